//! How long an offload will take, as the agent believes it: an estimate that ages and
//! is re-probed, so a deployment is never locked out of the cloud by one slow spell.
//!
//! The estimate is an EWMA (1/8) of measured offload round trips. Only offloads
//! measure it, and the policy offloads only when the estimate fits the deadline, so an
//! estimate that once exceeds the deadline would never be corrected: the deployment
//! would answer 429 for as long as the agent runs, however fast the link became. Two
//! rules prevent that:
//!
//! | rule   | when                                                        | effect |
//! |--------|-------------------------------------------------------------|--------|
//! | decay  | no sample for longer than `stale_after_us`                  | the estimate moves towards the fallback (the path's RTT plus the local service time) with half-life `half_life_us` |
//! | probe  | stale, and [`super::offload::decide`] refused the request, or the local queue refused it ([`offload_overflow`]) | the request goes to the cloud instead of a 429 (it would not have been answered in time anyway): one probe at a time, at most one per `probe_interval_us`; its round trip replaces the stale estimate |
//!
//! A probe never displaces a request that had an answer in time, so probing costs no
//! request its SLO; a probe that fails is counted by the circuit breaker like any
//! offload. With no sample yet the estimate is the fallback, and it is stale, so the
//! first refusal probes too: a lagging RTT estimate cannot lock a deployment out either.

use serde::{Deserialize, Serialize};

use crate::offload::{BreakerState, CircuitBreaker, Route};

/// The tunable part of [`RemoteEstimator`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct RemoteEstimatorConfig {
    /// Age of the last sample after which the estimate decays and may be probed.
    pub stale_after_us: u64,
    /// Half-life of the decay towards the fallback.
    pub half_life_us: u64,
    /// Least time between two probes' starts.
    pub probe_interval_us: u64,
    /// A probe without an outcome after this long no longer blocks the next one.
    pub probe_timeout_us: u64,
}

impl Default for RemoteEstimatorConfig {
    fn default() -> Self {
        RemoteEstimatorConfig {
            stale_after_us: 1_000_000,
            half_life_us: 2_000_000,
            probe_interval_us: 500_000,
            probe_timeout_us: 5_000_000,
        }
    }
}

/// The estimate of one deployment's offload round trip (sans-IO; times are `now_us`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RemoteEstimator {
    config: RemoteEstimatorConfig,
    /// EWMA of measured round trips, µs (0 before the first).
    ewma_us: u64,
    /// When the last sample came.
    sampled_at_us: Option<u64>,
    /// When the last probe started, and whether it is still out.
    probe_started_us: Option<u64>,
    probe_out: bool,
}

impl Default for RemoteEstimator {
    fn default() -> Self {
        RemoteEstimator::new(RemoteEstimatorConfig::default())
    }
}

impl RemoteEstimator {
    pub fn new(config: RemoteEstimatorConfig) -> Self {
        RemoteEstimator {
            config,
            ewma_us: 0,
            sampled_at_us: None,
            probe_started_us: None,
            probe_out: false,
        }
    }

    /// Whether the estimate is older than `stale_after_us` (or there is none).
    pub fn is_stale(&self, now_us: u64) -> bool {
        self.sampled_at_us
            .is_none_or(|at| now_us.saturating_sub(at) > self.config.stale_after_us)
    }

    /// The predicted offload round trip at `now_us`: the EWMA while fresh; once stale,
    /// moving towards `fallback_us` (RTT plus service time) with the half-life; the
    /// fallback before any sample.
    pub fn estimate_us(&self, now_us: u64, fallback_us: u64) -> u64 {
        let Some(at) = self.sampled_at_us else {
            return fallback_us;
        };
        let age = now_us.saturating_sub(at);
        if age <= self.config.stale_after_us {
            return self.ewma_us;
        }
        let half_lives =
            (age - self.config.stale_after_us) as f64 / self.config.half_life_us.max(1) as f64;
        let weight = 0.5f64.powf(half_lives);
        let blended = fallback_us as f64 + (self.ewma_us as f64 - fallback_us as f64) * weight;
        if blended.is_finite() && blended >= 0.0 {
            blended.round().min(u64::MAX as f64) as u64
        } else {
            fallback_us
        }
    }

