//! Variants of models with several typed inputs and outputs ([`crate::graph_model`]):
//! `full`, and `int8` (weights stored as int8 with per-channel scales, by the same
//! rewrite as for one-input models, [`crate::onnx_edit::OnnxGraph::quantize_weights_int8`]),
//! measured against `full` on typed rows under the push's acceptance rules, output by
//! output ([`crate::acceptance`]; by default min cosine ≥
//! [`crate::variants::MIN_INT8_COSINE`] over the float outputs together). Split variants
//! of typed models are not built.
//!
//! The rows are synthetic unless the push brings some: floats uniform in [0, 1),
//! integers uniform in 0..=255 (bytes, small token ids), booleans half true, from a
//! fixed seed, so every control plane measures the same thing. They measure agreement
//! with the full model, not accuracy; a row that the full model refuses (an integer out
//! of a model's range) is not used.

use std::collections::HashMap;

use crate::acceptance::{Accept, Values, Verdict};
use crate::graph_model::{GraphModel, NamedTensor};
use crate::onnx_edit::OnnxGraph;
use crate::variants::{agreement, BuiltVariant, VariantSet, MIN_INT8_COSINE};
use crate::RuntimeError;

/// Synthetic rows a typed model's variants are measured on.
pub const SYNTHETIC_TYPED_ROWS: usize = 16;

/// `count` deterministic requests for `model`'s inputs.
pub fn synthetic_rows(model: &GraphModel, count: usize) -> Vec<HashMap<String, NamedTensor>> {
    let mut state: u64 = 0x7a6f_6f5f_7479_7065;
    let mut next = move || {
        state = state
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        state >> 11
    };
    (0..count)
        .map(|_| {
            model
                .inputs()
                .iter()
                .map(|decl| {
                    let n: usize = decl.shape.iter().product();
                    let data = (0..n)
                        .map(|_| {
                            let r = next();
                            match decl.dtype.as_str() {
                                "f32" | "f16" => (r as f64) / (1u64 << 53) as f64,
                                "bool" => (r & 1) as f64,
                                _ => (r % 256) as f64,
                            }
                        })
                        .collect();
                    (
                        decl.name.clone(),
                        NamedTensor {
                            dtype: decl.dtype.clone(),
                            shape: decl.shape.clone(),
                            data,
                        },
                    )
                })
                .collect()
        })
        .collect()
}

/// The names of the model's float outputs, in its output order (what agreement compares).
fn float_outputs(model: &GraphModel) -> impl Iterator<Item = &str> {
    model
        .outputs()
        .iter()
        .filter(|d| d.dtype == "f32" || d.dtype == "f16")
        .map(|d| d.name.as_str())
}

/// Every float output of one answer, in the model's output order, as one vector (what
/// the view's min cosine compares).
fn flat_outputs(model: &GraphModel, answer: &HashMap<String, NamedTensor>) -> Vec<f32> {
    flatten(&float_answer(model, answer))
}

fn flatten(answer: &FloatAnswer) -> Vec<f32> {
    answer
        .iter()
        .flat_map(|(_, _, d)| d.iter().copied())
        .collect()
}

/// One answer's float outputs, in the model's output order: name, shape and values.
type FloatAnswer = Vec<(String, Vec<usize>, Vec<f32>)>;

fn float_answer(model: &GraphModel, answer: &HashMap<String, NamedTensor>) -> FloatAnswer {
    float_outputs(model)
        .filter_map(|name| {
            answer.get(name).map(|t| {
                (
                    name.to_string(),
                    t.shape.clone(),
                    t.data.iter().map(|v| *v as f32).collect(),
                )
            })
        })
        .collect()
}

/// `candidate` judged against `reference` by `accept`, output by output.
fn judge(accept: &[Accept], reference: &[FloatAnswer], candidate: &[FloatAnswer]) -> Verdict {
    crate::acceptance::judge(accept, &borrowed(reference), &borrowed(candidate))
}

fn borrowed(rows: &[FloatAnswer]) -> Vec<Vec<Values<'_>>> {
    rows.iter()
        .map(|row| {
            row.iter()
                .map(|(name, shape, data)| Values { name, shape, data })
                .collect()
        })
        .collect()
}

