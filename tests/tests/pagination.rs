//! Lists are paged on request (`?limit=N`, then the `Link: <…>; rel="next"` header's
//! `after`), on a real control plane: following the links gives every item once, in
//! key order, with the whole list's size in `X-Total-Count`, also while items come
//! and go between pages; a bad `limit` is a problem naming the field. A deployment's
//! row per device is a paged list of its own, and its status can be asked without
//! them (the counts and totals only). The device list is read from its cursor, regions
//! count their devices by health, and `GET /v1/jobs?state=` keeps one state's jobs.
//! The CLI's `device list` and `job list` read those lists a chunk at a time.

#![allow(clippy::unwrap_used)]

use nephele_e2e::{join, Cloud, Http, MODEL_ONNX};
use serde_json::{json, Value};

/// Every page of `path` at `limit` per page: the items, and the pages' count.
fn follow(cloud: &Cloud, path: &str, limit: usize, between: impl Fn(usize)) -> (Vec<Value>, usize) {
    let http = Http::new(Some(cloud.token.clone()));
    let mut url = format!("{}{path}?limit={limit}", cloud.api);
    let (mut items, mut pages) = (Vec::new(), 0);
    loop {
        let (status, headers, body) = http.get_full(&url).unwrap();
        assert_eq!(status, 200, "{body}");
        let page = body.as_array().unwrap();
        assert!(page.len() <= limit);
        items.extend(page.iter().cloned());
        pages += 1;
        between(pages);
        match headers.get("link") {
            Some(link) => {
                let target = link
                    .strip_prefix('<')
                    .and_then(|l| l.split_once(">; rel=\"next\""))
                    .map(|(target, _)| target)
                    .unwrap_or_else(|| panic!("a next link: {link}"));
                url = format!("{}{target}", cloud.api);
            }
            None => return (items, pages),
        }
    }
}

