//! Adaptive dynamic batching: how many requests to run together and how long to wait
//! for them, from the arrival rate and the measured service time per batch size.
//!
//! The async queue that carries requests lives in the agent; this module holds its
//! decisions: [`ArrivalEstimator`] (the arrival rate), [`BatchController`] (the
//! setting for that rate) and [`BatchQueue`] (a bounded FIFO that says when a batch is
//! due). All three take time as `now_us` arguments.
//!
//! [`BatchController::choose`], for arrival rate λ and service time `s(b)` of a batch of
//! `b` (utilisation `ρ(b) = λ · s(b) / b`):
//!
//! | step | rule                                                                           |
//! |------|--------------------------------------------------------------------------------|
//! | 1    | candidates: the measured sizes whose `s(b)` ≤ SLO, and always `b = 1`          |
//! | 2    | `max_batch` = the smallest candidate with `ρ(b)` ≤ target utilisation (0.8)    |
//! | 3    | if none keeps up: the candidate with the highest `b / s(b)` (ties: smaller `b`) |
//! | 4    | `max_batch = 1` → window 0: dispatch each request at once                      |
//! | 5    | else window = `(b − 1) / λ` (time for the rest of the batch to arrive after    |
//! |      | the first), clamped to [1 ms, 50 ms], then capped at `SLO − s(b)` (≥ 0)        |
//!
//! Only measured sizes are chosen (no interpolation): a batch size nobody measured is
//! a guess about the hardware. Batch 1 is always possible; when the profile lacks it,
//! `s(1)` is taken as the service time of the smallest measured size, an upper bound
//! since a smaller batch is not slower. The utilisation target is the stand-in for the
//! p99 SLO: queueing delay grows without bound as ρ → 1, so keeping ρ ≤ 0.8 keeps the
//! tail short without modelling its distribution.

use std::collections::VecDeque;

use serde::{Deserialize, Serialize};

/// Default time constant of [`ArrivalEstimator`]: one second.
pub const DEFAULT_ARRIVAL_TIME_CONSTANT_US: u64 = 1_000_000;

/// Estimates the arrival rate as an exponentially weighted count (sans-IO).
///
/// Each arrival adds 1 to a count that decays by `exp(−Δt / τ)`; the rate is
/// `count / τ`. For a steady arrival rate λ the count settles at `λ · τ`, so the rate
/// reads λ; after a change it moves 63 % of the way in τ. The estimate starts at 0 and
/// needs about τ to warm up. When nothing arrives the rate decays towards 0.
/// Times are expected not to go backwards; if one does, no time is taken to pass.
#[derive(Debug, Clone, PartialEq)]
pub struct ArrivalEstimator {
    time_constant_us: u64,
    /// The decayed count, as of `last_us`.
    count: f64,
    last_us: Option<u64>,
}

impl ArrivalEstimator {
    /// An estimator with time constant τ (0 is taken as 1 µs).
    pub fn new(time_constant_us: u64) -> Self {
        ArrivalEstimator {
            time_constant_us: time_constant_us.max(1),
            count: 0.0,
            last_us: None,
        }
    }

    /// Records one arrival at `now_us`.
    pub fn observe(&mut self, now_us: u64) {
        self.count = self.count_at(now_us) + 1.0;
        self.last_us = Some(self.last_us.map_or(now_us, |last_us| last_us.max(now_us)));
    }

    /// The arrival rate in requests per second, as of `now_us`.
    pub fn rate(&self, now_us: u64) -> f64 {
        self.count_at(now_us) / (self.time_constant_us as f64 / 1e6)
    }

    fn count_at(&self, now_us: u64) -> f64 {
        match self.last_us {
            None => 0.0,
            Some(last_us) => {
                let elapsed_us = now_us.saturating_sub(last_us) as f64;
                self.count * (-elapsed_us / self.time_constant_us as f64).exp()
            }
        }
    }
}

impl Default for ArrivalEstimator {
    fn default() -> Self {
        ArrivalEstimator::new(DEFAULT_ARRIVAL_TIME_CONSTANT_US)
    }
}

/// How a queue batches: at most `max_batch` requests, waiting at most `window_us` for
/// the oldest one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct BatchSetting {
    /// The most requests run together (0 is treated as 1).
    pub max_batch: usize,
    /// How long the oldest queued request may wait for the batch to fill; 0 dispatches
    /// at once.
    pub window_us: u64,
}

