//! `nephele sim`: argument parsing and printing; the engine is `nephele-sim`.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Instant;

use anyhow::{Context as _, Result};
use nephele_placement::{Policy, TypicalPods};
use nephele_sim::carbon::{run_shift, ShiftConfig};
use nephele_sim::inflation::{by_level, mean_sd, run_inflation, PolicySummary};
use nephele_sim::plot::svg_plot;
use nephele_sim::replay::{run_replay, ReplayConfig, ReplayOptions};
use nephele_sim::trace::load_openb;

#[derive(Debug, Clone, clap::Subcommand)]
pub enum SimCommand {
    /// Workload inflation on the openb GPU trace (the FGD paper's protocol).
    Inflation(InflationArgs),
    /// Time replay of openb through the scheduling queue (queueing delay, JCT,
    /// utilisation, fairness, preemptions, cost and carbon per configuration).
    Replay(ReplayArgs),
    /// Carbon-aware temporal shifting on the 2023 hourly grid series (forecast from
    /// past data vs perfect foresight), and region choice.
    Shift(ShiftArgs),
}

#[derive(Debug, Clone, clap::Args)]
pub struct ReplayArgs {
    /// Folder with alibaba-gpu-v2023/, carbon-intensity-hourly-2023/ and
    /// electricity-prices-hourly-2023/.
    #[arg(long, default_value = "../shared/data")]
    pub data: PathBuf,
    /// Where to write replay.csv, replay.json and replay.svg.
    #[arg(long, default_value = "sim-results")]
    pub out: PathBuf,
    /// Print the summary as JSON.
    #[arg(long)]
    pub json: bool,
    /// Divide arrival times by this (runtimes unchanged): openb as recorded keeps its
    /// GPUs about 0.2% busy, so it never queues uncompressed.
    #[arg(long, default_value_t = 100.0)]
    pub compression: f64,
    /// Keep every n-th GPU node.
    #[arg(long, default_value_t = 10)]
    pub node_stride: usize,
    /// Placement policies for the full configuration, comma-separated (FIFO always
    /// uses best-fit).
    #[arg(long, default_value = "best-fit,fgd")]
    pub policies: String,
    /// Checkpoint grace period of preempted jobs, seconds.
    #[arg(long, default_value_t = 30)]
    pub grace: u64,
    /// Wait after which a job that does not fit gets the reservation, seconds.
    #[arg(long, default_value_t = 3600)]
    pub aging: u64,
    /// Zones for regions (each needs a carbon and a price file).
    #[arg(long, default_value = "CA-ON,DE-LU,US-CAL-CISO,SG")]
    pub zones: String,
    /// Each tenant's GPU quota as a share of cluster GPUs (unset: no quota).
    #[arg(long)]
    pub tenant_gpu_quota: Option<f64>,
}

#[derive(Debug, Clone, clap::Args)]
pub struct ShiftArgs {
    /// Folder with carbon-intensity-hourly-2023/ and electricity-prices-hourly-2023/.
    #[arg(long, default_value = "../shared/data")]
    pub data: PathBuf,
    /// Where to write shift.csv, shift.json and shift.svg.
    #[arg(long, default_value = "sim-results")]
    pub out: PathBuf,
    /// Print the report as JSON instead of the table.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Clone, clap::Args)]
pub struct InflationArgs {
    /// Folder with the traces (holds alibaba-gpu-v2023/).
    #[arg(long, default_value = "../shared/data")]
    pub data: PathBuf,
    /// Seeds to run (results are mean and spread over them).
    #[arg(long, default_value_t = 5)]
    pub seeds: u64,
    /// Policies, comma-separated (default: all).
    #[arg(
        long,
        default_value = "random,first-fit,best-fit,dot-product,gpu-packing,fgd,ours"
    )]
    pub policies: String,
    /// Where to write inflation.csv, inflation.json and inflation.svg.
    #[arg(long, default_value = "sim-results")]
    pub out: PathBuf,
    /// Print the summary as JSON.
    #[arg(long)]
    pub json: bool,
}

pub fn run(command: SimCommand) -> Result<()> {
    match command {
        SimCommand::Inflation(args) => run_inflation_command(args),
        SimCommand::Replay(args) => run_replay_command(args),
        SimCommand::Shift(args) => run_shift_command(args),
    }
}

fn run_shift_command(args: ShiftArgs) -> Result<()> {
    let report = run_shift(&args.data, &ShiftConfig::default())?;
    report.write_all(&args.out)?;
    if args.json {
        println!("{}", serde_json::to_string(&report)?);
    } else {
        print!("{}", report.table());
        println!("wrote {}/shift.{{csv,json,svg}}", args.out.display());
    }
    Ok(())
}