/// Builds `full` and `int8` for a typed model and measures int8 against full on `rows`.
/// When the full model runs none of them (synthetic integers outside what an input
/// takes), `int8` is refused saying so, and `full` still ships.
///
/// `state` names the model's recurrent-state bindings (input, output): the int8 compute
/// form, whose activation rounding can compound through a state fed back step after
/// step, must also agree over a session's stream of the rows, and is not tried at all
/// on `synthetic` rows, on which a stream says little (silero-vad's compute form
/// agrees at 0.998 over a stream of synthetic noise and at 0.78 over speech).
///
/// `accept` names the rules int8 is judged by ([`crate::acceptance`]; empty: the
/// default); a rule naming an output the model lacks is an error.
pub fn build_graph_variants(
    name: &str,
    full: &[u8],
    model: &GraphModel,
    rows: &[HashMap<String, NamedTensor>],
    state: &[(String, String)],
    synthetic: bool,
    accept: &[Accept],
) -> Result<VariantSet, RuntimeError> {
    let floats: Vec<&str> = float_outputs(model).collect();
    crate::acceptance::check_outputs(name, accept, &floats)?;
    let mut used = Vec::new();
    let mut reference = Vec::new();
    let mut answers = Vec::new();
    let mut first_error = None;
    for row in rows {
        match model.run(row) {
            Ok(answer) => {
                reference.push(flat_outputs(model, &answer));
                answers.push(float_answer(model, &answer));
                used.push(row);
            }
            Err(error) => {
                first_error.get_or_insert(error);
            }
        }
    }
    let full_variant =
        BuiltVariant::full(full.to_vec(), 0, None, agreement(&reference, &reference));
    let mut int8 = BuiltVariant::pending("int8", "int8-weights", 0);
    if used.is_empty() {
        let mut int8 = int8;
        int8.rejected = Some(format!(
            "not measured: the model ran none of the {} validation rows ({}); push validation.typed_rows with inputs it takes",
            rows.len(),
            first_error.map(|e| e.to_string()).unwrap_or_default()
        ));
        return Ok(VariantSet {
            model: name.to_string(),
            full_input_bytes: 0,
            variants: vec![full_variant, int8],
        });
    }
    let built = OnnxGraph::parse(name, full).and_then(|graph| {
        crate::mixed_precision::quantize_until_it_agrees(&graph, |bytes| {
            // Measured as the agent runs it.
            let quantized = GraphModel::load(&format!("{name}/int8"), bytes)?;
            let got = used
                .iter()
                .map(|row| quantized.run(row).map(|a| float_answer(&quantized, &a)))
                .collect::<Result<Vec<_>, _>>()?;
            let outputs: Vec<Vec<f32>> = got.iter().map(flatten).collect();
            let measured = agreement(&reference, &outputs);
            let verdict = judge(accept, &answers, &got);
            Ok((verdict.passes(), (measured, verdict)))
        })
    });
    match built {
        Err(error) => int8.rejected = Some(format!("could not be built: {error}")),
        Ok(tried) => {
            let mut report = tried.report;
            let (measured, verdict) = tried.measured;
            int8.agreement = Some(measured);
            int8.accepted_on = Some(verdict.summary());
            int8.rejected = if reference.iter().all(|r| r.is_empty()) {
                Some("the model has no float output to compare".into())
            } else {
                crate::variants::int8_refusal(&report, &verdict, 0.0, tried.tries)
            };
            int8.files = vec![tried.bytes];
            if int8.rejected.is_none() {
                let rows: Vec<HashMap<String, NamedTensor>> =
                    used.iter().map(|r| (*r).clone()).collect();
                let (compute, tried_compute) = if !state.is_empty() && synthetic {
                    (None, crate::int8_compute::ComputeReport {
                        sites: 0,
                        calibration_rows: 0,
                        storage_ms: None,
                        compute_ms: None,
                        min_cosine: None,
                        chosen: false,
                        reason: "int8 compute: not tried for a model with recurrent state measured on synthetic rows only (activation rounding compounds through the state over a session; push validation.typed_rows of real inputs to measure it); int8 storage only".into(),
                    })
                } else {
                    try_compute(
                        name,
                        &int8.files[0],
                        &rows,
                        (&reference, &answers),
                        model,
                        state,
                        accept,
                    )
                };
                if let Some((compute, (measured, verdict))) = compute {
                    int8.files = vec![compute];
                    int8.precision = "int8-compute".into();
                    int8.agreement = Some(measured);
                    int8.accepted_on = Some(verdict.summary());
                }
                report.compute = Some(tried_compute);
            }
            int8.quantization = Some(report);
        }
    }
    Ok(VariantSet {
        model: name.to_string(),
        full_input_bytes: 0,
        variants: vec![full_variant, int8],
    })
}

/// A compute-form file chosen to ship, with its agreement and verdict.
type ComputeForm = (Vec<u8>, (crate::variants::Agreement, Verdict));

