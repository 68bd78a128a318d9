//! The scheduling queue: which pending job is tried next, and what happens when it does
//! not fit. The region actor calls [`Queue::tick`] every tick with the cluster and the
//! time; `nephele sim replay` drives exactly the same calls in virtual time.
//!
//! Per tick, in this order:
//!
//! 1. **Grace periods.** A preempted job whose grace period has passed gives its
//!    resources back and goes back to the queue (its checkpointed progress is kept:
//!    its expected runtime shrinks by the time it ran).
//! 2. **Order.** Priority class first (higher first). Within a class, dominant resource
//!    fairness across tenants: the tenant with the lowest weighted dominant share
//!    (share of the cluster's CPU, memory or GPU, whichever is largest, divided by the
//!    tenant's weight) goes next, and shares are updated after every bind, so this is
//!    DRF's progressive filling done one job at a time. FIFO (submit time, then id)
//!    within a tenant. A job that does not fit does not block the ones after it
//!    (except behind a starvation reservation, below).
//! 3. **Quota.** A job that would take its tenant over a quota waits ("over quota").
//! 4. **Place** (`place` / `place_gang`, all members or none).
//! 5. **Preempt.** A job that does not fit may evict strictly lower-priority preemptible
//!    work, and only when evicting the chosen victims really makes room for it now
//!    (checked on the cluster, never a guess). Within a class, preemption is decided in
//!    a second pass, highest priority first, after every job that fits without one has
//!    been placed, so no preemption counts on room a later job then takes. If the job would already fit once work
//!    that is being preempted has left, nothing more is preempted. Victims get
//!    `Preempt { grace_seconds }` (checkpoint, then stop) and keep their resources until
//!    the grace period has passed.
//! 6. **Starvation.** A job that has waited longer than `aging_seconds` and still does
//!    not fit gets the (single) reservation: the earliest time it would fit if the
//!    running jobs end when they are expected to, and the nodes it would use then
//!    (EASY backfilling, Lifka 1995). Jobs of the same or lower priority then start only
//!    if they end before that time or stay off those nodes, so they never delay it.
//!    When the start cannot be computed (some running work has no expected runtime and
//!    the job fits only once it ends), everything of the same or lower priority waits
//!    behind it, so the capacity it needs drains to it.
//!
//! Everything is deterministic for the same inputs: maps are ordered, ties are broken by
//! ids, and time is an argument.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use crate::cluster::{Binding, Cluster};
use crate::fairness::dominant_share;
use crate::fragmentation::TypicalPods;
use crate::gang::{place_gang, GangRequest, Topology};
use crate::model::{NodeSpec, PodRequest};
use crate::policy::{place, Policy, Unschedulable};
use crate::rng::Rng;

pub type JobId = u64;
/// Index into the tenant list given to [`Queue::new`].
pub type TenantId = usize;

/// Member `i` of job `j` holds cluster reservation `j << MEMBER_BITS | i`.
pub const MEMBER_BITS: u32 = 16;
/// The largest job id the queue accepts (ids share the reservation id space).
pub const MAX_JOB_ID: JobId = (1 << (64 - MEMBER_BITS)) - 1;

/// Named priority classes; a job carries the number, so others can sit between them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum PriorityClass {
    BestEffort,
    Batch,
    Production,
    System,
}

impl PriorityClass {
    pub fn priority(self) -> u32 {
        match self {
            PriorityClass::BestEffort => 0,
            PriorityClass::Batch => 100,
            PriorityClass::Production => 1000,
            PriorityClass::System => 10_000,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            PriorityClass::BestEffort => "best-effort",
            PriorityClass::Batch => "batch",
            PriorityClass::Production => "production",
            PriorityClass::System => "system",
        }
    }
}

/// Per-resource quota of a tenant; `None` means unlimited.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Quota {
    pub cpu_milli: Option<u64>,
    pub memory_mib: Option<u64>,
    pub gpu_milli: Option<u64>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Tenant {
    pub name: String,
    /// Relative entitlement (DRF weight); values ≤ 0 are treated as a tiny weight.
    pub weight: f64,
    pub quota: Quota,
}

/// A job: one pod, or a gang of members placed all or none.
#[derive(Debug, Clone, PartialEq)]
pub struct Job {
    pub id: JobId,
    pub tenant: TenantId,
    /// Higher is more important (see [`PriorityClass::priority`]).
    pub priority: u32,
    /// Seconds, on the caller's clock.
    pub submit: u64,
    pub members: Vec<PodRequest>,
    pub topology: Topology,
    /// Seconds of work; what backfilling and reservations plan with. `None`: unknown.
    pub expected_runtime: Option<u64>,
    pub preemptible: bool,
}

/// Resources as a vector (cpu milli, memory MiB, gpu milli).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Resources {
    pub cpu_milli: u64,
    pub memory_mib: u64,
    pub gpu_milli: u64,
}

impl Resources {
    fn of(members: &[PodRequest]) -> Resources {
        members
            .iter()
            .fold(Resources::default(), |acc, p| Resources {
                cpu_milli: acc.cpu_milli.saturating_add(p.cpu_milli),
                memory_mib: acc.memory_mib.saturating_add(p.memory_mib),
                gpu_milli: acc.gpu_milli.saturating_add(p.gpu_total()),
            })
    }

    fn add(&mut self, other: Resources) {
        self.cpu_milli = self.cpu_milli.saturating_add(other.cpu_milli);
        self.memory_mib = self.memory_mib.saturating_add(other.memory_mib);
        self.gpu_milli = self.gpu_milli.saturating_add(other.gpu_milli);
    }

    fn sub(&mut self, other: Resources) {
        self.cpu_milli = self.cpu_milli.saturating_sub(other.cpu_milli);
        self.memory_mib = self.memory_mib.saturating_sub(other.memory_mib);
        self.gpu_milli = self.gpu_milli.saturating_sub(other.gpu_milli);
    }

    pub fn as_f64(&self) -> [f64; 3] {
        [
            self.cpu_milli as f64,
            self.memory_mib as f64,
            self.gpu_milli as f64,
        ]
    }
}

