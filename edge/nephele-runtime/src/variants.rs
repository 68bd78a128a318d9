//! The variants the control plane derives when a model is pushed, each measured against
//! the full model on the model's validation data before it may ship.
//!
//! | variant            | how it is made                             | ships only if                                   |
//! |--------------------|--------------------------------------------|-------------------------------------------------|
//! | `full`             | the pushed file                            | it loads                                        |
//! | `int8`             | int8 weights, per-channel scales           | its outputs pass the push's rules ([`crate::acceptance`]: min cosine to fp32 ≥ 0.99 unless `--accept` names another) and accuracy drop ≤ 0.5 points (when labelled) |
//! | `split@<tensor>`   | head/tail pair at a single-tensor cut      | head→tail equals full within [`SPLIT_TOLERANCE`] on every row |
//!
//! Each variant records its size, its measured agreement and, for splits, what the
//! Neurosurgeon-style planner needs: compute on each side (FLOPs from tract's cost
//! model) and the bytes of the activation sent across the cut.

use tract_onnx::prelude::*;

use std::collections::HashMap;

use crate::acceptance::{Accept, Values, Verdict};
use crate::graph_model::NamedTensor;
use crate::onnx_edit::{OnnxGraph, QuantizationReport};
use crate::{Model, RuntimeError};

/// Largest |split − full| allowed, relative to the largest |full| output of the row
/// (plus an absolute 1e-6 for all-zero rows). Splitting changes only where tract may
/// fuse across the cut, so differences are float rounding.
pub const SPLIT_TOLERANCE: f32 = 1e-4;
/// An int8 variant ships only when every validation row's output has at least this
/// cosine similarity with fp32's…
pub const MIN_INT8_COSINE: f64 = crate::acceptance::DEFAULT_MIN_COSINE;
/// …and, for labelled data, it loses at most this many accuracy points.
pub const MAX_INT8_ACCURACY_DROP_POINTS: f64 = 0.5;

/// Rows to compare variants on, optionally with class labels (argmax of the output).
#[derive(Debug, Clone, PartialEq)]
pub struct ValidationSet {
    /// One input row per sample, laid out as the model's input without the batch axis.
    pub rows: Vec<Vec<f32>>,
    pub labels: Option<Vec<usize>>,
}

/// How closely a variant's outputs follow the full model's.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Agreement {
    pub rows: usize,
    pub min_cosine: f64,
    pub mean_cosine: f64,
    /// Largest |variant − full| over all outputs.
    pub max_abs_diff: f32,
    /// Share of rows whose argmax is the same.
    pub top1_agreement: f64,
}

/// Where a split variant cuts the model.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct CutInfo {
    pub tensor: String,
    /// Shape of the activation at the cut, batch first (`-1` symbolic).
    pub shape: Vec<i64>,
    /// f32 bytes of one row's activation: what crosses the link per request.
    pub activation_bytes: u64,
    pub head_flops: u64,
    pub tail_flops: u64,
    /// Why this cut was among those built ([`crate::cut_choice::choose_cuts`]).
    #[serde(default)]
    pub chosen_because: String,
}

/// One built variant.
#[derive(Debug, Clone, PartialEq)]
pub struct BuiltVariant {
    /// `full`, `int8` or `split@<tensor>`.
    pub name: String,
    pub precision: String,
    /// The file(s): one for full and int8, head then tail for a split.
    pub files: Vec<Vec<u8>>,
    pub flops: u64,
    pub accuracy: Option<f64>,
    pub agreement: Option<Agreement>,
    pub cut: Option<CutInfo>,
    pub quantization: Option<QuantizationReport>,
    /// What its outputs were judged on and what that measured, rule by rule
    /// ([`crate::acceptance::Verdict::summary`]); `None` where no rule applies.
    pub accepted_on: Option<String>,
    /// `None` when it may ship; otherwise why not (it is still reported).
    pub rejected: Option<String>,
}

impl BuiltVariant {
    /// The model as pushed: `fp32`, measured against itself.
    pub fn full(file: Vec<u8>, flops: u64, accuracy: Option<f64>, agreement: Agreement) -> Self {
        BuiltVariant {
            files: vec![file],
            accuracy,
            agreement: Some(agreement),
            ..BuiltVariant::pending("full", "fp32", flops)
        }
    }

