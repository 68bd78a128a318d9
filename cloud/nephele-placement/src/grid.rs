//! A region's live grid signal: the hourly carbon intensity (and energy price) a feed
//! pushes, the outlook the scheduler plans with, and the two carbon decisions the
//! control plane makes with it: when a deferrable job starts (temporal shifting) and
//! how green a region's best window for a job is (the carbon input of
//! [`crate::carbon::choose_region`], spatial shifting).
//!
//! Hours are unix hours (`unix seconds / 3600`, UTC). Carbon values are *measurements*:
//! a point for an hour after the current one is refused, so every forecast is made
//! from the past only, exactly as `nephele sim shift` measures it — the forecast is
//! [`RidgeForecaster::latest`], the last row of the table the simulator uses, and the
//! decision is [`crate::carbon::decide`] (a property test checks that the live decision
//! and the simulator's [`crate::carbon::run_online`] start a job in the same hour).
//! Prices may be pushed up to [`PRICE_AHEAD_HOURS`] ahead, as a day-ahead market
//! publishes them.
//!
//! A **provider's forecast** (a carbon-intensity service's, which may know tomorrow's
//! wind and solar) is kept beside the measurements, never mixed with them
//! ([`GridSeries::ingest_forecast`]): one forecast at a time, replaced whole when a newer
//! one arrives (an older one is refused), and used for the hours it covers in place of
//! the project's own forecast while it is at most [`FORECAST_FRESH_HOURS`] old; a
//! measurement of an hour always wins over any forecast of it.
//!
//! Pure and deterministic: time is an argument, no IO, no clock. Bad input is a
//! [`GridError`] naming the point, and a refused batch changes nothing.

use std::fmt;

use crate::carbon::{decide, Decision, Job, RidgeForecaster};

/// Seconds in an hour.
pub const HOUR_S: u64 = 3600;
/// Hours of history kept (90 days): the forecaster's profiles read 28 days back and
/// its fit forgets with a 30-day half-life.
pub const RETAIN_HOURS: u64 = 24 * 90;
/// Hours the outlook reaches from the current hour.
pub const HORIZON_HOURS: usize = 72;
/// A feed whose newest carbon measurement is more than this many hours old is stale:
/// jobs stop waiting for it.
pub const STALE_HOURS: u64 = 6;
/// How far ahead a price may be pushed (a day-ahead market's reach).
pub const PRICE_AHEAD_HOURS: u64 = 48;
/// Points in one push.
pub const MAX_POINTS: usize = 24 * 400;
/// Above any grid's intensity (lignite is about 1,100 g/kWh).
pub const MAX_CARBON_G_PER_KWH: f64 = 5000.0;
/// Beyond any market's price cap, in either direction.
pub const MAX_ABS_PRICE: f64 = 100_000.0;
/// How far ahead of its issue a provider's forecast may reach (a week).
pub const FORECAST_AHEAD_HOURS: u64 = 24 * 7;
/// A provider's forecast is used while it is at most this old (since it was issued);
/// after that the outlook falls back to the project's own forecast.
pub const FORECAST_FRESH_HOURS: u64 = 12;

/// `YYYY-MM-DD HH:00 UTC` of a unix hour (Howard Hinnant's civil-from-days).
pub fn utc_hour(hour: u64) -> String {
    let days = (hour / 24) as i64 + 719_468;
    let era = days.div_euclid(146_097);
    let doe = days - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!("{year:04}-{month:02}-{day:02} {:02}:00 UTC", hour % 24)
}

/// One hour of the feed. Either value may be absent (carbon and prices often come from
/// different sources).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GridPoint {
    /// Unix hour (`unix seconds / 3600`).
    pub hour: u64,
    /// Measured carbon intensity, gCO₂eq/kWh.
    pub carbon: Option<f64>,
    /// Energy price, currency per MWh (one currency for every region).
    pub price: Option<f64>,
}

/// Why a push was refused. Nothing of a refused push is kept.
#[derive(Debug, Clone, PartialEq)]
pub enum GridError {
    Empty,
    TooMany {
        points: usize,
    },
    /// A point with neither a carbon value nor a price.
    NothingAt {
        hour: u64,
    },
    CarbonOutOfRange {
        hour: u64,
        value: f64,
    },
    PriceOutOfRange {
        hour: u64,
        value: f64,
    },
    /// A carbon measurement for an hour that has not begun.
    CarbonFromTheFuture {
        hour: u64,
        now_hour: u64,
    },
    PriceTooFarAhead {
        hour: u64,
        now_hour: u64,
    },
    /// A provider's forecast said to be issued after now.
    ForecastFromTheFuture {
        issued: u64,
        now: u64,
    },
    /// A forecast issued before the one held: the newer one stays.
    ForecastOlderThanHeld {
        issued: u64,
        held: u64,
    },
    /// A forecast point for an hour before the forecast was issued.
    ForecastBeforeIssue {
        hour: u64,
        issued: u64,
    },
    ForecastTooFarAhead {
        hour: u64,
        issued: u64,
    },
}

