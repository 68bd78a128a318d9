//! The checks of a job spec against the region: the spec as a queue pod, the tenant's
//! whole quota, and why a job could never run here (with the figures that make the
//! refusal actionable).

use nephele_placement::{MigProfile, NodeSpec, PodRequest, Policy, Reason, TypicalPods};

use super::{JobSpec, RegionScheduler, SchedError, TopologySpec, MAX_MEMBERS};

impl RegionScheduler {
    /// Refuses a job that asks for more in all than its tenant's whole quota: it could
    /// never start, even with nothing else of the tenant's running.
    pub(super) fn within_whole_quota(
        &self,
        tenant: usize,
        pod: &PodRequest,
        members: u16,
    ) -> Result<(), SchedError> {
        let quota = self.queue.tenants()[tenant].quota;
        let members = u64::from(members.max(1));
        let asks = [
            (
                "gpus",
                "GPU milli",
                quota.gpu_milli,
                u64::from(pod.num_gpu) * u64::from(pod.gpu_milli) * members,
            ),
            (
                "cpu_milli",
                "CPU milli",
                quota.cpu_milli,
                pod.cpu_milli * members,
            ),
            (
                "memory_mib",
                "MiB of memory",
                quota.memory_mib,
                pod.memory_mib * members,
            ),
        ];
        for (field, unit, limit, asked) in asks {
            if let Some(limit) = limit.filter(|limit| asked > *limit) {
                return Err(SchedError::Invalid {
                    field: field.into(),
                    message: format!(
                        "quota exceeded: the job asks for {asked} {unit} in all ({members} member(s)), more than tenant {}'s whole quota of {limit}; it could never start: ask for less, or have an admin raise the quota",
                        self.tenants[tenant]
                    ),
                });
            }
        }
        Ok(())
    }

    pub(super) fn pod_of(&self, spec: &JobSpec) -> Result<PodRequest, SchedError> {
        let bad = |m: String| Err(SchedError::BadRequest(m));
        if spec.members == 0 || spec.members > MAX_MEMBERS {
            return bad(format!("members must be 1..={MAX_MEMBERS}"));
        }
        if spec.cpu_milli > 1 << 40 || spec.memory_mib > 1 << 40 {
            return bad("cpu_milli and memory_mib must be below 2^40".into());
        }
        let mut pod = PodRequest {
            cpu_milli: spec.cpu_milli,
            memory_mib: spec.memory_mib,
            same_nvlink: spec.same_nvlink,
            node_selector: spec.node_selector.clone(),
            tolerations: spec.tolerations.clone(),
            spot_ok: spec.spot_ok,
            runtime_minutes: spec
                .expected_runtime_s
                .map_or(0, |s| (s / 60).min(u64::from(u32::MAX)) as u32),
            checkpoint_minutes: spec
                .checkpoint_interval_s
                .map_or(0, |s| (s / 60).min(u64::from(u32::MAX)) as u32),
            ..PodRequest::default()
        };
        if let Some(name) = &spec.mig_profile {
            let Some(profile) = MigProfile::parse(name) else {
                return bad(format!(
                    "mig_profile {name:?} must look like 1g.10gb (compute sevenths g, memory gb)"
                ));
            };
            if spec.gpus > 1 || spec.gpu_milli.is_some() {
                return bad(
                    "mig_profile asks for one slice: leave gpus at 0 or 1 and gpu_milli unset"
                        .into(),
                );
            }
            let mig = PodRequest::mig(spec.cpu_milli, spec.memory_mib, profile);
            pod.num_gpu = mig.num_gpu;
            pod.gpu_milli = mig.gpu_milli;
            pod.mig_profile = mig.mig_profile;
        } else if spec.gpus > 0 {
            let milli = spec.gpu_milli.unwrap_or(1000);
            if !(1..=1000).contains(&milli) {
                return bad("gpu_milli must be 1..=1000 (a share of one GPU)".into());
            }
            if milli < 1000 && spec.gpus > 1 {
                return bad("a fractional gpu_milli is only for gpus = 1".into());
            }
            pod.num_gpu = spec.gpus;
            pod.gpu_milli = milli;
        } else if spec.gpu_milli.is_some() {
            return bad("gpu_milli needs gpus >= 1".into());
        }
        if !spec.gpu_models.is_empty() {
            if pod.num_gpu == 0 {
                return bad("gpu_models needs gpus >= 1 or a mig_profile".into());
            }
            for model in &spec.gpu_models {
                match self.gpu_models.iter().position(|m| m == model) {
                    Some(index) => pod.gpu_models.push(index as u16),
                    None => {
                        return bad(format!(
                            "no pool in region {} has GPU model {model:?}; models here: {}",
                            self.region,
                            if self.gpu_models.is_empty() {
                                "none".to_string()
                            } else {
                                self.gpu_models.join(", ")
                            }
                        ))
                    }
                }
            }
        }
        if spec
            .node_selector
            .iter()
            .any(|(k, v)| k.is_empty() || v.is_empty())
        {
            return bad("node_selector keys and values must not be empty".into());
        }
        Ok(pod)
    }