impl BatchSetting {
    /// No batching: each request on its own, at once.
    pub const UNBATCHED: BatchSetting = BatchSetting {
        max_batch: 1,
        window_us: 0,
    };
}

/// Chooses a [`BatchSetting`] for the current arrival rate (see the module table).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct BatchController {
    /// Highest utilisation a batch size may run at to count as keeping up; a value
    /// outside (0, 1] or NaN is replaced by 0.8.
    pub target_utilisation: f64,
    /// Shortest window when batching.
    pub min_window_us: u64,
    /// Longest window when batching (wins over `min_window_us` if smaller).
    pub max_window_us: u64,
}

impl Default for BatchController {
    /// Target utilisation 0.8, window between 1 ms and 50 ms.
    fn default() -> Self {
        BatchController {
            target_utilisation: 0.8,
            min_window_us: 1_000,
            max_window_us: 50_000,
        }
    }
}

impl BatchController {
    /// The setting for `rate_per_s` arrivals per second, given the service time
    /// measured per batch size, `profile = [(batch_size, service_us)]` in any order,
    /// and the latency SLO.
    ///
    /// Fallbacks: an empty profile (or one with only size 0) gives
    /// [`BatchSetting::UNBATCHED`]; a rate that is NaN or negative counts as 0, an
    /// infinite one as overload; a service time of 0 counts as 1 µs; a size measured
    /// twice keeps its slower measurement.
    pub fn choose(&self, rate_per_s: f64, profile: &[(usize, u64)], slo_us: u64) -> BatchSetting {
        let target = if self.target_utilisation > 0.0 && self.target_utilisation <= 1.0 {
            self.target_utilisation
        } else {
            0.8
        };
        let rate_per_s = if rate_per_s > 0.0 { rate_per_s } else { 0.0 };
        let candidates = candidates(profile, slo_us);
        if candidates.is_empty() {
            return BatchSetting::UNBATCHED;
        }
        let keeps_up = |&(batch_size, service_us): &(usize, u64)| {
            rate_per_s * service_us as f64 / (batch_size as f64 * 1e6) <= target
        };
        let (max_batch, service_us) = match candidates.iter().find(|c| keeps_up(c)) {
            Some(&found) => found,
            None => highest_throughput(&candidates),
        };
        if max_batch <= 1 {
            return BatchSetting::UNBATCHED;
        }
        let collect_us = if rate_per_s > 0.0 {
            (max_batch - 1) as f64 / rate_per_s * 1e6
        } else {
            f64::INFINITY
        };
        // `as` saturates (and maps NaN to 0); max-then-min cannot panic like clamp.
        let clamped_us = (collect_us as u64)
            .max(self.min_window_us)
            .min(self.max_window_us);
        BatchSetting {
            max_batch,
            window_us: clamped_us.min(slo_us.saturating_sub(service_us)),
        }
    }
}

/// Step 1 of the table: sorted by size, deduplicated (slowest wins), sizes over the
/// SLO dropped, size 1 present.
fn candidates(profile: &[(usize, u64)], slo_us: u64) -> Vec<(usize, u64)> {
    let mut measured: Vec<(usize, u64)> = profile
        .iter()
        .filter(|(batch_size, _)| *batch_size > 0)
        .map(|&(batch_size, service_us)| (batch_size, service_us.max(1)))
        .collect();
    // Slowest first within a size, so dedup keeps the slower measurement.
    measured.sort_by(|a, b| a.0.cmp(&b.0).then(b.1.cmp(&a.1)));
    measured.dedup_by_key(|(batch_size, _)| *batch_size);
    let Some(&(smallest, smallest_service_us)) = measured.first() else {
        return Vec::new();
    };
    if smallest != 1 {
        measured.insert(0, (1, smallest_service_us));
    }
    measured.retain(|&(batch_size, service_us)| batch_size == 1 || service_us <= slo_us);
    measured
}

/// The size with the most requests per µs, compared exactly; ties go to the smaller.
fn highest_throughput(candidates: &[(usize, u64)]) -> (usize, u64) {
    let mut best = candidates[0];
    for &candidate in &candidates[1..] {
        // b / s > b' / s'  ⇔  b · s' > b' · s, in u128 so nothing overflows.
        let candidate_side = candidate.0 as u128 * u128::from(best.1);
        let best_side = best.0 as u128 * u128::from(candidate.1);
        if candidate_side > best_side {
            best = candidate;
        }
    }
    best
}

