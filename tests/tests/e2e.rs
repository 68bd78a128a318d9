//! End-to-end tests: real `nephele-cloud` and `nephele-edge` processes on loopback,
//! real QUIC with mutual TLS, the real digits model run by tract.

#![allow(clippy::unwrap_used)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use nephele_e2e::{heldout, join, Cloud, Edge, MODEL_ONNX};
use serde_json::Value;

fn outputs(value: &Value) -> Vec<f32> {
    value["data"]
        .as_array()
        .expect("data array")
        .iter()
        .map(|x| x.as_f64().expect("number") as f32)
        .collect()
}

/// Equal up to float rounding: a request batched with others runs through a batch
/// plan, whose kernels may round differently in the last bits from batch 1's.
fn assert_close(got: &[f32], expected: &[f32], what: &str) {
    assert_eq!(got.len(), expected.len(), "{what}");
    for (a, b) in got.iter().zip(expected) {
        assert!(
            (a - b).abs() <= 1e-4 * b.abs().max(1.0),
            "{what}: {got:?} vs {expected:?}"
        );
    }
}

fn push_and_deploy(cloud: &Cloud, deployment: Value) {
    let (status, body) = cloud.put_model("digits-mlp", MODEL_ONNX).expect("upload");
    assert!(status == 201, "upload failed: {status} {body}");
    cloud.post("/v1/deployments", &deployment).expect("deploy");
}

#[test]
fn join_tokens_are_single_use_and_expire() {
    let cloud = Cloud::start("tokens").expect("cloud");
    let token = cloud.join_token("eu-west", 600).unwrap();
    let (ok, output) = join(&cloud, &cloud.dir.join("a"), "dev-a", &token, &[]).unwrap();
    assert!(ok, "first use must enrol: {output}");
    assert!(cloud.dir.join("a/agent.key").exists() && cloud.dir.join("a/agent.pem").exists());

    let (ok, output) = join(&cloud, &cloud.dir.join("b"), "dev-b", &token, &[]).unwrap();
    assert!(!ok, "a reused token must be refused");
    assert!(output.contains("already used"), "{output}");

    let short = cloud.join_token("eu-west", 1).unwrap();
    std::thread::sleep(Duration::from_millis(2100));
    let (ok, output) = join(&cloud, &cloud.dir.join("c"), "dev-c", &short, &[]).unwrap();
    assert!(!ok, "an expired token must be refused");
    assert!(output.contains("expired"), "{output}");

    // A token whose CA fingerprint is not this cluster's: the agent refuses the server.
    let mut forged = cloud.join_token("eu-west", 600).unwrap();
    let last = forged.pop().unwrap();
    forged.push(if last == '0' { '1' } else { '0' });
    let (ok, output) = join(&cloud, &cloud.dir.join("d"), "dev-d", &forged, &[]).unwrap();
    assert!(
        !ok,
        "a server whose CA does not match the token must be refused: {output}"
    );

    let (ok, output) = join(&cloud, &cloud.dir.join("e"), "dev-e", "nph1.garbage", &[]).unwrap();
    assert!(!ok && output.contains("malformed join token"), "{output}");

    // Invalid API payloads get a 4xx with a message, and change nothing.
    let http = cloud.client();
    for (path, body) in [
        ("/v1/tokens", serde_json::json!({"ttl_s": "soon"})),
        ("/v1/tokens", serde_json::json!({"region": "mars"})),
        (
            "/v1/deployments",
            serde_json::json!({"name": "x", "model": "nope"}),
        ),
        (
            "/v1/deployments",
            serde_json::json!({"name": "Bad Name", "model": "m"}),
        ),
        (
            "/v1/deployments",
            serde_json::json!({"name": "x", "model": "m", "colour": "red"}),
        ),
    ] {
        let (status, reply) = http
            .raw_json("POST", &format!("{}{path}", cloud.api), &body)
            .unwrap();
        assert!(
            (400..500).contains(&status),
            "{path} {body} → {status} {reply}"
        );
        assert!(
            reply["message"].as_str().is_some_and(|m| !m.is_empty()),
            "{reply}"
        );
    }
    let unauthorized = nephele_e2e::Http::new(Some("nope.nope".into()))
        .request("GET", &format!("{}/v1/devices", cloud.api), None)
        .unwrap_err()
        .to_string();
    assert!(unauthorized.contains("401"), "{unauthorized}");

    // The install script enrols a device into a staging root, unit file included.
    let root = cloud.dir.join("install-root");
    let token = cloud.join_token("us-east", 600).unwrap();
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../deploy/install-edge.sh");
    let output = std::process::Command::new("bash")
        .arg(script)
        .args([
            "--root",
            root.to_str().unwrap(),
            "--join-now",
            "--no-start",
            "--name",
            "installed-1",
            "--profile",
            "rpi5-8gb",
        ])
        .args([
            "--label",
            "site=lab",
            "--server",
            &cloud.quic,
            "--token",
            &token,
        ])
        .arg("--binary")
        .arg(nephele_e2e::bin("nephele-edge"))
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "install-edge.sh failed: {}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    let agent_toml = std::fs::read_to_string(root.join("var/lib/nephele-edge/agent.toml")).unwrap();
    assert!(
        agent_toml.contains("installed-1") && agent_toml.contains("us-east"),
        "{agent_toml}"
    );
    assert!(root
        .join("etc/systemd/system/nephele-edge.service")
        .exists());
    assert!(root.join("usr/local/bin/nephele-edge").exists());

    let devices = cloud.get("/v1/devices").unwrap();
    let names: Vec<&str> = devices
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, vec!["dev-a", "installed-1"]);

    // Into an image (--root without --join-now): nothing enrolled, the token not spent,
    // a join.env (0600) for the first boot, and both units enabled.
    let image = cloud.dir.join("image-root");
    let token = cloud.join_token("eu-west", 600).unwrap();
    let install = |extra: &[&str]| {
        std::process::Command::new("bash")
            .arg(script)
            .args(["--root", image.to_str().unwrap(), "--profile", "rpi5-8gb"])
            .args(extra)
            .output()
            .unwrap()
    };
    let refused = install(&["--binary", "/bin/true"]);
    assert!(!refused.status.success());
    assert!(
        String::from_utf8_lossy(&refused.stderr).contains("is not a nephele-edge binary"),
        "{}",
        String::from_utf8_lossy(&refused.stderr)
    );
    let binary = nephele_e2e::bin("nephele-edge");
    let output = install(&[
        "--name",
        "imaged-1",
        "--label",
        "site=lab",
        "--server",
        &cloud.quic,
        "--token",
        &token,
        "--binary",
        binary.to_str().unwrap(),
    ]);
    assert!(
        output.status.success(),
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    let data = image.join("var/lib/nephele-edge");
    assert!(
        !data.join("agent.toml").exists(),
        "an image must not be enrolled"
    );
    let join_env = image.join("etc/nephele-edge/join.env");
    let env_text = std::fs::read_to_string(&join_env).unwrap();
    assert!(
        env_text.contains(&format!("NEPHELE_JOIN_TOKEN=\"{token}\"")),
        "{env_text}"
    );
    assert!(
        env_text.contains("--name imaged-1") && env_text.contains("--label site=lab"),
        "{env_text}"
    );
    use std::os::unix::fs::PermissionsExt as _;
    let mode = std::fs::metadata(&join_env).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600, "join.env holds a token");
    for unit in ["nephele-edge.service", "nephele-edge-join.service"] {
        assert!(
            image
                .join("etc/systemd/system/multi-user.target.wants")
                .join(unit)
                .symlink_metadata()
                .is_ok(),
            "{unit} not enabled in the image"
        );
    }
    let devices = cloud.get("/v1/devices").unwrap();
    assert_eq!(
        devices.as_array().unwrap().len(),
        2,
        "the image spent its token"
    );
    // Its first boot, as nephele-edge-join.service runs it: the env file, then join.
    let first_boot = std::process::Command::new("bash")
        .arg("-c")
        .arg(r#"set -a; . "$1"; set +a; exec "$2" join --server "$NEPHELE_SERVER" --data-dir "$3" $NEPHELE_JOIN_ARGS"#)
        .arg("first-boot")
        .arg(&join_env)
        .arg(&binary)
        .arg(&data)
        .output()
        .unwrap();
    assert!(
        first_boot.status.success(),
        "{}",
        String::from_utf8_lossy(&first_boot.stderr)
    );
    let devices = cloud.get("/v1/devices").unwrap();
    assert!(
        devices
            .as_array()
            .unwrap()
            .iter()
            .any(|d| d["name"] == "imaged-1" && d["labels"]["site"] == "lab"),
        "{devices}"
    );
}

