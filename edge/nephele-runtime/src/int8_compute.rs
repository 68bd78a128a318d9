//! int8 *compute* for the int8 variant, shipped only where it measures faster.
//!
//! The int8 variant is first built as int8 *storage* ([`crate::onnx_edit`]: weights as
//! int8 with per-channel scales, folded back to f32 when the runtime loads them, so it
//! computes in f32 at fp32's speed). This module tries the other form on top of it:
//! every `MatMul` and `Conv` whose weight is such an int8 tensor gets its float input
//! quantized too, with a scale and zero point calibrated on the validation rows (the
//! smallest and largest value each of those activations took, asymmetric uint8 per
//! tensor, as onnxruntime's static quantizer does by default), and runs as
//! `MatMulInteger` / `ConvInteger` on the int8 values; the int32 result is scaled back
//! by `activation scale × weight scale` per output channel (and the bias added). The
//! file stays plain ONNX.
//!
//! Whether that pays is measured, never assumed ([`choose`]): the compute form is
//! loaded as the agent would load it and timed against the storage form on the same
//! row; only when it is clearly faster is it measured on every validation row under
//! the int8 rule, and shipped when it passes. Otherwise the storage form ships and the
//! report says what was measured. On this project's x86 machines tract runs these
//! integer ops tens of times slower than its f32 kernels, so storage wins there (the
//! README's "int8 compute" gives the figures per model); a runtime with fast integer
//! kernels is chosen the same way, by measurement.

use std::collections::{BTreeMap, HashMap, HashSet};

use prost::Message;
use tract_onnx::pb::{
    attribute_proto::AttributeType, tensor_proto::DataType, AttributeProto, GraphProto, NodeProto,
    TensorProto, ValueInfoProto,
};

use crate::graph_index::node_reads;
use crate::graph_model::{GraphModel, NamedTensor};
use crate::onnx_edit::{float_values, OnnxGraph};
use crate::RuntimeError;

/// The compute form ships only when its time for one row is below this share of the
/// storage form's (a clear win, not noise).
pub const FASTER_THAN: f64 = 0.9;

/// Timed runs of each form after its warm-up run.
const TIMED_RUNS: usize = 3;

/// What was tried, for the variant's note.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct ComputeReport {
    /// `MatMul`/`Conv` nodes that would compute in int8.
    pub sites: usize,
    /// Validation rows the activation ranges were taken from.
    pub calibration_rows: usize,
    /// Median time of one row, int8 storage (f32 compute), ms.
    pub storage_ms: Option<f64>,
    /// The same for the int8 compute form, ms.
    pub compute_ms: Option<f64>,
    /// The compute form's min cosine to fp32 on the validation rows, when measured.
    pub min_cosine: Option<f64>,
    /// Whether the compute form is what ships.
    pub chosen: bool,
    /// One line: why it ships or not.
    pub reason: String,
}

/// A node that int8 compute rewrites.
#[derive(Debug, Clone, PartialEq)]
struct Site {
    node: usize,
    /// The float activation quantized on its way in.
    activation: String,
    /// The int8 weight initializer and its float scales (initializer names).
    weight_q: String,
    weight_scale: String,
}

/// The int8 weights of a storage-form graph: the output of each `Mul(Cast(q), s)`
/// with `q` an int8 initializer and `s` a float one, mapped to `(q, s)`.
fn dequantized_weights(graph: &GraphProto) -> HashMap<String, (String, String)> {
    let initializers: HashMap<&str, &TensorProto> = graph
        .initializer
        .iter()
        .map(|t| (t.name.as_str(), t))
        .collect();
    let casts: HashMap<&str, &str> = graph
        .node
        .iter()
        .filter(|n| n.op_type == "Cast" && n.input.len() == 1 && n.output.len() == 1)
        .filter(|n| {
            initializers
                .get(n.input[0].as_str())
                .is_some_and(|t| t.data_type == DataType::Int8 as i32)
        })
        .map(|n| (n.output[0].as_str(), n.input[0].as_str()))
        .collect();
    graph
        .node
        .iter()
        .filter(|n| n.op_type == "Mul" && n.input.len() == 2 && n.output.len() == 1)
        .filter_map(|n| {
            let q = casts.get(n.input[0].as_str())?;
            let s = initializers.get(n.input[1].as_str())?;
            (s.data_type == DataType::Float as i32)
                .then(|| (n.output[0].clone(), (q.to_string(), s.name.clone())))
        })
        .collect()
}

