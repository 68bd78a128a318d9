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
use nephele_placement::{
    Binding, CapacityType, Cluster, Effect, Job, JobId, MigPartition, MigProfile, NodeSpec,
    PodRequest, Policy, PriorityClass, Queue, QueueConfig, Topology, TypicalPods,
};
use serde::{Deserialize, Serialize};

use crate::config::{PoolConfig, RegionConfig, SchedulerConfig, TenantConfig};

/// Most members of one gang.
pub const MAX_MEMBERS: u16 = 1024;

/// Longest a deferrable job may be given between now and its deadline.
pub const MAX_DEFER_S: u64 = 30 * 24 * 3600;

/// The region name that asks the control plane to choose one.
pub const AUTO_REGION: &str = "auto";

/// Why a request to the scheduler was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SchedError {
    #[error("{0}")]
    BadRequest(String),
    #[error("{0}")]
    NotFound(String),
    #[error("{0}")]
    Conflict(String),
}

/// A job priority: a class name or a number (higher is more important).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum PrioritySpec {
    Class(String),
    Value(u32),
}

/// Where a gang's members may go.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum TopologySpec {
    #[default]
    Any,
    /// Every member on the node of the first (hard).
    SameNode,
    /// On one node when possible, anywhere otherwise.
    PreferSameNode,
}

/// `POST /v1/jobs`: one pod, or a gang of `members` identical pods placed all or none.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JobSpec {
    pub name: String,
    /// Region to queue in (default: the first configured region); `auto` lets the
    /// control plane choose by carbon, price and free capacity.
    #[serde(default)]
    pub region: Option<String>,
    /// Tenant charged (default: the API token's tenant; only admins may name another).
    #[serde(default)]
    pub tenant: Option<String>,
    /// `best-effort`, `batch` (default), `production`, `system`, or a number.
    #[serde(default)]
    pub priority: Option<PrioritySpec>,
    #[serde(default = "one_member")]
    pub members: u16,
    /// Per member.
    #[serde(default = "default_cpu_milli")]
    pub cpu_milli: u64,
    #[serde(default = "default_memory_mib")]
    pub memory_mib: u64,
    #[serde(default)]
    pub gpus: u8,
    /// Share of each GPU in milli-GPU (1..=1000); below 1000 only with `gpus = 1`.
    #[serde(default)]
    pub gpu_milli: Option<u32>,
    /// Acceptable GPU models (as the firmware profiles name them); empty: any.
    #[serde(default)]
    pub gpu_models: Vec<String>,
    /// One MIG slice of this profile (e.g. `1g.10gb`) instead of whole GPUs.
    #[serde(default)]
    pub mig_profile: Option<String>,
    /// All of a member's GPUs in one NVLink domain.
    #[serde(default)]
    pub same_nvlink: bool,
    #[serde(default)]
    pub topology: TopologySpec,
    /// What backfilling and the starvation reservation plan with; unknown if absent.
    #[serde(default)]
    pub expected_runtime_s: Option<u64>,
    /// Finish by this unix second. Makes the job deferrable: it may wait for a
    /// lower-carbon hour, and starts by `deadline_unix − expected_runtime_s` whatever
    /// the forecast says. Needs `expected_runtime_s`.
    #[serde(default)]
    pub deadline_unix: Option<u64>,
    /// How often the job checkpoints (for the expected cost of spot interruptions).
    #[serde(default)]
    pub checkpoint_interval_s: Option<u64>,
    /// May be preempted by higher priorities (default: below `production`).
    #[serde(default)]
    pub preemptible: Option<bool>,
    /// May run on spot capacity.
    #[serde(default)]
    pub spot_ok: bool,
    /// Node labels required (`nephele.io/pool`, `nephele.io/profile` are set on every
    /// node).
    #[serde(default)]
    pub node_selector: BTreeMap<String, String>,
    #[serde(default)]
    pub tolerations: Vec<String>,
}

fn one_member() -> u16 {
    1
}
fn default_cpu_milli() -> u64 {
    1000
}
fn default_memory_mib() -> u64 {
    1024
}

impl JobSpec {
    /// A one-member job with the defaults, for tests and the CLI.
    pub fn named(name: &str) -> JobSpec {
        serde_json::from_value(serde_json::json!({ "name": name }))
            .unwrap_or_else(|_| unreachable!("a name alone is a valid spec"))
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct GpuShare {
    pub gpu: u8,
    pub milli: u32,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct MemberPlacement {
    pub member: usize,
    /// The node slot (`<pool>-<n>`).
    pub node: String,
    /// The pool agent serving that slot.
    pub agent: Option<String>,
    pub gpus: Vec<GpuShare>,
    pub mig_profile: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ReasonCount {
    pub reason: &'static str,
    pub nodes: u32,
}

/// The answer to "why is it not placed?".
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct WhyPendingView {
    pub message: String,
    /// Per filter reason, how many nodes rejected it (for unschedulable jobs).
    pub reasons: Vec<ReasonCount>,
    /// What to do about it, when there is something obvious.
    pub hint: Option<String>,
}

/// A deferrable job's carbon plan: while it waits, and after it was released.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct DeferralView {
    pub deadline_unix: u64,
    /// It starts by then whatever the forecast says.
    pub latest_start_unix: u64,
    /// `waiting` (held out of the queue) or `released` (queued).
    pub state: &'static str,
    /// Why it waits, or why it was released, in words.
    pub reason: String,
    /// Mean carbon (gCO₂eq/kWh) of its window had it started on submission, as
    /// measured and forecast then.
    pub carbon_at_submit: Option<f64>,
    /// Mean carbon of the window starting at the last decision (waiting) or at release.
    pub carbon_now: Option<f64>,
    /// While waiting: the start hour and mean carbon of the greenest window forecast.
    pub best_start_unix: Option<u64>,
    pub best_carbon: Option<f64>,
    pub released_unix: Option<u64>,
}

/// One region as `"region": "auto"` weighed it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RegionCandidate {
    pub region: String,
    /// Weighted, normalised score in [0, 1]; lower is better. `None` when excluded.
    pub score: Option<f64>,
    /// Mean carbon of the job's greenest window there (within its deadline).
    pub carbon_g_per_kwh: Option<f64>,
    pub best_start_unix: Option<u64>,
    pub price_per_mwh: Option<f64>,
    /// Free capacity on connected nodes, in the choice's unit.
    pub free: f64,
    /// Why it was not ranked.
    pub excluded: Option<String>,
}

/// How a region was chosen for `"region": "auto"`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RegionChoiceView {
    pub chosen: String,
    pub reason: String,
    /// `gpu` (whole GPUs) or `cpu` (cores): what `free` and `demand` count.
    pub unit: &'static str,
    pub demand: f64,
    pub weights: RegionWeightsConfig,
    pub candidates: Vec<RegionCandidate>,
}

/// Relative weight of carbon, price and free capacity in `"region": "auto"`; only the
/// ratios matter (see [`carbon::choose_region`]).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RegionWeightsConfig {
    pub carbon: f64,
    pub price: f64,
    pub capacity: f64,
}