/// Opens a QUIC connection to the gateway with the given client config.
fn connect(
    runtime: &tokio::runtime::Runtime,
    cloud: &Cloud,
    config: quinn::ClientConfig,
) -> Result<quinn::Connection, String> {
    runtime.block_on(async {
        let addr: std::net::SocketAddr = cloud.quic.parse().unwrap();
        let endpoint = nephele_net::client_endpoint(addr).unwrap();
        let connecting = endpoint
            .connect_with(config, addr, nephele_net::SERVER_NAME)
            .map_err(|e| e.to_string())?;
        let connection = connecting.await.map_err(|e| e.to_string())?;
        // The server verifies client certificates after the client finishes its side of
        // the handshake; a refused certificate shows up as a closed connection.
        let probe = async {
            let (mut send, mut recv) = connection.open_bi().await.map_err(|e| e.to_string())?;
            send.write_all(&[0, 0, 0, 1, 0])
                .await
                .map_err(|e| e.to_string())?;
            let _ = send.finish();
            let mut buf = Vec::new();
            let _ = tokio::time::timeout(Duration::from_secs(5), async {
                let mut chunk = [0u8; 1024];
                while let Ok(Some(n)) = recv.read(&mut chunk).await {
                    buf.extend_from_slice(&chunk[..n]);
                }
            })
            .await;
            Ok::<_, String>(())
        };
        let _ = probe.await;
        tokio::time::sleep(Duration::from_millis(300)).await;
        match connection.close_reason() {
            Some(reason) => Err(reason.to_string()),
            None => Ok(connection),
        }
    })
}

/// A tokio runtime for raw QUIC clients, and the control plane's CA certificate (DER).
fn runtime_and_ca(cloud: &Cloud) -> (tokio::runtime::Runtime, Vec<u8>) {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    let ca_pem = std::fs::read_to_string(cloud.dir.join("data/ca.pem")).unwrap();
    (runtime, nephele_net::pki::pem_to_der(&ca_pem).unwrap())
}

#[test]
fn clients_without_a_valid_certificate_are_refused() {
    let cloud = Cloud::start("certs").expect("cloud");
    let (runtime, ca_der) = runtime_and_ca(&cloud);

    // A certificate from another CA: the TLS handshake fails.
    let other_ca = nephele_net::ClusterCa::generate("attacker").unwrap();
    let (key_pem, csr) = nephele_net::pki::agent_csr("intruder").unwrap();
    let forged_cert = other_ca.sign_agent_csr(&csr, "intruder", "edge").unwrap();
    let key_der = nephele_net::pki::pem_to_der(&key_pem).unwrap();
    let config = nephele_net::mtls_client_config(&ca_der, &forged_cert, &key_der).unwrap();
    let result = connect(&runtime, &cloud, config);
    assert!(
        result.is_err(),
        "a certificate from another CA must be refused"
    );

    // No certificate at all: only a join request is allowed; a Hello is refused.
    let fingerprint = nephele_net::fingerprint(&ca_der);
    let config = nephele_net::join_client_config(fingerprint).unwrap();
    let result = connect(&runtime, &cloud, config);
    assert!(
        result.is_err(),
        "a certificate-less connection that does not join must be closed"
    );

    std::thread::sleep(Duration::from_millis(300));
    let logs = cloud.logs();
    assert!(
        logs.contains("handshake failed"),
        "the refusal is logged with its reason:\n{logs}"
    );
    assert!(logs.contains("bad join request"), "{logs}");
    let metrics = cloud
        .client()
        .request("GET", &format!("{}/metrics", cloud.api), None)
        .unwrap();
    assert!(
        metrics
            .as_str()
            .unwrap_or("")
            .contains("nephele_gateway_handshakes_failed_total 1"),
        "{metrics}"
    );
}

#[test]
fn a_fleet_deploys_serves_offloads_and_survives_bad_frames() {
    let cloud = Cloud::start("fleet").expect("cloud");
    let lab = Edge::start(
        &cloud,
        "lab-1",
        "eu-west",
        &["--profile", "rpi5-8gb", "--label", "site=lab"],
        &["--workers", "1"],
    )
    .unwrap();
    let plant = Edge::start(
        &cloud,
        "plant-1",
        "us-east",
        &["--profile", "jetson-orin-nano-8gb", "--label", "site=plant"],
        &[],
    )
    .unwrap();
    let pool = Edge::pool(&cloud, "pool-1", "eu-west").unwrap();

    cloud
        .wait_for("/v1/devices", "3 healthy devices", |v| {
            v.as_array()
                .map(|a| a.len() == 3 && a.iter().all(|d| d["health"] == "healthy"))
                .unwrap_or(false)
        })
        .unwrap();
    let devices = cloud.get("/v1/devices").unwrap();
    let lab_view = devices
        .as_array()
        .unwrap()
        .iter()
        .find(|d| d["name"] == "lab-1")
        .unwrap();
    assert_eq!(lab_view["profile"], "rpi5-8gb");
    assert_eq!(lab_view["cpu_cores"], 4);
    // The agent says where its profile contradicts this host (an rpi5 profile here).
    let rpi5 = nephele_domain::builtin_profiles::builtin("rpi5-8gb")
        .unwrap()
        .unwrap();
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get() as u32);
    let memory_mb = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|t| {
            t.lines()
                .find(|l| l.starts_with("MemTotal:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok())
        })
        .map_or(1024, |kb| kb / 1024);
    let logs = lab.logs();
    for contradiction in rpi5.contradictions(std::env::consts::ARCH, cores, memory_mb) {
        assert!(
            logs.contains(&contradiction),
            "{contradiction} not in:\n{logs}"
        );
    }

    // A corrupt model is refused at upload with a clear error.
    let (status, body) = cloud
        .put_model("broken", &MODEL_ONNX[..MODEL_ONNX.len() / 2])
        .unwrap();
    assert_eq!(status, 400, "{body}");
    assert!(
        body["message"].as_str().unwrap().contains("model broken"),
        "{body}"
    );

    push_and_deploy(
        &cloud,
        serde_json::json!({"name": "digits", "model": "digits-mlp", "selector": "site=lab", "slo_ms": 20, "max_queue": 1}),
    );
    let status = cloud
        .wait_for(
            "/v1/deployments/digits",
            "digits ready on lab-1 and the pool",
            |v| {
                v["ready_devices"] == 1
                    && v["devices"]
                        .as_array()
                        .map(|d| d.iter().all(|r| r["ready"] == true))
                        .unwrap_or(false)
            },
        )
        .unwrap();
    let selected: Vec<&str> = status["devices"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["device"].as_str().unwrap())
        .collect();
    assert_eq!(
        selected,
        vec!["lab-1", "pool-1"],
        "only the selected edge device (and the pool) get the model"
    );
    let (code, _) = plant.infer("digits", &[0.0; 64]).unwrap();
    assert_eq!(
        code, 404,
        "the unselected device does not serve the deployment"
    );

    // Answers equal running the same ONNX file directly with tract.
    let reference = nephele_runtime::Model::load_onnx("reference", MODEL_ONNX).unwrap();
    let data = heldout();
    for row in data.features.iter().take(40) {
        let (code, reply) = lab.infer("digits", row).unwrap();
        assert_eq!(code, 200, "{reply}");
        let (_, expected) = reference.infer(&[1, 64], row).unwrap();
        assert_close(
            &outputs(&reply),
            &expected,
            "agent output must equal tract's",
        );
    }

    // Overload: 16 concurrent clients on one inference slot with a 1-request queue: what
    // finds the queue full goes to the pool when the pool can answer within the 20 ms SLO.
    let lab_endpoint = Arc::new(lab.endpoint.clone());
    let features = Arc::new(data.features.clone());
    let mut handles = Vec::new();
    for client in 0..16 {
        let features = features.clone();
        let endpoint = lab_endpoint.clone();
        handles.push(std::thread::spawn(move || {
            let http = nephele_e2e::Http::new(None);
            let mut replies = Vec::new();
            for i in 0..25 {
                let row = &features[(client * 25 + i) % features.len()];
                let body = serde_json::json!({"shape": [1, 64], "data": row});
                let (code, reply) = http
                    .raw_json("POST", &format!("{endpoint}/v1/infer/digits"), &body)
                    .unwrap();
                replies.push((code, reply, row.clone()));
            }
            replies
        }));
    }
    let mut cloud_answers = 0;
    let mut answered = 0;
    for handle in handles {
        for (code, reply, row) in handle.join().unwrap() {
            if code == 429 {
                continue;
            }
            assert_eq!(code, 200, "{reply}");
            answered += 1;
            let (_, expected) = reference.infer(&[1, 64], &row).unwrap();
            assert_close(
                &outputs(&reply),
                &expected,
                "offloaded and batched answers are correct too",
            );
            if reply["where"] == "cloud" {
                assert_eq!(reply["computed_by"], "pool-1");
                cloud_answers += 1;
            }
        }
    }
    assert!(
        answered >= 300,
        "most of the burst is answered: {answered}/400"
    );
    assert!(
        cloud_answers > 0,
        "some of the burst must be offloaded to the pool"
    );

    // Hostile frames from an enrolled agent: an oversized frame on a request stream is
    // refused on that stream; garbage on a control stream closes that connection only.
    let rogue_dir = cloud.dir.join("rogue-1");
    let token = cloud.join_token("eu-west", 600).unwrap();
    let (ok, output) = join(&cloud, &rogue_dir, "rogue-1", &token, &[]).unwrap();
    assert!(ok, "{output}");
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    let read_pem = |name: &str| {
        nephele_net::pki::pem_to_der(&std::fs::read_to_string(rogue_dir.join(name)).unwrap())
            .unwrap()
    };
    let config = nephele_net::mtls_client_config(
        &read_pem("ca.pem"),
        &read_pem("agent.pem"),
        &read_pem("agent.key"),
    )
    .unwrap();
    let quic: std::net::SocketAddr = cloud.quic.parse().unwrap();
    // A blob the lab device fetched (its cache names blobs by sha256): the rogue agent,
    // assigned nothing, may not fetch it.
    let lab_blob: [u8; 32] = std::fs::read_dir(lab.dir.join("models"))
        .unwrap()
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().to_string())
        .find(|n| n.len() == 64)
        .map(|hex| {
            let bytes: Vec<u8> = (0..32)
                .map(|i| u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).unwrap())
                .collect();
            bytes.try_into().unwrap()
        })
        .expect("a blob in the lab device's cache");
    runtime.block_on(async {
        let endpoint = nephele_net::client_endpoint(quic).unwrap();
        let connection = endpoint
            .connect_with(config, quic, nephele_net::SERVER_NAME)
            .unwrap()
            .await
            .unwrap();
        let (mut control_send, mut control_recv) = connection.open_bi().await.unwrap();
        let profile_toml = nephele_domain::builtin_profiles::BUILTIN
            .iter()
            .find(|(n, _)| *n == "rpi5-8gb")
            .unwrap()
            .1;
        nephele_net::write_frame(
            &mut control_send,
            &nephele_proto::AgentMessage::Hello(nephele_proto::Hello {
                protocol_version: nephele_proto::PROTOCOL_VERSION,
                agent_version: "test".into(),
                role: "edge".into(),
                profile_name: "rpi5-8gb".into(),
                profile_toml: profile_toml.into(),
                models_cached: vec![],
                local_endpoint: "127.0.0.1:1".into(),
                node: Default::default(),
                jobs: vec![],
            }),
        )
        .await
        .unwrap();
        let welcome: Option<nephele_proto::CloudMessage> =
            nephele_net::read_frame(&mut control_recv, 1 << 20)
                .await
                .unwrap();
        assert!(
            matches!(welcome, Some(nephele_proto::CloudMessage::Welcome(_))),
            "{welcome:?}"
        );
        // Enrolled but assigned nothing: it may neither fetch another device's model
        // nor have the pool run a deployment it does not serve.
        for body in [
            nephele_proto::RequestBody::FetchChunk {
                sha256: lab_blob,
                offset: 0,
                len: 1024,
            },
            nephele_proto::RequestBody::Infer(nephele_proto::InferRequest {
                deployment: "digits".into(),
                request_id: 1,
                input: nephele_proto::Payload::Tensor(nephele_proto::Tensor {
                    shape: vec![1, 64],
                    data: vec![0.0; 64],
                }),
                stage: nephele_proto::InferStage::Whole,
                trace: None,
            }),
        ] {
            let (mut send, mut recv) = connection.open_bi().await.unwrap();
            nephele_net::write_frame(
                &mut send,
                &nephele_proto::StreamRequest {
                    protocol_version: nephele_proto::PROTOCOL_VERSION,
                    body,
                },
            )
            .await
            .unwrap();
            let _ = send.finish();
            let reply: Option<nephele_proto::StreamResponse> =
                nephele_net::read_frame(&mut recv, 1 << 20).await.unwrap();
            match reply {
                Some(nephele_proto::StreamResponse::Error(error)) => {
                    assert_eq!(
                        error.code,
                        nephele_proto::ErrorCode::Unauthorized,
                        "{error}"
                    );
                    assert!(error.message.contains("not assigned"), "{error}");
                }
                other => panic!("expected a refusal, got {other:?}"),
            }
        }
        // Request stream with a 4 GiB length prefix.
        let (mut send, mut recv) = connection.open_bi().await.unwrap();
        send.write_all(&u32::MAX.to_be_bytes()).await.unwrap();
        let reply: Option<nephele_proto::StreamResponse> =
            nephele_net::read_frame(&mut recv, 1 << 20).await.unwrap();
        match reply {
            Some(nephele_proto::StreamResponse::Error(error)) => {
                assert!(error.message.contains("exceeds"), "{error}")
            }
            other => panic!("expected an error frame, got {other:?}"),
        }
        // The connection itself is still open after a bad stream.
        assert!(connection.close_reason().is_none());
        // Garbage on the control stream: the gateway closes this connection.
        control_send
            .write_all(&[0, 0, 0, 3, 0xff, 0xfe, 0xfd])
            .await
            .unwrap();
        let reason = tokio::time::timeout(Duration::from_secs(5), connection.closed())
            .await
            .expect("closed");
        assert!(
            reason.to_string().contains("protocol violation"),
            "{reason}"
        );
    });
    std::thread::sleep(Duration::from_millis(300));
    let logs = cloud.logs();
    assert!(logs.contains("closing request stream: bad frame"), "{logs}");
    assert!(logs.contains("protocol violation"), "{logs}");
    // Other agents keep working.
    let (code, reply) = plant.infer("digits", &data.features[0]).unwrap();
    assert_eq!(code, 404, "{reply}");
    let (code, reply) = lab.infer("digits", &data.features[0]).unwrap();
    assert_eq!(code, 200, "{reply}");
    let pool_status: Value = nephele_e2e::Http::new(None)
        .request("GET", &format!("{}/v1/status", pool.endpoint), None)
        .unwrap();
    assert_eq!(pool_status["connected"], true);

    // Metrics on both sides.
    let cloud_metrics = cloud
        .client()
        .request("GET", &format!("{}/metrics", cloud.api), None)
        .unwrap();
    let text = cloud_metrics.as_str().unwrap_or("");
    assert!(
        text.contains("nephele_offloads_total{region=\"eu-west\",outcome=\"ok\"}"),
        "{text}"
    );
    assert!(text.contains("nephele_agents_connected"), "{text}");
    let agent_metrics = nephele_e2e::Http::new(None)
        .request("GET", &format!("{}/metrics", lab.endpoint), None)
        .unwrap();
    let text = agent_metrics.as_str().unwrap_or("");
    assert!(
        text.contains("nephele_agent_request_latency_seconds_bucket"),
        "{text}"
    );
    assert!(text.contains("outcome=\"cloud\""), "{text}");
    drop(pool);
}

