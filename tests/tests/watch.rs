//! Watches on a real control plane: `GET /v1/watch` streams every change to models,
//! deployments, devices and jobs as server-sent events with increasing resource
//! versions, only what the token's tenant may see; a client that reconnects with
//! `Last-Event-ID` gets what it missed, one with an id it cannot resume from is told to
//! list again; `nephele watch` prints them.

#![allow(clippy::unwrap_used)]

use std::io::{BufRead as _, BufReader};
use std::sync::mpsc;
use std::time::Duration;

use nephele_e2e::{bin, Cloud, Edge, MODEL_ONNX, TWO_REGIONS};
use serde_json::{json, Value};

/// One server-sent event: its id, event name and data.
#[derive(Debug, Clone)]
struct Sse {
    id: Option<String>,
    event: String,
    data: Value,
}

/// Opens a watch (`query` after `/v1/watch`) and sends each event down a channel until
/// the stream ends.
fn open(
    cloud: &Cloud,
    token: &str,
    query: &str,
    last_event_id: Option<&str>,
) -> mpsc::Receiver<Sse> {
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .tls_config(nephele_e2e::tls_config())
        .build()
        .into();
    let mut request = agent
        .get(format!("{}/v1/watch{query}", cloud.api))
        .header("authorization", format!("Bearer {token}"));
    if let Some(id) = last_event_id {
        request = request.header("last-event-id", id);
    }
    let response = request.call().unwrap();
    assert_eq!(response.status().as_u16(), 200);
    assert_eq!(
        response
            .headers()
            .get("content-type")
            .unwrap()
            .to_str()
            .unwrap(),
        "text/event-stream"
    );
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let reader = BufReader::new(response.into_body().into_reader());
        let (mut id, mut event, mut data) = (None, String::new(), String::new());
        for line in reader.lines() {
            let Ok(line) = line else { break };
            if line.is_empty() {
                if !event.is_empty() {
                    let sse = Sse {
                        id: id.take(),
                        event: std::mem::take(&mut event),
                        data: serde_json::from_str(&data).unwrap_or(Value::Null),
                    };
                    if tx.send(sse).is_err() {
                        break;
                    }
                }
                data.clear();
            } else if let Some(v) = line.strip_prefix("id: ") {
                id = Some(v.to_string());
            } else if let Some(v) = line.strip_prefix("event: ") {
                event = v.to_string();
            } else if let Some(v) = line.strip_prefix("data: ") {
                data.push_str(v);
            }
        }
    });
    rx
}

/// Events until one matches `until` (within 30 s); all of them.
fn collect(rx: &mpsc::Receiver<Sse>, until: impl Fn(&Sse) -> bool) -> Vec<Sse> {
    let mut seen = Vec::new();
    loop {
        let event = rx
            .recv_timeout(Duration::from_secs(30))
            .unwrap_or_else(|_| panic!("no matching event; saw {seen:?}"));
        let done = until(&event);
        seen.push(event);
        if done {
            return seen;
        }
    }
}

fn is(event: &Sse, kind: &str, name: &str, action: &str) -> bool {
    event.event == kind && event.data["name"] == name && event.data["action"] == action
}

