//! The policies ours is measured against, re-implemented from their documentation
//! (`../shared/docs/AUTOSCALING.md`). Neither sheds load (admission is open), as
//! neither does by itself; where a detail is not documented, the comment says what
//! was assumed.
//!
//! - [`Hpa`]: Kubernetes Horizontal Pod Autoscaler, autoscaling/v2, default behaviour.
//! - [`Kpa`]: Knative Pod Autoscaler, concurrency metric, default windows.
//! - [`Static`]: a fixed count (peak provisioning).

use serde::{Deserialize, Serialize};
use std::collections::VecDeque;

use crate::admission::Admission;
use crate::config::{check_bounds, check_duration, check_range, ConfigError};
use crate::{begin_tick, bounded_current, Decision, Mode, ScalingPolicy, Signals};

/// HPA's settings. Defaults are Kubernetes' where it has one.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct HpaConfig {
    pub min_replicas: u32,
    pub max_replicas: u32,
    /// `--horizontal-pod-autoscaler-sync-period`: 15 s.
    pub sync_period_ms: u64,
    /// `--horizontal-pod-autoscaler-tolerance`: 0.1.
    pub tolerance: f64,
    /// `behavior.scaleDown.stabilizationWindowSeconds`: 300 s.
    pub scale_down_stabilisation_ms: u64,
    /// Metric 1, a Resource-style utilisation target: the mean busy share of a pod's
    /// slots (what a GPU-utilisation metric from DCGM reports), 70%, the value most
    /// HPA examples use.
    pub target_utilisation: f64,
    /// Metric 2, a Pods metric with an AverageValue target: requests in flight plus
    /// waiting per pod (what vLLM-style servers export), target = one full pod's
    /// concurrency, i.e. a queue forming. Assumed: an operator of an inference
    /// service scales on the queue too, not on utilisation alone; with two metrics the
    /// larger proposal wins, as HPA does.
    pub target_outstanding_per_concurrency: f64,
}

impl Default for HpaConfig {
    fn default() -> Self {
        HpaConfig {
            min_replicas: 1,
            max_replicas: 64,
            sync_period_ms: 15_000,
            tolerance: 0.1,
            scale_down_stabilisation_ms: 300_000,
            target_utilisation: 0.7,
            target_outstanding_per_concurrency: 1.0,
        }
    }
}

impl HpaConfig {
    pub fn validate(&self) -> Result<(), ConfigError> {
        check_bounds(self.min_replicas, self.max_replicas)?;
        check_duration("sync_period_ms", self.sync_period_ms)?;
        check_range("tolerance", self.tolerance, 0.0, 0.9, "in 0..=0.9")?;
        check_range(
            "target_utilisation",
            self.target_utilisation,
            0.01,
            1.0,
            "in 0.01..=1",
        )?;
        check_range(
            "target_outstanding_per_concurrency",
            self.target_outstanding_per_concurrency,
            0.01,
            f64::MAX,
            "> 0",
        )
    }
}

/// Kubernetes HPA (autoscaling/v2) with the default `behavior`:
/// - every sync period, per metric: `desired = ceil(current × metric / target)`, no
///   change while the ratio is within the tolerance of 1; the largest proposal wins;
/// - metrics are averaged over the ready pods over the sync period (assumed: the
///   metrics pipeline reports a mean over about that period); when scaling up, pods
///   not yet ready count as 0 (so `desired = ceil(sum over ready pods / target)`),
///   as HPA does for pods without metrics;
/// - scale-up: at most max(+100%, +4 pods) per period; no stabilisation;
/// - scale-down: the highest recommendation of the last 300 s, at most −100% per
///   period.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Hpa {
    pub config: HpaConfig,
    desired: Option<u32>,
    last_sync_ms: Option<u64>,
    recommendations: VecDeque<(u64, u32)>,
    /// Sums since the last sync: utilisation × window, outstanding per ready pod ×
    /// window, window.
    utilisation_ms: f64,
    outstanding_ms: f64,
    window_ms: f64,
    last_now_ms: u64,
}

