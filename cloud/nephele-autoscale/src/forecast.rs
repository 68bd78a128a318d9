//! Request-rate forecasters, fed one bucket (a count of arrivals over a fixed length of
//! time) at a time. Each forecaster holds only what it has been fed, so a forecast made
//! after bucket `t` depends on buckets `..=t` and nothing later (property-tested).
//!
//! | kind             | model                                                          |
//! |------------------|----------------------------------------------------------------|
//! | `last`           | the last bucket again (naive)                                  |
//! | `ewma`           | exponentially weighted mean, flat forecast                     |
//! | `holt`           | level + damped trend (Holt's linear method, Gardner–McKenzie)  |
//! | `seasonal-naive` | the same bucket one season ago                                 |
//! | `holt-winters`   | level + damped trend + additive season (daily by default)      |
//!
//! Counts are forecast in buckets; [`RateForecaster`] turns tick-sized arrival counts
//! into buckets and forecasts into requests per second. Which kind the scaler uses is a
//! measured choice (`nephele sim autoscale` reports each kind's error per horizon on the
//! part of each trace that did not choose the parameters).

use serde::{Deserialize, Serialize};

/// Which model, with its smoothing parameters (all in 0..=1; `phi` is the trend's
/// damping, `season` the season's length in buckets).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "kebab-case")]
pub enum ForecasterKind {
    Last,
    Ewma {
        alpha: f64,
    },
    Holt {
        alpha: f64,
        beta: f64,
        phi: f64,
    },
    SeasonalNaive {
        season: usize,
    },
    HoltWinters {
        alpha: f64,
        beta: f64,
        gamma: f64,
        phi: f64,
        season: usize,
    },
}

impl ForecasterKind {
    /// A short label for tables.
    pub fn label(&self) -> String {
        match self {
            ForecasterKind::Last => "last".into(),
            ForecasterKind::Ewma { alpha } => format!("ewma(a={alpha})"),
            ForecasterKind::Holt { alpha, beta, phi } => {
                format!("holt(a={alpha},b={beta},phi={phi})")
            }
            ForecasterKind::SeasonalNaive { season } => format!("seasonal-naive(m={season})"),
            ForecasterKind::HoltWinters {
                alpha,
                beta,
                gamma,
                phi,
                season,
            } => format!("holt-winters(a={alpha},b={beta},g={gamma},phi={phi},m={season})"),
        }
    }

    /// Parameters out of range, as a sentence.
    pub fn problem(&self) -> Option<String> {
        let unit = |name: &str, value: f64| {
            (!(0.0..=1.0).contains(&value)).then(|| format!("{name} must be in 0..=1, not {value}"))
        };
        match self {
            ForecasterKind::Last => None,
            ForecasterKind::Ewma { alpha } => unit("alpha", *alpha),
            ForecasterKind::Holt { alpha, beta, phi } => unit("alpha", *alpha)
                .or_else(|| unit("beta", *beta))
                .or_else(|| unit("phi", *phi)),
            ForecasterKind::SeasonalNaive { season } => {
                (*season == 0).then(|| "season must be at least 1 bucket".to_string())
            }
            ForecasterKind::HoltWinters {
                alpha,
                beta,
                gamma,
                phi,
                season,
            } => unit("alpha", *alpha)
                .or_else(|| unit("beta", *beta))
                .or_else(|| unit("gamma", *gamma))
                .or_else(|| unit("phi", *phi))
                .or_else(|| (*season < 2).then(|| "season must be at least 2 buckets".to_string())),
        }
    }
}

/// One forecaster's state. Fed with [`Forecaster::observe`], read with
/// [`Forecaster::forecast`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Forecaster {
    pub kind: ForecasterKind,
    /// Buckets seen.
    pub seen: u64,
    level: f64,
    trend: f64,
    /// Seasonal offsets (Holt-Winters) or the last season's values (seasonal naive),
    /// indexed by bucket number modulo the season.
    season: Vec<f64>,
    last: f64,
}

impl Forecaster {
    pub fn new(kind: ForecasterKind) -> Forecaster {
        let season = match &kind {
            ForecasterKind::SeasonalNaive { season }
            | ForecasterKind::HoltWinters { season, .. } => {
                vec![0.0; (*season).max(1)]
            }
            _ => Vec::new(),
        };
        Forecaster {
            kind,
            seen: 0,
            level: 0.0,
            trend: 0.0,
            season,
            last: 0.0,
        }
    }

