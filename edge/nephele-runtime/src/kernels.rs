//! Where the runtime's own kernels take over from tract's: every plan the runtime
//! builds is optimised by [`optimized`], which is tract's `into_optimized` with the
//! operators those kernels run swapped in: each 1×1 convolution
//! ([`crate::pointwise`]) before tract's declutter, each depthwise convolution
//! ([`crate::depthwise`]), each other convolution with a spatial kernel
//! ([`crate::direct`]) and each product of an activation by constant weights
//! ([`crate::dense`], with the bias added after it) between the declutter and the
//! codegen; and each `If` left in the optimised plan by one with both branches planned
//! once ([`crate::planned_if`]).
//!
//! `NEPHELE_TRACT_CONV` keeps tract's own operators, to compare the two on the same
//! build: `all` (or `1`) for all four, or `depthwise`, `pointwise`, `direct` or `dense`
//! for one (comma-separated for several).

use std::sync::{Arc, OnceLock};

use tract_onnx::prelude::*;

use crate::dense::replace_dense;
use crate::depthwise::depthwise_for;
use crate::direct::direct_for;
use crate::pointwise::pointwise_for;

/// `model` typed, decluttered, the layers our kernels run given to them, and
/// optimised.
pub fn optimized(model: InferenceModel) -> TractResult<TypedModel> {
    optimized_with_windows(model).map(|(model, _)| model)
}

/// [`optimized`], with the model's convolution and pool windows read before the
/// declutter ([`crate::windows`]), which requests are checked against.
pub fn optimized_with_windows(
    model: InferenceModel,
) -> TractResult<(TypedModel, Vec<crate::windows::Window>)> {
    let kept = tracts_own();
    let mut model = model.into_typed()?;
    let windows = crate::windows::windows(&model);
    // Before the declutter, which turns 1×1 convolutions into general products.
    if !kept.contains(&"pointwise") {
        replace(&mut model, pointwise_for)?;
    }
    let mut model = model.into_decluttered()?;
    if !kept.contains(&"depthwise") {
        replace(&mut model, depthwise_for)?;
    }
    if !kept.contains(&"direct") {
        replace(&mut model, direct_for)?;
    }
    if !kept.contains(&"dense") {
        replace_dense(&mut model)?;
    }
    let mut model = model.into_optimized()?;
    // An `If` left on values: both branches planned once ([`crate::planned_if`]).
    replace(&mut model, crate::planned_if::planned_if_for)?;
    Ok((model, windows))
}

/// The kinds of layer `NEPHELE_TRACT_CONV` leaves to tract.
fn tracts_own() -> &'static [&'static str] {
    static KEPT: OnceLock<Vec<&'static str>> = OnceLock::new();
    KEPT.get_or_init(|| {
        let asked = std::env::var("NEPHELE_TRACT_CONV").unwrap_or_default();
        asked
            .split(',')
            .flat_map(|kind| match kind.trim() {
                "1" | "all" => vec!["depthwise", "pointwise", "direct", "dense"],
                "depthwise" => vec!["depthwise"],
                "direct" => vec!["direct"],
                "pointwise" => vec!["pointwise"],
                "dense" => vec!["dense"],
                _ => vec![],
            })
            .collect()
    })
}

/// Replaces every node of `model` for which `ours` gives an operator, wired to the
/// node's inputs the operator takes (the first [`OwnOp::INPUTS`]; it holds the
/// constants among the others); how many.
pub fn replace<O: OwnOp>(
    model: &mut TypedModel,
    ours: impl Fn(&TypedModel, &TypedNode) -> TractResult<Option<O>>,
) -> TractResult<usize> {
    let mut replaced = 0;
    for id in model.eval_order()? {
        let node = model.node(id);
        if let Some(op) = ours(model, node)? {
            let inputs = &node.inputs[..O::INPUTS.min(node.inputs.len())];
            let patch = TypedModelPatch::replace_single_op(model, node, inputs, op)?;
            patch.apply(model)?;
            replaced += 1;
        }
    }
    Ok(replaced)
}

