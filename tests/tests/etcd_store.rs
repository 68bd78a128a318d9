//! The control plane's state in a real three-member etcd cluster on loopback, instead
//! of the embedded redb file: it survives a control-plane crash together with the loss
//! of an etcd member, and a cluster without a quorum makes the control plane refuse
//! writes with a clear error (503) while it keeps answering reads and its devices keep
//! serving; once a majority is back, writes are taken again and nothing refused was
//! applied.
//!
//! The times printed here are what the README quotes; the assertions hold them only to
//! generous bounds, so a slow machine does not fail the test.

#![allow(clippy::unwrap_used)]

use std::time::{Duration, Instant};

use nephele_e2e::etcd::EtcdCluster;
use nephele_e2e::{heldout, names, Cloud, Edge, Http, MODEL_ONNX, TWO_REGIONS};
use serde_json::{json, Value};

fn deploy(cloud: &Cloud, name: &str) -> (u16, Value) {
    Http::new(Some(cloud.token.clone()))
        .raw_json(
            "POST",
            &format!("{}/v1/deployments", cloud.api),
            &json!({"name": name, "model": "digits-mlp", "selector": "tier=edge"}),
        )
        .unwrap()
}

fn wait_ready(cloud: &Cloud, name: &str) {
    cloud
        .wait_for(
            &format!("/v1/deployments/{name}"),
            &format!("{name} ready"),
            |v| v["ready_devices"] == 1,
        )
        .unwrap();
}

fn loads(edge: &Edge) -> f64 {
    edge.metric("nephele_agent_model_loads_total", "").unwrap()
}

/// A control plane on etcd with one device serving `digits`.
fn fleet(label: &str, etcd: &EtcdCluster) -> (Cloud, Edge) {
    let cloud = Cloud::start_on_etcd(label, TWO_REGIONS, &etcd.endpoints()).expect("cloud");
    assert!(
        !cloud.dir.join("data/state.redb").exists(),
        "the state must be in etcd, not in redb"
    );
    let edge = Edge::start(&cloud, "edge-1", "eu-west", &["--label", "tier=edge"], &[]).unwrap();
    let (status, body) = cloud.put_model("digits-mlp", MODEL_ONNX).unwrap();
    assert_eq!(status, 201, "{body}");
    let (status, body) = deploy(&cloud, "digits");
    assert_eq!(status, 201, "{body}");
    wait_ready(&cloud, "digits");
    (cloud, edge)
}

#[test]
fn the_state_in_etcd_survives_a_crash_and_the_loss_of_a_member() {
    let Some(mut etcd) = EtcdCluster::start("crash", 3).unwrap() else {
        return;
    };
    let (mut cloud, edge) = fleet("etcd-crash", &etcd);
    let token = cloud.join_token("eu-west", 600).unwrap();

    // The control plane crashes, and so does the etcd member it was talking to.
    cloud.kill9();
    etcd.kill(0);
    let restarted = Instant::now();
    cloud.restart().unwrap();
    println!(
        "etcd: control plane restarted on 2 of 3 members, ready in {} ms",
        restarted.elapsed().as_millis()
    );
    let devices = cloud.get("/v1/devices").unwrap();
    assert_eq!(names(&devices), ["edge-1"], "{devices}");
    assert_eq!(names(&cloud.get("/v1/deployments").unwrap()), ["digits"]);
    assert_eq!(names(&cloud.get("/v1/models").unwrap()), ["digits-mlp"]);
    cloud.wait_online("edge-1").unwrap();
    wait_ready(&cloud, "digits");
    assert_eq!(loads(&edge), 1.0, "nothing reloaded");
    // The token issued before the crash is still there, unspent: a device joins with it.
    let dir = cloud.dir.join("edge-2");
    let (ok, output) = nephele_e2e::join(&cloud, &dir, "edge-2", &token, &[]).unwrap();
    assert!(ok, "{output}");
    // Writes go on with two members of three.
    let (status, body) = deploy(&cloud, "digits-2");
    assert_eq!(status, 201, "{body}");
    wait_ready(&cloud, "digits-2");
    // The member comes back and catches up; the state is whole.
    etcd.restart(0).unwrap();
    etcd.wait_healthy(0).unwrap();
    assert_eq!(
        names(&cloud.get("/v1/deployments").unwrap()),
        ["digits", "digits-2"]
    );
}

#[test]
fn without_a_quorum_writes_are_refused_and_reads_and_serving_go_on() {
    let Some(mut etcd) = EtcdCluster::start("quorum", 3).unwrap() else {
        return;
    };
    let (cloud, edge) = fleet("etcd-quorum", &etcd);
    let row = heldout().features[1].clone();

    // Two of three members are lost: no quorum.
    etcd.kill(1);
    etcd.kill(2);
    let asked = Instant::now();
    let (status, body) = deploy(&cloud, "refused");
    let refused_in = asked.elapsed();
    assert_eq!(status, 503, "{body}");
    assert_eq!(body["error"], "unavailable", "{body}");
    let message = body["message"].as_str().unwrap_or_default();
    assert!(message.contains("no quorum"), "{message}");
    assert!(message.contains("not made"), "{message}");
    // Reads are answered (from the member's own copy), and the device serves.
    let asked = Instant::now();
    let deployments = cloud.get("/v1/deployments").unwrap();
    let read_in = asked.elapsed();
    assert_eq!(names(&deployments), ["digits"], "{deployments}");
    let (code, answer) = edge.infer("digits", &row).unwrap();
    assert_eq!(code, 200, "{answer}");
    println!(
        "etcd without quorum: a write refused (503) in {} ms, a read answered in {} ms, the device serves",
        refused_in.as_millis(),
        read_in.as_millis()
    );

    // A majority is back: writes are taken again; the refused one was never applied.
    etcd.restart(1).unwrap();
    etcd.wait_healthy(0).unwrap();
    etcd.wait_healthy(1).unwrap();
    assert_eq!(names(&cloud.get("/v1/deployments").unwrap()), ["digits"]);
    let begun = Instant::now();
    loop {
        let (status, body) = deploy(&cloud, "after");
        if status == 201 {
            break;
        }
        assert!(
            begun.elapsed() < Duration::from_secs(30),
            "writes not taken again: {status} {body}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    wait_ready(&cloud, "after");
    assert_eq!(
        names(&cloud.get("/v1/deployments").unwrap()),
        ["after", "digits"]
    );
    assert_eq!(loads(&edge), 2.0, "digits once, after once");
}