    /// Feeds the next bucket's count. Non-finite or negative values count as 0.
    pub fn observe(&mut self, value: f64) {
        let value = if value.is_finite() {
            value.max(0.0)
        } else {
            0.0
        };
        let index = self.seen;
        self.seen += 1;
        self.last = value;
        match self.kind.clone() {
            ForecasterKind::Last => {}
            ForecasterKind::Ewma { alpha } => {
                self.level = if index == 0 {
                    value
                } else {
                    alpha * value + (1.0 - alpha) * self.level
                };
            }
            ForecasterKind::Holt { alpha, beta, phi } => {
                if index == 0 {
                    self.level = value;
                    self.trend = 0.0;
                } else {
                    let previous = self.level;
                    self.level = alpha * value + (1.0 - alpha) * (previous + phi * self.trend);
                    self.trend = beta * (self.level - previous) + (1.0 - beta) * phi * self.trend;
                }
            }
            ForecasterKind::SeasonalNaive { season } => {
                let slot = (index % season.max(1) as u64) as usize;
                self.season[slot] = value;
            }
            ForecasterKind::HoltWinters {
                alpha,
                beta,
                gamma,
                phi,
                season,
            } => {
                let slot = (index % season as u64) as usize;
                if index < season as u64 {
                    // The first season has no seasonal estimate yet: fit the level and
                    // trend as Holt does, and keep each bucket's deviation from the
                    // level as its first seasonal offset.
                    if index == 0 {
                        self.level = value;
                    } else {
                        let previous = self.level;
                        self.level = alpha * value + (1.0 - alpha) * (previous + phi * self.trend);
                        self.trend =
                            beta * (self.level - previous) + (1.0 - beta) * phi * self.trend;
                    }
                    self.season[slot] = value - self.level;
                } else {
                    let previous = self.level;
                    let offset = self.season[slot];
                    self.level =
                        alpha * (value - offset) + (1.0 - alpha) * (previous + phi * self.trend);
                    self.trend = beta * (self.level - previous) + (1.0 - beta) * phi * self.trend;
                    self.season[slot] = gamma * (value - self.level) + (1.0 - gamma) * offset;
                }
            }
        }
    }

    /// The count forecast for the bucket `horizon` buckets after the last one fed
    /// (`horizon` ≥ 1; 0 is read as 1). Never negative; 0 before anything was fed.
    pub fn forecast(&self, horizon: usize) -> f64 {
        if self.seen == 0 {
            return 0.0;
        }
        let horizon = horizon.max(1);
        let damped_sum = |phi: f64| -> f64 {
            // phi + phi² + … + phi^h
            let mut sum = 0.0;
            let mut power = 1.0;
            for _ in 0..horizon {
                power *= phi;
                sum += power;
            }
            sum
        };
        let value = match &self.kind {
            ForecasterKind::Last => self.last,
            ForecasterKind::Ewma { .. } => self.level,
            ForecasterKind::Holt { phi, .. } => self.level + damped_sum(*phi) * self.trend,
            ForecasterKind::SeasonalNaive { season } => {
                let season = (*season).max(1) as u64;
                if self.seen < season {
                    self.last
                } else {
                    let target = self.seen - 1 + horizon as u64;
                    self.season[(target % season) as usize]
                }
            }
            ForecasterKind::HoltWinters { phi, season, .. } => {
                let season = *season as u64;
                let base = self.level + damped_sum(*phi) * self.trend;
                if self.seen < season {
                    base
                } else {
                    let target = self.seen - 1 + horizon as u64;
                    base + self.season[(target % season) as usize]
                }
            }
        };
        if value.is_finite() {
            value.max(0.0)
        } else {
            0.0
        }
    }
}

/// Turns arrival counts reported at ticks into fixed buckets for a [`Forecaster`], and
/// its forecasts into rates. A tick's arrivals are counted in the bucket that holds the
/// tick's time minus one millisecond (the window ends at the tick).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RateForecaster {
    pub bucket_ms: u64,
    pub forecaster: Forecaster,
    /// Start of the bucket being filled; `None` before the first report.
    bucket_start_ms: Option<u64>,
    count: f64,
}

