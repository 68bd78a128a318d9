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
//!
//! The module is split by concern: `region` is the region replayed in virtual time,
//! `simulate` runs one policy through it and scores the run, `run` runs every
//! policy on a trace, `calibrate` load-tests an LLM replica, `config` builds ours'
//! configuration, `forecast` scores the forecasters, and `report` prints and plots.

mod calibrate;
mod config;
mod forecast;
mod region;
mod report;
mod run;
mod simulate;
#[cfg(test)]
mod tests;

use std::path::PathBuf;

use nephele_autoscale::config::OursConfig;
use serde::Serialize;

use crate::autoscale_oracle::{OracleInfo, ReactiveInfo};
use crate::autoscale_trace::ServiceOptions;

pub use calibrate::{calibrate_concurrency, Calibration};
pub use config::{ours_config, with_override};
pub use forecast::{forecast_candidates, forecast_errors, minute_counts};
pub use run::{run_autoscale, run_autoscale_workload};
pub(crate) use simulate::context_clone;
pub use simulate::{simulate, simulate_with, RunContext, Scaler};

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

/// The JSON printed by `--json`: the traces' reports.
#[derive(Debug, Clone, Serialize)]
pub struct AutoscaleReport {
    pub reports: Vec<TraceReport>,
}
