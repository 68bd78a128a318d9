//! Staged rollouts on real agents: a new version of a model reaches a canary share of
//! the devices first, is judged on what those devices measure against the devices
//! still on the old version, and is rolled back from exactly the canary when it is
//! slower; a good version reaches every device. Requests go on the whole time, and
//! none of them fails: a device serves the version it runs until the other is loaded.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use nephele_e2e::model_versions::{retagged_digits, slow_digits};
use nephele_e2e::{heldout, Cloud, Edge, MODEL_ONNX};
use serde_json::{json, Value};

const CONFIG: &str = r#"
heartbeat_interval_ms = 300
[[region]]
name = "eu-west"
"#;

const DEVICES: [&str; 3] = ["cam-1", "cam-2", "cam-3"];

/// The tests here run one at a time: the slow version's gate compares p99 latencies,
/// which another test's agents on the same two cores would move.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

/// Pushes a version of `digits` and waits until it is built (the slow version's
/// variants take tens of seconds to measure on a loaded 2-core machine, longer than
/// a request may wait).
fn push(cloud: &Cloud, bytes: &[u8]) -> Value {
    let (status, body) = cloud
        .client()
        .raw("PUT", &format!("{}/v1/models/digits", cloud.api), bytes)
        .expect("upload");
    assert!(
        (200..=202).contains(&status),
        "upload failed: {status} {body}"
    );
    let reference = body["reference"].as_str().expect("reference").to_string();
    let deadline = std::time::Instant::now() + Duration::from_secs(300);
    loop {
        let model = cloud
            .get(&format!("/v1/models/{reference}"))
            .expect("model");
        match model["state"].as_str() {
            Some("ready") => return model,
            Some("building") if std::time::Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(500))
            }
            _ => panic!("{reference} did not build: {model:#}"),
        }
    }
}

fn spec(model: &Value) -> Value {
    json!({
        "name": "digits",
        "model": model["reference"],
        "offload": false,
        "slo_ms": 2000,
        "max_queue": 8,
        "variant": "full",
        "rollout": {
            "steps": [30, 100],
            "min_requests": 100,
            // Long enough for the old devices' p99 window to forget the moment the
            // canary measured its batch sizes (which takes a core for seconds).
            "min_step_s": 10,
            "progress_deadline_s": 120,
            // On a loaded 2-core machine the old version's p99 moves between 1 and
            // several ms (the canary's slow model takes a core); the slow version's
            // is 40–50 ms here. Fail on three times the old and 10 ms more.
            "max_p99_ratio": 3.0,
            "min_p99_increase_ms": 10.0
        }
    })
}

fn loads(edge: &Edge) -> f64 {
    edge.metric("nephele_agent_model_loads_total", "deployment=\"digits\"")
        .expect("agent metrics")
}

/// Every device runs `model` (its bytes reported ready).
fn everyone_runs(cloud: &Cloud, model: &Value) -> Value {
    let reference = model["reference"].as_str().expect("reference").to_string();
    cloud
        .wait_for(
            "/v1/deployments/digits",
            &format!("every device on {reference}"),
            |v| {
                v["devices"].as_array().is_some_and(|rows| {
                    rows.len() == DEVICES.len()
                        && rows
                            .iter()
                            .all(|r| r["model"] == reference.as_str() && r["current"] == true)
                })
            },
        )
        .expect("devices on the version")
}

