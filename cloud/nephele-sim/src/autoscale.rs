//! `nephele sim autoscale`: a request trace replayed in virtual time against one
//! region's replicas of one deployment, scaled by each policy through the same
//! `nephele-autoscale` core and admission gate the region actor calls.
//!
//! The region, as the live one works:
//! - **Replicas** are started when the policy asks for more; each pays a cold start
//!   drawn (seeded) from the production base-model load times
//!   (`basemodel_update_latency_anon.csv`, optionally scaled) before it serves.
//!   Replicas removed while starting stop at once; ready ones stop taking requests and
//!   finish what they hold (draining). Starting, ready and draining replicas all count
//!   as GPU time, every GPU of a replica.
//! - **Serving**: an image replica serves `concurrency` requests at once with a FIFO
//!   queue in front, each for its measured time; an LLM replica is the
//!   continuous-batching engine of [`crate::autoscale_llm`] (steps of measured
//!   duration, chunked prefill, KV-cache budget).
//! - **Routing**: each admitted request goes to the ready replica with the least work
//!   ahead (LLM: prompt tokens left to prefill plus decoding sequences, Splitwise's
//!   token-JSQ; images: outstanding requests; ties: the oldest replica). With no
//!   replica ready, requests wait at the region and go out when one becomes ready.
//! - **Admission** (only policies that set a level: ours): before routing, the gate is
//!   asked with the wait the request would have at that replica. A shed request (429)
//!   is counted **outside** the target: its retry is not replayed, so it gets no
//!   credit even if a retry would have made it.
//! - **Signals** every policy tick (its own period: ours 5 s, HPA 15 s, KPA 2 s):
//!   arrivals since the last tick, in flight (LLM: requests in the running batch),
//!   queued, p99 of answers in the window, utilisation of the ready replicas' slots
//!   over the window (LLM: the running batch, up to the load-tested concurrency, over
//!   that concurrency), ready and starting replicas, mean service time measured so far
//!   (LLM: the requests' latency alone), mean cold start measured so far.
//!
//! Besides the policies, two references that only the simulator can run (they read
//! what no scaler can): `oracle` ([`crate::autoscale_oracle`], clairvoyant) and
//! `reactive-ref` (each slot's need, told once the slot is over).
//!
//! Per policy: share of requests answered within their target, GPU-hours (GPUs ×
//! time from the first arrival to the last), cost (GPU-hours at the trace's GPU price
//! plus energy at the zone's hourly price), scale events (ticks that changed the
//! count) and direction changes (an increase after a decrease or the reverse).
//! Figures are given for the whole trace and apart for its first part (`tune`, where
//! parameters were chosen) and the rest (`holdout`).

use std::collections::{BinaryHeap, VecDeque};
use std::path::{Path, PathBuf};

use anyhow::{Context as _, Result};
use nephele_autoscale::admission::predicted_wait_ms;
use nephele_autoscale::config::OursConfig;
use nephele_autoscale::forecast::{evaluate, ForecasterKind};
use nephele_autoscale::serving::{
    least_loaded, quantile, service_estimate_ms, Deployment, SignalWindow, Snapshot,
};
use nephele_autoscale::{Hpa, HpaConfig, Kpa, KpaConfig, Ours, ScalingPolicy, Static, Verdict};
use nephele_placement::rng::Rng;
use serde::Serialize;

use crate::autoscale_llm::{LlmProfile, LlmServer, Produced};
use crate::autoscale_oracle::{
    run_oracle, run_reactive_bound, OracleInfo, OraclePlan, ReactiveInfo,
};
use crate::autoscale_trace::{load_cold_starts, load_workload, Request, ServiceOptions, Workload};
use crate::trace::{load_prices, HourlySeries};

/// What to run.
#[derive(Debug, Clone, Serialize)]
pub struct AutoscaleOptions {
    pub seed: u64,
    /// Electricity price zone (a file in `electricity-prices-hourly-2023/`).
    pub zone: String,
    pub min_replicas: u32,
    pub max_replicas: u32,
    /// Share of the trace's time (from its start) used to choose parameters.
    pub tune_share: f64,
    /// Share of requests within target that static provisioning must reach.
    pub static_goal: f64,
    /// A fixed static count instead of the search.
    pub static_replicas: Option<u32>,
    /// Also run ours without its forecast (and warm pool) and without admission.
    pub ablations: bool,
    /// Every cold start drawn is multiplied by this (1: as measured).
    pub cold_start_scale: f64,
    /// How LLM requests are judged.
    pub service: ServiceOptions,
    /// Also run the clairvoyant oracle (simulator only).
    pub oracle: bool,
    /// A JSON object merged over ours' configuration (fields not named keep theirs).
    pub ours_override: Option<serde_json::Value>,
    /// Every policy runs the trace's first this many seconds unscored (their requests
    /// and GPU time are left out of every figure), so that no policy is judged on
    /// starting cold, which a deployment does once [300: the longest window of the
    /// scalers, the 5-min scale-down stabilisation of HPA and ours].
    pub warmup_s: f64,
}

impl Default for AutoscaleOptions {
    fn default() -> Self {
        AutoscaleOptions {
            seed: 42,
            zone: "US-CAL-CISO".into(),
            min_replicas: 1,
            max_replicas: 64,
            tune_share: 0.5,
            static_goal: 0.99,
            static_replicas: None,
            ablations: false,
            cold_start_scale: 1.0,
            service: ServiceOptions::default(),
            oracle: true,
            ours_override: None,
            warmup_s: 300.0,
        }
    }
}

/// One part of the trace.
#[derive(Debug, Clone, Serialize)]
pub struct Segment {
    pub segment: &'static str,
    pub requests: usize,
    pub within_slo: f64,
    pub outside: usize,
    pub gpu_hours: f64,
}

/// What one policy did.
#[derive(Debug, Clone, Serialize)]
pub struct PolicyResult {
    pub name: String,
    pub within_slo: f64,
    pub gpu_hours: f64,
    /// USD: GPU-hours at the list price plus energy.
    pub cost: f64,
    pub gpu_cost: f64,
    pub energy_cost: f64,
    pub energy_kwh: f64,
    pub scale_events: u64,
    pub direction_changes: u64,
    pub requests: usize,
    /// Requests not answered within their target, shed ones included.
    pub outside: usize,
    /// Refused with 429 by admission control.
    pub shed: usize,
    /// Answered requests over their first-token, between-token and end-to-end
    /// targets (one request may be over several).
    pub over_ttft: usize,
    pub over_tbt: usize,
    pub over_e2e: usize,
    pub latency_p50_ms: f64,
    pub latency_p99_ms: f64,
    pub mean_replicas: f64,
    pub peak_replicas: u32,
    /// Share of ticks in panic mode.
    pub panic_share: f64,
    pub segments: Vec<Segment>,
    #[serde(skip)]
    pub series: Series,
    /// Per request: answered within its target.
    #[serde(skip)]
    pub met: Vec<bool>,
    /// When the last answer went out (µs since the first arrival).
    #[serde(skip)]
    pub last_answer_us: u64,
}

/// Per plot bucket.
#[derive(Debug, Clone, Default)]
pub struct Series {
    pub bucket_s: f64,
    pub arrivals: Vec<u32>,
    /// Mean replicas alive over the bucket.
    pub replicas: Vec<f64>,
    /// p99 latency (s) of answered requests that arrived in the bucket.
    pub p99_s: Vec<Option<f64>>,
    pub outside: Vec<u32>,
}

