//! GpuClustering, the FGD paper's third baseline, as its simulator implements it
//! (`../shared/docs/FGD-EVALUATION.md`, 1.4): a GPU pod prefers nodes that already
//! hold pods of its own "affinity class" (`share-gpu` for a fraction of one GPU, else
//! `<n>-gpu`), then nodes mixing its class with others, then empty nodes, then nodes
//! of other classes only; within a band, fuller nodes first. CPU-only pods score 0
//! everywhere, so the node order decides. GPUs on the chosen node: best fit.
//!
//! It scores on which classes a node holds, which the placement core's node state does
//! not keep (nodes are grouped by resources left), so this baseline lives in the
//! simulator and tracks the classes itself.

use std::collections::BTreeMap;

use nephele_placement::{
    place_on, Cluster, Placement, PodRequest, Policy, TypicalPods, Unschedulable,
};

/// Total milli-GPU of the largest node of the trace the band offset is scaled by
/// (8 GPUs), as in the FGD simulator.
const MAX_NODE_GPU_MILLI: i64 = 8000;

/// A GPU pod's affinity class: 0 for a share of one GPU, else its GPU count.
fn class_of(pod: &PodRequest) -> Option<u8> {
    if pod.num_gpu == 0 {
        None
    } else if pod.num_gpu == 1 && pod.gpu_milli < 1000 {
        Some(0)
    } else {
        Some(pod.num_gpu)
    }
}

/// Per node, how many pods of each affinity class it holds.
#[derive(Debug, Clone, Default)]
pub struct GpuClustering {
    classes: Vec<BTreeMap<u8, u32>>,
    /// Nodes in tie-break order (lowest rank first).
    order: Vec<usize>,
}

impl GpuClustering {
    /// For `nodes` nodes with tie-break ranks `priority` (lower first).
    pub fn new(nodes: usize, priority: &[u32]) -> GpuClustering {
        let mut order: Vec<usize> = (0..nodes).collect();
        order.sort_by_key(|n| (priority.get(*n).copied().unwrap_or(u32::MAX), *n));
        GpuClustering {
            classes: vec![BTreeMap::new(); nodes],
            order,
        }
    }

    /// The band and in-band score of `node` for a pod of `class`.
    fn score(&self, cluster: &Cluster, node: usize, class: u8) -> i64 {
        let held = &self.classes[node];
        let band = match (held.contains_key(&class), held.len()) {
            (true, 1) => 75,
            (true, _) => 50,
            (false, 0) => 25,
            (false, _) => 0,
        };
        let gpu_left: i64 = cluster.state[node]
            .gpu_left
            .iter()
            .map(|left| i64::from(*left))
            .sum();
        band + 25 * (MAX_NODE_GPU_MILLI - gpu_left) / MAX_NODE_GPU_MILLI
    }

    /// Chooses a node for `pod`: the feasible node with the highest score, the first in
    /// tie-break order among equals, GPUs by best fit. Does not reserve.
    pub fn place(
        &self,
        cluster: &Cluster,
        pod: &PodRequest,
        typical: &TypicalPods,
    ) -> Result<Placement, Unschedulable> {
        let class = class_of(pod);
        let mut best: Option<(i64, usize)> = None;
        let mut rejected: BTreeMap<nephele_placement::Reason, u32> = BTreeMap::new();
        for &node in &self.order {
            if let Err(reason) = cluster.check(node, pod) {
                *rejected.entry(reason).or_default() += 1;
                continue;
            }
            let score = class.map_or(0, |c| self.score(cluster, node, c));
            if best.is_none_or(|(top, _)| score > top) {
                best = Some((score, node));
            }
        }
        match best {
            Some((_, node)) => place_on(cluster, node, pod, Policy::BestFit, typical),
            None => Err(Unschedulable { rejected }),
        }
    }

    /// `pod` was placed on `node`.
    pub fn placed(&mut self, node: usize, pod: &PodRequest) {
        if let (Some(class), Some(held)) = (class_of(pod), self.classes.get_mut(node)) {
            *held.entry(class).or_default() += 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use nephele_placement::NodeSpec;

    fn node(name: &str) -> NodeSpec {
        NodeSpec {
            name: name.into(),
            cpu_milli: 64_000,
            memory_mib: 262_144,
            gpus: 8,
            gpu_model: Some(0),
            ..NodeSpec::default()
        }
    }

    fn pod(num_gpu: u8, gpu_milli: u32) -> PodRequest {
        PodRequest {
            cpu_milli: 1000,
            memory_mib: 1024,
            num_gpu,
            gpu_milli,
            ..PodRequest::default()
        }
    }

    #[test]
    fn gpu_pods_cluster_by_class_and_cpu_pods_follow_the_node_order() {
        let mut cluster = Cluster::new(vec![node("a"), node("b"), node("c")]);
        // Tie-break order: c, b, a.
        let priority = [2, 1, 0];
        let typical = TypicalPods::from_pods(&[pod(1, 1000)], 0.95);
        let mut clustering = GpuClustering::new(3, &priority);
        let put =
            |cluster: &mut Cluster, clustering: &mut GpuClustering, id: u64, p: PodRequest| {
                let placed = clustering.place(cluster, &p, &typical).expect("fits");
                cluster.reserve(id, &p, &placed.binding).expect("reserved");
                clustering.placed(placed.binding.node, &p);
                placed.binding.node
            };
        // Empty cluster: every node in the same band, the first in order wins.
        assert_eq!(put(&mut cluster, &mut clustering, 1, pod(1, 500)), 2);
        // A 2-GPU pod avoids the node holding only shares (band 0-25) for an empty one.
        assert_eq!(put(&mut cluster, &mut clustering, 2, pod(2, 1000)), 1);
        // Another share goes where shares are.
        assert_eq!(put(&mut cluster, &mut clustering, 3, pod(1, 250)), 2);
        // A CPU-only pod scores 0 everywhere: the first node in order.
        assert_eq!(put(&mut cluster, &mut clustering, 4, pod(0, 0)), 2);
        // Nothing fits: the reasons are counted per node.
        let huge = PodRequest {
            cpu_milli: 1_000_000,
            ..pod(1, 1000)
        };
        let why = clustering.place(&cluster, &huge, &typical).unwrap_err();
        assert_eq!(why.rejected.values().sum::<u32>(), 3);
    }
}
