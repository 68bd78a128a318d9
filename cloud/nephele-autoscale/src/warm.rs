//! The warm pool: replicas started ahead of need, so that a rise the forecast missed
//! finds capacity that has already paid its cold start.
//!
//! Its size is the forecast's recent under-forecast at the cold-start horizon: for
//! each closed bucket, actual − (the forecast made `h` buckets before it), `h` the
//! buckets a cold start spans; the pool covers the configured quantile of those
//! errors (in requests per second) at the target utilisation. A forecaster that is
//! right needs no pool; one that misses rises by the size of its misses.

use serde::{Deserialize, Serialize};
use std::collections::VecDeque;

use crate::predictive::replicas_for_rate;

/// Recent forecasts and their errors.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
pub struct WarmPool {
    /// Forecasts made for upcoming buckets: (bucket index, forecast count), oldest
    /// first.
    pending: VecDeque<(u64, f64)>,
    /// Under-forecast (actual − forecast, counts, floored at 0) of recent buckets.
    errors: VecDeque<f64>,
    /// The same values, sorted (so a quantile is a lookup).
    sorted: Vec<f64>,
    /// Index of the next bucket to close.
    next_bucket: u64,
}

impl WarmPool {
    /// A bucket closed with `actual` arrivals; `history` errors are kept.
    pub fn on_bucket(&mut self, actual: f64, history: usize) {
        let index = self.next_bucket;
        self.next_bucket += 1;
        while self
            .pending
            .front()
            .is_some_and(|(bucket, _)| *bucket < index)
        {
            self.pending.pop_front();
        }
        if let Some((bucket, forecast)) = self.pending.front().copied() {
            if bucket == index {
                self.pending.pop_front();
                let error = (actual - forecast).max(0.0);
                self.errors.push_back(error);
                let at = self.sorted.partition_point(|value| *value < error);
                self.sorted.insert(at, error);
                while self.errors.len() > history.max(1) {
                    if let Some(old) = self.errors.pop_front() {
                        let at = self.sorted.partition_point(|value| *value < old);
                        if at < self.sorted.len() {
                            self.sorted.remove(at);
                        }
                    }
                }
            }
        }
    }

    /// Remembers the forecast (a count) for the bucket `horizon` buckets after the last
    /// closed one, to score it when it closes. One forecast per bucket: the first kept.
    pub fn remember(&mut self, horizon: usize, forecast_count: f64) {
        let bucket = self.next_bucket + horizon.max(1) as u64 - 1;
        if self.pending.back().is_none_or(|(last, _)| *last < bucket) {
            self.pending.push_back((bucket, forecast_count));
        }
    }

    /// The `quantile` of recent under-forecasts, in counts per bucket (0 with none).
    pub fn error_quantile(&self, quantile: f64) -> f64 {
        if self.sorted.is_empty() {
            return 0.0;
        }
        let rank = ((quantile.clamp(0.0, 1.0) * self.sorted.len() as f64).ceil() as usize)
            .clamp(1, self.sorted.len());
        self.sorted[rank - 1]
    }

    /// Warm replicas: the error quantile as a rate, in replicas at the target
    /// utilisation, at most `max_warm`.
    #[allow(clippy::too_many_arguments)]
    pub fn size(
        &self,
        quantile: f64,
        bucket_ms: u64,
        service_ms: f64,
        concurrency: f64,
        target_utilisation: f64,
        max_warm: u32,
    ) -> u32 {
        let rate = self.error_quantile(quantile) * 1000.0 / bucket_ms.max(1) as f64;
        replicas_for_rate(rate, service_ms, concurrency, target_utilisation).min(max_warm)
    }

    /// Errors held.
    pub fn samples(&self) -> usize {
        self.errors.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_pool_covers_the_misses_and_not_the_overshoots() {
        let mut pool = WarmPool::default();
        // Forecast 10 for every bucket; actual 10, 30, 5, 10.
        for actual in [10.0, 30.0, 5.0, 10.0] {
            pool.remember(1, 10.0);
            pool.on_bucket(actual, 100);
        }
        assert_eq!(pool.samples(), 4);
        assert_eq!(pool.error_quantile(1.0), 20.0);
        assert_eq!(pool.error_quantile(0.5), 0.0);
        // 20 per 60 s bucket = 1/3 req/s × 3 s = 1 busy slot → 1 replica at 100%.
        assert_eq!(pool.size(1.0, 60_000, 3_000.0, 1.0, 1.0, 8), 1);
        assert_eq!(pool.size(1.0, 60_000, 3_000.0, 1.0, 1.0, 0), 0);
    }

    #[test]
    fn forecasts_are_scored_against_the_bucket_they_were_made_for() {
        let mut pool = WarmPool::default();
        pool.remember(2, 5.0); // for bucket 1
        pool.on_bucket(100.0, 10); // bucket 0: no forecast for it
        assert_eq!(pool.samples(), 0);
        pool.on_bucket(8.0, 10); // bucket 1
        assert_eq!(pool.error_quantile(1.0), 3.0);
    }
}