/// One forecaster's error on one trace.
#[derive(Debug, Clone, Serialize)]
pub struct ForecastRow {
    pub model: String,
    pub horizon_min: usize,
    /// On the tune part (what chose the model and its parameters).
    pub tune_mae: f64,
    /// On the rest.
    pub holdout_mae: f64,
    pub holdout_rmse: f64,
    pub holdout_relative_mae: f64,
    pub holdout_bias: f64,
}

/// The goals of issue 13, as measured.
#[derive(Debug, Clone, Serialize)]
pub struct Goals {
    pub ours_within_slo: f64,
    pub ours_gpu_hours_share_of_static: f64,
    /// Requests outside target, ours vs the better of HPA and KPA.
    pub ours_outside: usize,
    pub reactive_best: String,
    pub reactive_outside: usize,
    pub outside_reduction_vs_reactive: f64,
    /// Ours' GPU-hours over the clairvoyant oracle's (None: no oracle run).
    pub ours_over_oracle: Option<f64>,
    pub within_99: bool,
    /// The goal of every trace: ≥ 99% within target at ≤ 1.0× static's GPU-hours.
    pub gpu_hours_at_most_static: bool,
    /// The stretch: ≤ 1.5× the oracle's GPU-hours.
    pub at_most_1_5x_oracle: Option<bool>,
}

/// Ours' capacity estimate at the end of a run ([`nephele_autoscale::capacity`]).
#[derive(Debug, Clone, Serialize)]
pub struct LearnedCapacity {
    /// Requests per second one replica carries within target.
    pub per_replica_per_s: f64,
    /// From what the replicas were measured to carry (else the prior: the declared
    /// slots over the service time).
    pub learned: bool,
    /// Load levels with answers filed.
    pub levels: usize,
}

/// Everything about one trace.
#[derive(Debug, Clone, Serialize)]
pub struct TraceReport {
    pub trace: String,
    pub path: PathBuf,
    pub requests: usize,
    pub span_hours: f64,
    pub service_model: String,
    pub mean_service_ms: f64,
    pub concurrency: u32,
    pub target_rule: String,
    pub gpu: String,
    pub usd_per_gpu_hour: f64,
    pub zone: String,
    pub cold_start_p50_ms: f64,
    pub cold_start_p99_ms: f64,
    pub cold_start_scale: f64,
    /// GPUs one replica holds.
    pub gpus_per_replica: u32,
    /// LLM replicas: the load test that set `concurrency`.
    pub calibration: Option<Calibration>,
    /// The oracle's schedule, when it ran.
    pub oracle: Option<OracleInfo>,
    /// The reactive bound's search, when the oracle ran.
    pub reactive_bound: Option<ReactiveInfo>,
    pub static_replicas: u32,
    pub static_rule: String,
    pub tune_until_hours: f64,
    pub ours_config: OursConfig,
    /// What ours had learned one replica carries within target by the trace's end.
    pub ours_capacity: Option<LearnedCapacity>,
    /// The unscored warm-up every policy ran through first (s).
    pub warmup_s: f64,
    pub policies: Vec<PolicyResult>,
    pub ablations: Vec<PolicyResult>,
    pub goals: Option<Goals>,
    pub forecast: Vec<ForecastRow>,
    pub seconds: f64,
}

/// A replica's life.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Starting,
    Ready,
    Draining,
    Gone,
}

#[derive(Debug, Clone)]
struct Replica {
    state: State,
    started_us: u64,
    ready_at_us: u64,
    /// Slot replicas: requests in service and waiting.
    busy: u32,
    queue: VecDeque<u32>,
    /// LLM replicas: the continuous-batching engine.
    llm: Option<LlmServer>,
    /// What this replica adds to the region's totals now (see [`Region::refresh`]).
    counted: Contribution,
}

/// One replica's share of the region's running totals.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
struct Contribution {
    in_flight: u32,
    waiting: u32,
    /// Share of the replica's GPUs drawing full power (0..=1).
    power: f64,
}

impl Replica {
    fn outstanding(&self) -> u32 {
        match &self.llm {
            Some(server) => server.outstanding(),
            None => self.busy + self.queue.len() as u32,
        }
    }

    fn is_idle(&self) -> bool {
        match &self.llm {
            Some(server) => server.is_empty() && !server.stepping,
            None => self.busy == 0 && self.queue.is_empty(),
        }
    }

    /// The least-loaded key for routing: LLM replicas by tokens ahead (Splitwise's
    /// token-JSQ), then requests; slot replicas by requests.
    fn load_key(&self) -> (u64, u32) {
        match &self.llm {
            Some(server) => (server.pending_tokens(), server.outstanding()),
            None => (u64::from(self.outstanding()), 0),
        }
    }
}

/// (time µs, class, sequence number, replica, request): ordered by time, then class,
/// then the order they were scheduled in.
type Event = (u64, u8, u64, u32, u32);

/// A variant of ours for the ablations: a name and a change to its configuration.
type Variant = (&'static str, fn(&mut OursConfig));

/// Event classes, in the order they are handled at the same instant.
const COMPLETE: u8 = 0;
const STEP: u8 = 1;
const READY: u8 = 2;

#[derive(Debug, Default, Clone, Copy)]
struct Bucket {
    alive_us: f64,
    /// Replica-µs at full power (busy share × time).
    busy_us: f64,
}

/// The region in virtual time under one policy.
struct Region<'a> {
    workload: &'a Workload,
    concurrency: u32,
    /// The slots a replica declares to the scaler (what a live region's agents say):
    /// `concurrency`, or for an LLM replica under a scaler that learns its capacity, 1.
    declared_concurrency: u32,
    cold_starts: &'a [f64],
    /// Every cold start drawn is multiplied by this.
    cold_start_scale: f64,
    rng: Rng,
    now_us: u64,
    horizon_us: u64,
    replicas: Vec<Replica>,
    /// Indices of the replicas not gone.
    live: Vec<usize>,
    buffer: VecDeque<u32>,
    events: BinaryHeap<std::cmp::Reverse<Event>>,
    seq: u64,
    alive: u32,
    ready: u32,
    starting: u32,
    total: Contribution,
    accounted_us: u64,
    bucket_us: u64,
    buckets: Vec<Bucket>,
    /// What the serving core counts between two ticks.
    window: SignalWindow,
    /// Per request: latency (ms), or None (not answered: shed).
    latency_ms: Vec<Option<f64>>,
    /// Per LLM request: time to its first token (ms).
    ttft_ms: Vec<Option<f64>>,
    /// Per request: it waited at the region for a replica to be ready.
    waited_for_replica: Vec<bool>,
    service_sum_ms: f64,
    service_n: u64,
    cold_sum_ms: f64,
    cold_n: u64,
    /// When the last answer went out.
    last_answer_us: u64,
    produced: Vec<Produced>,
}

