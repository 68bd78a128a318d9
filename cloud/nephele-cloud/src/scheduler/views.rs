//! The JSON views the API returns, and the events the shell logs.

use serde::{Deserialize, Serialize};

use super::JobSpec;


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