impl fmt::Display for GridError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Empty => write!(f, "no points"),
            Self::TooMany { points } => {
                write!(f, "{points} points in one push; at most {MAX_POINTS}")
            }
            Self::NothingAt { hour } => write!(
                f,
                "the point for {} has neither carbon nor price",
                utc_hour(*hour)
            ),
            Self::CarbonOutOfRange { hour, value } => write!(
                f,
                "carbon {value} g/kWh at {} is outside 0..={MAX_CARBON_G_PER_KWH}",
                utc_hour(*hour)
            ),
            Self::PriceOutOfRange { hour, value } => write!(
                f,
                "price {value} at {} is not finite or beyond ±{MAX_ABS_PRICE}",
                utc_hour(*hour)
            ),
            Self::CarbonFromTheFuture { hour, now_hour } => write!(
                f,
                "carbon at {} is for an hour that has not begun (now is {}); push measurements only — forecasts are the scheduler's",
                utc_hour(*hour),
                utc_hour(*now_hour)
            ),
            Self::PriceTooFarAhead { hour, now_hour } => write!(
                f,
                "price at {} is more than {PRICE_AHEAD_HOURS} h after now ({})",
                utc_hour(*hour),
                utc_hour(*now_hour)
            ),
            Self::ForecastFromTheFuture { issued, now } => write!(
                f,
                "the forecast says it was issued at unix {issued}, after now ({now}); give the time the provider made it (its `updatedAt`)"
            ),
            Self::ForecastOlderThanHeld { issued, held } => write!(
                f,
                "the forecast was issued at unix {issued}, before the one this region holds (issued at unix {held}); the newer one stays"
            ),
            Self::ForecastBeforeIssue { hour, issued } => write!(
                f,
                "the forecast has a point for {}, before it was issued ({}); a forecast is for the hours after it was made",
                utc_hour(*hour),
                utc_hour(*issued / HOUR_S)
            ),
            Self::ForecastTooFarAhead { hour, issued } => write!(
                f,
                "the forecast point for {} is more than {FORECAST_AHEAD_HOURS} h after it was issued ({})",
                utc_hour(*hour),
                utc_hour(*issued / HOUR_S)
            ),
        }
    }
}

impl std::error::Error for GridError {}

/// What a push did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Ingested {
    /// Points stored (a later point for the same hour replaces an earlier one).
    pub kept: usize,
    /// Points older than the retention window, not stored.
    pub too_old: usize,
}

/// Why there is no outlook.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NoOutlook {
    /// No carbon measurement was ever pushed (or all fell out of retention).
    NoData,
    /// The newest measurement is older than [`STALE_HOURS`].
    Stale { latest_hour: u64 },
}

impl fmt::Display for NoOutlook {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::NoData => write!(f, "no carbon measurements for this region"),
            Self::Stale { latest_hour } => write!(
                f,
                "the newest carbon measurement ({}) is more than {STALE_HOURS} h old",
                utc_hour(*latest_hour)
            ),
        }
    }
}

/// The hours from now on as the scheduler sees them.
#[derive(Debug, Clone, PartialEq)]
pub struct Outlook {
    /// Unix hour of `carbon[0]` (the current hour).
    pub from_hour: u64,
    /// Newest measured hour (≤ `from_hour`).
    pub latest_measured: u64,
    /// Carbon per hour: measured for the current hour when it has been pushed, forecast
    /// from the past otherwise. [`HORIZON_HOURS`] long.
    pub carbon: Vec<f64>,
    /// Whether `carbon[i]` is a measurement.
    pub measured: Vec<bool>,
    /// Whether `carbon[i]` is the provider's forecast (else, when not measured, the
    /// project's own).
    pub provider: Vec<bool>,
    /// Price per hour: as pushed (measured or day-ahead), else the same hour of the most
    /// recent day that has one, else the newest price; NaN when no price was ever pushed.
    pub price: Vec<f64>,
}

impl Outlook {
    /// Mean carbon and price of a `duration`-hour window starting `offset` hours from
    /// now, over the hours the outlook covers.
    pub fn window(&self, offset: usize, duration: usize) -> Option<(f64, f64)> {
        let end = (offset + duration.max(1)).min(self.carbon.len());
        if offset >= end {
            return None;
        }
        let n = (end - offset) as f64;
        let carbon = self.carbon[offset..end].iter().sum::<f64>() / n;
        let price = self.price[offset..end].iter().sum::<f64>() / n;
        Some((carbon, price))
    }
}

/// A job waiting for a lower-carbon hour.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Deferral {
    /// The latest unix second it may start and still finish by its deadline.
    pub latest_start: u64,
    /// Whole hours it runs (its expected runtime rounded up).
    pub duration_hours: usize,
}

impl Deferral {
    /// For a job that runs `runtime_s` and must finish by `deadline` (unix seconds).
    pub fn new(runtime_s: u64, deadline: u64) -> Option<Deferral> {
        let latest_start = deadline.checked_sub(runtime_s)?;
        Some(Deferral {
            latest_start,
            duration_hours: runtime_s.div_ceil(HOUR_S).max(1) as usize,
        })
    }
}

/// Why a deferrable job starts now.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum StartReason {
    /// Starting any later would miss the deadline.
    LatestStart,
    /// No usable signal: the job does not wait for one.
    NoSignal(NoOutlook),
    /// No later window is forecast lower than this one (`carbon`: its mean).
    LowestNow { carbon: f64 },
}

/// This hour's answer for a deferrable job.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum DeferDecision {
    Start(StartReason),
    /// A later window is forecast lower: the best one starts at `best_hour`.
    Wait {
        now_carbon: f64,
        best_hour: u64,
        best_carbon: f64,
    },
}

/// The best window for a job in this region.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct WindowEstimate {
    pub start_hour: u64,
    pub carbon: f64,
    /// NaN when the region has no prices.
    pub price: f64,
}