#[test]
fn agents_reconnect_after_the_control_plane_restarts() {
    let mut cloud = Cloud::start("restart").expect("cloud");
    let edge = Edge::start(&cloud, "edge-1", "eu-west", &["--label", "tier=edge"], &[]).unwrap();
    push_and_deploy(
        &cloud,
        serde_json::json!({"name": "digits", "model": "digits-mlp", "selector": "tier=edge"}),
    );
    cloud
        .wait_for("/v1/deployments/digits", "ready", |v| {
            v["ready_devices"] == 1
        })
        .unwrap();
    let row = heldout().features[3].clone();
    let (code, before) = edge.infer("digits", &row).unwrap();
    assert_eq!(code, 200);

    cloud.stop();
    // The device keeps serving locally while the control plane is down.
    let (code, during) = edge.infer("digits", &row).unwrap();
    assert_eq!(code, 200, "{during}");
    assert_close(
        &outputs(&during),
        &outputs(&before),
        "served while the cloud is down",
    );

    // `stop` is SIGKILL: the old process said nothing to the agent. The new one
    // resets the old session at the agent's next packet (its reset keys are kept
    // across restarts); with keys drawn per process the agent came back only after its
    // 15 s idle timeout.
    cloud.restart().unwrap();
    let restarted = Instant::now();
    let devices = cloud.wait_online("edge-1").unwrap();
    let back = restarted.elapsed();
    eprintln!(
        "control-plane restart: the agent was back {} ms after the new process was ready",
        back.as_millis()
    );
    assert!(
        back < Duration::from_secs(8),
        "the agent came back only after {} ms: the restarted control plane's stateless \
         resets were not accepted\n{}",
        back.as_millis(),
        edge.logs()
    );
    assert_eq!(devices.as_array().unwrap().len(), 1);
    let status = cloud
        .wait_for("/v1/deployments/digits", "ready after restart", |v| {
            v["ready_devices"] == 1
        })
        .unwrap();
    // The version the deployment runs, as `name:version`.
    assert!(
        status["model"]
            .as_str()
            .is_some_and(|m| m.starts_with("digits-mlp:")),
        "{status:#}"
    );
    let (code, after) = edge.infer("digits", &row).unwrap();
    assert_eq!(code, 200);
    assert_close(
        &outputs(&after),
        &outputs(&before),
        "served after the restart",
    );
    assert!(edge.logs().contains("connected to the control plane"));
}