#[test]
fn a_watch_streams_what_changes_for_its_tenant_and_resumes() {
    let config =
        format!("{TWO_REGIONS}[[tenant]]\nname = \"team-a\"\n[[tenant]]\nname = \"team-b\"\n");
    let cloud = Cloud::start_with("watch", &config).expect("cloud");
    let admin = cloud.token.clone();
    let token = |name: &str, role: &str, tenant: &str| {
        cloud
            .post(
                "/v1/api-tokens",
                &json!({"name": name, "role": role, "tenant": tenant}),
            )
            .unwrap()["token"]
            .as_str()
            .unwrap()
            .to_string()
    };
    let dev_a = token("dev-a", "developer", "team-a");
    let view_b = token("view-b", "viewer", "team-b");

    let everything = open(&cloud, &admin, "", None);
    let team_b = open(&cloud, &view_b, "?kinds=deployment,model,device", None);

    // Team A pushes a model and deploys it; a device joins; team A deletes it.
    let http = nephele_e2e::Http::new(Some(dev_a.clone()));
    let (status, body) = http
        .raw(
            "PUT",
            &format!("{}/v1/models/digits-mlp?wait=true", cloud.api),
            MODEL_ONNX,
        )
        .unwrap();
    assert_eq!(status, 201, "{body}");
    http.request(
        "POST",
        &format!("{}/v1/deployments", cloud.api),
        Some(&json!({"name": "d-a", "model": "digits-mlp", "selector": "tier=edge"})),
    )
    .unwrap();
    let _edge = Edge::start(&cloud, "edge-1", "eu-west", &["--label", "tier=edge"], &[]).unwrap();
    cloud
        .wait_for("/v1/deployments/d-a", "d-a ready", |v| {
            v["ready_devices"] == 1
        })
        .unwrap();
    http.request("DELETE", &format!("{}/v1/deployments/d-a", cloud.api), None)
        .unwrap();
    let job = cloud
        .post(
            "/v1/jobs",
            &json!({"name": "train", "gpus": 1, "region": "eu-west", "tenant": "team-a"}),
        )
        .unwrap();
    assert_eq!(job["name"], "train");

    let seen = collect(&everything, |e| is(e, "job", "train", "put"));
    let position = |kind: &str, name: &str, action: &str| {
        seen.iter()
            .position(|e| is(e, kind, name, action))
            .unwrap_or_else(|| panic!("no {kind} {name} {action} in {seen:?}"))
    };
    let model = position("model", "digits-mlp", "put");
    let created = position("deployment", "d-a", "put");
    let device = position("device", "edge-1", "put");
    let deleted = position("deployment", "d-a", "delete");
    assert!(
        model < created && created < deleted && device < deleted,
        "{seen:?}"
    );
    assert_eq!(seen[created].data["tenant"], "team-a");
    assert_eq!(
        seen[deleted].data["tenant"], "team-a",
        "a delete still names its tenant"
    );
    let train = seen.last().unwrap();
    assert_eq!(
        (train.data["tenant"].as_str(), train.data["region"].as_str()),
        (Some("team-a"), Some("eu-west"))
    );
    // Versions grow, and each event's id carries its version.
    let versions: Vec<u64> = seen
        .iter()
        .map(|e| e.data["version"].as_u64().unwrap())
        .collect();
    assert!(versions.windows(2).all(|w| w[0] < w[1]), "{versions:?}");
    for e in &seen {
        let id = e.id.as_deref().unwrap();
        assert!(id.ends_with(&format!("-{}", e.data["version"])), "{id}");
    }
    println!(
        "admin's watch: {} events, versions {:?}",
        seen.len(),
        versions
    );

    // Team B's viewer saw the device (the fleet's), never team A's model or deployment.
    let theirs = collect(&team_b, |e| is(e, "device", "edge-1", "put"));
    assert!(
        theirs.iter().all(|e| e.event == "device"),
        "team B saw another tenant's objects: {theirs:?}"
    );
    std::thread::sleep(Duration::from_millis(300));
    while let Ok(e) = team_b.try_recv() {
        assert_eq!(e.event, "device", "{e:?}");
    }

    // Resuming after the model's event gives everything after it, in order.
    let from = seen[model].id.clone().unwrap();
    let resumed = open(&cloud, &admin, "?kinds=deployment&timeout_s=2", Some(&from));
    let again = collect(&resumed, |e| is(e, "deployment", "d-a", "delete"));
    assert!(is(&again[0], "deployment", "d-a", "put"), "{again:?}");
    // An id this process never gave: told to list again.
    let stale = open(&cloud, &admin, "?timeout_s=2", Some("1-5"));
    let first = stale.recv_timeout(Duration::from_secs(10)).unwrap();
    assert_eq!(first.event, "reset", "{first:?}");
    assert!(first.data["reason"]
        .as_str()
        .unwrap()
        .contains("list again"));

    // Bad queries are problems naming the field.
    let bad = nephele_e2e::Http::new(Some(admin.clone()))
        .get_full(&format!("{}/v1/watch?kinds=pods", cloud.api))
        .unwrap();
    assert_eq!((bad.0, bad.2["field"].as_str()), (400, Some("kinds")));

    // The CLI prints the same events (here those kept since the model's, then stops).
    let output = std::process::Command::new(bin("nephele"))
        .args([
            "watch",
            "--kinds",
            "deployment",
            "--since",
            &from,
            "--timeout",
            "2",
            "--json",
        ])
        .env("NEPHELE_API", &cloud.api)
        .env("NEPHELE_CA", cloud.ca_path())
        .env("NEPHELE_TOKEN", &admin)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let lines: Vec<Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 2, "{text}");
    assert_eq!(
        (lines[0]["action"].as_str(), lines[1]["action"].as_str()),
        (Some("put"), Some("delete"))
    );
}
