//! Per-channel scales and shifts next to a convolution, folded into its weights.
//!
//! A convolution followed by `BatchNormalization`, or by `Mul` and `Add` with constants
//! per output channel, computes what one convolution with scaled weights and a shifted
//! bias does; so does a convolution *preceded* by a scalar `Mul` or `Add` when it pads
//! nothing (a padded border would see the shift where the input has zeros). tract fuses
//! some of these into its matrix products' store, but not after a depthwise
//! convolution, nor before a convolution: there each is another pass over the whole
//! activation. PaddleOCR's exports have both (batch norms after depthwise layers in the
//! classifier; PP-OCRv4's "learnable affine" `Mul`/`Add` after every convolution and
//! activation in the detector and recognizer).
//!
//! Folded only when exact up to float rounding: the convolution's weights and bias are
//! constants, the value between the two nodes is read by the second alone (nowhere
//! else, not as an output of the graph), a batch norm is in inference form, and every
//! constant broadcasts along the output channels only. The folded weights are new
//! initializers; weights no node reads any more are dropped.

use std::collections::{HashMap, HashSet};

use tract_onnx::pb::{tensor_proto::DataType, GraphProto, ModelProto, NodeProto, TensorProto};

use crate::graph_index::{count_uses, is_onnx_domain, GraphIndex};
use crate::onnx_edit::float_values;

/// At most this many nodes are folded in one model.
pub const MAX_FOLDS: usize = 4096;

/// Folds every scale and shift it can into the convolutions next to them, in the main
/// graph. Returns how many nodes were folded away.
pub fn fold_affine_into_convs(model: &mut ModelProto) -> usize {
    match model.graph.as_mut() {
        Some(graph) => fold_in_graph(graph),
        None => 0,
    }
}

/// [`fold_affine_into_convs`] on a graph (the int8 variant also folds its batch norms
/// this way before quantizing, so their statistics travel inside the int8 weights).
pub fn fold_in_graph(graph: &mut GraphProto) -> usize {
    let mut folded = 0;
    let mut replaced: HashSet<String> = HashSet::new();
    while folded < MAX_FOLDS {
        let Some(fold) = Consts::new(graph).next_fold(graph) else {
            break;
        };
        apply(graph, fold, folded, &mut replaced);
        folded += 1;
    }
    drop_unread(graph, &replaced);
    folded
}

/// One fold: the convolution's new weights and bias, and how its wiring changes.
struct Fold {
    conv: usize,
    absorbed: usize,
    weights: Vec<f32>,
    /// The weights' dims, as the convolution's constant gives them.
    weight_dims: Vec<i64>,
    bias: Vec<f32>,
    /// A fold before the convolution: what it reads instead.
    new_input: Option<String>,
    /// A fold after it: the output it writes instead.
    new_output: Option<String>,
}

/// The graph's constants, who writes each value and how many times each is read.
struct Consts<'a> {
    index: GraphIndex<'a>,
}

