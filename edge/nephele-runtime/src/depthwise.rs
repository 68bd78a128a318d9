//! Depthwise convolutions (one 2-D filter per channel, f32, NCHW or CHW) run by the
//! runtime's own kernel instead of tract's `DepthWiseConv`.
//!
//! tract walks a depthwise layer zone by zone through its generic patch machinery
//! (ppocr-cls' 11 depthwise layers: 0.36 ms of its run in `nephele bench inference
//! --only profile`), slowest on the 5×5 ones on small planes. Here the input rows an
//! output row reads are copied into zero-padded rows (split into their stride phases
//! when the stride along the width is above 1), so each kernel tap of a block of 16
//! output columns is one contiguous read, multiplied and added into accumulators held
//! in registers, up to four blocks at once (independent chains keep the FMA units
//! busy). The loops are plain safe Rust the compiler vectorises; the build for AVX-512
//! or AVX2 with FMA is chosen at run time when the CPU has it. Each output sums its
//! taps in the same order whatever the batch or the kernel that ran, up to the FMA's
//! rounding.
//!
//! [`depthwise_for`] says which `Conv` nodes of a decluttered model it takes (group =
//! input = output channels, NCHW or CHW, OIHW kernel and bias constant, f32, two
//! spatial axes, every dimension known); [`crate::kernels::optimized`] swaps them in
//! before tract's codegen lowers them.

use tract_onnx::prelude::*;
use tract_onnx::tract_core::internal::*;
use tract_onnx::tract_core::ops::cnn::{Conv, KernelFormat};
use tract_onnx::tract_core::ops::nn::DataFormat;

use crate::kernels::{fma, Weights};

/// Where each output reads: sizes, strides, dilations and the padding before each axis
/// (the padding after follows from the output size).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Geometry {
    pub channels: usize,
    pub in_h: usize,
    pub in_w: usize,
    pub out_h: usize,
    pub out_w: usize,
    pub kernel_h: usize,
    pub kernel_w: usize,
    pub stride_h: usize,
    pub stride_w: usize,
    pub dilation_h: usize,
    pub dilation_w: usize,
    pub pad_top: usize,
    pub pad_left: usize,
}

impl Geometry {
    pub(crate) fn in_plane(&self) -> usize {
        self.in_h * self.in_w
    }

    pub(crate) fn out_plane(&self) -> usize {
        self.out_h * self.out_w
    }

    pub(crate) fn taps(&self) -> usize {
        self.kernel_h * self.kernel_w
    }

    /// The output's fact for `outputs` channels, given the input's.
    pub(crate) fn output_fact(
        &self,
        input: &TypedFact,
        batch_axis: bool,
        outputs: usize,
    ) -> TypedFact {
        let mut shape: TVec<TDim> = input
            .shape
            .iter()
            .take(usize::from(batch_axis))
            .cloned()
            .collect();
        shape.extend([outputs, self.out_h, self.out_w].map(|d| d.to_dim()));
        f32::fact(shape)
    }

    /// Whether no size, stride or dilation is zero (only such a layer has a kernel).
    pub(crate) fn is_whole(&self) -> bool {
        ![
            self.in_h,
            self.in_w,
            self.out_h,
            self.out_w,
            self.kernel_h,
            self.kernel_w,
            self.stride_h,
            self.stride_w,
            self.dilation_h,
            self.dilation_w,
        ]
        .contains(&0)
    }
}

