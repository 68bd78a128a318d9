//! Scoring policies and the place function.
//!
//! | policy       | node score (higher is better)                                    | GPU choice for a shared GPU |
//! |--------------|------------------------------------------------------------------|-----------------------------|
//! | `random`     | one feasible node at random                                       | random among fitting        |
//! | `first-fit`  | none: the node priority order decides                             | best fit                    |
//! | `best-fit`   | least CPU and GPU left after placement (normalised 0..100)        | best fit                    |
//! | `dot-product`| smallest dot product of node-left and pod vectors                 | best fit                    |
//! | `gpu-packing`| already-shared GPUs, then used nodes, then the smallest free node | best fit                    |
//! | `fgd`        | 100·sigmoid(ΔF/1000), ΔF = fragmentation before − after            | the GPU with the best ΔF    |
//! | `ours`       | memory-aware ΔF at 0.1-GPU resolution (no sigmoid), then priority | the GPU with the best ΔF    |
//!
//! FGD's integer sigmoid leaves about 100 score levels, so many nodes tie and the fixed
//! node order decides. `ours` differs in two ways: its fragmentation measure also
//! counts a node's GPUs as lost to a typical pod when the pod's memory no longer fits
//! there (FGD looks at CPU and GPU only, yet memory runs out on GPU nodes too), and it
//! scores the fragmentation change itself at 100 milli-GPU resolution. (Tried and
//! measured worse on openb: the exact change, FGD with packing or CPU-fit tie-breaks,
//! a GPU-volume-weighted target workload; see the README's placement section.)

use std::collections::{BTreeMap, HashMap};

use crate::cluster::{Binding, Cluster, Score};
use crate::fragmentation::TypicalPods;
use crate::model::{PodRequest, Reason, MILLI_PER_GPU};
use crate::rng::Rng;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Policy {
    Random,
    FirstFit,
    BestFit,
    DotProduct,
    GpuPacking,
    Fgd,
    Ours,
}

impl Policy {
    pub const ALL: [Policy; 7] = [
        Policy::Random,
        Policy::FirstFit,
        Policy::BestFit,
        Policy::DotProduct,
        Policy::GpuPacking,
        Policy::Fgd,
        Policy::Ours,
    ];

    /// The policies whose plans depend on no random draw (all but `Random`).
    pub const DETERMINISTIC: [Policy; 6] = [
        Policy::FirstFit,
        Policy::BestFit,
        Policy::DotProduct,
        Policy::GpuPacking,
        Policy::Fgd,
        Policy::Ours,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Policy::Random => "random",
            Policy::FirstFit => "first-fit",
            Policy::BestFit => "best-fit",
            Policy::DotProduct => "dot-product",
            Policy::GpuPacking => "gpu-packing",
            Policy::Fgd => "fgd",
            Policy::Ours => "ours",
        }
    }

    pub fn parse(name: &str) -> Option<Policy> {
        Policy::ALL.into_iter().find(|p| p.name() == name)
    }
}

/// The chosen node and GPUs.
#[derive(Debug, Clone, PartialEq)]
pub struct Placement {
    pub binding: Binding,
}

/// Why a pod was not placed: for each reason, how many nodes rejected it for it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Unschedulable {
    pub rejected: BTreeMap<Reason, u32>,
}

impl Unschedulable {
    /// Nodes considered.
    pub fn nodes(&self) -> u32 {
        self.rejected.values().sum()
    }
}

/// The answer to "why is this pending?", in the form Kubernetes made familiar:
/// `0/3 nodes can take it: 1 insufficient cpu, 2 insufficient gpu`.
impl std::fmt::Display for Unschedulable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut reasons: Vec<(&Reason, &u32)> = self.rejected.iter().collect();
        reasons.sort_by(|a, b| b.1.cmp(a.1).then(a.0.cmp(b.0)));
        let parts: Vec<String> = reasons
            .iter()
            .map(|(reason, n)| format!("{n} {}", reason.as_str()))
            .collect();
        write!(
            f,
            "0/{} nodes can take it: {}",
            self.nodes(),
            parts.join(", ")
        )
    }
}