/// `weight · x + acc`, fused into one instruction when `FMA` says the target has it
/// (else `mul_add` would be a library call): multiply, then add.
#[inline(always)]
pub(crate) fn fma<const FMA: bool>(weight: f32, x: f32, acc: f32) -> f32 {
    if FMA {
        weight.mul_add(x, acc)
    } else {
        acc + weight * x
    }
}

/// One of our operators: how many of the replaced node's inputs it takes.
pub trait OwnOp: TypedOp {
    const INPUTS: usize;
}

impl OwnOp for crate::depthwise::Depthwise {
    /// The image (kernel and bias are held).
    const INPUTS: usize = 1;
}

impl OwnOp for crate::direct::Direct {
    /// The image (kernel and bias are held).
    const INPUTS: usize = 1;
}

impl OwnOp for crate::pointwise::Pointwise {
    /// The image, the kernel (held, laid out for the kernel) and the bias.
    const INPUTS: usize = 3;
}

/// Constant `f32`s an operator holds, compared bit for bit (tract's operators must be
/// `Eq`).
#[derive(Debug, Clone)]
pub struct Weights(pub(crate) Arc<[f32]>);

impl Weights {
    /// `values` with subnormal ones flushed to zero. Trained weights have some (the
    /// digits MLP's first layer 97 of 8,192), and every vector multiply-add that meets
    /// one takes a microcode assist on x86 CPUs: they made that layer ten times slower
    /// at batch 6. Such a value (below 1.2e-38) times any activation adds nothing an
    /// `f32` sum of normal terms can hold.
    pub(crate) fn flushed(mut values: Vec<f32>) -> Weights {
        for v in &mut values {
            if v.is_subnormal() {
                *v = 0.0;
            }
        }
        Weights(values.into())
    }
}

impl PartialEq for Weights {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
            || self.0.len() == other.0.len()
                && self
                    .0
                    .iter()
                    .zip(other.0.iter())
                    .all(|(a, b)| a.to_bits() == b.to_bits())
    }
}

