//! `nephele sim`: argument parsing and printing; the engine is `nephele-sim`.

use std::path::PathBuf;
use std::time::Instant;

use anyhow::{Context as _, Result};
use nephele_placement::Policy;
use nephele_sim::autoscale::{run_autoscale, AutoscaleOptions};
use nephele_sim::autoscale_heldout::run_heldout;
use nephele_sim::autoscale_llm::SlowdownTarget;
use nephele_sim::autoscale_trace::ServiceOptions;
use nephele_sim::autoscale_tune::tune_ours;
use nephele_sim::carbon::{run_shift, ShiftConfig};
use nephele_sim::inflation::{Planning, StudyPolicy};
use nephele_sim::inflation_study::{run_pod_list, study_svgs, StudyRuns};
use nephele_sim::plot::svg_plot;
use nephele_sim::replay::{run_replay, ReplayConfig, ReplayOptions};
use nephele_sim::trace::{all_pod_lists, load_openb_with, pod_list_name, pod_list_path, Trace};

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
    /// Request traces replayed against a region's replicas under static, HPA, KPA,
    /// ours (the nephele-autoscale core) and a clairvoyant oracle (simulator only):
    /// within-target share, GPU-hours, cost, scale events, direction changes.
    Autoscale(AutoscaleArgs),
}

