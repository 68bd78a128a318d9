//! Variants of the demo model, built and checked the way the control plane does on push.

use nephele_runtime::onnx_edit::OnnxGraph;
use nephele_runtime::variants::{build_variants, ValidationSet, SPLIT_TOLERANCE};
use nephele_runtime::Model;

const MODEL: &[u8] = include_bytes!("../../../shared/models/digits-mlp/model.onnx");
const HELDOUT: &str = include_str!("../../../shared/models/digits-mlp/heldout.json");

fn heldout() -> ValidationSet {
    let value: serde_json::Value = serde_json::from_str(HELDOUT).expect("heldout.json parses");
    let rows: Vec<Vec<f32>> = serde_json::from_value(value["features"].clone()).expect("features");
    let labels: Vec<usize> = serde_json::from_value(value["labels"].clone()).expect("labels");
    ValidationSet {
        rows,
        labels: Some(labels),
    }
}

#[test]
fn every_candidate_cut_of_the_demo_model_splits_into_head_and_tail_equal_to_full() {
    let graph = OnnxGraph::parse("digits", MODEL).expect("parses");
    let cuts = graph.candidate_cuts();
    // Gemm → Relu → Gemm → Relu → Gemm: the four activations between the five nodes.
    assert_eq!(cuts.len(), 4, "{cuts:?}");
    let set = build_variants("digits", MODEL, &heldout()).expect("variants");
    let full = set.get("full").expect("full");
    for cut in &cuts {
        let split = set
            .get(&format!("split@{cut}"))
            .expect("split variant built");
        assert_eq!(split.rejected, None, "{cut}: {:?}", split.rejected);
        assert_eq!(split.files.len(), 2);
        let agreement = split.agreement.expect("measured");
        assert_eq!(agreement.rows, 360);
        assert!(agreement.top1_agreement == 1.0, "{cut}: {agreement:?}");
        let info = split.cut.as_ref().expect("cut info");
        // Compute is conserved across the cut (tract's cost model, batch 1).
        assert_eq!(info.head_flops + info.tail_flops, full.flops, "{cut}");
        assert!(
            info.head_flops > 0 && info.tail_flops > 0,
            "{cut}: {info:?}"
        );
        assert_eq!(split.accuracy, full.accuracy, "{cut}");
    }
    // Check the tolerance independently of the builder: run head then tail by hand.
    let rows = heldout().rows;
    let full_model = Model::load_onnx("full", MODEL).expect("full loads");
    for cut in &cuts {
        let split = set.get(&format!("split@{cut}")).expect("split");
        let head = Model::load_onnx("head", &split.files[0]).expect("head loads");
        let tail = Model::load_onnx("tail", &split.files[1]).expect("tail loads");
        for row in rows.iter().take(50) {
            let (_, expected) = full_model.infer(&[64], row).expect("full runs");
            let (shape, middle) = head.infer(&[64], row).expect("head runs");
            let (_, got) = tail.infer(&shape, &middle).expect("tail runs");
            let scale = expected.iter().fold(0f32, |m, v| m.max(v.abs()));
            for (a, b) in expected.iter().zip(&got) {
                assert!(
                    (a - b).abs() <= SPLIT_TOLERANCE * scale + 1e-6,
                    "{cut}: {a} vs {b}"
                );
            }
        }
    }
}

