//! Pointwise (1×1) convolutions (f32, NCHW or CHW, no stride, padding or groups) run
//! by the runtime's own kernel instead of tract's packed matrix product.
//!
//! A 1×1 convolution is a matrix product, `out[co, p] = Σ w[co, ci] · x[ci, p] + b[co]`
//! over the plane's points p. tract runs it as a general product: the input packed
//! into panels for every run, then its 16×12 kernel, which on the mobile CNNs' layers
//! (8–32 input channels expanded to 88–200, a few hundred points) spent most of its
//! time packing and storing rather than multiplying (ppocr-cls: 0.63 ms in its
//! products and 0.16 ms packing, `nephele bench inference --only profile`). Here it is
//! a convolution of one tap on [`crate::direct`]'s row kernel: the plane is taken in
//! segments of up to 512 points whose rows (one per input channel, each contiguous
//! over the points) are copied side by side into a small window that stays in the
//! second-level cache while every block of output channels reads it, and each block of
//! 6 output channels × 64 points (16 with AVX2) adds one row segment times 6 weights
//! per input channel in register accumulators. (The kernel this replaced read the
//! input rows in place, a plane apart, 4 channels × 64 points at a time: right for
//! AVX-512's 32 registers and small planes, it spilled AVX2's 16 and lost to tract's
//! products there.) The weights are laid out once, when the model loads.

use tract_onnx::prelude::*;
use tract_onnx::tract_core::internal::*;
use tract_onnx::tract_core::ops::cnn::{Conv, KernelFormat, PaddingSpec};
use tract_onnx::tract_core::ops::nn::DataFormat;

use crate::direct::{lay_out, row, ROWS, WIDE_LANES};
use crate::kernels::Weights;

/// Floats of the input a segment copies (its points of every input channel): 64 KiB,
/// within the second-level cache while every block of output channels reads it.
const SEGMENT_FLOATS: usize = 16 * 1024;

/// `out = w · x + b` for `batch` images: `input` `[batch, inputs, points]`, `laid` the
/// weights as [`lay_out`] lays them (one tap), `bias` `[outputs]`; the output is
/// `[batch, outputs, points]`.
///
/// # Panics
/// When a slice's length does not match the sizes (a caller's bug, never input).
pub fn run(
    input: &[f32],
    laid: &[f32],
    bias: &[f32],
    inputs: usize,
    outputs: usize,
    points: usize,
) -> Vec<f32> {
    let batch = input.len() / (inputs * points).max(1);
    assert_eq!(input.len(), batch * inputs * points);
    assert_eq!(laid.len(), outputs.div_ceil(ROWS) * inputs * ROWS);
    assert_eq!(bias.len(), outputs);
    let mut output = vec![0.0f32; batch * outputs * points];
    if points == 0 || inputs == 0 {
        for (o, b) in output
            .chunks_exact_mut(points.max(1))
            .zip(bias.iter().cycle())
        {
            o.fill(*b);
        }
        return output;
    }
    // Points a segment holds: a whole number of vectors, 64 to 512 of them.
    let segment = (SEGMENT_FLOATS / inputs / WIDE_LANES * WIDE_LANES).clamp(64, 512);
    let mut window = vec![0.0f32; inputs * segment];
    let mut rows = vec![0.0f32; ROWS * segment];
    let mut offsets = vec![0usize; inputs];
    let images = input
        .chunks_exact(inputs * points)
        .zip(output.chunks_exact_mut(outputs * points));
    for (x, out) in images {
        for p0 in (0..points).step_by(segment) {
            let len = segment.min(points - p0);
            let width = len.div_ceil(WIDE_LANES) * WIDE_LANES;
            // The segment's points of every input channel side by side, each row
            // padded with zeros to whole vectors.
            for (ci, (at, line)) in offsets
                .iter_mut()
                .zip(window.chunks_exact_mut(width))
                .enumerate()
            {
                *at = ci * width;
                line[..len].copy_from_slice(&x[ci * points + p0..][..len]);
                line[len..].fill(0.0);
            }
            let rows = &mut rows[..ROWS * width];
            for block in 0..outputs.div_ceil(ROWS) {
                let weights = &laid[block * inputs * ROWS..][..inputs * ROWS];
                let bias = &bias[block * ROWS..outputs.min((block + 1) * ROWS)];
                row(&window[..inputs * width], &offsets, weights, bias, rows);
                for (r, computed) in rows.chunks_exact(width).take(bias.len()).enumerate() {
                    out[(block * ROWS + r) * points + p0..][..len]
                        .copy_from_slice(&computed[..len]);
                }
            }
        }
    }
    output
}

/// tract's operator for a 1×1 convolution run by [`run`], wired as the `Conv` was
/// (image, kernel, bias): it reads the kernel as it laid it out when the model loaded,
/// and the bias (`[outputs]` or one value) as it comes, which may be computed from
/// constants that tract's declutter has not folded yet when the swap is made.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pointwise {
    inputs: usize,
    outputs: usize,
    /// Whether the input has its batch axis (`NCHW`) or not (`CHW`).
    batch_axis: bool,
    /// As [`lay_out`] lays them.
    laid: Weights,
}

impl Op for Pointwise {
    fn name(&self) -> StaticName {
        "NephelePointwise".into()
    }

    fn info(&self) -> TractResult<Vec<String>> {
        Ok(vec![format!(
            "{} -> {} channels",
            self.inputs, self.outputs
        )])
    }

    fn validation(&self) -> Validation {
        Validation::Rounding
    }

    op_as_typed_op!();
}

impl EvalOp for Pointwise {
    op_out_of_plan!();

