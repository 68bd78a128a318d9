//! The load test that sets an LLM replica's concurrency, as an operator does for a
//! `containerConcurrency` or an HPA target.

use nephele_autoscale::Static;
use nephele_placement::rng::Rng;
use serde::Serialize;

use super::{simulate, RunContext};
use crate::autoscale_trace::{Request, Workload};
use crate::trace::HourlySeries;

/// How an LLM replica's concurrency was set.
#[derive(Debug, Clone, Serialize)]
pub struct Calibration {
    /// The highest Poisson arrival rate one replica served with the goal share within
    /// target (req/s).
    pub max_rate_per_s: f64,
    /// Mean latency alone of the tune part's requests (ms).
    pub mean_service_ms: f64,
    /// max_rate × mean_service, rounded: the concurrency the policies size with.
    pub concurrency: u32,
    pub requests: usize,
    pub method: &'static str,
}

/// The concurrency an LLM replica sustains within target, as an operator load-tests
/// for a `containerConcurrency` or an HPA target: one ready replica, Poisson arrivals
/// (as vLLM's `benchmark_serving` sends them) of 2,000 requests drawn with
/// replacement from the tune part's (their token counts and targets), the highest rate
/// at which ≥ `goal` of them are within target (bisection); concurrency = that rate ×
/// the mean latency alone (Little's law), so that `replicas = rate × service /
/// concurrency` sizes to that rate.
pub fn calibrate_concurrency(
    workload: &Workload,
    tune_until_us: u64,
    goal: f64,
    seed: u64,
    prices: &HourlySeries,
) -> Calibration {
    const REQUESTS: usize = 2_000;
    let tune: Vec<Request> = workload
        .requests
        .iter()
        .filter(|r| r.arrival_us < tune_until_us)
        .copied()
        .collect();
    let pool = if tune.is_empty() {
        workload.requests.clone()
    } else {
        tune
    };
    let mean_service_ms = pool.iter().map(|r| r.service_ms).sum::<f64>() / pool.len().max(1) as f64;
    let method = "one replica, Poisson arrivals of 2,000 requests drawn from the tune part; highest rate with the goal share within target; concurrency = rate × mean latency alone";
    if pool.is_empty() {
        return Calibration {
            max_rate_per_s: 0.0,
            mean_service_ms,
            concurrency: 1,
            requests: 0,
            method,
        };
    }
    let mut draw = Rng::new(seed ^ 0x10ad_7e57);
    let picks: Vec<Request> = (0..REQUESTS)
        .map(|_| pool[draw.below(pool.len() as u64) as usize])
        .collect();
    let gaps: Vec<f64> = (0..REQUESTS)
        .map(|_| {
            let uniform = ((draw.next_u64() >> 11) as f64 + 0.5) / (1u64 << 53) as f64;
            -uniform.ln()
        })
        .collect();
    let mut shell = Workload {
        requests: Vec::new(),
        ..workload.clone()
    };
    shell.requests = Vec::with_capacity(REQUESTS);
    let mut within_at = |rate: f64| -> f64 {
        let mut at_s = 0.0;
        shell.requests.clear();
        for (request, gap) in picks.iter().zip(&gaps) {
            at_s += gap / rate;
            shell.requests.push(Request {
                arrival_us: (at_s * 1e6) as u64,
                ..*request
            });
        }
        let context = RunContext {
            workload: &shell,
            cold_starts: &[],
            prices,
            seed,
            bucket_us: 60_000_000,
            tune_until_us: 0,
            initial_replicas: 1,
            cold_start_scale: 1.0,
            declared_concurrency: None,
            score_from_us: 0,
        };
        simulate("load-test", &mut Static::new(1), &context).within_slo
    };
    let mut low = 0.0;
    let mut high = 0.25;
    while within_at(high) >= goal && high < 1e4 {
        low = high;
        high *= 2.0;
    }
    for _ in 0..20 {
        let middle = (low + high) / 2.0;
        if within_at(middle) >= goal {
            low = middle;
        } else {
            high = middle;
        }
    }
    Calibration {
        max_rate_per_s: low,
        mean_service_ms,
        concurrency: ((low * mean_service_ms / 1000.0).round() as u32).max(1),
        requests: REQUESTS,
        method,
    }
}
