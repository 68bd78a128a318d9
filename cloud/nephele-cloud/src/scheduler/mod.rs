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

use std::collections::BTreeMap;

use nephele_domain::AcceleratorKind;
use nephele_placement::carbon::{self, Excluded, RegionOffer, RegionWeights};
use nephele_placement::grid::{
    utc_hour, DeferDecision, Deferral, GridError, GridPoint, GridSeries, NoOutlook, StartReason,
    HOUR_S,
};
use nephele_placement::queue::{JobState, Quota, Tenant, WhyPending};
use nephele_placement::workload;
use nephele_placement::{
    Binding, CapacityType, Cluster, Effect, Job, JobId, MigPartition, MigProfile, NodeSpec,
    PodRequest, Policy, PriorityClass, Queue, QueueConfig, Reason, Topology, TypicalPods,
};
use serde::{Deserialize, Serialize};

use crate::config::{NodesConfig, PoolConfig, RegionConfig, SchedulerConfig, TenantConfig};

/// Most members of one gang.
pub const MAX_MEMBERS: u16 = 1024;

/// Longest a deferrable job may be given between now and its deadline.
pub const MAX_DEFER_S: u64 = 30 * 24 * 3600;

/// The region name that asks the control plane to choose one.
pub const AUTO_REGION: &str = "auto";

/// The tenant serving replicas are charged to; no configured tenant may take the name.
pub const SERVING_TENANT: &str = "serving";

mod books;
mod charges;
pub mod ledger;
mod nodes;
mod replicas;
mod run;
mod spec;
mod tenants;
mod views;

pub use books::{JobRecord, NodeRecord, RegionRecord, StoredBinding};
pub use nodes::{NodeAction, NodePhase};
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