impl<'a> Consts<'a> {
    fn new(graph: &'a GraphProto) -> Consts<'a> {
        Consts {
            index: GraphIndex::new(graph),
        }
    }

    /// The values of a float constant, with its dims.
    fn floats(&self, name: &str) -> Option<(Vec<f32>, Vec<i64>)> {
        let t = self.index.constants.get(name)?;
        if t.data_type != DataType::Float as i32 || t.dims.iter().any(|d| *d < 0) {
            return None;
        }
        float_values(t).ok().map(|v| (v, t.dims.clone()))
    }

    fn next_fold(&self, graph: &GraphProto) -> Option<Fold> {
        (0..graph.node.len()).find_map(|index| {
            self.fold_after(graph, index)
                .or_else(|| self.fold_before(graph, index))
        })
    }

    /// A convolution's weights (dims: out channels, in channels per group, kernel…) and
    /// bias (zeros when it has none), when both are float constants.
    fn conv_params(&self, conv: &NodeProto) -> Option<(Vec<f32>, Vec<i64>, Vec<f32>)> {
        if conv.op_type != "Conv" || !is_onnx_domain(conv) || conv.output.len() != 1 {
            return None;
        }
        let (weights, dims) = self.floats(conv.input.get(1)?)?;
        if dims.len() < 3 || dims[0] <= 0 {
            return None;
        }
        let channels = dims[0] as usize;
        let bias = match conv.input.get(2).filter(|b| !b.is_empty()) {
            Some(name) => self.floats(name)?.0,
            None => vec![0.0; channels],
        };
        (bias.len() == channels && weights.len().is_multiple_of(channels))
            .then_some((weights, dims, bias))
    }

    /// `node` (a batch norm, or `Mul`/`Add` by a per-channel constant) applied to the
    /// output of a convolution: the fold of it into that convolution.
    fn fold_after(&self, graph: &GraphProto, index: usize) -> Option<Fold> {
        let node = &graph.node[index];
        if !is_onnx_domain(node) || node.output.len() != 1 {
            return None;
        }
        let data = match node.op_type.as_str() {
            "BatchNormalization" if node.input.len() == 5 => node.input[0].as_str(),
            "Mul" | "Add" if node.input.len() == 2 => self.non_constant_of(node)?.0,
            _ => return None,
        };
        if !self.index.read_once(data) {
            return None;
        }
        let conv_index = *self.index.producer.get(data)?;
        let conv = &graph.node[conv_index];
        let (weights, dims, bias) = self.conv_params(conv)?;
        let channels = dims[0] as usize;
        let (scale, shift) = match node.op_type.as_str() {
            "BatchNormalization" => self.batch_norm(node, channels)?,
            op => {
                let (_, constant) = self.non_constant_of(node)?;
                let (values, const_dims) = self.floats(constant)?;
                let per_channel = per_output_channel(&values, &const_dims, dims.len(), channels)?;
                if op == "Mul" {
                    (per_channel, vec![0.0; channels])
                } else {
                    (vec![1.0; channels], per_channel)
                }
            }
        };
        let per_out = weights.len() / channels;
        let weights: Vec<f32> = weights
            .iter()
            .enumerate()
            .map(|(i, w)| w * scale[i / per_out])
            .collect();
        let bias: Vec<f32> = (0..channels)
            .map(|c| bias[c] * scale[c] + shift[c])
            .collect();
        all_finite(&weights, &bias).then(|| Fold {
            conv: conv_index,
            absorbed: index,
            weights,
            weight_dims: dims,
            bias,
            new_input: None,
            new_output: Some(node.output[0].clone()),
        })
    }

    /// `graph.node[index]`, a convolution padding nothing, reading a scalar `Mul` or
    /// `Add` of another value: the fold of that node into it.
    fn fold_before(&self, graph: &GraphProto, index: usize) -> Option<Fold> {
        let conv = &graph.node[index];
        let (weights, dims, bias) = self.conv_params(conv)?;
        if !pads_nothing(conv) {
            return None;
        }
        let input = conv.input.first()?;
        if !self.index.read_once(input) {
            return None;
        }
        let node_index = *self.index.producer.get(input.as_str())?;
        let node = &graph.node[node_index];
        if !is_onnx_domain(node)
            || node.output.len() != 1
            || node.input.len() != 2
            || !matches!(node.op_type.as_str(), "Mul" | "Add")
        {
            return None;
        }
        let (data, constant) = self.non_constant_of(node)?;
        let (values, const_dims) = self.floats(constant)?;
        // A scalar of rank 0 or 1 leaves the convolution's input rank as it is.
        let [value] = values.as_slice() else {
            return None;
        };
        if const_dims.len() > 1 {
            return None;
        }
        let channels = dims[0] as usize;
        let per_out = weights.len() / channels;
        let (weights, bias) = if node.op_type == "Mul" {
            (weights.iter().map(|w| w * value).collect(), bias)
        } else {
            let bias = (0..channels)
                .map(|c| {
                    let sum: f32 = weights[c * per_out..(c + 1) * per_out].iter().sum();
                    bias[c] + value * sum
                })
                .collect();
            (weights, bias)
        };
        all_finite(&weights, &bias).then(|| Fold {
            conv: index,
            absorbed: node_index,
            weights,
            weight_dims: dims,
            bias,
            new_input: Some(data.to_string()),
            new_output: None,
        })
    }

    /// Of a two-input node, the input that is not a constant and the one that is.
    fn non_constant_of<'n>(&self, node: &'n NodeProto) -> Option<(&'n str, &'n str)> {
        let [a, b] = [&node.input[0], &node.input[1]];
        match (
            self.index.constants.contains_key(a.as_str()),
            self.index.constants.contains_key(b.as_str()),
        ) {
            (false, true) => Some((a, b)),
            (true, false) => Some((b, a)),
            _ => None,
        }
    }

