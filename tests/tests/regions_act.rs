//! End-to-end tests of regions that act (issue 13): cloud replicas autoscaled onto pool
//! nodes that the `local` provider starts and stops as real `nephele-edge` processes,
//! spot interruptions, jobs that run as processes (a JAX gang, a checkpointing job),
//! a control-plane kill -9, and providers that fail or hang.

#![allow(clippy::unwrap_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use nephele_e2e::{alive, program, require, venv_python, Cloud, Edge, Http};
use serde_json::{json, Value};

/// The common part of every config here: fast ticks, short waits.
const BASE: &str = r#"
heartbeat_interval_ms = 300
[scheduler]
tick_ms = 200
grace_s = 3
recover_timeout_s = 60
[autoscale]
tick_ms = 1000
[autoscale.policy]
cooldown_ms = 3000
scale_down_stabilisation_ms = 4000
stable_window_ms = 4000
[autoscale.policy.forecast]
enabled = false
[autoscale.policy.warm]
enabled = false
[nodes]
scale_down_after_s = 3
join_timeout_s = 60
retry_after_s = 1
[nodes.local]
boot_delay_s = 0.3
workers = 1
"#;

fn config(pools: &str) -> String {
    format!("{BASE}\n[[region]]\nname = \"eu-west\"\n{pools}")
}

/// Nodes of eu-west that are up with their agent.
fn nodes_up(cloud: &Cloud) -> Vec<Value> {
    cloud
        .get("/v1/regions/eu-west/nodes")
        .unwrap()
        .as_array()
        .unwrap()
        .iter()
        .filter(|n| n["phase"] == "up" && !n["agent"].is_null())
        .cloned()
        .collect()
}

fn replicas(cloud: &Cloud, deployment: &str) -> Value {
    let all = cloud
        .get(&format!("/v1/deployments/{deployment}/replicas"))
        .unwrap();
    all.as_array()
        .and_then(|a| a.first().cloned())
        .unwrap_or(Value::Null)
}

/// The pid the local provider recorded for a node's agent.
fn agent_pid(cloud: &Cloud, device: &str) -> Option<i32> {
    std::fs::read_to_string(cloud.dir.join("data/nodes").join(device).join("agent.pid"))
        .ok()?
        .trim()
        .parse()
        .ok()
}

/// Pushes the load model: a dense MLP (64 → 1024 → 1024 → 10) whose compute is not
/// negligible, so a burst queues at the replicas for real.
fn push_mlp(cloud: &Cloud) {
    let bytes = nephele_runtime::synthetic::dense_mlp(64, 1024, 2, 10, 13);
    let (status, body) = cloud.put_model("mlp", &bytes).unwrap();
    assert_eq!(status, 201, "{body}");
}

/// Deploys the MLP to `tier=edge` with a local queue of one (so a burst overflows to
/// the cloud) and these replica settings, and starts one edge agent with one
/// inference slot.
fn deploy_mlp(cloud: &Cloud, slo_ms: u32, replicas: Value) -> Edge {
    cloud
        .post(
            "/v1/deployments",
            &json!({"name": "mlp", "model": "mlp", "selector": "tier=edge", "slo_ms": slo_ms,
                    "max_queue": 1, "variant": "full", "replicas": replicas}),
        )
        .unwrap();
    Edge::start(
        cloud,
        "edge-1",
        "eu-west",
        &["--profile", "rpi5-8gb", "--label", "tier=edge"],
        &["--workers", "1"],
    )
    .unwrap()
}

/// Every answer the test's clients got: (HTTP status, where, computed_by).
type Answers = Arc<Mutex<Vec<(u16, String, String)>>>;