    /// A variant about to be built: no files and nothing measured yet.
    pub fn pending(name: impl Into<String>, precision: &str, flops: u64) -> Self {
        BuiltVariant {
            name: name.into(),
            precision: precision.into(),
            files: Vec::new(),
            flops,
            accuracy: None,
            agreement: None,
            cut: None,
            quantization: None,
            accepted_on: None,
            rejected: None,
        }
    }

    pub fn size(&self) -> u64 {
        self.files.iter().map(|f| f.len() as u64).sum()
    }
}

/// Everything derived from one pushed model.
#[derive(Debug, Clone, PartialEq)]
pub struct VariantSet {
    pub model: String,
    pub full_input_bytes: u64,
    pub variants: Vec<BuiltVariant>,
}

impl VariantSet {
    pub fn get(&self, name: &str) -> Option<&BuiltVariant> {
        self.variants.iter().find(|v| v.name == name)
    }

    /// The variants that may ship.
    pub fn shippable(&self) -> impl Iterator<Item = &BuiltVariant> {
        self.variants.iter().filter(|v| v.rejected.is_none())
    }
}

/// Sum of multiply-accumulates tract's cost model counts for one row (batch 1), × 2.
pub fn flops(name: &str, bytes: &[u8]) -> Result<u64, RuntimeError> {
    flops_with_shape(name, bytes, None)
}

/// [`flops`] for a model loaded with a fixed input row shape.
pub fn flops_with_shape(
    name: &str,
    bytes: &[u8],
    row_shape: Option<&[usize]>,
) -> Result<u64, RuntimeError> {
    let model = Model::load_onnx_with_shape(name, bytes, row_shape)?;
    flops_for_input(name, bytes, &model.input().shape)
}

/// [`flops`] for a model whose input shape (batch first, `-1` symbolic) is known
/// already, e.g. from a loaded [`Model`]: no second load.
pub fn flops_for_input(name: &str, bytes: &[u8], input_shape: &[i64]) -> Result<u64, RuntimeError> {
    let load = |cause: String| RuntimeError::Load {
        model: name.to_string(),
        cause,
    };
    let typed = typed_at_batch_one(name, bytes, input_shape)?
        .into_decluttered()
        .map_err(|e| load(format!("{e:#}")))?;
    let mut fma = 0u64;
    for node in typed.nodes() {
        let inputs = typed
            .node_input_facts(node.id)
            .map_err(|e| load(format!("{e:#}")))?;
        let costs = node.op.cost(&inputs).map_err(|e| load(format!("{e:#}")))?;
        for (cost, count) in costs {
            if matches!(cost, tract_onnx::tract_core::ops::Cost::FMA(_)) {
                fma = fma.saturating_add(count.to_i64().unwrap_or(0).max(0) as u64);
            }
        }
    }
    Ok(fma.saturating_mul(2))
}

/// The ONNX file typed (not optimised) with its input fixed to `input_shape` at batch
/// 1 (symbolic dimensions as 1): what tract's cost model and the cut costs read.
pub(crate) fn typed_at_batch_one(
    name: &str,
    bytes: &[u8],
    input_shape: &[i64],
) -> Result<TypedModel, RuntimeError> {
    let mut concrete: Vec<usize> = input_shape.iter().map(|d| (*d).max(1) as usize).collect();
    if let Some(first) = concrete.first_mut() {
        *first = 1;
    }
    let mut reader = bytes;
    crate::onnx_reader()
        .model_for_read(&mut reader)
        .and_then(|m| m.with_input_fact(0, f32::fact(&concrete).into()))
        .and_then(|m| m.into_typed())
        .map_err(|e| RuntimeError::Load {
            model: name.to_string(),
            cause: format!("{e:#}"),
        })
}

fn run_all(model: &Model, rows: &[Vec<f32>]) -> Result<Vec<Vec<f32>>, RuntimeError> {
    run_all_shaped(model, rows).map(|(_, outputs)| outputs)
}