/// A carbon-intensity provider's forecast as a region holds it.
#[derive(Debug, Clone, PartialEq)]
pub struct ProviderForecast {
    /// When the provider made it (unix seconds).
    pub issued: u64,
    /// Who made it, for operators (`electricitymaps`, say).
    pub source: String,
    /// Unix hour of `carbon[0]`.
    pub first_hour: u64,
    /// Forecast carbon per hour, gCO₂eq/kWh; NaN where the forecast has no point.
    pub carbon: Vec<f64>,
}

impl ProviderForecast {
    /// Its value for `hour`, if it has one.
    pub fn at(&self, hour: u64) -> Option<f64> {
        let index = usize::try_from(hour.checked_sub(self.first_hour)?).ok()?;
        self.carbon.get(index).copied().filter(|v| v.is_finite())
    }

    /// Whether it is recent enough to be used at `now` (unix seconds).
    pub fn fresh(&self, now: u64) -> bool {
        now.saturating_sub(self.issued) <= FORECAST_FRESH_HOURS * HOUR_S
    }

    /// Unix hours with a point (first, last).
    pub fn span(&self) -> Option<(u64, u64)> {
        let first = self.carbon.iter().position(|v| v.is_finite())?;
        let last = self.carbon.iter().rposition(|v| v.is_finite())?;
        Some((
            self.first_hour + first as u64,
            self.first_hour + last as u64,
        ))
    }
}

/// One point of a provider's forecast push.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ForecastPoint {
    /// Unix hour.
    pub hour: u64,
    /// gCO₂eq/kWh.
    pub carbon: f64,
}

/// What a forecast push did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ForecastIngested {
    /// Hours the forecast holds.
    pub hours: usize,
    /// When the forecast it replaced was issued, if there was one.
    pub replaced: Option<u64>,
}

/// One region's hourly series. Missing hours are NaN; the forecaster skips them.
#[derive(Debug, Clone)]
pub struct GridSeries {
    /// Unix hour of index 0.
    first_hour: u64,
    carbon: Vec<f64>,
    price: Vec<f64>,
    forecaster: RidgeForecaster,
    /// The newest provider forecast pushed, if any.
    provider: Option<ProviderForecast>,
    /// Bumped by every push that kept something; keys the cache.
    generation: u64,
    cache: Option<(u64, u64, Result<Outlook, NoOutlook>)>,
}

impl Default for GridSeries {
    /// Forecast by the model `nephele sim shift` chose on January–June 2023 (the online
    /// linear model with a 30-day half-life; `shift.json`'s `forecaster`).
    fn default() -> Self {
        Self::new(RidgeForecaster {
            half_life_days: 30.0,
            ..RidgeForecaster::default()
        })
    }
}

impl GridSeries {
    /// An empty series forecast by `forecaster` (the simulator's default is what
    /// `nephele sim shift` measured).
    pub fn new(forecaster: RidgeForecaster) -> GridSeries {
        GridSeries {
            first_hour: 0,
            carbon: Vec::new(),
            price: Vec::new(),
            forecaster,
            provider: None,
            generation: 0,
            cache: None,
        }
    }

    /// The provider forecast held, if any (fresh or not).
    pub fn provider_forecast(&self) -> Option<&ProviderForecast> {
        self.provider.as_ref()
    }

    /// Stores a provider's forecast issued at `issued` (unix seconds) by `source`,
    /// replacing the one held (all of it, or nothing when a point is bad or it is older
    /// than the one held). Measurements are not touched.
    pub fn ingest_forecast(
        &mut self,
        points: &[ForecastPoint],
        issued: u64,
        source: &str,
        now: u64,
    ) -> Result<ForecastIngested, GridError> {
        if points.is_empty() {
            return Err(GridError::Empty);
        }
        if points.len() > MAX_POINTS {
            return Err(GridError::TooMany {
                points: points.len(),
            });
        }
        if issued / HOUR_S > now / HOUR_S {
            return Err(GridError::ForecastFromTheFuture { issued, now });
        }
        if let Some(held) = &self.provider {
            if issued < held.issued {
                return Err(GridError::ForecastOlderThanHeld {
                    issued,
                    held: held.issued,
                });
            }
        }
        let issued_hour = issued / HOUR_S;
        for p in points {
            if !(0.0..=MAX_CARBON_G_PER_KWH).contains(&p.carbon) {
                return Err(GridError::CarbonOutOfRange {
                    hour: p.hour,
                    value: p.carbon,
                });
            }
            if p.hour < issued_hour {
                return Err(GridError::ForecastBeforeIssue {
                    hour: p.hour,
                    issued,
                });
            }
            if p.hour > issued_hour + FORECAST_AHEAD_HOURS {
                return Err(GridError::ForecastTooFarAhead {
                    hour: p.hour,
                    issued,
                });
            }
        }
        let first_hour = points.iter().map(|p| p.hour).min().unwrap_or(issued_hour);
        let last_hour = points.iter().map(|p| p.hour).max().unwrap_or(first_hour);
        let mut carbon = vec![f64::NAN; (last_hour - first_hour + 1) as usize];
        for p in points {
            carbon[(p.hour - first_hour) as usize] = p.carbon;
        }
        let replaced = self.provider.as_ref().map(|f| f.issued);
        self.provider = Some(ProviderForecast {
            issued,
            source: source.to_string(),
            first_hour,
            carbon,
        });
        self.generation += 1;
        Ok(ForecastIngested {
            hours: points.len(),
            replaced,
        })
    }

