//! Products of an activation by a constant matrix (`y = x · W + b`, f32: a transformer's
//! projections and feed-forward layers) run by the runtime's own kernel instead of
//! tract's packed matrix product.
//!
//! tract runs these as general products: the activation packed into panels for every
//! run, then its AVX-512 16×12 kernel, whose 12 accumulators take one vector load and
//! 12 broadcasts per 12 multiply-adds, so it waits on loads. On MiniLM at 128 tokens its
//! products took 30.9 ms of a 37.4 ms run and packing another 1.9 ms, against 20.3 ms
//! for onnxruntime's (`nephele bench inference --only profile --model
//! minilm-l6-seq128`). Here the activation is packed once per run into blocks of
//! [`ROWS`] rows laid out step by step (one copy of each value, against a multiply-add
//! per value and column), a block of [`ROWS`] rows × [`COLS`] columns is 24 vector
//! accumulators, and every step along the shared dimension adds one row of the weights'
//! panel (4 vector loads) times [`ROWS`] activation values (broadcast) into them, 24
//! multiply-adds for 10 loads. The weights
//! are laid out once, when the model loads, as panels of [`COLS`] columns in the order
//! the kernel reads them, and the panel is walked in slices of [`DEPTH`] steps that
//! stay in the first-level cache while every row block uses them. The loops are safe
//! Rust the compiler vectorises, built for AVX-512 or AVX2 with FMA and chosen at run
//! time, as in [`crate::depthwise`].

use tract_onnx::prelude::*;
use tract_onnx::tract_core::internal::*;
use tract_onnx::tract_core::ops::binary::TypedBinOp;
use tract_onnx::tract_core::ops::einsum::EinSum;
use tract_onnx::tract_core::ops::math::Add;

use crate::kernels::{fma, Weights};

/// Rows (tokens) a block computes together.
const ROWS: usize = 6;
/// Columns a panel holds, and a block computes together with AVX-512: 4 vectors of 16
/// lanes.
const COLS: usize = 64;
/// Columns a block computes together with narrower vectors: 2 of AVX2's 8 lanes (6 × 2
/// accumulators, two weight vectors and a broadcast fill its 16 registers; a block of
/// 64 columns would spill them on every multiply-add).
const NARROW: usize = 16;
/// Steps along the shared dimension a slice of the panel holds: 32 KiB of weights at
/// [`COLS`] columns, within a first-level data cache, read by every block of rows.
const DEPTH: usize = 128;
/// The same with [`NARROW`] tiles: half as many steps, so the slice (16 KiB) leaves
/// room in a 32 KiB first-level cache for the activations and the outputs while every
/// block of rows passes over it. On the 2-vCPU AMD EPYC (AVX2, 32 KiB per core) the
/// kernel alone took 3-4% less time on MiniLM's three product shapes than at 128
/// steps (and than at 256), in two alternated rounds of the `dense_shapes` example;
/// AVX-512's wide tiles keep 128.
const NARROW_DEPTH: usize = 64;

/// `weights` (`[depth, columns]`, row-major) as the kernel reads them: per panel of
/// [`COLS`] columns, per step along the shared dimension, the panel's [`COLS`] weights
/// side by side (zero past the last column).
pub fn panels(weights: &[f32], depth: usize, columns: usize) -> Vec<f32> {
    let blocks = columns.div_ceil(COLS);
    let mut laid = vec![0.0; blocks * depth * COLS];
    for k in 0..depth {
        for n in 0..columns {
            laid[((n / COLS) * depth + k) * COLS + n % COLS] = weights[k * columns + n];
        }
    }
    laid
}

/// A layer's weights (as [`panels`] lays them), bias and sizes.
pub struct Layer<'a> {
    pub laid: &'a [f32],
    /// `[columns]`, or empty for none.
    pub bias: &'a [f32],
    pub depth: usize,
    pub columns: usize,
}

/// `x · W + b` for `x` `[rows, depth]`; the output is `[rows, columns]`.
///
/// # Panics
/// When a slice's length does not match the sizes (a caller's bug, never input).
pub fn run(x: &[f32], layer: &Layer) -> Vec<f32> {
    let (depth, columns) = (layer.depth, layer.columns);
    assert_eq!(layer.laid.len(), columns.div_ceil(COLS) * depth * COLS);
    assert!(layer.bias.is_empty() || layer.bias.len() == columns);
    if depth == 0 {
        // No rows can be told apart (a model's weights always have a shared dimension).
        return vec![];
    }
    let rows = x.len() / depth;
    assert_eq!(x.len(), rows * depth);
    let mut output = vec![0.0f32; rows * columns];
    product(x, layer, rows, &mut output);
    output
}