/// Runs the layer on `batch` images: `input` is `[batch, C, in_h, in_w]`, `weights`
/// `[C, kernel_h, kernel_w]`, `bias` `[C]`; the output is `[batch, C, out_h, out_w]`
/// (built row by row: never zeroed first).
///
/// # Panics
/// When a slice's length does not match the geometry (a caller's bug, never input).
pub fn run(geo: &Geometry, input: &[f32], weights: &[f32], bias: &[f32]) -> Vec<f32> {
    let batch = input.len() / geo.in_plane().max(1) / geo.channels.max(1);
    assert_eq!(input.len(), batch * geo.channels * geo.in_plane());
    assert_eq!(weights.len(), geo.channels * geo.taps());
    assert_eq!(bias.len(), geo.channels);
    if geo.in_plane() == 0 || geo.out_plane() == 0 {
        return vec![0.0; batch * geo.channels * geo.out_plane()];
    }
    // The only `unsafe` of the runtime: calling a function compiled for CPU features
    // the baseline x86_64 target lacks, after checking at run time that this CPU has
    // them (the kernel itself is safe code; the features let the compiler vectorise it
    // 16 or 8 lanes wide and fuse its multiply-adds).
    #[cfg(target_arch = "x86_64")]
    #[allow(unsafe_code)]
    {
        if std::arch::is_x86_feature_detected!("avx512f") {
            // SAFETY: the CPU has AVX-512F (and with it AVX2 and FMA), checked above.
            return unsafe { run_avx512(geo, input, weights, bias) };
        }
        if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma")
        {
            // SAFETY: the CPU has AVX2 and FMA, checked above.
            return unsafe { run_avx2(geo, input, weights, bias) };
        }
    }
    // NEON and its fused multiply-add are part of aarch64's baseline.
    #[cfg(target_arch = "aarch64")]
    return run_planes::<true>(geo, input, weights, bias);
    #[allow(unreachable_code)]
    run_planes::<false>(geo, input, weights, bias)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx2,fma")]
fn run_avx512(geo: &Geometry, input: &[f32], weights: &[f32], bias: &[f32]) -> Vec<f32> {
    run_planes::<true>(geo, input, weights, bias)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
fn run_avx2(geo: &Geometry, input: &[f32], weights: &[f32], bias: &[f32]) -> Vec<f32> {
    run_planes::<true>(geo, input, weights, bias)
}

/// Output columns computed together, in one vector register (AVX-512) or two (AVX2).
const LANES: usize = 16;

/// Every plane of every image; `FMA` says whether a fused multiply-add is a single
/// instruction here (else it would be a library call: multiply, then add).
///
/// Each input plane is first copied into a zero-padded one (the padding on the left,
/// and on the right as far as the last block of `LANES` columns reads), its rows split
/// into their stride phases when the stride along the width is above 1 (phase p holds
/// columns p, p+s, p+2s, …). Then every kernel tap of every block of output columns is
/// one contiguous read, with no edge cases: the padding's zeros add nothing, and rows
/// above and below the input are skipped.
#[inline(always)]
fn run_planes<const FMA: bool>(
    geo: &Geometry,
    input: &[f32],
    weights: &[f32],
    bias: &[f32],
) -> Vec<f32> {
    let stride = geo.stride_w;
    let blocks = geo.out_w.div_ceil(LANES);
    let width = blocks * LANES;
    // Per kernel column: its stride phase and its shift within it; output column ox
    // reads padded column ox * stride + kx * dilation, which is position ox + shift of
    // phase p.
    let columns: Vec<(usize, usize)> = (0..geo.kernel_w)
        .map(|kx| {
            let offset = kx * geo.dilation_w;
            (offset % stride, offset / stride)
        })
        .collect();
    let longest_shift = columns.iter().map(|c| c.1).max().unwrap_or(0);
    let phase_len = width + longest_shift;
    let padded_w = phase_len * stride;
    // The padded rows a window of output rows reads, loaded as the window moves down:
    // each input row is loaded once, and what the taps read stays in the cache.
    let span = (geo.kernel_h - 1) * geo.dilation_h + 1;
    let mut padded = vec![0.0f32; padded_w * span];
    let mut loaded = vec![usize::MAX; span];
    let mut line = vec![0.0f32; padded_w];
    let mut out_row = vec![0.0f32; width];
    let in_plane = geo.in_plane();
    let mut output = Vec::with_capacity(input.len() / in_plane * geo.out_plane());
    for (plane, source) in input.chunks_exact(in_plane).enumerate() {
        let channel = plane % geo.channels;
        let taps = &weights[channel * geo.taps()..][..geo.taps()];
        loaded.fill(usize::MAX);
        let in_row = |oy: usize, ky: usize| {
            let iy = (oy * geo.stride_h + ky * geo.dilation_h) as isize - geo.pad_top as isize;
            (iy >= 0 && (iy as usize) < geo.in_h).then_some(iy as usize)
        };
        for oy in 0..geo.out_h {
            for iy in (0..geo.kernel_h).filter_map(|ky| in_row(oy, ky)) {
                if loaded[iy % span] == iy {
                    continue;
                }
                loaded[iy % span] = iy;
                let row = &source[iy * geo.in_w..][..geo.in_w];
                let padded_row = &mut padded[(iy % span) * padded_w..][..padded_w];
                load_row(geo, phase_len, row, padded_row, &mut line);
            }
            let rows = (0..geo.kernel_h).filter_map(|ky| {
                in_row(oy, ky).map(|iy| {
                    (
                        &padded[(iy % span) * padded_w..][..padded_w],
                        &taps[ky * geo.kernel_w..][..geo.kernel_w],
                    )
                })
            });
            let mut ox = 0;
            // Four blocks at a time while they fit: four independent chains of
            // multiply-adds keep the FMA units busy (one chain waits on each result).
            while ox < width {
                let b = bias[channel];
                ox += LANES
                    * match (width - ox) / LANES {
                        1 => {
                            block::<FMA, 1>(&columns, phase_len, rows.clone(), b, ox, &mut out_row)
                        }
                        2 => {
                            block::<FMA, 2>(&columns, phase_len, rows.clone(), b, ox, &mut out_row)
                        }
                        3 => {
                            block::<FMA, 3>(&columns, phase_len, rows.clone(), b, ox, &mut out_row)
                        }
                        _ => {
                            block::<FMA, 4>(&columns, phase_len, rows.clone(), b, ox, &mut out_row)
                        }
                    };
            }
            output.extend_from_slice(&out_row[..geo.out_w]);
        }
    }
    output
}

/// One input row into its padded (and, with a stride, phased) form; `line` is scratch
/// of the padded width whose padding stays zero.
#[inline(always)]
pub(crate) fn load_row(
    geo: &Geometry,
    phase_len: usize,
    row: &[f32],
    padded: &mut [f32],
    line: &mut [f32],
) {
    let stride = geo.stride_w;
    let fits = geo.in_w.min(padded.len().saturating_sub(geo.pad_left));
    if stride == 1 {
        padded[geo.pad_left..geo.pad_left + fits].copy_from_slice(&row[..fits]);
        return;
    }
    line[geo.pad_left..geo.pad_left + fits].copy_from_slice(&row[..fits]);
    if stride == 2 {
        let (even, odd) = padded.split_at_mut(phase_len);
        for ((pair, e), o) in line.chunks_exact(2).zip(even).zip(odd) {
            *e = pair[0];
            *o = pair[1];
        }
        return;
    }
    for (p, phase) in padded.chunks_exact_mut(phase_len).enumerate() {
        for (out, x) in phase.iter_mut().zip(line.iter().skip(p).step_by(stride)) {
            *out = *x;
        }
    }
}

/// Output columns `ox..ox + B * LANES` of one row: `B` accumulators of `LANES`
/// columns, independent chains of multiply-adds kept in registers; returns `B`.
#[inline(always)]
fn block<'a, const FMA: bool, const B: usize>(
    columns: &[(usize, usize)],
    phase_len: usize,
    rows: impl Iterator<Item = (&'a [f32], &'a [f32])>,
    bias: f32,
    ox: usize,
    out_row: &mut [f32],
) -> usize {
    let mut acc = [[bias; LANES]; B];
    for (line, weights) in rows {
        for (&(phase, shift), &weight) in columns.iter().zip(weights) {
            let at = phase * phase_len + ox + shift;
            let Some(x) = line.get(at..at + B * LANES) else {
                continue;
            };
            for b in 0..B {
                let x: &[f32; LANES] = x[b * LANES..][..LANES].try_into().unwrap_or(&[0.0; LANES]);
                for lane in 0..LANES {
                    acc[b][lane] = fma::<FMA>(weight, x[lane], acc[b][lane]);
                }
            }
        }
    }
    for (b, acc) in acc.iter().enumerate() {
        out_row[ox + b * LANES..][..LANES].copy_from_slice(acc);
    }
    B
}

/// tract's operator for a depthwise layer run by [`run`], weights and bias held in it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Depthwise {
    pub geometry: Geometry,
    /// Whether the input has its batch axis (`NCHW`) or not (`CHW`: tract drops it
    /// from a batch-1 model).
    batch_axis: bool,
    /// `[C, kernel_h, kernel_w]`.
    weights: Weights,
    bias: Weights,
}