    /// Why `members` pods like `pod` could never run in this region whatever happens
    /// (no node of any pool could hold one; more than all its nodes could hold; a
    /// gang that must share a node and cannot), or `None` when some state could run it.
    pub(super) fn never_fits(
        &self,
        pod: &PodRequest,
        members: u16,
        topology: TopologySpec,
    ) -> Option<String> {
        if self.slots.is_empty() {
            return Some(format!(
                "region {} has no pools; add a [[region.pool]] to the control plane's config",
                self.region
            ));
        }
        let mut per_pool = Vec::new();
        let mut capacity: u64 = 0;
        for (index, pool) in self.pools.iter().enumerate() {
            let slots = self.slots.iter().filter(|s| s.pool_index == index).count() as u64;
            match self.templates.check(index, pod) {
                Err(reason) => per_pool.push(format!(
                    "pool {} ({}): {}",
                    pool.name,
                    self.slots
                        .iter()
                        .find(|s| s.pool_index == index)
                        .map_or("", |s| s.profile.as_str()),
                    refusal_detail(reason, pod, &self.templates.nodes[index])
                )),
                Ok(()) => {
                    // Members one empty node of this pool holds.
                    let mut node = self.templates.clone();
                    let mut fits = 0u64;
                    while fits < u64::from(members) {
                        let Ok(placement) = nephele_placement::place_on(
                            &node,
                            index,
                            pod,
                            Policy::FirstFit,
                            &TypicalPods::default(),
                        ) else {
                            break;
                        };
                        if node
                            .reserve(u64::MAX - fits, pod, &placement.binding)
                            .is_err()
                        {
                            break;
                        }
                        fits += 1;
                    }
                    if topology == TopologySpec::SameNode && fits < u64::from(members) {
                        per_pool.push(format!(
                            "pool {}: one node holds {fits} of the {members} members, and they must share one",
                            pool.name
                        ));
                        continue;
                    }
                    capacity += fits * slots;
                }
            }
        }
        if capacity == 0 {
            return Some(format!(
                "no pool of region {} can ever run this job: {}",
                self.region,
                per_pool.join("; ")
            ));
        }
        if capacity < u64::from(members) {
            return Some(format!(
                "region {} can never hold {members} members of this shape: all its nodes together hold {capacity}",
                self.region
            ));
        }
        None
    }
}

/// A never-fits reason with the figures that make it actionable: what one member asks
/// for against what a node of the pool has.
pub(super) fn refusal_detail(reason: Reason, pod: &PodRequest, node: &NodeSpec) -> String {
    let what = reason.as_str();
    match reason {
        Reason::InsufficientGpu => {
            let mut mig_gpus: Vec<u8> = node.mig.iter().map(|m| m.gpu).collect();
            mig_gpus.sort_unstable();
            mig_gpus.dedup();
            let whole = usize::from(node.gpus).saturating_sub(mig_gpus.len());
            let mig = if mig_gpus.is_empty() {
                String::new()
            } else {
                format!(" ({} in MIG slices: ask for a mig_profile)", mig_gpus.len())
            };
            format!(
                "{what}: a member asks for {} GPU(s) at {} milli each, a node has {whole} whole GPU(s){mig}",
                pod.num_gpu, pod.gpu_milli
            )
        }
        Reason::InsufficientCpu => format!(
            "{what}: a member asks for {} milli-CPU, a node has {}",
            pod.cpu_milli, node.cpu_milli
        ),
        Reason::InsufficientMemory => format!(
            "{what}: a member asks for {} MiB, a node has {} MiB",
            pod.memory_mib, node.memory_mib
        ),
        Reason::NoMigSlice => format!(
            "{what}: the job asks for a {} slice, the pool's nodes offer {}",
            pod.mig_profile.map_or_else(String::new, |p| p.to_string()),
            if node.mig.is_empty() {
                "no MIG partitions".to_string()
            } else {
                node.mig
                    .iter()
                    .map(|m| format!("{}x {} on gpu {}", m.count, m.profile, m.gpu))
                    .collect::<Vec<_>>()
                    .join(", ")
            }
        ),
        Reason::NodeSelectorMismatch => format!(
            "{what}: the job selects {:?}, the pool's nodes carry {:?}",
            pod.node_selector, node.labels
        ),
        Reason::SpotNotAllowed => format!(
            "{what}: the pool sells spot capacity, which may be taken back at short notice; submit with --spot-ok (\"spot_ok\": true) if the job can be interrupted"
        ),
        _ => what.to_string(),
    }
}
