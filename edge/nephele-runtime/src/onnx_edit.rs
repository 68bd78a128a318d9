//! Rewriting ONNX files into the variants the control plane ships: an int8 weight
//! variant and head/tail pairs split at a cut tensor.
//!
//! Everything here works on the ONNX protobuf itself (tract-onnx's `pb` types), so the
//! variants are ordinary ONNX files that any ONNX runtime loads, not tract-only plans.
//!
//! - **int8 weights** ([`OnnxGraph::quantize_weights_int8`]): every large float
//!   initializer is stored as symmetric int8 with one scale per output channel and
//!   turned back into f32 in the graph (`Cast` to float, then `Mul` by the scales). The
//!   file is about 4× smaller. Optimisation folds the two nodes into a constant, so the
//!   variant *computes* in f32 at exactly the speed of the original: int8 here buys size
//!   (download, flash, memory of the artifact), not speed. Whether outputs still agree
//!   with fp32 is measured by the caller ([`crate::variants`]), never assumed.
//! - **split** ([`OnnxGraph::split`]): the *head* is every node the cut tensor depends
//!   on, with the cut as its only output; the *tail* is every other node, with the cut
//!   as its only input. A tensor is a valid cut only when nothing in the tail needs
//!   anything from the head side except the cut itself ([`OnnxGraph::candidate_cuts`]).
//!
//! int8 *compute* (activations quantized too, calibrated on the validation rows) is
//! [`crate::int8_compute`], tried on top of this storage form and shipped only where it
//! measures faster. Not here: graphs with external data files.

use std::collections::{BTreeSet, HashMap, HashSet};

use prost::Message;
use tract_onnx::pb::{
    attribute_proto::AttributeType, tensor_proto::DataType, tensor_shape_proto, type_proto,
    AttributeProto, GraphProto, ModelProto, NodeProto, TensorProto, TensorShapeProto, TypeProto,
    ValueInfoProto,
};

use crate::graph_index::{node_reads, rename_outer_reads};
use crate::RuntimeError;

/// Float initializers with fewer elements than this stay f32 (small biases, shapes,
/// scalars): in a small model their bytes still count, in a large one they are noise,
/// and below this size a scale and two nodes would cost more than they save.
pub const MIN_QUANTIZED_ELEMENTS: usize = 64;

/// A parsed ONNX model that can be rewritten.
#[derive(Debug, Clone)]
pub struct OnnxGraph {
    name: String,
    /// The model without its graph (opsets, IR version, metadata).
    model: ModelProto,
    graph: GraphProto,
}

/// What int8 quantization did, for the manifest.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct QuantizationReport {
    /// Initializers stored as int8.
    pub quantized_tensors: usize,
    /// Their elements.
    pub quantized_elements: u64,
    /// Float elements left as f32 (small tensors).
    pub kept_f32_elements: u64,
    /// Largest |w − dequantized(w)| over all quantized weights.
    pub max_abs_weight_error: f32,
    /// Every quantized weight with its relative error ‖w − dq(w)‖ / ‖w‖, largest first:
    /// the order in which mixed precision keeps tensors in f32.
    #[serde(default)]
    pub relative_errors: Vec<(String, f32)>,
    /// Weights kept in f32 so that the variant's outputs agree with fp32 (mixed
    /// precision), with their relative error as int8.
    #[serde(default)]
    pub kept_for_accuracy: Vec<(String, f32)>,
    /// Whether the variant also computes in int8, as measured
    /// ([`crate::int8_compute::choose`]); `None` when it was not tried.
    #[serde(default)]
    pub compute: Option<crate::int8_compute::ComputeReport>,
}