/// Joint inference, then a cut: with a confidence threshold, unsure local answers are
/// re-asked in the pool; when the control plane goes away mid-burst, every request is
/// still answered (locally) or refused with 429, never left hanging or lost.
#[test]
fn hard_examples_go_to_the_pool_and_a_cut_cloud_loses_no_request() {
    let mut cloud = Cloud::start("joint").expect("cloud");
    let edge = Edge::start(
        &cloud,
        "edge-1",
        "eu-west",
        &["--profile", "rpi5-8gb", "--label", "tier=edge"],
        &["--workers", "1"],
    )
    .unwrap();
    let _pool = Edge::pool(&cloud, "pool-1", "eu-west").unwrap();
    // An unknown variant is refused with the ones that exist.
    let (status, body) = cloud.put_model("digits-mlp", MODEL_ONNX).expect("upload");
    assert_eq!(status, 201, "{body}");
    assert_eq!(body["format"], "onnx", "{body}");
    let names: Vec<&str> = body["variants"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        vec![
            "full",
            "int8",
            "split@fc1",
            "split@relu1",
            "split@fc2",
            "split@relu2"
        ],
        "{body}"
    );
    assert!(
        body["variants"]
            .as_array()
            .unwrap()
            .iter()
            .all(|v| v["rejected"].is_null()),
        "{body}"
    );
    let refused = cloud
        .client()
        .raw_json(
            "POST",
            &format!("{}/v1/deployments", cloud.api),
            &serde_json::json!({"name": "d", "model": "digits-mlp", "variant": "fp16"}),
        )
        .unwrap();
    assert_eq!(refused.0, 400, "{}", refused.1);
    assert!(
        refused.1["message"].as_str().unwrap().contains("int8"),
        "{}",
        refused.1
    );
    cloud.deploy_on_one_edge_and_the_pool(
        serde_json::json!({"name": "digits", "model": "digits-mlp", "selector": "tier=edge",
            "slo_ms": 50, "max_queue": 8, "hard_example_threshold": 0.9999}),
    );
    let data = heldout();
    let reference = nephele_runtime::Model::load_onnx("reference", MODEL_ONNX).unwrap();
    let mut hard = 0;
    for row in data.features.iter().take(60) {
        let (code, reply) = edge.infer("digits", row).unwrap();
        assert_eq!(code, 200, "{reply}");
        let (_, expected) = reference.infer(&[1, 64], row).unwrap();
        assert_close(&outputs(&reply), &expected, "joint inference answer");
        if reply["hard_example"] == true {
            assert_eq!(reply["where"], "cloud", "{reply}");
            assert_eq!(reply["computed_by"], "pool-1", "{reply}");
            hard += 1;
        }
    }
    assert!(hard > 0, "some held-out digits are below 99.99% confidence");

    // A split variant: the head on the device, the tail in the pool, and the answer
    // equals the whole model's.
    cloud.deploy_on_one_edge_and_the_pool(
        serde_json::json!({"name": "digits-split", "model": "digits-mlp",
            "variant": "split@relu1", "selector": "tier=edge", "slo_ms": 50}),
    );
    for row in data.features.iter().take(20) {
        let (code, reply) = edge.infer("digits-split", row).unwrap();
        assert_eq!(code, 200, "{reply}");
        assert_eq!(reply["where"], "split", "{reply}");
        assert_eq!(reply["computed_by"], "pool-1", "{reply}");
        let (_, expected) = reference.infer(&[1, 64], row).unwrap();
        assert_close(&outputs(&reply), &expected, "split answer");
    }

    // `variant: split` lets the planner choose the cut per device from the link the
    // device measured: on loopback, for a 0.03 MFLOP model, nothing beats running it
    // all on the device, so the edge keeps `full`, and it still answers correctly.
    let planned = cloud.deploy_on_one_edge_and_the_pool(
        serde_json::json!({"name": "digits-planned", "model": "digits-mlp",
            "variant": "split", "selector": "tier=edge", "slo_ms": 50}),
    );
    let edge_row = planned["devices"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["device"] == "edge-1")
        .cloned()
        .unwrap_or_default();
    assert_eq!(edge_row["variant"], "full", "{planned}");
    // Both sides report the compute time they measured at load, which the planner
    // uses instead of the profiles' peak TOPS.
    let measured = cloud
        .wait_for(
            "/v1/deployments/digits-planned",
            "measured service times",
            |v| {
                v["devices"]
                    .as_array()
                    .is_some_and(|rows| rows.iter().all(|r| r["service_ms"].as_f64() > Some(0.0)))
            },
        )
        .unwrap();
    assert!(
        measured["devices"].as_array().unwrap().len() >= 2,
        "{measured}"
    );
    let devices = cloud.get("/v1/devices").unwrap();
    let edge_view = devices
        .as_array()
        .unwrap()
        .iter()
        .find(|d| d["name"] == "edge-1")
        .cloned()
        .unwrap_or_default();
    assert!(
        edge_view["link"]["bandwidth_bps"].as_u64().unwrap_or(0) > 0,
        "the edge measured its link while downloading: {edge_view}"
    );
    let (code, reply) = edge.infer("digits-planned", &data.features[0]).unwrap();
    assert_eq!(code, 200, "{reply}");

    // Cut the control plane mid-burst: 8 clients × 30 requests.
    let endpoint = Arc::new(edge.endpoint.clone());
    let features = Arc::new(data.features.clone());
    let handles: Vec<_> = (0..8)
        .map(|client| {
            let endpoint = endpoint.clone();
            let features = features.clone();
            std::thread::spawn(move || {
                let http = nephele_e2e::Http::new(None);
                (0..30)
                    .map(|i| {
                        let row = &features[(client * 30 + i) % features.len()];
                        let body = serde_json::json!({"shape": [1, 64], "data": row});
                        http.raw_json("POST", &format!("{endpoint}/v1/infer/digits"), &body)
                            .map(|(code, reply)| (code, reply, row.clone()))
                    })
                    .collect::<Vec<_>>()
            })
        })
        .collect();
    std::thread::sleep(Duration::from_millis(30));
    cloud.stop();
    let (mut answered, mut refused) = (0, 0);
    for handle in handles {
        for result in handle.join().unwrap() {
            let (code, reply, row) = result.expect("every request gets an HTTP answer");
            match code {
                200 => {
                    let (_, expected) = reference.infer(&[1, 64], &row).unwrap();
                    assert_close(&outputs(&reply), &expected, "answer during the cut");
                    answered += 1;
                }
                429 => refused += 1,
                other => panic!("request neither answered nor refused: {other} {reply}"),
            }
        }
    }
    assert_eq!(answered + refused, 240);
    assert!(answered > 0);
    // After the cut everything is local: the breaker keeps requests off the dead path.
    for row in data.features.iter().take(20) {
        let (code, reply) = edge.infer("digits", row).unwrap();
        assert_eq!(code, 200, "{reply}");
        assert_eq!(reply["where"], "local", "{reply}");
    }
    // The split deployment runs its tail on the device while the cloud is away.
    for row in data.features.iter().take(10) {
        let (code, reply) = edge.infer("digits-split", row).unwrap();
        assert_eq!(code, 200, "{reply}");
        assert_eq!(reply["where"], "local", "{reply}");
        let (_, expected) = reference.infer(&[1, 64], row).unwrap();
        assert_close(
            &outputs(&reply),
            &expected,
            "split answer without the cloud",
        );
    }
}