/// The item a full [`BatchQueue`] refused, handed back to the caller.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Full<T>(pub T);

impl<T> std::fmt::Display for Full<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "the batch queue is full")
    }
}

impl<T: std::fmt::Debug> std::error::Error for Full<T> {}

/// A bounded FIFO of requests waiting to be batched (sans-IO).
///
/// Its driver pushes arrivals, sleeps until [`BatchQueue::next_deadline_us`] or the
/// next arrival, and takes a batch whenever [`BatchQueue::ready`] says so. Items leave
/// in arrival order, each exactly once. With times that do not go backwards,
/// `ready(now)` holds exactly when `now ≥ next_deadline_us()`.
#[derive(Debug, Clone)]
pub struct BatchQueue<T> {
    /// Items with the time they were pushed, oldest first.
    items: VecDeque<(u64, T)>,
    capacity: usize,
}

impl<T> BatchQueue<T> {
    /// An empty queue holding at most `capacity` items (0 refuses everything).
    pub fn new(capacity: usize) -> Self {
        BatchQueue {
            items: VecDeque::new(),
            capacity,
        }
    }

    /// Items waiting.
    pub fn len(&self) -> usize {
        self.items.len()
    }

    /// Whether nothing waits.
    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }

    /// The most items the queue holds.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Enqueues an item that arrived at `now_us`; when the queue is full the item comes
    /// back in [`Full`] (back-pressure: the caller answers 429 or offloads it).
    pub fn push(&mut self, item: T, now_us: u64) -> Result<(), Full<T>> {
        if self.items.len() >= self.capacity {
            return Err(Full(item));
        }
        self.items.push_back((now_us, item));
        Ok(())
    }

    /// Whether a batch is due: a full batch is waiting, or the oldest item has waited
    /// for the whole window.
    pub fn ready(&self, now_us: u64, setting: &BatchSetting) -> bool {
        match self.items.front() {
            None => false,
            Some((pushed_us, _)) => {
                self.items.len() >= setting.max_batch.max(1)
                    || now_us.saturating_sub(*pushed_us) >= setting.window_us
            }
        }
    }

    /// Removes and returns up to `max_batch` items, oldest first. It does not check
    /// [`BatchQueue::ready`]: the driver decides when.
    pub fn take_batch(&mut self, setting: &BatchSetting) -> Vec<T> {
        let n_items = self.items.len().min(setting.max_batch.max(1));
        self.items.drain(..n_items).map(|(_, item)| item).collect()
    }

    /// When the next batch is due: `None` when empty; the oldest item's arrival when a
    /// full batch already waits (due now); otherwise the oldest item's arrival plus the
    /// window (saturating).
    pub fn next_deadline_us(&self, setting: &BatchSetting) -> Option<u64> {
        let (pushed_us, _) = self.items.front()?;
        if self.items.len() >= setting.max_batch.max(1) {
            Some(*pushed_us)
        } else {
            Some(pushed_us.saturating_add(setting.window_us))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// A GPU-like profile: batching amortises well (b / s(b) grows with b).
    const GPU: &[(usize, u64)] = &[(1, 2_000), (2, 2_400), (4, 3_200), (8, 4_800), (16, 8_000)];

    fn check(rate_per_s: f64, profile: &[(usize, u64)], slo_us: u64, expected: (usize, u64)) {
        let setting = BatchController::default().choose(rate_per_s, profile, slo_us);
        assert_eq!(
            (setting.max_batch, setting.window_us),
            expected,
            "{rate_per_s}/s, SLO {slo_us} µs, {profile:?}"
        );
    }

    #[test]
    fn batch_size_and_window_follow_the_load() {
        // Capacities at ρ = 0.8: b=1 400/s, 2 667/s, 4 1000/s, 8 1333/s, 16 1600/s.
        // Idle and light load: no batching, no window.
        check(0.0, GPU, 100_000, (1, 0));
        check(300.0, GPU, 100_000, (1, 0));
        // 600/s needs batches of 2: the second arrives in 1/600 s ≈ 1666 µs.
        check(600.0, GPU, 100_000, (2, 1_666));
        // 1200/s: batches of 8, seven more arrive in 5833 µs.
        check(1_200.0, GPU, 100_000, (8, 5_833));
        // 1500/s: 16; 15 arrivals take 10 ms.
        check(1_500.0, GPU, 100_000, (16, 10_000));
        // Nothing keeps up at 5000/s: the highest throughput, 16, whose 15 more
        // arrivals take 3 ms; under infinite load the window floor of 1 ms.
        check(5_000.0, GPU, 100_000, (16, 3_000));
        check(f64::INFINITY, GPU, 100_000, (16, 1_000));
        // A tight SLO caps the window at SLO − s(b): 12 ms − 8 ms.
        check(1_500.0, GPU, 12_000, (16, 4_000));
        // Sizes slower than the SLO are not candidates: a 7.999 ms SLO drops 16; seven
        // more arrivals take 1.4 ms, and a 5 ms SLO caps that at 5 − 4.8 ms.
        check(5_000.0, GPU, 7_999, (8, 1_400));
        check(5_000.0, GPU, 5_000, (8, 200));
        // Very slow arrivals needing batches still wait at most 50 ms.
        let slow_device = &[(1, 1_000_000), (64, 2_000_000)];
        check(1.0, slow_device, 10_000_000, (64, 50_000));
    }

    #[test]
    fn batching_that_does_not_pay_is_not_used() {
        // A CPU-like profile where a batch of 4 takes 4× as long: same throughput, so
        // overload stays at batch 1.
        check(10_000.0, &[(1, 1_000), (4, 4_000)], 100_000, (1, 0));
        // Worse throughput when batched: still 1.
        check(10_000.0, &[(1, 1_000), (4, 5_000)], 100_000, (1, 0));
    }

    #[test]
    fn odd_profiles_fall_back_to_documented_choices() {
        check(1_000.0, &[], 100_000, (1, 0));
        check(1_000.0, &[(0, 5)], 100_000, (1, 0));
        check(f64::NAN, GPU, 100_000, (1, 0));
        check(-3.0, GPU, 100_000, (1, 0));
        // No batch-1 measurement: assumed as slow as the smallest measured size (4),
        // which 200/s does not need.
        check(200.0, &[(4, 3_200), (8, 4_800)], 100_000, (1, 0));
        check(1_200.0, &[(8, 4_800), (4, 3_200)], 100_000, (8, 5_833));
        // Size measured twice: the slower one counts, here over a 5 ms SLO.
        check(1_200.0, &[(1, 2_000), (8, 4_800)], 5_000, (8, 200));
        check(
            1_200.0,
            &[(1, 2_000), (8, 4_800), (8, 6_000)],
            5_000,
            (1, 0),
        );
        check(
            1_200.0,
            &[(1, 2_000), (8, 6_000), (8, 4_800)],
            5_000,
            (1, 0),
        );
        // Service time 0 counts as 1 µs; an SLO no longer than that leaves no window.
        check(1e9, &[(1, 0), (2, 0)], 1, (2, 0));
        check(1e9, &[(1, 0), (2, 0)], 0, (1, 0));
        let odd = BatchController {
            target_utilisation: f64::NAN,
            min_window_us: 60_000,
            max_window_us: 50_000,
        };
        assert_eq!(
            odd.choose(1_500.0, GPU, 100_000),
            BatchSetting {
                max_batch: 16,
                window_us: 50_000
            }
        );
    }

    #[test]
    fn the_arrival_rate_tracks_load_and_decays_when_idle() {
        let mut estimator = ArrivalEstimator::new(1_000_000);
        assert_eq!(estimator.rate(0), 0.0);
        // 100/s for 10 time constants.
        for arrival in 0..1_000u64 {
            estimator.observe(arrival * 10_000);
        }
        let rate = estimator.rate(10_000_000);
        assert!((rate - 100.0).abs() < 1.0, "{rate}");
        // One time constant of silence: e⁻¹ of it.
        let idle = estimator.rate(11_000_000);
        assert!((idle - rate / std::f64::consts::E).abs() < 1e-6, "{idle}");
        // A clock that steps back is taken as no time passing.
        let before = estimator.rate(10_000_000);
        assert_eq!(estimator.rate(5), estimator.rate(9_990_000));
        estimator.observe(5);
        assert!(estimator.rate(10_000_000) > before);
        // A zero time constant neither panics nor divides by zero.
        let mut instant = ArrivalEstimator::new(0);
        instant.observe(7);
        assert!(instant.rate(7).is_finite());
        assert_eq!(instant.rate(u64::MAX), 0.0);
    }

    #[test]
    fn the_queue_batches_in_order_and_pushes_back_when_full() {
        let setting = BatchSetting {
            max_batch: 3,
            window_us: 1_000,
        };
        let mut queue = BatchQueue::new(4);
        assert!(!queue.ready(0, &setting));
        assert_eq!(queue.next_deadline_us(&setting), None);
        queue.push("a", 100).expect("room");
        queue.push("b", 200).expect("room");
        assert!(!queue.ready(1_099, &setting));
        assert_eq!(queue.next_deadline_us(&setting), Some(1_100));
        assert!(queue.ready(1_100, &setting));
        queue.push("c", 300).expect("room");
        // A full batch is due at once.
        assert!(queue.ready(300, &setting));
        assert_eq!(queue.next_deadline_us(&setting), Some(100));
        queue.push("d", 400).expect("room");
        assert_eq!(queue.push("e", 500), Err(Full("e")));
        assert_eq!(queue.take_batch(&setting), vec!["a", "b", "c"]);
        assert_eq!(queue.take_batch(&setting), vec!["d"]);
        assert!(queue.is_empty());
        // Capacity 0 refuses everything; max_batch 0 is 1.
        let mut closed = BatchQueue::new(0);
        assert_eq!(closed.push(1, 0), Err(Full(1)));
        let mut queue = BatchQueue::new(2);
        queue.push(1, 0).expect("room");
        queue.push(2, 0).expect("room");
        let zero = BatchSetting {
            max_batch: 0,
            window_us: u64::MAX,
        };
        assert!(queue.ready(0, &zero));
        assert_eq!(queue.take_batch(&zero), vec![1]);
    }

    #[derive(Debug, Clone)]
    enum Op {
        Push { advance_us: u64 },
        Take { max_batch: usize },
    }

    fn ops() -> impl Strategy<Value = Vec<Op>> {
        proptest::collection::vec(
            prop_oneof![
                3 => (0u64..3_000).prop_map(|advance_us| Op::Push { advance_us }),
                1 => (0usize..6).prop_map(|max_batch| Op::Take { max_batch }),
            ],
            0..80,
        )
    }

    proptest! {
        #[test]
        fn the_queue_never_reorders_duplicates_or_drops(
            ops in ops(),
            capacity in 0usize..8,
            window_us in 0u64..5_000,
        ) {
            let mut queue = BatchQueue::new(capacity);
            let mut accepted = Vec::new();
            let mut taken = Vec::new();
            let mut now_us = 0u64;
            for (next_item, op) in ops.into_iter().enumerate() {
                match op {
                    Op::Push { advance_us } => {
                        now_us += advance_us;
                        let was_full = queue.len() >= capacity;
                        match queue.push(next_item, now_us) {
                            Ok(()) => accepted.push(next_item),
                            Err(Full(back)) => {
                                prop_assert!(was_full);
                                prop_assert_eq!(back, next_item);
                            }
                        }
                        prop_assert!(queue.len() <= capacity);
                    }
                    Op::Take { max_batch } => {
                        let setting = BatchSetting { max_batch, window_us };
                        let due = queue.next_deadline_us(&setting);
                        prop_assert_eq!(
                            queue.ready(now_us, &setting),
                            due.is_some_and(|due| now_us >= due)
                        );
                        let batch = queue.take_batch(&setting);
                        prop_assert!(batch.len() <= max_batch.max(1));
                        taken.extend(batch);
                    }
                }
            }
            taken.extend(queue.take_batch(&BatchSetting { max_batch: usize::MAX, window_us }));
            prop_assert_eq!(taken, accepted);
        }

        #[test]
        fn the_setting_is_always_sane(
            rate_per_s in prop_oneof![any::<f64>(), 0.0..10_000.0f64],
            profile in proptest::collection::vec((0usize..64, any::<u64>()), 0..6),
            slo_us in any::<u64>(),
        ) {
            let setting = BatchController::default().choose(rate_per_s, &profile, slo_us);
            prop_assert!(setting.max_batch >= 1);
            prop_assert!(setting.window_us <= 50_000);
            prop_assert!(setting.max_batch == 1 || profile.iter().any(|(b, _)| *b == setting.max_batch));
            if setting.max_batch == 1 {
                prop_assert_eq!(setting.window_us, 0);
            }
        }
    }
}
