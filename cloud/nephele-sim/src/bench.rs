//! Placement throughput, shared by `cargo bench -p nephele-sim` and
//! `nephele bench placement`.
//!
//! The cluster is synthetic but shaped like the openb GPU nodes (8-, 2-, 4- and 1-GPU
//! nodes in the trace's proportions, four GPU models), half-filled by random placements
//! of openb-like pods so node states differ. Then, on one thread, each kind of request
//! is placed `decisions` times on its own copy of that cluster: every decision is
//! filter + score + select + reserve, and the reservation is **kept**, so each decision
//! sees the state the previous one left (no reserve/release loop that would let a
//! cache see the same state again). The first decision of each kind, which builds the
//! shape's index from every node group, is reported apart as `first_decision_us`.

use std::time::Instant;

use nephele_placement::gang::{place_gang, GangRequest, Topology};
use nephele_placement::rng::Rng;
use nephele_placement::{
    place, Cluster, DomainLevel, NodeSpec, PodRequest, Policy, Spread, TypicalPods,
};
use serde::Serialize;

/// A cluster of `n` nodes in the openb GPU-node mix.
pub fn synthetic_nodes(n: usize, rng: &mut Rng) -> Vec<NodeSpec> {
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
                ..NodeSpec::default()
            }
        })
        .collect()
}

fn pod(cpu_milli: u64, num_gpu: u8, gpu_milli: u32) -> PodRequest {
    PodRequest {
        cpu_milli,
        memory_mib: 16_384,
        num_gpu,
        gpu_milli,
        ..PodRequest::default()
    }
}

/// Shapes and rough frequencies of the openb default pod list.
pub fn openb_like_workload() -> Vec<PodRequest> {
    let mut pods = Vec::new();
    pods.extend(std::iter::repeat_n(pod(8_000, 1, 1000), 40));
    pods.extend(std::iter::repeat_n(pod(4_000, 1, 500), 20));
    pods.extend(std::iter::repeat_n(pod(6_000, 1, 250), 15));
    pods.extend(std::iter::repeat_n(pod(16_000, 2, 1000), 8));
    pods.extend(std::iter::repeat_n(pod(32_000, 8, 1000), 4));
    pods.extend(std::iter::repeat_n(pod(4_000, 0, 0), 13));
    pods
}

#[derive(Debug, Clone, Serialize)]
pub struct KindResult {
    pub kind: &'static str,
    pub decisions: usize,
    /// Decisions that found a place.
    pub placed: usize,
    /// Decisions per second (a gang counts once).
    pub placements_per_sec: f64,
    /// Pods per second (a gang counts its members).
    pub pods_per_sec: f64,
    pub mean_us: f64,
    pub first_decision_us: f64,
    pub gpu_allocated_after: f64,
}

#[derive(Debug, Clone, Serialize)]
pub struct PlacementBench {
    pub nodes: usize,
    pub policy: &'static str,
    /// Single whole-GPU pods per second: the headline figure.
    pub placements_per_sec: f64,
    pub gpu_allocated_before: f64,
    pub distinct_node_states: usize,
    pub threads: u32,
    pub results: Vec<KindResult>,
}

/// Runs the three kinds (single whole-GPU pod, fractional-GPU pod, 8-member gang with a
/// same-node preference) at `nodes` nodes.
pub fn placement(nodes: usize, decisions: usize, policy: Policy, seed: u64) -> PlacementBench {
    let mut rng = Rng::new(seed);
    let mut cluster = Cluster::new(synthetic_nodes(nodes, &mut rng));
    let pods = openb_like_workload();
    let typical = TypicalPods::from_pods(&pods, 0.95).with_supply(&cluster.nodes);
    let priority = rng.permutation(nodes);
    cluster.set_priority(&priority);
    let capacity = cluster.total_gpu_milli().max(1);
    let mut id = 0u64;
    while cluster.used_gpu_milli() * 2 < capacity {
        let pod = &pods[rng.below(pods.len() as u64) as usize];
        if let Ok(placement) = place(&cluster, pod, Policy::Random, &typical, &priority, &mut rng) {
            let _ = cluster.reserve(id, pod, &placement.binding);
        }
        id += 1;
    }
    let before = cluster.used_gpu_milli() as f64 / capacity as f64;
    let states = cluster.groups().count();
    let mut results = Vec::new();
    let gang_member = pod(8_000, 1, 1000);
    for kind in [
        "single_gpu_pod",
        "fractional_gpu_pod",
        "gang_8x1_gpu",
        "spread_gpu_pod",
    ] {
        let mut working = cluster.clone();
        let mut placed = 0usize;
        let mut members = 0usize;
        let mut first_us = 0.0;
        let started = Instant::now();
        for decision in 0..decisions {
            let first = Instant::now();
            let next_id = 1_000_000_000 + (decision as u64) * 8;
            let ok = match kind {
                "gang_8x1_gpu" => {
                    let gang = GangRequest {
                        first_id: next_id,
                        members: vec![gang_member.clone(); 8],
                        topology: Topology::SameNode { hard: false },
                    };
                    let ok = place_gang(&mut working, &gang, policy, &typical, &priority, &mut rng)
                        .is_ok();
                    if ok {
                        members += 8;
                    }
                    ok
                }
                _ => {
                    let request = match kind {
                        "single_gpu_pod" => pod(8_000, 1, 1000),
                        // Replicas of one service spread over nodes: the score depends
                        // on where the others are, so it takes the node-by-node path.
                        "spread_gpu_pod" => PodRequest {
                            spread: Some(Spread {
                                job: 7,
                                level: DomainLevel::Node,
                            }),
                            ..pod(8_000, 1, 1000)
                        },
                        _ => pod(4_000, 1, 500),
                    };
                    let ok = place(&working, &request, policy, &typical, &priority, &mut rng)
                        .is_ok_and(|p| working.reserve(next_id, &request, &p.binding).is_ok());
                    if ok {
                        members += 1;
                    }
                    ok
                }
            };
            if decision == 0 {
                first_us = first.elapsed().as_secs_f64() * 1e6;
            }
            placed += usize::from(ok);
        }
        let seconds = started.elapsed().as_secs_f64().max(1e-9);
        results.push(KindResult {
            kind,
            decisions,
            placed,
            placements_per_sec: decisions as f64 / seconds,
            pods_per_sec: members as f64 / seconds,
            mean_us: seconds * 1e6 / decisions.max(1) as f64,
            first_decision_us: first_us,
            gpu_allocated_after: working.used_gpu_milli() as f64 / capacity as f64,
        });
    }
    PlacementBench {
        nodes,
        policy: policy.name(),
        placements_per_sec: results[0].placements_per_sec,
        gpu_allocated_before: before,
        distinct_node_states: states,
        threads: 1,
        results,
    }
}
