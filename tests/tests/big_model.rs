//! Pushing a real ≥ 10 MB CNN while agents are connected: PP-OCRv4's text recognizer
//! (10.9 MB, from rapidocr's PyPI wheel, prepared by `tests/run.sh`), exported with a
//! symbolic batch, height and width, pushed as exported with its shape given at push
//! (`--input x=N,3,48,320`). The push answers at once with the model `building`, the
//! build reports progress and ends `ready` with at most 8 split candidates (each with
//! the reason it was chosen), the agents' sessions stay up throughout, and a pool loads
//! a split tail only when a device first sends that cut, accounting its bytes.

use std::time::{Duration, Instant};

use nephele_e2e::*;

const REC_MODEL: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../target/models/ppocr-rec/model.onnx"
);

fn connected_for(cloud: &Cloud) -> Vec<(String, u64)> {
    let devices = cloud.get("/v1/devices").expect("devices");
    devices
        .as_array()
        .into_iter()
        .flatten()
        .map(|d| {
            (
                d["name"].as_str().unwrap_or("?").to_string(),
                d["connected_for_s"].as_u64().unwrap_or(0),
            )
        })
        .collect()
}

fn status(edge: &Edge) -> serde_json::Value {
    Http::new(None)
        .request("GET", &format!("{}/v1/status", edge.endpoint), None)
        .expect("agent status")
}

/// The recognizer's bytes; `None` (a skip, or a failure under `CI=true`) when the test
/// script has not fetched it.
fn recognizer() -> Option<Vec<u8>> {
    let path = std::path::Path::new(REC_MODEL);
    require(
        "the PP-OCRv4 recognizer (target/models/ppocr-rec)",
        path.exists(),
    )
    .then(|| std::fs::read(path).expect("read the recognizer"))
}

#[test]
fn a_big_cnn_is_built_in_the_background_and_its_split_tail_loads_on_demand() {
    let Some(model) = recognizer() else {
        return;
    };
    assert!(model.len() >= 10_000_000, "{} bytes", model.len());
    let cloud = Cloud::start("big-model").expect("cloud");
    let edge = Edge::start(
        &cloud,
        "cam-1",
        "eu-west",
        &["--profile", "rpi5-8gb", "--label", "site=lab"],
        &["--workers", "1"],
    )
    .expect("edge agent");
    let pool = Edge::pool(&cloud, "pool-1", "eu-west").expect("pool agent");
    cloud
        .wait_for("/v1/devices", "both agents online", |v| {
            v.as_array()
                .is_some_and(|d| d.len() == 2 && d.iter().all(|x| x["online"] == true))
        })
        .expect("agents online");
    let before = connected_for(&cloud);
    let pushed = Instant::now();

    // As exported: the shape is given at push, the file is not edited by hand.
    let url = format!("{}/v1/models/ocr-rec?input=x%3DN%2C3%2C48%2C320", cloud.api);
    let (code, view) = cloud.client().raw("PUT", &url, &model).expect("push");
    let returned = pushed.elapsed();
    assert_eq!(code, 202, "{view}");
    assert_eq!(view["state"], "building", "{view}");
    assert_eq!(view["input_specs"][0], "x=N,3,48,320", "{view}");
    println!(
        "push of {} bytes answered in {:.3} s",
        model.len(),
        returned.as_secs_f64()
    );

    // The build reports progress until the model is ready.
    let mut steps = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(600);
    let ready = loop {
        let view = cloud.get("/v1/models/ocr-rec").expect("model view");
        if view["state"] != "building" {
            break view;
        }
        if let Some(step) = view["progress"]["step"].as_str() {
            if steps.last().map(String::as_str) != Some(step) {
                steps.push(step.to_string());
            }
        }
        assert!(Instant::now() < deadline, "still building: {view}");
        std::thread::sleep(Duration::from_millis(200));
    };
    let built = pushed.elapsed();
    assert_eq!(ready["state"], "ready", "{ready}");
    println!(
        "built in {:.1} s; progress seen: {steps:?}",
        built.as_secs_f64()
    );
    assert!(!steps.is_empty(), "no progress was reported");
    let variants = ready["variants"].as_array().expect("variants");
    let splits: Vec<&serde_json::Value> = variants
        .iter()
        .filter(|v| v["name"].as_str().is_some_and(|n| n.starts_with("split@")))
        .collect();
    for v in variants {
        println!(
            "  {:<28} {:>9} bytes  {}  {}",
            v["name"].as_str().unwrap_or("?"),
            v["size"],
            v["status"].as_str().unwrap_or("?"),
            v["reason"].as_str().unwrap_or("")
        );
    }
    assert!(
        (1..=8).contains(&splits.len()),
        "{} split candidates: {ready}",
        splits.len()
    );
    assert!(
        splits
            .iter()
            .all(|v| v["reason"].as_str().is_some_and(|r| r.contains("frontier"))),
        "every split says why its cut was chosen: {ready}"
    );

    // Neither agent's session dropped while the model was built and stored.
    let after = connected_for(&cloud);
    let waited = pushed.elapsed().as_secs();
    for (name, then) in &before {
        let now = after
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, s)| *s)
            .unwrap_or(0);
        assert!(
            now + 1 >= then + waited,
            "{name} reconnected during the build: connected for {then} s before, {now} s after {waited} s"
        );
    }

    // A split deployment: the device runs the head, the pool the tail, which the pool
    // loads when the first request for that cut arrives, and only that tail.
    let split = splits[0]["name"].as_str().expect("split name").to_string();
    cloud.deploy_on_one_edge_and_the_pool(serde_json::json!({"name": "ocr",
        "model": "ocr-rec", "variant": split, "selector": "site=lab", "slo_ms": 5000, "max_queue": 4}));
    let tails_on_pool = || -> Vec<serde_json::Value> {
        status(&pool)["deployments"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|d| d["name"] == "ocr")
            .flat_map(|d| d["tails"].as_array().cloned().unwrap_or_default())
            .collect()
    };
    assert!(
        tails_on_pool().is_empty(),
        "the pool loaded tails before any device sent a cut"
    );
    let rss_before = status(&pool)["rss_bytes"].as_u64().unwrap_or(0);
    let row: Vec<f32> = (0..3 * 48 * 320)
        .map(|i| ((i % 97) as f32) / 97.0)
        .collect();
    let body = serde_json::json!({"shape": [1, 3, 48, 320], "data": row});
    let mut answered_split = 0;
    for _ in 0..3 {
        let (code, reply) = Http::new(None)
            .raw_json("POST", &format!("{}/v1/infer/ocr", edge.endpoint), &body)
            .expect("infer");
        assert_eq!(code, 200, "{reply}");
        if reply["where"] == "split" {
            answered_split += 1;
        }
    }
    assert!(answered_split > 0, "no answer went through the pool's tail");
    let tails = tails_on_pool();
    assert_eq!(tails.len(), 1, "{tails:?}");
    assert_eq!(tails[0]["variant"], split.as_str(), "{tails:?}");
    let tail_bytes = tails[0]["bytes"].as_u64().unwrap_or(u64::MAX);
    assert!(
        tail_bytes <= 2 * model.len() as u64,
        "{tail_bytes} bytes of tail for a {}-byte model",
        model.len()
    );
    let rss_after = status(&pool)["rss_bytes"].as_u64().unwrap_or(0);
    println!(
        "pool: tail {split} loaded on demand ({tail_bytes} bytes of file); RSS {:.1} → {:.1} MB ({:+.1} MB for the tail in use; the model file is {:.1} MB)",
        rss_before as f64 / 1e6,
        rss_after as f64 / 1e6,
        (rss_after as f64 - rss_before as f64) / 1e6,
        model.len() as f64 / 1e6
    );
    // The RSS step is printed, not asserted: it also holds what the allocator kept of
    // the download and the parse, and moves by megabytes from run to run.
}