impl Op for Depthwise {
    fn name(&self) -> StaticName {
        "NepheleDepthwise".into()
    }

    fn info(&self) -> TractResult<Vec<String>> {
        Ok(vec![format!("{:?}", self.geometry)])
    }

    fn validation(&self) -> Validation {
        Validation::Rounding
    }

    op_as_typed_op!();
}

impl EvalOp for Depthwise {
    op_out_of_plan!();

    fn eval(&self, _: &EvalContext, inputs: TVec<TValue>) -> TractResult<TVec<TValue>> {
        let input = args_1!(inputs);
        let geo = &self.geometry;
        let shape = input.shape();
        let batch = if self.batch_axis {
            shape.first().copied()
        } else {
            Some(1)
        };
        let axes = usize::from(self.batch_axis);
        ensure!(
            shape.len() == 3 + axes
                && shape[axes..] == [geo.channels, geo.in_h, geo.in_w][..]
                && input.datum_type() == f32::datum_type(),
            "depthwise layer for {}[{}, {}, {}] f32 given {:?} {:?}",
            if self.batch_axis { "[N] + " } else { "" },
            geo.channels,
            geo.in_h,
            geo.in_w,
            shape,
            input.datum_type()
        );
        let mut out_shape: TVec<usize> = batch.into_iter().take(axes).collect();
        out_shape.extend([geo.channels, geo.out_h, geo.out_w]);
        let source = input.try_as_plain_ram()?;
        let output = run(
            geo,
            source.as_slice::<f32>()?,
            &self.weights.0,
            &self.bias.0,
        );
        let output = tract_ndarray::ArrayD::from_shape_vec(&*out_shape, output)?.into_tensor();
        Ok(tvec!(output.into_tvalue()))
    }
}