    /// Takes the probe slot if the estimate is stale, no probe is out (or the one out
    /// has timed out) and the last started at least `probe_interval_us` ago.
    pub fn take_probe(&mut self, now_us: u64) -> bool {
        if !self.is_stale(now_us) {
            return false;
        }
        let since_last = self.probe_started_us.map(|at| now_us.saturating_sub(at));
        let out = self.probe_out && since_last.is_some_and(|t| t < self.config.probe_timeout_us);
        let too_soon = since_last.is_some_and(|t| t < self.config.probe_interval_us);
        if out || too_soon {
            return false;
        }
        self.probe_started_us = Some(now_us);
        self.probe_out = true;
        true
    }

    /// A measured offload round trip. A sample after a stale spell replaces the
    /// estimate (the old one no longer describes the path); otherwise it is averaged
    /// in at 1/8.
    pub fn on_sample(&mut self, now_us: u64, sample_us: u64) {
        let sample = sample_us.max(1);
        self.ewma_us = if self.ewma_us == 0 || self.is_stale(now_us) {
            sample
        } else {
            (self.ewma_us.saturating_mul(7).saturating_add(sample)) / 8
        };
        self.sampled_at_us = Some(now_us);
        self.probe_out = false;
    }

    /// An offload that gave no measurement (failed, shed): the probe slot is free again
    /// after `probe_interval_us`.
    pub fn on_no_sample(&mut self) {
        self.probe_out = false;
    }

    /// Whether a probe is out now.
    pub fn probe_out(&self) -> bool {
        self.probe_out
    }
}

/// A request that [`super::offload::decide`] refused goes to the cloud instead when
/// the estimate is stale, the probe slot is free and the breaker is closed (see the
/// module table); any other route is returned as it is.
pub fn probe_if_refused(
    route: Route,
    cloud_connected: bool,
    estimator: &mut RemoteEstimator,
    breaker: &mut CircuitBreaker,
    now_us: u64,
) -> Route {
    match route {
        Route::Reject { .. } if cloud_connected => {
            let probe = if breaker.state() == BreakerState::Closed {
                // A path the breaker trusts: correct its stale estimate.
                estimator.take_probe(now_us)
            } else {
                // An open breaker whose time is up gets its half-open trial from a
                // refused request too. `decide` asks the breaker only when the estimate
                // fits the deadline, so with a high estimate and an open breaker nothing
                // would ever try the path again: offload stayed shut after the pool
                // overflowed during a slow spell, though the link had recovered.
                breaker.allow(now_us)
            };
            if probe {
                Route::Offload {
                    fallback_local: false,
                }
            } else {
                route
            }
        }
        other => other,
    }
}

