//! `nephele sim`: replays real cluster traces through the placement core.
//!
//! `inflation` follows the FGD paper's protocol (see `../shared/docs/FGD-EVALUATION.md`)
//! on the Alibaba openb trace: the GPU node list, the default pod list shuffled by the
//! seed and inflated by random re-draws to 130% of GPU capacity, one scheduling attempt
//! per pod in order, no departures. After every pod it records arrived and allocated
//! milli-GPU and the cluster's fragmentation, and reports per arrived-% level the
//! unallocated GPU share (100% − allocated) and the fragmentation rate. Our generator is
//! SplitMix64, not Go's math/rand, so the sequences differ from the paper's for the
//! same seed numbers; the protocol is otherwise the same.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{bail, Context as _, Result};
use nephele_placement::rng::Rng;
use nephele_placement::{place, Cluster, NodeSpec, PodRequest, Policy, TypicalPods};
use serde::Serialize;

#[derive(Debug, Clone, clap::Subcommand)]
pub enum SimCommand {
    /// Workload inflation on the openb GPU trace (the FGD paper's protocol).
    Inflation(InflationArgs),
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

struct Trace {
    nodes: Vec<NodeSpec>,
    pods: Vec<PodRequest>,
}

fn read_csv(path: &Path) -> Result<Vec<BTreeMap<String, String>>> {
    let text = std::fs::read_to_string(path).with_context(|| {
        format!(
            "cannot read {} (pass --data with the folder that holds alibaba-gpu-v2023/)",
            path.display()
        )
    })?;
    let mut lines = text.lines();
    let header: Vec<String> = lines
        .next()
        .context("empty CSV")?
        .split(',')
        .map(str::to_string)
        .collect();
    let mut rows = Vec::new();
    for (number, line) in lines.enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let fields: Vec<&str> = line.split(',').collect();
        if fields.len() != header.len() {
            bail!(
                "{}:{}: {} fields, header has {}",
                path.display(),
                number + 2,
                fields.len(),
                header.len()
            );
        }
        rows.push(
            header
                .iter()
                .cloned()
                .zip(fields.iter().map(|f| f.to_string()))
                .collect(),
        );
    }
    Ok(rows)
}

fn field<T: std::str::FromStr>(row: &BTreeMap<String, String>, key: &str) -> Result<T> {
    row.get(key)
        .with_context(|| format!("missing column {key}"))?
        .parse()
        .map_err(|_| anyhow::anyhow!("column {key}: cannot parse {:?}", row.get(key)))
}

fn load_trace(data: &Path) -> Result<Trace> {
    let dir = data.join("alibaba-gpu-v2023");
    let mut models: Vec<String> = Vec::new();
    let mut intern = |name: &str| -> u16 {
        if let Some(idx) = models.iter().position(|m| m == name) {
            return idx as u16;
        }
        models.push(name.to_string());
        (models.len() - 1) as u16
    };
    let mut node_rows = read_csv(&dir.join("openb_node_list_gpu_node.csv"))?;
    node_rows.sort_by(|a, b| a.get("sn").cmp(&b.get("sn")));
    let mut nodes = Vec::new();
    for row in &node_rows {
        let gpus: u8 = field(row, "gpu")?;
        let model = row.get("model").map(String::as_str).unwrap_or("");
        nodes.push(NodeSpec {
            name: row.get("sn").cloned().unwrap_or_default(),
            cpu_milli: field(row, "cpu_milli")?,
            memory_mib: field(row, "memory_mib")?,
            gpus,
            gpu_model: (gpus > 0 && !model.is_empty()).then(|| intern(model)),
        });
    }
    let mut pod_rows = read_csv(&dir.join("openb_pod_list_default.csv"))?;
    pod_rows.sort_by(|a, b| a.get("name").cmp(&b.get("name")));
    let mut pods = Vec::new();
    for row in &pod_rows {
        let num_gpu: u8 = field(row, "num_gpu")?;
        let gpu_milli: u32 = field::<u32>(row, "gpu_milli")?.min(1000);
        let spec = row.get("gpu_spec").map(String::as_str).unwrap_or("");
        pods.push(PodRequest {
            cpu_milli: field(row, "cpu_milli")?,
            memory_mib: field(row, "memory_mib")?,
            num_gpu,
            gpu_milli: if num_gpu == 0 { 0 } else { gpu_milli },
            gpu_models: spec
                .split('|')
                .filter(|s| !s.is_empty())
                .map(&mut intern)
                .collect(),
        });
    }
    Ok(Trace { nodes, pods })
}

