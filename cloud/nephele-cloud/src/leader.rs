//! Leadership among control-plane replicas that share an etcd cluster: one replica
//! leads (serves the API and agents, runs the regions); the others wait as standbys and
//! take over when the leader's lease ends.
//!
//! etcd's election recipe: the leader key `<prefix>leader` is created by the first
//! replica that finds it absent, bound to a lease of [`LEASE_TTL_S`] seconds that the
//! leader renews every third of it. A leader killed or cut off stops renewing; etcd
//! deletes the key when the lease ends, and a standby creates it. Fencing: from the
//! moment it leads, every write of a replica is a transaction that compares the leader
//! key's create revision with its own ([`Etcd::fence_on`]), so a replica deposed while
//! paused or partitioned cannot write a thing; and a leader that cannot renew its lease
//! before it ends exits (status 75), so that its supervisor starts it again as a
//! standby rather than it acting on state it no longer owns.
//!
//! Today every region is led by the one leading replica (the state is one fleet); a
//! standby forwards API connections to the leader (the `standby` module) until it leads. Agents are given every replica's address
//! (`nephele-edge join --server A,B`) and move to whichever answers.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::store::etcd::{Campaign, Etcd};

/// Seconds a leader's lease lasts without renewal: how long a dead leader's regions
/// wait for another replica, at most.
pub const LEASE_TTL_S: u64 = 5;

/// What the leader key says about its holder (for logs and operators).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct LeaderInfo {
    pub host: String,
    pub pid: u32,
    /// The API and QUIC addresses it was configured with.
    pub api: String,
    pub quic: String,
}

impl LeaderInfo {
    pub fn describe(&self) -> String {
        format!(
            "{} pid {} (API {}, QUIC {})",
            self.host, self.pid, self.api, self.quic
        )
    }
}

/// The exit status of a leader that lost its lease.
pub const EXIT_DEPOSED: i32 = 75;

/// Where a replica notes its lease, so that when it is started again (after a crash,
/// say) it ends its old lease at once rather than waiting out the TTL behind itself.
const LEASE_FILE: &str = "leader-lease";

/// The key the leader holds: `<prefix>leader`.
pub fn leader_key(etcd: &Etcd) -> String {
    etcd.key("leader", "").trim_end_matches('/').to_string()
}

/// Waits until this replica leads, then fences the store on its leadership and keeps
/// the lease alive on a thread of its own until the process ends.
pub async fn lead(etcd: Arc<Etcd>, me: LeaderInfo, data_dir: &Path) -> anyhow::Result<()> {
    let key = leader_key(&etcd);
    let value = serde_json::to_vec(&me)?;
    let lease_file = data_dir.join(LEASE_FILE);
    if let Some(old) = std::fs::read_to_string(&lease_file)
        .ok()
        .and_then(|text| text.trim().parse::<i64>().ok())
    {
        // This replica's previous life held it (or had): end it, so that a leader
        // started again leads again at once.
        end_previous_lease(&etcd, old).await;
        let _ = std::fs::remove_file(&lease_file);
    }
    let mut announced: Option<Vec<u8>> = None;
    loop {
        let attempt = {
            let etcd = etcd.clone();
            let (key, value) = (key.clone(), value.clone());
            tokio::task::spawn_blocking(move || -> Result<_, crate::store::StoreError> {
                // A lease only when the key looks free, so a standby does not grant one
                // every half second.
                if let Some(by) = etcd.get(&key)? {
                    return Ok((Campaign::Held { by }, 0));
                }
                let lease = etcd.grant_lease(LEASE_TTL_S)?;
                Ok((etcd.campaign(&key, &value, lease)?, lease))
            })
            .await?
        };
        match attempt {
            Ok((Campaign::Won { revision }, lease)) => {
                etcd.fence_on(&key, revision);
                if let Err(error) = std::fs::write(&lease_file, lease.to_string()) {
                    tracing::warn!(%error, "cannot note the leader lease; a restart will wait for it to end");
                }
                tracing::info!(revision, lease, ttl_s = LEASE_TTL_S, "this replica leads");
                let etcd = etcd.clone();
                std::thread::Builder::new()
                    .name("leader-lease".into())
                    .spawn(move || keep_lease(&etcd, lease))?;
                return Ok(());
            }
            Ok((Campaign::Held { by }, _)) => {
                if announced.as_ref() != Some(&by) {
                    let holder = serde_json::from_slice::<LeaderInfo>(&by)
                        .map(|info| info.describe())
                        .unwrap_or_else(|_| String::from_utf8_lossy(&by).into_owned());
                    tracing::info!(leader = %holder, "standby: another replica leads; waiting to take over");
                    announced = Some(by);
                }
            }
            Err(error) => {
                tracing::warn!(%error, "standby: cannot campaign for leadership now; retrying");
            }
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// Ends the lease this replica held before it was started again. A lease already gone
/// is no error. etcd may not take the revoke at once (a member killed with this
/// replica was its raft leader, and the others are still electing one), so it is tried
/// again until it succeeds or the lease must have ended anyway, one TTL later: before,
/// one refused attempt meant waiting the whole lease out (7.6 s to lead, once in six
/// runs of `etcd_store.rs`, instead of 0.05-0.12 s).
async fn end_previous_lease(etcd: &Arc<Etcd>, lease: i64) {
    let give_up = Instant::now() + Duration::from_secs(LEASE_TTL_S);
    let mut attempts = 0u32;
    loop {
        attempts += 1;
        let revoked = {
            let etcd = etcd.clone();
            tokio::task::spawn_blocking(move || etcd.revoke_lease(lease)).await
        };
        match revoked {
            Ok(Ok(())) => {
                tracing::info!(
                    lease,
                    attempts,
                    "ended this replica's lease from before its restart"
                );
                return;
            }
            Ok(Err(error)) if error.to_string().contains("lease not found") => return,
            Ok(Err(error)) if Instant::now() < give_up => {
                tracing::debug!(lease, %error, "cannot end the previous lease yet; retrying");
            }
            Ok(Err(error)) => {
                tracing::warn!(lease, attempts, %error, "cannot end this replica's lease from before its restart; waiting for it to run out");
                return;
            }
            Err(error) => {
                tracing::warn!(lease, %error, "the lease revoke task failed; waiting for the lease to run out");
                return;
            }
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Renews `lease` every third of its life; exits the process when it cannot be
/// renewed before it ends (the key is gone, another replica may lead).
fn keep_lease(etcd: &Etcd, lease: i64) {
    let ttl = Duration::from_secs(LEASE_TTL_S);
    let mut renewed = Instant::now();
    loop {
        std::thread::sleep(ttl / 3);
        match etcd.keep_alive(lease) {
            Ok(left) if left > 0 => renewed = Instant::now(),
            Ok(_) => deposed("the leader lease expired before it was renewed"),
            Err(error) if renewed.elapsed() >= ttl => {
                deposed(&format!("the leader lease could not be renewed: {error}"))
            }
            Err(error) => {
                tracing::warn!(%error, "cannot renew the leader lease yet; retrying");
            }
        }
    }
}

fn deposed(why: &str) -> ! {
    tracing::error!(
        reason = why,
        "this replica no longer leads: exiting so that it is started again as a standby"
    );
    std::process::exit(EXIT_DEPOSED)
}
