//! Convolutions of every input channel into every output channel with a spatial
//! kernel (3×3 and the like, f32, NCHW or CHW, no groups) run by the runtime's own
//! kernel instead of tract's im2col product.
//!
//! tract runs such a layer as a matrix product over an im2col copy of its input: every
//! input value written once per kernel tap (nine times for a 3×3), then packed and
//! multiplied by its kernel. PP-OCR's detector at 640×640 has five 96 → 24 channel 3×3
//! layers (1.24 G multiply-adds, 1.06 G of them in the two on 160×160 planes) and a
//! 3×3 stem; tract's products and the `Pad` passes before them took 64 ms of a
//! 240 ms run on a 2-vCPU AMD EPYC (`time_model --ops`). Here nothing is copied per
//! tap: the input rows an output row reads are loaded once into zero-padded rows
//! (split into their stride phases when the stride along the width is above 1, as in
//! [`crate::depthwise`]), so every tap of a block of output columns is one contiguous
//! read. A block of [`ROWS`] output channels × 64 columns is 24 vector
//! accumulators with AVX-512, and every (input channel, tap) adds one row segment (4
//! vector loads) times [`ROWS`] weights (broadcast) into them, 24 multiply-adds for 10
//! loads, as in [`crate::dense`]; with AVX2's 16 registers the block is [`ROWS`] × 16
//! columns (12 accumulators). The weights are laid out once, when the model loads, in
//! the order the kernel reads them. Safe loops the compiler vectorises, built for
//! AVX-512 or AVX2 with FMA and chosen at run time.
//!
//! [`direct_for`] says which `Conv` nodes of a decluttered model it takes;
//! [`crate::kernels::optimized`] swaps them in before tract's codegen lowers them.

use tract_onnx::prelude::*;
use tract_onnx::tract_core::internal::*;

use crate::depthwise::{conv_parts, fma_cost, load_row, Geometry};
use crate::kernels::{fma, Weights};

/// Output channels a block computes together.
pub(crate) const ROWS: usize = 6;
/// Lanes of an AVX-512 vector register, and of the narrower builds (AVX2, and the
/// baseline builds, whose registers hold 8 or 4).
pub(crate) const WIDE_LANES: usize = 16;
const LANES: usize = 8;

/// A layer's sizes (`channels` the input's), weights as [`lay_out`] lays them, and
/// bias.
pub struct Layer<'a> {
    pub geo: &'a Geometry,
    pub outputs: usize,
    pub laid: &'a [f32],
    pub bias: &'a [f32],
}

/// The weights (`[outputs, channels, kernel_h, kernel_w]`, OIHW) as [`row`] reads
/// them: per block of [`ROWS`] output channels, per (input channel, tap), the block's
/// [`ROWS`] weights side by side (zero past the last output channel).
pub fn lay_out(weights: &[f32], outputs: usize, channels: usize, taps: usize) -> Vec<f32> {
    let inputs = channels * taps;
    let mut laid = vec![0.0; outputs.div_ceil(ROWS) * inputs * ROWS];
    for co in 0..outputs {
        for ci in 0..inputs {
            laid[((co / ROWS) * inputs + ci) * ROWS + co % ROWS] = weights[co * inputs + ci];
        }
    }
    laid
}

/// Runs the layer on `batch` images: `input` is `[batch, channels, in_h, in_w]`; the
/// output is `[batch, outputs, out_h, out_w]`.
///
/// # Panics
/// When a slice's length does not match the sizes (a caller's bug, never input).
pub fn run(layer: &Layer, input: &[f32]) -> Vec<f32> {
    let geo = layer.geo;
    let image = geo.channels * geo.in_plane();
    let batch = input.len() / image.max(1);
    assert_eq!(input.len(), batch * image);
    assert_eq!(
        layer.laid.len(),
        layer.outputs.div_ceil(ROWS) * ROWS * geo.channels * geo.taps()
    );
    assert_eq!(layer.bias.len(), layer.outputs);
    let mut output = vec![0.0f32; batch * layer.outputs * geo.out_plane()];
    if image == 0 || geo.out_plane() == 0 {
        return output;
    }
    images(layer, input, &mut output, row);
    output
}