    /// An inference-form batch norm's per-channel scale and shift.
    fn batch_norm(&self, node: &NodeProto, channels: usize) -> Option<(Vec<f32>, Vec<f32>)> {
        let training = node
            .attribute
            .iter()
            .find(|a| a.name == "training_mode")
            .is_some_and(|a| a.i != 0);
        if training {
            return None;
        }
        let epsilon = node
            .attribute
            .iter()
            .find(|a| a.name == "epsilon")
            .map_or(1e-5, |a| a.f);
        let param = |i: usize| {
            self.floats(&node.input[i])
                .map(|(v, _)| v)
                .filter(|v| v.len() == channels)
        };
        let (gamma, beta, mean, var) = (param(1)?, param(2)?, param(3)?, param(4)?);
        let scale: Vec<f32> = (0..channels)
            .map(|c| gamma[c] / (var[c] + epsilon).sqrt())
            .collect();
        let shift = (0..channels)
            .map(|c| beta[c] - mean[c] * scale[c])
            .collect();
        Some((scale, shift))
    }
}

/// A constant's values as one per output channel, when it broadcasts against a
/// convolution output of `rank` (batch, channels, spatial…) along the channels only.
fn per_output_channel(
    values: &[f32],
    dims: &[i64],
    rank: usize,
    channels: usize,
) -> Option<Vec<f32>> {
    if dims.len() > rank {
        return None;
    }
    // Right-aligned against the output: the channel axis is `rank - 2` from the right.
    let channel_axis = dims.len().checked_sub(rank - 1);
    for (axis, dim) in dims.iter().enumerate() {
        if Some(axis) != channel_axis && *dim != 1 {
            return None;
        }
    }
    match values.len() {
        1 => Some(vec![values[0]; channels]),
        n if n == channels && channel_axis.is_some() => Some(values.to_vec()),
        _ => None,
    }
}

/// Whether a convolution pads nothing (no `pads` or all zero, `auto_pad` absent,
/// `NOTSET` or `VALID`).
fn pads_nothing(conv: &NodeProto) -> bool {
    conv.attribute.iter().all(|a| match a.name.as_str() {
        "pads" => a.ints.iter().all(|p| *p == 0),
        "auto_pad" => matches!(a.s.as_slice(), b"" | b"NOTSET" | b"VALID"),
        _ => true,
    })
}

fn all_finite(weights: &[f32], bias: &[f32]) -> bool {
    weights.iter().chain(bias).all(|v| v.is_finite())
}