/// Every row's output, and the output's shape for one row (batch 1).
fn run_all_shaped(
    model: &Model,
    rows: &[Vec<f32>],
) -> Result<(Vec<usize>, Vec<Vec<f32>>), RuntimeError> {
    let row_shape: Vec<usize> = model.input().shape[1..]
        .iter()
        .map(|d| *d as usize)
        .collect();
    let mut shape = Vec::new();
    let outputs = rows
        .iter()
        .map(|row| {
            model.infer(&row_shape, row).map(|(s, out)| {
                shape = s;
                out
            })
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok((shape, outputs))
}

/// The one output of a one-output model, as [`crate::acceptance`] compares it.
struct Reference<'a> {
    name: &'a str,
    shape: &'a [usize],
    rows: &'a [Vec<f32>],
}

impl Reference<'_> {
    /// `candidate`'s rows judged against these by `accept`.
    fn judge(&self, accept: &[Accept], candidate: &[Vec<f32>]) -> Verdict {
        let want = one_output(self.name, self.shape, self.rows);
        let got = one_output(self.name, self.shape, candidate);
        crate::acceptance::judge(accept, &want, &got)
    }
}

fn one_output<'a>(name: &'a str, shape: &'a [usize], rows: &'a [Vec<f32>]) -> Vec<Vec<Values<'a>>> {
    rows.iter()
        .map(|data| vec![Values { name, shape, data }])
        .collect()
}

fn argmax(values: &[f32]) -> usize {
    crate::acceptance::top(values).0
}

use crate::acceptance::cosine;

/// Compares outputs row by row.
pub fn agreement(reference: &[Vec<f32>], candidate: &[Vec<f32>]) -> Agreement {
    let rows = reference.len().min(candidate.len());
    let (mut min_cosine, mut sum_cosine, mut max_abs_diff, mut same_top1) =
        (f64::INFINITY, 0.0, 0.0f32, 0usize);
    for (a, b) in reference.iter().zip(candidate) {
        let c = if a.len() == b.len() {
            cosine(a, b)
        } else {
            0.0
        };
        min_cosine = min_cosine.min(c);
        sum_cosine += c;
        for (x, y) in a.iter().zip(b) {
            max_abs_diff = max_abs_diff.max((x - y).abs());
        }
        same_top1 += usize::from(argmax(a) == argmax(b));
    }
    Agreement {
        rows,
        min_cosine: if rows == 0 { 0.0 } else { min_cosine },
        mean_cosine: sum_cosine / rows.max(1) as f64,
        max_abs_diff,
        top1_agreement: same_top1 as f64 / rows.max(1) as f64,
    }
}

fn accuracy(outputs: &[Vec<f32>], labels: Option<&Vec<usize>>) -> Option<f64> {
    let labels = labels?;
    let correct = outputs
        .iter()
        .zip(labels)
        .filter(|(out, label)| argmax(out) == **label)
        .count();
    Some(100.0 * correct as f64 / outputs.len().max(1) as f64)
}

/// Builds and measures every variant of `full` (an ONNX file). Fails only when the full
/// model itself cannot be loaded or run on the validation rows; a variant that cannot
/// be built or disagrees is kept with `rejected` saying why.
pub fn build_variants(
    name: &str,
    full: &[u8],
    validation: &ValidationSet,
) -> Result<VariantSet, RuntimeError> {
    build_variants_with(name, full, validation, None, true)
}

/// [`build_variants`] with the input row shape fixed (models with symbolic height and
/// width) and, with `splits` false, without the split variants (a benchmark of int8
/// alone need not load every head and tail).
pub fn build_variants_with(
    name: &str,
    full: &[u8],
    validation: &ValidationSet,
    row_shape: Option<&[usize]>,
    splits: bool,
) -> Result<VariantSet, RuntimeError> {
    build_variants_observed(name, full, validation, row_shape, splits, &[], &mut |_| {})
}

/// How far a build is, for a progress bar: `done` of `total` steps, `step` naming the
/// one just finished.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct BuildProgress {
    pub done: usize,
    pub total: usize,
    pub step: String,
}