/// `clients` threads sending rows to `edge` until `stop`.
fn traffic(
    edge: &Edge,
    deployment: &str,
    clients: usize,
    stop: Arc<AtomicBool>,
) -> (Answers, Vec<std::thread::JoinHandle<()>>) {
    let answers: Answers = Arc::new(Mutex::new(Vec::new()));
    let handles = (0..clients)
        .map(|client| {
            let endpoint = edge.endpoint.clone();
            let deployment = deployment.to_string();
            let answers = answers.clone();
            let stop = stop.clone();
            std::thread::spawn(move || {
                let http = Http::new(None);
                let mut n = 0u32;
                while !stop.load(Ordering::Relaxed) {
                    let row: Vec<f32> = (0..64)
                        .map(|i| ((i + client + n as usize) % 7) as f32 / 7.0)
                        .collect();
                    let body = json!({"shape": [1, 64], "data": row});
                    let (status, value) = http
                        .raw_json("POST", &format!("{endpoint}/v1/infer/{deployment}"), &body)
                        .unwrap_or_else(|e| panic!("request failed without an answer: {e:#}"));
                    let text = |k: &str| value[k].as_str().unwrap_or("").to_string();
                    answers
                        .lock()
                        .unwrap()
                        .push((status, text("where"), text("computed_by")));
                    n += 1;
                }
            })
        })
        .collect();
    (answers, handles)
}

/// Every request got one answer: 200, or 429 (refused with Retry-After, never silent).
fn check_answers(answers: &Answers) -> BTreeMap<String, usize> {
    let answers = answers.lock().unwrap();
    assert!(!answers.is_empty());
    let mut by_agent: BTreeMap<String, usize> = BTreeMap::new();
    for (status, place, by) in answers.iter() {
        assert!(
            *status == 200 || *status == 429,
            "answer {status} {place} {by}"
        );
        if *status == 200 && place == "cloud" {
            *by_agent.entry(by.clone()).or_default() += 1;
        }
    }
    by_agent
}

/// The sum of a Prometheus metric of the control plane over the series that carry
/// every label given (`name`, then `label="value"` parts in any order).
fn metric(cloud: &Cloud, name: &str, labels: &[&str]) -> f64 {
    metric_at(&cloud.api, name, labels)
}

