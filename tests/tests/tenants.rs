//! Tenants as API objects on a real control plane (issue 16): an admin creates a tenant
//! with quotas through the CLI, its developer's jobs are held to them (a job over the
//! whole GPU quota refused, one over the job quota refused, both naming the quota), a
//! raised quota takes effect at once, the tenant and its jobs survive a `kill -9`, it
//! cannot be deleted while it holds anything, and once deleted nothing more is taken
//! for it. Only admins change tenants; a tenant's token sees only its own.

#![allow(clippy::unwrap_used)]

use nephele_e2e::{Cloud, Http};
use serde_json::{json, Value};

fn nephele(cloud: &Cloud, token: &str, args: &[&str]) -> (bool, String) {
    cloud.cli_as(token, args)
}

fn call(
    cloud: &Cloud,
    token: &str,
    method: &str,
    path: &str,
    body: Option<&Value>,
) -> (u16, Value) {
    let http = Http::new(Some(token.to_string()));
    let url = format!("{}{path}", cloud.api);
    match (method, body) {
        ("GET", _) => {
            let (status, _, value) = http.get_full(&url).unwrap();
            (status, value)
        }
        (_, Some(body)) => http.raw_json(method, &url, body).unwrap(),
        _ => panic!("{method} without a body"),
    }
}

fn delete(cloud: &Cloud, token: &str, path: &str) -> u16 {
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .tls_config(nephele_e2e::tls_config())
        .build()
        .into();
    agent
        .delete(format!("{}{path}", cloud.api))
        .header("authorization", format!("Bearer {token}"))
        .call()
        .unwrap()
        .status()
        .as_u16()
}