/// The nodes int8 compute rewrites: `MatMul` with a 2-D int8 weight scaled per column
/// (or per tensor), `Gemm` likewise (not transposing A; a transposed B is stored
/// transposed), `Conv` with an int8 weight scaled per output channel (or per tensor)
/// and, if any, a bias that is an initializer.
fn sites(graph: &GraphProto) -> Vec<Site> {
    let weights = dequantized_weights(graph);
    let initializers: HashMap<&str, &TensorProto> = graph
        .initializer
        .iter()
        .map(|t| (t.name.as_str(), t))
        .collect();
    let mut found = Vec::new();
    for (index, node) in graph.node.iter().enumerate() {
        if !node.domain.is_empty() || node.output.len() != 1 || node.input.len() < 2 {
            continue;
        }
        let Some((q, s)) = weights.get(&node.input[1]) else {
            continue;
        };
        let (Some(qt), Some(st)) = (initializers.get(q.as_str()), initializers.get(s.as_str()))
        else {
            continue;
        };
        let scales: i64 = st.dims.iter().product();
        let per_tensor = scales == 1;
        let fits = match node.op_type.as_str() {
            "MatMul" => {
                qt.dims.len() == 2
                    && node.input.len() == 2
                    && (per_tensor || st.dims == [1, qt.dims[1]])
            }
            "Conv" => {
                qt.dims.len() >= 3
                    && (per_tensor
                        || (st.dims.len() == qt.dims.len()
                            && st.dims[0] == qt.dims[0]
                            && st.dims[1..].iter().all(|d| *d == 1)))
                    && node
                        .input
                        .get(2)
                        .filter(|b| !b.is_empty())
                        .is_none_or(|b| initializers.contains_key(b.as_str()))
            }
            "Gemm" => {
                let trans_b = int_attr(node, "transB").unwrap_or(0) != 0;
                let beta = float_attr(node, "beta").unwrap_or(1.0);
                let bias_ok = match node.input.get(2).filter(|c| !c.is_empty()) {
                    None => true,
                    Some(c) => beta == 1.0 || initializers.contains_key(c.as_str()),
                };
                qt.dims.len() == 2
                    && int_attr(node, "transA").unwrap_or(0) == 0
                    && bias_ok
                    && (per_tensor
                        || (!trans_b && st.dims == [1, qt.dims[1]])
                        || (trans_b && st.dims == [qt.dims[0], 1]))
            }
            _ => false,
        };
        if fits && !node.input[0].is_empty() {
            found.push(Site {
                node: index,
                activation: node.input[0].clone(),
                weight_q: q.clone(),
                weight_scale: s.clone(),
            });
        }
    }
    found
}

/// Asymmetric uint8 parameters for values seen in `[lo, hi]`: the range is widened to
/// hold 0 (so zero padding is exact), `scale = (hi − lo) / 255`, `zero = round(−lo /
/// scale)`. A range of one point (an activation that never varied) gets scale 1.
pub fn uint8_params(lo: f32, hi: f32) -> (f32, u8) {
    let (lo, hi) = (lo.min(0.0), hi.max(0.0));
    let scale = (hi - lo) / 255.0;
    if !scale.is_finite() || scale <= 0.0 {
        return (1.0, 0);
    }
    let zero = (-lo / scale).round().clamp(0.0, 255.0) as u8;
    (scale, zero)
}

fn int_attr(node: &NodeProto, name: &str) -> Option<i64> {
    node.attribute.iter().find(|a| a.name == name).map(|a| a.i)
}

fn float_attr(node: &NodeProto, name: &str) -> Option<f32> {
    node.attribute.iter().find(|a| a.name == name).map(|a| a.f)
}

fn scalar_f32(name: String, value: f32) -> TensorProto {
    TensorProto {
        name,
        data_type: DataType::Float as i32,
        raw_data: value.to_le_bytes().to_vec(),
        ..TensorProto::default()
    }
}

