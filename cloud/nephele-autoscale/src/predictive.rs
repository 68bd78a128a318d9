//! From a rate to replicas, and the pre-warm floor: the replicas the forecast rate
//! needs when a replica started now would be ready.
//!
//! The floor only ever raises the count (as AWS predictive scaling: the larger of
//! predictive and reactive wins, and predictive never scales in); scale-in stays with
//! the reactive rules.

use crate::forecast::RateForecaster;

/// Replicas that serve `rate_per_s` with their slots `target_utilisation` busy, each
/// replica serving `concurrency` requests at once in `service_ms` each (a fractional
/// concurrency is a learned capacity: [`crate::capacity`], in requests at once).
pub fn replicas_for_rate(
    rate_per_s: f64,
    service_ms: f64,
    concurrency: f64,
    target_utilisation: f64,
) -> u32 {
    let concurrency = if concurrency.is_finite() && concurrency > 0.0 {
        concurrency
    } else {
        1.0
    };
    let per_replica = concurrency * target_utilisation.max(0.01);
    let busy_slots = rate_per_s.max(0.0) * service_ms.max(0.0) / 1000.0;
    let needed = (busy_slots / per_replica - 1e-9).ceil();
    if needed.is_finite() {
        needed.clamp(0.0, f64::from(u32::MAX)) as u32
    } else {
        0
    }
}

/// The forecast horizons the pre-warm floor covers: from the bucket in which a
/// replica started now would be ready to the one a tick later, capped at `horizon_ms`
/// ahead of now (and at least the bucket being filled).
pub fn prewarm_horizons(
    forecaster: &RateForecaster,
    now_ms: u64,
    cold_start_ms: f64,
    tick_ms: u64,
    horizon_ms: u64,
) -> (usize, usize) {
    let cold = cold_start_ms.clamp(0.0, 1e15) as u64;
    let cap = forecaster.horizon_at(now_ms.saturating_add(horizon_ms));
    let first = forecaster.horizon_at(now_ms.saturating_add(cold)).min(cap);
    let last = forecaster
        .horizon_at(now_ms.saturating_add(cold).saturating_add(tick_ms))
        .min(cap);
    (first, last.max(first))
}

/// The forecast peak rate over `horizons` and the replicas it needs.
pub fn prewarm_floor(
    forecaster: &RateForecaster,
    horizons: (usize, usize),
    service_ms: f64,
    concurrency: f64,
    target_utilisation: f64,
) -> (f64, u32) {
    let rate = forecaster.peak_rate_per_s(horizons.0, horizons.1);
    (
        rate,
        replicas_for_rate(rate, service_ms, concurrency, target_utilisation),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::forecast::ForecasterKind;

    #[test]
    fn replicas_cover_the_rate_at_the_target_utilisation() {
        // 10 req/s × 0.5 s = 5 busy slots; 4 slots × 0.5 = 2 per replica → 3.
        assert_eq!(replicas_for_rate(10.0, 500.0, 4.0, 0.5), 3);
        assert_eq!(replicas_for_rate(8.0, 500.0, 4.0, 0.5), 2);
        assert_eq!(replicas_for_rate(0.0, 500.0, 4.0, 0.5), 0);
        assert_eq!(replicas_for_rate(f64::NAN, 500.0, 4.0, 0.5), 0);
    }

    #[test]
    fn the_floor_looks_past_the_cold_start() {
        let mut forecaster = RateForecaster::new(ForecasterKind::Last, 60_000);
        assert_eq!(
            prewarm_horizons(&forecaster, 0, 30_000.0, 5_000, 300_000),
            (1, 1)
        );
        forecaster.record(60_000, 600);
        forecaster.record(61_000, 0);
        // Filling [60 s, 120 s): at 61 s a 30 s cold start is ready in this bucket, at
        // 100 s in the next one, and a very long one is capped at 5 min ahead.
        assert_eq!(
            prewarm_horizons(&forecaster, 61_000, 30_000.0, 5_000, 300_000),
            (1, 1)
        );
        assert_eq!(
            prewarm_horizons(&forecaster, 100_000, 30_000.0, 5_000, 300_000),
            (2, 2)
        );
        assert_eq!(
            prewarm_horizons(&forecaster, 100_000, 1e12, 5_000, 300_000),
            (6, 6)
        );
        let (rate, replicas) = prewarm_floor(&forecaster, (1, 2), 1_000.0, 1.0, 1.0);
        assert!((rate - 10.0).abs() < 1e-9);
        assert_eq!(replicas, 10);
    }
}