#[test]
fn int8_variant_is_four_times_smaller_and_keeps_accuracy() {
    let set = build_variants("digits", MODEL, &heldout()).expect("variants");
    let full = set.get("full").expect("full");
    let int8 = set.get("int8").expect("int8");
    assert_eq!(int8.rejected, None, "{:?}", int8.rejected);
    let ratio = full.size() as f64 / int8.size() as f64;
    assert!(
        ratio >= 3.5,
        "size ratio {ratio:.2}: full {} int8 {}",
        full.size(),
        int8.size()
    );
    let drop = full.accuracy.expect("labelled") - int8.accuracy.expect("labelled");
    assert!(
        drop <= 0.5,
        "accuracy {:?} → {:?}",
        full.accuracy,
        int8.accuracy
    );
    let agreement = int8.agreement.expect("measured");
    assert!(agreement.min_cosine >= 0.99, "{agreement:?}");
    eprintln!(
        "digits-mlp int8: {} → {} bytes ({ratio:.2}×), accuracy {:?} → {:?}, min cosine {:.5}",
        full.size(),
        int8.size(),
        full.accuracy,
        int8.accuracy,
        agreement.min_cosine
    );
    // int8 compute was tried on top (activations calibrated on the rows, both forms
    // timed as the agent runs them) and the faster one that keeps the rule ships.
    let compute = int8
        .quantization
        .as_ref()
        .and_then(|q| q.compute.as_ref())
        .expect("int8 compute tried");
    eprintln!("digits-mlp int8 compute: {}", compute.reason);
    assert_eq!(compute.sites, 3, "{compute:?}");
    assert_eq!(compute.calibration_rows, heldout().rows.len());
    assert!(
        compute.storage_ms.is_some() && compute.compute_ms.is_some(),
        "{compute:?}"
    );
    assert_eq!(
        compute.chosen,
        int8.precision == "int8-compute",
        "{compute:?}"
    );
    if compute.chosen {
        // What follows checks the storage form.
        return;
    }
    // What the agent loads: the weights folded back to f32, same outputs as the
    // Cast × scale graph that travels.
    let in_graph = Model::load_onnx("in-graph", &int8.files[0]).expect("int8 loads as is");
    let folded = Model::load_variant("folded", &int8.files[0], None).expect("int8 folds");
    assert!(
        nephele_runtime::onnx_edit::dequantize_weights("x", &int8.files[0])
            .expect("parses")
            .is_some()
    );
    assert!(nephele_runtime::onnx_edit::dequantize_weights("x", MODEL)
        .expect("parses")
        .is_none());
    for row in heldout().rows.iter().take(20) {
        let (_, a) = in_graph.infer(&[64], row).expect("runs");
        let (_, b) = folded.infer(&[64], row).expect("runs");
        for (x, y) in a.iter().zip(&b) {
            assert!((x - y).abs() <= 1e-5 * x.abs().max(1.0), "{x} vs {y}");
        }
    }
    // Every int8 file is a plain ONNX model again, so it can be split too.
    let graph = OnnxGraph::parse("digits/int8", &int8.files[0]).expect("int8 parses");
    assert_eq!(graph.candidate_cuts().len(), 4);
}

#[test]
fn a_tensor_that_does_not_split_the_graph_is_refused_with_the_reason() {
    let graph = OnnxGraph::parse("digits", MODEL).expect("parses");
    let error = graph.split("no-such-tensor", &[1, 8]).unwrap_err();
    assert!(error.to_string().contains("no node produces"), "{error}");
    let error = graph.split("logits", &[1, 10]).unwrap_err();
    assert!(error.to_string().contains("model digits"), "{error}");
}

#[test]
fn an_empty_validation_set_is_an_error_not_a_pass() {
    let empty = ValidationSet {
        rows: vec![],
        labels: None,
    };
    let error = build_variants("digits", MODEL, &empty).unwrap_err();
    assert!(
        error.to_string().contains("validation set is empty"),
        "{error}"
    );
}

#[test]
fn a_batch_of_any_size_gives_the_rows_that_batch_one_gives_in_order() {
    let model = Model::load_onnx("digits", MODEL).expect("loads");
    let rows = heldout().rows;
    let singles: Vec<Vec<f32>> = rows
        .iter()
        .take(77)
        .map(|row| model.infer(&[64], row).expect("runs").1)
        .collect();
    for batch in [1usize, 2, 3, 13, 64, 77] {
        let data: Vec<f32> = rows.iter().take(batch).flatten().copied().collect();
        let (shape, out) = model.infer(&[batch, 64], &data).expect("batch runs");
        assert_eq!(shape, vec![batch, 10]);
        for (i, expected) in singles.iter().take(batch).enumerate() {
            for (a, b) in expected.iter().zip(&out[i * 10..(i + 1) * 10]) {
                assert!(
                    (a - b).abs() <= 1e-4 * a.abs().max(1.0),
                    "batch {batch} row {i}: {a} vs {b}"
                );
            }
        }
    }
    let profile = model.profile_batches(&[1, 8, 32], 5).expect("profiles");
    assert_eq!(
        profile.iter().map(|p| p.0).collect::<Vec<_>>(),
        vec![1, 8, 32]
    );
    assert!(profile.iter().all(|p| p.1 >= 1));
    eprintln!("digits-mlp service time by batch size (µs): {profile:?}");
}

/// The registry models, when `shared/models/registry/prepare.sh` has fetched them.
fn registry_dir(model: &str) -> Option<std::path::PathBuf> {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../target/models")
        .join(model);
    if dir.join("validation.json").exists() {
        Some(dir)
    } else {
        // CI always prepares them (tests/run.sh): there, a missing model is a failure.
        assert!(
            !std::env::var("CI").is_ok_and(|v| v == "true" || v == "1"),
            "{} not prepared, and CI always prepares it: run `bash tests/run.sh`",
            dir.display()
        );
        eprintln!(
            "skipped: {} not prepared (run `bash shared/models/registry/prepare.sh`)",
            dir.display()
        );
        None
    }
}

