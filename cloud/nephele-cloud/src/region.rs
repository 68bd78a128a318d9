//! One actor per configured region. Today it tracks the region's pool agents and picks
//! the replica for each offloaded request (least outstanding requests, ties by name);
//! autoscaling and placement will live here, calling pure cores.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

use actix::prelude::*;

struct PoolMember {
    session_id: u64,
    connection: quinn::Connection,
    outstanding: Arc<AtomicU32>,
    profile: String,
}

pub struct RegionActor {
    name: String,
    pools: BTreeMap<String, PoolMember>,
}

impl RegionActor {
    pub fn new(name: String) -> Self {
        RegionActor {
            name,
            pools: BTreeMap::new(),
        }
    }
}

impl Actor for RegionActor {
    type Context = Context<Self>;
}

#[derive(Message)]
#[rtype(result = "()")]
pub struct PoolJoined {
    pub name: String,
    pub session_id: u64,
    pub connection: quinn::Connection,
    pub profile: String,
}

impl Handler<PoolJoined> for RegionActor {
    type Result = ();
    fn handle(&mut self, message: PoolJoined, _: &mut Self::Context) {
        tracing::info!(region = %self.name, pool_agent = %message.name, profile = %message.profile, "pool replica available");
        self.pools.insert(
            message.name,
            PoolMember {
                session_id: message.session_id,
                connection: message.connection,
                outstanding: Arc::new(AtomicU32::new(0)),
                profile: message.profile,
            },
        );
    }
}

#[derive(Message)]
#[rtype(result = "()")]
pub struct PoolLeft {
    pub name: String,
    pub session_id: u64,
}

impl Handler<PoolLeft> for RegionActor {
    type Result = ();
    fn handle(&mut self, message: PoolLeft, _: &mut Self::Context) {
        if self.pools.get(&message.name).map(|m| m.session_id) == Some(message.session_id) {
            self.pools.remove(&message.name);
            tracing::info!(region = %self.name, pool_agent = %message.name, "pool replica gone");
        }
    }
}

/// A chosen replica. `outstanding` is incremented on creation; drop the guard when the
/// request is done.
pub struct PoolLease {
    pub name: String,
    pub connection: quinn::Connection,
    outstanding: Arc<AtomicU32>,
}

impl Drop for PoolLease {
    fn drop(&mut self) {
        self.outstanding.fetch_sub(1, Ordering::Relaxed);
    }
}

#[derive(Message)]
#[rtype(result = "Option<PoolLease>")]
pub struct PickPool {
    /// Never route to this agent (a pool agent offloading to itself).
    pub exclude: Option<String>,
}

impl Handler<PickPool> for RegionActor {
    type Result = Option<PoolLease>;
    fn handle(&mut self, message: PickPool, _: &mut Self::Context) -> Self::Result {
        self.pools
            .retain(|_, member| member.connection.close_reason().is_none());
        let (name, member) = self
            .pools
            .iter()
            .filter(|(name, _)| Some(*name) != message.exclude.as_ref())
            .min_by_key(|(name, member)| {
                (member.outstanding.load(Ordering::Relaxed), (*name).clone())
            })?;
        member.outstanding.fetch_add(1, Ordering::Relaxed);
        let _ = &member.profile;
        Some(PoolLease {
            name: name.clone(),
            connection: member.connection.clone(),
            outstanding: member.outstanding.clone(),
        })
    }
}
