//! Faults across a network: the agent in a Linux network namespace of its own, the
//! control plane in the test's, and between them a link the test slows, makes lossy,
//! cuts and heals, or moves the agent to a new address on (`nephele_e2e::netlab`). Real
//! `nephele-cloud` and `nephele-edge` processes, real QUIC and TLS.
//!
//! What must hold: a large desired state crosses a slow lossy link without the control
//! stream losing its framing; a partition neither restarts nor reloads what the device
//! serves, and every usage record it kept is counted exactly once after the heal; an
//! address change keeps the session (QUIC connection migration), with nothing reloaded.
//!
//! The times printed here are what the README quotes; the assertions hold them only to
//! generous bounds, so a slow machine does not fail the test.

#![allow(clippy::unwrap_used)]

use std::time::{Duration, Instant};

use nephele_e2e::netlab::{Impairment, Lab};
use nephele_e2e::{heldout, Cloud, Edge, MODEL_ONNX, TWO_REGIONS};
use serde_json::Value;

/// A lab and a control plane listening on its link; `None` when skipped.
fn lab_and_cloud(label: &str) -> Option<(Lab, Cloud)> {
    let lab = Lab::start().expect("network lab")?;
    let cloud =
        Cloud::start_listening(label, TWO_REGIONS, &format!("{}:0", lab.cloud_ip)).expect("cloud");
    Some((lab, cloud))
}

fn upload_digits(cloud: &Cloud) {
    let (status, body) = cloud.put_model("digits-mlp", MODEL_ONNX).expect("upload");
    assert!(status == 201, "upload failed: {status} {body}");
}

fn deploy(cloud: &Cloud, name: &str) {
    cloud
        .post(
            "/v1/deployments",
            &serde_json::json!({"name": name, "model": "digits-mlp", "selector": "tier=edge"}),
        )
        .expect("deploy");
}

fn wait_ready(cloud: &Cloud, name: &str, seconds: u64) {
    cloud
        .wait_long(
            &format!("/v1/deployments/{name}"),
            &format!("{name} ready on the device"),
            seconds,
            |v| v["ready_devices"] == 1,
        )
        .unwrap();
}

/// A lab with a 10 ms link, a control plane, and `edge-1` across it (run with
/// `run_args`) serving `digits`.
fn serving_across_a_link(label: &str, run_args: &[&str]) -> Option<(Lab, Cloud, Edge)> {
    let (lab, cloud) = lab_and_cloud(label)?;
    lab.impair(Impairment {
        delay: Duration::from_millis(10),
        ..Impairment::CLEAN
    });
    let edge = Edge::start_in(
        &lab,
        &cloud,
        "edge-1",
        "eu-west",
        &["--label", "tier=edge"],
        run_args,
    )
    .unwrap();
    upload_digits(&cloud);
    deploy(&cloud, "digits");
    wait_ready(&cloud, "digits", 60);
    Some((lab, cloud, edge))
}

fn device(cloud: &Cloud, name: &str) -> Value {
    cloud
        .get("/v1/devices")
        .unwrap()
        .as_array()
        .and_then(|devices| devices.iter().find(|d| d["name"] == name).cloned())
        .unwrap_or(Value::Null)
}

fn sessions(edge: &Edge) -> f64 {
    edge.metric("nephele_agent_sessions_total", "").unwrap()
}

fn loads(edge: &Edge) -> f64 {
    edge.metric("nephele_agent_model_loads_total", "").unwrap()
}

fn served_local(cloud: &Cloud) -> u64 {
    cloud.get("/v1/devices/edge-1/usage").unwrap()["deployments"]["digits"]["served_local"]
        .as_u64()
        .unwrap_or(0)
}

fn ask(edge: &Edge, n: u64) {
    let row = heldout().features[4].clone();
    for _ in 0..n {
        let (code, body) = edge.infer("digits", &row).unwrap();
        assert_eq!(code, 200, "{body}");
    }
}