#[derive(Debug, Clone, clap::Args)]
pub struct AutoscaleArgs {
    /// Folder with azure-llm-inference-2023/, alibaba-genai-lora-v2026/ (traces and
    /// the measured model-load times used as cold starts) and
    /// electricity-prices-hourly-2023/.
    #[arg(long, default_value = "../shared/data")]
    pub data: PathBuf,
    /// Where to write autoscale-<trace>.{json,csv,svg} and -series.csv, -forecast.csv.
    #[arg(long, default_value = "sim-results")]
    pub out: PathBuf,
    /// azure-code, genai-lora, or a FILE in either trace's CSV format (told apart by
    /// its header); several, comma-separated, run one after the other.
    #[arg(long, default_value = "azure-code,genai-lora")]
    pub trace: String,
    /// Print each trace's report as one JSON object (one line per trace).
    #[arg(long)]
    pub json: bool,
    /// Electricity price zone for the energy cost.
    #[arg(long, default_value = "US-CAL-CISO")]
    pub zone: String,
    /// Seed of the cold-start draws.
    #[arg(long, default_value_t = 42)]
    pub seed: u64,
    #[arg(long, default_value_t = 1)]
    pub min_replicas: u32,
    #[arg(long, default_value_t = 64)]
    pub max_replicas: u32,
    /// Share of each trace (from its start) on which parameters were chosen; the rest
    /// is reported apart as the held-out part.
    #[arg(long, default_value_t = 0.5)]
    pub tune_share: f64,
    /// Static replicas (default: the fewest that keep 99% within target).
    #[arg(long)]
    pub static_replicas: Option<u32>,
    /// Also run ours without forecast/warm pool, without admission, and without both.
    #[arg(long)]
    pub ablations: bool,
    /// Multiply every cold start drawn by this (sensitivity; 1 = as measured).
    #[arg(long, default_value_t = 1.0)]
    pub cold_start_scale: f64,
    /// LLM latency target: Splitwise's p99 slowdowns (TTFT 6×, TBT 5×, E2E 5×) or
    /// its p90 ones (3×, 1.5×, 1.5×), over the request alone on an idle replica.
    #[arg(long, default_value = "p99")]
    pub slo: String,
    /// LLM replicas' token budget per step (vLLM's max_num_batched_tokens).
    #[arg(long, default_value_t = 2048)]
    pub token_budget: u32,
    /// Skip the clairvoyant oracle (simulator-only bound).
    #[arg(long)]
    pub no_oracle: bool,
    /// Instead of the comparison: run the grid that chooses ours' parameters on the
    /// tune part of each trace (writes autoscale-tune.{csv,json}).
    #[arg(long)]
    pub tune: bool,
    /// Cold-start seeds of the tuning grid, comma-separated.
    #[arg(long, default_value = "1,2,3")]
    pub tune_seeds: String,
    /// A JSON object merged over ours' configuration, e.g.
    /// '{"scale_down_stabilisation_ms": 60000, "warm": {"max_warm": 4}}'. Without it,
    /// ours runs its one default configuration on every trace.
    #[arg(long)]
    pub ours_config: Option<String>,
    /// Every policy runs the first this many seconds of each trace unscored (warm-up).
    #[arg(long, default_value_t = 300.0)]
    pub warmup_s: f64,
    /// Instead of one report per trace: every trace and each of its held-out
    /// variations (cut by time, ×0.25–×4 the rate, request lengths shuffled, swapped
    /// and scaled), one row each (writes autoscale-heldout.{csv,json,svg}).
    #[arg(long)]
    pub heldout: bool,
    /// Seed of the held-out variations (thinning, shuffles).
    #[arg(long, default_value_t = 7)]
    pub variation_seed: u64,
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
    /// Pod lists to inflate (repeat or comma-separate): a name (`default`, `gpuspec33`,
    /// … for `alibaba-gpu-v2023/openb_pod_list_<name>.csv` in --data), a CSV file (the
    /// trace repository's 11 columns, or `name,cpu_milli,memory_mib,num_gpu,gpu_milli`),
    /// or `all` for every `openb_pod_list_*.csv` there. `LIST@HOW` resamples a list
    /// from its own pods: `default@multi30` (30% of GPU pods multi-GPU), `@shared70`
    /// (70% shared), `@cpu2x` (GPU pods ask twice the CPU); `resampled` names eight
    /// such lists made from the default one.
    #[arg(long, value_delimiter = ',', default_value = "default")]
    pub pods: Vec<String>,
    /// Seeds to run (results are mean and spread over them).
    #[arg(long, default_value_t = 5)]
    pub seeds: u64,
    /// The first seed (the paper's runs are 42..=51): seeds apart from the reported ones
    /// are for choosing a policy's parameters.
    #[arg(long, default_value_t = 42)]
    pub first_seed: u64,
    /// Policies, comma-separated (default: all).
    #[arg(
        long,
        default_value = "random,first-fit,best-fit,dot-product,gpu-clustering,gpu-packing,fgd,ours"
    )]
    pub policies: String,
    /// What FGD and ours plan for: `whole-list` (the typical pods of the whole pod list,
    /// known in advance, as the paper does) or `learned` (as a running region: a fixed
    /// starting mix, then the latest 2,000 pods arrived, remade every 100).
    #[arg(long, default_value = "whole-list", value_parser = ["whole-list", "learned"])]
    pub planning: String,
    /// Where to write inflation.json and, per pod list, inflation-<list>.csv and .svg.
    #[arg(long, default_value = "sim-results")]
    pub out: PathBuf,
    /// Print the summary as JSON.
    #[arg(long)]
    pub json: bool,
    /// Runs at once (default: the machine's cores).
    #[arg(long)]
    pub threads: Option<usize>,
    /// The weights `ours` runs with, for research (`resolution=50,scarcity=0.5,
    /// excess=1,one-pod=0.6` are the defaults; any left out keep theirs).
    #[arg(long, value_name = "NAME=VALUE,...")]
    pub ours_params: Option<String>,
    /// Choose ours' weights for each list from the other given lists alone (a grid of
    /// 108, compared with FGD on seeds 100..103) and report FGD, ours with the
    /// defaults and ours with the weights chosen without the list. Lists made with
    /// `@` (and files) are held out from every choice. Writes inflation-loo.json.
    #[arg(long)]
    pub leave_one_out: bool,
}

