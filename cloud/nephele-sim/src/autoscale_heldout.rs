//! `nephele sim autoscale --heldout`: the one default configuration of ours, with
//! static, HPA, KPA and the clairvoyant oracle beside it, on each trace and on every
//! held-out variation of it ([`crate::autoscale_variants`]: cut by time, thinned and
//! superposed to ×0.25–×4 the rate, request lengths shuffled, swapped between halves
//! and scaled ×0.5–×4). A default that holds only on the data that chose it is not a
//! default: this is the table that says where it holds.
//!
//! Per row: the within-target share and GPU-hours (and their share of static's) of
//! every policy, ours' GPU-hours over the oracle's, and whether ours met the goal of
//! every trace (≥ 99% within target at ≤ 1.0× static's GPU-hours) and the stretch
//! (≤ 1.5× the oracle's).

use std::path::{Path, PathBuf};

use anyhow::{Context as _, Result};
use serde::Serialize;

use crate::autoscale::{run_autoscale_workload, AutoscaleOptions, TraceReport};
use crate::autoscale_trace::{load_cold_starts, load_workload};
use crate::autoscale_variants::variations;
use crate::plot::{svg_bars, BarGroup};
use crate::trace::load_prices;

/// One policy on one row.
#[derive(Debug, Clone, Serialize)]
pub struct Cell {
    pub policy: String,
    pub within_slo: f64,
    pub gpu_hours: f64,
    pub share_of_static: f64,
}

/// One trace or variation.
#[derive(Debug, Clone, Serialize)]
pub struct Row {
    pub trace: String,
    /// `as-given`, or the variation's name.
    pub variant: String,
    pub what: String,
    pub requests: usize,
    pub static_replicas: u32,
    pub cells: Vec<Cell>,
    pub ours_over_oracle: Option<f64>,
    /// Ours ≥ 99% within target at ≤ 1.0× static's GPU-hours.
    pub goal_met: bool,
    /// Ours ≤ 1.5× the oracle's GPU-hours (None: no oracle).
    pub stretch_met: Option<bool>,
    /// What ours learned one replica carries within target (req/s).
    pub ours_capacity_per_s: Option<f64>,
}

/// Every row, and how they were made.
#[derive(Debug, Clone, Serialize)]
pub struct HeldoutReport {
    pub rows: Vec<Row>,
    pub seed: u64,
    pub variation_seed: u64,
    pub warmup_s: f64,
    pub seconds: f64,
}

fn row(trace: &str, variant: &str, what: &str, report: &TraceReport) -> Row {
    let static_gpu = report
        .policies
        .iter()
        .find(|p| p.name == "static")
        .map_or(0.0, |p| p.gpu_hours);
    let cells: Vec<Cell> = report
        .policies
        .iter()
        .map(|p| Cell {
            policy: p.name.clone(),
            within_slo: p.within_slo,
            gpu_hours: p.gpu_hours,
            share_of_static: p.gpu_hours / static_gpu.max(1e-9),
        })
        .collect();
    let ours = cells.iter().find(|c| c.policy == "ours");
    let oracle = cells.iter().find(|c| c.policy == "oracle");
    let ours_over_oracle = ours
        .zip(oracle)
        .map(|(ours, oracle)| ours.gpu_hours / oracle.gpu_hours.max(1e-9));
    Row {
        trace: trace.to_string(),
        variant: variant.to_string(),
        what: what.to_string(),
        requests: report.requests,
        static_replicas: report.static_replicas,
        goal_met: ours.is_some_and(|c| c.within_slo >= 0.99 && c.share_of_static <= 1.0),
        stretch_met: ours_over_oracle.map(|ratio| ratio <= 1.5),
        ours_over_oracle,
        ours_capacity_per_s: report.ours_capacity.as_ref().map(|c| c.per_replica_per_s),
        cells,
    }
}

/// Runs every policy on each trace of `traces` and on each of its variations
/// (`variation_seed`), with `options` (ours: the defaults, unless `ours_override`).
pub fn run_heldout(
    data: &Path,
    traces: &[&str],
    options: &AutoscaleOptions,
    variation_seed: u64,
    progress: &mut dyn FnMut(&str),
) -> Result<HeldoutReport> {
    let started = std::time::Instant::now();
    let cold_starts = load_cold_starts(data)?;
    let prices = load_prices(data, &options.zone)
        .with_context(|| format!("electricity prices for zone {}", options.zone))?;
    let mut rows = Vec::new();
    for &trace in traces {
        let workload = load_workload(data, trace, &options.service)?;
        let name = workload.name.clone();
        let mut runs = vec![(
            "as-given".to_string(),
            "the trace as published".to_string(),
            workload.clone(),
        )];
        runs.extend(
            variations(&workload, variation_seed)
                .into_iter()
                .map(|v| (v.name, v.what, v.workload)),
        );
        let count = runs.len();
        for (index, (variant, what, workload)) in runs.into_iter().enumerate() {
            progress(&format!(
                "{name}: {variant} ({} of {count}, {} requests)",
                index + 1,
                workload.requests.len()
            ));
            let report =
                run_autoscale_workload(workload, &cold_starts, &prices, options, &mut |_| {})?;
            rows.push(row(&name, &variant, &what, &report));
        }
    }
    Ok(HeldoutReport {
        rows,
        seed: options.seed,
        variation_seed,
        warmup_s: options.warmup_s,
        seconds: started.elapsed().as_secs_f64(),
    })
}

