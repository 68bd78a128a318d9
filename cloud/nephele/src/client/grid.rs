//! `nephele grid`: a region's carbon and price signal and its forecasts.

use anyhow::{bail, Context as _, Result};
use nephele_api::*;

use super::*;

#[derive(Debug, Clone, clap::Subcommand)]
pub enum GridCommand {
    /// What a region's carbon decisions see: the signal and the next hours, measured or
    /// forecast.
    Show {
        region: String,
        /// Hours to list (up to 72).
        #[arg(long, default_value_t = 24)]
        hours: usize,
    },
    /// Push hourly measurements from files in the `../shared/data` format (Electricity
    /// Maps carbon intensity, GreenDCC prices), as a carbon feed would, and a
    /// carbon-intensity provider's forecast (`--forecast`).
    Push {
        region: String,
        /// A carbon-intensity file (`Carbon Intensity gCO₂eq/kWh (direct)` column).
        #[arg(long)]
        carbon: Option<std::path::PathBuf>,
        /// A price file (`Price (USD/MWh)` column).
        #[arg(long)]
        prices: Option<std::path::PathBuf>,
        /// A provider's carbon forecast: Electricity Maps' forecast JSON, the Carbon
        /// Intensity API's (GB) JSON, or a CSV as Electricity Maps exports it. Kept
        /// beside the measurements and used, while fresh, instead of the region's own
        /// forecast for the hours it covers.
        #[arg(long)]
        forecast: Option<std::path::PathBuf>,
        /// When the forecast was made (UTC, `2023-08-31T09:50Z`); default: the file's
        /// `updatedAt`, else now.
        #[arg(long)]
        issued: Option<String>,
        /// Who made the forecast (default: from the file).
        #[arg(long)]
        source: Option<String>,
        /// Replay a past series as if live: this hour of the files (UTC,
        /// `2023-07-01T12:00`) becomes the current hour, and nothing after it is sent.
        #[arg(long)]
        as_of: Option<String>,
        /// Days of history to send, ending at --as-of (or now).
        #[arg(long, default_value_t = 60)]
        days: u64,
    },
}