impl<'a> Region<'a> {
    fn new(
        workload: &'a Workload,
        cold_starts: &'a [f64],
        seed: u64,
        bucket_us: u64,
        cold_start_scale: f64,
        declared_concurrency: Option<u32>,
    ) -> Region<'a> {
        let horizon_us = workload.requests.last().map_or(0, |r| r.arrival_us);
        Region {
            workload,
            concurrency: workload.concurrency.max(1),
            declared_concurrency: declared_concurrency.unwrap_or(workload.concurrency).max(1),
            cold_starts,
            cold_start_scale: if cold_start_scale.is_finite() && cold_start_scale >= 0.0 {
                cold_start_scale
            } else {
                1.0
            },
            rng: Rng::new(seed),
            now_us: 0,
            horizon_us,
            replicas: Vec::new(),
            live: Vec::new(),
            buffer: VecDeque::new(),
            events: BinaryHeap::new(),
            seq: 0,
            alive: 0,
            ready: 0,
            starting: 0,
            total: Contribution::default(),
            accounted_us: 0,
            bucket_us: bucket_us.max(1),
            buckets: vec![Bucket::default(); (horizon_us / bucket_us.max(1)) as usize + 1],
            window: SignalWindow::default(),
            latency_ms: vec![None; workload.requests.len()],
            ttft_ms: vec![None; workload.requests.len()],
            waited_for_replica: vec![false; workload.requests.len()],
            service_sum_ms: 0.0,
            service_n: 0,
            cold_sum_ms: 0.0,
            cold_n: 0,
            last_answer_us: 0,
            produced: Vec::new(),
        }
    }

    fn push(&mut self, at_us: u64, class: u8, a: u32, b: u32) {
        self.seq += 1;
        self.events
            .push(std::cmp::Reverse((at_us, class, self.seq, a, b)));
    }

    /// Integrates GPU time and power up to `to_us` (accounting stops at the last
    /// arrival).
    fn advance(&mut self, to_us: u64) {
        let from = self.accounted_us;
        let to = to_us.min(self.horizon_us);
        if to > from {
            let mut at = from;
            while at < to {
                let index = (at / self.bucket_us) as usize;
                let end = ((index as u64 + 1) * self.bucket_us).min(to);
                let span = (end - at) as f64;
                if let Some(bucket) = self.buckets.get_mut(index) {
                    bucket.alive_us += f64::from(self.alive) * span;
                    bucket.busy_us += self.total.power * span;
                }
                at = end;
            }
            self.accounted_us = to;
        }
        self.now_us = self.now_us.max(to_us);
    }

    /// Recomputes what replica `index` adds to the totals after a change.
    fn refresh(&mut self, index: usize) {
        let replica = &self.replicas[index];
        let gone = replica.state == State::Gone;
        let now = match &replica.llm {
            _ if gone => Contribution::default(),
            Some(server) => Contribution {
                in_flight: server.running(),
                waiting: server.waiting(),
                power: if server.stepping { 1.0 } else { 0.0 },
            },
            None => Contribution {
                in_flight: replica.busy,
                waiting: replica.queue.len() as u32,
                power: f64::from(replica.busy) / f64::from(self.concurrency),
            },
        };
        let before = replica.counted;
        self.total.in_flight = self.total.in_flight + now.in_flight - before.in_flight;
        self.total.waiting = self.total.waiting + now.waiting - before.waiting;
        self.total.power += now.power - before.power;
        self.replicas[index].counted = now;
    }

    /// The cold start the next replica started would pay (µs), without drawing it.
    fn peek_cold_start_us(&self) -> u64 {
        if self.cold_starts.is_empty() {
            return 0;
        }
        let mut rng = self.rng.clone();
        let ms = self.cold_starts[rng.below(self.cold_starts.len() as u64) as usize];
        (ms * self.cold_start_scale * 1000.0) as u64
    }

    fn start_replica(&mut self, ready_now: bool) {
        let cold_ms = if ready_now || self.cold_starts.is_empty() {
            0.0
        } else {
            self.cold_starts[self.rng.below(self.cold_starts.len() as u64) as usize]
                * self.cold_start_scale
        };
        let ready_at_us = self.now_us + (cold_ms * 1000.0) as u64;
        let index = self.replicas.len() as u32;
        self.replicas.push(Replica {
            state: if ready_now {
                State::Ready
            } else {
                State::Starting
            },
            started_us: self.now_us,
            ready_at_us,
            busy: 0,
            queue: VecDeque::new(),
            llm: self.workload.llm.as_ref().map(|_| LlmServer::default()),
            counted: Contribution::default(),
        });
        self.alive += 1;
        self.live.push(index as usize);
        if ready_now {
            self.ready += 1;
        } else {
            self.starting += 1;
            self.push(ready_at_us, READY, index, 0);
        }
    }

    fn best_ready(&self) -> Option<usize> {
        least_loaded(
            self.live
                .iter()
                .filter(|&&index| self.replicas[index].state == State::Ready)
                .map(|&index| (self.replicas[index].load_key(), index)),
        )
    }

    fn begin(&mut self, index: usize, request: u32) {
        let service_ms = self.workload.requests[request as usize].service_ms;
        self.replicas[index].busy += 1;
        self.refresh(index);
        let done = self.now_us + (service_ms * 1000.0).round() as u64;
        self.push(done, COMPLETE, index as u32, request);
    }

    /// Starts replica `index`'s next step if it is an idle LLM replica with work.
    fn kick(&mut self, index: usize) {
        let workload = self.workload;
        let Some(profile) = workload.llm.as_ref() else {
            return;
        };
        let requests = &workload.requests;
        let Some(server) = self.replicas[index].llm.as_mut() else {
            return;
        };
        if server.stepping {
            return;
        }
        if let Some(duration_us) = server.plan_step(profile, requests) {
            let at = self.now_us + duration_us;
            self.push(at, STEP, index as u32, 0);
        }
        self.refresh(index);
    }

    fn route(&mut self, request: u32) {
        let Some(index) = self.best_ready() else {
            if let Some(waited) = self.waited_for_replica.get_mut(request as usize) {
                *waited = true;
            }
            self.buffer.push_back(request);
            return;
        };
        if let Some(server) = self.replicas[index].llm.as_mut() {
            server.enqueue(request, &self.workload.requests);
            self.refresh(index);
            self.kick(index);
        } else if self.replicas[index].busy < self.concurrency {
            self.begin(index, request);
        } else {
            self.replicas[index].queue.push_back(request);
            self.refresh(index);
        }
    }

    /// The wait the gate is asked about: before the request would start at the
    /// replica it would go to, or until the first starting replica is ready. LLM
    /// replicas: the prompt tokens ahead of it at a full step's prefill rate.
    fn predicted_wait_ms(&self, service_ms: f64) -> f64 {
        let per_token_ms = self
            .workload
            .llm
            .as_ref()
            .map(LlmProfile::ms_per_prefill_token);
        if let Some(index) = self.best_ready() {
            let replica = &self.replicas[index];
            return match (&replica.llm, per_token_ms) {
                (Some(server), Some(per_token)) => server.prefill_ahead() as f64 * per_token,
                _ => predicted_wait_ms(replica.outstanding(), self.concurrency, service_ms, None),
            };
        }
        let first_ready = self
            .live
            .iter()
            .map(|&index| &self.replicas[index])
            .filter(|r| r.state == State::Starting)
            .map(|r| r.ready_at_us)
            .min();
        match (first_ready, per_token_ms) {
            (Some(at), Some(per_token)) => {
                let ahead: u64 = self
                    .buffer
                    .iter()
                    .map(|&r| u64::from(self.workload.requests[r as usize].prompt_tokens))
                    .sum();
                at.saturating_sub(self.now_us) as f64 / 1000.0 + ahead as f64 * per_token
            }
            (Some(at), None) => predicted_wait_ms(
                self.buffer.len() as u32,
                self.concurrency,
                service_ms,
                Some(at.saturating_sub(self.now_us) as f64 / 1000.0),
            ),
            (None, _) => f64::INFINITY,
        }
    }

    fn answered(&mut self, request: u32) {
        let arrival_us = self.workload.requests[request as usize].arrival_us;
        let latency_ms = (self.now_us - arrival_us) as f64 / 1000.0;
        self.latency_ms[request as usize] = Some(latency_ms);
        let within = self.workload.requests[request as usize]
            .within(latency_ms, self.ttft_ms[request as usize]);
        let found_replica = !self
            .waited_for_replica
            .get(request as usize)
            .is_some_and(|w| *w);
        self.window.answer(latency_ms, within, found_replica);
        self.service_sum_ms += self.workload.requests[request as usize].service_ms;
        self.service_n += 1;
        self.last_answer_us = self.last_answer_us.max(self.now_us);
    }

    fn complete(&mut self, index: usize, request: u32) {
        self.answered(request);
        let state = self.replicas[index].state;
        self.replicas[index].busy -= 1;
        self.refresh(index);
        if let Some(next) = self.replicas[index].queue.pop_front() {
            self.begin(index, next);
        } else if state == State::Draining && self.replicas[index].busy == 0 {
            self.retire(index);
        }
    }

    /// An LLM replica's step ended: apply it, answer what finished, start the next.
    fn step_done(&mut self, index: usize) {
        let mut produced = std::mem::take(&mut self.produced);
        produced.clear();
        if let Some(server) = self.replicas[index].llm.as_mut() {
            server.finish_step(&mut produced);
        }
        for item in &produced {
            match *item {
                Produced::FirstToken(request) => {
                    let arrival_us = self.workload.requests[request as usize].arrival_us;
                    self.ttft_ms[request as usize] =
                        Some((self.now_us - arrival_us) as f64 / 1000.0);
                }
                Produced::Done(request) => self.answered(request),
            }
        }
        self.produced = produced;
        self.refresh(index);
        self.kick(index);
        if self.replicas[index].state == State::Draining && self.replicas[index].is_idle() {
            self.retire(index);
        }
    }

    fn become_ready(&mut self, index: usize) {
        if self.replicas[index].state != State::Starting {
            return;
        }
        self.replicas[index].state = State::Ready;
        self.starting -= 1;
        self.ready += 1;
        self.cold_sum_ms += (self.now_us - self.replicas[index].started_us) as f64 / 1000.0;
        self.cold_n += 1;
        self.refresh(index);
        while let Some(request) = self.buffer.pop_front() {
            self.route(request);
        }
    }

    fn retire(&mut self, index: usize) {
        self.replicas[index].state = State::Gone;
        self.refresh(index);
        self.alive -= 1;
        self.live.retain(|&live| live != index);
    }

    /// Carries out a desired count.
    fn scale_to(&mut self, desired: u32) {
        let active = self.ready + self.starting;
        if desired > active {
            for _ in active..desired {
                self.start_replica(false);
            }
            return;
        }
        let mut remove = active - desired;
        // Starting replicas first, the furthest from ready first.
        let mut starting: Vec<usize> = self
            .live
            .iter()
            .copied()
            .filter(|&i| self.replicas[i].state == State::Starting)
            .collect();
        starting.sort_by_key(|&i| std::cmp::Reverse((self.replicas[i].ready_at_us, i)));
        for index in starting {
            if remove == 0 {
                break;
            }
            self.starting -= 1;
            self.retire(index);
            remove -= 1;
        }
        // Then ready ones, least outstanding first, the newest first among equals.
        let mut ready: Vec<usize> = self
            .live
            .iter()
            .copied()
            .filter(|&i| self.replicas[i].state == State::Ready)
            .collect();
        ready.sort_by_key(|&i| (self.replicas[i].load_key(), std::cmp::Reverse(i)));
        for index in ready {
            if remove == 0 {
                break;
            }
            self.replicas[index].state = State::Draining;
            self.ready -= 1;
            self.refresh(index);
            if self.replicas[index].is_idle() {
                self.retire(index);
            }
            remove -= 1;
        }
    }

    /// Replicas (ready, or starting and ready by `at_us`) that will serve at `at_us`.
    fn ready_by(&self, at_us: u64) -> u32 {
        self.live
            .iter()
            .map(|&index| &self.replicas[index])
            .filter(|r| {
                r.state == State::Ready || r.state == State::Starting && r.ready_at_us <= at_us
            })
            .count() as u32
    }

    /// What the replicas are now, for the serving core to close the window with.
    fn snapshot(&self) -> Snapshot {
        Snapshot {
            in_flight: self.total.in_flight,
            queued: self.buffer.len() as u32 + self.total.waiting,
            ready: self.ready,
            starting: self.starting,
            service_ms: self.mean_service_ms().unwrap_or(0.0),
            concurrency: self.declared_concurrency,
            cold_start_ms: (self.cold_n > 0).then(|| self.cold_sum_ms / self.cold_n as f64),
            priority: 0,
        }
    }

    /// Mean service time of the requests answered so far (LLM: latency alone).
    fn mean_service_ms(&self) -> Option<f64> {
        (self.service_n > 0).then(|| self.service_sum_ms / self.service_n as f64)
    }
}

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
    /// scored (every policy runs through it; see [`AutoscaleOptions::warmup_s`]).
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