/// How the queue behaves; the defaults are the full design (DRF, priorities,
/// preemption, aging reservation with EASY backfilling).
#[derive(Debug, Clone, PartialEq)]
pub struct QueueConfig {
    pub policy: Policy,
    /// Order by priority class first (else every job is in one class).
    pub priorities: bool,
    /// DRF across tenants within a class (else one FIFO across tenants).
    pub fairness: bool,
    pub preemption: bool,
    /// Time a victim has to checkpoint before its resources are taken.
    pub grace_seconds: u64,
    /// Wait after which a job that still does not fit gets the reservation; `None`
    /// disables reservations (and so backfilling restrictions).
    pub aging_seconds: Option<u64>,
    /// Seed of the generator handed to `place` (only the `random` policy draws).
    pub seed: u64,
}

impl Default for QueueConfig {
    fn default() -> Self {
        QueueConfig {
            policy: Policy::BestFit,
            priorities: true,
            fairness: true,
            preemption: true,
            grace_seconds: 30,
            aging_seconds: Some(3600),
            seed: 0,
        }
    }
}

/// Why a job is still pending.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WhyPending {
    /// Its tenant's quota would be exceeded ("over quota"), naming the resource.
    OverQuota { resource: &'static str },
    /// No node (or set of nodes, for a gang) can take it: rejections per reason.
    Unschedulable(Unschedulable),
    /// Victims were asked to stop; it waits for their grace period.
    WaitingForPreemption,
    /// It would fit, but starting it could delay the reserved job.
    BehindReservation { reserved: JobId },
    /// It would fit, but on nodes a higher- or equal-priority job preempted work for.
    NominatedFor { job: JobId },
}

impl std::fmt::Display for WhyPending {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            WhyPending::OverQuota { resource } => write!(f, "over quota ({resource})"),
            WhyPending::Unschedulable(why) => write!(f, "{why}"),
            WhyPending::WaitingForPreemption => write!(f, "waiting for preempted work to stop"),
            WhyPending::BehindReservation { reserved } => {
                write!(f, "would delay reserved job {reserved}")
            }
            WhyPending::NominatedFor { job } => {
                write!(f, "its nodes are being freed for job {job}")
            }
        }
    }
}

/// What the shell must carry out after a tick.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Effect {
    /// Start the job; bindings in member order (already reserved in the cluster).
    Bind { job: JobId, bindings: Vec<Binding> },
    /// Tell the victim to checkpoint and stop within `grace_seconds`.
    Preempt {
        victim: JobId,
        by: JobId,
        grace_seconds: u64,
    },
    /// The victim's grace period has passed: its resources are free and it is pending
    /// again (the shell stops it if it is still running).
    Requeued { job: JobId },
    /// A pending job's reason changed (edge-triggered to keep ticks cheap; the current
    /// reason is always [`Queue::why_pending`]).
    Pending { job: JobId, why: WhyPending },
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum JobState {
    Pending,
    Running {
        start: u64,
        bindings: Vec<Binding>,
    },
    /// Preempted; holds its resources until `deadline`.
    Terminating {
        start: u64,
        deadline: u64,
        bindings: Vec<Binding>,
    },
    Finished {
        at: u64,
    },
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum QueueError {
    DuplicateJob(JobId),
    UnknownTenant(TenantId),
    EmptyJob,
    TooManyMembers,
    JobIdTooLarge,
}

impl std::fmt::Display for QueueError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            QueueError::DuplicateJob(id) => write!(f, "job {id} was already submitted"),
            QueueError::UnknownTenant(t) => write!(f, "unknown tenant {t}"),
            QueueError::EmptyJob => write!(f, "a job needs at least one member"),
            QueueError::TooManyMembers => write!(f, "a gang has at most 65536 members"),
            QueueError::JobIdTooLarge => write!(f, "job ids must be below 2^48"),
        }
    }
}

impl std::error::Error for QueueError {}

/// The single starvation reservation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reservation {
    pub job: JobId,
    pub priority: u32,
    /// When it is expected to fit; `None` when that depends on work of unknown length.
    pub start: Option<u64>,
    /// The nodes it would use at `start`.
    pub nodes: BTreeSet<usize>,
}

#[derive(Debug, Clone)]
struct Entry {
    job: Job,
    state: JobState,
    /// Since when it has been pending (submit, or requeue after preemption): aging.
    queued_since: u64,
    /// Remaining expected work (shrinks when preempted after running a while).
    remaining: Option<u64>,
    shape: u32,
    why: Option<WhyPending>,
    demand: Resources,
}

/// Counts of jobs by state (every submitted job is exactly one of these).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Counts {
    pub pending: usize,
    pub running: usize,
    pub terminating: usize,
    pub finished: usize,
}

/// Pods a learning queue needs before it plans with their typical pods, and how many
/// more before it makes them again.
pub const LEARN_MIN_PODS: usize = 100;
/// Seconds between two makings of a learning queue's typical pods: each makes the
/// placement index score its nodes afresh.
pub const LEARN_PERIOD_S: u64 = 60;

#[derive(Debug, Clone)]
pub struct Queue {
    config: QueueConfig,
    tenants: Vec<Tenant>,
    typical: TypicalPods,
    /// The pods submitted lately, when the queue learns its target workload from them
    /// ([`Queue::learn_workload`]).
    recent: crate::workload::RecentPods,
    jobs: BTreeMap<JobId, Entry>,
    /// The pending and the terminating jobs, kept with every state change
    /// ([`Queue::reindex`]) so a pass does not scan the running ones: a region holds
    /// tens of thousands of those, and a pass runs for every batch of submissions.
    pending: BTreeSet<JobId>,
    terminating: BTreeSet<JobId>,
    /// Resources held (running or terminating) per tenant.
    usage: Vec<Resources>,
    /// Interned (members, topology) so that per-tick memos key on a number. The topology
    /// is keyed by its Debug text, which stays right when variants are added.
    shapes: HashMap<(Vec<PodRequest>, String), u32>,
    reservation: Option<Reservation>,
    /// The reservation's start must be computed again.
    reservation_dirty: bool,
    rng: Rng,
    preemptions: u64,
    /// Jobs waiting for their victims to leave, with their priority and the nodes the
    /// victims free: work of the same or lower priority may not start there meanwhile,
    /// or the preemption would have been for nothing (Kubernetes' nominated node).
    nominations: BTreeMap<JobId, (u32, BTreeSet<usize>)>,
    /// The cluster's nodes with nothing running, and which shapes fit there.
    empty: Option<Cluster>,
    ever_fits: HashMap<u32, bool>,
}

