//! The queue's book-keeping: construction, tenants, the learned target workload,
//! submission, the pending and terminating indexes, and what it tells about its jobs.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use super::{
    Counts, Entry, Job, JobId, JobState, Queue, QueueConfig, QueueError, Quota, Reservation,
    Resources, Tenant, TenantId, WhyPending, LEARN_MIN_PODS, LEARN_PERIOD_S, MAX_JOB_ID,
    MEMBER_BITS,
};
use crate::fragmentation::TypicalPods;
use crate::model::NodeSpec;
use crate::rng::Rng;

impl Queue {
    /// `typical` is the target workload the `fgd`/`ours` policies score against.
    pub fn new(config: QueueConfig, tenants: Vec<Tenant>, typical: TypicalPods) -> Queue {
        let n = tenants.len();
        Queue {
            rng: Rng::new(config.seed),
            config,
            tenants,
            typical,
            recent: crate::workload::RecentPods::default(),
            jobs: BTreeMap::new(),
            pending: BTreeSet::new(),
            terminating: BTreeSet::new(),
            usage: vec![Resources::default(); n],
            shapes: HashMap::new(),
            reservation: None,
            reservation_dirty: false,
            preemptions: 0,
            nominations: BTreeMap::new(),
            empty: None,
            ever_fits: HashMap::new(),
        }
    }

    pub fn config(&self) -> &QueueConfig {
        &self.config
    }

    pub fn tenants(&self) -> &[Tenant] {
        &self.tenants
    }

    /// Adds a tenant (tenants are created while the queue runs); its id.
    pub fn add_tenant(&mut self, tenant: Tenant) -> TenantId {
        self.tenants.push(tenant);
        self.usage.push(Resources::default());
        self.reservation_dirty = true;
        self.tenants.len() - 1
    }

    /// From now on, keeps the last `capacity` pods submitted and plans with the typical
    /// pods made of them once [`Queue::refresh_workload`] finds enough (until then, with
    /// the typical pods it was made with).
    pub fn learn_workload(&mut self, capacity: usize) {
        self.recent = crate::workload::RecentPods::new(capacity);
    }

    /// Plans with the typical pods of the recent submissions against `nodes`' GPU
    /// supply at `now` (seconds), once [`LEARN_MIN_PODS`] are kept, as many more
    /// arrived since the last time and [`LEARN_PERIOD_S`] passed; says whether it
    /// changed them.
    pub fn refresh_workload(&mut self, nodes: &[NodeSpec], now: u64) -> bool {
        match self
            .recent
            .rebuild(nodes, now, LEARN_MIN_PODS, LEARN_MIN_PODS, LEARN_PERIOD_S)
        {
            Some(typical) => {
                self.typical = typical;
                true
            }
            None => false,
        }
    }

    /// The typical pods the fragmentation-aware policies plan with now.
    pub fn typical(&self) -> &TypicalPods {
        &self.typical
    }

    /// Changes a tenant's weight and quota. What it holds stays where it is, even over
    /// a lowered quota (nothing is evicted for it); it only starts less until under it.
    pub fn set_tenant(&mut self, tenant: TenantId, weight: f64, quota: Quota) -> bool {
        let Some(entry) = self.tenants.get_mut(tenant) else {
            return false;
        };
        entry.weight = weight;
        entry.quota = quota;
        self.reservation_dirty = true;
        true
    }

    /// Adds a pending job.
    pub fn submit(&mut self, job: Job) -> Result<(), QueueError> {
        if self.jobs.contains_key(&job.id) {
            return Err(QueueError::DuplicateJob(job.id));
        }
        if job.tenant >= self.tenants.len() {
            return Err(QueueError::UnknownTenant(job.tenant));
        }
        if job.members.is_empty() {
            return Err(QueueError::EmptyJob);
        }
        if job.members.len() > 1 << MEMBER_BITS {
            return Err(QueueError::TooManyMembers);
        }
        if job.id > MAX_JOB_ID {
            return Err(QueueError::JobIdTooLarge);
        }
        let next = self.shapes.len() as u32;
        let shape = *self
            .shapes
            .entry((job.members.clone(), format!("{:?}", job.topology)))
            .or_insert(next);
        let entry = Entry {
            queued_since: job.submit,
            remaining: job.expected_runtime,
            demand: Resources::of(&job.members),
            shape,
            why: None,
            state: JobState::Pending,
            job,
        };
        self.pending.insert(entry.job.id);
        for member in &entry.job.members {
            self.recent.observe(member);
        }
        self.jobs.insert(entry.job.id, entry);
        Ok(())
    }

    /// Files `job` under its current state in the pending and terminating indexes
    /// (out of both when running, finished or gone). Called after every state change.
    pub(super) fn reindex(&mut self, job: JobId) {
        self.pending.remove(&job);
        self.terminating.remove(&job);
        match self.jobs.get(&job).map(|e| &e.state) {
            Some(JobState::Pending) => {
                self.pending.insert(job);
            }
            Some(JobState::Terminating { .. }) => {
                self.terminating.insert(job);
            }
            _ => {}
        }
    }

    /// Whether the pending and terminating indexes agree with a scan of every job
    /// (for tests: every state change must keep them).
    pub fn indexes_agree(&self) -> bool {
        let scan = |f: fn(&JobState) -> bool| -> BTreeSet<JobId> {
            self.jobs
                .values()
                .filter(|e| f(&e.state))
                .map(|e| e.job.id)
                .collect()
        };
        scan(|s| *s == JobState::Pending) == self.pending
            && scan(|s| matches!(s, JobState::Terminating { .. })) == self.terminating
    }

    pub fn state(&self, job: JobId) -> Option<&JobState> {
        self.jobs.get(&job).map(|e| &e.state)
    }

    pub fn job(&self, job: JobId) -> Option<&Job> {
        self.jobs.get(&job).map(|e| &e.job)
    }

    /// The current answer to "why is this pending?" (`None` when not pending or not
    /// tried yet).
    pub fn why_pending(&self, job: JobId) -> Option<&WhyPending> {
        self.jobs
            .get(&job)
            .filter(|e| e.state == JobState::Pending)
            .and_then(|e| e.why.as_ref())
    }

    pub fn reservation(&self) -> Option<&Reservation> {
        self.reservation.as_ref()
    }

    pub fn preemptions(&self) -> u64 {
        self.preemptions
    }

    /// Resources held by each tenant (running and terminating work).
    pub fn usage(&self) -> &[Resources] {
        &self.usage
    }

    /// Whether each tenant has pending work.
    pub fn backlogged(&self) -> Vec<bool> {
        let mut out = vec![false; self.tenants.len()];
        for entry in self.pending.iter().filter_map(|id| self.jobs.get(id)) {
            out[entry.job.tenant] = true;
        }
        out
    }

    pub fn counts(&self) -> Counts {
        let mut counts = Counts::default();
        for entry in self.jobs.values() {
            match entry.state {
                JobState::Pending => counts.pending += 1,
                JobState::Running { .. } => counts.running += 1,
                JobState::Terminating { .. } => counts.terminating += 1,
                JobState::Finished { .. } => counts.finished += 1,
            }
        }
        counts
    }

    pub fn jobs(&self) -> impl Iterator<Item = (&Job, &JobState)> {
        self.jobs.values().map(|e| (&e.job, &e.state))
    }
}