fn floats(name: String, dims: Vec<i64>, values: &[f32]) -> TensorProto {
    TensorProto {
        name,
        dims,
        data_type: DataType::Float as i32,
        raw_data: values.iter().flat_map(|v| v.to_le_bytes()).collect(),
        ..TensorProto::default()
    }
}

fn node(op: &str, inputs: Vec<String>, output: String) -> NodeProto {
    NodeProto {
        op_type: op.into(),
        input: inputs,
        output: vec![output],
        ..NodeProto::default()
    }
}

fn cast_to_float(input: String, output: String) -> NodeProto {
    NodeProto {
        attribute: vec![AttributeProto {
            name: "to".into(),
            r#type: AttributeType::Int as i32,
            i: DataType::Float as i64,
            ..AttributeProto::default()
        }],
        ..node("Cast", vec![input], output)
    }
}

/// The storage-form `model` with the activations of its sites as extra outputs (what
/// calibration reads), and the names of all the sites' activations (a graph input or
/// output among them is read from the row or the answer as it is).
fn with_activation_outputs(model: &OnnxGraph) -> (Vec<u8>, Vec<String>) {
    let mut graph = model.graph().clone();
    let present: HashSet<String> = graph
        .output
        .iter()
        .chain(graph.input.iter())
        .map(|o| o.name.clone())
        .collect();
    let mut names: Vec<String> = Vec::new();
    let mut extra: Vec<String> = Vec::new();
    for site in sites(&graph) {
        if !names.contains(&site.activation) {
            if !present.contains(&site.activation) {
                extra.push(site.activation.clone());
            }
            names.push(site.activation);
        }
    }
    for name in &extra {
        graph.output.push(ValueInfoProto {
            name: name.clone(),
            ..ValueInfoProto::default()
        });
    }
    (model.with_graph(graph).encode_to_vec(), names)
}

/// The smallest and largest value each site's activation takes on `rows`, run by tract
/// on the storage form (weights folded back, as the agent runs it).
fn calibrate(
    name: &str,
    storage: &OnnxGraph,
    rows: &[HashMap<String, NamedTensor>],
) -> Result<BTreeMap<String, (f32, f32)>, RuntimeError> {
    let (bytes, names) = with_activation_outputs(storage);
    let model = GraphModel::load(&format!("{name}/calibration"), &bytes)?;
    let mut ranges: BTreeMap<String, (f32, f32)> = BTreeMap::new();
    for row in rows {
        let answer = model.run(row)?;
        for tensor_name in &names {
            let Some(values) = answer.get(tensor_name).or_else(|| row.get(tensor_name)) else {
                continue;
            };
            let entry = ranges
                .entry(tensor_name.clone())
                .or_insert((f32::INFINITY, f32::NEG_INFINITY));
            for v in &values.data {
                let v = *v as f32;
                if v.is_finite() {
                    entry.0 = entry.0.min(v);
                    entry.1 = entry.1.max(v);
                }
            }
        }
    }
    Ok(ranges)
}