impl Hpa {
    pub fn new(config: HpaConfig) -> Result<Hpa, ConfigError> {
        config.validate()?;
        Ok(Hpa {
            config,
            desired: None,
            last_sync_ms: None,
            recommendations: VecDeque::new(),
            utilisation_ms: 0.0,
            outstanding_ms: 0.0,
            window_ms: 0.0,
            last_now_ms: 0,
        })
    }

    fn decision(&self, desired: u32, reason: String) -> Decision {
        Decision {
            desired,
            warm: 0,
            mode: Mode::Stable,
            admission: Admission::open(),
            forecast_rate_per_s: None,
            reason,
        }
    }
}

impl ScalingPolicy for Hpa {
    fn name(&self) -> &'static str {
        "hpa"
    }

    fn period_ms(&self) -> u64 {
        self.config.sync_period_ms
    }

    fn tick(&mut self, now_ms: u64, signals: &Signals) -> Decision {
        let (now_ms, signals) = begin_tick(&mut self.last_now_ms, now_ms, signals);
        let config = &self.config;
        let (current, min, max) = bounded_current(
            self.desired,
            &signals,
            config.min_replicas,
            config.max_replicas,
        );
        let window = signals.window_ms.max(1) as f64;
        let ready = f64::from(signals.ready);
        self.utilisation_ms += signals.utilisation * window;
        let outstanding = f64::from(signals.in_flight) + f64::from(signals.queued);
        self.outstanding_ms += outstanding * window;
        self.window_ms += window;
        if self
            .last_sync_ms
            .is_some_and(|last| now_ms.saturating_sub(last) < config.sync_period_ms)
        {
            self.desired = Some(current);
            return self.decision(current, "between syncs".into());
        }
        self.last_sync_ms = Some(now_ms);
        let utilisation = self.utilisation_ms / self.window_ms.max(1.0);
        // Total outstanding (not per pod): divided by ready pods below.
        let outstanding = self.outstanding_ms / self.window_ms.max(1.0);
        self.utilisation_ms = 0.0;
        self.outstanding_ms = 0.0;
        self.window_ms = 0.0;

        let per_pod_target =
            config.target_outstanding_per_concurrency * f64::from(signals.concurrency);
        // Per metric: (usage ratio over ready pods, sum of the metric over ready pods,
        // target per pod).
        let metrics = [
            (
                utilisation / config.target_utilisation,
                utilisation * ready,
                config.target_utilisation,
            ),
            (
                if ready > 0.0 {
                    outstanding / ready / per_pod_target
                } else {
                    0.0
                },
                outstanding,
                per_pod_target,
            ),
        ];
        let mut proposal = None::<u32>;
        for (ratio, sum, target) in metrics {
            let this = if signals.ready == 0 {
                // No pod reports: HPA does not act on a missing metric, except that
                // outstanding work with no ready pod asks for one full pod's worth.
                if sum > 0.0 {
                    ((sum / target).ceil() as u32).max(current)
                } else {
                    current
                }
            } else if (ratio - 1.0).abs() <= config.tolerance {
                current
            } else if ratio > 1.0 {
                // Unready pods count as 0: the ratio over all pods.
                let pods = ready + f64::from(signals.starting);
                let all_ratio = sum / pods / target;
                if all_ratio <= 1.0 + config.tolerance {
                    current
                } else {
                    (sum / target).ceil() as u32
                }
            } else {
                (ratio * ready).ceil() as u32
            };
            proposal = Some(proposal.map_or(this, |p| p.max(this)));
        }
        let proposal = proposal.unwrap_or(current).clamp(min, max);
        self.recommendations.push_back((now_ms, proposal));
        while self
            .recommendations
            .front()
            .is_some_and(|(at, _)| now_ms.saturating_sub(*at) > config.scale_down_stabilisation_ms)
        {
            self.recommendations.pop_front();
        }
        let desired = if proposal > current {
            let limit = current.saturating_mul(2).max(current.saturating_add(4));
            proposal.min(limit)
        } else {
            // Scale-down stabilisation: the highest recommendation of the window.
            let highest = self
                .recommendations
                .iter()
                .map(|(_, rec)| *rec)
                .max()
                .unwrap_or(proposal);
            highest.min(current)
        }
        .clamp(min, max);
        self.desired = Some(desired);
        self.decision(
            desired,
            format!(
                "utilisation {utilisation:.2}, outstanding {outstanding:.1}: proposal {proposal}"
            ),
        )
    }
}

