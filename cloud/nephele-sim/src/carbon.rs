//! Temporal (and a little spatial) carbon shifting on the 2023 hourly grid series, in the
//! spirit of Wiesner et al., "Let's Wait Awhile" (Middleware 2021). Carbon data:
//! Electricity Maps (via GreenDCC), ODbL; credit "Electricity Maps" with any result.
//!
//! Protocol (all hours UTC, 2023):
//! - The forecaster is chosen on January–June only (hours before
//!   [`ShiftConfig::split_hour`], jobs that finish before it) among a grid of
//!   [`ProfileBlend`]s and [`RidgeForecaster`]s: the candidate with the best mean
//!   captured share over the zones on the headline scenario wins. Everything
//!   reported is on July–December, jobs released there whose deadline falls in 2023.
//!   Forecasts always use the series up to the current hour only.
//! - Scenario I, nightly: one job a day released at [`ShiftConfig::nightly_hour`].
//!   Scenario II, ad hoc: one job released every hour.
//! - For each zone × scenario × duration × slack: mean intensity of the no-shift baseline,
//!   the online policy with the forecast, and the perfect-foresight oracle; savings in %
//!   of the baseline; captured share = forecast saving / oracle saving; deadlines met.
//! - Headline: ad hoc, 1-hour jobs, 8 hours of slack, per zone; the goal is a captured
//!   share ≥ 0.9.
//! - What information would reach it: the headline again with the first 1, 2 and 3
//!   forecast hours replaced by the measured values ([`KnownAhead`], reads the future on
//!   purpose), the rest still forecast. No forecast made from the past can beat knowing
//!   those hours, so a zone below the goal here is below it for every such forecaster
//!   used with the same decision rule.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{bail, Context as _, Result};
use nephele_placement::carbon::{
    choose_region, no_shift, oracle, run_online, ForecastTable, Forecaster, Job, ProfileBlend,
    RegionOffer, RegionWeights, RidgeForecaster,
};
use serde::Serialize;

use crate::plot::{svg_xy, XyLine};
pub use crate::trace::{load_carbon, load_prices, HourlySeries};

/// The eight zones with carbon data; all but GB also have prices.
pub const ZONES: [&str; 8] = [
    "CA-ON",
    "DE-LU",
    "GB",
    "IN-WE",
    "SG",
    "US-CAL-CISO",
    "US-MIDA-PJM",
    "US-TEX-ERCO",
];

/// Which release pattern.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum Scenario {
    /// One job a day at a fixed hour (Let's Wait Awhile's scenario I).
    Nightly,
    /// One job every hour (scenario II).
    AdHoc,
}

impl Scenario {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Nightly => "nightly",
            Self::AdHoc => "ad-hoc",
        }
    }
}

/// What to run.
#[derive(Debug, Clone, Serialize)]
pub struct ShiftConfig {
    pub durations: Vec<usize>,
    pub slacks: Vec<usize>,
    /// Release hour (UTC) of the nightly jobs.
    pub nightly_hour: usize,
    /// First hour of the evaluation half (2023-07-01 00:00 UTC = 4344); tuning uses the
    /// hours before it only.
    pub split_hour: usize,
    /// Grid the forecaster is tuned over.
    pub tune_days: Vec<usize>,
    pub tune_decays: Vec<f64>,
    pub tune_momenta: Vec<f64>,
    /// Half-lives (days) of the [`RidgeForecaster`] candidates in the same tuning.
    pub tune_ridge_half_lives: Vec<f64>,
    /// The headline scenario: ad hoc, `headline_duration`-hour jobs, `headline_slack`.
    pub headline_duration: usize,
    pub headline_slack: usize,
}

impl Default for ShiftConfig {
    fn default() -> Self {
        Self {
            durations: vec![1, 4],
            slacks: vec![2, 4, 8, 24],
            nightly_hour: 1,
            split_hour: 4344,
            tune_days: vec![1, 3, 7, 14, 28, 56],
            tune_decays: vec![0.8, 0.9, 0.95, 0.98, 0.99, 1.0],
            tune_momenta: vec![0.0, 0.5, 1.0],
            tune_ridge_half_lives: vec![30.0, 60.0, 120.0],
            headline_duration: 1,
            headline_slack: 8,
        }
    }
}