fn product(x: &[f32], layer: &Layer, rows: usize, out: &mut [f32]) {
    // The only `unsafe` here: calling the kernel built for CPU features the baseline
    // x86_64 target lacks, after checking at run time that this CPU has them.
    #[cfg(target_arch = "x86_64")]
    #[allow(unsafe_code)]
    {
        if std::arch::is_x86_feature_detected!("avx512f") {
            // SAFETY: the CPU has AVX-512F (and with it AVX2 and FMA), checked above.
            return unsafe { product_avx512(x, layer, rows, out) };
        }
        if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma")
        {
            // SAFETY: the CPU has AVX2 and FMA, checked above.
            return unsafe { product_avx2(x, layer, rows, out) };
        }
    }
    // NEON and its fused multiply-add are part of aarch64's baseline.
    #[cfg(target_arch = "aarch64")]
    return product_of::<true, NARROW>(x, layer, rows, out);
    #[allow(unreachable_code)]
    product_of::<false, NARROW>(x, layer, rows, out)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx2,fma")]
fn product_avx512(x: &[f32], layer: &Layer, rows: usize, out: &mut [f32]) {
    product_of::<true, COLS>(x, layer, rows, out)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
fn product_avx2(x: &[f32], layer: &Layer, rows: usize, out: &mut [f32]) {
    product_of::<true, NARROW>(x, layer, rows, out)
}

/// Every panel, every slice of it along the shared dimension, every block of rows
/// ([`ROWS`], then what is left one row block of its own size).
#[inline(always)]
fn product_of<const FMA: bool, const C: usize>(
    x: &[f32],
    layer: &Layer,
    rows: usize,
    out: &mut [f32],
) {
    let Layer {
        laid,
        bias,
        depth,
        columns,
    } = *layer;
    // One row is already laid out as a block of one (unless it has a value to flush).
    let packed = if rows == 1 && !x.iter().any(|v| v.is_subnormal()) {
        std::borrow::Cow::Borrowed(x)
    } else {
        std::borrow::Cow::Owned(pack_rows(x, rows, depth))
    };
    let full = rows / ROWS;
    let rest = rows % ROWS;
    for (block, panel) in laid.chunks_exact(depth * COLS).enumerate() {
        let n0 = block * COLS;
        let width = COLS.min(columns - n0);
        let mut k0 = 0;
        while k0 < depth {
            let steps = if C == NARROW { NARROW_DEPTH } else { DEPTH }.min(depth - k0);
            let slice = Slice {
                panel: &panel[k0 * COLS..(k0 + steps) * COLS],
                first: k0 == 0,
                bias: bias.get(n0..n0 + width),
                n0,
                width,
                columns,
            };
            for b in 0..full {
                let xs = &packed[(b * depth + k0) * ROWS..][..steps * ROWS];
                tiles::<FMA, ROWS, C>(xs, &slice, b * ROWS, out);
            }
            let xs = &packed[full * depth * ROWS + k0 * rest..][..steps * rest];
            let m = full * ROWS;
            match rest {
                0 => {}
                1 => tiles::<FMA, 1, C>(xs, &slice, m, out),
                2 => tiles::<FMA, 2, C>(xs, &slice, m, out),
                3 => tiles::<FMA, 3, C>(xs, &slice, m, out),
                4 => tiles::<FMA, 4, C>(xs, &slice, m, out),
                _ => tiles::<FMA, 5, C>(xs, &slice, m, out),
            }
            k0 += steps;
        }
    }
}

/// `x` (`[rows, depth]`) block by block of [`ROWS`] rows, step by step along the shared
/// dimension, the block's values of a step side by side (the last block, of fewer
/// rows, as many as it has): so that the kernel reads both operands in order. Subnormal
/// values are flushed to zero on the way, as tract's matrix kernels do by setting the
/// CPU's denormals-are-zero flag (see [`Weights::flushed`]): activations have them too
/// (an attention's probabilities of far-off tokens).
fn pack_rows(x: &[f32], rows: usize, depth: usize) -> Vec<f32> {
    let mut packed = vec![0.0f32; rows * depth];
    for (m, row) in x.chunks_exact(depth).enumerate() {
        let (block, r) = (m / ROWS, m % ROWS);
        let height = ROWS.min(rows - block * ROWS);
        let base = block * ROWS * depth;
        for (k, v) in row.iter().enumerate() {
            packed[base + k * height + r] = flush(*v);
        }
    }
    packed
}

/// `v`, or zero when it is subnormal (or zero), without a branch.
#[inline(always)]
fn flush(v: f32) -> f32 {
    let bits = v.to_bits();
    f32::from_bits(if bits & 0x7f80_0000 == 0 { 0 } else { bits })
}

/// One slice of a panel: its steps (from the first or not: the accumulators then start
/// from the bias, else from what the slices before stored) and where its columns are.
struct Slice<'a> {
    panel: &'a [f32],
    first: bool,
    bias: Option<&'a [f32]>,
    n0: usize,
    width: usize,
    columns: usize,
}

/// Rows `m..m + R` at the slice's columns, `C` columns at a time.
#[inline(always)]
fn tiles<const FMA: bool, const R: usize, const C: usize>(
    xs: &[f32],
    slice: &Slice,
    m: usize,
    out: &mut [f32],
) {
    let mut c0 = 0;
    while c0 + C <= slice.width {
        tile::<FMA, R, C, true>(xs, slice, m, c0, out);
        c0 += C;
    }
    if c0 < slice.width {
        tile::<FMA, R, C, false>(xs, slice, m, c0, out);
    }
}

/// Rows `m..m + R` at the slice's columns `c0..c0 + C` (those that exist: all `C` when
/// `FULL`), `xs` their packed values for its steps.
#[inline(always)]
fn tile<const FMA: bool, const R: usize, const C: usize, const FULL: bool>(
    xs: &[f32],
    slice: &Slice,
    m: usize,
    c0: usize,
    out: &mut [f32],
) {
    let Slice {
        panel,
        first,
        bias,
        n0,
        width,
        columns,
    } = *slice;
    let width = C.min(width - c0);
    let n0 = n0 + c0;
    // Whole rows in and out of `acc` (`load`, `store`), never a slice of it of a length
    // known only at run time: that would keep the accumulators out of registers. A
    // whole tile's rows are copied as arrays of `C`, which compile to vector moves; a
    // copy of a run-time length is a `memcpy` call per row (twelve per tile on AVX2).
    // Whole and partial tiles are separate instantiations (`FULL`) so that the
    // compiler cannot merge their copies into one call of either length.
    let mut acc = [[0.0f32; C]; R];
    for (r, acc) in acc.iter_mut().enumerate() {
        let from = if !first {
            Some(&out[(m + r) * columns + n0..])
        } else {
            bias.map(|bias| &bias[c0..])
        };
        if let Some(from) = from {
            *acc = load::<C, FULL>(from, width);
        }
    }
    for (w, v) in panel.chunks_exact(COLS).zip(xs.chunks_exact(R)) {
        let w: &[f32; C] = w[c0..c0 + C].try_into().unwrap_or(&[0.0; C]);
        let v: &[f32; R] = v.try_into().unwrap_or(&[0.0; R]);
        for r in 0..R {
            for lane in 0..C {
                acc[r][lane] = fma::<FMA>(v[r], w[lane], acc[r][lane]);
            }
        }
    }
    for (r, acc) in acc.iter().enumerate() {
        store::<C, FULL>(acc, &mut out[(m + r) * columns + n0..], width);
    }
}

/// The first `width` values of `from` (all `C` when `FULL`), zero after them.
#[inline(always)]
fn load<const C: usize, const FULL: bool>(from: &[f32], width: usize) -> [f32; C] {
    let mut row = [0.0f32; C];
    if FULL {
        row = from[..C].try_into().unwrap_or(row);
    } else {
        row[..width].copy_from_slice(&from[..width]);
    }
    row
}

/// `row`'s first `width` values (all `C` when `FULL`) into the start of `to`.
#[inline(always)]
fn store<const C: usize, const FULL: bool>(row: &[f32; C], to: &mut [f32], width: usize) {
    if FULL {
        if let Ok(to) = <&mut [f32; C]>::try_from(&mut to[..C]) {
            *to = *row;
        }
    } else {
        to[..width].copy_from_slice(&row[..width]);
    }
}

/// Where each axis of the output comes from: an axis of the input, the weights'
/// columns, or an axis of one that neither operand has.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Dim {
    Input(usize),
    Columns,
    One,
}

