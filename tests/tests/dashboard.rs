//! The dashboard in a real browser (issue 16): Debian's Chromium, headless, driven over
//! WebDriver, loads the page the control plane serves over HTTPS (its certificate
//! trusted by its public key), with a populated fleet: an edge device serving a
//! deployment under a rollout, a pool node the `local` provider runs, a running and a
//! pending job, a measured grid signal. Every main view must render with that data
//! (fleet, deployments and rollouts, GPU pools, jobs and why pending, cost and carbon
//! per tenant), and a screenshot of the page and of each view is kept in
//! `target/screenshots/`. The cards come from the control plane's counts and the long
//! lists are paged: with one row a page, Next and Previous walk the devices.

#![allow(clippy::unwrap_used)]

use std::path::PathBuf;
use std::time::Duration;

use nephele_e2e::browser::{self, Browser};
use nephele_e2e::{require, Cloud};
use serde_json::json;

const CONFIG: &str = r#"
heartbeat_interval_ms = 300
[scheduler]
tick_ms = 200
grace_s = 1
[nodes]
join_timeout_s = 60
[nodes.local]
boot_delay_s = 0.3
workers = 1
[[region]]
name = "eu-west"
carbon_zone = "DE"
[[region.pool]]
name = "l4"
node_profile = "gpu-4x-l4"
provider = "local"
min_nodes = 1
max_nodes = 1
price_per_hour = 3.6
"#;

fn screenshots() -> PathBuf {
    let dir = PathBuf::from(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../target/screenshots"
    ));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// The text of every row of a table, cells joined by `|`.
fn rows(browser: &Browser, table: &str) -> Vec<String> {
    let value = browser
        .eval(&format!(
            "return [...document.querySelectorAll('#{table} tbody tr')].map(tr => [...tr.cells].map(td => td.textContent).join('|'));"
        ))
        .unwrap();
    value
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap().to_string())
        .collect()
}

