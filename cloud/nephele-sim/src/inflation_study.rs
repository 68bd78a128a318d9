//! The FGD paper's study: workload inflation ([`crate::inflation`]) on each pod list
//! of the openb family (GPU sharing, GPU-type constraints, CPU-only load), every
//! policy, several seeds, with the FGD authors' own figures for the lists they
//! published (`../shared/data/alibaba-gpu-v2023/README.md`, from their simulator's
//! `analysis_allo_discrete.csv`, seeds 42–51).

use std::collections::BTreeMap;
use std::time::Instant;

use nephele_placement::{OursParams, TypicalPods};
use serde::Serialize;

use crate::inflation::{
    by_level, mean_sd, run_inflation, run_parallel, Failures, Planning, PolicySummary, StudyPolicy,
};
use crate::plot::{svg_bars, BarGroup};
use crate::trace::Trace;

/// The FGD authors' unallocated GPU % at 100% arrived (mean of their 10 seeds), per
/// pod list: Random, DotProd, GpuClustering, GpuPacking, BestFit, FGD.
const AUTHORS: &[(&str, [f64; 6])] = &[
    ("default", [13.70, 9.38, 8.35, 8.22, 7.14, 4.77]),
    ("cpu050", [10.98, 6.97, 6.48, 6.54, 6.44, 5.00]),
    ("cpu100", [12.57, 8.27, 7.58, 7.50, 6.74, 4.79]),
    ("cpu200", [16.97, 12.55, 10.33, 10.02, 7.85, 5.18]),
    ("cpu250", [20.00, 16.43, 12.25, 11.95, 8.79, 6.80]),
    ("gpushare40", [15.14, 10.70, 10.24, 10.23, 8.56, 6.04]),
    ("gpushare60", [17.19, 13.18, 13.10, 12.85, 10.94, 8.75]),
    ("gpushare80", [19.38, 15.86, 15.50, 15.35, 13.34, 10.92]),
    ("gpushare100", [21.10, 18.02, 17.78, 17.87, 15.38, 13.36]),
    ("gpuspec10", [13.74, 9.83, 8.04, 7.76, 6.90, 5.34]),
    ("gpuspec20", [14.10, 11.71, 10.89, 10.72, 11.54, 5.34]),
    ("gpuspec25", [14.58, 14.56, 13.59, 13.23, 14.33, 6.09]),
    ("gpuspec33", [16.13, 20.18, 18.91, 17.78, 19.61, 12.16]),
];

/// The authors' figures for a pod list, by their policy names, in %.
pub fn authors_figures(list: &str) -> Option<BTreeMap<&'static str, f64>> {
    let (_, row) = AUTHORS.iter().find(|(name, _)| *name == list)?;
    let names = [
        "random",
        "dot-product",
        "gpu-clustering",
        "gpu-packing",
        "best-fit",
        "fgd",
    ];
    Some(names.into_iter().zip(row.iter().copied()).collect())
}

/// One pod list's results.
#[derive(Debug, Serialize)]
pub struct PodListResult {
    pub name: String,
    pub file: String,
    pub nodes: usize,
    pub pods: usize,
    pub typical_pod_classes: usize,
    /// What FGD and ours planned with: `whole-list` or `learned` ([`Planning`]).
    pub planning: &'static str,
    pub policies: Vec<PolicySummary>,
    /// The FGD authors' unallocated GPU % at 100% for this list (`null` for a list
    /// they did not publish).
    pub authors_unallocated_pct: Option<BTreeMap<&'static str, f64>>,
    /// `policy,seed,arrived_pct,allocated_pct,unallocated_pct,fragmentation_pct,
    /// fragmentation_ratio_pct` rows.
    #[serde(skip)]
    pub csv: String,
    /// Per policy, mean unallocated % per arrived % level (for the plot).
    #[serde(skip)]
    pub curves: Vec<(String, Vec<(u32, f64)>)>,
}

/// What a study runs on each pod list.
#[derive(Debug, Clone)]
pub struct StudyRuns {
    pub policies: Vec<StudyPolicy>,
    /// The paper's are 42..52.
    pub seeds: std::ops::Range<u64>,
    /// Runs at once.
    pub threads: usize,
    pub planning: Planning,
    /// The weights `ours` runs with.
    pub ours: OursParams,
}

