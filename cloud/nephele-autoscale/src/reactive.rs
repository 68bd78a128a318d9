//! The product's reactive rules (`../shared/docs/AUTOSCALING.md`, "the seed's
//! pseudocode"), with the predictive floor and the warm pool folded in as inputs.
//!
//! Needs are in replicas at the target utilisation: `stable` from the mean arrival rate
//! over the stable window, `backlog` from the requests in flight and waiting now (with
//! `backlog_within_cold_start`, the replicas that clear them within one cold start:
//! when requests are short next to a cold start, as LLM completions are next to a
//! model load, replicas started now would come after the backlog has drained). `extra` is the warm pool, `floor` the pre-warm
//! floor of the forecast. Rules, first match wins:
//!
//! | # | condition                                                     | total replicas                           |
//! |---|---------------------------------------------------------------|------------------------------------------|
//! | 1 | last tick's demand ≥ panic threshold × ready capacity, or in panic (less than a stable window since that was last true) | panic: max(current, stable + extra, backlog); never down |
//! | 2 | p99 > target while requests wait or the replicas are busy (utilisation ≥ target), or queued > threshold × ready | out: max(current + 1, stable + extra, backlog) |
//! | 3 | max(stable, floor) + extra above current × (1 + tolerance)    | out: to it (demand / pre-warm)           |
//! | 4 | utilisation < low, queue empty, a cooldown since any change, and the highest recommendation of the scale-down stabilisation window below current × (1 − tolerance) | in: to that recommendation, at most current / max ratio at once |
//! | 5 | otherwise                                                     | hold                                     |
//!
//! A recommendation is max(stable, backlog, floor) + extra, recorded every tick. Only
//! rule 4 lowers the count, so neither a forecast nor a shrinking warm pool removes a
//! replica by itself. Everything is clamped to the bounds.
//!
//! Why these sizes: panic is entered on the last tick's rate (as KPA), but sized on
//! the backlog (requests in flight and waiting at the tick) and the stable rate, not on
//! a 5 s rate × service time: with long requests at a low rate, three requests in one
//! tick would ask for dozens of replicas. A p99 over target counts only while the
//! replicas are still short (something waits, or they are busy), so the latency of a
//! backlog already drained does not add replicas after the fact.

use serde::{Deserialize, Serialize};
use std::collections::VecDeque;

use crate::config::OursConfig;
use crate::predictive::replicas_for_rate;
use crate::{bounded_current, Mode, Signals};

/// What the caller adds to the signals: the estimates and the predictive parts.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Plan {
    /// Service time to size with (measured, or the default).
    pub service_ms: f64,
    /// Requests one replica carries at once within target: the learned capacity
    /// ([`crate::capacity`]) × the service time, or the declared slots.
    pub concurrency: f64,
    /// Pre-warm floor from the forecast (0: none).
    pub floor: u32,
    /// Warm replicas to keep on top of the need.
    pub extra: u32,
    /// Cold start to size the backlog with (measured, or the default).
    pub cold_start_ms: f64,
}

/// The rules' answer.
#[derive(Debug, Clone, PartialEq)]
pub struct Outcome {
    pub total: u32,
    /// Of `total`, the replicas above the current need (the warm pool's share).
    pub warm: u32,
    pub mode: Mode,
    pub rule: Rule,
    pub reason: String,
}

/// Which rule decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Rule {
    Panic,
    Latency,
    Queue,
    Demand,
    Prewarm,
    ScaleIn,
    Hold,
}

/// The rules' memory.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
pub struct ReactiveCore {
    /// The last total decided (`None` before the first tick).
    pub current: Option<u32>,
    last_change_ms: Option<u64>,
    /// When the panic condition was last true.
    last_panic_ms: Option<u64>,
    /// (tick time, arrivals, window) over the stable window.
    demand: VecDeque<(u64, u64, u64)>,
    /// (tick time, recommendation) over the scale-down stabilisation window.
    recommendations: VecDeque<(u64, u32)>,
    /// (tick time, scale-out proposal) over the scale-up stabilisation window.
    up_proposals: VecDeque<(u64, u32)>,
}

impl ReactiveCore {
    /// Mean arrival rate (req/s) over the stable window, this tick included.
    fn stable_rate(&self) -> f64 {
        let (arrivals, window) = self
            .demand
            .iter()
            .fold((0u64, 0u64), |(a, w), (_, arrivals, window)| {
                (a + arrivals, w + window)
            });
        if window == 0 {
            0.0
        } else {
            arrivals as f64 * 1000.0 / window as f64
        }
    }

