//! Offline-first agents: real `nephele-cloud` and `nephele-edge` processes on loopback.
//! A device restarted while the control plane is down serves what it was given from
//! what it kept (verified again); when the control plane is back it reconciles without
//! reloading; a damaged cache or kept state is refused and replaced; a device deleted
//! in the control plane stops serving and says why, across restarts.
//!
//! The times printed here are what the README quotes; the assertions hold them only to
//! generous bounds, so a slow machine does not fail the test.

#![allow(clippy::unwrap_used)]

use std::time::{Duration, Instant};

use nephele_e2e::{heldout, Cloud, Edge, MODEL_ONNX};
use serde_json::Value;

fn deploy_digits(cloud: &Cloud) {
    let (status, body) = cloud.put_model("digits-mlp", MODEL_ONNX).expect("upload");
    assert!(status == 201, "upload failed: {status} {body}");
    cloud
        .post(
            "/v1/deployments",
            &serde_json::json!({"name": "digits", "model": "digits-mlp", "selector": "tier=edge"}),
        )
        .expect("deploy");
    cloud
        .wait_for("/v1/deployments/digits", "digits ready", |v| {
            v["ready_devices"] == 1
        })
        .unwrap();
}

/// Asks the device until it answers `want`; returns how long that took and the answer.
fn until_status(edge: &Edge, row: &[f32], want: u16, limit: Duration) -> (Duration, Value) {
    let begun = Instant::now();
    loop {
        let answer = edge.infer("digits", row);
        if let Ok((code, body)) = &answer {
            if *code == want {
                return (begun.elapsed(), body.clone());
            }
        }
        assert!(
            begun.elapsed() < limit,
            "no {want} within {limit:?}: last {answer:?}\n{}",
            edge.logs()
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn phase(edge: &Edge) -> String {
    edge.status().unwrap()["deployments"]
        .as_array()
        .and_then(|d| d.iter().find(|d| d["name"] == "digits"))
        .map(|d| d["phase"].as_str().unwrap_or_default().to_string())
        .unwrap_or_default()
}

fn loads(edge: &Edge) -> f64 {
    edge.metric("nephele_agent_model_loads_total", "deployment=\"digits\"")
        .unwrap()
}

#[test]
fn an_agent_restarted_while_the_cloud_is_down_serves_what_it_kept() {
    let mut cloud = Cloud::start("offline").expect("cloud");
    let mut edge =
        Edge::start(&cloud, "edge-1", "eu-west", &["--label", "tier=edge"], &[]).unwrap();
    deploy_digits(&cloud);
    let row = heldout().features[3].clone();
    let (code, before) = edge.infer("digits", &row).unwrap();
    assert_eq!(code, 200, "{before}");

    // The control plane goes away, then the device reboots.
    cloud.kill9();
    let started = Instant::now();
    edge.restart().unwrap();
    let (_, offline) = until_status(&edge, &row, 200, Duration::from_secs(60));
    let serving_after = started.elapsed();
    println!(
        "offline restart: first answer {} ms after the agent was started (no control plane)",
        serving_after.as_millis()
    );
    assert_eq!(offline["data"], before["data"], "same model, same answer");
    assert_eq!(offline["computed_by"], before["computed_by"]);
    let status = edge.status().unwrap();
    assert_eq!(status["connected"], false, "{status}");
    assert_eq!(loads(&edge), 1.0);
    assert!(edge
        .logs()
        .contains("serving the desired state kept on this device"));

    // Heal: the control plane's state is the same, so nothing is loaded again.
    let healed = Instant::now();
    cloud.restart().unwrap();
    cloud.wait_online("edge-1").unwrap();
    cloud
        .wait_for("/v1/deployments/digits", "ready after the heal", |v| {
            v["ready_devices"] == 1
        })
        .unwrap();
    println!(
        "heal: device online and its deployment reported ready {} ms after the control plane was started again",
        healed.elapsed().as_millis()
    );
    // The cloud's desired state reached the reconciler (it is kept once applied).
    let begun = Instant::now();
    while !edge.status().unwrap()["connected"]
        .as_bool()
        .unwrap_or(false)
    {
        assert!(begun.elapsed() < Duration::from_secs(30), "never connected");
        std::thread::sleep(Duration::from_millis(50));
    }
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(loads(&edge), 1.0, "a reconnect must not reload the model");
    let (code, after) = edge.infer("digits", &row).unwrap();
    assert_eq!((code, &after["data"]), (200, &before["data"]));

    // A damaged cache, found while offline: refused with the reason, fetched again
    // once the control plane answers.
    cloud.kill9();
    edge.kill9();
    let models = edge.dir.join("models");
    let mut damaged = 0;
    for entry in std::fs::read_dir(&models).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_none() {
            let mut bytes = std::fs::read(&path).unwrap();
            let middle = bytes.len() / 2;
            bytes[middle] ^= 0x5a;
            std::fs::write(&path, bytes).unwrap();
            damaged += 1;
        }
    }
    assert!(damaged >= 1, "nothing cached in {}", models.display());
    edge.restart().unwrap();
    let begun = Instant::now();
    while !phase(&edge).starts_with("failed") {
        assert!(
            begun.elapsed() < Duration::from_secs(30),
            "the damaged model was not refused: {}",
            edge.status().unwrap()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let reason = phase(&edge);
    assert!(reason.contains("damaged (sha256 mismatch)"), "{reason}");
    let (code, body) = edge.infer("digits", &row).unwrap();
    assert_eq!(code, 503, "a refused model is not served: {body}");
    cloud.restart().unwrap();
    let (fetched_in, answer) = until_status(&edge, &row, 200, Duration::from_secs(60));
    println!(
        "damaged cache: fetched again and serving {} ms after the control plane was back",
        fetched_in.as_millis()
    );
    assert_eq!(answer["data"], before["data"]);
    assert_eq!(
        edge.metric("nephele_agent_corrupt_cache_total", "")
            .unwrap(),
        1.0
    );

    // A damaged kept state: refused whole at start; the control plane's replaces it.
    edge.kill9();
    let kept = edge.dir.join("desired-state.bin");
    let mut bytes = std::fs::read(&kept).unwrap();
    let last = bytes.len() - 1;
    bytes[last] ^= 1;
    std::fs::write(&kept, bytes).unwrap();
    edge.restart().unwrap();
    let (_, answer) = until_status(&edge, &row, 200, Duration::from_secs(60));
    assert_eq!(answer["data"], before["data"]);
    assert_eq!(
        edge.metric("nephele_agent_kept_state_refused_total", "")
            .unwrap(),
        1.0
    );
    assert!(edge
        .logs()
        .contains("the desired state kept on this device is refused"));
}

#[test]
fn a_device_deleted_in_the_control_plane_stops_serving_and_says_why() {
    let mut cloud = Cloud::start("removed").expect("cloud");
    let mut edge =
        Edge::start(&cloud, "edge-1", "eu-west", &["--label", "tier=edge"], &[]).unwrap();
    deploy_digits(&cloud);
    let row = heldout().features[0].clone();
    assert_eq!(edge.infer("digits", &row).unwrap().0, 200);

    cloud.delete("/v1/devices/edge-1").unwrap();
    let (took, body) = until_status(&edge, &row, 410, Duration::from_secs(30));
    println!(
        "deleted device: 410 on its endpoint {} ms after the DELETE",
        took.as_millis()
    );
    let error = body["message"].as_str().unwrap_or_default();
    assert!(error.contains("deleted from the fleet"), "{body}");
    assert!(error.contains("nephele-edge join"), "{body}");
    let status = edge.status().unwrap();
    assert!(status["removed"].is_string(), "{status}");
    assert_eq!(status["deployments"], serde_json::json!([]), "{status}");

    // Kept across a restart, even with the control plane down: the device does not
    // go back to serving what it was given before.
    cloud.kill9();
    edge.restart().unwrap();
    let (code, body) = edge.infer("digits", &row).unwrap();
    assert_eq!(code, 410, "{body}");
}

fn served_local(cloud: &Cloud) -> u64 {
    cloud.get("/v1/devices/edge-1/usage").unwrap()["deployments"]["digits"]["served_local"]
        .as_u64()
        .unwrap_or(0)
}

/// Usage is kept on the device until the control plane has counted it: requests served
/// during a partition, across an agent restart, are all counted once after the heal.
#[test]
fn usage_served_through_a_partition_and_a_restart_is_counted_exactly_once() {
    let mut cloud = Cloud::start("usage").expect("cloud");
    let mut edge = Edge::start(
        &cloud,
        "edge-1",
        "eu-west",
        &["--label", "tier=edge"],
        &["--usage-window-ms", "200"],
    )
    .unwrap();
    deploy_digits(&cloud);
    let row = heldout().features[2].clone();
    let ask = |edge: &Edge, n: u64| {
        for _ in 0..n {
            let (code, body) = edge.infer("digits", &row).unwrap();
            assert_eq!(code, 200, "{body}");
        }
    };
    ask(&edge, 5);
    let begun = Instant::now();
    while served_local(&cloud) < 5 {
        assert!(begun.elapsed() < Duration::from_secs(30), "never counted");
        std::thread::sleep(Duration::from_millis(50));
    }

    // Partition: the control plane is gone; the device serves, then restarts.
    cloud.kill9();
    ask(&edge, 7);
    std::thread::sleep(Duration::from_millis(700));
    edge.restart().unwrap();
    let pending = edge.status().unwrap()["usage"]["pending"].as_u64().unwrap();
    assert!(
        pending >= 1,
        "the partition's usage is kept across the restart"
    );
    let (_, _) = until_status(&edge, &row, 200, Duration::from_secs(30));
    ask(&edge, 3);
    std::thread::sleep(Duration::from_millis(700));

    // Heal: everything is delivered, and counted once however often it was sent.
    let healed = Instant::now();
    cloud.restart().unwrap();
    while served_local(&cloud) < 16 {
        assert!(
            healed.elapsed() < Duration::from_secs(30),
            "counted {} of 16",
            served_local(&cloud)
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    println!(
        "usage: 16 requests served across a partition and an agent restart, all counted {} ms after the control plane came back",
        healed.elapsed().as_millis()
    );
    while edge.status().unwrap()["usage"]["pending"] != 0 {
        assert!(
            healed.elapsed() < Duration::from_secs(30),
            "never acknowledged"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    std::thread::sleep(Duration::from_millis(1_000));
    let usage = cloud.get("/v1/devices/edge-1/usage").unwrap();
    assert_eq!(
        usage["deployments"]["digits"]["served_local"], 16,
        "{usage}"
    );
    assert_eq!(usage["dropped"], 0, "{usage}");
    assert_eq!(
        usage["records"], usage["last_seq"],
        "numbered from 1 without gaps: {usage}"
    );
    // The CLI shows the same.
    let output = std::process::Command::new(nephele_e2e::bin("nephele"))
        .args(["device", "usage", "edge-1"])
        .args(["--api", &cloud.api, "--token", &cloud.token])
        .env("NEPHELE_CA", cloud.ca_path())
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{text}");
    let row = text
        .lines()
        .find(|l| l.starts_with("digits"))
        .unwrap_or_else(|| panic!("{text}"));
    assert_eq!(
        row.split_whitespace().nth(1),
        Some("16"),
        "served locally: {text}"
    );
}
