//! `nephele report cost|carbon`: chargeback and showback over a time range, per job and
//! deployment or per tenant (`GET /v1/reports/cost|carbon`; the README's "Chargeback
//! and showback" says what each figure is).

use anyhow::{bail, Context as _, Result};
use nephele_api::{CarbonReport, CarbonRow, CostReport, CostRow};

use crate::client::{show, when_unix, ApiArgs};

#[derive(Debug, Clone, clap::Subcommand)]
pub enum ReportCommand {
    /// GPU- and CPU-seconds on the pools, their cost, and requests served on devices.
    Cost(ReportArgs),
    /// Energy on the pools and the carbon it emitted at each hour's measured intensity.
    Carbon(ReportArgs),
}

#[derive(Debug, Clone, clap::Args)]
pub struct ReportArgs {
    /// The range's length back from --to (or now): 90m, 24h, 7d (default 24h).
    #[arg(long, conflicts_with = "from")]
    pub since: Option<String>,
    /// The range's start: 2026-12-01T00:00Z, or unix seconds (rounded down to the hour).
    #[arg(long)]
    pub from: Option<String>,
    /// The range's end: 2026-12-02T00:00Z, or unix seconds (rounded up to the hour;
    /// default now).
    #[arg(long)]
    pub to: Option<String>,
    /// A row per `workload` (job or deployment) or per `tenant`.
    #[arg(long, default_value = "workload", value_parser = ["workload", "tenant"])]
    pub by: String,
    /// Only this tenant's rows (admins; other tokens see their own tenant's only).
    #[arg(long)]
    pub tenant: Option<String>,
    /// Only this region's pools (requests served on devices are then left out).
    #[arg(long)]
    pub region: Option<String>,
}

/// Unix seconds of `--from`/`--to`: a number, or an ISO-8601 UTC time.
fn instant(flag: &str, text: &str) -> Result<u64> {
    if let Ok(seconds) = text.trim().parse::<u64>() {
        return Ok(seconds);
    }
    crate::grid_forecast::parse_utc_seconds(text).with_context(|| {
        format!("--{flag} {text:?}: give unix seconds or a UTC time such as 2026-12-01T00:00Z")
    })
}

/// Seconds of `--since`: a number with `s`, `m`, `h` or `d`.
fn duration(text: &str) -> Result<u64> {
    let text = text.trim();
    let split = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let number: u64 = number
        .parse()
        .ok()
        .filter(|n| *n > 0)
        .with_context(|| format!("--since {text:?}: give a length such as 90m, 24h or 7d"))?;
    let unit_s = match unit {
        "s" => 1,
        "m" => 60,
        "h" | "" => 3600,
        "d" => 86_400,
        _ => bail!("--since {text:?}: the unit is s, m, h or d (e.g. 24h, 7d)"),
    };
    Ok(number.saturating_mul(unit_s))
}

/// The API path of a report, from the flags.
fn path(kind: &str, args: &ReportArgs) -> Result<String> {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let to = match &args.to {
        Some(text) => instant("to", text)?,
        None => now,
    };
    let from = match (&args.from, &args.since) {
        (Some(text), _) => instant("from", text)?,
        (None, Some(since)) => to.saturating_sub(duration(since)?),
        (None, None) => to.saturating_sub(24 * 3600),
    };
    if from >= to {
        bail!("the range is empty: --from must come before --to");
    }
    let mut path = format!("/v1/reports/{kind}?from={from}&to={to}&group={}", args.by);
    if let Some(tenant) = &args.tenant {
        path.push_str(&format!("&tenant={tenant}"));
    }
    if let Some(region) = &args.region {
        path.push_str(&format!("&region={region}"));
    }
    Ok(path)
}

fn hours(seconds: f64) -> String {
    format!("{:.2}", seconds / 3600.0)
}

fn range_line(from: u64, to: u64) {
    println!(
        "from {} to {}",
        when_unix(Some(from)).split(" (").next().unwrap_or(""),
        when_unix(Some(to)).split(" (").next().unwrap_or("")
    );
}

fn regions(list: &[String]) -> String {
    if list.is_empty() {
        "-".into()
    } else {
        list.join(",")
    }
}

/// The tenant column's text: `?` for a deployment deleted before its usage was
/// counted.
fn tenant(name: &str) -> &str {
    if name.is_empty() {
        "?"
    } else {
        name
    }
}

