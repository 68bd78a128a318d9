//! Cost and carbon: temporal shifting of deferrable jobs and spatial choice of region.
//!
//! Hours are indices into an hourly series (0 = the series' first hour); intensities are
//! in gCO₂eq/kWh. A job that runs `duration` hours at constant power emits in proportion
//! to the *mean* intensity over the hours it runs, so every comparison here is on that
//! mean ("window mean").
//!
//! - [`ProfileBlend`]: the forecaster. It only ever sees the past ([`Forecaster`] gets a
//!   slice that ends at the current hour), so it cannot peek by construction.
//! - [`run_online`]: the online temporal-shifting policy. Every hour it re-plans with the
//!   newest forecast and starts the job when the current window is no worse than the best
//!   forecast later window; at the job's latest start it starts regardless, so the
//!   deadline always holds.
//! - [`oracle`] (perfect foresight, the bound no policy beats) and [`no_shift`] (start on
//!   release, the baseline), as in Wiesner et al., "Let's Wait Awhile", Middleware 2021.
//! - [`choose_region`]: spatial shifting, a documented weighted score of carbon, price
//!   and free capacity.
//!
//! Pure and deterministic: no IO, no clock, no dependencies. Bad input gives a
//! [`ShiftError`], never a panic.

use std::fmt;

/// A deferrable job: released at `release`, runs `duration` whole hours without pause,
/// and must have finished by `deadline` (exclusive: the last hour it may run is
/// `deadline - 1`). Slack is `deadline - release - duration`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Job {
    pub release: usize,
    pub duration: usize,
    pub deadline: usize,
}

impl Job {
    /// A job with `slack` hours of freedom after its release.
    pub fn with_slack(release: usize, duration: usize, slack: usize) -> Self {
        Self {
            release,
            duration,
            deadline: release + duration + slack,
        }
    }

    /// The last hour the job may start and still meet its deadline.
    pub fn latest_start(&self) -> Result<usize, ShiftError> {
        if self.duration == 0 {
            return Err(ShiftError::ZeroDuration);
        }
        match self.deadline.checked_sub(self.duration) {
            Some(latest) if latest >= self.release => Ok(latest),
            _ => Err(ShiftError::Infeasible(*self)),
        }
    }
}

/// Why a job could not be evaluated.
#[derive(Debug, Clone, PartialEq)]
pub enum ShiftError {
    ZeroDuration,
    /// The deadline leaves less than `duration` hours after the release.
    Infeasible(Job),
    /// The series ends before the job's deadline.
    SeriesTooShort {
        needed: usize,
        len: usize,
    },
    /// An intensity the job would run under is NaN or infinite.
    NonFinite {
        hour: usize,
    },
}

impl fmt::Display for ShiftError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::ZeroDuration => write!(f, "job duration is 0 hours"),
            Self::Infeasible(job) => write!(
                f,
                "deadline {} is less than {} hours after release {}",
                job.deadline, job.duration, job.release
            ),
            Self::SeriesTooShort { needed, len } => {
                write!(f, "series has {len} hours, the job needs {needed}")
            }
            Self::NonFinite { hour } => write!(f, "intensity at hour {hour} is not finite"),
        }
    }
}

impl std::error::Error for ShiftError {}

/// Where a job ran and what it emitted per kWh.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Outcome {
    pub start: usize,
    /// Mean intensity over `start..start + duration`, in the series' unit. Emissions are
    /// this × energy.
    pub mean_intensity: f64,
}

impl Outcome {
    /// Whether the job finished by its deadline.
    pub fn meets(&self, job: &Job) -> bool {
        self.start >= job.release && self.start + job.duration <= job.deadline
    }
}

/// Predicts the next hours from the past. `history` holds the measured values of hours
/// `0..=now` (its last element is the current hour); the result holds predictions for
/// hours `now + 1 ..= now + horizon`. Implementations only see `history`, so a forecast
/// cannot depend on the future unless the implementation was built from it (as
/// [`PerfectForesight`] is, on purpose).
pub trait Forecaster {
    fn forecast(&self, history: &[f64], horizon: usize) -> Vec<f64>;
}

/// The forecaster used by the carbon experiment: the recent daily profile, pulled
/// towards the latest measured level with a deviation that decays with the horizon, plus
/// a short-lived continuation of the last hour's change in that deviation.
///
/// ```text
/// f(now + h) = P(now + h) + a · decay^h + momentum · s · Σ_{i=1..h} 0.5^i
/// a          = x(now) − P(now)                      (today's anomaly)
/// s          = a − (x(now − 1) − P(now − 1))        (its change over the last hour)
/// P(u)       = mean of x(u − 24·d) over the `days` most recent whole days d ≥ 1
///              with u − 24·d ≤ now (same hour of day, only measured hours)
/// ```
///
/// Why this shape: grid intensity has a strong daily cycle (solar, demand) that the
/// profile carries, and slow weather-driven swings (wind) that make the current level the
/// best guess for the next few hours; the anomaly decays because weather regimes end.
/// A ramp (wind picking up, a gas plant starting) tends to go on for an hour or two,
/// which the momentum term carries with a fixed one-hour half-life. All terms are plain
/// averages and differences of past hours: no fitting, little to overfit, and it needs
/// one day of history to start (before that it is persistence: f = x(now)). `days`,
/// `decay` and `momentum` are chosen by measurement on the first half of 2023 only (see
/// `nephele-sim`'s carbon experiment), and reported on the second half.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ProfileBlend {
    /// How many past days the profile averages (at least 1).
    pub days: usize,
    /// Per-hour decay of the current anomaly, in [0, 1]; 1 keeps it forever, 0 ignores it.
    pub decay: f64,
    /// Weight of the last hour's change in the anomaly (0 turns it off).
    pub momentum: f64,
}