/// After every pod: (arrived %, allocated %, fragmentation % of capacity, fragmentation
/// / idle %).
type Series = Vec<(f64, f64, f64, f64)>;

/// One run: (arrived %, allocated %, fragmentation % of capacity, fragmentation / idle)
/// after every pod.
fn run_inflation(
    trace: &Trace,
    typical: &TypicalPods,
    policy: Policy,
    seed: u64,
) -> (Series, BTreeMap<&'static str, u64>) {
    let mut failures: BTreeMap<&'static str, u64> = BTreeMap::new();
    let mut rng = Rng::new(seed);
    let mut pods = trace.pods.clone();
    rng.shuffle(&mut pods);
    let mut cluster = Cluster::new(trace.nodes.clone());
    let capacity = cluster.total_gpu_milli() as f64;
    let mut total: f64 = pods.iter().map(|p| p.gpu_total() as f64).sum();
    loop {
        let pod = trace.pods[rng.below(trace.pods.len() as u64) as usize].clone();
        // The protocol's stop test uses milli per GPU, not the pod's total.
        if total + f64::from(pod.gpu_milli) > 1.3 * capacity {
            break;
        }
        total += pod.gpu_total() as f64;
        pods.push(pod);
    }
    let priority = rng.permutation(trace.nodes.len());
    cluster.set_priority(&priority);
    let mut node_frag: Vec<f64> = cluster
        .nodes
        .iter()
        .zip(&cluster.state)
        .map(|(spec, state)| typical.state_fragmentation(spec, state))
        .collect();
    let mut frag_total: f64 = node_frag.iter().sum();
    let mut arrived = 0.0;
    let mut used = 0.0;
    let mut series = Vec::with_capacity(pods.len());
    for (id, pod) in pods.iter().enumerate() {
        arrived += pod.gpu_total() as f64;
        match place(&cluster, pod, policy, typical, &priority, &mut rng) {
            Ok(placement) => {
                let node = placement.binding.node;
                if cluster.reserve(id as u64, pod, &placement.binding).is_ok() {
                    used += pod.gpu_total() as f64;
                    let updated =
                        typical.state_fragmentation(&cluster.nodes[node], &cluster.state[node]);
                    frag_total += updated - node_frag[node];
                    node_frag[node] = updated;
                }
            }
            // Why pods fail before demand reaches capacity: the reason most nodes gave.
            Err(why) if arrived <= capacity => {
                if let Some((reason, _)) = why.rejected.iter().max_by_key(|(_, n)| **n) {
                    *failures.entry(reason.as_str()).or_default() += 1;
                }
            }
            Err(_) => {}
        }
        let idle = capacity - used;
        series.push((
            arrived / capacity * 100.0,
            used / capacity * 100.0,
            frag_total / capacity * 100.0,
            if idle > 0.0 {
                frag_total / idle * 100.0
            } else {
                0.0
            },
        ));
    }
    (series, failures)
}

/// Mean of allocated % (and fragmentation) over events at each integer arrived % level;
/// an empty level takes the window of its neighbours, as the paper's scripts do.
fn by_level(series: &[(f64, f64, f64, f64)]) -> Vec<(u32, f64, f64, f64)> {
    let mut buckets: BTreeMap<u32, Vec<(f64, f64, f64)>> = BTreeMap::new();
    for (arrived, used, frag, ratio) in series {
        buckets
            .entry(arrived.round() as u32)
            .or_default()
            .push((*used, *frag, *ratio));
    }
    let mean = |values: &[(f64, f64, f64)]| {
        let n = values.len().max(1) as f64;
        (
            values.iter().map(|v| v.0).sum::<f64>() / n,
            values.iter().map(|v| v.1).sum::<f64>() / n,
            values.iter().map(|v| v.2).sum::<f64>() / n,
        )
    };
    (0..=130)
        .filter_map(|level| {
            let values = match buckets.get(&level) {
                Some(values) => values.clone(),
                None => (level.saturating_sub(1)..=level + 1)
                    .filter_map(|l| buckets.get(&l))
                    .flatten()
                    .copied()
                    .collect(),
            };
            (!values.is_empty()).then(|| {
                let (used, frag, ratio) = mean(&values);
                (level, used, frag, ratio)
            })
        })
        .collect()
}