/// A request the local queue refused after [`super::offload::decide`] chose local (the
/// queue filled, or its admission predicted the request late): it goes to the cloud
/// when the estimate fits the deadline and the breaker allows, else as a probe on the
/// same terms as [`probe_if_refused`]; otherwise it is refused. So over a slow path
/// overflow is not sent to be answered late without bound.
pub fn offload_overflow(
    predicted_remote_us: u64,
    deadline_us: u64,
    estimator: &mut RemoteEstimator,
    breaker: &mut CircuitBreaker,
    now_us: u64,
) -> bool {
    if predicted_remote_us <= deadline_us {
        return breaker.allow(now_us);
    }
    let refused = Route::Reject { retry_after_ms: 0 };
    matches!(
        probe_if_refused(refused, true, estimator, breaker, now_us),
        Route::Offload { .. }
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::offload::BreakerConfig;

    const S: u64 = 1_000_000;

    #[test]
    fn a_fresh_estimate_is_the_ewma_and_a_stale_one_decays_to_the_fallback() {
        let mut e = RemoteEstimator::default();
        assert_eq!(e.estimate_us(0, 5_000), 5_000);
        assert!(e.is_stale(0));
        e.on_sample(0, 300_000);
        assert_eq!(e.estimate_us(S / 2, 5_000), 300_000);
        assert!(!e.is_stale(S));
        // One half-life past stale: half way to the fallback.
        assert_eq!(e.estimate_us(3 * S, 5_000), 152_500);
        // Long after: the fallback.
        assert_eq!(e.estimate_us(120 * S, 5_000), 5_000);
        // Averaged while fresh, replaced once stale.
        e.on_sample(S, 100_000);
        assert_eq!(e.estimate_us(S, 0), (300_000 * 7 + 100_000) / 8);
        e.on_sample(10 * S, 2_000);
        assert_eq!(e.estimate_us(10 * S, 0), 2_000);
    }

    #[test]
    fn one_probe_at_a_time_and_not_more_often_than_the_interval() {
        let mut e = RemoteEstimator::default();
        assert!(e.take_probe(0));
        assert!(!e.take_probe(1), "one is out");
        e.on_no_sample();
        assert!(!e.take_probe(S / 4), "too soon after the last");
        assert!(e.take_probe(S));
        // A probe that never comes back stops blocking after the timeout.
        assert!(!e.take_probe(3 * S));
        assert!(e.take_probe(7 * S));
        // A fresh sample: no probing until stale again.
        e.on_sample(8 * S, 1_000);
        assert!(!e.take_probe(8 * S + S / 2));
        assert!(e.take_probe(10 * S));
    }

    #[test]
    fn only_refusals_become_probes_and_only_when_stale() {
        let mut e = RemoteEstimator::default();
        let mut breaker = CircuitBreaker::new(BreakerConfig::default());
        let reject = Route::Reject { retry_after_ms: 5 };
        assert_eq!(
            probe_if_refused(Route::Local, true, &mut e, &mut breaker, 0),
            Route::Local
        );
        assert_eq!(
            probe_if_refused(reject, false, &mut e, &mut breaker, 0),
            reject,
            "no cloud"
        );
        assert_eq!(
            probe_if_refused(reject, true, &mut e, &mut breaker, 0),
            Route::Offload {
                fallback_local: false
            }
        );
        assert_eq!(
            probe_if_refused(reject, true, &mut e, &mut breaker, 1),
            reject,
            "the probe is out"
        );
        e.on_sample(2, 400_000);
        assert_eq!(
            probe_if_refused(reject, true, &mut e, &mut breaker, S),
            reject,
            "fresh estimate: the refusal stands"
        );
    }

    #[test]
    fn overflow_goes_to_the_cloud_when_it_fits_else_only_as_a_probe() {
        let mut e = RemoteEstimator::default();
        let mut breaker = CircuitBreaker::new(BreakerConfig::default());
        e.on_sample(0, 300_000);
        // Fresh and over the deadline: refused.
        assert!(!offload_overflow(300_000, 20_000, &mut e, &mut breaker, 1));
        // Fits: offloaded, as often as it comes.
        assert!(offload_overflow(5_000, 20_000, &mut e, &mut breaker, 2));
        assert!(offload_overflow(5_000, 20_000, &mut e, &mut breaker, 3));
        // Stale and over: one probe, then refused until it is back.
        assert!(offload_overflow(
            300_000,
            20_000,
            &mut e,
            &mut breaker,
            2 * S
        ));
        assert!(!offload_overflow(
            300_000,
            20_000,
            &mut e,
            &mut breaker,
            2 * S + 1
        ));
    }

    #[test]
    fn an_open_breaker_is_not_probed_around_and_its_probe_is_not_spent() {
        let mut e = RemoteEstimator::default();
        let mut breaker = CircuitBreaker::new(BreakerConfig::default());
        for _ in 0..BreakerConfig::default().failure_threshold {
            breaker.on_failure(0);
        }
        let reject = Route::Reject { retry_after_ms: 5 };
        assert_eq!(
            probe_if_refused(reject, true, &mut e, &mut breaker, 1),
            reject
        );
        assert!(!e.probe_out(), "the estimator's slot was not taken");
    }

    #[test]
    fn an_open_breaker_whose_time_is_up_is_tried_by_a_refused_request() {
        // The estimate is far above any deadline (a slow spell), so `decide` never asks
        // the breaker; the first refusal after the open period is its half-open trial,
        // and only one goes while it is out.
        let mut e = RemoteEstimator::default();
        e.on_sample(0, 900_000);
        let config = BreakerConfig::default();
        let mut breaker = CircuitBreaker::new(config);
        for _ in 0..config.failure_threshold {
            breaker.on_failure(0);
        }
        let reject = Route::Reject { retry_after_ms: 5 };
        let later = config.open_for_us + 1;
        assert_eq!(
            probe_if_refused(reject, true, &mut e, &mut breaker, later),
            Route::Offload {
                fallback_local: false
            }
        );
        assert_eq!(breaker.state(), BreakerState::HalfOpen);
        assert_eq!(
            probe_if_refused(reject, true, &mut e, &mut breaker, later + 1),
            reject
        );
        // Its success closes the breaker.
        breaker.on_success(later + 2);
        assert_eq!(breaker.state(), BreakerState::Closed);
    }
}