/// One output row of one block of output channels ([`row_of`]) on the kernel built
/// for this CPU: the call crosses into a build for CPU features the baseline target
/// lacks here, one row at a time, so that the compiler sees the row's operands as
/// the parameters they are (inlined into a larger function, it could not tell them
/// from the accumulators and kept those in memory).
pub(crate) fn row(
    window: &[f32],
    offsets: &[usize],
    weights: &[f32],
    bias: &[f32],
    rows: &mut [f32],
) {
    // The only `unsafe` here: calling the kernel built for CPU features the baseline
    // x86_64 target lacks, after checking at run time that this CPU has them.
    #[cfg(target_arch = "x86_64")]
    #[allow(unsafe_code)]
    {
        if std::arch::is_x86_feature_detected!("avx512f") {
            // SAFETY: the CPU has AVX-512F (and with it AVX2 and FMA), checked above.
            return unsafe { row_avx512(window, offsets, weights, bias, rows) };
        }
        if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma")
        {
            // SAFETY: the CPU has AVX2 and FMA, checked above.
            return unsafe { row_avx2(window, offsets, weights, bias, rows) };
        }
    }
    // NEON and its fused multiply-add are part of aarch64's baseline.
    #[cfg(target_arch = "aarch64")]
    return row_of::<true, LANES>(window, offsets, weights, bias, rows);
    #[allow(unreachable_code)]
    row_of::<false, LANES>(window, offsets, weights, bias, rows)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx2,fma")]
fn row_avx512(window: &[f32], offsets: &[usize], weights: &[f32], bias: &[f32], rows: &mut [f32]) {
    row_of::<true, WIDE_LANES>(window, offsets, weights, bias, rows)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
fn row_avx2(window: &[f32], offsets: &[usize], weights: &[f32], bias: &[f32], rows: &mut [f32]) {
    row_of::<true, LANES>(window, offsets, weights, bias, rows)
}

/// Computes one output row of one block of output channels: the window, where each
/// (input channel, tap) reads in it, the block's weights and bias, the row
/// (`[ROWS, width]`).
type RowKernel = fn(&[f32], &[usize], &[f32], &[f32], &mut [f32]);

/// Every output row of every image. The input rows the row reads (all channels) sit
/// in a rolling window of zero-padded rows, each loaded once as the window moves
/// down; a row above or below the input reads a row of zeros. Then each block of
/// output channels computes the row with `kernel` (whole vectors: the row's width is
/// rounded up to [`WIDE_LANES`] columns).
fn images(layer: &Layer, input: &[f32], out: &mut [f32], kernel: RowKernel) {
    let geo = layer.geo;
    let stride = geo.stride_w;
    let width = geo.out_w.div_ceil(WIDE_LANES) * WIDE_LANES;
    let phase_len = width + (geo.kernel_w - 1) * geo.dilation_w / stride;
    // Per kernel column, where it reads within a padded row: output column ox reads
    // padded column ox * stride + kx * dilation, which is position ox + shift of its
    // stride phase.
    let columns: Vec<usize> = (0..geo.kernel_w)
        .map(|kx| kx * geo.dilation_w)
        .map(|offset| (offset % stride) * phase_len + offset / stride)
        .collect();
    let padded_w = phase_len * stride;
    let span = (geo.kernel_h - 1) * geo.dilation_h + 1;
    // Slot (channel, row % span), then one row of zeros.
    let zeros = geo.channels * span * padded_w;
    let mut window = vec![0.0f32; zeros + padded_w];
    let mut loaded = vec![usize::MAX; span];
    let mut line = vec![0.0f32; padded_w];
    let taps = geo.channels * geo.taps();
    let mut offsets = vec![zeros; taps];
    // One output row of a block's channels, `width` columns each.
    let mut rows = vec![0.0f32; ROWS * width];
    let in_row = |oy: usize, ky: usize| {
        let iy = (oy * geo.stride_h + ky * geo.dilation_h) as isize - geo.pad_top as isize;
        (iy >= 0 && (iy as usize) < geo.in_h).then_some(iy as usize)
    };
    let (in_image, out_image) = (
        geo.channels * geo.in_plane(),
        layer.outputs * geo.out_plane(),
    );
    for (source, target) in input
        .chunks_exact(in_image)
        .zip(out.chunks_exact_mut(out_image))
    {
        loaded.fill(usize::MAX);
        for oy in 0..geo.out_h {
            for iy in (0..geo.kernel_h).filter_map(|ky| in_row(oy, ky)) {
                if loaded[iy % span] == iy {
                    continue;
                }
                loaded[iy % span] = iy;
                for c in 0..geo.channels {
                    let row = &source[(c * geo.in_h + iy) * geo.in_w..][..geo.in_w];
                    let slot = &mut window[(c * span + iy % span) * padded_w..][..padded_w];
                    load_row(geo, phase_len, row, slot, &mut line);
                }
            }
            // Where each (channel, tap) of this row reads, in the kernel's order.
            for (c, per_channel) in offsets.chunks_exact_mut(geo.taps()).enumerate() {
                for (ky, per_row) in per_channel.chunks_exact_mut(geo.kernel_w).enumerate() {
                    let base = in_row(oy, ky).map(|iy| (c * span + iy % span) * padded_w);
                    for (at, column) in per_row.iter_mut().zip(&columns) {
                        *at = base.map_or(zeros, |base| base + column);
                    }
                }
            }
            for block in 0..layer.outputs.div_ceil(ROWS) {
                let weights = &layer.laid[block * taps * ROWS..][..taps * ROWS];
                let bias = &layer.bias[block * ROWS..layer.outputs.min((block + 1) * ROWS)];
                kernel(&window, &offsets, weights, bias, &mut rows);
                let out_at = block * ROWS * geo.out_plane() + oy * geo.out_w;
                for (r, computed) in rows.chunks_exact(width).take(bias.len()).enumerate() {
                    target[out_at + r * geo.out_plane()..][..geo.out_w]
                        .copy_from_slice(&computed[..geo.out_w]);
                }
            }
        }
    }
}

/// One output row of one block of output channels into `rows` (`[ROWS, width]`), given
/// the window, where each (input channel, tap) reads in it and the block's weights for
/// them: in tiles of `4 · V`, `2 · V` or `V` columns (`V` the vector's lanes, 16 with
/// AVX-512) or, with narrower vectors, of `2 · V` or `V` columns: [`ROWS`] × 2
/// accumulators and the row's two vectors fill AVX2's 16 registers, and a wider tile
/// would spill them.
#[inline(always)]
fn row_of<const FMA: bool, const V: usize>(
    window: &[f32],
    offsets: &[usize],
    weights: &[f32],
    bias: &[f32],
    rows: &mut [f32],
) {
    let width = rows.len() / ROWS;
    let mut ox = 0;
    while ox < width {
        ox += match ((width - ox) / V, V == WIDE_LANES) {
            (1, true) => tile::<FMA, WIDE_LANES>(window, offsets, weights, bias, ox, rows),
            (2 | 3, true) => {
                tile::<FMA, { 2 * WIDE_LANES }>(window, offsets, weights, bias, ox, rows)
            }
            (_, true) => tile::<FMA, { 4 * WIDE_LANES }>(window, offsets, weights, bias, ox, rows),
            (1, false) => tile::<FMA, LANES>(window, offsets, weights, bias, ox, rows),
            (_, false) => tile::<FMA, { 2 * LANES }>(window, offsets, weights, bias, ox, rows),
        };
    }
}

/// Output columns `ox..ox + N` of the row for the block's channels (`bias` holds those
/// that exist: fewer than [`ROWS`] in the last block), `N / V` vectors per channel held
/// in registers, stored whole into `rows`; returns `N`. Every operand is a parameter of
/// its own, not a field of a struct: through a struct the compiler cannot tell the
/// reads from the accumulators apart and keeps those in memory.
#[inline(always)]
fn tile<const FMA: bool, const N: usize>(
    window: &[f32],
    offsets: &[usize],
    weights: &[f32],
    bias: &[f32],
    ox: usize,
    rows: &mut [f32],
) -> usize {
    let width = rows.len() / ROWS;
    let mut acc = [[0.0f32; N]; ROWS];
    for (r, acc) in acc.iter_mut().enumerate() {
        acc.fill(bias.get(r).copied().unwrap_or(0.0));
    }
    for (&at, w) in offsets.iter().zip(weights.chunks_exact(ROWS)) {
        let Some(x) = window.get(at + ox..at + ox + N) else {
            continue;
        };
        let x: &[f32; N] = x.try_into().unwrap_or(&[0.0; N]);
        let w: &[f32; ROWS] = w.try_into().unwrap_or(&[0.0; ROWS]);
        for r in 0..ROWS {
            for lane in 0..N {
                acc[r][lane] = fma::<FMA>(w[r], x[lane], acc[r][lane]);
            }
        }
    }
    for (r, acc) in acc.iter().enumerate() {
        rows[r * width + ox..][..N].copy_from_slice(acc);
    }
    N
}

/// tract's operator for a convolution run by [`run`], weights and bias held in it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Direct {
    /// `channels` is the input's.
    pub geometry: Geometry,
    outputs: usize,
    /// Whether the input has its batch axis (`NCHW`) or not (`CHW`).
    batch_axis: bool,
    /// As [`lay_out`] lays them.
    laid: Weights,
    bias: Weights,
}

impl Op for Direct {
    fn name(&self) -> StaticName {
        "NepheleConv".into()
    }

    fn info(&self) -> TractResult<Vec<String>> {
        Ok(vec![format!(
            "{} -> {} channels, {:?}",
            self.geometry.channels, self.outputs, self.geometry
        )])
    }

    fn validation(&self) -> Validation {
        Validation::Rounding
    }

    op_as_typed_op!();
}

impl EvalOp for Direct {
    op_out_of_plan!();

    fn eval(&self, _: &EvalContext, inputs: TVec<TValue>) -> TractResult<TVec<TValue>> {
        let input = args_1!(inputs);
        let geo = &self.geometry;
        let shape = input.shape();
        let axes = usize::from(self.batch_axis);
        ensure!(
            shape.len() == 3 + axes
                && shape[axes..] == [geo.channels, geo.in_h, geo.in_w][..]
                && input.datum_type() == f32::datum_type(),
            "convolution for {}[{}, {}, {}] f32 given {:?} {:?}",
            if self.batch_axis { "[N] + " } else { "" },
            geo.channels,
            geo.in_h,
            geo.in_w,
            shape,
            input.datum_type()
        );
        let mut out_shape: TVec<usize> = shape[..axes].into();
        out_shape.extend([self.outputs, geo.out_h, geo.out_w]);
        let source = input.try_as_plain_ram()?;
        let layer = Layer {
            geo,
            outputs: self.outputs,
            laid: &self.laid.0,
            bias: &self.bias.0,
        };
        let output = run(&layer, source.as_slice::<f32>()?);
        let output = tract_ndarray::ArrayD::from_shape_vec(&*out_shape, output)?.into_tensor();
        Ok(tvec!(output.into_tvalue()))
    }
}

impl TypedOp for Direct {
    fn output_facts(&self, inputs: &[&TypedFact]) -> TractResult<TVec<TypedFact>> {
        let geo = &self.geometry;
        Ok(tvec!(geo.output_fact(
            inputs[0],
            self.batch_axis,
            self.outputs
        )))
    }

    fn cost(&self, inputs: &[&TypedFact]) -> TractResult<TVec<(Cost, TDim)>> {
        let geo = &self.geometry;
        let per_image = self.outputs * geo.out_plane() * geo.channels * geo.taps();
        Ok(fma_cost(inputs[0], self.batch_axis, per_image))
    }

    as_op!();
}

/// The [`Direct`] for a tract `Conv` node of `model`, when it is one this kernel runs:
/// one group, a kernel of two spatial axes larger than 1×1 (1×1 layers are
/// [`crate::pointwise`]'s or tract's), OIHW kernel and bias constant, f32, every
/// dimension known.
pub fn direct_for(model: &TypedModel, node: &TypedNode) -> TractResult<Option<Direct>> {
    let Some(parts) = conv_parts(model, node)? else {
        return Ok(None);
    };
    let geo = parts.geometry;
    if parts.group != 1 || (geo.kernel_h, geo.kernel_w) == (1, 1) {
        return Ok(None);
    }
    let laid = lay_out(&parts.kernel, parts.outputs, geo.channels, geo.taps());
    Ok(Some(Direct {
        geometry: geo,
        outputs: parts.outputs,
        batch_axis: parts.batch_axis,
        laid: Weights::flushed(laid),
        bias: Weights(parts.bias.into()),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::depthwise::tests::geometry;
    use proptest::prelude::*;

    /// The textbook loop: each output the bias plus every in-bounds tap of every input
    /// channel.
    fn reference(
        geo: &Geometry,
        outputs: usize,
        input: &[f32],
        weights: &[f32],
        bias: &[f32],
    ) -> Vec<f32> {
        let batch = input.len() / geo.in_plane() / geo.channels;
        let mut out = vec![0.0; batch * outputs * geo.out_plane()];
        for n in 0..batch {
            for co in 0..outputs {
                for oy in 0..geo.out_h {
                    for ox in 0..geo.out_w {
                        let mut sum = bias[co];
                        for c in 0..geo.channels {
                            let plane =
                                &input[(n * geo.channels + c) * geo.in_plane()..][..geo.in_plane()];
                            let kernel = &weights[(co * geo.channels + c) * geo.taps()..];
                            for ky in 0..geo.kernel_h {
                                for kx in 0..geo.kernel_w {
                                    let iy = (oy * geo.stride_h + ky * geo.dilation_h) as isize
                                        - geo.pad_top as isize;
                                    let ix = (ox * geo.stride_w + kx * geo.dilation_w) as isize
                                        - geo.pad_left as isize;
                                    if (0..geo.in_h as isize).contains(&iy)
                                        && (0..geo.in_w as isize).contains(&ix)
                                    {
                                        sum += kernel[ky * geo.kernel_w + kx]
                                            * plane[iy as usize * geo.in_w + ix as usize];
                                    }
                                }
                            }
                        }
                        out[((n * outputs + co) * geo.out_h + oy) * geo.out_w + ox] = sum;
                    }
                }
            }
        }
        out
    }

    fn values(n: usize, seed: u64) -> Vec<f32> {
        crate::test_graphs::pseudo_random(n, seed, 1.0)
    }

    proptest! {
        /// Every stride, dilation, padding, channel count and size gives the textbook
        /// loop's answer, with the CPU's vector kernel and without it.
        #[test]
        fn the_kernel_computes_the_textbook_convolution(
            geo in geometry(),
            outputs in 1usize..15,
            batch in 1usize..3,
            seed in any::<u64>(),
        ) {
            let input = values(batch * geo.channels * geo.in_plane(), seed);
            let weights = values(outputs * geo.channels * geo.taps(), seed ^ 1);
            let bias = values(outputs, seed ^ 2);
            let expected = reference(&geo, outputs, &input, &weights, &bias);
            let laid = lay_out(&weights, outputs, geo.channels, geo.taps());
            let layer = Layer { geo: &geo, outputs, laid: &laid, bias: &bias };
            let fast = run(&layer, &input);
            let mut plain = vec![0.0; expected.len()];
            images(&layer, &input, &mut plain, row_of::<false, LANES>);
            let mut wide = vec![0.0; expected.len()];
            images(&layer, &input, &mut wide, row_of::<false, WIDE_LANES>);
            prop_assert_eq!(fast.len(), expected.len());
            for (i, e) in expected.iter().enumerate() {
                prop_assert!((fast[i] - e).abs() <= 1e-4 * (1.0 + e.abs()), "{i}: {} vs {e}", fast[i]);
                prop_assert!((plain[i] - e).abs() <= 1e-4 * (1.0 + e.abs()), "{i}: {} vs {e}", plain[i]);
                prop_assert!((wide[i] - e).abs() <= 1e-4 * (1.0 + e.abs()), "{i}: {} vs {e}", wide[i]);
            }
        }
    }
}
