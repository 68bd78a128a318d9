//! The JSON views the API returns, and the events the shell logs.

use serde::{Deserialize, Serialize};

use super::JobSpec;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, schemars::JsonSchema)]
pub struct GpuShare {
    pub gpu: u8,
    pub milli: u32,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, schemars::JsonSchema)]
pub struct MemberPlacement {
    pub member: usize,
    /// The node slot (`<pool>-<n>`).
    pub node: String,
    /// The pool agent serving that slot.
    pub agent: Option<String>,
    pub gpus: Vec<GpuShare>,
    pub mig_profile: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, schemars::JsonSchema)]
pub struct ReasonCount {
    pub reason: &'static str,
    pub nodes: u32,
}

/// The answer to "why is it not placed?".
#[derive(Debug, Clone, PartialEq, Eq, Serialize, schemars::JsonSchema)]
pub struct WhyPendingView {
    pub message: String,
    /// Per filter reason, how many nodes rejected it (for unschedulable jobs).
    pub reasons: Vec<ReasonCount>,
    /// What to do about it, when there is something obvious.
    pub hint: Option<String>,
}

/// A deferrable job's carbon plan: while it waits, and after it was released.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct DeferralView {
    pub deadline_unix: u64,
    /// It starts by then whatever the forecast says.
    pub latest_start_unix: u64,
    /// `waiting` (held out of the queue) or `released` (queued).
    pub state: String,
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
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
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
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct RegionChoiceView {
    pub chosen: String,
    pub reason: String,
    /// `gpu` (whole GPUs) or `cpu` (cores): what `free` and `demand` count.
    pub unit: String,
    pub demand: f64,
    pub weights: RegionWeightsConfig,
    pub candidates: Vec<RegionCandidate>,
}

/// Relative weight of carbon, price and free capacity in `"region": "auto"`; only the
/// ratios matter (see [`carbon::choose_region`]).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
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

#[derive(Debug, Clone, PartialEq, Serialize, schemars::JsonSchema)]
pub struct JobView {
    pub name: String,
    pub tenant: String,
    /// Numbers this submission in its region (its processes' key on the nodes is
    /// `<tenant>/<name>/<uid>`).
    pub uid: u64,
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
    /// The current (or last) attempt, 0 before the first start.
    pub attempt: u32,
    /// The current attempt's members as their agents report them (jobs with a
    /// command).
    pub members: Vec<MemberView>,
    /// Every attempt so far, oldest first (the last 20).
    pub attempts: Vec<AttemptView>,
    /// `succeeded`, or `failed: <why>` once no attempt is left.
    pub outcome: Option<String>,
    /// While in `backoff`: when it runs again.
    pub retry_at_unix: Option<u64>,
    pub spec: JobSpec,
}

/// One member of a job's current attempt.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct MemberView {
    pub member: u16,
    pub node: String,
    /// `launching` (sent to its agent), `running`, `stopping`, `exited`,
    /// `failed-to-start`, `lost` (its node went away).
    pub state: String,
    pub pid: Option<u32>,
    pub exit_code: Option<i32>,
    pub signal: Option<i32>,
    pub started_unix: Option<u64>,
    pub finished_unix: Option<u64>,
    /// Why it could not start.
    pub error: Option<String>,
}

/// One attempt of a job.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct AttemptView {
    pub attempt: u32,
    pub started_unix: u64,
    pub ended_unix: Option<u64>,
    /// The node of each member.
    pub nodes: Vec<String>,
    /// `MASTER_ADDR:MASTER_PORT` of a gang.
    pub rendezvous: Option<String>,
    /// `succeeded`, `failed: …`, `preempted`, `drained`, `node lost`, `cancelled`, or
    /// none while it runs.
    pub outcome: Option<String>,
}

/// One hour of a region's grid outlook.
#[derive(Debug, Clone, PartialEq, Serialize, schemars::JsonSchema)]
pub struct GridHourView {
    pub unix: u64,
    pub carbon_g_per_kwh: f64,
    /// A measurement (else a forecast).
    pub measured: bool,
    /// `measured`, `provider` (a carbon-intensity provider's forecast, pushed with
    /// `nephele grid push --forecast`) or `model` (the project's own forecast).
    pub source: &'static str,
    pub price_per_mwh: Option<f64>,
}

/// A provider's forecast as pushed (`PUT /v1/regions/{name}/grid`, `forecast`).
#[derive(Debug, Clone, PartialEq)]
pub struct ForecastPush {
    /// When the provider made it, unix seconds.
    pub issued: u64,
    pub source: String,
    pub points: Vec<nephele_placement::grid::ForecastPoint>,
}

