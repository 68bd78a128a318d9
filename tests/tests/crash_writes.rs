//! Writes acknowledged by the control plane survive a `kill -9` taken at a random
//! moment of a stream of writes: real `nephele-cloud` processes on loopback. Join
//! tokens, deployments and jobs are created as fast as one client can; the process is
//! killed mid-stream, restarted on its data dir, and every write that was answered
//! 2xx must be there exactly once (a write that was cut may be there or not, but
//! never twice). Three rounds, killed after 0.3–1.5 s of writing.

#![allow(clippy::unwrap_used)]

use std::collections::HashMap;
use std::time::{Duration, Instant};

use nephele_e2e::{Cloud, Http, MODEL_ONNX};
use serde_json::{json, Value};

#[derive(Default, Debug)]
struct Acked {
    tokens: Vec<String>,
    deployments: Vec<String>,
    jobs: Vec<String>,
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
        let writer = std::thread::spawn(move || write_until_killed(&api, &token, round));
        let after = Duration::from_millis(300 + rand_ms(round) % 1_200);
        std::thread::sleep(after);
        cloud.kill9();
        let acked = writer.join().unwrap();
        let restarted = Instant::now();
        cloud.restart().expect("restart");
        println!(
            "round {round}: killed after {} ms of writing; {} tokens, {} deployments, {} jobs acknowledged; API back in {} ms",
            after.as_millis(),
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

        let tokens = counts(&cloud.get("/v1/tokens").unwrap(), "id");
        let deployments = counts(&cloud.get("/v1/deployments").unwrap(), "name");
        let jobs = counts(&cloud.get("/v1/jobs").unwrap(), "name");
        for (what, names, found) in [
            ("token", &all.tokens, &tokens),
            ("deployment", &all.deployments, &deployments),
            ("job", &all.jobs, &jobs),
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