/// Runs every policy over every seed of `runs` on `trace`, spread over its threads;
/// `done` is called after each run with (runs done, runs in all).
pub fn run_pod_list(
    name: &str,
    file: &str,
    trace: &Trace,
    study: &StudyRuns,
    done: &(dyn Fn(usize, usize) + Sync),
) -> PodListResult {
    let StudyRuns {
        policies,
        seeds,
        threads,
        planning,
        ours,
    } = study;
    let (threads, planning, ours) = (*threads, *planning, *ours);
    let typical = TypicalPods::from_pods(&trace.pods, 0.95).with_supply(&trace.nodes);
    let runs: Vec<(usize, u64)> = (0..policies.len())
        .flat_map(|p| seeds.clone().map(move |s| (p, s)))
        .collect();
    // (policy index, seed) → (levels, failures, seconds)
    type RunResult = (Vec<(u32, f64, f64, f64)>, Failures, f64);
    let measured: Vec<RunResult> = run_parallel(
        &runs,
        threads,
        &|&(policy, seed)| {
            let started = Instant::now();
            let (series, failures) =
                run_inflation(trace, &typical, policies[policy], seed, planning, ours);
            (by_level(&series), failures, started.elapsed().as_secs_f64())
        },
        done,
    );
    let results: BTreeMap<(usize, u64), RunResult> = runs.iter().copied().zip(measured).collect();
    let gpu_capacity: f64 = trace
        .nodes
        .iter()
        .map(|n| f64::from(n.gpus) * f64::from(nephele_placement::MILLI_PER_GPU))
        .sum::<f64>()
        .max(1.0);
    let mut csv = String::new();
    let mut summaries = Vec::new();
    let mut curves = Vec::new();
    for (index, policy) in policies.iter().enumerate() {
        let mut at_100 = Vec::new();
        let mut ratio_100 = Vec::new();
        let mut curve: BTreeMap<u32, Vec<f64>> = BTreeMap::new();
        let mut failed = Failures::new();
        let mut seconds = 0.0;
        for ((_, seed), (levels, failures, secs)) in results.range((index, 0)..(index, u64::MAX)) {
            seconds += secs;
            for (kind, count) in failures {
                let entry = failed.entry(kind.clone()).or_default();
                entry.pods += count.pods;
                entry.gpu_milli += count.gpu_milli;
            }
            for (level, used, frag, ratio) in levels {
                csv += &format!(
                    "{},{seed},{level},{used:.4},{:.4},{frag:.4},{ratio:.4}\n",
                    policy.name(),
                    100.0 - used
                );
                curve.entry(*level).or_default().push(100.0 - used);
                if *level == 100 {
                    at_100.push((100.0 - used) / 100.0);
                    ratio_100.push(*ratio / 100.0);
                }
            }
        }
        let (mean, sd) = mean_sd(&at_100);
        let n = (seeds.end - seeds.start).max(1) as f64;
        summaries.push(PolicySummary {
            name: policy.name().into(),
            unallocated_gpu_share_at_100: mean,
            unallocated_gpu_share_at_100_sd: sd,
            fragmentation_ratio_at_100: mean_sd(&ratio_100).0,
            seeds: seeds.end - seeds.start,
            seconds_per_run: seconds / n,
            failed_pods_before_100: failed
                .iter()
                .map(|(kind, count)| (kind.clone(), count.pods as f64 / n))
                .collect(),
            failed_gpu_pct_before_100: failed
                .iter()
                .map(|(kind, count)| {
                    (
                        kind.clone(),
                        count.gpu_milli as f64 / n / gpu_capacity * 100.0,
                    )
                })
                .collect(),
        });
        curves.push((
            policy.name().to_string(),
            curve.into_iter().map(|(l, v)| (l, mean_sd(&v).0)).collect(),
        ));
    }
    PodListResult {
        name: name.to_string(),
        file: file.to_string(),
        nodes: trace.nodes.len(),
        pods: trace.pods.len(),
        typical_pod_classes: typical.classes.len(),
        planning: planning.name(),
        policies: summaries,
        authors_unallocated_pct: authors_figures(name),
        csv,
        curves,
    }
}