/// [`build_variants_with`], judging int8 by `accept` ([`crate::acceptance`]; empty: the
/// default cosine rule) and calling `progress` after each step (the full model, int8,
/// choosing the cuts, each split).
#[allow(clippy::too_many_arguments)]
pub fn build_variants_observed(
    name: &str,
    full: &[u8],
    validation: &ValidationSet,
    row_shape: Option<&[usize]>,
    splits: bool,
    accept: &[Accept],
    progress: &mut dyn FnMut(BuildProgress),
) -> Result<VariantSet, RuntimeError> {
    if validation.rows.is_empty() {
        return Err(RuntimeError::BadInput {
            model: name.to_string(),
            cause: "the validation set is empty; variants cannot be checked against it".into(),
        });
    }
    if let Some(labels) = &validation.labels {
        if labels.len() != validation.rows.len() {
            return Err(RuntimeError::BadInput {
                model: name.to_string(),
                cause: format!(
                    "{} labels for {} validation rows",
                    labels.len(),
                    validation.rows.len()
                ),
            });
        }
    }
    let graph = OnnxGraph::parse(name, full)?;
    let full_model = Model::load_onnx_with_shape(name, full, row_shape)?;
    let (output_shape, reference) = run_all_shaped(&full_model, &validation.rows)?;
    crate::acceptance::check_outputs(name, accept, &[full_model.output().name.as_str()])?;
    let full_accuracy = accuracy(&reference, validation.labels.as_ref());
    // What the rest needs of the loaded model; it goes before the int8 and split
    // variants are loaded and measured, so a large model's build holds one runnable
    // model at a time (its reference outputs are computed).
    let output_name = full_model.output().name.clone();
    let input_shape = full_model.input().shape.clone();
    drop(full_model);
    let full_flops = flops_for_input(name, full, &input_shape)?;
    let row_len: i64 = input_shape[1..].iter().product();
    let input_bytes = (row_len.max(0) as u64) * 4;
    // The cuts first (cheap: one typed pass), so the total is known from the start.
    let cuts = if splits {
        let all = graph.candidate_cuts();
        let costs = crate::cut_choice::cut_costs(name, full, &input_shape, &all)?;
        crate::cut_choice::choose_cuts(
            &costs,
            input_bytes,
            full_flops,
            crate::cut_choice::MAX_SPLIT_CANDIDATES,
        )
    } else {
        Vec::new()
    };
    let total = 2 + cuts.len();
    let mut done = 0;
    let mut step = |what: String| {
        done += 1;
        progress(BuildProgress {
            done,
            total,
            step: what,
        });
    };
    step(format!(
        "full model checked on {} validation rows",
        validation.rows.len()
    ));
    let mut variants = vec![BuiltVariant::full(
        full.to_vec(),
        full_flops,
        full_accuracy,
        agreement(&reference, &reference),
    )];
    variants.push(int8_variant(
        name,
        &graph,
        validation,
        &Reference {
            name: &output_name,
            shape: &output_shape,
            rows: &reference,
        },
        accept,
        full_accuracy,
        full_flops,
        row_shape,
    ));
    step("int8 variant measured".into());
    for cut in &cuts {
        let mut variant = split_variant(name, &graph, &cut.cost.tensor, validation, &reference);
        if let Some(info) = variant.cut.as_mut() {
            info.chosen_because = cut.reason.clone();
        }
        variants.push(variant);
        step(format!("split@{} measured", cut.cost.tensor));
    }
    Ok(VariantSet {
        model: name.to_string(),
        full_input_bytes: input_bytes,
        variants,
    })
}

