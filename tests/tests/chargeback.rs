//! Chargeback and showback on a real control plane (issue 16): two tenants' jobs on a
//! pool node the `local` provider runs as a real agent process, a deployment served on
//! a real edge agent, a measured grid signal; `GET /v1/reports/cost|carbon` charge
//! each tenant what it held × the time it held it, across a `kill -9` of the control
//! plane (the jobs ran on; the outage is charged, nothing lost), carbon at the pushed
//! intensity, the edge's requests to the deployment's tenant, and each tenant sees only
//! its own rows. The CLI's `nephele report` prints the same.

#![allow(clippy::unwrap_used)]

use std::time::{Duration, Instant};

use nephele_e2e::{Cloud, Http};
use serde_json::{json, Value};

const CONFIG: &str = r#"
heartbeat_interval_ms = 300
[scheduler]
tick_ms = 200
grace_s = 1
recover_timeout_s = 120
[nodes]
join_timeout_s = 60
[nodes.local]
boot_delay_s = 0.3
workers = 1
[[tenant]]
name = "team-a"
[[tenant]]
name = "team-b"
[[region]]
name = "eu-west"
carbon_zone = "DE"
[[region.pool]]
name = "l4"
node_profile = "gpu-4x-l4"
provider = "local"
min_nodes = 1
max_nodes = 1
price_per_hour = 3.6
"#;

/// gpu-4x-l4's rated power (`power_budget_w` in its firmware profile).
const NODE_POWER_W: f64 = 550.0;
const PRICE_PER_HOUR: f64 = 3.6;
const INTENSITY: f64 = 300.0;

fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

fn api_token(cloud: &Cloud, name: &str, tenant: &str) -> String {
    let answer = cloud
        .post(
            "/v1/api-tokens",
            &json!({"name": name, "role": "developer", "tenant": tenant}),
        )
        .unwrap();
    answer["token"].as_str().unwrap().to_string()
}

fn as_tenant(cloud: &Cloud, token: &str, method: &str, path: &str, body: &Value) -> Value {
    let (status, answer) = Http::new(Some(token.to_string()))
        .raw_json(method, &format!("{}{path}", cloud.api), body)
        .unwrap();
    assert!(
        (200..300).contains(&status),
        "{method} {path}: {status} {answer}"
    );
    answer
}

fn row<'a>(report: &'a Value, name: &str) -> &'a Value {
    report["rows"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["name"] == name)
        .unwrap_or_else(|| panic!("no row {name} in {report:#}"))
}

fn close(actual: f64, expected: f64, tolerance: f64, what: &str) {
    assert!(
        (actual - expected).abs() <= tolerance,
        "{what}: {actual} against {expected} ± {tolerance}"
    );
}