    pub fn in_panic(&self, now_ms: u64, config: &OursConfig) -> bool {
        self.last_panic_ms
            .is_some_and(|last| now_ms.saturating_sub(last) < config.stable_window_ms)
    }

    /// Applies the rules for the tick at `now_ms` (not earlier than the previous one).
    pub fn step(
        &mut self,
        now_ms: u64,
        signals: &Signals,
        plan: &Plan,
        config: &OursConfig,
    ) -> Outcome {
        let (current, min, max) = bounded_current(
            self.current,
            signals,
            config.min_replicas,
            config.max_replicas,
        );
        let clamp = |value: u32| value.clamp(min, max);
        let concurrency = if plan.concurrency.is_finite() && plan.concurrency > 0.0 {
            plan.concurrency
        } else {
            f64::from(signals.concurrency.max(1))
        };
        let service_ms = plan.service_ms;
        let need =
            |rate: f64| replicas_for_rate(rate, service_ms, concurrency, config.target_utilisation);

        // Demand over the stable window (this tick included) and over the last tick.
        self.demand
            .push_back((now_ms, signals.arrivals, signals.window_ms));
        while self.demand.len() > 1
            && self
                .demand
                .front()
                .is_some_and(|(at, _, _)| now_ms.saturating_sub(*at) >= config.stable_window_ms)
        {
            self.demand.pop_front();
        }
        let short_rate = if signals.window_ms == 0 {
            0.0
        } else {
            signals.arrivals as f64 * 1000.0 / signals.window_ms as f64
        };
        let stable = need(self.stable_rate());
        let outstanding = f64::from(signals.in_flight) + f64::from(signals.queued);
        // The backlog asks for the replicas that clear it within a horizon, in service
        // times: one service time, or with `backlog_within_target` the latency target
        // (every request waiting now may still be answered within it), and with
        // `backlog_within_cold_start` at least one cold start (a replica started now
        // serves only after one, so clearing it sooner is up to the replicas there).
        let mut horizon_ms = service_ms;
        if config.backlog_within_target {
            horizon_ms = horizon_ms.max(config.target_p99_ms);
        }
        if config.backlog_within_cold_start {
            horizon_ms = horizon_ms.max(plan.cold_start_ms);
        }
        let drain = if service_ms > 0.0 {
            (horizon_ms / service_ms).max(1.0)
        } else {
            1.0
        };
        let backlog = (outstanding / (concurrency * config.target_utilisation * drain) - 1e-9)
            .ceil()
            .max(0.0) as u32;
        let extra = plan.extra;

        // Rule 1's condition: demand over the last tick at 100% busy ≥ threshold × ready.
        let short_demand = short_rate * service_ms / 1000.0 / concurrency;
        let ready = f64::from(signals.ready);
        let panic_now = short_demand > 0.0
            && short_demand >= config.panic_threshold * ready.max(1.0)
            || signals.ready == 0 && outstanding > 0.0;
        if panic_now {
            self.last_panic_ms = Some(now_ms);
        }
        let in_panic = self.in_panic(now_ms, config);

        let recommendation = stable.max(backlog).max(plan.floor).saturating_add(extra);
        self.recommendations.push_back((now_ms, recommendation));
        while self
            .recommendations
            .front()
            .is_some_and(|(at, _)| now_ms.saturating_sub(*at) > config.scale_down_stabilisation_ms)
        {
            self.recommendations.pop_front();
        }

        let queue_limit = config.queue_per_replica * ready.max(1.0);
        let short_now = signals.queued > 0 || signals.utilisation >= config.target_utilisation;
        let over_latency =
            short_now && signals.p99_ms.is_some_and(|p99| p99 > config.target_p99_ms);
        let over_queue = f64::from(signals.queued) > queue_limit;
        let wanted = stable.max(plan.floor).saturating_add(extra);
        let since = |at: Option<u64>| at.map_or(u64::MAX, |at| now_ms.saturating_sub(at));

        let (mut total, rule, reason) = if in_panic {
            let total = current.max(stable.saturating_add(extra)).max(backlog);
            (
                total,
                Rule::Panic,
                format!(
                    "panic: last tick's demand {short_demand:.1} replicas vs {} ready",
                    signals.ready
                ),
            )
        } else if over_latency || over_queue {
            let total = current
                .saturating_add(1)
                .max(stable.saturating_add(extra))
                .max(backlog);
            if over_latency {
                (
                    total,
                    Rule::Latency,
                    format!(
                        "p99 {:.0} ms over target {:.0} ms",
                        signals.p99_ms.unwrap_or_default(),
                        config.target_p99_ms
                    ),
                )
            } else {
                (
                    total,
                    Rule::Queue,
                    format!("{} queued over {queue_limit:.1}", signals.queued),
                )
            }
        } else if f64::from(wanted) > f64::from(current) * (1.0 + config.tolerance) {
            let rule = if plan.floor > stable {
                Rule::Prewarm
            } else {
                Rule::Demand
            };
            (
                wanted,
                rule,
                format!(
                    "need {wanted} (stable {stable}, forecast {}, warm {extra})",
                    plan.floor
                ),
            )
        } else {
            let highest = self
                .recommendations
                .iter()
                .map(|(_, rec)| *rec)
                .max()
                .unwrap_or(recommendation);
            let step_floor = (f64::from(current) / config.max_scale_down_ratio).ceil() as u32;
            let target = highest.max(step_floor);
            let may_scale_in = signals.utilisation < config.low_utilisation
                && signals.queued == 0
                && since(self.last_change_ms) >= config.cooldown_ms;
            if may_scale_in
                && target < current
                && f64::from(target) < f64::from(current) * (1.0 - config.tolerance)
            {
                (
                    target,
                    Rule::ScaleIn,
                    format!(
                        "utilisation {:.2} under {:.2}, queue empty: to {target}",
                        signals.utilisation, config.low_utilisation
                    ),
                )
            } else {
                (current, Rule::Hold, "hold".to_string())
            }
        };

        // Scale-up stabilisation: the lowest proposal of the window.
        if total > current && config.scale_up_stabilisation_ms > 0 {
            self.up_proposals.push_back((now_ms, total));
            while self.up_proposals.front().is_some_and(|(at, _)| {
                now_ms.saturating_sub(*at) > config.scale_up_stabilisation_ms
            }) {
                self.up_proposals.pop_front();
            }
            if let Some(lowest) = self.up_proposals.iter().map(|(_, p)| *p).min() {
                total = lowest.max(current);
            }
        }
        let total = clamp(total);
        if total != current {
            self.last_change_ms = Some(now_ms);
        }
        self.current = Some(total);
        let need_now = stable.max(backlog).max(plan.floor);
        Outcome {
            total,
            warm: total.saturating_sub(need_now).min(extra),
            mode: if in_panic { Mode::Panic } else { Mode::Stable },
            rule,
            reason,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Signals of a 5 s tick: `rate` req/s offered, `ready` replicas, service 1 s,
    /// concurrency 1.
    fn signals(
        rate: f64,
        ready: u32,
        queued: u32,
        utilisation: f64,
        p99_ms: Option<f64>,
    ) -> Signals {
        Signals {
            window_ms: 5_000,
            arrivals: (rate * 5.0) as u64,
            in_flight: ready.min((rate) as u32),
            queued,
            p99_ms,
            utilisation,
            ready,
            starting: 0,
            service_ms: 1_000.0,
            concurrency: 1,
            cold_start_ms: Some(30_000.0),
            priority: 0,
            ..Signals::default()
        }
    }

    /// Runs the ticks (one every 5 s from t = 5 s) and checks the totals and rules.
    fn check(config: &OursConfig, start: u32, ticks: &[(Signals, u32, Rule)]) {
        let mut core = ReactiveCore {
            current: Some(start),
            ..ReactiveCore::default()
        };
        let plan = Plan {
            service_ms: 1_000.0,
            concurrency: 1.0,
            floor: 0,
            extra: 0,
            cold_start_ms: 30_000.0,
        };
        for (idx, (signals, expected, rule)) in ticks.iter().enumerate() {
            let now = 5_000 * (idx as u64 + 1);
            let outcome = core.step(now, signals, &plan, config);
            assert_eq!(
                (outcome.total, outcome.rule),
                (*expected, *rule),
                "tick {idx} at {now} ms: {}",
                outcome.reason
            );
        }
    }

    fn config() -> OursConfig {
        OursConfig {
            cooldown_ms: 20_000,
            scale_down_stabilisation_ms: 30_000,
            stable_window_ms: 20_000,
            backlog_within_cold_start: false,
            backlog_within_target: false,
            ..OursConfig::default()
        }
    }

    #[test]
    fn a_backlog_may_take_its_latency_target_to_clear() {
        // 1 s requests, a 2 s target (the default): 5 outstanding on 3 ready replicas
        // are answered in time by ceil(5 / (0.7 × 2)) = 4 replicas, not the
        // ceil(5 / 0.7) = 8 that would start them all at once.
        let config = OursConfig {
            backlog_within_target: true,
            ..config()
        };
        check(
            &config,
            2,
            &[(signals(1.0, 3, 4, 0.9, Some(1_000.0)), 4, Rule::Queue)],
        );
    }

    #[test]
    fn panic_enters_on_a_burst_and_leaves_after_a_calm_stable_window() {
        // 10 ready at 1 req/s each; a burst of 30 req/s (3× capacity) → panic, sized on
        // the burst at 70%: ceil(30 / 0.7) = 43. No scale-in for a stable window (20 s)
        // after the burst, nor for the scale-down window (30 s) after the scale-out.
        let calm = || signals(1.0, 43, 0, 0.05, Some(900.0));
        check(
            &config(),
            10,
            &[
                (signals(30.0, 10, 0, 1.0, None), 43, Rule::Panic),
                (calm(), 43, Rule::Panic),
                (calm(), 43, Rule::Panic),
                (calm(), 43, Rule::Panic),
                (calm(), 43, Rule::Hold),
                (calm(), 43, Rule::Hold),
                // 30 s after: the window still holds the burst's recommendation.
                (calm(), 43, Rule::Hold),
                // 35 s after: the highest recommendation left is the stable mean of the
                // tick after the burst, (30 + 1) / 2 req/s → 23.
                (calm(), 23, Rule::ScaleIn),
            ],
        );
    }

    #[test]
    fn out_on_latency_or_queue_and_in_only_after_the_cooldown() {
        let quiet = || signals(0.5, 8, 0, 0.1, Some(1_000.0));
        check(
            &config(),
            2,
            &[
                (signals(1.0, 2, 0, 0.8, Some(2_500.0)), 3, Rule::Latency),
                // A p99 over target with nothing waiting and idle slots: the backlog
                // that caused it is gone, hold.
                (signals(1.0, 3, 0, 0.5, Some(2_500.0)), 3, Rule::Hold),
                // 4 queued over 1 per ready replica: out to the backlog's need,
                // ceil((1 in flight + 4) / 0.7) = 8.
                (signals(1.0, 3, 4, 0.9, Some(1_000.0)), 8, Rule::Queue),
                (quiet(), 8, Rule::Hold),
                (quiet(), 8, Rule::Hold),
                (quiet(), 8, Rule::Hold),
                (quiet(), 8, Rule::Hold),
                (quiet(), 8, Rule::Hold),
                // 30 s after the scale-out the backlog's 8 is still in the window.
                (quiet(), 8, Rule::Hold),
                // Then in, at most halving.
                (quiet(), 4, Rule::ScaleIn),
                // A queue blocks scale-in (and 1 queued is not over 4 ready).
                (signals(0.5, 4, 1, 0.1, Some(1_000.0)), 4, Rule::Hold),
            ],
        );
    }

    #[test]
    fn a_backlog_that_drains_within_a_cold_start_asks_for_no_replica_of_its_own() {
        // 1 s requests, 30 s cold starts: 3 ready replicas clear 5 requests long before
        // a new one would be ready. The queue rule still adds one replica, but the
        // backlog's own need is ceil(5 / (0.7 × 30)) = 1, not ceil(5 / 0.7) = 8.
        let config = OursConfig {
            backlog_within_cold_start: true,
            ..config()
        };
        check(
            &config,
            2,
            &[(signals(1.0, 3, 4, 0.9, Some(1_000.0)), 3, Rule::Queue)],
        );
    }

    #[test]
    fn the_tolerance_band_holds_small_changes() {
        let config = OursConfig {
            tolerance: 0.1,
            ..config()
        };
        // 20 ready; a stable need of ceil(14.7 / 0.7) = 21 is within 10%: hold.
        check(
            &config,
            20,
            &[(signals(14.7, 20, 0, 0.7, Some(900.0)), 20, Rule::Hold)],
        );
        // ceil(16.1 / 0.7) = 23 is outside: out to 23.
        check(
            &config,
            20,
            &[(signals(16.1, 20, 0, 0.8, Some(900.0)), 23, Rule::Demand)],
        );
    }
}