/// A plot bucket that divides an hour and gives about 1,500 buckets or fewer.
fn plot_bucket_us(span_s: f64) -> u64 {
    let candidates = [15u64, 30, 60, 300, 600, 900, 1800, 3600];
    let seconds = candidates
        .iter()
        .copied()
        .find(|s| span_s / *s as f64 <= 1500.0)
        .unwrap_or(3600);
    seconds * 1_000_000
}

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

/// Ours' configuration for a workload: the defaults, with the bounds of the run, the
/// p99 target at the p99 of the tune part's end-to-end latency targets, and the
/// admission wait floor at the trace's allowed wait (images: the target floor; LLM
/// requests: the mean wait before prefill their first-token targets allow).
pub fn ours_config(
    workload: &Workload,
    options: &AutoscaleOptions,
    tune_until_us: u64,
) -> OursConfig {
    let mut targets: Vec<f64> = workload
        .requests
        .iter()
        .filter(|r| r.arrival_us < tune_until_us)
        .map(|r| r.target_ms)
        .filter(|t| t.is_finite())
        .collect();
    let p99 = quantile(&mut targets, 0.99).unwrap_or(2_000.0);
    let mut config = OursConfig {
        min_replicas: options.min_replicas,
        max_replicas: options.max_replicas,
        target_p99_ms: p99,
        ..OursConfig::default()
    };
    config.admission.min_wait_ms = workload.target_floor_ms;
    config
}

