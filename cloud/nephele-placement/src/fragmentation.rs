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

impl TypicalPod {
    /// Whether the class can run on a node of this GPU model (any, when it names none).
    pub fn accepts(&self, model: Option<GpuModel>) -> bool {
        self.gpu_models.is_empty() || model.is_some_and(|m| self.gpu_models.contains(&m))
    }
}

/// The target workload: the most common pod shapes covering `threshold` of the pods.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct TypicalPods {
    pub classes: Vec<TypicalPod>,
    /// Per GPU model: how much of the GPU demand only that model and the few others
    /// its typed classes accept can take, per GPU of theirs, relative to the whole
    /// demand per GPU of the cluster (0 for a model no typed class names; empty until
    /// [`TypicalPods::with_supply`]).
    pub pressure: Vec<f64>,
    /// The weights `ours` scores with (set once per study or region; the defaults
    /// unless `nephele sim inflation --leave-one-out` chooses others).
    pub ours: crate::policy::OursParams,
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
        TypicalPods {
            classes: kept,
            pressure: Vec::new(),
            ours: crate::policy::OursParams::default(),
        }
    }

    /// Fills in [`TypicalPods::pressure`] from the cluster's GPUs of each model: a
    /// typed class's share of the GPU demand is spread over the models it accepts in
    /// proportion to their supply, and a model's pressure is what lands on it per GPU,
    /// relative to the whole demand per GPU of the cluster (1.0: typed pods alone would
    /// fill that model as full as the whole workload fills the cluster).
    pub fn with_supply(mut self, nodes: &[NodeSpec]) -> TypicalPods {
        let mut supply: BTreeMap<GpuModel, f64> = BTreeMap::new();
        for node in nodes {
            if let Some(model) = node.gpu_model {
                *supply.entry(model).or_default() += f64::from(node.gpus);
            }
        }
        let total_supply: f64 = supply.values().sum();
        let demand: f64 = self
            .classes
            .iter()
            .map(|k| k.share * f64::from(k.num_gpu) * f64::from(k.gpu_milli))
            .sum();
        let max_model = supply.keys().copied().max().unwrap_or(0);
        let mut pressure = vec![0.0; usize::from(max_model) + 1];
        if demand <= 0.0 || total_supply <= 0.0 {
            self.pressure = pressure;
            return self;
        }
        for class in self.classes.iter().filter(|k| !k.gpu_models.is_empty()) {
            let reach: f64 = supply
                .iter()
                .filter(|(m, _)| class.gpu_models.contains(m))
                .map(|(_, n)| *n)
                .sum();
            if reach <= 0.0 {
                continue;
            }
            let d = class.share * f64::from(class.num_gpu) * f64::from(class.gpu_milli) / demand;
            for (model, _) in supply.iter().filter(|(m, _)| class.gpu_models.contains(m)) {
                pressure[usize::from(*model)] += d / (reach / total_supply);
            }
        }
        self.pressure = pressure;
        self
    }

    /// [`TypicalPods::pressure`] of a node's model (0 for none or an unknown one).
    pub fn pressure_of(&self, model: Option<GpuModel>) -> f64 {
        model
            .and_then(|m| self.pressure.get(usize::from(m)))
            .copied()
            .unwrap_or(0.0)
    }

    /// Expected fragmented milli-GPU of a node in the given state (FGD's measure: CPU
    /// and GPU only).
    pub fn node_fragmentation(&self, spec: &NodeSpec, cpu_left: u64, gpu_left: &[u32]) -> f64 {
        if gpu_left.is_empty() {
            return 0.0;
        }
        let idle: u64 = gpu_left.iter().map(|g| u64::from(*g)).sum();
        let mut total = 0.0;
        for class in &self.classes {
            let model_ok = class.accepts(spec.gpu_model);
            let fitting = gpu_left.iter().filter(|g| **g >= class.gpu_milli).count();
            let can_host = class.num_gpu > 0
                && class.gpu_milli > 0
                && model_ok
                && fitting >= usize::from(class.num_gpu)
                && cpu_left >= class.cpu_milli;
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

    /// Expected milli-GPU of a node that a stream of typical pods could not fill: for
    /// each class, the node's idle GPU less what pods of that class alone could take
    /// one after another, counting how many of them the node's CPU (and, when given,
    /// memory) still holds, and on shared GPUs only whole multiples of the class's
    /// share (a GPU with 700 left holds one 400 pod: 300 is lost to that class). Where
    /// FGD's measure asks only whether one more pod of a class fits, this one also sees
    /// GPUs that the node's CPU will run out before (the lists with more CPU load) and
    /// the slivers a share leaves (the GPU-sharing lists). Classes that take no GPU, or
    /// not this node's model, see all idle GPU as fragment, as in FGD.
    pub fn stream_fragmentation(
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
            let model_ok = class.accepts(spec.gpu_model);
            if class.num_gpu == 0 || class.gpu_milli == 0 || !model_ok {
                total += class.share * idle as f64;
                continue;
            }
            let gpu_usable = GpuUse::of(class, gpu_left).usable(class);
            let usable = capped(class, gpu_usable, cpu_left, memory_left);
            total += class.share * (idle - usable) as f64;
        }
        total
    }

    /// Both measures before a placement less after it ([`Changes`]), for each of
    /// `choices` (the GPUs and milli a pod would take on this node, each GPU once), with
    /// the node's CPU and memory going from `cpu_left`/`memory_left` to
    /// `cpu_after`/`memory_after` (FGD's measure ignores memory). The same figures as
    /// computing each measure twice, in one pass over the node's GPUs per class:
    /// placement scores every state a node group reaches, so this is on its hot path.
    #[allow(clippy::too_many_arguments)]
    pub fn fragmentation_changes(
        &self,
        spec: &NodeSpec,
        gpu_left: &[u32],
        cpu_left: u64,
        memory_left: Option<u64>,
        cpu_after: u64,
        memory_after: Option<u64>,
        choices: &[&[(u8, u32)]],
    ) -> Vec<Changes> {
        let mut changes = vec![Changes::default(); choices.len()];
        if gpu_left.is_empty() {
            return changes;
        }
        let idle: u64 = gpu_left.iter().map(|g| u64::from(*g)).sum();
        // Idle GPU falls by what the pod takes, for every class.
        let taken =
            |choice: &[(u8, u32)]| -> u64 { choice.iter().map(|(_, m)| u64::from(*m)).sum() };
        for class in &self.classes {
            let model_ok = class.accepts(spec.gpu_model);
            if class.num_gpu == 0 || class.gpu_milli == 0 || !model_ok {
                // All idle GPU is a fragment before and after, in both measures.
                for (change, choice) in changes.iter_mut().zip(choices) {
                    let taken = taken(choice) as f64;
                    change.stream += class.share * taken;
                    change.one_pod += class.share * taken;
                }
                continue;
            }
            let before = GpuUse::of(class, gpu_left);
            let usable_before = capped(class, before.usable(class), cpu_left, memory_left);
            let one_pod_before = before.one_pod_fragment(class, idle, cpu_left);
            for (change, choice) in changes.iter_mut().zip(choices) {
                let taken = taken(choice);
                let mut after = before;
                for (gpu, milli) in choice.iter() {
                    let old = gpu_left.get(usize::from(*gpu)).copied().unwrap_or(0);
                    after.replace(class, old, old.saturating_sub(*milli));
                }
                let usable_after = capped(class, after.usable(class), cpu_after, memory_after);
                // fragment = idle - usable, before less after.
                change.stream +=
                    class.share * (taken as f64 - usable_before as f64 + usable_after as f64);
                let one_pod_after = after.one_pod_fragment(class, idle - taken, cpu_after);
                change.one_pod += class.share * (one_pod_before as f64 - one_pod_after as f64);
            }
        }
        changes
    }

    pub fn state_fragmentation(&self, spec: &NodeSpec, state: &NodeState) -> f64 {
        if !state.up {
            return 0.0;
        }
        self.node_fragmentation(spec, state.cpu_left, &state.gpu_left)
    }
}

