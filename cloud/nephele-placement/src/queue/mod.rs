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
//!
//! The queue is split by concern: `types` holds the vocabulary (jobs, tenants, states,
//! effects), `state` the queue's book-keeping and what it tells, `lifecycle` what
//! happens to a job from outside (it ends, is removed, adopted, evicted, lost), `place`
//! quota, shares and trial placement, `preempt` the choice of victims, `reservation`
//! the starvation reservation, and `tick` the scheduling pass itself.

mod lifecycle;
mod place;
mod preempt;
mod reservation;
mod state;
#[cfg(test)]
mod tests;
mod tick;
mod types;

use std::collections::{BTreeMap, BTreeSet, HashMap};

use crate::cluster::Cluster;
use crate::fragmentation::TypicalPods;
use crate::model::PodRequest;
use crate::rng::Rng;

pub use types::{
    Counts, Effect, Job, JobId, JobState, PriorityClass, QueueConfig, QueueError, Quota,
    Reservation, Resources, Tenant, TenantId, WhyPending, MAX_JOB_ID, MEMBER_BITS,
};

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