#[test]
fn lists_are_paged_by_key_with_next_links() {
    let cloud = Cloud::start("pagination").unwrap();
    let mut ids: Vec<String> = (0..7)
        .map(|_| {
            cloud
                .post("/v1/tokens", &json!({"region": "eu-west"}))
                .unwrap()["id"]
                .as_str()
                .unwrap()
                .to_string()
        })
        .collect();
    ids.sort();

    let http = Http::new(Some(cloud.token.clone()));
    let (_, headers, whole) = http.get_full(&format!("{}/v1/tokens", cloud.api)).unwrap();
    assert_eq!(
        whole.as_array().unwrap().len(),
        7,
        "unpaged, the list is whole"
    );
    assert!(!headers.contains_key("link"));
    let (_, headers, _) = http
        .get_full(&format!("{}/v1/tokens?limit=3", cloud.api))
        .unwrap();
    assert_eq!(headers["x-total-count"], "7");

    let (items, pages) = follow(&cloud, "/v1/tokens", 3, |_| {});
    let seen: Vec<String> = items
        .iter()
        .map(|t| t["id"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(seen, ids, "every token once, in key order");
    assert_eq!(pages, 3);

    // Deleting what was already read does not shift the pages: nothing is skipped.
    // (Join tokens are not deletable; jobs are.)
    for name in ["a", "b", "c", "d", "e"] {
        let status = cloud
            .post(
                "/v1/jobs",
                &json!({"name": format!("job-{name}"), "region": "eu-west", "cpu_milli": 100, "memory_mib": 64}),
            )
            .unwrap();
        assert!(status["name"].is_string(), "{status}");
    }
    let (items, _) = follow(&cloud, "/v1/jobs", 2, |page| {
        if page == 1 {
            cloud.delete("/v1/jobs/job-a?region=eu-west").unwrap();
        }
    });
    let names: Vec<&str> = items.iter().map(|j| j["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["job-a", "job-b", "job-c", "job-d", "job-e"]);
    // The CLI follows the links: what is left (job-a deleted), a chunk of 2 at a time.
    let (ok, text) = cloud.cli_as(&cloud.token, &["job", "list", "--chunk-size", "2"]);
    assert!(ok, "{text}");
    let shown: Vec<&str> = text
        .lines()
        .skip(1)
        .filter_map(|line| line.split_whitespace().nth(1))
        .collect();
    assert_eq!(shown, ["job-b", "job-c", "job-d", "job-e"], "{text}");

    // `?state=` keeps a list's jobs in one state; every job is in one of them.
    let all = cloud.get("/v1/jobs").unwrap();
    let mut in_some_state = 0;
    for state in nephele_cloud::api::JOB_STATES {
        let listed = cloud.get(&format!("/v1/jobs?state={state}")).unwrap();
        for job in listed.as_array().unwrap() {
            assert_eq!(job["state"], state, "{job}");
        }
        in_some_state += listed.as_array().unwrap().len();
    }
    assert_eq!(in_some_state, all.as_array().unwrap().len(), "{all}");
    let (status, _, body) = http
        .get_full(&format!("{}/v1/jobs?state=sleeping", cloud.api))
        .unwrap();
    assert_eq!(status, 400, "{body}");
    assert_eq!(body["field"], "state", "{body}");

    // A bad limit names the field.
    for bad in ["0", "1001", "many"] {
        let (status, _, body) = http
            .get_full(&format!("{}/v1/devices?limit={bad}", cloud.api))
            .unwrap();
        assert_eq!(status, 400, "{body}");
        assert_eq!(body["field"], "limit", "{body}");
    }
}

#[test]
fn a_deployments_devices_are_paged_and_its_status_comes_without_them_on_request() {
    let cloud = Cloud::start("deployment-rows").unwrap();
    // Five enrolled devices, none connected: rows, and counted offline.
    let mut names: Vec<String> = (0..5).map(|i| format!("cam-{i}")).collect();
    for name in &names {
        let token = cloud.join_token("eu-west", 600).unwrap();
        let (ok, output) = join(&cloud, &cloud.dir.join(name), name, &token, &[]).unwrap();
        assert!(ok, "{output}");
    }
    names.sort();
    let (status, body) = cloud.put_model("digits-mlp", MODEL_ONNX).unwrap();
    assert_eq!(status, 201, "{body}");
    cloud
        .post(
            "/v1/deployments",
            &json!({"name": "digits", "model": "digits-mlp", "offload": false}),
        )
        .unwrap();

    // The device list is paged from the cursor too; the region counts them by health.
    let (devices, pages) = follow(&cloud, "/v1/devices", 2, |_| {});
    let listed: Vec<String> = devices
        .iter()
        .map(|d| d["name"].as_str().unwrap().to_string())
        .collect();
    assert_eq!((listed, pages), (names.clone(), 3));
    // The CLI reads the list the same way, a chunk per request, and says what a
    // `--limit` leaves out.
    let (ok, text) = cloud.cli_as(&cloud.token, &["device", "list", "--chunk-size", "2"]);
    assert!(ok, "{text}");
    let shown: Vec<&str> = text
        .lines()
        .skip(1)
        .filter_map(|line| line.split_whitespace().next())
        .collect();
    assert_eq!(shown, names, "every device once, in name order: {text}");
    let (ok, text) = cloud.cli_as(
        &cloud.token,
        &[
            "device",
            "list",
            "--chunk-size",
            "2",
            "--limit",
            "3",
            "--json",
        ],
    );
    assert!(ok, "{text}");
    let first: Vec<Value> = serde_json::from_str(&text).unwrap();
    let first: Vec<&str> = first.iter().map(|d| d["name"].as_str().unwrap()).collect();
    assert_eq!(first, names[..3]);
    let (ok, text) = cloud.cli_as(&cloud.token, &["device", "list", "--limit", "4"]);
    assert!(ok && text.contains("4 of 5 devices shown"), "{text}");
    let (ok, text) = cloud.cli_as(&cloud.token, &["device", "list", "--chunk-size", "0"]);
    assert!(!ok && text.contains("chunk-size"), "{text}");
    let regions = cloud.get("/v1/regions").unwrap();
    let region = regions
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["name"] == "eu-west")
        .unwrap();
    assert_eq!(region["health"], json!({"offline": 5}), "{region}");

    let whole = cloud.get("/v1/deployments/digits").unwrap();
    assert_eq!(whole["devices"].as_array().unwrap().len(), 5, "{whole}");
    assert_eq!(whole["device_phases"], json!({"offline": 5}), "{whole}");
    assert_eq!(
        whole["totals"],
        json!({"served_local": 0, "served_offloaded": 0, "failed": 0,
               "worst_p99_ms": 0.0, "variants": {}}),
        "{whole}"
    );
    let counts = cloud.get("/v1/deployments/digits?devices=false").unwrap();
    assert_eq!(counts["devices"], json!([]), "{counts}");
    for field in [
        "desired_devices",
        "ready_devices",
        "device_phases",
        "totals",
        "warnings",
        "model",
    ] {
        assert_eq!(counts[field], whole[field], "{field}");
    }
    let listed = cloud.get("/v1/deployments?devices=false").unwrap();
    assert_eq!(listed[0]["devices"], json!([]), "{listed}");
    assert_eq!(listed[0]["device_phases"], whole["device_phases"]);

    let (rows, pages) = follow(&cloud, "/v1/deployments/digits/devices", 2, |_| {});
    let seen: Vec<&str> = rows.iter().map(|r| r["device"].as_str().unwrap()).collect();
    assert_eq!(seen, names, "every device once, in name order");
    assert_eq!(pages, 3);
    assert_eq!(
        Value::Array(rows),
        whole["devices"],
        "the same rows as the status's"
    );

    let http = Http::new(Some(cloud.token.clone()));
    let (status, _, body) = http
        .get_full(&format!("{}/v1/deployments/digits?devices=some", cloud.api))
        .unwrap();
    assert_eq!(status, 400, "{body}");
    assert_eq!(body["field"], "devices", "{body}");
    let (status, _, body) = http
        .get_full(&format!("{}/v1/deployments/nope/devices", cloud.api))
        .unwrap();
    assert_eq!(status, 404, "{body}");
}