#[derive(Debug, Serialize)]
struct PolicySummary {
    name: String,
    /// 1 − allocated/capacity at 100% arrived GPU demand, mean over seeds.
    unallocated_gpu_share_at_100: f64,
    unallocated_gpu_share_at_100_sd: f64,
    fragmentation_ratio_at_100: f64,
    seeds: u64,
    seconds_per_run: f64,
    /// Pods that found no node before arrived demand reached 100%, per seed, by the
    /// reason most nodes gave.
    failed_pods_before_100: BTreeMap<&'static str, f64>,
}

fn mean_sd(values: &[f64]) -> (f64, f64) {
    let n = values.len().max(1) as f64;
    let mean = values.iter().sum::<f64>() / n;
    let var = values.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / n;
    (mean, var.sqrt())
}

fn svg_plot(curves: &[(String, Vec<(u32, f64)>)]) -> String {
    let (width, height, left, bottom) = (720.0, 420.0, 60.0, 40.0);
    let x = |level: f64| left + level / 130.0 * (width - left - 20.0);
    let max_y = curves
        .iter()
        .flat_map(|(_, c)| c.iter().map(|(_, v)| *v))
        .fold(10.0f64, f64::max)
        .ceil();
    let y = |value: f64| height - bottom - value / max_y * (height - bottom - 20.0);
    let colours = [
        "#888", "#8c564b", "#1f77b4", "#9467bd", "#ff7f0e", "#2ca02c", "#d62728",
    ];
    let mut svg = format!(
        "<svg xmlns='http://www.w3.org/2000/svg' width='{width}' height='{height}' font-family='sans-serif' font-size='12'>\n<rect width='100%' height='100%' fill='white'/>\n"
    );
    svg += &format!(
        "<line x1='{left}' y1='{}' x2='{}' y2='{}' stroke='black'/>\n",
        y(0.0),
        x(130.0),
        y(0.0)
    );
    svg += &format!(
        "<line x1='{left}' y1='{}' x2='{left}' y2='{}' stroke='black'/>\n",
        y(0.0),
        y(max_y)
    );
    for level in (0..=130).step_by(10) {
        svg += &format!(
            "<text x='{}' y='{}' text-anchor='middle'>{level}</text>\n",
            x(f64::from(level)),
            y(0.0) + 16.0
        );
    }
    for tick in 0..=5 {
        let value = max_y * f64::from(tick) / 5.0;
        svg += &format!(
            "<text x='{}' y='{}' text-anchor='end'>{value:.0}</text>\n",
            left - 6.0,
            y(value) + 4.0
        );
    }
    svg += &format!(
        "<text x='{}' y='{}' text-anchor='middle'>arrived GPU demand (% of capacity)</text>\n",
        (left + width) / 2.0,
        height - 4.0
    );
    svg += &format!("<text x='14' y='{}' transform='rotate(-90 14 {})' text-anchor='middle'>unallocated GPU (% of capacity)</text>\n", height / 2.0, height / 2.0);
    for (idx, (name, curve)) in curves.iter().enumerate() {
        let colour = colours[idx % colours.len()];
        let points: Vec<String> = curve
            .iter()
            .map(|(l, v)| format!("{:.1},{:.1}", x(f64::from(*l)), y(*v)))
            .collect();
        svg += &format!(
            "<polyline fill='none' stroke='{colour}' stroke-width='1.5' points='{}'/>\n",
            points.join(" ")
        );
        svg += &format!(
            "<text x='{}' y='{}' fill='{colour}'>{name}</text>\n",
            width - 130.0,
            30.0 + 15.0 * idx as f64
        );
    }
    svg + "</svg>\n"
}

pub fn run(command: SimCommand) -> Result<()> {
    let SimCommand::Inflation(args) = command;
    let policies: Vec<Policy> = args
        .policies
        .split(',')
        .map(|name| Policy::parse(name.trim()).with_context(|| format!("unknown policy {name:?}")))
        .collect::<Result<_>>()?;
    let trace = load_trace(&args.data)?;
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
