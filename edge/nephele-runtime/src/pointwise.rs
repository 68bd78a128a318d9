//! Pointwise (1×1) convolutions (f32, NCHW or CHW, no stride, padding or groups) run
//! by the runtime's own kernel instead of tract's packed matrix product.
//!
//! A 1×1 convolution is a matrix product, `out[co, p] = Σ w[co, ci] · x[ci, p] + b[co]`
//! over the plane's points p. tract runs it as a general product: the input packed
//! into panels for every run, then its 16×12 kernel, which on the mobile CNNs' layers
//! (8–32 input channels expanded to 88–200, a few hundred points) spent most of its
//! time packing and storing rather than multiplying (ppocr-cls: 0.63 ms in its
//! products and 0.16 ms packing, `nephele bench inference --only profile`). Here each input channel's row is
//! already contiguous over the points, so nothing is packed: a block of 4 output
//! channels × 64 points is 16 vector accumulators in registers, and every input channel
//! adds one row segment (4 vector loads) times 4 weights (broadcast) into them. The
//! weights are laid out once, when the model loads, in the order the kernel reads
//! them. The loops are safe Rust the compiler vectorises, built for AVX-512 or AVX2 with
//! FMA and chosen at run time, as in [`crate::depthwise`].

use tract_onnx::prelude::*;
use tract_onnx::tract_core::internal::*;
use tract_onnx::tract_core::ops::cnn::{Conv, KernelFormat, PaddingSpec};
use tract_onnx::tract_core::ops::nn::DataFormat;

use crate::kernels::{fma, Weights};

/// Output channels a block computes together.
const ROWS: usize = 4;
/// Points a block computes together: 4 vectors of 16 lanes.
const WIDE: usize = 64;
/// Points of the narrower blocks for what is left of a row: one vector.
const NARROW: usize = 16;

/// The weights (`[outputs, inputs]`) as a kernel computing `R` output channels
/// together reads them ([`ROWS`] here): per block of `R` output channels, per input,
/// the block's `R` weights side by side (zero past the last output channel).
pub(crate) fn interleave<const R: usize>(
    weights: &[f32],
    outputs: usize,
    inputs: usize,
) -> Vec<f32> {
    let blocks = outputs.div_ceil(R);
    let mut laid = vec![0.0; blocks * inputs * R];
    for co in 0..outputs {
        for ci in 0..inputs {
            laid[((co / R) * inputs + ci) * R + co % R] = weights[co * inputs + ci];
        }
    }
    laid
}

/// `out = w · x + b` for `batch` images: `input` `[batch, inputs, points]`, `laid` the
/// weights as [`interleave`] lays them, `bias` `[outputs]`; the output is `[batch,
/// outputs, points]`.
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
    let layer = Layer {
        laid,
        bias,
        inputs,
        outputs,
        points,
    };
    let images = input
        .chunks_exact(inputs * points)
        .zip(output.chunks_exact_mut(outputs * points));
    for (x, out) in images {
        image(x, &layer, out);
    }
    output
}

/// A layer's weights (as [`interleave`] lays them), bias and sizes.
struct Layer<'a> {
    laid: &'a [f32],
    bias: &'a [f32],
    inputs: usize,
    outputs: usize,
    points: usize,
}