/// After this many empty buckets in a row (a shell that was down), the rest of a gap is
/// not fed one bucket at a time.
const MAX_GAP_BUCKETS: u64 = 7 * 24 * 60;

impl RateForecaster {
    pub fn new(kind: ForecasterKind, bucket_ms: u64) -> RateForecaster {
        RateForecaster {
            bucket_ms: bucket_ms.max(1),
            forecaster: Forecaster::new(kind),
            bucket_start_ms: None,
            count: 0.0,
        }
    }

    /// Records `arrivals` over the window that ends at `now_ms`. Returns the counts of
    /// the buckets this closed, oldest first (what was fed to the forecaster).
    pub fn record(&mut self, now_ms: u64, arrivals: u64) -> Vec<f64> {
        let at = now_ms.saturating_sub(1);
        let bucket = at - at % self.bucket_ms;
        let mut closed = Vec::new();
        match self.bucket_start_ms {
            None => self.bucket_start_ms = Some(bucket),
            Some(start) if bucket > start => {
                closed.push(self.count);
                self.forecaster.observe(self.count);
                let empty = ((bucket - start) / self.bucket_ms - 1).min(MAX_GAP_BUCKETS) as usize;
                closed.extend(std::iter::repeat_n(0.0, empty));
                for _ in 0..empty {
                    self.forecaster.observe(0.0);
                }
                self.bucket_start_ms = Some(bucket);
                self.count = 0.0;
            }
            // A report from the past (clock went back) counts in the current bucket.
            Some(_) => {}
        }
        self.count += arrivals as f64;
        closed
    }

    /// The model and its parameters, as a label (`holt-winters(a=0.3,…)`).
    pub fn kind_name(&self) -> String {
        self.forecaster.kind.label()
    }

    /// The forecast rate (requests per second) of the bucket `horizon` after the last
    /// closed one.
    pub fn rate_per_s(&self, horizon: usize) -> f64 {
        self.forecaster.forecast(horizon) * 1000.0 / self.bucket_ms as f64
    }

    /// The highest forecast rate over horizons `first..=last` (at least 1).
    pub fn peak_rate_per_s(&self, first: usize, last: usize) -> f64 {
        (first.max(1)..=last.max(first).max(1))
            .map(|h| self.rate_per_s(h))
            .fold(0.0, f64::max)
    }

    /// The horizon of the bucket that holds `at_ms`: 1 for the bucket being filled
    /// (forecasts are made from closed buckets only), 2 for the next, … (1 for times
    /// before it, and before the first report).
    pub fn horizon_at(&self, at_ms: u64) -> usize {
        let Some(start) = self.bucket_start_ms else {
            return 1;
        };
        let ahead = at_ms.saturating_sub(start) / self.bucket_ms;
        usize::try_from(ahead)
            .unwrap_or(usize::MAX - 1)
            .saturating_add(1)
    }
}

/// Forecast error of one kind at one horizon, in requests per second.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ForecastError {
    pub horizon: usize,
    /// Mean absolute error.
    pub mae: f64,
    pub rmse: f64,
    /// Mean of actual − forecast (positive: the forecast is low).
    pub bias: f64,
    /// MAE over the mean actual rate.
    pub relative_mae: f64,
    pub points: usize,
}

