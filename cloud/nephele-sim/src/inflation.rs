//! Workload inflation, as in the FGD paper (see `../shared/docs/FGD-EVALUATION.md`), on
//! the Alibaba openb trace: the GPU node list, the default pod list shuffled by the seed
//! and inflated by random re-draws to 130% of GPU capacity, one scheduling attempt per
//! pod in order, no departures. After every pod it records arrived and allocated
//! milli-GPU and the cluster's fragmentation, and reports per arrived-% level the
//! unallocated GPU share (100% − allocated) and the fragmentation rate. Our generator is
//! SplitMix64, not Go's math/rand, so the sequences differ from the paper's for the same
//! seed numbers; the protocol is otherwise the same.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

use nephele_placement::queue::LEARN_MIN_PODS;
use nephele_placement::rng::Rng;
use nephele_placement::workload::{self, RecentPods};
use nephele_placement::{place, Cluster, OursParams, Policy, TypicalPods};
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

/// What the fragmentation-aware policies (FGD, ours) plan for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Planning {
    /// The typical pods of the whole pod list, known in advance, as the paper does.
    #[default]
    WholeList,
    /// What a running region does: a fixed starting mix, then the typical pods of the
    /// latest [`workload::RECENT_PODS`] arrived, made again after every
    /// [`LEARN_MIN_PODS`] more (a region also waits a minute between makings; the
    /// simulation has no clock, so this remakes them at least as often).
    Learned,
}

impl Planning {
    pub fn name(self) -> &'static str {
        match self {
            Planning::WholeList => "whole-list",
            Planning::Learned => "learned",
        }
    }

    pub fn parse(name: &str) -> Option<Planning> {
        match name {
            "whole-list" => Some(Planning::WholeList),
            "learned" => Some(Planning::Learned),
            _ => None,
        }
    }
}

/// Runs `work` on every item, spread over `threads`, calling `done(done, all)` after
/// each; the results in the items' order.
pub fn run_parallel<T: Sync, R: Send>(
    items: &[T],
    threads: usize,
    work: &(dyn Fn(&T) -> R + Sync),
    done: &(dyn Fn(usize, usize) + Sync),
) -> Vec<R> {
    let results: Mutex<BTreeMap<usize, R>> = Mutex::new(BTreeMap::new());
    let next = AtomicUsize::new(0);
    let finished = AtomicUsize::new(0);
    std::thread::scope(|scope| {
        for _ in 0..threads.max(1) {
            scope.spawn(|| loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                let Some(item) = items.get(i) else {
                    return;
                };
                let result = work(item);
                results
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .insert(i, result);
                done(finished.fetch_add(1, Ordering::Relaxed) + 1, items.len());
            });
        }
    });
    results
        .into_inner()
        .unwrap_or_else(|p| p.into_inner())
        .into_values()
        .collect()
}

/// `resolution=50,scarcity=0.5,excess=1,one-pod=0.6` (any subset; the rest keep
/// [`OursParams::default`]).
pub fn parse_ours_params(text: &str) -> Result<OursParams, String> {
    let mut params = OursParams::default();
    for pair in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let (name, value) = pair
            .split_once('=')
            .ok_or_else(|| format!("{pair:?} is not NAME=VALUE"))?;
        let value: f64 = value
            .trim()
            .parse()
            .map_err(|_| format!("{name}: {value:?} is not a number"))?;
        let slot = match name.trim() {
            "resolution" => &mut params.resolution_milli,
            "scarcity" => &mut params.scarcity_weight,
            "excess" => &mut params.excess_pressure_weight,
            "one-pod" => &mut params.one_pod_weight,
            other => {
                return Err(format!(
                    "unknown weight {other:?} (resolution, scarcity, excess, one-pod)"
                ))
            }
        };
        *slot = value;
    }
    if !(params.resolution_milli.is_finite() && params.resolution_milli > 0.0) {
        return Err("resolution must be a number above 0".into());
    }
    for (name, value) in [
        ("scarcity", params.scarcity_weight),
        ("excess", params.excess_pressure_weight),
    ] {
        if !(value.is_finite() && value >= 0.0) {
            return Err(format!("{name} must be 0 or more"));
        }
    }
    if !(0.0..=1.0).contains(&params.one_pod_weight) {
        return Err("one-pod must be between 0 and 1".into());
    }

    Ok(params)
}

/// After every pod: (arrived %, allocated %, fragmentation % of capacity, fragmentation
/// / idle %).
pub type Series = Vec<(f64, f64, f64, f64)>;

/// Pods that found no node, of one kind, and their GPU demand.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Failed {
    pub pods: u64,
    pub gpu_milli: u64,
}

/// Failed pods by [`failure_kind`].
pub type Failures = BTreeMap<String, Failed>;