/// The compute form of a storage-form graph: each site whose activation has a range
/// rewritten (see the module). `None` when no site has one.
fn rewrite(storage: &OnnxGraph, ranges: &BTreeMap<String, (f32, f32)>) -> Option<Vec<u8>> {
    let mut graph = storage.graph().clone();
    let found: Vec<Site> = sites(&graph)
        .into_iter()
        .filter(|s| {
            ranges
                .get(&s.activation)
                .is_some_and(|(lo, hi)| lo.is_finite() && hi.is_finite())
        })
        .collect();
    if found.is_empty() {
        return None;
    }
    let initializers: HashMap<String, TensorProto> = graph
        .initializer
        .iter()
        .map(|t| (t.name.clone(), t.clone()))
        .collect();
    let by_node: HashMap<usize, &Site> = found.iter().map(|s| (s.node, s)).collect();
    let mut quantized: HashMap<String, (String, String, f32)> = HashMap::new();
    let mut added: Vec<TensorProto> = Vec::new();
    let mut nodes: Vec<NodeProto> = Vec::with_capacity(graph.node.len() + 4 * found.len());
    for (index, original) in graph.node.iter().enumerate() {
        let Some(site) = by_node.get(&index) else {
            nodes.push(original.clone());
            continue;
        };
        let (q_name, zero_name, a_scale) = quantized
            .entry(site.activation.clone())
            .or_insert_with(|| {
                let (lo, hi) = ranges[&site.activation];
                let (scale, zero) = uint8_params(lo, hi);
                let base = &site.activation;
                let (s_name, z_name, q_name) = (
                    format!("{base}~s"),
                    format!("{base}~z"),
                    format!("{base}~q"),
                );
                added.push(scalar_f32(s_name.clone(), scale));
                added.push(TensorProto {
                    name: z_name.clone(),
                    data_type: DataType::Uint8 as i32,
                    raw_data: vec![zero],
                    ..TensorProto::default()
                });
                nodes.push(node(
                    "QuantizeLinear",
                    vec![base.clone(), s_name, z_name.clone()],
                    q_name.clone(),
                ));
                (q_name, z_name, scale)
            })
            .clone();
        let q = &initializers[&site.weight_q];
        let weight_scales = float_values(&initializers[&site.weight_scale]).unwrap_or_default();
        let is_conv = original.op_type == "Conv";
        let is_gemm = original.op_type == "Gemm";
        let alpha = if is_gemm {
            float_attr(original, "alpha").unwrap_or(1.0)
        } else {
            1.0
        };
        let combined: Vec<f32> = weight_scales.iter().map(|s| s * a_scale * alpha).collect();
        let out = original.output[0].clone();
        let (int_out, float_out) = (format!("{out}~i"), format!("{out}~f"));
        // Gemm's transposed B is stored as [K, N] for MatMulInteger.
        let weight = if is_gemm && int_attr(original, "transB").unwrap_or(0) != 0 {
            let (n, k) = (q.dims[0] as usize, q.dims[1] as usize);
            let name = format!("{}~t", site.weight_q);
            let mut data = vec![0u8; n * k];
            for row in 0..n {
                for col in 0..k {
                    data[col * n + row] = q.raw_data[row * k + col];
                }
            }
            added.push(TensorProto {
                name: name.clone(),
                dims: vec![k as i64, n as i64],
                data_type: DataType::Int8 as i32,
                raw_data: data,
                ..TensorProto::default()
            });
            name
        } else {
            site.weight_q.clone()
        };
        let mut integer = node(
            if is_conv {
                "ConvInteger"
            } else {
                "MatMulInteger"
            },
            vec![q_name, weight, zero_name],
            int_out.clone(),
        );
        let channel_dims: Vec<i64> = if combined.len() == 1 {
            Vec::new()
        } else if !is_conv {
            vec![combined.len() as i64]
        } else {
            // [1, M, 1, …]: the output's channel axis.
            let mut dims = vec![1i64; q.dims.len()];
            dims[1] = combined.len() as i64;
            dims
        };
        if is_conv {
            integer.attribute = original.attribute.clone();
        }
        nodes.push(integer);
        nodes.push(cast_to_float(int_out, float_out.clone()));
        let scale_name = format!("{out}~c");
        added.push(floats(scale_name.clone(), channel_dims.clone(), &combined));
        let bias_input = original.input.get(2).filter(|b| !b.is_empty());
        let bias_values = bias_input
            .and_then(|b| initializers.get(b))
            .and_then(|b| float_values(b).ok());
        let scaled = format!("{out}~m");
        match (bias_input, bias_values) {
            (None, _) => nodes.push(node("Mul", vec![float_out, scale_name], out)),
            (Some(_), Some(bias)) => {
                nodes.push(node("Mul", vec![float_out, scale_name], scaled.clone()));
                let bias_name = format!("{out}~b");
                if is_conv {
                    let mut dims = vec![1i64; q.dims.len()];
                    dims[1] = bias.len() as i64;
                    added.push(floats(bias_name.clone(), dims, &bias));
                } else {
                    // Gemm's C times beta, broadcast as Gemm broadcasts it.
                    let beta = float_attr(original, "beta").unwrap_or(1.0);
                    let c = &initializers[&original.input[2]];
                    let values: Vec<f32> = bias.iter().map(|v| v * beta).collect();
                    added.push(floats(bias_name.clone(), c.dims.clone(), &values));
                }
                nodes.push(node("Add", vec![scaled, bias_name], out));
            }
            (Some(c), None) => {
                // A computed C (Gemm only, with beta 1, as `sites` allows).
                nodes.push(node("Mul", vec![float_out, scale_name], scaled.clone()));
                nodes.push(node("Add", vec![scaled, c.clone()], out));
            }
        }
    }
    graph.node = nodes;
    graph.initializer.extend(added);
    prune(&mut graph);
    Some(storage.with_graph(graph).encode_to_vec())
}