impl Default for ProfileBlend {
    /// 28 days, 0.98 per hour, momentum 0.5: the best mean captured share over the eight
    /// zones on January–June 2023 in the tuning grid of the carbon experiment.
    fn default() -> Self {
        Self {
            days: 28,
            decay: 0.98,
            momentum: 0.5,
        }
    }
}

impl ProfileBlend {
    /// Mean of the same hour of day over the most recent `days` days whose hour is
    /// measured (≤ now); `None` when no such day exists.
    fn profile(&self, history: &[f64], target: usize) -> Option<f64> {
        let now = history.len().checked_sub(1)?;
        let first_day = target.saturating_sub(now).div_ceil(24).max(1);
        let mut sum = 0.0;
        let mut count = 0usize;
        for day in first_day..first_day + self.days.max(1) {
            let Some(hour) = target.checked_sub(24 * day) else {
                break;
            };
            let value = history[hour];
            if value.is_finite() {
                sum += value;
                count += 1;
            }
        }
        (count > 0).then(|| sum / count as f64)
    }
}

impl Forecaster for ProfileBlend {
    fn forecast(&self, history: &[f64], horizon: usize) -> Vec<f64> {
        let Some((&current, _)) = history.split_last() else {
            return vec![f64::NAN; horizon];
        };
        let now = history.len() - 1;
        let decay = self.decay.clamp(0.0, 1.0);
        let anomaly = self
            .profile(history, now)
            .map(|level| current - level)
            .filter(|a| a.is_finite());
        let slope = match (anomaly, now.checked_sub(1)) {
            (Some(a), Some(before)) => self
                .profile(history, before)
                .map(|level| a - (history[before] - level))
                .filter(|s| s.is_finite())
                .unwrap_or(0.0),
            _ => 0.0,
        };
        let momentum = if self.momentum.is_finite() {
            self.momentum
        } else {
            0.0
        };
        let (mut weight, mut ramp, mut half) = (1.0, 0.0, 1.0);
        (1..=horizon)
            .map(|h| {
                weight *= decay;
                half *= 0.5;
                ramp += half;
                match (self.profile(history, now + h), anomaly) {
                    (Some(profile), Some(anomaly)) => {
                        profile + anomaly * weight + momentum * slope * ramp
                    }
                    _ => current,
                }
            })
            .collect()
    }
}

/// Reads the real future: the bound that shows how much a better forecast could add.
/// Policy + perfect foresight = oracle (a property test checks this).
#[derive(Debug, Clone, Copy)]
pub struct PerfectForesight<'a> {
    pub series: &'a [f64],
}

impl Forecaster for PerfectForesight<'_> {
    fn forecast(&self, history: &[f64], horizon: usize) -> Vec<f64> {
        let from = history.len();
        (from..from + horizon)
            .map(|hour| self.series.get(hour).copied().unwrap_or(f64::NAN))
            .collect()
    }
}

/// Forecasts made once per hour by another forecaster and looked up by the current hour,
/// so that many overlapping jobs share them. Each row was built from the series up to its
/// own hour only, so the table reads no more of the future than the forecaster it wraps.
#[derive(Debug, Clone, PartialEq)]
pub struct ForecastTable {
    rows: Vec<Vec<f64>>,
}

impl ForecastTable {
    /// Row `t` = `forecaster.forecast(&series[..=t], horizon)`.
    pub fn build(series: &[f64], forecaster: &impl Forecaster, horizon: usize) -> Self {
        Self {
            rows: (0..series.len())
                .map(|now| forecaster.forecast(&series[..=now], horizon))
                .collect(),
        }
    }

    /// The forecast made at hour `now` (`None` past the series).
    pub fn row(&self, now: usize) -> Option<&[f64]> {
        self.rows.get(now).map(Vec::as_slice)
    }
}

impl Forecaster for ForecastTable {
    fn forecast(&self, history: &[f64], horizon: usize) -> Vec<f64> {
        let row = history
            .len()
            .checked_sub(1)
            .and_then(|now| self.row(now))
            .unwrap_or(&[]);
        (0..horizon)
            .map(|h| row.get(h).copied().unwrap_or(f64::NAN))
            .collect()
    }
}