/// The job scheduler behind the API, with a real pool agent filling a node slot: a job
/// waits (and says why) until a pool connects, is placed on it, is preempted by higher
/// priority work after the grace period, waits again when its agent goes away, and
/// bad requests get clear errors. The CLI reads the same views.
#[test]
fn jobs_are_scheduled_onto_pool_agents() {
    let cloud = Cloud::start("jobs").expect("cloud");
    let http = cloud.client();
    let job = |name: &str| {
        cloud
            .get(&format!("/v1/jobs/{name}"))
            .unwrap_or_else(|e| panic!("{e}"))
    };
    let submit = |body: Value| {
        http.raw_json("POST", &format!("{}/v1/jobs", cloud.api), &body)
            .unwrap()
    };

    // No pool agent yet: accepted, pending, and the answer says what to do.
    let (status, train) = submit(serde_json::json!({
        "name": "train", "region": "eu-west", "gpus": 2, "cpu_milli": 8000,
        "memory_mib": 32768, "expected_runtime_s": 3600
    }));
    assert_eq!(status, 201, "{train}");
    assert_eq!(train["state"], "pending", "{train}");
    assert_eq!(
        train["why_pending"]["reasons"][0],
        serde_json::json!({"reason": "node down", "nodes": 4}),
        "{train}"
    );
    assert!(train["why_pending"]["hint"]
        .as_str()
        .unwrap()
        .contains("--role pool"));

    let pool = Edge::pool(&cloud, "pool-1", "eu-west").unwrap();
    let placed = cloud
        .wait_for("/v1/jobs/train", "train placed", |v| {
            v["state"] == "running"
        })
        .unwrap();
    assert_eq!(placed["placement"][0]["node"], "l4-0", "{placed}");
    assert_eq!(placed["placement"][0]["agent"], "pool-1", "{placed}");
    assert_eq!(placed["placement"][0]["gpus"].as_array().unwrap().len(), 2);
    let nodes = cloud.get("/v1/regions/eu-west/nodes").unwrap();
    assert_eq!(nodes.as_array().unwrap().len(), 4, "{nodes}");
    assert_eq!(nodes[0]["jobs"], serde_json::json!(["default/train"]));
    assert_eq!(nodes[0]["gpu_free_milli"].as_array().unwrap().len(), 4);
    assert_eq!(nodes[1]["up"], false);

    // A gang that needs two nodes waits whole; the reason counts the nodes.
    let (_, gang) = submit(serde_json::json!({
        "name": "gang", "region": "eu-west", "members": 2, "gpus": 4,
        "topology": "any", "priority": "best-effort"
    }));
    assert_eq!(gang["state"], "pending", "{gang}");
    assert!(
        gang["why_pending"]["message"]
            .as_str()
            .unwrap()
            .contains("insufficient gpu"),
        "{gang}"
    );

    // Production work preempts the batch job after its 1 s grace period.
    let (status, urgent) = submit(serde_json::json!({
        "name": "urgent", "region": "eu-west", "gpus": 4, "priority": "production"
    }));
    assert_eq!(status, 201, "{urgent}");
    assert!(
        urgent["why_pending"]["message"]
            .as_str()
            .unwrap()
            .contains("preempted"),
        "{urgent}"
    );
    let victim = job("train");
    // Within the grace period it is terminating; a slow machine may already be past it.
    if victim["state"] == "terminating" {
        assert_eq!(victim["preempted_by"], "default/urgent", "{victim}");
    } else {
        assert_eq!(victim["state"], "pending", "{victim}");
    }
    cloud
        .wait_for("/v1/jobs/urgent", "urgent placed", |v| {
            v["state"] == "running"
        })
        .unwrap();
    let train = job("train");
    assert_eq!(train["state"], "pending", "{train}");
    assert_eq!(train["requeues"], 1, "{train}");

    // The CLI shows the same.
    let cli = |args: &[&str]| {
        let output = std::process::Command::new(nephele_e2e::bin("nephele"))
            .args(args)
            .args(["--api", &cloud.api, "--token", &cloud.token])
            .env("NEPHELE_CA", cloud.ca_path())
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&output.stdout).to_string()
            + &String::from_utf8_lossy(&output.stderr);
        (output.status.success(), text)
    };
    let (ok, text) = cli(&["job", "get", "urgent"]);
    assert!(
        ok && text.contains("running") && text.contains("l4-0["),
        "{text}"
    );
    let (ok, text) = cli(&["job", "list"]);
    assert!(
        ok && text.contains("gang") && text.contains("pending"),
        "{text}"
    );
    let (ok, text) = cli(&["region", "nodes", "eu-west"]);
    assert!(
        ok && text.contains("pool-1") && text.contains("default/urgent"),
        "{text}"
    );
    let (ok, text) = cli(&[
        "job",
        "submit",
        "x",
        "--gpus",
        "2",
        "--gpu-milli",
        "500",
        "--hold",
    ]);
    assert!(!ok && text.contains("fractional"), "{text}");
    // A job with nothing to run is refused unless it only holds its resources.
    let (ok, text) = cli(&["job", "submit", "x", "--gpus", "1"]);
    assert!(!ok && text.contains("--hold to only hold"), "{text}");
    // `--stale` (any replica may answer) is accepted by the leader on every read.
    for args in [
        &["job", "list", "--stale"][..],
        &["job", "get", "urgent", "--stale"],
        &["device", "list", "--stale"],
        &["region", "nodes", "eu-west", "--stale"],
    ] {
        let (ok, text) = cli(args);
        assert!(ok, "{args:?}: {text}");
    }
    // A job that is nowhere: the error names every region searched.
    let (ok, text) = cli(&["job", "get", "nope"]);
    assert!(
        !ok && text.contains("no job named nope for tenant default in region")
            && text.contains("eu-west"),
        "{text}"
    );
    // Times as dates and ages, not unix seconds.
    let (ok, text) = cli(&["token", "create", "--ttl", "5000"]);
    assert!(ok && text.contains(" UTC (in 83 min)"), "{text}");
    let (ok, text) = cli(&["token", "list"]);
    assert!(ok && text.contains(" UTC (in 83 min)"), "{text}");

    // Bad requests: clear errors, nothing queued.
    for (body, status, needle) in [
        (
            serde_json::json!({"name": "a", "gpu": 1}),
            400,
            "unknown field",
        ),
        (
            serde_json::json!({"name": "a", "region": "mars"}),
            404,
            "eu-west",
        ),
        (
            serde_json::json!({"name": "a", "tenant": "nobody"}),
            400,
            "tenant",
        ),
        (
            serde_json::json!({"name": "urgent", "region": "eu-west"}),
            409,
            "exists",
        ),
        (
            serde_json::json!({"name": "a", "gpus": 1, "gpu_models": ["TPU v5"]}),
            400,
            "NVIDIA L4",
        ),
    ] {
        let (got, answer) = submit(body.clone());
        assert_eq!(got, status, "{body}: {answer}");
        assert!(
            answer["message"].as_str().unwrap().contains(needle),
            "{body}: {answer}"
        );
    }
    let (status, _) = nephele_e2e::Http::new(Some("bogus.token".into()))
        .raw_json(
            "POST",
            &format!("{}/v1/jobs", cloud.api),
            &serde_json::json!({"name": "a"}),
        )
        .unwrap();
    assert_eq!(status, 401);
    assert_eq!(cloud.get("/v1/jobs").unwrap().as_array().unwrap().len(), 3);

    // The pool agent goes away: its jobs wait again, on "node down".
    drop(pool);
    let urgent = cloud
        .wait_for("/v1/jobs/urgent", "urgent requeued", |v| {
            v["state"] == "pending"
        })
        .unwrap();
    assert!(
        urgent["why_pending"]["message"]
            .as_str()
            .unwrap()
            .contains("node down"),
        "{urgent}"
    );
    // Delete answers with the job as it was; then it is gone.
    let deleted = cloud
        .client()
        .request("DELETE", &format!("{}/v1/jobs/urgent", cloud.api), None)
        .unwrap();
    assert_eq!(deleted["name"], "urgent");
    assert!(cloud.get("/v1/jobs/urgent").is_err());
    let metrics = cloud
        .client()
        .request("GET", &format!("{}/metrics", cloud.api), None)
        .unwrap();
    assert!(
        metrics
            .as_str()
            .unwrap()
            .contains("nephele_scheduler_events_total{region=\"eu-west\",kind=\"preempted\"} 1"),
        "{metrics}"
    );
}

/// A BERT sentence encoder pushed as safetensors + config for candle: the control plane
/// builds and checks its f32 and Q8_0 GGUF variants, agents load them through the same
/// `Model` and batcher as ONNX models, and the answers are the encoder's.
#[test]
fn a_bert_encoder_pushed_for_candle_is_served_in_both_variants() {
    use base64::Engine as _;
    use nephele_runtime::candle_bert::{tiny_random_bert, CandleBert};
    let cloud = Cloud::start("candle").expect("cloud");
    let edge = Edge::start(
        &cloud,
        "edge-1",
        "eu-west",
        &["--profile", "rpi5-8gb", "--label", "tier=edge"],
        &[],
    )
    .unwrap();
    let (safetensors, config) = tiny_random_bert(11).unwrap();
    let upload = serde_json::json!({
        "bert": {
            "safetensors_base64": base64::engine::general_purpose::STANDARD.encode(&safetensors),
            "config": serde_json::from_str::<Value>(&config).unwrap(),
            "sequence": 8,
        }
    });
    let url = format!("{}/v1/models/tiny-bert?wait=true", cloud.api);
    let (status, body) = cloud.client().raw_json("PUT", &url, &upload).unwrap();
    assert_eq!(status, 201, "{body}");
    let names: Vec<&str> = body["variants"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["full", "int8"], "{body}");
    assert_eq!(body["format"], "candle-bert-gguf", "{body}");
    // Both kinds of upload at once, or a sequence BERT cannot take, are refused.
    let both = serde_json::json!({"onnx_base64": "", "bert": upload["bert"].clone()});
    assert_eq!(cloud.client().raw_json("PUT", &url, &both).unwrap().0, 400);
    let mut long = upload.clone();
    long["bert"]["sequence"] = serde_json::json!(100_000);
    let refused = cloud.client().raw_json("PUT", &url, &long).unwrap();
    assert_eq!(refused.0, 400, "{}", refused.1);
    for variant in ["full", "int8"] {
        let name = format!("bert-{variant}");
        cloud
            .post(
                "/v1/deployments",
                &serde_json::json!({"name": name, "model": "tiny-bert", "variant": variant,
                    "selector": "tier=edge", "slo_ms": 200}),
            )
            .unwrap();
        cloud
            .wait_for(
                &format!("/v1/deployments/{name}"),
                &format!("{name} ready"),
                |v| v["ready_devices"] == 1,
            )
            .unwrap();
    }
    let reference = CandleBert::load("reference", &safetensors, &config).unwrap();
    for r in 0..10usize {
        let row: Vec<f32> = (0..8).map(|p| ((r * 13 + p * 5) % 95 + 1) as f32).collect();
        let expected = reference.embed(1, 8, &row).unwrap();
        let (code, full) = edge.infer("bert-full", &row).unwrap();
        assert_eq!(code, 200, "{full}");
        assert_close(&outputs(&full), &expected, "candle full answer");
        let (code, int8) = edge.infer("bert-int8", &row).unwrap();
        assert_eq!(code, 200, "{int8}");
        let got = outputs(&int8);
        let dot: f32 = got.iter().zip(&expected).map(|(a, b)| a * b).sum();
        let norm = |v: &[f32]| v.iter().map(|x| x * x).sum::<f32>().sqrt();
        let cosine = dot / (norm(&got) * norm(&expected));
        assert!(cosine >= 0.99, "int8 answer cosine {cosine}");
    }
    // A row that is not token ids is a clear 400, not a crash.
    let (code, reply) = edge.infer("bert-full", &[0.5; 8]).unwrap();
    assert_eq!(code, 400, "{reply}");
}

const CARBON_REGIONS: &str = r#"
heartbeat_interval_ms = 300
[scheduler]
tick_ms = 200
[[region]]
name = "green"
carbon_zone = "CA-ON"
[[region.pool]]
name = "l4"
node_profile = "gpu-4x-l4"
max_nodes = 1
[[region]]
name = "brown"
carbon_zone = "DE"
[[region.pool]]
name = "l4"
node_profile = "gpu-4x-l4"
max_nodes = 1
"#;