/// Drops nodes whose outputs nothing uses and initializers no node uses (the
/// dequantization of weights that now feed integer ops directly); a branch's or loop
/// body's reads of the graph around it count as uses.
fn prune(graph: &mut GraphProto) {
    loop {
        let used: HashSet<String> = graph
            .node
            .iter()
            .flat_map(|n| node_reads(n).into_iter().map(str::to_string))
            .chain(graph.output.iter().map(|o| o.name.clone()))
            .collect();
        let before = graph.node.len();
        graph
            .node
            .retain(|n| n.output.iter().any(|o| used.contains(o)) || n.output.is_empty());
        if graph.node.len() == before {
            graph.initializer.retain(|t| used.contains(&t.name));
            let initializer_names: HashSet<&str> =
                graph.initializer.iter().map(|t| t.name.as_str()).collect();
            let unused_inputs: HashSet<String> = graph
                .input
                .iter()
                .filter(|i| !used.contains(&i.name) && initializer_names.contains(i.name.as_str()))
                .map(|i| i.name.clone())
                .collect();
            graph.input.retain(|i| !unused_inputs.contains(&i.name));
            return;
        }
    }
}

/// Tries the compute form of the int8-storage file `storage` (see the module).
/// `rows` are the validation rows (calibration and agreement), run for calibration on
/// `calibration_form` when given (the same graph with every input dimension a size or
/// a name, for a one-input model whose file leaves them unknown), else on `storage`;
/// `time` loads a file as
/// the agent would and returns its median time for one row in ms, running it at most
/// `runs` times (the first run a warm-up); `agrees` loads it and measures every row
/// under the int8 rule, returning whether it passes and its min cosine. Returns the
/// compute file when it is what should ship, and the report either way; an error in
/// the attempt is reported, never fatal to the storage form.
pub fn choose(
    name: &str,
    storage: &[u8],
    calibration_form: Option<&[u8]>,
    rows: &[HashMap<String, NamedTensor>],
    mut time: impl FnMut(&[u8], usize) -> Result<f64, RuntimeError>,
    mut agrees: impl FnMut(&[u8]) -> Result<(bool, f64), RuntimeError>,
) -> (Option<Vec<u8>>, ComputeReport) {
    let mut report = ComputeReport {
        sites: 0,
        calibration_rows: rows.len(),
        storage_ms: None,
        compute_ms: None,
        min_cosine: None,
        chosen: false,
        reason: String::new(),
    };
    let attempt = (|| -> Result<Option<Vec<u8>>, RuntimeError> {
        let graph = OnnxGraph::parse(name, storage)?;
        report.sites = sites(graph.graph()).len();
        if report.sites == 0 {
            report.reason = "int8 compute: no MatMul or Conv with an int8 weight to run in int8; int8 storage only".into();
            return Ok(None);
        }
        if rows.is_empty() {
            report.reason =
                "int8 compute: no validation row to calibrate activations on; int8 storage only"
                    .into();
            return Ok(None);
        }
        let ranges = match calibration_form {
            Some(bytes) => calibrate(name, &OnnxGraph::parse(name, bytes)?, rows)?,
            None => calibrate(name, &graph, rows)?,
        };
        let Some(compute) = rewrite(&graph, &ranges) else {
            report.reason =
                "int8 compute: no activation range was measured; int8 storage only".into();
            return Ok(None);
        };
        let storage_ms = time(storage, 1 + TIMED_RUNS)?;
        report.storage_ms = Some(storage_ms);
        // One run first, cold: a form several times slower than the storage form's warm
        // median is known to be slower without paying for more of its runs.
        let first = time(&compute, 1)?;
        let compute_ms = if first > 3.0 * storage_ms {
            first
        } else {
            time(&compute, 1 + TIMED_RUNS)?
        };
        report.compute_ms = Some(compute_ms);
        if compute_ms >= FASTER_THAN * storage_ms {
            report.reason = format!(
                "int8 compute ({} MatMul/Gemm/Conv, activations calibrated on {} rows): {:.1}× the time of f32 compute here ({} vs {} ms a row), so int8 storage only",
                report.sites,
                rows.len(),
                compute_ms / storage_ms,
                ms(compute_ms),
                ms(storage_ms)
            );
            return Ok(None);
        }
        let (passes, min_cosine) = agrees(&compute)?;
        report.min_cosine = Some(min_cosine);
        if !passes {
            report.reason = format!(
                "int8 compute ({} MatMul/Gemm/Conv): {:.2}× faster here but its outputs disagree with fp32 (min cosine {min_cosine:.4}), so int8 storage only",
                report.sites,
                storage_ms / compute_ms
            );
            return Ok(None);
        }
        report.chosen = true;
        report.reason = format!(
            "int8 compute ({} MatMul/Gemm/Conv, activations calibrated on {} rows): {:.2}× faster than f32 here ({} vs {} ms a row), min cosine {min_cosine:.4}",
            report.sites,
            rows.len(),
            storage_ms / compute_ms,
            ms(compute_ms),
            ms(storage_ms)
        );
        Ok(Some(compute))
    })();
    match attempt {
        Ok(file) => (file, report),
        Err(error) => {
            report.reason = format!("int8 compute could not be tried ({error}); int8 storage only");
            (None, report)
        }
    }
}

