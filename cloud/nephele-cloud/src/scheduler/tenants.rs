//! Tenants created, changed and deleted while the region runs (`PUT` and `DELETE
//! /v1/tenants/{name}`, told by the federation): the queue takes new weights and quotas
//! at once; what runs over a lowered quota stays (nothing is evicted for it), it only
//! starts less until under it. A deleted tenant's jobs run on until they end; new ones
//! are refused. The per-region job quota is checked here, at submission.

use nephele_placement::queue::{Quota, Tenant};

use super::{JobKind, RegionScheduler, SchedError};
use crate::config::TenantConfig;

impl RegionScheduler {
    /// Adds or changes a tenant.
    pub fn set_tenant(&mut self, spec: &TenantConfig) {
        let quota = Quota {
            cpu_milli: spec.quota_cpu_milli,
            memory_mib: spec.quota_memory_mib,
            gpu_milli: spec.quota_gpu_milli,
        };
        match self.tenant_position(&spec.name) {
            Some(index) => {
                self.removed_tenants.remove(&index);
                self.queue.set_tenant(index, spec.weight, quota);
                self.quota_jobs[index] = spec.quota_jobs;
            }
            None => {
                let index = self.queue.add_tenant(Tenant {
                    name: spec.name.clone(),
                    weight: spec.weight,
                    quota,
                });
                self.tenants.push(spec.name.clone());
                self.quota_jobs.push(spec.quota_jobs);
                debug_assert_eq!(index + 1, self.tenants.len());
            }
        }
    }

    /// A tenant deleted: no new jobs for it here.
    pub fn remove_tenant(&mut self, name: &str) {
        if let Some(index) = self.tenant_position(name) {
            self.removed_tenants.insert(index);
        }
    }

    /// Jobs of `tenant` here that have not ended (waiting, held or running).
    pub fn active_jobs(&self, tenant: &str) -> usize {
        let Some(index) = self.tenant_position(tenant) else {
            return 0;
        };
        self.jobs
            .values()
            .filter(|m| m.tenant == index && m.kind == JobKind::Batch)
            .filter(|m| m.held.is_some() || m.run.outcome.is_none())
            .count()
    }

    /// Refuses one more job for a tenant at its job quota.
    pub(super) fn within_job_quota(&self, tenant: usize) -> Result<(), SchedError> {
        let Some(limit) = self.quota_jobs.get(tenant).copied().flatten() else {
            return Ok(());
        };
        let name = &self.tenants[tenant];
        let active = self.active_jobs(name);
        if active >= limit as usize {
            return Err(SchedError::Conflict(format!(
                "quota exceeded: tenant {name} has {active} job(s) in region {} that have not ended, and its quota_jobs is {limit}; wait for one to end or delete one, or have an admin raise the quota",
                self.region
            )));
        }
        Ok(())
    }
}
