//! `nephele bench placement`: placement decisions per second on a synthetic cluster
//! shaped like the openb GPU nodes (8-, 2-, 4- and 1-GPU nodes in the trace's
//! proportions), half-filled by random placements so node states differ, then timed
//! on one core: each decision is filter + score + select + reserve, and the
//! reservation is released again so every decision sees the same cluster.

use std::time::Instant;

use anyhow::Result;
use nephele_placement::rng::Rng;
use nephele_placement::{place, Cluster, NodeSpec, PodRequest, Policy, TypicalPods};

#[derive(Debug, Clone, clap::Subcommand)]
pub enum BenchCommand {
    /// Placement throughput of the placement core.
    Placement(PlacementArgs),
}

#[derive(Debug, Clone, clap::Args)]
pub struct PlacementArgs {
    #[arg(long, default_value_t = 10_000)]
    pub nodes: usize,
    /// Decisions to time per pod kind.
    #[arg(long, default_value_t = 200)]
    pub decisions: usize,
    #[arg(long, default_value = "fgd")]
    pub policy: String,
    #[arg(long, default_value_t = 42)]
    pub seed: u64,
    #[arg(long)]
    pub json: bool,
}

fn synthetic_nodes(n: usize, rng: &mut Rng) -> Vec<NodeSpec> {
    (0..n)
        .map(|idx| {
            // openb GPU nodes: 617 with 8 GPUs, 518 with 2, 54 with 4, 24 with 1.
            let draw = rng.below(1213);
            let (gpus, cpu) = match draw {
                0..617 => (8, 96_000),
                617..1135 => (2, 64_000),
                1135..1189 => (4, 64_000),
                _ => (1, 32_000),
            };
            NodeSpec {
                name: format!("node-{idx:05}"),
                cpu_milli: cpu,
                memory_mib: 393_216,
                gpus,
                gpu_model: Some(rng.below(4) as u16),
            }
        })
        .collect()
}

fn workload() -> Vec<PodRequest> {
    // Shapes and rough frequencies of the openb default pod list.
    let shape = |cpu: u64, num_gpu: u8, gpu_milli: u32| PodRequest {
        cpu_milli: cpu,
        memory_mib: 16_384,
        num_gpu,
        gpu_milli,
        gpu_models: vec![],
    };
    let mut pods = Vec::new();
    pods.extend(std::iter::repeat_n(shape(8_000, 1, 1000), 40));
    pods.extend(std::iter::repeat_n(shape(4_000, 1, 500), 20));
    pods.extend(std::iter::repeat_n(shape(6_000, 1, 250), 15));
    pods.extend(std::iter::repeat_n(shape(16_000, 2, 1000), 8));
    pods.extend(std::iter::repeat_n(shape(32_000, 8, 1000), 4));
    pods.extend(std::iter::repeat_n(shape(4_000, 0, 0), 13));
    pods
}

pub fn run(command: BenchCommand) -> Result<()> {
    let BenchCommand::Placement(args) = command;
    let policy = nephele_placement::Policy::parse(&args.policy)
        .ok_or_else(|| anyhow::anyhow!("unknown policy {:?}", args.policy))?;
    let mut rng = Rng::new(args.seed);
    let mut cluster = Cluster::new(synthetic_nodes(args.nodes, &mut rng));
    let pods = workload();
    let typical = TypicalPods::from_pods(&pods, 0.95);
    let priority = rng.permutation(args.nodes);
    cluster.set_priority(&priority);
    // Half-fill with random placements.
    let capacity = cluster.total_gpu_milli();
    let mut id = 0u64;
    while cluster.used_gpu_milli() * 2 < capacity {
        let pod = &pods[rng.below(pods.len() as u64) as usize];
        if let Ok(placement) = place(&cluster, pod, Policy::Random, &typical, &priority, &mut rng) {
            let _ = cluster.reserve(id, pod, &placement.binding);
        }
        id += 1;
    }
    let kinds = [
        (
            "single_gpu_pod",
            PodRequest {
                cpu_milli: 8_000,
                memory_mib: 16_384,
                num_gpu: 1,
                gpu_milli: 1000,
                gpu_models: vec![],
            },
        ),
        (
            "fractional_gpu_pod",
            PodRequest {
                cpu_milli: 4_000,
                memory_mib: 16_384,
                num_gpu: 1,
                gpu_milli: 500,
                gpu_models: vec![],
            },
        ),
    ];
    let mut results = Vec::new();
    for (name, pod) in kinds {
        let started = Instant::now();
        let mut placed = 0usize;
        for _ in 0..args.decisions {
            if let Ok(placement) = place(&cluster, &pod, policy, &typical, &priority, &mut rng) {
                if cluster.reserve(u64::MAX, &pod, &placement.binding).is_ok() {
                    placed += 1;
                    cluster.unreserve(u64::MAX);
                }
            }
        }
        let seconds = started.elapsed().as_secs_f64();
        results.push(serde_json::json!({
            "kind": name,
            "decisions": args.decisions,
            "placed": placed,
            "placements_per_sec": args.decisions as f64 / seconds,
            "mean_us": seconds * 1e6 / args.decisions as f64,
        }));
    }
    let single = results[0]["placements_per_sec"].as_f64().unwrap_or(0.0);
    let summary = serde_json::json!({
        "nodes": args.nodes,
        "policy": policy.name(),
        "placements_per_sec": single,
        "gpu_allocated_before": cluster.used_gpu_milli() as f64 / capacity as f64,
        "results": results,
        "threads": 1,
        "distinct_node_states": cluster.groups().count(),
    });
    if args.json {
        println!("{summary}");
    } else {
        println!(
            "{} nodes, policy {}, cluster {:.0}% allocated:",
            args.nodes,
            policy.name(),
            summary["gpu_allocated_before"].as_f64().unwrap_or(0.0) * 100.0
        );
        for result in summary["results"].as_array().into_iter().flatten() {
            println!(
                "  {:<20} {:>10.0} placements/s  ({:.1} µs each)",
                result["kind"].as_str().unwrap_or(""),
                result["placements_per_sec"].as_f64().unwrap_or(0.0),
                result["mean_us"].as_f64().unwrap_or(0.0)
            );
        }
    }
    Ok(())
}