/// Number of inputs of [`RidgeForecaster`]'s per-horizon linear models.
const RIDGE_FEATURES: usize = 9;

/// An online linear model per forecast horizon, refitted every hour on the past only.
///
/// For an origin `t` and a target `u = t + h`, the prediction is `w_h · z(t, h)` with
///
/// ```text
/// z = [1, x(t), x(t−1), x(t−2), P(u), P(t), P(t−1), x(u − 24k), x(u − 168k)]
/// ```
///
/// where `P` is [`ProfileBlend`]'s same-hour profile over `profile_days` days and
/// `x(u − 24k)`, `x(u − 168k)` are the most recent measured values at the target's hour
/// of day and hour of week. [`ProfileBlend`] (profile + decaying anomaly + momentum) is
/// one point of this family; fitting the weights per horizon lets each zone and season
/// choose how much of today's level, yesterday's and last week's shape to carry.
///
/// Fitting: exponentially weighted ridge least squares. At hour `t` every pair
/// (origin `t − h`, target `t`) whose target has just been measured is added to horizon
/// `h`'s normal equations, which decay by `0.5^(1 / (24 · half_life_days))` per hour;
/// the weights used for the forecast at `t` are solved from those sums, so they depend
/// on hours `≤ t` only. Until `warmup_days` days of pairs exist, or when the system is
/// singular, the row falls back to [`ProfileBlend`] with the same profile length.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RidgeForecaster {
    /// Days the profiles `P` average (at least 1).
    pub profile_days: usize,
    /// Half-life of a training pair's weight, in days.
    pub half_life_days: f64,
    /// Ridge penalty as a share of the mean diagonal of the normal equations.
    pub ridge: f64,
    /// Days of training pairs before the model replaces the fallback.
    pub warmup_days: usize,
}

impl Default for RidgeForecaster {
    /// 28-day profiles, 60-day half-life, a ridge of 10⁻⁶ (only to keep the system
    /// solvable; larger penalties shrink towards 0 and measured worse on January–June).
    fn default() -> Self {
        Self {
            profile_days: 28,
            half_life_days: 60.0,
            ridge: 1e-6,
            warmup_days: 14,
        }
    }
}

/// Most recent measured value of hour `target` stepped back by whole `period`s to `≤ now`.
fn lagged(history: &[f64], target: usize, period: usize) -> Option<f64> {
    let now = history.len().checked_sub(1)?;
    let back = target.saturating_sub(now).div_ceil(period).max(1);
    target
        .checked_sub(back * period)
        .map(|hour| history[hour])
        .filter(|v| v.is_finite())
}

impl RidgeForecaster {
    fn profiler(&self) -> ProfileBlend {
        ProfileBlend {
            days: self.profile_days.max(1),
            decay: 0.98,
            momentum: 0.5,
        }
    }

    /// The inputs for origin `history.len() − 1` and horizon `h`; `None` when one is
    /// missing (too little history) or not finite.
    fn features(&self, history: &[f64], h: usize) -> Option<[f64; RIDGE_FEATURES]> {
        let profiler = self.profiler();
        let now = history.len().checked_sub(1)?;
        let target = now + h;
        let x = |back: usize| {
            now.checked_sub(back)
                .map(|i| history[i])
                .filter(|v| v.is_finite())
        };
        let z = [
            1.0,
            x(0)?,
            x(1)?,
            x(2)?,
            profiler.profile(history, target)?,
            profiler.profile(history, now)?,
            profiler.profile(&history[..now], now.checked_sub(1)?)?,
            lagged(history, target, 24)?,
            lagged(history, target, 168)?,
        ];
        z.iter().all(|v| v.is_finite()).then_some(z)
    }

    /// Row `t` of the result is the forecast made at hour `t` for hours `t + 1 ..= t +
    /// horizon`, from `series[..=t]` only (a property test checks this).
    pub fn table(&self, series: &[f64], horizon: usize) -> ForecastTable {
        ForecastTable {
            rows: self.rows_from(series, horizon, 0),
        }
    }

    /// The forecast made at the series' last hour: the last row of [`Self::table`],
    /// without solving the models of the earlier rows (what a live scheduler needs).
    pub fn latest(&self, series: &[f64], horizon: usize) -> Vec<f64> {
        self.rows_from(series, horizon, series.len().saturating_sub(1))
            .pop()
            .unwrap_or_else(|| vec![f64::NAN; horizon])
    }

