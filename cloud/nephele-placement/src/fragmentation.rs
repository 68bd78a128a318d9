//! The fragmentation measure of FGD (Weng et al., ATC'23): how much of a node's idle GPU
//! capacity the typical workload could not use. Used as FGD's objective and as the
//! reported metric of `nephele sim inflation`.

use std::collections::BTreeMap;

use crate::cluster::NodeState;
use crate::model::{GpuModel, NodeSpec, PodRequest};

/// The grouping key of a pod shape: (cpu, gpu milli, gpu count, models).
type Shape = (u64, u32, u8, Vec<GpuModel>);

/// One class of typical pod and its share of the workload.
#[derive(Debug, Clone, PartialEq)]
pub struct TypicalPod {
    pub cpu_milli: u64,
    pub num_gpu: u8,
    pub gpu_milli: u32,
    pub gpu_models: Vec<GpuModel>,
    /// Mean memory of the pods in the class (the grouping ignores memory).
    pub memory_mib: u64,
    pub share: f64,
}

/// The target workload: the most common pod shapes covering `threshold` of the pods.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct TypicalPods {
    pub classes: Vec<TypicalPod>,
}

impl TypicalPods {
    /// Groups pods by (cpu, gpu milli, gpu count, models), memory ignored; keeps the most
    /// frequent groups until their cumulative share reaches `threshold` (0..=1), and
    /// renormalises their shares to sum to 1. Ties in count go to larger shapes first.
    pub fn from_pods(pods: &[PodRequest], threshold: f64) -> TypicalPods {
        let mut counts: BTreeMap<Shape, (u64, u64)> = BTreeMap::new();
        for pod in pods {
            let shape = (
                pod.cpu_milli,
                pod.gpu_milli,
                pod.num_gpu,
                pod.gpu_models.clone(),
            );
            let entry = counts.entry(shape).or_default();
            entry.0 += 1;
            entry.1 += pod.memory_mib;
        }
        let mut groups: Vec<(Shape, (u64, u64))> = counts.into_iter().collect();
        groups.sort_by(|a, b| b.1 .0.cmp(&a.1 .0).then_with(|| b.0.cmp(&a.0)));
        let total = pods.len().max(1) as f64;
        let mut kept = Vec::new();
        let mut cumulative = 0.0;
        for ((cpu_milli, gpu_milli, num_gpu, gpu_models), (count, memory_sum)) in groups {
            if cumulative >= threshold - 1e-9 {
                break;
            }
            cumulative += count as f64 / total;
            kept.push(TypicalPod {
                cpu_milli,
                num_gpu,
                gpu_milli,
                gpu_models,
                memory_mib: memory_sum / count.max(1),
                share: count as f64,
            });
        }
        let sum: f64 = kept.iter().map(|k| k.share).sum();
        for class in &mut kept {
            class.share /= sum.max(1.0);
        }
        TypicalPods { classes: kept }
    }

    /// Expected fragmented milli-GPU of a node in the given state.
    pub fn node_fragmentation(&self, spec: &NodeSpec, cpu_left: u64, gpu_left: &[u32]) -> f64 {
        self.node_fragmentation_with_memory(spec, cpu_left, None, gpu_left)
    }

    /// As [`Self::node_fragmentation`], and when `memory_left` is given a class whose
    /// memory does not fit cannot use the node's GPUs either.
    pub fn node_fragmentation_with_memory(
        &self,
        spec: &NodeSpec,
        cpu_left: u64,
        memory_left: Option<u64>,
        gpu_left: &[u32],
    ) -> f64 {
        if gpu_left.is_empty() {
            return 0.0;
        }
        let idle: u64 = gpu_left.iter().map(|g| u64::from(*g)).sum();
        let mut total = 0.0;
        for class in &self.classes {
            let model_ok = class.gpu_models.is_empty()
                || spec
                    .gpu_model
                    .is_some_and(|m| class.gpu_models.contains(&m));
            let fitting = gpu_left.iter().filter(|g| **g >= class.gpu_milli).count();
            let can_host = class.num_gpu > 0
                && model_ok
                && fitting >= usize::from(class.num_gpu)
                && cpu_left >= class.cpu_milli
                && memory_left.is_none_or(|left| left >= class.memory_mib);
            // A CPU-only class, a foreign model, or a class that does not fit sees all
            // idle GPU as fragment; one that fits sees only the GPUs too small for it.
            let fragment: u64 = if can_host {
                gpu_left
                    .iter()
                    .filter(|g| **g < class.gpu_milli)
                    .map(|g| u64::from(*g))
                    .sum()
            } else {
                idle
            };
            total += class.share * fragment as f64;
        }
        total
    }

    pub fn state_fragmentation(&self, spec: &NodeSpec, state: &NodeState) -> f64 {
        if !state.up {
            return 0.0;
        }
        self.node_fragmentation(spec, state.cpu_left, &state.gpu_left)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(cpu: u64, num_gpu: u8, milli: u32) -> PodRequest {
        PodRequest {
            cpu_milli: cpu,
            memory_mib: 1,
            num_gpu,
            gpu_milli: milli,
            gpu_models: vec![],
            ..PodRequest::default()
        }
    }

    #[test]
    fn typical_pods_keep_the_common_shapes() {
        let mut pods = vec![pod(1000, 1, 500); 6];
        pods.extend(vec![pod(2000, 1, 1000); 3]);
        pods.push(pod(4000, 2, 1000));
        let typical = TypicalPods::from_pods(&pods, 0.9);
        assert_eq!(typical.classes.len(), 2);
        assert!((typical.classes[0].share - 6.0 / 9.0).abs() < 1e-12);
    }

    #[test]
    fn fragments_are_what_typical_pods_cannot_use() {
        let spec = NodeSpec {
            name: "n".into(),
            cpu_milli: 8000,
            memory_mib: 1000,
            gpus: 2,
            gpu_model: Some(0),
            ..NodeSpec::default()
        };
        // Only whole-GPU pods: a half-used GPU is a fragment, a free one is not.
        let typical = TypicalPods::from_pods(&[pod(1000, 1, 1000)], 1.0);
        assert_eq!(typical.node_fragmentation(&spec, 8000, &[1000, 500]), 500.0);
        // Without CPU left, everything idle is a fragment.
        assert_eq!(typical.node_fragmentation(&spec, 0, &[1000, 500]), 1500.0);
        // Half-GPU pods can use both.
        let typical = TypicalPods::from_pods(&[pod(1000, 1, 500)], 1.0);
        assert_eq!(typical.node_fragmentation(&spec, 8000, &[1000, 500]), 0.0);
    }
}