impl Default for RegionWeightsConfig {
    /// Carbon first, then price, with some weight on headroom.
    fn default() -> Self {
        RegionWeightsConfig {
            carbon: 0.6,
            price: 0.3,
            capacity: 0.1,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct JobView {
    pub name: String,
    pub tenant: String,
    pub region: String,
    /// `deferred` (waiting for a lower-carbon hour, not queued yet), `pending`,
    /// `running` (placed; resources held) or `terminating` (preempted, within its grace
    /// period).
    pub state: &'static str,
    pub priority: u32,
    pub preemptible: bool,
    pub submitted_unix: u64,
    pub started_unix: Option<u64>,
    pub placement: Vec<MemberPlacement>,
    pub why_pending: Option<WhyPendingView>,
    /// Set while terminating: who preempted it and when its resources are taken.
    pub preempted_by: Option<String>,
    pub grace_deadline_unix: Option<u64>,
    /// Times it lost its resources (preemption or node loss) and waited again.
    pub requeues: u32,
    /// For a job with a deadline: its carbon plan.
    pub deferral: Option<DeferralView>,
    /// For a job submitted with `"region": "auto"`: how this region was chosen.
    pub region_choice: Option<RegionChoiceView>,
    pub spec: JobSpec,
}

/// One hour of a region's grid outlook.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct GridHourView {
    pub unix: u64,
    pub carbon_g_per_kwh: f64,
    /// A measurement (else the forecast).
    pub measured: bool,
    pub price_per_mwh: Option<f64>,
}

/// `GET /v1/regions/{name}/grid`: what the region's carbon decisions see.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct GridView {
    pub region: String,
    pub carbon_zone: Option<String>,
    /// `fresh`, `stale` (newest measurement too old: jobs do not wait) or `none`.
    pub signal: &'static str,
    pub note: Option<String>,
    pub measured_hours: usize,
    pub latest_measured_unix: Option<u64>,
    /// From the current hour on (72 h), measured where pushed, forecast otherwise.
    pub outlook: Vec<GridHourView>,
    pub deferred_jobs: usize,
}

/// `PUT /v1/regions/{name}/grid`: what the push kept.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct GridPushView {
    pub kept: usize,
    /// Points older than the 90 days a region keeps, not stored.
    pub too_old: usize,
    pub grid: GridView,
}

/// What one region can offer a job, for `"region": "auto"`.
#[derive(Debug, Clone, PartialEq)]
pub struct JobOffer {
    pub region: String,
    /// Why this region could never take the job (its pools lack what it asks for).
    pub unfit: Option<String>,
    pub unit: &'static str,
    pub demand: f64,
    pub free: f64,
    /// The job's greenest window there (start hour, carbon, price), or why none.
    pub window: Result<(u64, f64, f64), String>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct NodeView {
    pub name: String,
    pub pool: String,
    pub profile: String,
    pub agent: Option<String>,
    pub up: bool,
    pub capacity_type: &'static str,
    pub price_per_hour: f64,
    pub cpu_milli: u64,
    pub cpu_free_milli: u64,
    pub memory_mib: u64,
    pub memory_free_mib: u64,
    pub gpu_model: Option<String>,
    /// Free milli-GPU per GPU.
    pub gpu_free_milli: Vec<u32>,
    /// Free slices per MIG partition (`<profile> on gpu <n>`).
    pub mig_free: Vec<(String, u8)>,
    /// Jobs with a member here (`tenant/name`).
    pub jobs: Vec<String>,
}

/// Something the shell should log or carry out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SchedEvent {
    Placed {
        job: String,
        nodes: Vec<String>,
    },
    /// Tell the job to checkpoint and stop within `grace_seconds`.
    Preempting {
        job: String,
        by: String,
        grace_seconds: u64,
    },
    /// It lost its resources (grace period over, or its node went away) and waits again.
    Requeued {
        job: String,
    },
    /// A deferrable job was submitted and waits for a lower-carbon hour.
    Deferred {
        job: String,
        reason: String,
    },
    /// A deferrable job left its wait and joined the queue.
    Released {
        job: String,
        reason: String,
    },
}

struct Slot {
    pool: String,
    profile: String,
    gpu_model: Option<String>,
    price_per_hour: f64,
    /// The pool agent serving it now.
    agent: Option<String>,
    /// The agent that served it last, so a reconnecting agent gets its slot back.
    last_agent: Option<String>,
}

struct JobMeta {
    name: String,
    tenant: usize,
    spec: JobSpec,
    submitted_unix: u64,
    started_unix: Option<u64>,
    preempted_by: Option<JobId>,
    requeues: u32,
    /// A deferrable job's plan, and the queue job it becomes when released.
    deferral: Option<Deferred>,
    region_choice: Option<RegionChoiceView>,
}