/// `config` with the fields of `patch` (a JSON object, nested objects merged) in
/// place of its own; validated.
pub fn with_override(config: OursConfig, patch: Option<&serde_json::Value>) -> Result<OursConfig> {
    let Some(patch) = patch else {
        return Ok(config);
    };
    fn merge(into: &mut serde_json::Value, patch: &serde_json::Value) {
        match (into, patch) {
            (serde_json::Value::Object(into), serde_json::Value::Object(patch)) => {
                for (key, value) in patch {
                    match into.get_mut(key) {
                        Some(slot) => merge(slot, value),
                        None => {
                            into.insert(key.clone(), value.clone());
                        }
                    }
                }
            }
            (into, patch) => *into = patch.clone(),
        }
    }
    let mut value = serde_json::to_value(&config)?;
    merge(&mut value, patch);
    let merged: OursConfig =
        serde_json::from_value(value).context("--ours-config: not an OursConfig")?;
    merged
        .validate()
        .context("--ours-config: invalid configuration")?;
    Ok(merged)
}

/// Runs every policy on one trace.
pub fn run_autoscale(
    data: &Path,
    trace: &str,
    options: &AutoscaleOptions,
    progress: &mut dyn FnMut(&str),
) -> Result<TraceReport> {
    let workload = load_workload(data, trace, &options.service)?;
    let cold_starts = load_cold_starts(data)?;
    let prices = load_prices(data, &options.zone).with_context(|| {
        format!(
            "electricity prices for zone {} (pass --zone with a file in {}/electricity-prices-hourly-2023/)",
            options.zone,
            data.display()
        )
    })?;
    run_autoscale_workload(workload, &cold_starts, &prices, options, progress)
}

