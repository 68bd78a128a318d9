//! The forecasters compared on each trace and their errors at 1–5 minutes ahead on
//! the tune part and on the rest.

use nephele_autoscale::forecast::{evaluate, ForecasterKind};

use super::ForecastRow;
use crate::autoscale_trace::Workload;

/// The forecasters compared on each trace.
pub fn forecast_candidates() -> Vec<ForecasterKind> {
    vec![
        ForecasterKind::Last,
        ForecasterKind::Ewma { alpha: 0.1 },
        ForecasterKind::Ewma { alpha: 0.3 },
        ForecasterKind::Ewma { alpha: 0.6 },
        ForecasterKind::Holt {
            alpha: 0.3,
            beta: 0.05,
            phi: 0.9,
        },
        ForecasterKind::Holt {
            alpha: 0.6,
            beta: 0.1,
            phi: 0.9,
        },
        ForecasterKind::SeasonalNaive { season: 1440 },
        ForecasterKind::HoltWinters {
            alpha: 0.1,
            beta: 0.01,
            gamma: 0.1,
            phi: 0.9,
            season: 1440,
        },
        ForecasterKind::HoltWinters {
            alpha: 0.3,
            beta: 0.01,
            gamma: 0.3,
            phi: 0.9,
            season: 1440,
        },
        ForecasterKind::HoltWinters {
            alpha: 0.5,
            beta: 0.01,
            gamma: 0.5,
            phi: 0.9,
            season: 1440,
        },
    ]
}

/// Per-minute arrival counts.
pub fn minute_counts(workload: &Workload) -> Vec<f64> {
    let span_min = (workload.span_s() / 60.0).floor() as usize + 1;
    let mut counts = vec![0.0; span_min];
    for request in &workload.requests {
        let minute = (request.arrival_us / 60_000_000) as usize;
        if let Some(slot) = counts.get_mut(minute) {
            *slot += 1.0;
        }
    }
    counts
}

/// Each candidate's error at 1–5 minutes ahead, on the tune part and on the rest.
pub fn forecast_errors(workload: &Workload, tune_share: f64) -> Vec<ForecastRow> {
    let counts = minute_counts(workload);
    let split = ((counts.len() as f64 * tune_share).round() as usize).clamp(1, counts.len());
    let horizons = [1, 2, 3, 4, 5];
    let mut rows = Vec::new();
    for kind in forecast_candidates() {
        let tune = evaluate(&kind, &counts[..split], 60_000, &horizons, 0);
        let holdout = evaluate(&kind, &counts, 60_000, &horizons, split);
        for (t, h) in tune.iter().zip(&holdout) {
            rows.push(ForecastRow {
                model: kind.label(),
                horizon_min: h.horizon,
                tune_mae: t.mae,
                holdout_mae: h.mae,
                holdout_rmse: h.rmse,
                holdout_relative_mae: h.relative_mae,
                holdout_bias: h.bias,
            });
        }
    }
    rows
}