fn apply(graph: &mut GraphProto, fold: Fold, serial: usize, replaced: &mut HashSet<String>) {
    let conv = &graph.node[fold.conv];
    let stem = conv.output.first().cloned().unwrap_or_default();
    let taken: HashSet<&str> = graph.initializer.iter().map(|t| t.name.as_str()).collect();
    let fresh = |kind: &str| {
        (0..)
            .map(|n| format!("{stem}:folded{serial}.{n}:{kind}"))
            .find(|name| !taken.contains(name.as_str()))
            .unwrap_or_default()
    };
    let (w_name, b_name) = (fresh("w"), fresh("b"));
    let channels = fold.bias.len() as i64;
    replaced.extend(conv.input.iter().skip(1).cloned());
    let tensor = |name: &str, dims: Vec<i64>, values: &[f32]| TensorProto {
        name: name.to_string(),
        dims,
        data_type: DataType::Float as i32,
        raw_data: values.iter().flat_map(|v| v.to_le_bytes()).collect(),
        ..TensorProto::default()
    };
    graph
        .initializer
        .push(tensor(&w_name, fold.weight_dims, &fold.weights));
    graph
        .initializer
        .push(tensor(&b_name, vec![channels], &fold.bias));
    let conv = &mut graph.node[fold.conv];
    let data = match fold.new_input {
        Some(input) => input,
        None => conv.input[0].clone(),
    };
    conv.input = vec![data, w_name, b_name];
    if let Some(output) = fold.new_output {
        conv.output = vec![output];
    }
    let absorbed = graph.node.remove(fold.absorbed);
    replaced.extend(absorbed.input);
}