const MAX_SPEC_CPU: f64 = 128_000.0;
const MAX_SPEC_GPU: f64 = 8_000.0;

/// GPUs for a pod on a node: whole-GPU pods take the lowest-index free GPUs; a shared
/// pod takes the fitting GPU with the least room left (lowest index on ties).
fn best_fit_gpus(gpu_left: &[u32], pod: &PodRequest) -> Vec<(u8, u32)> {
    if pod.num_gpu == 0 {
        return Vec::new();
    }
    if pod.gpu_milli >= MILLI_PER_GPU || pod.num_gpu > 1 {
        let chosen: Vec<(u8, u32)> = gpu_left
            .iter()
            .enumerate()
            .filter(|(_, left)| **left >= pod.gpu_milli)
            .take(usize::from(pod.num_gpu))
            .map(|(idx, _)| (idx as u8, pod.gpu_milli))
            .collect();
        return if chosen.len() == usize::from(pod.num_gpu) {
            chosen
        } else {
            Vec::new()
        };
    }
    gpu_left
        .iter()
        .enumerate()
        .filter(|(_, left)| **left >= pod.gpu_milli)
        .min_by_key(|(idx, left)| (**left, *idx))
        .map(|(idx, _)| vec![(idx as u8, pod.gpu_milli)])
        .unwrap_or_default()
}

fn after(gpu_left: &[u32], gpus: &[(u8, u32)]) -> Vec<u32> {
    let mut left = gpu_left.to_vec();
    for (idx, milli) in gpus {
        left[usize::from(*idx)] -= milli;
    }
    left
}

/// Candidate GPU choices that FGD-style policies evaluate: every fitting GPU for a
/// shared pod, the best-fit choice otherwise.
fn candidate_gpus(gpu_left: &[u32], pod: &PodRequest) -> Vec<Vec<(u8, u32)>> {
    if pod.num_gpu == 1 && pod.gpu_milli < MILLI_PER_GPU {
        gpu_left
            .iter()
            .enumerate()
            .filter(|(_, left)| **left >= pod.gpu_milli)
            .map(|(idx, _)| vec![(idx as u8, pod.gpu_milli)])
            .collect()
    } else {
        vec![best_fit_gpus(gpu_left, pod)]
    }
}

fn sigmoid(x: f64) -> f64 {
    1.0 / (1.0 + (-x).exp())
}

/// GPUs chosen on a node: (GPU index, milli-GPU taken).
type GpuChoice = Vec<(u8, u32)>;

/// What makes two nodes score the same: GPU model, CPU left, GPU left per GPU.
type StateKey<'a> = (Option<u16>, u64, u64, &'a [u32]);

