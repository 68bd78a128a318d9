//! Tenants, roles and API tokens on a real control plane (`nephele-cloud` on
//! loopback): every refusal the API makes (no token, a wrong, revoked or rotated-away
//! token, a role too low, another tenant's object, a quota exceeded, an oversized
//! upload, invalid payloads, a token over its rate) is an `application/problem+json`
//! answer naming the field at fault, and changes nothing; the audit log says who
//! changed what, from where; the CLI manages tokens; no secret is ever shown twice.

#![allow(clippy::unwrap_used)]

use std::collections::HashMap;
use std::io::{Read as _, Write as _};
use std::time::Duration;

use nephele_e2e::{bin, Cloud, MODEL_ONNX, TWO_REGIONS};
use serde_json::{json, Value};

/// One answer: status, headers (lower-case names), JSON body (or the text).
struct Answer {
    status: u16,
    headers: HashMap<String, String>,
    body: Value,
}

fn call(cloud: &Cloud, token: Option<&str>, method: &str, path: &str, body: &[u8]) -> Answer {
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(Duration::from_secs(60)))
        .tls_config(nephele_e2e::tls_config())
        .build()
        .into();
    let url = format!("{}{path}", cloud.api);
    let auth = token.map(|t| format!("Bearer {t}"));
    let with_auth = |r: ureq::RequestBuilder<ureq::typestate::WithoutBody>| match &auth {
        Some(a) => r.header("authorization", a),
        None => r,
    };
    let with_auth_body = |r: ureq::RequestBuilder<ureq::typestate::WithBody>| match &auth {
        Some(a) => r.header("authorization", a),
        None => r,
    };
    let response = match method {
        "GET" => with_auth(agent.get(&url)).call(),
        "DELETE" => with_auth(agent.delete(&url)).call(),
        "POST" => with_auth_body(agent.post(&url))
            .header("content-type", "application/json")
            .send(body),
        "PUT" => with_auth_body(agent.put(&url)).send(body),
        other => panic!("{other}"),
    };
    let mut response = response.unwrap_or_else(|e| panic!("{method} {path}: {e}"));
    let headers = response
        .headers()
        .iter()
        .map(|(n, v)| {
            (
                n.as_str().to_lowercase(),
                v.to_str().unwrap_or_default().to_string(),
            )
        })
        .collect();
    let text = response.body_mut().read_to_string().unwrap_or_default();
    Answer {
        status: response.status().as_u16(),
        headers,
        body: serde_json::from_str(&text).unwrap_or(Value::String(text)),
    }
}

fn json_body(value: Value) -> Vec<u8> {
    serde_json::to_vec(&value).unwrap()
}

/// Asserts `answer` is a problem document with `status` naming `field` (when given)
/// and saying `needle`.
#[track_caller]
fn refused(answer: &Answer, status: u16, field: Option<&str>, needle: &str) {
    let body = &answer.body;
    assert_eq!(answer.status, status, "{body}");
    assert_eq!(
        answer.headers.get("content-type").map(String::as_str),
        Some("application/problem+json"),
        "{body}"
    );
    assert_eq!(body["status"], status, "{body}");
    assert!(
        body["type"]
            .as_str()
            .unwrap()
            .starts_with("urn:nephele:problem:"),
        "{body}"
    );
    assert!(body["title"].is_string(), "{body}");
    assert_eq!(body["detail"], body["message"], "{body}");
    let detail = body["detail"].as_str().unwrap();
    assert!(detail.contains(needle), "{needle:?} not in {body}");
    if let Some(field) = field {
        assert_eq!(body["field"], field, "{body}");
    }
}

fn create_token(cloud: &Cloud, name: &str, role: &str, tenant: &str) -> (String, String) {
    let answer = call(
        cloud,
        Some(&cloud.token),
        "POST",
        "/v1/api-tokens",
        &json_body(json!({"name": name, "role": role, "tenant": tenant})),
    );
    assert_eq!(answer.status, 201, "{}", answer.body);
    (
        answer.body["id"].as_str().unwrap().to_string(),
        answer.body["token"].as_str().unwrap().to_string(),
    )
}

