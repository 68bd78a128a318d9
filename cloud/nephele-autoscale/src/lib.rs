//! The autoscaling core a region ticks for each cloud deployment: how many replicas it
//! should have now (including a warm pool), whether it is in panic, and how much load to
//! admit. Used by the region actor (live) and by `nephele sim autoscale` (trace replay in
//! virtual time), through the same [`ScalingPolicy::tick`] and [`AdmissionGate`].
//!
//! What it does, per deployment and per tick (default every 5 s):
//! - [`reactive`]: the product's rules: out when p99 is over target or the queue per
//!   ready replica is over a threshold; in when utilisation is low and the queue empty,
//!   after a cooldown, through a tolerance band and a scale-down stabilisation window;
//!   a panic mode when short-window demand is at least twice the ready capacity.
//! - [`predictive`] with [`forecast`]: the arrival rate of the next minutes, turned into
//!   replicas early enough that they are ready when the rise arrives (the measured cold
//!   start ahead). It only raises the floor: a forecast never removes a replica.
//! - [`warm`]: spare started replicas, sized from the forecast's recent under-forecast
//!   over the cold-start horizon.
//! - [`admission`]: a per-deployment admission level and a per-request gate (429 with
//!   Retry-After, never a silent drop) when the backlog is beyond what the replicas can
//!   serve before the deadline; [`admission::grant_by_priority`] shares a region's
//!   replicas out highest priority first, so the lowest priorities shed first.
//! - [`baselines`]: Kubernetes HPA (autoscaling/v2), Knative KPA and static
//!   provisioning, re-implemented from their documentation for comparison.
//!
//! What it deliberately does not do: no IO, no clock (time is `now_ms`, a `u64` of
//! milliseconds the caller chooses), no randomness, no async runtime. It does not start
//! or stop replicas, route requests, or measure anything: the caller reports
//! [`Signals`] and carries out the [`Decision`]. It does not choose nodes (placement
//! does) or ask providers for them. Same inputs, same decisions; every policy's state
//! is `Serialize + Deserialize` so a region can persist it and resume after a restart.

pub mod admission;
pub mod baselines;
pub mod capacity;
pub mod config;
pub mod forecast;
pub mod ours;
pub mod predictive;
pub mod reactive;
pub mod serving;
pub mod warm;

pub use admission::{Admission, AdmissionGate, Claim, ShedReason, Verdict};
pub use baselines::{Hpa, HpaConfig, Kpa, KpaConfig, Static};
pub use capacity::{Capacity, CapacityConfig};
pub use config::{ConfigError, OursConfig};
pub use forecast::{Forecaster, ForecasterKind, RateForecaster};
pub use ours::Ours;
pub use serving::{Deployment, SignalWindow, Snapshot};

use serde::{Deserialize, Serialize};

/// What the region measured for one deployment since its last tick.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Signals {
    /// Length of the window these figures cover (normally the time since the last tick).
    pub window_ms: u64,
    /// Requests offered in the window, admitted or not.
    pub arrivals: u64,
    /// Requests being served at replicas now.
    pub in_flight: u32,
    /// Requests waiting now (at replicas, or at the region while no replica is ready).
    pub queued: u32,
    /// p99 latency (arrival to answer) of requests answered in the window, if any.
    pub p99_ms: Option<f64>,
    /// Mean busy share of the ready replicas' slots over the window, 0..=1.
    pub utilisation: f64,
    /// Replicas serving.
    pub ready: u32,
    /// Replicas started and not yet ready (paying their cold start).
    pub starting: u32,
    /// Measured mean service time of one request at a replica (0: not measured yet).
    pub service_ms: f64,
    /// Requests one replica serves at once.
    pub concurrency: u32,
    /// Measured time from start to ready of recent replicas.
    pub cold_start_ms: Option<f64>,
    /// The deployment's priority (higher is more important); see
    /// [`admission::grant_by_priority`].
    pub priority: u32,
    /// Answers that left in the window of requests that found a ready replica when they
    /// arrived, and how many of them met their latency target (what [`capacity`] learns
    /// a replica's capacity from).
    #[serde(default)]
    pub answered: u64,
    #[serde(default)]
    pub within_target: u64,
}

impl Default for Signals {
    fn default() -> Self {
        Signals {
            window_ms: 5_000,
            arrivals: 0,
            in_flight: 0,
            queued: 0,
            p99_ms: None,
            utilisation: 0.0,
            ready: 0,
            starting: 0,
            service_ms: 0.0,
            concurrency: 1,
            cold_start_ms: None,
            priority: 0,
            answered: 0,
            within_target: 0,
        }
    }
}

/// Whether the scaler is reacting to a burst (no scale-in while in panic).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Mode {
    Stable,
    Panic,
}