    /// Rows `from..series.len()` of the table; the fit still runs over every hour.
    fn rows_from(&self, series: &[f64], horizon: usize, from: usize) -> Vec<Vec<f64>> {
        const P: usize = RIDGE_FEATURES;
        let fallback = self.profiler();
        let forget = if self.half_life_days > 0.0 && self.half_life_days.is_finite() {
            0.5f64.powf(1.0 / (24.0 * self.half_life_days))
        } else {
            1.0
        };
        let ridge = if self.ridge.is_finite() {
            self.ridge.max(0.0)
        } else {
            0.0
        };
        let warmup = (24 * self.warmup_days) as f64 * 0.5;
        // Per horizon: Σ w·z zᵀ, Σ w·z y, Σ w (effective number of pairs).
        let mut gram = vec![[[0.0f64; P]; P]; horizon];
        let mut cross = vec![[0.0f64; P]; horizon];
        let mut weight = vec![0.0f64; horizon];
        // features[t][h-1]: inputs at origin t for horizon h, kept until the target arrives.
        let mut pending: Vec<Vec<Option<[f64; P]>>> = Vec::with_capacity(series.len());
        let mut rows = Vec::with_capacity(series.len().saturating_sub(from));
        for now in 0..series.len() {
            let history = &series[..=now];
            let actual = series[now];
            for h in 1..=horizon {
                let (g, c, w) = (&mut gram[h - 1], &mut cross[h - 1], &mut weight[h - 1]);
                for row in g.iter_mut() {
                    for v in row.iter_mut() {
                        *v *= forget;
                    }
                }
                for v in c.iter_mut() {
                    *v *= forget;
                }
                *w *= forget;
                let Some(origin) = now.checked_sub(h) else {
                    continue;
                };
                if let (Some(z), true) = (pending[origin][h - 1], actual.is_finite()) {
                    for i in 0..P {
                        for j in 0..P {
                            g[i][j] += z[i] * z[j];
                        }
                        c[i] += z[i] * actual;
                    }
                    *w += 1.0;
                }
            }
            let inputs: Vec<Option<[f64; P]>> =
                (1..=horizon).map(|h| self.features(history, h)).collect();
            if now < from {
                pending.push(inputs);
                continue;
            }
            let simple = fallback.forecast(history, horizon);
            let row = (1..=horizon)
                .map(|h| {
                    let model = (weight[h - 1] >= warmup)
                        .then(|| solve_ridge(&gram[h - 1], &cross[h - 1], ridge))
                        .flatten();
                    match (model, inputs[h - 1]) {
                        (Some(w), Some(z)) => {
                            let value: f64 = w.iter().zip(&z).map(|(a, b)| a * b).sum();
                            if value.is_finite() {
                                value
                            } else {
                                simple[h - 1]
                            }
                        }
                        _ => simple[h - 1],
                    }
                })
                .collect();
            pending.push(inputs);
            rows.push(row);
        }
        rows
    }
}

/// Solves `(G + λ·mean(diag G)·I) w = c` by Gaussian elimination with partial pivoting;
/// `None` when the system is singular.
fn solve_ridge(
    gram: &[[f64; RIDGE_FEATURES]; RIDGE_FEATURES],
    cross: &[f64; RIDGE_FEATURES],
    ridge: f64,
) -> Option<[f64; RIDGE_FEATURES]> {
    const P: usize = RIDGE_FEATURES;
    let scale = (0..P).map(|i| gram[i][i]).sum::<f64>() / P as f64;
    let mut a = *gram;
    let mut b = *cross;
    for (i, row) in a.iter_mut().enumerate() {
        row[i] += ridge * scale;
    }
    for col in 0..P {
        let pivot = (col..P).max_by(|&i, &j| a[i][col].abs().total_cmp(&a[j][col].abs()))?;
        if a[pivot][col].abs() <= 1e-12 * scale.max(1e-300) {
            return None;
        }
        a.swap(col, pivot);
        b.swap(col, pivot);
        let (upper, lower) = a.split_at_mut(col + 1);
        let pivot_row = &upper[col];
        for (offset, row) in lower.iter_mut().enumerate() {
            let factor = row[col] / pivot_row[col];
            for (value, above) in row[col..].iter_mut().zip(&pivot_row[col..]) {
                *value -= factor * above;
            }
            b[col + 1 + offset] -= factor * b[col];
        }
    }
    let mut w = [0.0; P];
    for row in (0..P).rev() {
        let rest: f64 = (row + 1..P).map(|k| a[row][k] * w[k]).sum();
        w[row] = (b[row] - rest) / a[row][row];
    }
    w.iter().all(|v| v.is_finite()).then_some(w)
}

/// What the policy does this hour.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    StartNow,
    Wait,
}

/// One hour's decision for `job` at hour `now` (release ≤ now ≤ latest start), given the
/// measured intensity `current` of this hour and `forecast` for the following hours.
///
/// Start now when this is the latest start, or when the window starting now (its first
/// hour measured, the rest forecast) has a mean no higher than every later feasible
/// window's forecast mean. Ties start now: waiting for an equal forecast only adds risk.
/// A non-finite or missing forecast hour makes the windows that need it unusable; with
/// no usable later window the job starts now. Waiting is never forced by the forecast,
/// so the deadline holds whatever the forecaster returns.
pub fn decide(job: &Job, now: usize, current: f64, forecast: &[f64]) -> Decision {
    let Ok(latest) = job.latest_start() else {
        return Decision::StartNow;
    };
    if now >= latest || !current.is_finite() {
        return Decision::StartNow;
    }
    // value(h) for h = 0 (now) … ; forecast[h - 1] is hour now + h.
    let value = |h: usize| {
        if h == 0 {
            Some(current)
        } else {
            forecast.get(h - 1).copied().filter(|v| v.is_finite())
        }
    };
    let window = |offset: usize| -> Option<f64> {
        let mut sum = 0.0;
        for h in offset..offset + job.duration {
            sum += value(h)?;
        }
        Some(sum / job.duration as f64)
    };
    let Some(here) = window(0) else {
        return Decision::StartNow;
    };
    let better_later =
        (1..=latest - now).any(|offset| window(offset).is_some_and(|later| later < here));
    if better_later {
        Decision::Wait
    } else {
        Decision::StartNow
    }
}

