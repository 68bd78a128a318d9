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

/// Four distinct batches of `batch` rows taken in turn from `rows`, so caches see
/// different data as in serving. Empty when `rows` is empty or `batch` is 0.
pub fn sample_batches(rows: &[Vec<f32>], batch: usize) -> Vec<Vec<f32>> {
    if rows.is_empty() || batch == 0 {
        return Vec::new();
    }
    (0..4)
        .map(|offset| {
            (0..batch)
                .flat_map(|i| rows[(offset * batch + i) % rows.len()].iter().copied())
                .collect()
        })
        .collect()
}

/// The protocol for any backend: `run` on `batches` in turn, `warmup` times untimed,
/// then for `duration` (and at least `min_runs` times), each run timed alone.
pub fn time_runs<E>(
    batch: usize,
    batches: &[Vec<f32>],
    warmup: usize,
    duration: Duration,
    min_runs: usize,
    mut run: impl FnMut(&[f32]) -> Result<(), E>,
) -> Result<LatencyStats, E> {
    let mut times_ms = Vec::new();
    if !batches.is_empty() {
        for i in 0..warmup {
            run(&batches[i % batches.len()])?;
        }
        let started = Instant::now();
        while times_ms.len() < min_runs.max(1) || started.elapsed() < duration {
            let data = &batches[times_ms.len() % batches.len()];
            let run_started = Instant::now();
            run(data)?;
            times_ms.push(run_started.elapsed().as_secs_f64() * 1e3);
        }
    }
    let total_ms: f64 = times_ms.iter().sum();
    let runs = times_ms.len();
    times_ms.sort_by(f64::total_cmp);
    Ok(LatencyStats {
        batch,
        runs,
        p50_ms: percentile(&times_ms, 0.5),
        p99_ms: percentile(&times_ms, 0.99),
        mean_ms: total_ms / runs.max(1) as f64,
        items_per_s: (runs * batch) as f64 / (total_ms / 1e3).max(1e-12),
    })
}

/// Runs `model` on batches of `batch` rows taken in turn from `rows` (each one input row
/// without the batch axis), with [`time_runs`]' protocol.
pub fn measure(
    model: &Model,
    rows: &[Vec<f32>],
    batch: usize,
    warmup: usize,
    duration: Duration,
    min_runs: usize,
) -> Result<LatencyStats, RuntimeError> {
    if rows.is_empty() || batch == 0 {
        return Err(RuntimeError::BadInput {
            model: model.name().to_string(),
            cause: "no input rows or a batch of 0".into(),
        });
    }
    let mut shape = vec![batch];
    shape.extend(
        model.input().shape[1..]
            .iter()
            .map(|d| (*d).max(1) as usize),
    );
    time_runs(
        batch,
        &sample_batches(rows, batch),
        warmup,
        duration,
        min_runs,
        |data| model.infer(&shape, data).map(|_| ()),
    )
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