/// A time in ms with the digits it needs (0.006, 3.1, 163).
fn ms(value: f64) -> String {
    if value < 1.0 {
        format!("{value:.3}")
    } else if value < 100.0 {
        format!("{value:.1}")
    } else {
        format!("{value:.0}")
    }
}

/// Median of `runs − 1` timed runs of `run` after one warm-up (one run: its own time).
pub fn median_ms(
    runs: usize,
    mut run: impl FnMut() -> Result<(), RuntimeError>,
) -> Result<f64, RuntimeError> {
    let runs = runs.max(1);
    let mut times = Vec::with_capacity(runs);
    for k in 0..runs {
        let start = std::time::Instant::now();
        run()?;
        if k > 0 || runs == 1 {
            times.push(start.elapsed().as_secs_f64() * 1e3);
        }
    }
    times.sort_by(f64::total_cmp);
    Ok(times[times.len() / 2])
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// Every value of the range maps into 0..=255 and back within half a step, and
        /// zero is exact.
        #[test]
        fn uint8_params_cover_the_range_and_keep_zero_exact(
            lo in -1e4f32..1e4, width in 0f32..1e4,
        ) {
            let hi = lo + width;
            let (scale, zero) = uint8_params(lo, hi);
            prop_assert!(scale > 0.0 && scale.is_finite());
            let quantize = |x: f32| ((x / scale).round() + zero as f32).clamp(0.0, 255.0);
            let back = |q: f32| (q - zero as f32) * scale;
            prop_assert_eq!(back(quantize(0.0)), 0.0);
            for x in [lo.min(0.0), hi.max(0.0), (lo + hi) / 2.0] {
                prop_assert!((back(quantize(x)) - x).abs() <= 0.51 * scale + 1e-3 * x.abs().max(1.0));
            }
        }
    }

    fn mlp_storage() -> (Vec<u8>, Vec<HashMap<String, NamedTensor>>) {
        let full = crate::input_spec::prepare(
            "mlp",
            &crate::synthetic::dense_mlp(32, 64, 2, 10, 7),
            &["input=N,32:f32".parse().expect("spec")],
        )
        .expect("typed")
        .into_owned();
        let (storage, _) = OnnxGraph::parse("mlp", &full)
            .expect("parses")
            .quantize_weights_int8()
            .expect("quantized");
        let mut state = 11u64;
        let rows = (0..8)
            .map(|_| {
                let data = (0..32)
                    .map(|_| {
                        state = state.wrapping_mul(6364136223846793005).wrapping_add(1);
                        ((state >> 11) as f64 / (1u64 << 53) as f64) * 2.0 - 1.0
                    })
                    .collect();
                HashMap::from([(
                    "input".to_string(),
                    NamedTensor {
                        dtype: "f32".into(),
                        shape: vec![1, 32],
                        data,
                    },
                )])
            })
            .collect();
        (storage, rows)
    }

    fn ops(bytes: &[u8]) -> Vec<String> {
        let graph = OnnxGraph::parse("m", bytes).expect("parses");
        graph
            .graph()
            .node
            .iter()
            .map(|n| n.op_type.clone())
            .collect()
    }

    fn cos(a: &[f64], b: &[f64]) -> f64 {
        let dot: f64 = a.iter().zip(b).map(|(x, y)| x * y).sum();
        dot / (a.iter().map(|x| x * x).sum::<f64>().sqrt()
            * b.iter().map(|x| x * x).sum::<f64>().sqrt())
    }

    #[test]
    fn the_compute_form_of_an_mlp_runs_its_matmuls_in_int8_and_agrees_with_storage() {
        let (storage, rows) = mlp_storage();
        let graph = OnnxGraph::parse("mlp", &storage).expect("parses");
        assert_eq!(sites(graph.graph()).len(), 3);
        let ranges = calibrate("mlp", &graph, &rows).expect("calibrated");
        assert_eq!(ranges.len(), 3, "{ranges:?}");
        assert!(ranges.values().all(|(lo, hi)| lo <= hi));
        let compute = rewrite(&graph, &ranges).expect("rewritten");
        let kinds = ops(&compute);
        assert_eq!(
            kinds.iter().filter(|k| *k == "MatMulInteger").count(),
            3,
            "{kinds:?}"
        );
        assert!(!kinds.iter().any(|k| k == "MatMul"), "{kinds:?}");
        // The weights' own dequantization is gone: the only Casts left turn the int32
        // products into floats, one per integer op.
        assert_eq!(
            kinds.iter().filter(|k| *k == "Cast").count(),
            3,
            "{kinds:?}"
        );
        let f32_model = GraphModel::load("mlp/storage", &storage).expect("storage loads");
        let int8_model = GraphModel::load("mlp/compute", &compute).expect("compute loads");
        for row in &rows {
            let a = &f32_model.run(row).expect("runs")["logits"].data;
            let b = &int8_model.run(row).expect("runs")["logits"].data;
            assert!(cos(a, b) > 0.99, "{a:?} vs {b:?}");
        }
    }

    #[test]
    fn compute_ships_only_when_it_is_faster_and_agrees() {
        let (storage, rows) = mlp_storage();
        let is_compute = |bytes: &[u8]| ops(bytes).iter().any(|k| k == "MatMulInteger");
        // Slower: storage only, and the compute form is not measured for agreement.
        let (file, report) = choose(
            "mlp",
            &storage,
            None,
            &rows,
            |bytes, _| Ok(if is_compute(bytes) { 40.0 } else { 1.0 }),
            |_| panic!("a slower form is not measured"),
        );
        assert!(file.is_none() && !report.chosen, "{report:?}");
        assert_eq!(report.compute_ms, Some(40.0));
        assert!(
            report.reason.contains("40.0×") && report.reason.contains("storage only"),
            "{}",
            report.reason
        );
        // Faster but disagreeing: storage only, saying so.
        let (file, report) = choose(
            "mlp",
            &storage,
            None,
            &rows,
            |bytes, _| Ok(if is_compute(bytes) { 0.5 } else { 1.0 }),
            |_| Ok((false, 0.95)),
        );
        assert!(file.is_none() && !report.chosen);
        assert!(report.reason.contains("disagree"), "{}", report.reason);
        // Faster and agreeing: the compute file ships.
        let (file, report) = choose(
            "mlp",
            &storage,
            None,
            &rows,
            |bytes, _| Ok(if is_compute(bytes) { 0.5 } else { 1.0 }),
            |_| Ok((true, 0.999)),
        );
        assert!(report.chosen, "{report:?}");
        assert!(file.is_some_and(|f| is_compute(&f)));
        // No rows: nothing to calibrate on.
        let (file, report) = choose(
            "mlp",
            &storage,
            None,
            &[],
            |_, _| Ok(1.0),
            |_| Ok((true, 1.0)),
        );
        assert!(file.is_none() && report.reason.contains("no validation row"));
    }

    #[test]
    fn a_constant_activation_gets_a_usable_scale() {
        assert_eq!(uint8_params(0.0, 0.0), (1.0, 0));
        let (scale, zero) = uint8_params(2.0, 2.0);
        assert!(scale > 0.0);
        assert_eq!(zero, 0);
    }
}