struct Deferred {
    plan: Deferral,
    /// Held out of the queue while `Some`.
    held: Option<Job>,
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

/// The workload mix the fragmentation-aware scorer plans for until the region has seen
/// its own: mostly single GPUs and halves, some 2-, 4- and 8-GPU jobs.
fn default_typical() -> TypicalPods {
    let mut pods = Vec::new();
    for (count, cpu, gpus, milli) in [
        (40, 4000, 1, 1000),
        (20, 2000, 1, 500),
        (10, 1000, 1, 250),
        (15, 8000, 2, 1000),
        (10, 16000, 4, 1000),
        (5, 32000, 8, 1000),
    ] {
        for _ in 0..count {
            pods.push(PodRequest {
                cpu_milli: cpu,
                memory_mib: cpu * 4,
                num_gpu: gpus,
                gpu_milli: milli,
                ..PodRequest::default()
            });
        }
    }
    TypicalPods::from_pods(&pods, 1.0)
}

pub struct RegionScheduler {
    region: String,
    carbon_zone: Option<String>,
    grid: GridSeries,
    /// One empty, up node per pool: what a job could ever fit on here.
    templates: Cluster,
    cluster: Cluster,
    queue: Queue,
    slots: Vec<Slot>,
    gpu_models: Vec<String>,
    tenants: Vec<String>,
    jobs: BTreeMap<JobId, JobMeta>,
    by_name: BTreeMap<(usize, String), JobId>,
    next_id: JobId,
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
        for pool in &region.pools {
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
            for index in 0..pool.max_nodes {
                let mut spec = template.clone();
                spec.name = format!("{}-{index}", pool.name);
                spec.gpu_model = interned;
                nodes.push(spec);
                slots.push(Slot {
                    pool: pool.name.clone(),
                    profile: pool.node_profile.clone(),
                    gpu_model: model.clone(),
                    price_per_hour: pool.price_per_hour,
                    agent: None,
                    last_agent: None,
                });
            }
        }
        let mut cluster = Cluster::new(nodes);
        for node in 0..slots.len() {
            cluster.node_lost(node);
        }
        let tenant_list: Vec<Tenant> = if tenants.is_empty() {
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
        let queue_config = QueueConfig {
            policy,
            priorities: true,
            fairness: config.fairness,
            preemption: config.preemption,
            grace_seconds: config.grace_s,
            aging_seconds: (config.aging_s > 0).then_some(config.aging_s),
            seed: 0,
        };
        Ok(RegionScheduler {
            region: region.name.clone(),
            carbon_zone: region.carbon_zone.clone(),
            grid: GridSeries::default(),
            templates: Cluster::new(templates),
            cluster,
            tenants: tenant_list.iter().map(|t| t.name.clone()).collect(),
            queue: Queue::new(queue_config, tenant_list, default_typical()),
            slots,
            gpu_models,
            jobs: BTreeMap::new(),
            by_name: BTreeMap::new(),
            next_id: 1,
        })
    }

    pub fn region(&self) -> &str {
        &self.region
    }

    pub fn tenant_names(&self) -> &[String] {
        &self.tenants
    }

    /// A pool agent connected. Returns the slot it now serves, or `None` when no pool of
    /// this region has its profile or every such slot is taken (it still serves
    /// offloaded requests, but no jobs are placed on it).
    pub fn agent_joined(&mut self, agent: &str, profile: &str) -> Option<String> {
        let index = self
            .slots
            .iter()
            .position(|s| s.agent.as_deref() == Some(agent))
            .or_else(|| {
                let free = |s: &Slot| s.profile == profile && s.agent.is_none();
                self.slots
                    .iter()
                    .position(|s| free(s) && s.last_agent.as_deref() == Some(agent))
                    .or_else(|| {
                        self.slots
                            .iter()
                            .position(|s| free(s) && s.last_agent.is_none())
                    })
                    .or_else(|| self.slots.iter().position(free))
            })?;
        let slot = &mut self.slots[index];
        slot.agent = Some(agent.to_string());
        slot.last_agent = Some(agent.to_string());
        self.cluster.node_up(index);
        Some(self.cluster.nodes[index].name.clone())
    }

    /// A pool agent went away: its slot goes down and every job with a member there
    /// waits again (all members of a gang). Returns those jobs as `tenant/name`.
    pub fn agent_left(&mut self, agent: &str, now: u64) -> Vec<String> {
        let Some(index) = self
            .slots
            .iter()
            .position(|s| s.agent.as_deref() == Some(agent))
        else {
            return Vec::new();
        };
        self.slots[index].agent = None;
        let hit = self.queue.node_lost(&mut self.cluster, index, now);
        hit.into_iter()
            .filter_map(|id| {
                let meta = self.jobs.get_mut(&id)?;
                meta.requeues += 1;
                meta.started_unix = None;
                meta.preempted_by = None;
                Some(format!("{}/{}", self.tenants[meta.tenant], meta.name))
            })
            .collect()
    }

    fn tenant_index(&self, tenant: &str) -> Result<usize, SchedError> {
        self.tenants
            .iter()
            .position(|t| t == tenant)
            .ok_or_else(|| {
                SchedError::BadRequest(format!(
                    "unknown tenant {tenant:?}; configured tenants: {}",
                    self.tenants.join(", ")
                ))
            })
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
        mut spec: JobSpec,
        region_choice: Option<RegionChoiceView>,
        now: u64,
    ) -> Result<(JobView, Vec<SchedEvent>), SchedError> {
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
        let deferral = match spec.deadline_unix {
            None => None,
            Some(deadline) => Some(self.plan_deferral(&spec, deadline, now)?),
        };
        let held = if deferral.is_some() {
            Some(job)
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
                spec,
                submitted_unix: now,
                started_unix: None,
                preempted_by: None,
                requeues: 0,
                deferral: deferral.map(|(plan, view)| Deferred { plan, held, view }),
                region_choice,
            },
        );
        let mut events = self.tick(now);
        if let Some(deferred) = self.jobs.get(&id).and_then(|m| m.deferral.as_ref()) {
            if deferred.held.is_some() {
                events.push(SchedEvent::Deferred {
                    job: self.qualified(id),
                    reason: deferred.view.reason.clone(),
                });
            }
        }
        let view = self
            .view_of(id)
            .ok_or_else(|| SchedError::NotFound("the job vanished during its first pass".into()))?;
        Ok((view, events))
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
            state: "waiting",
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
            .jobs
            .iter()
            .filter(|(_, m)| m.deferral.as_ref().is_some_and(|d| d.held.is_some()))
            .map(|(id, _)| *id)
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
                    let Some(mut job) = deferred.held.take() else {
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
                        deferred.held = Some(job);
                        continue;
                    }
                    view.state = "released";
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

    /// Stores grid measurements (all or none) and re-decides the held jobs.
    pub fn push_grid(
        &mut self,
        points: &[GridPoint],
        now: u64,
    ) -> Result<(GridPushView, Vec<SchedEvent>), SchedError> {
        let ingested = self
            .grid
            .ingest(points, now)
            .map_err(|e: GridError| SchedError::BadRequest(e.to_string()))?;
        let events = self.tick(now);
        Ok((
            GridPushView {
                kept: ingested.kept,
                too_old: ingested.too_old,
                grid: self.grid_view(now),
            },
            events,
        ))
    }

