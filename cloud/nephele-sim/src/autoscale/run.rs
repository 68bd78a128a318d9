//! `nephele sim autoscale` on one trace: the static search, HPA, KPA, ours, the
//! references and the ablations, each replayed on the same workload, gathered into
//! a [`TraceReport`] with the goals measured.

use std::path::Path;

use anyhow::{Context as _, Result};
use nephele_autoscale::config::OursConfig;
use nephele_autoscale::serving::quantile;
use nephele_autoscale::{Hpa, HpaConfig, Kpa, KpaConfig, Ours, Static};

use super::{
    calibrate_concurrency, context_clone, forecast_errors, ours_config, simulate, with_override,
    AutoscaleOptions, Goals, LearnedCapacity, PolicyResult, RunContext, TraceReport,
};
use crate::autoscale_oracle::{run_oracle, run_reactive_bound};
use crate::autoscale_trace::{load_cold_starts, load_workload, Workload};
use crate::trace::{load_prices, HourlySeries};

/// A variant of ours for the ablations: a name and a change to its configuration.
type Variant = (&'static str, fn(&mut OursConfig));

/// A plot bucket that divides an hour and gives about 1,500 buckets or fewer.
fn plot_bucket_us(span_s: f64) -> u64 {
    let candidates = [15u64, 30, 60, 300, 600, 900, 1800, 3600];
    let seconds = candidates
        .iter()
        .copied()
        .find(|s| span_s / *s as f64 <= 1500.0)
        .unwrap_or(3600);
    seconds * 1_000_000
}

/// Runs every policy on one trace.
pub fn run_autoscale(
    data: &Path,
    trace: &str,
    options: &AutoscaleOptions,
    progress: &mut dyn FnMut(&str),
) -> Result<TraceReport> {
    let workload = load_workload(data, trace, &options.service)?;
    let cold_starts = load_cold_starts(data)?;
    let prices = load_prices(data, &options.zone).with_context(|| {
        format!(
            "electricity prices for zone {} (pass --zone with a file in {}/electricity-prices-hourly-2023/)",
            options.zone,
            data.display()
        )
    })?;
    run_autoscale_workload(workload, &cold_starts, &prices, options, progress)
}

/// Runs every policy on a loaded workload (a trace, or a variation of one:
/// [`crate::autoscale_variants`]).
pub fn run_autoscale_workload(
    mut workload: Workload,
    cold_starts: &[f64],
    prices: &HourlySeries,
    options: &AutoscaleOptions,
    progress: &mut dyn FnMut(&str),
) -> Result<TraceReport> {
    let started = std::time::Instant::now();
    let span_us = workload.requests.last().map_or(0, |r| r.arrival_us);
    let tune_until_us = (span_us as f64 * options.tune_share.clamp(0.0, 1.0)) as u64;
    let bucket_us = plot_bucket_us(span_us as f64 / 1e6);
    let calibration = if workload.llm.is_some() {
        progress(&format!("{}: load test of one replica", workload.name));
        let calibration = calibrate_concurrency(
            &workload,
            tune_until_us,
            options.static_goal,
            options.seed,
            prices,
        );
        workload.concurrency = calibration.concurrency;
        Some(calibration)
    } else {
        None
    };
    let workload = workload;
    let score_from_us = (options.warmup_s.max(0.0) * 1e6).min(span_us as f64) as u64;
    let context = RunContext {
        workload: &workload,
        cold_starts,
        prices,
        seed: options.seed,
        bucket_us,
        tune_until_us,
        initial_replicas: options.min_replicas,
        cold_start_scale: options.cold_start_scale,
        declared_concurrency: None,
        score_from_us,
    };
    progress(&format!(
        "{}: {} requests over {:.1} h",
        workload.name,
        workload.requests.len(),
        span_us as f64 / 3.6e9
    ));

    // Static: the fewest replicas that keep the goal share within target over the
    // whole trace (peak provisioning sized with hindsight), unless given.
    let static_context = |replicas: u32| RunContext {
        initial_replicas: replicas,
        ..context_clone(&context)
    };
    let (static_replicas, static_result, static_rule) = match options.static_replicas {
        Some(replicas) => {
            let result = simulate(
                "static",
                &mut Static::new(replicas),
                &static_context(replicas),
            );
            (replicas, result, format!("{replicas} replicas (given)"))
        }
        None => {
            let (mut low, mut high) = (options.min_replicas.max(1), options.max_replicas.max(1));
            let mut best = simulate("static", &mut Static::new(high), &static_context(high));
            let mut best_n = high;
            while low < high {
                let middle = (low + high) / 2;
                progress(&format!("{}: static with {middle} replicas", workload.name));
                let result = simulate("static", &mut Static::new(middle), &static_context(middle));
                if result.within_slo >= options.static_goal {
                    high = middle;
                    best = result;
                    best_n = middle;
                } else {
                    low = middle + 1;
                }
            }
            if best_n != low {
                best = simulate("static", &mut Static::new(low), &static_context(low));
                best_n = low;
            }
            (
                best_n,
                best,
                format!(
                    "the fewest replicas that keep ≥ {:.0}% of the whole trace within target (searched 1..={})",
                    options.static_goal * 100.0,
                    options.max_replicas
                ),
            )
        }
    };

    // One configuration for every trace: the defaults with the run's bounds and the
    // trace's latency target; no per-trace patch (the `--tune` grid is a research tool).
    let ours_config = with_override(
        ours_config(&workload, options, tune_until_us),
        options.ours_override.as_ref(),
    )?;
    let mut policies = vec![static_result];
    progress(&format!("{}: hpa", workload.name));
    let mut hpa = Hpa::new(HpaConfig {
        min_replicas: options.min_replicas,
        max_replicas: options.max_replicas,
        ..HpaConfig::default()
    })?;
    policies.push(simulate("hpa", &mut hpa, &context));
    progress(&format!("{}: kpa", workload.name));
    let mut kpa = Kpa::new(KpaConfig {
        min_replicas: options.min_replicas,
        max_replicas: options.max_replicas,
        ..KpaConfig::default()
    })?;
    policies.push(simulate("kpa", &mut kpa, &context));
    progress(&format!("{}: ours", workload.name));
    // A deployment's floor is standing: ours starts with its min_replicas ready.
    // Ours is told what a live region's agents declare, one slot, not the load test
    // HPA and KPA are configured from: it learns an LLM replica's capacity as it runs.
    let ours_context = RunContext {
        initial_replicas: ours_config.min_replicas.max(options.min_replicas),
        declared_concurrency: workload.llm.is_some().then_some(1),
        ..context_clone(&context)
    };
    let mut ours = Ours::new(ours_config.clone())?;
    policies.push(simulate("ours", &mut ours, &ours_context));
    let ours_capacity = ours.capacity().current().map(|per_s| LearnedCapacity {
        per_replica_per_s: per_s,
        learned: ours.capacity().is_learned(),
        levels: ours.capacity().levels().len(),
    });
    let (oracle, reactive_bound) = if options.oracle {
        progress(&format!("{}: oracle (clairvoyant)", workload.name));
        let max_cold_us = cold_starts.iter().copied().fold(0.0, f64::max)
            * options.cold_start_scale.max(0.0)
            * 1000.0;
        let (result, info, plan) = run_oracle(
            &context,
            options.static_goal,
            options.min_replicas,
            options.max_replicas,
            max_cold_us as u64,
        );
        policies.push(result);
        progress(&format!("{}: reactive bound", workload.name));
        let (reactive, reactive_info) = run_reactive_bound(
            &context,
            &plan,
            options.static_goal,
            options.min_replicas,
            static_replicas.max(options.min_replicas) + 2,
        );
        policies.push(reactive);
        (Some(info), Some(reactive_info))
    } else {
        (None, None)
    };

    let mut ablations = Vec::new();
    if options.ablations {
        let variants: [Variant; 3] = [
            ("ours-reactive-only", |c| {
                c.forecast.enabled = false;
                c.admission.enabled = false;
            }),
            ("ours-no-forecast", |c| c.forecast.enabled = false),
            ("ours-no-admission", |c| c.admission.enabled = false),
        ];
        for (name, edit) in variants {
            progress(&format!("{}: {name}", workload.name));
            let mut config = ours_config.clone();
            edit(&mut config);
            let mut policy = Ours::new(config)?;
            ablations.push(simulate(name, &mut policy, &ours_context));
        }
    }

    progress(&format!("{}: forecasters", workload.name));
    let forecast = forecast_errors(&workload, options.tune_share);
    let goals = goals(&policies);
    let mut cold_sorted = cold_starts.to_vec();
    Ok(TraceReport {
        trace: workload.name.clone(),
        path: workload.path.clone(),
        requests: workload.requests.len(),
        span_hours: span_us as f64 / 3.6e9,
        service_model: workload.service_model.clone(),
        mean_service_ms: workload.requests.iter().map(|r| r.service_ms).sum::<f64>()
            / workload.requests.len().max(1) as f64,
        concurrency: workload.concurrency,
        target_rule: workload.target_rule.clone(),
        gpu: workload.gpu.gpu.to_string(),
        usd_per_gpu_hour: workload.gpu.usd_per_gpu_hour(),
        zone: options.zone.clone(),
        cold_start_p50_ms: quantile(&mut cold_sorted, 0.5).unwrap_or(0.0)
            * options.cold_start_scale,
        cold_start_p99_ms: quantile(&mut cold_sorted, 0.99).unwrap_or(0.0)
            * options.cold_start_scale,
        cold_start_scale: options.cold_start_scale,
        gpus_per_replica: workload.gpus_per_replica,
        calibration,
        oracle,
        reactive_bound,
        static_replicas,
        static_rule,
        tune_until_hours: tune_until_us as f64 / 3.6e9,
        ours_config,
        ours_capacity,
        warmup_s: score_from_us as f64 / 1e6,
        policies,
        ablations,
        goals,
        forecast,
        seconds: started.elapsed().as_secs_f64(),
    })
}

fn goals(policies: &[PolicyResult]) -> Option<Goals> {
    let find = |name: &str| policies.iter().find(|p| p.name == name);
    let (ours, static_, hpa, kpa) = (find("ours")?, find("static")?, find("hpa")?, find("kpa")?);
    let over_oracle = find("oracle").map(|oracle| ours.gpu_hours / oracle.gpu_hours.max(1e-9));
    let reactive = if hpa.outside <= kpa.outside { hpa } else { kpa };
    let share = ours.gpu_hours / static_.gpu_hours.max(1e-9);
    let reduction = if reactive.outside == 0 {
        if ours.outside == 0 {
            0.0
        } else {
            -1.0
        }
    } else {
        1.0 - ours.outside as f64 / reactive.outside as f64
    };
    Some(Goals {
        ours_within_slo: ours.within_slo,
        ours_gpu_hours_share_of_static: share,
        ours_outside: ours.outside,
        reactive_best: reactive.name.clone(),
        reactive_outside: reactive.outside,
        outside_reduction_vs_reactive: reduction,
        ours_over_oracle: over_oracle,
        within_99: ours.within_slo >= 0.99,
        gpu_hours_at_most_static: share <= 1.0,
        at_most_1_5x_oracle: over_oracle.map(|ratio| ratio <= 1.5),
    })
}