/// Prints each row, then the total (`all`), or that nothing was used.
fn each_row<R>(rows: &[R], total: &R, row: impl Fn(&str, &R), tenant_of: impl Fn(&R) -> &str) {
    for r in rows {
        row(tenant(tenant_of(r)), r);
    }
    if rows.is_empty() {
        println!("(nothing used in this range)");
    } else {
        row("all", total);
    }
}

fn print_cost(v: &CostReport) {
    range_line(v.from, v.to);
    println!(
        "{:<12} {:<11} {:<22} {:>10} {:>10} {:>10} {:>11} {:>11} {:>7}  REGIONS",
        "TENANT",
        "KIND",
        "NAME",
        "GPU-HOURS",
        "CPU-HOURS",
        "COST",
        "EDGE-LOCAL",
        "OFFLOADED",
        "FAILED"
    );
    each_row(
        &v.rows,
        &v.total,
        |tenant, r: &CostRow| {
            println!(
                "{:<12} {:<11} {:<22} {:>10} {:>10} {:>10.2} {:>11} {:>11} {:>7}  {}",
                tenant,
                r.kind,
                r.name,
                hours(r.gpu_seconds),
                hours(r.cpu_seconds),
                r.cost,
                r.edge_requests_local,
                r.edge_requests_offloaded,
                r.edge_requests_failed,
                regions(&r.regions)
            );
        },
        |r| r.tenant.as_str(),
    );
    println!("(cost in the pools' price unit: node share × price_per_hour)");
}

fn print_carbon(v: &CarbonReport) {
    range_line(v.from, v.to);
    println!(
        "{:<12} {:<11} {:<22} {:>10} {:>12} {:>10} {:>14}  REGIONS",
        "TENANT", "KIND", "NAME", "KWH", "KG-CO2EQ", "G/KWH", "KWH-NO-SIGNAL"
    );
    each_row(
        &v.rows,
        &v.total,
        |tenant, r: &CarbonRow| {
            println!(
                "{:<12} {:<11} {:<22} {:>10.3} {:>12.3} {:>10} {:>14.3}  {}",
                tenant,
                r.kind,
                r.name,
                r.energy_kwh,
                r.carbon_g / 1000.0,
                r.intensity_g_per_kwh
                    .map_or("-".to_string(), |g| format!("{g:.0}")),
                r.energy_without_signal_kwh,
                regions(&r.regions)
            );
        },
        |r| r.tenant.as_str(),
    );
    println!("(energy at the nodes' rated power; carbon only for hours with a measured intensity)");
}

pub fn run(args: ApiArgs, command: ReportCommand) -> Result<()> {
    let api = args.client()?;
    match &command {
        ReportCommand::Cost(flags) => {
            let report: CostReport = api.get_as(&path("cost", flags)?)?;
            show(args.json, &report, print_cost);
        }
        ReportCommand::Carbon(flags) => {
            let report: CarbonReport = api.get_as(&path("carbon", flags)?)?;
            show(args.json, &report, print_carbon);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lengths_and_instants_parse_and_bad_ones_say_what_to_give() {
        assert_eq!(duration("90m").unwrap(), 5400);
        assert_eq!(duration("24h").unwrap(), 86_400);
        assert_eq!(duration("7d").unwrap(), 604_800);
        assert!(duration("0h").is_err());
        assert!(format!("{:#}", duration("3w").unwrap_err()).contains("s, m, h or d"));
        assert_eq!(instant("from", "3600").unwrap(), 3600);
        assert_eq!(instant("from", "1970-01-01T01:00Z").unwrap(), 3600);
        assert!(format!("{:#}", instant("from", "yesterday").unwrap_err()).contains("unix seconds"));
    }

    #[test]
    fn the_path_carries_the_range_and_the_filters() {
        let args = ReportArgs {
            since: None,
            from: Some("0".into()),
            to: Some("7200".into()),
            by: "tenant".into(),
            tenant: Some("team-a".into()),
            region: None,
        };
        assert_eq!(
            path("cost", &args).unwrap(),
            "/v1/reports/cost?from=0&to=7200&group=tenant&tenant=team-a"
        );
        let empty = ReportArgs {
            from: Some("7200".into()),
            ..args
        };
        assert!(path("cost", &empty).is_err());
    }
}