/// One zone × scenario × duration × slack on the evaluation half.
#[derive(Debug, Clone, Serialize)]
pub struct ShiftRow {
    pub zone: String,
    pub scenario: Scenario,
    pub duration_h: usize,
    pub slack_h: usize,
    pub jobs: usize,
    /// Mean over jobs of the job's mean intensity (gCO₂eq/kWh).
    pub baseline: f64,
    pub forecast: f64,
    pub oracle: f64,
    pub forecast_saving_pct: f64,
    pub oracle_saving_pct: f64,
    /// Forecast saving / oracle saving; `None` when the oracle saves nothing.
    pub captured: Option<f64>,
    pub deadlines_met: usize,
}

/// Per-zone data quality and forecast error on the evaluation half.
#[derive(Debug, Clone, Serialize)]
pub struct ZoneInfo {
    pub carbon: HourlySeries,
    pub prices: Option<HourlySeries>,
    /// Mean absolute percentage error over horizons 1–24 h, hours with an actual value
    /// below 1 g/kWh skipped (CA-ON touches 0).
    pub mape_pct: f64,
    /// Σ|error| / Σ actual over the same forecasts: robust to values near 0.
    pub wape_pct: f64,
    /// Same, for the first forecast hour only.
    pub mape_1h_pct: f64,
}

/// One point of the tuning grid, scored on January–June only.
#[derive(Debug, Clone, Serialize)]
pub struct TuningPoint {
    pub model: String,
    pub mean_captured: f64,
}

/// A forecaster candidate: the fixed-shape profile blend or the per-horizon online
/// linear model.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum ForecastModel {
    Profile(ProfileBlend),
    Ridge(RidgeForecaster),
}

impl ForecastModel {
    /// Row `t` = the forecast made at hour `t` from `series[..=t]`.
    pub fn table(&self, series: &[f64], horizon: usize) -> ForecastTable {
        match self {
            Self::Profile(p) => ForecastTable::build(series, p, horizon),
            Self::Ridge(r) => r.table(series, horizon),
        }
    }

    pub fn describe(&self) -> String {
        match self {
            Self::Profile(p) => format!(
                "profile of {} days + anomaly decaying {} per hour + momentum {}",
                p.days, p.decay, p.momentum
            ),
            Self::Ridge(r) => format!(
                "online linear model per horizon (profile {} days, half-life {} days, ridge {})",
                r.profile_days, r.half_life_days, r.ridge
            ),
        }
    }
}

/// Spatial shifting of ad-hoc 1-hour jobs over the zones with prices, all with free
/// capacity: where [`choose_region`] sends each job and what it costs, per weighting.
#[derive(Debug, Clone, Serialize)]
pub struct SpatialRow {
    pub weights: String,
    pub mean_carbon: f64,
    pub mean_price: f64,
    /// Jobs per zone, in [`ZONES`] order of the zones with prices.
    pub jobs_per_zone: Vec<(String, usize)>,
}

/// The headline figure.
#[derive(Debug, Clone, Serialize)]
pub struct Headline {
    pub scenario: String,
    pub per_zone: Vec<(String, Option<f64>)>,
    pub mean_captured: f64,
    pub zones_at_goal: usize,
    pub goal: f64,
    /// The same scenario with the first `hours_known` forecast hours replaced by the
    /// measured values: the bound on what a better short-term forecast could add.
    pub known_ahead: Vec<KnownAheadRow>,
}

/// The headline with the next `hours_known` hours known exactly.
#[derive(Debug, Clone, Serialize)]
pub struct KnownAheadRow {
    pub hours_known: usize,
    pub per_zone: Vec<(String, Option<f64>)>,
    pub mean_captured: f64,
    pub zones_at_goal: usize,
}

/// A forecast table whose first `hours` hours are replaced by the measured series: it
/// reads the future on purpose, to bound what a better short-term forecast could add.
pub struct KnownAhead<'a> {
    pub table: &'a ForecastTable,
    pub series: &'a [f64],
    pub hours: usize,
}