/// KPA's settings. Defaults are Knative's where it has one.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct KpaConfig {
    /// `min-scale`: Knative's default is 0 (scale to zero); here 1, what an operator
    /// sets for a latency-bound service whose cold start is tens of seconds.
    pub min_replicas: u32,
    pub max_replicas: u32,
    /// The autoscaler's `tick-interval`: 2 s.
    pub tick_ms: u64,
    /// `stable-window`: 60 s.
    pub stable_window_ms: u64,
    /// `panic-window-percentage`: 10% of the stable window.
    pub panic_window_share: f64,
    /// `panic-threshold-percentage`: 200%.
    pub panic_threshold: f64,
    /// `container-concurrency-target-percentage`: 70%. The per-replica target is the
    /// container concurrency (what a replica serves at once) × this.
    pub target_utilisation: f64,
    /// `max-scale-up-rate`: 1000.
    pub max_scale_up_rate: f64,
    /// `max-scale-down-rate`: 2.
    pub max_scale_down_rate: f64,
}

impl Default for KpaConfig {
    fn default() -> Self {
        KpaConfig {
            min_replicas: 1,
            max_replicas: 64,
            tick_ms: 2_000,
            stable_window_ms: 60_000,
            panic_window_share: 0.1,
            panic_threshold: 2.0,
            target_utilisation: 0.7,
            max_scale_up_rate: 1000.0,
            max_scale_down_rate: 2.0,
        }
    }
}

impl KpaConfig {
    pub fn validate(&self) -> Result<(), ConfigError> {
        check_bounds(self.min_replicas, self.max_replicas)?;
        check_duration("tick_ms", self.tick_ms)?;
        check_duration("stable_window_ms", self.stable_window_ms)?;
        check_range(
            "panic_window_share",
            self.panic_window_share,
            0.01,
            1.0,
            "in 0.01..=1",
        )?;
        check_range(
            "panic_threshold",
            self.panic_threshold,
            1.0,
            f64::MAX,
            "≥ 1",
        )?;
        check_range(
            "target_utilisation",
            self.target_utilisation,
            0.01,
            1.0,
            "in 0.01..=1",
        )?;
        check_range(
            "max_scale_up_rate",
            self.max_scale_up_rate,
            1.0,
            f64::MAX,
            "≥ 1",
        )?;
        check_range(
            "max_scale_down_rate",
            self.max_scale_down_rate,
            1.0,
            f64::MAX,
            "≥ 1",
        )
    }
}

/// Knative's KPA on the concurrency metric:
/// - observed concurrency = requests in flight plus waiting at the replicas (and at the
///   activator while none is ready), sampled each tick (assumed: the tick's
///   instantaneous value stands for Knative's per-second averages);
/// - stable and panic figures = mean concurrency over the stable window (60 s) and the
///   panic window (6 s), each divided by container concurrency × target utilisation,
///   rounded up;
/// - panic starts when the panic figure / ready replicas ≥ 200%; in panic the panic
///   figure is used but never below the current count; panic ends a stable window
///   after it last started or was renewed, when the condition no longer holds;
/// - per evaluation at most ×1000 up and ÷2 down (of the ready replicas).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Kpa {
    pub config: KpaConfig,
    desired: Option<u32>,
    samples: VecDeque<(u64, f64)>,
    panic_since_ms: Option<u64>,
    last_now_ms: u64,
}

