//! Jobs in and out of a region: tenants looked up by name, submission (checked, then
//! queued or held for a lower-carbon hour) and deletion.

use nephele_placement::{Job, JobId, PriorityClass, Topology};

use super::{
    run, Deferred, Hold, JobKind, JobMeta, JobSpec, JobView, PrioritySpec, RegionChoiceView,
    RegionScheduler, SchedError, SchedEvent, TopologySpec,
};

impl RegionScheduler {
    /// The tenants jobs may be submitted for (not the internal serving tenant, nor
    /// deleted ones).
    pub fn tenant_names(&self) -> Vec<&str> {
        (0..self.tenants.len())
            .filter(|&i| self.is_user_tenant(i) && !self.removed_tenants.contains(&i))
            .map(|i| self.tenants[i].as_str())
            .collect()
    }

    pub(super) fn is_user_tenant(&self, index: usize) -> bool {
        index != self.serving_tenant && index < self.tenants.len()
    }

    /// A tenant's index, a deleted one's included (its jobs still run until they end).
    pub(super) fn tenant_position(&self, tenant: &str) -> Option<usize> {
        (0..self.tenants.len()).find(|&i| self.is_user_tenant(i) && self.tenants[i] == tenant)
    }

    /// The index of a tenant jobs may be submitted for.
    pub(super) fn tenant_index(&self, tenant: &str) -> Result<usize, SchedError> {
        self.tenant_position(tenant)
            .filter(|i| !self.removed_tenants.contains(i))
            .ok_or_else(|| {
                SchedError::BadRequest(format!(
                    "unknown tenant {tenant:?}; tenants: {}",
                    self.tenant_names().join(", ")
                ))
            })
    }

    /// Queues a job for `tenant` and runs one scheduling pass, so the answer already
    /// says where it went or why not. A job with a deadline may be held as `deferred`.
    pub fn submit(
        &mut self,
        tenant: &str,
        spec: JobSpec,
        now: u64,
    ) -> Result<(JobView, Vec<SchedEvent>), SchedError> {
        self.submit_chosen(tenant, spec, None, now)
    }

    /// [`Self::submit`] for a job whose region was chosen by
    /// [`choose_region_for`](super::choose_region_for).
    pub fn submit_chosen(
        &mut self,
        tenant: &str,
        spec: JobSpec,
        region_choice: Option<RegionChoiceView>,
        now: u64,
    ) -> Result<(JobView, Vec<SchedEvent>), SchedError> {
        let id = self.admit(tenant, spec, region_choice, now)?;
        let mut events = self.tick(now);
        events.extend(self.admitted_events(id));
        let view = self
            .view_of(id)
            .ok_or_else(|| SchedError::NotFound("the job vanished during its first pass".into()))?;
        Ok((view, events))
    }