    /// The grid signal as the carbon decisions see it at `now`.
    pub fn grid_view(&mut self, now: u64) -> GridView {
        let deferred_jobs = self
            .jobs
            .values()
            .filter(|m| m.deferral.as_ref().is_some_and(|d| d.held.is_some()))
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
        GridView {
            region: self.region.clone(),
            carbon_zone: self.carbon_zone.clone(),
            signal,
            note,
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
        let index = self.tenant_index(tenant)?;
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
        let view = self
            .view_of(id)
            .ok_or_else(|| SchedError::NotFound(format!("no job {name:?}")))?;
        self.queue.remove(&mut self.cluster, id);
        if let Some(meta) = self.jobs.remove(&id) {
            self.by_name.remove(&(meta.tenant, meta.name));
        }
        let events = self.tick(now);
        Ok((view, events))
    }

    /// One scheduling pass at `now` (unix seconds): held jobs whose hour has come join
    /// the queue, then the queue runs.
    pub fn tick(&mut self, now: u64) -> Vec<SchedEvent> {
        let mut events = self.release_deferred(now);
        let effects = self.queue.tick(&mut self.cluster, now);
        for effect in effects {
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
                    events.push(SchedEvent::Preempting {
                        job: self.qualified(victim),
                        by: self.qualified(by),
                        grace_seconds,
                    });
                }
                Effect::Requeued { job } => {
                    if let Some(meta) = self.jobs.get_mut(&job) {
                        meta.requeues += 1;
                        meta.started_unix = None;
                    }
                    events.push(SchedEvent::Requeued {
                        job: self.qualified(job),
                    });
                }
                Effect::Pending { .. } => {}
            }
        }
        events
    }