impl OnnxGraph {
    /// Parses an ONNX file. `name` is used in errors.
    pub fn parse(name: &str, bytes: &[u8]) -> Result<Self, RuntimeError> {
        let mut model = ModelProto::decode(bytes).map_err(|e| RuntimeError::Load {
            model: name.to_string(),
            cause: format!("not an ONNX protobuf: {e}"),
        })?;
        let graph = model.graph.take().ok_or_else(|| RuntimeError::Load {
            model: name.to_string(),
            cause: "the ONNX file has no graph".into(),
        })?;
        if graph.node.is_empty() {
            return Err(RuntimeError::Unsupported {
                model: name.to_string(),
                cause: "the graph has no nodes".into(),
            });
        }
        if graph
            .initializer
            .iter()
            .any(|t| !t.external_data.is_empty())
        {
            return Err(RuntimeError::Unsupported {
                model: name.to_string(),
                cause: "weights in external data files are not supported; embed them".into(),
            });
        }
        Ok(OnnxGraph {
            name: name.to_string(),
            model,
            graph: lift_constants(graph),
        })
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub(crate) fn graph(&self) -> &GraphProto {
        &self.graph
    }

    pub(crate) fn with_graph(&self, graph: GraphProto) -> ModelProto {
        ModelProto {
            graph: Some(graph),
            ..self.model.clone()
        }
    }

    fn unsupported(&self, cause: String) -> RuntimeError {
        RuntimeError::Unsupported {
            model: self.name.clone(),
            cause,
        }
    }

    /// The encoded model.
    pub fn to_bytes(&self) -> Vec<u8> {
        self.with_graph(self.graph.clone()).encode_to_vec()
    }

    /// Names of the graph's real inputs (not initializers listed as inputs).
    pub(crate) fn real_inputs(&self) -> Vec<&ValueInfoProto> {
        let graph = self.graph();
        let initializers: HashSet<&str> =
            graph.initializer.iter().map(|t| t.name.as_str()).collect();
        graph
            .input
            .iter()
            .filter(|i| !initializers.contains(i.name.as_str()))
            .collect()
    }

    /// Indices of the nodes `tensor` depends on (itself included), in graph order.
    fn ancestors(&self, tensor: &str) -> BTreeSet<usize> {
        let graph = self.graph();
        let producer: HashMap<&str, usize> = graph
            .node
            .iter()
            .enumerate()
            .flat_map(|(i, n)| n.output.iter().map(move |o| (o.as_str(), i)))
            .collect();
        let mut seen = BTreeSet::new();
        let mut stack: Vec<&str> = vec![tensor];
        while let Some(name) = stack.pop() {
            if let Some(&node_idx) = producer.get(name) {
                if seen.insert(node_idx) {
                    stack.extend(node_reads(&graph.node[node_idx]));
                }
            }
        }
        seen
    }

    /// Why `cut` cannot split the graph in two, or `None` when it can.
    fn cut_problem(&self, cut: &str) -> Option<String> {
        let graph = self.graph();
        let head = self.ancestors(cut);
        if head.is_empty() {
            return Some(format!("no node produces tensor {cut:?}"));
        }
        if head.len() == graph.node.len() {
            return Some(format!(
                "{cut:?} is computed by the last node: nothing is left for the tail"
            ));
        }
        if graph.output.iter().any(|o| o.name == cut) {
            return Some(format!("{cut:?} is a graph output"));
        }
        let head_tensors: HashSet<&str> = head
            .iter()
            .flat_map(|&i| graph.node[i].output.iter().map(String::as_str))
            .collect();
        let inputs: HashSet<&str> = self.real_inputs().iter().map(|i| i.name.as_str()).collect();
        for (node_idx, node) in graph.node.iter().enumerate() {
            if head.contains(&node_idx) {
                continue;
            }
            for input in node_reads(node) {
                if input != cut && head_tensors.contains(input) {
                    return Some(format!(
                        "node {:?} after the cut also needs {input:?} from before it",
                        node.name
                    ));
                }
                if inputs.contains(input) {
                    return Some(format!(
                        "node {:?} after the cut reads the model input {input:?}",
                        node.name
                    ));
                }
            }
        }
        if graph
            .output
            .iter()
            .any(|o| head_tensors.contains(o.name.as_str()))
        {
            return Some("a graph output is computed before the cut".into());
        }
        None
    }

    /// Tensors that split the graph into a head and a tail with exactly one tensor
    /// between them, in graph order (earliest first). The model's input and outputs are
    /// never cuts; `split` at 0 or all layers is "all remote" or "all local" and needs no
    /// file of its own.
    pub fn candidate_cuts(&self) -> Vec<String> {
        let mut seen = HashSet::new();
        self.graph()
            .node
            .iter()
            .flat_map(|n| n.output.iter())
            .filter(|o| !o.is_empty() && seen.insert(o.as_str()))
            .filter(|o| self.cut_problem(o).is_none())
            .cloned()
            .collect()
    }

    /// Splits at `cut` into (head, tail) ONNX files. The head's output and the tail's
    /// input are named `cut`; the tail's input shape is `cut_shape` (`-1` for a
    /// symbolic dimension, written as `N`), which the caller gets by typing the head.
    pub fn split(&self, cut: &str, cut_shape: &[i64]) -> Result<(Vec<u8>, Vec<u8>), RuntimeError> {
        if let Some(problem) = self.cut_problem(cut) {
            return Err(self.unsupported(format!("cannot split at {cut:?}: {problem}")));
        }
        let graph = self.graph();
        let head_nodes = self.ancestors(cut);
        let (mut head, mut tail) = (Vec::new(), Vec::new());
        for (i, node) in graph.node.iter().enumerate() {
            if head_nodes.contains(&i) {
                head.push(node.clone());
            } else {
                tail.push(node.clone());
            }
        }
        let cut_value = |shape: Option<&[i64]>| ValueInfoProto {
            name: cut.to_string(),
            r#type: Some(float_type(shape)),
            doc_string: String::new(),
        };
        let head_graph = GraphProto {
            name: format!("{}-head", graph.name),
            initializer: used_initializers(graph, &head),
            input: self.real_inputs().into_iter().cloned().collect(),
            output: vec![cut_value(None)],
            node: head,
            ..GraphProto::default()
        };
        let tail_graph = GraphProto {
            name: format!("{}-tail", graph.name),
            initializer: used_initializers(graph, &tail),
            input: vec![cut_value(Some(cut_shape))],
            output: graph.output.clone(),
            node: tail,
            ..GraphProto::default()
        };
        Ok((
            self.with_graph(head_graph).encode_to_vec(),
            self.with_graph(tail_graph).encode_to_vec(),
        ))
    }

    /// The head alone (for typing the cut before the tail is written).
    pub fn head(&self, cut: &str) -> Result<Vec<u8>, RuntimeError> {
        self.split(cut, &[]).map(|(head, _)| head)
    }

    /// Stores every weight and embedding table (see `channel_axes` for the roles)
    /// of at least [`MIN_QUANTIZED_ELEMENTS`] elements as symmetric int8, with one
    /// scale per output channel where the layout is known, dequantized in the graph.
    pub fn quantize_weights_int8(&self) -> Result<(Vec<u8>, QuantizationReport), RuntimeError> {
        self.quantize_weights_int8_keeping(&HashSet::new())
    }

    /// [`Self::quantize_weights_int8`], keeping the initializers named in `keep` in f32
    /// (mixed precision: the tensors whose int8 error hurts the outputs).
    pub fn quantize_weights_int8_keeping(
        &self,
        keep: &HashSet<String>,
    ) -> Result<(Vec<u8>, QuantizationReport), RuntimeError> {
        // BatchNormalization after a Conv is folded into the Conv's weights and bias
        // first: its statistics then travel inside int8 weights instead of as f32, and
        // the runtime has one node less. Outputs change only by float rounding, and the
        // variant is measured against the full model anyway.
        let mut folded = self.graph().clone();
        crate::fold_affine::fold_in_graph(&mut folded);
        let graph = &folded;
        let axes = channel_axes(graph);
        let mut report = QuantizationReport {
            quantized_tensors: 0,
            quantized_elements: 0,
            kept_f32_elements: 0,
            max_abs_weight_error: 0.0,
            relative_errors: Vec::new(),
            kept_for_accuracy: Vec::new(),
            compute: None,
        };
        let mut initializers = Vec::with_capacity(graph.initializer.len());
        let mut dequantize_nodes = Vec::new();
        let mut quantized_names = HashSet::new();
        for tensor in &graph.initializer {
            if tensor.data_type != DataType::Float as i32 {
                initializers.push(tensor.clone());
                continue;
            }
            let values = float_values(tensor).map_err(|cause| {
                self.unsupported(format!("initializer {:?}: {cause}", tensor.name))
            })?;
            let Some(&role_axis) = axes.get(tensor.name.as_str()) else {
                report.kept_f32_elements += values.len() as u64;
                initializers.push(tensor.clone());
                continue;
            };
            // A tensor with infinities (attention masks, `-inf` fill values) or NaNs has no
            // int8 scale: kept in f32, as a small one is.
            if values.len() < MIN_QUANTIZED_ELEMENTS || values.iter().any(|v| !v.is_finite()) {
                report.kept_f32_elements += values.len() as u64;
                initializers.push(tensor.clone());
                continue;
            }
            let dims: Vec<usize> = tensor.dims.iter().map(|d| (*d).max(0) as usize).collect();
            let axis = role_axis.filter(|a| *a < dims.len());
            let (quantized, scales, error) = quantize(&values, &dims, axis);
            let relative = relative_error(&values, &quantized, &scales, &dims, axis);
            if keep.contains(&tensor.name) {
                report.kept_f32_elements += values.len() as u64;
                report
                    .kept_for_accuracy
                    .push((tensor.name.clone(), relative));
                initializers.push(tensor.clone());
                continue;
            }
            report.relative_errors.push((tensor.name.clone(), relative));
            report.max_abs_weight_error = report.max_abs_weight_error.max(error);
            report.quantized_tensors += 1;
            report.quantized_elements += values.len() as u64;
            // Short suffixes: in a small model the names are a visible share of the file.
            let q_name = format!("{}:q", tensor.name);
            let cast_name = format!("{}:f", tensor.name);
            let scale_name = format!("{}:s", tensor.name);
            initializers.push(TensorProto {
                name: q_name.clone(),
                dims: tensor.dims.clone(),
                data_type: DataType::Int8 as i32,
                raw_data: quantized.iter().map(|v| *v as u8).collect(),
                ..TensorProto::default()
            });
            let scale_dims: Vec<i64> = match axis {
                Some(axis) => (0..dims.len())
                    .map(|d| if d == axis { dims[d] as i64 } else { 1 })
                    .collect(),
                None => Vec::new(),
            };
            initializers.push(TensorProto {
                name: scale_name.clone(),
                dims: scale_dims,
                data_type: DataType::Float as i32,
                raw_data: scales.iter().flat_map(|s| s.to_le_bytes()).collect(),
                ..TensorProto::default()
            });
            dequantize_nodes.push(NodeProto {
                name: format!("{}:dq", tensor.name),
                op_type: "Cast".into(),
                input: vec![q_name],
                output: vec![cast_name.clone()],
                attribute: vec![AttributeProto {
                    name: "to".into(),
                    r#type: AttributeType::Int as i32,
                    i: DataType::Float as i64,
                    ..AttributeProto::default()
                }],
                ..NodeProto::default()
            });
            dequantize_nodes.push(NodeProto {
                name: format!("{}:ds", tensor.name),
                op_type: "Mul".into(),
                input: vec![cast_name, scale_name],
                output: vec![tensor.name.clone()],
                ..NodeProto::default()
            });
            quantized_names.insert(tensor.name.clone());
        }
        report
            .relative_errors
            .sort_by(|a, b| b.1.total_cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
        report
            .kept_for_accuracy
            .sort_by(|a, b| b.1.total_cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
        let mut nodes = dequantize_nodes;
        nodes.extend(graph.node.iter().cloned());
        let new_graph = GraphProto {
            node: nodes,
            initializer: initializers,
            // Old exporters also list initializers as inputs; a quantized one is now
            // computed, so it must not be an input any more.
            input: graph
                .input
                .iter()
                .filter(|i| !quantized_names.contains(&i.name))
                .cloned()
                .collect(),
            ..graph.clone()
        };
        Ok((
            self.with_graph(minify_names(new_graph)).encode_to_vec(),
            report,
        ))
    }
}

/// Renames every internal tensor and node to a short id and drops doc strings: the int8
/// variant is a transport artifact, and in a small CNN its names were a tenth of the
/// file. The graph's inputs and outputs keep their names (clients and splits use them);
/// the full variant keeps every original name for debugging.
fn minify_names(mut graph: GraphProto) -> GraphProto {
    let keep: HashSet<String> = graph
        .input
        .iter()
        .chain(graph.output.iter())
        .map(|v| v.name.clone())
        .collect();
    let mut names: HashMap<String, String> = HashMap::new();
    let mut rename = |name: &mut String| {
        if name.is_empty() || keep.contains(name.as_str()) {
            return;
        }
        let next = names.len();
        let short = names
            .entry(name.clone())
            .or_insert_with(|| format!("{next:x}"))
            .clone();
        *name = short;
    };
    for tensor in &mut graph.initializer {
        rename(&mut tensor.name);
        tensor.doc_string.clear();
    }
    for (index, node) in graph.node.iter_mut().enumerate() {
        node.input.iter_mut().for_each(&mut rename);
        node.output.iter_mut().for_each(&mut rename);
        node.name = format!("n{index:x}");
        node.doc_string.clear();
    }
    for value in &mut graph.value_info {
        rename(&mut value.name);
    }
    // A branch or loop body reads the graph's values by name: the same new names.
    for node in &mut graph.node {
        rename_outer_reads(node, &names);
    }
    graph.doc_string.clear();
    graph
}

/// `Constant` nodes holding a tensor become initializers (some exporters, PaddlePaddle's
/// among them, store every weight that way). The graph computes the same; weights are
/// then where quantization looks for them, and a cut is not blocked by a constant that
/// the head would otherwise have to hand over.
fn lift_constants(mut graph: GraphProto) -> GraphProto {
    let mut kept = Vec::with_capacity(graph.node.len());
    let outputs: HashSet<String> = graph.output.iter().map(|o| o.name.clone()).collect();
    for node in std::mem::take(&mut graph.node) {
        let tensor = (node.op_type == "Constant"
            && node.domain.is_empty()
            && node.output.len() == 1
            && !outputs.contains(&node.output[0])
            && node.attribute.len() == 1)
            .then(|| node.attribute.first())
            .flatten()
            .filter(|a| a.name == "value")
            .and_then(|a| a.t.clone());
        match tensor {
            Some(mut tensor) => {
                tensor.name = node.output[0].clone();
                graph.initializer.push(tensor);
            }
            None => kept.push(node),
        }
    }
    graph.node = kept;
    graph
}

/// Folds the `Cast(int8) × scale` pairs that [`OnnxGraph::quantize_weights_int8`] writes
/// back into f32 initializers: the int8 file is how a variant travels and is stored,
/// and this is what the runtime loads (tract does not fold them, and re-dequantising
/// every weight on every run measured slower than fp32). Returns the rewritten model,
/// or `None` when there is nothing to fold.
pub fn dequantize_weights(name: &str, bytes: &[u8]) -> Result<Option<Vec<u8>>, RuntimeError> {
    let parsed = OnnxGraph::parse(name, bytes)?;
    let mut graph = parsed.graph.clone();
    let initializers: HashMap<String, TensorProto> = graph
        .initializer
        .iter()
        .map(|t| (t.name.clone(), t.clone()))
        .collect();
    let casts: HashMap<String, String> = graph
        .node
        .iter()
        .filter(|n| n.op_type == "Cast" && n.input.len() == 1 && n.output.len() == 1)
        .filter(|n| {
            initializers
                .get(&n.input[0])
                .is_some_and(|t| t.data_type == DataType::Int8 as i32)
        })
        .map(|n| (n.output[0].clone(), n.input[0].clone()))
        .collect();
    let mut folded: Vec<TensorProto> = Vec::new();
    let mut dropped_nodes: HashSet<String> = HashSet::new();
    for node in &graph.node {
        if node.op_type != "Mul" || node.input.len() != 2 || node.output.len() != 1 {
            continue;
        }
        let (Some(q_name), Some(scale)) =
            (casts.get(&node.input[0]), initializers.get(&node.input[1]))
        else {
            continue;
        };
        let Some(q) = initializers.get(q_name) else {
            continue;
        };
        let Ok(scales) = float_values(scale) else {
            continue;
        };
        let dims: Vec<usize> = q.dims.iter().map(|d| (*d).max(0) as usize).collect();
        let count: usize = dims.iter().product();
        if q.raw_data.len() != count {
            continue;
        }
        // One scale, or one per index of the single axis whose scale dim is not 1.
        let axis = scale.dims.iter().position(|d| *d != 1);
        let stride_channels = match axis {
            None if scales.len() == 1 => Some((1usize, 1usize)),
            Some(axis) if scale.dims.len() == dims.len() && scales.len() == dims[axis] => Some((
                dims[axis + 1..].iter().product::<usize>().max(1),
                dims[axis].max(1),
            )),
            _ => None,
        };
        let Some((stride, channels)) = stride_channels else {
            continue;
        };
        let values: Vec<u8> = q
            .raw_data
            .iter()
            .enumerate()
            .flat_map(|(i, b)| {
                let scale = scales[(i / stride) % channels];
                (f32::from(*b as i8) * scale).to_le_bytes()
            })
            .collect();
        folded.push(TensorProto {
            name: node.output[0].clone(),
            dims: q.dims.clone(),
            data_type: DataType::Float as i32,
            raw_data: values,
            ..TensorProto::default()
        });
        dropped_nodes.insert(node.output[0].clone());
        dropped_nodes.insert(node.input[0].clone());
    }
    if folded.is_empty() {
        return Ok(None);
    }
    graph
        .node
        .retain(|n| !n.output.iter().any(|o| dropped_nodes.contains(o)));
    let still_used: HashSet<&str> = graph
        .node
        .iter()
        .flat_map(node_reads)
        .chain(graph.output.iter().map(|o| o.name.as_str()))
        .collect();
    let folded_names: HashSet<String> = folded.iter().map(|t| t.name.clone()).collect();
    graph
        .initializer
        .retain(|t| still_used.contains(t.name.as_str()) && !folded_names.contains(&t.name));
    graph.initializer.extend(folded);
    Ok(Some(parsed.with_graph(graph).encode_to_vec()))
}

fn float_type(shape: Option<&[i64]>) -> TypeProto {
    TypeProto {
        value: Some(type_proto::Value::TensorType(type_proto::Tensor {
            elem_type: DataType::Float as i32,
            shape: shape.map(|dims| TensorShapeProto {
                dim: dims
                    .iter()
                    .map(|d| tensor_shape_proto::Dimension {
                        denotation: String::new(),
                        value: Some(if *d >= 0 {
                            tensor_shape_proto::dimension::Value::DimValue(*d)
                        } else {
                            tensor_shape_proto::dimension::Value::DimParam("N".into())
                        }),
                    })
                    .collect(),
            }),
        })),
        denotation: String::new(),
    }
}

/// The initializers `nodes` read, in the original order.
fn used_initializers(graph: &GraphProto, nodes: &[NodeProto]) -> Vec<TensorProto> {
    let used: HashSet<&str> = nodes.iter().flat_map(node_reads).collect();
    graph
        .initializer
        .iter()
        .filter(|t| used.contains(t.name.as_str()))
        .cloned()
        .collect()
}

fn int_attr(node: &NodeProto, name: &str) -> Option<i64> {
    node.attribute.iter().find(|a| a.name == name).map(|a| a.i)
}

/// Which initializers are weights, and the axis of their output channels: one scale
/// per output channel keeps a channel with small weights from being rounded away by a
/// channel with large ones. Only tensors in a known role are quantized: normalisation
/// statistics, scales and shapes stay f32 (quantizing a BatchNormalization variance
/// with one scale for the tensor turned the PP-OCR classifier's outputs to noise).
///
/// | consumer                 | role       | layout           | scales             |
/// |--------------------------|------------|------------------|--------------------|
/// | Gemm B, transB = 0       | weight     | [K, N]           | per channel, axis 1 |
/// | Gemm B, transB = 1       | weight     | [N, K]           | per channel, axis 0 |
/// | MatMul B                 | weight     | [..., K, N]      | per channel, last  |
/// | Conv / ConvTranspose W   | weight     | [M, C/g, kH, kW] | axis 0 (1 for ConvT) |
/// | Gather data (embeddings) | table      | [rows, dim]      | one per row        |
/// | Gemm C, Conv B           | bias       | [N]              | stays f32          |
/// | anything else            |            |                  | stays f32          |
///
/// Biases stay f32, as weight-only quantizers leave them: they are a fraction of a
/// percent of a model, and one scale for a whole bias vector (a folded BatchNorm puts
/// each channel's mean and shift there) rounds small channels away. On PP-OCRv4's
/// recognizer, quantizing its 7,368 bias elements with the 2.67 M weight elements
/// lowered the min cosine to fp32 from 0.969 to 0.954 (onnxruntime, the pushed rows).
///
/// A tensor used in two roles is quantized only if both agree.
fn channel_axes(graph: &GraphProto) -> HashMap<&str, Option<usize>> {
    let ranks: HashMap<&str, usize> = graph
        .initializer
        .iter()
        .map(|t| (t.name.as_str(), t.dims.len()))
        .collect();
    // name -> Some(role) while every use agrees; None once a use disagrees.
    let mut roles: HashMap<&str, Option<Option<usize>>> = HashMap::new();
    for node in &graph.node {
        for (position, input) in node.input.iter().enumerate() {
            let Some(&rank) = ranks.get(input.as_str()) else {
                continue;
            };
            let role = match (node.op_type.as_str(), position) {
                ("Gemm", 1) if int_attr(node, "transB").unwrap_or(0) != 0 => Some(Some(0)),
                ("Gemm", 1) => Some(Some(1)),
                ("MatMul", 1) if rank >= 2 => Some(Some(rank - 1)),
                ("Conv", 1) => Some(Some(0)),
                ("ConvTranspose", 1) => Some(Some(1)),
                ("Gather", 0) if rank >= 2 => Some(Some(0)),
                ("Gemm", 2) | ("Conv", 2) | ("ConvTranspose", 2) => None,
                _ => None,
            };
            roles
                .entry(input.as_str())
                .and_modify(|r| {
                    if *r != role {
                        *r = None;
                    }
                })
                .or_insert(role);
        }
    }
    roles
        .into_iter()
        .filter_map(|(name, role)| role.map(|axis| (name, axis)))
        .collect()
}

/// The f32 values of a float initializer, from `raw_data` (little endian) or
/// `float_data`.
pub(crate) fn float_values(tensor: &TensorProto) -> Result<Vec<f32>, String> {
    let expected: i64 = tensor.dims.iter().product();
    let values: Vec<f32> = if !tensor.raw_data.is_empty() {
        if !tensor.raw_data.len().is_multiple_of(4) {
            return Err(format!(
                "{} raw bytes is not a whole number of f32",
                tensor.raw_data.len()
            ));
        }
        tensor
            .raw_data
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect()
    } else {
        tensor.float_data.clone()
    };
    if values.len() as i64 != expected {
        return Err(format!(
            "{} values for dims {:?} ({expected} expected)",
            values.len(),
            tensor.dims
        ));
    }
    Ok(values)
}

/// Symmetric int8 quantization along `axis` (per tensor when `None`). Returns the
/// values, the scales (one per channel, or one) and the largest absolute error.
fn quantize(values: &[f32], dims: &[usize], axis: Option<usize>) -> (Vec<i8>, Vec<f32>, f32) {
    // Element i's channel: (i / stride) % channels, stride = product of dims after axis.
    let (channels, stride) = match axis {
        Some(axis) => (
            dims[axis].max(1),
            dims[axis + 1..].iter().product::<usize>().max(1),
        ),
        None => (1, 1),
    };
    let channel_of = |i: usize| (i / stride) % channels;
    let mut max_abs = vec![0.0f32; channels];
    for (i, v) in values.iter().enumerate() {
        let c = channel_of(i);
        max_abs[c] = max_abs[c].max(v.abs());
    }
    let scales: Vec<f32> = max_abs
        .iter()
        .map(|m| if *m > 0.0 { m / 127.0 } else { 1.0 })
        .collect();
    let mut error = 0.0f32;
    let quantized = values
        .iter()
        .enumerate()
        .map(|(i, v)| {
            let scale = scales[channel_of(i)];
            let q = (v / scale).round().clamp(-127.0, 127.0) as i8;
            error = error.max((f32::from(q) * scale - v).abs());
            q
        })
        .collect();
    (quantized, scales, error)
}

/// ‖w − dequantized(w)‖ / ‖w‖ (0 for an all-zero tensor).
fn relative_error(
    values: &[f32],
    quantized: &[i8],
    scales: &[f32],
    dims: &[usize],
    axis: Option<usize>,
) -> f32 {
    let (channels, stride) = match axis {
        Some(axis) => (
            dims[axis].max(1),
            dims[axis + 1..].iter().product::<usize>().max(1),
        ),
        None => (1, 1),
    };
    let (mut err, mut norm) = (0.0f64, 0.0f64);
    for (i, (v, q)) in values.iter().zip(quantized).enumerate() {
        let scale = scales[(i / stride) % channels];
        let d = f64::from(f32::from(*q) * scale - v);
        err += d * d;
        norm += f64::from(*v) * f64::from(*v);
    }
    if norm == 0.0 {
        0.0
    } else {
        (err / norm).sqrt() as f32
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn per_channel_quantization_bounds_the_error_by_half_a_step() {
        // [K=2, N=3] with wildly different column magnitudes.
        let values = [1.0, 100.0, 0.01, -0.5, -50.0, 0.02];
        let (q, scales, error) = quantize(&values, &[2, 3], Some(1));
        assert_eq!(scales.len(), 3);
        assert_eq!(q[1], 127);
        // The small column gets its own scale, so it keeps full int8 resolution.
        assert_eq!(q[5], 127);
        assert!((63..=64).contains(&q[2]));
        for (c, scale) in scales.iter().enumerate() {
            for k in 0..2 {
                let i = k * 3 + c;
                assert!((f32::from(q[i]) * scale - values[i]).abs() <= scale / 2.0 + 1e-7);
            }
        }
        assert!(error <= 100.0 / 127.0 / 2.0 + 1e-6);
    }

    #[test]
    fn all_zero_weights_quantize_without_dividing_by_zero() {
        let (q, scales, error) = quantize(&[0.0; 8], &[8], None);
        assert!(q.iter().all(|v| *v == 0));
        assert_eq!(scales, vec![1.0]);
        assert_eq!(error, 0.0);
    }

    #[test]
    fn garbage_is_refused_with_the_model_name() {
        let error = OnnxGraph::parse("junk", b"\xff\xff\xff not protobuf").unwrap_err();
        assert!(error.to_string().contains("model junk"), "{error}");
        let empty = ModelProto::default().encode_to_vec();
        let error = OnnxGraph::parse("empty", &empty).unwrap_err();
        assert!(error.to_string().contains("no graph"), "{error}");
    }

    #[test]
    fn branches_reading_outer_names_survive_int8_and_split() {
        use crate::test_graphs::run;
        let full = crate::test_graphs::branch_reading_outer_names();
        let bytes = full.encode_to_vec();
        let graph = OnnxGraph::parse("verifier", &bytes).expect("parses");
        for sign in [1.0f32, -1.0] {
            let x: Vec<f32> = (0..16).map(|i| sign * (i as f32 / 8.0 + 0.1)).collect();
            let want = run(&full, &[1, 16], &x);
            // int8: the weights renamed inside, the branches' reads renamed with them,
            // and `b` (read only by the branches) kept.
            let (int8, report) = graph.quantize_weights_int8().expect("int8");
            assert_eq!(report.quantized_tensors, 1);
            let int8 = ModelProto::decode(&int8[..]).expect("decodes");
            let got = run(&int8, &[1, 16], &x);
            let error = got
                .iter()
                .zip(&want)
                .map(|(a, b)| (a - b).abs())
                .fold(0.0, f32::max);
            assert!(error < 0.05, "int8 differs by {error}");
            let folded = dequantize_weights("verifier", &int8.encode_to_vec())
                .expect("folds")
                .expect("something to fold");
            let folded = ModelProto::decode(&folded[..]).expect("decodes");
            assert_eq!(run(&folded, &[1, 16], &x).len(), 16);
            // Split at `h`: the tail's branches read `h` (the cut) and `b` (carried).
            let (head, tail) = graph.split("h", &[1, 16]).expect("splits at h");
            let head = ModelProto::decode(&head[..]).expect("head");
            let tail = ModelProto::decode(&tail[..]).expect("tail");
            let h = run(&head, &[1, 16], &x);
            assert_eq!(run(&tail, &[1, 16], &h), want);
        }
        // A cut after which a branch still reads `h` from before it is no cut.
        assert!(!graph.candidate_cuts().contains(&"s".to_string()));
        assert!(graph.candidate_cuts().contains(&"h".to_string()));
        let refused = graph.split("s", &[]).expect_err("s is no cut").to_string();
        assert!(refused.contains("needs \"h\" from before it"), "{refused}");
    }
}
