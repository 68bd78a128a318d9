//! What a region's autoscaler last decided for a deployment, and the signals it
//! decided on (`GET /v1/deployments/{name}/replicas`, each region's `autoscaler`).
//! The autoscaler's own types live in `nephele-autoscale`; these are their API form.

use serde::{Deserialize, Serialize};

/// A deployment's autoscaler in one region.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct AutoscalerView {
    /// The last decision (none before the first tick).
    pub decision: Option<AutoscaleDecisionView>,
    /// The window it was made on.
    pub signals: Option<AutoscaleSignalsView>,
    /// The arrival forecaster the policy pre-warms with.
    pub forecaster: String,
    /// Requests per second one replica serves within the target, as learned online
    /// (none until measured).
    pub capacity_per_replica_per_s: Option<f64>,
    /// Whether that capacity comes from measured load levels (else a first estimate).
    pub capacity_learned: bool,
}

/// What the autoscaler decided.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct AutoscaleDecisionView {
    /// Replicas wanted, warm ones included (within the deployment's bounds).
    pub desired: u32,
    /// How many of `desired` are the warm pool (started ahead of need).
    pub warm: u32,
    /// `stable`, or `panic` (reacting to a burst: no scale-in).
    pub mode: String,
    /// The admission level until the next tick.
    pub admission: AdmissionView,
    /// The forecast arrival rate over the pre-warm horizon, when it forecasts.
    pub forecast_rate_per_s: Option<f64>,
    /// Why, in a few words.
    pub reason: String,
}

/// Which offloaded requests the region admits until the next tick.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct AdmissionView {
    /// A request whose predicted wait is longer is shed (none: no bound).
    pub max_wait_ms: Option<f64>,
    /// At most this rate is admitted (none: no limit).
    pub max_rate_per_s: Option<f64>,
    /// Requests admitted at once at most.
    pub burst: f64,
    /// What a shed request is told to wait before retrying.
    pub retry_after_ms: u64,
}

/// The window the autoscaler decided on.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct AutoscaleSignalsView {
    pub window_ms: u64,
    /// Requests offered in the window, admitted or not.
    pub arrivals: u64,
    pub in_flight: u32,
    pub queued: u32,
    /// p99 latency of the requests answered in the window.
    pub p99_ms: Option<f64>,
    /// Mean busy share of the ready replicas' slots, 0..=1.
    pub utilisation: f64,
    pub ready: u32,
    pub starting: u32,
    /// Mean service time of one request at a replica (0: not measured yet).
    pub service_ms: f64,
    pub concurrency: u32,
    pub cold_start_ms: Option<f64>,
    pub priority: u32,
    /// Answers of requests that found a ready replica, and how many met the target.
    pub answered: u64,
    pub within_target: u64,
}
