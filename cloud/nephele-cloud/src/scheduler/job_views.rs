//! The jobs as the API shows them: a job's state, placement and why it is pending,
//! lookups by name, counts by state, and lists in pages.

use std::collections::BTreeMap;

use nephele_placement::queue::{JobState, WhyPending};
use nephele_placement::{Binding, JobId};

use super::{
    GpuShare, Hold, JobKind, JobMeta, JobView, MemberPlacement, ReasonCount, RegionScheduler,
    SchedError, StoredBinding, WhyPendingView,
};

impl RegionScheduler {
    /// A job's view by id (`None` once it is gone).
    pub fn job_view(&self, id: JobId) -> Option<JobView> {
        self.view_of(id)
    }

    /// Jobs in the books (serving replicas too).
    pub fn job_count(&self) -> usize {
        self.jobs.len()
    }

    /// Jobs by the state their view shows (`deferred`, `pending`, `running`, …), the
    /// serving replicas left out, without building views.
    pub fn job_state_counts(&self) -> BTreeMap<&'static str, i64> {
        let mut counts: BTreeMap<&'static str, i64> = BTreeMap::new();
        for (id, meta) in &self.jobs {
            if meta.kind != JobKind::Batch {
                continue;
            }
            if let Some(state) = self.state_name(*id, meta) {
                *counts.entry(state).or_default() += 1;
            }
        }
        counts
    }

    /// The state a job's view shows.
    pub(super) fn state_name(&self, id: JobId, meta: &JobMeta) -> Option<&'static str> {
        Some(match (&meta.held, &meta.run.outcome) {
            (Some((_, Hold::Deferred)), _) => "deferred",
            (Some((_, Hold::Backoff { .. })), _) => "backoff",
            (Some((_, Hold::Recovering { .. })), _) => "recovering",
            (None, Some(outcome)) => outcome.state(),
            (None, None) => match self.queue.state(id)? {
                JobState::Pending => "pending",
                JobState::Running { .. } => "running",
                JobState::Terminating { .. } => "terminating",
                JobState::Finished { .. } => "finished",
            },
        })
    }

    pub(super) fn qualified(&self, job: JobId) -> String {
        self.jobs.get(&job).map_or_else(
            || format!("#{job}"),
            |m| format!("{}/{}", self.tenants[m.tenant], m.name),
        )
    }

    /// Placement view of stored bindings (a job restored from the books).
    pub(super) fn stored_placement(&self, bindings: &[StoredBinding]) -> Vec<MemberPlacement> {
        bindings
            .iter()
            .enumerate()
            .map(|(member, b)| MemberPlacement {
                member,
                node: b.node.clone(),
                agent: self
                    .slot_named(&b.node)
                    .and_then(|i| self.agent_for_node(i))
                    .map(str::to_string),
                gpus: b
                    .gpus
                    .iter()
                    .map(|&(gpu, milli)| GpuShare { gpu, milli })
                    .collect(),
                mig_profile: None,
            })
            .collect()
    }

    pub(super) fn placement(&self, bindings: &[Binding]) -> Vec<MemberPlacement> {
        bindings
            .iter()
            .enumerate()
            .map(|(member, b)| MemberPlacement {
                member,
                node: self.cluster.nodes[b.node].name.clone(),
                agent: self.slots[b.node].agent.clone(),
                gpus: b
                    .gpus
                    .iter()
                    .map(|&(gpu, milli)| GpuShare { gpu, milli })
                    .collect(),
                mig_profile: b.mig.and_then(|m| {
                    self.cluster.nodes[b.node]
                        .mig
                        .get(usize::from(m))
                        .map(|p| p.profile.to_string())
                }),
            })
            .collect()
    }

    pub(super) fn why(&self, id: JobId) -> WhyPendingView {
        let up = self.cluster.state.iter().filter(|s| s.up).count();
        let no_nodes_hint = (up == 0).then(|| {
            format!(
                "no pool agent is connected in region {}: enrol one with `nephele-edge join --role pool --profile <{}>`",
                self.region,
                self.slots
                    .iter()
                    .map(|s| s.profile.as_str())
                    .collect::<std::collections::BTreeSet<_>>()
                    .into_iter()
                    .collect::<Vec<_>>()
                    .join("|")
            )
        });
        match self.queue.why_pending(id) {
            None => WhyPendingView {
                message: "not tried yet".into(),
                reasons: Vec::new(),
                hint: None,
            },
            Some(WhyPending::Unschedulable(u)) => {
                let mut reasons: Vec<ReasonCount> = u
                    .rejected
                    .iter()
                    .map(|(r, n)| ReasonCount {
                        reason: r.as_str().into(),
                        nodes: *n,
                    })
                    .collect();
                reasons.sort_by(|a, b| b.nodes.cmp(&a.nodes).then(a.reason.cmp(&b.reason)));
                let hint = if self.slots.is_empty() {
                    Some(format!(
                        "region {} has no [[region.pool]]; add one to the control plane's config",
                        self.region
                    ))
                } else {
                    no_nodes_hint
                };
                WhyPendingView {
                    message: u.to_string(),
                    reasons,
                    hint,
                }
            }
            Some(WhyPending::OverQuota { resource }) => WhyPendingView {
                message: format!(
                    "over quota: tenant {} would exceed its {resource} quota",
                    self.jobs
                        .get(&id)
                        .map_or("?", |m| self.tenants[m.tenant].as_str())
                ),
                reasons: Vec::new(),
                hint: Some("wait for the tenant's other jobs to end, or raise its quota".into()),
            },
            Some(WhyPending::WaitingForPreemption) => WhyPendingView {
                message: "waiting for preempted lower-priority work to checkpoint and stop".into(),
                reasons: Vec::new(),
                hint: None,
            },
            Some(WhyPending::BehindReservation { reserved }) => WhyPendingView {
                message: format!(
                    "it would delay {}, which has waited longest and holds the reservation",
                    self.qualified(*reserved)
                ),
                reasons: Vec::new(),
                hint: None,
            },
            Some(WhyPending::NominatedFor { job }) => WhyPendingView {
                message: format!(
                    "the nodes it fits on are being freed for {}",
                    self.qualified(*job)
                ),
                reasons: Vec::new(),
                hint: None,
            },
        }
    }

    pub(super) fn view_of(&self, id: JobId) -> Option<JobView> {
        let meta = self.jobs.get(&id)?;
        let deferral = meta.deferral.as_ref().map(|d| d.view.clone());
        let (state, placement, grace, why_pending) = match (&meta.held, &meta.run.outcome) {
            (Some((_, hold)), _) => match hold {
                Hold::Deferred => ("deferred", Vec::new(), None, None),
                Hold::Backoff { .. } => ("backoff", Vec::new(), None, None),
                Hold::Recovering { bindings, .. } => {
                    ("recovering", self.stored_placement(bindings), None, None)
                }
            },
            (None, Some(outcome)) => (outcome.state(), Vec::new(), None, None),
            (None, None) => match self.queue.state(id)? {
                JobState::Pending => ("pending", Vec::new(), None, Some(self.why(id))),
                JobState::Running { bindings, .. } => {
                    ("running", self.placement(bindings), None, None)
                }
                JobState::Terminating {
                    bindings, deadline, ..
                } => (
                    "terminating",
                    self.placement(bindings),
                    Some(*deadline),
                    None,
                ),
                JobState::Finished { .. } => ("finished", Vec::new(), None, None),
            },
        };
        Some(JobView {
            name: meta.name.clone(),
            tenant: self.tenants[meta.tenant].clone(),
            uid: meta.uid,
            region: self.region.clone(),
            state: state.into(),
            priority: meta.priority,
            preemptible: meta.preemptible,
            submitted_unix: meta.submitted_unix,
            started_unix: meta.started_unix,
            placement,
            why_pending,
            preempted_by: grace.and(meta.preempted_by).map(|by| self.qualified(by)),
            grace_deadline_unix: grace,
            requeues: meta.requeues,
            deferral,
            region_choice: meta.region_choice.clone(),
            attempt: meta.run.attempt,
            members: meta.run.member_views(),
            attempts: meta.run.attempts.clone(),
            outcome: meta.run.outcome.as_ref().map(|o| o.to_string()),
            retry_at_unix: match &meta.held {
                Some((_, Hold::Backoff { until })) => Some(*until),
                _ => None,
            },
            spec: meta.spec.clone(),
        })
    }

    pub fn get(&self, tenant: &str, name: &str) -> Result<JobView, SchedError> {
        let id = self.lookup(tenant, name)?;
        self.view_of(id)
            .ok_or_else(|| SchedError::NotFound(format!("no job {name:?}")))
    }

    /// Jobs of `tenant`, or of every tenant for `None`, oldest first (serving
    /// replicas are shown with their deployments, not here).
    pub fn list(&self, tenant: Option<&str>) -> Vec<JobView> {
        self.list_page(tenant, None, None).0
    }

    /// The jobs [`RegionScheduler::list`] shows, those in `state` only, and how many
    /// there are. With `page` (a key to start after, and how many to return) they come
    /// in key order (`region/tenant/name`, as the API pages them) and only the page's
    /// views are built, so a page or a count of a long queue costs a page; without,
    /// every one in submission order.
    pub fn list_page(
        &self,
        tenant: Option<&str>,
        state: Option<&str>,
        page: Option<(Option<&str>, usize)>,
    ) -> (Vec<JobView>, usize) {
        let only = tenant.map(|t| self.tenant_position(t));
        let ids: Vec<(JobId, &JobMeta)> = self
            .jobs
            .iter()
            .filter(|(_, m)| m.kind == JobKind::Batch)
            .filter(|(_, m)| match only {
                None => true,
                Some(index) => index == Some(m.tenant),
            })
            .filter(|(id, m)| {
                let shown = self.state_name(**id, m);
                shown.is_some() && state.is_none_or(|wanted| shown == Some(wanted))
            })
            .map(|(id, m)| (*id, m))
            .collect();
        let total = ids.len();
        if let Some((after, fetch)) = page {
            let key =
                |m: &JobMeta| format!("{}/{}/{}", self.region, self.tenants[m.tenant], m.name);
            let mut keyed: Vec<(String, JobId)> = ids
                .iter()
                .map(|(id, m)| (key(m), *id))
                .filter(|(k, _)| after.is_none_or(|a| k.as_str() > a))
                .collect();
            keyed.sort_unstable();
            keyed.truncate(fetch);
            let views = keyed
                .iter()
                .filter_map(|(_, id)| self.view_of(*id))
                .collect();
            return (views, total);
        }
        let views = ids.iter().filter_map(|(id, _)| self.view_of(*id)).collect();
        (views, total)
    }

    /// Whether the cluster's books balance (every node: capacity = left + reserved).
    pub fn accounting_holds(&self) -> bool {
        self.cluster.accounting_holds()
    }
}