#[test]
fn tenants_are_made_changed_and_deleted_through_the_api_and_hold_their_jobs_to_quotas() {
    let mut cloud = Cloud::start("tenants").unwrap();
    let admin = cloud.token.clone();

    // An admin creates it with the CLI.
    let (ok, out) = nephele(
        &cloud,
        &admin,
        &[
            "tenant",
            "create",
            "team-x",
            "--gpu-milli",
            "2000",
            "--jobs",
            "1",
            "--weight",
            "2",
        ],
    );
    assert!(ok, "{out}");
    assert!(out.contains("tenant team-x created"), "{out}");
    assert!(
        out.contains("GPU milli 2000") && out.contains("jobs 1"),
        "{out}"
    );
    let (ok, out) = nephele(&cloud, &admin, &["tenant", "create", "team-x"]);
    assert!(!ok && out.contains("tenant team-x exists"), "{out}");

    let developer = cloud
        .post(
            "/v1/api-tokens",
            &json!({"name": "x-dev", "role": "developer", "tenant": "team-x"}),
        )
        .unwrap()["token"]
        .as_str()
        .unwrap()
        .to_string();
    let developer_id = developer.split('.').next().unwrap().to_string();

    // Only admins change tenants.
    let (status, body) = call(
        &cloud,
        &developer,
        "PUT",
        "/v1/tenants/team-x",
        Some(&json!({"quota_gpu_milli": 9000})),
    );
    assert_eq!(status, 403, "{body}");
    // A tenant's token sees its own tenant only.
    let (status, mine) = call(&cloud, &developer, "GET", "/v1/tenants", None);
    assert_eq!(status, 200);
    assert_eq!(mine.as_array().unwrap().len(), 1, "{mine}");
    assert_eq!(mine[0]["name"], "team-x");
    let (status, _) = call(&cloud, &developer, "GET", "/v1/tenants/default", None);
    assert_eq!(status, 404);

    // Held to its quotas: more GPUs in all than its whole quota, and a second job.
    let (status, body) = call(
        &cloud,
        &developer,
        "POST",
        "/v1/jobs",
        Some(&json!({"name": "big", "gpus": 3, "region": "eu-west"})),
    );
    assert_eq!(status, 400, "{body}");
    assert_eq!(body["field"], "gpus", "{body}");
    let (status, body) = call(
        &cloud,
        &developer,
        "POST",
        "/v1/jobs",
        Some(&json!({"name": "one", "gpus": 1, "region": "eu-west"})),
    );
    assert_eq!(status, 201, "{body}");
    let (status, body) = call(
        &cloud,
        &developer,
        "POST",
        "/v1/jobs",
        Some(&json!({"name": "two", "gpus": 1, "region": "eu-west"})),
    );
    assert_eq!(status, 409, "{body}");
    assert!(
        body["detail"].as_str().unwrap().contains("quota_jobs is 1"),
        "{body}"
    );

    // A raised quota takes effect at once; what is not given stays.
    let (ok, out) = nephele(&cloud, &admin, &["tenant", "set", "team-x", "--jobs", "2"]);
    assert!(ok, "{out}");
    assert!(
        out.contains("GPU milli 2000") && out.contains("jobs 2"),
        "{out}"
    );
    let (status, body) = call(
        &cloud,
        &developer,
        "POST",
        "/v1/jobs",
        Some(&json!({"name": "two", "gpus": 1, "region": "eu-west"})),
    );
    assert_eq!(status, 201, "{body}");

    // Both survive a kill -9.
    cloud.kill9();
    cloud.restart().unwrap();
    let tenant = cloud.get("/v1/tenants/team-x").unwrap();
    assert_eq!(
        (
            tenant["quota_gpu_milli"].as_u64(),
            tenant["quota_jobs"].as_u64(),
            tenant["weight"].as_f64()
        ),
        (Some(2000), Some(2), Some(2.0)),
        "{tenant}"
    );
    assert!(
        tenant["updated_by"].as_str().unwrap().contains("admin"),
        "{tenant}"
    );
    let (status, jobs) = call(&cloud, &developer, "GET", "/v1/jobs", None);
    assert_eq!(status, 200);
    assert_eq!(jobs.as_array().unwrap().len(), 2, "{jobs:#}");
    let (status, body) = call(
        &cloud,
        &developer,
        "POST",
        "/v1/jobs",
        Some(&json!({"name": "three", "gpus": 1, "region": "eu-west"})),
    );
    assert_eq!(status, 409, "the job quota holds after the restart: {body}");

    // A model version of its own, pushed by its developer.
    let file = cloud.dir.join("mx.onnx");
    std::fs::write(&file, nephele_runtime::synthetic::dense_mlp(4, 8, 1, 2, 7)).unwrap();
    let (ok, out) = nephele(
        &cloud,
        &developer,
        &["model", "push", "mx", file.to_str().unwrap()],
    );
    assert!(ok, "{out}");

    // Not deleted while it holds jobs, then tokens and models; deleted once it holds
    // nothing.
    let (ok, out) = nephele(&cloud, &admin, &["tenant", "delete", "team-x"]);
    assert!(
        !ok && out.contains("jobs that have not ended (2 in eu-west)"),
        "{out}"
    );
    for job in ["one", "two"] {
        assert_eq!(
            delete(
                &cloud,
                &developer,
                &format!("/v1/jobs/{job}?region=eu-west")
            ),
            200
        );
    }
    let (ok, out) = nephele(&cloud, &admin, &["tenant", "delete", "team-x"]);
    assert!(
        !ok && out.contains("1 API token(s), 1 model version(s)"),
        "{out}"
    );
    // `model delete` takes the model away (the default tenant's token does not see it).
    let default_developer = cloud
        .post(
            "/v1/api-tokens",
            &json!({"name": "d-dev", "role": "developer", "tenant": "default"}),
        )
        .unwrap()["token"]
        .as_str()
        .unwrap()
        .to_string();
    let (ok, out) = nephele(&cloud, &default_developer, &["model", "delete", "mx"]);
    assert!(!ok && out.contains("no model named mx"), "{out}");
    let blobs = || {
        std::fs::read_dir(cloud.dir.join("data/blobs"))
            .map(|dir| dir.count())
            .unwrap_or(0)
    };
    let files_before = blobs();
    let (ok, out) = nephele(&cloud, &developer, &["model", "delete", "mx"]);
    assert!(ok && out.contains("deleted model mx:"), "{out}");
    // Its files (the pushed one and each variant's; no other model ships them) go too.
    assert!(
        files_before >= 2 && blobs() == 0,
        "blob files: {files_before} before the delete, {} after",
        blobs()
    );
    let (ok, out) = nephele(&cloud, &developer, &["model", "get", "mx"]);
    assert!(!ok && out.contains("no model named mx"), "{out}");
    let (ok, out) = nephele(&cloud, &admin, &["tenant", "delete", "team-x"]);
    assert!(
        !ok && out.contains("1 API token(s), 0 model version(s)"),
        "{out}"
    );
    assert_eq!(
        delete(&cloud, &admin, &format!("/v1/api-tokens/{developer_id}")),
        200
    );
    let (ok, out) = nephele(&cloud, &admin, &["tenant", "delete", "team-x"]);
    assert!(ok, "{out}");
    assert!(out.contains("tenant team-x deleted"), "{out}");
    let (status, body) = call(
        &cloud,
        &admin,
        "POST",
        "/v1/jobs",
        Some(&json!({"name": "late", "gpus": 1, "tenant": "team-x", "region": "eu-west"})),
    );
    assert_eq!(status, 400, "{body}");
    let (status, _) = call(&cloud, &admin, "GET", "/v1/tenants/team-x", None);
    assert_eq!(status, 404);
    // The admin's own tenant cannot be deleted with its own token.
    let (ok, out) = nephele(&cloud, &admin, &["tenant", "delete", "default"]);
    assert!(!ok && out.contains("belongs to tenant default"), "{out}");

    // Every change is in the audit log.
    let audit = cloud.get("/v1/audit?limit=100").unwrap();
    let changes: Vec<String> = audit
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["path"].as_str().unwrap_or("").starts_with("/v1/tenants"))
        .map(|e| {
            format!(
                "{} {} {}",
                e["method"].as_str().unwrap(),
                e["path"].as_str().unwrap(),
                e["status"]
            )
        })
        .collect();
    assert!(
        changes.contains(&"PUT /v1/tenants/team-x 201".to_string()),
        "{changes:?}"
    );
    assert!(
        changes.contains(&"PUT /v1/tenants/team-x 200".to_string()),
        "{changes:?}"
    );
    assert!(
        changes.contains(&"DELETE /v1/tenants/team-x 200".to_string()),
        "{changes:?}"
    );
}
