//! Fitting a job: cluster capacity, weighted dominant shares, quota, trial placement
//! (single pods and gangs), committing bindings, and trying with jobs released.

use super::{reservation_id, JobId, JobState, Queue, Resources, TenantId};
use crate::cluster::{Binding, Cluster};
use crate::fairness::dominant_share;
use crate::gang::{place_gang, GangRequest};
use crate::model::PodRequest;
use crate::policy::{place, Unschedulable};

impl Queue {
    pub(super) fn capacity(cluster: &Cluster) -> [f64; 3] {
        let mut cap = [0.0; 3];
        for node in &cluster.nodes {
            cap[0] += node.cpu_milli as f64;
            cap[1] += node.memory_mib as f64;
            cap[2] += f64::from(node.gpus) * 1000.0;
        }
        cap
    }

    /// Weighted dominant share of a tenant.
    pub(super) fn share(&self, capacity: &[f64; 3], tenant: TenantId) -> f64 {
        dominant_share(capacity, &self.usage[tenant].as_f64())
            / self.tenants[tenant].weight.max(1e-9)
    }

    pub(super) fn over_quota(&self, tenant: TenantId, demand: Resources) -> Option<&'static str> {
        let quota = self.tenants[tenant].quota;
        let used = self.usage[tenant];
        let over = |limit: Option<u64>, used: u64, more: u64| {
            limit.is_some_and(|l| used.saturating_add(more) > l)
        };
        if over(quota.cpu_milli, used.cpu_milli, demand.cpu_milli) {
            Some("cpu")
        } else if over(quota.memory_mib, used.memory_mib, demand.memory_mib) {
            Some("memory")
        } else if over(quota.gpu_milli, used.gpu_milli, demand.gpu_milli) {
            Some("gpu")
        } else {
            None
        }
    }

    /// Where the job's members would go now, without reserving anything.
    pub(super) fn try_place(
        &mut self,
        cluster: &Cluster,
        job: JobId,
    ) -> Result<Vec<Binding>, Unschedulable> {
        let Some(entry) = self.jobs.get(&job) else {
            return Err(Unschedulable::default());
        };
        let (policy, typical) = (self.config.policy, &self.typical);
        if entry.job.members.len() == 1 {
            return place(
                cluster,
                &entry.job.members[0],
                policy,
                typical,
                cluster.priority(),
                &mut self.rng,
            )
            .map(|p| vec![p.binding]);
        }
        let gang = GangRequest {
            first_id: reservation_id(job, 0),
            members: entry.job.members.clone(),
            topology: entry.job.topology,
        };
        let mut scratch = cluster.clone();
        place_gang(
            &mut scratch,
            &gang,
            policy,
            typical,
            cluster.priority(),
            &mut self.rng,
        )
    }

    /// Reserves the bindings and marks the job running.
    pub(super) fn commit(
        &mut self,
        cluster: &mut Cluster,
        job: JobId,
        bindings: &[Binding],
        now: u64,
    ) -> bool {
        let Some(entry) = self.jobs.get(&job) else {
            return false;
        };
        let members = entry.job.members.clone();
        for (member, (pod, binding)) in members.iter().zip(bindings).enumerate() {
            if cluster
                .reserve(reservation_id(job, member), pod, binding)
                .is_err()
            {
                for done in 0..member {
                    cluster.unreserve(reservation_id(job, done));
                }
                return false;
            }
        }
        if let Some(entry) = self.jobs.get_mut(&job) {
            entry.state = JobState::Running {
                start: now,
                bindings: bindings.to_vec(),
            };
            entry.why = None;
            let (tenant, demand) = (entry.job.tenant, entry.demand);
            self.usage[tenant].add(demand);
        }
        self.reindex(job);
        true
    }

    /// Temporarily frees the given jobs' reservations, runs `f`, and restores them
    /// exactly (reserve is idempotent by id and the bindings are the same).
    pub(super) fn with_released<T>(
        &mut self,
        cluster: &mut Cluster,
        jobs: &[JobId],
        f: impl FnOnce(&mut Self, &mut Cluster) -> T,
    ) -> T {
        let mut taken: Vec<(u64, PodRequest, Binding)> = Vec::new();
        for job in jobs {
            if let Some(entry) = self.jobs.get(job) {
                if let JobState::Running { bindings, .. } | JobState::Terminating { bindings, .. } =
                    &entry.state
                {
                    for (member, (pod, binding)) in
                        entry.job.members.iter().zip(bindings).enumerate()
                    {
                        let id = reservation_id(*job, member);
                        if cluster.unreserve(id) {
                            taken.push((id, pod.clone(), binding.clone()));
                        }
                    }
                }
            }
        }
        let out = f(self, cluster);
        for (id, pod, binding) in &taken {
            // Cannot fail: the same resources were just given back.
            let _ = cluster.restore(*id, pod, binding);
        }
        out
    }
}