/// The int8 compute form of a typed model's int8-storage file, timed and measured as
/// the agent runs it ([`crate::int8_compute::choose`]).
fn try_compute(
    name: &str,
    storage: &[u8],
    rows: &[HashMap<String, NamedTensor>],
    (reference, answers): (&[Vec<f32>], &[FloatAnswer]),
    full: &GraphModel,
    state: &[(String, String)],
    accept: &[Accept],
) -> (Option<ComputeForm>, crate::int8_compute::ComputeReport) {
    let mut measured = None;
    let (file, report) = crate::int8_compute::choose(
        name,
        storage,
        None,
        rows,
        |bytes, runs| {
            let model = GraphModel::load(&format!("{name}/int8"), bytes)?;
            crate::int8_compute::median_ms(runs, || model.run(&rows[0]).map(|_| ()))
        },
        |bytes| {
            let model = GraphModel::load(&format!("{name}/int8"), bytes)?;
            let got = rows
                .iter()
                .map(|row| model.run(row).map(|a| float_answer(&model, &a)))
                .collect::<Result<Vec<_>, _>>()?;
            let outputs: Vec<Vec<f32>> = got.iter().map(flatten).collect();
            let mut agreed = agreement(reference, &outputs);
            let mut verdict = judge(accept, answers, &got);
            if !state.is_empty() {
                // A session's stream: each step's state comes from the step before.
                let want = session_stream(full, rows, state)?;
                let got = session_stream(&model, rows, state)?;
                let streamed = agreement(&want, &got);
                agreed.min_cosine = agreed.min_cosine.min(streamed.min_cosine);
                verdict.parts.push(crate::acceptance::Part {
                    passes: streamed.min_cosine >= MIN_INT8_COSINE,
                    text: format!(
                        "min cosine {:.4} over a session's stream of {} steps (rule ≥ {MIN_INT8_COSINE})",
                        streamed.min_cosine,
                        rows.len()
                    ),
                });
            }
            let passes = verdict.passes();
            measured = Some((agreed, verdict));
            Ok((passes, agreed.min_cosine))
        },
    );
    (file.zip(measured), report)
}

/// `rows` run as one session (the first step's state inputs zeros, as a new session's;
/// each later step's the outputs they are bound to from the step before): per float
/// output, its values over the whole stream, so an output of one value (a speech
/// probability) is compared over the stream and not drowned by a large state beside it.
fn session_stream(
    model: &GraphModel,
    rows: &[HashMap<String, NamedTensor>],
    state: &[(String, String)],
) -> Result<Vec<Vec<f32>>, RuntimeError> {
    let floats: Vec<&str> = float_outputs(model).collect();
    let mut streams: Vec<Vec<f32>> = vec![Vec::new(); floats.len()];
    let mut carried: HashMap<String, NamedTensor> = state
        .iter()
        .filter_map(|(input, _)| model.zeros_for(input).map(|z| (input.clone(), z)))
        .collect();
    for row in rows {
        let mut request = row.clone();
        request.extend(carried.iter().map(|(k, v)| (k.clone(), v.clone())));
        let answer = model.run(&request)?;
        for (stream, name) in streams.iter_mut().zip(&floats) {
            if let Some(tensor) = answer.get(*name) {
                stream.extend(tensor.data.iter().map(|v| *v as f32));
            }
        }
        carried = state
            .iter()
            .filter_map(|(input, output)| answer.get(output).map(|t| (input.clone(), t.clone())))
            .collect();
    }
    Ok(streams)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_typed_example_gets_an_int8_variant_measured_against_full() {
        let bytes = crate::input_spec::prepare(
            "typed",
            &crate::synthetic::typed_example(),
            &[
                "scale=1,4".parse().expect("spec"),
                "offset=scalar:i64=3".parse().expect("spec"),
            ],
        )
        .expect("prepared")
        .into_owned();
        let model = GraphModel::load("typed", &bytes).expect("loads");
        let rows = synthetic_rows(&model, 4);
        assert_eq!(rows.len(), 4);
        assert!(rows[0]["ids"].data.iter().all(|v| (0.0..256.0).contains(v)));
        assert!(rows[0]["scale"].data.iter().all(|v| (0.0..1.0).contains(v)));
        // Same seed, same rows.
        assert_eq!(rows, synthetic_rows(&model, 4));
        let set =
            build_graph_variants("typed", &bytes, &model, &rows, &[], true, &[]).expect("built");
        assert_eq!(set.variants.len(), 2);
        let int8 = &set.variants[1];
        // The fixture's weights are too small to quantize: refused, saying so.
        assert!(
            int8.rejected
                .as_deref()
                .is_some_and(|r| r.contains("large enough") || r.contains("could not")),
            "{:?}",
            int8.rejected
        );
    }
}