/// A node template for `pool`, from its built-in firmware profile, and the name of its
/// GPU model (the caller interns it into [`NodeSpec::gpu_model`]).
pub fn node_spec(region: &str, pool: &PoolConfig) -> Result<(NodeSpec, Option<String>), String> {
    let profile = nephele_domain::builtin_profiles::builtin(&pool.node_profile)
        .ok_or_else(|| {
            format!(
                "node_profile {:?} is not a built-in profile; use one of: {}",
                pool.node_profile,
                nephele_domain::builtin_profiles::builtin_names().join(", ")
            )
        })?
        .map_err(|e| format!("profile {}: {e}", pool.node_profile))?;
    let gpu = profile
        .accelerators
        .iter()
        .find(|a| a.kind == AcceleratorKind::Gpu);
    let gpus = gpu.map_or(0, |g| g.count.min(64) as u8);
    let mut mig = Vec::new();
    if let Some(name) = &pool.mig_profile {
        let spec = gpu
            .and_then(|g| g.mig.iter().find(|m| &m.name == name))
            .ok_or_else(|| {
                let known: Vec<&str> = gpu
                    .map(|g| g.mig.iter().map(|m| m.name.as_str()).collect())
                    .unwrap_or_default();
                format!(
                    "mig_profile {name:?} is not offered by {} (MIG profiles: {})",
                    pool.node_profile,
                    if known.is_empty() {
                        "none".to_string()
                    } else {
                        known.join(", ")
                    }
                )
            })?;
        let profile = MigProfile::parse(name)
            .ok_or_else(|| format!("mig_profile {name:?} is not of the form 1g.10gb"))?;
        for index in 0..gpus {
            mig.push(MigPartition {
                gpu: index,
                profile,
                count: spec.max_instances.min(7) as u8,
            });
        }
    }
    let labels = BTreeMap::from([
        ("nephele.io/pool".to_string(), pool.name.clone()),
        ("nephele.io/profile".to_string(), pool.node_profile.clone()),
        ("nephele.io/region".to_string(), region.to_string()),
        (
            "nephele.io/capacity-type".to_string(),
            pool.capacity_type.clone(),
        ),
    ]);
    let spot = pool.capacity_type == "spot";
    Ok((
        NodeSpec {
            name: String::new(),
            cpu_milli: u64::from(profile.device.cpu_cores) * 1000,
            memory_mib: profile.device.memory_mb,
            gpus,
            gpu_model: None,
            mig,
            nvlink_domain: Vec::new(),
            labels,
            taints: Vec::new(),
            location: Default::default(),
            capacity_type: if spot {
                CapacityType::Spot
            } else {
                CapacityType::OnDemand
            },
            price_micro_usd_per_hour: (pool.price_per_hour.max(0.0) * 1e6) as u64,
            interruptions_per_1000h: pool.interruptions_per_1000h,
        },
        gpu.filter(|_| gpus > 0).map(|g| g.model.clone()),
    ))
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
    pub fn new(
        region: &RegionConfig,
        tenants: &[TenantConfig],
        config: &SchedulerConfig,
    ) -> Result<RegionScheduler, String> {
        let policy = Policy::parse(&config.policy)
            .ok_or_else(|| format!("unknown scheduler policy {:?}", config.policy))?;
        let mut gpu_models: Vec<String> = Vec::new();
        let mut nodes = Vec::new();
        let mut slots = Vec::new();
        let mut templates = Vec::new();
        let mut pools = Vec::new();
        for (pool_index, pool) in region.pools.iter().enumerate() {
            let (template, model) = node_spec(&region.name, pool)?;
            let interned = model.as_ref().map(|m| {
                gpu_models.iter().position(|k| k == m).unwrap_or_else(|| {
                    gpu_models.push(m.clone());
                    gpu_models.len() - 1
                }) as u16
            });
            let mut shape = template.clone();
            shape.name = pool.name.clone();
            shape.gpu_model = interned;
            templates.push(shape);
            pools.push(nodes::PoolState::new(pool));
            for index in 0..pool.max_nodes {
                let mut spec = template.clone();
                spec.name = format!("{}-{index}", pool.name);
                spec.gpu_model = interned;
                slots.push(nodes::Slot::new(
                    &region.name,
                    pool,
                    pool_index,
                    index,
                    &spec.name,
                    model.clone(),
                ));
                nodes.push(spec);
            }
        }
        let mut cluster = Cluster::new(nodes);
        for node in 0..slots.len() {
            cluster.node_lost(node);
        }
        let mut quota_jobs: Vec<Option<u32>> = tenants.iter().map(|t| t.quota_jobs).collect();
        let mut tenant_list: Vec<Tenant> = if tenants.is_empty() {
            vec![Tenant {
                name: "default".into(),
                weight: 1.0,
                quota: Quota::default(),
            }]
        } else {
            tenants
                .iter()
                .map(|t| Tenant {
                    name: t.name.clone(),
                    weight: t.weight,
                    quota: Quota {
                        cpu_milli: t.quota_cpu_milli,
                        memory_mib: t.quota_memory_mib,
                        gpu_milli: t.quota_gpu_milli,
                    },
                })
                .collect()
        };
        if tenant_list.iter().any(|t| t.name == SERVING_TENANT) {
            return Err(format!(
                "tenant {SERVING_TENANT:?} is reserved for serving replicas; rename it"
            ));
        }
        let serving_tenant = tenant_list.len();
        quota_jobs.resize(serving_tenant + 1, None);
        tenant_list.push(Tenant {
            name: SERVING_TENANT.into(),
            weight: 1.0,
            quota: Quota::default(),
        });
        let queue_config = QueueConfig {
            policy,
            priorities: true,
            fairness: config.fairness,
            preemption: config.preemption,
            grace_seconds: config.grace_s,
            aging_seconds: (config.aging_s > 0).then_some(config.aging_s),
            seed: 0,
        };
        let tenant_names = tenant_list.iter().map(|t| t.name.clone()).collect();
        let mut queue = Queue::new(queue_config, tenant_list, workload::starting_mix());
        // Until it has seen enough of its own, and then from its latest RECENT_PODS.
        queue.learn_workload(workload::RECENT_PODS);
        Ok(RegionScheduler {
            region: region.name.clone(),
            carbon_zone: region.carbon_zone.clone(),
            grid: GridSeries::default(),
            templates: Cluster::new(templates),
            cluster,
            tenants: tenant_names,
            serving_tenant,
            queue,
            slots,
            pools,
            gpu_models,
            jobs: BTreeMap::new(),
            by_name: BTreeMap::new(),
            next_id: 1,
            replica_sets: BTreeMap::new(),
            settings: Settings::from(config),
            later: Vec::new(),
            next_uid: 1,
            ledger: ledger::Ledger::default(),
            removed_tenants: std::collections::BTreeSet::new(),
            quota_jobs,
            touched: std::collections::BTreeSet::new(),
            touched_all: true,
            holding: std::collections::BTreeSet::new(),
            with_processes: std::collections::BTreeSet::new(),
        })
    }

    /// With the node-provisioning settings (`[nodes]`) and how long an agent may be
    /// away before its node's work runs elsewhere.
    pub fn with_nodes(mut self, nodes: NodesConfig, lost_after_s: u64) -> Self {
        self.settings.nodes = nodes;
        self.settings.lost_after_s = lost_after_s.max(1);
        self
    }

    /// Where checkpoint directories go when the config names no `checkpoint_root`.
    pub fn with_default_checkpoint_root(mut self, root: &str) -> Self {
        if self.settings.checkpoint_root == "checkpoints" {
            self.settings.checkpoint_root = root.to_string();
        }
        self
    }

    pub fn region(&self) -> &str {
        &self.region
    }

    /// The tenants jobs may be submitted for (not the internal serving tenant, nor
    /// deleted ones).
    pub fn tenant_names(&self) -> Vec<&str> {
        (0..self.tenants.len())
            .filter(|&i| self.is_user_tenant(i) && !self.removed_tenants.contains(&i))
            .map(|i| self.tenants[i].as_str())
            .collect()
    }

    fn is_user_tenant(&self, index: usize) -> bool {
        index != self.serving_tenant && index < self.tenants.len()
    }

    /// A tenant's index, a deleted one's included (its jobs still run until they end).
    fn tenant_position(&self, tenant: &str) -> Option<usize> {
        (0..self.tenants.len()).find(|&i| self.is_user_tenant(i) && self.tenants[i] == tenant)
    }

    /// The index of a tenant jobs may be submitted for.
    fn tenant_index(&self, tenant: &str) -> Result<usize, SchedError> {
        self.tenant_position(tenant)
            .filter(|i| !self.removed_tenants.contains(i))
            .ok_or_else(|| {
                SchedError::BadRequest(format!(
                    "unknown tenant {tenant:?}; tenants: {}",
                    self.tenant_names().join(", ")
                ))
            })
    }

    /// Refuses a job that asks for more in all than its tenant's whole quota: it could
    /// never start, even with nothing else of the tenant's running.
    fn within_whole_quota(
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

    fn pod_of(&self, spec: &JobSpec) -> Result<PodRequest, SchedError> {
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
    fn never_fits(&self, pod: &PodRequest, members: u16, topology: TopologySpec) -> Option<String> {
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

    /// [`Self::submit`] for a job whose region was chosen by [`choose_region_for`].
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

    /// A job's view by id (`None` once it is gone).
    pub fn job_view(&self, id: JobId) -> Option<JobView> {
        self.view_of(id)
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
    fn state_name(&self, id: JobId, meta: &JobMeta) -> Option<&'static str> {
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

    /// Checks a deadline and plans the wait; the first decision is the next tick's.
    fn plan_deferral(
        &mut self,
        spec: &JobSpec,
        deadline: u64,
        now: u64,
    ) -> Result<(Deferral, DeferralView), SchedError> {
        let bad = |m: String| Err(SchedError::BadRequest(m));
        let Some(runtime) = spec.expected_runtime_s.filter(|r| *r > 0) else {
            return bad(
                "deadline_unix needs expected_runtime_s (> 0): the runtime decides when the job must start"
                    .into(),
            );
        };
        let Some(plan) = Deferral::new(runtime, deadline).filter(|p| p.latest_start >= now) else {
            return bad(format!(
                "deadline_unix {deadline} leaves less than expected_runtime_s ({runtime} s) after now ({now})"
            ));
        };
        if deadline - now > MAX_DEFER_S {
            return bad(format!(
                "deadline_unix {deadline} is more than {} days away",
                MAX_DEFER_S / 86_400
            ));
        }
        let carbon_at_submit = self
            .grid
            .best_window(now, None, plan.duration_hours)
            .ok()
            .map(|w| w.carbon);
        let view = DeferralView {
            deadline_unix: deadline,
            latest_start_unix: plan.latest_start,
            state: "waiting".into(),
            reason: "not decided yet".into(),
            carbon_at_submit,
            carbon_now: carbon_at_submit,
            best_start_unix: None,
            best_carbon: None,
            released_unix: None,
        };
        Ok((plan, view))
    }

    /// This hour's start-or-wait decision for every held job; released ones join the
    /// queue with `now` as their submission time.
    fn release_deferred(&mut self, now: u64) -> Vec<SchedEvent> {
        let mut events = Vec::new();
        let held: Vec<JobId> = self
            .held_jobs()
            .filter(|(_, m)| matches!(m.held, Some((_, Hold::Deferred))))
            .map(|(id, _)| id)
            .collect();
        for id in held {
            let Some(meta) = self.jobs.get_mut(&id) else {
                continue;
            };
            let name = format!("{}/{}", self.tenants[meta.tenant], meta.name);
            let Some(deferred) = meta.deferral.as_mut() else {
                continue;
            };
            let view = &mut deferred.view;
            match self.grid.decide(now, &deferred.plan) {
                DeferDecision::Wait {
                    now_carbon,
                    best_hour,
                    best_carbon,
                } => {
                    view.carbon_now = Some(now_carbon);
                    view.best_start_unix = Some(best_hour * HOUR_S);
                    view.best_carbon = Some(best_carbon);
                    view.reason = format!(
                        "waiting for a lower-carbon hour: {now_carbon:.0} g/kWh if it started now, {best_carbon:.0} forecast from {}",
                        utc_hour(best_hour)
                    );
                }
                DeferDecision::Start(reason) => {
                    let Some((mut job, _)) = meta.held.take() else {
                        continue;
                    };
                    job.submit = now;
                    view.carbon_now = self
                        .grid
                        .best_window(now, None, deferred.plan.duration_hours)
                        .ok()
                        .map(|w| w.carbon);
                    view.reason = match reason {
                        StartReason::LatestStart => {
                            "released at its latest start: any later would miss the deadline"
                                .to_string()
                        }
                        StartReason::NoSignal(why) => format!("released without waiting: {why}"),
                        StartReason::LowestNow { carbon } => format!(
                            "released: no later window is forecast below this one ({carbon:.0} g/kWh)"
                        ),
                    };
                    if let Err(error) = self.queue.submit(job.clone()) {
                        // Cannot happen for a fresh id; keep it held rather than lose it.
                        view.reason = format!("could not queue it ({error}); retrying");
                        meta.held = Some((job, Hold::Deferred));
                        self.holding.insert(id);
                        continue;
                    }
                    view.state = "released".into();
                    view.released_unix = Some(now);
                    view.best_start_unix = None;
                    view.best_carbon = None;
                    events.push(SchedEvent::Released {
                        job: name,
                        reason: view.reason.clone(),
                    });
                }
            }
        }
        events
    }

    /// The forecast kept in the region's books (see [`RegionRecord::grid_forecast`]).
    pub fn stored_forecast(&self) -> Option<books::StoredForecast> {
        self.grid.provider_forecast().map(|f| {
            let points = f
                .carbon
                .iter()
                .enumerate()
                .filter(|(_, v)| v.is_finite())
                .map(|(i, v)| (f.first_hour + i as u64, *v))
                .collect();
            (f.issued, f.source.clone(), points)
        })
    }

    /// Stores grid measurements and a provider's forecast (all of both, or none) and
    /// re-decides the held jobs.
    pub fn push_grid(
        &mut self,
        points: &[GridPoint],
        forecast: Option<&ForecastPush>,
        now: u64,
    ) -> Result<(GridPushView, Vec<SchedEvent>), SchedError> {
        if points.is_empty() && forecast.is_none() {
            return Err(SchedError::BadRequest(
                "no points: give measured \"points\", a provider's \"forecast\", or both".into(),
            ));
        }
        let bad = |e: GridError| SchedError::BadRequest(e.to_string());
        // On a copy first, so that a bad forecast leaves the measurements out too.
        let mut grid = self.grid.clone();
        let ingested = if points.is_empty() {
            Default::default()
        } else {
            grid.ingest(points, now).map_err(bad)?
        };
        let forecast_ingested = forecast
            .map(|f| grid.ingest_forecast(&f.points, f.issued, &f.source, now))
            .transpose()
            .map_err(bad)?;
        self.grid = grid;
        let events = self.tick(now);
        Ok((
            GridPushView {
                kept: ingested.kept,
                too_old: ingested.too_old,
                forecast_hours: forecast_ingested.map(|f| f.hours),
                replaced_forecast_issued_unix: forecast_ingested.and_then(|f| f.replaced),
                grid: self.grid_view(now),
            },
            events,
        ))
    }

    /// The grid signal as the carbon decisions see it at `now`.
    pub fn grid_view(&mut self, now: u64) -> GridView {
        let deferred_jobs = self
            .held_jobs()
            .filter(|(_, m)| matches!(m.held, Some((_, Hold::Deferred))))
            .count();
        let (signal, note, outlook) = match self.grid.outlook(now) {
            Ok(outlook) => (
                "fresh",
                None,
                (0..outlook.carbon.len())
                    .map(|i| GridHourView {
                        unix: (outlook.from_hour + i as u64) * HOUR_S,
                        carbon_g_per_kwh: outlook.carbon[i],
                        measured: outlook.measured[i],
                        source: if outlook.measured[i] {
                            "measured"
                        } else if outlook.provider[i] {
                            "provider"
                        } else {
                            "model"
                        }
                        .into(),
                        price_per_mwh: Some(outlook.price[i]).filter(|p| p.is_finite()),
                    })
                    .collect(),
            ),
            Err(why @ NoOutlook::NoData) => (
                "none",
                Some(format!(
                    "{why}: push measurements with `nephele grid push {}` (PUT /v1/regions/{}/grid); until then deferrable jobs start at once",
                    self.region, self.region
                )),
                Vec::new(),
            ),
            Err(why @ NoOutlook::Stale { .. }) => (
                "stale",
                Some(format!(
                    "{why}: deferrable jobs start at once until the feed catches up"
                )),
                Vec::new(),
            ),
        };
        let forecast = self.grid.provider_forecast().map(|f| {
            let span = f.span().unwrap_or((f.first_hour, f.first_hour));
            ProviderForecastView {
                source: f.source.clone(),
                issued_unix: f.issued,
                hours: f.carbon.iter().filter(|v| v.is_finite()).count(),
                first_unix: span.0 * HOUR_S,
                last_unix: span.1 * HOUR_S,
                fresh: f.fresh(now),
            }
        });
        GridView {
            region: self.region.clone(),
            carbon_zone: self.carbon_zone.clone(),
            signal: signal.into(),
            note,
            forecast,
            measured_hours: self.grid.measured_hours(),
            latest_measured_unix: self.grid.latest_measured().map(|h| h * HOUR_S),
            outlook,
            deferred_jobs,
        }
    }

    /// What this region offers `spec` for `"region": "auto"`: whether it could ever
    /// take it, its free capacity, and the job's greenest window here.
    pub fn offer(&mut self, spec: &JobSpec, now: u64) -> JobOffer {
        let members = f64::from(spec.members.max(1));
        let gpu_job = spec.gpus > 0 || spec.mig_profile.is_some();
        let per_member =
            if let Some(profile) = spec.mig_profile.as_deref().and_then(MigProfile::parse) {
                f64::from(profile.milli()) / 1000.0
            } else if spec.gpus > 0 {
                f64::from(spec.gpus) * f64::from(spec.gpu_milli.unwrap_or(1000)) / 1000.0
            } else {
                spec.cpu_milli as f64 / 1000.0
            };
        let free = self
            .cluster
            .state
            .iter()
            .filter(|state| state.up)
            .map(|state| {
                if gpu_job {
                    state.gpu_left.iter().map(|m| f64::from(*m)).sum::<f64>() / 1000.0
                } else {
                    state.cpu_left as f64 / 1000.0
                }
            })
            // Not `sum()`: an empty f64 sum is -0.0.
            .fold(0.0, |total, free| total + free);
        let unfit = match self.pod_of(spec) {
            Err(error) => Some(error.to_string()),
            Ok(_) if self.slots.is_empty() => Some(format!("region {} has no pools", self.region)),
            Ok(pod) => (!(0..self.templates.nodes.len())
                .any(|i| self.templates.check(i, &pod).is_ok()))
            .then(|| {
                format!(
                    "no pool of region {} has nodes that fit one member",
                    self.region
                )
            }),
        };
        let duration = spec
            .expected_runtime_s
            .map_or(1, |r| r.div_ceil(HOUR_S).max(1) as usize);
        let latest = spec
            .deadline_unix
            .and_then(|d| d.checked_sub(spec.expected_runtime_s.unwrap_or(0)));
        let window = self
            .grid
            .best_window(now, latest, duration)
            .map(|w| (w.start_hour * HOUR_S, w.carbon, w.price))
            .map_err(|why| why.to_string());
        JobOffer {
            region: self.region.clone(),
            unfit,
            unit: if gpu_job { "gpu" } else { "cpu" },
            demand: per_member * members,
            free,
            window,
        }
    }

    fn lookup(&self, tenant: &str, name: &str) -> Result<JobId, SchedError> {
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
    fn forget(&mut self, id: JobId) {
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

    /// One scheduling pass at `now` (unix seconds): held jobs whose hour has come join
    /// the queue, then the queue runs.
    pub fn tick(&mut self, now: u64) -> Vec<SchedEvent> {
        self.prune_indexes();
        let charged = self.accrue(now);
        let mut events = std::mem::take(&mut self.later);
        let before = events.len();
        if charged.skipped_s > 0 {
            events.push(SchedEvent::Node {
                node: self.region.clone(),
                what: format!(
                    "the ledger charged {} s and left out {} s of a longer gap (clock jump or a long outage)",
                    charged.seconds, charged.skipped_s
                ),
            });
        }
        events.extend(self.release_deferred(now));
        events.extend(self.release_holds(now));
        events.extend(self.nodes_tick(now));
        // Holds released, nodes changed: records beyond the queue's effects may have
        // changed.
        self.touched_all |= events.len() > before;
        // Every slot counts as supply, launched or not: what the pools can give.
        self.queue.refresh_workload(&self.cluster.nodes, now);
        let effects = self.queue.tick(&mut self.cluster, now);
        for effect in effects {
            match &effect {
                Effect::Bind { job, .. } | Effect::Requeued { job } => {
                    self.touched.insert(*job);
                }
                Effect::Preempt { victim, by, .. } => {
                    self.touched.extend([*victim, *by]);
                }
                Effect::Pending { .. } => {}
            }
            match effect {
                Effect::Bind { job, bindings } => {
                    let nodes = bindings
                        .iter()
                        .map(|b| self.cluster.nodes[b.node].name.clone())
                        .collect();
                    if let Some(meta) = self.jobs.get_mut(&job) {
                        meta.started_unix = Some(now);
                        meta.preempted_by = None;
                    }
                    self.on_bound(job, &bindings, now);
                    events.push(SchedEvent::Placed {
                        job: self.qualified(job),
                        nodes,
                    });
                }
                Effect::Preempt {
                    victim,
                    by,
                    grace_seconds,
                } => {
                    if let Some(meta) = self.jobs.get_mut(&victim) {
                        meta.preempted_by = Some(by);
                    }
                    self.on_stopping(victim, "preempted", now);
                    events.push(SchedEvent::Preempting {
                        job: self.qualified(victim),
                        by: self.qualified(by),
                        grace_seconds,
                    });
                }
                Effect::Requeued { job } => {
                    events.extend(self.on_requeued(job, now));
                }
                Effect::Pending { .. } => {}
            }
        }
        let replicas = self.replicas_tick(now);
        self.touched_all |= !replicas.is_empty();
        events.extend(replicas);
        events
    }

    fn qualified(&self, job: JobId) -> String {
        self.jobs.get(&job).map_or_else(
            || format!("#{job}"),
            |m| format!("{}/{}", self.tenants[m.tenant], m.name),
        )
    }

    /// Placement view of stored bindings (a job restored from the books).
    fn stored_placement(&self, bindings: &[StoredBinding]) -> Vec<MemberPlacement> {
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

    fn placement(&self, bindings: &[Binding]) -> Vec<MemberPlacement> {
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

    fn why(&self, id: JobId) -> WhyPendingView {
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

    fn view_of(&self, id: JobId) -> Option<JobView> {
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

/// Chooses a region for a job from every region's [`JobOffer`] (spatial shifting).
///
/// Regions that could never take the job are left out. Among the rest, those with a
/// fresh grid signal are ranked by [`carbon::choose_region`] on the carbon of the job's
/// greenest window within its deadline, price (only when every candidate has one) and
/// free capacity; regions without a signal are not compared on carbon, so they are
/// chosen only when no region has one, and then by free capacity alone. When no region
/// has the free capacity now, the job is queued where carbon and price are best.
pub fn choose_region_for(
    offers: &[JobOffer],
    weights: RegionWeightsConfig,
) -> Result<RegionChoiceView, SchedError> {
    let fit: Vec<&JobOffer> = offers.iter().filter(|o| o.unfit.is_none()).collect();
    if fit.is_empty() {
        let why: Vec<String> = offers
            .iter()
            .map(|o| format!("{}: {}", o.region, o.unfit.as_deref().unwrap_or("?")))
            .collect();
        return Err(SchedError::BadRequest(format!(
            "no region can take this job ({})",
            if why.is_empty() {
                "no regions".to_string()
            } else {
                why.join("; ")
            }
        )));
    }
    let signalled: Vec<&JobOffer> = fit.iter().copied().filter(|o| o.window.is_ok()).collect();
    let use_carbon = !signalled.is_empty();
    let pool = if use_carbon { signalled } else { fit };
    let priced = use_carbon
        && pool
            .iter()
            .all(|o| o.window.as_ref().is_ok_and(|w| w.2.is_finite()));
    let inputs: Vec<RegionOffer> = pool
        .iter()
        .map(|o| {
            let (carbon, price) = match &o.window {
                Ok((_, carbon, price)) if use_carbon => {
                    (*carbon, if priced { *price } else { 0.0 })
                }
                _ => (0.0, 0.0),
            };
            RegionOffer {
                name: o.region.clone(),
                carbon_forecast: vec![carbon],
                price,
                free_capacity: o.free,
            }
        })
        .collect();
    let clean = |w: f64| if w.is_finite() && w > 0.0 { w } else { 0.0 };
    let used = RegionWeights {
        carbon: if use_carbon {
            clean(weights.carbon)
        } else {
            0.0
        },
        price: if priced { clean(weights.price) } else { 0.0 },
        capacity: clean(weights.capacity),
    };
    let demand = pool.first().map_or(0.0, |o| o.demand);
    let mut ranking = carbon::choose_region(&inputs, demand, used);
    let mut full = false;
    if ranking.ranked.is_empty() {
        full = true;
        ranking = carbon::choose_region(&inputs, 0.0, used);
    }
    let best = ranking
        .ranked
        .first()
        .ok_or_else(|| SchedError::BadRequest("no region could be ranked for this job".into()))?;
    let chosen = pool[best.index];
    let mut reason = match (&chosen.window, use_carbon) {
        (Ok((start, carbon, _)), true) => format!(
            "lowest score {:.2} of {}: {carbon:.0} g/kWh for its greenest window (from {})",
            best.score,
            inputs.len(),
            utc_hour(start / HOUR_S)
        ),
        _ => "no region has a grid signal: chosen by free capacity".to_string(),
    };
    if full {
        reason.push_str(
            "; no region has the free capacity now, so it queues where carbon and price are best",
        );
    }
    let candidates = offers
        .iter()
        .map(|o| {
            let index = pool.iter().position(|p| p.region == o.region);
            let ranked = index.and_then(|i| ranking.ranked.iter().find(|r| r.index == i));
            let excluded = if let Some(why) = &o.unfit {
                Some(why.clone())
            } else if let Err(why) = &o.window {
                Some(if use_carbon {
                    format!("no grid signal ({why}), so it cannot be compared on carbon")
                } else {
                    format!("no grid signal ({why})")
                })
            } else {
                index
                    .and_then(|i| ranking.excluded.iter().find(|(e, _)| *e == i))
                    .map(|(_, why)| match why {
                        Excluded::NoCapacity => "not enough free capacity now".to_string(),
                        Excluded::BadInput => "no usable carbon or price figure".to_string(),
                    })
            };
            let window = o.window.as_ref().ok();
            RegionCandidate {
                region: o.region.clone(),
                score: ranked.map(|r| r.score),
                carbon_g_per_kwh: window.map(|w| w.1),
                best_start_unix: window.map(|w| w.0),
                price_per_mwh: window.map(|w| w.2).filter(|p| p.is_finite()),
                free: o.free,
                excluded: if ranked.is_some() { None } else { excluded },
            }
        })
        .collect();
    Ok(RegionChoiceView {
        chosen: chosen.region.clone(),
        reason,
        unit: chosen.unit.to_string(),
        demand,
        weights,
        candidates,
    })
}

/// A never-fits reason with the figures that make it actionable: what one member asks
/// for against what a node of the pool has.
fn refusal_detail(reason: Reason, pod: &PodRequest, node: &NodeSpec) -> String {
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

#[cfg(test)]
mod run_tests;
#[cfg(test)]
mod tests;