    /// Hours with a carbon measurement.
    pub fn measured_hours(&self) -> usize {
        self.carbon.iter().filter(|v| v.is_finite()).count()
    }

    /// The newest measured carbon hour.
    pub fn latest_measured(&self) -> Option<u64> {
        self.carbon
            .iter()
            .rposition(|v| v.is_finite())
            .map(|i| self.first_hour + i as u64)
    }

    /// The measured carbon at `hour`, if pushed.
    pub fn carbon_at(&self, hour: u64) -> Option<f64> {
        let index = usize::try_from(hour.checked_sub(self.first_hour)?).ok()?;
        self.carbon.get(index).copied().filter(|v| v.is_finite())
    }

    /// Every stored hour with a value, oldest first: what [`GridSeries::ingest`] takes
    /// back to rebuild the series (a region keeps its grid signal across restarts).
    pub fn points(&self) -> Vec<GridPoint> {
        (0..self.carbon.len())
            .filter_map(|index| {
                let carbon = Some(self.carbon[index]).filter(|v| v.is_finite());
                let price = Some(self.price[index]).filter(|v| v.is_finite());
                (carbon.is_some() || price.is_some()).then_some(GridPoint {
                    hour: self.first_hour + index as u64,
                    carbon,
                    price,
                })
            })
            .collect()
    }

    /// Stores `points` at `now` (unix seconds): all of them, or none when one is bad.
    pub fn ingest(&mut self, points: &[GridPoint], now: u64) -> Result<Ingested, GridError> {
        let now_hour = now / HOUR_S;
        if points.is_empty() {
            return Err(GridError::Empty);
        }
        if points.len() > MAX_POINTS {
            return Err(GridError::TooMany {
                points: points.len(),
            });
        }
        for p in points {
            if p.carbon.is_none() && p.price.is_none() {
                return Err(GridError::NothingAt { hour: p.hour });
            }
            if let Some(value) = p.carbon {
                if !(0.0..=MAX_CARBON_G_PER_KWH).contains(&value) {
                    return Err(GridError::CarbonOutOfRange {
                        hour: p.hour,
                        value,
                    });
                }
                if p.hour > now_hour {
                    return Err(GridError::CarbonFromTheFuture {
                        hour: p.hour,
                        now_hour,
                    });
                }
            }
            if let Some(value) = p.price {
                if !value.is_finite() || value.abs() > MAX_ABS_PRICE {
                    return Err(GridError::PriceOutOfRange {
                        hour: p.hour,
                        value,
                    });
                }
                if p.hour > now_hour.saturating_add(PRICE_AHEAD_HOURS) {
                    return Err(GridError::PriceTooFarAhead {
                        hour: p.hour,
                        now_hour,
                    });
                }
            }
        }
        let oldest = now_hour.saturating_sub(RETAIN_HOURS - 1);
        self.trim(oldest);
        let mut summary = Ingested::default();
        for p in points {
            if p.hour < oldest {
                summary.too_old += 1;
                continue;
            }
            let index = self.slot(p.hour);
            if let Some(value) = p.carbon {
                self.carbon[index] = value;
            }
            if let Some(value) = p.price {
                self.price[index] = value;
            }
            summary.kept += 1;
        }
        if summary.kept > 0 {
            self.generation += 1;
        }
        Ok(summary)
    }

    /// Drops hours before `oldest`.
    fn trim(&mut self, oldest: u64) {
        if self.carbon.is_empty() || oldest <= self.first_hour {
            return;
        }
        let cut = usize::try_from(oldest - self.first_hour)
            .unwrap_or(usize::MAX)
            .min(self.carbon.len());
        self.carbon.drain(..cut);
        self.price.drain(..cut);
        self.first_hour = oldest;
        if self.carbon.is_empty() {
            self.first_hour = 0;
        }
    }

    /// The index of `hour`, growing the series to hold it. Callers keep `hour` within
    /// the retention window and the price reach, so the series stays bounded.
    fn slot(&mut self, hour: u64) -> usize {
        if self.carbon.is_empty() {
            self.first_hour = hour;
        }
        if hour < self.first_hour {
            let grow = (self.first_hour - hour) as usize;
            self.carbon
                .splice(0..0, std::iter::repeat_n(f64::NAN, grow));
            self.price.splice(0..0, std::iter::repeat_n(f64::NAN, grow));
            self.first_hour = hour;
        }
        let index = (hour - self.first_hour) as usize;
        if index >= self.carbon.len() {
            self.carbon.resize(index + 1, f64::NAN);
            self.price.resize(index + 1, f64::NAN);
        }
        index
    }

    /// The outlook at `now` (unix seconds), cached until the hour or the data changes.
    pub fn outlook(&mut self, now: u64) -> Result<Outlook, NoOutlook> {
        let now_hour = now / HOUR_S;
        if let Some((generation, hour, outlook)) = &self.cache {
            if *generation == self.generation && *hour == now_hour {
                return outlook.clone();
            }
        }
        let outlook = self.compute(now_hour);
        self.cache = Some((self.generation, now_hour, outlook.clone()));
        outlook
    }