/// What kind of pod failed and what blocked it: `"<pod>: <resources>"`, where the pod is
/// `cpu-only`, `shared gpu`, `1 gpu` or `<n> gpus` (with `, typed` when it names GPU
/// models) and the resources are those short on the nodes closest to taking it (the
/// fewest resources short), each checked on its own: `cpu` when some node lacked only
/// CPU, `cpu or gpu` when one node lacked only CPU and another only GPUs, `cpu+gpu`
/// when every node lacked both.
pub fn failure_kind(cluster: &Cluster, pod: &nephele_placement::PodRequest) -> String {
    let mut closest: Vec<Vec<nephele_placement::Reason>> = Vec::new();
    for node in 0..cluster.nodes.len() {
        let short = cluster.shortages(node, pod);
        if short.is_empty() {
            continue;
        }
        match closest.first().map(Vec::len) {
            Some(n) if short.len() > n => {}
            Some(n) if short.len() == n => {
                if !closest.contains(&short) {
                    closest.push(short);
                }
            }
            _ => closest = vec![short],
        }
    }
    let resource = |reason: &nephele_placement::Reason| match reason {
        nephele_placement::Reason::InsufficientCpu => "cpu",
        nephele_placement::Reason::InsufficientMemory => "memory",
        nephele_placement::Reason::GpuModelMismatch | nephele_placement::Reason::NoGpu => {
            "gpu model"
        }
        _ => "gpu",
    };
    let mut alternatives: Vec<String> = closest
        .iter()
        .map(|set| set.iter().map(resource).collect::<Vec<_>>().join("+"))
        .collect();
    alternatives.sort();
    alternatives.dedup();
    let blocked = if alternatives.is_empty() {
        "other".to_string()
    } else {
        alternatives.join(" or ")
    };
    let kind = match (pod.num_gpu, pod.gpu_milli) {
        (0, _) => "cpu-only".to_string(),
        (1, milli) if milli < nephele_placement::MILLI_PER_GPU => "shared gpu".to_string(),
        (1, _) => "1 gpu".to_string(),
        (n, _) => format!("{n} gpus"),
    };
    let typed = if pod.gpu_models.is_empty() {
        ""
    } else {
        ", typed"
    };
    format!("{kind}{typed}: {blocked}")
}

