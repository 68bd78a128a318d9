//! What one replica carries within the latency target, learned while the deployment
//! runs, instead of an offline load test or a per-deployment tuning grid.
//!
//! Every tick, the answers of the window (how many, how many within their target) are
//! filed under the load each ready replica was offered while they were served:
//! arrivals per ready replica per second over the last
//! [`CapacityConfig::load_window_services`] service times, at least the tick and at
//! least the window's p99 latency (short enough that a burst's misses are filed under
//! the burst's load, long enough to hold the arrivals of the requests answered). A
//! window with answers but no arrival in that span says nothing about a load and is
//! not filed. The load is offered, not answered: under
//! overload the answers lag the arrivals, and sizes are taken on arrival rates. Loads
//! are kept in levels 25% apart. A level with at least
//! [`CapacityConfig::min_answers`] answers is *good* when at least
//! [`CapacityConfig::goal`] of them were within target, and *failing* otherwise. The
//! estimate is:
//!
//! - the top of the highest good level below the lowest failing level, and one level
//!   higher while no failing level is known just above it (a probe: loads nobody has
//!   tried yet are tried one level at a time, and the level's answers settle it);
//! - never above the bottom of the lowest failing level (a load that missed the goal
//!   is not asked of a replica again while it is remembered);
//! - the prior (the slot count over the measured service time, what the replicas
//!   declare) while no level has enough answers, within the same cap;
//! - never below [`CapacityConfig::min_share_of_prior`] of the prior (a guard against
//!   evidence the learner misreads: it cannot make a deployment ask for thousands of
//!   replicas, or shed everything);
//! - never higher after a tick in which an answer missed its target than before it
//!   (a miss never buys capacity, even when it lands in a level still above the goal).
//!
//! Counts decay with a half-life, so a deployment whose model, hardware or request mix
//! changes relearns: a failing level is forgotten and probed again, a good one loses
//! its weight.
//!
//! Pure: no clock (ticks give `now_ms`), no randomness; serde state, so a region
//! persists it with the rest of the scaler.

use std::collections::VecDeque;

use serde::{Deserialize, Serialize};

use crate::config::{check_duration, check_range, ConfigError};
use crate::Signals;

/// How load levels are spaced: each 25% above the one below.
const LEVEL_RATIO: f64 = 1.25;
/// The bottom of level 0, requests per replica per second (one a day is ~1.2e-5).
const LEVEL_BASE: f64 = 1e-6;
/// Levels above this are one level (loads beyond 1e-6 × 1.25^160 ≈ 3e9 /s).
const TOP_LEVEL: i32 = 160;

/// The capacity learner's settings.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct CapacityConfig {
    /// Off: size with the prior only (the slot count over the service time).
    pub enabled: bool,
    /// Share of a level's answers that must be within target for it to be good [0.99].
    pub goal: f64,
    /// Answers a level needs before its share counts [300: at a 99% goal, three misses
    /// in a level are not yet a verdict].
    pub min_answers: f64,
    /// The load a tick's answers are filed under is the arrivals per ready replica per
    /// second over this many service times, and at least the tick [10: of 2, 4, 6, 8,
    /// 10, 12, 16, 23, 46 and 92, the middle of the plateau (8–12) where both shared
    /// traces kept ≥ 99% within target on their tune halves at the lowest GPU-hours].
    pub load_window_services: f64,
    /// Counts halve over this long [6 h].
    pub half_life_ms: u64,
    /// Try one level above the highest good one while no failing level is known there
    /// [true].
    pub probe: bool,
    /// The estimate never falls below this share of the prior [0.05].
    pub min_share_of_prior: f64,
}

impl Default for CapacityConfig {
    fn default() -> Self {
        CapacityConfig {
            enabled: true,
            goal: 0.99,
            min_answers: 300.0,
            load_window_services: 10.0,
            half_life_ms: 6 * 3_600_000,
            probe: true,
            min_share_of_prior: 0.05,
        }
    }
}