/// tract's operator for a product by constant weights run by [`run`], wired to the
/// activation alone: it holds the weights as [`panels`] lays them and the bias of the
/// `Add` it absorbed, if any.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Dense {
    depth: usize,
    columns: usize,
    /// The output's axes.
    dims: Vec<Dim>,
    laid: Weights,
    bias: Option<Weights>,
}

impl Dense {
    fn shape<D: Clone + From<usize>>(&self, input: &[D]) -> TractResult<TVec<D>> {
        self.dims
            .iter()
            .map(|dim| match dim {
                Dim::Input(axis) => input
                    .get(*axis)
                    .cloned()
                    .ok_or_else(|| format_err!("no axis {axis} in the product's input")),
                Dim::Columns => Ok(D::from(self.columns)),
                Dim::One => Ok(D::from(1)),
            })
            .collect()
    }
}

impl Op for Dense {
    fn name(&self) -> StaticName {
        "NepheleDense".into()
    }

    fn info(&self) -> TractResult<Vec<String>> {
        Ok(vec![format!(
            "{} -> {} columns{}",
            self.depth,
            self.columns,
            if self.bias.is_some() { ", bias" } else { "" }
        )])
    }

    fn validation(&self) -> Validation {
        Validation::Rounding
    }

    op_as_typed_op!();
}

