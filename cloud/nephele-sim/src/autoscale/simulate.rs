//! One policy (or one of the simulator's references) replayed through the region:
//! the event loop that interleaves completions, arrivals and ticks, the oracle's
//! look, and the scoring of a run into a [`PolicyResult`].

use nephele_autoscale::serving::{quantile, service_estimate_ms, Deployment};
use nephele_autoscale::{ScalingPolicy, Verdict};

use super::region::{Bucket, Region, COMPLETE, STEP};
use super::{PolicyResult, Segment, Series};
use crate::autoscale_oracle::OraclePlan;
use crate::autoscale_trace::Workload;
use crate::trace::HourlySeries;

/// What a run needs besides the policy.
pub struct RunContext<'a> {
    pub workload: &'a Workload,
    pub cold_starts: &'a [f64],
    pub prices: &'a HourlySeries,
    pub seed: u64,
    pub bucket_us: u64,
    pub tune_until_us: u64,
    pub initial_replicas: u32,
    /// Every cold start drawn is multiplied by this (1: as measured).
    pub cold_start_scale: f64,
    /// The slots a replica declares to the scaler, when not the workload's
    /// `concurrency` (ours on an LLM replica: 1, what a live region's agents declare;
    /// it learns the rest).
    pub declared_concurrency: Option<u32>,
    /// The warm-up: requests arriving before this and GPU time before it are not
    /// scored (every policy runs through it; see
    /// [`AutoscaleOptions::warmup_s`](super::AutoscaleOptions::warmup_s)).
    pub score_from_us: u64,
}