#[test]
fn every_main_view_of_the_dashboard_renders_with_data_in_chromium() {
    if !require(
        "Debian's chromium and chromium-driver (tests/run.sh installs them)",
        browser::available(),
    ) {
        return;
    }
    let cloud = Cloud::start_with("dashboard", CONFIG).unwrap();
    cloud.wait_pool_nodes_up("eu-west").unwrap();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let (status, answer) = cloud
        .client()
        .raw_json(
            "PUT",
            &format!("{}/v1/regions/eu-west/grid", cloud.api),
            &json!({"points": [
                {"unix": now - 3600, "carbon_g_per_kwh": 310.0},
                {"unix": now, "carbon_g_per_kwh": 290.0}
            ]}),
        )
        .unwrap();
    assert_eq!(status, 200, "{answer}");
    cloud
        .post(
            "/v1/jobs",
            &json!({"name": "train", "gpus": 2, "cpu_milli": 2000, "memory_mib": 4096}),
        )
        .unwrap();
    // Three GPUs do not fit beside it on the one four-GPU node: pending, with the reason.
    cloud
        .post("/v1/jobs", &json!({"name": "waits", "gpus": 3}))
        .unwrap();
    let (status, body) = cloud
        .put_model("digits-mlp", nephele_e2e::MODEL_ONNX)
        .unwrap();
    assert_eq!(status, 201, "{body}");
    cloud
        .post(
            "/v1/deployments",
            &json!({"name": "digits", "model": "digits-mlp", "selector": "tier=edge",
                    "offload": false}),
        )
        .unwrap();
    let edge = cloud.edge_serving_digits("eu-west").unwrap();
    for i in 0..10 {
        let row = nephele_e2e::digits_row(i);
        let (status, _) = edge.infer("digits", &row).unwrap();
        assert_eq!(status, 200);
    }
    // A change of SLO is rolled out in steps: the deployment shows its rollout.
    let (status, answer) = cloud
        .client()
        .raw_json(
            "PUT",
            &format!("{}/v1/deployments/digits", cloud.api),
            &json!({"name": "digits", "model": "digits-mlp", "selector": "tier=edge",
                    "offload": false, "slo_ms": 250}),
        )
        .unwrap();
    assert_eq!(status, 200, "{answer}");
    std::thread::sleep(Duration::from_secs(2));

    let addr = cloud.api.trim_start_matches("https://").to_string();
    let pin = browser::spki_pin(&addr).unwrap();
    let browser = Browser::start(&cloud.dir, &[pin], 1400, 2000).unwrap();
    browser
        .goto(&format!("{}/#token={}", cloud.api, cloud.token))
        .unwrap();
    browser
        .wait_for(
            "the dashboard's first refresh with every view filled",
            "return document.body.dataset.refreshed && document.querySelectorAll('#tenants-cost tbody tr td.num').length > 0 && document.getElementById('live').textContent === 'live';",
            Duration::from_secs(60),
        )
        .unwrap();

    let error = browser
        .eval("return document.getElementById('error').textContent;")
        .unwrap();
    assert_eq!(error, "", "the page says it cannot load");

    // Fleet: both agents, healthy, what the device runs.
    let devices = rows(&browser, "devices");
    eprintln!("devices: {devices:#?}");
    let device = devices.iter().find(|r| r.starts_with("edge-1|")).unwrap();
    assert!(device.contains("|healthy|"), "{device}");
    assert!(device.contains("digits (full)"), "{device}");
    assert!(devices.iter().any(|r| r.contains("|pool|")), "{devices:?}");
    let regions = browser
        .eval("return document.getElementById('fleet-regions').textContent;")
        .unwrap();
    assert!(
        regions.as_str().unwrap().contains("eu-west: 2 devices"),
        "{regions}"
    );

    // Deployments and rollouts: the deployment, its requests and its rollout.
    let deployments = rows(&browser, "deployments");
    eprintln!("deployments: {deployments:#?}");
    let digits = deployments
        .iter()
        .find(|r| r.starts_with("digits|"))
        .unwrap();
    assert!(digits.contains("|1 / 1|"), "{digits}");
    assert!(digits.contains("|10|"), "the 10 requests served: {digits}");
    assert!(digits.contains("#1 "), "the rollout: {digits}");

    // GPU pools: the node up, two of its four GPUs taken by the running job.
    let nodes = rows(&browser, "nodes");
    eprintln!("nodes: {nodes:#?}");
    let node = nodes.iter().find(|r| r.contains("|l4-0|")).unwrap();
    assert!(node.contains("|up|"), "{node}");
    assert!(node.contains("2.00 of 4"), "{node}");
    assert!(node.contains("train"), "{node}");

    // Jobs: running, and pending with why.
    let jobs = rows(&browser, "jobs");
    eprintln!("jobs: {jobs:#?}");
    let train = jobs.iter().find(|r| r.contains("|train|")).unwrap();
    assert!(train.contains("|running|"), "{train}");
    let waits = jobs.iter().find(|r| r.contains("|waits|")).unwrap();
    assert!(waits.contains("|pending|"), "{waits}");
    assert!(
        waits.split('|').next_back().unwrap().len() > 10,
        "why pending: {waits}"
    );

    // Cost and carbon per tenant: the running job's GPU-hours, cost and carbon.
    let costs = rows(&browser, "tenants-cost");
    eprintln!("cost and carbon: {costs:#?}");
    let default = costs.iter().find(|r| r.starts_with("default|")).unwrap();
    let cells: Vec<&str> = default.split('|').collect();
    let gpu_hours: f64 = cells[1].parse().unwrap();
    let kg: f64 = cells[7].parse().unwrap();
    assert!(gpu_hours > 0.0, "{default}");
    assert!(kg > 0.0, "{default}");
    assert_eq!(cells[4], "10", "edge requests: {default}");

    // The page as a person first sees it, and each view's own picture.
    let dir = screenshots();
    let page = browser.screenshot(&dir.join("dashboard.png")).unwrap();
    let (width, height) = browser::png_size(&page).unwrap();
    assert!(width >= 1000 && height >= 700, "{width}×{height}");
    let mut seen = std::collections::BTreeSet::new();
    for (view, css) in [
        ("fleet", "#devices"),
        ("deployments", "#deployments"),
        ("pools", "#nodes"),
        ("jobs", "#jobs"),
        ("costs", "#tenants-cost"),
    ] {
        let path = dir.join(format!("dashboard-{view}.png"));
        let png = browser.element_screenshot(css, &path).unwrap();
        let (width, height) = browser::png_size(&png).unwrap();
        // A header and at least one row of data, as wide as the page's tables.
        assert!(width >= 600 && height >= 50, "{view}: {width}×{height}");
        assert!(seen.insert(png.clone()), "{view} looks like another view");
        eprintln!(
            "screenshot {}: {width}×{height}, {} bytes",
            path.display(),
            png.len()
        );
    }

    // The counts on the cards come from totals, not from rows.
    let summary = browser
        .eval("return document.getElementById('summary').textContent;")
        .unwrap();
    let summary = summary.as_str().unwrap();
    assert!(summary.contains("2 / 2devices online"), "{summary}");
    assert!(summary.contains("1 / 1jobs running / pending"), "{summary}");

    // Long lists are paged: one row a page here, Next and Previous walk the devices.
    browser
        .goto(&format!("{}/#token={}&page_size=1", cloud.api, cloud.token))
        .unwrap();
    let pager = |id: &str| {
        browser
            .eval(&format!(
                "return document.getElementById('{id}-pager').textContent;"
            ))
            .unwrap()
            .as_str()
            .unwrap()
            .to_string()
    };
    let devices_page = |what: &str, starts: &str| {
        browser
            .wait_for(
                what,
                &format!(
                    "return document.getElementById('devices-pager').textContent.startsWith('{starts}');"
                ),
                Duration::from_secs(30),
            )
            .unwrap();
    };
    let click = |button: &str| {
        browser
            .eval(&format!(
                "document.querySelector('#devices-pager button.{button}').click(); return null;"
            ))
            .unwrap();
    };
    devices_page("the first page of one device", "1–1 of 2 devices");
    let first = rows(&browser, "devices");
    assert_eq!(first.len(), 1, "{first:?}");
    assert!(
        pager("jobs").starts_with("1–1 of 2 jobs"),
        "{}",
        pager("jobs")
    );
    assert!(
        pager("deployment-devices").starts_with("1–1 of"),
        "{}",
        pager("deployment-devices")
    );
    click("next");
    devices_page("the second page", "2–2 of 2 devices");
    let second = rows(&browser, "devices");
    assert_eq!(second.len(), 1, "{second:?}");
    assert_ne!(
        first[0].split('|').next(),
        second[0].split('|').next(),
        "the next page shows the other device"
    );
    let next_disabled = browser
        .eval("return document.querySelector('#devices-pager button.next').disabled;")
        .unwrap();
    assert_eq!(next_disabled, true, "the last page has no next");
    click("previous");
    devices_page("back on the first page", "1–1 of 2 devices");
    let name = |rows: &[String]| rows[0].split('|').next().unwrap().to_string();
    assert_eq!(name(&rows(&browser, "devices")), name(&first));
    drop(edge);
}