impl CapacityConfig {
    pub fn validate(&self) -> Result<(), ConfigError> {
        check_range("capacity.goal", self.goal, 0.5, 1.0, "in 0.5..=1")?;
        check_range(
            "capacity.min_answers",
            self.min_answers,
            1.0,
            1e9,
            "at least 1",
        )?;
        check_range(
            "capacity.load_window_services",
            self.load_window_services,
            0.0,
            1e6,
            "in 0..=1e6",
        )?;
        check_duration("capacity.half_life_ms", self.half_life_ms)?;
        check_range(
            "capacity.min_share_of_prior",
            self.min_share_of_prior,
            0.0,
            1.0,
            "in 0..=1",
        )?;
        Ok(())
    }
}

/// Answers filed under one load level (decayed counts).
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize)]
pub struct Level {
    pub answered: f64,
    pub within: f64,
}

/// The learner's state.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct Capacity {
    /// (level, counts), sorted by level (a list, not a map: JSON object keys are
    /// strings, which a policy nested in a tagged enum would not read back as numbers).
    levels: Vec<(i32, Level)>,
    /// (tick time, arrivals, ready replica-ms, ready) over the load window.
    recent: VecDeque<(u64, u64, f64, u32)>,
    /// The estimate after the last tick (requests per replica per second).
    estimate: Option<f64>,
    /// Whether it came from the levels (else the prior, perhaps capped).
    #[serde(default)]
    from_levels: bool,
    last_ms: Option<u64>,
}

/// Where a load falls.
pub fn level_of(load_per_s: f64) -> i32 {
    if load_per_s.is_nan() || load_per_s <= LEVEL_BASE {
        return 0;
    }
    let level = ((load_per_s / LEVEL_BASE).ln() / LEVEL_RATIO.ln()).floor();
    (level as i32).clamp(0, TOP_LEVEL)
}

/// The bottom of a level (requests per replica per second).
pub fn level_floor(level: i32) -> f64 {
    LEVEL_BASE * LEVEL_RATIO.powi(level)
}

impl Capacity {
    /// The estimate (requests per replica per second kept within target), or `prior` (what
    /// the replicas declare: slots over service time) while nothing is learned.
    pub fn estimate(&self, prior_per_s: f64) -> f64 {
        self.estimate.unwrap_or(prior_per_s)
    }

    /// The estimate after the last tick, if any tick was observed.
    pub fn current(&self) -> Option<f64> {
        self.estimate
    }

    /// Whether the estimate comes from what the replicas were measured to carry within
    /// target (so it needs no utilisation headroom on top), not from the prior.
    pub fn is_learned(&self) -> bool {
        self.from_levels
    }

    /// The levels learned so far (level, bottom load, answers, within), for a `why`
    /// view and the simulator's report.
    pub fn levels(&self) -> Vec<(i32, f64, Level)> {
        self.levels
            .iter()
            .map(|&(level, counts)| (level, level_floor(level), counts))
            .collect()
    }