/// Who decides the replica count.
pub enum Scaler<'p> {
    /// A policy of `nephele-autoscale`, through its `tick`.
    Policy(&'p mut dyn ScalingPolicy),
    /// The clairvoyant schedule of [`crate::autoscale_oracle`] (simulator only): it
    /// reads the region's replicas and the cold start the next one will draw.
    Oracle(&'p OraclePlan),
    /// The best a scaler without foresight could do (simulator only): told each slot's
    /// exact need as soon as the slot ends, it keeps `floor` replicas and the largest
    /// need of the last `hold_us`.
    Reactive {
        plan: &'p OraclePlan,
        floor: u32,
        hold_us: u64,
    },
}

/// How often the oracle looks (µs).
const ORACLE_TICK_US: u64 = 1_000_000;

/// Replays the workload under `policy`.
pub fn simulate(
    name: &str,
    policy: &mut dyn ScalingPolicy,
    context: &RunContext<'_>,
) -> PolicyResult {
    simulate_with(name, Scaler::Policy(policy), context)
}

/// Replays the workload under `scaler`.
pub fn simulate_with(name: &str, scaler: Scaler<'_>, context: &RunContext<'_>) -> PolicyResult {
    let workload = context.workload;
    let mut region = Region::new(
        workload,
        context.cold_starts,
        context.seed,
        context.bucket_us,
        context.cold_start_scale,
        context.declared_concurrency,
    );
    for _ in 0..context.initial_replicas {
        region.start_replica(true);
    }
    let period_us = match &scaler {
        Scaler::Policy(policy) => policy.period_ms().max(1) * 1000,
        Scaler::Oracle(_) | Scaler::Reactive { .. } => ORACLE_TICK_US,
    };
    let mut next_tick_us = period_us;
    let mut next_request = 0usize;
    // A policy is ticked through the serving core's deployment state, as a region's is
    // (the references decide replicas directly and admit everything).
    let (mut deployment, direct) = match scaler {
        Scaler::Policy(policy) => (Some(Deployment::new(policy, 0)), None),
        other => (None, Some(other)),
    };
    let (mut scale_events, mut direction_changes, mut ticks, mut panic_ticks) =
        (0u64, 0u64, 0u64, 0u64);
    let mut last_desired = context.initial_replicas;
    let mut last_direction = 0i8;
    let mut peak_replicas = context.initial_replicas;
    let mut shed = 0usize;
    let mut oracle_checked_us = 0u64;
    loop {
        let arrival = workload.requests.get(next_request).map(|r| r.arrival_us);
        let event = region.events.peek().map(|e| (e.0).0);
        let tick = (next_tick_us <= region.horizon_us).then_some(next_tick_us);
        // Same instant: events, then the arrival, then the tick.
        let next = [
            event.map(|t| (t, 0)),
            arrival.map(|t| (t, 1)),
            tick.map(|t| (t, 2)),
        ]
        .into_iter()
        .flatten()
        .min();
        let Some((at, kind)) = next else { break };
        region.advance(at);
        match kind {
            0 => {
                if let Some(std::cmp::Reverse((_, class, _, a, b))) = region.events.pop() {
                    let index = a as usize;
                    match class {
                        COMPLETE => region.complete(index, b),
                        STEP => region.step_done(index),
                        _ if index < region.replicas.len() => region.become_ready(index),
                        _ => {}
                    }
                }
            }
            1 => {
                let request = next_request as u32;
                next_request += 1;
                region.window.arrival();
                let admitted = deployment.as_mut().is_none_or(|deployment| {
                    let verdict = deployment.admit(at / 1000, || {
                        region.predicted_wait_ms(service_estimate_ms(region.mean_service_ms()))
                    });
                    matches!(verdict, Verdict::Admit)
                });
                if admitted {
                    region.route(request);
                } else {
                    shed += 1;
                }
            }
            _ => {
                next_tick_us = at + period_us;
                ticks += 1;
                let desired = match (&mut deployment, &direct) {
                    (Some(deployment), _) => {
                        let snapshot = region.snapshot();
                        let decision = deployment.tick(at / 1000, &mut region.window, snapshot);
                        if decision.mode == nephele_autoscale::Mode::Panic {
                            panic_ticks += 1;
                        }
                        let desired = decision.desired;
                        region.scale_to(desired);
                        desired
                    }
                    (None, None) => unreachable!("a policy or a reference decides"),
                    (None, Some(Scaler::Policy(_))) => unreachable!("policies tick above"),
                    (None, Some(Scaler::Oracle(plan))) => {
                        oracle_tick(&mut region, plan, at, &mut oracle_checked_us)
                    }
                    (
                        None,
                        Some(Scaler::Reactive {
                            plan,
                            floor,
                            hold_us,
                        }),
                    ) => {
                        let slot = plan.slot_us.max(1);
                        // Slots that have ended by now, within the hold.
                        let known_until = at / slot * slot;
                        let from = known_until.saturating_sub(*hold_us + slot);
                        let desired = if known_until == 0 {
                            *floor
                        } else {
                            plan.max_need(from, known_until).max(*floor)
                        };
                        region.scale_to(desired);
                        desired
                    }
                };
                if desired != last_desired {
                    scale_events += 1;
                    let direction = if desired > last_desired { 1 } else { -1 };
                    if last_direction != 0 && direction != last_direction {
                        direction_changes += 1;
                    }
                    last_direction = direction;
                    last_desired = desired;
                }
                peak_replicas = peak_replicas.max(region.alive);
            }
        }
    }
    summarise(
        name,
        &region,
        context,
        Counters {
            scale_events,
            direction_changes,
            shed,
            peak_replicas,
            panic_share: panic_ticks as f64 / ticks.max(1) as f64,
        },
    )
}

/// One look of the oracle at `now_us`: keep the replicas needed before a replica
/// started now would be ready (releasing the rest), then start, one at a time, the
/// replicas some moment up to then would lack, each with the cold start it will draw.
/// Returns the replicas active (ready and starting) after it.
fn oracle_tick(
    region: &mut Region<'_>,
    plan: &OraclePlan,
    now_us: u64,
    checked_us: &mut u64,
) -> u32 {
    let cold_us = region.peek_cold_start_us();
    let keep = plan.max_need(now_us, now_us + cold_us + ORACLE_TICK_US);
    if region.ready + region.starting > keep {
        region.scale_to(keep);
    }
    loop {
        let cold_us = region.peek_cold_start_us();
        let from = (*checked_us).max(now_us);
        let until = now_us + cold_us + ORACLE_TICK_US;
        if plan.short_between(from, until, |at| region.ready_by(at)) {
            region.start_replica(false);
        } else {
            *checked_us = (*checked_us).max(until);
            break;
        }
    }
    region.ready + region.starting
}

struct Counters {
    scale_events: u64,
    direction_changes: u64,
    shed: usize,
    peak_replicas: u32,
    panic_share: f64,
}

fn summarise(
    name: &str,
    region: &Region<'_>,
    context: &RunContext<'_>,
    counters: Counters,
) -> PolicyResult {
    let workload = context.workload;
    let requests = &workload.requests;
    let met: Vec<bool> = requests
        .iter()
        .enumerate()
        .map(|(i, r)| {
            region.latency_ms[i].is_some_and(|latency| r.within(latency, region.ttft_ms[i]))
        })
        .collect();
    let (mut over_ttft, mut over_tbt, mut over_e2e) = (0, 0, 0);
    for (i, r) in requests.iter().enumerate() {
        if let Some(latency) = region.latency_ms[i] {
            let (ttft, tbt, e2e) = r.misses(latency, region.ttft_ms[i]);
            over_ttft += usize::from(ttft);
            over_tbt += usize::from(tbt);
            over_e2e += usize::from(e2e);
        }
    }
    let within = |range: std::ops::Range<usize>| -> (usize, usize) {
        let inside = met[range.clone()].iter().filter(|m| **m).count();
        (inside, range.len())
    };
    // The warm-up is run, not scored: its requests and its GPU time are left out.
    let first = requests.partition_point(|r| r.arrival_us < context.score_from_us);
    let first_bucket =
        (context.score_from_us.div_ceil(region.bucket_us) as usize).min(region.buckets.len());
    let scored_buckets = &region.buckets[first_bucket..];
    let split = requests
        .partition_point(|r| r.arrival_us < context.tune_until_us)
        .max(first);
    let split_bucket = ((context.tune_until_us / region.bucket_us) as usize).max(first_bucket);
    let gpus = f64::from(workload.gpus_per_replica.max(1));
    let gpu_hours_of =
        |buckets: &[Bucket]| buckets.iter().map(|b| b.alive_us).sum::<f64>() * gpus / 3.6e9;
    let segment = |label: &'static str, range: std::ops::Range<usize>, buckets: &[Bucket]| {
        let (inside, n) = within(range);
        Segment {
            segment: label,
            requests: n,
            within_slo: inside as f64 / n.max(1) as f64,
            outside: n - inside,
            gpu_hours: gpu_hours_of(buckets),
        }
    };
    let split_bucket = split_bucket.min(region.buckets.len());
    let segments = vec![
        segment(
            "tune",
            first..split,
            &region.buckets[first_bucket..split_bucket],
        ),
        segment(
            "holdout",
            split..requests.len(),
            &region.buckets[split_bucket..],
        ),
    ];
    let (inside, n) = within(first..requests.len());
    let gpu_hours = gpu_hours_of(scored_buckets);
    let gpu = workload.gpu;
    let mut energy_kwh = 0.0;
    let mut energy_cost = 0.0;
    let bucket_s = region.bucket_us as f64 / 1e6;
    for (index, bucket) in region.buckets.iter().enumerate().skip(first_bucket) {
        let watt_us =
            gpus * (gpu.idle_w * bucket.alive_us + (gpu.tdp_w - gpu.idle_w) * bucket.busy_us);
        let kwh = watt_us / 3.6e9 / 1000.0;
        let seconds = workload.start_offset_s + index as f64 * bucket_s;
        let hour = workload.start_hour + (seconds / 3600.0).floor() as i64;
        energy_kwh += kwh;
        energy_cost += kwh * price_at(context.prices, hour) / 1000.0;
    }
    let gpu_cost = gpu_hours * gpu.usd_per_gpu_hour();
    let mut answered: Vec<f64> = region.latency_ms[first..]
        .iter()
        .flatten()
        .copied()
        .collect();
    let latency_p50_ms = quantile(&mut answered, 0.5).unwrap_or(0.0);
    let latency_p99_ms = quantile(&mut answered, 0.99).unwrap_or(0.0);
    // The plot series.
    let buckets = region.buckets.len();
    let mut series = Series {
        bucket_s,
        arrivals: vec![0; buckets],
        replicas: region
            .buckets
            .iter()
            .map(|b| b.alive_us / region.bucket_us as f64)
            .collect(),
        p99_s: vec![None; buckets],
        outside: vec![0; buckets],
    };
    let mut latencies: Vec<Vec<f64>> = vec![Vec::new(); buckets];
    for (index, request) in requests.iter().enumerate() {
        let bucket = ((request.arrival_us / region.bucket_us) as usize).min(buckets - 1);
        series.arrivals[bucket] += 1;
        if let Some(latency) = region.latency_ms[index] {
            latencies[bucket].push(latency / 1000.0);
        }
        if !met[index] {
            series.outside[bucket] += 1;
        }
    }
    for (slot, mut values) in series.p99_s.iter_mut().zip(latencies) {
        *slot = quantile(&mut values, 0.99);
    }
    let span_h = region.horizon_us.saturating_sub(context.score_from_us) as f64 / 3.6e9;
    PolicyResult {
        name: name.to_string(),
        within_slo: inside as f64 / n.max(1) as f64,
        gpu_hours,
        cost: gpu_cost + energy_cost,
        gpu_cost,
        energy_cost,
        energy_kwh,
        scale_events: counters.scale_events,
        direction_changes: counters.direction_changes,
        requests: n,
        outside: n - inside,
        shed: counters.shed,
        over_ttft,
        over_tbt,
        over_e2e,
        latency_p50_ms,
        latency_p99_ms,
        mean_replicas: if span_h > 0.0 {
            gpu_hours / gpus / span_h
        } else {
            0.0
        },
        peak_replicas: counters.peak_replicas,
        panic_share: counters.panic_share,
        segments,
        series,
        met,
        last_answer_us: region.last_answer_us,
    }
}

/// The price (USD/MWh) of `hour` (since 1970): the same hour of the year in the
/// series' year when the trace is from another year.
fn price_at(prices: &HourlySeries, hour: i64) -> f64 {
    let len = prices.values.len() as i64;
    if len == 0 {
        return 0.0;
    }
    let index = (hour - prices.start_hour).rem_euclid(len);
    prices.values[index as usize]
}

pub(crate) fn context_clone<'a>(context: &RunContext<'a>) -> RunContext<'a> {
    RunContext {
        workload: context.workload,
        cold_starts: context.cold_starts,
        prices: context.prices,
        seed: context.seed,
        bucket_us: context.bucket_us,
        tune_until_us: context.tune_until_us,
        initial_replicas: context.initial_replicas,
        cold_start_scale: context.cold_start_scale,
        declared_concurrency: context.declared_concurrency,
        score_from_us: context.score_from_us,
    }
}
