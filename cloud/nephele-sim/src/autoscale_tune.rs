//! `nephele sim autoscale --tune`: how ours' parameters are chosen, in the tree so that
//! the choice can be rerun and checked. Only the **tune part** of each trace (its first
//! `tune_share` by time) is read: the workload is cut there before anything runs, so
//! nothing of the held-out part can leak into the choice.
//!
//! For each trace: the LLM replica's concurrency is load-tested on the tune part (as
//! the full run does), static is sized on the tune part (the fewest replicas with the
//! goal share within target there), and every configuration of [`grid`] runs ours on
//! the tune part for each seed. The chosen configuration is the cheapest (largest
//! share of static's GPU-hours over the traces, mean over seeds) whose mean share
//! within target over the seeds reaches the goal on every trace; if none does, the one
//! with the highest such share on its worst trace.

use std::path::Path;

use anyhow::{Context as _, Result};
use nephele_autoscale::{Hpa, HpaConfig, Kpa, KpaConfig, Ours, Static};
use serde::Serialize;
use serde_json::json;

use crate::autoscale::{
    calibrate_concurrency, ours_config, simulate, with_override, AutoscaleOptions, RunContext,
};
use crate::autoscale_trace::{load_cold_starts, load_workload};
use crate::trace::load_prices;

/// The configurations tried: JSON patches over ours' configuration for the trace.
pub fn grid() -> Vec<serde_json::Value> {
    let mut patches = Vec::new();
    for min_replicas in [1u32, 4, 8, 12, 16, 20] {
        for backlog_within_cold_start in [false, true] {
            for utilisation in [0.7, 0.85, 1.0] {
                for stabilisation_s in [60u64, 300, 900] {
                    for (warm, quantile, max_warm) in
                        [(false, 0.8, 8u32), (true, 0.8, 8), (true, 0.95, 16)]
                    {
                        for admission in [true, false] {
                            patches.push(json!({
                                "min_replicas": min_replicas,
                                "backlog_within_cold_start": backlog_within_cold_start,
                                "target_utilisation": utilisation,
                                "scale_down_stabilisation_ms": stabilisation_s * 1000,
                                "warm": {"enabled": warm, "quantile": quantile, "max_warm": max_warm},
                                "admission": {"enabled": admission},
                            }));
                        }
                    }
                }
            }
        }
    }
    patches
}

/// One run of the grid.
#[derive(Debug, Clone, Serialize)]
pub struct TuneRow {
    pub config: usize,
    pub trace: String,
    pub seed: u64,
    pub within_slo: f64,
    /// Requests outside target.
    pub outside: usize,
    pub gpu_hours: f64,
    /// GPU-hours over static's on the tune part.
    pub share_of_static: f64,
}

/// A trace's tune part.
#[derive(Debug, Clone, Serialize)]
pub struct TuneTrace {
    pub trace: String,
    pub requests: usize,
    pub tune_hours: f64,
    pub static_replicas: u32,
    pub static_gpu_hours: f64,
    pub concurrency: u32,
    /// Mean over the seeds of the requests outside target under HPA and KPA.
    pub hpa_outside: f64,
    pub kpa_outside: f64,
}

/// A configuration's figures, mean over seeds, per trace.
#[derive(Debug, Clone, Serialize)]
pub struct TuneSummary {
    pub config: usize,
    pub patch: serde_json::Value,
    /// (trace, mean within, min within, mean share of static, mean outside).
    pub traces: Vec<(String, f64, f64, f64, f64)>,
}

/// The configuration chosen for one trace.
#[derive(Debug, Clone, Serialize)]
pub struct Chosen {
    pub trace: String,
    pub config: usize,
    /// Whether it met the goal on the tune part (else: the best within found).
    pub feasible: bool,
    pub patch: serde_json::Value,
    pub within_mean: f64,
    pub within_min: f64,
    pub share_of_static: f64,
}

