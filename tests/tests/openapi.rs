//! The API's contract: Schemathesis (PyPI, in the venv `tests/run.sh` prepares) reads
//! `/v1/openapi.json` from a real control plane and sends every operation generated
//! requests, valid and invalid: no answer may be a 5xx, contradict its documented
//! schema, status or content type. Token rotation and revocation are left out (the
//! fuzzer would rotate away its own token and test the rest unauthenticated), and so
//! is the watch (a stream that lasts; `tests/tests/watch.rs` tests it). The seed
//! is fixed so CI is reproducible; run with another (`SCHEMATHESIS_SEED`) to look for
//! more.

#![allow(clippy::unwrap_used)]

use std::process::Command;

use nephele_e2e::{require, temp_dir, venv_python, Cloud, Edge, MODEL_ONNX, TWO_REGIONS};

#[test]
fn every_operation_keeps_its_documented_contract() {
    let schemathesis = venv_python().with_file_name("schemathesis");
    if !require("Schemathesis in the test venv", schemathesis.exists()) {
        return;
    }
    // A generous rate: the fuzzer sends thousands of requests with one token.
    let config = format!("api_rate_per_s = 100000.0\napi_rate_burst = 100000\n{TWO_REGIONS}");
    let cloud = Cloud::start_with("openapi", &config).expect("cloud");
    // Real objects of every kind, so lists and gets answer with them (and their
    // schemas are checked on real answers, not only on empty lists).
    let _edge = Edge::start(&cloud, "edge-1", "eu-west", &["--label", "tier=edge"], &[]).unwrap();
    let (status, body) = cloud.put_model("digits-mlp", MODEL_ONNX).unwrap();
    assert_eq!(status, 201, "{body}");
    cloud
        .post(
            "/v1/deployments",
            &serde_json::json!({"name": "digits", "model": "digits-mlp", "selector": "tier=edge"}),
        )
        .unwrap();
    cloud
        .wait_for("/v1/deployments/digits", "digits ready", |v| {
            v["ready_devices"] == 1
        })
        .unwrap();
    cloud
        .post(
            "/v1/jobs",
            &serde_json::json!({"name": "train", "gpus": 1, "region": "eu-west"}),
        )
        .unwrap();
    for path in ["/v1/devices", "/v1/models", "/v1/deployments", "/v1/jobs"] {
        let listed = cloud.get(path).unwrap();
        assert!(!listed.as_array().unwrap().is_empty(), "{path}: {listed}");
    }

    // The document is public and whole.
    let (status, _, document) = nephele_e2e::Http::new(None)
        .get_full(&format!("{}/v1/openapi.json", cloud.api))
        .unwrap();
    assert_eq!(status, 200);
    assert_eq!(document["openapi"], "3.0.3");
    let operations: usize = document["paths"]
        .as_object()
        .unwrap()
        .values()
        .map(|p| p.as_object().unwrap().len())
        .sum();
    assert!(operations >= 34, "{operations} operations");

    let seed = std::env::var("SCHEMATHESIS_SEED").unwrap_or_else(|_| "20261203".into());
    let output = Command::new(&schemathesis)
        .args(["run", &format!("{}/v1/openapi.json", cloud.api)])
        .args(["--header", &format!("Authorization: Bearer {}", cloud.token)])
        // Over HTTPS, checking the API's certificate against the cluster CA.
        .arg("--tls-verify")
        .arg(cloud.ca_path())
        .args([
            "--checks",
            "not_a_server_error,response_schema_conformance,content_type_conformance,status_code_conformance",
        ])
        .args(["--exclude-operation-id", "rotateApiToken"])
        .args(["--exclude-operation-id", "revokeApiToken"])
        // A watch without a timeout lasts until the client goes (tested in watch.rs).
        .args(["--exclude-operation-id", "watch"])
        .args(["--max-examples", "25", "--workers", "1", "--seed", &seed])
        .env("NO_COLOR", "1")
        // Schemathesis keeps a cache in its working directory: not in the checkout.
        .current_dir(temp_dir("schemathesis"))
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&output.stdout).to_string()
        + &String::from_utf8_lossy(&output.stderr);
    let summary: Vec<&str> = text
        .lines()
        .skip_while(|l| !l.contains("SUMMARY"))
        .collect();
    println!("{}", summary.join("\n"));
    assert!(
        output.status.success(),
        "Schemathesis found failures (seed {seed}):\n{text}"
    );
    // Every operation of the document but the three left out above.
    let tested = format!("Tested: {}", operations - 3);
    assert!(text.contains(&tested), "{tested}: {text}");
    // The control plane is still up and answering after the fuzzing.
    assert!(cloud.get("/v1/regions").is_ok());
    assert!(!cloud.logs().contains("panicked"), "{}", cloud.logs());
}