/// The FGD paper's three studies, each over the default list and its variants: the
/// file stem of its figure, its title, and its pod lists in the order they are drawn.
pub const STUDIES: [(&str, &str, [&str; 5]); 3] = [
    (
        "sharing",
        "GPU sharing: share of GPU pods that ask for part of a GPU",
        [
            "default",
            "gpushare40",
            "gpushare60",
            "gpushare80",
            "gpushare100",
        ],
    ),
    (
        "constraints",
        "GPU-type constraints: share of GPU pods that name GPU models",
        [
            "default",
            "gpuspec10",
            "gpuspec20",
            "gpuspec25",
            "gpuspec33",
        ],
    ),
    (
        "cpu",
        "CPU-only load: CPU-only pods beside the GPU pods",
        ["cpu050", "cpu100", "default", "cpu200", "cpu250"],
    ),
];

/// One bar chart per study whose lists ran (at least two of them): unallocated GPU %
/// at 100% arrived per list and policy (mean ± sd over the seeds), with the FGD
/// authors' figure as the last bar. Returns (`inflation-study-<study>.svg`, SVG).
pub fn study_svgs(lists: &[PodListResult]) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for (stem, title, names) in STUDIES {
        let ran: Vec<&PodListResult> = names
            .iter()
            .filter_map(|name| lists.iter().find(|l| l.name == *name))
            .collect();
        if ran.len() < 2 {
            continue;
        }
        let mut series: Vec<String> = ran[0].policies.iter().map(|p| p.name.clone()).collect();
        series.push("fgd (authors)".into());
        let groups: Vec<BarGroup> = ran
            .iter()
            .map(|list| BarGroup {
                label: list.name.clone(),
                bars: series
                    .iter()
                    .map(|name| {
                        if name == "fgd (authors)" {
                            return list
                                .authors_unallocated_pct
                                .as_ref()
                                .and_then(|a| a.get("fgd"))
                                .map(|v| (*v, 0.0));
                        }
                        list.policies.iter().find(|p| &p.name == name).map(|p| {
                            (
                                p.unallocated_gpu_share_at_100 * 100.0,
                                p.unallocated_gpu_share_at_100_sd * 100.0,
                            )
                        })
                    })
                    .collect(),
            })
            .collect();
        out.push((
            format!("inflation-study-{stem}.svg"),
            svg_bars(
                title,
                "unallocated GPU at 100% arrived (% of capacity)",
                &series,
                &groups,
            ),
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_authors_figures_are_there_for_the_thirteen_lists_and_no_other() {
        assert_eq!(AUTHORS.len(), 13);
        assert_eq!(authors_figures("gpuspec33").unwrap()["fgd"], 12.16);
        assert_eq!(authors_figures("default").unwrap()["gpu-clustering"], 8.35);
        assert!(authors_figures("mine").is_none());
    }

    fn result(name: &str, ours: f64) -> PodListResult {
        PodListResult {
            name: name.into(),
            file: format!("{name}.csv"),
            nodes: 1,
            pods: 1,
            typical_pod_classes: 1,
            planning: "whole-list",
            policies: vec![PolicySummary {
                name: "ours".into(),
                unallocated_gpu_share_at_100: ours,
                unallocated_gpu_share_at_100_sd: 0.001,
                fragmentation_ratio_at_100: 0.0,
                seeds: 1,
                seconds_per_run: 0.0,
                failed_pods_before_100: BTreeMap::new(),
                failed_gpu_pct_before_100: BTreeMap::new(),
            }],
            authors_unallocated_pct: authors_figures(name),
            csv: String::new(),
            curves: Vec::new(),
        }
    }

    #[test]
    fn a_study_figure_is_drawn_when_two_of_its_lists_ran() {
        let lists = vec![
            result("default", 0.046),
            result("gpuspec33", 0.06),
            result("cpu050", 0.05),
        ];
        let figures = study_svgs(&lists);
        let names: Vec<&str> = figures.iter().map(|(n, _)| n.as_str()).collect();
        // Sharing ran only default, constraints default and gpuspec33, CPU default and
        // cpu050.
        assert_eq!(
            names,
            ["inflation-study-constraints.svg", "inflation-study-cpu.svg"]
        );
        let (_, constraints) = &figures[0];
        assert!(constraints.contains("ours: 6.00 ± 0.10"));
        assert!(constraints.contains("fgd (authors): 12.16"));
    }
}