#[derive(Debug, Clone, Serialize)]
pub struct TuneReport {
    pub rule: &'static str,
    pub goal: f64,
    pub seeds: Vec<u64>,
    pub traces: Vec<TuneTrace>,
    /// Per configuration (written to the CSV, not the JSON).
    #[serde(skip)]
    pub summaries: Vec<TuneSummary>,
    /// Per configuration, trace and seed (aggregated in the CSV).
    #[serde(skip)]
    pub rows: Vec<TuneRow>,
    /// Per trace, the chosen configuration.
    pub chosen: Vec<Chosen>,
}

/// Runs the grid on the tune part of each trace.
pub fn tune_ours(
    data: &Path,
    traces: &[&str],
    options: &AutoscaleOptions,
    seeds: &[u64],
    progress: &mut dyn FnMut(&str),
) -> Result<TuneReport> {
    let cold_starts = load_cold_starts(data)?;
    let prices = load_prices(data, &options.zone)
        .with_context(|| format!("electricity prices for zone {}", options.zone))?;
    let patches = grid();
    let mut rows = Vec::new();
    let mut tune_traces = Vec::new();
    for trace in traces {
        let mut workload = load_workload(data, trace, &options.service)?;
        let span_us = workload.requests.last().map_or(0, |r| r.arrival_us);
        let tune_until_us = (span_us as f64 * options.tune_share.clamp(0.0, 1.0)) as u64;
        workload.requests.retain(|r| r.arrival_us < tune_until_us);
        if workload.llm.is_some() {
            workload.concurrency = calibrate_concurrency(
                &workload,
                tune_until_us,
                options.static_goal,
                options.seed,
                &prices,
            )
            .concurrency;
        }
        let base = ours_config(&workload, options, tune_until_us);
        let context = |seed: u64, initial: u32| RunContext {
            workload: &workload,
            cold_starts: &cold_starts,
            prices: &prices,
            seed,
            bucket_us: 60_000_000,
            tune_until_us,
            initial_replicas: initial,
            cold_start_scale: options.cold_start_scale,
            declared_concurrency: None,
            score_from_us: 0,
        };
        progress(&format!("{trace}: static on the tune part"));
        let (mut low, mut high) = (options.min_replicas.max(1), options.max_replicas.max(1));
        let mut static_gpu_hours = simulate(
            "static",
            &mut Static::new(high),
            &context(options.seed, high),
        )
        .gpu_hours;
        while low < high {
            let middle = (low + high) / 2;
            let result = simulate(
                "static",
                &mut Static::new(middle),
                &context(options.seed, middle),
            );
            if result.within_slo >= options.static_goal {
                high = middle;
                static_gpu_hours = result.gpu_hours;
            } else {
                low = middle + 1;
            }
        }
        let (mut hpa_outside, mut kpa_outside) = (0.0, 0.0);
        for &seed in seeds {
            let mut hpa = Hpa::new(HpaConfig {
                min_replicas: options.min_replicas,
                max_replicas: options.max_replicas,
                ..HpaConfig::default()
            })?;
            hpa_outside +=
                simulate("hpa", &mut hpa, &context(seed, options.min_replicas)).outside as f64;
            let mut kpa = Kpa::new(KpaConfig {
                min_replicas: options.min_replicas,
                max_replicas: options.max_replicas,
                ..KpaConfig::default()
            })?;
            kpa_outside +=
                simulate("kpa", &mut kpa, &context(seed, options.min_replicas)).outside as f64;
        }
        let runs = seeds.len().max(1) as f64;
        tune_traces.push(TuneTrace {
            trace: trace.to_string(),
            requests: workload.requests.len(),
            tune_hours: tune_until_us as f64 / 3.6e9,
            static_replicas: low,
            static_gpu_hours,
            concurrency: workload.concurrency,
            hpa_outside: hpa_outside / runs,
            kpa_outside: kpa_outside / runs,
        });
        for (index, patch) in patches.iter().enumerate() {
            if index % 50 == 0 {
                progress(&format!(
                    "{trace}: configuration {index} of {}",
                    patches.len()
                ));
            }
            let config = with_override(base.clone(), Some(patch))?;
            for &seed in seeds {
                let mut ours = Ours::new(config.clone())?;
                // A deployment's floor is standing: it is there from the start.
                let initial = config.min_replicas.max(options.min_replicas);
                let result = simulate("ours", &mut ours, &context(seed, initial));
                rows.push(TuneRow {
                    config: index,
                    trace: trace.to_string(),
                    seed,
                    within_slo: result.within_slo,
                    outside: result.outside,
                    gpu_hours: result.gpu_hours,
                    share_of_static: result.gpu_hours / static_gpu_hours.max(1e-9),
                });
            }
        }
    }
    let summaries: Vec<TuneSummary> = patches
        .iter()
        .enumerate()
        .map(|(index, patch)| {
            let per_trace: Vec<(String, f64, f64, f64, f64)> = tune_traces
                .iter()
                .map(|t| {
                    let mine: Vec<&TuneRow> = rows
                        .iter()
                        .filter(|r| r.config == index && r.trace == t.trace)
                        .collect();
                    let n = mine.len().max(1) as f64;
                    (
                        t.trace.clone(),
                        mine.iter().map(|r| r.within_slo).sum::<f64>() / n,
                        mine.iter().map(|r| r.within_slo).fold(1.0, f64::min),
                        mine.iter().map(|r| r.share_of_static).sum::<f64>() / n,
                        mine.iter().map(|r| r.outside as f64).sum::<f64>() / n,
                    )
                })
                .collect();
            TuneSummary {
                config: index,
                patch: patch.clone(),
                traces: per_trace,
            }
        })
        .collect();
    let chosen = tune_traces
        .iter()
        .enumerate()
        .map(|(at, t)| {
            let reactive_outside = t.hpa_outside.min(t.kpa_outside);
            let feasible = summaries
                .iter()
                .filter(|s| {
                    s.traces[at].1 >= options.static_goal
                        && s.traces[at].4 <= 0.5 * reactive_outside
                })
                .min_by(|a, b| a.traces[at].3.total_cmp(&b.traces[at].3));
            let pick = feasible.or_else(|| {
                summaries
                    .iter()
                    .max_by(|a, b| a.traces[at].1.total_cmp(&b.traces[at].1))
            });
            Chosen {
                trace: t.trace.clone(),
                config: pick.map_or(0, |s| s.config),
                feasible: feasible.is_some(),
                patch: pick.map_or(serde_json::Value::Null, |s| s.patch.clone()),
                within_mean: pick.map_or(0.0, |s| s.traces[at].1),
                within_min: pick.map_or(0.0, |s| s.traces[at].2),
                share_of_static: pick.map_or(0.0, |s| s.traces[at].3),
            }
        })
        .collect();
    Ok(TuneReport {
        rule: "per trace (a deployment's own configuration): the cheapest configuration (mean share of the tune part's static GPU-hours over the seeds) that meets issue 13's other two goals on that trace's tune part, mean over the seeds: ≥ the goal share within target, and at most half the requests outside target of the better of HPA and KPA; if none, the one with the highest mean share within",
        goal: options.static_goal,
        seeds: seeds.to_vec(),
        traces: tune_traces,
        summaries,
        rows,
        chosen,
    })
}

impl TuneReport {
    /// CSV: one line per configuration, its patch and per-trace figures.
    pub fn csv(&self) -> String {
        let mut out = String::from("config,patch");
        for t in &self.traces {
            out += &format!(
                ",{0}_within_mean,{0}_within_min,{0}_share_of_static,{0}_outside_mean",
                t.trace
            );
        }
        out += ",chosen_for\n";
        for s in &self.summaries {
            out += &format!(
                "{},\"{}\"",
                s.config,
                s.patch.to_string().replace('"', "\"\"")
            );
            for t in &s.traces {
                out += &format!(",{:.5},{:.5},{:.4},{:.1}", t.1, t.2, t.3, t.4);
            }
            let chosen_for: Vec<&str> = self
                .chosen
                .iter()
                .filter(|c| c.config == s.config)
                .map(|c| c.trace.as_str())
                .collect();
            out += &format!(",{}\n", chosen_for.join(" "));
        }
        out
    }
}