fn reservation_id(job: JobId, member: usize) -> u64 {
    (job << MEMBER_BITS) | member as u64
}

/// Cost of evicting a victim: lower priority first, then least work lost, then smallest.
type VictimKey = (u32, u64, u64, u64, JobId);
/// Cost of a victim set on one node: count, highest priority, work lost, size, node.
type SetCost = (usize, u32, u64, u64, usize);

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
    fn reindex(&mut self, job: JobId) {
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

    /// The job ended on its own (completed or failed). Releases its resources; a
    /// pending or finished job is left alone. Returns whether it was running or
    /// terminating.
    pub fn finish(&mut self, cluster: &mut Cluster, job: JobId, now: u64) -> bool {
        let Some(entry) = self.jobs.get(&job) else {
            return false;
        };
        let expected_end = match &entry.state {
            JobState::Running { start, .. } => entry.remaining.map(|r| start.saturating_add(r)),
            JobState::Terminating { deadline, .. } => Some(*deadline),
            _ => return false,
        };
        // Ending earlier than planned frees capacity the reservation did not count on.
        if expected_end.is_none_or(|end| now < end) {
            self.reservation_dirty = true;
        }
        self.release(cluster, job);
        if let Some(entry) = self.jobs.get_mut(&job) {
            entry.state = JobState::Finished { at: now };
        }
        self.reindex(job);
        true
    }

    /// Removes a job in any state, as when its owner cancels it or a finished job is
    /// forgotten: a running or terminating job gives its resources back first. The job
    /// leaves no trace (a later tick drops a reservation or nominations it held).
    /// Returns whether the job existed.
    pub fn remove(&mut self, cluster: &mut Cluster, job: JobId) -> bool {
        let Some(entry) = self.jobs.get(&job) else {
            return false;
        };
        if matches!(
            entry.state,
            JobState::Running { .. } | JobState::Terminating { .. }
        ) {
            // Freed capacity the reservation did not count on.
            self.reservation_dirty = true;
        }
        self.release(cluster, job);
        self.jobs.remove(&job);
        self.reindex(job);
        self.nominations.remove(&job);
        true
    }

    /// Adds a job that is already running at `bindings` (restored books after a
    /// control-plane restart, once its nodes are back): its members are reserved exactly
    /// there, also on nodes that take no new work (the processes run there), and it is
    /// running since `start`. When a binding no longer fits (the node changed, or
    /// something else took the room), nothing is reserved and the job is left pending.
    /// Returns whether it was adopted as running.
    pub fn adopt(
        &mut self,
        cluster: &mut Cluster,
        job: Job,
        bindings: &[Binding],
        start: u64,
    ) -> Result<bool, QueueError> {
        let id = job.id;
        let members = job.members.clone();
        self.submit(job)?;
        if bindings.len() != members.len() {
            return Ok(false);
        }
        for (member, (pod, binding)) in members.iter().zip(bindings).enumerate() {
            if cluster
                .restore(reservation_id(id, member), pod, binding)
                .is_err()
            {
                for done in 0..member {
                    cluster.unreserve(reservation_id(id, done));
                }
                return Ok(false);
            }
        }
        if let Some(entry) = self.jobs.get_mut(&id) {
            entry.state = JobState::Running {
                start,
                bindings: bindings.to_vec(),
            };
            entry.why = None;
            let (tenant, demand) = (entry.job.tenant, entry.demand);
            self.usage[tenant].add(demand);
        }
        self.reindex(id);
        Ok(true)
    }

    /// Asks a running job to stop within `grace_seconds` for a reason of the shell's
    /// (its node is drained, its attempt failed): it becomes terminating, keeps its
    /// resources until then, and is requeued by the tick after the deadline (or at once
    /// by [`Queue::stopped`]). Not counted as a preemption. Returns whether it was
    /// running.
    pub fn evict(&mut self, job: JobId, now: u64, grace_seconds: u64) -> bool {
        let Some(entry) = self.jobs.get_mut(&job) else {
            return false;
        };
        let JobState::Running { start, bindings } = &entry.state else {
            return false;
        };
        entry.state = JobState::Terminating {
            start: *start,
            deadline: now.saturating_add(grace_seconds),
            bindings: bindings.clone(),
        };
        self.reindex(job);
        true
    }

    /// A terminating job's processes have all exited before its grace deadline: its
    /// resources are given back now and it waits again, as when the deadline passes.
    /// Returns whether it was terminating.
    pub fn stopped(&mut self, cluster: &mut Cluster, job: JobId, now: u64) -> bool {
        let Some(entry) = self.jobs.get(&job) else {
            return false;
        };
        if !matches!(entry.state, JobState::Terminating { .. }) {
            return false;
        }
        self.reservation_dirty = true;
        self.release(cluster, job);
        if let Some(entry) = self.jobs.get_mut(&job) {
            if let JobState::Terminating { start, .. } = entry.state {
                let ran = now.saturating_sub(start);
                entry.remaining = entry.remaining.map(|r| r.saturating_sub(ran).max(1));
            }
            entry.state = JobState::Pending;
            entry.queued_since = now;
            entry.why = None;
        }
        self.reindex(job);
        true
    }

    /// A node went away: its jobs (every member of a gang with one member there) lose
    /// their resources and wait again. Returns their ids.
    pub fn node_lost(&mut self, cluster: &mut Cluster, node: usize, now: u64) -> Vec<JobId> {
        let hit: BTreeSet<JobId> = cluster
            .reservations()
            .filter(|(_, (_, b))| b.node == node)
            .map(|(id, _)| id >> MEMBER_BITS)
            .filter(|job| self.jobs.contains_key(job))
            .collect();
        for job in &hit {
            self.release(cluster, *job);
            if let Some(entry) = self.jobs.get_mut(job) {
                entry.state = JobState::Pending;
                entry.queued_since = now;
                entry.why = None;
            }
            self.reindex(*job);
        }
        cluster.node_lost(node);
        self.reservation_dirty = true;
        hit.into_iter().collect()
    }

    /// Gives back a running or terminating job's reservations and tenant usage.
    fn release(&mut self, cluster: &mut Cluster, job: JobId) {
        let Some(entry) = self.jobs.get(&job) else {
            return;
        };
        if !matches!(
            entry.state,
            JobState::Running { .. } | JobState::Terminating { .. }
        ) {
            return;
        }
        for member in 0..entry.job.members.len() {
            cluster.unreserve(reservation_id(job, member));
        }
        let (tenant, demand) = (entry.job.tenant, entry.demand);
        self.usage[tenant].sub(demand);
    }

    fn capacity(cluster: &Cluster) -> [f64; 3] {
        let mut cap = [0.0; 3];
        for node in &cluster.nodes {
            cap[0] += node.cpu_milli as f64;
            cap[1] += node.memory_mib as f64;
            cap[2] += f64::from(node.gpus) * 1000.0;
        }
        cap
    }

    /// Weighted dominant share of a tenant.
    fn share(&self, capacity: &[f64; 3], tenant: TenantId) -> f64 {
        dominant_share(capacity, &self.usage[tenant].as_f64())
            / self.tenants[tenant].weight.max(1e-9)
    }

    fn over_quota(&self, tenant: TenantId, demand: Resources) -> Option<&'static str> {
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
    fn try_place(&mut self, cluster: &Cluster, job: JobId) -> Result<Vec<Binding>, Unschedulable> {
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
    fn commit(
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
    fn with_released<T>(
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

    fn victim_key(&self, victim: JobId, now: u64) -> VictimKey {
        let entry = &self.jobs[&victim];
        let start = match entry.state {
            JobState::Running { start, .. } => start,
            _ => now,
        };
        (
            entry.job.priority,
            now.saturating_sub(start),
            entry.demand.gpu_milli,
            entry.demand.cpu_milli,
            victim,
        )
    }

    /// The cheapest victim set that makes room for `job` now, if any: fewest victims,
    /// then the cheapest (see [`VictimKey`]); every returned set has been checked to
    /// make the job fit.
    fn choose_victims(
        &mut self,
        cluster: &mut Cluster,
        job: JobId,
        now: u64,
    ) -> Option<(Vec<JobId>, BTreeSet<usize>)> {
        let entry = self.jobs.get(&job)?;
        let priority = entry.job.priority;
        let single = entry.job.members.len() == 1;
        let pod = entry.job.members[0].clone();
        let mut candidates: Vec<(VictimKey, JobId)> = self
            .jobs
            .values()
            .filter(|e| {
                e.job.preemptible
                    && e.job.priority < priority
                    && matches!(e.state, JobState::Running { .. })
            })
            .map(|e| (self.victim_key(e.job.id, now), e.job.id))
            .collect();
        if candidates.is_empty() {
            return None;
        }
        candidates.sort();
        if single {
            // Per node: victims with a member there, cheapest first.
            let mut by_node: BTreeMap<usize, Vec<(VictimKey, JobId)>> = BTreeMap::new();
            for (key, victim) in &candidates {
                if let Some(JobState::Running { bindings, .. }) = self.state(*victim) {
                    let nodes: BTreeSet<usize> = bindings.iter().map(|b| b.node).collect();
                    for node in nodes {
                        by_node.entry(node).or_default().push((*key, *victim));
                    }
                }
            }
            let mut best: Option<(SetCost, Vec<JobId>)> = None;
            for (node, victims) in by_node {
                // Fewest first: any single victim that suffices, else the cheapest prefix.
                let mut found: Option<Vec<JobId>> = None;
                for (_, victim) in &victims {
                    if self.with_released(cluster, &[*victim], |_, c| c.check(node, &pod).is_ok()) {
                        found = Some(vec![*victim]);
                        break;
                    }
                }
                if found.is_none() && victims.len() > 1 {
                    let all: Vec<JobId> = victims.iter().map(|(_, v)| *v).collect();
                    let mut prefix = Vec::new();
                    for victim in &all {
                        prefix.push(*victim);
                        if prefix.len() > 1
                            && self
                                .with_released(cluster, &prefix, |_, c| c.check(node, &pod).is_ok())
                        {
                            found = Some(prefix.clone());
                            break;
                        }
                    }
                }
                let Some(set) = found else { continue };
                let keys: Vec<VictimKey> = set.iter().map(|v| self.victim_key(*v, now)).collect();
                let cost = (
                    set.len(),
                    keys.iter().map(|k| k.0).max().unwrap_or(0),
                    keys.iter().map(|k| k.1).sum::<u64>(),
                    keys.iter().map(|k| k.2 + k.3).sum::<u64>(),
                    node,
                );
                if best.as_ref().is_none_or(|(c, _)| cost < *c) {
                    best = Some((cost, set));
                }
            }
            return best.map(|(cost, set)| (set, BTreeSet::from([cost.4])));
        }
        // Gang: the shortest cheapest-first prefix that lets the gang fit (binary search;
        // fitting is monotone in practice), then drop victims on nodes the gang does not use.
        let all: Vec<JobId> = candidates.iter().map(|(_, v)| *v).collect();
        let fits = |queue: &mut Self, cluster: &mut Cluster, set: &[JobId]| {
            queue.with_released(cluster, set, |q, c| q.try_place(c, job).ok())
        };
        fits(self, cluster, &all)?;
        let (mut lo, mut hi) = (1usize, all.len());
        while lo < hi {
            let mid = (lo + hi) / 2;
            if fits(self, cluster, &all[..mid]).is_some() {
                hi = mid;
            } else {
                lo = mid + 1;
            }
        }
        let prefix = all[..lo].to_vec();
        let bindings = fits(self, cluster, &prefix)?;
        let used: BTreeSet<usize> = bindings.iter().map(|b| b.node).collect();
        let pruned: Vec<JobId> = prefix
            .iter()
            .copied()
            .filter(|v| match self.state(*v) {
                Some(JobState::Running { bindings, .. }) => {
                    bindings.iter().any(|b| used.contains(&b.node))
                }
                _ => false,
            })
            .collect();
        match fits(self, cluster, &pruned) {
            Some(bindings) if !pruned.is_empty() => {
                Some((pruned, bindings.iter().map(|b| b.node).collect()))
            }
            _ => Some((prefix, used)),
        }
    }

    /// Whether the job could fit at all, on the same nodes with nothing running (cached
    /// per shape). A job that never fits gets no reservation: it would block the queue
    /// for nothing.
    fn could_ever_fit(&mut self, cluster: &Cluster, job: JobId) -> bool {
        let Some(shape) = self.jobs.get(&job).map(|e| e.shape) else {
            return false;
        };
        if self.empty.as_ref().map(|c| c.nodes.len()) != Some(cluster.nodes.len()) {
            self.empty = Some(Cluster::new(cluster.nodes.clone()));
            self.ever_fits.clear();
        }
        if let Some(known) = self.ever_fits.get(&shape) {
            return *known;
        }
        let Some(empty) = self.empty.take() else {
            return false;
        };
        let fits = self.try_place(&empty, job).is_ok();
        self.empty = Some(empty);
        self.ever_fits.insert(shape, fits);
        fits
    }

    /// When `job` would fit if running work ended when expected, and where; `None`
    /// when it could not fit even on an empty cluster.
    fn plan_reservation(&mut self, cluster: &Cluster, job: JobId, now: u64) -> Option<Reservation> {
        if !self.could_ever_fit(cluster, job) {
            return None;
        }
        let priority = self.jobs.get(&job).map(|e| e.job.priority).unwrap_or(0);
        let mut ends: Vec<(u64, JobId)> = self
            .jobs
            .values()
            .filter_map(|e| match e.state {
                JobState::Running { start, .. } => e
                    .remaining
                    .map(|r| (start.saturating_add(r).max(now), e.job.id)),
                JobState::Terminating { deadline, .. } => Some((deadline.max(now), e.job.id)),
                _ => None,
            })
            .collect();
        ends.sort();
        if let Ok(bindings) = self.try_place(cluster, job) {
            return Some(Reservation {
                job,
                priority,
                start: Some(now),
                nodes: bindings.iter().map(|b| b.node).collect(),
            });
        }
        let mut scratch = cluster.clone();
        let mut idx = 0;
        while idx < ends.len() {
            let at = ends[idx].0;
            while idx < ends.len() && ends[idx].0 == at {
                let victim = ends[idx].1;
                if let Some(entry) = self.jobs.get(&victim) {
                    for member in 0..entry.job.members.len() {
                        scratch.unreserve(reservation_id(victim, member));
                    }
                }
                idx += 1;
            }
            if let Ok(bindings) = self.try_place(&scratch, job) {
                return Some(Reservation {
                    job,
                    priority,
                    start: Some(at),
                    nodes: bindings.iter().map(|b| b.node).collect(),
                });
            }
        }
        Some(Reservation {
            job,
            priority,
            start: None,
            nodes: BTreeSet::new(),
        })
    }

    /// Whether starting `job` on `bindings` now could delay the reservation.
    fn delays_reservation(&self, job: JobId, bindings: &[Binding], now: u64) -> Option<JobId> {
        let reservation = self.reservation.as_ref()?;
        let entry = self.jobs.get(&job)?;
        if reservation.job == job || entry.job.priority > reservation.priority {
            return None;
        }
        let start = reservation.start?;
        // Sure to be gone by then (expected runtimes are taken as exact)...
        if entry
            .remaining
            .is_some_and(|r| now.saturating_add(r) <= start)
        {
            return None;
        }
        // ...or off the nodes the reserved job will use.
        if bindings
            .iter()
            .all(|b| !reservation.nodes.contains(&b.node))
        {
            return None;
        }
        Some(reservation.job)
    }

    fn set_why(&mut self, job: JobId, why: WhyPending, effects: &mut Vec<Effect>) {
        if let Some(entry) = self.jobs.get_mut(&job) {
            if entry.why.as_ref() != Some(&why) {
                entry.why = Some(why.clone());
                effects.push(Effect::Pending { job, why });
            }
        }
    }

    /// One scheduling pass at time `now`. See the module documentation for the order.
    pub fn tick(&mut self, cluster: &mut Cluster, now: u64) -> Vec<Effect> {
        let mut effects = Vec::new();
        // 1. Grace periods that have passed.
        let expired: Vec<JobId> = self
            .terminating
            .iter()
            .filter_map(|id| self.jobs.get(id))
            .filter(
                |e| matches!(e.state, JobState::Terminating { deadline, .. } if deadline <= now),
            )
            .map(|e| e.job.id)
            .collect();
        for job in expired {
            self.release(cluster, job);
            if let Some(entry) = self.jobs.get_mut(&job) {
                if let JobState::Terminating {
                    start, deadline, ..
                } = entry.state
                {
                    // Progress up to the preempt signal was checkpointed.
                    let ran = deadline
                        .saturating_sub(self.config.grace_seconds)
                        .saturating_sub(start);
                    entry.remaining = entry.remaining.map(|r| r.saturating_sub(ran).max(1));
                }
                entry.state = JobState::Pending;
                entry.queued_since = now;
                entry.why = None;
            }
            self.reindex(job);
            effects.push(Effect::Requeued { job });
        }
        let pending = &self.pending;
        self.nominations.retain(|job, _| pending.contains(job));
        // The reservation ends when its job is no longer pending.
        if let Some(reservation) = &self.reservation {
            if self.state(reservation.job) != Some(&JobState::Pending) {
                self.reservation = None;
            } else if reservation.start.is_some_and(|s| s <= now) {
                self.reservation_dirty = true;
            }
        }
        if self.reservation_dirty {
            self.reservation_dirty = false;
            if let Some(job) = self.reservation.as_ref().map(|r| r.job) {
                self.reservation = self.plan_reservation(cluster, job, now);
            }
        }

        // 2. Order: classes (highest first), within a class per-tenant FIFO queues.
        let mut classes: BTreeMap<std::cmp::Reverse<u32>, Vec<Vec<JobId>>> = BTreeMap::new();
        let mut pending: Vec<&Entry> = self
            .pending
            .iter()
            .filter_map(|id| self.jobs.get(id))
            .collect();
        pending.sort_by_key(|e| (e.job.submit, e.job.id));
        let lanes = if self.config.fairness {
            self.tenants.len()
        } else {
            1
        };
        for entry in pending {
            let class = if self.config.priorities {
                entry.job.priority
            } else {
                0
            };
            let lane = if self.config.fairness {
                entry.job.tenant
            } else {
                0
            };
            classes
                .entry(std::cmp::Reverse(class))
                .or_insert_with(|| vec![Vec::new(); lanes])[lane]
                .push(entry.job.id);
        }
        let capacity = Self::capacity(cluster);
        let mut no_fit: HashMap<u32, Unschedulable> = HashMap::new();
        let mut no_victims: BTreeSet<(u32, u32)> = BTreeSet::new();
        for (_, mut lanes) in classes {
            // Pass 1: everything in the class that fits without preempting anyone, in
            // fairness order. Pass 2: preemption for what is left, highest priority
            // first, so no preemption counts on room that a job placed later in the
            // same tick takes without one.
            let mut order = Vec::new();
            let mut heads = vec![0usize; lanes.len()];
            loop {
                // 3. Next: the tenant with the lowest weighted dominant share.
                let next = (0..lanes.len())
                    .filter(|l| heads[*l] < lanes[*l].len())
                    .min_by(|a, b| {
                        if self.config.fairness {
                            self.share(&capacity, *a)
                                .total_cmp(&self.share(&capacity, *b))
                                .then(a.cmp(b))
                        } else {
                            a.cmp(b)
                        }
                    });
                let Some(lane) = next else { break };
                let job = lanes[lane][heads[lane]];
                heads[lane] += 1;
                order.push(job);
                self.attempt(
                    cluster,
                    job,
                    now,
                    false,
                    &mut no_fit,
                    &mut no_victims,
                    &mut effects,
                );
            }
            lanes.clear();
            if self.config.preemption {
                let mut left: Vec<(u32, JobId)> = order
                    .into_iter()
                    .filter_map(|job| {
                        let entry = self.jobs.get(&job)?;
                        (entry.state == JobState::Pending).then_some((entry.job.priority, job))
                    })
                    .collect();
                left.sort_by_key(|(priority, _)| std::cmp::Reverse(*priority));
                for (_, job) in left {
                    self.attempt(
                        cluster,
                        job,
                        now,
                        true,
                        &mut no_fit,
                        &mut no_victims,
                        &mut effects,
                    );
                }
            }
        }
        effects
    }

    /// One placement attempt for `job`; with `preempt` false a job that does not fit is
    /// left for the preemption pass (when preemption is on) without further ado.
    #[allow(clippy::too_many_arguments)]
    fn attempt(
        &mut self,
        cluster: &mut Cluster,
        job: JobId,
        now: u64,
        preempt: bool,
        no_fit: &mut HashMap<u32, Unschedulable>,
        no_victims: &mut BTreeSet<(u32, u32)>,
        effects: &mut Vec<Effect>,
    ) {
        let Some(entry) = self.jobs.get(&job) else {
            return;
        };
        let (tenant, demand, shape, priority) = (
            entry.job.tenant,
            entry.demand,
            entry.shape,
            entry.job.priority,
        );
        let aged = self
            .config
            .aging_seconds
            .is_some_and(|a| now.saturating_sub(entry.queued_since) >= a);
        if let Some(resource) = self.over_quota(tenant, demand) {
            self.set_why(job, WhyPending::OverQuota { resource }, effects);
            return;
        }
        // Unknown start: everything of the same or lower priority waits behind it.
        if let Some(reservation) = &self.reservation {
            if reservation.start.is_none()
                && reservation.job != job
                && priority <= reservation.priority
            {
                let reserved = reservation.job;
                self.set_why(job, WhyPending::BehindReservation { reserved }, effects);
                return;
            }
        }
        // Cluster only fills up within a tick, so a shape that did not fit still does not.
        let placed = match no_fit.get(&shape) {
            Some(why) => Err(why.clone()),
            None => self.try_place(cluster, job),
        };
        match placed {
            Ok(bindings) => {
                let taken = self.nominations.iter().find(|(other, (p, nodes))| {
                    **other != job
                        && *p >= priority
                        && bindings.iter().any(|b| nodes.contains(&b.node))
                });
                if let Some((other, _)) = taken {
                    let other = *other;
                    self.set_why(job, WhyPending::NominatedFor { job: other }, effects);
                    return;
                }
                if let Some(reserved) = self.delays_reservation(job, &bindings, now) {
                    self.set_why(job, WhyPending::BehindReservation { reserved }, effects);
                    return;
                }
                if self.commit(cluster, job, &bindings, now) {
                    self.nominations.remove(&job);
                    if priority > self.reservation.as_ref().map_or(u32::MAX, |r| r.priority) {
                        // Higher-priority work may take what the reservation counted on.
                        self.reservation_dirty = true;
                    }
                    if self.reservation.as_ref().is_some_and(|r| r.job == job) {
                        self.reservation = None;
                    }
                    effects.push(Effect::Bind { job, bindings });
                }
            }
            Err(why) => {
                no_fit.insert(shape, why.clone());
                if self.config.preemption && !preempt {
                    return;
                }
                if self.config.preemption && !no_victims.contains(&(shape, priority)) {
                    // Already waiting for enough preempted work to leave?
                    let terminating: Vec<JobId> = self.terminating.iter().copied().collect();
                    if !terminating.is_empty()
                        && self.with_released(cluster, &terminating, |q, c| {
                            q.try_place(c, job).is_ok()
                        })
                    {
                        self.set_why(job, WhyPending::WaitingForPreemption, effects);
                        return;
                    }
                    match self.choose_victims(cluster, job, now) {
                        Some((victims, nodes)) => {
                            let deadline = now.saturating_add(self.config.grace_seconds);
                            self.nominations.insert(job, (priority, nodes));
                            for victim in victims {
                                if let Some(v) = self.jobs.get_mut(&victim) {
                                    let old = std::mem::replace(&mut v.state, JobState::Pending);
                                    v.state = match old {
                                        JobState::Running { start, bindings } => {
                                            JobState::Terminating {
                                                start,
                                                deadline,
                                                bindings,
                                            }
                                        }
                                        other => other,
                                    };
                                }
                                self.reindex(victim);
                                self.preemptions += 1;
                                effects.push(Effect::Preempt {
                                    victim,
                                    by: job,
                                    grace_seconds: self.config.grace_seconds,
                                });
                            }
                            self.reservation_dirty = true;
                            self.set_why(job, WhyPending::WaitingForPreemption, effects);
                            return;
                        }
                        None => {
                            no_victims.insert((shape, priority));
                        }
                    }
                }
                if aged {
                    let replace = match &self.reservation {
                        None => true,
                        Some(r) => r.job != job && priority > r.priority,
                    };
                    if replace {
                        if let Some(planned) = self.plan_reservation(cluster, job, now) {
                            self.reservation = Some(planned);
                        }
                    }
                }
                self.set_why(job, WhyPending::Unschedulable(why), effects);
            }
        }
    }
}

// `..Default::default()` stays although every field is set today: NodeSpec and
// PodRequest are gaining fields concurrently.
#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::NodeSpec;

    fn cluster(gpus: &[u8]) -> Cluster {
        Cluster::new(
            gpus.iter()
                .enumerate()
                .map(|(i, g)| NodeSpec {
                    name: format!("n{i}"),
                    cpu_milli: 64_000,
                    memory_mib: 256_000,
                    gpus: *g,
                    gpu_model: Some(0),
                    ..Default::default()
                })
                .collect(),
        )
    }

    fn pod(gpus: u8) -> PodRequest {
        PodRequest {
            cpu_milli: 1000,
            memory_mib: 1000,
            num_gpu: gpus,
            gpu_milli: 1000,
            ..Default::default()
        }
    }

    fn job(id: JobId, tenant: TenantId, class: PriorityClass, submit: u64, gpus: u8) -> Job {
        Job {
            id,
            tenant,
            priority: class.priority(),
            submit,
            members: vec![pod(gpus)],
            topology: Topology::Any,
            expected_runtime: Some(100),
            preemptible: class < PriorityClass::Production,
        }
    }

    fn tenants(n: usize) -> Vec<Tenant> {
        (0..n)
            .map(|i| Tenant {
                name: format!("t{i}"),
                weight: 1.0,
                quota: Quota::default(),
            })
            .collect()
    }

    fn queue(config: QueueConfig, n: usize) -> Queue {
        Queue::new(config, tenants(n), TypicalPods::default())
    }

    fn bound(effects: &[Effect]) -> Vec<JobId> {
        effects
            .iter()
            .filter_map(|e| match e {
                Effect::Bind { job, .. } => Some(*job),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn remove_frees_resources_in_any_state_and_forgets_the_job() {
        let mut c = cluster(&[2]);
        let mut q = queue(QueueConfig::default(), 1);
        q.submit(job(1, 0, PriorityClass::Batch, 0, 2)).unwrap();
        q.submit(job(2, 0, PriorityClass::Batch, 1, 2)).unwrap();
        assert_eq!(bound(&q.tick(&mut c, 1)), vec![1]);
        // Pending: just gone.
        assert!(q.remove(&mut c, 2));
        assert_eq!(q.state(2), None);
        // Running: its GPUs come back and the next job gets them.
        assert!(q.remove(&mut c, 1));
        assert_eq!(c.used_gpu_milli(), 0);
        assert_eq!(q.usage()[0], Resources::default());
        assert!(c.accounting_holds());
        assert!(!q.remove(&mut c, 1));
        q.submit(job(3, 0, PriorityClass::Batch, 2, 2)).unwrap();
        assert_eq!(bound(&q.tick(&mut c, 2)), vec![3]);
        assert_eq!(q.counts().running, 1);
    }

    #[test]
    fn higher_priority_class_goes_first() {
        let mut c = cluster(&[1]);
        let config = QueueConfig {
            preemption: false,
            ..Default::default()
        };
        let mut q = queue(config, 1);
        q.submit(job(1, 0, PriorityClass::BestEffort, 0, 1))
            .unwrap();
        q.submit(job(2, 0, PriorityClass::Production, 5, 1))
            .unwrap();
        assert_eq!(bound(&q.tick(&mut c, 10)), vec![2]);
        assert!(matches!(
            q.why_pending(1),
            Some(WhyPending::Unschedulable(_))
        ));
    }

    #[test]
    fn drf_serves_the_tenant_with_the_lowest_dominant_share() {
        let mut c = cluster(&[4]);
        let mut q = queue(QueueConfig::default(), 2);
        q.submit(job(1, 0, PriorityClass::Batch, 0, 1)).unwrap();
        q.submit(job(2, 0, PriorityClass::Batch, 0, 1)).unwrap();
        assert_eq!(bound(&q.tick(&mut c, 0)), vec![1, 2]);
        // Tenant 0 holds half the GPUs; tenant 1 submitted later but goes first.
        for id in 3..5 {
            q.submit(job(id, 0, PriorityClass::Batch, 1, 1)).unwrap();
        }
        for id in 5..7 {
            q.submit(job(id, 1, PriorityClass::Batch, 2, 1)).unwrap();
        }
        assert_eq!(bound(&q.tick(&mut c, 3)), vec![5, 6]);
        // FIFO across tenants ignores shares.
        let mut c = cluster(&[4]);
        let config = QueueConfig {
            fairness: false,
            ..Default::default()
        };
        let mut q = queue(config, 2);
        for id in 1..5 {
            q.submit(job(id, 0, PriorityClass::Batch, id, 1)).unwrap();
        }
        q.submit(job(9, 1, PriorityClass::Batch, 9, 1)).unwrap();
        assert_eq!(bound(&q.tick(&mut c, 10)), vec![1, 2, 3, 4]);
    }

    #[test]
    fn over_quota_jobs_wait_with_a_reason() {
        let mut c = cluster(&[4]);
        let mut t = tenants(1);
        t[0].quota.gpu_milli = Some(1000);
        let mut q = Queue::new(QueueConfig::default(), t, TypicalPods::default());
        q.submit(job(1, 0, PriorityClass::Batch, 0, 1)).unwrap();
        q.submit(job(2, 0, PriorityClass::Batch, 0, 1)).unwrap();
        assert_eq!(bound(&q.tick(&mut c, 0)), vec![1]);
        assert_eq!(
            q.why_pending(2),
            Some(&WhyPending::OverQuota { resource: "gpu" })
        );
        assert!(q.finish(&mut c, 1, 50));
        assert_eq!(bound(&q.tick(&mut c, 50)), vec![2]);
    }

    #[test]
    fn preemption_frees_resources_only_after_the_grace_period() {
        let mut c = cluster(&[1]);
        let mut q = queue(QueueConfig::default(), 1);
        q.submit(job(1, 0, PriorityClass::BestEffort, 0, 1))
            .unwrap();
        assert_eq!(bound(&q.tick(&mut c, 0)), vec![1]);
        q.submit(job(2, 0, PriorityClass::Production, 10, 1))
            .unwrap();
        let effects = q.tick(&mut c, 10);
        assert!(effects.contains(&Effect::Preempt {
            victim: 1,
            by: 2,
            grace_seconds: 30
        }));
        assert_eq!(
            c.used_gpu_milli(),
            1000,
            "victim keeps its GPU during grace"
        );
        assert!(bound(&q.tick(&mut c, 20)).is_empty());
        assert_eq!(q.preemptions(), 1, "no second preemption while waiting");
        let effects = q.tick(&mut c, 40);
        assert!(effects.contains(&Effect::Requeued { job: 1 }));
        assert_eq!(bound(&effects), vec![2]);
        assert_eq!(q.state(1), Some(&JobState::Pending));
    }

    #[test]
    fn no_useless_or_equal_priority_preemption() {
        let mut c = cluster(&[1]);
        let mut q = queue(QueueConfig::default(), 1);
        q.submit(job(1, 0, PriorityClass::BestEffort, 0, 1))
            .unwrap();
        q.tick(&mut c, 0);
        // Needs two GPUs: evicting everything still would not make room.
        q.submit(job(2, 0, PriorityClass::Production, 1, 2))
            .unwrap();
        // Same priority: never a victim.
        q.submit(job(3, 0, PriorityClass::BestEffort, 1, 1))
            .unwrap();
        let effects = q.tick(&mut c, 1);
        assert!(!effects.iter().any(|e| matches!(e, Effect::Preempt { .. })));
    }

    #[test]
    fn fewest_then_cheapest_victims() {
        let mut c = cluster(&[2, 2]);
        let mut q = queue(QueueConfig::default(), 1);
        // Node 0: two 1-GPU best-effort jobs; node 1: one 2-GPU batch job.
        q.submit(job(1, 0, PriorityClass::BestEffort, 0, 1))
            .unwrap();
        q.submit(job(2, 0, PriorityClass::BestEffort, 0, 1))
            .unwrap();
        q.submit(job(3, 0, PriorityClass::Batch, 0, 2)).unwrap();
        assert_eq!(bound(&q.tick(&mut c, 0)).len(), 3);
        q.submit(job(4, 0, PriorityClass::Production, 5, 2))
            .unwrap();
        let victims: Vec<JobId> = q
            .tick(&mut c, 5)
            .iter()
            .filter_map(|e| match e {
                Effect::Preempt { victim, .. } => Some(*victim),
                _ => None,
            })
            .collect();
        assert_eq!(victims, vec![3], "one victim beats two cheaper ones");
    }

    #[test]
    fn aged_job_gets_a_reservation_and_backfill_cannot_delay_it() {
        let mut c = cluster(&[5]);
        let config = QueueConfig {
            preemption: false,
            aging_seconds: Some(0),
            ..Default::default()
        };
        let mut q = queue(config, 1);
        let mut short = job(1, 0, PriorityClass::Batch, 0, 1);
        short.expected_runtime = Some(100);
        let mut long = job(2, 0, PriorityClass::Batch, 0, 2);
        long.expected_runtime = Some(1000);
        q.submit(short).unwrap();
        q.submit(long).unwrap();
        assert_eq!(bound(&q.tick(&mut c, 0)), vec![1, 2]);
        q.submit(job(3, 0, PriorityClass::Batch, 10, 4)).unwrap();
        let mut fits_before = job(4, 0, PriorityClass::Batch, 11, 1);
        fits_before.expected_runtime = Some(50);
        let mut too_long = job(5, 0, PriorityClass::Batch, 12, 1);
        too_long.expected_runtime = Some(5000);
        q.submit(fits_before).unwrap();
        q.submit(too_long).unwrap();
        assert_eq!(bound(&q.tick(&mut c, 20)), vec![4]);
        let reservation = q.reservation().cloned().unwrap();
        assert_eq!((reservation.job, reservation.start), (3, Some(1000)));
        assert_eq!(
            q.why_pending(5),
            Some(&WhyPending::BehindReservation { reserved: 3 })
        );
        q.finish(&mut c, 4, 70);
        q.finish(&mut c, 1, 100);
        assert!(bound(&q.tick(&mut c, 100)).is_empty());
        q.finish(&mut c, 2, 1000);
        // The reserved job starts on time; the long one may go once it has.
        assert_eq!(bound(&q.tick(&mut c, 1000)), vec![3, 5]);
        assert!(q.reservation().is_none());
    }

    #[test]
    fn a_job_that_can_never_fit_gets_no_reservation() {
        let mut c = cluster(&[2]);
        let config = QueueConfig {
            aging_seconds: Some(0),
            ..Default::default()
        };
        let mut q = queue(config, 1);
        q.submit(job(1, 0, PriorityClass::Production, 0, 4))
            .unwrap();
        q.submit(job(2, 0, PriorityClass::Batch, 1, 1)).unwrap();
        assert_eq!(bound(&q.tick(&mut c, 5)), vec![2]);
        assert!(q.reservation().is_none());
    }

    #[test]
    fn bad_submissions_are_errors() {
        let mut q = queue(QueueConfig::default(), 1);
        q.submit(job(1, 0, PriorityClass::Batch, 0, 1)).unwrap();
        assert_eq!(
            q.submit(job(1, 0, PriorityClass::Batch, 0, 1)),
            Err(QueueError::DuplicateJob(1))
        );
        assert_eq!(
            q.submit(job(2, 7, PriorityClass::Batch, 0, 1)),
            Err(QueueError::UnknownTenant(7))
        );
        let mut empty = job(3, 0, PriorityClass::Batch, 0, 1);
        empty.members.clear();
        assert_eq!(q.submit(empty), Err(QueueError::EmptyJob));
        assert_eq!(
            q.submit(job(MAX_JOB_ID + 1, 0, PriorityClass::Batch, 0, 1)),
            Err(QueueError::JobIdTooLarge)
        );
    }

    #[test]
    fn gang_is_placed_whole_and_can_preempt() {
        let mut c = cluster(&[2, 2]);
        let mut q = queue(QueueConfig::default(), 1);
        q.submit(job(1, 0, PriorityClass::BestEffort, 0, 1))
            .unwrap();
        q.tick(&mut c, 0);
        let mut gang = job(2, 0, PriorityClass::Production, 1, 2);
        gang.members = vec![pod(2), pod(2)];
        q.submit(gang).unwrap();
        let effects = q.tick(&mut c, 1);
        assert!(effects
            .iter()
            .any(|e| matches!(e, Effect::Preempt { victim: 1, .. })));
        let effects = q.tick(&mut c, 31);
        assert_eq!(bound(&effects), vec![2]);
        assert_eq!(c.used_gpu_milli(), 4000);
    }
}
