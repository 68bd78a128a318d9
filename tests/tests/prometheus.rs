//! The alerting rules shipped in `deploy/prometheus/` and a real Prometheus (Debian's
//! `prometheus`, installed by `tests/run.sh`) scraping a real control plane and agent:
//! the rules pass `promtool check rules` and their unit tests (`promtool test rules`:
//! each alert fires, with its labels and text, exactly when it should), Prometheus
//! loads them and evaluates every one without error against what nephele exports,
//! and a killed agent shows as offline in Prometheus.

#![allow(clippy::unwrap_used)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use nephele_e2e::{heldout, require, temp_dir, Cloud, Edge, MODEL_ONNX};
use serde_json::Value;

fn rules_dir() -> PathBuf {
    PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../deploy/prometheus"))
}

fn installed(program: &str) -> bool {
    ["/usr/bin", "/usr/local/bin", "/bin"]
        .iter()
        .any(|dir| Path::new(dir).join(program).exists())
}

fn promtool(args: &[&str]) -> String {
    let output = Command::new("promtool")
        .args(args)
        .current_dir(rules_dir())
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&output.stdout).to_string()
        + &String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "promtool {args:?}:\n{text}");
    text
}

struct Prometheus {
    child: Child,
    url: String,
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Prometheus {
    /// Scrapes each `(job, host:port, CA)`: over HTTPS checked against the CA file
    /// when one is given, else plain HTTP.
    fn start(dir: &Path, targets: &[(&str, &str, Option<&Path>)]) -> Prometheus {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let mut config = format!(
            "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nrule_files:\n  - {}\nscrape_configs:\n",
            rules_dir().join("alerts.yml").display()
        );
        for (job, target, ca) in targets {
            config.push_str(&format!("  - job_name: {job}\n"));
            if let Some(ca) = ca {
                config.push_str(&format!(
                    "    scheme: https\n    tls_config:\n      ca_file: {}\n",
                    ca.display()
                ));
            }
            config.push_str(&format!(
                "    static_configs:\n      - targets: [\"{target}\"]\n"
            ));
        }
        std::fs::write(dir.join("prometheus.yml"), config).unwrap();
        let log = std::fs::File::create(dir.join("prometheus.log")).unwrap();
        let child = Command::new("prometheus")
            .arg(format!(
                "--config.file={}",
                dir.join("prometheus.yml").display()
            ))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.join("tsdb").display()
            ))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap();
        Prometheus {
            child,
            url: format!("http://127.0.0.1:{port}"),
        }
    }

    fn get(&self, path: &str) -> Option<Value> {
        let mut response = ureq::get(&format!("{}{path}", self.url)).call().ok()?;
        let value: Value = response.body_mut().read_json().ok()?;
        (value["status"] == "success").then(|| value["data"].clone())
    }

    /// Polls `path` until `done` holds of its data (up to `seconds`).
    fn until(&self, path: &str, seconds: u64, what: &str, done: impl Fn(&Value) -> bool) -> Value {
        let begun = Instant::now();
        loop {
            if let Some(data) = self.get(path) {
                if done(&data) {
                    return data;
                }
                if begun.elapsed() > Duration::from_secs(seconds) {
                    panic!("{what}: not after {seconds} s; last {data}");
                }
            } else if begun.elapsed() > Duration::from_secs(seconds) {
                panic!("{what}: Prometheus did not answer in {seconds} s");
            }
            std::thread::sleep(Duration::from_millis(250));
        }
    }

    /// The value of an instant query's single series matching `labels` (as `k="v"`).
    fn value(data: &Value, device: &str) -> Option<f64> {
        data["result"]
            .as_array()?
            .iter()
            .find(|s| s["metric"]["device"] == device)?["value"][1]
            .as_str()?
            .parse()
            .ok()
    }
}

