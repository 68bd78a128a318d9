//! Edge-to-cloud offload under a real bursty arrival trace, in virtual time, through the
//! same pure decision the agent makes ([`nephele_infer_policy::offload::decide`] with
//! its circuit breaker).
//!
//! The device is one inference slot with a bounded FIFO queue; each request's service
//! time is drawn in turn from times measured on this machine with the real model. The
//! cloud is the region's pool, scaled out (no queue: autoscaling keeps it at its service
//! time), reached over a link with a fixed round trip; its service time is the same
//! measured time, a conservative stand-in for a GPU pool. Arrivals are the trace's,
//! scaled so that the mean rate is `load` × the device's capacity (1 / mean service):
//! the trace's bursts then take the device above its capacity for a while.
//!
//! | mode        | each request                                                     |
//! |-------------|------------------------------------------------------------------|
//! | edge only   | queued locally if the queue has room, else refused (429)         |
//! | cloud only  | sent to the cloud                                                |
//! | offload     | `decide` (local / offload / refuse), as the agent does, with the margin it learns from its local answers ([`LocalLateness`]) |
//! | clairvoyant | a reference no agent can run: kept local exactly when its answer, with every service time known in advance, is within the SLO; else sent to the cloud |
//!
//! The clairvoyant mode is first-come first-served with each request kept when it
//! fits, which with one deadline for all is earliest-deadline-first. Its cloud share
//! is what this trace and these service times force out of the device, so it is the
//! floor against which the offload mode's share reads (with varying service times a
//! schedule that reorders or drops long requests could keep a little more, so it is
//! a reference, not a proven bound).
//!
//! A request counts within the SLO when it was answered and its latency (queueing +
//! service, or round trip + cloud service) is at most the SLO; refused requests are not
//! within it.

use nephele_infer_policy::lateness::LocalLateness;
use nephele_infer_policy::offload::{
    decide, BreakerConfig, CircuitBreaker, OffloadPolicy, RemoteEstimate, RequestContext, Route,
};
use serde::Serialize;
use std::collections::VecDeque;

/// Where requests may go.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Mode {
    EdgeOnly,
    CloudOnly,
    Offload,
    Clairvoyant,
}

/// The scenario.
#[derive(Debug, Clone, Serialize)]
pub struct OffloadConfig {
    pub slo_us: u64,
    /// Mean arrival rate as a share of the device's capacity.
    pub load: f64,
    pub rtt_us: u64,
    /// Requests that may wait on the device (queued or running).
    pub queue_capacity: u32,
    /// Measured service times of one request, used in turn.
    #[serde(skip)]
    pub service_us: Vec<u64>,
}

/// What one mode achieved.
#[derive(Debug, Clone, Serialize)]
pub struct OffloadResult {
    pub mode: Mode,
    pub requests: usize,
    pub within_slo: f64,
    pub cloud_share: f64,
    pub refused_share: f64,
    pub p50_ms: f64,
    pub p99_ms: f64,
}

/// Arrival times scaled so that their mean rate is `config.load` × capacity.
pub fn scale_arrivals(arrivals_us: &[u64], config: &OffloadConfig) -> Vec<u64> {
    let n = arrivals_us.len();
    let span = arrivals_us.last().copied().unwrap_or(0) as f64;
    let mean_service = mean(&config.service_us).max(1.0);
    if n < 2 || span <= 0.0 || config.load <= 0.0 {
        return arrivals_us.to_vec();
    }
    // Wanted mean gap = mean service / load; the trace's mean gap = span / (n − 1).
    let factor = (mean_service / config.load) / (span / (n - 1) as f64);
    arrivals_us
        .iter()
        .map(|t| (*t as f64 * factor).round() as u64)
        .collect()
}

fn mean(values: &[u64]) -> f64 {
    values.iter().sum::<u64>() as f64 / values.len().max(1) as f64
}