impl Eq for Weights {}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_graphs::{assert_close, floats, model, node, pseudo_random, with_ints};
    use prost::Message;
    use tract_onnx::pb::NodeProto;

    /// Plans `bytes` for `shape` with tract's own operators or through [`optimized`],
    /// runs it on `xs`; the output and the operators' names in the plan.
    fn plan_and_run(
        bytes: &[u8],
        shape: &[usize],
        xs: &[f32],
        ours: bool,
    ) -> (Vec<f32>, Vec<String>) {
        let model = tract_onnx::onnx()
            .model_for_read(&mut &bytes[..])
            .and_then(|m| m.with_input_fact(0, f32::fact(shape).into()))
            .expect("the model types");
        let typed = if ours {
            optimized(model)
        } else {
            model.into_optimized()
        }
        .expect("the model plans");
        let ops = typed
            .nodes()
            .iter()
            .map(|n| n.op.name().to_string())
            .collect();
        let plan = typed.into_runnable().expect("runnable");
        let input = Tensor::from_shape(shape, xs).expect("shape");
        let out = plan.run(tvec!(input.into())).expect("runs");
        let out = out[0].to_plain_array_view::<f32>().expect("f32");
        (out.iter().copied().collect(), ops)
    }

    fn count(ops: &[String], name: &str) -> usize {
        ops.iter().filter(|op| op.as_str() == name).count()
    }

    /// Depthwise layers (pads, strides, dilations, batch 1 and 2), each followed by a
    /// 1×1 layer and an activation, answer through our operators what tract's own plan
    /// answers.
    #[test]
    fn convolutions_of_an_onnx_graph_answer_as_tracts_own() {
        // Name, kernel, strides, dilations, pads (top, left, bottom, right), batch.
        type Case = (&'static str, [i64; 2], [i64; 2], [i64; 2], [i64; 4], usize);
        let cases: [Case; 5] = [
            ("3x3 same", [3, 3], [1, 1], [1, 1], [1, 1, 1, 1], 1),
            ("3x3 stride 2", [3, 3], [2, 2], [1, 1], [1, 1, 1, 1], 1),
            (
                "5x5 stride (2,1), batch 2",
                [5, 5],
                [2, 1],
                [1, 1],
                [2, 2, 2, 2],
                2,
            ),
            (
                "3x3 dilated, unpadded",
                [3, 3],
                [1, 1],
                [2, 2],
                [0, 0, 0, 0],
                1,
            ),
            ("3x5 uneven pads", [3, 5], [1, 2], [1, 1], [0, 2, 1, 1], 2),
        ];
        let (channels, h, w, expanded) = (6usize, 9usize, 21usize, 13usize);
        for (case, kernel, strides, dilations, pads, batch) in cases {
            let taps = (kernel[0] * kernel[1]) as usize;
            let depthwise = with_ints(
                node("Conv", &["x", "k", "b"], "y"),
                &[
                    ("group", &[channels as i64][..]),
                    ("kernel_shape", &kernel[..]),
                    ("strides", &strides[..]),
                    ("dilations", &dilations[..]),
                    ("pads", &pads[..]),
                ],
            );
            let pointwise = with_ints(
                node("Conv", &["y", "k1", "b1"], "z"),
                &[("kernel_shape", &[1, 1][..])],
            );
            let graph = model(
                &[batch as i64, channels as i64, h as i64, w as i64],
                vec![depthwise, pointwise, node("Relu", &["z"], "r")],
                vec![
                    floats(
                        "k",
                        &[channels as i64, 1, kernel[0], kernel[1]],
                        &pseudo_random(channels * taps, 7, 1.0),
                    ),
                    floats("b", &[channels as i64], &pseudo_random(channels, 8, 0.5)),
                    floats(
                        "k1",
                        &[expanded as i64, channels as i64, 1, 1],
                        &pseudo_random(expanded * channels, 10, 1.0),
                    ),
                    floats("b1", &[expanded as i64], &pseudo_random(expanded, 11, 0.5)),
                ],
                &["r"],
            );
            let bytes = graph.encode_to_vec();
            let shape = [batch, channels, h, w];
            let xs = pseudo_random(shape.iter().product(), 9, 2.0);
            let (want, theirs) = plan_and_run(&bytes, &shape, &xs, false);
            let (got, ours) = plan_and_run(&bytes, &shape, &xs, true);
            assert_eq!(count(&theirs, "NepheleDepthwise"), 0, "{case}");
            assert_eq!(count(&ours, "NepheleDepthwise"), 1, "{case}: {ours:?}");
            assert_eq!(count(&ours, "NephelePointwise"), 1, "{case}: {ours:?}");
            assert_close(&got, &want, 1e-5, case);
        }
    }

    /// Subnormal weights are laid out as zeros, every other value as it is.
    #[test]
    fn weights_are_flushed_of_subnormals_only() {
        let tiny = f32::MIN_POSITIVE / 2.0;
        let values = vec![tiny, -tiny, f32::MIN_POSITIVE, -0.5, 0.0, 3.0];
        let flushed = Weights::flushed(values);
        assert_eq!(&*flushed.0, &[0.0, 0.0, f32::MIN_POSITIVE, -0.5, 0.0, 3.0]);
    }

    /// Products of an activation by constant weights (`MatMul`, `Gemm` with its
    /// weights transposed; 2-D and 3-D activations; rows, shared dimension and columns
    /// across the kernel's blocks) run on [`crate::dense`], absorbing a bias added over
    /// the columns, and answer what tract's own plan answers.
    #[test]
    fn products_by_constant_weights_answer_as_tracts_own() {
        // Name, input shape, nodes, weights' shape, bias's shape (if any), whether an
        // `Add` is left (a bias that is not over the columns alone).
        type Case = (
            &'static str,
            Vec<usize>,
            Vec<NodeProto>,
            Vec<i64>,
            Option<Vec<i64>>,
            bool,
        );
        let matmul_add = || {
            vec![
                node("MatMul", &["x", "w"], "y"),
                node("Add", &["y", "b"], "z"),
            ]
        };
        let cases: Vec<Case> = vec![
            (
                "MatMul + Add, [1, 5, 40]",
                vec![1, 5, 40],
                matmul_add(),
                vec![40, 70],
                Some(vec![70]),
                false,
            ),
            (
                "MatMul, [13, 200]",
                vec![13, 200],
                vec![node("MatMul", &["x", "w"], "z")],
                vec![200, 130],
                None,
                false,
            ),
            (
                "MatMul + Add, [2, 3, 7]",
                vec![2, 3, 7],
                matmul_add(),
                vec![7, 64],
                Some(vec![1, 64]),
                false,
            ),
            (
                "MatMul + Add of a bias per row",
                vec![7, 33],
                matmul_add(),
                vec![33, 50],
                Some(vec![7, 50]),
                true,
            ),
            (
                "Gemm with transB",
                vec![7, 33],
                vec![with_ints(
                    node("Gemm", &["x", "w", "b"], "z"),
                    &[("transB", &[1][..])],
                )],
                vec![50, 33],
                Some(vec![50]),
                false,
            ),
        ];
        for (case, shape, nodes, w_shape, b_shape, add_left) in cases {
            let volume = |dims: &[i64]| dims.iter().product::<i64>() as usize;
            let mut initializers = vec![floats(
                "w",
                &w_shape,
                &pseudo_random(volume(&w_shape), 5, 1.0),
            )];
            if let Some(b) = &b_shape {
                initializers.push(floats("b", b, &pseudo_random(volume(b), 6, 1.0)));
            }
            let dims: Vec<i64> = shape.iter().map(|d| *d as i64).collect();
            let graph = model(&dims, nodes, initializers, &["z"]);
            let bytes = graph.encode_to_vec();
            let xs = pseudo_random(shape.iter().product(), 7, 1.0);
            let (want, _) = plan_and_run(&bytes, &shape, &xs, false);
            let (got, ours) = plan_and_run(&bytes, &shape, &xs, true);
            assert_eq!(count(&ours, "NepheleDense"), 1, "{case}: {ours:?}");
            assert!(
                !ours.iter().any(|op| op.contains("MatMul")),
                "{case}: {ours:?}"
            );
            let adds = ours.iter().filter(|op| op.contains("Add")).count();
            assert_eq!(adds > 0, add_left, "{case}: {ours:?}");
            assert_close(&got, &want, 1e-5, case);
        }
    }

    /// Products of two activations, and constants times an activation, stay tract's.
    #[test]
    fn other_products_are_left_to_tract() {
        let cases = [
            (
                "activation by activation",
                vec![
                    node("Transpose", &["x"], "t"),
                    node("MatMul", &["x", "t"], "z"),
                ],
                vec![],
            ),
            (
                "constant by activation",
                vec![node("MatMul", &["w", "x"], "z")],
                vec![floats("w", &[3, 4], &pseudo_random(12, 3, 1.0))],
            ),
        ];
        for (case, nodes, initializers) in cases {
            let graph = model(&[4, 6], nodes, initializers, &["z"]);
            let bytes = graph.encode_to_vec();
            let xs = pseudo_random(24, 4, 1.0);
            let (want, _) = plan_and_run(&bytes, &[4, 6], &xs, false);
            let (got, ops) = plan_and_run(&bytes, &[4, 6], &xs, true);
            assert!(
                !ops.iter().any(|op| op.starts_with("Nephele")),
                "{case}: {ops:?}"
            );
            assert_close(&got, &want, 1e-6, case);
        }
    }

    /// Convolutions with a spatial kernel (pads, strides, dilations, batch 1 and 2,
    /// channel counts across the kernel's blocks) run on [`crate::direct`] and answer
    /// what tract's own plan answers.
    #[test]
    fn spatial_convolutions_answer_as_tracts_own() {
        // Name, kernel, strides, dilations, pads (top, left, bottom, right), batch,
        // input and output channels.
        type Case = (
            &'static str,
            [i64; 2],
            [i64; 2],
            [i64; 2],
            [i64; 4],
            usize,
            usize,
            usize,
        );
        let cases: [Case; 5] = [
            (
                "3x3 same, 96 -> 24",
                [3, 3],
                [1, 1],
                [1, 1],
                [1, 1, 1, 1],
                1,
                96,
                24,
            ),
            (
                "3x3 stride 2, 3 -> 16",
                [3, 3],
                [2, 2],
                [1, 1],
                [1, 1, 1, 1],
                1,
                3,
                16,
            ),
            (
                "5x5 stride (2,1), batch 2",
                [5, 5],
                [2, 1],
                [1, 1],
                [2, 2, 2, 2],
                2,
                5,
                7,
            ),
            (
                "3x3 dilated, unpadded",
                [3, 3],
                [1, 1],
                [2, 2],
                [0, 0, 0, 0],
                1,
                4,
                13,
            ),
            (
                "3x5 uneven pads",
                [3, 5],
                [1, 2],
                [1, 1],
                [0, 2, 1, 1],
                2,
                6,
                6,
            ),
        ];
        let (h, w) = (9usize, 37usize);
        for (case, kernel, strides, dilations, pads, batch, channels, outputs) in cases {
            let taps = (kernel[0] * kernel[1]) as usize;
            let conv = with_ints(
                node("Conv", &["x", "k", "b"], "y"),
                &[
                    ("kernel_shape", &kernel[..]),
                    ("strides", &strides[..]),
                    ("dilations", &dilations[..]),
                    ("pads", &pads[..]),
                ],
            );
            let graph = model(
                &[batch as i64, channels as i64, h as i64, w as i64],
                vec![conv, node("Relu", &["y"], "r")],
                vec![
                    floats(
                        "k",
                        &[outputs as i64, channels as i64, kernel[0], kernel[1]],
                        &pseudo_random(outputs * channels * taps, 7, 1.0),
                    ),
                    floats("b", &[outputs as i64], &pseudo_random(outputs, 8, 0.5)),
                ],
                &["r"],
            );
            let bytes = graph.encode_to_vec();
            let shape = [batch, channels, h, w];
            let xs = pseudo_random(shape.iter().product(), 9, 2.0);
            let (want, theirs) = plan_and_run(&bytes, &shape, &xs, false);
            let (got, ours) = plan_and_run(&bytes, &shape, &xs, true);
            assert_eq!(count(&theirs, "NepheleConv"), 0, "{case}");
            assert_eq!(count(&ours, "NepheleConv"), 1, "{case}: {ours:?}");
            assert_close(&got, &want, 1e-4, case);
        }
    }

    /// Convolutions no kernel of ours runs stay tract's: a grouped one that is not
    /// depthwise, a 1×1 with a stride.
    #[test]
    fn other_convolutions_are_left_to_tract() {
        let cases = [
            ("two channels a group", 2i64, [3i64, 3], [1i64, 1], 2usize),
            ("1x1 strided", 1, [1, 1], [2, 2], 4),
        ];
        for (case, group, kernel, strides, per_group) in cases {
            let conv = with_ints(
                node("Conv", &["x", "k"], "y"),
                &[
                    ("group", &[group][..]),
                    ("kernel_shape", &kernel[..]),
                    ("strides", &strides[..]),
                ],
            );
            let taps = (kernel[0] * kernel[1]) as usize;
            let graph = model(
                &[1, 4, 8, 8],
                vec![conv],
                vec![floats(
                    "k",
                    &[4, per_group as i64, kernel[0], kernel[1]],
                    &pseudo_random(4 * per_group * taps, 3, 1.0),
                )],
                &["y"],
            );
            let xs = pseudo_random(256, 4, 1.0);
            let bytes = graph.encode_to_vec();
            let (want, _) = plan_and_run(&bytes, &[1, 4, 8, 8], &xs, false);
            let (got, ops) = plan_and_run(&bytes, &[1, 4, 8, 8], &xs, true);
            assert!(
                !ops.iter().any(|op| op.starts_with("Nephele")),
                "{case}: {ops:?}"
            );
            assert_close(&got, &want, 1e-6, case);
        }
    }
}