impl TypedOp for Depthwise {
    fn output_facts(&self, inputs: &[&TypedFact]) -> TractResult<TVec<TypedFact>> {
        let geo = &self.geometry;
        Ok(tvec!(geo.output_fact(
            inputs[0],
            self.batch_axis,
            geo.channels
        )))
    }

    fn cost(&self, inputs: &[&TypedFact]) -> TractResult<TVec<(Cost, TDim)>> {
        let geo = &self.geometry;
        let per_image = geo.channels * geo.out_plane() * geo.taps();
        Ok(fma_cost(inputs[0], self.batch_axis, per_image))
    }

    as_op!();
}

/// A convolution's cost: `per_image` multiply-adds for each image of `input`'s batch.
pub(crate) fn fma_cost(
    input: &TypedFact,
    batch_axis: bool,
    per_image: usize,
) -> TVec<(Cost, TDim)> {
    let batch = if batch_axis {
        input.shape[0].clone()
    } else {
        1.to_dim()
    };
    tvec!((Cost::FMA(f32::datum_type()), batch * per_image))
}

/// What the runtime's convolution kernels need of a tract `Conv` node, when it has it:
/// f32, NCHW or CHW, an OIHW kernel of two spatial axes and a bias that are constants,
/// every dimension known and none zero.
pub(crate) struct ConvParts {
    /// `channels` is the input's.
    pub geometry: Geometry,
    pub outputs: usize,
    pub group: usize,
    /// Whether the input has its batch axis (`NCHW`) or not (`CHW`).
    pub batch_axis: bool,
    /// `[outputs, channels / group, kernel_h, kernel_w]`.
    pub kernel: Vec<f32>,
    /// `[outputs]` (a single bias spread over them).
    pub bias: Vec<f32>,
}

