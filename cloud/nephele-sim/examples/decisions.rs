//! `cargo run --release -p nephele-sim --example decisions -- POLICY [ROUNDS] [DECISIONS] [KIND] [NODES]`:
//! the placement bench's four kinds of decision at 10,000 nodes (or NODES), built to compare
//! builds of the placement core with each other, which the bench itself is too short
//! and too noisy for on a shared machine.
//!
//! - The cluster is filled directly (each pod on a random node, best-fit GPUs), not by
//!   placing through `place` as the bench does, so a run under callgrind spends its
//!   time in the decisions: `valgrind --tool=callgrind --toggle-collect='*decisions::run_*'
//!   target/release/examples/decisions ours 1` counts their instructions, which do not
//!   depend on the machine's speed; `run_first` is the first decision of a kind (it
//!   builds the shape's index), `run_rest` the others. Spread pods, scored node by
//!   node, run a twentieth of DECISIONS.
//! - With ROUNDS > 1 each kind runs ROUNDS times on a fresh copy of the filled cluster
//!   and the median wall time per decision is printed, first decision excluded.
//!
//! It uses only the API the placement core has had since before issue 18, so the same
//! file builds in an older checkout: copy it into that checkout's `examples/`, build
//! each checkout in its own target folder (a shared one mixes their crates up), and
//! alternate the runs.

use std::time::Instant;

use nephele_placement::gang::{place_gang, GangRequest, Topology};
use nephele_placement::rng::Rng;
use nephele_placement::{
    place, Binding, Cluster, DomainLevel, PodRequest, Policy, Spread, TypicalPods, MILLI_PER_GPU,
};
use nephele_sim::bench::{openb_like_workload, synthetic_nodes};

const KINDS: [&str; 4] = [
    "single_gpu_pod",
    "fractional_gpu_pod",
    "gang_8x1_gpu",
    "spread_gpu_pod",
];

fn pod(cpu_milli: u64, num_gpu: u8, gpu_milli: u32) -> PodRequest {
    PodRequest {
        cpu_milli,
        memory_mib: 16_384,
        num_gpu,
        gpu_milli,
        ..PodRequest::default()
    }
}

/// Half the cluster's GPUs taken by openb-like pods on random nodes, and the nodes'
/// priority order.
fn filled(nodes: usize, rng: &mut Rng) -> (Cluster, Vec<u32>) {
    let mut cluster = Cluster::new(synthetic_nodes(nodes, rng));
    let priority = rng.permutation(nodes);
    cluster.set_priority(&priority);
    let pods = openb_like_workload();
    let capacity = cluster.total_gpu_milli();
    let mut used = cluster.used_gpu_milli();
    let mut id = 0u64;
    while used * 2 < capacity {
        let pod = &pods[rng.below(pods.len() as u64) as usize];
        let node = rng.below(nodes as u64) as usize;
        let left = &cluster.state[node].gpu_left;
        let fitting = (0..left.len()).filter(|g| left[*g] >= pod.gpu_milli);
        let gpus: Vec<(u8, u32)> = if pod.gpu_milli < MILLI_PER_GPU {
            fitting
                .min_by_key(|g| (left[*g], *g))
                .map(|g| vec![(g as u8, pod.gpu_milli)])
                .unwrap_or_default()
        } else {
            fitting
                .take(usize::from(pod.num_gpu))
                .map(|g| (g as u8, pod.gpu_milli))
                .collect()
        };
        if gpus.len() == usize::from(pod.num_gpu) {
            let binding = Binding {
                node,
                gpus,
                mig: None,
            };
            if cluster.reserve(id, pod, &binding).is_ok() {
                used += pod.gpu_total();
            }
        }
        id += 1;
    }
    (cluster, priority)
}

struct Bench<'a> {
    policy: Policy,
    typical: &'a TypicalPods,
    priority: &'a [u32],
}

impl Bench<'_> {
    /// One decision of `kind`, its reservation kept; pods placed.
    fn decide(&self, kind: &str, cluster: &mut Cluster, decision: usize, rng: &mut Rng) -> usize {
        let id = 1_000_000_000 + decision as u64 * 8;
        if kind == "gang_8x1_gpu" {
            let gang = GangRequest {
                first_id: id,
                members: vec![pod(8_000, 1, 1000); 8],
                topology: Topology::SameNode { hard: false },
            };
            return place_gang(
                cluster,
                &gang,
                self.policy,
                self.typical,
                self.priority,
                rng,
            )
            .map_or(0, |_| 8);
        }
        let request = match kind {
            "single_gpu_pod" => pod(8_000, 1, 1000),
            "spread_gpu_pod" => PodRequest {
                spread: Some(Spread {
                    job: 7,
                    level: DomainLevel::Node,
                }),
                ..pod(8_000, 1, 1000)
            },
            _ => pod(4_000, 1, 500),
        };
        let placed = place(
            cluster,
            &request,
            self.policy,
            self.typical,
            self.priority,
            rng,
        )
        .is_ok_and(|p| cluster.reserve(id, &request, &p.binding).is_ok());
        usize::from(placed)
    }
}

#[inline(never)]
fn run_first(bench: &Bench, kind: &str, cluster: &mut Cluster, rng: &mut Rng) -> usize {
    bench.decide(kind, cluster, 0, rng)
}

#[inline(never)]
fn run_rest(
    bench: &Bench,
    kind: &str,
    cluster: &mut Cluster,
    decisions: usize,
    rng: &mut Rng,
) -> usize {
    (1..decisions)
        .map(|decision| bench.decide(kind, cluster, decision, rng))
        .sum()
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let policy = args.first().and_then(|name| Policy::parse(name)).expect(
        "usage: decisions POLICY [ROUNDS] [DECISIONS] [KIND|all] [NODES], e.g. decisions ours 9",
    );
    let rounds: usize = args.get(1).map_or(1, |r| r.parse().expect("ROUNDS"));
    let decisions: usize = args.get(2).map_or(2_000, |d| d.parse().expect("DECISIONS"));
    let only = args.get(3).filter(|kind| *kind != "all");
    let nodes: usize = args.get(4).map_or(10_000, |n| n.parse().expect("NODES"));
    let mut rng = Rng::new(42);
    let (cluster, priority) = filled(nodes, &mut rng);
    let typical = TypicalPods::from_pods(&openb_like_workload(), 0.95);
    let bench = Bench {
        policy,
        typical: &typical,
        priority: &priority,
    };
    println!("kind,decisions,pods_placed,median_ns_per_decision,min_ns,max_ns");
    for kind in KINDS
        .into_iter()
        .filter(|k| only.is_none_or(|only| only == k))
    {
        let mut times = Vec::new();
        // A spread pod is scored node by node (about 10,000 scorings a decision).
        let decisions = if kind == "spread_gpu_pod" {
            (decisions / 20).max(2)
        } else {
            decisions
        };
        let mut placed = 0;
        for round in 0..rounds {
            let mut working = cluster.clone();
            let mut rng = Rng::new(7 + round as u64);
            run_first(&bench, kind, &mut working, &mut rng);
            let started = Instant::now();
            placed = run_rest(&bench, kind, &mut working, decisions, &mut rng);
            times.push(started.elapsed().as_nanos() as f64 / (decisions - 1) as f64);
        }
        times.sort_by(f64::total_cmp);
        println!(
            "{kind},{},{placed},{:.0},{:.0},{:.0}",
            decisions - 1,
            times[times.len() / 2],
            times[0],
            times[times.len() - 1]
        );
    }
}