/// What the region should do for the deployment now.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Decision {
    /// Total replicas wanted, warm ones included (within the configured bounds).
    pub desired: u32,
    /// How many of `desired` are the warm pool (started ahead of need).
    pub warm: u32,
    pub mode: Mode,
    /// The admission level until the next tick; apply it per request with an
    /// [`AdmissionGate`].
    pub admission: Admission,
    /// The forecast arrival rate over the pre-warm horizon, when the policy forecasts.
    pub forecast_rate_per_s: Option<f64>,
    /// Why, in a few words (for logs and `why` views).
    pub reason: String,
}

/// One autoscaling policy. The caller ticks it every [`ScalingPolicy::period_ms`] (or
/// more often: a policy with a longer loop answers its last decision in between) with
/// the signals of the window since its previous tick, and carries out the decision.
/// Time only moves forward; a `now_ms` earlier than the previous one is treated as the
/// previous one.
pub trait ScalingPolicy {
    fn name(&self) -> &'static str;
    /// How often this policy wants to be ticked.
    fn period_ms(&self) -> u64;
    fn tick(&mut self, now_ms: u64, signals: &Signals) -> Decision;
}

/// A policy borrowed (the simulator ticks one it does not own).
impl<T: ScalingPolicy + ?Sized> ScalingPolicy for &mut T {
    fn name(&self) -> &'static str {
        (**self).name()
    }
    fn period_ms(&self) -> u64 {
        (**self).period_ms()
    }
    fn tick(&mut self, now_ms: u64, signals: &Signals) -> Decision {
        (**self).tick(now_ms, signals)
    }
}

/// Any of the policies, for a caller that picks one by configuration and persists it
/// (`serde_json::to_string(&policy)`, then resume with `from_str`).
// One per deployment: `Ours` being larger than the others costs nothing worth a box.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "policy", rename_all = "kebab-case")]
pub enum Policy {
    Ours(Ours),
    Hpa(Hpa),
    Kpa(Kpa),
    Static(Static),
}

impl ScalingPolicy for Policy {
    fn name(&self) -> &'static str {
        match self {
            Policy::Ours(p) => p.name(),
            Policy::Hpa(p) => p.name(),
            Policy::Kpa(p) => p.name(),
            Policy::Static(p) => p.name(),
        }
    }
    fn period_ms(&self) -> u64 {
        match self {
            Policy::Ours(p) => p.period_ms(),
            Policy::Hpa(p) => p.period_ms(),
            Policy::Kpa(p) => p.period_ms(),
            Policy::Static(p) => p.period_ms(),
        }
    }
    fn tick(&mut self, now_ms: u64, signals: &Signals) -> Decision {
        match self {
            Policy::Ours(p) => p.tick(now_ms, signals),
            Policy::Hpa(p) => p.tick(now_ms, signals),
            Policy::Kpa(p) => p.tick(now_ms, signals),
            Policy::Static(p) => p.tick(now_ms, signals),
        }
    }
}

/// What every policy does first: signals made usable ([`sanitised`]) and a clock that
/// never goes back (a tick earlier than the last is taken as at the last).
pub(crate) fn begin_tick(last_now_ms: &mut u64, now_ms: u64, signals: &Signals) -> (u64, Signals) {
    let now_ms = now_ms.max(*last_now_ms);
    *last_now_ms = now_ms;
    (now_ms, sanitised(signals))
}

/// The replica bounds `(min, max)` with `max` never below `min`, and the count a tick
/// starts from: the policy's last decision, or else what runs and starts, within them.
pub(crate) fn bounded_current(
    last_decision: Option<u32>,
    signals: &Signals,
    min_replicas: u32,
    max_replicas: u32,
) -> (u32, u32, u32) {
    let max = max_replicas.max(min_replicas);
    let current = last_decision
        .unwrap_or(signals.ready.saturating_add(signals.starting))
        .clamp(min_replicas, max);
    (current, min_replicas, max)
}

/// Signals with every number made usable: non-finite or negative values replaced, the
/// utilisation clamped to 0..=1, concurrency at least 1. Policies call this first so
/// that no input can make them panic or produce NaN.
pub fn sanitised(signals: &Signals) -> Signals {
    let finite_or = |value: f64, fallback: f64| {
        if value.is_finite() && value >= 0.0 {
            value
        } else {
            fallback
        }
    };
    Signals {
        window_ms: signals.window_ms,
        arrivals: signals.arrivals,
        in_flight: signals.in_flight,
        queued: signals.queued,
        p99_ms: signals
            .p99_ms
            .filter(|value| value.is_finite() && *value >= 0.0),
        utilisation: finite_or(signals.utilisation, 0.0).min(1.0),
        ready: signals.ready,
        starting: signals.starting,
        service_ms: finite_or(signals.service_ms, 0.0),
        concurrency: signals.concurrency.max(1),
        cold_start_ms: signals
            .cold_start_ms
            .filter(|value| value.is_finite() && *value >= 0.0),
        priority: signals.priority,
        answered: signals.answered,
        within_target: signals.within_target.min(signals.answered),
    }
}
