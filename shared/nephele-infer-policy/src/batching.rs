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
//! | 1    | candidates: the measured sizes whose `s(b)` ≤ SLO, and always `b = 1`; going   |
//! |      | up in size, a size stays only if its `b / s(b)` beats the last one kept by 5 % |
//! | 2    | `max_batch` = the smallest candidate with `ρ(b)` ≤ target utilisation (0.8)    |
//! | 3    | if none keeps up: the candidate with the highest `b / s(b)` (ties: smaller `b`) |
//! | 4    | `max_batch = 1` → window 0: dispatch each request at once                      |
//! | 4b   | window 0 as well when waiting does not pay: a wait of `w` gathers `λ · w`      |
//! |      | requests, each saving `s(1) − s(b) / b`, so only if `λ · (s(1) − s(b)/b) ≥ 1`  |
//! |      | (requests queued behind a running batch still go together: greedy batching)   |
//! | 5    | else window = `(b − 1) / λ` (time for the rest of the batch to arrive after    |
//! |      | the first), clamped to [1 ms, 50 ms], then capped at what batching saves,      |
//! |      | `b · s(1) − s(b)` (waiting idles the device), and at `SLO − s(b)` (≥ 0)        |
//!
//! Only measured sizes are chosen (no interpolation): a batch size nobody measured is
//! a guess about the hardware. A larger batch holds all its requests until the whole
//! batch is done, so it must buy throughput measurably (the 5 % of step 1) to be worth
//! that latency; where batching does not pay (a CNN on a CPU) only batch 1 remains. Batch 1 is always possible; when the profile lacks it,
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
            // Nothing keeps up: drain as a backlog drains (see `drain_size`).
            None => economical(&self::candidates(profile, slo_us / 2)),
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
        // Waiting idles the device. A wait of w gathers about r · w more requests, each
        // saving s(1) − s(b)/b over running alone, so it pays only when r · (s(1) −
        // s(b)/b) ≥ 1; otherwise dispatch at once (window 0): requests that queue behind
        // a running batch still go together, without the device ever waiting for them.
        // (Measured: waiting 7 ms for batches of 8 at 90% load on a model that only
        // batches away its dispatch overhead gathered 4, idled the device and cut its
        // throughput by a quarter.)
        let single_us = candidates[0].1;
        let saving_per_request_us = single_us as f64 - service_us as f64 / max_batch as f64;
        if rate_per_s * saving_per_request_us / 1e6 < 1.0 {
            return BatchSetting {
                max_batch,
                window_us: 0,
            };
        }
        // Never wait longer for a batch of `b` than running `b` together saves over
        // running them one by one: b · s(1) − s(b).
        let saved_us = (max_batch as u64)
            .saturating_mul(single_us)
            .saturating_sub(service_us);
        BatchSetting {
            max_batch,
            window_us: clamped_us
                .min(saved_us)
                .min(slo_us.saturating_sub(service_us)),
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
    // Keep a larger size only when it beats the last kept size's throughput by 5 %:
    // b / s ≥ 1.05 · b' / s'  ⇔  20 · b · s' ≥ 21 · b' · s.
    let mut kept: Vec<(usize, u64)> = Vec::with_capacity(measured.len());
    for candidate in measured {
        let pays = kept.last().is_none_or(|&(last_size, last_service)| {
            20 * candidate.0 as u128 * u128::from(last_service.max(1))
                >= 21 * last_size as u128 * u128::from(candidate.1.max(1))
        });
        if pays {
            kept.push(candidate);
        }
    }
    kept
}

/// How many queued requests to take at once when a backlog drains: among the sizes
/// whose batch takes at most half the SLO, the smallest candidate (step 1 of the module
/// table) whose throughput is within 5 % of the highest, so that a backlog is taken in
/// larger batches only where batching buys throughput. 1 for an empty profile.
///
/// Why half, and why not simply the highest throughput: in a backlog a request that
/// just missed a batch waits for it and then runs in the next, up to 2 · s(b); a batch
/// longer than half the SLO leaves only the requests that arrive late in a batch any
/// chance, and puts every one of them near the SLO, where one scheduling stall makes
/// them late. (Measured on the PP-OCR classifier, whose batches only amortise a
/// dispatch overhead: draining in batches of 8, 14 ms of a 20 ms SLO, bought 6 % over
/// batches of 1 and put p99 past capacity at 19–24 ms.)
pub fn drain_size(profile: &[(usize, u64)], slo_us: u64) -> usize {
    let candidates = candidates(profile, slo_us / 2);
    if candidates.is_empty() {
        return 1;
    }
    economical(&candidates).0
}