impl EvalOp for Dense {
    op_out_of_plan!();

    fn eval(&self, _: &EvalContext, inputs: TVec<TValue>) -> TractResult<TVec<TValue>> {
        let input = args_1!(inputs);
        ensure!(
            input.datum_type() == f32::datum_type() && input.len() % self.depth.max(1) == 0,
            "product by {}×{} weights given {:?} {:?}",
            self.depth,
            self.columns,
            input.shape(),
            input.datum_type()
        );
        let shape = self.shape(input.shape())?;
        let source = input.try_as_plain_ram()?;
        let output = run(
            source.as_slice::<f32>()?,
            &Layer {
                laid: &self.laid.0,
                bias: self.bias.as_ref().map_or(&[][..], |b| &b.0),
                depth: self.depth,
                columns: self.columns,
            },
        );
        let output = tract_ndarray::ArrayD::from_shape_vec(&*shape, output)?.into_tensor();
        Ok(tvec!(output.into_tvalue()))
    }
}

impl TypedOp for Dense {
    fn output_facts(&self, inputs: &[&TypedFact]) -> TractResult<TVec<TypedFact>> {
        Ok(tvec!(f32::fact(self.shape(&inputs[0].shape)?)))
    }

    fn cost(&self, inputs: &[&TypedFact]) -> TractResult<TVec<(Cost, TDim)>> {
        // Every input value is multiplied once per column.
        let volume: TDim = inputs[0].shape.iter().product();
        Ok(tvec!((Cost::FMA(f32::datum_type()), volume * self.columns)))
    }

    as_op!();
}

/// What each axis of an `EinSum` by constant weights does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Role {
    /// Summed over: in both operands, not in the output.
    Summed,
    /// The activation's rows: in the activation and the output.
    Free,
    /// The weights' columns: in the weights and the output.
    Columns,
    /// Of size 1 wherever it is.
    Unit,
}

/// Weights already laid out for the kernel, by the address of the constant they come
/// from (alive in the model while it is rewritten) and whether it was transposed.
pub type LaidOut = std::collections::HashMap<(usize, bool), Weights>;

/// An `EinSum` axis: its letter, its role, and its position in the activation, the
/// weights and the output (where it is one of theirs).
struct AxisUse {
    repr: char,
    role: Role,
    at: [Option<usize>; 3],
}

