//! Two control-plane replicas on one three-member etcd cluster: one leads, the other
//! waits. Killing the leader moves the fleet to the standby within the lease time,
//! with nothing lost and nothing reloaded on the device; a leader paused past its
//! lease is deposed, and when it wakes it can write nothing (fencing) and exits. A
//! standby forwards its API to the leader (a write and a read go through it), answers
//! `?stale` reads from its own copy of the store, refuses writes with 503 while the
//! leader it knows is dead, and meanwhile answers reads from its copy.
//!
//! The times printed here are what the README quotes; the assertions hold them only to
//! generous bounds, so a slow machine does not fail the test.

#![allow(clippy::unwrap_used)]

use std::process::Command;
use std::time::{Duration, Instant};

use nephele_e2e::etcd::EtcdCluster;
use nephele_e2e::{heldout, names, temp_dir, Cloud, Edge, Http, MODEL_ONNX, TWO_REGIONS};
use serde_json::{json, Value};

fn deploy(cloud: &Cloud, name: &str) -> anyhow::Result<(u16, Value)> {
    Http::new(Some(cloud.token.clone())).raw_json(
        "POST",
        &format!("{}/v1/deployments", cloud.api),
        &json!({"name": name, "model": "digits-mlp", "selector": "tier=edge"}),
    )
}

fn signal(pid: u32, name: &str) {
    let status = Command::new("kill")
        .args([&format!("-{name}"), &pid.to_string()])
        .status()
        .unwrap();
    assert!(status.success(), "kill -{name} {pid}");
}

