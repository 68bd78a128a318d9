//! Hard-swish as exporters spell it out, made the one operator tract runs in one pass.
//!
//! MobileNetV3-style networks (PaddleOCR's classifier, detector and recognizer among
//! them) apply hard-swish, x·relu6(x + 3)/6, after most of their convolutions. ONNX
//! has no `HardSwish` before opset 14, so exporters write it out: Paddle as `Add` 3,
//! `Clip` 0..6, `Mul` by x, `Div` by 6; PyTorch as `HardSigmoid` (α = 1/6, β = 0.5) then
//! `Mul` by x; others with `Mul` by 1/6 in place of the `Div`. tract runs those as two
//! fused element-wise passes plus a scalar product over the whole activation, where its
//! own `HardSwish` is one pass computing x·clamp(x + 3, 0, 6)·(1/6): the exporters'
//! formula, the division by 6 a product by its f32 inverse. On ppocr-cls the spelled-out
//! form took 0.30 of 1.73 ms per run and the fused one 0.04 (README, performance).
//!
//! Only exact patterns are rewritten, in the main graph: every constant a one-element
//! f32 of the value the formula needs (not also a graph input, which a caller could
//! override), every intermediate value used by the next node alone (nowhere else, not in
//! a subgraph, not an output of the graph). Anything else is left as it was. The
//! `Constant` nodes of the pattern stay; tract drops what nothing uses.

use std::collections::{HashMap, HashSet};

use tract_onnx::pb::{tensor_proto::DataType, GraphProto, ModelProto, NodeProto, TensorProto};
use tract_onnx::prelude::*;
use tract_onnx::tract_core::internal::TractErrorContext as _;

use crate::graph_index::{is_onnx_domain, GraphIndex};
use crate::onnx_edit::float_values;
use crate::RuntimeError;

/// Parses an ONNX file as the runtime runs it: scales and shifts folded into the
/// convolutions next to them ([`crate::fold_affine`]) and hard-swish patterns fused
/// first. Fails as tract's own `model_for_read` would on a file it cannot read, and as
/// unsupported on a model whose operators this build was made without
/// ([`crate::op_families`]).
pub(crate) fn read_for_running(name: &str, bytes: &[u8]) -> Result<InferenceModel, RuntimeError> {
    let load = |e: TractError| RuntimeError::Load {
        model: name.to_string(),
        cause: format!("{e:#}"),
    };
    let onnx = crate::onnx_reader();
    let mut reader = bytes;
    let mut proto = onnx
        .proto_model_for_read(&mut reader)
        .context("Reading proto model")
        .map_err(load)?;
    if let Some(cause) = crate::op_families::refusal(&proto) {
        return Err(RuntimeError::Unsupported {
            model: name.to_string(),
            cause,
        });
    }
    crate::fold_affine::fold_affine_into_convs(&mut proto);
    fuse_hard_swish(&mut proto);
    onnx.model_for_proto_model(&proto)
        .context("Translating proto model to model")
        .map_err(load)
}

/// Replaces each hard-swish written out in the main graph by one `HardSwish` node that
/// writes the same output. Returns how many were replaced.
pub fn fuse_hard_swish(model: &mut ModelProto) -> usize {
    let opset = onnx_opset(model);
    let Some(graph) = model.graph.as_mut() else {
        return 0;
    };
    let found = {
        let view = GraphView::new(graph, opset);
        let mut taken: HashSet<usize> = HashSet::new();
        let mut found: Vec<(usize, String, Vec<usize>)> = Vec::new();
        for index in 0..graph.node.len() {
            let Some((x, inner)) = view.hard_swish_ending_at(index) else {
                continue;
            };
            if taken.contains(&index) || inner.iter().any(|i| taken.contains(i)) {
                continue;
            }
            taken.insert(index);
            taken.extend(inner.iter().copied());
            found.push((index, x, inner));
        }
        found
    };
    if found.is_empty() {
        return 0;
    }
    let removed: HashSet<usize> = found
        .iter()
        .flat_map(|(_, _, inner)| inner.clone())
        .collect();
    let replaced: HashMap<usize, String> = found
        .iter()
        .map(|(index, x, _)| (*index, x.clone()))
        .collect();
    let nodes = std::mem::take(&mut graph.node);
    graph.node = nodes
        .into_iter()
        .enumerate()
        .filter(|(index, _)| !removed.contains(index))
        .map(|(index, node)| match replaced.get(&index) {
            Some(x) => NodeProto {
                name: node.name.clone(),
                op_type: "HardSwish".into(),
                input: vec![x.clone()],
                output: node.output.clone(),
                ..NodeProto::default()
            },
            None => node,
        })
        .collect();
    found.len()
}