/// The variants of a BERT encoder pushed as `model.safetensors` + `config.json` for
/// candle: `full` is the encoder as one f32 GGUF file, `int8` the same in Q8_0
/// ([`crate::candle_bert::quantize_int8`]), checked against `full` on `validation`
/// (rows of `seq` token ids) by the same rules as an ONNX model's int8. No split
/// variants: a candle model is not cut.
pub fn build_bert_variants(
    name: &str,
    safetensors: &[u8],
    config_json: &str,
    seq: usize,
    validation: &ValidationSet,
    accept: &[Accept],
) -> Result<VariantSet, RuntimeError> {
    use crate::candle_bert::{full_gguf, quantize_int8};
    if validation.rows.is_empty() {
        return Err(RuntimeError::BadInput {
            model: name.to_string(),
            cause: "the validation set is empty; variants cannot be checked against it".into(),
        });
    }
    if let Some(row) = validation.rows.iter().find(|row| row.len() != seq) {
        return Err(RuntimeError::BadInput {
            model: name.to_string(),
            cause: format!("a validation row has {} token ids, not {seq}", row.len()),
        });
    }
    let full = full_gguf(name, safetensors, config_json)?;
    let full_model = Model::load_bert_gguf(name, &full, seq)?;
    let (output_shape, reference) = run_all_shaped(&full_model, &validation.rows)?;
    crate::acceptance::check_outputs(name, accept, &[full_model.output().name.as_str()])?;
    let full_accuracy = accuracy(&reference, validation.labels.as_ref());
    let flops = full_model.candle_flops().unwrap_or(0);
    let mut int8 = BuiltVariant::pending("int8", "int8-q8_0", flops);
    let built = quantize_int8(name, safetensors, config_json).and_then(|bytes| {
        let model = Model::load_bert_gguf(&format!("{name}/int8"), &bytes, seq)?;
        let outputs = run_all(&model, &validation.rows)?;
        Ok((bytes, outputs))
    });
    match built {
        Err(error) => int8.rejected = Some(format!("could not be built: {error}")),
        Ok((bytes, outputs)) => {
            let measured = agreement(&reference, &outputs);
            let verdict = Reference {
                name: &full_model.output().name,
                shape: &output_shape,
                rows: &reference,
            }
            .judge(accept, &outputs);
            int8.accuracy = accuracy(&outputs, validation.labels.as_ref());
            int8.files = vec![bytes];
            int8.agreement = Some(measured);
            int8.accepted_on = Some(verdict.summary());
            let drop = match (full_accuracy, int8.accuracy) {
                (Some(full), Some(quantized)) => full - quantized,
                _ => 0.0,
            };
            if let Some(failed) = verdict.failures() {
                int8.rejected = Some(format!("outputs disagree with fp32: {failed}"));
            } else if drop > MAX_INT8_ACCURACY_DROP_POINTS {
                int8.rejected = Some(format!(
                    "loses {drop:.2} accuracy points (> {MAX_INT8_ACCURACY_DROP_POINTS})"
                ));
            }
        }
    }
    Ok(VariantSet {
        model: name.to_string(),
        full_input_bytes: seq as u64 * 4,
        variants: vec![
            BuiltVariant::full(
                full,
                flops,
                full_accuracy,
                agreement(&reference, &reference),
            ),
            int8,
        ],
    })
}

#[allow(clippy::too_many_arguments)]
fn int8_variant(
    name: &str,
    graph: &OnnxGraph,
    validation: &ValidationSet,
    reference: &Reference,
    accept: &[Accept],
    full_accuracy: Option<f64>,
    full_flops: u64,
    row_shape: Option<&[usize]>,
) -> BuiltVariant {
    let mut variant = BuiltVariant::pending("int8", "int8-weights", full_flops);
    // Measured as the agent runs it; weights that hurt are kept in f32 until the rules
    // hold (crate::mixed_precision).
    let built = crate::mixed_precision::quantize_until_it_agrees(graph, |bytes| {
        let model = Model::load_variant(&format!("{name}/int8"), bytes, row_shape)?;
        let outputs = run_all(&model, &validation.rows)?;
        let measured = agreement(reference.rows, &outputs);
        let verdict = reference.judge(accept, &outputs);
        let quantized_accuracy = accuracy(&outputs, validation.labels.as_ref());
        let drop = match (full_accuracy, quantized_accuracy) {
            (Some(full), Some(int8)) => full - int8,
            _ => 0.0,
        };
        let passes = verdict.passes() && drop <= MAX_INT8_ACCURACY_DROP_POINTS;
        Ok((passes, (measured, verdict, quantized_accuracy, drop)))
    });
    match built {
        Err(error) => variant.rejected = Some(format!("could not be built: {error}")),
        Ok(tried) => {
            let (measured, verdict, quantized_accuracy, drop) = tried.measured;
            let mut report = tried.report;
            variant.accuracy = quantized_accuracy;
            variant.files = vec![tried.bytes];
            variant.agreement = Some(measured);
            variant.rejected = int8_refusal(&report, &verdict, drop, tried.tries);
            variant.accepted_on = Some(verdict.summary());
            if variant.rejected.is_none() {
                let (compute, tried_compute) = try_compute(
                    name,
                    graph,
                    &variant.files[0],
                    validation,
                    reference,
                    accept,
                    full_accuracy,
                    row_shape,
                );
                if let Some((compute, measured, accuracy, verdict)) = compute {
                    variant.files = vec![compute];
                    variant.precision = "int8-compute".into();
                    variant.agreement = Some(measured);
                    variant.accuracy = accuracy;
                    variant.accepted_on = Some(verdict.summary());
                }
                report.compute = Some(tried_compute);
            }
            variant.quantization = Some(report);
        }
    }
    variant
}