/// The smallest candidate (they are sorted by size) with at least 95 % of the highest
/// throughput.
fn economical(candidates: &[(usize, u64)]) -> (usize, u64) {
    let best = highest_throughput(candidates);
    candidates
        .iter()
        .copied()
        // b / s ≥ 0.95 · b* / s*  ⇔  20 · b · s* ≥ 19 · b* · s.
        .find(|&(size, service)| {
            20 * size as u128 * u128::from(best.1.max(1))
                >= 19 * best.0 as u128 * u128::from(service.max(1))
        })
        .unwrap_or(best)
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

/// How many standard deviations of the prediction error [`AdmissionControl`] keeps in
/// hand: 3.09, the normal 99.9 % quantile. Lateness on a shared machine has a heavier
/// tail than a normal one (scheduling stalls), so this aims well past the p99 it is
/// meant to hold.
pub const DEFAULT_ERROR_QUANTILE_Z: f64 = 3.09;

/// Admission by deadline that learns how wrong its predictions are (sans-IO).
///
/// [`predicted_completion_us`] misses what the profile does not see: a busy machine,
/// scheduling delays, a slow batch. So each answered request reports its predicted and
/// measured latency, and the control keeps an exponentially weighted mean `m` and
/// standard deviation `σ` of the lateness (measured − predicted, at least 0; weight
/// 1/64 per answer).
/// A request is admitted when `predicted + m + z · σ ≤ bound`: with errors roughly
/// normal, a share of about `1 − Φ(z)` of the answers is later than the bound; `z` is
/// raised by the answers that actually are, until they are [`Self::MISS_TARGET`] of
/// the answers (see [`AdmissionControl::observe`]). Before
/// any answer the margin is the prior. The estimate moves the same way up and down, so a slow
/// spell that raised the margin is forgotten as fast once answers come back in time.
#[derive(Debug, Clone, PartialEq)]
pub struct AdmissionControl {
    bound_us: u64,
    z: f64,
    /// The `z` given at construction: what the calibration never goes below.
    z_floor: f64,
    mean_us: f64,
    var_us2: f64,
}

impl AdmissionControl {
    const WEIGHT: f64 = 1.0 / 64.0;
    /// The share of admitted requests that may be answered past the bound: half the
    /// 1 % a p99 objective leaves.
    pub const MISS_TARGET: f64 = 0.005;
    /// How far one answer moves `z`: up by about this on a miss, down by this ×
    /// [`Self::MISS_TARGET`] on an answer in time, so `z` settles where misses are
    /// [`Self::MISS_TARGET`] of answers (stochastic approximation of a quantile).
    const Z_STEP: f64 = 0.05;
    const Z_MAX: f64 = 10.0;

    /// A control holding answers to `bound_us`, keeping `z` deviations in hand (a
    /// non-finite or negative `z` is taken as 0), that starts from an expected
    /// lateness of `prior_us` (counted as one earlier answer, so the first answers
    /// blend with it rather than replace it): a fresh queue knows nothing of its
    /// machine yet, and one batch-1 service time is a modest guess.
    pub fn new(bound_us: u64, z: f64, prior_us: u64) -> Self {
        let z = if z.is_finite() {
            z.clamp(0.0, Self::Z_MAX)
        } else {
            0.0
        };
        AdmissionControl {
            bound_us,
            z,
            z_floor: z,
            mean_us: prior_us as f64,
            var_us2: 0.0,
        }
    }

    /// The bound answers are held to.
    pub fn bound_us(&self) -> u64 {
        self.bound_us
    }

    /// What is added to a prediction before comparing it with the bound (≥ 0).
    pub fn margin_us(&self) -> f64 {
        self.mean_us + self.z * self.var_us2.sqrt()
    }

    /// The highest prediction admitted now.
    pub fn limit_us(&self) -> u64 {
        (self.bound_us as f64 - self.margin_us()).max(0.0) as u64
    }

    /// Whether a request predicted to be answered in `predicted_us` is admitted.
    pub fn admits(&self, predicted_us: u64) -> bool {
        predicted_us as f64 + self.margin_us() <= self.bound_us as f64
    }

    /// One answered request: what was predicted when it was admitted, what it took.
    /// An answer sooner than predicted counts as an error of 0: a batch that filled
    /// before its window ran out says nothing about how late the next one may be, and
    /// counting it would widen the spread the margin is made of.
    ///
    /// It also calibrates `z` against the bound itself: the error's tail on a busy
    /// machine is heavier than a normal one (the bench saw about 1 % of answers past the
    /// bound at z = 3.09, not 0.1 %), so each answer past the bound raises `z` and each
    /// one in time lowers it a little, never below the `z` it started with.
    pub fn observe(&mut self, predicted_us: u64, measured_us: u64) {
        let missed = f64::from(u8::from(measured_us > self.bound_us));
        self.z = (self.z + Self::Z_STEP * (missed - Self::MISS_TARGET))
            .clamp(self.z_floor, Self::Z_MAX.max(self.z_floor));
        let error = measured_us.saturating_sub(predicted_us) as f64;
        // West's exponentially weighted mean and variance.
        let delta = error - self.mean_us;
        self.mean_us += Self::WEIGHT * delta;
        self.var_us2 = (1.0 - Self::WEIGHT) * (self.var_us2 + Self::WEIGHT * delta * delta);
    }
}

/// The most a prediction may be under sustained overload, when requests arrive at least
/// as fast as batches of `take` are served (`profile` with the learned overhead): a
/// quarter of `bound_us`, or two batches of `take` if that is longer. `None` below
/// capacity, where admission by deadline alone decides.
///
/// Why: past capacity the device cannot run faster, so every request queued beyond what
/// keeps it busy only waits. Admission by deadline alone fills the queue up to the
/// bound, and then one scheduling stall makes everything in it late at once (the bench
/// measured p99 of 19–24 ms against a 20 ms SLO at 1.5× capacity, with the median at
/// 12 ms). Two batches' worth admits a whole next batch even right after one starts, so
/// the device never waits for work; the rest of the bound is left for stalls. This is
/// CoDel's idea for a router's standing queue (Nichols & Jacobson, 2012), with the
/// arrival rate as the overload signal instead of the sojourn time.
pub fn overload_limit_us(
    rate_per_s: f64,
    profile: &[(usize, u64)],
    take: usize,
    bound_us: u64,
) -> Option<u64> {
    let take = take.max(1);
    let service_us = batch_service_us(profile, take)?.max(1);
    let capacity_per_s = take as f64 * 1e6 / service_us as f64;
    (rate_per_s.is_finite() && rate_per_s >= capacity_per_s)
        .then(|| (bound_us / 4).max(service_us.saturating_mul(2)))
}

/// Service time of one batch of `rows` requests from a measured profile: linear
/// between the two measured sizes around `rows` (the runtime builds a plan for any
/// size), the smallest size's time below it, and whole batches of the largest size
/// past it. Services are first made non-decreasing in size (a larger batch measured
/// faster than a smaller one counts as the smaller one's time), so the result never
/// falls as `rows` grows. `None` for an empty profile.
pub fn batch_service_us(profile: &[(usize, u64)], rows: usize) -> Option<u64> {
    let rows = rows.max(1);
    let mut sorted: Vec<(usize, u64)> = profile
        .iter()
        .map(|&(size, service)| (size.max(1), service))
        .collect();
    sorted.sort_unstable();
    let mut slowest = 0;
    for entry in &mut sorted {
        slowest = slowest.max(entry.1);
        entry.1 = slowest;
    }
    let &(largest, largest_us) = sorted.last()?;
    if rows > largest {
        return Some(largest_us.saturating_mul(rows.div_ceil(largest) as u64));
    }
    let above = sorted.partition_point(|&(size, _)| size < rows);
    let (upper, upper_us) = sorted[above];
    if upper == rows || above == 0 {
        return Some(upper_us);
    }
    let (lower, lower_us) = sorted[above - 1];
    let share = (rows - lower) as f64 / (upper - lower) as f64;
    Some(lower_us + ((upper_us - lower_us) as f64 * share).round() as u64)
}

/// When a request that joins the queue now would be answered (µs from now), for
/// admission by deadline (a request that would miss it is refused at once, as Triton's
/// queue policy does with `REJECT`, rather than queued to be answered late).
///
/// The request waits for the batches in flight (`busy_for_us`; when it joins the first
/// batch and that batch will not fill, also for what is left of that batch's window,
/// `window_left_us`, which runs from the oldest request's arrival), then for the full
/// batches of `take` requests ahead of it, then for its own batch, which holds the
/// rest:
///
/// ```text
/// ahead + 1 = k · take + r   (1 ≤ r ≤ take)
/// completion = max(busy_for, window_left if k = 0 and r < take else 0) + k · s(take) + s(r)
/// ```
///
/// with `s` from [`batch_service_us`]. `None` when the profile is empty (nothing
/// measured: nothing to predict with). Saturating; monotone in `busy_for_us`, and in
/// `ahead` when no window is left (with one, the request that fills a batch is answered
/// sooner than the one before it).
pub fn predicted_completion_us(
    ahead: usize,
    take: usize,
    window_left_us: u64,
    busy_for_us: u64,
    profile: &[(usize, u64)],
) -> Option<u64> {
    let take = take.max(1);
    let position = ahead.saturating_add(1);
    let full_batches = (position - 1) / take;
    let own = position - full_batches * take;
    let full = batch_service_us(profile, take)?;
    let last = batch_service_us(profile, own)?;
    let waiting = if full_batches == 0 && own < take {
        busy_for_us.max(window_left_us)
    } else {
        busy_for_us
    };
    Some(
        waiting
            .saturating_add(full.saturating_mul(full_batches as u64))
            .saturating_add(last),
    )
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
    fn a_standing_queue_is_capped_only_past_capacity() {
        // GPU profile: batches of 16 serve 2,000/s.
        assert_eq!(overload_limit_us(1_500.0, GPU, 16, 100_000), None);
        assert_eq!(overload_limit_us(2_000.0, GPU, 16, 100_000), Some(25_000));
        // Two batches when that is longer than a quarter of the bound.
        assert_eq!(overload_limit_us(5_000.0, GPU, 16, 40_000), Some(16_000));
        // Batches of 1 serve 500/s.
        assert_eq!(overload_limit_us(499.0, GPU, 1, 20_000), None);
        assert_eq!(overload_limit_us(501.0, GPU, 1, 20_000), Some(5_000));
        assert_eq!(overload_limit_us(501.0, GPU, 1, 12_000), Some(4_000));
        assert_eq!(overload_limit_us(f64::NAN, GPU, 1, 20_000), None);
        assert_eq!(overload_limit_us(f64::INFINITY, GPU, 1, 20_000), None);
        assert_eq!(overload_limit_us(1e9, &[], 1, 20_000), None);
    }

    #[test]
    fn batch_size_and_window_follow_the_load() {
        // Capacities at ρ = 0.8: b=1 400/s, 2 667/s, 4 1000/s, 8 1333/s, 16 1600/s.
        // Idle and light load: no batching, no window.
        check(0.0, GPU, 100_000, (1, 0));
        check(300.0, GPU, 100_000, (1, 0));
        // 600/s needs batches of 2, but waiting for the second does not pay: a wait of
        // w gathers 600 · w requests, each saving 2000 − 2400 / 2 = 800 µs, which is
        // 0.48 µs per µs waited. So no window: what queues behind a running batch goes
        // together, and the device never idles for it.
        check(600.0, GPU, 100_000, (2, 0));
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
        // Past capacity the backlog's batches take at most half the SLO (a request may
        // wait for one and run in the next): within 7.999 ms that is 4, whose three more
        // arrivals take 0.6 ms, raised to the 1 ms floor; within 5 ms, 2.
        check(5_000.0, GPU, 7_999, (4, 1_000));
        check(5_000.0, GPU, 5_000, (2, 1_000));
        // Very slow arrivals needing batches still wait at most 50 ms.
        let slow_device = &[(1, 1_000_000), (64, 2_000_000)];
        check(2.0, slow_device, 10_000_000, (64, 50_000));
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
        // Service time 0 counts as 1 µs; an SLO no longer than that leaves no window,
        // and past capacity half of it holds no batch but 1.
        check(1e9, &[(1, 0), (2, 0)], 1, (1, 0));
        check(1e9, &[(1, 0), (2, 0)], 2, (2, 1));
        check(1e9, &[(1, 0), (2, 0)], 0, (1, 0));
        let odd = BatchController {
            target_utilisation: f64::NAN,
            min_window_us: 60_000,
            max_window_us: 50_000,
        };
        // The window the nonsense bounds give (50 ms) is capped by what a batch of 16
        // saves: 16 · 2 ms − 8 ms.
        assert_eq!(
            odd.choose(1_500.0, GPU, 100_000),
            BatchSetting {
                max_batch: 16,
                window_us: 24_000
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

    #[test]
    fn admission_learns_the_prediction_error() {
        let mut control = AdmissionControl::new(20_000, DEFAULT_ERROR_QUANTILE_Z, 0);
        // Nothing learned yet and no prior: the prediction is taken as it is.
        assert!(control.admits(20_000));
        assert!(!control.admits(20_001));
        // A prior of 2 ms holds back that much until answers say otherwise.
        let primed = AdmissionControl::new(20_000, DEFAULT_ERROR_QUANTILE_Z, 2_000);
        assert!(primed.admits(18_000));
        assert!(!primed.admits(18_001));
        // Predictions 3 ms short every time: a bias of 3 ms and (once the start is
        // forgotten) no spread.
        for _ in 0..2_000 {
            control.observe(5_000, 8_000);
        }
        assert!((control.margin_us() - 3_000.0).abs() < 1.0, "{control:?}");
        assert!(control.admits(16_999));
        assert!(!control.admits(17_100));
        // Errors of 0 or 4 ms alternating: mean 2 ms, σ 2 ms, so ~2 + 3.09 · 2 ms.
        for i in 0..2_000 {
            control.observe(5_000, if i % 2 == 0 { 5_000 } else { 9_000 });
        }
        let margin = control.margin_us();
        assert!((margin - 8_180.0).abs() < 300.0, "{margin}");
        assert_eq!(control.limit_us(), (20_000.0 - margin) as u64);
        // Answers sooner than predicted count as on time, not as negative lateness.
        for _ in 0..2_000 {
            control.observe(9_000, 5_000);
        }
        assert!(
            control.margin_us() >= 0.0 && control.margin_us() < 50.0,
            "{control:?}"
        );
        // Back to exact predictions: the margin is forgotten.
        for _ in 0..2_000 {
            control.observe(5_000, 5_000);
        }
        assert!(control.margin_us().abs() < 50.0, "{control:?}");
    }

    #[test]
    fn admission_raises_its_quantile_when_answers_miss_the_bound_and_relaxes_after() {
        let mut control = AdmissionControl::new(20_000, DEFAULT_ERROR_QUANTILE_Z, 0);
        // Errors of 0 or 4 ms (σ 2 ms): the margin is about 2 + 3.09 · 2 ms.
        for i in 0..2_000 {
            control.observe(5_000, if i % 2 == 0 { 5_000 } else { 9_000 });
        }
        let calm = control.margin_us();
        // Now 1 answer in 20 is past the bound, though its error (1.5 ms) is one the
        // spread already covers: ten times the target share of misses.
        for i in 0..2_000 {
            match i {
                i if i % 20 == 0 => control.observe(19_000, 20_500),
                i if i % 2 == 0 => control.observe(5_000, 5_000),
                _ => control.observe(5_000, 9_000),
            }
        }
        let stressed = control.margin_us();
        assert!(stressed > calm + 2_000.0, "{calm} → {stressed}");
        // Back in time for long enough: z returns to where it started, not below.
        for i in 0..200_000 {
            control.observe(5_000, if i % 2 == 0 { 5_000 } else { 9_000 });
        }
        let relaxed = control.margin_us();
        assert!((relaxed - calm).abs() < 300.0, "{calm} vs {relaxed}");
    }

    #[test]
    fn a_backlog_drains_in_batches_only_where_batching_pays() {
        // GPU-like: 16 is best (2 per ms).
        assert_eq!(drain_size(GPU, 1_000_000), 16);
        // Within an 8 ms SLO only 1, 2, 4 take at most half of it; 4 is best.
        assert_eq!(drain_size(GPU, 8_000), 4);
        assert_eq!(drain_size(GPU, 4_000), 1);
        // Batches that only amortise a 0.2 ms dispatch overhead: 2 is the last size that
        // buys 5 % over the one before (4 and 8 are not candidates), and 1 is not within
        // 5 % of 2.
        let overhead = [(1, 1_980), (2, 3_760), (4, 7_310), (8, 14_420)];
        assert_eq!(drain_size(&overhead, 20_000), 2);
        // A CPU CNN: per-item cost flat (within noise): batch 1.
        let flat = [(1, 1_600), (2, 3_150), (4, 6_300), (8, 12_500)];
        assert_eq!(drain_size(&flat, 20_000), 1);
        assert_eq!(drain_size(&[], 20_000), 1);
    }

    #[test]
    fn batch_service_interpolates_between_measured_sizes() {
        assert_eq!(batch_service_us(GPU, 1), Some(2_000));
        // Between 2 (2.4 ms) and 4 (3.2 ms): linear.
        assert_eq!(batch_service_us(GPU, 3), Some(2_800));
        assert_eq!(batch_service_us(GPU, 16), Some(8_000));
        // Below the smallest measured size: its time.
        assert_eq!(batch_service_us(&[(4, 3_200), (8, 4_800)], 1), Some(3_200));
        // A larger size measured faster counts as the smaller one's time.
        assert_eq!(batch_service_us(&[(1, 2_000), (2, 1_500)], 2), Some(2_000));
        // Past the largest size: whole batches of it.
        assert_eq!(batch_service_us(GPU, 17), Some(16_000));
        assert_eq!(batch_service_us(&[], 1), None);
    }

    #[test]
    fn completion_counts_the_work_in_flight_the_batches_ahead_and_its_own() {
        // Alone, nothing running, batch 1: its own service only.
        assert_eq!(predicted_completion_us(0, 1, 0, 0, GPU), Some(2_000));
        // Alone in a batch of 4 that will not fill: the window left, then s(1).
        assert_eq!(predicted_completion_us(0, 4, 1_500, 0, GPU), Some(3_500));
        // Third in that batch: the window left, then s(3); filling it: no window.
        assert_eq!(predicted_completion_us(2, 4, 1_500, 0, GPU), Some(4_300));
        assert_eq!(predicted_completion_us(3, 4, 1_500, 0, GPU), Some(3_200));
        // 9 ahead in batches of 4: two full batches, then its own batch of 2,
        // after the 5 ms still running.
        assert_eq!(
            predicted_completion_us(9, 4, 1_500, 5_000, GPU),
            Some(5_000 + 2 * 3_200 + 2_400)
        );
        assert_eq!(predicted_completion_us(0, 1, 0, 0, &[]), None);
    }

    proptest! {
        #[test]
        fn completion_is_monotone_in_the_queue_and_the_work_in_flight(
            ahead in 0usize..500,
            take in 1usize..64,
            window in 0u64..50_000,
            busy in 0u64..100_000,
            extra in 1usize..50,
            more_busy in 1u64..10_000,
        ) {
            let now = predicted_completion_us(ahead, take, window, busy, GPU).unwrap();
            let unwindowed = predicted_completion_us(ahead, take, 0, busy, GPU).unwrap();
            let longer = predicted_completion_us(ahead + extra, take, 0, busy, GPU).unwrap();
            prop_assert!(longer >= unwindowed);
            prop_assert!(now >= unwindowed);
            let busier = predicted_completion_us(ahead, take, window, busy + more_busy, GPU).unwrap();
            prop_assert!(busier >= now);
            // Never less than its own service alone.
            prop_assert!(now >= 2_000);
        }

        #[test]
        fn batch_service_never_falls_as_rows_grow(
            profile in proptest::collection::vec((1usize..80, 1u64..100_000), 1..8),
            rows in 1usize..200,
        ) {
            let here = batch_service_us(&profile, rows).unwrap();
            let next = batch_service_us(&profile, rows + 1).unwrap();
            prop_assert!(next >= here, "{profile:?}: {rows} → {here}, {} → {next}", rows + 1);
        }
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