/// Checks the job against the series and returns its latest start.
fn validate(job: &Job, series: &[f64]) -> Result<usize, ShiftError> {
    let latest = job.latest_start()?;
    if job.deadline > series.len() {
        return Err(ShiftError::SeriesTooShort {
            needed: job.deadline,
            len: series.len(),
        });
    }
    if let Some(offset) = series[job.release..job.deadline]
        .iter()
        .position(|v| !v.is_finite())
    {
        return Err(ShiftError::NonFinite {
            hour: job.release + offset,
        });
    }
    Ok(latest)
}

fn window_mean(series: &[f64], start: usize, duration: usize) -> f64 {
    series[start..start + duration].iter().sum::<f64>() / duration as f64
}

/// The online policy: from the release, each hour ask `forecaster` (which sees the series
/// only up to and including that hour) and [`decide`]. The result always meets the
/// deadline.
pub fn run_online(
    job: &Job,
    series: &[f64],
    forecaster: &(impl Forecaster + ?Sized),
) -> Result<Outcome, ShiftError> {
    let latest = validate(job, series)?;
    let mut now = job.release;
    while now < latest {
        let horizon = latest + job.duration - 1 - now;
        let forecast = forecaster.forecast(&series[..=now], horizon);
        if decide(job, now, series[now], &forecast) == Decision::StartNow {
            break;
        }
        now += 1;
    }
    Ok(Outcome {
        start: now,
        mean_intensity: window_mean(series, now, job.duration),
    })
}

/// Perfect foresight: the feasible start with the lowest window mean (the earliest on
/// ties). No policy can do better on the same job and series.
pub fn oracle(job: &Job, series: &[f64]) -> Result<Outcome, ShiftError> {
    let latest = validate(job, series)?;
    let mut best = Outcome {
        start: job.release,
        mean_intensity: window_mean(series, job.release, job.duration),
    };
    for start in job.release + 1..=latest {
        let mean = window_mean(series, start, job.duration);
        if mean.total_cmp(&best.mean_intensity).is_lt() {
            best = Outcome {
                start,
                mean_intensity: mean,
            };
        }
    }
    Ok(best)
}

/// The baseline: start on release.
pub fn no_shift(job: &Job, series: &[f64]) -> Result<Outcome, ShiftError> {
    validate(job, series)?;
    Ok(Outcome {
        start: job.release,
        mean_intensity: window_mean(series, job.release, job.duration),
    })
}

/// One candidate region for [`choose_region`].
#[derive(Debug, Clone, PartialEq)]
pub struct RegionOffer {
    pub name: String,
    /// Forecast intensity (gCO₂eq/kWh) for each hour the job would run there.
    pub carbon_forecast: Vec<f64>,
    /// Expected energy price over the job's hours (any one currency per MWh for all).
    pub price: f64,
    /// Free capacity in the job's unit (e.g. GPUs).
    pub free_capacity: f64,
}

/// Relative importance of the three criteria; only their ratios matter. Negative or
/// non-finite weights count as 0; all zero ranks by input order.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RegionWeights {
    pub carbon: f64,
    pub price: f64,
    pub capacity: f64,
}

/// Why a region was not ranked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Excluded {
    /// Less free capacity than the job needs.
    NoCapacity,
    /// An empty carbon forecast, or a NaN/infinite forecast, price or capacity.
    BadInput,
}

/// A region's place in the ranking; `score` in [0, 1], lower is better.
#[derive(Debug, Clone, PartialEq)]
pub struct RankedRegion {
    /// Index into the offers passed in.
    pub index: usize,
    pub score: f64,
    /// Mean forecast intensity over the job's hours.
    pub mean_carbon: f64,
}

/// The ranking: feasible regions best first, then the excluded ones with the reason.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Ranking {
    pub ranked: Vec<RankedRegion>,
    pub excluded: Vec<(usize, Excluded)>,
}