    fn compute(&self, now_hour: u64) -> Result<Outlook, NoOutlook> {
        // The newest measurement that is not after the current hour.
        let Some(upto) = self.upto(now_hour) else {
            return Err(NoOutlook::NoData);
        };
        let last = self.carbon[..upto]
            .iter()
            .rposition(|v| v.is_finite())
            .ok_or(NoOutlook::NoData)?;
        let latest_measured = self.first_hour + last as u64;
        if now_hour - latest_measured > STALE_HOURS {
            return Err(NoOutlook::Stale {
                latest_hour: latest_measured,
            });
        }
        let lag = (now_hour - latest_measured) as usize;
        let forecast = self
            .forecaster
            .latest(&self.carbon[..=last], lag + HORIZON_HOURS);
        let mut carbon = Vec::with_capacity(HORIZON_HOURS);
        let mut measured = Vec::with_capacity(HORIZON_HOURS);
        let mut provider = Vec::with_capacity(HORIZON_HOURS);
        // A fresh provider forecast stands in for the project's own where it has a point.
        let from_provider = self
            .provider
            .as_ref()
            .filter(|f| f.fresh(now_hour * HOUR_S + HOUR_S - 1));
        for i in 0..HORIZON_HOURS {
            let hour = now_hour + i as u64;
            if lag == 0 && i == 0 {
                carbon.push(self.carbon[last]);
                measured.push(true);
                provider.push(false);
            } else if let Some(value) = from_provider.and_then(|f| f.at(hour)) {
                carbon.push(value);
                measured.push(false);
                provider.push(true);
            } else {
                // forecast[k] is hour latest_measured + 1 + k.
                let value = forecast.get(lag + i - 1).copied().unwrap_or(f64::NAN);
                // Unclamped, as the simulator uses it: the decision compares windows,
                // and a forecast below 0 still ranks the hour as the greenest.
                carbon.push(if value.is_finite() {
                    value
                } else {
                    self.carbon[last]
                });
                measured.push(false);
                provider.push(false);
            }
        }
        let price = (0..HORIZON_HOURS as u64)
            .map(|i| self.price_estimate(now_hour + i, now_hour))
            .collect();
        Ok(Outlook {
            from_hour: now_hour,
            latest_measured,
            carbon,
            measured,
            provider,
            price,
        })
    }

    /// How many stored hours are not after `now_hour` (`None` when the series starts
    /// later); carbon and prices share the index.
    fn upto(&self, now_hour: u64) -> Option<usize> {
        let past = now_hour.checked_sub(self.first_hour)?;
        Some(
            usize::try_from(past)
                .unwrap_or(usize::MAX)
                .saturating_add(1)
                .min(self.carbon.len()),
        )
    }

    fn price_at(&self, hour: u64) -> Option<f64> {
        let index = usize::try_from(hour.checked_sub(self.first_hour)?).ok()?;
        self.price.get(index).copied().filter(|v| v.is_finite())
    }

    /// As pushed; else the same hour on the most recent of the last 7 days with a price
    /// no later than now; else the newest price up to now; else NaN.
    fn price_estimate(&self, hour: u64, now_hour: u64) -> f64 {
        if let Some(value) = self.price_at(hour) {
            return value;
        }
        let back = hour.saturating_sub(now_hour).div_ceil(24).max(1);
        for day in back..back + 7 {
            if let Some(value) = hour.checked_sub(24 * day).and_then(|h| self.price_at(h)) {
                return value;
            }
        }
        let Some(upto) = self.upto(now_hour) else {
            return f64::NAN;
        };
        self.price[..upto]
            .iter()
            .rev()
            .copied()
            .find(|v| v.is_finite())
            .unwrap_or(f64::NAN)
    }

    /// This hour's decision for a deferrable job at `now` (unix seconds). It never
    /// waits past `deferral.latest_start`, whatever the forecast, so the deadline holds.
    pub fn decide(&mut self, now: u64, deferral: &Deferral) -> DeferDecision {
        let now_hour = now / HOUR_S;
        let latest_hour = deferral.latest_start / HOUR_S;
        if now >= deferral.latest_start || latest_hour <= now_hour {
            return DeferDecision::Start(StartReason::LatestStart);
        }
        let outlook = match self.outlook(now) {
            Ok(outlook) => outlook,
            Err(why) => return DeferDecision::Start(StartReason::NoSignal(why)),
        };
        let duration = deferral.duration_hours.max(1);
        let offsets = (latest_hour - now_hour) as usize;
        let job = Job {
            release: 0,
            duration,
            deadline: offsets + duration,
        };
        let now_carbon = outlook.window(0, duration).map_or(f64::NAN, |w| w.0);
        match decide(&job, 0, outlook.carbon[0], &outlook.carbon[1..]) {
            Decision::StartNow => {
                DeferDecision::Start(StartReason::LowestNow { carbon: now_carbon })
            }
            Decision::Wait => {
                let best = best_offset(&outlook, offsets, duration);
                DeferDecision::Wait {
                    now_carbon,
                    best_hour: now_hour + best.0 as u64,
                    best_carbon: best.1,
                }
            }
        }
    }

    /// The lowest-carbon window for a `duration_hours` job starting between now and
    /// `latest_start` (unix seconds; `None`: now only), within the outlook.
    pub fn best_window(
        &mut self,
        now: u64,
        latest_start: Option<u64>,
        duration_hours: usize,
    ) -> Result<WindowEstimate, NoOutlook> {
        let outlook = self.outlook(now)?;
        let now_hour = now / HOUR_S;
        let offsets = latest_start.map_or(0, |latest| {
            (latest / HOUR_S).saturating_sub(now_hour) as usize
        });
        let (offset, carbon) = best_offset(&outlook, offsets, duration_hours.max(1));
        let price = outlook
            .window(offset, duration_hours.max(1))
            .map_or(f64::NAN, |w| w.1);
        Ok(WindowEstimate {
            start_hour: now_hour + offset as u64,
            carbon,
            price,
        })
    }
}