#[test]
fn a_slow_version_rolls_back_from_the_canary_and_a_good_one_reaches_every_device() {
    let _alone = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    let mut cloud = Cloud::start_with("rollouts", CONFIG).expect("cloud");
    let edges: Vec<Edge> = DEVICES
        .iter()
        .map(|name| Edge::start(&cloud, name, "eu-west", &[], &[]).expect("agent"))
        .collect();
    for name in DEVICES {
        cloud.wait_online(name).expect("online");
    }
    let v1 = push(&cloud, MODEL_ONNX);
    cloud.post("/v1/deployments", &spec(&v1)).expect("deploy");
    everyone_runs(&cloud, &v1);

    // Requests on every device, the whole time.
    let stop = Arc::new(AtomicBool::new(false));
    let failures = Arc::new(Mutex::new(Vec::<String>::new()));
    let served = Arc::new(AtomicU64::new(0));
    let row = heldout().features[0].clone();
    let clients: Vec<_> = edges
        .iter()
        .map(|edge| {
            let endpoint = edge.endpoint.clone();
            let (stop, failures, served, row) =
                (stop.clone(), failures.clone(), served.clone(), row.clone());
            std::thread::spawn(move || {
                let client = nephele_e2e::Http::new(None);
                let body = json!({"shape": [1, row.len()], "data": row});
                let url = format!("{endpoint}/v1/infer/digits");
                while !stop.load(Ordering::Relaxed) {
                    match client.raw_json("POST", &url, &body) {
                        Ok((200, _)) => {
                            served.fetch_add(1, Ordering::Relaxed);
                        }
                        Ok((code, reply)) => failures
                            .lock()
                            .unwrap_or_else(|p| p.into_inner())
                            .push(format!("{endpoint}: {code} {reply}")),
                        Err(error) => failures
                            .lock()
                            .unwrap_or_else(|p| p.into_inner())
                            .push(format!("{endpoint}: {error:#}")),
                    }
                    std::thread::sleep(Duration::from_millis(3));
                }
            })
        })
        .collect();

    // A deliberately slow version: the same answers, far more compute per row.
    let slow = push(&cloud, &slow_digits(512, 1024));
    assert_eq!(slow["name"], "digits");
    assert_ne!(
        slow["version"], v1["version"],
        "another content, another version"
    );
    let started = cloud
        .client()
        .raw_json(
            "PUT",
            &format!("{}/v1/deployments/digits", cloud.api),
            &spec(&slow),
        )
        .expect("update");
    assert_eq!(started.0, 200, "{}", started.1);
    let rollout = &started.1["rollout"];
    assert_eq!(rollout["state"], "progressing", "{rollout:#}");
    assert_eq!(rollout["moved_devices"], json!(["cam-1"]), "{rollout:#}");
    // Another update while one rolls out is refused, saying what to do.
    let again = cloud
        .client()
        .raw_json(
            "PUT",
            &format!("{}/v1/deployments/digits", cloud.api),
            &spec(&v1),
        )
        .expect("second update");
    assert_eq!(again.0, 409, "{}", again.1);

    let rolled_back = cloud
        .wait_for(
            "/v1/deployments/digits/rollout",
            "the slow version's gate",
            |r| r["state"] != "progressing",
        )
        .expect("the rollout ended");
    assert_eq!(rolled_back["state"], "rolled_back", "{rolled_back:#}");
    let gate = rolled_back["gate"].as_str().unwrap_or_default();
    assert!(
        gate.contains("gate failed at step 1") && gate.contains("p99"),
        "{rolled_back:#}"
    );
    eprintln!("slow version: {gate}");
    assert_eq!(rolled_back["moved_devices"], json!(["cam-1"]));
    everyone_runs(&cloud, &v1);
    // Exactly the canary loaded the slow version (and the old one again).
    let counts: Vec<f64> = edges.iter().map(loads).collect();
    assert_eq!(counts, vec![3.0, 1.0, 1.0], "model loads per device");

    // The CLI shows the rollout and why it went back.
    let output = std::process::Command::new(nephele_e2e::bin("nephele"))
        .args(["rollout", "status", "digits"])
        .args(["--api", &cloud.api, "--token", &cloud.token])
        .env("NEPHELE_CA", cloud.ca_path())
        .output()
        .expect("nephele rollout status");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{stdout}");
    eprintln!("after the slow version:\n{stdout}");
    assert!(stdout.contains("rolled back"), "{stdout}");
    assert!(
        stdout.contains("devices on the new version: 1 of 3 selected (cam-1)"),
        "{stdout}"
    );

    // A good version: the same computation in other bytes reaches every device, the
    // canary first, then the rest.
    let good = push(&cloud, &retagged_digits("v3"));
    let output = std::process::Command::new(nephele_e2e::bin("nephele"))
        .args(["deploy", "update", "digits", "--model"])
        .arg(good["reference"].as_str().expect("reference"))
        .args(["--api", &cloud.api, "--token", &cloud.token])
        .env("NEPHELE_CA", cloud.ca_path())
        .output()
        .expect("nephele deploy update");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(
        stdout.contains("rollout 2 of deployment digits: progressing"),
        "{stdout}"
    );

    // kill -9 of the control plane in the middle of the rollout: devices serve on
    // through the outage, and the restarted control plane takes the rollout up where
    // its record says, with no device reloading what it runs.
    cloud.kill9();
    std::thread::sleep(Duration::from_secs(2));
    cloud.restart().expect("restart");
    for name in DEVICES {
        cloud.wait_online(name).expect("back online");
    }
    let resumed = cloud
        .get("/v1/deployments/digits/rollout")
        .expect("rollout");
    assert_eq!(resumed["number"], 2, "{resumed:#}");
    assert_ne!(resumed["state"], "rolled_back", "{resumed:#}");
    let deployments = cloud.get("/v1/deployments").expect("deployments");
    assert_eq!(
        deployments.as_array().map(Vec::len),
        Some(1),
        "{deployments:#}"
    );
    let output = std::process::Command::new(nephele_e2e::bin("nephele"))
        .args(["rollout", "status", "digits", "--watch"])
        .args(["--api", &cloud.api, "--token", &cloud.token])
        .env("NEPHELE_CA", cloud.ca_path())
        .output()
        .expect("nephele rollout status --watch");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(stdout.contains("step 1 of 2 passed"), "{stdout}");
    assert!(
        stdout.contains("complete: every selected device runs the new version"),
        "{stdout}"
    );
    eprintln!("good version:\n{stdout}");
    let status = everyone_runs(&cloud, &good);
    assert_eq!(
        status["model"], good["reference"],
        "the deployment's own version now"
    );
    let counts: Vec<f64> = edges.iter().map(loads).collect();
    assert_eq!(counts, vec![4.0, 2.0, 2.0], "model loads per device");

    stop.store(true, Ordering::Relaxed);
    for client in clients {
        client.join().expect("client thread");
    }
    let failures = failures.lock().unwrap_or_else(|p| p.into_inner()).clone();
    let served = served.load(Ordering::Relaxed);
    eprintln!(
        "{served} requests served during the rollouts, {} failed",
        failures.len()
    );
    assert!(
        failures.is_empty(),
        "failed requests during the rollouts: {failures:#?}"
    );
    assert!(
        served > 300,
        "too little traffic to mean anything: {served}"
    );
}