    /// Files the tick's answers and updates the estimate; returns it.
    /// `service_ms` is the measured service time (it sets the load window).
    pub fn observe(
        &mut self,
        now_ms: u64,
        signals: &Signals,
        prior_per_s: f64,
        service_ms: f64,
        config: &CapacityConfig,
    ) -> f64 {
        let by_service = if service_ms.is_finite() && service_ms > 0.0 {
            config.load_window_services * service_ms
        } else {
            0.0
        };
        let load_window_ms = by_service.max(signals.p99_ms.unwrap_or(0.0)).min(1e12) as u64;
        let prior = if prior_per_s.is_finite() && prior_per_s > 0.0 {
            prior_per_s
        } else {
            f64::MAX
        };
        let before = self.estimate(prior);
        if let Some(last) = self.last_ms {
            let elapsed = now_ms.saturating_sub(last) as f64;
            let keep = 0.5f64.powf(elapsed / config.half_life_ms.max(1) as f64);
            if keep < 1.0 {
                for (_, level) in &mut self.levels {
                    level.answered *= keep;
                    level.within *= keep;
                }
                self.levels.retain(|(_, level)| level.answered >= 1e-3);
            }
        }
        self.last_ms = Some(now_ms);

        self.recent.push_back((
            now_ms,
            signals.arrivals,
            f64::from(signals.ready) * signals.window_ms as f64,
            signals.ready,
        ));
        while self.recent.len() > 1
            && self
                .recent
                .front()
                .is_some_and(|(at, ..)| now_ms.saturating_sub(*at) >= load_window_ms)
        {
            self.recent.pop_front();
        }
        let within = signals.within_target.min(signals.answered);
        if signals.answered > 0 {
            let (arrivals, replica_ms) = self
                .recent
                .iter()
                .fold((0u64, 0.0), |(a, r), (_, arrivals, replica_ms, _)| {
                    (a + arrivals, r + replica_ms)
                });
            let (fewest, most) = self
                .recent
                .iter()
                .fold((u32::MAX, 0), |(low, high), &(.., ready)| {
                    (low.min(ready), high.max(ready))
                });
            // Answers while no replica was ready (the first after a cold start) are no
            // evidence about a replica's load; nor are those of a window in which the
            // ready replicas changed by more than a level (replicas that just came up
            // lower the load while the answers of the overload before them still leave).
            let steady = fewest > 0 && f64::from(most) <= f64::from(fewest) * LEVEL_RATIO;
            if replica_ms > 0.0 && arrivals > 0 && steady {
                let load = arrivals as f64 * 1000.0 / replica_ms;
                let index = level_of(load);
                let at = match self.levels.binary_search_by_key(&index, |(at, _)| *at) {
                    Ok(at) => at,
                    Err(at) => {
                        self.levels.insert(at, (index, Level::default()));
                        at
                    }
                };
                let level = &mut self.levels[at].1;
                level.answered += signals.answered as f64;
                level.within += within as f64;
            }
        }

        let (mut estimate, from_levels) = self.learned(prior, config);
        if prior < f64::MAX {
            estimate = estimate.max(prior * config.min_share_of_prior);
        }
        if within < signals.answered && estimate > before {
            estimate = before;
        } else {
            self.from_levels = from_levels;
        }
        self.estimate = Some(estimate);
        estimate
    }

    /// The estimate the levels give, from `prior` while none has enough answers, and
    /// whether the levels gave it.
    fn learned(&self, prior: f64, config: &CapacityConfig) -> (f64, bool) {
        let fitted = monotone_shares(&self.levels);
        let judged = |weight: f64| weight >= config.min_answers;
        let lowest_failing = fitted
            .iter()
            .find(|(_, share, weight)| judged(*weight) && *share < config.goal)
            .map(|&(index, _, _)| index);
        let highest_good = fitted
            .iter()
            .rev()
            .filter(|(index, _, _)| lowest_failing.is_none_or(|fail| *index < fail))
            .find(|(_, share, weight)| judged(*weight) && *share >= config.goal)
            .map(|&(index, _, _)| index);
        let cap = lowest_failing.map_or(f64::MAX, level_floor);
        match highest_good {
            Some(index) => {
                // Probe one level up while that level has not been tried enough itself.
                let next_tried = self
                    .levels
                    .iter()
                    .find(|(at, _)| *at == index + 1)
                    .is_some_and(|(_, level)| judged(level.answered));
                let probe = config.probe && !next_tried;
                let top = level_floor(if probe { index + 2 } else { index + 1 }).min(cap);
                if top >= prior.min(cap) {
                    (top, true)
                } else {
                    (prior.min(cap), false)
                }
            }
            None => (prior.min(cap), lowest_failing.is_some()),
        }
    }
}