/// A push acknowledged with 202 survives a crash of the control plane mid-build: it was
/// kept on disk before the answer, and the restarted control plane builds it again.
#[test]
fn a_push_acknowledged_before_a_crash_is_built_after_the_restart() {
    let Some(model) = recognizer() else {
        return;
    };
    let mut cloud = Cloud::start("push-crash").expect("cloud");
    let url = format!("{}/v1/models/ocr-rec?input=x%3DN%2C3%2C48%2C320", cloud.api);
    let (code, view) = cloud.client().raw("PUT", &url, &model).expect("push");
    assert_eq!(code, 202, "{view}");
    // Killed while building (this model takes tens of seconds to build here).
    cloud.kill9();
    let pushes = cloud.dir.join("data/pushes");
    assert!(
        pushes.join("ocr-rec.json").exists() && pushes.join("ocr-rec.body").exists(),
        "the acknowledged push is kept: {:?}",
        std::fs::read_dir(&pushes).map(|d| d.count())
    );
    let restarted = Instant::now();
    cloud.restart().expect("restart");
    let deadline = Instant::now() + Duration::from_secs(600);
    let ready = loop {
        let view = cloud
            .get("/v1/models/ocr-rec")
            .expect("the model is known after the restart");
        if view["state"] != "building" {
            break view;
        }
        assert!(Instant::now() < deadline, "still building: {view}");
        std::thread::sleep(Duration::from_millis(200));
    };
    assert_eq!(ready["state"], "ready", "{ready}");
    assert_eq!(ready["input_specs"][0], "x=N,3,48,320", "{ready}");
    println!(
        "push acknowledged, control plane killed mid-build: built again and ready {:.1} s after the restart",
        restarted.elapsed().as_secs_f64()
    );
    assert!(cloud
        .logs()
        .contains("building again a push acknowledged before the restart"));
    // Forgotten once stored (just after the model is), so a further restart builds
    // nothing.
    let stored = Instant::now();
    while std::fs::read_dir(&pushes).unwrap().count() > 0 {
        assert!(
            stored.elapsed() < Duration::from_secs(10),
            "the push is still kept after its model was stored"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    // The same push again is the model already stored: 200, not a second build.
    let (code, view) = cloud.client().raw("PUT", &url, &model).expect("push again");
    assert_eq!(code, 200, "{view}");
}
