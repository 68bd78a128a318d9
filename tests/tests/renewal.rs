//! Agent certificates renewed before they expire, over the mutual-TLS session: real
//! `nephele-cloud` and `nephele-edge` processes on loopback. The renewed certificate is
//! stored on the device, the next session uses it, and the old one is refused from
//! then on (a copy of the old data dir is told it was superseded and stops serving).

#![allow(clippy::unwrap_used)]

use std::time::{Duration, Instant};

use nephele_e2e::{heldout, Cloud, Edge, MODEL_ONNX};

fn wait_until(what: &str, limit: Duration, mut done: impl FnMut() -> bool) {
    let begun = Instant::now();
    while !done() {
        assert!(begun.elapsed() < limit, "{what} not within {limit:?}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn certificates_are_renewed_over_the_session_and_the_old_one_is_retired() {
    let cloud = Cloud::start("renewal").expect("cloud");
    let mut edge =
        Edge::start(&cloud, "edge-1", "eu-west", &["--label", "tier=edge"], &[]).unwrap();
    let (status, body) = cloud.put_model("digits-mlp", MODEL_ONNX).expect("upload");
    assert_eq!(status, 201, "{body}");
    cloud
        .post(
            "/v1/deployments",
            &serde_json::json!({"name": "digits", "model": "digits-mlp", "selector": "tier=edge"}),
        )
        .unwrap();
    cloud
        .wait_for("/v1/deployments/digits", "ready", |v| {
            v["ready_devices"] == 1
        })
        .unwrap();
    let row = heldout().features[1].clone();
    let (code, before) = edge.infer("digits", &row).unwrap();
    assert_eq!(code, 200, "{before}");

    // A year's certificate is not due: nothing renewed on the default schedule.
    let not_after = edge.status().unwrap()["certificate_not_after_unix"]
        .as_i64()
        .unwrap();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64;
    assert!(not_after > now + 360 * 86_400, "{not_after}");
    assert!(!edge.logs().contains("certificate renewed"));

    // Keep the enrolment as it is now, then make renewal due at once.
    let old_dir = cloud.dir.join("edge-1-before-renewal");
    std::fs::create_dir_all(&old_dir).unwrap();
    for file in [
        "agent.toml",
        "agent.key",
        "agent.pem",
        "ca.pem",
        "manifest-signing.pub",
    ] {
        std::fs::copy(edge.dir.join(file), old_dir.join(file)).unwrap();
    }
    let old_cert = std::fs::read(edge.dir.join("agent.pem")).unwrap();
    edge.run_args = vec!["--renew-before-days".into(), "400".into()];
    edge.restart().unwrap();
    wait_until("the renewal", Duration::from_secs(30), || {
        edge.logs().contains("certificate renewed")
    });
    let new_cert = std::fs::read(edge.dir.join("agent.pem")).unwrap();
    assert_ne!(new_cert, old_cert, "a new certificate is stored");
    assert!(!edge.dir.join("agent.key.new").exists());
    assert!(!edge.dir.join("agent.pem.new").exists());
    assert_eq!(
        edge.metric("nephele_agent_certificate_renewals_total", "")
            .unwrap(),
        1.0
    );

    // The next session connects with the new certificate, which retires the old.
    edge.run_args.clear();
    edge.restart().unwrap();
    wait_until(
        "the new certificate in use",
        Duration::from_secs(30),
        || {
            cloud
                .logs()
                .contains("renewed certificate in use; the previous one is retired")
        },
    );
    let (code, after) = edge.infer("digits", &row).unwrap();
    assert_eq!((code, &after["data"]), (200, &before["data"]));
    assert!(edge.status().unwrap()["connected"].as_bool().unwrap());

    // The old certificate is refused from now on: a device still holding it is told it
    // was superseded, stops serving and says so.
    let stale = Edge::run_existing("edge-1-stale", &old_dir, &[]).unwrap();
    wait_until("the stale copy refused", Duration::from_secs(30), || {
        stale.status().unwrap()["removed"]
            .as_str()
            .is_some_and(|reason| reason.contains("superseded"))
    });
    let (code, body) = stale.infer("digits", &row).unwrap();
    assert_eq!(code, 410, "{body}");
    // The renewed device is not disturbed by it.
    let (code, _) = edge.infer("digits", &row).unwrap();
    assert_eq!(code, 200);
    assert_eq!(edge.status().unwrap()["connected"], true);
    assert!(edge.status().unwrap()["removed"].is_null());
}