    fn qualified(&self, job: JobId) -> String {
        self.jobs.get(&job).map_or_else(
            || format!("#{job}"),
            |m| format!("{}/{}", self.tenants[m.tenant], m.name),
        )
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
                        reason: r.as_str(),
                        nodes: *n,
                    })
                    .collect();
                reasons.sort_by(|a, b| b.nodes.cmp(&a.nodes).then(a.reason.cmp(b.reason)));
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
        if let Some(job) = meta.deferral.as_ref().and_then(|d| d.held.as_ref()) {
            return Some(JobView {
                name: meta.name.clone(),
                tenant: self.tenants[meta.tenant].clone(),
                region: self.region.clone(),
                state: "deferred",
                priority: job.priority,
                preemptible: job.preemptible,
                submitted_unix: meta.submitted_unix,
                started_unix: None,
                placement: Vec::new(),
                why_pending: None,
                preempted_by: None,
                grace_deadline_unix: None,
                requeues: meta.requeues,
                deferral,
                region_choice: meta.region_choice.clone(),
                spec: meta.spec.clone(),
            });
        }
        let job = self.queue.job(id)?;
        let state = self.queue.state(id)?;
        let (name, placement, grace) = match state {
            JobState::Pending => ("pending", Vec::new(), None),
            JobState::Running { bindings, .. } => ("running", self.placement(bindings), None),
            JobState::Terminating {
                bindings, deadline, ..
            } => ("terminating", self.placement(bindings), Some(*deadline)),
            JobState::Finished { .. } => ("finished", Vec::new(), None),
        };
        Some(JobView {
            name: meta.name.clone(),
            tenant: self.tenants[meta.tenant].clone(),
            region: self.region.clone(),
            state: name,
            priority: job.priority,
            preemptible: job.preemptible,
            submitted_unix: meta.submitted_unix,
            started_unix: meta.started_unix,
            placement,
            why_pending: (*state == JobState::Pending).then(|| self.why(id)),
            preempted_by: grace.and(meta.preempted_by).map(|by| self.qualified(by)),
            grace_deadline_unix: grace,
            requeues: meta.requeues,
            deferral,
            region_choice: meta.region_choice.clone(),
            spec: meta.spec.clone(),
        })
    }

    pub fn get(&self, tenant: &str, name: &str) -> Result<JobView, SchedError> {
        let id = self.lookup(tenant, name)?;
        self.view_of(id)
            .ok_or_else(|| SchedError::NotFound(format!("no job {name:?}")))
    }

    /// Jobs of `tenant`, or of every tenant for `None`, oldest first.
    pub fn list(&self, tenant: Option<&str>) -> Vec<JobView> {
        let only = tenant.map(|t| self.tenants.iter().position(|n| n == t));
        self.jobs
            .iter()
            .filter(|(_, m)| match only {
                None => true,
                Some(index) => index == Some(m.tenant),
            })
            .filter_map(|(id, _)| self.view_of(*id))
            .collect()
    }

    pub fn nodes(&self) -> Vec<NodeView> {
        let mut jobs_on: BTreeMap<usize, Vec<String>> = BTreeMap::new();
        for (id, (_, binding)) in self.cluster.reservations() {
            let job = id >> nephele_placement::queue::MEMBER_BITS;
            let entry = jobs_on.entry(binding.node).or_default();
            let name = self.qualified(job);
            if !entry.contains(&name) {
                entry.push(name);
            }
        }
        self.slots
            .iter()
            .enumerate()
            .map(|(index, slot)| {
                let spec = &self.cluster.nodes[index];
                let state = &self.cluster.state[index];
                NodeView {
                    name: spec.name.clone(),
                    pool: slot.pool.clone(),
                    profile: slot.profile.clone(),
                    agent: slot.agent.clone(),
                    up: state.up,
                    capacity_type: match spec.capacity_type {
                        CapacityType::Spot => "spot",
                        CapacityType::OnDemand => "on-demand",
                    },
                    price_per_hour: slot.price_per_hour,
                    cpu_milli: spec.cpu_milli,
                    cpu_free_milli: state.cpu_left,
                    memory_mib: spec.memory_mib,
                    memory_free_mib: state.memory_left,
                    gpu_model: slot.gpu_model.clone(),
                    gpu_free_milli: state.gpu_left.clone(),
                    mig_free: spec
                        .mig
                        .iter()
                        .zip(&state.mig_free)
                        .map(|(p, free)| (format!("{} on gpu {}", p.profile, p.gpu), *free))
                        .collect(),
                    jobs: jobs_on.remove(&index).unwrap_or_default(),
                }
            })
            .collect()
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
        unit: chosen.unit,
        demand,
        weights,
        candidates,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn region(max_nodes: u32) -> RegionConfig {
        RegionConfig {
            name: "eu".into(),
            carbon_zone: None,
            pools: vec![PoolConfig {
                name: "l4".into(),
                node_profile: "gpu-4x-l4".into(),
                capacity_type: "on-demand".into(),
                price_per_hour: 3.0,
                max_nodes,
                mig_profile: None,
                interruptions_per_1000h: 0,
            }],
        }
    }

    fn tenants() -> Vec<TenantConfig> {
        ["alpha", "beta"]
            .into_iter()
            .map(|name| TenantConfig {
                name: name.into(),
                weight: 1.0,
                quota_cpu_milli: None,
                quota_memory_mib: None,
                quota_gpu_milli: (name == "beta").then_some(2000),
            })
            .collect()
    }

    fn scheduler(max_nodes: u32) -> RegionScheduler {
        let config = SchedulerConfig {
            grace_s: 10,
            ..SchedulerConfig::default()
        };
        RegionScheduler::new(&region(max_nodes), &tenants(), &config).expect("valid")
    }

    fn spec(value: serde_json::Value) -> JobSpec {
        serde_json::from_value(value).expect("valid spec")
    }

    #[test]
    fn jobs_wait_for_pool_agents_and_say_why() {
        let mut s = scheduler(2);
        let (view, _) = s
            .submit(
                "alpha",
                spec(serde_json::json!({"name": "train", "gpus": 2})),
                100,
            )
            .expect("accepted");
        assert_eq!(view.state, "pending");
        let why = view.why_pending.expect("why");
        assert_eq!(why.message, "0/2 nodes can take it: 2 node down");
        assert!(why.hint.expect("hint").contains("--role pool"));
        assert_eq!(
            s.agent_joined("pool-a", "gpu-4x-l4").as_deref(),
            Some("l4-0")
        );
        // An agent with another profile gets no slot.
        assert_eq!(s.agent_joined("cpu-1", "x86-cpu-server"), None);
        let events = s.tick(101);
        assert_eq!(
            events,
            vec![SchedEvent::Placed {
                job: "alpha/train".into(),
                nodes: vec!["l4-0".into()]
            }]
        );
        let view = s.get("alpha", "train").expect("exists");
        assert_eq!(view.state, "running");
        assert_eq!(view.placement[0].agent.as_deref(), Some("pool-a"));
        assert_eq!(view.placement[0].gpus.len(), 2);
        // Tenant isolation: beta does not see alpha's job.
        assert!(matches!(
            s.get("beta", "train"),
            Err(SchedError::NotFound(_))
        ));
        assert_eq!(s.list(Some("beta")).len(), 0);
        assert_eq!(s.list(None).len(), 1);
        assert!(s.accounting_holds());
    }

    #[test]
    fn a_gang_is_placed_whole_and_requeued_whole_when_a_node_goes() {
        let mut s = scheduler(2);
        s.agent_joined("pool-a", "gpu-4x-l4");
        s.agent_joined("pool-b", "gpu-4x-l4");
        let (view, _) = s
            .submit(
                "alpha",
                spec(serde_json::json!({"name": "gang", "members": 2, "gpus": 3})),
                0,
            )
            .expect("accepted");
        assert_eq!(view.state, "running");
        let nodes: Vec<&str> = view.placement.iter().map(|p| p.node.as_str()).collect();
        assert_eq!(nodes.len(), 2);
        assert_ne!(nodes[0], nodes[1]);
        // A 3-member gang of 3 GPUs cannot fit in 2 nodes of 4: nothing is held for it.
        let (big, _) = s
            .submit(
                "alpha",
                spec(serde_json::json!({"name": "big", "members": 3, "gpus": 3})),
                1,
            )
            .expect("accepted");
        assert_eq!(big.state, "pending");
        let free: u32 = s
            .nodes()
            .iter()
            .flat_map(|n| n.gpu_free_milli.clone())
            .sum();
        assert_eq!(free, 2000);
        let requeued = s.agent_left("pool-b", 5);
        assert_eq!(requeued, vec!["alpha/gang".to_string()]);
        let view = s.get("alpha", "gang").expect("exists");
        assert_eq!(view.state, "pending");
        assert_eq!(view.requeues, 1);
        assert!(s.nodes().iter().all(|n| n.jobs.is_empty()));
        // The agent comes back to its own slot and the gang runs again.
        assert_eq!(
            s.agent_joined("pool-b", "gpu-4x-l4").as_deref(),
            Some("l4-1")
        );
        s.tick(6);
        assert_eq!(s.get("alpha", "gang").expect("exists").state, "running");
        assert!(s.accounting_holds());
    }

    #[test]
    fn higher_priority_preempts_after_the_grace_period_and_delete_frees_at_once() {
        let mut s = scheduler(1);
        s.agent_joined("pool-a", "gpu-4x-l4");
        s.submit(
            "alpha",
            spec(serde_json::json!({"name": "low", "gpus": 4, "priority": "best-effort"})),
            0,
        )
        .expect("accepted");
        let (high, events) = s
            .submit(
                "alpha",
                spec(serde_json::json!({"name": "high", "gpus": 4, "priority": "production"})),
                1,
            )
            .expect("accepted");
        assert_eq!(high.state, "pending");
        assert_eq!(
            events,
            vec![SchedEvent::Preempting {
                job: "alpha/low".into(),
                by: "alpha/high".into(),
                grace_seconds: 10
            }]
        );
        let low = s.get("alpha", "low").expect("exists");
        assert_eq!(low.state, "terminating");
        assert_eq!(low.preempted_by.as_deref(), Some("alpha/high"));
        assert_eq!(low.grace_deadline_unix, Some(11));
        assert!(s.tick(5).is_empty());
        let events = s.tick(11);
        assert!(events.contains(&SchedEvent::Requeued {
            job: "alpha/low".into()
        }));
        assert_eq!(s.get("alpha", "high").expect("exists").state, "running");
        // Deleting the running job lets the preempted one back on at once.
        let (gone, events) = s.delete("alpha", "high", 12).expect("exists");
        assert_eq!(gone.state, "running");
        assert_eq!(
            events,
            vec![SchedEvent::Placed {
                job: "alpha/low".into(),
                nodes: vec!["l4-0".into()]
            }]
        );
        assert!(matches!(
            s.get("alpha", "high"),
            Err(SchedError::NotFound(_))
        ));
        assert!(s.accounting_holds());
    }

    #[test]
    fn quotas_and_bad_specs_are_explained() {
        let mut s = scheduler(1);
        s.agent_joined("pool-a", "gpu-4x-l4");
        let (view, _) = s
            .submit("beta", spec(serde_json::json!({"name": "j", "gpus": 3})), 0)
            .expect("accepted");
        let why = view.why_pending.expect("why");
        assert!(why.message.contains("gpu quota"), "{}", why.message);
        for (body, expect) in [
            (
                serde_json::json!({"name": "x", "gpus": 2, "gpu_milli": 500}),
                "fractional",
            ),
            (
                serde_json::json!({"name": "x", "gpu_milli": 500}),
                "needs gpus",
            ),
            (
                serde_json::json!({"name": "x", "gpus": 1, "gpu_models": ["TPU"]}),
                "NVIDIA L4",
            ),
            (serde_json::json!({"name": "x", "members": 0}), "members"),
            (
                serde_json::json!({"name": "x", "mig_profile": "big"}),
                "1g.10gb",
            ),
            (
                serde_json::json!({"name": "x", "priority": "urgent"}),
                "unknown",
            ),
            (serde_json::json!({"name": "Bad Name"}), "job"),
        ] {
            let result = s.submit("alpha", spec(body.clone()), 0);
            match result {
                Err(SchedError::BadRequest(message)) => {
                    assert!(message.contains(expect), "{body}: {message}")
                }
                other => panic!("{body}: {other:?}"),
            }
        }
        assert!(matches!(
            s.submit("gamma", JobSpec::named("x"), 0),
            Err(SchedError::BadRequest(_))
        ));
        assert!(matches!(
            s.submit("beta", JobSpec::named("j"), 0),
            Err(SchedError::Conflict(_))
        ));
        // Unknown fields are refused by the JSON layer.
        assert!(
            serde_json::from_value::<JobSpec>(serde_json::json!({"name": "x", "gpu": 1})).is_err()
        );
    }

    #[test]
    fn mig_pools_serve_slices() {
        let mut region = region(1);
        region.pools[0].node_profile = "dgx-a100-80gb".into();
        region.pools[0].mig_profile = Some("1g.10gb".into());
        let mut s = RegionScheduler::new(&region, &[], &SchedulerConfig::default()).expect("valid");
        s.agent_joined("dgx", "dgx-a100-80gb");
        let (view, _) = s
            .submit(
                "default",
                spec(serde_json::json!({"name": "small", "mig_profile": "1g.10gb"})),
                0,
            )
            .expect("accepted");
        assert_eq!(view.state, "running");
        assert_eq!(view.placement[0].mig_profile.as_deref(), Some("1g.10gb"));
        let (whole, _) = s
            .submit(
                "default",
                spec(serde_json::json!({"name": "whole", "gpus": 1})),
                0,
            )
            .expect("accepted");
        assert_eq!(whole.state, "pending");
        let mut bad = region.clone();
        bad.pools[0].mig_profile = Some("9g.99gb".into());
        assert!(RegionScheduler::new(&bad, &[], &SchedulerConfig::default())
            .err()
            .expect("refused")
            .contains("1g.10gb"));
    }

    /// Lowest at 03:00 UTC, highest at 15:00 (gCO₂eq/kWh), plus `level`.
    fn cycle(hour: u64, level: f64) -> f64 {
        level + 200.0 - 100.0 * (((hour % 24) as f64 - 3.0) / 24.0 * std::f64::consts::TAU).cos()
    }

    /// 30 days of measurements ending with the hour of `now`.
    fn feed(s: &mut RegionScheduler, now: u64, level: f64) {
        let end = now / HOUR_S;
        let points: Vec<GridPoint> = (end - 30 * 24 + 1..=end)
            .map(|hour| GridPoint {
                hour,
                carbon: Some(cycle(hour, level)),
                price: Some(40.0),
            })
            .collect();
        s.push_grid(&points, now).expect("valid push");
    }

    /// 2023-11-14 16:00 UTC: the next trough is 11 hours away.
    const NOW: u64 = 1_699_977_600 + 60;

    #[test]
    fn a_deferrable_job_waits_for_the_greener_hour_and_never_past_its_latest_start() {
        let mut s = scheduler(1);
        s.agent_joined("pool-a", "gpu-4x-l4");
        feed(&mut s, NOW, 0.0);
        let trough = (NOW / HOUR_S..NOW / HOUR_S + 24)
            .find(|h| h % 24 == 3)
            .expect("a 03:00");
        let body = |name: &str, deadline: u64| {
            spec(serde_json::json!({
                "name": name, "gpus": 1, "expected_runtime_s": 3600, "deadline_unix": deadline
            }))
        };
        let (view, events) = s
            .submit("alpha", body("night", NOW + 20 * HOUR_S), NOW)
            .expect("accepted");
        assert_eq!(view.state, "deferred");
        let plan = view.deferral.expect("a plan");
        assert_eq!(plan.state, "waiting");
        assert_eq!(plan.latest_start_unix, NOW + 19 * HOUR_S);
        assert_eq!(plan.best_start_unix, Some(trough * HOUR_S));
        assert!(plan.best_carbon.expect("best") < plan.carbon_now.expect("now"));
        assert!(plan.reason.contains("lower-carbon hour"), "{}", plan.reason);
        assert!(matches!(&events[..], [SchedEvent::Deferred { job, .. }] if job == "alpha/night"));
        assert!(view.placement.is_empty() && s.nodes()[0].jobs.is_empty());
        // A job without a deadline is not held.
        let (now_job, _) = s
            .submit(
                "alpha",
                spec(serde_json::json!({"name": "now", "gpus": 1})),
                NOW,
            )
            .expect("accepted");
        assert_eq!(now_job.state, "running");
        // Its latest start falls within this hour: it goes at once, whatever the forecast.
        let (tight, _) = s
            .submit("alpha", body("tight", NOW + 3600 + 1200), NOW)
            .expect("accepted");
        assert_eq!(tight.state, "running");
        let plan = tight.deferral.expect("a plan");
        assert_eq!(plan.state, "released");
        assert!(plan.reason.contains("latest start"), "{}", plan.reason);
        // Hour by hour, with the feed's measurement of each hour, it waits for 03:00.
        let mut hour = NOW / HOUR_S;
        while hour < trough {
            hour += 1;
            let now = hour * HOUR_S + 30;
            s.push_grid(
                &[GridPoint {
                    hour,
                    carbon: Some(cycle(hour, 0.0)),
                    price: None,
                }],
                now,
            )
            .expect("valid push");
            let state = s.get("alpha", "night").expect("exists").state;
            if hour < trough {
                assert_eq!(state, "deferred", "hour {}", hour % 24);
            }
        }
        let night = s.get("alpha", "night").expect("exists");
        assert_eq!(night.state, "running");
        let plan = night.deferral.expect("a plan");
        assert_eq!(plan.state, "released");
        assert_eq!(plan.released_unix, Some(trough * HOUR_S + 30));
        assert!(plan.carbon_now.expect("now") < plan.carbon_at_submit.expect("then"));
        assert!(s.accounting_holds());
    }

    #[test]
    fn deadlines_are_checked_and_no_signal_means_no_wait() {
        let mut s = scheduler(1);
        s.agent_joined("pool-a", "gpu-4x-l4");
        for (body, expect) in [
            (
                serde_json::json!({"name": "x", "deadline_unix": NOW + 7200}),
                "needs expected_runtime_s",
            ),
            (
                serde_json::json!({"name": "x", "deadline_unix": NOW + 600, "expected_runtime_s": 3600}),
                "leaves less than",
            ),
            (
                serde_json::json!({"name": "x", "deadline_unix": NOW + 40 * 86_400, "expected_runtime_s": 60}),
                "days away",
            ),
        ] {
            match s.submit("alpha", spec(body.clone()), NOW) {
                Err(SchedError::BadRequest(message)) => {
                    assert!(message.contains(expect), "{body}: {message}")
                }
                other => panic!("{body}: {other:?}"),
            }
        }
        let (view, _) = s
            .submit(
                "alpha",
                spec(serde_json::json!({
                    "name": "later", "expected_runtime_s": 60, "deadline_unix": NOW + 86_400
                })),
                NOW,
            )
            .expect("accepted");
        assert_eq!(view.state, "running");
        let plan = view.deferral.expect("a plan");
        assert!(
            plan.reason.contains("no carbon measurements"),
            "{}",
            plan.reason
        );
        let grid = s.grid_view(NOW);
        assert_eq!(grid.signal, "none");
        assert!(grid.note.expect("note").contains("nephele grid push"));
        // A measurement from the future is refused and changes nothing.
        let future = GridPoint {
            hour: NOW / HOUR_S + 1,
            carbon: Some(10.0),
            price: None,
        };
        assert!(matches!(
            s.push_grid(&[future], NOW),
            Err(SchedError::BadRequest(m)) if m.contains("has not begun")
        ));
        assert_eq!(s.grid_view(NOW).measured_hours, 0);
        // A deferred job can be deleted while it waits.
        feed(&mut s, NOW, 0.0);
        let (held, _) = s
            .submit(
                "alpha",
                spec(serde_json::json!({
                    "name": "held", "expected_runtime_s": 3600, "deadline_unix": NOW + 20 * HOUR_S
                })),
                NOW,
            )
            .expect("accepted");
        assert_eq!(held.state, "deferred");
        assert_eq!(s.grid_view(NOW).deferred_jobs, 1);
        let (gone, _) = s.delete("alpha", "held", NOW).expect("exists");
        assert_eq!(gone.state, "deferred");
        assert!(s.get("alpha", "held").is_err());
        assert_eq!(s.grid_view(NOW).deferred_jobs, 0);
    }

    fn named_region(name: &str, agents: usize) -> RegionScheduler {
        let mut config = region(1);
        config.name = name.into();
        let mut s =
            RegionScheduler::new(&config, &tenants(), &SchedulerConfig::default()).expect("valid");
        for a in 0..agents {
            s.agent_joined(&format!("{name}-{a}"), "gpu-4x-l4");
        }
        s
    }

    #[test]
    fn auto_region_takes_the_greener_region_with_room() {
        let job = spec(serde_json::json!({"name": "t", "gpus": 2, "expected_runtime_s": 3600}));
        let mut green = named_region("green", 1);
        let mut brown = named_region("brown", 1);
        feed(&mut green, NOW, 0.0);
        feed(&mut brown, NOW, 300.0);
        let weights = RegionWeightsConfig::default();
        let offers = [brown.offer(&job, NOW), green.offer(&job, NOW)];
        assert_eq!(offers[0].unit, "gpu");
        assert_eq!((offers[0].demand, offers[0].free), (2.0, 4.0));
        let choice = choose_region_for(&offers, weights).expect("a region");
        assert_eq!(choice.chosen, "green");
        assert!(choice.reason.contains("g/kWh"), "{}", choice.reason);
        assert!(choice.candidates.iter().all(|c| c.score.is_some()));
        // A deadline lets the comparison use each region's greenest window.
        let deferrable = spec(serde_json::json!({
            "name": "t", "gpus": 2, "expected_runtime_s": 3600, "deadline_unix": NOW + 20 * HOUR_S
        }));
        let offer = green.offer(&deferrable, NOW);
        let now_only = green.offer(&job, NOW);
        assert!(offer.window.as_ref().expect("w").1 < now_only.window.as_ref().expect("w").1);
        // No room in the green region now: the brown one, which has it.
        let mut full_green = named_region("green", 0);
        feed(&mut full_green, NOW, 0.0);
        let offers = [brown.offer(&job, NOW), full_green.offer(&job, NOW)];
        let choice = choose_region_for(&offers, weights).expect("a region");
        assert_eq!(choice.chosen, "brown");
        let excluded = &choice.candidates[1];
        assert_eq!(
            excluded.excluded.as_deref(),
            Some("not enough free capacity now")
        );
        // A region without a signal is not compared on carbon.
        let mut dark = named_region("dark", 1);
        let offers = [dark.offer(&job, NOW), brown.offer(&job, NOW)];
        let choice = choose_region_for(&offers, weights).expect("a region");
        assert_eq!(choice.chosen, "brown");
        assert!(choice.candidates[0]
            .excluded
            .as_deref()
            .expect("excluded")
            .contains("no grid signal"));
        // Without any signal it goes by free capacity alone.
        let mut empty = named_region("empty", 0);
        let offers = [empty.offer(&job, NOW), dark.offer(&job, NOW)];
        let choice = choose_region_for(&offers, weights).expect("a region");
        assert_eq!(choice.chosen, "dark");
        // A region whose pools cannot hold it is never chosen; none at all is a 400.
        let huge = spec(serde_json::json!({"name": "t", "gpus": 8}));
        let offers = [green.offer(&huge, NOW)];
        assert!(offers[0].unfit.is_some());
        assert!(matches!(
            choose_region_for(&offers, weights),
            Err(SchedError::BadRequest(m)) if m.contains("no region can take")
        ));
        // And the chosen region records how.
        let (view, _) = green
            .submit_chosen("alpha", job.clone(), Some(choice_for_test()), NOW)
            .expect("accepted");
        assert_eq!(view.region_choice.expect("recorded").chosen, "green");
    }

    fn choice_for_test() -> RegionChoiceView {
        RegionChoiceView {
            chosen: "green".into(),
            reason: "test".into(),
            unit: "gpu",
            demand: 2.0,
            weights: RegionWeightsConfig::default(),
            candidates: Vec::new(),
        }
    }

    #[derive(Debug, Clone)]
    enum Op {
        Join(usize),
        Leave(usize),
        Submit {
            tenant: usize,
            class: usize,
            members: u16,
            gpus: u8,
            milli: u32,
        },
        Delete(usize),
        Tick(u64),
        /// A measurement for the current hour.
        Grid(u16),
        /// A job that may wait up to this many hours.
        Deferrable(u8),
    }

    fn op() -> impl proptest::strategy::Strategy<Value = Op> {
        use proptest::prelude::*;
        prop_oneof![
            2 => (0usize..4).prop_map(Op::Join),
            1 => (0usize..4).prop_map(Op::Leave),
            4 => (0usize..2, 0usize..3, 1u16..=3, 0u8..=4, 1u32..=1000).prop_map(
                |(tenant, class, members, gpus, milli)| Op::Submit { tenant, class, members, gpus, milli }
            ),
            1 => (0usize..30).prop_map(Op::Delete),
            2 => (1u64..20).prop_map(Op::Tick),
            1 => (1u64..7200).prop_map(Op::Tick),
            1 => (0u16..800).prop_map(Op::Grid),
            1 => (0u8..10).prop_map(Op::Deferrable),
        ]
    }

    proptest::proptest! {
        /// Whatever agents, jobs and deletions arrive: the books balance, every placed
        /// member sits on an up node served by an agent, a gang is placed whole or not
        /// at all, the node view and the job view agree, and tenants see only their own.
        #[test]
        fn the_scheduler_shell_keeps_its_books(ops in proptest::collection::vec(op(), 1..60)) {
            let mut s = scheduler(3);
            let mut now = 0u64;
            let mut submitted = 0usize;
            for op in ops {
                match op {
                    Op::Join(a) => { s.agent_joined(&format!("agent-{a}"), "gpu-4x-l4"); }
                    Op::Leave(a) => { s.agent_left(&format!("agent-{a}"), now); }
                    Op::Submit { tenant, class, members, gpus, milli } => {
                        let milli = if gpus == 1 { milli } else { 1000 };
                        let priority = ["best-effort", "batch", "production"][class];
                        let body = serde_json::json!({
                            "name": format!("j{submitted}"),
                            "members": members,
                            "gpus": gpus,
                            "gpu_milli": if gpus > 0 { Some(milli) } else { None },
                            "priority": priority,
                            "expected_runtime_s": 30,
                        });
                        let tenant = ["alpha", "beta"][tenant];
                        s.submit(tenant, spec(body), now).expect("valid job");
                        submitted += 1;
                    }
                    Op::Delete(j) => {
                        for tenant in ["alpha", "beta"] {
                            let _ = s.delete(tenant, &format!("j{j}"), now);
                        }
                    }
                    Op::Tick(dt) => { now += dt; s.tick(now); }
                    Op::Grid(value) => {
                        let point = GridPoint { hour: now / HOUR_S, carbon: Some(f64::from(value)), price: None };
                        s.push_grid(&[point], now).expect("valid measurement");
                    }
                    Op::Deferrable(hours) => {
                        let body = serde_json::json!({
                            "name": format!("j{submitted}"),
                            "gpus": 1,
                            "expected_runtime_s": 1800,
                            "deadline_unix": now + 1800 + u64::from(hours) * HOUR_S,
                        });
                        s.submit("alpha", spec(body), now).expect("valid job");
                        submitted += 1;
                    }
                }
                proptest::prop_assert!(s.accounting_holds());
                let nodes = s.nodes();
                let jobs = s.list(None);
                for job in &jobs {
                    match job.state {
                        "pending" => proptest::prop_assert!(job.placement.is_empty() && job.why_pending.is_some()),
                        // Held out of the queue, and never past its latest start.
                        "deferred" => {
                            proptest::prop_assert!(job.placement.is_empty());
                            let plan = job.deferral.as_ref().expect("a plan");
                            proptest::prop_assert!(plan.latest_start_unix > now, "held past its latest start");
                        }
                        _ => {
                            proptest::prop_assert_eq!(job.placement.len(), usize::from(job.spec.members));
                            for member in &job.placement {
                                let node = nodes.iter().find(|n| n.name == member.node).expect("node");
                                proptest::prop_assert!(node.up && node.agent.is_some());
                                proptest::prop_assert_eq!(&member.agent, &node.agent);
                                let qualified = format!("{}/{}", job.tenant, job.name);
                                proptest::prop_assert!(node.jobs.contains(&qualified));
                            }
                        }
                    }
                }
                let holding: usize = nodes.iter().map(|n| n.jobs.len()).sum();
                let members_on_distinct_nodes: usize = jobs.iter().map(|j| {
                    j.placement.iter().map(|p| p.node.as_str()).collect::<std::collections::BTreeSet<_>>().len()
                }).sum();
                proptest::prop_assert_eq!(holding, members_on_distinct_nodes);
                let alpha = s.list(Some("alpha"));
                proptest::prop_assert!(alpha.iter().all(|j| j.tenant == "alpha"));
                proptest::prop_assert_eq!(alpha.len() + s.list(Some("beta")).len(), jobs.len());
            }
        }
    }
}