    fn eval(&self, _: &EvalContext, inputs: TVec<TValue>) -> TractResult<TVec<TValue>> {
        let (input, _kernel, bias) = args_3!(inputs);
        let bias = bias.try_as_plain_ram()?;
        let bias = bias.as_slice::<f32>()?;
        let bias: Vec<f32> = match bias.len() {
            n if n == self.outputs => bias.to_vec(),
            1 => vec![bias[0]; self.outputs],
            n => bail!(
                "1x1 convolution of {} channels given {n} biases",
                self.outputs
            ),
        };
        let shape = input.shape();
        let axes = usize::from(self.batch_axis);
        ensure!(
            shape.len() == 3 + axes
                && shape[axes] == self.inputs
                && input.datum_type() == f32::datum_type(),
            "1x1 convolution of {} channels given {:?} {:?}",
            self.inputs,
            shape,
            input.datum_type()
        );
        let points = shape[axes + 1] * shape[axes + 2];
        let mut out_shape: TVec<usize> = shape.into();
        out_shape[axes] = self.outputs;
        let source = input.try_as_plain_ram()?;
        let output = run(
            source.as_slice::<f32>()?,
            &self.laid.0,
            &bias,
            self.inputs,
            self.outputs,
            points,
        );
        let output = tract_ndarray::ArrayD::from_shape_vec(&*out_shape, output)?.into_tensor();
        Ok(tvec!(output.into_tvalue()))
    }
}

impl TypedOp for Pointwise {
    fn output_facts(&self, inputs: &[&TypedFact]) -> TractResult<TVec<TypedFact>> {
        let mut shape = inputs[0].shape.to_tvec();
        shape[usize::from(self.batch_axis)] = self.outputs.to_dim();
        Ok(tvec!(f32::fact(shape)))
    }

    fn cost(&self, inputs: &[&TypedFact]) -> TractResult<TVec<(Cost, TDim)>> {
        // Every input value is multiplied once per output channel.
        let volume: TDim = inputs[0].shape.iter().product();
        Ok(tvec!((Cost::FMA(f32::datum_type()), volume * self.outputs)))
    }

    as_op!();
}

/// The [`Pointwise`] for a tract `Conv` node of `model`, when it is one this kernel runs.
pub fn pointwise_for(model: &TypedModel, node: &TypedNode) -> TractResult<Option<Pointwise>> {
    let Some(conv) = node.op_as::<Conv>() else {
        return Ok(None);
    };
    let spec = &conv.pool_spec;
    let ones = |v: &[usize]| v.iter().all(|d| *d == 1);
    let unpadded = match &spec.padding {
        PaddingSpec::Valid => true,
        PaddingSpec::Explicit(before, after) => before.iter().chain(after.iter()).all(|p| *p == 0),
        _ => false,
    };
    if conv.q_params.is_some()
        || !matches!(spec.data_format, DataFormat::NCHW | DataFormat::CHW)
        || conv.kernel_fmt != KernelFormat::OIHW
        || spec.kernel_shape[..] != [1, 1]
        || !ones(&spec.strides())
        || !ones(&spec.dilations())
        || !unpadded
        || conv.group != 1
        || node.inputs.len() != 3
    {
        return Ok(None);
    }
    let input = model.outlet_fact(node.inputs[0])?;
    // The bias may still be computed from constants here (before tract's declutter
    // folds them): it stays an input of the operator.
    let bias = model.outlet_fact(node.inputs[2])?;
    let (Some(shape), Some(kernel)) = (
        input.shape.as_concrete(),
        model.outlet_fact(node.inputs[1])?.konst.as_ref(),
    ) else {
        return Ok(None);
    };
    let (inputs, outputs) = (spec.input_channels, spec.output_channels);
    let batch_axis = spec.data_format == DataFormat::NCHW;
    let axes = usize::from(batch_axis);
    if input.datum_type != f32::datum_type()
        || kernel.datum_type() != f32::datum_type()
        || bias.datum_type != f32::datum_type()
        || shape.len() != 3 + axes
        || shape[axes] != inputs
        || kernel.shape() != [outputs, inputs, 1, 1]
        || !(bias.shape.volume() == outputs.to_dim() || bias.shape.volume() == 1.to_dim())
        || inputs == 0
        || outputs == 0
    {
        return Ok(None);
    }
    let weights = kernel.try_as_plain_ram()?;
    let laid = lay_out(weights.as_slice::<f32>()?, outputs, inputs, 1);
    Ok(Some(Pointwise {
        inputs,
        outputs,
        batch_axis,
        laid: Weights::flushed(laid),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn values(n: usize, seed: u64) -> Vec<f32> {
        crate::test_graphs::pseudo_random(n, seed, 1.0)
    }

    proptest! {
        /// Every size (rows of fewer points than a vector, several segments, channels
        /// not a multiple of the block) gives the textbook sum.
        #[test]
        fn the_kernel_computes_the_matrix_product(
            inputs in 1usize..40,
            outputs in 1usize..23,
            points in prop_oneof![0usize..150, 500usize..1300],
            batch in 1usize..3,
            seed in any::<u64>(),
        ) {
            let x = values(batch * inputs * points, seed);
            let w = values(outputs * inputs, seed ^ 1);
            let b = values(outputs, seed ^ 2);
            let fast = run(&x, &lay_out(&w, outputs, inputs, 1), &b, inputs, outputs, points);
            prop_assert_eq!(fast.len(), batch * outputs * points);
            for n in 0..batch {
                for co in 0..outputs {
                    for p in 0..points {
                        let mut want = b[co];
                        for ci in 0..inputs {
                            want += w[co * inputs + ci] * x[(n * inputs + ci) * points + p];
                        }
                        let at = (n * outputs + co) * points + p;
                        prop_assert!((fast[at] - want).abs() <= 1e-5 * (1.0 + want.abs()), "{} vs {}", fast[at], want);
                    }
                }
            }
        }
    }
}