/// 30 days of hourly carbon in Electricity Maps' file format, dated June 2023: a daily
/// cycle around `level` whose lowest hour falls 6 hours after the file's last hour.
fn carbon_file(path: &std::path::Path, level: f64) {
    let mut text = String::from(
        "Datetime (UTC),Zone Id,Carbon Intensity gCO₂eq/kWh (direct),Data Estimated\n",
    );
    for i in 0..720i64 {
        let phase = (i - 725).rem_euclid(24) as f64;
        let value = level + 200.0 - 100.0 * (phase / 24.0 * std::f64::consts::TAU).cos();
        text.push_str(&format!(
            "2023-06-{:02} {:02}:00:00,XX,{value:.2},false\n",
            1 + i / 24,
            i % 24
        ));
    }
    std::fs::write(path, text).unwrap();
}

#[test]
fn carbon_aware_jobs_go_to_the_greener_region_and_wait_for_the_greener_hour() {
    let cloud = Cloud::start_with("carbon", CARBON_REGIONS).expect("cloud");
    let http = cloud.client();
    let url = |path: &str| format!("{}{path}", cloud.api);
    let _pools: Vec<Edge> = ["green", "brown"]
        .iter()
        .map(|region| Edge::pool(&cloud, &format!("pool-{region}"), region).unwrap())
        .collect();
    for region in ["green", "brown"] {
        cloud
            .wait_for(
                &format!("/v1/regions/{region}/nodes"),
                "pool slot up",
                |v| v[0]["up"] == true,
            )
            .unwrap();
    }

    // No signal yet: the grid view says so and how to fix it.
    let grid = cloud.get("/v1/regions/green/grid").unwrap();
    assert_eq!(grid["signal"], "none", "{grid}");
    assert!(grid["note"].as_str().unwrap().contains("nephele grid push"));

    // The CLI replays a file as if live: its last hour becomes the current hour.
    for (region, level) in [("green", 50.0), ("brown", 300.0)] {
        let file = cloud.dir.join(format!("{region}.csv"));
        carbon_file(&file, level);
        let output = std::process::Command::new(nephele_e2e::bin("nephele"))
            .args(["grid", "push", region, "--carbon"])
            .arg(&file)
            .args(["--as-of", "2023-06-30T23:00", "--days", "30"])
            .args(["--api", &cloud.api, "--token", &cloud.token])
            .env("NEPHELE_CA", cloud.ca_path())
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&output.stdout);
        assert!(
            output.status.success(),
            "{stdout}{}",
            String::from_utf8_lossy(&output.stderr)
        );
        assert!(stdout.contains("kept 720"), "{stdout}");
        assert!(stdout.contains("signal fresh"), "{stdout}");
    }
    let grid = cloud.get("/v1/regions/brown/grid").unwrap();
    assert_eq!(grid["signal"], "fresh", "{grid}");
    assert_eq!(grid["measured_hours"], 720);
    let outlook = grid["outlook"].as_array().unwrap();
    assert_eq!(outlook.len(), 72);
    let now_hour = outlook[0]["unix"].as_u64().unwrap() / 3600;
    let greenest = (0..24)
        .min_by(|a, b| {
            let c = |i: usize| outlook[i]["carbon_g_per_kwh"].as_f64().unwrap();
            c(*a).total_cmp(&c(*b))
        })
        .unwrap();
    // The hour may have turned since the push; the trough stays where it was.
    let trough = grid["latest_measured_unix"].as_u64().unwrap() / 3600 + 6;
    assert_eq!(now_hour + greenest as u64, trough, "{grid:#}");

    // "auto": the greener region, with how it was chosen.
    let (status, train) = http
        .raw_json(
            "POST",
            &url("/v1/jobs"),
            &serde_json::json!({"name": "train", "region": "auto", "gpus": 2, "expected_runtime_s": 3600}),
        )
        .unwrap();
    assert_eq!(status, 201, "{train}");
    assert_eq!(train["region"], "green", "{train:#}");
    assert_eq!(train["state"], "running", "{train:#}");
    assert_eq!(train["region_choice"]["chosen"], "green");
    assert_eq!(
        train["region_choice"]["candidates"]
            .as_array()
            .unwrap()
            .len(),
        2
    );

    // A deadline makes it wait for the trough, out of the queue.
    let deadline = (now_hour + 20) * 3600;
    let (status, nightly) = http
        .raw_json(
            "POST",
            &url("/v1/jobs"),
            &serde_json::json!({"name": "nightly", "region": "brown", "gpus": 1,
                "expected_runtime_s": 3600, "deadline_unix": deadline}),
        )
        .unwrap();
    assert_eq!(status, 201, "{nightly}");
    assert_eq!(nightly["state"], "deferred", "{nightly:#}");
    assert_eq!(
        nightly["deferral"]["best_start_unix"].as_u64(),
        Some(trough * 3600),
        "{nightly:#}"
    );
    assert_eq!(nightly["deferral"]["latest_start_unix"], deadline - 3600);
    let nodes = cloud.get("/v1/regions/brown/nodes").unwrap();
    assert!(nodes[0]["jobs"].as_array().unwrap().is_empty(), "{nodes}");
    let output = std::process::Command::new(nephele_e2e::bin("nephele"))
        .args(["job", "get", "nightly", "--region", "brown"])
        .args(["--api", &cloud.api, "--token", &cloud.token])
        .env("NEPHELE_CA", cloud.ca_path())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(stdout.contains("deferred"), "{stdout}");
    assert!(
        stdout.contains("waiting for a lower-carbon hour"),
        "{stdout}"
    );

    // A carbon-intensity provider's forecast (Electricity Maps' forecast format, as its
    // API returns it) knows of a windy hour three hours from now: it is used for the
    // hours it covers, beside the measurements, and the held job now waits for it.
    let windy = now_hour + 3;
    // ISO 8601 of a unix hour (Howard Hinnant's civil-from-days), as the provider writes it.
    let iso = |hour: u64| {
        let days = (hour / 24) as i64 + 719_468;
        let era = days.div_euclid(146_097);
        let doe = days - era * 146_097;
        let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
        let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
        let mp = (5 * doy + 2) / 153;
        let day = doy - (153 * mp + 2) / 5 + 1;
        let month = if mp < 10 { mp + 3 } else { mp - 9 };
        let year = yoe + era * 400 + i64::from(month <= 2);
        format!("{year:04}-{month:02}-{day:02}T{:02}:00:00.000Z", hour % 24)
    };
    let points: Vec<serde_json::Value> = (now_hour..now_hour + 24)
        .map(|hour| {
            serde_json::json!({"datetime": iso(hour),
                "carbonIntensity": if hour == windy { 12.0 } else { 480.0 }})
        })
        .collect();
    let file = cloud.dir.join("brown-forecast.json");
    std::fs::write(
        &file,
        serde_json::json!({"zone": "XX", "forecast": points}).to_string(),
    )
    .unwrap();
    let output = std::process::Command::new(nephele_e2e::bin("nephele"))
        .args(["grid", "push", "brown", "--forecast"])
        .arg(&file)
        .args(["--api", &cloud.api, "--token", &cloud.token])
        .env("NEPHELE_CA", cloud.ca_path())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(
        stdout.contains("provider forecast of 24 hours stored"),
        "{stdout}"
    );
    assert!(
        stdout.contains("provider forecast: electricitymaps XX"),
        "{stdout}"
    );
    let grid = cloud.get("/v1/regions/brown/grid").unwrap();
    assert_eq!(
        grid["measured_hours"], 720,
        "the measurements are as they were"
    );
    assert_eq!(grid["forecast"]["hours"], 24, "{grid:#}");
    assert_eq!(grid["forecast"]["fresh"], true);
    let hour_of = |unix_hour: u64| {
        grid["outlook"]
            .as_array()
            .unwrap()
            .iter()
            .find(|h| h["unix"].as_u64() == Some(unix_hour * 3600))
            .cloned()
            .unwrap()
    };
    assert_eq!(hour_of(windy)["source"], "provider", "{grid:#}");
    assert_eq!(hour_of(windy)["carbon_g_per_kwh"], 12.0);
    let nightly = cloud.get("/v1/jobs/nightly?region=brown").unwrap();
    assert_eq!(nightly["state"], "deferred", "{nightly:#}");
    assert_eq!(
        nightly["deferral"]["best_start_unix"].as_u64(),
        Some(windy * 3600),
        "the held job waits for the provider's windy hour now: {nightly:#}"
    );
    // An older forecast than the one held is refused, and the held one stays.
    let (status, reply) = http
        .raw_json(
            "PUT",
            &url("/v1/regions/brown/grid"),
            &serde_json::json!({"forecast": {"issued_unix": now_hour * 3600 - 7200,
                "source": "late", "points": [{"unix": now_hour * 3600, "carbon_g_per_kwh": 1.0}]}}),
        )
        .unwrap();
    assert_eq!(status, 400, "{reply}");
    assert!(
        reply["message"]
            .as_str()
            .unwrap()
            .contains("before the one this region holds"),
        "{reply}"
    );
    assert_eq!(
        cloud.get("/v1/regions/brown/grid").unwrap()["forecast"]["source"],
        "electricitymaps XX"
    );

    // Bad input is a 400 that says why, and changes nothing.
    for (body, expect) in [
        (
            serde_json::json!({"points": [{"unix": (now_hour + 2) * 3600, "carbon_g_per_kwh": 10.0}]}),
            "has not begun",
        ),
        (
            serde_json::json!({"points": [{"unix": now_hour * 3600, "carbon_g_per_kwh": -5.0}]}),
            "outside",
        ),
        (
            serde_json::json!({"points": [{"when": 1}]}),
            "invalid grid push",
        ),
        (serde_json::json!({"points": []}), "no points"),
    ] {
        let (status, reply) = http
            .raw_json("PUT", &url("/v1/regions/brown/grid"), &body)
            .unwrap();
        assert_eq!(status, 400, "{body}: {reply}");
        assert!(
            reply["message"].as_str().unwrap().contains(expect),
            "{reply}"
        );
    }
    assert_eq!(
        cloud.get("/v1/regions/brown/grid").unwrap()["measured_hours"],
        720
    );
    let (status, _) = http
        .raw_json(
            "PUT",
            &url("/v1/regions/nowhere/grid"),
            &serde_json::json!({"points": []}),
        )
        .unwrap();
    assert_eq!(status, 404);
    let (status, reply) = http
        .raw_json(
            "POST",
            &url("/v1/jobs"),
            &serde_json::json!({"name": "x", "region": "brown", "deadline_unix": deadline}),
        )
        .unwrap();
    assert_eq!(status, 400, "{reply}");

    // The queue gauges count the held job; deleting it lets it go.
    let metrics = cloud
        .client()
        .request("GET", &url("/metrics"), None)
        .unwrap();
    let metrics = metrics.as_str().unwrap_or_default().to_string();
    assert!(
        metrics.contains("nephele_scheduler_jobs{region=\"brown\",state=\"deferred\"} 1"),
        "{metrics}"
    );
    cloud
        .client()
        .request("DELETE", &url("/v1/jobs/nightly"), None)
        .unwrap();
    assert!(cloud.get("/v1/jobs/nightly").is_err());
}

