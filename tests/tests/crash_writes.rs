//! Writes acknowledged by the control plane survive a `kill -9` taken at a random
//! moment of a stream of writes: real `nephele-cloud` and `nephele-edge join`
//! processes on loopback. Join tokens, deployments and jobs are created as fast as one
//! client can while devices enrol one after another; the control plane is killed
//! mid-stream, restarted on its data dir, and every write that was answered 2xx (every
//! join that got its certificate) must be there exactly once (a write that was cut may
//! be there or not, but never twice), and no join token is spent without its device
//! or a device enrolled without its token spent. Three rounds, killed after 0.3–1.5 s.

#![allow(clippy::unwrap_used)]

use std::collections::HashMap;
use std::time::{Duration, Instant};

use nephele_e2e::{join_via, Cloud, Http, MODEL_ONNX};
use serde_json::{json, Value};

#[derive(Default, Debug)]
struct Acked {
    tokens: Vec<String>,
    deployments: Vec<String>,
    jobs: Vec<String>,
    devices: Vec<String>,
}

/// Writes until the control plane stops answering; what was acknowledged.
fn write_until_killed(api: &str, token: &str, round: usize) -> Acked {
    let client = Http::new(Some(token.to_string()));
    let mut acked = Acked::default();
    for i in 0.. {
        let ok = |result: anyhow::Result<(u16, Value)>| match result {
            Ok((code, body)) if (200..300).contains(&code) => Some(body),
            _ => None,
        };
        let Some(created) = ok(client.raw_json(
            "POST",
            &format!("{api}/v1/tokens"),
            &json!({"region": "eu-west", "ttl_s": 3600}),
        )) else {
            break;
        };
        acked
            .tokens
            .push(created["id"].as_str().unwrap().to_string());
        let name = format!("d{round}x{i}");
        if ok(client.raw_json(
            "POST",
            &format!("{api}/v1/deployments"),
            &json!({"name": name, "model": "digits-mlp", "selector": "tier=nowhere"}),
        ))
        .is_none()
        {
            break;
        }
        acked.deployments.push(name);
        let name = format!("j{round}x{i}");
        if ok(client.raw_json(
            "POST",
            &format!("{api}/v1/jobs"),
            &json!({"name": name, "region": "eu-west", "gpus": 1,
                    "command": ["sleep", "1"]}),
        ))
        .is_none()
        {
            break;
        }
        acked.jobs.push(name);
    }
    acked
}

/// Enrols devices one after another until the control plane stops answering; the
/// names that got their certificate.
fn join_until_killed(
    api: &str,
    quic: &str,
    token: &str,
    dir: &std::path::Path,
    round: usize,
) -> Vec<String> {
    let client = Http::new(Some(token.to_string()));
    let mut joined = Vec::new();
    for i in 0.. {
        let Ok((201, created)) = client.raw_json(
            "POST",
            &format!("{api}/v1/tokens"),
            &json!({"region": "eu-west", "ttl_s": 3600}),
        ) else {
            break;
        };
        let name = format!("a{round}x{i}");
        let secret = created["token"].as_str().unwrap();
        match join_via(quic, &dir.join(&name), &name, secret, &[]) {
            Ok((true, _)) => joined.push(name),
            _ => break,
        }
    }
    joined
}

/// How many times each name appears in a listing.
fn counts(listing: &Value, key: &str) -> HashMap<String, usize> {
    let mut counts = HashMap::new();
    for item in listing.as_array().unwrap() {
        *counts
            .entry(item[key].as_str().unwrap_or_default().to_string())
            .or_insert(0) += 1;
    }
    counts
}

#[test]
fn writes_acknowledged_before_a_kill_9_are_there_after_it_and_none_twice() {
    let mut cloud = Cloud::start("crash-writes").expect("cloud");
    let (status, body) = cloud.put_model("digits-mlp", MODEL_ONNX).unwrap();
    assert_eq!(status, 201, "{body}");
    let mut all = Acked::default();
    for round in 0..3 {
        let (api, token) = (cloud.api.clone(), cloud.token.clone());
        let writer = {
            let (api, token) = (api.clone(), token.clone());
            std::thread::spawn(move || write_until_killed(&api, &token, round))
        };
        let joiner = {
            let (quic, dir) = (cloud.quic.clone(), cloud.dir.clone());
            std::thread::spawn(move || join_until_killed(&api, &quic, &token, &dir, round))
        };
        let after = Duration::from_millis(300 + rand_ms(round) % 1_200);
        std::thread::sleep(after);
        cloud.kill9();
        let acked = writer.join().unwrap();
        let joined = joiner.join().unwrap();
        let restarted = Instant::now();
        cloud.restart().expect("restart");
        println!(
            "round {round}: killed after {} ms of writing; {} devices joined, {} tokens, {} deployments, {} jobs acknowledged; API back in {} ms",
            after.as_millis(),
            joined.len(),
            acked.tokens.len(),
            acked.deployments.len(),
            acked.jobs.len(),
            restarted.elapsed().as_millis()
        );
        assert!(
            !acked.tokens.is_empty(),
            "nothing was written before the kill"
        );
        all.tokens.extend(acked.tokens);
        all.deployments.extend(acked.deployments);
        all.jobs.extend(acked.jobs);
        all.devices.extend(joined);

        let token_list = cloud.get("/v1/tokens").unwrap();
        let tokens = counts(&token_list, "id");
        let devices = counts(&cloud.get("/v1/devices").unwrap(), "name");
        // A token is spent exactly when its device exists (one transaction).
        let spent: Vec<String> = token_list
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|t| t["used_by"].as_str().map(str::to_string))
            .collect();
        for device in &spent {
            assert_eq!(
                devices.get(device),
                Some(&1),
                "token spent for {device}, which is not enrolled"
            );
        }
        for device in devices.keys() {
            assert!(
                spent.contains(device),
                "{device} enrolled without its token spent"
            );
        }
        let deployments = counts(&cloud.get("/v1/deployments").unwrap(), "name");
        let jobs = counts(&cloud.get("/v1/jobs").unwrap(), "name");
        for (what, names, found) in [
            ("token", &all.tokens, &tokens),
            ("deployment", &all.deployments, &deployments),
            ("job", &all.jobs, &jobs),
            ("device", &all.devices, &devices),
        ] {
            for name in names {
                assert_eq!(
                    found.get(name),
                    Some(&1),
                    "acknowledged {what} {name} after round {round}"
                );
            }
            assert!(
                found.values().all(|n| *n == 1),
                "a {what} listed twice: {found:?}"
            );
        }
    }
}

/// A spread of kill times that differs per round without a random crate.
fn rand_ms(round: usize) -> u64 {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .subsec_nanos() as u64;
    nanos / 1_000 + round as u64 * 397
}