pub fn run(command: SimCommand) -> Result<()> {
    match command {
        SimCommand::Inflation(args) => run_inflation_command(args),
        SimCommand::Replay(args) => run_replay_command(args),
        SimCommand::Shift(args) => run_shift_command(args),
        SimCommand::Autoscale(args) => run_autoscale_command(args),
    }
}

fn run_autoscale_command(args: AutoscaleArgs) -> Result<()> {
    if !args.data.is_dir() {
        anyhow::bail!(
            "data folder {} not found: pass --data with the folder that holds azure-llm-inference-2023/, alibaba-genai-lora-v2026/ and electricity-prices-hourly-2023/ (the default, ../shared/data, is relative to where you run nephele)",
            args.data.display()
        );
    }
    if args.min_replicas > args.max_replicas || args.max_replicas == 0 {
        anyhow::bail!(
            "--min-replicas must be at most --max-replicas, and --max-replicas at least 1"
        );
    }
    if !(0.0..=1.0).contains(&args.tune_share) {
        anyhow::bail!("--tune-share must be in 0..=1");
    }
    if !(args.cold_start_scale.is_finite() && args.cold_start_scale >= 0.0) {
        anyhow::bail!("--cold-start-scale must be a number ≥ 0");
    }
    if !(args.warmup_s.is_finite() && args.warmup_s >= 0.0) {
        anyhow::bail!("--warmup-s must be a number of seconds ≥ 0");
    }
    let slowdown = match args.slo.as_str() {
        "p99" => SlowdownTarget::SPLITWISE_P99,
        "p90" => SlowdownTarget::SPLITWISE_P90,
        other => anyhow::bail!("--slo must be p99 or p90, not {other:?}"),
    };
    let ours_override = args
        .ours_config
        .as_deref()
        .map(serde_json::from_str::<serde_json::Value>)
        .transpose()
        .context("--ours-config is not JSON")?;
    let options = AutoscaleOptions {
        seed: args.seed,
        zone: args.zone.clone(),
        min_replicas: args.min_replicas,
        max_replicas: args.max_replicas,
        tune_share: args.tune_share,
        static_replicas: args.static_replicas,
        ablations: args.ablations,
        cold_start_scale: args.cold_start_scale,
        service: ServiceOptions {
            slowdown,
            token_budget: args.token_budget.max(1),
        },
        oracle: !args.no_oracle,
        ours_override,
        warmup_s: args.warmup_s,
        ..AutoscaleOptions::default()
    };
    let started = Instant::now();
    let quiet = args.json;
    if args.heldout {
        let traces: Vec<&str> = args
            .trace
            .split(',')
            .map(str::trim)
            .filter(|t| !t.is_empty())
            .collect();
        let report = run_heldout(
            &args.data,
            &traces,
            &options,
            args.variation_seed,
            &mut |line| {
                if !quiet {
                    eprintln!(
                        "[autoscale held-out {:>6.1} s] {line}",
                        started.elapsed().as_secs_f64()
                    );
                }
            },
        )?;
        let written = report.write(&args.out)?;
        if args.json {
            println!("{}", serde_json::to_string(&report)?);
        } else {
            print!("{}", report.table());
            let names: Vec<String> = written.iter().map(|p| p.display().to_string()).collect();
            println!("wrote {}", names.join(", "));
        }
        return Ok(());
    }
    if args.tune {
        let seeds: Vec<u64> = args
            .tune_seeds
            .split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(|s| s.parse::<u64>().context("--tune-seeds: not a number"))
            .collect::<Result<_>>()?;
        let traces: Vec<&str> = args
            .trace
            .split(',')
            .map(str::trim)
            .filter(|t| !t.is_empty())
            .collect();
        let report = tune_ours(&args.data, &traces, &options, &seeds, &mut |line| {
            if !quiet {
                eprintln!(
                    "[autoscale tune {:>6.1} s] {line}",
                    started.elapsed().as_secs_f64()
                );
            }
        })?;
        std::fs::create_dir_all(&args.out)
            .with_context(|| format!("cannot create {}", args.out.display()))?;
        std::fs::write(args.out.join("autoscale-tune.csv"), report.csv())?;
        std::fs::write(
            args.out.join("autoscale-tune.json"),
            serde_json::to_string_pretty(&report)?,
        )?;
        if args.json {
            println!("{}", serde_json::to_string(&report.chosen)?);
        } else {
            for chosen in &report.chosen {
                println!(
                    "{}: configuration {} (goal met on the tune part: {}): {}\n  within {:.2}% (min {:.2}%) at {:.0}% of static's GPU-hours, mean over seeds {}",
                    chosen.trace,
                    chosen.config,
                    chosen.feasible,
                    chosen.patch,
                    chosen.within_mean * 100.0,
                    chosen.within_min * 100.0,
                    chosen.share_of_static * 100.0,
                    args.tune_seeds
                );
            }
            println!("wrote {}/autoscale-tune.{{csv,json}}", args.out.display());
        }
        return Ok(());
    }
    for trace in args
        .trace
        .split(',')
        .map(str::trim)
        .filter(|t| !t.is_empty())
    {
        let report = run_autoscale(&args.data, trace, &options, &mut |line| {
            if !quiet {
                eprintln!(
                    "[autoscale {:>5.1} s] {line}",
                    started.elapsed().as_secs_f64()
                );
            }
        })?;
        let written = report.write(&args.out)?;
        if args.json {
            println!("{}", serde_json::to_string(&report)?);
        } else {
            print!("{}", report.table());
            let names: Vec<String> = written.iter().map(|p| p.display().to_string()).collect();
            println!("wrote {}\n", names.join(", "));
        }
    }
    Ok(())
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

type ListAsked = (String, PathBuf, Option<String>);

/// `sim inflation --leave-one-out`: the lists the study names (not made with `@`, not a
/// file of the user's) choose; every list is reported with weights chosen without it.
fn run_leave_one_out(
    args: &InflationArgs,
    lists: &[ListAsked],
    load: &dyn Fn(&ListAsked) -> Result<Trace>,
    threads: usize,
    planning: Planning,
) -> Result<()> {
    use nephele_sim::inflation_loo::{default_grid, leave_one_out, LooOptions};
    let mut given = Vec::new();
    let mut held_out = Vec::new();
    for asked in lists {
        let trace = load(asked)?;
        let study_list =
            asked.2.is_none() && nephele_sim::inflation_study::authors_figures(&asked.0).is_some();
        if study_list {
            given.push((asked.0.clone(), trace));
        } else {
            held_out.push((asked.0.clone(), trace));
        }
    }
    if given.len() < 2 {
        anyhow::bail!(
            "--leave-one-out needs at least two of the study's lists to choose on (e.g. --pods all,resampled)"
        );
    }
    let options = LooOptions {
        grid: default_grid(),
        choice_seeds: 100..103,
        report_seeds: args.first_seed..args.first_seed + args.seeds,
        threads,
        planning,
    };
    let quiet = args.json;
    let report = leave_one_out(
        &given,
        &held_out,
        &options,
        &|name| {
            nephele_sim::inflation_study::authors_figures(name).and_then(|a| a.get("fgd").copied())
        },
        &|stage, done, all| {
            if !quiet && (done % 50 == 0 || done == all) {
                eprint!("\r[sim] leave-one-out, {stage}: {done}/{all} runs");
                if done == all {
                    eprintln!();
                }
            }
        },
    );
    std::fs::write(
        args.out.join("inflation-loo.json"),
        serde_json::to_vec_pretty(&report)?,
    )?;
    if args.json {
        println!("{}", serde_json::to_string(&report)?);
    } else {
        print!("{}", report.table());
        println!(
            "wrote {}/inflation-loo.json ({:.0} s)",
            args.out.display(),
            report.elapsed_s
        );
    }
    Ok(())
}

fn run_inflation_command(args: InflationArgs) -> Result<()> {
    let policies: Vec<StudyPolicy> = args
        .policies
        .split(',')
        .map(|name| {
            StudyPolicy::parse(name.trim()).with_context(|| {
                format!(
                    "unknown policy {name:?} (the study's: {})",
                    StudyPolicy::ALL.map(StudyPolicy::name).join(", ")
                )
            })
        })
        .collect::<Result<_>>()?;
    let planning = Planning::parse(&args.planning)
        .with_context(|| format!("--planning {}: whole-list or learned", args.planning))?;
    if !args.data.join("alibaba-gpu-v2023").is_dir() {
        anyhow::bail!(
            "{} has no alibaba-gpu-v2023/ (the openb traces); pass --data with the folder that holds them, e.g. ../shared/data",
            args.data.display()
        );
    }
    // (name, file shown, file, resampling)
    let mut lists_asked: Vec<(String, PathBuf, Option<String>)> = Vec::new();
    for pods in &args.pods {
        let expanded: Vec<String> = if pods == "resampled" {
            nephele_sim::pod_resample::STANDARD
                .iter()
                .map(|s| s.to_string())
                .collect()
        } else {
            vec![pods.clone()]
        };
        for pods in expanded {
            let (list, how) = match pods.rsplit_once('@') {
                Some((list, how)) => {
                    nephele_sim::pod_resample::Resample::parse(how)
                        .map_err(|e| anyhow::anyhow!("--pods {pods}: {e}"))?;
                    (list.to_string(), Some(how.to_string()))
                }
                None => (pods.clone(), None),
            };
            if list == "all" {
                if how.is_some() {
                    anyhow::bail!("--pods {pods}: resample one list at a time (default@multi30)");
                }
                for file in all_pod_lists(&args.data)? {
                    lists_asked.push((pod_list_name(&file), file, None));
                }
                continue;
            }
            let path = pod_list_path(&args.data, &list);
            if !path.is_file() {
                anyhow::bail!(
                    "--pods {pods}: {} not found (a name like default or gpuspec33, a CSV file, LIST@multi30|shared70|cpu2x, resampled or all)",
                    path.display()
                );
            }
            let name = match &how {
                Some(how) => format!("{}@{how}", pod_list_name(&path)),
                None => pod_list_name(&path),
            };
            lists_asked.push((name, path, how));
        }
    }
    let mut seen = std::collections::BTreeSet::new();
    lists_asked.retain(|(name, ..)| seen.insert(name.clone()));
    let load = |(name, file, how): &(String, PathBuf, Option<String>)| -> Result<Trace> {
        let trace = load_openb_with(&args.data, file)?;
        match how {
            None => Ok(trace),
            Some(how) => {
                let spec = nephele_sim::pod_resample::Resample::parse(how)
                    .map_err(|e| anyhow::anyhow!("{name}: {e}"))?;
                nephele_sim::pod_resample::resample(
                    &trace,
                    spec,
                    nephele_sim::pod_resample::seed_of(name),
                )
                .map_err(|e| anyhow::anyhow!("{name}: {e}"))
            }
        }
    };
    let threads = args
        .threads
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
        .max(1);
    let ours = match &args.ours_params {
        Some(text) => nephele_sim::inflation::parse_ours_params(text)
            .map_err(|e| anyhow::anyhow!("--ours-params {text}: {e}"))?,
        None => nephele_placement::OursParams::default(),
    };
    let study = StudyRuns {
        policies,
        seeds: args.first_seed..args.first_seed + args.seeds,
        threads,
        planning,
        ours,
    };
    std::fs::create_dir_all(&args.out)?;
    if args.leave_one_out {
        return run_leave_one_out(&args, &lists_asked, &load, study.threads, planning);
    }
    let started = Instant::now();
    let mut lists = Vec::new();
    for (index, asked) in lists_asked.iter().enumerate() {
        let (name, file, _) = asked;
        let name = name.clone();
        let trace = load(asked)?;
        let label = format!("[sim] {}/{} {name}", index + 1, lists_asked.len());
        let json = args.json;
        let progress = move |done: usize, all: usize| {
            if !json {
                eprint!("\r{label}: {done}/{all} runs");
                if done == all {
                    eprintln!();
                }
            }
        };
        let result = run_pod_list(
            &name,
            &file.display().to_string(),
            &trace,
            &study,
            &progress,
        );
        std::fs::write(
            args.out.join(format!("inflation-{name}.csv")),
            String::from("policy,seed,arrived_pct,allocated_pct,unallocated_pct,fragmentation_pct,fragmentation_ratio_pct\n")
                + &result.csv,
        )?;
        std::fs::write(
            args.out.join(format!("inflation-{name}.svg")),
            svg_plot(&result.curves),
        )?;
        lists.push(result);
    }
    let summary = serde_json::json!({
        "trace": "alibaba-gpu-v2023 openb (GPU node list; the pod lists named)",
        "seeds": args.seeds,
        "first_seed": args.first_seed,
        "planning": planning.name(),
        "elapsed_s": started.elapsed().as_secs_f64(),
        "pod_lists": lists,
    });
    for (file, svg) in study_svgs(&lists) {
        std::fs::write(args.out.join(file), svg)?;
    }
    std::fs::write(
        args.out.join("inflation.json"),
        serde_json::to_vec_pretty(&summary)?,
    )?;
    if args.json {
        println!("{}", serde_json::to_string(&summary)?);
        return Ok(());
    }
    for list in &lists {
        println!(
            "\n{} ({} pods on {} nodes): unallocated GPU at 100% arrived, {} seed(s), planning for the {}",
            list.name, list.pods, list.nodes, args.seeds, list.planning
        );
        println!(
            "{:<15} {:>10} {:>8} {:>12} {:>18} {:>8}",
            "POLICY", "UNALLOC %", "SD", "FGD AUTHORS %", "FRAG RATIO @100%", "S/RUN"
        );
        let mut failures = Vec::new();
        for s in &list.policies {
            let authors = list
                .authors_unallocated_pct
                .as_ref()
                .and_then(|a| a.get(s.name.as_str()))
                .map_or("-".to_string(), |v| format!("{v:.2}"));
            println!(
                "{:<15} {:>10.2} {:>8.2} {:>12} {:>17.1}% {:>8.2}",
                s.name,
                s.unallocated_gpu_share_at_100 * 100.0,
                s.unallocated_gpu_share_at_100_sd * 100.0,
                authors,
                s.fragmentation_ratio_at_100 * 100.0,
                s.seconds_per_run
            );
            let mut kinds: Vec<(&String, &f64)> = s.failed_gpu_pct_before_100.iter().collect();
            kinds.sort_by(|a, b| b.1.total_cmp(a.1).then(a.0.cmp(b.0)));
            let reasons: Vec<String> = kinds
                .iter()
                .map(|(kind, pct)| {
                    let pods = s.failed_pods_before_100.get(*kind).copied().unwrap_or(0.0);
                    format!("{pods:.1} {kind} ({pct:.2}% gpu)")
                })
                .collect();
            failures.push(format!(
                "  {:<15} {}",
                s.name,
                if reasons.is_empty() {
                    "none".into()
                } else {
                    reasons.join("; ")
                }
            ));
        }
        println!("pods that found no node before demand reached 100%, per run: the kind of pod, what was short on the nodes closest to taking it, and their GPU demand:");
        for line in failures {
            println!("{line}");
        }
    }
    println!(
        "\nwrote {}/inflation.json, inflation-<list>.{{csv,svg}} and a bar chart per study run (inflation-study-<sharing|constraints|cpu>.svg) ({:.0} s)",
        args.out.display(),
        started.elapsed().as_secs_f64()
    );
    Ok(())
}