/// What the pattern matcher needs to know of a graph.
struct GraphView<'a> {
    nodes: &'a [NodeProto],
    index: GraphIndex<'a>,
    /// The model's ONNX opset: `Clip` takes its bounds as attributes before 11.
    opset: i64,
}

impl<'a> GraphView<'a> {
    fn new(graph: &'a GraphProto, opset: i64) -> GraphView<'a> {
        GraphView {
            nodes: &graph.node,
            index: GraphIndex::new(graph),
            opset,
        }
    }

    /// The node writing `value`, when `value` is read once (by the node at hand) and is
    /// not an output of the graph.
    fn sole_producer(&self, value: &str) -> Option<(usize, &'a NodeProto)> {
        if !self.index.read_once(value) {
            return None;
        }
        let index = *self.index.producer.get(value)?;
        let node = &self.nodes[index];
        (is_onnx_domain(node) && node.output.len() == 1).then_some((index, node))
    }

    /// Whether `value` is a one-element f32 constant equal to `want`.
    fn is_scalar(&self, value: &str, want: f32) -> bool {
        self.index
            .constants
            .get(value)
            .and_then(|tensor| scalar_f32(tensor))
            .is_some_and(|v| close(v, want))
    }

    /// `Clip(Add(x, 3), 0, 6)` writing `value`: x and the two nodes.
    fn relu6_of_x_plus_3(&self, value: &str) -> Option<(String, Vec<usize>)> {
        let (clip_index, clip) = self.sole_producer(value)?;
        if clip.op_type != "Clip" || !self.clip_bounds_are(clip, 0.0, 6.0) {
            return None;
        }
        let (add_index, add) = self.sole_producer(clip.input.first()?)?;
        if add.op_type != "Add" || add.input.len() != 2 {
            return None;
        }
        let x = self.other_than_scalar(&add.input, 3.0)?;
        Some((x, vec![add_index, clip_index]))
    }

    /// x·relu6(x + 3)/6 as a gate: `HardSigmoid(x)` with α = 1/6, β = 0.5, or
    /// `relu6(x + 3)` divided by 6 or multiplied by 1/6, writing `value`.
    fn hard_sigmoid(&self, value: &str) -> Option<(String, Vec<usize>)> {
        let (index, node) = self.sole_producer(value)?;
        match node.op_type.as_str() {
            "HardSigmoid" if node.input.len() == 1 => {
                let alpha = float_attr(node, "alpha").unwrap_or(0.2);
                let beta = float_attr(node, "beta").unwrap_or(0.5);
                (close(alpha, 1.0 / 6.0) && close(beta, 0.5))
                    .then(|| (node.input[0].clone(), vec![index]))
            }
            "Div" | "Mul" if node.input.len() == 2 => {
                let relu6 = self.scaled_by_one_sixth(node)?;
                let (x, mut inner) = self.relu6_of_x_plus_3(relu6)?;
                inner.push(index);
                Some((x, inner))
            }
            _ => None,
        }
    }

    /// A hard-swish whose last node is `self.nodes[index]`: x and the nodes before it.
    fn hard_swish_ending_at(&self, index: usize) -> Option<(String, Vec<usize>)> {
        let node = &self.nodes[index];
        if !is_onnx_domain(node) || node.input.len() != 2 || node.output.len() != 1 {
            return None;
        }
        if node.op_type == "Mul" {
            // x · hard_sigmoid(x)
            for (x, gate) in [(0, 1), (1, 0)] {
                if let Some((gate_x, inner)) = self.hard_sigmoid(&node.input[gate]) {
                    if gate_x == node.input[x] {
                        return Some((gate_x, inner));
                    }
                }
            }
        }
        if matches!(node.op_type.as_str(), "Div" | "Mul") {
            // (x · relu6(x + 3)) / 6
            let product = self.scaled_by_one_sixth(node)?;
            let (mul_index, mul) = self.sole_producer(product)?;
            if mul.op_type != "Mul" || mul.input.len() != 2 {
                return None;
            }
            for (x, gate) in [(0, 1), (1, 0)] {
                if let Some((gate_x, mut inner)) = self.relu6_of_x_plus_3(&mul.input[gate]) {
                    if gate_x == mul.input[x] {
                        inner.push(mul_index);
                        return Some((gate_x, inner));
                    }
                }
            }
        }
        None
    }

    /// For `Div(v, 6)`, `Mul(v, 1/6)` or `Mul(1/6, v)`: v.
    fn scaled_by_one_sixth<'n>(&self, node: &'n NodeProto) -> Option<&'n str> {
        match node.op_type.as_str() {
            "Div" if self.is_scalar(&node.input[1], 6.0) => Some(&node.input[0]),
            "Mul" if self.is_scalar(&node.input[1], 1.0 / 6.0) => Some(&node.input[0]),
            "Mul" if self.is_scalar(&node.input[0], 1.0 / 6.0) => Some(&node.input[1]),
            _ => None,
        }
    }

    /// Of two inputs, the one that is not the scalar `want`, when the other is.
    fn other_than_scalar(&self, inputs: &[String], want: f32) -> Option<String> {
        if self.is_scalar(&inputs[1], want) {
            Some(inputs[0].clone())
        } else if self.is_scalar(&inputs[0], want) {
            Some(inputs[1].clone())
        } else {
            None
        }
    }

    /// Whether a `Clip` clamps to exactly [low, high]: bounds as inputs (opset 11 on)
    /// or as attributes (before; from 11 on they are ignored).
    fn clip_bounds_are(&self, clip: &NodeProto, low: f32, high: f32) -> bool {
        match clip.input.len() {
            3 if self.opset >= 11 => {
                self.is_scalar(&clip.input[1], low) && self.is_scalar(&clip.input[2], high)
            }
            1 if self.opset < 11 => {
                float_attr(clip, "min").is_some_and(|v| close(v, low))
                    && float_attr(clip, "max").is_some_and(|v| close(v, high))
            }
            _ => false,
        }
    }
}