#[test]
fn the_standby_takes_over_and_a_deposed_leader_cannot_write() {
    let Some(etcd) = EtcdCluster::start("failover", 3).unwrap() else {
        return;
    };
    let shared = temp_dir("ha-shared");
    let mut a = Cloud::replica("ha-a", TWO_REGIONS, &etcd.endpoints(), &shared).unwrap();
    a.wait_leading(60).unwrap();
    a.token = std::fs::read_to_string(a.dir.join("data/admin-token"))
        .unwrap()
        .trim()
        .to_string();
    let mut b = Cloud::replica("ha-b", TWO_REGIONS, &etcd.endpoints(), &shared).unwrap();
    b.token = a.token.clone();
    std::thread::sleep(Duration::from_secs(2));
    assert!(b.wait_leading(0).is_err(), "two replicas lead at once");
    assert!(b.logs().contains("standby"), "{}", b.logs());

    // A device that knows both replicas, serving a model pushed through the leader.
    let servers = format!("{},{}", a.quic, b.quic);
    let edge = Edge::start_via(
        &a,
        &servers,
        "edge-1",
        "eu-west",
        &["--label", "tier=edge"],
        &[],
    )
    .unwrap();
    let (status, body) = a.put_model("digits-mlp", MODEL_ONNX).unwrap();
    assert_eq!(status, 201, "{body}");
    // The standby forwards its API to the leader: a write and a read through it.
    let (status, body) = deploy(&b, "digits").unwrap();
    assert_eq!(status, 201, "a write through the standby: {body}");
    a.wait_for("/v1/deployments/digits", "digits ready", |v| {
        v["ready_devices"] == 1
    })
    .unwrap();
    assert_eq!(
        names(&b.get("/v1/devices").unwrap()),
        ["edge-1"],
        "a read through the standby"
    );
    // Asked for `?stale`, the standby answers from its own copy of the store, says so,
    // and leaves out what only the leader knows (live state); a wrong token is refused
    // there too.
    let stale = |path: &str, token: &str| {
        Http::new(Some(token.to_string()))
            .get_full(&format!("{}{path}", b.api))
            .unwrap()
    };
    let (status, headers, devices) = stale("/v1/devices?stale", &b.token);
    assert_eq!(status, 200, "{devices}");
    assert_eq!(headers["x-nephele-stale"], "true", "{headers:?}");
    assert_eq!(headers["x-nephele-known-leader"], "true", "{headers:?}");
    assert_eq!(names(&devices), ["edge-1"]);
    assert_eq!(devices[0]["online"], Value::Null, "{devices}");
    assert_eq!(devices[0]["health"], "unknown", "{devices}");
    let (_, _, deployment) = stale("/v1/deployments/digits?stale", &b.token);
    assert!(
        deployment["model"]
            .as_str()
            .is_some_and(|m| m.starts_with("digits-mlp:")),
        "{deployment}"
    );
    assert_eq!(deployment["desired_devices"], 1, "{deployment}");
    let (status, _, body) = stale("/v1/devices?stale", "nobody.secret");
    assert_eq!(status, 401, "{body}");
    let (status, headers, _) = stale("/v1/devices", &b.token);
    assert_eq!(status, 200);
    assert!(
        !headers.contains_key("x-nephele-stale"),
        "without ?stale the leader answers: {headers:?}"
    );
    let row = heldout().features[6].clone();

    // The leader dies. Until the standby leads, a write through it is refused (503,
    // retry) and not made.
    a.kill9();
    let killed = Instant::now();
    let (status, body) = deploy(&b, "in-the-gap").unwrap();
    assert_eq!(status, 503, "{body}");
    assert!(
        body["message"].as_str().unwrap_or("").contains("retry"),
        "{body}"
    );
    // Reads are still answered meanwhile, from the standby's copy.
    let asked = Instant::now();
    let (status, headers, models) = stale("/v1/models", &b.token);
    let stale_read = asked.elapsed();
    assert_eq!(status, 200, "{models}");
    assert_eq!(headers["x-nephele-stale"], "true", "{headers:?}");
    assert!(
        headers["x-nephele-stale-reason"].contains("cannot reach the leader"),
        "{headers:?}"
    );
    assert_eq!(names(&models), ["digits-mlp"]);
    let (status, _, deployments) = stale("/v1/deployments", &b.token);
    assert_eq!(status, 200, "{deployments}");
    assert_eq!(names(&deployments), ["digits"]);
    // The CLI says where such an answer came from.
    let output = Command::new(nephele_e2e::bin("nephele"))
        .args(["device", "list", "--api", &b.api, "--token", &b.token])
        .env("NEPHELE_CA", b.ca_path())
        .output()
        .unwrap();
    let (stdout, stderr) = (
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr),
    );
    assert!(output.status.success(), "{stdout}{stderr}");
    assert!(stdout.contains("edge-1"), "{stdout}");
    assert!(
        stderr.contains("answered from a standby's copy"),
        "{stderr}"
    );
    println!(
        "etcd failover: with the leader dead, the standby answered a read from its copy in {} ms",
        stale_read.as_millis()
    );
    let led_after = b.wait_leading(30).unwrap();
    let b_leads = killed.elapsed();
    assert!(
        edge.infer("digits", &row).unwrap().0 == 200,
        "the device serves throughout"
    );
    b.wait_online("edge-1").unwrap();
    let device_back = killed.elapsed();
    b.wait_for(
        "/v1/deployments/digits",
        "digits ready via the new leader",
        |v| v["ready_devices"] == 1,
    )
    .unwrap();
    println!(
        "etcd failover: the standby led {} ms after the leader was killed (waited {} ms), \
         the device was back online on it after {} ms",
        b_leads.as_millis(),
        led_after.as_millis(),
        device_back.as_millis()
    );
    assert_eq!(names(&b.get("/v1/models").unwrap()), ["digits-mlp"]);
    assert_eq!(names(&b.get("/v1/deployments").unwrap()), ["digits"]);
    assert_eq!(names(&b.get("/v1/devices").unwrap()), ["edge-1"]);
    assert_eq!(
        edge.metric("nephele_agent_model_loads_total", "").unwrap(),
        1.0,
        "nothing reloaded"
    );
    // A new push through the new leader reaches the device (blobs are shared).
    let (status, body) = deploy(&b, "digits-b").unwrap();
    assert_eq!(status, 201, "{body}");
    b.wait_for("/v1/deployments/digits-b", "digits-b ready", |v| {
        v["ready_devices"] == 1
    })
    .unwrap();

    // The old leader comes back as a standby.
    a.restart_replica().unwrap();
    std::thread::sleep(Duration::from_secs(2));
    assert!(a.wait_leading(0).is_err(), "two replicas lead at once");

    // The leader is paused past its lease: the standby takes over; when the paused
    // one wakes, it writes nothing and leaves.
    signal(b.pid(), "STOP");
    let paused = Instant::now();
    let a_led = a.wait_leading(30);
    signal(b.pid(), "CONT");
    a_led.unwrap();
    let a_leads = paused.elapsed();
    let late_write = deploy(&b, "from-the-deposed-leader");
    assert!(
        !matches!(late_write, Ok((201, _))),
        "a deposed leader took a write: {late_write:?}"
    );
    let begun = Instant::now();
    let status = loop {
        if let Some(status) = b.exited() {
            break status;
        }
        assert!(
            begun.elapsed() < Duration::from_secs(15),
            "the deposed leader did not stop:\n{}",
            b.logs()
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    println!(
        "etcd fencing: leader paused; the standby led {} ms later; the woken leader's write was refused ({}) and it exited ({status})",
        a_leads.as_millis(),
        match &late_write {
            Ok((code, _)) => code.to_string(),
            Err(error) => format!("{error}"),
        }
    );
    assert_eq!(status.code(), Some(75), "{}", b.logs());
    assert_eq!(
        names(&a.get("/v1/deployments").unwrap()),
        ["digits", "digits-b"],
        "nothing from the deposed leader"
    );
    a.wait_online("edge-1").unwrap();
    assert_eq!(edge.infer("digits-b", &row).unwrap().0, 200);
    let _ = std::fs::remove_dir_all(&shared);
}
