//! A trace's report for people: the table, the files written beside it, and the
//! SVG plots of load, replicas and latency.

use std::path::{Path, PathBuf};

use anyhow::{Context as _, Result};

use super::{Series, TraceReport};

impl TraceReport {
    /// A table for people.
    pub fn table(&self) -> String {
        let mut out = format!(
            "{}: {} requests over {:.1} h; {}; target: {}; static = {} ({})\n",
            self.trace,
            self.requests,
            self.span_hours,
            self.service_model,
            self.target_rule,
            self.static_replicas,
            self.static_rule
        );
        if let Some(capacity) = &self.ours_capacity {
            out += &format!(
                "ours: one configuration for every trace (no tuned patch); learned {:.3} req/s per replica within target ({}){}\n",
                capacity.per_replica_per_s,
                if capacity.learned { "from the answers" } else { "the prior: slots over service time" },
                self.calibration.as_ref().map_or(String::new(), |c| format!(
                    "; HPA and KPA size with the load test's concurrency {} ({:.3} req/s per replica)",
                    c.concurrency, c.max_rate_per_s
                )),
            );
        }
        if self.warmup_s > 0.0 {
            out += &format!(
                "every policy ran the first {:.0} s unscored (warm-up): figures are from there on\n",
                self.warmup_s
            );
        }
        out += &format!(
            "{:<20} {:>10} {:>9} {:>10} {:>10} {:>7} {:>6} {:>7} {:>9} {:>9} {:>9}\n",
            "POLICY",
            "WITHIN",
            "OUTSIDE",
            "GPU-HOURS",
            "COST $",
            "EVENTS",
            "FLIPS",
            "SHED",
            "P99 S",
            "HOLDOUT",
            "HO GPU-H"
        );
        for p in self.policies.iter().chain(&self.ablations) {
            let holdout = p.segments.iter().find(|s| s.segment == "holdout");
            out += &format!(
                "{:<20} {:>9.2}% {:>9} {:>10.2} {:>10.2} {:>7} {:>6} {:>7} {:>9.2} {:>8.2}% {:>9.2}\n",
                p.name,
                p.within_slo * 100.0,
                p.outside,
                p.gpu_hours,
                p.cost,
                p.scale_events,
                p.direction_changes,
                p.shed,
                p.latency_p99_ms / 1000.0,
                holdout.map_or(0.0, |s| s.within_slo * 100.0),
                holdout.map_or(0.0, |s| s.gpu_hours),
            );
        }
        if let Some(goals) = &self.goals {
            out += &format!(
                "goals: ours within {:.2}% (≥ 99%: {}), GPU-hours {:.0}% of static (≤ 100%: {}){}; {} outside vs {} for {} ({:+.0}%)\n",
                goals.ours_within_slo * 100.0,
                yes(goals.within_99),
                goals.ours_gpu_hours_share_of_static * 100.0,
                yes(goals.gpu_hours_at_most_static),
                goals.ours_over_oracle.map_or(String::new(), |ratio| format!(
                    ", {ratio:.2}× the oracle's (stretch ≤ 1.5×: {})",
                    yes(ratio <= 1.5)
                )),
                goals.ours_outside,
                goals.reactive_outside,
                goals.reactive_best,
                -goals.outside_reduction_vs_reactive * 100.0,
            );
        }
        let static_gpu_hours = self
            .policies
            .iter()
            .find(|p| p.name == "static")
            .map_or(0.0, |p| p.gpu_hours);
        let share = |name: &str| {
            self.policies
                .iter()
                .find(|p| p.name == name)
                .map(|p| p.gpu_hours / static_gpu_hours.max(1e-9) * 100.0)
        };
        if let (Some(oracle), Some(info)) = (share("oracle"), &self.oracle) {
            out += &format!(
                "oracle (clairvoyant, simulator only): {oracle:.0}% of static's GPU-hours ({} replays; {} misses planned of {} allowed)\n",
                info.rounds, info.planned_misses, info.allowance
            );
        }
        if let (Some(reactive), Some(info)) = (share("reactive-ref"), &self.reactive_bound) {
            out += &format!(
                "reactive reference (each 5-s slot's need told when it ends): {reactive:.0}% of static's GPU-hours, floor {} and hold {:.0} s (goal met: {})\n",
                info.floor,
                info.hold_s,
                yes(info.met_goal)
            );
        }
        if let Some(calibration) = &self.calibration {
            out += &format!(
                "load test of one replica: {:.3} req/s within target at most, × {:.0} ms alone = concurrency {}\n",
                calibration.max_rate_per_s, calibration.mean_service_ms, calibration.concurrency
            );
        }
        out += "forecast MAE (req/s) at 1 and 5 min ahead, tune part → held-out part:\n";
        let models: Vec<&String> = {
            let mut seen = Vec::new();
            for row in &self.forecast {
                if !seen.contains(&&row.model) {
                    seen.push(&row.model);
                }
            }
            seen
        };
        for model in models {
            let at = |h: usize| {
                self.forecast
                    .iter()
                    .find(|r| &r.model == model && r.horizon_min == h)
            };
            if let (Some(one), Some(five)) = (at(1), at(5)) {
                out += &format!(
                    "  {:<52} 1 min {:.4} → {:.4}   5 min {:.4} → {:.4}\n",
                    model, one.tune_mae, one.holdout_mae, five.tune_mae, five.holdout_mae
                );
            }
        }
        out
    }