/// (row length, rows, reference rows) of a `nephele-validation/1` file.
fn validation_file(dir: &std::path::Path) -> (usize, Vec<Vec<f32>>, Vec<Vec<f32>>) {
    let meta: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.join("validation.json")).expect("read"))
            .expect("json");
    let floats = |file: &str| -> Vec<f32> {
        std::fs::read(dir.join(meta[file].as_str().expect("file name")))
            .expect("read rows")
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect()
    };
    let product = |key: &str| -> usize {
        meta[key]
            .as_array()
            .expect("shape")
            .iter()
            .map(|d| d.as_u64().expect("dim") as usize)
            .product()
    };
    let (row, out) = (product("shape"), product("reference_shape"));
    let rows = floats("rows_file")
        .chunks(row)
        .map(<[f32]>::to_vec)
        .collect();
    let reference = floats("reference_file")
        .chunks(out)
        .map(<[f32]>::to_vec)
        .collect();
    (row, rows, reference)
}

/// How many nodes of a plan's profile run operator `op`.
fn nodes_of(ops: &[nephele_runtime::op_profile::OpTime], op: &str) -> usize {
    ops.iter().filter(|o| o.op == op).map(|o| o.nodes).sum()
}

/// PaddleOCR's classifier and detector write hard-swish out in four nodes; the runtime
/// runs it as tract's one `HardSwish` (`fuse_activations`) and folds the scales and
/// shifts next to convolutions into their weights (`fold_affine`), and still answers
/// what onnxruntime answers on the files' validation rows, within their tolerance.
#[test]
fn ppocr_runs_hard_swish_fused_and_answers_as_onnxruntime_does() {
    for (name, row_shape, fused, depthwise, pointwise, direct) in [
        ("ppocr-cls", [3usize, 48, 192], 18, 11, 41, 1),
        ("ppocr-det", [3, 640, 640], 24, 14, 42, 6),
    ] {
        let Some(dir) = registry_dir(name) else {
            continue;
        };
        let bytes = std::fs::read(dir.join("model.onnx")).expect("read the model");
        let model = Model::load_onnx_with_shape(name, &bytes, Some(&row_shape)).expect("loads");
        let ops = model.op_profile(1).expect("profiles");
        let count = |op: &str| nodes_of(&ops, op);
        assert_eq!(count("HardSwish"), fused, "{name}: {ops:?}");
        // Its depthwise, 1×1 and other convolutions (the stem's 3×3, the detector's
        // 3×3 neck and head) run on the runtime's own kernels (`depthwise.rs`,
        // `pointwise.rs`, `direct.rs`): no convolution is left to tract.
        assert_eq!(count("NepheleDepthwise"), depthwise, "{name}: {ops:?}");
        assert_eq!(count("DepthWiseConv"), 0, "{name}: {ops:?}");
        assert_eq!(count("NephelePointwise"), pointwise, "{name}: {ops:?}");
        assert_eq!(count("NepheleConv"), direct, "{name}: {ops:?}");
        assert!(
            !ops.iter().any(|o| o.op == "Pad"),
            "{name}: a convolution's padding is left as a pass of its own: {ops:?}"
        );
        assert!(
            !ops.iter().any(|o| o.op.contains("Add+Max+Min")),
            "{name}: a written-out hard-swish is left: {ops:?}"
        );
        if name == "ppocr-cls" {
            // Its batch norms after depthwise layers are folded into their weights
            // (`fold_affine`): no scale-and-shift pass is left.
            assert!(
                !ops.iter().any(|o| o.op.starts_with("OptBinChain(Mul+Add")),
                "{name}: a batch norm is left as a pass of its own: {ops:?}"
            );
        }
        let meta: serde_json::Value =
            serde_json::from_slice(&std::fs::read(dir.join("validation.json")).expect("read"))
                .expect("json");
        let tolerance = meta["tolerance"].as_f64().expect("tolerance") as f32;
        let (row_len, rows, reference) = validation_file(&dir);
        let mut worst = 0f32;
        for (row, want) in rows.iter().zip(&reference) {
            let mut shape = vec![1];
            shape.extend_from_slice(&row_shape);
            assert_eq!(row.len(), row_len);
            let (_, got) = model.infer(&shape, row).expect("runs");
            assert_eq!(got.len(), want.len(), "{name}");
            for (g, w) in got.iter().zip(want) {
                worst = worst.max((g - w).abs());
            }
        }
        assert!(
            worst <= tolerance,
            "{name}: max |tract − onnxruntime| {worst:.2e} above {tolerance:.0e}"
        );
        eprintln!(
            "{name}: {fused} hard-swish fused, {depthwise} depthwise and {pointwise} 1×1 layers ours, max |tract − onnxruntime| {worst:.2e}"
        );
    }
}

