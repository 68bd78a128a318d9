//! Node providers: what starts and stops a pool's nodes when its region asks.
//!
//! The region scheduler decides (pure, `scheduler/nodes.rs`); a provider carries out
//! one [`crate::scheduler::NodeAction`] at a time, off the actor, and the region hears
//! back whether it worked. A provider never decides anything and holds no books: a
//! slot is capacity only while the scheduler has it `launching` or `up`.
//!
//! | provider  | launch                                                   | release                       |
//! |-----------|----------------------------------------------------------|-------------------------------|
//! | `local`   | `nephele-edge join` + `nephele-edge run --role pool` as processes on this machine, after `boot_delay_s` | SIGTERM to the agent, SIGKILL after 10 s |
//! | `command` | the pool's `add` script (`deploy/providers/README.md`)   | its `remove` script           |
//!
//! Every call is bounded in time (scripts by their `timeout_s`, the local provider by
//! its join's own timeout), so a hung provider is reported as failed and retried with
//! backoff, never counted twice.

pub mod command;
pub mod local;

use std::future::Future;
use std::pin::Pin;

use crate::config::{CommandProviderConfig, ProviderKind};

/// A boxed future, as provider calls return (no async-trait dependency).
pub type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send + 'static>>;

/// Everything a provider needs to start one node.
#[derive(Debug, Clone)]
pub struct LaunchRequest {
    pub region: String,
    pub pool: String,
    /// The slot's name in the region (`<pool>-<n>`).
    pub node: String,
    /// The device name the node's agent must join as (`<region>-<pool>-<n>`).
    pub device: String,
    pub profile: String,
    pub capacity_type: String,
    /// QUIC address agents connect to, HOST:PORT.
    pub server: String,
    /// A fresh single-use join token for this node.
    pub token: String,
}

#[derive(Debug, Clone)]
pub struct ReleaseRequest {
    pub region: String,
    pub pool: String,
    pub node: String,
    pub device: String,
}

/// Starts and stops nodes. Implementations are cheap to call: the work happens in the
/// returned future, which the region runs off its actor.
pub trait Provider: Send + Sync {
    fn launch(&self, request: LaunchRequest) -> BoxFuture<Result<(), String>>;
    fn release(&self, request: ReleaseRequest) -> BoxFuture<Result<(), String>>;
    /// The device names of the nodes it runs for `pool` now, when it can tell (`None`:
    /// it cannot). After a control-plane restart the region reconciles its books with
    /// this: a node it does not list is gone, and one it lists that the books do not
    /// know is released.
    fn list(&self, region: &str, pool: &str) -> BoxFuture<Option<Result<Vec<String>, String>>>;
}

/// The providers of one region: one per kind in use, the command provider per pool.
pub struct Providers {
    pub local: Option<std::sync::Arc<local::LocalProvider>>,
    pub command: std::collections::BTreeMap<String, std::sync::Arc<command::CommandProvider>>,
}

impl Providers {
    pub fn new(
        local: Option<std::sync::Arc<local::LocalProvider>>,
        commands: impl IntoIterator<Item = (String, CommandProviderConfig)>,
    ) -> Providers {
        Providers {
            local,
            command: commands
                .into_iter()
                .map(|(pool, config)| {
                    (
                        pool,
                        std::sync::Arc::new(command::CommandProvider::new(config)),
                    )
                })
                .collect(),
        }
    }

    /// The provider of `pool` with kind `kind`, if configured.
    pub fn get(&self, kind: ProviderKind, pool: &str) -> Option<std::sync::Arc<dyn Provider>> {
        match kind {
            ProviderKind::None => None,
            ProviderKind::Local => self
                .local
                .clone()
                .map(|p| p as std::sync::Arc<dyn Provider>),
            ProviderKind::Command => self
                .command
                .get(pool)
                .cloned()
                .map(|p| p as std::sync::Arc<dyn Provider>),
        }
    }
}

/// The last `limit` bytes of a process's output, as text, for an error message.
pub(crate) fn tail_text(bytes: &[u8], limit: usize) -> String {
    let start = bytes.len().saturating_sub(limit);
    String::from_utf8_lossy(&bytes[start..]).trim().to_string()
}
