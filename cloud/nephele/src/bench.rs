//! `nephele bench placement`: placement throughput of the placement core; the method
//! is in `nephele_sim::bench` (shared with `cargo bench -p nephele-sim`).

use anyhow::Result;
use nephele_placement::Policy;
use nephele_sim::bench::placement_rounds;

#[derive(Debug, Clone, clap::Subcommand)]
pub enum BenchCommand {
    /// Placement throughput of the placement core.
    Placement(PlacementArgs),
    /// The inference runtime against onnxruntime, dynamic batching, int8 and offload.
    Inference(crate::bench_inference::InferenceArgs),
    /// Split vs local vs full offload over real QUIC through a shaped link.
    Split(crate::bench_split::SplitArgs),
    /// Thousands of agents on one control plane: memory and CPU per agent, heartbeat
    /// rate, time for a deployment to be Ready on all, offloaded requests per second.
    Fleet(crate::bench_fleet::FleetArgs),
    /// An hour of steady traffic on a real edge agent whose link to the control plane
    /// is cut now and then: the agent's and the control plane's memory over time.
    Soak(crate::bench_soak::SoakArgs),
}

#[derive(Debug, Clone, clap::Args)]
pub struct PlacementArgs {
    #[arg(long, default_value_t = 10_000)]
    pub nodes: usize,
    /// Decisions to time per kind of request (each keeps its reservation).
    #[arg(long, default_value_t = 2000)]
    pub decisions: usize,
    /// Identical rounds per kind; the median is reported with the range (one round
    /// lasts milliseconds, so one is at the mercy of whatever else the machine runs).
    #[arg(long, default_value_t = 5)]
    pub rounds: usize,
    #[arg(long, default_value = "fgd")]
    pub policy: String,
    #[arg(long, default_value_t = 42)]
    pub seed: u64,
    #[arg(long)]
    pub json: bool,
}

pub fn run(command: BenchCommand) -> Result<()> {
    let args = match command {
        BenchCommand::Placement(args) => args,
        BenchCommand::Inference(args) => return crate::bench_inference::run(args),
        BenchCommand::Split(args) => return crate::bench_split::run(args),
        BenchCommand::Fleet(args) => return crate::bench_fleet::run(args),
        BenchCommand::Soak(args) => return crate::bench_soak::run(args),
    };
    let policy = Policy::parse(&args.policy).ok_or_else(|| {
        anyhow::anyhow!("unknown policy {:?} (try fgd, ours, best-fit)", args.policy)
    })?;
    if args.nodes == 0 || args.decisions == 0 || args.rounds == 0 {
        anyhow::bail!("--nodes, --decisions and --rounds must be at least 1");
    }
    let report = placement_rounds(args.nodes, args.decisions, args.rounds, policy, args.seed);
    if args.json {
        println!("{}", serde_json::to_string(&report)?);
    } else {
        println!(
            "{} nodes ({} distinct states), policy {}, cluster {:.0}% allocated, 1 thread, median of {} rounds:",
            report.nodes,
            report.distinct_node_states,
            report.policy,
            report.gpu_allocated_before * 100.0,
            args.rounds
        );
        for r in &report.results {
            println!(
                "  {:<20} {:>10.0} decisions/s ({:.0}–{:.0}) {:>10.0} pods/s  ({:.1} µs each, first {:.0} µs, {}/{} placed)",
                r.kind,
                r.placements_per_sec,
                r.placements_per_sec_min,
                r.placements_per_sec_max,
                r.pods_per_sec,
                r.mean_us,
                r.first_decision_us,
                r.placed,
                r.decisions
            );
        }
    }
    Ok(())
}
