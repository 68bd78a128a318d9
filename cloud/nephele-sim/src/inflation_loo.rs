//! Leave-one-list-out for `ours`' weights (`nephele sim inflation --leave-one-out`):
//! what the study's figures are worth when no list chose the weights it is scored with.
//!
//! Every weighting of a grid runs on every given list at the choice seeds (not the
//! reported ones), with FGD beside it. For each given list, the weighting chosen is the
//! one whose worst ratio to FGD over the *other* lists is smallest (the mean ratio
//! breaks ties); a list that is not one of the given ones (a resampled or a user's list)
//! gets the weighting chosen on all the given lists. Then FGD, ours with the defaults
//! and ours with the chosen weighting run on each list at the reported seeds. The
//! weightings are always compared planning for the whole list (a learned run costs
//! several times as much); the reported runs plan as asked, so `--planning learned`
//! reports the weights chosen that way as a running region would use them.

use std::collections::BTreeMap;
use std::ops::Range;

use nephele_placement::{OursParams, Policy, TypicalPods};
use serde::Serialize;

use crate::inflation::{by_level, mean_sd, run_inflation, run_parallel, Planning, StudyPolicy};
use crate::trace::Trace;

/// The grid: resolution × scarcity × excess pressure × one-pod weight, around the
/// defaults (108 weightings).
pub fn default_grid() -> Vec<OursParams> {
    let mut grid = Vec::new();
    for resolution_milli in [25.0, 50.0, 100.0] {
        for scarcity_weight in [0.25, 0.5, 1.0] {
            for excess_pressure_weight in [0.5, 1.0, 2.0] {
                for one_pod_weight in [0.4, 0.6, 0.8, 1.0] {
                    grid.push(OursParams {
                        resolution_milli,
                        scarcity_weight,
                        excess_pressure_weight,
                        one_pod_weight,
                    });
                }
            }
        }
    }
    grid
}

/// What a leave-one-out run does.
#[derive(Debug, Clone)]
pub struct LooOptions {
    pub grid: Vec<OursParams>,
    /// Seeds the weightings are compared on.
    pub choice_seeds: Range<u64>,
    /// Seeds the chosen weighting is reported on.
    pub report_seeds: Range<u64>,
    pub threads: usize,
    pub planning: Planning,
}

/// A weighting, as the report and `--ours-params` write it.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Weighting {
    pub resolution: f64,
    pub scarcity: f64,
    pub excess: f64,
    pub one_pod: f64,
}

impl From<OursParams> for Weighting {
    fn from(p: OursParams) -> Weighting {
        Weighting {
            resolution: p.resolution_milli,
            scarcity: p.scarcity_weight,
            excess: p.excess_pressure_weight,
            one_pod: p.one_pod_weight,
        }
    }
}

impl std::fmt::Display for Weighting {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "resolution={},scarcity={},excess={},one-pod={}",
            self.resolution, self.scarcity, self.excess, self.one_pod
        )
    }
}

/// One list's row.
#[derive(Debug, Clone, Serialize)]
pub struct LooRow {
    pub name: String,
    /// `given` (one of the lists the weightings were compared on, left out for its
    /// own choice) or `held-out` (none of them).
    pub kind: &'static str,
    /// The weighting chosen without this list.
    pub chosen: Weighting,
    pub chosen_is_default: bool,
    /// Unallocated GPU % at 100% arrived, mean and sd over the reported seeds.
    pub fgd_pct: f64,
    pub fgd_sd: f64,
    pub ours_default_pct: f64,
    pub ours_default_sd: f64,
    pub ours_chosen_pct: f64,
    pub ours_chosen_sd: f64,
    /// The FGD authors' figure, for the lists they published.
    pub fgd_authors_pct: Option<f64>,
}