/// A compute-form int8 file chosen to ship, with its agreement, accuracy and verdict.
type ComputeForm = (Vec<u8>, Agreement, Option<f64>, Verdict);

/// The int8 compute form of a one-input model's int8-storage file, timed and measured
/// as the agent runs it ([`crate::int8_compute::choose`]), under the same rules as the
/// storage form (the push's acceptance rules and the accuracy drop).
#[allow(clippy::too_many_arguments)]
fn try_compute(
    name: &str,
    graph: &OnnxGraph,
    storage: &[u8],
    validation: &ValidationSet,
    reference: &Reference,
    accept: &[Accept],
    full_accuracy: Option<f64>,
    row_shape: Option<&[usize]>,
) -> (Option<ComputeForm>, crate::int8_compute::ComputeReport) {
    // Calibration runs the rows as typed requests of the model's one input.
    let input = graph
        .real_inputs()
        .first()
        .map(|i| i.name.clone())
        .unwrap_or_default();
    let shape = Model::load_variant(&format!("{name}/int8"), storage, row_shape).map(|m| {
        m.input().shape[1..]
            .iter()
            .map(|d| *d as usize)
            .collect::<Vec<_>>()
    });
    let rows: Vec<HashMap<String, NamedTensor>> = match &shape {
        Ok(row) => validation
            .rows
            .iter()
            .map(|values| {
                let mut dims = vec![1];
                dims.extend(row.iter().copied());
                HashMap::from([(
                    input.clone(),
                    NamedTensor {
                        dtype: "f32".into(),
                        shape: dims,
                        data: values.iter().map(|v| *v as f64).collect(),
                    },
                )])
            })
            .collect(),
        Err(_) => Vec::new(),
    };
    // Calibration runs a copy with the input's shape given (a one-input file may leave
    // its dimensions unknown and take them from `row_shape`); the shipped file keeps the
    // storage form's input as it is.
    let calibration_form = shape.as_ref().ok().and_then(|row| {
        let dims: Vec<String> = std::iter::once(1)
            .chain(row.iter().copied())
            .map(|d| d.to_string())
            .collect();
        let spec = format!("{input}={}:f32", dims.join(",")).parse().ok()?;
        crate::input_spec::prepare(name, storage, &[spec])
            .ok()
            .map(std::borrow::Cow::into_owned)
    });
    let mut measured = None;
    let (file, report) = crate::int8_compute::choose(
        name,
        storage,
        calibration_form.as_deref(),
        &rows,
        |bytes, runs| {
            let model = Model::load_variant(&format!("{name}/int8"), bytes, row_shape)?;
            let row_shape: Vec<usize> = model.input().shape[1..]
                .iter()
                .map(|d| *d as usize)
                .collect();
            let row = &validation.rows[0];
            crate::int8_compute::median_ms(runs, || model.infer(&row_shape, row).map(|_| ()))
        },
        |bytes| {
            let model = Model::load_variant(&format!("{name}/int8"), bytes, row_shape)?;
            let outputs = run_all(&model, &validation.rows)?;
            let agreed = agreement(reference.rows, &outputs);
            let verdict = reference.judge(accept, &outputs);
            let quantized_accuracy = accuracy(&outputs, validation.labels.as_ref());
            let drop = match (full_accuracy, quantized_accuracy) {
                (Some(full), Some(int8)) => full - int8,
                _ => 0.0,
            };
            let passes = verdict.passes() && drop <= MAX_INT8_ACCURACY_DROP_POINTS;
            measured = Some((agreed, quantized_accuracy, verdict));
            Ok((passes, agreed.min_cosine))
        },
    );
    (
        file.zip(measured)
            .map(|(bytes, (agreed, accuracy, verdict))| (bytes, agreed, accuracy, verdict)),
        report,
    )
}