/// Spatial shifting: ranks the regions that can host a job needing `demand` capacity.
///
/// Scoring: regions with `free_capacity < demand` (or bad numbers) are excluded. For
/// the rest, each criterion is min–max normalised over the candidates to [0, 1], 0 the
/// best: mean forecast carbon over the job's hours (lower better), price (lower better)
/// and free capacity (higher better, as headroom for the rest of the queue). The score
/// is the weighted mean of the three, `Σ wᵢ·nᵢ / Σ wᵢ`. A criterion on which all
/// candidates are equal scores 0 for all, so it cannot decide. Min–max normalisation
/// is used because the units (g/kWh, currency/MWh, GPUs) are not comparable, so a
/// weight means "share of the decision" rather than an exchange rate; the price of that
/// choice is that adding or removing a candidate can change the scale. Ties keep the
/// input order, so the result is deterministic.
pub fn choose_region(offers: &[RegionOffer], demand: f64, weights: RegionWeights) -> Ranking {
    let clean = |w: f64| if w.is_finite() && w > 0.0 { w } else { 0.0 };
    let (wc, wp, wf) = (
        clean(weights.carbon),
        clean(weights.price),
        clean(weights.capacity),
    );
    let mut ranking = Ranking::default();
    let mut feasible = Vec::new();
    for (index, offer) in offers.iter().enumerate() {
        let finite = !offer.carbon_forecast.is_empty()
            && offer.carbon_forecast.iter().all(|v| v.is_finite())
            && offer.price.is_finite()
            && offer.free_capacity.is_finite();
        if !finite {
            ranking.excluded.push((index, Excluded::BadInput));
        } else if offer.free_capacity < demand {
            ranking.excluded.push((index, Excluded::NoCapacity));
        } else {
            let carbon =
                offer.carbon_forecast.iter().sum::<f64>() / offer.carbon_forecast.len() as f64;
            feasible.push((index, carbon, offer.price, offer.free_capacity));
        }
    }
    let range = |pick: fn(&(usize, f64, f64, f64)) -> f64| {
        feasible
            .iter()
            .map(pick)
            .fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), v| {
                (lo.min(v), hi.max(v))
            })
    };
    // 0 for the best value, 1 for the worst.
    let norm = |value: f64, (lo, hi): (f64, f64), higher_is_better: bool| {
        if hi - lo <= 0.0 {
            0.0
        } else if higher_is_better {
            (hi - value) / (hi - lo)
        } else {
            (value - lo) / (hi - lo)
        }
    };
    let (carbon_range, price_range, free_range) = (range(|f| f.1), range(|f| f.2), range(|f| f.3));
    let total = wc + wp + wf;
    ranking.ranked = feasible
        .iter()
        .map(|&(index, carbon, price, free)| {
            let score = if total > 0.0 {
                (wc * norm(carbon, carbon_range, false)
                    + wp * norm(price, price_range, false)
                    + wf * norm(free, free_range, true))
                    / total
            } else {
                0.0
            };
            RankedRegion {
                index,
                score,
                mean_carbon: carbon,
            }
        })
        .collect();
    // Stable sort: ties keep the input order.
    ranking.ranked.sort_by(|a, b| a.score.total_cmp(&b.score));
    ranking
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// A clean daily cycle: low at 03:00, high at 15:00.
    fn daily(days: usize) -> Vec<f64> {
        (0..days * 24)
            .map(|h| 200.0 + 100.0 * ((h % 24) as f64 / 24.0 * std::f64::consts::TAU).sin())
            .collect()
    }

    #[test]
    fn latest_start_and_bad_jobs() {
        assert_eq!(Job::with_slack(5, 2, 3).latest_start(), Ok(8));
        let zero = Job {
            release: 0,
            duration: 0,
            deadline: 4,
        };
        assert_eq!(zero.latest_start(), Err(ShiftError::ZeroDuration));
        let tight = Job {
            release: 5,
            duration: 3,
            deadline: 7,
        };
        assert!(matches!(
            tight.latest_start(),
            Err(ShiftError::Infeasible(_))
        ));
        let series = [1.0; 10];
        assert!(matches!(
            oracle(&Job::with_slack(5, 2, 8), &series),
            Err(ShiftError::SeriesTooShort { .. })
        ));
        let mut nan = series.to_vec();
        nan[6] = f64::NAN;
        assert_eq!(
            no_shift(&Job::with_slack(5, 1, 2), &nan),
            Err(ShiftError::NonFinite { hour: 6 })
        );
    }

    #[test]
    fn oracle_picks_the_cheapest_window_and_baseline_starts_on_release() {
        let series = [5.0, 4.0, 9.0, 1.0, 1.0, 8.0, 0.0];
        let job = Job::with_slack(0, 2, 4);
        assert_eq!(oracle(&job, &series).map(|o| o.start), Ok(3));
        assert_eq!(no_shift(&job, &series).map(|o| o.mean_intensity), Ok(4.5));
    }

    #[test]
    fn profile_blend_learns_a_daily_cycle() {
        let series = daily(20);
        let now = 24 * 19 + 5;
        let forecast = ProfileBlend::default().forecast(&series[..=now], 30);
        for (h, value) in forecast.iter().enumerate() {
            assert!((value - series[(now + 1 + h) % 24]).abs() < 1e-9);
        }
    }

    #[test]
    fn profile_blend_starts_as_persistence() {
        let forecast = ProfileBlend::default().forecast(&[3.0, 7.0], 3);
        assert_eq!(forecast, vec![7.0, 7.0, 7.0]);
        assert!(ProfileBlend::default()
            .forecast(&[], 2)
            .iter()
            .all(|v| v.is_nan()));
    }

    #[test]
    fn ridge_learns_a_daily_cycle_and_falls_back_before_warmup() {
        let series = daily(40);
        let ridge = RidgeForecaster::default();
        let table = ridge.table(&series, 10);
        let now = 24 * 39 + 5;
        for (h, value) in table.row(now).expect("row").iter().enumerate() {
            let actual = series[(now + 1 + h) % 24];
            assert!(
                (value - actual).abs() < 1e-3 * 300.0,
                "h {h}: {value} vs {actual}"
            );
        }
        // Day 3 is before the 14-day warm-up: the profile blend answers.
        let early = 24 * 3 + 2;
        let fallback = ridge.profiler().forecast(&series[..=early], 10);
        assert_eq!(table.row(early).expect("row"), fallback.as_slice());
    }

    #[test]
    fn forecast_table_matches_the_forecaster() {
        let series = daily(3);
        let table = ForecastTable::build(&series, &ProfileBlend::default(), 6);
        for now in [0, 10, 40, 71] {
            assert_eq!(
                table.forecast(&series[..=now], 6),
                ProfileBlend::default().forecast(&series[..=now], 6)
            );
        }
    }

    #[test]
    fn policy_waits_for_the_night_on_a_daily_cycle() {
        let series = daily(10);
        // Released at 12:00 on day 8 with a day of slack: the trough is at 18:00.
        let job = Job::with_slack(24 * 8 + 12, 1, 24);
        let online = run_online(&job, &series, &ProfileBlend::default()).expect("valid");
        let best = oracle(&job, &series).expect("valid");
        assert_eq!(online, best);
        assert_eq!(online.start % 24, 18);
    }

    #[test]
    fn garbage_forecasts_still_meet_the_deadline() {
        struct Liar;
        impl Forecaster for Liar {
            fn forecast(&self, _: &[f64], horizon: usize) -> Vec<f64> {
                vec![-1e9; horizon]
            }
        }
        let series = daily(2);
        let job = Job::with_slack(3, 4, 10);
        let outcome = run_online(&job, &series, &Liar).expect("valid");
        assert_eq!(outcome.start, 13);
        assert!(outcome.meets(&job));
    }

    fn offer(name: &str, carbon: f64, price: f64, free: f64) -> RegionOffer {
        RegionOffer {
            name: name.into(),
            carbon_forecast: vec![carbon; 3],
            price,
            free_capacity: free,
        }
    }

    #[test]
    fn choose_region_weights_and_exclusions() {
        let offers = [
            offer("clean-dear", 50.0, 200.0, 8.0),
            offer("dirty-cheap", 600.0, 20.0, 8.0),
            offer("full", 10.0, 10.0, 1.0),
            offer("broken", f64::NAN, 10.0, 10.0),
        ];
        let carbon = RegionWeights {
            carbon: 1.0,
            price: 0.0,
            capacity: 0.0,
        };
        let ranking = choose_region(&offers, 2.0, carbon);
        assert_eq!(
            ranking.ranked.iter().map(|r| r.index).collect::<Vec<_>>(),
            vec![0, 1]
        );
        assert_eq!(
            ranking.excluded,
            vec![(2, Excluded::NoCapacity), (3, Excluded::BadInput)]
        );
        let price = RegionWeights {
            carbon: 0.2,
            price: 0.8,
            capacity: 0.0,
        };
        let ranking = choose_region(&offers, 2.0, price);
        assert_eq!(ranking.ranked[0].index, 1);
        assert!((ranking.ranked[0].score - 0.2).abs() < 1e-12);
        assert!((ranking.ranked[1].score - 0.8).abs() < 1e-12);
    }

    #[test]
    fn choose_region_capacity_breaks_ties_and_equal_offers_keep_order() {
        let offers = [offer("a", 100.0, 50.0, 4.0), offer("b", 100.0, 50.0, 9.0)];
        let weights = RegionWeights {
            carbon: 1.0,
            price: 1.0,
            capacity: 1.0,
        };
        assert_eq!(choose_region(&offers, 1.0, weights).ranked[0].index, 1);
        let same = [offer("a", 1.0, 1.0, 1.0), offer("b", 1.0, 1.0, 1.0)];
        let ranking = choose_region(&same, 1.0, weights);
        assert_eq!(
            ranking.ranked.iter().map(|r| r.index).collect::<Vec<_>>(),
            vec![0, 1]
        );
        assert!(choose_region(&[], 1.0, weights).ranked.is_empty());
    }

    fn arb_case() -> impl Strategy<Value = (Vec<f64>, Job)> {
        (1usize..6, 0usize..30, 0usize..60).prop_flat_map(|(duration, slack, release)| {
            let len = release + duration + slack;
            (
                prop::collection::vec(0.0f64..800.0, len..len + 80),
                Just(Job::with_slack(release, duration, slack)),
            )
        })
    }

    proptest! {
        /// Whatever the forecast, the job starts in its window, so it meets the deadline,
        /// and it never beats the oracle (nor is the oracle worse than the baseline).
        #[test]
        fn deadlines_met_and_oracle_never_beaten((series, job) in arb_case(), days in 1usize..20, decay in 0.0f64..1.0, momentum in 0.0f64..2.0) {
            let forecaster = ProfileBlend { days, decay, momentum };
            let online = run_online(&job, &series, &forecaster).expect("valid");
            let best = oracle(&job, &series).expect("valid");
            let base = no_shift(&job, &series).expect("valid");
            prop_assert!(online.meets(&job));
            prop_assert!(best.meets(&job));
            prop_assert!(best.mean_intensity <= online.mean_intensity + 1e-9);
            prop_assert!(best.mean_intensity <= base.mean_intensity + 1e-9);
        }

        /// With perfect foresight the online policy reaches the oracle's emissions.
        #[test]
        fn perfect_forecast_equals_oracle((series, job) in arb_case()) {
            let online = run_online(&job, &series, &PerfectForesight { series: &series }).expect("valid");
            let best = oracle(&job, &series).expect("valid");
            prop_assert!((online.mean_intensity - best.mean_intensity).abs() < 1e-9);
        }

        /// Changing any hour after `now` leaves the forecast made at `now` unchanged.
        #[test]
        fn forecaster_never_reads_the_future(
            series in prop::collection::vec(0.0f64..800.0, 2..200),
            cut in any::<prop::sample::Index>(),
            noise in prop::collection::vec(-500.0f64..500.0, 200),
            days in 1usize..20,
            decay in 0.0f64..1.0,
            momentum in 0.0f64..2.0,
        ) {
            let now = cut.index(series.len());
            let mut changed = series.clone();
            for (value, delta) in changed.iter_mut().zip(&noise).skip(now + 1) {
                *value += delta;
            }
            let forecaster = ProfileBlend { days, decay, momentum };
            let table = ForecastTable::build(&series, &forecaster, 30);
            let changed_table = ForecastTable::build(&changed, &forecaster, 30);
            prop_assert_eq!(table.row(now), changed_table.row(now));
            // And decisions made at `now` do not change either.
            let job = Job::with_slack(now, 1, 20);
            prop_assert_eq!(
                decide(&job, now, series[now], table.row(now).unwrap_or(&[])),
                decide(&job, now, changed[now], changed_table.row(now).unwrap_or(&[]))
            );
        }

        /// The online linear model's forecast at `now` ignores every later hour, and the
        /// policy driven by it meets every deadline.
        #[test]
        fn ridge_never_reads_the_future(
            series in prop::collection::vec(0.0f64..800.0, 2..400),
            cut in any::<prop::sample::Index>(),
            noise in prop::collection::vec(-500.0f64..500.0, 400),
            half_life_days in 0.5f64..100.0,
            warmup_days in 0usize..3,
        ) {
            let now = cut.index(series.len());
            let mut changed = series.clone();
            for (value, delta) in changed.iter_mut().zip(&noise).skip(now + 1) {
                *value += delta;
            }
            let ridge = RidgeForecaster { half_life_days, warmup_days, ..RidgeForecaster::default() };
            let table = ridge.table(&series, 12);
            let changed_table = ridge.table(&changed, 12);
            prop_assert_eq!(table.row(now), changed_table.row(now));
            // What a live scheduler computes is the table's row at its last hour.
            let latest = ridge.latest(&series[..=now], 12);
            prop_assert_eq!(Some(latest.as_slice()), table.row(now));
            let release = now.min(series.len().saturating_sub(12));
            if release + 12 <= series.len() {
                let job = Job::with_slack(release, 2, 10);
                let online = run_online(&job, &series, &table).expect("valid");
                prop_assert!(online.meets(&job));
            }
        }

        /// Rankings hold only regions with room, scores are in [0, 1] and sorted.
        #[test]
        fn choose_region_is_well_formed(
            regions in prop::collection::vec((0.0f64..900.0, -50.0f64..500.0, 0.0f64..16.0), 0..10),
            demand in 0.0f64..8.0,
            wc in 0.0f64..1.0, wp in 0.0f64..1.0, wf in 0.0f64..1.0,
        ) {
            let offers: Vec<RegionOffer> = regions.iter().enumerate()
                .map(|(i, (c, p, f))| offer(&i.to_string(), *c, *p, *f)).collect();
            let ranking = choose_region(&offers, demand, RegionWeights { carbon: wc, price: wp, capacity: wf });
            prop_assert_eq!(ranking.ranked.len() + ranking.excluded.len(), offers.len());
            for pair in ranking.ranked.windows(2) {
                prop_assert!(pair[0].score <= pair[1].score);
            }
            for region in &ranking.ranked {
                prop_assert!(offers[region.index].free_capacity >= demand);
                prop_assert!((0.0..=1.0 + 1e-12).contains(&region.score));
            }
        }
    }
}