/// The [`ConvParts`] of `node` of `model`, if it is such a convolution.
pub(crate) fn conv_parts(model: &TypedModel, node: &TypedNode) -> TractResult<Option<ConvParts>> {
    let Some(conv) = node.op_as::<Conv>() else {
        return Ok(None);
    };
    let spec = &conv.pool_spec;
    if conv.q_params.is_some()
        || !matches!(spec.data_format, DataFormat::NCHW | DataFormat::CHW)
        || conv.kernel_fmt != KernelFormat::OIHW
        || spec.kernel_shape.len() != 2
        || node.inputs.len() != 3
        || conv.group == 0
        || spec.input_channels % conv.group != 0
    {
        return Ok(None);
    }
    let input = model.outlet_fact(node.inputs[0])?;
    let kernel = model.outlet_fact(node.inputs[1])?;
    let bias = model.outlet_fact(node.inputs[2])?;
    let (Some(shape), Some(kernel), Some(bias)) = (
        input.shape.as_concrete(),
        kernel.konst.as_ref(),
        bias.konst.as_ref(),
    ) else {
        return Ok(None);
    };
    let (channels, outputs) = (spec.input_channels, spec.output_channels);
    let (kh, kw) = (spec.kernel_shape[0], spec.kernel_shape[1]);
    let batch_axis = spec.data_format == DataFormat::NCHW;
    let axes = usize::from(batch_axis);
    if input.datum_type != f32::datum_type()
        || kernel.datum_type() != f32::datum_type()
        || bias.datum_type() != f32::datum_type()
        || shape.len() != 3 + axes
        || shape[axes] != channels
        || kernel.shape() != [outputs, channels / conv.group, kh, kw]
        || !(bias.len() == outputs || bias.len() == 1)
    {
        return Ok(None);
    }
    let padded = spec.computed_padding(&shape[axes + 1..]);
    let (strides, dilations) = (spec.strides(), spec.dilations());
    let geometry = Geometry {
        channels,
        in_h: shape[axes + 1],
        in_w: shape[axes + 2],
        out_h: padded[0].convoluted,
        out_w: padded[1].convoluted,
        kernel_h: kh,
        kernel_w: kw,
        stride_h: strides[0],
        stride_w: strides[1],
        dilation_h: dilations[0],
        dilation_w: dilations[1],
        pad_top: padded[0].pad_before,
        pad_left: padded[1].pad_before,
    };
    if !geometry.is_whole() || outputs == 0 {
        return Ok(None);
    }
    let bias = bias.try_as_plain_ram()?;
    let bias = bias.as_slice::<f32>()?;
    Ok(Some(ConvParts {
        geometry,
        outputs,
        group: conv.group,
        batch_axis,
        kernel: kernel.try_as_plain_ram()?.as_slice::<f32>()?.to_vec(),
        bias: if bias.len() == outputs {
            bias.to_vec()
        } else {
            vec![bias[0]; outputs]
        },
    }))
}