/// How much a placement lowers a node's fragmentation (before less after, milli-GPU
/// weighted by the classes' shares), in each measure.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Changes {
    /// [`TypicalPods::stream_fragmentation`]'s change.
    pub stream: f64,
    /// [`TypicalPods::node_fragmentation`]'s (FGD's) change.
    pub one_pod: f64,
}

/// What one class could take of a node's GPUs, kept as sums that a change of one
/// GPU updates without a pass over the others.
#[derive(Debug, Clone, Copy)]
struct GpuUse {
    /// 1-GPU classes: Σ whole multiples of the share per GPU. Others: Σ left on the
    /// GPUs with room for one of the pod's GPUs.
    sum: u64,
    /// GPUs with room for one of the pod's GPUs.
    fitting: u32,
    /// Σ left on the GPUs with room for one of the pod's GPUs.
    fitting_left: u64,
}

impl GpuUse {
    fn of(class: &TypicalPod, gpu_left: &[u32]) -> GpuUse {
        let mut use_ = GpuUse {
            sum: 0,
            fitting: 0,
            fitting_left: 0,
        };
        for left in gpu_left {
            use_.add(class, *left);
        }
        use_
    }

    fn contribution(class: &TypicalPod, left: u32) -> u64 {
        if left < class.gpu_milli {
            0
        } else if class.num_gpu == 1 {
            u64::from(left / class.gpu_milli * class.gpu_milli)
        } else {
            u64::from(left)
        }
    }