#[test]
fn shipped_alerts_pass_promtool_and_a_real_prometheus_evaluates_them() {
    if !require(
        "prometheus and promtool (Debian's prometheus)",
        installed("prometheus") && installed("promtool"),
    ) {
        return;
    }
    let checked = promtool(&["check", "rules", "alerts.yml"]);
    assert!(checked.contains("SUCCESS: 8 rules found"), "{checked}");
    let tested = promtool(&["test", "rules", "alerts_test.yml"]);
    assert!(tested.contains("SUCCESS"), "{tested}");

    let cloud = Cloud::start("prometheus").expect("cloud");
    let mut edge =
        Edge::start(&cloud, "edge-1", "eu-west", &["--label", "tier=edge"], &[]).unwrap();
    let (status, body) = cloud.put_model("digits-mlp", MODEL_ONNX).unwrap();
    assert_eq!(status, 201, "{body}");
    cloud
        .post(
            "/v1/deployments",
            &serde_json::json!({"name": "digits", "model": "digits-mlp", "selector": "tier=edge", "slo_ms": 40}),
        )
        .unwrap();
    cloud
        .wait_for("/v1/deployments/digits", "digits ready", |v| {
            v["ready_devices"] == 1
        })
        .unwrap();
    let row = heldout().features[0].clone();
    for _ in 0..20 {
        assert_eq!(edge.infer("digits", &row).unwrap().0, 200);
    }

    let dir = temp_dir("prometheus");
    // The control plane's /metrics over HTTPS with the cluster CA; the agent's local
    // endpoint is plain HTTP on the device.
    let cloud_target = cloud.addr();
    let edge_target = edge.endpoint.trim_start_matches("http://").to_string();
    let ca = cloud.ca_path();
    let prometheus = Prometheus::start(
        &dir,
        &[
            ("nephele-control-plane", &cloud_target, Some(&ca)),
            ("nephele-agents", &edge_target, None),
        ],
    );
    let targets = prometheus.until("/api/v1/targets", 90, "both targets scraped", |d| {
        let active = d["activeTargets"].as_array().cloned().unwrap_or_default();
        active.len() == 2 && active.iter().all(|t| t["health"] == "up")
    });
    println!(
        "Prometheus scrapes: {}",
        targets["activeTargets"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| format!("{} {}", t["scrapeUrl"], t["health"]))
            .collect::<Vec<_>>()
            .join(", ")
    );
    let online = prometheus.until(
        "/api/v1/query?query=nephele_device_online",
        30,
        "edge-1 online",
        |d| Prometheus::value(d, "edge-1") == Some(1.0),
    );
    assert_eq!(online["result"][0]["metric"]["role"], "edge");
    let slo = prometheus.until(
        "/api/v1/query?query=nephele_agent_slo_milliseconds",
        30,
        "the agent's SLO gauge",
        |d| d["result"].as_array().is_some_and(|r| !r.is_empty()),
    );
    assert_eq!(slo["result"][0]["value"][1], "40");

    // Every shipped rule is loaded and evaluates without error on real series.
    let rules = prometheus.until("/api/v1/rules", 60, "every rule evaluated", |d| {
        let rules: Vec<&Value> = d["groups"]
            .as_array()
            .into_iter()
            .flatten()
            .flat_map(|g| g["rules"].as_array().into_iter().flatten())
            .collect();
        rules.len() == 8 && rules.iter().all(|r| r["health"] == "ok")
    });
    let mut groups: Vec<&str> = rules["groups"]
        .as_array()
        .unwrap()
        .iter()
        .map(|g| g["name"].as_str().unwrap())
        .collect();
    groups.sort_unstable();
    assert_eq!(
        groups,
        [
            "nephele-fleet",
            "nephele-jobs",
            "nephele-rollouts",
            "nephele-serving"
        ]
    );

    // A killed agent is offline in Prometheus (the alert fires 5 minutes later, as
    // promtool's unit test shows).
    edge.kill9();
    let begun = Instant::now();
    prometheus.until(
        "/api/v1/query?query=nephele_device_online",
        90,
        "edge-1 offline",
        |d| Prometheus::value(d, "edge-1") == Some(0.0),
    );
    println!(
        "edge-1 killed: offline in Prometheus after {:.1} s",
        begun.elapsed().as_secs_f64()
    );
    let pending =
        prometheus.until("/api/v1/alerts", 30, "the offline alert pending", |d| {
            d["alerts"].as_array().into_iter().flatten().any(|a| {
                a["labels"]["alertname"] == "NepheleAgentOffline" && a["state"] == "pending"
            })
        });
    assert!(pending.to_string().contains("edge-1"), "{pending}");
}
