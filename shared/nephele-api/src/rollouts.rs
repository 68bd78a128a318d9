//! A deployment's rollouts (`/v1/deployments/{name}/rollout`): how an update reaches
//! its devices in gated steps, and what each step's gate saw.

use serde::{Deserialize, Serialize};

/// How a deployment's updates roll out; every field has a default.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct RolloutSettings {
    /// Share of the selected devices running the new version after each step, in
    /// percent, increasing, the last 100 (the first is the canary).
    pub steps: Vec<u32>,
    /// Requests the moved devices must have served on the new version before a gate
    /// is judged.
    pub min_requests: u64,
    /// Least time a step lasts before its gate is judged, seconds.
    pub min_step_s: u64,
    /// A step whose devices do not all run the new version within this many seconds
    /// rolls back.
    pub progress_deadline_s: u64,
    /// The gate fails when the new version's p99 exceeds the old one's by this factor
    /// *and* by `min_p99_increase_ms` (a tiny model's p99 varies by more than 20%).
    pub max_p99_ratio: f64,
    pub min_p99_increase_ms: f64,
    /// Largest rise of the error rate (failed / requests) the gate accepts.
    pub max_error_rate_increase: f64,
    /// Largest rise of the share of requests offloaded to the cloud.
    pub max_offload_share_increase: f64,
    /// Largest drop of accuracy, in points, the new model version may show against the
    /// old on the same labelled validation rows (judged before the first step: devices
    /// have no labels).
    pub max_accuracy_drop_points: f64,
}

impl Default for RolloutSettings {
    fn default() -> Self {
        RolloutSettings {
            steps: vec![10, 50, 100],
            min_requests: 100,
            min_step_s: 30,
            progress_deadline_s: 300,
            max_p99_ratio: 1.2,
            min_p99_increase_ms: 2.0,
            max_error_rate_increase: 0.01,
            max_offload_share_increase: 0.2,
            max_accuracy_drop_points: 0.5,
        }
    }
}

impl RolloutSettings {
    /// Why these settings cannot be used, if they cannot.
    pub fn validate(&self) -> Result<(), String> {
        if self.steps.is_empty() || self.steps.len() > 20 {
            return Err("rollout.steps must list 1 to 20 percentages ending in 100".into());
        }
        if self.steps.windows(2).any(|w| w[0] >= w[1]) || self.steps[0] == 0 {
            return Err(format!(
                "rollout.steps must increase from above 0 to 100, got {:?}",
                self.steps
            ));
        }
        if self.steps.last() != Some(&100) {
            return Err(format!(
                "rollout.steps must end in 100 (every device), got {:?}",
                self.steps
            ));
        }
        if self.min_requests > 100_000_000 {
            return Err("rollout.min_requests must be at most 100000000".into());
        }
        if self.min_step_s > 86_400 * 7 || self.progress_deadline_s > 86_400 * 7 {
            return Err("rollout.min_step_s and progress_deadline_s must be at most a week".into());
        }
        if self.progress_deadline_s == 0 {
            return Err("rollout.progress_deadline_s must be at least 1".into());
        }
        let finite = [
            ("max_p99_ratio", self.max_p99_ratio),
            ("min_p99_increase_ms", self.min_p99_increase_ms),
            ("max_error_rate_increase", self.max_error_rate_increase),
            (
                "max_offload_share_increase",
                self.max_offload_share_increase,
            ),
            ("max_accuracy_drop_points", self.max_accuracy_drop_points),
        ];
        for (name, value) in finite {
            if !value.is_finite() || value < 0.0 {
                return Err(format!("rollout.{name} must be a number ≥ 0, got {value}"));
            }
        }
        if self.max_p99_ratio < 1.0 {
            return Err(format!(
                "rollout.max_p99_ratio must be at least 1, got {}",
                self.max_p99_ratio
            ));
        }
        Ok(())
    }
}

/// What a device runs of a deployment: the fields a rollout changes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct RuntimeSpec {
    /// The model version (`name:version`, the store key of the model).
    pub model: String,
    pub variant: String,
    pub slo_ms: u32,
    pub offload: bool,
    pub max_queue: u32,
    pub hard_example_threshold: Option<f32>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum RolloutState {
    Progressing,
    Paused,
    Complete,
    RolledBack,
}

impl RolloutState {
    /// Whether the rollout still holds devices apart (progressing or paused).
    pub fn active(self) -> bool {
        matches!(self, RolloutState::Progressing | RolloutState::Paused)
    }
}

/// What a version showed on a set of devices.
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize, schemars::JsonSchema)]
pub struct Figures {
    pub devices: usize,
    pub requests: u64,
    pub failed: u64,
    pub offloaded: u64,
    /// Median over the devices of each device's p99, ms.
    pub p99_ms: f64,
}

impl Figures {
    pub fn error_rate(&self) -> f64 {
        if self.requests == 0 {
            0.0
        } else {
            self.failed as f64 / self.requests as f64
        }
    }

    pub fn offload_share(&self) -> f64 {
        let served = self.requests.saturating_sub(self.failed);
        if served == 0 {
            0.0
        } else {
            self.offloaded as f64 / served as f64
        }
    }
}

/// Something that happened in a rollout, for its history.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct RolloutEvent {
    pub at_unix_ms: u64,
    pub message: String,
}

/// A rollout as the API shows it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct RolloutView {
    pub number: u64,
    /// `progressing`, `paused`, `complete` or `rolled_back`.
    pub state: RolloutState,
    pub from: RuntimeSpec,
    pub to: RuntimeSpec,
    /// 1-based step under way, of `steps`.
    pub step: usize,
    pub steps: Vec<u32>,
    /// Selected edge devices, and how many are told to run the new version.
    pub selected_devices: usize,
    pub moved_devices: Vec<String>,
    /// What the gate saw last, or what it waits for.
    pub gate: String,
    pub settings: RolloutSettings,
    pub started_unix_ms: u64,
    pub finished_unix_ms: Option<u64>,
    pub baseline: Figures,
    pub events: Vec<RolloutEvent>,
}