/// The [`Dense`] for a tract `EinSum` node of `model` (an activation times constant
/// weights, the summed axes last in the activation and first in the weights, in the
/// same order, the columns last in both the weights and the output), when it is one
/// this kernel runs; and the `Add` of a constant bias after it that it absorbs, if any.
/// `laid_out` holds the weights laid out so far, by tensor.
pub fn dense_for(
    model: &TypedModel,
    node: &TypedNode,
    laid_out: &mut LaidOut,
) -> TractResult<Option<(Dense, Option<usize>)>> {
    let Some(einsum) = node.op_as::<EinSum>() else {
        return Ok(None);
    };
    if einsum.q_params.is_some()
        || einsum.operating_dt != f32::datum_type()
        || node.inputs.len() != 2
        || model.outlet_fact(node.inputs[0])?.konst.is_some()
    {
        return Ok(None);
    }
    let input = model.outlet_fact(node.inputs[0])?;
    let (Some(x_shape), Some(weights), Some(out_shape)) = (
        input.shape.as_concrete(),
        model.outlet_fact(node.inputs[1])?.konst.clone(),
        node.outputs[0].fact.shape.as_concrete(),
    ) else {
        return Ok(None);
    };
    if input.datum_type != f32::datum_type() || weights.datum_type() != f32::datum_type() {
        return Ok(None);
    }
    let w_shape = weights.shape();
    // Each axis's role and its position in the activation, the weights, the output.
    let mut axes = vec![];
    for axis in einsum.axes.iter_all_axes() {
        let lists = [&axis.inputs[0], &axis.inputs[1], &axis.outputs[0]];
        if lists.iter().any(|l| l.len() > 1) {
            return Ok(None);
        }
        let at = lists.map(|l| l.first().copied());
        let [x, w, o] = at;
        let size = x.map(|p| x_shape[p]).or(w.map(|p| w_shape[p])).unwrap_or(1);
        let role = match (x, w, o) {
            (None, Some(_), Some(_)) => Role::Columns,
            _ if size == 1 => Role::Unit,
            (Some(_), Some(_), None) => Role::Summed,
            (Some(_), None, Some(_)) => Role::Free,
            _ => return Ok(None),
        };
        axes.push(AxisUse {
            repr: axis.repr,
            role,
            at,
        });
    }
    // The axes other than units, in the order the activation (0), the weights (1) or
    // the output (2) lays them.
    let order = |which: usize| -> Vec<(char, Role)> {
        let mut placed: Vec<(usize, char, Role)> = axes
            .iter()
            .filter(|a| a.role != Role::Unit)
            .filter_map(|a| a.at[which].map(|p| (p, a.repr, a.role)))
            .collect();
        placed.sort_unstable_by_key(|p| p.0);
        placed.into_iter().map(|(_, c, r)| (c, r)).collect()
    };
    let (in_x, in_w, in_out) = (order(0), order(1), order(2));
    let of = |list: &[(char, Role)], role: Role| -> Vec<char> {
        list.iter().filter(|a| a.1 == role).map(|a| a.0).collect()
    };
    let summed = of(&in_x, Role::Summed);
    let free = of(&in_x, Role::Free);
    let columns_axes = of(&in_w, Role::Columns);
    let letters = |list: &[(char, Role)]| -> Vec<char> { list.iter().map(|a| a.0).collect() };
    let x_ok = letters(&in_x) == [&free[..], &summed].concat();
    // The weights `[depth, columns]`, or `[columns, depth]` (a `Gemm` with `transB`,
    // PyTorch's `Linear`), laid out for the kernel either way.
    let plain = letters(&in_w) == [&summed[..], &columns_axes].concat();
    let transposed = letters(&in_w) == [&columns_axes[..], &summed].concat();
    let out_ok = letters(&in_out) == [&free[..], &columns_axes].concat();
    if columns_axes.len() != 1 || !x_ok || !(plain || transposed) || !out_ok {
        return Ok(None);
    }
    let depth: usize = axes
        .iter()
        .filter(|a| a.role == Role::Summed)
        .filter_map(|a| a.at[0].map(|p| x_shape[p]))
        .product();
    let columns = weights.len() / depth.max(1);
    if depth == 0 || columns == 0 {
        return Ok(None);
    }
    // The output's axes, from the input's where they are its (its units too: any
    // other unit axis is a new one).
    let mut dims = vec![Dim::One; out_shape.len()];
    for a in &axes {
        if let Some(o) = a.at[2] {
            dims[o] = match (a.role, a.at[0]) {
                (Role::Columns, _) => Dim::Columns,
                (_, Some(x)) => Dim::Input(x),
                _ => Dim::One,
            };
        }
    }
    // One layout per weight tensor: a constant several products share (one
    // initializer read by 512 layers, as the rollout tests' slow model has) is laid out
    // once and held by all of them.
    let key = (Arc::as_ptr(&weights) as usize, plain);
    let laid = match laid_out.get(&key) {
        Some(laid) => laid.clone(),
        None => {
            let values = weights.try_as_plain_ram()?;
            let values = values.as_slice::<f32>()?;
            let laid = Weights::flushed(if plain {
                panels(values, depth, columns)
            } else {
                let mut by_depth = vec![0.0; values.len()];
                for (n, row) in values.chunks_exact(depth).enumerate() {
                    for (k, v) in row.iter().enumerate() {
                        by_depth[k * columns + n] = *v;
                    }
                }
                panels(&by_depth, depth, columns)
            });
            laid_out.insert(key, laid.clone());
            laid
        }
    };
    let mut op = Dense {
        depth,
        columns,
        dims,
        laid,
        bias: None,
    };
    if op.shape(x_shape)?.as_slice() != out_shape {
        return Ok(None);
    }
    // A constant bias added after it, over the columns (the output's last axis), is
    // added by the kernel as it stores.
    let absorbed = bias_after(model, node, out_shape, columns)?.map(|(add, bias)| {
        op.bias = Some(Weights(bias.into()));
        add
    });
    Ok(Some((op, absorbed)))
}