fn image(x: &[f32], layer: &Layer, out: &mut [f32]) {
    // The only `unsafe` here: calling the kernel built for CPU features the baseline
    // x86_64 target lacks, after checking at run time that this CPU has them.
    #[cfg(target_arch = "x86_64")]
    #[allow(unsafe_code)]
    {
        if std::arch::is_x86_feature_detected!("avx512f") {
            // SAFETY: the CPU has AVX-512F (and with it AVX2 and FMA), checked above.
            return unsafe { image_avx512(x, layer, out) };
        }
        if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma")
        {
            // SAFETY: the CPU has AVX2 and FMA, checked above.
            return unsafe { image_avx2(x, layer, out) };
        }
    }
    // NEON and its fused multiply-add are part of aarch64's baseline.
    #[cfg(target_arch = "aarch64")]
    return image_of::<true>(x, layer, out);
    #[allow(unreachable_code)]
    image_of::<false>(x, layer, out)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx2,fma")]
fn image_avx512(x: &[f32], layer: &Layer, out: &mut [f32]) {
    image_of::<true>(x, layer, out)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
fn image_avx2(x: &[f32], layer: &Layer, out: &mut [f32]) {
    image_of::<true>(x, layer, out)
}

/// One image: blocks of [`WIDE`] points (then [`NARROW`] ones, the last overlapping
/// the one before it, then single points when the row is shorter than that) for every
/// block of [`ROWS`] output channels.
#[inline(always)]
fn image_of<const FMA: bool>(x: &[f32], layer: &Layer, out: &mut [f32]) {
    let Layer {
        laid,
        bias,
        inputs,
        outputs,
        points,
    } = *layer;
    let mut p = 0;
    while p + WIDE <= points {
        for block in 0..outputs.div_ceil(ROWS) {
            tile::<FMA, WIDE>(x, layer, block, p, out);
        }
        p += WIDE;
    }
    if points >= NARROW {
        while p < points {
            let at = p.min(points - NARROW);
            for block in 0..outputs.div_ceil(ROWS) {
                tile::<FMA, NARROW>(x, layer, block, at, out);
            }
            p = at + NARROW;
        }
    }
    for p in p..points {
        for co in 0..outputs {
            let weights = &laid[(co / ROWS) * inputs * ROWS..][..inputs * ROWS];
            let mut acc = bias[co];
            for ci in 0..inputs {
                acc = fma::<FMA>(weights[ci * ROWS + co % ROWS], x[ci * points + p], acc);
            }
            out[co * points + p] = acc;
        }
    }
}

/// Output channels `block * ROWS ..` (those that exist) at points `p..p + N`.
#[inline(always)]
fn tile<const FMA: bool, const N: usize>(
    x: &[f32],
    layer: &Layer,
    block: usize,
    p: usize,
    out: &mut [f32],
) {
    let Layer {
        laid,
        bias,
        inputs,
        outputs,
        points,
    } = *layer;
    let co = block * ROWS;
    let mut acc = [[0.0f32; N]; ROWS];
    for (r, acc) in acc.iter_mut().enumerate() {
        acc.fill(bias.get(co + r).copied().unwrap_or(0.0));
    }
    let weights = &laid[block * inputs * ROWS..][..inputs * ROWS];
    for (ci, w) in weights.chunks_exact(ROWS).enumerate() {
        let Some(row) = x.get(ci * points + p..ci * points + p + N) else {
            continue;
        };
        let row: &[f32; N] = row.try_into().unwrap_or(&[0.0; N]);
        for r in 0..ROWS {
            for lane in 0..N {
                acc[r][lane] = fma::<FMA>(w[r], row[lane], acc[r][lane]);
            }
        }
    }
    for (r, acc) in acc.iter().enumerate().take(outputs - co) {
        out[(co + r) * points + p..][..N].copy_from_slice(acc);
    }
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
    /// As [`interleave`] lays them.
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
    let laid = interleave::<ROWS>(weights.as_slice::<f32>()?, outputs, inputs);
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
        /// Every size (rows of fewer points than a vector, channels not a multiple of
        /// the block) gives the textbook sum, with the CPU's vector kernel and without.
        #[test]
        fn the_kernel_computes_the_matrix_product(
            inputs in 1usize..40,
            outputs in 1usize..23,
            points in 0usize..150,
            batch in 1usize..3,
            seed in any::<u64>(),
        ) {
            let x = values(batch * inputs * points, seed);
            let w = values(outputs * inputs, seed ^ 1);
            let b = values(outputs, seed ^ 2);
            let laid = interleave::<ROWS>(&w, outputs, inputs);
            let fast = run(&x, &laid, &b, inputs, outputs, points);
            let mut plain = vec![0.0; fast.len()];
            for (xi, oi) in x.chunks_exact((inputs * points).max(1)).zip(plain.chunks_exact_mut((outputs * points).max(1))) {
                if points > 0 {
                    let layer = Layer { laid: &laid, bias: &b, inputs, outputs, points };
                    image_of::<false>(xi, &layer, oi);
                }
            }
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
                        prop_assert!((plain[at] - want).abs() <= 1e-5 * (1.0 + want.abs()), "{} vs {}", plain[at], want);
                    }
                }
            }
        }
    }
}