/// The version of the default (`ai.onnx`) operator set the model imports.
fn onnx_opset(model: &ModelProto) -> i64 {
    model
        .opset_import
        .iter()
        .find(|o| o.domain.is_empty() || o.domain == "ai.onnx")
        .map_or(0, |o| o.version)
}

fn float_attr(node: &NodeProto, name: &str) -> Option<f32> {
    node.attribute.iter().find(|a| a.name == name).map(|a| a.f)
}

/// The value of a one-element f32 tensor.
fn scalar_f32(tensor: &TensorProto) -> Option<f32> {
    if tensor.data_type != DataType::Float as i32 || tensor.dims.iter().product::<i64>() != 1 {
        return None;
    }
    match float_values(tensor).ok()?.as_slice() {
        [value] => Some(*value),
        _ => None,
    }
}

fn close(value: f32, want: f32) -> bool {
    (value - want).abs() <= 1e-6 * want.abs().max(1.0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_graphs::{
        assert_close, assert_left_alone, constant, model as graph_model, node, op_types,
        run as run_graph, scalar, value_info, with_floats,
    };
    use proptest::prelude::*;

    const LEN: usize = 16;

    fn with_opset(mut model: ModelProto, version: i64) -> ModelProto {
        model.opset_import[0].version = version;
        model
    }

    /// A model `x [1, LEN] → nodes → outputs`, with scalar `constants` as initializers.
    fn model(nodes: Vec<NodeProto>, constants: &[(&str, f32)], outputs: &[&str]) -> ModelProto {
        let initializers = constants.iter().map(|(n, v)| scalar(n, *v)).collect();
        graph_model(&[1, LEN as i64], nodes, initializers, outputs)
    }

    fn run(model: &ModelProto, xs: &[f32]) -> Vec<f32> {
        run_graph(model, &[1, xs.len()], xs)
    }

    /// Paddle's form: (x · clip(x + 3, 0, 6)) / 6.
    fn paddle() -> ModelProto {
        model(
            vec![
                node("Add", &["x", "three"], "a"),
                node("Clip", &["a", "zero", "six"], "c"),
                node("Mul", &["x", "c"], "m"),
                node("Div", &["m", "six"], "y"),
            ],
            &[("three", 3.0), ("zero", 0.0), ("six", 6.0)],
            &["y"],
        )
    }

    fn fused(mut model: ModelProto) -> (usize, ModelProto) {
        let count = fuse_hard_swish(&mut model);
        (count, model)
    }

    #[test]
    fn each_exporters_spelling_becomes_one_hard_swish() {
        let one_sixth = 1.0 / 6.0;
        let cases: Vec<(&str, ModelProto)> = vec![
            ("paddle: Div by 6", paddle()),
            (
                "product by 1/6, constants first, Clip bounds as attributes (opset 6)",
                with_opset(
                    model(
                        vec![
                            node("Add", &["three", "x"], "a"),
                            with_floats(node("Clip", &["a"], "c"), &[("min", 0.0), ("max", 6.0)]),
                            node("Mul", &["c", "x"], "m"),
                            node("Mul", &["sixth", "m"], "y"),
                        ],
                        &[("three", 3.0), ("sixth", one_sixth)],
                        &["y"],
                    ),
                    6,
                ),
            ),
            (
                "pytorch: HardSigmoid(1/6, 0.5) then Mul",
                model(
                    vec![
                        with_floats(
                            node("HardSigmoid", &["x"], "h"),
                            &[("alpha", one_sixth), ("beta", 0.5)],
                        ),
                        node("Mul", &["h", "x"], "y"),
                    ],
                    &[],
                    &["y"],
                ),
            ),
            (
                "keras: x · (clip(x + 3, 0, 6) / 6)",
                model(
                    vec![
                        node("Add", &["x", "three"], "a"),
                        node("Clip", &["a", "zero", "six"], "c"),
                        node("Div", &["c", "six"], "h"),
                        node("Mul", &["x", "h"], "y"),
                    ],
                    &[("three", 3.0), ("zero", 0.0), ("six", 6.0)],
                    &["y"],
                ),
            ),
        ];
        let xs: Vec<f32> = (0..LEN).map(|i| i as f32 - 8.0 + 0.37).collect();
        for (case, original) in cases {
            let want = run(&original, &xs);
            let (count, rewritten) = fused(original);
            assert_eq!(count, 1, "{case}");
            assert_eq!(op_types(&rewritten), ["HardSwish"], "{case}");
            let got = run(&rewritten, &xs);
            assert_close(&got, &want, 1e-6, case);
        }
    }

    #[test]
    fn near_misses_are_left_as_they_are() {
        let one_sixth = 1.0 / 6.0;
        let paddle_with = |three: f32, six_clip: f32, div: f32, outputs: &[&str]| {
            model(
                vec![
                    node("Add", &["x", "three"], "a"),
                    node("Clip", &["a", "zero", "clip_max"], "c"),
                    node("Mul", &["x", "c"], "m"),
                    node("Div", &["m", "div"], "y"),
                ],
                &[
                    ("three", three),
                    ("zero", 0.0),
                    ("clip_max", six_clip),
                    ("div", div),
                ],
                outputs,
            )
        };
        let cases: Vec<(&str, ModelProto)> = vec![
            ("adds 2.9", paddle_with(2.9, 6.0, 6.0, &["y"])),
            ("clips at 5", paddle_with(3.0, 5.0, 6.0, &["y"])),
            ("divides by 5", paddle_with(3.0, 6.0, 5.0, &["y"])),
            (
                "an intermediate is an output of the graph",
                paddle_with(3.0, 6.0, 6.0, &["y", "c"]),
            ),
            (
                "multiplies by another value than the one it gated",
                model(
                    vec![
                        node("Add", &["x", "three"], "a"),
                        node("Clip", &["a", "zero", "six"], "c"),
                        node("Mul", &["a", "c"], "m"),
                        node("Div", &["m", "six"], "y"),
                    ],
                    &[("three", 3.0), ("zero", 0.0), ("six", 6.0)],
                    &["y"],
                ),
            ),
            (
                "an intermediate is read twice",
                model(
                    vec![
                        node("Add", &["x", "three"], "a"),
                        node("Clip", &["a", "zero", "six"], "c"),
                        node("Mul", &["x", "c"], "m"),
                        node("Div", &["m", "six"], "d"),
                        node("Add", &["d", "a"], "y"),
                    ],
                    &[("three", 3.0), ("zero", 0.0), ("six", 6.0)],
                    &["y"],
                ),
            ),
            (
                "Clip bounds as attributes in opset 11 (where they are ignored)",
                model(
                    vec![
                        node("Add", &["x", "three"], "a"),
                        with_floats(node("Clip", &["a"], "c"), &[("min", 0.0), ("max", 6.0)]),
                        node("Mul", &["x", "c"], "m"),
                        node("Div", &["m", "six"], "y"),
                    ],
                    &[("three", 3.0), ("six", 6.0)],
                    &["y"],
                ),
            ),
            (
                "Clip bounds as inputs before opset 11",
                with_opset(paddle(), 6),
            ),
            (
                "HardSigmoid at ONNX's default slope 0.2",
                model(
                    vec![
                        node("HardSigmoid", &["x"], "h"),
                        node("Mul", &["h", "x"], "y"),
                    ],
                    &[],
                    &["y"],
                ),
            ),
            (
                "HardSigmoid with β = 0.4",
                model(
                    vec![
                        with_floats(
                            node("HardSigmoid", &["x"], "h"),
                            &[("alpha", one_sixth), ("beta", 0.4)],
                        ),
                        node("Mul", &["h", "x"], "y"),
                    ],
                    &[],
                    &["y"],
                ),
            ),
        ];
        assert_left_alone(cases, fuse_hard_swish);
    }

    #[test]
    fn a_constant_that_is_also_a_graph_input_is_not_taken_for_a_constant() {
        let mut overridable = paddle();
        let graph = overridable.graph.as_mut().expect("graph");
        graph.input.push(value_info("three", Some(&[1])));
        let (count, _) = fused(overridable);
        assert_eq!(count, 0);
    }

    #[test]
    fn constant_nodes_count_as_constants_and_every_pattern_of_a_chain_is_fused() {
        let original = model(
            vec![
                constant("three", scalar("", 3.0)),
                constant("zero", scalar("", 0.0)),
                constant("six", scalar("", 6.0)),
                node("Add", &["x", "three"], "a1"),
                node("Clip", &["a1", "zero", "six"], "c1"),
                node("Mul", &["x", "c1"], "m1"),
                node("Div", &["m1", "six"], "y1"),
                node("Add", &["y1", "three"], "a2"),
                node("Clip", &["a2", "zero", "six"], "c2"),
                node("Mul", &["c2", "y1"], "m2"),
                node("Div", &["m2", "six"], "y"),
            ],
            &[],
            &["y"],
        );
        let xs: Vec<f32> = (0..LEN).map(|i| (i as f32 - 8.0) * 0.9).collect();
        let want = run(&original, &xs);
        let (count, rewritten) = fused(original);
        assert_eq!(count, 2);
        assert_eq!(
            op_types(&rewritten),
            ["Constant", "Constant", "Constant", "HardSwish", "HardSwish"]
        );
        let got = run(&rewritten, &xs);
        assert_close(&got, &want, 1e-6, "a chain of two");
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]

        /// Whatever the input, the fused model answers what the exporter's graph does
        /// (to the rounding of /6 against ·(1/6)).
        #[test]
        fn the_fused_graph_computes_what_the_written_out_one_does(
            xs in proptest::collection::vec(-1.0e4f32..1.0e4, LEN)
        ) {
            let original = paddle();
            let want = run(&original, &xs);
            let (count, rewritten) = fused(original);
            prop_assert_eq!(count, 1);
            let got = run(&rewritten, &xs);
            for (g, w) in got.iter().zip(&want) {
                prop_assert!((g - w).abs() <= 2e-7 * w.abs().max(1.0), "{} vs {}", g, w);
            }
        }
    }
}