/// Waits until `check` holds, polling; fails with `what` after `limit`.
fn until(what: &str, limit: Duration, check: impl Fn() -> bool) -> Duration {
    let begun = Instant::now();
    while !check() {
        assert!(begun.elapsed() < limit, "{what} not within {limit:?}");
        std::thread::sleep(Duration::from_millis(50));
    }
    begun.elapsed()
}

/// Many deployments make a desired state that takes seconds to cross an 80 ms, 2% loss,
/// 5 Mbit/s link, while heartbeats go on: the agent's control stream must keep its
/// framing (once it read payload bytes as a length and reconnected again and again).
#[test]
fn a_large_desired_state_crosses_a_slow_lossy_link() {
    let Some((lab, cloud)) = lab_and_cloud("lossy") else {
        return;
    };
    let edge = Edge::start_in(
        &lab,
        &cloud,
        "edge-1",
        "eu-west",
        &["--label", "tier=edge"],
        &[],
    )
    .unwrap();
    cloud.wait_online("edge-1").unwrap();
    upload_digits(&cloud);
    lab.impair(Impairment {
        delay: Duration::from_millis(40),
        jitter: Duration::from_millis(5),
        loss: 0.02,
        rate_bps: 5e6,
    });
    let count = 24;
    let begun = Instant::now();
    for n in 0..count {
        deploy(&cloud, &format!("digits-{n:02}"));
    }
    for n in 0..count {
        wait_ready(&cloud, &format!("digits-{n:02}"), 180);
    }
    let elapsed = begun.elapsed();
    let stats = lab.stats();
    println!(
        "lossy link (80 ms, 2% loss, 5 Mbit/s): {count} deployments ready on the device in {:.1} s; \
         {} packets ({} KiB) carried, {} lost, {} overflowed",
        elapsed.as_secs_f64(),
        stats.packets,
        stats.bytes / 1024,
        stats.lost,
        stats.overflowed
    );
    assert!(stats.lost > 0, "the link lost nothing: {stats:?}");
    let logs = edge.logs();
    assert!(
        !logs.contains("exceeds the"),
        "the control stream lost its framing:\n{logs}"
    );
    assert_eq!(sessions(&edge), 1.0, "the agent reconnected:\n{logs}");
    assert_eq!(
        loads(&edge),
        f64::from(count),
        "each deployment loaded once"
    );
    assert_eq!(device(&cloud, "edge-1")["session"], 1);
}

