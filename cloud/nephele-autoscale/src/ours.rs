//! `Ours`: reactive rules + predictive pre-warm + warm pool + admission control, in one
//! [`ScalingPolicy`]. Each tick, in this order:
//!
//! 1. The signals are sanitised; the service time and cold start estimates are updated
//!    from what was measured (the defaults until then); the tick's answers teach the
//!    capacity learner what one replica carries within target ([`crate::capacity`]),
//!    and every size below is taken at that capacity.
//! 2. The arrivals go into the forecaster's bucket; closed buckets score the forecasts
//!    made for them (the warm pool's error history).
//! 3. The pre-warm floor: the replicas the forecast peak rate needs over the buckets up
//!    to when a replica started now would be ready ([`crate::predictive`]).
//! 4. The warm pool size from the recent under-forecast ([`crate::warm`]).
//! 5. The reactive rules decide the total with the floor and the pool as inputs
//!    ([`crate::reactive`]); only their scale-in rule lowers it.
//! 6. The admission level for the requests until the next tick ([`crate::admission`]).

use serde::{Deserialize, Serialize};

use crate::admission::Admission;
use crate::capacity::Capacity;
use crate::config::{ConfigError, OursConfig};
use crate::forecast::RateForecaster;
use crate::predictive::{prewarm_floor, prewarm_horizons, replicas_for_rate};
use crate::reactive::{Plan, ReactiveCore};
use crate::warm::WarmPool;
use crate::{begin_tick, Decision, ScalingPolicy, Signals};

/// The product's scaler. Build it with [`Ours::new`]; persist it with serde.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Ours {
    pub config: OursConfig,
    reactive: ReactiveCore,
    forecast: RateForecaster,
    warm_pool: WarmPool,
    #[serde(default)]
    capacity: Capacity,
    service_ms: Option<f64>,
    cold_start_ms: Option<f64>,
    last_now_ms: u64,
}

impl Ours {
    /// A scaler with `config` (validated).
    pub fn new(config: OursConfig) -> Result<Ours, ConfigError> {
        config.validate()?;
        Ok(Ours {
            forecast: RateForecaster::new(config.forecast.model.clone(), config.forecast.bucket_ms),
            config,
            reactive: ReactiveCore::default(),
            warm_pool: WarmPool::default(),
            capacity: Capacity::default(),
            service_ms: None,
            cold_start_ms: None,
            last_now_ms: 0,
        })
    }

    /// The forecaster, for a `why` view or a forecast-only comparison.
    pub fn forecaster(&self) -> &RateForecaster {
        &self.forecast
    }

    /// The capacity learner, for a `why` view and the simulator's report.
    pub fn capacity(&self) -> &Capacity {
        &self.capacity
    }
}

impl ScalingPolicy for Ours {
    fn name(&self) -> &'static str {
        "ours"
    }

    fn period_ms(&self) -> u64 {
        self.config.tick_ms
    }

    fn tick(&mut self, now_ms: u64, signals: &Signals) -> Decision {
        let (now_ms, signals) = begin_tick(&mut self.last_now_ms, now_ms, signals);
        let config = &self.config;
        if signals.service_ms > 0.0 {
            self.service_ms = Some(signals.service_ms);
        }
        if let Some(cold) = signals.cold_start_ms {
            self.cold_start_ms = Some(cold);
        }
        let service_ms = self.service_ms.unwrap_or(config.default_service_ms);
        let cold_start_ms = self.cold_start_ms.unwrap_or(config.default_cold_start_ms);
        // What one replica carries within target (requests per second): learned from
        // the answers, or the declared slots over the service time until then. As a
        // concurrency (requests at once, Little's law) every size below is taken at it.
        let prior_per_s = f64::from(signals.concurrency) * 1000.0 / service_ms.max(1e-3);
        let per_replica_per_s = if config.capacity.enabled {
            self.capacity
                .observe(now_ms, &signals, prior_per_s, service_ms, &config.capacity)
        } else {
            prior_per_s
        };
        // A learned capacity is already the load kept within target: sizes take it
        // whole (target_utilisation is the headroom of the prior, which is a slot count).
        let headroom = if config.capacity.enabled && self.capacity.is_learned() {
            config.target_utilisation
        } else {
            1.0
        };
        let concurrency = (per_replica_per_s * service_ms / 1000.0 / headroom).max(1e-6);

        let (mut floor, mut extra, mut forecast_rate) = (0, 0, None);
        if config.forecast.enabled {
            let bucket_ms = config.forecast.bucket_ms;
            for count in self.forecast.record(now_ms, signals.arrivals) {
                self.warm_pool.on_bucket(count, config.warm.history_buckets);
            }
            // The forecast for the bucket a replica started now would first serve.
            let cold_horizon = self
                .forecast
                .horizon_at(now_ms.saturating_add(cold_start_ms.min(1e15) as u64));
            self.warm_pool.remember(
                cold_horizon,
                self.forecast.forecaster.forecast(cold_horizon),
            );
            let horizons = prewarm_horizons(
                &self.forecast,
                now_ms,
                cold_start_ms,
                config.tick_ms,
                config.forecast.horizon_ms,
            );
            let (rate, replicas) = prewarm_floor(
                &self.forecast,
                horizons,
                service_ms,
                concurrency,
                config.target_utilisation,
            );
            floor = replicas;
            forecast_rate = Some(rate);
            if config.warm.enabled {
                extra = self.warm_pool.size(
                    config.warm.quantile,
                    bucket_ms,
                    service_ms,
                    concurrency,
                    config.target_utilisation,
                    config.warm.max_warm,
                );
            }
        }

        let outcome = self.reactive.step(
            now_ms,
            &signals,
            &Plan {
                service_ms,
                concurrency,
                floor,
                extra,
                cold_start_ms,
            },
            config,
        );

        let admission = if config.admission.enabled {
            admission_level(
                config,
                &signals,
                service_ms,
                concurrency,
                cold_start_ms,
                outcome.total,
            )
        } else {
            Admission::open()
        };
        Decision {
            desired: outcome.total,
            warm: outcome.warm,
            mode: outcome.mode,
            admission,
            forecast_rate_per_s: forecast_rate,
            reason: outcome.reason,
        }
    }
}

