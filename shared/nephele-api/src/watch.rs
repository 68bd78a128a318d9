//! Watches (`GET /v1/watch`): server-sent events, one per change; `data` is a
//! [`WatchEvent`], or a [`WatchReset`] for an event named `reset`.

use serde::{Deserialize, Serialize};

/// One change to a device, model, deployment, job or node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct WatchEvent {
    /// Increasing per control-plane process (the event id is `<epoch>-<version>`).
    pub version: u64,
    /// `device`, `model`, `deployment`, `job` or `node`.
    pub kind: String,
    pub name: String,
    /// `put` (created or changed) or `delete`.
    pub action: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tenant: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub region: Option<String>,
    pub unix_ms: u64,
}

/// The watch cannot resume where the client asked: list again.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct WatchReset {
    pub reason: String,
}