    /// CSV of the series and the summary, and the SVG.
    pub fn write(&self, out: &Path) -> Result<Vec<PathBuf>> {
        std::fs::create_dir_all(out).with_context(|| format!("cannot create {}", out.display()))?;
        let stem = format!("autoscale-{}", self.trace);
        let mut series_csv = String::from(
            "policy,bucket_start_s,arrivals,load_req_per_s,replicas,p99_latency_s,outside\n",
        );
        for p in &self.policies {
            let s = &p.series;
            for index in 0..s.arrivals.len() {
                series_csv += &format!(
                    "{},{:.0},{},{:.4},{:.3},{},{}\n",
                    p.name,
                    index as f64 * s.bucket_s,
                    s.arrivals[index],
                    f64::from(s.arrivals[index]) / s.bucket_s,
                    s.replicas[index],
                    s.p99_s[index].map_or(String::new(), |v| format!("{v:.3}")),
                    s.outside[index]
                );
            }
        }
        let mut summary_csv = String::from("trace,policy,within_slo,outside,gpu_hours,cost_usd,gpu_cost_usd,energy_cost_usd,energy_kwh,scale_events,direction_changes,shed,p50_ms,p99_ms,mean_replicas,peak_replicas,tune_within_slo,tune_gpu_hours,holdout_within_slo,holdout_gpu_hours\n");
        for p in self.policies.iter().chain(&self.ablations) {
            let seg = |name: &str| p.segments.iter().find(|s| s.segment == name);
            summary_csv += &format!(
                "{},{},{:.5},{},{:.3},{:.2},{:.2},{:.2},{:.2},{},{},{},{:.0},{:.0},{:.2},{},{:.5},{:.3},{:.5},{:.3}\n",
                self.trace,
                p.name,
                p.within_slo,
                p.outside,
                p.gpu_hours,
                p.cost,
                p.gpu_cost,
                p.energy_cost,
                p.energy_kwh,
                p.scale_events,
                p.direction_changes,
                p.shed,
                p.latency_p50_ms,
                p.latency_p99_ms,
                p.mean_replicas,
                p.peak_replicas,
                seg("tune").map_or(0.0, |s| s.within_slo),
                seg("tune").map_or(0.0, |s| s.gpu_hours),
                seg("holdout").map_or(0.0, |s| s.within_slo),
                seg("holdout").map_or(0.0, |s| s.gpu_hours),
            );
        }
        let mut forecast_csv = String::from("trace,model,horizon_min,tune_mae,holdout_mae,holdout_rmse,holdout_relative_mae,holdout_bias\n");
        for row in &self.forecast {
            forecast_csv += &format!(
                "{},\"{}\",{},{:.4},{:.4},{:.4},{:.4},{:.4}\n",
                self.trace,
                row.model,
                row.horizon_min,
                row.tune_mae,
                row.holdout_mae,
                row.holdout_rmse,
                row.holdout_relative_mae,
                row.holdout_bias
            );
        }
        let paths = [
            (out.join(format!("{stem}-series.csv")), series_csv),
            (out.join(format!("{stem}.csv")), summary_csv),
            (out.join(format!("{stem}-forecast.csv")), forecast_csv),
            (
                out.join(format!("{stem}.json")),
                serde_json::to_string_pretty(self)?,
            ),
            (out.join(format!("{stem}.svg")), self.svg()),
        ];
        let mut written = Vec::new();
        for (path, text) in paths {
            std::fs::write(&path, text)
                .with_context(|| format!("cannot write {}", path.display()))?;
            written.push(path);
        }
        Ok(written)
    }

    /// Three panels over time: load, replicas per policy, p99 latency per policy.
    pub fn svg(&self) -> String {
        let hours = self.span_hours > 3.0;
        let (scale, unit) = if hours {
            (3600.0, "hours")
        } else {
            (60.0, "minutes")
        };
        let x_of = |s: &Series, index: usize| index as f64 * s.bucket_s / scale;
        let Some(first) = self.policies.first() else {
            return String::new();
        };
        let load = vec![(
            "offered load".to_string(),
            first
                .series
                .arrivals
                .iter()
                .enumerate()
                .map(|(i, a)| {
                    (
                        x_of(&first.series, i),
                        f64::from(*a) / first.series.bucket_s,
                    )
                })
                .collect::<Vec<_>>(),
        )];
        let replicas: Vec<(String, Vec<(f64, f64)>)> = self
            .policies
            .iter()
            .map(|p| {
                (
                    p.name.clone(),
                    p.series
                        .replicas
                        .iter()
                        .enumerate()
                        .map(|(i, r)| (x_of(&p.series, i), *r))
                        .collect(),
                )
            })
            .collect();
        let latency: Vec<(String, Vec<(f64, f64)>)> = self
            .policies
            .iter()
            .map(|p| {
                (
                    p.name.clone(),
                    p.series
                        .p99_s
                        .iter()
                        .enumerate()
                        .filter_map(|(i, v)| v.map(|v| (x_of(&p.series, i), v)))
                        .collect(),
                )
            })
            .collect();
        let x_label = format!("{unit} since the trace's first request ({})", self.trace);
        let panels = [
            crate::plot::svg_lines(&load, &x_label, "offered load (req/s)"),
            crate::plot::svg_lines(
                &replicas,
                &x_label,
                "replicas (starting + ready + draining)",
            ),
            crate::plot::svg_lines(&latency, &x_label, "p99 latency of answered requests (s)"),
        ];
        let mut svg = String::from(
            "<svg xmlns='http://www.w3.org/2000/svg' width='720' height='1260' font-family='sans-serif' font-size='12'>\n",
        );
        for (index, panel) in panels.iter().enumerate() {
            svg += &format!(
                "<g transform='translate(0,{})'>\n{panel}</g>\n",
                index * 420
            );
        }
        svg + "</svg>\n"
    }
}

fn yes(value: bool) -> &'static str {
    if value {
        "yes"
    } else {
        "NO"
    }
}