impl Kpa {
    pub fn new(config: KpaConfig) -> Result<Kpa, ConfigError> {
        config.validate()?;
        Ok(Kpa {
            config,
            desired: None,
            samples: VecDeque::new(),
            panic_since_ms: None,
            last_now_ms: 0,
        })
    }
}

impl ScalingPolicy for Kpa {
    fn name(&self) -> &'static str {
        "kpa"
    }

    fn period_ms(&self) -> u64 {
        self.config.tick_ms
    }

    fn tick(&mut self, now_ms: u64, signals: &Signals) -> Decision {
        let (now_ms, signals) = begin_tick(&mut self.last_now_ms, now_ms, signals);
        let config = &self.config;
        let (current, min, max) = bounded_current(
            self.desired,
            &signals,
            config.min_replicas,
            config.max_replicas,
        );
        let concurrency = f64::from(signals.in_flight) + f64::from(signals.queued);
        self.samples.push_back((now_ms, concurrency));
        while self
            .samples
            .front()
            .is_some_and(|(at, _)| now_ms.saturating_sub(*at) >= config.stable_window_ms)
        {
            self.samples.pop_front();
        }
        let panic_window_ms = (config.stable_window_ms as f64 * config.panic_window_share) as u64;
        let mean_over = |window_ms: u64| {
            let (sum, n) = self
                .samples
                .iter()
                .filter(|(at, _)| now_ms.saturating_sub(*at) < window_ms.max(1))
                .fold((0.0, 0usize), |(sum, n), (_, value)| (sum + value, n + 1));
            if n == 0 {
                0.0
            } else {
                sum / n as f64
            }
        };
        let per_replica = f64::from(signals.concurrency) * config.target_utilisation;
        let stable = (mean_over(config.stable_window_ms) / per_replica - 1e-9)
            .ceil()
            .max(0.0) as u32;
        let panic = (mean_over(panic_window_ms) / per_replica - 1e-9)
            .ceil()
            .max(0.0) as u32;
        let ready = f64::from(signals.ready.max(1));
        let over_threshold = f64::from(panic) / ready >= config.panic_threshold;
        if over_threshold {
            // Entering, or renewing while still over the threshold.
            self.panic_since_ms = Some(now_ms);
        } else if self
            .panic_since_ms
            .is_some_and(|since| now_ms.saturating_sub(since) >= config.stable_window_ms)
        {
            self.panic_since_ms = None;
        }
        let in_panic = self.panic_since_ms.is_some();
        let mut desired = if in_panic { panic.max(current) } else { stable };
        let up_limit = (config.max_scale_up_rate * ready).ceil() as u32;
        let down_limit = (ready / config.max_scale_down_rate).floor() as u32;
        desired = desired.min(up_limit).max(down_limit).clamp(min, max);
        self.desired = Some(desired);
        Decision {
            desired,
            warm: 0,
            mode: if in_panic { Mode::Panic } else { Mode::Stable },
            admission: Admission::open(),
            forecast_rate_per_s: None,
            reason: format!("stable {stable}, panic {panic}, ready {}", signals.ready),
        }
    }
}

/// A fixed count: what peak provisioning runs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Static {
    pub replicas: u32,
    pub tick_ms: u64,
}

impl Static {
    pub fn new(replicas: u32) -> Static {
        Static {
            replicas,
            tick_ms: 60_000,
        }
    }
}