/// Why an int8 variant is not shipped, or `None` when it is.
pub(crate) fn int8_refusal(
    report: &crate::onnx_edit::QuantizationReport,
    verdict: &Verdict,
    drop: f64,
    tries: usize,
) -> Option<String> {
    let kept = if report.kept_for_accuracy.is_empty() {
        String::new()
    } else {
        format!(
            " even with the {} weights of largest int8 error kept in f32 ({tries} builds tried)",
            report.kept_for_accuracy.len()
        )
    };
    if report.quantized_tensors == 0 {
        Some("no weight is large enough to quantize".into())
    } else if let Some(failed) = verdict.failures() {
        Some(format!("outputs disagree with fp32: {failed}{kept}"))
    } else if drop > MAX_INT8_ACCURACY_DROP_POINTS {
        Some(format!(
            "loses {drop:.2} accuracy points (> {MAX_INT8_ACCURACY_DROP_POINTS}){kept}"
        ))
    } else {
        None
    }
}

fn split_variant(
    name: &str,
    graph: &OnnxGraph,
    cut: &str,
    validation: &ValidationSet,
    reference: &[Vec<f32>],
) -> BuiltVariant {
    let mut variant = BuiltVariant::pending(format!("split@{cut}"), "fp32", 0);
    let built = (|| {
        let head_only = graph.head(cut)?;
        let head_name = format!("{name}/head@{cut}");
        let head = Model::load_onnx(&head_name, &head_only)?;
        let shape = head.output().shape.clone();
        let (head_bytes, tail_bytes) = graph.split(cut, &shape)?;
        let tail_name = format!("{name}/tail@{cut}");
        let tail = Model::load_onnx(&tail_name, &tail_bytes)?;
        let activations = run_all(&head, &validation.rows)?;
        let outputs = run_all(&tail, &activations)?;
        let per_row: i64 = shape.iter().skip(1).product();
        let info = CutInfo {
            tensor: cut.to_string(),
            shape,
            activation_bytes: (per_row.max(0) as u64) * 4,
            head_flops: flops(&head_name, &head_bytes)?,
            tail_flops: flops(&tail_name, &tail_bytes)?,
            chosen_because: String::new(),
        };
        Ok::<_, RuntimeError>((head_bytes, tail_bytes, info, outputs))
    })();
    match built {
        Err(error) => variant.rejected = Some(format!("could not be built: {error}")),
        Ok((head_bytes, tail_bytes, info, outputs)) => {
            let within = reference.iter().zip(&outputs).all(|(full, split)| {
                let scale = full.iter().fold(0.0f32, |m, v| m.max(v.abs()));
                full.len() == split.len()
                    && full
                        .iter()
                        .zip(split)
                        .all(|(a, b)| (a - b).abs() <= SPLIT_TOLERANCE * scale + 1e-6)
            });
            let measured = agreement(reference, &outputs);
            variant.accuracy = accuracy(&outputs, validation.labels.as_ref());
            variant.flops = info.head_flops.saturating_add(info.tail_flops);
            variant.files = vec![head_bytes, tail_bytes];
            variant.agreement = Some(measured);
            variant.cut = Some(info);
            if !within {
                variant.rejected = Some(format!(
                    "head→tail differs from the full model by up to {} (tolerance {SPLIT_TOLERANCE} relative)",
                    measured.max_abs_diff
                ));
            }
        }
    }
    variant
}