    fn add(&mut self, class: &TypicalPod, left: u32) {
        self.sum += Self::contribution(class, left);
        if left >= class.gpu_milli {
            self.fitting += 1;
            self.fitting_left += u64::from(left);
        }
    }

    fn replace(&mut self, class: &TypicalPod, old: u32, new: u32) {
        self.sum = self.sum - Self::contribution(class, old) + Self::contribution(class, new);
        if old >= class.gpu_milli {
            self.fitting -= 1;
            self.fitting_left -= u64::from(old);
        }
        if new >= class.gpu_milli {
            self.fitting += 1;
            self.fitting_left += u64::from(new);
        }
    }

    /// FGD's fragment for a GPU class of this node's model: the GPUs too small for one
    /// of its pods when one more fits (GPUs and CPU), all `idle` GPU otherwise.
    fn one_pod_fragment(self, class: &TypicalPod, idle: u64, cpu_left: u64) -> u64 {
        if self.fitting >= u32::from(class.num_gpu) && cpu_left >= class.cpu_milli {
            idle - self.fitting_left
        } else {
            idle
        }
    }

    /// GPU milli the class could take, GPUs alone considered.
    fn usable(self, class: &TypicalPod) -> u64 {
        if class.num_gpu == 1 || self.fitting >= u32::from(class.num_gpu) {
            self.sum
        } else {
            0
        }
    }
}