    /// Checks and queues a job (or holds it, with a deadline) without running the
    /// queue: a batch of submissions is admitted one by one, then placed by one
    /// [`Self::tick`] (the region actor's group commit). Answers the job's id for
    /// [`Self::admitted_events`] and [`Self::job_view`] after that tick.
    pub fn admit(
        &mut self,
        tenant: &str,
        mut spec: JobSpec,
        region_choice: Option<RegionChoiceView>,
        now: u64,
    ) -> Result<JobId, SchedError> {
        nephele_domain::validate_name("job", &spec.name).map_err(SchedError::BadRequest)?;
        let tenant_index = self.tenant_index(tenant)?;
        let priority = match &spec.priority {
            None => PriorityClass::Batch.priority(),
            Some(PrioritySpec::Value(v)) => *v,
            Some(PrioritySpec::Class(name)) => [
                PriorityClass::BestEffort,
                PriorityClass::Batch,
                PriorityClass::Production,
                PriorityClass::System,
            ]
            .into_iter()
            .find(|c| c.name() == name)
            .map(PriorityClass::priority)
            .ok_or_else(|| {
                SchedError::BadRequest(format!(
                    "priority {name:?} is unknown; use best-effort, batch, production, system or a number"
                ))
            })?,
        };
        let pod = self.pod_of(&spec)?;
        spec.validate_command().map_err(SchedError::BadRequest)?;
        if let Some(why) = self.never_fits(&pod, spec.members, spec.topology) {
            return Err(SchedError::BadRequest(why));
        }
        self.within_whole_quota(tenant_index, &pod, spec.members)?;
        self.within_job_quota(tenant_index)?;
        let key = (tenant_index, spec.name.clone());
        if self.by_name.contains_key(&key) {
            return Err(SchedError::Conflict(format!(
                "job {} already exists in region {}; delete it first",
                spec.name, self.region
            )));
        }
        spec.tenant = Some(tenant.to_string());
        spec.region = Some(self.region.clone());
        let id = self.next_id;
        self.next_id += 1;
        let job = Job {
            id,
            tenant: tenant_index,
            priority,
            submit: now,
            members: vec![pod; usize::from(spec.members)],
            topology: match spec.topology {
                TopologySpec::Any => Topology::Any,
                TopologySpec::SameNode => Topology::SameNode { hard: true },
                TopologySpec::PreferSameNode => Topology::SameNode { hard: false },
            },
            expected_runtime: spec.expected_runtime_s,
            preemptible: spec
                .preemptible
                .unwrap_or(priority < PriorityClass::Production.priority()),
        };
        let (job_priority, job_preemptible) = (job.priority, job.preemptible);
        let deferral = match spec.deadline_unix {
            None => None,
            Some(deadline) => Some(self.plan_deferral(&spec, deadline, now)?),
        };
        let held = if deferral.is_some() {
            Some((job, Hold::Deferred))
        } else {
            self.queue
                .submit(job)
                .map_err(|e| SchedError::BadRequest(e.to_string()))?;
            None
        };
        self.by_name.insert(key, id);
        self.jobs.insert(
            id,
            JobMeta {
                name: spec.name.clone(),
                tenant: tenant_index,
                uid: {
                    self.next_uid += 1;
                    self.next_uid - 1
                },
                kind: JobKind::Batch,
                priority: job_priority,
                preemptible: job_preemptible,
                spec,
                submitted_unix: now,
                started_unix: None,
                preempted_by: None,
                requeues: 0,
                deferral: deferral.map(|(plan, view)| Deferred { plan, view }),
                region_choice,
                held,
                run: run::RunState::default(),
            },
        );
        self.index_job(id);
        self.touched.insert(id);
        Ok(id)
    }

    /// What a newly admitted job adds to the events of the tick after it: that it is
    /// held for a lower-carbon hour.
    pub fn admitted_events(&self, id: JobId) -> Vec<SchedEvent> {
        let mut events = Vec::new();
        if let Some(meta) = self.jobs.get(&id) {
            if let (Some((_, Hold::Deferred)), Some(deferred)) = (&meta.held, &meta.deferral) {
                events.push(SchedEvent::Deferred {
                    job: self.qualified(id),
                    reason: deferred.view.reason.clone(),
                });
            }
        }
        events
    }

    pub(super) fn lookup(&self, tenant: &str, name: &str) -> Result<JobId, SchedError> {
        let index = self.tenant_position(tenant).ok_or_else(|| {
            SchedError::NotFound(format!(
                "no job {name:?} for tenant {tenant} in region {}",
                self.region
            ))
        })?;
        self.by_name
            .get(&(index, name.to_string()))
            .copied()
            .ok_or_else(|| {
                SchedError::NotFound(format!(
                    "no job {name:?} for tenant {tenant} in region {}",
                    self.region
                ))
            })
    }

    /// Deletes a job in any state; a placed job gives its resources back at once and the
    /// queue runs again. Returns the job as it was.
    pub fn delete(
        &mut self,
        tenant: &str,
        name: &str,
        now: u64,
    ) -> Result<(JobView, Vec<SchedEvent>), SchedError> {
        let id = self.lookup(tenant, name)?;
        // A record goes: only a full write finds what to delete.
        self.touched_all = true;
        let view = self
            .view_of(id)
            .ok_or_else(|| SchedError::NotFound(format!("no job {name:?}")))?;
        self.forget(id);
        let events = self.tick(now);
        Ok((view, events))
    }

    /// Removes a job in any state from the queue and the books: its resources go back
    /// at once, and its processes leave the desired state (their agents stop them).
    pub(super) fn forget(&mut self, id: JobId) {
        self.queue.remove(&mut self.cluster, id);
        if let Some(meta) = self.jobs.remove(&id) {
            self.by_name.remove(&(meta.tenant, meta.name));
            if let JobKind::Replica { deployment } = &meta.kind {
                if let Some(set) = self.replica_sets.get_mut(deployment) {
                    set.replicas.remove(&id);
                }
            }
        }
    }
}