/// Each level's share within target, fitted to never rise with the load (isotonic
/// regression by pooling adjacent violators, weighted by answers): a few misses at a
/// low load, next to a good higher one, are noise, not a limit. Returns (level, fitted
/// share, weight of the pool it fell in), in level order.
pub fn monotone_shares(levels: &[(i32, Level)]) -> Vec<(i32, f64, f64)> {
    // (first index into levels, one past the last, weight, within).
    let mut pools: Vec<(usize, usize, f64, f64)> = Vec::new();
    for (index, (_, level)) in levels.iter().enumerate() {
        if level.answered.is_nan() || level.answered <= 0.0 {
            continue;
        }
        pools.push((
            index,
            index + 1,
            level.answered,
            level.within.min(level.answered),
        ));
        while pools.len() >= 2 {
            let last = pools[pools.len() - 1];
            let before = pools[pools.len() - 2];
            // Shares must not rise with the load: merge while the later pool's is higher.
            if last.3 * before.2 > before.3 * last.2 {
                pools.pop();
                let merged = pools
                    .last_mut()
                    .unwrap_or_else(|| unreachable!("two pools"));
                merged.1 = last.1;
                merged.2 += last.2;
                merged.3 += last.3;
            } else {
                break;
            }
        }
    }
    let mut fitted = Vec::with_capacity(levels.len());
    for (first, end, weight, within) in pools {
        for (level, counts) in &levels[first..end] {
            if counts.answered > 0.0 {
                fitted.push((*level, within / weight, weight));
            }
        }
    }
    fitted
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn tick(answered: u64, within: u64, ready: u32) -> Signals {
        Signals {
            window_ms: 5_000,
            arrivals: answered,
            answered,
            within_target: within,
            ready,
            ..Signals::default()
        }
    }

    #[test]
    fn levels_are_a_quarter_apart_and_never_out_of_range() {
        assert_eq!(level_of(0.0), 0);
        assert_eq!(level_of(f64::NAN), 0);
        assert_eq!(level_of(-3.0), 0);
        assert_eq!(level_of(f64::INFINITY), TOP_LEVEL);
        for load in [0.01, 0.5, 1.0, 7.3, 250.0] {
            let level = level_of(load);
            assert!(level_floor(level) <= load * (1.0 + 1e-12));
            assert!(load < level_floor(level + 1) * (1.0 + 1e-12));
        }
    }

    #[test]
    fn the_prior_holds_until_a_level_has_enough_answers() {
        let mut capacity = Capacity::default();
        let config = CapacityConfig::default();
        // 1 answer per 5 s on one replica: 0.2 /s, 29 answers: not judged yet.
        for n in 1..=29u64 {
            assert_eq!(
                capacity.observe(n * 5_000, &tick(1, 1, 1), 0.05, 1_000.0, &config),
                0.05
            );
        }
    }

    #[test]
    fn a_good_load_raises_the_estimate_one_level_at_a_time_and_a_failing_one_caps_it() {
        let config = CapacityConfig::default();
        let mut capacity = Capacity::default();
        let mut now = 0;
        // 2 answers a second per replica, all within: good; the estimate goes one level
        // above that level's top.
        for _ in 0..40 {
            now += 5_000;
            capacity.observe(now, &tick(40, 40, 4), 0.5, 1_000.0, &config);
        }
        let good = capacity.estimate(0.5);
        assert!(
            good > 2.0 && good <= 2.0 * LEVEL_RATIO.powi(2) + 1e-9,
            "{good}"
        );
        // At 4 /s per replica a tenth miss: failing; the estimate falls under 4 and
        // never goes back above that level while it is remembered.
        let cap = level_floor(level_of(4.0));
        for _ in 0..40 {
            now += 5_000;
            capacity.observe(now, &tick(80, 72, 4), 0.5, 1_000.0, &config);
            assert!(capacity.estimate(0.5) <= good + 1e-9, "a miss raised it");
        }
        assert!(capacity.estimate(0.5) <= cap + 1e-9);
        for _ in 0..40 {
            now += 5_000;
            capacity.observe(now, &tick(40, 40, 4), 0.5, 1_000.0, &config);
            assert!(capacity.estimate(0.5) <= cap + 1e-9);
            assert!(capacity.is_learned());
        }
    }

    #[test]
    fn a_failing_level_is_forgotten_after_some_half_lives_and_probed_again() {
        let config = CapacityConfig {
            half_life_ms: 60_000,
            ..CapacityConfig::default()
        };
        let mut capacity = Capacity::default();
        let mut now = 0;
        for _ in 0..20 {
            now += 5_000;
            capacity.observe(now, &tick(80, 40, 4), 10.0, 1_000.0, &config);
        }
        let low = capacity.estimate(10.0);
        assert!(low <= 4.0, "{low}");
        // An hour of good answers at a lower load: the failing level decays away.
        for _ in 0..720 {
            now += 5_000;
            capacity.observe(now, &tick(20, 20, 4), 10.0, 1_000.0, &config);
        }
        assert!(capacity.estimate(10.0) > low, "{}", capacity.estimate(10.0));
    }

    #[test]
    fn answers_with_no_ready_replica_are_not_filed() {
        let config = CapacityConfig::default();
        let mut capacity = Capacity::default();
        for n in 1..=100u64 {
            capacity.observe(n * 5_000, &tick(10, 0, 0), 1.0, 1_000.0, &config);
        }
        assert!(capacity.levels().is_empty());
        // The misses still never raise it.
        assert!(capacity.estimate(1.0) <= 1.0);
    }

    #[test]
    fn state_round_trips_through_json() {
        let config = CapacityConfig::default();
        let mut first = Capacity::default();
        for n in 1..=50u64 {
            first.observe(n * 5_000, &tick(n % 7, n % 7, 2), 0.3, 1_000.0, &config);
        }
        let mut resumed: Capacity =
            serde_json::from_str(&serde_json::to_string(&first).expect("serialises"))
                .expect("parses");
        for n in 51..=80u64 {
            let signals = tick(n % 5, n % 4, 3);
            assert_eq!(
                first.observe(n * 5_000, &signals, 0.3, 1_000.0, &config),
                resumed.observe(n * 5_000, &signals, 0.3, 1_000.0, &config)
            );
        }
    }

    #[test]
    fn a_few_misses_at_a_low_load_are_pooled_with_a_good_higher_one() {
        let level = |answered: f64, within: f64| Level { answered, within };
        let fitted = monotone_shares(&[
            (10, level(100.0, 95.0)),
            (11, level(900.0, 900.0)),
            (12, level(100.0, 50.0)),
        ]);
        // Levels 10 and 11 pool (995 of 1,000); 12 stays on its own, lower.
        assert_eq!(fitted.len(), 3);
        assert!((fitted[0].1 - 0.995).abs() < 1e-12 && fitted[0].2 == 1_000.0);
        assert_eq!(fitted[0].1, fitted[1].1);
        assert_eq!((fitted[2].1, fitted[2].2), (0.5, 100.0));
        assert!(monotone_shares(&[]).is_empty());
    }

    proptest! {
        /// The fit never rises with the load and keeps the total of the answers.
        #[test]
        fn the_fitted_shares_never_rise_with_the_load(
            counts in proptest::collection::vec((0.0f64..500.0, 0.0f64..1.0), 0..30),
        ) {
            let levels: Vec<(i32, Level)> = counts
                .iter()
                .enumerate()
                .map(|(index, &(answered, share))| (index as i32, Level { answered, within: answered * share }))
                .collect();
            let fitted = monotone_shares(&levels);
            for pair in fitted.windows(2) {
                prop_assert!(pair[1].1 <= pair[0].1 + 1e-9, "{:?}", pair);
            }
            for (_, share, _) in &fitted {
                prop_assert!((0.0..=1.0 + 1e-12).contains(share));
            }
        }

        /// The rule: a tick whose answers missed the target never raises the
        /// estimate, whatever came before; and the estimate is always a finite,
        /// positive rate.
        #[test]
        fn a_tick_with_a_miss_never_raises_the_estimate(
            ticks in proptest::collection::vec((0u64..200, 0u64..200, 0u32..20, 1u64..20_000), 1..200),
            prior in 0.001f64..100.0,
        ) {
            let config = CapacityConfig::default();
            let mut capacity = Capacity::default();
            let mut now = 0u64;
            for (answered, within, ready, gap) in ticks {
                now += gap;
                let before = capacity.estimate(prior);
                let signals = Signals { window_ms: gap, answered, within_target: within, ready, ..Signals::default() };
                let after = capacity.observe(now, &signals, prior, 1_000.0, &config);
                prop_assert!(after.is_finite() && after > 0.0, "{after}");
                if within.min(answered) < answered {
                    prop_assert!(after <= before, "{before} -> {after} on a tick with a miss");
                }
            }
        }
    }
}