/// The admission level: a request may wait `wait_multiple` mean service times (at
/// least `min_wait_ms`) before it starts; past that it would miss a deadline of about
/// twice its service time, so it is refused now with a Retry-After of about when
/// capacity frees (the cold start of the replicas being started, or one service time).
/// When the offered rate needs more than `max_replicas`, the rate is also capped at
/// what `max_replicas` can carry.
fn admission_level(
    config: &OursConfig,
    signals: &Signals,
    service_ms: f64,
    concurrency: f64,
    cold_start_ms: f64,
    desired: u32,
) -> Admission {
    let max_wait_ms =
        (config.admission.wait_multiple * service_ms).max(config.admission.min_wait_ms);
    let retry_after_ms = if signals.starting > 0 || desired > signals.ready {
        cold_start_ms
    } else {
        service_ms
    };
    let rate = if signals.window_ms == 0 {
        0.0
    } else {
        signals.arrivals as f64 * 1000.0 / signals.window_ms as f64
    };
    let at_limit = replicas_for_rate(rate, service_ms, concurrency, 1.0) > config.max_replicas;
    let max_rate_per_s = at_limit
        .then(|| f64::from(config.max_replicas) * concurrency * 1000.0 / service_ms.max(1e-3))
        .filter(|rate| rate.is_finite());
    Admission {
        max_wait_ms: Some(max_wait_ms),
        max_rate_per_s,
        burst: (f64::from(config.max_replicas) * concurrency).max(1.0),
        retry_after_ms: (retry_after_ms.max(0.0).ceil() as u64)
            .max(config.admission.min_retry_after_ms),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::forecast::ForecasterKind;
    use crate::Mode;

    fn signals(arrivals: u64, ready: u32) -> Signals {
        Signals {
            window_ms: 5_000,
            arrivals,
            in_flight: ready.min(arrivals as u32),
            queued: 0,
            p99_ms: Some(500.0),
            utilisation: 0.5,
            ready,
            starting: 0,
            service_ms: 1_000.0,
            concurrency: 1,
            cold_start_ms: Some(20_000.0),
            priority: 0,
            ..Signals::default()
        }
    }

    #[test]
    fn a_forecast_rise_is_prewarmed_before_it_arrives_and_never_removes_replicas() {
        let config = OursConfig {
            forecast: crate::config::ForecastConfig {
                model: ForecasterKind::Holt {
                    alpha: 0.9,
                    beta: 0.9,
                    phi: 1.0,
                },
                ..Default::default()
            },
            warm: crate::config::WarmConfig {
                enabled: false,
                ..Default::default()
            },
            ..OursConfig::default()
        };
        let mut ours = Ours::new(config).expect("valid");
        // A ramp: 1, 2, 3, 4 req/s per minute. Ready follows the decision.
        let mut ready = 1;
        let mut last = None;
        for minute in 0..4u64 {
            for tick in 1..=12u64 {
                let now = minute * 60_000 + tick * 5_000;
                let decision = ours.tick(now, &signals(5 * (minute + 1), ready));
                ready = decision.desired;
                last = Some(decision);
            }
        }
        let last = last.expect("ticked");
        // The ramp's trend forecasts 5 req/s for the next minute: ceil(5 / 0.7) = 8
        // replicas while the current minute's need is ceil(4 / 0.7) = 6.
        assert_eq!(last.desired, 8, "{}", last.reason);
        assert!(last.forecast_rate_per_s.is_some_and(|rate| rate > 4.5));
        // The forecast falls to nothing: the count holds (utilisation is not low).
        let mut now = 4 * 60_000;
        for _ in 0..60 {
            now += 5_000;
            let decision = ours.tick(now, &signals(0, ready));
            assert!(decision.desired >= 8, "{}", decision.reason);
        }
    }

    #[test]
    fn admission_bounds_the_wait_and_caps_the_rate_at_the_replica_limit() {
        let config = OursConfig {
            max_replicas: 4,
            ..OursConfig::default()
        };
        let mut ours = Ours::new(config).expect("valid");
        // 100 req/s of 1 s requests needs 100 replicas; the limit is 4.
        let decision = ours.tick(5_000, &signals(500, 4));
        assert_eq!(decision.desired, 4);
        assert_eq!(decision.mode, Mode::Panic);
        assert_eq!(decision.admission.max_wait_ms, Some(1_000.0));
        assert_eq!(decision.admission.max_rate_per_s, Some(4.0));
        assert_eq!(decision.admission.retry_after_ms, 1_000);
    }

    #[test]
    fn state_round_trips_through_json_and_resumes_identically() {
        let mut first = Ours::new(OursConfig::default()).expect("valid");
        for tick in 1..=30u64 {
            first.tick(tick * 5_000, &signals(tick % 7, 2));
        }
        let json = serde_json::to_string(&first).expect("serialises");
        let mut resumed: Ours = serde_json::from_str(&json).expect("parses");
        for tick in 31..=60u64 {
            let input = signals(tick % 5 * 3, 3);
            assert_eq!(
                first.tick(tick * 5_000, &input),
                resumed.tick(tick * 5_000, &input)
            );
        }
    }
}
