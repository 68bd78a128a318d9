//! `cargo run --release -p nephele-sim --example inflation -- LISTS POLICIES SEEDS [PLANNING] [DATA]`:
//! the FGD study without the CLI crate (which is slow to build), for choosing a policy's
//! parameters quickly. LISTS and POLICIES are comma-separated (`default,gpushare80`,
//! `fgd,ours`), SEEDS a range (`100..105`: seeds apart from the reported 42..52 are for
//! choosing), PLANNING `whole-list` (default) or `learned`, DATA `../shared/data` by
//! default. Prints the unallocated GPU % at 100% arrived per list and policy, and the
//! mean over the lists.

use std::path::PathBuf;

use anyhow::{anyhow, bail, Context};
use nephele_sim::inflation::{Planning, StudyPolicy};
use nephele_sim::inflation_study::{run_pod_list, StudyRuns};
use nephele_sim::trace::{load_openb_with, pod_list_path};

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [lists, policies, seeds, rest @ ..] = args.as_slice() else {
        bail!("usage: inflation LISTS POLICIES SEEDS [PLANNING] [DATA], e.g. default,gpushare80 fgd,ours 100..105");
    };
    let policies = policies
        .split(',')
        .map(|p| StudyPolicy::parse(p).ok_or_else(|| anyhow!("unknown policy {p}")))
        .collect::<anyhow::Result<Vec<_>>>()?;
    let (first, end) = seeds
        .split_once("..")
        .context("SEEDS is a range such as 100..105")?;
    let planning = rest.first().map_or("whole-list", String::as_str);
    let planning =
        Planning::parse(planning).ok_or_else(|| anyhow!("unknown planning {planning}"))?;
    let data = PathBuf::from(rest.get(1).map_or("../shared/data", String::as_str));
    let study = StudyRuns {
        policies: policies.clone(),
        seeds: first.parse()?..end.parse()?,
        threads: std::thread::available_parallelism().map_or(1, |n| n.get()),
        planning,
        ours: nephele_placement::OursParams::default(),
    };
    let lists: Vec<&str> = lists.split(',').collect();
    let mut sums = vec![0.0; policies.len()];
    for list in &lists {
        let trace = load_openb_with(&data, &pod_list_path(&data, list))?;
        let result = run_pod_list(list, list, &trace, &study, &|_, _| {});
        let mut line = format!("{list:12}");
        for (sum, policy) in sums.iter_mut().zip(&result.policies) {
            let (mean, sd) = (
                policy.unallocated_gpu_share_at_100 * 100.0,
                policy.unallocated_gpu_share_at_100_sd * 100.0,
            );
            *sum += mean;
            line += &format!("  {} {mean:.3} ± {sd:.3}", policy.name);
        }
        println!("{line}");
    }
    let mut line = format!("{:12}", "mean");
    for (sum, policy) in sums.iter().zip(&policies) {
        line += &format!("  {} {:.3}", policy.name(), sum / lists.len() as f64);
    }
    println!("{line}");
    Ok(())
}