/// all-MiniLM-L6-v2's projections and feed-forward layers (six layers of four
/// projections and two feed-forward products) run on the runtime's own product kernel
/// (`dense.rs`) with their biases, the attention's products stay tract's, and tract
/// still answers the numpy forward the reference came from.
#[test]
fn minilm_runs_its_products_by_weights_on_the_dense_kernel() {
    let Some(dir) = registry_dir("minilm") else {
        return;
    };
    let (seq, rows, reference) = validation_file(&dir);
    let onnx = std::fs::read(dir.join("model.onnx")).expect("onnx");
    let model = Model::load_onnx_with_shape("minilm", &onnx, Some(&[seq])).expect("loads");
    let ops = model.op_profile(1).expect("profiles");
    let count = |op: &str| nodes_of(&ops, op);
    assert_eq!(count("NepheleDense"), 36, "{ops:?}");
    assert_eq!(count("OptMatMul"), 12, "{ops:?}");
    let mut worst = 0f32;
    for (row, want) in rows.iter().zip(&reference) {
        let (_, got) = model.infer(&[1, seq], row).expect("runs");
        assert_eq!(got.len(), want.len());
        for (g, w) in got.iter().zip(want) {
            worst = worst.max((g - w).abs());
        }
    }
    assert!(worst <= 1e-4, "max |tract − numpy| {worst:.2e}");
    eprintln!("minilm: 36 products ours, max |tract − numpy| {worst:.2e}");
}

/// Three implementations of all-MiniLM-L6-v2 agree: candle from the safetensors, tract
/// on the ONNX graph built from them, and the numpy forward the reference came from.
#[cfg(feature = "candle")]
#[test]
fn minilm_in_candle_equals_tract_and_the_numpy_reference() {
    let Some(dir) = registry_dir("minilm") else {
        return;
    };
    let (seq, rows, reference) = validation_file(&dir);
    let bert = nephele_runtime::candle_bert::CandleBert::load(
        "minilm",
        &std::fs::read(dir.join("model.safetensors")).expect("weights"),
        &std::fs::read_to_string(dir.join("config.json")).expect("config"),
    )
    .expect("candle loads MiniLM");
    let onnx = std::fs::read(dir.join("model.onnx")).expect("onnx");
    let tract = Model::load_onnx("minilm", &onnx).expect("tract loads MiniLM");
    let ids: Vec<f32> = rows.iter().flatten().copied().collect();
    let candle_out = bert.embed(rows.len(), seq, &ids).expect("candle runs");
    let (_, tract_out) = tract.infer(&[rows.len(), seq], &ids).expect("tract runs");
    let hidden = bert.hidden_size();
    for (i, expected) in reference.iter().enumerate() {
        let c = &candle_out[i * hidden..(i + 1) * hidden];
        let t = &tract_out[i * hidden..(i + 1) * hidden];
        for ((a, b), e) in c.iter().zip(t).zip(expected) {
            assert!((a - e).abs() <= 1e-4, "row {i}: candle {a} vs numpy {e}");
            assert!((b - e).abs() <= 1e-4, "row {i}: tract {b} vs numpy {e}");
        }
    }
    // Bad ids are an error, not a panic.
    assert!(bert.embed(1, seq, &vec![1e9; seq]).is_err());
    assert!(bert.embed(1, seq, &vec![0.5; seq]).is_err());
}

/// The optional onnxruntime backend gives tract's answers and is chosen by measurement.
#[cfg(feature = "onnxruntime")]
#[test]
fn the_onnxruntime_backend_agrees_with_tract_and_is_chosen_by_measurement() {
    if std::env::var("ORT_DYLIB_PATH").is_err() {
        eprintln!("skipped: ORT_DYLIB_PATH is not set (tests/run.sh sets it from target/models)");
        return;
    }
    let tract = Model::load_onnx("digits", MODEL).expect("loads");
    let mut both = Model::load_onnx("digits", MODEL).expect("loads");
    both.attach_onnxruntime(MODEL)
        .expect("onnxruntime loads the same file");
    both.force_onnxruntime();
    assert_eq!(both.backend(), "onnxruntime");
    let rows = heldout().rows;
    let data: Vec<f32> = rows.iter().take(13).flatten().copied().collect();
    let (shape_a, a) = tract.infer(&[13, 64], &data).expect("tract runs");
    let (shape_b, b) = both.infer(&[13, 64], &data).expect("onnxruntime runs");
    assert_eq!(shape_a, shape_b);
    for (x, y) in a.iter().zip(&b) {
        assert!((x - y).abs() <= 1e-4 * x.abs().max(1.0), "{x} vs {y}");
    }
    let choice = both.choose_backend(20).expect("measures");
    assert_eq!(choice.backend, both.backend());
    assert!(choice.onnxruntime_us.is_some());
    // A corrupt file is refused by onnxruntime too, with the model's name.
    let mut broken = Model::load_onnx("digits", MODEL).expect("loads");
    let error = broken.attach_onnxruntime(b"garbage").unwrap_err();
    assert!(error.to_string().contains("model digits"), "{error}");
}