/// A request that declares `length` bytes of body and sends a few: the answer.
fn declared(cloud: &Cloud, token: &str, request_line: &str, length: u64) -> String {
    let mut stream = nephele_e2e::raw_connection(&cloud.api, Duration::from_secs(10)).unwrap();
    let head = format!(
        "{request_line} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {token}\r\nContent-Length: {length}\r\nConnection: close\r\n\r\n"
    );
    stream.write_all(head.as_bytes()).unwrap();
    let _ = stream.write_all(&[b'{'; 1024]);
    let mut answer = String::new();
    let _ = stream.read_to_string(&mut answer);
    answer
}

const TENANTS: &str = r#"
[[tenant]]
name = "team-a"
quota_gpu_milli = 2000
[[tenant]]
name = "team-b"
"#;

#[test]
fn every_refusal_is_a_problem_naming_the_field_and_changes_nothing() {
    // 1 request/s after a burst of 60: the burst of 200 below goes over it however slow
    // the machine is (at 20/s, 200 requests taking over 7 s on a busy machine did not).
    let config = format!("api_rate_per_s = 1.0\napi_rate_burst = 60\n{TWO_REGIONS}{TENANTS}");
    let cloud = Cloud::start_with("access", &config).expect("cloud");
    let admin = cloud.token.clone();
    let (_, dev_a) = create_token(&cloud, "dev-a", "developer", "team-a");
    let (_, view_a) = create_token(&cloud, "view-a", "viewer", "team-a");
    let (dev_b_id, dev_b) = create_token(&cloud, "dev-b", "developer", "team-b");

    // Team A pushes a model and deploys it with its own developer token.
    let pushed = call(
        &cloud,
        Some(&dev_a),
        "PUT",
        "/v1/models/digits-a?wait=true",
        MODEL_ONNX,
    );
    assert_eq!(pushed.status, 201, "{}", pushed.body);
    assert_eq!(pushed.body["tenant"], "team-a");
    let deployed = call(
        &cloud,
        Some(&dev_a),
        "POST",
        "/v1/deployments",
        &json_body(json!({"name": "d-a", "model": "digits-a"})),
    );
    assert_eq!(deployed.status, 201, "{}", deployed.body);
    assert_eq!(deployed.body["tenant"], "team-a");

    // No token, a wrong one.
    let none = call(&cloud, None, "GET", "/v1/models", b"");
    refused(&none, 401, Some("authorization"), "missing bearer token");
    assert!(none.headers.contains_key("www-authenticate"));
    refused(
        &call(&cloud, Some("forged.token"), "GET", "/v1/models", b""),
        401,
        Some("authorization"),
        "invalid API token",
    );

    // A revoked token; a rotated-away secret.
    let (tmp_id, tmp) = create_token(&cloud, "tmp", "viewer", "team-b");
    assert_eq!(
        call(&cloud, Some(&tmp), "GET", "/v1/models", b"").status,
        200
    );
    let revoked = call(
        &cloud,
        Some(&admin),
        "DELETE",
        &format!("/v1/api-tokens/{tmp_id}"),
        b"",
    );
    assert_eq!(revoked.status, 200, "{}", revoked.body);
    assert_eq!(revoked.body["state"], "revoked");
    refused(
        &call(&cloud, Some(&tmp), "GET", "/v1/models", b""),
        401,
        Some("authorization"),
        "was revoked",
    );
    let rotated = call(
        &cloud,
        Some(&admin),
        "POST",
        &format!("/v1/api-tokens/{dev_b_id}/rotate"),
        b"",
    );
    assert_eq!(rotated.status, 200, "{}", rotated.body);
    let dev_b_new = rotated.body["token"].as_str().unwrap().to_string();
    refused(
        &call(&cloud, Some(&dev_b), "GET", "/v1/models", b""),
        401,
        Some("authorization"),
        "invalid API token",
    );
    let dev_b = dev_b_new;
    assert_eq!(
        call(&cloud, Some(&dev_b), "GET", "/v1/models", b"").status,
        200
    );

    // A role too low: a viewer cannot push; a developer cannot enrol devices, manage
    // tokens, drain nodes or read the audit log.
    refused(
        &call(&cloud, Some(&view_a), "PUT", "/v1/models/other", MODEL_ONNX),
        403,
        Some("authorization"),
        "needs the developer role or above",
    );
    for (method, path) in [
        ("POST", "/v1/tokens"),
        ("GET", "/v1/api-tokens"),
        ("GET", "/v1/audit"),
        ("POST", "/v1/regions/eu-west/nodes/x/drain"),
        ("PUT", "/v1/regions/eu-west/grid"),
    ] {
        let answer = call(&cloud, Some(&dev_a), method, path, b"{}");
        refused(&answer, 403, Some("authorization"), "role or above");
    }
    assert!(
        call(&cloud, Some(&admin), "GET", "/v1/models/other", b"").status == 404,
        "the viewer's push changed nothing"
    );

    // Another tenant's objects: not found, not changed, not reused.
    let b_models = call(&cloud, Some(&dev_b), "GET", "/v1/models", b"");
    assert_eq!(b_models.body, json!([]));
    let b_deployments = call(&cloud, Some(&dev_b), "GET", "/v1/deployments", b"");
    assert_eq!(b_deployments.body, json!([]));
    refused(
        &call(&cloud, Some(&dev_b), "GET", "/v1/deployments/d-a", b""),
        404,
        None,
        "no deployment named d-a",
    );
    refused(
        &call(&cloud, Some(&dev_b), "DELETE", "/v1/deployments/d-a", b""),
        404,
        None,
        "no deployment named d-a",
    );
    refused(
        &call(
            &cloud,
            Some(&dev_b),
            "POST",
            "/v1/deployments/d-a/rollout/pause",
            b"",
        ),
        404,
        None,
        "no deployment named d-a",
    );
    refused(
        &call(
            &cloud,
            Some(&dev_b),
            "GET",
            "/v1/deployments/d-a/replicas",
            b"",
        ),
        404,
        None,
        "no deployment named d-a",
    );
    refused(
        &call(&cloud, Some(&dev_b), "GET", "/v1/models/digits-a", b""),
        404,
        None,
        "no model named digits-a",
    );
    refused(
        &call(
            &cloud,
            Some(&dev_b),
            "POST",
            "/v1/deployments",
            &json_body(json!({"name": "d-b", "model": "digits-a"})),
        ),
        404,
        None,
        "no model named digits-a",
    );
    refused(
        &call(
            &cloud,
            Some(&dev_b),
            "PUT",
            "/v1/models/digits-a?wait=true",
            MODEL_ONNX,
        ),
        409,
        None,
        "taken by another tenant",
    );
    refused(
        &call(
            &cloud,
            Some(&dev_b),
            "POST",
            "/v1/jobs",
            &json_body(json!({"name": "j", "tenant": "team-a"})),
        ),
        403,
        Some("tenant"),
        "acts for tenant team-b",
    );
    let still = call(&cloud, Some(&dev_a), "GET", "/v1/deployments/d-a", b"");
    assert_eq!(still.status, 200, "{}", still.body);
    let all = call(&cloud, Some(&admin), "GET", "/v1/deployments", b"");
    assert_eq!(all.body.as_array().unwrap().len(), 1, "{}", all.body);

    // Quota: more GPUs than team A's whole quota could never start.
    refused(
        &call(
            &cloud,
            Some(&dev_a),
            "POST",
            "/v1/jobs",
            &json_body(json!({"name": "big", "gpus": 3, "region": "eu-west"})),
        ),
        400,
        Some("gpus"),
        "quota exceeded",
    );
    let jobs = call(&cloud, Some(&admin), "GET", "/v1/jobs?region=eu-west", b"");
    assert_eq!(jobs.body, json!([]), "nothing was queued");

    // Oversized uploads, refused from their declared length before they are read.
    let huge = declared(&cloud, &dev_a, "PUT /v1/models/huge", 600_000_000);
    assert!(huge.starts_with("HTTP/1.1 413"), "{huge}");
    assert!(huge.contains("application/problem+json"), "{huge}");
    assert!(huge.contains("\"field\":\"body\""), "{huge}");
    assert!(huge.contains("512 MiB"), "{huge}");
    let big_spec = declared(&cloud, &dev_a, "POST /v1/deployments", 5_000_000);
    assert!(big_spec.starts_with("HTTP/1.1 413"), "{big_spec}");

    // Invalid payloads name the field at fault.
    let invalid = [
        (
            "/v1/deployments",
            json!({"name": "x", "model": "digits-a", "slo_ms": "fast"}),
            "slo_ms",
        ),
        ("/v1/deployments", json!({"name": "x"}), "model"),
        (
            "/v1/deployments",
            json!({"name": "x", "model": "digits-a", "colour": "red"}),
            "colour",
        ),
        (
            "/v1/deployments",
            json!({"name": "x", "model": "digits-a", "rollout": {"steps": [10, "all"]}}),
            "rollout.steps[1]",
        ),
        ("/v1/jobs", json!({"name": "j", "gpus": -1}), "gpus"),
    ];
    for (path, body, field) in invalid {
        let answer = call(&cloud, Some(&dev_a), "POST", path, &json_body(body));
        refused(&answer, 400, Some(field), "invalid JSON body");
    }
    for (body, field) in [
        (
            json!({"name": "t", "role": "root", "tenant": "team-a"}),
            "role",
        ),
        (
            json!({"name": "t", "role": "viewer", "tenant": "team-z"}),
            "tenant",
        ),
        (
            json!({"name": "t", "role": "viewer", "tenant": "team-a", "ttl_s": 0}),
            "ttl_s",
        ),
    ] {
        let answer = call(
            &cloud,
            Some(&admin),
            "POST",
            "/v1/api-tokens",
            &json_body(body),
        );
        assert_eq!(answer.status, 400, "{}", answer.body);
        assert_eq!(answer.body["field"], field, "{}", answer.body);
    }
    let wrong_method = call(&cloud, Some(&admin), "DELETE", "/v1/models", b"");
    refused(&wrong_method, 405, None, "it takes GET");
    assert_eq!(
        wrong_method.headers.get("allow").map(String::as_str),
        Some("GET")
    );

    // A token over its rate (1/s, 60 at once) is told when to come back.
    let limited = (0..200)
        .map(|_| call(&cloud, Some(&view_a), "GET", "/v1/tenants", b""))
        .find(|a| a.status == 429)
        .expect("a burst of 200 requests goes over 60 + 1/s");
    refused(&limited, 429, None, "over its request rate");
    assert!(limited.headers.contains_key("retry-after"));
    assert!(limited.body["retry_after_s"].as_u64().unwrap() >= 1);
    // Other tokens are not slowed by it.
    assert_eq!(
        call(&cloud, Some(&dev_a), "GET", "/v1/tenants", b"").status,
        200
    );

    // Tenants: each token sees its own; admins see all, with quotas.
    let mine = call(&cloud, Some(&dev_a), "GET", "/v1/tenants", b"");
    assert_eq!(mine.body.as_array().unwrap().len(), 1, "{}", mine.body);
    assert_eq!(mine.body[0]["quota_gpu_milli"], 2000);
    assert_eq!(mine.body[0]["models"], 1);
    let every = call(&cloud, Some(&admin), "GET", "/v1/tenants", b"");
    assert_eq!(every.body.as_array().unwrap().len(), 2, "{}", every.body);

    // The audit log: who changed what, when, from where, and how it ended.
    std::thread::sleep(Duration::from_millis(300));
    let audit = call(&cloud, Some(&admin), "GET", "/v1/audit?limit=1000", b"");
    assert_eq!(audit.status, 200, "{}", audit.body);
    let entries = audit.body.as_array().unwrap();
    let find = |method: &str, path: &str, status: u16| {
        entries
            .iter()
            .find(|e| e["method"] == method && e["path"] == path && e["status"] == status)
    };
    let push = find("PUT", "/v1/models/digits-a", 201).expect("team A's push is audited");
    assert_eq!(push["tenant"], "team-a");
    assert_eq!(push["role"], "developer");
    assert_eq!(push["peer"], "127.0.0.1");
    assert!(push["unix_ms"].as_u64().unwrap() > 0);
    assert!(
        find("PUT", "/v1/models/other", 403).is_some(),
        "refusals too"
    );
    assert!(find("DELETE", "/v1/deployments/d-a", 404).is_some());
    assert!(find("POST", &format!("/v1/api-tokens/{dev_b_id}/rotate"), 200).is_some());
    assert!(
        entries.iter().all(|e| e["method"] != "GET"),
        "reads are not audited"
    );
    let seqs: Vec<u64> = entries.iter().map(|e| e["seq"].as_u64().unwrap()).collect();
    assert!(seqs.windows(2).all(|w| w[0] < w[1]), "{seqs:?}");

    // No secret is listed, logged or echoed.
    let listed = call(&cloud, Some(&admin), "GET", "/v1/api-tokens", b"");
    assert!(listed
        .body
        .as_array()
        .unwrap()
        .iter()
        .all(|t| t.get("token").is_none()));
    let logs = cloud.logs();
    for secret in [&dev_a, &view_a, &dev_b, &tmp, &admin] {
        let secret_half = secret.split_once('.').unwrap().1;
        // (Only the first admin token is printed, once, at the first start.)
        if secret != &admin {
            assert!(
                !logs.contains(secret_half),
                "a secret in the control plane's log"
            );
        }
        assert!(!audit.body.to_string().contains(secret_half));
    }

    // The CLI: create, list, revoke; `--help` never shows the token from the
    // environment.
    let nephele = |args: &[&str]| {
        let output = std::process::Command::new(bin("nephele"))
            .args(args)
            .env("NEPHELE_API", &cloud.api)
            .env("NEPHELE_CA", cloud.ca_path())
            .env("NEPHELE_TOKEN", &admin)
            .output()
            .unwrap();
        (
            output.status.success(),
            String::from_utf8_lossy(&output.stdout).to_string(),
            String::from_utf8_lossy(&output.stderr).to_string(),
        )
    };
    let (ok, out, err) = nephele(&[
        "api-token",
        "create",
        "ci-bot",
        "--role",
        "viewer",
        "--tenant",
        "team-b",
    ]);
    assert!(ok, "{out}{err}");
    assert!(out.contains("shown only now"), "{out}");
    let (ok, out, err) = nephele(&["api-token", "list", "--json"]);
    assert!(ok, "{err}");
    let list: Value = serde_json::from_str(&out).unwrap();
    let ci = list
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["name"] == "ci-bot")
        .expect("listed");
    let (ok, out, _) = nephele(&["api-token", "revoke", ci["id"].as_str().unwrap()]);
    assert!(ok && out.contains("revoked"), "{out}");
    let (ok, out, _) = nephele(&["audit", "--limit", "5"]);
    assert!(ok && out.contains("/v1/api-tokens"), "{out}");
    let (ok, out, _) = nephele(&["tenant", "list"]);
    assert!(
        ok && out.contains("team-a") && out.contains("2000"),
        "{out}"
    );
    let (_, help, _) = nephele(&["api-token", "--help"]);
    assert!(!help.contains(admin.split_once('.').unwrap().1), "{help}");
    // A mistake in the input is said as such, not blamed on the network: the CLI
    // knows the API's roles (its types are the API's) and says which there are before
    // anything is sent; the control plane refuses the same with a problem naming the
    // field (above).
    let (ok, _, err) = nephele(&[
        "api-token",
        "create",
        "x",
        "--role",
        "root",
        "--tenant",
        "team-a",
    ]);
    assert!(
        !ok && err.contains("no role \"root\"") && err.contains("viewer, developer"),
        "{err}"
    );
    // And a refusal by the control plane comes through with its detail and field.
    let (ok, _, err) = nephele(&[
        "api-token",
        "create",
        "x",
        "--role",
        "viewer",
        "--tenant",
        "nobody",
    ]);
    assert!(
        !ok && err.contains("400") && err.contains("no tenant \"nobody\""),
        "{err}"
    );
}