#[test]
fn tenants_are_charged_what_they_held_through_a_kill_9_and_see_only_their_own() {
    let mut cloud = Cloud::start_with("chargeback", CONFIG).unwrap();
    cloud.wait_pool_nodes_up("eu-west").unwrap();
    let team_a = api_token(&cloud, "a-dev", "team-a");
    let team_b = api_token(&cloud, "b-dev", "team-b");
    let began = unix_now();

    // The grid as measured: this hour and the one before.
    let now = unix_now();
    let (status, answer) = cloud
        .client()
        .raw_json(
            "PUT",
            &format!("{}/v1/regions/eu-west/grid", cloud.api),
            &json!({"points": [
                {"unix": now - 3600, "carbon_g_per_kwh": INTENSITY, "price_per_mwh": 90.0},
                {"unix": now, "carbon_g_per_kwh": INTENSITY, "price_per_mwh": 90.0}
            ]}),
        )
        .unwrap();
    assert_eq!(status, 200, "{answer}");

    // Half the node's GPUs for team-a, a quarter for team-b (CPU and memory small, so
    // the GPU share is each one's share of the node).
    as_tenant(
        &cloud,
        &team_a,
        "POST",
        "/v1/jobs",
        &json!({"name": "train", "gpus": 2, "cpu_milli": 1000, "memory_mib": 1024}),
    );
    as_tenant(
        &cloud,
        &team_b,
        "POST",
        "/v1/jobs",
        &json!({"name": "eval", "gpus": 1, "cpu_milli": 1000, "memory_mib": 1024}),
    );

    // team-b's model served on a device: every request it answers is counted for team-b.
    let (status, answer) = Http::new(Some(team_b.clone()))
        .raw(
            "PUT",
            &format!("{}/v1/models/digits-mlp?wait=true", cloud.api),
            nephele_e2e::MODEL_ONNX,
        )
        .unwrap();
    assert_eq!(status, 201, "{answer}");
    as_tenant(
        &cloud,
        &team_b,
        "POST",
        "/v1/deployments",
        &json!({"name": "digits", "model": "digits-mlp", "selector": "tier=edge",
                "offload": false}),
    );
    let edge = cloud.edge_serving_digits("eu-west").unwrap();
    let mut answered = 0;
    for i in 0..20 {
        let row = nephele_e2e::digits_row(i);
        let (status, _) = edge.infer("digits", &row).unwrap();
        if status == 200 {
            answered += 1;
        }
    }
    assert_eq!(answered, 20);

    let jobs_running = |cloud: &Cloud| -> Vec<(String, u64)> {
        cloud
            .get("/v1/jobs")
            .unwrap()
            .as_array()
            .unwrap()
            .iter()
            .filter(|j| j["state"] == "running")
            .map(|j| {
                (
                    j["name"].as_str().unwrap().to_string(),
                    j["started_unix"].as_u64().unwrap(),
                )
            })
            .collect()
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    while jobs_running(&cloud).len() < 2 {
        assert!(
            Instant::now() < deadline,
            "{:#}",
            cloud.get("/v1/jobs").unwrap()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    let started: std::collections::BTreeMap<String, u64> =
        jobs_running(&cloud).into_iter().collect();

    // kill -9 of the control plane: the jobs run on on their node; the outage is charged.
    std::thread::sleep(Duration::from_secs(3));
    cloud.kill9();
    std::thread::sleep(Duration::from_secs(4));
    cloud.restart().unwrap();
    let deadline = Instant::now() + Duration::from_secs(90);
    while jobs_running(&cloud).len() < 2 {
        assert!(
            Instant::now() < deadline,
            "{:#}",
            cloud.get("/v1/jobs").unwrap()
        );
        std::thread::sleep(Duration::from_millis(300));
    }
    std::thread::sleep(Duration::from_secs(2));

    // Every request the edge answered is counted, once.
    let range = format!("from={}&to={}", began - 60, unix_now() + 1);
    let deadline = Instant::now() + Duration::from_secs(30);
    let cost = loop {
        let cost = cloud.get(&format!("/v1/reports/cost?{range}")).unwrap();
        let digits = cost["rows"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["name"] == "digits")
            .cloned();
        if digits.is_some_and(|d| d["edge_requests_local"] == 20) {
            break cost;
        }
        assert!(
            Instant::now() < deadline,
            "edge requests never counted: {cost:#}"
        );
        std::thread::sleep(Duration::from_millis(300));
    };
    let asked = unix_now();
    eprintln!("cost report: {cost:#}");

    let train = row(&cost, "train");
    assert_eq!(train["tenant"], "team-a");
    assert_eq!(train["kind"], "job");
    assert_eq!(train["regions"], json!(["eu-west"]));
    let held_s = (asked - started["train"]) as f64;
    // Two GPUs from placement to the last tick: a tick's lag and whole seconds apart.
    close(
        train["gpu_seconds"].as_f64().unwrap(),
        2.0 * held_s,
        6.0,
        "train's GPU-seconds",
    );
    // Half of the node (its GPU share) × the price per hour.
    close(
        train["cost"].as_f64().unwrap(),
        train["gpu_seconds"].as_f64().unwrap() / 4.0 * PRICE_PER_HOUR / 3600.0,
        1e-9,
        "train's cost",
    );
    let eval = row(&cost, "eval");
    assert_eq!(eval["tenant"], "team-b");
    close(
        eval["gpu_seconds"].as_f64().unwrap(),
        (asked - started["eval"]) as f64,
        3.0,
        "eval's GPU-seconds",
    );
    let digits = row(&cost, "digits");
    assert_eq!(digits["tenant"], "team-b");
    assert_eq!(digits["kind"], "deployment");
    assert_eq!(digits["edge_requests_offloaded"], 0);

    // Carbon: each GPU-hour's energy at the node's rated power × the measured intensity
    // (an hour past the pushed ones, if the test crossed one, is reported apart). The
    // ledger moves on between two reports, so the cost report's energy is bracketed by
    // a carbon report taken before it and one taken after.
    let carbon_before = cloud.get(&format!("/v1/reports/carbon?{range}")).unwrap();
    let cost_again = cloud.get(&format!("/v1/reports/cost?{range}")).unwrap();
    let carbon = cloud.get(&format!("/v1/reports/carbon?{range}")).unwrap();
    let energy_of = |report: &Value| row(report, "train")["energy_kwh"].as_f64().unwrap();
    let from_cost =
        row(&cost_again, "train")["gpu_seconds"].as_f64().unwrap() / 4.0 * NODE_POWER_W / 3.6e6;
    assert!(
        energy_of(&carbon_before) - 1e-9 <= from_cost && from_cost <= energy_of(&carbon) + 1e-9,
        "train's energy: {} .. {} kWh around {from_cost} from its GPU-seconds",
        energy_of(&carbon_before),
        energy_of(&carbon)
    );
    let train_carbon = row(&carbon, "train");
    let energy = train_carbon["energy_kwh"].as_f64().unwrap();
    let measured = energy - train_carbon["energy_without_signal_kwh"].as_f64().unwrap();
    close(
        train_carbon["carbon_g"].as_f64().unwrap(),
        measured * INTENSITY,
        1e-6,
        "train's carbon",
    );
    if measured > 0.0 {
        close(
            train_carbon["intensity_g_per_kwh"].as_f64().unwrap(),
            INTENSITY,
            1e-9,
            "intensity",
        );
    }

    // A tenant sees only its own rows, and may not ask for another's.
    let (status, _, own) = Http::new(Some(team_b.clone()))
        .get_full(&format!("{}/v1/reports/cost?{range}", cloud.api))
        .unwrap();
    assert_eq!(status, 200);
    let names: Vec<&str> = own["rows"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, vec!["digits", "eval"], "{own:#}");
    let (status, _, refused) = Http::new(Some(team_b))
        .get_full(&format!(
            "{}/v1/reports/cost?{range}&tenant=team-a",
            cloud.api
        ))
        .unwrap();
    assert_eq!(status, 403, "{refused}");
    let by_tenant = cloud
        .get(&format!("/v1/reports/cost?{range}&group=tenant"))
        .unwrap();
    close(
        by_tenant["total"]["cost"].as_f64().unwrap(),
        cost["total"]["cost"].as_f64().unwrap(),
        1e-3,
        "totals by tenant and by workload",
    );
    let (status, _, bad) = cloud
        .client()
        .get_full(&format!("{}/v1/reports/cost?from=20&to=10", cloud.api))
        .unwrap();
    assert_eq!(status, 400, "{bad}");
    assert_eq!(bad["field"], "from", "{bad}");

    // The CLI prints the same report as a table.
    let (ok, stdout) = cloud.cli_as(
        &cloud.token,
        &["report", "cost", "--since", "2h", "--by", "tenant"],
    );
    assert!(ok, "{stdout}");
    eprintln!("{stdout}");
    assert!(
        stdout.contains("team-a") && stdout.contains("team-b"),
        "{stdout}"
    );
    assert!(stdout.lines().any(|l| l.starts_with("TENANT")), "{stdout}");
    drop(edge);
}