impl LooRow {
    /// Whether ours with the weighting chosen without this list is below FGD (ours,
    /// and the authors' where published).
    pub fn ours_below_fgd(&self) -> bool {
        self.ours_chosen_pct < self.fgd_pct
            && self
                .fgd_authors_pct
                .is_none_or(|a| self.ours_chosen_pct < a)
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct LooReport {
    pub planning: &'static str,
    pub grid_size: usize,
    pub choice_seeds: (u64, u64),
    pub report_seeds: (u64, u64),
    /// The weighting all the given lists choose (what a held-out list runs with).
    pub chosen_on_all_given: Weighting,
    pub rows: Vec<LooRow>,
    /// Lists where ours (chosen without them) is below FGD, of all.
    pub ours_below_fgd: usize,
    pub lists: usize,
    pub elapsed_s: f64,
}

/// Unallocated GPU % at 100% arrived of one run.
fn unallocated_at_100(
    trace: &Trace,
    typical: &TypicalPods,
    policy: Policy,
    seed: u64,
    planning: Planning,
    ours: OursParams,
) -> f64 {
    let (series, _) = run_inflation(
        trace,
        typical,
        StudyPolicy::Core(policy),
        seed,
        planning,
        ours,
    );
    by_level(&series)
        .iter()
        .find(|(level, ..)| *level == 100)
        .map_or(f64::NAN, |(_, used, ..)| 100.0 - used)
}

/// The index of the weighting with the smallest worst ratio over `lists` (then mean).
fn choose(ratios: &[Vec<f64>], lists: &[usize]) -> usize {
    let score = |config: usize| {
        let values: Vec<f64> = lists.iter().map(|l| ratios[*l][config]).collect();
        let worst = values.iter().copied().fold(f64::MIN, f64::max);
        (
            worst,
            values.iter().sum::<f64>() / values.len().max(1) as f64,
        )
    };
    (0..ratios.first().map_or(0, Vec::len))
        .min_by(|a, b| {
            let (sa, sb) = (score(*a), score(*b));
            sa.0.total_cmp(&sb.0).then(sa.1.total_cmp(&sb.1))
        })
        .unwrap_or(0)
}

/// See the module's doc. `given` are the lists the weightings are compared on, `held_out`
/// lists that chose nothing; `authors` gives the FGD authors' figure by list name.
pub fn leave_one_out(
    given: &[(String, Trace)],
    held_out: &[(String, Trace)],
    options: &LooOptions,
    authors: &dyn Fn(&str) -> Option<f64>,
    progress: &(dyn Fn(&str, usize, usize) + Sync),
) -> LooReport {
    let started = std::time::Instant::now();
    let planning = options.planning;
    let all: Vec<(&String, &Trace, TypicalPods)> = given
        .iter()
        .chain(held_out)
        .map(|(name, trace)| {
            (
                name,
                trace,
                TypicalPods::from_pods(&trace.pods, 0.95).with_supply(&trace.nodes),
            )
        })
        .collect();
    // 1. Every weighting (and FGD, as config None) on every given list, choice seeds.
    let grid = &options.grid;
    let mut choice_runs: Vec<(usize, Option<usize>, u64)> = Vec::new();
    for list in 0..given.len() {
        for seed in options.choice_seeds.clone() {
            choice_runs.push((list, None, seed));
            for config in 0..grid.len() {
                choice_runs.push((list, Some(config), seed));
            }
        }
    }
    let results = run_parallel(
        &choice_runs,
        options.threads,
        &|(list, config, seed)| {
            let (_, trace, typical) = &all[*list];
            match config {
                None => unallocated_at_100(
                    trace,
                    typical,
                    Policy::Fgd,
                    *seed,
                    Planning::WholeList,
                    OursParams::default(),
                ),
                Some(c) => unallocated_at_100(
                    trace,
                    typical,
                    Policy::Ours,
                    *seed,
                    Planning::WholeList,
                    grid[*c],
                ),
            }
        },
        &|done, all| progress("choosing", done, all),
    );
    let mut fgd_sum = vec![0.0; given.len()];
    let mut ours_sum = vec![vec![0.0; grid.len()]; given.len()];
    for ((list, config, _), value) in choice_runs.iter().zip(&results) {
        match config {
            None => fgd_sum[*list] += value,
            Some(c) => ours_sum[*list][*c] += value,
        }
    }
    let ratios: Vec<Vec<f64>> = (0..given.len())
        .map(|l| {
            ours_sum[l]
                .iter()
                .map(|o| o / fgd_sum[l].max(1e-9))
                .collect()
        })
        .collect();
    let every_given: Vec<usize> = (0..given.len()).collect();
    let on_all = choose(&ratios, &every_given);
    let chosen: Vec<usize> = (0..all.len())
        .map(|list| {
            if list < given.len() {
                let others: Vec<usize> =
                    every_given.iter().copied().filter(|l| *l != list).collect();
                choose(&ratios, &others)
            } else {
                on_all
            }
        })
        .collect();
    // 2. FGD, ours (defaults) and ours (chosen) on every list, reported seeds.
    let defaults = OursParams::default();
    let mut report_runs: Vec<(usize, u8, u64)> = Vec::new();
    for (list, config) in chosen.iter().enumerate() {
        for seed in options.report_seeds.clone() {
            report_runs.push((list, 0, seed));
            report_runs.push((list, 1, seed));
            if grid[*config] != defaults {
                report_runs.push((list, 2, seed));
            }
        }
    }
    let reported = run_parallel(
        &report_runs,
        options.threads,
        &|(list, which, seed)| {
            let (_, trace, typical) = &all[*list];
            let (policy, params) = match which {
                0 => (Policy::Fgd, defaults),
                1 => (Policy::Ours, defaults),
                _ => (Policy::Ours, grid[chosen[*list]]),
            };
            unallocated_at_100(trace, typical, policy, *seed, planning, params)
        },
        &|done, all| progress("reporting", done, all),
    );
    let mut by: BTreeMap<(usize, u8), Vec<f64>> = BTreeMap::new();
    for ((list, which, _), value) in report_runs.iter().zip(reported) {
        by.entry((*list, *which)).or_default().push(value);
    }
    let rows: Vec<LooRow> = all
        .iter()
        .enumerate()
        .map(|(list, (name, ..))| {
            let get = |which: u8| mean_sd(by.get(&(list, which)).map_or(&[][..], Vec::as_slice));
            let (fgd, fgd_sd) = get(0);
            let (ours_default, ours_default_sd) = get(1);
            let chosen_is_default = grid[chosen[list]] == defaults;
            let (ours_chosen, ours_chosen_sd) = if chosen_is_default {
                (ours_default, ours_default_sd)
            } else {
                get(2)
            };
            LooRow {
                name: name.to_string(),
                kind: if list < given.len() {
                    "given"
                } else {
                    "held-out"
                },
                chosen: grid[chosen[list]].into(),
                chosen_is_default,
                fgd_pct: fgd,
                fgd_sd,
                ours_default_pct: ours_default,
                ours_default_sd,
                ours_chosen_pct: ours_chosen,
                ours_chosen_sd,
                fgd_authors_pct: authors(name),
            }
        })
        .collect();
    LooReport {
        planning: planning.name(),
        grid_size: grid.len(),
        choice_seeds: (options.choice_seeds.start, options.choice_seeds.end),
        report_seeds: (options.report_seeds.start, options.report_seeds.end),
        chosen_on_all_given: grid[on_all].into(),
        ours_below_fgd: rows.iter().filter(|r| r.ours_below_fgd()).count(),
        lists: rows.len(),
        rows,
        elapsed_s: started.elapsed().as_secs_f64(),
    }
}

impl LooReport {
    /// The table people read.
    pub fn table(&self) -> String {
        let mut out = format!(
            "leave-one-list-out ({} weightings compared on seeds {}..{}, reported on {}..{}, planning {}); unallocated GPU % at 100% arrived\n",
            self.grid_size,
            self.choice_seeds.0,
            self.choice_seeds.1,
            self.report_seeds.0,
            self.report_seeds.1,
            self.planning
        );
        out += &format!(
            "{:<18} {:<9} {:>7} {:>8} {:>12} {:>11}  {}\n",
            "LIST",
            "KIND",
            "FGD",
            "AUTHORS",
            "OURS DEFAULT",
            "OURS CHOSEN",
            "CHOSEN WITHOUT THIS LIST"
        );
        for row in &self.rows {
            out += &format!(
                "{:<18} {:<9} {:>7.2} {:>8} {:>12.2} {:>11.2}  {}{}\n",
                row.name,
                row.kind,
                row.fgd_pct,
                row.fgd_authors_pct
                    .map_or("-".to_string(), |a| format!("{a:.2}")),
                row.ours_default_pct,
                row.ours_chosen_pct,
                if row.chosen_is_default {
                    "the defaults"
                } else {
                    ""
                },
                if row.chosen_is_default {
                    String::new()
                } else {
                    row.chosen.to_string()
                },
            );
        }
        out += &format!(
            "ours (weights chosen without the list) below FGD on {} of {} lists; all given lists choose {}\n",
            self.ours_below_fgd, self.lists, self.chosen_on_all_given
        );
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_list_never_chooses_with_its_own_ratios() {
        // ratios[list][weighting]: list 0 alone would choose weighting 1; without it,
        // the other two choose weighting 0.
        let ratios = vec![vec![1.5, 0.5], vec![0.9, 1.2], vec![0.8, 1.1]];
        assert_eq!(choose(&ratios, &[0]), 1);
        assert_eq!(choose(&ratios, &[1, 2]), 0);
    }

    #[test]
    fn the_worst_ratio_decides_and_the_mean_breaks_ties() {
        let ratios = vec![vec![1.0, 1.0, 0.7], vec![0.5, 0.9, 1.0]];
        // Worst: 1.0, 1.0, 1.0; means 0.75, 0.95, 0.85.
        assert_eq!(choose(&ratios, &[0, 1]), 0);
        let ratios = vec![vec![1.2, 1.0], vec![0.5, 0.99]];
        assert_eq!(choose(&ratios, &[0, 1]), 1);
    }

    #[test]
    fn the_default_grid_holds_the_defaults() {
        assert!(default_grid().contains(&OursParams::default()));
    }
}