/// The [`Depthwise`] for a tract `Conv` node of `model`, when it is one this kernel runs.
pub fn depthwise_for(model: &TypedModel, node: &TypedNode) -> TractResult<Option<Depthwise>> {
    let Some(parts) = conv_parts(model, node)? else {
        return Ok(None);
    };
    let channels = parts.geometry.channels;
    if parts.group != channels || parts.outputs != channels || channels < 2 {
        return Ok(None);
    }
    Ok(Some(Depthwise {
        geometry: parts.geometry,
        batch_axis: parts.batch_axis,
        weights: Weights::flushed(parts.kernel),
        bias: Weights(parts.bias.into()),
    }))
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use proptest::prelude::*;

    /// The textbook loop: each output the bias plus every in-bounds tap.
    fn reference(geo: &Geometry, input: &[f32], weights: &[f32], bias: &[f32]) -> Vec<f32> {
        let batch = input.len() / geo.in_plane() / geo.channels;
        let mut out = vec![0.0; batch * geo.channels * geo.out_plane()];
        for n in 0..batch {
            for c in 0..geo.channels {
                let plane = &input[(n * geo.channels + c) * geo.in_plane()..][..geo.in_plane()];
                for oy in 0..geo.out_h {
                    for ox in 0..geo.out_w {
                        let mut sum = bias[c];
                        for ky in 0..geo.kernel_h {
                            for kx in 0..geo.kernel_w {
                                let iy = (oy * geo.stride_h + ky * geo.dilation_h) as isize
                                    - geo.pad_top as isize;
                                let ix = (ox * geo.stride_w + kx * geo.dilation_w) as isize
                                    - geo.pad_left as isize;
                                if iy >= 0
                                    && ix >= 0
                                    && (iy as usize) < geo.in_h
                                    && (ix as usize) < geo.in_w
                                {
                                    sum += weights[c * geo.taps() + ky * geo.kernel_w + kx]
                                        * plane[iy as usize * geo.in_w + ix as usize];
                                }
                            }
                        }
                        out[((n * geo.channels + c) * geo.out_h + oy) * geo.out_w + ox] = sum;
                    }
                }
            }
        }
        out
    }

    pub(crate) fn geometry() -> impl Strategy<Value = Geometry> {
        (
            (1usize..4, 1usize..12, 1usize..20),
            (1usize..6, 1usize..6),
            (1usize..4, 1usize..4, 1usize..3, 1usize..3),
            (0usize..4, 0usize..4, 0usize..4, 0usize..4),
        )
            .prop_filter_map(
                "an output of at least one point",
                |((channels, in_h, in_w), (kh, kw), (sh, sw, dh, dw), (pt, pb, pl, pr))| {
                    let span_h = (kh - 1) * dh + 1;
                    let span_w = (kw - 1) * dw + 1;
                    let padded_h = in_h + pt + pb;
                    let padded_w = in_w + pl + pr;
                    (padded_h >= span_h && padded_w >= span_w).then(|| Geometry {
                        channels,
                        in_h,
                        in_w,
                        out_h: (padded_h - span_h) / sh + 1,
                        out_w: (padded_w - span_w) / sw + 1,
                        kernel_h: kh,
                        kernel_w: kw,
                        stride_h: sh,
                        stride_w: sw,
                        dilation_h: dh,
                        dilation_w: dw,
                        pad_top: pt,
                        pad_left: pl,
                    })
                },
            )
    }

    fn values(n: usize, seed: u64) -> Vec<f32> {
        crate::test_graphs::pseudo_random(n, seed, 1.0)
    }

    proptest! {
        /// Every stride, dilation, padding and size gives the textbook loop's answer,
        /// with the CPU's vector kernel and without it.
        #[test]
        fn the_kernel_computes_the_textbook_convolution(
            geo in geometry(),
            batch in 1usize..3,
            seed in any::<u64>(),
        ) {
            let input = values(batch * geo.channels * geo.in_plane(), seed);
            let weights = values(geo.channels * geo.taps(), seed ^ 1);
            let bias = values(geo.channels, seed ^ 2);
            let expected = reference(&geo, &input, &weights, &bias);
            let fast = run(&geo, &input, &weights, &bias);
            let plain = run_planes::<false>(&geo, &input, &weights, &bias);
            prop_assert_eq!(fast.len(), expected.len());
            prop_assert_eq!(plain.len(), expected.len());
            for (i, e) in expected.iter().enumerate() {
                prop_assert!((fast[i] - e).abs() <= 1e-5 * (1.0 + e.abs()), "{i}: {} vs {e}", fast[i]);
                prop_assert!((plain[i] - e).abs() <= 1e-5 * (1.0 + e.abs()), "{i}: {} vs {e}", plain[i]);
            }
        }
    }
}