/// Pushes a version of `digits` with the held-out digits (and their labels) as its
/// validation rows, waiting until it is built.
fn push_validated(cloud: &Cloud, bytes: &[u8]) -> Value {
    use base64::Engine as _;
    let set = heldout();
    let body = json!({
        "onnx_base64": base64::engine::general_purpose::STANDARD.encode(bytes),
        "validation": {"rows": set.features, "labels": set.labels},
    });
    let (status, model) = cloud
        .client()
        .raw_json(
            "PUT",
            &format!("{}/v1/models/digits?wait=true", cloud.api),
            &body,
        )
        .expect("upload");
    assert!((200..=201).contains(&status), "{status} {model:#}");
    model
}

fn full_accuracy(model: &Value) -> f64 {
    model["variants"]
        .as_array()
        .and_then(|v| v.iter().find(|v| v["name"] == "full"))
        .and_then(|v| v["accuracy_pct"].as_f64())
        .unwrap_or_else(|| panic!("no accuracy: {model:#}"))
}

#[test]
fn a_less_accurate_version_is_rolled_back_before_any_device_loads_it() {
    let _alone = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    let cloud = Cloud::start_with("rollout-accuracy", CONFIG).expect("cloud");
    let edge = Edge::start(&cloud, "cam-1", "eu-west", &[], &[]).expect("agent");
    cloud.wait_online("cam-1").expect("online");
    let v1 = push_validated(&cloud, MODEL_ONNX);
    let mut deployment = spec(&v1);
    deployment["rollout"]["min_requests"] = json!(0);
    deployment["rollout"]["min_step_s"] = json!(0);
    cloud.post("/v1/deployments", &deployment).expect("deploy");
    cloud
        .wait_for("/v1/deployments/digits", "digits ready", |v| {
            v["ready_devices"] == 1
        })
        .expect("ready");

    // Retrained badly: loads and runs as fast, answers 0 far too often.
    let worse = push_validated(&cloud, &nephele_e2e::model_versions::biased_digits(8.0));
    let (old, new) = (full_accuracy(&v1), full_accuracy(&worse));
    eprintln!("accuracy on the 360 held-out digits: {old:.2}% → {new:.2}%");
    assert!(new < old - 0.5, "{old} → {new}");
    deployment["model"] = worse["reference"].clone();
    let (status, answer) = cloud
        .client()
        .raw_json(
            "PUT",
            &format!("{}/v1/deployments/digits", cloud.api),
            &deployment,
        )
        .expect("update");
    assert_eq!(status, 200, "{answer:#}");
    let rollout = &answer["rollout"];
    assert_eq!(rollout["state"], "rolled_back", "{rollout:#}");
    assert_eq!(rollout["moved_devices"], json!([]), "{rollout:#}");
    let gate = rollout["gate"].as_str().unwrap_or_default();
    assert!(
        gate.starts_with("accuracy gate failed before the first step")
            && gate.contains("on the same 360 labelled rows"),
        "{gate}"
    );
    eprintln!("{gate}");
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(
        loads(&edge),
        1.0,
        "the device never loaded the worse version"
    );
    let status = cloud.get("/v1/deployments/digits").expect("status");
    assert_eq!(status["model"], v1["reference"], "{status:#}");

    // The same computation in other bytes passes the gate and rolls out.
    let same = push_validated(&cloud, &retagged_digits("accuracy test"));
    deployment["model"] = same["reference"].clone();
    let (status, answer) = cloud
        .client()
        .raw_json(
            "PUT",
            &format!("{}/v1/deployments/digits", cloud.api),
            &deployment,
        )
        .expect("update");
    assert_eq!(status, 200, "{answer:#}");
    let events = answer["rollout"]["events"].to_string();
    assert!(events.contains("accuracy gate passed"), "{events}");
    cloud
        .wait_for("/v1/deployments/digits/rollout", "the rollout done", |r| {
            r["state"] == "complete"
        })
        .expect("complete");
}