/// Scores `pod` on one node state; returns the score and the GPUs to take.
fn score_node(
    cluster: &Cluster,
    node: usize,
    pod: &PodRequest,
    policy: Policy,
    typical: &TypicalPods,
) -> (Score, Vec<(u8, u32)>) {
    let spec = &cluster.nodes[node];
    let state = &cluster.state[node];
    let gpu_left_total: u64 = state.gpu_left.iter().map(|g| u64::from(*g)).sum();
    match policy {
        Policy::Random | Policy::FirstFit => ((0, 0), best_fit_gpus(&state.gpu_left, pod)),
        Policy::BestFit => {
            let cpu_after = state.cpu_left.saturating_sub(pod.cpu_milli) as f64 / MAX_SPEC_CPU;
            let gpu_after = gpu_left_total.saturating_sub(pod.gpu_total()) as f64 / MAX_SPEC_GPU;
            let raw = (100.0 * (1.0 - (0.5 * cpu_after + 0.5 * gpu_after))) as i64;
            ((raw, 0), best_fit_gpus(&state.gpu_left, pod))
        }
        Policy::DotProduct => {
            let dot = (state.cpu_left as f64 / MAX_SPEC_CPU)
                * (pod.cpu_milli as f64 / MAX_SPEC_CPU)
                + (gpu_left_total as f64 / MAX_SPEC_GPU) * (pod.gpu_total() as f64 / MAX_SPEC_GPU);
            (
                ((100.0 * (1.0 - dot / 2.0)) as i64, 0),
                best_fit_gpus(&state.gpu_left, pod),
            )
        }
        Policy::GpuPacking => {
            let gpus = best_fit_gpus(&state.gpu_left, pod);
            if pod.num_gpu == 0 {
                return ((0, 0), gpus);
            }
            let shared: Vec<u32> = state
                .gpu_left
                .iter()
                .copied()
                .filter(|left| *left < MILLI_PER_GPU && *left > 0)
                .collect();
            let node_used = state.gpu_left.iter().any(|left| *left < MILLI_PER_GPU);
            let uses_shared = gpus
                .iter()
                .all(|(idx, _)| state.gpu_left[usize::from(*idx)] < MILLI_PER_GPU);
            let score = if uses_shared && !shared.is_empty() {
                let left_sum: u64 = shared
                    .iter()
                    .map(|l| u64::from(*l) * 100 / u64::from(MILLI_PER_GPU))
                    .sum();
                (100 - left_sum as i64 / 10).max(50)
            } else if node_used {
                let free_used = gpus
                    .iter()
                    .filter(|(idx, _)| state.gpu_left[usize::from(*idx)] == MILLI_PER_GPU)
                    .count() as i64;
                (50 - free_used).max(33)
            } else {
                33 - i64::from(spec.gpus)
            };
            ((score, 0), gpus)
        }
        Policy::Fgd | Policy::Ours => {
            let memory = (policy == Policy::Ours).then_some(state.memory_left);
            let before = typical.node_fragmentation_with_memory(
                spec,
                state.cpu_left,
                memory,
                &state.gpu_left,
            );
            let cpu_after = state.cpu_left - pod.cpu_milli;
            let memory_after = memory.map(|m| m - pod.memory_mib);
            let mut best: Option<(Score, Vec<(u8, u32)>)> = None;
            for gpus in candidate_gpus(&state.gpu_left, pod) {
                let left_after = after(&state.gpu_left, &gpus);
                let delta = before
                    - typical.node_fragmentation_with_memory(
                        spec,
                        cpu_after,
                        memory_after,
                        &left_after,
                    );
                let fgd = (100.0 * sigmoid(delta / 1000.0)) as i64;
                let score = if policy == Policy::Fgd {
                    (fgd, 0)
                } else {
                    // The exact change at 0.1-GPU resolution: about 100x more levels
                    // than FGD's integer sigmoid, so fewer ties are left to chance.
                    ((delta / 100.0).round() as i64, 0)
                };
                if best.as_ref().is_none_or(|(current, _)| score > *current) {
                    best = Some((score, gpus));
                }
            }
            best.unwrap_or(((0, 0), Vec::new()))
        }
    }
}