/// Drops the initializers among `replaced` (the folded convolutions' old weights, the
/// absorbed nodes' scales), and the `Constant` nodes, that nothing reads any more.
fn drop_unread(graph: &mut GraphProto, replaced: &HashSet<String>) {
    if replaced.is_empty() {
        return;
    }
    let read: HashSet<String> = {
        let mut uses = HashMap::new();
        count_uses(graph, &mut uses);
        uses.keys()
            .map(|k| k.to_string())
            .chain(graph.output.iter().map(|o| o.name.clone()))
            .collect()
    };
    graph
        .initializer
        .retain(|t| !replaced.contains(&t.name) || read.contains(&t.name));
    graph.node.retain(|n| {
        !(n.op_type == "Constant" && n.output.len() == 1 && !read.contains(&n.output[0]))
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_graphs::{
        assert_close, assert_left_alone, constant, floats, model, node, op_types, pseudo_random,
        run, scalar, value_info, with_floats, with_ints,
    };
    use proptest::prelude::*;

    const C: usize = 3;
    const INPUT: [usize; 4] = [1, C, 6, 5];

    fn input_dims() -> Vec<i64> {
        INPUT.iter().map(|d| *d as i64).collect()
    }

    /// A 3×3 convolution of the C input channels to C outputs (`group` 1 or C), padded
    /// by `pad`, with bias, writing `y`.
    fn conv(input: &str, output: &str, group: i64, pad: i64) -> NodeProto {
        with_ints(
            node("Conv", &[input, "w", "b"], output),
            &[
                ("kernel_shape", &[3, 3]),
                ("pads", &[pad, pad, pad, pad]),
                ("group", &[group]),
            ],
        )
    }

    fn conv_params(group: i64, seed: u64) -> Vec<TensorProto> {
        let per_group = (C as i64) / group;
        let w_len = C * per_group as usize * 9;
        vec![
            floats(
                "w",
                &[C as i64, per_group, 3, 3],
                &pseudo_random(w_len, seed, 1.0),
            ),
            floats("b", &[C as i64], &pseudo_random(C, seed + 1, 1.0)),
        ]
    }

    fn batch_norm_params(seed: u64) -> Vec<TensorProto> {
        let positive: Vec<f32> = pseudo_random(C, seed + 5, 0.9)
            .iter()
            .map(|v| v + 1.0)
            .collect();
        vec![
            floats("gamma", &[C as i64], &pseudo_random(C, seed + 2, 2.0)),
            floats("beta", &[C as i64], &pseudo_random(C, seed + 3, 1.0)),
            floats("mean", &[C as i64], &pseudo_random(C, seed + 4, 1.0)),
            floats("var", &[C as i64], &positive),
        ]
    }

    fn folded(mut model: ModelProto) -> (usize, ModelProto) {
        let count = fold_affine_into_convs(&mut model);
        (count, model)
    }

    /// Folds, checks the count and what is left, and that the outputs agree.
    fn check_folds(case: &str, original: ModelProto, count: usize, left: &[&str]) {
        let xs = pseudo_random(INPUT.iter().product(), 7, 2.0);
        let want = run(&original, &INPUT, &xs);
        let (n, rewritten) = folded(original);
        assert_eq!(n, count, "{case}");
        assert_eq!(op_types(&rewritten), left, "{case}");
        assert_close(&run(&rewritten, &INPUT, &xs), &want, 1e-5, case);
    }

    #[test]
    fn batch_norm_and_channel_scales_after_a_convolution_fold_into_it() {
        for group in [1, C as i64] {
            let mut params = conv_params(group, 11);
            params.extend(batch_norm_params(11));
            params.push(floats("s", &[1, C as i64, 1, 1], &[0.5, -2.0, 3.0]));
            params.push(floats("t", &[C as i64, 1, 1], &[0.25, 1.0, -4.0]));
            params.push(scalar("u", 0.75));
            let graph = model(
                &input_dims(),
                vec![
                    conv("x", "c", group, 1),
                    with_floats(
                        node(
                            "BatchNormalization",
                            &["c", "gamma", "beta", "mean", "var"],
                            "n",
                        ),
                        &[("epsilon", 1e-3)],
                    ),
                    node("Mul", &["s", "n"], "m"),
                    node("Add", &["m", "t"], "a"),
                    node("Mul", &["a", "u"], "y"),
                ],
                params,
                &["y"],
            );
            check_folds(&format!("group {group}"), graph, 4, &["Conv"]);
        }
    }

    #[test]
    fn a_scalar_scale_and_shift_before_an_unpadded_convolution_fold_into_it() {
        let mut params = conv_params(1, 21);
        params.push(scalar("s", -1.5));
        params.push(floats("t", &[1], &[0.625]));
        let graph = model(
            &input_dims(),
            vec![
                constant("s_node", scalar("", -1.5)),
                node("Mul", &["x", "s_node"], "m"),
                node("Add", &["t", "m"], "a"),
                conv("a", "y", 1, 0),
            ],
            params,
            &["y"],
        );
        check_folds("before", graph, 2, &["Conv"]);
    }

    #[test]
    fn what_would_change_the_result_is_left_as_it_is() {
        let cases: Vec<(&str, ModelProto)> = vec![
            (
                "a shift before a padded convolution (its border would see it)",
                model(
                    &input_dims(),
                    vec![node("Add", &["x", "t"], "a"), conv("a", "y", 1, 1)],
                    [conv_params(1, 31), vec![scalar("t", 0.5)]].concat(),
                    &["y"],
                ),
            ),
            (
                "a per-channel shift before a convolution",
                model(
                    &input_dims(),
                    vec![node("Mul", &["x", "s"], "m"), conv("m", "y", 1, 0)],
                    [
                        conv_params(1, 32),
                        vec![floats("s", &[C as i64, 1, 1], &[1.0, 2.0, 3.0])],
                    ]
                    .concat(),
                    &["y"],
                ),
            ),
            (
                "a constant of C values on the last axis (it scales columns, not channels)",
                model(
                    &[1, C as i64, 6, C as i64],
                    vec![conv("x", "c", 1, 1), node("Mul", &["c", "s"], "y")],
                    [
                        conv_params(1, 33),
                        vec![floats("s", &[C as i64], &[1.0, 2.0, 3.0])],
                    ]
                    .concat(),
                    &["y"],
                ),
            ),
            (
                "the convolution's output is also an output of the graph",
                model(
                    &input_dims(),
                    vec![conv("x", "c", 1, 1), node("Mul", &["c", "s"], "y")],
                    [conv_params(1, 34), vec![scalar("s", 2.0)]].concat(),
                    &["y", "c"],
                ),
            ),
            (
                "the convolution's output is read twice",
                model(
                    &input_dims(),
                    vec![
                        conv("x", "c", 1, 1),
                        node("Mul", &["c", "s"], "m"),
                        node("Add", &["m", "c"], "y"),
                    ],
                    [conv_params(1, 35), vec![scalar("s", 2.0)]].concat(),
                    &["y"],
                ),
            ),
            ("a scale that is a graph input, not a constant", {
                let mut m = model(
                    &input_dims(),
                    vec![conv("x", "c", 1, 1), node("Mul", &["c", "s"], "y")],
                    [conv_params(1, 36), vec![scalar("s", 2.0)]].concat(),
                    &["y"],
                );
                let graph = m.graph.as_mut().expect("graph");
                graph.input.push(value_info("s", Some(&[])));
                m
            }),
            (
                "a batch norm in training mode",
                model(
                    &input_dims(),
                    vec![
                        conv("x", "c", 1, 1),
                        with_ints(
                            node(
                                "BatchNormalization",
                                &["c", "gamma", "beta", "mean", "var"],
                                "y",
                            ),
                            &[("training_mode", &[1])],
                        ),
                    ],
                    [conv_params(1, 37), batch_norm_params(37)].concat(),
                    &["y"],
                ),
            ),
        ];
        assert_left_alone(cases, fold_affine_into_convs);
    }

    #[test]
    fn weights_nothing_reads_any_more_are_dropped_and_shared_ones_kept() {
        // Two convolutions share w and b; only the first is followed by a scale.
        let graph = model(
            &input_dims(),
            vec![
                conv("x", "c1", 1, 1),
                node("Mul", &["c1", "s"], "m"),
                conv("m", "y", 1, 1),
            ],
            [conv_params(1, 41), vec![scalar("s", 2.0)]].concat(),
            &["y"],
        );
        let (count, rewritten) = folded(graph);
        assert_eq!(count, 1);
        let names: Vec<&str> = rewritten
            .graph
            .as_ref()
            .expect("graph")
            .initializer
            .iter()
            .map(|t| t.name.as_str())
            .collect();
        assert!(names.contains(&"w") && names.contains(&"b"), "{names:?}");
        assert!(!names.contains(&"s"), "{names:?}");
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(32))]

        /// Whatever the weights, scales and shifts, the folded model answers what the
        /// original does.
        #[test]
        fn folding_keeps_what_the_graph_computes(
            seed in 0u64..1_000_000,
            scale in -4.0f32..4.0,
            shift in -4.0f32..4.0,
            depthwise in any::<bool>(),
        ) {
            let group = if depthwise { C as i64 } else { 1 };
            let mut params = conv_params(group, seed);
            params.extend(batch_norm_params(seed));
            params.push(scalar("s", scale));
            params.push(scalar("t", shift));
            let graph = model(
                &input_dims(),
                vec![
                    node("Mul", &["x", "s"], "pre"),
                    conv("pre", "c", group, 0),
                    node("BatchNormalization", &["c", "gamma", "beta", "mean", "var"], "n"),
                    node("Add", &["n", "t"], "y"),
                ],
                params,
                &["y"],
            );
            let xs = pseudo_random(INPUT.iter().product(), seed + 9, 2.0);
            let want = run(&graph, &INPUT, &xs);
            let (count, rewritten) = folded(graph);
            prop_assert_eq!(count, 3);
            let got = run(&rewritten, &INPUT, &xs);
            let worst = want.iter().map(|w| w.abs()).fold(1.0f32, f32::max);
            for (g, w) in got.iter().zip(&want) {
                prop_assert!((g - w).abs() <= 1e-5 * worst, "{} vs {}", g, w);
            }
        }
    }
}
