//! The job scheduler of one region, without the actor around it: node slots that pool
//! agents fill as they connect, the queue of `nephele_placement` (priority classes,
//! dominant resource fairness across tenants, quotas, gangs, preemption with a grace
//! period, a starvation reservation with backfilling), and the JSON views the API
//! returns. No IO, no clock (time is an argument), no async: the region actor calls it
//! and carries out what it returns, and the tests call it directly.
//!
//! Slots: every `[[region.pool]]` gives `max_nodes` nodes built from the pool's firmware
//! profile (CPU cores, memory, the GPUs of its first `gpu` accelerator, MIG slices if
//! the pool sets `mig_profile`, capacity type and price). A slot is down until a pool
//! agent with that profile connects; it goes down again (and its jobs wait again) when
//! the agent disconnects. Slots are the shape later node provisioning fills, as a
//! Karpenter NodePool's limits are.
//!
//! Jobs are named per tenant. What a job does once placed (a container, a training
//! process) is not carried out yet: a placed job holds its resources until it is
//! deleted, preempted, or its node goes away.
//!
//! Carbon: each region keeps the grid signal a feed pushes (`PUT
//! /v1/regions/{name}/grid`, a [`GridSeries`]). A job with a `deadline_unix` is
//! *deferrable*: it is held as `deferred`, out of the queue, while the forecast says a
//! later window is greener ([`GridSeries::decide`], the rule `nephele sim shift`
//! measures), and released into the queue when this hour is the greenest left, when the
//! signal is missing or stale, or at its latest start (`deadline − expected runtime`),
//! whatever the forecast. [`RegionScheduler::offer`] and [`choose_region`] rank regions
//! for a job submitted with `"region": "auto"` (spatial shifting).
//!
//! This file holds the scheduler's state (its types, and the indexes of held jobs, jobs
//! with processes and records touched); the rest is split by concern: `setup.rs`
//! (building it from the config), `admit.rs` (submission and deletion), `validate.rs`
//! (a job spec's checks and never-fits refusals), `pass.rs` (the scheduling pass),
//! `grid.rs` (the grid signal and deferrable jobs), `region_choice.rs` (offers and the
//! choice of a region), `job_views.rs` (the jobs' views, why pending, lists); each of
//! the others (`nodes.rs`, `replicas.rs`, `run.rs`, `books.rs`, `tenants.rs`,
//! `charges.rs`) says what it holds. The ledger `charges.rs` keeps is
//! [`crate::ledger`], shared with the reports.

use std::collections::BTreeMap;

use nephele_placement::grid::{Deferral, GridSeries};
use nephele_placement::{Cluster, Job, JobId, Queue};
use serde::{Deserialize, Serialize};

use crate::config::{NodesConfig, SchedulerConfig};

/// Most members of one gang.
pub const MAX_MEMBERS: u16 = 1024;

/// Longest a deferrable job may be given between now and its deadline.
pub const MAX_DEFER_S: u64 = 30 * 24 * 3600;

pub use crate::config::{AUTO_REGION, SERVING_TENANT};

mod admit;
mod books;
mod charges;
mod grid;
mod job_views;
mod nodes;
mod pass;
mod region_choice;
mod replicas;
mod run;
mod setup;
mod spec;
mod tenants;
mod validate;
mod views;

pub use crate::config::node_spec;
pub use crate::ledger;
pub use books::{JobRecord, NodeRecord, RegionRecord, StoredBinding};
pub use nodes::{NodeAction, NodePhase};
pub use region_choice::choose_region_for;
pub use replicas::ReplicaSpec;
pub use run::PoolWork;

pub use spec::*;
pub use views::*;

/// Why a request to the scheduler was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SchedError {
    #[error("{0}")]
    BadRequest(String),
    /// A bad value in one field of the job spec, naming it.
    #[error("{message}")]
    Invalid { field: String, message: String },
    #[error("{0}")]
    NotFound(String),
    #[error("{0}")]
    Conflict(String),
}

/// What a queue job stands for.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", tag = "kind")]
pub enum JobKind {
    /// A job a tenant submitted (`POST /v1/jobs`).
    Batch,
    /// A cloud replica of a deployment that may offload (see `replicas.rs`).
    Replica { deployment: String },
}

struct JobMeta {
    name: String,
    tenant: usize,
    /// Numbers this submission in the region (a job deleted and submitted again under
    /// its name is another): part of its processes' key on the agents.
    uid: u64,
    kind: JobKind,
    priority: u32,
    preemptible: bool,
    spec: JobSpec,
    submitted_unix: u64,
    started_unix: Option<u64>,
    preempted_by: Option<JobId>,
    requeues: u32,
    /// A deferrable job's plan.
    deferral: Option<Deferred>,
    region_choice: Option<RegionChoiceView>,
    /// Out of the queue while `Some`: the queue job it becomes, and why it waits.
    held: Option<(Job, Hold)>,
    /// Its attempts and their processes.
    run: run::RunState,
}

/// Why a job waits outside the queue.
#[derive(Debug, Clone, PartialEq)]
enum Hold {
    /// For a lower-carbon hour (see `deferral`).
    Deferred,
    /// After a failed attempt, until `until` (unix seconds).
    Backoff { until: u64 },
    /// Restored from the books as running at `bindings` (node names): waits for those
    /// nodes' agents to come back, until `until`, then runs again elsewhere.
    Recovering {
        bindings: Vec<books::StoredBinding>,
        start: u64,
        /// It was terminating (preempted or drained) until this deadline.
        terminating_until: Option<u64>,
        until: u64,
    },
}

struct Deferred {
    plan: Deferral,
    view: DeferralView,
}