/// `gpu_usable` of a class, capped by how many of its pods the node's CPU and memory
/// (when given) still hold. A multiplication decides most nodes; the division runs
/// only where CPU or memory binds.
fn capped(class: &TypicalPod, gpu_usable: u64, cpu_left: u64, memory_left: Option<u64>) -> u64 {
    let per_pod = u64::from(class.num_gpu) * u64::from(class.gpu_milli);
    if gpu_usable == 0 || per_pod == 0 {
        return gpu_usable;
    }
    // Holds ceil(gpu_usable / per_pod) pods of `each`: then the GPUs bind.
    let holds = |left: u64, each: u64| {
        each == 0
            || u128::from(left) * u128::from(per_pod)
                >= u128::from(each) * u128::from(gpu_usable + per_pod - 1)
    };
    if holds(cpu_left, class.cpu_milli)
        && memory_left.is_none_or(|memory| holds(memory, class.memory_mib))
    {
        return gpu_usable;
    }
    let mut pods = cpu_left.checked_div(class.cpu_milli).unwrap_or(u64::MAX);
    if let (Some(memory), true) = (memory_left, class.memory_mib > 0) {
        pods = pods.min(memory / class.memory_mib);
    }
    gpu_usable.min(pods.saturating_mul(per_pod))
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

    fn node(gpus: u8, model: u16) -> NodeSpec {
        NodeSpec {
            name: format!("n{model}"),
            cpu_milli: 16_000,
            memory_mib: 64_000,
            gpus,
            gpu_model: Some(model),
            ..NodeSpec::default()
        }
    }

    #[test]
    fn a_stream_of_pods_sees_the_cpu_run_out_and_the_slivers_a_share_leaves() {
        let spec = node(8, 0);
        // Whole-GPU pods with 4 cores: one more fits (FGD: nothing lost), but the 16
        // cores left hold only four of them, so four free GPUs are lost to the class.
        let typical = TypicalPods::from_pods(&[pod(4000, 1, 1000)], 1.0);
        let free = [1000; 8];
        assert_eq!(typical.node_fragmentation(&spec, 16_000, &free), 0.0);
        assert_eq!(
            typical.stream_fragmentation(&spec, 16_000, None, &free),
            4000.0
        );
        // Memory counts when given: 64,000 MiB holds 64 pods of 1 MiB, no limit here.
        assert_eq!(
            typical.stream_fragmentation(&spec, 16_000, Some(64_000), &free),
            4000.0
        );
        assert_eq!(
            typical.stream_fragmentation(&spec, 16_000, Some(2), &free),
            6000.0
        );
        // 400-milli shares: a GPU with 700 left holds one (300 lost), a free one two
        // (200 lost); FGD counts neither.
        let typical = TypicalPods::from_pods(&[pod(0, 1, 400)], 1.0);
        let left = [700, 1000];
        assert_eq!(typical.node_fragmentation(&spec, 16_000, &left), 0.0);
        assert_eq!(
            typical.stream_fragmentation(&spec, 16_000, None, &left),
            500.0
        );
        // A class that takes no GPU, or not this model, loses all idle GPU, as in FGD.
        let mut typed = pod(1000, 1, 1000);
        typed.gpu_models = vec![1];
        let typical = TypicalPods::from_pods(&[typed], 1.0);
        assert_eq!(
            typical.stream_fragmentation(&spec, 16_000, None, &left),
            1700.0
        );
    }

    proptest::proptest! {
        /// The one-pass changes are each measure before less the measure after.
        #[test]
        fn changes_agree_with_the_measure_computed_twice(
            classes in proptest::collection::vec((0u64..8, 0u8..4, 1u32..=10, 0u64..6, proptest::option::of(0u16..2)), 1..8),
            gpu_left in proptest::collection::vec(0u32..=10, 0..8),
            cpu_left in 0u64..40,
            memory_left in 0u64..40,
            take in proptest::collection::vec((0u8..8, 1u32..=10), 0..3),
            cpu_taken in 0u64..8,
            memory_taken in 0u64..8,
            with_memory in proptest::bool::ANY,
        ) {
            let pods: Vec<PodRequest> = classes
                .iter()
                .map(|(cpu, num_gpu, tenth, memory, model)| PodRequest {
                    cpu_milli: cpu * 1000,
                    memory_mib: *memory,
                    num_gpu: *num_gpu,
                    gpu_milli: if *num_gpu > 1 { 1000 } else { tenth * 100 },
                    gpu_models: model.iter().copied().collect(),
                    ..PodRequest::default()
                })
                .collect();
            let typical = TypicalPods::from_pods(&pods, 1.0);
            let spec = node(gpu_left.len() as u8, 0);
            let gpu_left: Vec<u32> = gpu_left.iter().map(|t| t * 100).collect();
            // A choice takes what it can from GPUs that exist.
            let choice: Vec<(u8, u32)> = take
                .iter()
                .filter(|(gpu, _)| usize::from(*gpu) < gpu_left.len())
                .map(|(gpu, tenth)| (*gpu, (tenth * 100).min(gpu_left[usize::from(*gpu)])))
                .collect::<std::collections::BTreeMap<u8, u32>>()
                .into_iter()
                .collect();
            let mut left_after = gpu_left.clone();
            for (gpu, milli) in &choice {
                left_after[usize::from(*gpu)] -= milli;
            }
            let cpu_left = cpu_left * 1000;
            let cpu_after = cpu_left.saturating_sub(cpu_taken * 1000);
            let memory = with_memory.then_some(memory_left);
            let memory_after = memory.map(|m| m.saturating_sub(memory_taken));
            let stream = typical.stream_fragmentation(&spec, cpu_left, memory, &gpu_left)
                - typical.stream_fragmentation(&spec, cpu_after, memory_after, &left_after);
            let one_pod = typical.node_fragmentation(&spec, cpu_left, &gpu_left)
                - typical.node_fragmentation(&spec, cpu_after, &left_after);
            let once = typical.fragmentation_changes(
                &spec, &gpu_left, cpu_left, memory, cpu_after, memory_after, &[&choice, &[]],
            );
            proptest::prop_assert!((once[0].stream - stream).abs() < 1e-6, "{:?} vs {}", once[0], stream);
            proptest::prop_assert!((once[0].one_pod - one_pod).abs() < 1e-6, "{:?} vs {}", once[0], one_pod);
            // Taking nothing, with the same CPU and memory, changes nothing.
            let same = typical.fragmentation_changes(
                &spec, &gpu_left, cpu_left, memory, cpu_left, memory, &[&[]],
            );
            proptest::prop_assert!(same[0].stream.abs() < 1e-9 && same[0].one_pod.abs() < 1e-9);
        }
    }

    #[test]
    fn pressure_is_typed_demand_per_gpu_of_the_models_it_accepts() {
        // Model 0: 8 GPUs, model 1: 2. Half the demand accepts only model 1.
        let mut typed = pod(1000, 1, 1000);
        typed.gpu_models = vec![1];
        let untyped = pod(1000, 1, 1000);
        let typical =
            TypicalPods::from_pods(&[typed, untyped], 1.0).with_supply(&[node(8, 0), node(2, 1)]);
        // Half the demand on a fifth of the GPUs: 0.5 / 0.2.
        assert!((typical.pressure_of(Some(1)) - 2.5).abs() < 1e-12);
        assert_eq!(typical.pressure_of(Some(0)), 0.0);
        assert_eq!(typical.pressure_of(None), 0.0);
        assert_eq!(typical.pressure_of(Some(9)), 0.0);
        // A class accepting both spreads over them by supply: the same figure on each.
        let mut both = pod(1000, 1, 1000);
        both.gpu_models = vec![0, 1];
        let typical = TypicalPods::from_pods(&[both], 1.0).with_supply(&[node(8, 0), node(2, 1)]);
        assert!((typical.pressure_of(Some(0)) - 1.0).abs() < 1e-12);
        assert!((typical.pressure_of(Some(1)) - 1.0).abs() < 1e-12);
        // No supply at all: no pressure, no panic.
        assert!(TypicalPods::from_pods(&[pod(0, 1, 1000)], 1.0)
            .with_supply(&[])
            .pressure
            .iter()
            .all(|p| *p == 0.0));
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
