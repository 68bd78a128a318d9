//! Workload inflation, as in the FGD paper (see `../shared/docs/FGD-EVALUATION.md`), on
//! the Alibaba openb trace: the GPU node list, the default pod list shuffled by the seed
//! and inflated by random re-draws to 130% of GPU capacity, one scheduling attempt per
//! pod in order, no departures. After every pod it records arrived and allocated
//! milli-GPU and the cluster's fragmentation, and reports per arrived-% level the
//! unallocated GPU share (100% − allocated) and the fragmentation rate. Our generator is
//! SplitMix64, not Go's math/rand, so the sequences differ from the paper's for the same
//! seed numbers; the protocol is otherwise the same.

use std::collections::BTreeMap;

use nephele_placement::rng::Rng;
use nephele_placement::{place, Cluster, Policy, TypicalPods};
use serde::Serialize;

use crate::gpu_clustering::GpuClustering;
use crate::trace::Trace;

/// A policy of the study: the placement core's, or GpuClustering, a baseline only the
/// simulator has ([`crate::gpu_clustering`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StudyPolicy {
    Core(Policy),
    GpuClustering,
}

impl StudyPolicy {
    /// The FGD paper's six policies, first-fit and ours, in the order tables show them.
    pub const ALL: [StudyPolicy; 8] = [
        StudyPolicy::Core(Policy::Random),
        StudyPolicy::Core(Policy::FirstFit),
        StudyPolicy::Core(Policy::BestFit),
        StudyPolicy::Core(Policy::DotProduct),
        StudyPolicy::GpuClustering,
        StudyPolicy::Core(Policy::GpuPacking),
        StudyPolicy::Core(Policy::Fgd),
        StudyPolicy::Core(Policy::Ours),
    ];

    pub fn name(self) -> &'static str {
        match self {
            StudyPolicy::Core(policy) => policy.name(),
            StudyPolicy::GpuClustering => "gpu-clustering",
        }
    }

    pub fn parse(name: &str) -> Option<StudyPolicy> {
        if name == "gpu-clustering" {
            return Some(StudyPolicy::GpuClustering);
        }
        Policy::parse(name).map(StudyPolicy::Core)
    }
}

/// After every pod: (arrived %, allocated %, fragmentation % of capacity, fragmentation
/// / idle %).
pub type Series = Vec<(f64, f64, f64, f64)>;

/// One run: (arrived %, allocated %, fragmentation % of capacity, fragmentation / idle)
/// after every pod.
pub fn run_inflation(
    trace: &Trace,
    typical: &TypicalPods,
    policy: StudyPolicy,
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
    let mut clustering = (policy == StudyPolicy::GpuClustering)
        .then(|| GpuClustering::new(trace.nodes.len(), &priority));
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
        let placed = match (policy, clustering.as_ref()) {
            (StudyPolicy::Core(policy), _) => {
                place(&cluster, pod, policy, typical, &priority, &mut rng)
            }
            (StudyPolicy::GpuClustering, Some(clustering)) => {
                clustering.place(&cluster, pod, typical)
            }
            (StudyPolicy::GpuClustering, None) => unreachable!("made above for this policy"),
        };
        match placed {
            Ok(placement) => {
                let node = placement.binding.node;
                if cluster.reserve(id as u64, pod, &placement.binding).is_ok() {
                    if let Some(clustering) = clustering.as_mut() {
                        clustering.placed(node, pod);
                    }
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
pub fn by_level(series: &[(f64, f64, f64, f64)]) -> Vec<(u32, f64, f64, f64)> {
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
pub struct PolicySummary {
    pub name: String,
    /// 1 − allocated/capacity at 100% arrived GPU demand, mean over seeds.
    pub unallocated_gpu_share_at_100: f64,
    pub unallocated_gpu_share_at_100_sd: f64,
    pub fragmentation_ratio_at_100: f64,
    pub seeds: u64,
    pub seconds_per_run: f64,
    /// Pods that found no node before arrived demand reached 100%, per seed, by the
    /// reason most nodes gave.
    pub failed_pods_before_100: BTreeMap<&'static str, f64>,
}

pub fn mean_sd(values: &[f64]) -> (f64, f64) {
    let n = values.len().max(1) as f64;
    let mean = values.iter().sum::<f64>() / n;
    let var = values.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / n;
    (mean, var.sqrt())
}