/// The `Add` node after `node` (its only use, not an output of the model) of a constant
/// over the last axis, `[columns]` or one value, that leaves the shape as it is; and
/// that bias, one value per column.
fn bias_after(
    model: &TypedModel,
    node: &TypedNode,
    shape: &[usize],
    columns: usize,
) -> TractResult<Option<(usize, Vec<f32>)>> {
    let outlet = OutletId::new(node.id, 0);
    if shape.last() != Some(&columns) || model.output_outlets()?.contains(&outlet) {
        return Ok(None);
    }
    let Some(add) = model.single_succ(node.id)? else {
        return Ok(None);
    };
    let Some(binary) = add.op_as::<TypedBinOp>() else {
        return Ok(None);
    };
    if !binary.0.is::<Add>()
        || add.inputs.len() != 2
        || model.outlet_successors(outlet).len() != 1
        || add.outputs[0].fact.shape.as_concrete() != Some(shape)
    {
        return Ok(None);
    }
    let other = if add.inputs[0] == outlet {
        add.inputs[1]
    } else {
        add.inputs[0]
    };
    let Some(bias) = model.outlet_fact(other)?.konst.clone() else {
        return Ok(None);
    };
    let only_last =
        bias.shape().iter().rev().skip(1).all(|d| *d == 1) && bias.rank() <= shape.len();
    if bias.datum_type() != f32::datum_type() || !only_last {
        return Ok(None);
    }
    let plain = bias.try_as_plain_ram()?;
    let values = plain.as_slice::<f32>()?;
    Ok(match values.len() {
        n if n == columns => Some((add.id, values.to_vec())),
        1 => Some((add.id, vec![values[0]; columns])),
        _ => None,
    })
}

