//! Measuring a loaded model the way `nephele bench inference` reports it: latency
//! percentiles of back-to-back runs at a fixed batch size, on the calling thread.
//!
//! The same protocol as the onnxruntime side (`shared/models/registry/ort_bench.py`):
//! warm-up runs first, then runs until `seconds` have passed (at least `min_runs`),
//! each timed alone; p50/p99 are of those times, throughput is items per second of
//! run time.

use std::time::{Duration, Instant};

use crate::{Model, RuntimeError};

/// Figures of one model at one batch size.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct LatencyStats {
    pub batch: usize,
    pub runs: usize,
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub mean_ms: f64,
    pub items_per_s: f64,
}

/// Nearest-rank percentile of sorted `values` (`q` in 0..=1).
pub fn percentile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = (q.clamp(0.0, 1.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// Runs `model` on batches of `batch` rows taken in turn from `rows` (each one input row
/// without the batch axis), `warmup` times untimed, then for `duration` (and at least
/// `min_runs` times).
pub fn measure(
    model: &Model,
    rows: &[Vec<f32>],
    batch: usize,
    warmup: usize,
    duration: Duration,
    min_runs: usize,
) -> Result<LatencyStats, RuntimeError> {
    let bad = |cause: String| RuntimeError::BadInput {
        model: model.name().to_string(),
        cause,
    };
    if rows.is_empty() || batch == 0 {
        return Err(bad("no input rows or a batch of 0".into()));
    }
    let row_shape: Vec<usize> = model.input().shape[1..]
        .iter()
        .map(|d| (*d).max(1) as usize)
        .collect();
    let mut shape = vec![batch];
    shape.extend_from_slice(&row_shape);
    // A few distinct batches, so caches see different data as in serving.
    let batches: Vec<Vec<f32>> = (0..4)
        .map(|offset| {
            (0..batch)
                .flat_map(|i| rows[(offset * batch + i) % rows.len()].iter().copied())
                .collect()
        })
        .collect();
    for i in 0..warmup {
        model.infer(&shape, &batches[i % batches.len()])?;
    }
    let mut times_ms = Vec::new();
    let started = Instant::now();
    while times_ms.len() < min_runs.max(1) || started.elapsed() < duration {
        let data = &batches[times_ms.len() % batches.len()];
        let run_started = Instant::now();
        model.infer(&shape, data)?;
        times_ms.push(run_started.elapsed().as_secs_f64() * 1e3);
    }
    let total_ms: f64 = times_ms.iter().sum();
    let runs = times_ms.len();
    times_ms.sort_by(f64::total_cmp);
    Ok(LatencyStats {
        batch,
        runs,
        p50_ms: percentile(&times_ms, 0.5),
        p99_ms: percentile(&times_ms, 0.99),
        mean_ms: total_ms / runs as f64,
        items_per_s: (runs * batch) as f64 / (total_ms / 1e3).max(1e-12),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_use_the_nearest_rank() {
        let values: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(percentile(&values, 0.5), 50.0);
        assert_eq!(percentile(&values, 0.99), 99.0);
        assert_eq!(percentile(&values, 1.0), 100.0);
        assert_eq!(percentile(&values, 0.0), 1.0);
        assert!(percentile(&[], 0.5).is_nan());
    }
}