/// Feeds `counts` (one per bucket of `bucket_ms`) in order and scores the forecasts of
/// buckets at index ≥ `score_from`, made `h` buckets earlier, for each `h` in
/// `horizons`. Each forecast is made before the bucket it predicts is fed.
pub fn evaluate(
    kind: &ForecasterKind,
    counts: &[f64],
    bucket_ms: u64,
    horizons: &[usize],
    score_from: usize,
) -> Vec<ForecastError> {
    let to_rate = 1000.0 / bucket_ms.max(1) as f64;
    let max_h = horizons.iter().copied().max().unwrap_or(1).max(1);
    // pending[h - 1][i]: the forecast of bucket i made h buckets before it.
    let mut made: Vec<Vec<Option<f64>>> = vec![vec![None; counts.len()]; max_h];
    let mut forecaster = Forecaster::new(kind.clone());
    for (index, value) in counts.iter().enumerate() {
        forecaster.observe(*value);
        for h in 1..=max_h {
            if let Some(slot) = made[h - 1].get_mut(index + h) {
                *slot = Some(forecaster.forecast(h));
            }
        }
    }
    horizons
        .iter()
        .map(|&h| {
            let h = h.max(1);
            let (mut abs, mut sq, mut bias, mut actual_sum, mut n) = (0.0, 0.0, 0.0, 0.0, 0usize);
            for (index, value) in counts.iter().enumerate().skip(score_from) {
                if let Some(Some(forecast)) = made[h - 1].get(index) {
                    let error = (value - forecast) * to_rate;
                    abs += error.abs();
                    sq += error * error;
                    bias += error;
                    actual_sum += value * to_rate;
                    n += 1;
                }
            }
            let points = n.max(1) as f64;
            ForecastError {
                horizon: h,
                mae: abs / points,
                rmse: (sq / points).sqrt(),
                bias: bias / points,
                relative_mae: if actual_sum > 0.0 {
                    abs / actual_sum
                } else {
                    0.0
                },
                points: n,
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(kind: ForecasterKind, series: &[f64], horizon: usize, expected: f64) {
        let mut forecaster = Forecaster::new(kind.clone());
        for value in series {
            forecaster.observe(*value);
        }
        let got = forecaster.forecast(horizon);
        assert!(
            (got - expected).abs() < 1e-6,
            "{kind:?} on {series:?} at h={horizon}: got {got}, expected {expected}"
        );
    }

    #[test]
    fn simple_models_forecast_what_they_should() {
        check(ForecasterKind::Last, &[1.0, 5.0], 3, 5.0);
        check(ForecasterKind::Ewma { alpha: 0.5 }, &[4.0, 8.0], 1, 6.0);
        // A straight line with an undamped trend is extrapolated exactly.
        let line: Vec<f64> = (0..50).map(|i| 2.0 * i as f64).collect();
        check(
            ForecasterKind::Holt {
                alpha: 0.8,
                beta: 0.8,
                phi: 1.0,
            },
            &line,
            3,
            104.0,
        );
        check(
            ForecasterKind::SeasonalNaive { season: 3 },
            &[1.0, 2.0, 3.0, 4.0],
            1,
            2.0,
        );
        // Nothing fed: 0. Never negative.
        check(ForecasterKind::Last, &[], 1, 0.0);
        check(
            ForecasterKind::Holt {
                alpha: 1.0,
                beta: 1.0,
                phi: 1.0,
            },
            &[10.0, 0.0],
            5,
            0.0,
        );
    }

    #[test]
    fn holt_winters_learns_a_season() {
        let season = [0.0, 10.0, 20.0, 10.0];
        let series: Vec<f64> = (0..40).map(|i| 5.0 + season[i % 4]).collect();
        let kind = ForecasterKind::HoltWinters {
            alpha: 0.3,
            beta: 0.0,
            gamma: 0.5,
            phi: 1.0,
            season: 4,
        };
        let mut forecaster = Forecaster::new(kind);
        for value in &series {
            forecaster.observe(*value);
        }
        // The next bucket is index 40 → season slot 0.
        for h in 1..=4 {
            let expected = 5.0 + season[(39 + h) % 4];
            assert!((forecaster.forecast(h) - expected).abs() < 0.5, "h={h}");
        }
    }

    #[test]
    fn buckets_close_when_time_passes_them() {
        let mut rate = RateForecaster::new(ForecasterKind::Last, 60_000);
        assert!(rate.record(5_000, 3).is_empty());
        assert!(rate.record(60_000, 2).is_empty(), "the window ends at 60 s");
        assert_eq!(rate.record(65_000, 1), vec![5.0]);
        assert_eq!(rate.record(185_000, 4), vec![1.0, 0.0]);
        assert!((rate.rate_per_s(1) - 0.0).abs() < 1e-9);
        assert_eq!(rate.record(245_000, 0), vec![4.0]);
        assert!((rate.rate_per_s(1) - 4.0 / 60.0).abs() < 1e-9);
    }

    #[test]
    fn evaluation_scores_forecasts_made_before_the_bucket() {
        let counts = [1.0, 2.0, 3.0, 4.0];
        let errors = evaluate(&ForecasterKind::Last, &counts, 1000, &[1, 2], 0);
        // h=1: forecasts of buckets 1..3 are 1, 2, 3 → error 1 each.
        assert_eq!(errors[0].points, 3);
        assert!((errors[0].mae - 1.0).abs() < 1e-9);
        assert!((errors[1].mae - 2.0).abs() < 1e-9);
    }
}