const POLICIES: [&str; 5] = ["static", "hpa", "kpa", "ours", "oracle"];

impl HeldoutReport {
    /// One line per row: within target and share of static's GPU-hours per policy.
    pub fn table(&self) -> String {
        let mut out = format!(
            "{:<34} {:>7} {:>6}  {:>15} {:>15} {:>15} {:>15} {:>15} {:>8}  {}\n",
            "TRACE / VARIATION",
            "REQS",
            "STATIC",
            "STATIC",
            "HPA",
            "KPA",
            "OURS",
            "ORACLE",
            "OURS/OR",
            "GOAL"
        );
        for row in &self.rows {
            let cell = |name: &str| {
                row.cells.iter().find(|c| c.policy == name).map_or_else(
                    || "-".to_string(),
                    |c| {
                        format!(
                            "{:.2}%/{:.0}%",
                            c.within_slo * 100.0,
                            c.share_of_static * 100.0
                        )
                    },
                )
            };
            out += &format!(
                "{:<34} {:>7} {:>6}  {:>15} {:>15} {:>15} {:>15} {:>15} {:>8}  {}\n",
                format!("{}/{}", row.trace, row.variant),
                row.requests,
                row.static_replicas,
                cell("static"),
                cell("hpa"),
                cell("kpa"),
                cell("ours"),
                cell("oracle"),
                row.ours_over_oracle
                    .map_or("-".to_string(), |r| format!("{r:.2}×")),
                if row.goal_met { "met" } else { "missed" },
            );
        }
        let met = self.rows.iter().filter(|r| r.goal_met).count();
        let stretch = self
            .rows
            .iter()
            .filter(|r| r.stretch_met == Some(true))
            .count();
        out += &format!(
            "each cell: within target / GPU-hours as a share of static's. Goal (ours ≥ 99% within at ≤ 1.0× static): met on {met} of {} rows; stretch (≤ 1.5× the oracle): {stretch}. Warm-up {:.0} s unscored; cold-start seed {}, variation seed {}; {:.0} s\n",
            self.rows.len(),
            self.warmup_s,
            self.seed,
            self.variation_seed,
            self.seconds
        );
        out
    }

    pub fn csv(&self) -> String {
        let mut out = String::from(
            "trace,variant,requests,static_replicas,policy,within_slo,gpu_hours,share_of_static,ours_over_oracle,goal_met\n",
        );
        for row in &self.rows {
            for cell in &row.cells {
                out += &format!(
                    "{},{},{},{},{},{:.5},{:.3},{:.4},{},{}\n",
                    row.trace,
                    row.variant,
                    row.requests,
                    row.static_replicas,
                    cell.policy,
                    cell.within_slo,
                    cell.gpu_hours,
                    cell.share_of_static,
                    row.ours_over_oracle
                        .map_or(String::new(), |r| format!("{r:.3}")),
                    row.goal_met
                );
            }
        }
        out
    }

    /// GPU-hours as a share of static's, per row and policy (bars), in percent.
    pub fn svg(&self) -> String {
        let series: Vec<String> = POLICIES.iter().map(|p| p.to_string()).collect();
        let groups: Vec<BarGroup> = self
            .rows
            .iter()
            .map(|row| BarGroup {
                label: format!("{}/{}", row.trace, row.variant),
                bars: POLICIES
                    .iter()
                    .map(|name| {
                        row.cells
                            .iter()
                            .find(|c| c.policy == *name)
                            .map(|c| (c.share_of_static * 100.0, 0.0))
                    })
                    .collect(),
            })
            .collect();
        svg_bars(
            "GPU-hours as a share of static's, per trace and held-out variation",
            "% of static",
            &series,
            &groups,
        )
    }

    /// Writes autoscale-heldout.{csv,json,svg} under `out`.
    pub fn write(&self, out: &Path) -> Result<Vec<PathBuf>> {
        std::fs::create_dir_all(out).with_context(|| format!("cannot create {}", out.display()))?;
        let files = [
            ("autoscale-heldout.csv", self.csv()),
            (
                "autoscale-heldout.json",
                serde_json::to_string_pretty(self)?,
            ),
            ("autoscale-heldout.svg", self.svg()),
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