/// Places one pod: filter, score, select (ties: lowest `priority[node]`), choose GPUs.
/// Does not reserve; the caller commits with [`Cluster::reserve`].
///
/// When `priority` is the cluster's own ([`Cluster::set_priority`]), nodes are visited
/// by group of identical state, each group filtered and scored once; otherwise node by
/// node. Both give the same placement (property-tested).
pub fn place(
    cluster: &Cluster,
    pod: &PodRequest,
    policy: Policy,
    typical: &TypicalPods,
    priority: &[u32],
    rng: &mut Rng,
) -> Result<Placement, Unschedulable> {
    if policy != Policy::Random && priority == cluster.priority() {
        return place_grouped(cluster, pod, policy, typical);
    }
    let mut rejected: BTreeMap<Reason, u32> = BTreeMap::new();
    let mut feasible = Vec::new();
    for node in 0..cluster.nodes.len() {
        match cluster.check(node, pod) {
            Ok(()) => feasible.push(node),
            Err(reason) => *rejected.entry(reason).or_default() += 1,
        }
    }
    if feasible.is_empty() {
        return Err(Unschedulable { rejected });
    }
    if policy == Policy::Random {
        let node = feasible[rng.below(feasible.len() as u64) as usize];
        let state = &cluster.state[node];
        let fitting: Vec<usize> = (0..state.gpu_left.len())
            .filter(|g| state.gpu_left[*g] >= pod.gpu_milli)
            .collect();
        let gpus = if pod.num_gpu == 1 && pod.gpu_milli < MILLI_PER_GPU {
            vec![(
                fitting[rng.below(fitting.len() as u64) as usize] as u8,
                pod.gpu_milli,
            )]
        } else {
            best_fit_gpus(&state.gpu_left, pod)
        };
        return Ok(Placement {
            binding: Binding { node, gpus },
        });
    }
    // Nodes in identical states score identically: score each state once.
    let mut memo: HashMap<StateKey, (Score, GpuChoice)> = HashMap::new();
    let mut best: Option<(Score, u32, usize, GpuChoice)> = None;
    for &node in &feasible {
        let state = &cluster.state[node];
        // Memory only matters to the memory-aware objective of `ours`.
        let memory_key = if policy == Policy::Ours {
            state.memory_left
        } else {
            0
        };
        let key = (
            cluster.nodes[node].gpu_model,
            state.cpu_left,
            memory_key,
            state.gpu_left.as_slice(),
        );
        let (score, gpus) = memo
            .entry(key)
            .or_insert_with(|| score_node(cluster, node, pod, policy, typical))
            .clone();
        let rank = priority.get(node).copied().unwrap_or(node as u32);
        let better = match &best {
            None => true,
            Some((best_score, best_rank, _, _)) => {
                score > *best_score || (score == *best_score && rank < *best_rank)
            }
        };
        if better {
            best = Some((score, rank, node, gpus));
        }
    }
    let Some((_, _, node, gpus)) = best else {
        return Err(Unschedulable { rejected });
    };
    // BestFit normalises scores min-max over feasible nodes in the paper; that does not
    // change the order, so the argmax above is the same node.
    Ok(Placement {
        binding: Binding { node, gpus },
    })
}

/// The indexed placement path: the best feasible group comes from the shape's index
/// (see `Cluster::best_for_shape`), which scores only groups it has not seen; a full
/// scan over groups runs only to explain a failure.
fn place_grouped(
    cluster: &Cluster,
    pod: &PodRequest,
    policy: Policy,
    typical: &TypicalPods,
) -> Result<Placement, Unschedulable> {
    let shape = cluster.shape_id(pod, policy as u8, typical);
    let best = cluster.best_for_shape(shape, |node| {
        cluster
            .check(node, pod)
            .ok()
            .map(|()| score_node(cluster, node, pod, policy, typical).0)
    });
    let Some((_, node)) = best else {
        let mut rejected: BTreeMap<Reason, u32> = BTreeMap::new();
        for group in cluster.groups() {
            if let Some((_, node)) = group.first() {
                if let Err(reason) = cluster.check(node, pod) {
                    *rejected.entry(reason).or_default() += group.members.len() as u32;
                }
            }
        }
        return Err(Unschedulable { rejected });
    };
    let (_, gpus) = score_node(cluster, node, pod, policy, typical);
    Ok(Placement {
        binding: Binding { node, gpus },
    })
}

/// Places one pod on one given node (a gang member that must join its anchor): the
/// node's own filter answer and best GPU choice under `policy`.
pub fn place_on(
    cluster: &Cluster,
    node: usize,
    pod: &PodRequest,
    policy: Policy,
    typical: &TypicalPods,
) -> Result<Placement, Unschedulable> {
    if node >= cluster.nodes.len() {
        return Err(Unschedulable::default());
    }
    if let Err(reason) = cluster.check(node, pod) {
        return Err(Unschedulable {
            rejected: BTreeMap::from([(reason, 1)]),
        });
    }
    let policy = if policy == Policy::Random {
        Policy::FirstFit
    } else {
        policy
    };
    let (_, gpus) = score_node(cluster, node, pod, policy, typical);
    Ok(Placement {
        binding: Binding { node, gpus },
    })
}
