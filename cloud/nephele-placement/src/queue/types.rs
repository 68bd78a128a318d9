//! The queue's vocabulary: job and tenant ids, priority classes, quotas, jobs and
//! their resources, the configuration, why a job waits, the effects a pass has, job
//! states, errors, the starvation reservation and the counts by state.

use std::collections::BTreeSet;

use crate::cluster::Binding;
use crate::gang::Topology;
use crate::model::PodRequest;
use crate::policy::{Policy, Unschedulable};

pub type JobId = u64;
/// Index into the tenant list given to [`Queue::new`](super::Queue::new).
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
    pub(super) fn of(members: &[PodRequest]) -> Resources {
        members
            .iter()
            .fold(Resources::default(), |acc, p| Resources {
                cpu_milli: acc.cpu_milli.saturating_add(p.cpu_milli),
                memory_mib: acc.memory_mib.saturating_add(p.memory_mib),
                gpu_milli: acc.gpu_milli.saturating_add(p.gpu_total()),
            })
    }

    pub(super) fn add(&mut self, other: Resources) {
        self.cpu_milli = self.cpu_milli.saturating_add(other.cpu_milli);
        self.memory_mib = self.memory_mib.saturating_add(other.memory_mib);
        self.gpu_milli = self.gpu_milli.saturating_add(other.gpu_milli);
    }

    pub(super) fn sub(&mut self, other: Resources) {
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
    /// reason is always [`Queue::why_pending`](super::Queue::why_pending)).
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

/// Counts of jobs by state (every submitted job is exactly one of these).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Counts {
    pub pending: usize,
    pub running: usize,
    pub terminating: usize,
    pub finished: usize,
}