/// The offset in `0..=offsets` whose window has the lowest mean carbon (the earliest
/// on ties), among windows that start inside the outlook.
fn best_offset(outlook: &Outlook, offsets: usize, duration: usize) -> (usize, f64) {
    let last = offsets.min(
        outlook
            .carbon
            .len()
            .saturating_sub(duration.min(outlook.carbon.len())),
    );
    (0..=last)
        .filter_map(|offset| outlook.window(offset, duration).map(|w| (offset, w.0)))
        .fold((0, f64::INFINITY), |best, next| {
            if next.1 < best.1 {
                next
            } else {
                best
            }
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::carbon::run_online;
    use proptest::prelude::*;

    /// A day-night cycle: lowest at 03:00 UTC, highest at 15:00.
    fn cycle(hour: u64) -> f64 {
        200.0 - 100.0 * (((hour % 24) as f64 - 3.0) / 24.0 * std::f64::consts::TAU).cos()
    }

    const T0: u64 = 1_700_000_000 / HOUR_S; // some hour in 2023

    fn fed(days: u64) -> (GridSeries, u64) {
        let mut grid = GridSeries::default();
        let points: Vec<GridPoint> = (0..days * 24)
            .map(|i| GridPoint {
                hour: T0 + i,
                carbon: Some(cycle(T0 + i)),
                price: Some(50.0 + (i % 24) as f64),
            })
            .collect();
        let now = (T0 + days * 24 - 1) * HOUR_S + 60;
        grid.ingest(&points, now).expect("valid");
        (grid, now)
    }

    #[test]
    fn hours_print_as_utc_dates() {
        assert_eq!(utc_hour(0), "1970-01-01 00:00 UTC");
        assert_eq!(utc_hour(T0), "2023-11-14 22:00 UTC");
        assert_eq!(utc_hour(472_216 + 24 * 17), "2023-12-01 16:00 UTC");
        assert_eq!(
            utc_hour((1_709_164_800 + 7200) / HOUR_S),
            "2024-02-29 02:00 UTC"
        );
    }

    #[test]
    fn bad_pushes_are_refused_whole() {
        let mut grid = GridSeries::default();
        let now = T0 * HOUR_S;
        let good = GridPoint {
            hour: T0,
            carbon: Some(100.0),
            price: None,
        };
        for (bad, expect) in [
            (
                GridPoint {
                    hour: T0 + 1,
                    ..good
                },
                "has not begun",
            ),
            (
                GridPoint {
                    carbon: Some(-1.0),
                    ..good
                },
                "outside",
            ),
            (
                GridPoint {
                    carbon: Some(f64::NAN),
                    ..good
                },
                "outside",
            ),
            (
                GridPoint {
                    carbon: None,
                    price: Some(f64::INFINITY),
                    ..good
                },
                "not finite",
            ),
            (
                GridPoint {
                    hour: T0 + 49,
                    carbon: None,
                    price: Some(1.0),
                },
                "more than 48 h",
            ),
            (
                GridPoint {
                    carbon: None,
                    price: None,
                    ..good
                },
                "neither",
            ),
        ] {
            let error = grid.ingest(&[good, bad], now).expect_err("refused");
            assert!(error.to_string().contains(expect), "{error}");
            assert_eq!(grid.measured_hours(), 0, "nothing kept from a refused push");
        }
        assert_eq!(grid.ingest(&[], now), Err(GridError::Empty));
        let many = vec![good; MAX_POINTS + 1];
        assert!(matches!(
            grid.ingest(&many, now),
            Err(GridError::TooMany { .. })
        ));
        // A day-ahead price is fine; a later point for the same hour wins.
        let ahead = GridPoint {
            hour: T0 + 30,
            carbon: None,
            price: Some(-5.0),
        };
        let again = GridPoint {
            carbon: Some(120.0),
            ..good
        };
        assert_eq!(
            grid.ingest(&[good, ahead, again], now),
            Ok(Ingested {
                kept: 3,
                too_old: 0
            })
        );
        assert_eq!(grid.carbon_at(T0), Some(120.0));
        assert_eq!(grid.latest_measured(), Some(T0));
    }

    #[test]
    fn old_points_fall_out_of_retention_and_are_counted() {
        let mut grid = GridSeries::default();
        let now = (T0 + RETAIN_HOURS + 10) * HOUR_S;
        let points: Vec<GridPoint> = (0..RETAIN_HOURS + 11)
            .map(|i| GridPoint {
                hour: T0 + i,
                carbon: Some(cycle(i)),
                price: None,
            })
            .collect();
        let summary = grid.ingest(&points, now).expect("valid");
        // The retention window is the RETAIN_HOURS hours ending with the current one.
        assert_eq!(summary.too_old, 11);
        assert_eq!(summary.kept as u64, RETAIN_HOURS);
        assert_eq!(grid.measured_hours() as u64, RETAIN_HOURS);
        assert_eq!(grid.carbon_at(T0 + 10), None);
        assert!(grid.carbon_at(T0 + 11).is_some());
    }

    #[test]
    fn no_signal_or_a_stale_one_means_no_waiting() {
        let mut grid = GridSeries::default();
        let now = T0 * HOUR_S;
        let deferral = Deferral::new(3600, now + 10 * HOUR_S).expect("valid");
        assert_eq!(
            grid.decide(now, &deferral),
            DeferDecision::Start(StartReason::NoSignal(NoOutlook::NoData))
        );
        grid.ingest(
            &[GridPoint {
                hour: T0,
                carbon: Some(100.0),
                price: None,
            }],
            now,
        )
        .expect("valid");
        let later = now + (STALE_HOURS + 1) * HOUR_S;
        let deferral = Deferral::new(3600, later + 10 * HOUR_S).expect("valid");
        assert_eq!(
            grid.decide(later, &deferral),
            DeferDecision::Start(StartReason::NoSignal(NoOutlook::Stale { latest_hour: T0 }))
        );
    }

    #[test]
    fn a_deferrable_job_waits_for_the_night_and_never_past_its_latest_start() {
        // Fed 30 days; now is 19:xx UTC. The trough is at 03:00, within 10 h.
        let (mut grid, now) = fed(30);
        let now_hour = now / HOUR_S;
        assert_eq!(now_hour % 24, (T0 + 30 * 24 - 1) % 24);
        let outlook = grid.outlook(now).expect("fresh");
        assert!(outlook.measured[0]);
        assert_eq!(outlook.carbon.len(), HORIZON_HOURS);
        for (i, value) in outlook.carbon.iter().enumerate().skip(1) {
            let actual = cycle(now_hour + i as u64);
            assert!(
                (value - actual).abs() < 3.0,
                "hour +{i}: {value} vs {actual}"
            );
        }
        let trough = (0..24)
            .map(|i| now_hour + i)
            .find(|h| h % 24 == 3)
            .expect("a 03:00");
        let deferral = Deferral::new(3600, (now_hour + 24) * HOUR_S).expect("valid");
        match grid.decide(now, &deferral) {
            DeferDecision::Wait {
                best_hour,
                best_carbon,
                now_carbon,
            } => {
                assert_eq!(best_hour, trough);
                assert!(best_carbon < now_carbon);
            }
            other => panic!("expected to wait, got {other:?}"),
        }
        let best = grid
            .best_window(now, Some(deferral.latest_start), 1)
            .expect("fresh");
        assert_eq!(best.start_hour, trough);
        assert!(best.price.is_finite());
        let here = grid.best_window(now, None, 1).expect("fresh");
        assert_eq!(here.start_hour, now_hour);
        // With the latest start inside this hour it starts whatever the forecast says.
        let tight = Deferral::new(3600, now + 3600 + 600).expect("valid");
        assert_eq!(
            grid.decide(now, &tight),
            DeferDecision::Start(StartReason::LatestStart)
        );
    }

    fn flat_forecast(now: u64, hours: std::ops::Range<u64>, value: f64) -> Vec<ForecastPoint> {
        hours
            .map(|i| ForecastPoint {
                hour: now / HOUR_S + i,
                carbon: value,
            })
            .collect()
    }

    #[test]
    fn a_provider_forecast_stands_in_for_the_model_and_never_for_a_measurement() {
        let (mut grid, now) = fed(30);
        let own = grid.outlook(now).expect("outlook");
        assert!(own.provider.iter().all(|p| !p));
        // The provider knows of a windy hour five hours from now; it also forecasts the
        // current hour, which is measured.
        let mut points = flat_forecast(now, 0..48, 400.0);
        points[5].carbon = 15.0;
        let ingested = grid
            .ingest_forecast(&points, now - 600, "electricitymaps", now)
            .expect("valid");
        assert_eq!(
            ingested,
            ForecastIngested {
                hours: 48,
                replaced: None
            }
        );
        let outlook = grid.outlook(now).expect("outlook");
        assert!(outlook.measured[0] && !outlook.provider[0]);
        assert_eq!(outlook.carbon[0], own.carbon[0], "the measurement wins");
        assert!(outlook.provider[1..48].iter().all(|p| *p));
        assert_eq!(outlook.carbon[5], 15.0);
        assert_eq!(outlook.carbon[6], 400.0);
        // Past the forecast's reach, the project's own forecast again.
        assert!(!outlook.provider[48]);
        assert_eq!(outlook.carbon[48], own.carbon[48]);
        // The measurements are as they were.
        assert_eq!(grid.measured_hours(), 30 * 24);
        // A deferrable 1-hour job that may wait 20 hours waits for the windy hour.
        let deferral = Deferral::new(HOUR_S, now + 21 * HOUR_S).expect("deferral");
        match grid.decide(now, &deferral) {
            DeferDecision::Wait {
                best_hour,
                best_carbon,
                ..
            } => {
                assert_eq!(best_hour, now / HOUR_S + 5);
                assert_eq!(best_carbon, 15.0);
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn forecasts_are_replaced_by_newer_ones_refused_when_older_or_bad_and_unused_when_stale() {
        let (mut grid, now) = fed(30);
        let points = flat_forecast(now, 1..24, 100.0);
        grid.ingest_forecast(&points, now - 3600, "a", now)
            .expect("first");
        let held = grid.provider_forecast().cloned();
        // Older than the one held, from the future, before its own issue, too far
        // ahead, out of range: refused, and the held forecast stays.
        let refusals = [
            (flat_forecast(now, 1..24, 90.0), now - 7200),
            (flat_forecast(now, 1..24, 90.0), now + 2 * HOUR_S),
            (
                vec![ForecastPoint {
                    hour: now / HOUR_S - 2,
                    carbon: 90.0,
                }],
                now,
            ),
            (
                flat_forecast(now, 1..(FORECAST_AHEAD_HOURS + 3), 90.0),
                now - 3600,
            ),
            (flat_forecast(now, 1..24, -5.0), now - 3600),
            (Vec::new(), now),
        ];
        for (points, issued) in &refusals {
            let error = grid
                .ingest_forecast(points, *issued, "b", now)
                .expect_err("refused");
            assert!(!error.to_string().is_empty());
            assert_eq!(grid.provider_forecast().cloned(), held, "{error}");
        }
        assert!(matches!(
            grid.ingest_forecast(&points, now - 7200, "b", now),
            Err(GridError::ForecastOlderThanHeld { .. })
        ));
        // A newer one replaces it whole.
        let newer = grid
            .ingest_forecast(&flat_forecast(now, 2..5, 50.0), now, "c", now)
            .expect("newer");
        assert_eq!(newer.replaced, Some(now - 3600));
        let outlook = grid.outlook(now).expect("outlook");
        assert!(
            !outlook.provider[1],
            "the hours the old one had are gone with it"
        );
        assert!(outlook.provider[2] && outlook.carbon[2] == 50.0);
        // Thirteen hours on (with measurements kept up), it is stale: not used.
        let later = now + 13 * HOUR_S;
        let catch_up: Vec<GridPoint> = (1..=13)
            .map(|i| GridPoint {
                hour: now / HOUR_S + i,
                carbon: Some(cycle(now / HOUR_S + i)),
                price: None,
            })
            .collect();
        grid.ingest(&catch_up, later).expect("measurements");
        let provider = grid.provider_forecast().expect("still held");
        assert!(!provider.fresh(later));
        let outlook = grid.outlook(later).expect("outlook");
        assert!(outlook.provider.iter().all(|p| !p));
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]

        /// Whatever forecast is pushed, a measured hour shows its measurement, a
        /// provider hour the provider's value, and the measurements stay as pushed.
        #[test]
        fn forecasts_never_mix_with_measurements(
            offsets in proptest::collection::vec((0u64..80, 0.0f64..900.0), 1..60),
            age_h in 0u64..20,
        ) {
            let (mut grid, now) = fed(10);
            let before = grid.points();
            let issued = now.saturating_sub(age_h * HOUR_S);
            let points: Vec<ForecastPoint> = offsets
                .iter()
                .map(|(o, v)| ForecastPoint { hour: issued / HOUR_S + o, carbon: *v })
                .filter(|p| p.hour <= issued / HOUR_S + FORECAST_AHEAD_HOURS)
                .collect();
            prop_assume!(!points.is_empty());
            grid.ingest_forecast(&points, issued, "p", now).expect("valid");
            prop_assert_eq!(grid.points(), before);
            let outlook = grid.outlook(now).expect("outlook");
            let forecast = grid.provider_forecast().expect("held").clone();
            for i in 0..outlook.carbon.len() {
                let hour = outlook.from_hour + i as u64;
                prop_assert!(!(outlook.measured[i] && outlook.provider[i]));
                if outlook.measured[i] {
                    prop_assert_eq!(Some(outlook.carbon[i]), grid.carbon_at(hour));
                }
                if outlook.provider[i] {
                    prop_assert!(forecast.fresh(now));
                    prop_assert_eq!(Some(outlook.carbon[i]), forecast.at(hour));
                }
            }
        }

        /// The live decision, fed one measurement an hour, starts a job in the same hour
        /// as the simulator's online policy over the same series and forecaster, and so
        /// always by its latest start.
        #[test]
        fn live_decisions_match_the_simulator(
            values in prop::collection::vec(0.0f64..800.0, 48..400),
            release in any::<prop::sample::Index>(),
            duration in 1usize..4,
            slack in 0usize..12,
        ) {
            let forecaster = RidgeForecaster { warmup_days: 1, ..RidgeForecaster::default() };
            let len = values.len();
            prop_assume!(len > duration + slack + 1);
            let release = release.index(len - duration - slack);
            let job = Job::with_slack(release, duration, slack);
            let table = forecaster.table(&values, HORIZON_HOURS);
            let expected = run_online(&job, &values, &table).expect("valid").start;

            let mut grid = GridSeries::new(forecaster);
            let points: Vec<GridPoint> = values[..release].iter().enumerate()
                .map(|(i, v)| GridPoint { hour: T0 + i as u64, carbon: Some(*v), price: None })
                .collect();
            if !points.is_empty() {
                grid.ingest(&points, (T0 + release as u64) * HOUR_S).expect("valid");
            }
            let latest = (T0 + (release + slack) as u64) * HOUR_S;
            let deferral = Deferral { latest_start: latest, duration_hours: duration };
            let mut started = None;
            for (hour, value) in values.iter().enumerate().skip(release).take(slack + 1) {
                let now = (T0 + hour as u64) * HOUR_S;
                grid.ingest(&[GridPoint { hour: T0 + hour as u64, carbon: Some(*value), price: None }], now)
                    .expect("valid");
                if let DeferDecision::Start(_) = grid.decide(now, &deferral) {
                    started = Some(hour);
                    break;
                }
            }
            prop_assert_eq!(started, Some(expected));
        }
    }
}