/// Runs `mode` over `arrivals_us` (already scaled).
pub fn simulate(arrivals_us: &[u64], config: &OffloadConfig, mode: Mode) -> OffloadResult {
    let services: &[u64] = if config.service_us.is_empty() {
        &[1]
    } else {
        &config.service_us
    };
    let mean_service = mean(services).max(1.0) as u64;
    let cloud_latency = config.rtt_us + mean_service;
    let policy = OffloadPolicy::default();
    let mut breaker = CircuitBreaker::new(BreakerConfig::default());
    // Completion times of requests queued or running on the device, oldest first.
    let mut on_device: VecDeque<u64> = VecDeque::new();
    let mut latencies = Vec::with_capacity(arrivals_us.len());
    let (mut within, mut cloud, mut refused) = (0usize, 0usize, 0usize);
    // The agent's running estimate of its service time (EWMA 1/8), as in the agent.
    let mut estimate = 0u64;
    // How late local answers come against their prediction, learned from the answers
    // as they complete (the agent's `LocalLateness`): (completed at, predicted, took).
    let mut lateness = LocalLateness::default();
    let mut answering: VecDeque<(u64, u64, u64)> = VecDeque::new();
    let mut predicted_local = 0u64;
    for (i, &now) in arrivals_us.iter().enumerate() {
        while on_device.front().is_some_and(|done| *done <= now) {
            on_device.pop_front();
        }
        while answering.front().is_some_and(|(done, _, _)| *done <= now) {
            if let Some((_, predicted, took)) = answering.pop_front() {
                lateness.observe(predicted, took, config.slo_us);
            }
        }
        let service = services[i % services.len()];
        let queue_ahead = on_device.len() as u32;
        let route = match mode {
            Mode::EdgeOnly if queue_ahead < config.queue_capacity => Route::Local,
            Mode::EdgeOnly => Route::Reject { retry_after_ms: 1 },
            Mode::CloudOnly => Route::Offload {
                fallback_local: false,
            },
            Mode::Clairvoyant => {
                let start = on_device.back().copied().unwrap_or(now).max(now);
                if start + service - now <= config.slo_us && queue_ahead < config.queue_capacity {
                    Route::Local
                } else {
                    Route::Offload {
                        fallback_local: false,
                    }
                }
            }
            Mode::Offload => {
                let context = RequestContext {
                    queue_ahead,
                    local_service_us: estimate,
                    slots: 1,
                    local_queue_capacity: config.queue_capacity,
                    remote: Some(RemoteEstimate {
                        rtt_us: config.rtt_us,
                        cloud_queue_us: 0,
                        cloud_service_us: mean_service,
                    }),
                    deadline_us: config.slo_us,
                    local_margin_permille: lateness.margin_permille(),
                };
                predicted_local = context.predicted_local_us();
                decide(&context, &policy, &mut breaker, now)
            }
        };
        let latency = match route {
            Route::Local => {
                let start = on_device.back().copied().unwrap_or(now).max(now);
                let done = start + service;
                on_device.push_back(done);
                if mode == Mode::Offload {
                    answering.push_back((done, predicted_local, done - now));
                }
                estimate = if estimate == 0 {
                    service
                } else {
                    (estimate * 7 + service) / 8
                };
                Some(done - now)
            }
            Route::Offload { .. } => {
                breaker.on_success(now);
                cloud += 1;
                Some(cloud_latency)
            }
            Route::Reject { .. } => {
                refused += 1;
                None
            }
        };
        if let Some(latency) = latency {
            within += usize::from(latency <= config.slo_us);
            latencies.push(latency);
        }
    }
    latencies.sort_unstable();
    let n = arrivals_us.len().max(1) as f64;
    let quantile = |q: f64| {
        if latencies.is_empty() {
            return 0.0;
        }
        let rank = ((q * latencies.len() as f64).ceil() as usize).clamp(1, latencies.len());
        latencies[rank - 1] as f64 / 1000.0
    };
    OffloadResult {
        mode,
        requests: arrivals_us.len(),
        within_slo: within as f64 / n,
        cloud_share: cloud as f64 / n,
        refused_share: refused as f64 / n,
        p50_ms: quantile(0.5),
        p99_ms: quantile(0.99),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(load: f64) -> OffloadConfig {
        OffloadConfig {
            slo_us: 10_000,
            load,
            rtt_us: 4_000,
            queue_capacity: 64,
            service_us: vec![1_000],
        }
    }

    /// A burst of 50 requests at once on a 1 ms device with a 10 ms SLO: edge only can
    /// keep 10 within the SLO; offload sends the rest to a 5 ms cloud.
    #[test]
    fn a_burst_is_absorbed_by_offload_and_not_by_the_edge_alone() {
        let burst = vec![0u64; 50];
        let config = config(1.0);
        let edge = simulate(&burst, &config, Mode::EdgeOnly);
        assert_eq!(edge.within_slo, 10.0 / 50.0);
        assert_eq!(edge.cloud_share, 0.0);
        let offload = simulate(&burst, &config, Mode::Offload);
        assert_eq!(offload.within_slo, 1.0);
        assert!(
            offload.cloud_share > 0.7 && offload.cloud_share < 1.0,
            "{offload:?}"
        );
        let clairvoyant = simulate(&burst, &config, Mode::Clairvoyant);
        assert_eq!(clairvoyant.within_slo, 1.0);
        assert_eq!(
            clairvoyant.cloud_share,
            40.0 / 50.0,
            "10 fit in 10 ms on 1 ms each"
        );
        assert!(offload.cloud_share >= clairvoyant.cloud_share);
        let cloud = simulate(&burst, &config, Mode::CloudOnly);
        assert_eq!((cloud.within_slo, cloud.cloud_share), (1.0, 1.0));
    }

    #[test]
    fn a_full_queue_refuses_and_a_slow_cloud_does_not_help() {
        let burst = vec![0u64; 100];
        let mut config = config(1.0);
        config.queue_capacity = 5;
        config.rtt_us = 50_000;
        let edge = simulate(&burst, &config, Mode::EdgeOnly);
        assert_eq!(edge.refused_share, 0.95);
        let offload = simulate(&burst, &config, Mode::Offload);
        assert_eq!(offload.cloud_share, 0.0, "the cloud cannot meet the SLO");
        assert!(offload.within_slo >= edge.within_slo);
    }

    #[test]
    fn scaling_sets_the_mean_rate_to_the_load() {
        let arrivals: Vec<u64> = (0..101).map(|i| i * 7_000).collect();
        let scaled = scale_arrivals(&arrivals, &config(0.5));
        // Mean service 1 ms at load 0.5: a request every 2 ms.
        assert_eq!(scaled[100], 200_000);
        assert_eq!(scale_arrivals(&[5], &config(0.5)), vec![5]);
    }
}