/// A partition shorter than QUIC's idle timeout is ridden out by the session; a longer
/// one ends it and the agent reconnects after the heal; a link flapping every second
/// is ridden out. Throughout, the device keeps serving, loads nothing again, and every
/// request it served is counted once.
#[test]
fn a_partition_neither_restarts_nor_reloads_and_every_record_is_counted_once() {
    let Some((lab, cloud, edge)) =
        serving_across_a_link("partition", &["--usage-window-ms", "200"])
    else {
        return;
    };
    ask(&edge, 5);
    until("5 requests counted", Duration::from_secs(30), || {
        served_local(&cloud) == 5
    });
    assert_eq!(loads(&edge), 1.0);

    // Short: 6 s, under the 15 s idle timeout.
    lab.partition();
    ask(&edge, 4);
    std::thread::sleep(Duration::from_secs(6));
    lab.heal();
    let short_counted = until(
        "the short partition's usage counted",
        Duration::from_secs(30),
        || served_local(&cloud) == 9,
    );
    assert_eq!(sessions(&edge), 1.0, "the session survives a 6 s partition");
    assert_eq!(device(&cloud, "edge-1")["session"], 1);

    // Long: until both sides have given the session up, then 5 s more.
    lab.partition();
    let cut = Instant::now();
    ask(&edge, 6);
    until(
        "the agent to notice the partition",
        Duration::from_secs(40),
        || edge.metric("nephele_agent_connected", "").unwrap() == 0.0,
    );
    until(
        "the control plane to notice",
        Duration::from_secs(40),
        || device(&cloud, "edge-1")["online"] == false,
    );
    ask(&edge, 2);
    std::thread::sleep(Duration::from_secs(5));
    let partitioned_for = cut.elapsed();
    assert!(edge.status().unwrap()["usage"]["pending"].as_u64().unwrap() >= 1);
    lab.heal();
    let healed = Instant::now();
    cloud.wait_online("edge-1").unwrap();
    let reconnected = healed.elapsed();
    until(
        "the long partition's usage counted",
        Duration::from_secs(30),
        || served_local(&cloud) == 17,
    );
    let counted = healed.elapsed();
    until("usage acknowledged", Duration::from_secs(30), || {
        edge.status().unwrap()["usage"]["pending"] == 0
    });
    println!(
        "partition: 6 s partition ridden out by the session, its usage counted {} ms after the heal; \
         {:.1} s partition: reconnected {} ms and all 17 requests counted {} ms after the heal",
        short_counted.as_millis(),
        partitioned_for.as_secs_f64(),
        reconnected.as_millis(),
        counted.as_millis()
    );
    // A flapping link: down 1 s, up 1 s, ten times, serving all along; the session
    // rides it out (each outage is under the idle timeout).
    for _ in 0..10 {
        lab.partition();
        ask(&edge, 1);
        std::thread::sleep(Duration::from_secs(1));
        lab.heal();
        ask(&edge, 1);
        std::thread::sleep(Duration::from_secs(1));
    }
    until(
        "the flapping link's usage counted",
        Duration::from_secs(30),
        || served_local(&cloud) == 37,
    );
    // Settle, then check nothing was counted twice.
    std::thread::sleep(Duration::from_secs(1));
    let usage = cloud.get("/v1/devices/edge-1/usage").unwrap();
    assert_eq!(
        usage["deployments"]["digits"]["served_local"], 37,
        "{usage}"
    );
    assert_eq!(usage["dropped"], 0, "{usage}");
    assert_eq!(usage["records"], usage["last_seq"], "no gaps: {usage}");
    assert_eq!(
        sessions(&edge),
        2.0,
        "one reconnect, after the long partition; none while the link flapped"
    );
    assert_eq!(loads(&edge), 1.0, "nothing reloaded:\n{}", edge.logs());
    assert_eq!(device(&cloud, "edge-1")["session"], 2);
}

/// The device's address changes mid-session (a new DHCP lease, a move between
/// networks): QUIC migrates the connection, the session and what it serves stay, and
/// the control plane reaches the device at its new address.
#[test]
fn an_address_change_keeps_the_session() {
    let Some((mut lab, cloud, edge)) = serving_across_a_link("migrate", &[]) else {
        return;
    };
    let old = lab.edge_ip;
    let before = device(&cloud, "edge-1");
    assert!(
        before["address"]
            .as_str()
            .is_some_and(|a| a.starts_with(&format!("{old}:"))),
        "{before}"
    );

    let new = lab.change_edge_address().unwrap();
    let moved = Instant::now();
    until(
        "the control plane to see the new address",
        Duration::from_secs(30),
        || {
            device(&cloud, "edge-1")["address"]
                .as_str()
                .is_some_and(|a| a.starts_with(&format!("{new}:")))
        },
    );
    let migrated = moved.elapsed();
    // The control plane reaches the device there: a new deployment arrives.
    deploy(&cloud, "digits-after-move");
    wait_ready(&cloud, "digits-after-move", 60);
    ask(&edge, 3);
    println!(
        "address change: {old} → {new}, the control plane saw the new address {} ms later, same session",
        migrated.as_millis()
    );
    assert!(
        lab.edge_sources().contains(&new),
        "{:?}",
        lab.edge_sources()
    );
    assert_eq!(sessions(&edge), 1.0, "no new session:\n{}", edge.logs());
    assert_eq!(device(&cloud, "edge-1")["session"], 1);
    assert_eq!(
        edge.metric("nephele_agent_model_loads_total", "deployment=\"digits\"")
            .unwrap(),
        1.0,
        "nothing reloaded"
    );
}