pub fn grid(args: ApiArgs, command: GridCommand) -> Result<()> {
    let api = args.client()?;
    match command {
        GridCommand::Show { region, hours } => {
            let grid: GridView = api.get_as(&format!("/v1/regions/{region}/grid"))?;
            show(args.json, &grid, |g| print_grid(g, hours));
        }
        GridCommand::Push {
            region,
            carbon,
            prices,
            forecast,
            issued,
            source,
            as_of,
            days,
        } => {
            if carbon.is_none() && prices.is_none() && forecast.is_none() {
                bail!("nothing to push: give --carbon FILE, --prices FILE and/or --forecast FILE");
            }
            if (issued.is_some() || source.is_some()) && forecast.is_none() {
                bail!("--issued and --source describe a --forecast FILE; give one");
            }
            let forecast = match &forecast {
                None => None,
                Some(path) => {
                    let text = std::fs::read_to_string(path)
                        .with_context(|| format!("cannot read {}", path.display()))?;
                    let read = crate::grid_forecast::parse(&path.display().to_string(), &text)?;
                    let issued_unix = match &issued {
                        Some(text) => crate::grid_forecast::parse_utc_seconds(text)
                            .with_context(|| {
                                format!("--issued {text:?}: expected a UTC time such as 2023-08-31T09:50Z")
                            })?,
                        None => read.issued_unix.unwrap_or_else(unix_now),
                    };
                    Some(GridForecastBody {
                        issued_unix,
                        source: source.clone().unwrap_or(read.source),
                        points: read
                            .hours
                            .iter()
                            .map(|(hour, carbon)| GridForecastPointBody {
                                unix: hour * 3600,
                                carbon_g_per_kwh: *carbon,
                            })
                            .collect(),
                    })
                }
            };
            let now_hour = (unix_now() / 3600) as i64;
            let anchor = match &as_of {
                Some(text) => nephele_sim::trace::parse_utc_hour(text).with_context(|| {
                    format!("--as-of {text:?}: expected a UTC time such as 2023-07-01T12:00")
                })?,
                None => now_hour,
            };
            let shift = now_hour - anchor;
            let first = anchor - days.max(1) as i64 * 24 + 1;
            let mut hours: std::collections::BTreeMap<i64, (Option<f64>, Option<f64>)> =
                Default::default();
            for path in carbon.iter().chain(prices.iter()) {
                let (kind, series) = nephele_sim::trace::load_grid_file(path)?;
                let span = (
                    series.start_hour,
                    series.start_hour + series.values.len() as i64 - 1,
                );
                let mut used = 0;
                for (i, value) in series.values.iter().enumerate() {
                    let hour = series.start_hour + i as i64;
                    if hour < first || hour > anchor {
                        continue;
                    }
                    let entry = hours.entry(hour + shift).or_default();
                    match kind {
                        nephele_sim::trace::GridColumn::Carbon => entry.0 = Some(*value),
                        nephele_sim::trace::GridColumn::Price => entry.1 = Some(*value),
                    }
                    used += 1;
                }
                if used == 0 {
                    bail!(
                        "{} covers {} … {} UTC, none of it in the {days} days up to {} UTC; to replay it as if live, pass --as-of with a time inside it",
                        path.display(),
                        nephele_sim::trace::format_utc_hour(span.0),
                        nephele_sim::trace::format_utc_hour(span.1),
                        nephele_sim::trace::format_utc_hour(anchor)
                    );
                }
            }
            let points: Vec<GridPointBody> = hours
                .iter()
                .filter(|(hour, _)| **hour >= 0)
                .map(|(hour, (carbon, price))| GridPointBody {
                    unix: *hour as u64 * 3600,
                    carbon_g_per_kwh: *carbon,
                    price_per_mwh: *price,
                })
                .collect();
            let sent = points.len();
            let body = GridPushBody { points, forecast };
            let pushed: GridPushView = api.put_as(&format!("/v1/regions/{region}/grid"), &body)?;
            show(args.json, &pushed, |v| {
                if sent > 0 {
                    println!(
                        "region {region}: sent {sent} hours ({} … {} UTC of the files{}), kept {}, {} older than the 90 days a region keeps",
                        nephele_sim::trace::format_utc_hour(first),
                        nephele_sim::trace::format_utc_hour(anchor),
                        if shift != 0 { ", replayed as the hours up to now" } else { "" },
                        v.kept,
                        v.too_old
                    );
                }
                if let Some(hours) = v.forecast_hours {
                    println!(
                        "region {region}: provider forecast of {hours} hours stored{}",
                        match v.replaced_forecast_issued_unix {
                            Some(issued) => format!(", replacing the one issued {}", utc(issued)),
                            None => String::new(),
                        }
                    );
                }
                print_grid(&v.grid, 12);
            });
        }
    }
    Ok(())
}

fn print_grid(v: &GridView, hours: usize) {
    println!(
        "grid of region {} (zone {}): signal {}, {} hours measured, newest {}, {} deferred job(s)",
        v.region,
        text(v.carbon_zone.as_deref()),
        v.signal,
        v.measured_hours,
        v.latest_measured_unix.map_or("-".into(), utc),
        v.deferred_jobs
    );
    if let Some(note) = &v.note {
        println!("  {note}");
    }
    if let Some(f) = &v.forecast {
        println!(
            "  provider forecast: {} issued {}, {} hours ({} … {}), {}",
            f.source,
            utc(f.issued_unix),
            f.hours,
            utc(f.first_unix),
            utc(f.last_unix),
            if f.fresh {
                "used for the hours it covers"
            } else {
                "stale (over 12 h old): not used"
            }
        );
    }
    if v.outlook.is_empty() {
        return;
    }
    println!(
        "  {:<20} {:>12} {:<9} {:>10}",
        "HOUR", "gCO2eq/kWh", "", "PRICE/MWh"
    );
    for hour in v.outlook.iter().take(hours.clamp(1, 72)) {
        println!(
            "  {:<20} {:>12.1} {:<9} {:>10}",
            utc(hour.unix),
            hour.carbon_g_per_kwh,
            match hour.source.as_str() {
                "measured" => "measured",
                "provider" => "provider",
                _ => "forecast",
            },
            hour.price_per_mwh.map_or("-".into(), |p| format!("{p:.1}"))
        );
    }
    if let Some(best) = v
        .outlook
        .iter()
        .filter(|h| h.carbon_g_per_kwh.is_finite())
        .min_by(|a, b| a.carbon_g_per_kwh.total_cmp(&b.carbon_g_per_kwh))
    {
        println!(
            "  greenest hour in the next {}: {} at {:.1} g/kWh",
            v.outlook.len(),
            utc(best.unix),
            best.carbon_g_per_kwh
        );
    }
}