/// The same, read from any process's `/metrics` (an edge agent's, say).
fn metric_at(base: &str, name: &str, labels: &[&str]) -> f64 {
    let text = Http::new(None)
        .request("GET", &format!("{base}/metrics"), None)
        .unwrap();
    text.as_str()
        .unwrap_or("")
        .lines()
        .filter(|l| l.starts_with(&format!("{name}{{")) || l.starts_with(&format!("{name} ")))
        .filter(|l| labels.iter().all(|label| l.contains(label)))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

#[test]
fn a_burst_scales_replicas_out_on_new_local_nodes_and_back_in() {
    let cloud = Cloud::start_with(
        "burst",
        &config(
            r#"[[region.pool]]
name = "l4"
node_profile = "gpu-4x-l4"
provider = "local"
min_nodes = 1
max_nodes = 3
"#,
        ),
    )
    .unwrap();
    // The provider keeps one node from the start.
    cloud
        .wait_for("/v1/regions/eu-west/nodes", "the first node", |v| {
            v[0]["phase"] == "up" && v[0]["agent"] == "eu-west-l4-0"
        })
        .unwrap();
    push_mlp(&cloud);
    let edge = deploy_mlp(&cloud, 50, json!({"min": 1, "max": 3, "target_p99_ms": 15}));
    cloud
        .wait_for("/v1/deployments/mlp", "ready on the edge", |v| {
            v["ready_devices"] == 1
        })
        .unwrap();
    cloud
        .wait_long(
            "/v1/deployments/mlp/replicas",
            "one ready replica",
            60,
            |v| v[0]["ready"] == 1,
        )
        .unwrap();

    // The burst: 12 clients against one edge device whose queue holds 1.
    let stop = Arc::new(AtomicBool::new(false));
    let (answers, handles) = traffic(&edge, "mlp", 12, stop.clone());
    let scaled = cloud.wait_long(
        "/v1/deployments/mlp/replicas",
        "more ready replicas",
        90,
        |v| v[0]["ready"].as_u64().unwrap_or(0) >= 2,
    );
    // The burst goes on until the new replicas have served some of it (bounded).
    let deadline = Instant::now() + Duration::from_secs(60);
    while Instant::now() < deadline {
        let served_by_new =
            answers.lock().unwrap().iter().any(|(status, place, by)| {
                *status == 200 && place == "cloud" && by != "eu-west-l4-0"
            });
        if served_by_new {
            break;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    std::thread::sleep(Duration::from_secs(1));
    stop.store(true, Ordering::Relaxed);
    for handle in handles {
        handle.join().unwrap();
    }
    let scaled = scaled.unwrap_or_else(|e| panic!("{e:#}\n{}", cloud.logs()));
    let up: Vec<String> = nodes_up(&cloud)
        .iter()
        .map(|n| n["agent"].as_str().unwrap().to_string())
        .collect();
    assert!(up.len() >= 2, "{up:?}");
    let by_agent = check_answers(&answers);
    let served_by_new: usize = by_agent
        .iter()
        .filter(|(agent, _)| agent.as_str() != "eu-west-l4-0")
        .map(|(_, n)| *n)
        .sum();
    assert!(
        served_by_new > 0,
        "the overflow reached the new replicas: {by_agent:?} {scaled}"
    );
    // What the gateway relayed from replicas: one answer per offloaded request.
    let relayed = metric(&cloud, "nephele_offloads_total", &["outcome=\"ok\""]);
    let cloud_answers: usize = by_agent.values().sum();
    assert!(
        relayed >= cloud_answers as f64,
        "relayed {relayed} < answered {cloud_answers}"
    );

    // After the cooldown: back to one replica on one node (min_nodes), and the other
    // nodes are released and their agents stopped.
    let pids: BTreeMap<String, i32> = up
        .iter()
        .filter_map(|d| Some((d.clone(), agent_pid(&cloud, d)?)))
        .collect();
    assert_eq!(pids.len(), up.len());
    let nodes = cloud
        .wait_long(
            "/v1/regions/eu-west/nodes",
            "the extra nodes released",
            120,
            |v| {
                v.as_array()
                    .unwrap()
                    .iter()
                    .filter(|n| n["phase"] != "absent")
                    .count()
                    == 1
            },
        )
        .unwrap_or_else(|e| panic!("{e:#}\n{}", cloud.logs()));
    let after = replicas(&cloud, "mlp");
    assert_eq!(after["desired"], 1, "{after}");
    let kept = nodes
        .as_array()
        .unwrap()
        .iter()
        .find(|n| n["phase"] != "absent")
        .and_then(|n| n["device"].as_str())
        .unwrap()
        .to_string();
    let released: Vec<(&String, &i32)> = pids.iter().filter(|(d, _)| **d != kept).collect();
    assert!(!released.is_empty());
    let deadline = Instant::now() + Duration::from_secs(15);
    while released.iter().any(|(_, p)| alive(**p)) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
    }
    for (device, pid) in &released {
        assert!(!alive(**pid), "released agent {device} still runs");
        assert!(
            !cloud.dir.join("data/nodes").join(device).exists(),
            "{device}'s data dir is gone"
        );
    }
    assert!(alive(pids[&kept]), "the node kept still runs");
    // The edge device still answers, locally or through the remaining replica.
    let (status, _) = edge.infer("mlp", &[0.5; 64]).unwrap();
    assert_eq!(status, 200);
}

#[test]
fn a_spot_interruption_moves_replicas_without_losing_a_request() {
    let cloud = Cloud::start_with(
        "spot",
        &config(
            r#"[[region.pool]]
name = "spot"
node_profile = "gpu-4x-l4"
capacity_type = "spot"
provider = "local"
min_nodes = 1
max_nodes = 2
"#,
        ),
    )
    .unwrap();
    cloud
        .wait_for("/v1/regions/eu-west/nodes", "the first node", |v| {
            v[0]["phase"] == "up" && !v[0]["agent"].is_null()
        })
        .unwrap();
    push_mlp(&cloud);
    let edge = deploy_mlp(&cloud, 200, json!({"min": 1, "max": 1}));
    cloud
        .wait_long(
            "/v1/deployments/mlp/replicas",
            "the replica ready on spot-0",
            60,
            |v| v[0]["ready"] == 1 && v[0]["replicas"][0]["node"] == "spot-0",
        )
        .unwrap();
    // The edge device's own copy too, before traffic starts (else the first
    // requests meet a deployment still loading: 503).
    cloud
        .wait_for("/v1/deployments/mlp", "mlp ready on the edge", |v| {
            v["ready_devices"] == 1
        })
        .unwrap();
    // What would show a request lost or failed by the move: the gateway failing an
    // offload or finding no ready replica, or the device counting an offload failure.
    let failures = |cloud: &Cloud, edge: &Edge| {
        [
            metric(cloud, "nephele_offloads_total", &["outcome=\"error\""]),
            metric(cloud, "nephele_offloads_total", &["outcome=\"no_replica\""]),
            metric_at(&edge.endpoint, "nephele_agent_offload_failures_total", &[]),
        ]
    };
    let failures_before = failures(&cloud, &edge);
    let stop = Arc::new(AtomicBool::new(false));
    let (answers, handles) = traffic(&edge, "mlp", 4, stop.clone());
    std::thread::sleep(Duration::from_secs(2));
    // The provider says spot-0 goes in 60 s.
    cloud
        .post(
            "/v1/regions/eu-west/nodes/spot-0/interrupt",
            &json!({"notice_s": 60}),
        )
        .unwrap();
    let moved = cloud.wait_long(
        "/v1/deployments/mlp/replicas",
        "the replica on spot-1",
        90,
        |v| {
            let replicas = v[0]["replicas"].as_array().cloned().unwrap_or_default();
            replicas.len() == 1
                && replicas[0]["node"] == "spot-1"
                && replicas[0]["state"] == "ready"
        },
    );
    std::thread::sleep(Duration::from_secs(3));
    stop.store(true, Ordering::Relaxed);
    for handle in handles {
        handle.join().unwrap();
    }
    moved.unwrap_or_else(|e| panic!("{e:#}\n{}", cloud.logs()));
    let by_agent = check_answers(&answers);
    assert!(
        by_agent.contains_key("eu-west-spot-1"),
        "served after the move: {by_agent:?}"
    );
    // Every request was answered (200, or 429 with a Retry-After: refused, not lost,
    // as admission control or the SLO decided on a busy machine), and none of the
    // accepted ones failed: the gateway always had a ready replica and never failed
    // a relay, and the device never counted an offload failure (so its breaker never
    // opened because of the move).
    let failures_after = failures(&cloud, &edge);
    let (refused, total) = {
        let answers = answers.lock().unwrap();
        (answers.iter().filter(|a| a.0 != 200).count(), answers.len())
    };
    let shed = metric(&cloud, "nephele_offloads_total", &["outcome=\"shed\""]);
    eprintln!("answers: {total}, refused with 429: {refused} (region's admission control shed {} offloads); served by the cloud: {by_agent:?}", shed as u64);
    for (what, (before, after)) in [
        "gateway errors",
        "no ready replica",
        "device offload failures",
    ]
    .iter()
    .zip(failures_before.iter().zip(failures_after.iter()))
    {
        assert_eq!(
            after - before,
            0.0,
            "{what} during the move\n{}",
            cloud.logs()
        );
    }
    // The interrupted node is released once empty.
    cloud
        .wait_long("/v1/regions/eu-west/nodes", "spot-0 released", 60, |v| {
            v[0]["phase"] == "absent"
        })
        .unwrap_or_else(|e| panic!("{e:#}\n{}", cloud.logs()));
}

/// The JSON line a gang member printed (its log holds gloo's chatter on stderr too).
fn result_line(log: &str) -> Option<Value> {
    log.lines().rev().find_map(|l| {
        serde_json::from_str::<Value>(l)
            .ok()
            .filter(|v| v.get("rank").is_some())
    })
}

fn logs(cloud: &Cloud, job: &str, member: u16, attempt: Option<u32>) -> String {
    let attempt = attempt.map(|a| format!("&attempt={a}")).unwrap_or_default();
    let value = cloud
        .get(&format!(
            "/v1/jobs/{job}/logs?member={member}{attempt}&max_bytes=1048576"
        ))
        .unwrap_or_else(|e| panic!("{e:#}"));
    value["data"].as_str().unwrap_or("").to_string()
}

#[test]
fn a_four_member_gang_starts_whole_and_its_members_all_reduce_with_jax() {
    let python = venv_python();
    let ready = python.exists()
        && std::process::Command::new(&python)
            .args(["-c", "import jax"])
            .status()
            .is_ok_and(|s| s.success());
    if !require("JAX in target/models/venv", ready) {
        return;
    }
    let cloud = Cloud::start_with(
        "gang",
        &config(
            r#"[[region.pool]]
name = "l4"
node_profile = "gpu-4x-l4"
provider = "local"
max_nodes = 4
"#,
        ),
    )
    .unwrap();
    let (status, job) = cloud
        .client()
        .raw_json(
            "POST",
            &format!("{}/v1/jobs", cloud.api),
            &json!({"name": "allreduce", "members": 4, "gpus": 4, "cpu_milli": 4000,
                    "command": [python.display().to_string(), program("gang_allreduce.py").display().to_string()],
                    "args": ["--timeout", "120"], "max_retries": 0}),
        )
        .unwrap();
    assert_eq!(status, 201, "{job}");
    assert_eq!(job["state"], "pending", "no node yet: {job}");
    // Nodes come up one by one; the gang starts only when all four are placed.
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let view = cloud.get("/v1/jobs/allreduce").unwrap();
        let up = nodes_up(&cloud).len();
        if view["state"] != "pending" {
            assert_eq!(up, 4, "placed with {up} nodes up: {view}");
            assert_eq!(view["placement"].as_array().unwrap().len(), 4);
            break;
        }
        assert!(
            view["members"].as_array().unwrap().is_empty(),
            "nothing started early: {view}"
        );
        assert!(
            Instant::now() < deadline,
            "never placed: {view}\n{}",
            cloud.logs()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let done = cloud
        .wait_long("/v1/jobs/allreduce", "the gang to finish", 180, |v| {
            v["state"] == "succeeded" || v["state"] == "failed"
        })
        .unwrap();
    let results: Vec<Value> = (0..4)
        .map(|m| {
            let log = logs(&cloud, "allreduce", m, None);
            result_line(&log)
                .unwrap_or_else(|| panic!("member {m} printed no result:\n{log}\n{done}"))
        })
        .collect();
    assert_eq!(done["state"], "succeeded", "{done}");
    let ranks: BTreeSet<u64> = results
        .iter()
        .map(|r| r["rank"].as_u64().unwrap())
        .collect();
    assert_eq!(ranks, (0..4).collect(), "each member saw its own rank");
    for r in &results {
        assert_eq!(r["world_size"], 4);
        assert_eq!(r["agreed"], true, "{r}");
        assert_eq!(r["master"], results[0]["master"], "one rendezvous");
        assert_eq!(
            r["result"], results[0]["result"],
            "they agree on the all-reduce"
        );
    }
    assert_eq!(done["attempts"].as_array().unwrap().len(), 1);
}

/// A control plane whose one pool keeps two nodes from the `local` provider, once both
/// are up.
fn two_local_nodes(label: &str) -> Cloud {
    let cloud = Cloud::start_with(
        label,
        &config(
            r#"[[region.pool]]
name = "l4"
node_profile = "gpu-4x-l4"
provider = "local"
min_nodes = 2
max_nodes = 2
"#,
        ),
    )
    .unwrap();
    cloud
        .wait_long("/v1/regions/eu-west/nodes", "two nodes", 60, |v| {
            v.as_array()
                .unwrap()
                .iter()
                .all(|n| n["phase"] == "up" && !n["agent"].is_null())
        })
        .unwrap();
    cloud
}

#[test]
fn a_preempted_job_checkpoints_and_resumes_on_another_node() {
    let cloud = two_local_nodes("preempt");
    let counter = program("checkpoint_counter.py").display().to_string();
    cloud
        .post(
            "/v1/jobs",
            &json!({"name": "low", "gpus": 4, "priority": "batch",
            "command": ["python3", counter, "--interval-ms", "20", "--every", "10"]}),
        )
        .unwrap();
    let low = cloud
        .wait_for("/v1/jobs/low", "low running", |v| {
            v["members"][0]["state"] == "running"
        })
        .unwrap();
    let first_node = low["placement"][0]["node"].as_str().unwrap().to_string();
    // A non-preemptible job takes the other node.
    cloud
        .post(
            "/v1/jobs",
            &json!({"name": "filler", "gpus": 4, "priority": "production"}),
        )
        .unwrap();
    std::thread::sleep(Duration::from_secs(2));
    // Production work needs a node: `low` is preempted (SIGTERM, 3 s grace).
    cloud
        .post(
            "/v1/jobs",
            &json!({"name": "urgent", "gpus": 4, "priority": "production",
            "command": ["sleep", "600"]}),
        )
        .unwrap();
    cloud
        .wait_for("/v1/jobs/urgent", "urgent running", |v| {
            v["state"] == "running"
        })
        .unwrap();
    let stopped = cloud.get("/v1/jobs/low").unwrap();
    assert_eq!(stopped["state"], "pending", "{stopped}");
    assert_eq!(stopped["attempts"][0]["outcome"], "preempted", "{stopped}");
    let first_log = logs(&cloud, "low", 0, Some(1));
    assert!(first_log.contains("starting fresh"), "{first_log}");
    assert!(
        first_log.to_lowercase().contains("sigterm"),
        "it was told to stop: {first_log}"
    );
    // The filler leaves: `low` runs again, on the other node, from its checkpoint.
    cloud.delete("/v1/jobs/filler").unwrap();
    let again = cloud
        .wait_for("/v1/jobs/low", "low running again", |v| {
            v["attempt"] == 2 && v["members"][0]["state"] == "running"
        })
        .unwrap();
    assert_ne!(
        again["placement"][0]["node"].as_str().unwrap(),
        first_node,
        "{again}"
    );
    std::thread::sleep(Duration::from_secs(1));
    let second_log = logs(&cloud, "low", 0, Some(2));
    let resumed: u64 = second_log
        .lines()
        .find_map(|l| {
            l.split("resumed from step ")
                .nth(1)?
                .split_whitespace()
                .next()?
                .parse()
                .ok()
        })
        .unwrap_or_else(|| panic!("attempt 2 did not resume: {second_log}"));
    assert!(resumed > 0, "{second_log}");
    // Deleting it sends SIGTERM; the member ends.
    cloud.delete("/v1/jobs/low").unwrap();
    cloud.delete("/v1/jobs/urgent").unwrap();
}

#[test]
fn a_control_plane_killed_while_jobs_run_and_replicas_serve_loses_and_repeats_nothing() {
    let mut cloud = two_local_nodes("kill9");
    let (status, body) = cloud
        .put_model("digits-mlp", nephele_e2e::MODEL_ONNX)
        .unwrap();
    assert_eq!(status, 201, "{body}");
    cloud
        .post(
            "/v1/deployments",
            &json!({"name": "digits", "model": "digits-mlp", "selector": "tier=edge",
            "replicas": {"min": 1, "max": 1}}),
        )
        .unwrap();
    let counter = program("checkpoint_counter.py").display().to_string();
    cloud
        .post(
            "/v1/jobs",
            &json!({"name": "long", "gpus": 2, "members": 2,
            "command": ["python3", counter, "--interval-ms", "20"]}),
        )
        .unwrap();
    let before = cloud
        .wait_long("/v1/jobs/long", "both members running", 60, |v| {
            v["members"]
                .as_array()
                .is_some_and(|m| m.len() == 2 && m.iter().all(|m| m["state"] == "running"))
        })
        .unwrap();
    let replica_before = cloud
        .wait_long(
            "/v1/deployments/digits/replicas",
            "the replica ready",
            60,
            |v| v[0]["ready"] == 1,
        )
        .unwrap();
    let pids_before: Vec<i64> = before["members"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["pid"].as_i64().unwrap())
        .collect();
    let agents_before: Vec<i32> = ["eu-west-l4-0", "eu-west-l4-1"]
        .iter()
        .map(|d| agent_pid(&cloud, d).unwrap())
        .collect();

    cloud.kill9();
    std::thread::sleep(Duration::from_secs(1));
    assert!(
        agents_before.iter().all(|p| alive(*p)),
        "the nodes outlive the control plane"
    );
    cloud.restart().unwrap();

    // Every job and replica is accounted for once the agents are back, and nothing
    // was started again.
    let after = cloud
        .wait_long("/v1/jobs/long", "the job adopted", 60, |v| {
            v["state"] == "running"
                && v["members"]
                    .as_array()
                    .is_some_and(|m| m.iter().all(|m| m["state"] == "running"))
        })
        .unwrap_or_else(|e| panic!("{e:#}\n{}", cloud.logs()));
    assert_eq!(after["attempt"], 1, "{after}");
    let pids_after: Vec<i64> = after["members"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["pid"].as_i64().unwrap())
        .collect();
    assert_eq!(pids_after, pids_before, "the same processes");
    let replica_after = cloud
        .wait_long(
            "/v1/deployments/digits/replicas",
            "the replica ready again",
            60,
            |v| v[0]["ready"] == 1,
        )
        .unwrap();
    assert_eq!(
        replica_after[0]["replicas"][0]["agent"],
        replica_before[0]["replicas"][0]["agent"]
    );
    assert_eq!(replica_after[0]["replicas"].as_array().unwrap().len(), 1);
    for device in ["eu-west-l4-0", "eu-west-l4-1"] {
        assert!(
            agents_before.contains(&agent_pid(&cloud, device).unwrap()),
            "{device} was not launched again"
        );
    }
    for member in 0..2 {
        let log = logs(&cloud, "long", member, None);
        assert_eq!(
            log.matches("starting fresh").count(),
            1,
            "member {member} started once: {log}"
        );
        assert!(!log.contains("resumed from"), "{log}");
    }
    assert_eq!(cloud.get("/v1/jobs").unwrap().as_array().unwrap().len(), 1);
    cloud.delete("/v1/jobs/long").unwrap();
}

#[test]
fn a_provider_that_fails_or_hangs_is_retried_and_never_counted_as_capacity() {
    let scripts = concat!(env!("CARGO_MANIFEST_DIR"), "/../deploy/providers/testing");
    let cloud = Cloud::start_with(
        "provider-fails",
        &config(&format!(
            r#"[[region.pool]]
name = "broken"
node_profile = "gpu-4x-l4"
provider = "command"
max_nodes = 2
[region.pool.command]
add = "{scripts}/fail.sh"
remove = "{scripts}/fail.sh"
timeout_s = 5
[[region.pool]]
name = "stuck"
node_profile = "gpu-1x-t4"
provider = "command"
max_nodes = 1
[region.pool.command]
add = "{scripts}/hang.sh"
remove = "{scripts}/hang.sh"
timeout_s = 1
"#
        )),
    )
    .unwrap();
    cloud
        .post(
            "/v1/jobs",
            &json!({"name": "needs-l4", "gpus": 4, "gpu_models": ["NVIDIA L4"]}),
        )
        .unwrap();
    cloud
        .post(
            "/v1/jobs",
            &json!({"name": "needs-t4", "gpus": 1, "gpu_models": ["NVIDIA T4"]}),
        )
        .unwrap();
    // Both launches fail, are reported on the node, and are tried again with backoff.
    cloud
        .wait_long("/v1/regions/eu-west/nodes", "failures reported", 60, |v| {
            let note = |i: usize| v[i]["note"].as_str().unwrap_or("").to_string();
            note(0).contains("launch failed") && note(2).contains("did not finish within 1 s")
        })
        .unwrap_or_else(|e| panic!("{e:#}\n{}", cloud.logs()));
    let deadline = Instant::now() + Duration::from_secs(40);
    while cloud.logs().matches("provider call failed").count() < 4 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(200));
    }
    assert!(
        cloud.logs().matches("provider call failed").count() >= 4,
        "retried:\n{}",
        cloud.logs()
    );
    // Never capacity: no node is up, and the jobs wait.
    let nodes = cloud.get("/v1/regions/eu-west/nodes").unwrap();
    assert!(
        nodes
            .as_array()
            .unwrap()
            .iter()
            .all(|n| n["up"] == false && n["agent"].is_null()),
        "{nodes}"
    );
    for job in ["needs-l4", "needs-t4"] {
        assert_eq!(
            cloud.get(&format!("/v1/jobs/{job}")).unwrap()["state"],
            "pending"
        );
    }
    // A job no pool could ever run is refused at submission, with the reason.
    let (status, refused) = cloud
        .client()
        .raw_json(
            "POST",
            &format!("{}/v1/jobs", cloud.api),
            &json!({"name": "huge", "gpus": 16}),
        )
        .unwrap();
    assert_eq!(status, 400, "{refused}");
    assert!(
        refused["message"]
            .as_str()
            .unwrap()
            .contains("can ever run this job"),
        "{refused}"
    );
}