fn run_replay_command(args: ReplayArgs) -> Result<()> {
    let mut configs = vec![ReplayConfig::fifo(Policy::BestFit)];
    for name in args.policies.split(',').filter(|s| !s.trim().is_empty()) {
        let policy = Policy::parse(name.trim()).with_context(|| {
            format!("unknown policy {name:?} (try best-fit, fgd, ours, first-fit)")
        })?;
        configs.push(ReplayConfig::full(policy, args.grace, args.aging));
    }
    if !args.compression.is_finite() || args.compression <= 0.0 || args.node_stride == 0 {
        anyhow::bail!("--compression must be > 0 and --node-stride at least 1");
    }
    let options = ReplayOptions {
        time_compression: args.compression,
        node_stride: args.node_stride,
        zones: args
            .zones
            .split(',')
            .map(|z| z.trim().to_string())
            .collect(),
        configs,
        tenant_gpu_quota: args.tenant_gpu_quota,
        ..ReplayOptions::default()
    };
    let quiet = args.json;
    let report = run_replay(&args.data, &options, &mut |line| {
        if !quiet {
            eprintln!("[replay] {line}");
        }
    })?;
    report.write(&args.out)?;
    if args.json {
        println!("{}", serde_json::to_string(&report)?);
    } else {
        print!("{}", report.table());
        println!("wrote {}/replay.{{csv,json,svg}}", args.out.display());
    }
    Ok(())
}

fn run_inflation_command(args: InflationArgs) -> Result<()> {
    let policies: Vec<Policy> = args
        .policies
        .split(',')
        .map(|name| Policy::parse(name.trim()).with_context(|| format!("unknown policy {name:?}")))
        .collect::<Result<_>>()?;
    let trace = load_openb(&args.data)?;
    let typical = TypicalPods::from_pods(&trace.pods, 0.95);
    std::fs::create_dir_all(&args.out)?;
    let mut csv = String::from("policy,seed,arrived_pct,allocated_pct,unallocated_pct,fragmentation_pct,fragmentation_ratio_pct\n");
    let mut summaries = Vec::new();
    let mut curves = Vec::new();
    let total_runs = policies.len() as u64 * args.seeds;
    let mut done = 0;
    for policy in &policies {
        let mut at_100 = Vec::new();
        let mut ratio_100 = Vec::new();
        let mut curve: BTreeMap<u32, Vec<f64>> = BTreeMap::new();
        let started = Instant::now();
        let mut failed: BTreeMap<&'static str, u64> = BTreeMap::new();
        for seed in 0..args.seeds {
            let (series, failures) = run_inflation(&trace, &typical, *policy, 42 + seed);
            for (reason, count) in failures {
                *failed.entry(reason).or_default() += count;
            }
            let levels = by_level(&series);
            done += 1;
            if !args.json {
                eprintln!(
                    "[sim] {done}/{total_runs} {} seed {}",
                    policy.name(),
                    42 + seed
                );
            }
            for (level, used, frag, ratio) in &levels {
                csv += &format!(
                    "{},{},{level},{used:.4},{:.4},{frag:.4},{ratio:.4}\n",
                    policy.name(),
                    42 + seed,
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
        summaries.push(PolicySummary {
            name: policy.name().into(),
            unallocated_gpu_share_at_100: mean,
            unallocated_gpu_share_at_100_sd: sd,
            fragmentation_ratio_at_100: mean_sd(&ratio_100).0,
            seeds: args.seeds,
            seconds_per_run: started.elapsed().as_secs_f64() / args.seeds.max(1) as f64,
            failed_pods_before_100: failed
                .iter()
                .map(|(reason, count)| (*reason, *count as f64 / args.seeds.max(1) as f64))
                .collect(),
        });
        curves.push((
            policy.name().to_string(),
            curve.into_iter().map(|(l, v)| (l, mean_sd(&v).0)).collect(),
        ));
    }
    std::fs::write(args.out.join("inflation.csv"), csv)?;
    let summary = serde_json::json!({
        "trace": "alibaba-gpu-v2023 openb (gpu node list, default pod list)",
        "nodes": trace.nodes.len(),
        "pods": trace.pods.len(),
        "typical_pod_classes": typical.classes.len(),
        "policies": summaries,
    });
    std::fs::write(
        args.out.join("inflation.json"),
        serde_json::to_vec_pretty(&summary)?,
    )?;
    std::fs::write(args.out.join("inflation.svg"), svg_plot(&curves))?;
    if args.json {
        println!("{}", serde_json::to_string(&summary)?);
    } else {
        println!(
            "{:<12} {:>22} {:>8} {:>18} {:>10}",
            "POLICY", "UNALLOC GPU @100% (%)", "SD", "FRAG RATIO @100%", "S/RUN"
        );
        let mut failures = Vec::new();
        for s in &summaries {
            println!(
                "{:<12} {:>22.2} {:>8.2} {:>17.1}% {:>10.1}",
                s.name,
                s.unallocated_gpu_share_at_100 * 100.0,
                s.unallocated_gpu_share_at_100_sd * 100.0,
                s.fragmentation_ratio_at_100 * 100.0,
                s.seconds_per_run
            );
            let reasons: Vec<String> = s
                .failed_pods_before_100
                .iter()
                .map(|(reason, n)| format!("{n:.1} {reason}"))
                .collect();
            failures.push(format!(
                "  {:<12} {}",
                s.name,
                if reasons.is_empty() {
                    "none".into()
                } else {
                    reasons.join(", ")
                }
            ));
        }
        println!("pods that found no node before demand reached 100% (per run, by the reason most nodes gave):");
        for line in failures {
            println!("{line}");
        }
        println!("wrote {}/inflation.{{csv,json,svg}}", args.out.display());
    }
    Ok(())
}
