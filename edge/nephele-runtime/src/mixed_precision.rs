//! Mixed precision for the int8-weights variant: when quantizing every weight makes the
//! outputs disagree with fp32 (the rule of [`crate::variants`]), the weights whose int8
//! error is largest relative to their size are kept in f32, as few as the rule allows.
//!
//! The order is each tensor's relative error ‖w − dq(w)‖ / ‖w‖ (a weight with outlier
//! channels or a heavy tail loses most), and the number kept is searched for on the
//! validation rows themselves: 1, 2, 4, … until the rule holds, then halved back
//! between the last failure and the first success, at most [`MAX_TRIES`] builds in
//! all. A variant that needs more than half of its weights in f32 is not worth its
//! name and is refused.

use std::collections::HashSet;

use crate::onnx_edit::{OnnxGraph, QuantizationReport};
use crate::RuntimeError;

/// Builds (each loaded and run on the validation rows) one search may try.
pub const MAX_TRIES: usize = 8;

/// A quantized file, its report, and what `measure` said about it.
pub struct Tried<M> {
    pub bytes: Vec<u8>,
    pub report: QuantizationReport,
    pub measured: M,
    pub passes: bool,
    /// Builds measured to get here (1 when every weight could stay int8).
    pub tries: usize,
}

/// Quantizes every weight; if `measure` says the result fails the rule, keeps the most
/// sensitive weights in f32 until it passes (see the module). Returns the passing build
/// with the fewest weights kept, or the last one tried (`passes` false) when none did
/// within the bounds.
pub fn quantize_until_it_agrees<M>(
    graph: &OnnxGraph,
    mut measure: impl FnMut(&[u8]) -> Result<(bool, M), RuntimeError>,
) -> Result<Tried<M>, RuntimeError> {
    let (bytes, report) = graph.quantize_weights_int8()?;
    let (passes, measured) = measure(&bytes)?;
    let order: Vec<String> = report
        .relative_errors
        .iter()
        .map(|(name, _)| name.clone())
        .collect();
    let mut tries = 1;
    let mut best = Tried {
        bytes,
        report,
        measured,
        passes,
        tries,
    };
    if passes || order.len() < 2 {
        return Ok(best);
    }
    let limit = order.len() / 2;
    let mut build = |k: usize| -> Result<Tried<M>, RuntimeError> {
        let keep: HashSet<String> = order.iter().take(k).cloned().collect();
        let (bytes, report) = graph.quantize_weights_int8_keeping(&keep)?;
        let (passes, measured) = measure(&bytes)?;
        Ok(Tried {
            bytes,
            report,
            measured,
            passes,
            tries: 0,
        })
    };
    // Doubling until the rule holds…
    let (mut failed, mut k) = (0usize, 1usize);
    let mut found: Option<(usize, Tried<M>)> = None;
    while tries < MAX_TRIES && k <= limit {
        let attempt = build(k)?;
        tries += 1;
        if attempt.passes {
            found = Some((k, attempt));
            break;
        }
        failed = k;
        best = attempt;
        k *= 2;
    }
    let Some((mut passing, mut winner)) = found else {
        best.tries = tries;
        return Ok(best);
    };
    // …then back down between the last failure and the first success.
    while tries < MAX_TRIES && passing - failed > 1 {
        let middle = failed + (passing - failed) / 2;
        let attempt = build(middle)?;
        tries += 1;
        if attempt.passes {
            passing = middle;
            winner = attempt;
        } else {
            failed = middle;
        }
    }
    winner.tries = tries;
    Ok(winner)
}

/// What mixed precision kept and whether int8 compute was chosen, for the variant's
/// note (`None`: nothing to say).
pub fn summary(report: &QuantizationReport) -> Option<String> {
    let lines: Vec<String> = kept_summary(report)
        .into_iter()
        .chain(report.compute.as_ref().map(|c| c.reason.clone()))
        .collect();
    (!lines.is_empty()).then(|| lines.join("; "))
}

/// One line on what mixed precision kept.
fn kept_summary(report: &QuantizationReport) -> Option<String> {
    if report.kept_for_accuracy.is_empty() {
        return None;
    }
    let names: Vec<String> = report
        .kept_for_accuracy
        .iter()
        .take(4)
        .map(|(name, error)| format!("{name} ({:.1}% error as int8)", 100.0 * error))
        .collect();
    let more = report.kept_for_accuracy.len().saturating_sub(names.len());
    Some(format!(
        "mixed precision: {} of {} weights kept in f32 because int8 changed the outputs too much: {}{}",
        report.kept_for_accuracy.len(),
        report.kept_for_accuracy.len() + report.quantized_tensors,
        names.join(", "),
        if more > 0 {
            format!(" and {more} more")
        } else {
            String::new()
        }
    ))
}