/// Swaps every product [`dense_for`] takes for a [`Dense`] (and the `Add` of a bias it
/// absorbs with it); how many.
pub fn replace_dense(model: &mut TypedModel) -> TractResult<usize> {
    let mut laid_out = LaidOut::new();
    let mut replaced = 0;
    for id in model.eval_order()? {
        let node = model.node(id);
        let Some((op, absorbed)) = dense_for(model, node, &mut laid_out)? else {
            continue;
        };
        let mut patch = TypedModelPatch::default();
        let x = patch.tap_model(model, node.inputs[0])?;
        let out = patch.wire_node(&node.name, op, &[x])?[0];
        let last = absorbed.unwrap_or(id);
        patch.shunt_outside(model, OutletId::new(last, 0), out)?;
        patch.obliterate(id)?;
        if let Some(add) = absorbed {
            patch.obliterate(add)?;
        }
        patch.apply(model)?;
        replaced += 1;
    }
    Ok(replaced)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_graphs::pseudo_random;
    use proptest::prelude::*;

    /// Products that share one weight initializer share one laid-out copy of it (a
    /// model of 512 layers over one 4 MB matrix would otherwise lay out 2 GB).
    #[test]
    fn shared_weights_are_laid_out_once() {
        use crate::test_graphs::{floats, model, node};
        use prost::Message;
        let graph = model(
            &[2, 8],
            vec![
                node("MatMul", &["x", "w"], "a"),
                node("Relu", &["a"], "r"),
                node("MatMul", &["r", "w"], "b"),
            ],
            vec![floats("w", &[8, 8], &pseudo_random(64, 3, 1.0))],
            &["b"],
        );
        let bytes = graph.encode_to_vec();
        let mut typed = tract_onnx::onnx()
            .model_for_read(&mut &bytes[..])
            .and_then(|m| m.into_typed())
            .and_then(|m| m.into_decluttered())
            .expect("the model types");
        assert_eq!(replace_dense(&mut typed).expect("swaps"), 2);
        let laid: Vec<&Weights> = typed
            .nodes()
            .iter()
            .filter_map(|n| n.op_as::<Dense>())
            .map(|op| &op.laid)
            .collect();
        assert_eq!(laid.len(), 2);
        assert!(Arc::ptr_eq(&laid[0].0, &laid[1].0));
    }

    /// Subnormal activations are taken as zero (as tract's kernels take them), on the
    /// packed path and on the one-row path, and normal ones as they are.
    #[test]
    fn subnormal_activations_count_as_zero() {
        let tiny = f32::MIN_POSITIVE / 4.0;
        assert!(tiny.is_subnormal());
        let (depth, columns) = (3, 5);
        let w = pseudo_random(depth * columns, 1, 1.0);
        let laid = panels(&w, depth, columns);
        let layer = Layer {
            laid: &laid,
            bias: &[],
            depth,
            columns,
        };
        for rows in [1, 7] {
            // One value of the first row, the others zero: the output is that value
            // times its row of weights.
            let mut x = vec![0.0; rows * depth];
            x[1] = tiny;
            assert!(run(&x, &layer).iter().all(|v| *v == 0.0), "{rows} rows");
            x[1] = 1e-30;
            let out = run(&x, &layer);
            for (n, v) in out[..columns].iter().enumerate() {
                assert_eq!(*v, 1e-30 * w[columns + n], "{rows} rows");
            }
        }
        assert_eq!(flush(-tiny).to_bits(), 0);
        assert_eq!(flush(-1.5), -1.5);
    }

    proptest! {
        /// Every size (fewer rows than a block, a shared dimension across several
        /// slices, columns not a multiple of a panel), with a bias and without, gives
        /// the textbook sum, with the CPU's vector kernel and without.
        #[test]
        fn the_kernel_computes_the_matrix_product(
            rows in 0usize..20,
            depth in 1usize..300,
            columns in 1usize..150,
            with_bias in any::<bool>(),
            seed in any::<u64>(),
        ) {
            let x = pseudo_random(rows * depth, seed, 1.0);
            let w = pseudo_random(depth * columns, seed ^ 1, 1.0);
            let b = if with_bias { pseudo_random(columns, seed ^ 2, 1.0) } else { vec![] };
            let laid = panels(&w, depth, columns);
            let layer = Layer { laid: &laid, bias: &b, depth, columns };
            let fast = run(&x, &layer);
            let mut plain = vec![0.0; rows * columns];
            product_of::<false, NARROW>(&x, &layer, rows, &mut plain);
            let mut wide = vec![0.0; rows * columns];
            product_of::<false, COLS>(&x, &layer, rows, &mut wide);
            prop_assert_eq!(&wide, &plain);
            prop_assert_eq!(fast.len(), rows * columns);
            for m in 0..rows {
                for n in 0..columns {
                    let mut want = b.get(n).copied().unwrap_or(0.0);
                    for k in 0..depth {
                        want += x[m * depth + k] * w[k * columns + n];
                    }
                    let at = m * columns + n;
                    let tolerance = 1e-5 * (depth as f32).sqrt() * (1.0 + want.abs());
                    prop_assert!((fast[at] - want).abs() <= tolerance, "{} vs {}", fast[at], want);
                    prop_assert!((plain[at] - want).abs() <= tolerance, "{} vs {}", plain[at], want);
                }
            }
        }
    }
}