/// Sends raw HTTP/1.1 bytes to the API and reads what comes back within `wait`: the
/// answer's head and as much of its body as arrived.
fn raw_http(api: &str, head: &str, body: &[u8], wait: Duration) -> String {
    use std::io::{Read, Write};
    let mut stream = nephele_e2e::raw_connection(api, wait).expect("connect to the API");
    stream.write_all(head.as_bytes()).expect("head");
    // The body may be refused (and the connection closed) before it is all sent.
    let _ = stream.write_all(body);
    let mut answer = Vec::new();
    let mut buffer = [0u8; 8192];
    while let Ok(n) = stream.read(&mut buffer) {
        if n == 0 {
            break;
        }
        answer.extend_from_slice(&buffer[..n]);
        if answer.windows(4).any(|w| w == b"\r\n\r\n") && answer.len() > 12 {
            // Head in; take what of the body is already there.
            stream
                .set_read_timeout(Some(Duration::from_millis(200)))
                .expect("timeout");
        }
    }
    String::from_utf8_lossy(&answer).into_owned()
}

#[test]
fn unauthenticated_uploads_are_refused_before_their_body_is_read() {
    let cloud = Cloud::start("hostile-api").expect("cloud");
    // A method a route does not take is a 405 naming the ones it does; readiness is
    // its own route beside liveness.
    let answer = raw_http(
        &cloud.api,
        &format!(
            "PATCH /v1/deployments/d HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {}\r\nConnection: close\r\n\r\n",
            cloud.token
        ),
        b"",
        Duration::from_secs(10),
    );
    assert!(answer.starts_with("HTTP/1.1 405"), "{answer}");
    assert!(
        answer.to_lowercase().contains("allow: get, put, delete"),
        "{answer}"
    );
    assert!(
        answer.contains("PATCH is not allowed on /v1/deployments/d; it takes GET, PUT, DELETE"),
        "{answer}"
    );
    let answer = raw_http(
        &cloud.api,
        "GET /readyz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
        b"",
        Duration::from_secs(10),
    );
    assert!(
        answer.starts_with("HTTP/1.1 200") && answer.contains("\"ready\""),
        "{answer}"
    );
    let before = cloud.rss_bytes().expect("rss");
    // Twelve uploads that announce 500 MB each and send 4 MiB: each is answered 401 at
    // once, without the control plane waiting for (or buffering) the rest.
    let chunk = vec![b'{'; 4 * 1024 * 1024];
    let started = Instant::now();
    let answers: Vec<String> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..12)
            .map(|i| {
                let (api, chunk) = (&cloud.api, &chunk);
                scope.spawn(move || {
                    let token = if i % 2 == 0 { "" } else { "Authorization: Bearer forged.token\r\n" };
                    raw_http(
                        api,
                        &format!("POST /v1/tokens HTTP/1.1\r\nHost: x\r\n{token}Content-Type: application/json\r\nContent-Length: 500000000\r\n\r\n"),
                        chunk,
                        Duration::from_secs(10),
                    )
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("client"))
            .collect()
    });
    let took = started.elapsed();
    for answer in &answers {
        assert!(answer.starts_with("HTTP/1.1 401"), "{answer}");
    }
    let after = cloud.rss_bytes().expect("rss");
    println!(
        "12 unauthenticated 500 MB uploads refused in {took:?}; control plane RSS {} -> {} MiB",
        before >> 20,
        after >> 20
    );
    assert!(
        took < Duration::from_secs(9),
        "the refusals waited for the bodies: {took:?}"
    );
    assert!(
        after < before + (64 << 20),
        "RSS grew from {before} to {after} bytes"
    );

    // Authenticated, a declared body over its route's limit is refused before it is
    // read, saying the limit: 1 MiB for a deployment, 512 MiB for a model.
    let auth = format!("Authorization: Bearer {}\r\n", cloud.token);
    for (path, length, says) in [
        ("/v1/deployments", 2_000_000u64, "1 MiB"),
        ("/v1/models/huge", 600_000_000, "512 MiB"),
    ] {
        let answer = raw_http(
            &cloud.api,
            &format!("POST {path} HTTP/1.1\r\nHost: x\r\n{auth}Content-Length: {length}\r\n\r\n"),
            b"{}",
            Duration::from_secs(10),
        );
        assert!(answer.starts_with("HTTP/1.1 413"), "{path}: {answer}");
        assert!(answer.contains(says), "{path}: {answer}");
    }
    // The refusals are counted by reason (6 without a token, 6 with a forged one), and
    // logged with the peer's address but never the token.
    let metrics = raw_http(
        &cloud.api,
        "GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
        b"",
        Duration::from_secs(5),
    );
    for reason in ["missing", "invalid"] {
        let line = format!("nephele_api_auth_failures_total{{reason=\"{reason}\"}} 6");
        assert!(metrics.contains(&line), "{line} not in {metrics}");
    }
    let log = std::fs::read_to_string(cloud.log_path()).expect("log");
    assert!(log.contains("not authenticated"), "{log}");
    assert!(!log.contains("forged.token"), "a token reached the log");
    // And honest requests are still served.
    assert!(cloud.get("/v1/models").is_ok());
}

/// A join turned away because its address already has 8 joins in progress says why and
/// tries again with backoff, and succeeds once a place is free (issue 53). Before, it
/// failed at once with "stream read failed: connection lost".
#[test]
fn a_join_turned_away_for_its_address_says_why_and_tries_again() {
    let cloud = Cloud::start("join-retry").expect("cloud");
    let (runtime, ca_der) = runtime_and_ca(&cloud);
    let config = nephele_net::join_client_config(nephele_net::fingerprint(&ca_der)).unwrap();
    let addr: std::net::SocketAddr = cloud.quic.parse().unwrap();
    // Eight half joins from 127.0.0.1, the address the agent joins from: every place
    // that address may hold.
    let (endpoint, held) = runtime.block_on(async {
        let endpoint = quinn::Endpoint::client(([127, 0, 0, 1], 0).into()).unwrap();
        let mut held = Vec::new();
        for _ in 0..8 {
            let connection = endpoint
                .connect_with(config.clone(), addr, nephele_net::SERVER_NAME)
                .unwrap()
                .await
                .expect("handshake");
            let (mut send, recv) = connection.open_bi().await.expect("stream");
            send.write_all(&[0, 0]).await.expect("half a length prefix");
            held.push((connection, send, recv));
        }
        (endpoint, held)
    });
    let token = cloud.join_token("eu-west", 600).unwrap();
    let (quic, dir) = (cloud.quic.clone(), cloud.dir.join("patient"));
    let joining =
        std::thread::spawn(move || nephele_e2e::join_via(&quic, &dir, "patient", &token, &[]));
    std::thread::sleep(Duration::from_secs(2));
    assert!(!joining.is_finished(), "the join gave up while turned away");
    // The places are given back; the agent's next try gets one.
    runtime.block_on(async {
        for (connection, _, _) in &held {
            connection.close(0u32.into(), b"done");
        }
        endpoint.wait_idle().await;
    });
    let (ok, output) = joining.join().unwrap().unwrap();
    assert!(ok, "{output}");
    assert!(
        output.contains("from this address"),
        "the reason is shown: {output}"
    );
    assert!(output.contains("trying again"), "{output}");
    let devices = cloud.get("/v1/devices").unwrap();
    assert!(
        devices
            .as_array()
            .unwrap()
            .iter()
            .any(|d| d["name"] == "patient"),
        "{devices}"
    );
}

