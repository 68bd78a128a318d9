//! The views the API returns are the API's own types (`nephele_api`); what stays here
//! is the scheduler's: a pushed forecast, a region's offer for a job, and the events
//! the shell logs.

pub use nephele_api::{
    AttemptView, DeferralView, GpuShare, GridHourView, GridPushView, GridView, JobView,
    MemberPlacement, MemberView, NodeView, ProviderForecastView, ReasonCount, RegionCandidate,
    RegionChoiceView, RegionWeightsConfig, ReplicaSetView, ReplicaView, WhyPendingView,
};

/// A provider's forecast as pushed (`PUT /v1/regions/{name}/grid`, `forecast`).
#[derive(Debug, Clone, PartialEq)]
pub struct ForecastPush {
    /// When the provider made it, unix seconds.
    pub issued: u64,
    pub source: String,
    pub points: Vec<nephele_placement::grid::ForecastPoint>,
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
