//! The target workload a live region's fragmentation-aware policies plan for, learned
//! from the pods it is asked to place. FGD scores a placement by the fragmentation it
//! causes for "typical pods"; the paper (and `nephele sim`) take a trace's whole pod
//! list, known in advance. A region knows only what it has been asked so far, so it
//! keeps its most recent pods and, every so often, makes the typical pods of them
//! against its GPU supply ([`TypicalPods::with_supply`]): then `ours` also sees which
//! GPU models typed pods need more of than the pools have, and leaves them to those
//! pods.

use std::collections::VecDeque;

use crate::{NodeSpec, PodRequest, TypicalPods};

/// Pod classes kept: those that make up 95% of the recent pods, as `nephele sim` keeps
/// of a trace.
pub const COVERAGE: f64 = 0.95;

/// The submitted pods (job members and serving replicas) a region learns its target
/// workload from: its fragmentation-aware policies plan for the typical pods of the
/// latest this many, with the GPU models typed pods ask for weighed against the pools'
/// supply.
pub const RECENT_PODS: usize = 2000;

/// The workload mix the fragmentation-aware scorer plans for until a region has seen
/// its own: mostly single GPUs and halves, some 2-, 4- and 8-GPU jobs.
pub fn starting_mix() -> TypicalPods {
    let mut pods = Vec::new();
    for (count, cpu, gpus, milli) in [
        (40, 4000, 1, 1000),
        (20, 2000, 1, 500),
        (10, 1000, 1, 250),
        (15, 8000, 2, 1000),
        (10, 16000, 4, 1000),
        (5, 32000, 8, 1000),
    ] {
        for _ in 0..count {
            pods.push(PodRequest {
                cpu_milli: cpu,
                memory_mib: cpu * 4,
                num_gpu: gpus,
                gpu_milli: milli,
                ..PodRequest::default()
            });
        }
    }
    TypicalPods::from_pods(&pods, 1.0)
}

/// The most recent pods a region was asked to place, oldest first.
#[derive(Debug, Clone, Default)]
pub struct RecentPods {
    pods: VecDeque<PodRequest>,
    capacity: usize,
    since_rebuilt: usize,
    /// When the last rebuild was, on the caller's clock (seconds).
    rebuilt_at: Option<u64>,
}

impl RecentPods {
    /// Keeps the last `capacity` pods (0: none, never rebuilds).
    pub fn new(capacity: usize) -> RecentPods {
        RecentPods {
            pods: VecDeque::with_capacity(capacity.min(4096)),
            capacity,
            since_rebuilt: 0,
            rebuilt_at: None,
        }
    }

    pub fn observe(&mut self, pod: &PodRequest) {
        if self.capacity == 0 {
            return;
        }
        if self.pods.len() == self.capacity {
            self.pods.pop_front();
        }
        self.pods.push_back(pod.clone());
        self.since_rebuilt += 1;
    }

    pub fn len(&self) -> usize {
        self.pods.len()
    }

    pub fn is_empty(&self) -> bool {
        self.pods.is_empty()
    }

    /// The typical pods of the recent ones against `nodes`' GPU supply at `now`
    /// (seconds), once at least `min` are kept, `every` arrived since the last rebuild
    /// and `period` seconds passed since it; `None` otherwise (what the caller plans
    /// with stays). The period bounds how often a busy region's placement index is
    /// rescored for new typical pods.
    pub fn rebuild(
        &mut self,
        nodes: &[NodeSpec],
        now: u64,
        min: usize,
        every: usize,
        period: u64,
    ) -> Option<TypicalPods> {
        let rested = self
            .rebuilt_at
            .is_none_or(|at| now >= at.saturating_add(period));
        if self.pods.len() < min.max(1) || self.since_rebuilt < every.max(1) || !rested {
            return None;
        }
        self.since_rebuilt = 0;
        self.rebuilt_at = Some(now);
        Some(TypicalPods::from_pods(self.pods.make_contiguous(), COVERAGE).with_supply(nodes))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(gpus: u8, milli: u32, models: Vec<crate::GpuModel>) -> PodRequest {
        PodRequest {
            cpu_milli: 4000,
            memory_mib: 16_000,
            num_gpu: gpus,
            gpu_milli: milli,
            gpu_models: models,
            ..PodRequest::default()
        }
    }

    fn node(gpus: u8, model: crate::GpuModel) -> NodeSpec {
        NodeSpec {
            cpu_milli: 64_000,
            memory_mib: 256_000,
            gpus,
            gpu_model: Some(model),
            ..NodeSpec::default()
        }
    }

    #[test]
    fn rebuilds_only_after_enough_pods_and_keeps_the_latest() {
        let mut recent = RecentPods::new(4);
        let nodes = [node(8, 0), node(2, 1)];
        for _ in 0..3 {
            recent.observe(&pod(1, 1000, vec![]));
        }
        assert!(
            recent.rebuild(&nodes, 0, 4, 2, 60).is_none(),
            "3 of the 4 needed"
        );
        recent.observe(&pod(1, 1000, vec![]));
        assert!(recent.rebuild(&nodes, 0, 4, 2, 60).is_some());
        assert!(
            recent.rebuild(&nodes, 100, 4, 2, 60).is_none(),
            "nothing new since"
        );
        // Typed pods push the untyped ones out of the window: model 1 (2 GPUs) is now
        // wanted by every pod, so it is under pressure and model 0 is not.
        for _ in 0..4 {
            recent.observe(&pod(1, 1000, vec![1]));
        }
        assert_eq!(recent.len(), 4);
        assert!(
            recent.rebuild(&nodes, 59, 4, 2, 60).is_none(),
            "within the period"
        );
        let typical = recent.rebuild(&nodes, 60, 4, 2, 60).expect("rebuilt");
        assert!(typical.pressure_of(Some(1)) > typical.pressure_of(Some(0)));
        assert!(typical.pressure_of(Some(1)) > 0.0);
    }

    #[test]
    fn a_window_of_nothing_learns_nothing() {
        let mut off = RecentPods::new(0);
        off.observe(&pod(1, 1000, vec![]));
        assert!(off.is_empty());
        assert!(off.rebuild(&[node(8, 0)], 0, 0, 0, 0).is_none());
    }
}