/// Runs every policy on a loaded workload (a trace, or a variation of one:
/// [`crate::autoscale_variants`]).
pub fn run_autoscale_workload(
    mut workload: Workload,
    cold_starts: &[f64],
    prices: &HourlySeries,
    options: &AutoscaleOptions,
    progress: &mut dyn FnMut(&str),
) -> Result<TraceReport> {
    let started = std::time::Instant::now();
    let span_us = workload.requests.last().map_or(0, |r| r.arrival_us);
    let tune_until_us = (span_us as f64 * options.tune_share.clamp(0.0, 1.0)) as u64;
    let bucket_us = plot_bucket_us(span_us as f64 / 1e6);
    let calibration = if workload.llm.is_some() {
        progress(&format!("{}: load test of one replica", workload.name));
        let calibration = calibrate_concurrency(
            &workload,
            tune_until_us,
            options.static_goal,
            options.seed,
            prices,
        );
        workload.concurrency = calibration.concurrency;
        Some(calibration)
    } else {
        None
    };
    let workload = workload;
    let score_from_us = (options.warmup_s.max(0.0) * 1e6).min(span_us as f64) as u64;
    let context = RunContext {
        workload: &workload,
        cold_starts,
        prices,
        seed: options.seed,
        bucket_us,
        tune_until_us,
        initial_replicas: options.min_replicas,
        cold_start_scale: options.cold_start_scale,
        declared_concurrency: None,
        score_from_us,
    };
    progress(&format!(
        "{}: {} requests over {:.1} h",
        workload.name,
        workload.requests.len(),
        span_us as f64 / 3.6e9
    ));

    // Static: the fewest replicas that keep the goal share within target over the
    // whole trace (peak provisioning sized with hindsight), unless given.
    let static_context = |replicas: u32| RunContext {
        initial_replicas: replicas,
        ..context_clone(&context)
    };
    let (static_replicas, static_result, static_rule) = match options.static_replicas {
        Some(replicas) => {
            let result = simulate(
                "static",
                &mut Static::new(replicas),
                &static_context(replicas),
            );
            (replicas, result, format!("{replicas} replicas (given)"))
        }
        None => {
            let (mut low, mut high) = (options.min_replicas.max(1), options.max_replicas.max(1));
            let mut best = simulate("static", &mut Static::new(high), &static_context(high));
            let mut best_n = high;
            while low < high {
                let middle = (low + high) / 2;
                progress(&format!("{}: static with {middle} replicas", workload.name));
                let result = simulate("static", &mut Static::new(middle), &static_context(middle));
                if result.within_slo >= options.static_goal {
                    high = middle;
                    best = result;
                    best_n = middle;
                } else {
                    low = middle + 1;
                }
            }
            if best_n != low {
                best = simulate("static", &mut Static::new(low), &static_context(low));
                best_n = low;
            }
            (
                best_n,
                best,
                format!(
                    "the fewest replicas that keep ≥ {:.0}% of the whole trace within target (searched 1..={})",
                    options.static_goal * 100.0,
                    options.max_replicas
                ),
            )
        }
    };

    // One configuration for every trace: the defaults with the run's bounds and the
    // trace's latency target; no per-trace patch (the `--tune` grid is a research tool).
    let ours_config = with_override(
        ours_config(&workload, options, tune_until_us),
        options.ours_override.as_ref(),
    )?;
    let mut policies = vec![static_result];
    progress(&format!("{}: hpa", workload.name));
    let mut hpa = Hpa::new(HpaConfig {
        min_replicas: options.min_replicas,
        max_replicas: options.max_replicas,
        ..HpaConfig::default()
    })?;
    policies.push(simulate("hpa", &mut hpa, &context));
    progress(&format!("{}: kpa", workload.name));
    let mut kpa = Kpa::new(KpaConfig {
        min_replicas: options.min_replicas,
        max_replicas: options.max_replicas,
        ..KpaConfig::default()
    })?;
    policies.push(simulate("kpa", &mut kpa, &context));
    progress(&format!("{}: ours", workload.name));
    // A deployment's floor is standing: ours starts with its min_replicas ready.
    // Ours is told what a live region's agents declare, one slot, not the load test
    // HPA and KPA are configured from: it learns an LLM replica's capacity as it runs.
    let ours_context = RunContext {
        initial_replicas: ours_config.min_replicas.max(options.min_replicas),
        declared_concurrency: workload.llm.is_some().then_some(1),
        ..context_clone(&context)
    };
    let mut ours = Ours::new(ours_config.clone())?;
    policies.push(simulate("ours", &mut ours, &ours_context));
    let ours_capacity = ours.capacity().current().map(|per_s| LearnedCapacity {
        per_replica_per_s: per_s,
        learned: ours.capacity().is_learned(),
        levels: ours.capacity().levels().len(),
    });
    let (oracle, reactive_bound) = if options.oracle {
        progress(&format!("{}: oracle (clairvoyant)", workload.name));
        let max_cold_us = cold_starts.iter().copied().fold(0.0, f64::max)
            * options.cold_start_scale.max(0.0)
            * 1000.0;
        let (result, info, plan) = run_oracle(
            &context,
            options.static_goal,
            options.min_replicas,
            options.max_replicas,
            max_cold_us as u64,
        );
        policies.push(result);
        progress(&format!("{}: reactive bound", workload.name));
        let (reactive, reactive_info) = run_reactive_bound(
            &context,
            &plan,
            options.static_goal,
            options.min_replicas,
            static_replicas.max(options.min_replicas) + 2,
        );
        policies.push(reactive);
        (Some(info), Some(reactive_info))
    } else {
        (None, None)
    };

    let mut ablations = Vec::new();
    if options.ablations {
        let variants: [Variant; 3] = [
            ("ours-reactive-only", |c| {
                c.forecast.enabled = false;
                c.admission.enabled = false;
            }),
            ("ours-no-forecast", |c| c.forecast.enabled = false),
            ("ours-no-admission", |c| c.admission.enabled = false),
        ];
        for (name, edit) in variants {
            progress(&format!("{}: {name}", workload.name));
            let mut config = ours_config.clone();
            edit(&mut config);
            let mut policy = Ours::new(config)?;
            ablations.push(simulate(name, &mut policy, &ours_context));
        }
    }

    progress(&format!("{}: forecasters", workload.name));
    let forecast = forecast_errors(&workload, options.tune_share);
    let goals = goals(&policies);
    let mut cold_sorted = cold_starts.to_vec();
    Ok(TraceReport {
        trace: workload.name.clone(),
        path: workload.path.clone(),
        requests: workload.requests.len(),
        span_hours: span_us as f64 / 3.6e9,
        service_model: workload.service_model.clone(),
        mean_service_ms: workload.requests.iter().map(|r| r.service_ms).sum::<f64>()
            / workload.requests.len().max(1) as f64,
        concurrency: workload.concurrency,
        target_rule: workload.target_rule.clone(),
        gpu: workload.gpu.gpu.to_string(),
        usd_per_gpu_hour: workload.gpu.usd_per_gpu_hour(),
        zone: options.zone.clone(),
        cold_start_p50_ms: quantile(&mut cold_sorted, 0.5).unwrap_or(0.0)
            * options.cold_start_scale,
        cold_start_p99_ms: quantile(&mut cold_sorted, 0.99).unwrap_or(0.0)
            * options.cold_start_scale,
        cold_start_scale: options.cold_start_scale,
        gpus_per_replica: workload.gpus_per_replica,
        calibration,
        oracle,
        reactive_bound,
        static_replicas,
        static_rule,
        tune_until_hours: tune_until_us as f64 / 3.6e9,
        ours_config,
        ours_capacity,
        warmup_s: score_from_us as f64 / 1e6,
        policies,
        ablations,
        goals,
        forecast,
        seconds: started.elapsed().as_secs_f64(),
    })
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

fn goals(policies: &[PolicyResult]) -> Option<Goals> {
    let find = |name: &str| policies.iter().find(|p| p.name == name);
    let (ours, static_, hpa, kpa) = (find("ours")?, find("static")?, find("hpa")?, find("kpa")?);
    let over_oracle = find("oracle").map(|oracle| ours.gpu_hours / oracle.gpu_hours.max(1e-9));
    let reactive = if hpa.outside <= kpa.outside { hpa } else { kpa };
    let share = ours.gpu_hours / static_.gpu_hours.max(1e-9);
    let reduction = if reactive.outside == 0 {
        if ours.outside == 0 {
            0.0
        } else {
            -1.0
        }
    } else {
        1.0 - ours.outside as f64 / reactive.outside as f64
    };
    Some(Goals {
        ours_within_slo: ours.within_slo,
        ours_gpu_hours_share_of_static: share,
        ours_outside: ours.outside,
        reactive_best: reactive.name.clone(),
        reactive_outside: reactive.outside,
        outside_reduction_vs_reactive: reduction,
        ours_over_oracle: over_oracle,
        within_99: ours.within_slo >= 0.99,
        gpu_hours_at_most_static: share <= 1.0,
        at_most_1_5x_oracle: over_oracle.map(|ratio| ratio <= 1.5),
    })
}

/// The JSON printed by `--json`: the traces' reports.
#[derive(Debug, Clone, Serialize)]
pub struct AutoscaleReport {
    pub reports: Vec<TraceReport>,
}

impl TraceReport {
    /// A table for people.
    pub fn table(&self) -> String {
        let mut out = format!(
            "{}: {} requests over {:.1} h; {}; target: {}; static = {} ({})\n",
            self.trace,
            self.requests,
            self.span_hours,
            self.service_model,
            self.target_rule,
            self.static_replicas,
            self.static_rule
        );
        if let Some(capacity) = &self.ours_capacity {
            out += &format!(
                "ours: one configuration for every trace (no tuned patch); learned {:.3} req/s per replica within target ({}){}\n",
                capacity.per_replica_per_s,
                if capacity.learned { "from the answers" } else { "the prior: slots over service time" },
                self.calibration.as_ref().map_or(String::new(), |c| format!(
                    "; HPA and KPA size with the load test's concurrency {} ({:.3} req/s per replica)",
                    c.concurrency, c.max_rate_per_s
                )),
            );
        }
        if self.warmup_s > 0.0 {
            out += &format!(
                "every policy ran the first {:.0} s unscored (warm-up): figures are from there on\n",
                self.warmup_s
            );
        }
        out += &format!(
            "{:<20} {:>10} {:>9} {:>10} {:>10} {:>7} {:>6} {:>7} {:>9} {:>9} {:>9}\n",
            "POLICY",
            "WITHIN",
            "OUTSIDE",
            "GPU-HOURS",
            "COST $",
            "EVENTS",
            "FLIPS",
            "SHED",
            "P99 S",
            "HOLDOUT",
            "HO GPU-H"
        );
        for p in self.policies.iter().chain(&self.ablations) {
            let holdout = p.segments.iter().find(|s| s.segment == "holdout");
            out += &format!(
                "{:<20} {:>9.2}% {:>9} {:>10.2} {:>10.2} {:>7} {:>6} {:>7} {:>9.2} {:>8.2}% {:>9.2}\n",
                p.name,
                p.within_slo * 100.0,
                p.outside,
                p.gpu_hours,
                p.cost,
                p.scale_events,
                p.direction_changes,
                p.shed,
                p.latency_p99_ms / 1000.0,
                holdout.map_or(0.0, |s| s.within_slo * 100.0),
                holdout.map_or(0.0, |s| s.gpu_hours),
            );
        }
        if let Some(goals) = &self.goals {
            out += &format!(
                "goals: ours within {:.2}% (≥ 99%: {}), GPU-hours {:.0}% of static (≤ 100%: {}){}; {} outside vs {} for {} ({:+.0}%)\n",
                goals.ours_within_slo * 100.0,
                yes(goals.within_99),
                goals.ours_gpu_hours_share_of_static * 100.0,
                yes(goals.gpu_hours_at_most_static),
                goals.ours_over_oracle.map_or(String::new(), |ratio| format!(
                    ", {ratio:.2}× the oracle's (stretch ≤ 1.5×: {})",
                    yes(ratio <= 1.5)
                )),
                goals.ours_outside,
                goals.reactive_outside,
                goals.reactive_best,
                -goals.outside_reduction_vs_reactive * 100.0,
            );
        }
        let static_gpu_hours = self
            .policies
            .iter()
            .find(|p| p.name == "static")
            .map_or(0.0, |p| p.gpu_hours);
        let share = |name: &str| {
            self.policies
                .iter()
                .find(|p| p.name == name)
                .map(|p| p.gpu_hours / static_gpu_hours.max(1e-9) * 100.0)
        };
        if let (Some(oracle), Some(info)) = (share("oracle"), &self.oracle) {
            out += &format!(
                "oracle (clairvoyant, simulator only): {oracle:.0}% of static's GPU-hours ({} replays; {} misses planned of {} allowed)\n",
                info.rounds, info.planned_misses, info.allowance
            );
        }
        if let (Some(reactive), Some(info)) = (share("reactive-ref"), &self.reactive_bound) {
            out += &format!(
                "reactive reference (each 5-s slot's need told when it ends): {reactive:.0}% of static's GPU-hours, floor {} and hold {:.0} s (goal met: {})\n",
                info.floor,
                info.hold_s,
                yes(info.met_goal)
            );
        }
        if let Some(calibration) = &self.calibration {
            out += &format!(
                "load test of one replica: {:.3} req/s within target at most, × {:.0} ms alone = concurrency {}\n",
                calibration.max_rate_per_s, calibration.mean_service_ms, calibration.concurrency
            );
        }
        out += "forecast MAE (req/s) at 1 and 5 min ahead, tune part → held-out part:\n";
        let models: Vec<&String> = {
            let mut seen = Vec::new();
            for row in &self.forecast {
                if !seen.contains(&&row.model) {
                    seen.push(&row.model);
                }
            }
            seen
        };
        for model in models {
            let at = |h: usize| {
                self.forecast
                    .iter()
                    .find(|r| &r.model == model && r.horizon_min == h)
            };
            if let (Some(one), Some(five)) = (at(1), at(5)) {
                out += &format!(
                    "  {:<52} 1 min {:.4} → {:.4}   5 min {:.4} → {:.4}\n",
                    model, one.tune_mae, one.holdout_mae, five.tune_mae, five.holdout_mae
                );
            }
        }
        out
    }

    /// CSV of the series and the summary, and the SVG.
    pub fn write(&self, out: &Path) -> Result<Vec<PathBuf>> {
        std::fs::create_dir_all(out).with_context(|| format!("cannot create {}", out.display()))?;
        let stem = format!("autoscale-{}", self.trace);
        let mut series_csv = String::from(
            "policy,bucket_start_s,arrivals,load_req_per_s,replicas,p99_latency_s,outside\n",
        );
        for p in &self.policies {
            let s = &p.series;
            for index in 0..s.arrivals.len() {
                series_csv += &format!(
                    "{},{:.0},{},{:.4},{:.3},{},{}\n",
                    p.name,
                    index as f64 * s.bucket_s,
                    s.arrivals[index],
                    f64::from(s.arrivals[index]) / s.bucket_s,
                    s.replicas[index],
                    s.p99_s[index].map_or(String::new(), |v| format!("{v:.3}")),
                    s.outside[index]
                );
            }
        }
        let mut summary_csv = String::from("trace,policy,within_slo,outside,gpu_hours,cost_usd,gpu_cost_usd,energy_cost_usd,energy_kwh,scale_events,direction_changes,shed,p50_ms,p99_ms,mean_replicas,peak_replicas,tune_within_slo,tune_gpu_hours,holdout_within_slo,holdout_gpu_hours\n");
        for p in self.policies.iter().chain(&self.ablations) {
            let seg = |name: &str| p.segments.iter().find(|s| s.segment == name);
            summary_csv += &format!(
                "{},{},{:.5},{},{:.3},{:.2},{:.2},{:.2},{:.2},{},{},{},{:.0},{:.0},{:.2},{},{:.5},{:.3},{:.5},{:.3}\n",
                self.trace,
                p.name,
                p.within_slo,
                p.outside,
                p.gpu_hours,
                p.cost,
                p.gpu_cost,
                p.energy_cost,
                p.energy_kwh,
                p.scale_events,
                p.direction_changes,
                p.shed,
                p.latency_p50_ms,
                p.latency_p99_ms,
                p.mean_replicas,
                p.peak_replicas,
                seg("tune").map_or(0.0, |s| s.within_slo),
                seg("tune").map_or(0.0, |s| s.gpu_hours),
                seg("holdout").map_or(0.0, |s| s.within_slo),
                seg("holdout").map_or(0.0, |s| s.gpu_hours),
            );
        }
        let mut forecast_csv = String::from("trace,model,horizon_min,tune_mae,holdout_mae,holdout_rmse,holdout_relative_mae,holdout_bias\n");
        for row in &self.forecast {
            forecast_csv += &format!(
                "{},\"{}\",{},{:.4},{:.4},{:.4},{:.4},{:.4}\n",
                self.trace,
                row.model,
                row.horizon_min,
                row.tune_mae,
                row.holdout_mae,
                row.holdout_rmse,
                row.holdout_relative_mae,
                row.holdout_bias
            );
        }
        let paths = [
            (out.join(format!("{stem}-series.csv")), series_csv),
            (out.join(format!("{stem}.csv")), summary_csv),
            (out.join(format!("{stem}-forecast.csv")), forecast_csv),
            (
                out.join(format!("{stem}.json")),
                serde_json::to_string_pretty(self)?,
            ),
            (out.join(format!("{stem}.svg")), self.svg()),
        ];
        let mut written = Vec::new();
        for (path, text) in paths {
            std::fs::write(&path, text)
                .with_context(|| format!("cannot write {}", path.display()))?;
            written.push(path);
        }
        Ok(written)
    }

    /// Three panels over time: load, replicas per policy, p99 latency per policy.
    pub fn svg(&self) -> String {
        let hours = self.span_hours > 3.0;
        let (scale, unit) = if hours {
            (3600.0, "hours")
        } else {
            (60.0, "minutes")
        };
        let x_of = |s: &Series, index: usize| index as f64 * s.bucket_s / scale;
        let Some(first) = self.policies.first() else {
            return String::new();
        };
        let load = vec![(
            "offered load".to_string(),
            first
                .series
                .arrivals
                .iter()
                .enumerate()
                .map(|(i, a)| {
                    (
                        x_of(&first.series, i),
                        f64::from(*a) / first.series.bucket_s,
                    )
                })
                .collect::<Vec<_>>(),
        )];
        let replicas: Vec<(String, Vec<(f64, f64)>)> = self
            .policies
            .iter()
            .map(|p| {
                (
                    p.name.clone(),
                    p.series
                        .replicas
                        .iter()
                        .enumerate()
                        .map(|(i, r)| (x_of(&p.series, i), *r))
                        .collect(),
                )
            })
            .collect();
        let latency: Vec<(String, Vec<(f64, f64)>)> = self
            .policies
            .iter()
            .map(|p| {
                (
                    p.name.clone(),
                    p.series
                        .p99_s
                        .iter()
                        .enumerate()
                        .filter_map(|(i, v)| v.map(|v| (x_of(&p.series, i), v)))
                        .collect(),
                )
            })
            .collect();
        let x_label = format!("{unit} since the trace's first request ({})", self.trace);
        let panels = [
            crate::plot::svg_lines(&load, &x_label, "offered load (req/s)"),
            crate::plot::svg_lines(
                &replicas,
                &x_label,
                "replicas (starting + ready + draining)",
            ),
            crate::plot::svg_lines(&latency, &x_label, "p99 latency of answered requests (s)"),
        ];
        let mut svg = String::from(
            "<svg xmlns='http://www.w3.org/2000/svg' width='720' height='1260' font-family='sans-serif' font-size='12'>\n",
        );
        for (index, panel) in panels.iter().enumerate() {
            svg += &format!(
                "<g transform='translate(0,{})'>\n{panel}</g>\n",
                index * 420
            );
        }
        svg + "</svg>\n"
    }
}

fn yes(value: bool) -> &'static str {
    if value {
        "yes"
    } else {
        "NO"
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::autoscale_trace::gpu_price;

    fn workload(requests: Vec<Request>, concurrency: u32) -> Workload {
        Workload {
            name: "test".into(),
            path: PathBuf::from("test.csv"),
            start_hour: 0,
            start_offset_s: 0.0,
            concurrency,
            gpu: gpu_price("A10G-24GB").expect("row"),
            gpus_per_replica: 1,
            llm: None,
            service_model: "fixed".into(),
            target_rule: "test".into(),
            target_floor_ms: 1_000.0,
            requests,
        }
    }

    fn prices() -> HourlySeries {
        HourlySeries {
            zone: "X".into(),
            start_hour: 0,
            values: vec![100.0; 24],
            filled: 0,
            duplicates: 0,
            estimated: 0,
        }
    }

    fn run(
        workload: &Workload,
        policy: &mut dyn ScalingPolicy,
        initial: u32,
        cold_ms: f64,
    ) -> PolicyResult {
        let prices = prices();
        let cold = [cold_ms];
        let context = RunContext {
            workload,
            cold_starts: &cold,
            prices: &prices,
            seed: 1,
            bucket_us: 15_000_000,
            tune_until_us: workload.requests.last().map_or(0, |r| r.arrival_us) / 2,
            initial_replicas: initial,
            cold_start_scale: 1.0,
            declared_concurrency: None,
            score_from_us: 0,
        };
        simulate("p", policy, &context)
    }

    fn request(arrival_s: f64, service_ms: f64, target_ms: f64) -> Request {
        Request::timed((arrival_s * 1e6) as u64, service_ms, target_ms)
    }

    #[test]
    fn one_replica_serves_in_fifo_order_and_counts_its_gpu_time() {
        // Three 1 s requests at once on one single-slot replica: latencies 1, 2, 3 s;
        // a last request at 100 s ends the accounting: 100 s of one replica.
        let w = workload(
            vec![
                request(0.0, 1_000.0, 2_000.0),
                request(0.0, 1_000.0, 2_000.0),
                request(0.0, 1_000.0, 2_000.0),
                request(100.0, 1_000.0, 2_000.0),
            ],
            1,
        );
        let result = run(&w, &mut Static::new(1), 1, 0.0);
        assert_eq!(result.outside, 1, "the third waited 2 s");
        assert!((result.gpu_hours - 100.0 / 3600.0).abs() < 1e-9);
        assert_eq!(result.scale_events, 0);
        // Energy: idle 37.5 W for 100 s + (150 − 37.5) W for 3 busy seconds (the
        // last request is served after the last arrival, where accounting stops).
        let kwh = (37.5 * 100.0 + 112.5 * 3.0) / 3.6e6;
        assert!(
            (result.energy_kwh - kwh).abs() < 1e-9,
            "{}",
            result.energy_kwh
        );
        assert!((result.energy_cost - kwh * 0.1).abs() < 1e-9);
    }

    #[test]
    fn least_outstanding_spreads_and_a_cold_start_delays_the_buffered() {
        let w = workload(
            (0..8)
                .map(|_| request(0.0, 1_000.0, 1_500.0))
                .chain([request(60.0, 1.0, 1.0)])
                .collect(),
            1,
        );
        // Eight replicas ready: every request served at once.
        assert_eq!(run(&w, &mut Static::new(8), 8, 0.0).outside, 0);
        // Two ready: 4 rounds of 1 s → the last six wait.
        assert_eq!(run(&w, &mut Static::new(2), 2, 0.0).outside, 6);
    }

    fn llm_workload(requests: Vec<Request>) -> Workload {
        Workload {
            gpus_per_replica: 2,
            llm: Some(LlmProfile::llama2_70b_h100_tp2()),
            gpu: gpu_price("H100-SXM-80GB").expect("row"),
            ..workload(requests, 1)
        }
    }

    fn llm_request(arrival_s: f64, prompt: u32, output: u32) -> Request {
        let alone = LlmProfile::llama2_70b_h100_tp2().isolated(prompt, output);
        Request {
            arrival_us: (arrival_s * 1e6) as u64,
            service_ms: alone.e2e_ms,
            target_ms: 5.0 * alone.e2e_ms,
            prompt_tokens: prompt,
            output_tokens: output,
            ttft_target_ms: 6.0 * alone.ttft_ms,
            tbt_target_ms: 5.0 * alone.tbt_ms,
        }
    }

    #[test]
    fn an_llm_request_alone_takes_its_isolated_latency_on_two_gpus() {
        let w = llm_workload(vec![llm_request(0.0, 3000, 10), llm_request(100.0, 100, 6)]);
        let result = run(&w, &mut Static::new(1), 1, 0.0);
        assert_eq!(result.outside, 0);
        let alone = LlmProfile::llama2_70b_h100_tp2().isolated(3000, 10);
        assert!(
            (result.latency_p99_ms - alone.e2e_ms).abs() < 0.01,
            "{} against {}",
            result.latency_p99_ms,
            alone.e2e_ms
        );
        // One replica of two GPUs for the 100 s to the last arrival.
        assert!((result.gpu_hours - 2.0 * 100.0 / 3600.0).abs() < 1e-9);
    }

    #[test]
    fn a_short_prompt_behind_a_long_one_misses_its_first_token_unless_routed_elsewhere() {
        let w = llm_workload(vec![
            llm_request(0.0, 7000, 10),
            llm_request(0.01, 100, 6),
            llm_request(100.0, 100, 6),
        ]);
        let one = run(&w, &mut Static::new(1), 1, 0.0);
        assert_eq!((one.outside, one.over_ttft), (1, 1));
        // Two replicas: token-JSQ sends the short prompt to the idle one.
        assert_eq!(run(&w, &mut Static::new(2), 2, 0.0).outside, 0);
    }

    #[test]
    fn an_override_merges_nested_fields_and_is_validated() {
        let patch = serde_json::json!({"warm": {"max_warm": 3}, "min_replicas": 2});
        let merged = with_override(OursConfig::default(), Some(&patch)).expect("valid");
        assert_eq!(merged.warm.max_warm, 3);
        assert_eq!(merged.warm.quantile, OursConfig::default().warm.quantile);
        assert_eq!(merged.min_replicas, 2);
        let bad = serde_json::json!({"min_replicas": 100});
        assert!(with_override(OursConfig::default(), Some(&bad)).is_err());
    }

    #[test]
    fn ours_sheds_what_would_miss_and_scales_out() {
        // 200 requests of 1 s in 10 s on one replica, 20 s cold starts.
        let mut requests: Vec<Request> = (0..200)
            .map(|i| request(i as f64 * 0.05, 1_000.0, 2_000.0))
            .collect();
        requests.push(request(300.0, 1_000.0, 2_000.0));
        let w = workload(requests, 1);
        let mut config = OursConfig::default();
        config.forecast.model = ForecasterKind::Last;
        let mut ours = Ours::new(config).expect("valid");
        let result = run(&w, &mut ours, 1, 20_000.0);
        assert!(result.shed > 50, "{}", result.shed);
        assert!(result.peak_replicas > 10, "{}", result.peak_replicas);
        let hpa_result = run(
            &w,
            &mut Hpa::new(HpaConfig::default()).expect("valid"),
            1,
            20_000.0,
        );
        assert_eq!(hpa_result.shed, 0);
        // Deterministic: the same run twice.
        let mut again = Ours::new({
            let mut c = OursConfig::default();
            c.forecast.model = ForecasterKind::Last;
            c
        })
        .expect("valid");
        let second = run(&w, &mut again, 1, 20_000.0);
        assert_eq!(
            (
                result.outside,
                result.shed,
                result.scale_events,
                result.gpu_hours.to_bits()
            ),
            (
                second.outside,
                second.shed,
                second.scale_events,
                second.gpu_hours.to_bits()
            )
        );
    }
}