/// The only admin token rotated away (as a fuzzer once did) locks everyone out; the
/// way back is local: with the control plane stopped, `nephele-cloud
/// --reset-admin-token` on its data dir adds a new admin token (refused while it
/// runs), writes it to `<data-dir>/admin-token`, and the audit log records it.
#[test]
fn a_locked_out_control_plane_gets_a_break_glass_admin_token_on_its_machine() {
    let mut cloud = Cloud::start("break-glass").unwrap();
    let id = cloud.token.split_once('.').unwrap().0.to_string();
    let rotated = call(
        &cloud,
        Some(&cloud.token),
        "POST",
        &format!("/v1/api-tokens/{id}/rotate"),
        b"",
    );
    assert_eq!(rotated.status, 200, "{}", rotated.body);
    // The file still holds the old secret: nobody holding it gets in.
    let old = std::fs::read_to_string(cloud.dir.join("data/admin-token")).unwrap();
    let locked = call(&cloud, Some(old.trim()), "GET", "/v1/tenants", b"");
    assert_eq!(locked.status, 401, "{}", locked.body);

    let reset = |cloud: &Cloud| {
        std::process::Command::new(bin("nephele-cloud"))
            .arg("--config")
            .arg(cloud.dir.join("cloud.toml"))
            .arg("--data-dir")
            .arg(cloud.dir.join("data"))
            .arg("--reset-admin-token")
            .output()
            .unwrap()
    };
    // Not while it runs: the store is the running control plane's.
    let refused = reset(&cloud);
    assert!(!refused.status.success());
    assert!(
        String::from_utf8_lossy(&refused.stderr).contains("stop nephele-cloud first"),
        "{}",
        String::from_utf8_lossy(&refused.stderr)
    );
    cloud.stop();
    let done = reset(&cloud);
    let said = String::from_utf8_lossy(&done.stdout).to_string();
    assert!(
        done.status.success() && said.contains("break-glass admin API token"),
        "{said}{}",
        String::from_utf8_lossy(&done.stderr)
    );
    let new = std::fs::read_to_string(cloud.dir.join("data/admin-token")).unwrap();
    assert_ne!(new.trim(), old.trim());
    assert!(said.contains(new.trim()));

    // Started again, the new token is an admin's; the rotated one still works too.
    cloud.restart().unwrap();
    assert_eq!(cloud.token, new.trim());
    let tenants = call(&cloud, Some(new.trim()), "GET", "/v1/tenants", b"");
    assert_eq!(tenants.status, 200, "{}", tenants.body);
    let rotated_secret = rotated.body["token"].as_str().unwrap();
    assert_eq!(
        call(&cloud, Some(rotated_secret), "GET", "/v1/tenants", b"").status,
        200
    );
    let audit = call(&cloud, Some(new.trim()), "GET", "/v1/audit?limit=100", b"");
    assert!(
        audit.body.to_string().contains("/break-glass/admin-token"),
        "{}",
        audit.body
    );
}

/// A request the HTTP parser refuses is the client's fault: answered 400, logged as a
/// warning (never at ERROR), and counted on `/metrics`.
#[test]
fn a_malformed_request_is_a_counted_warning_not_an_error() {
    let cloud = Cloud::start("malformed").expect("cloud");
    let mut stream = nephele_e2e::raw_connection(&cloud.api, Duration::from_secs(10)).unwrap();
    stream
        .write_all(b"GET /v1/regions HTTP/1.1\r\nHost: x\r\nno colon in this header\r\n\r\n")
        .unwrap();
    let mut answer = String::new();
    let _ = stream.read_to_string(&mut answer);
    assert!(answer.starts_with("HTTP/1.1 400"), "{answer}");
    let metrics = cloud
        .client()
        .request("GET", &format!("{}/metrics", cloud.api), None)
        .unwrap();
    let metrics = metrics.as_str().unwrap_or("");
    assert!(
        metrics.contains("nephele_api_malformed_requests_total 1"),
        "{metrics}"
    );
    let logs = cloud.logs();
    assert!(
        logs.contains("WARN nephele::http: a client's request was refused as malformed"),
        "{logs}"
    );
    assert!(!logs.contains("ERROR actix_http"), "{logs}");
}