/// Settings of a region's scheduler that come from the control plane's config.
#[derive(Debug, Clone)]
pub struct Settings {
    pub grace_s: u64,
    /// `NEPHELE_CHECKPOINT_DIR` = `<checkpoint_root>/<region>/<tenant>/<job>`.
    pub checkpoint_root: String,
    pub rendezvous_ports: [u16; 2],
    pub recover_timeout_s: u64,
    pub retry_backoff_s: u64,
    pub nodes: NodesConfig,
    /// A node whose agent has been away this long loses its work (it runs again
    /// elsewhere); until then its jobs keep their places, as their processes do.
    pub lost_after_s: u64,
}

impl Settings {
    fn from(config: &SchedulerConfig) -> Settings {
        Settings {
            grace_s: config.grace_s,
            checkpoint_root: config
                .checkpoint_root
                .as_ref()
                .map(|p| p.display().to_string())
                .unwrap_or_else(|| "checkpoints".into()),
            rendezvous_ports: config.rendezvous_ports,
            recover_timeout_s: config.recover_timeout_s,
            retry_backoff_s: config.retry_backoff_s.max(1),
            nodes: NodesConfig::default(),
            lost_after_s: 30,
        }
    }
}

pub struct RegionScheduler {
    region: String,
    carbon_zone: Option<String>,
    grid: GridSeries,
    /// One empty, up node per pool: what a job could ever fit on here.
    templates: Cluster,
    cluster: Cluster,
    queue: Queue,
    slots: Vec<nodes::Slot>,
    pools: Vec<nodes::PoolState>,
    gpu_models: Vec<String>,
    tenants: Vec<String>,
    /// The tenant that serving replicas are charged to (not one of the configured).
    serving_tenant: usize,
    jobs: BTreeMap<JobId, JobMeta>,
    by_name: BTreeMap<(usize, String), JobId>,
    next_id: JobId,
    replica_sets: BTreeMap<String, replicas::ReplicaSet>,
    settings: Settings,
    /// Events of calls that return something else (an agent joining), handed out by
    /// the next tick.
    later: Vec<SchedEvent>,
    /// The next submission's `uid` (kept in the books).
    next_uid: u64,
    /// What the pool nodes were used for, hour by hour (chargeback).
    ledger: ledger::Ledger,
    /// Tenants deleted while this scheduler ran: their jobs run on, new ones are
    /// refused (a queue keeps its tenants' indices).
    removed_tenants: std::collections::BTreeSet<usize>,
    /// Per tenant (by index), the most jobs it may have here at once.
    quota_jobs: Vec<Option<u32>>,
    /// Jobs whose record [`Self::admit`] and [`Self::tick`] changed since the last
    /// [`Self::take_touched`], so a batch of submissions writes only its own records;
    /// `touched_all` when something else may have changed too.
    touched: std::collections::BTreeSet<JobId>,
    touched_all: bool,
    /// Jobs that may be held (deferred, backing off, recovering): every job whose
    /// `held` is set is in it ([`Self::index_job`] after each change), and ones that no
    /// longer are leave it at the next tick. The scans of held jobs walk this instead
    /// of every job: a region holds tens of thousands, and a tick runs for every batch
    /// of submissions.
    holding: std::collections::BTreeSet<JobId>,
    /// Jobs with processes for pool agents to run (replicas and batch jobs with a
    /// command); fixed when a job is added, gone ones pruned at the next tick.
    with_processes: std::collections::BTreeSet<JobId>,
}

impl RegionScheduler {
    /// Files a job added or changed in the indexes of held jobs and of jobs with
    /// processes. Called after a job is added and whenever its `held` is set.
    fn index_job(&mut self, id: JobId) {
        let Some(meta) = self.jobs.get(&id) else {
            return;
        };
        if meta.held.is_some() {
            self.holding.insert(id);
        }
        let processes = match &meta.kind {
            JobKind::Replica { .. } => true,
            JobKind::Batch => run::has_command(&meta.spec),
        };
        if processes {
            self.with_processes.insert(id);
        }
    }

    /// Drops jobs that are gone or no longer held from the indexes.
    fn prune_indexes(&mut self) {
        let jobs = &self.jobs;
        self.holding
            .retain(|id| jobs.get(id).is_some_and(|m| m.held.is_some()));
        self.with_processes.retain(|id| jobs.contains_key(id));
    }

    /// The jobs that may be held, with their records (see [`Self::holding`]).
    fn held_jobs(&self) -> impl Iterator<Item = (JobId, &JobMeta)> {
        self.holding
            .iter()
            .filter_map(|id| self.jobs.get(id).map(|m| (*id, m)))
            .filter(|(_, m)| m.held.is_some())
    }

    /// Whether every held job and every job with processes is indexed (for tests:
    /// each change of a job's hold must keep it).
    pub fn indexes_agree(&self) -> bool {
        self.jobs.iter().all(|(id, meta)| {
            (meta.held.is_none() || self.holding.contains(id))
                && (!matches!(meta.kind, JobKind::Replica { .. }) && !run::has_command(&meta.spec)
                    || self.with_processes.contains(id))
        })
    }

    /// The jobs whose records [`Self::admit`] and [`Self::tick`] changed since the last
    /// call, or `None` when any record may have changed (the caller writes them all).
    /// Every other change to the books goes through a full write, so this is exact for
    /// what it covers and conservative for the rest.
    pub fn take_touched(&mut self) -> Option<Vec<JobId>> {
        let touched = std::mem::take(&mut self.touched);
        let all = std::mem::replace(&mut self.touched_all, false);
        // A touched job that is gone needs its key deleted, which a full write finds.
        if all || touched.iter().any(|id| !self.jobs.contains_key(id)) {
            return None;
        }
        Some(touched.into_iter().collect())
    }
}

#[cfg(test)]
mod run_tests;
#[cfg(test)]
mod tests;