/// The provider forecast a region holds.
#[derive(Debug, Clone, PartialEq, Serialize, schemars::JsonSchema)]
pub struct ProviderForecastView {
    pub source: String,
    pub issued_unix: u64,
    /// Hours it has a value for.
    pub hours: usize,
    pub first_unix: u64,
    pub last_unix: u64,
    /// Used now (issued at most 12 hours ago); else the project's own forecast is.
    pub fresh: bool,
}

/// `GET /v1/regions/{name}/grid`: what the region's carbon decisions see.
#[derive(Debug, Clone, PartialEq, Serialize, schemars::JsonSchema)]
pub struct GridView {
    pub region: String,
    pub carbon_zone: Option<String>,
    /// `fresh`, `stale` (newest measurement too old: jobs do not wait) or `none`.
    pub signal: &'static str,
    pub note: Option<String>,
    /// The provider forecast held, if one was pushed.
    pub forecast: Option<ProviderForecastView>,
    pub measured_hours: usize,
    pub latest_measured_unix: Option<u64>,
    /// From the current hour on (72 h), measured where pushed, forecast otherwise.
    pub outlook: Vec<GridHourView>,
    pub deferred_jobs: usize,
}

/// `PUT /v1/regions/{name}/grid`: what the push kept.
#[derive(Debug, Clone, PartialEq, Serialize, schemars::JsonSchema)]
pub struct GridPushView {
    pub kept: usize,
    /// Points older than the 90 days a region keeps, not stored.
    pub too_old: usize,
    /// Hours of the provider forecast pushed, if one was.
    pub forecast_hours: Option<usize>,
    /// When the forecast it replaced was issued.
    pub replaced_forecast_issued_unix: Option<u64>,
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

#[derive(Debug, Clone, PartialEq, Serialize, schemars::JsonSchema)]
pub struct NodeView {
    pub name: String,
    pub pool: String,
    pub profile: String,
    pub agent: Option<String>,
    /// Takes new work: its agent is connected and it is not being drained.
    pub up: bool,
    /// `absent`, `launching`, `up`, `draining`, `releasing` (see
    /// `scheduler/nodes.rs`).
    pub phase: &'static str,
    /// `none` (enrolled by hand), `local` or `command`.
    pub provider: &'static str,
    /// The device name a provider starts this node as.
    pub device: Option<String>,
    /// Since when it is in its phase (unix seconds).
    pub since_unix: Option<u64>,
    /// Why it is draining, or the last provider error.
    pub note: Option<String>,
    /// The deployments it holds a serving replica of.
    pub replicas: Vec<String>,
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
    /// Jobs with a member here (`tenant/name`; replicas as `serving/<deployment>-<n>`).
    pub jobs: Vec<String>,
}

/// A deployment's cloud replicas in one region, and what its autoscaler decided.
#[derive(Debug, Clone, PartialEq, Serialize, schemars::JsonSchema)]
pub struct ReplicaSetView {
    pub region: String,
    pub deployment: String,
    pub priority: u32,
    pub min: u32,
    pub max: u32,
    /// What the autoscaler asks for (warm replicas included).
    pub desired: u32,
    pub ready: u32,
    pub starting: u32,
    pub pending: u32,
    /// Per replica: `pending`, `starting`, `ready`, `retiring` (replaced; leaves when its
    /// replacement is ready), `failed`.
    pub replicas: Vec<ReplicaView>,
    /// Recent cold starts (placement to ready), ms.
    pub cold_starts_ms: Vec<u64>,
    /// The autoscaler's last decision, filled in by the region actor.
    pub autoscaler: Option<serde_json::Value>,
}

#[derive(Debug, Clone, PartialEq, Serialize, schemars::JsonSchema)]
pub struct ReplicaView {
    pub name: String,
    pub state: &'static str,
    pub node: Option<String>,
    pub agent: Option<String>,
    pub placed_unix: Option<u64>,
    pub cold_start_ms: Option<u64>,
    pub error: Option<String>,
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
    /// Every member of the job's attempt exited 0.
    Succeeded {
        job: String,
        attempt: u32,
    },
    /// An attempt failed: it runs again after `retry_in_s`, or never (`None`).
    Failed {
        job: String,
        attempt: u32,
        reason: String,
        retry_in_s: Option<u64>,
    },
    /// A node changed phase (launched, up, draining, released...).
    Node {
        node: String,
        what: String,
    },
    /// A serving replica became ready (or failed to load).
    Replica {
        replica: String,
        what: String,
    },
}