impl ScalingPolicy for Static {
    fn name(&self) -> &'static str {
        "static"
    }

    fn period_ms(&self) -> u64 {
        self.tick_ms.max(1)
    }

    fn tick(&mut self, _now_ms: u64, _signals: &Signals) -> Decision {
        Decision {
            desired: self.replicas,
            warm: 0,
            mode: Mode::Stable,
            admission: Admission::open(),
            forecast_rate_per_s: None,
            reason: "static".into(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn signals(
        in_flight: u32,
        queued: u32,
        utilisation: f64,
        ready: u32,
        starting: u32,
    ) -> Signals {
        Signals {
            window_ms: 15_000,
            arrivals: 0,
            in_flight,
            queued,
            p99_ms: None,
            utilisation,
            ready,
            starting,
            service_ms: 1_000.0,
            concurrency: 4,
            cold_start_ms: None,
            priority: 0,
            ..Signals::default()
        }
    }

    /// (now, signals, expected desired) in order, for one policy.
    fn check(policy: &mut dyn ScalingPolicy, steps: &[(u64, Signals, u32)]) {
        for (now, signals, expected) in steps {
            let decision = policy.tick(*now, signals);
            assert_eq!(
                decision.desired, *expected,
                "at {now} ms: {}",
                decision.reason
            );
        }
    }

    #[test]
    fn hpa_follows_its_rules() {
        let mut hpa = Hpa::new(HpaConfig::default()).expect("valid");
        check(
            &mut hpa,
            &[
                // 4 ready at 75%: within 10% of 70% → hold.
                (15_000, signals(12, 0, 0.75, 4, 0), 4),
                // At 100% with 40 waiting: outstanding 52 / 4 per pod = 13 pods, but
                // at most max(×2, +4) = 8 per sync.
                (30_000, signals(12, 40, 1.0, 4, 0), 8),
                // Between syncs nothing changes.
                (35_000, signals(0, 0, 0.0, 8, 0), 8),
                // Idle: the recommendation is 1, but the 300 s window holds 8.
                (45_000, signals(0, 0, 0.0, 8, 0), 8),
                (330_000, signals(0, 0, 0.0, 8, 0), 8),
                // 300 s after the last high recommendation: down to 1.
                (346_000, signals(0, 0, 0.0, 8, 0), 1),
            ],
        );
    }

    #[test]
    fn kpa_panics_on_a_burst_and_does_not_scale_down_in_panic() {
        let mut kpa = Kpa::new(KpaConfig::default()).expect("valid");
        let mut at = 0;
        let mut tick = |kpa: &mut Kpa, in_flight: u32, queued: u32, ready: u32| {
            at += 2_000;
            kpa.tick(at, &signals(in_flight, queued, 0.5, ready, 0))
        };
        // Steady 2.8 per replica on 2 replicas: stable.
        for _ in 0..30 {
            let decision = tick(&mut kpa, 5, 0, 2);
            assert_eq!((decision.desired, decision.mode), (2, Mode::Stable));
        }
        // A burst: 40 outstanding on 2 ready. Panic window mean over 6 s (3 samples)
        // (40 + 5 + 5) / 3 = 16.7 → 6 replicas = 3× ready → panic.
        let decision = tick(&mut kpa, 40, 0, 2);
        assert_eq!((decision.desired, decision.mode), (6, Mode::Panic));
        // Quiet again: still panic, never below 6, until a stable window has passed.
        for _ in 0..29 {
            let decision = tick(&mut kpa, 0, 0, 6);
            assert_eq!((decision.desired, decision.mode), (6, Mode::Panic));
        }
        let decision = tick(&mut kpa, 0, 0, 6);
        assert_eq!(decision.mode, Mode::Stable);
        // At most halving per evaluation.
        assert_eq!(decision.desired, 3);
    }

    #[test]
    fn bad_configs_are_refused() {
        assert!(Hpa::new(HpaConfig {
            min_replicas: 5,
            max_replicas: 2,
            ..HpaConfig::default()
        })
        .is_err());
        assert!(Kpa::new(KpaConfig {
            panic_threshold: 0.5,
            ..KpaConfig::default()
        })
        .is_err());
    }
}