/// One run: (arrived %, allocated %, fragmentation % of capacity, fragmentation / idle)
/// after every pod. Fragmentation is always measured against `typical` (the whole
/// list's); `planning` says what the policies plan with.
pub fn run_inflation(
    trace: &Trace,
    typical: &TypicalPods,
    policy: StudyPolicy,
    seed: u64,
    planning: Planning,
    ours: OursParams,
) -> (Series, Failures) {
    let mut whole = typical.clone();
    whole.ours = ours;
    let mut failures = Failures::new();
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
    cluster.set_priority(&rng.permutation(trace.nodes.len()));
    let priority = cluster.shared_priority();
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
    let mut recent = RecentPods::new(match planning {
        Planning::WholeList => 0,
        Planning::Learned => workload::RECENT_PODS,
    });
    let mut learned = workload::starting_mix();
    learned.ours = ours;
    for (id, pod) in pods.iter().enumerate() {
        arrived += pod.gpu_total() as f64;
        let plan_with = match planning {
            Planning::WholeList => &whole,
            Planning::Learned => {
                recent.observe(pod);
                if let Some(made) =
                    recent.rebuild(&trace.nodes, 0, LEARN_MIN_PODS, LEARN_MIN_PODS, 0)
                {
                    learned = TypicalPods { ours, ..made };
                }
                &learned
            }
        };
        let placed = match (policy, clustering.as_ref()) {
            (StudyPolicy::Core(policy), _) => {
                place(&cluster, pod, policy, plan_with, &priority, &mut rng)
            }
            (StudyPolicy::GpuClustering, Some(clustering)) => {
                clustering.place(&cluster, pod, plan_with)
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
            // Why pods fail before demand reaches capacity: every resource short on
            // the nodes that came closest.
            Err(_) if arrived <= capacity => {
                let entry = failures.entry(failure_kind(&cluster, pod)).or_default();
                entry.pods += 1;
                entry.gpu_milli += pod.gpu_total();
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
    /// Pods that found no node before arrived demand reached 100%, per seed, by
    /// [`failure_kind`] (the kind of pod and every resource that blocked it).
    pub failed_pods_before_100: BTreeMap<String, f64>,
    /// Their GPU demand, % of the cluster's GPU capacity, per seed, by the same kinds.
    pub failed_gpu_pct_before_100: BTreeMap<String, f64>,
}

pub fn mean_sd(values: &[f64]) -> (f64, f64) {
    let n = values.len().max(1) as f64;
    let mean = values.iter().sum::<f64>() / n;
    let var = values.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / n;
    (mean, var.sqrt())
}

#[cfg(test)]
mod tests {
    use super::*;
    use nephele_placement::{NodeSpec, PodRequest};

    fn node(name: &str, cpu_milli: u64, gpus: u8) -> NodeSpec {
        NodeSpec {
            name: name.into(),
            cpu_milli,
            memory_mib: 1000,
            gpus,
            gpu_model: Some(0),
            ..NodeSpec::default()
        }
    }

    /// 40 nodes of 8 GPUs and a list of whole, half and quarter GPUs.
    fn small_trace() -> Trace {
        let nodes = (0..40).map(|i| node(&format!("n{i}"), 96_000, 8)).collect();
        let pods: Vec<PodRequest> = (0..600)
            .map(|i| PodRequest {
                cpu_milli: 2000,
                memory_mib: 10,
                num_gpu: 1,
                gpu_milli: [1000, 500, 250][i % 3],
                ..PodRequest::default()
            })
            .collect();
        Trace {
            nodes,
            meta: Vec::new(),
            models: vec!["G".into()],
            pods,
        }
    }

    #[test]
    fn ours_params_parse_by_name_and_bad_ones_are_named() {
        assert_eq!(parse_ours_params(""), Ok(OursParams::default()));
        let p = parse_ours_params("resolution=25, one-pod=1").expect("parses");
        assert_eq!(p.resolution_milli, 25.0);
        assert_eq!(p.one_pod_weight, 1.0);
        assert_eq!(p.scarcity_weight, OursParams::default().scarcity_weight);
        for (bad, says) in [
            ("resolution=0", "resolution"),
            ("scarcity=-1", "scarcity"),
            ("one-pod=2", "one-pod"),
            ("excess=lots", "lots"),
            ("weight=1", "unknown weight"),
            ("resolution", "NAME=VALUE"),
        ] {
            let error = parse_ours_params(bad).unwrap_err();
            assert!(error.contains(says), "{bad}: {error}");
        }
    }

    #[test]
    fn planning_changes_where_pods_go_never_which_pods_arrive() {
        let trace = small_trace();
        let typical = TypicalPods::from_pods(&trace.pods, 0.95).with_supply(&trace.nodes);
        for policy in [Policy::Fgd, Policy::Ours] {
            let [whole, learned] = [Planning::WholeList, Planning::Learned].map(|planning| {
                run_inflation(
                    &trace,
                    &typical,
                    StudyPolicy::Core(policy),
                    42,
                    planning,
                    OursParams::default(),
                )
                .0
            });
            assert_eq!(
                whole.len(),
                learned.len(),
                "{policy:?}: the same pods arrive"
            );
            for (w, l) in whole.iter().zip(&learned) {
                assert_eq!(w.0, l.0, "{policy:?}: arrived % differs");
                assert!(l.1 <= l.0 + 1e-9 && l.1 <= 100.0, "{policy:?}: {l:?}");
            }
        }
    }

    #[test]
    fn planning_names_parse_back() {
        for planning in [Planning::WholeList, Planning::Learned] {
            assert_eq!(Planning::parse(planning.name()), Some(planning));
        }
        assert_eq!(Planning::parse("oracle"), None);
    }

    #[test]
    fn a_failure_names_every_resource_short_on_the_closest_nodes() {
        // Node a has the GPU but not the CPU, node b the CPU but no free GPU, node c
        // neither: the pod fails for "cpu or gpu" (c, short of both, is not closest).
        let mut cluster = Cluster::new(vec![
            node("a", 1000, 1),
            node("b", 8000, 1),
            node("c", 1000, 1),
        ]);
        let filler = PodRequest {
            cpu_milli: 0,
            memory_mib: 0,
            num_gpu: 1,
            gpu_milli: 1000,
            ..PodRequest::default()
        };
        for (id, node) in [1usize, 2].into_iter().enumerate() {
            let binding = nephele_placement::Binding {
                node,
                gpus: vec![(0, 1000)],
                mig: None,
            };
            cluster.reserve(id as u64, &filler, &binding).unwrap();
        }
        let pod = PodRequest {
            cpu_milli: 4000,
            memory_mib: 10,
            num_gpu: 1,
            gpu_milli: 500,
            ..PodRequest::default()
        };
        assert_eq!(failure_kind(&cluster, &pod), "shared gpu: cpu or gpu");
        // Typed to another model, with more memory than any node has: on every node
        // two resources are short at least.
        let typed = PodRequest {
            gpu_models: vec![7],
            memory_mib: 5000,
            num_gpu: 2,
            gpu_milli: 1000,
            cpu_milli: 0,
            ..PodRequest::default()
        };
        assert_eq!(
            failure_kind(&cluster, &typed),
            "2 gpus, typed: memory+gpu model"
        );
    }
}