#[test]
fn connections_holding_half_a_join_request_are_closed_in_bounded_time() {
    let cloud = Cloud::start("half-joins").expect("cloud");
    let (runtime, ca_der) = runtime_and_ca(&cloud);
    let config = nephele_net::join_client_config(nephele_net::fingerprint(&ca_der)).unwrap();
    let addr: std::net::SocketAddr = cloud.quic.parse().unwrap();
    // Certificate-less connections that send half of a join request's length prefix and
    // then nothing, as an attacker holding the control plane's memory and places would:
    // from one address (127.0.0.2: 12 connections), then from nine more (127.0.0.3 to
    // .11: 8 each). Linux routes all of 127/8 to the loopback device.
    let hold = |runtime: &tokio::runtime::Runtime, host: u8, count: usize| {
        runtime.block_on(async {
            let local = std::net::SocketAddr::from(([127, 0, 0, host], 0));
            let endpoint = quinn::Endpoint::client(local).unwrap();
            let mut held = Vec::new();
            for _ in 0..count {
                let connection = endpoint
                    .connect_with(config.clone(), addr, nephele_net::SERVER_NAME)
                    .unwrap()
                    .await
                    .expect("handshake");
                // One closed at once may refuse the stream: it is counted all the same.
                let streams = match connection.open_bi().await {
                    Ok((mut send, recv)) => {
                        let _ = send.write_all(&[0, 0]).await;
                        Some((send, recv))
                    }
                    Err(_) => None,
                };
                held.push((connection, streams));
            }
            (endpoint, held)
        })
    };
    // An agent enrolled before the attack, whose session must go on through it.
    let resident = Edge::start(&cloud, "resident", "eu-west", &[], &[]).expect("resident agent");
    let sessions_before = resident.metric("nephele_agent_sessions_total", "").unwrap();
    let rss_before = cloud.rss_bytes().unwrap_or(0);
    let started = Instant::now();
    let mut attack = vec![hold(&runtime, 2, 12)];
    // One address cannot take every place: an honest agent joins during its attack.
    let joined = Instant::now();
    let honest = Edge::start(&cloud, "during-attack", "eu-west", &[], &[])
        .expect("an honest join while one address holds half joins");
    println!(
        "an honest agent joined in {:?} while one address held 12 half joins",
        joined.elapsed()
    );
    drop(honest);
    for host in 3..=11 {
        attack.push(hold(&runtime, host, 8));
    }
    let holders: usize = attack.iter().map(|(_, held)| held.len()).sum();
    // Every place is held now: the control plane's memory, and the resident agent.
    let rss_during = cloud.rss_bytes().unwrap_or(0);
    let online = cloud.get("/v1/devices").unwrap();
    assert!(
        online
            .as_array()
            .unwrap()
            .iter()
            .any(|d| d["name"] == "resident" && d["online"] == true),
        "{online}"
    );
    println!(
        "control plane RSS {} MiB before the attack, {} MiB with {holders} half joins held",
        rss_before >> 20,
        rss_during >> 20
    );
    // The stated bound: what the held joins cost stays under 64 MiB.
    assert!(
        rss_during < rss_before + (64 << 20),
        "{rss_before} -> {rss_during}"
    );
    let reasons: Vec<String> = runtime.block_on(async {
        let mut reasons = Vec::new();
        for (_, held) in &attack {
            for (connection, _streams) in held {
                let closed = tokio::time::timeout(Duration::from_secs(20), connection.closed())
                    .await
                    .expect("the control plane closes a connection that does not join");
                reasons.push(closed.to_string());
            }
        }
        reasons
    });
    let took = started.elapsed();
    let per_address = reasons
        .iter()
        .filter(|r| r.contains("from this address"))
        .count();
    let busy = reasons
        .iter()
        .filter(|r| r.contains("too many joins in progress"))
        .count();
    let slow = reasons.iter().filter(|r| r.contains("in time")).count();
    println!(
        "{holders} half joins from 10 addresses: {per_address} closed at once (8 per address), {busy} closed at once (64 in all), {slow} after the timeout; all closed in {took:?}"
    );
    assert_eq!(per_address + busy + slow, holders, "{reasons:?}");
    // 12 from one address: 4 over its 8; then 8 + 72 passed that check for 64 places.
    assert_eq!(per_address, 4, "{reasons:?}");
    assert_eq!(busy, 16, "{reasons:?}");
    assert_eq!(slow, 64, "{reasons:?}");
    assert!(took < Duration::from_secs(25), "{took:?}");
    // Counted by reason, and afterwards an honest agent joins as before.
    let metrics = cloud
        .client()
        .request("GET", &format!("{}/metrics", cloud.api), None)
        .unwrap();
    let metrics = metrics.as_str().unwrap_or("");
    // The resident agent's session went on: no reconnect during the attack.
    assert!(resident.status().unwrap()["connected"].as_bool().unwrap());
    assert_eq!(
        resident.metric("nephele_agent_sessions_total", "").unwrap(),
        sessions_before
    );
    for (reason, count) in [
        ("timeout", slow),
        ("busy", busy),
        ("busy_address", per_address),
    ] {
        assert!(
            metrics.contains(&format!(
                "nephele_gateway_joins_refused_total{{reason=\"{reason}\"}} {count}"
            )),
            "{reason}: {metrics}"
        );
    }
    let edge = Edge::start(&cloud, "after-attack", "eu-west", &[], &[]).expect("an honest join");
    drop(edge);
}

/// The subcommands a `--help` page lists under `Commands:` (but `help`).
fn subcommands(help: &str) -> Vec<String> {
    help.lines()
        .skip_while(|line| !line.starts_with("Commands:"))
        .skip(1)
        .take_while(|line| line.starts_with("  "))
        .filter_map(|line| line.split_whitespace().next())
        .filter(|name| *name != "help")
        .map(str::to_string)
        .collect()
}

#[test]
fn no_help_page_shows_a_secret_from_the_environment() {
    const SECRET: &str = "tok1.s3cr3t-from-the-environment";
    let help = |binary: &str, args: &[String]| {
        let output = std::process::Command::new(nephele_e2e::bin(binary))
            .args(args)
            .arg("--help")
            .env("NEPHELE_TOKEN", SECRET)
            .env("NEPHELE_JOIN_TOKEN", SECRET)
            .output()
            .unwrap();
        assert!(output.status.success(), "{binary} {args:?} --help");
        String::from_utf8_lossy(&output.stdout).to_string()
            + &String::from_utf8_lossy(&output.stderr)
    };
    let mut pages = 0;
    let mut todo: Vec<(&str, Vec<String>)> = vec![
        ("nephele", vec![]),
        ("nephele-edge", vec![]),
        ("nephele-cloud", vec![]),
    ];
    while let Some((binary, args)) = todo.pop() {
        let page = help(binary, &args);
        pages += 1;
        assert!(
            !page.contains("s3cr3t"),
            "`{binary} {} --help` shows the token:\n{page}",
            args.join(" ")
        );
        for sub in subcommands(&page) {
            let mut deeper = args.clone();
            deeper.push(sub);
            todo.push((binary, deeper));
        }
    }
    assert!(pages > 30, "only {pages} help pages were read");
    // A malformed --api is an input mistake, not an unreachable server.
    let run = |api: &str| {
        let output = std::process::Command::new(nephele_e2e::bin("nephele"))
            .args(["device", "list", "--api", api])
            .output()
            .unwrap();
        assert!(!output.status.success());
        String::from_utf8_lossy(&output.stderr).to_string()
    };
    for bad in ["htp:/x", "127.0.0.1:8080", "http://exa mple"] {
        let said = run(bad);
        assert!(
            said.contains("is not a URL") && !said.contains("cannot reach"),
            "{bad}: {said}"
        );
    }
    let said = run("http://127.0.0.1:1");
    assert!(
        said.contains("cannot reach the API at http://127.0.0.1:1"),
        "{said}"
    );
    println!("help pages read without a secret: {pages}");
}

/// `nephele demo --agent-bin` runs the fleet's agents from the agent binary (here
/// `nephele-edge`, as `install-edge.sh` installs it) instead of the CLI's `edge`
/// subcommand, and says which binary its memory figures measured.
#[test]
fn the_demo_runs_its_agents_from_the_agent_binary_when_asked() {
    let agent = nephele_e2e::bin("nephele-edge");
    let output = std::process::Command::new(nephele_e2e::bin("nephele"))
        .args(["demo", "--json", "--requests", "30", "--agent-bin"])
        .arg(&agent)
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "demo failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let report: Value = serde_json::from_slice(&output.stdout).unwrap();
    let described = report["agent_binary"].as_str().unwrap();
    assert!(
        described.starts_with(&agent.display().to_string()) && !described.contains(" edge ("),
        "{described}"
    );
    let devices = report["devices"].as_array().unwrap();
    assert_eq!(devices.len(), 3);
    for device in devices {
        assert!(device["rss_idle_mb"].as_f64().unwrap() > 0.0, "{device}");
        assert!(device["accuracy"].as_f64().unwrap() > 0.9, "{device}");
    }
}