impl Forecaster for KnownAhead<'_> {
    fn forecast(&self, history: &[f64], horizon: usize) -> Vec<f64> {
        let mut row = self.table.forecast(history, horizon);
        let next = history.len();
        for (h, value) in row.iter_mut().enumerate().take(self.hours) {
            if let Some(actual) = self.series.get(next + h) {
                *value = *actual;
            }
        }
        row
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct ShiftReport {
    pub config: ShiftConfig,
    /// The forecaster tuning chose, in words.
    pub forecaster: String,
    pub tuning: Vec<TuningPoint>,
    pub zones: Vec<ZoneInfo>,
    pub rows: Vec<ShiftRow>,
    pub headline: Headline,
    pub spatial: Vec<SpatialRow>,
    pub seconds: f64,
}

/// Releases of `scenario` jobs whose whole window lies in `from..to`.
fn jobs(
    scenario: Scenario,
    nightly_hour: usize,
    duration: usize,
    slack: usize,
    from: usize,
    to: usize,
) -> Vec<Job> {
    (from..to)
        .filter(|r| scenario == Scenario::AdHoc || r % 24 == nightly_hour % 24)
        .map(|r| Job::with_slack(r, duration, slack))
        .filter(|job| job.deadline <= to)
        .collect()
}

/// Runs one cell: (baseline, forecast, oracle) mean intensities and deadlines met.
fn evaluate(
    series: &[f64],
    table: &impl Forecaster,
    jobs: &[Job],
) -> Result<(f64, f64, f64, usize)> {
    let (mut base, mut online, mut best, mut met) = (0.0, 0.0, 0.0, 0);
    for job in jobs {
        let b = no_shift(job, series)?;
        let o = run_online(job, series, table)?;
        let p = oracle(job, series)?;
        base += b.mean_intensity;
        online += o.mean_intensity;
        best += p.mean_intensity;
        met += usize::from(o.meets(job));
    }
    let n = jobs.len().max(1) as f64;
    Ok((base / n, online / n, best / n, met))
}

fn saving_pct(base: f64, value: f64) -> f64 {
    if base > 0.0 {
        (base - value) / base * 100.0
    } else {
        0.0
    }
}

fn captured(base: f64, online: f64, best: f64) -> Option<f64> {
    (base - best > 1e-12).then(|| (base - online) / (base - best))
}

/// Forecast errors from origins in `from..to - 24`, horizons 1–24.
fn forecast_errors(
    series: &[f64],
    table: &ForecastTable,
    from: usize,
    to: usize,
) -> (f64, f64, f64) {
    let (mut ape, mut n, mut abs, mut sum, mut ape1, mut n1) = (0.0, 0usize, 0.0, 0.0, 0.0, 0usize);
    for origin in from..to.saturating_sub(24) {
        let Some(row) = table.row(origin) else {
            continue;
        };
        for (h, predicted) in row.iter().take(24).enumerate() {
            let actual = series[origin + 1 + h];
            let error = (predicted - actual).abs();
            abs += error;
            sum += actual.abs();
            if actual >= 1.0 {
                ape += error / actual;
                n += 1;
                if h == 0 {
                    ape1 += error / actual;
                    n1 += 1;
                }
            }
        }
    }
    (
        ape / n.max(1) as f64 * 100.0,
        if sum > 0.0 { abs / sum * 100.0 } else { 0.0 },
        ape1 / n1.max(1) as f64 * 100.0,
    )
}

/// The experiment on series already loaded: `zones` holds (carbon, prices if any).
pub fn shift_experiment(
    zones: Vec<(HourlySeries, Option<HourlySeries>)>,
    config: &ShiftConfig,
) -> Result<ShiftReport> {
    let started = Instant::now();
    if zones.is_empty() {
        bail!("no zones to run");
    }
    let (dh, sh) = (config.headline_duration, config.headline_slack);
    if dh == 0 || config.durations.contains(&0) {
        bail!("job durations must be at least 1 hour");
    }
    let split = config.split_hour;
    for (carbon, _) in &zones {
        if carbon.values.len() <= split {
            bail!(
                "{}: {} hours, the evaluation starts at hour {split}",
                carbon.zone,
                carbon.values.len()
            );
        }
    }
    // Tuning on the first half only: jobs end before `split`.
    let mut tuning = Vec::new();
    let profiles = config.tune_days.iter().flat_map(|&days| {
        config.tune_decays.iter().flat_map(move |&decay| {
            config.tune_momenta.iter().map(move |&momentum| {
                ForecastModel::Profile(ProfileBlend {
                    days,
                    decay,
                    momentum,
                })
            })
        })
    });
    let ridges = config.tune_ridge_half_lives.iter().map(|&half_life_days| {
        ForecastModel::Ridge(RidgeForecaster {
            half_life_days,
            ..RidgeForecaster::default()
        })
    });
    let mut candidates = Vec::new();
    for forecaster in profiles.chain(ridges) {
        let mut shares = Vec::new();
        for (carbon, _) in &zones {
            let head = &carbon.values[..split];
            let table = forecaster.table(head, dh + sh);
            let set = jobs(Scenario::AdHoc, config.nightly_hour, dh, sh, 0, split);
            let (b, o, p, _) = evaluate(head, &table, &set)?;
            shares.push(captured(b, o, p).unwrap_or(0.0));
        }
        tuning.push(TuningPoint {
            model: forecaster.describe(),
            mean_captured: shares.iter().sum::<f64>() / shares.len() as f64,
        });
        candidates.push(forecaster);
    }
    // The first best point wins ties.
    let chosen = tuning
        .iter()
        .zip(&candidates)
        .fold(
            None::<(f64, ForecastModel)>,
            |best, (point, model)| match best {
                Some(b) if b.0.total_cmp(&point.mean_captured).is_ge() => Some(b),
                _ => Some((point.mean_captured, *model)),
            },
        )
        .map_or(ForecastModel::Ridge(RidgeForecaster::default()), |b| b.1);

    let horizon = config
        .durations
        .iter()
        .chain([&dh])
        .max()
        .copied()
        .unwrap_or(1)
        + config
            .slacks
            .iter()
            .chain([&sh])
            .max()
            .copied()
            .unwrap_or(0);
    let mut rows = Vec::new();
    let mut infos = Vec::new();
    let mut tables = Vec::new();
    for (carbon, prices) in zones {
        let series = &carbon.values;
        let end = series.len();
        let table = chosen.table(series, horizon);
        for scenario in [Scenario::Nightly, Scenario::AdHoc] {
            for &duration in &config.durations {
                for &slack in &config.slacks {
                    let set = jobs(scenario, config.nightly_hour, duration, slack, split, end);
                    let (b, o, p, met) = evaluate(series, &table, &set)?;
                    rows.push(ShiftRow {
                        zone: carbon.zone.clone(),
                        scenario,
                        duration_h: duration,
                        slack_h: slack,
                        jobs: set.len(),
                        baseline: b,
                        forecast: o,
                        oracle: p,
                        forecast_saving_pct: saving_pct(b, o),
                        oracle_saving_pct: saving_pct(b, p),
                        captured: captured(b, o, p),
                        deadlines_met: met,
                    });
                }
            }
        }
        let (mape_pct, wape_pct, mape_1h_pct) = forecast_errors(series, &table, split, end);
        tables.push(table);
        infos.push(ZoneInfo {
            carbon,
            prices,
            mape_pct,
            wape_pct,
            mape_1h_pct,
        });
    }
    let per_zone: Vec<(String, Option<f64>)> = infos
        .iter()
        .map(|info| {
            let zone = &info.carbon.zone;
            let row = rows.iter().find(|r| {
                &r.zone == zone
                    && r.scenario == Scenario::AdHoc
                    && r.duration_h == dh
                    && r.slack_h == sh
            });
            (zone.clone(), row.and_then(|r| r.captured))
        })
        .collect();
    let goal = 0.9;
    let mut known_ahead = Vec::new();
    for hours in 1..=3 {
        let mut per_zone = Vec::new();
        for (info, table) in infos.iter().zip(&tables) {
            let series = &info.carbon.values;
            let set = jobs(
                Scenario::AdHoc,
                config.nightly_hour,
                dh,
                sh,
                split,
                series.len(),
            );
            let known = KnownAhead {
                table,
                series,
                hours,
            };
            let (b, o, p, _) = evaluate(series, &known, &set)?;
            per_zone.push((info.carbon.zone.clone(), captured(b, o, p)));
        }
        known_ahead.push(KnownAheadRow {
            hours_known: hours,
            mean_captured: per_zone.iter().map(|(_, c)| c.unwrap_or(0.0)).sum::<f64>()
                / per_zone.len().max(1) as f64,
            zones_at_goal: per_zone
                .iter()
                .filter(|(_, c)| c.is_some_and(|c| c >= goal))
                .count(),
            per_zone,
        });
    }
    let headline = Headline {
        scenario: format!("ad-hoc {dh} h jobs, {sh} h slack, Jul–Dec 2023"),
        mean_captured: per_zone.iter().map(|(_, c)| c.unwrap_or(0.0)).sum::<f64>()
            / per_zone.len() as f64,
        zones_at_goal: per_zone
            .iter()
            .filter(|(_, c)| c.is_some_and(|c| c >= goal))
            .count(),
        per_zone,
        goal,
        known_ahead,
    };
    let spatial = spatial(&infos, &tables, split);
    Ok(ShiftReport {
        config: config.clone(),
        forecaster: chosen.describe(),
        tuning,
        zones: infos,
        rows,
        headline,
        spatial,
        seconds: started.elapsed().as_secs_f64(),
    })
}

/// Ad-hoc 4-hour jobs released every hour of the evaluation half, sent to one of the
/// zones with prices by [`choose_region`] (carbon: the measured hour then the forecast;
/// price: the measured prices of those hours, as a day-ahead market would publish them).
fn spatial(infos: &[ZoneInfo], tables: &[ForecastTable], split: usize) -> Vec<SpatialRow> {
    const DURATION: usize = 4;
    let priced: Vec<(usize, &HourlySeries)> = infos
        .iter()
        .enumerate()
        .filter_map(|(i, info)| info.prices.as_ref().map(|p| (i, p)))
        .collect();
    let end = priced
        .iter()
        .map(|(i, p)| infos[*i].carbon.values.len().min(p.values.len()))
        .min()
        .unwrap_or(0);
    let weightings = [
        ("carbon only", 1.0, 0.0),
        ("price only", 0.0, 1.0),
        ("carbon 0.5 + price 0.5", 0.5, 0.5),
    ];
    let mut out = Vec::new();
    for (name, carbon_w, price_w) in weightings {
        let mut counts = vec![0usize; priced.len()];
        let (mut carbon_sum, mut price_sum, mut n) = (0.0, 0.0, 0usize);
        for release in split..end.saturating_sub(DURATION) {
            let offers: Vec<RegionOffer> = priced
                .iter()
                .map(|(i, prices)| {
                    let carbon = &infos[*i].carbon.values;
                    let mut forecast = vec![carbon[release]];
                    forecast.extend(
                        tables[*i]
                            .row(release)
                            .unwrap_or(&[])
                            .iter()
                            .take(DURATION - 1),
                    );
                    RegionOffer {
                        name: infos[*i].carbon.zone.clone(),
                        carbon_forecast: forecast,
                        price: prices.values[release..release + DURATION]
                            .iter()
                            .sum::<f64>()
                            / DURATION as f64,
                        free_capacity: 1.0,
                    }
                })
                .collect();
            let ranking = choose_region(
                &offers,
                1.0,
                RegionWeights {
                    carbon: carbon_w,
                    price: price_w,
                    capacity: 0.0,
                },
            );
            let Some(best) = ranking.ranked.first() else {
                continue;
            };
            let (i, _) = priced[best.index];
            counts[best.index] += 1;
            carbon_sum += infos[i].carbon.values[release..release + DURATION]
                .iter()
                .sum::<f64>()
                / DURATION as f64;
            price_sum += offers[best.index].price;
            n += 1;
        }
        out.push(SpatialRow {
            weights: name.to_string(),
            mean_carbon: carbon_sum / n.max(1) as f64,
            mean_price: price_sum / n.max(1) as f64,
            jobs_per_zone: priced
                .iter()
                .zip(&counts)
                .map(|((i, _), c)| (infos[*i].carbon.zone.clone(), *c))
                .collect(),
        });
    }
    out
}

/// Loads every zone in [`ZONES`] from `data` and runs [`shift_experiment`].
pub fn run_shift(data: &Path, config: &ShiftConfig) -> Result<ShiftReport> {
    let mut zones = Vec::new();
    for zone in ZONES {
        let carbon = load_carbon(data, zone)?;
        let price_path = data
            .join("electricity-prices-hourly-2023")
            .join(format!("{zone}_electricity_prices_2023.csv"));
        let prices = if price_path.exists() {
            Some(load_prices(data, zone)?)
        } else {
            None
        };
        zones.push((carbon, prices));
    }
    let started = Instant::now();
    let mut report = shift_experiment(zones, config)?;
    report.seconds = started.elapsed().as_secs_f64();
    Ok(report)
}

fn opt(value: Option<f64>) -> String {
    value.map_or("-".to_string(), |v| format!("{v:.3}"))
}

impl ShiftReport {
    /// The human summary: headline per zone, then savings by slack.
    pub fn table(&self) -> String {
        let (dh, sh) = (self.config.headline_duration, self.config.headline_slack);
        let mut out = format!(
            "Carbon-aware temporal shifting (Electricity Maps 2023 data). Forecaster: {}, chosen on Jan–Jun; results on Jul–Dec.\n\nHeadline: {}\n",
            self.forecaster, self.headline.scenario
        );
        let _ = writeln!(
            out,
            "{:<12} {:>8} {:>9} {:>9} {:>9} {:>7} {:>7} {:>7} {:>6} {:>9} {:>7}",
            "zone",
            "base g",
            "forecast",
            "oracle",
            "fc save%",
            "or sav%",
            "capt.",
            "MAPE%",
            "WAPE%",
            "met/jobs",
            "filled"
        );
        for info in &self.zones {
            let zone = &info.carbon.zone;
            let Some(row) = self.rows.iter().find(|r| {
                &r.zone == zone
                    && r.scenario == Scenario::AdHoc
                    && r.duration_h == dh
                    && r.slack_h == sh
            }) else {
                continue;
            };
            let _ = writeln!(
                out,
                "{:<12} {:>8.1} {:>9.1} {:>9.1} {:>9.2} {:>7.2} {:>7} {:>7.1} {:>6.1} {:>4}/{:<4} {:>7}",
                zone,
                row.baseline,
                row.forecast,
                row.oracle,
                row.forecast_saving_pct,
                row.oracle_saving_pct,
                opt(row.captured),
                info.mape_pct,
                info.wape_pct,
                row.deadlines_met,
                row.jobs,
                info.carbon.filled
            );
        }
        let _ = writeln!(
            out,
            "mean captured share {:.3}; zones at ≥ {:.0}%: {}/{}. Let's Wait Awhile (Wiesner et al. 2021) reported 5.9–9.0% savings for Germany and Great Britain.\n",
            self.headline.mean_captured,
            self.headline.goal * 100.0,
            self.headline.zones_at_goal,
            self.headline.per_zone.len()
        );
        if !self.headline.known_ahead.is_empty() {
            let _ = writeln!(
                out,
                "What a better short-term forecast could add: captured share with the next k hours known exactly (the rest forecast), same rule:"
            );
            let _ = write!(out, "{:<12}", "k hours");
            for (zone, _) in &self.headline.per_zone {
                let _ = write!(out, " {zone:>11}");
            }
            let _ = writeln!(out, " {:>8} {:>8}", "mean", "at goal");
            let rows = std::iter::once((
                0,
                &self.headline.per_zone,
                self.headline.mean_captured,
                self.headline.zones_at_goal,
            ))
            .chain(
                self.headline
                    .known_ahead
                    .iter()
                    .map(|k| (k.hours_known, &k.per_zone, k.mean_captured, k.zones_at_goal)),
            );
            for (hours, per_zone, mean, at_goal) in rows {
                let label = if hours == 0 {
                    "0 (forecast)".to_string()
                } else {
                    hours.to_string()
                };
                let _ = write!(out, "{label:<12}");
                for (_, c) in per_zone {
                    let _ = write!(out, " {:>11}", opt(*c));
                }
                let _ = writeln!(out, " {mean:>8.3} {:>4}/{:<3}", at_goal, per_zone.len());
            }
            let _ = writeln!(out);
        }
        let _ = writeln!(out, "Saving % forecast / oracle (captured share) by slack:");
        for scenario in [Scenario::Nightly, Scenario::AdHoc] {
            for &duration in &self.config.durations {
                let _ = write!(out, "{:<12} {} {duration} h", "", scenario.as_str());
                let _ = writeln!(out);
                let _ = write!(out, "{:<12}", "zone");
                for slack in &self.config.slacks {
                    let _ = write!(out, " {:>22}", format!("slack {slack} h"));
                }
                let _ = writeln!(out);
                for info in &self.zones {
                    let _ = write!(out, "{:<12}", info.carbon.zone);
                    for &slack in &self.config.slacks {
                        let cell = self.rows.iter().find(|r| {
                            r.zone == info.carbon.zone
                                && r.scenario == scenario
                                && r.duration_h == duration
                                && r.slack_h == slack
                        });
                        let text = cell.map_or("-".to_string(), |r| {
                            format!(
                                "{:.1}/{:.1} ({})",
                                r.forecast_saving_pct,
                                r.oracle_saving_pct,
                                opt(r.captured)
                            )
                        });
                        let _ = write!(out, " {text:>22}");
                    }
                    let _ = writeln!(out);
                }
            }
        }
        let _ = writeln!(
            out,
            "\nSpatial (ad-hoc 4 h jobs, zones with prices, choose_region, no capacity limit):"
        );
        for row in &self.spatial {
            let _ = writeln!(
                out,
                "  {:<24} mean {:.1} g/kWh, {:.1} USD/MWh; jobs per zone {:?}",
                row.weights, row.mean_carbon, row.mean_price, row.jobs_per_zone
            );
        }
        let missed: usize = self.rows.iter().map(|r| r.jobs - r.deadlines_met).sum();
        let _ = writeln!(
            out,
            "\nDeadlines missed: {missed}. Experiment time {:.2} s.",
            self.seconds
        );
        out
    }

    /// One line per zone × scenario × duration × slack.
    pub fn csv(&self) -> String {
        let mut out = String::from("zone,scenario,duration_h,slack_h,jobs,baseline_g_per_kwh,forecast_g_per_kwh,oracle_g_per_kwh,forecast_saving_pct,oracle_saving_pct,captured_share,deadlines_met\n");
        for r in &self.rows {
            let _ = writeln!(
                out,
                "{},{},{},{},{},{:.4},{:.4},{:.4},{:.4},{:.4},{},{}",
                r.zone,
                r.scenario.as_str(),
                r.duration_h,
                r.slack_h,
                r.jobs,
                r.baseline,
                r.forecast,
                r.oracle,
                r.forecast_saving_pct,
                r.oracle_saving_pct,
                r.captured.map_or(String::new(), |c| format!("{c:.4}")),
                r.deadlines_met
            );
        }
        out
    }

    /// Saving % against slack per zone for ad-hoc jobs of the headline duration:
    /// the forecast policy solid, the oracle dashed, one colour per zone.
    pub fn svg(&self) -> String {
        let dh = self.config.headline_duration;
        let mut lines = Vec::new();
        for (colour, info) in self.zones.iter().enumerate() {
            let cells: Vec<&ShiftRow> = self
                .rows
                .iter()
                .filter(|r| {
                    r.zone == info.carbon.zone
                        && r.scenario == Scenario::AdHoc
                        && r.duration_h == dh
                })
                .collect();
            for (dashed, pick) in [
                (
                    false,
                    (|r: &ShiftRow| r.forecast_saving_pct) as fn(&ShiftRow) -> f64,
                ),
                (true, |r: &ShiftRow| r.oracle_saving_pct),
            ] {
                lines.push(XyLine {
                    name: if dashed {
                        String::new()
                    } else {
                        info.carbon.zone.clone()
                    },
                    points: cells.iter().map(|r| (r.slack_h as f64, pick(r))).collect(),
                    colour,
                    dashed,
                });
            }
        }
        svg_xy(
            &format!("Ad-hoc {dh} h jobs, Jul–Dec 2023: solid = forecast policy, dashed = oracle"),
            "slack (hours)",
            "emissions saving vs no shift (%)",
            &lines,
        )
    }

    /// Writes shift.csv, shift.json and shift.svg into `out` (created if missing).
    pub fn write_all(&self, out: &Path) -> Result<Vec<PathBuf>> {
        std::fs::create_dir_all(out).with_context(|| format!("cannot create {}", out.display()))?;
        let files = [
            ("shift.csv", self.csv()),
            ("shift.json", serde_json::to_string_pretty(self)?),
            ("shift.svg", self.svg()),
        ];
        let mut written = Vec::new();
        for (name, body) in files {
            let path = out.join(name);
            std::fs::write(&path, body)
                .with_context(|| format!("cannot write {}", path.display()))?;
            written.push(path);
        }
        Ok(written)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A daily cycle with a slow multi-day swing and deterministic noise.
    fn synthetic(hours: usize) -> Vec<f64> {
        let mut state = 7u64;
        (0..hours)
            .map(|h| {
                state = state
                    .wrapping_mul(6_364_136_223_846_793_005)
                    .wrapping_add(1);
                let noise = (state >> 40) as f64 / (1u64 << 24) as f64 - 0.5;
                let day = (h % 24) as f64 / 24.0 * std::f64::consts::TAU;
                let week = h as f64 / 24.0 / 5.0 * std::f64::consts::TAU;
                300.0 + 80.0 * day.sin() + 60.0 * week.sin() + 20.0 * noise
            })
            .collect()
    }

    fn series(zone: &str, values: Vec<f64>) -> HourlySeries {
        HourlySeries {
            zone: zone.into(),
            start_hour: 0,
            values,
            filled: 0,
            duplicates: 0,
            estimated: 0,
        }
    }

    fn small_config() -> ShiftConfig {
        ShiftConfig {
            durations: vec![1, 3],
            slacks: vec![2, 8],
            split_hour: 24 * 30,
            tune_days: vec![3, 7],
            tune_decays: vec![0.9, 1.0],
            tune_momenta: vec![0.0, 0.5],
            tune_ridge_half_lives: vec![30.0],
            ..ShiftConfig::default()
        }
    }

    #[test]
    fn synthetic_experiment_meets_deadlines_and_captures_most_of_the_cycle() {
        let zones = vec![
            (series("A", synthetic(24 * 60)), None),
            (series("B", vec![100.0; 24 * 60]), None),
        ];
        let report = shift_experiment(zones, &small_config()).expect("runs");
        assert_eq!(report.rows.len(), 2 * 2 * 2 * 2);
        for row in &report.rows {
            assert_eq!(row.deadlines_met, row.jobs, "{row:?}");
            assert!(row.jobs > 0);
            assert!(row.oracle <= row.forecast + 1e-9 && row.oracle <= row.baseline + 1e-9);
        }
        let headline = report.headline.per_zone[0].1.expect("A has a saving");
        assert!(headline > 0.8, "captured {headline}");
        // A flat series has nothing to capture.
        assert_eq!(report.headline.per_zone[1].1, None);
        // Knowing hours ahead never beats perfect foresight, and knowing them all up to
        // the window would be perfect foresight itself.
        assert_eq!(report.headline.known_ahead.len(), 3);
        for row in &report.headline.known_ahead {
            let share = row.per_zone[0].1.expect("A has a saving");
            assert!(share <= 1.0 + 1e-9, "{row:?}");
            assert_eq!(row.per_zone[1].1, None);
        }
        assert!(report.table().contains("Headline"));
        assert!(report.table().contains("next k hours known"));
        assert_eq!(report.csv().lines().count(), 1 + report.rows.len());
        assert!(report.svg().starts_with("<svg"));
    }

    #[test]
    fn knowing_the_whole_window_is_perfect_foresight() {
        let values = synthetic(24 * 20);
        let table = ForecastModel::Profile(ProfileBlend::default()).table(&values, 9);
        let set = jobs(Scenario::AdHoc, 1, 1, 8, 24 * 5, values.len());
        let known = KnownAhead {
            table: &table,
            series: &values,
            hours: 8,
        };
        let (base, online, best, met) = evaluate(&values, &known, &set).expect("runs");
        assert_eq!(met, set.len());
        assert!((online - best).abs() < 1e-9, "{online} vs {best}");
        assert!(best < base);
        let (_, forecast, _, _) = evaluate(&values, &table, &set).expect("runs");
        assert!(forecast >= online - 1e-9);
    }
}
