//! Node slots and node provisioning.
//!
//! Every `[[region.pool]]` has `max_nodes` slots. In a pool without a provider a slot
//! is filled by any pool agent with the pool's profile when it connects (the agent was
//! enrolled by hand). In a pool with a provider (`local` or `command`), the region asks
//! the provider for a node when pending work needs one, and the node's agent joins as
//! the slot's device name (`<region>-<pool>-<n>`).
//!
//! | phase       | on                                             | next        |
//! |-------------|------------------------------------------------|-------------|
//! | absent      | work needs a node of this pool (provider pool) | launching   |
//! | absent      | an agent with the pool's profile connects      | up          |
//! | launching   | its agent connects                             | up          |
//! | launching   | the provider failed, or no agent within `join_timeout_s` | absent (retry with backoff) or releasing |
//! | up          | empty for `scale_down_after_s`, above `min_nodes` | releasing |
//! | up          | its work fits elsewhere (consolidation)        | draining    |
//! | up          | an interruption notice (spot)                  | draining    |
//! | up          | its agent away for `lost_after_s`              | up, its work requeued (provider pools: released after `join_timeout_s`) |
//! | draining    | empty, or the notice's deadline                | releasing (provider pools) |
//! | draining    | its agent leaves (pools without a provider)    | absent      |
//! | releasing   | the provider removed it                        | absent      |
//! | releasing   | the provider failed                            | releasing (retried with backoff) |
//!
//! A node counts as capacity only while `launching` (planned on, not placed on) or
//! `up` with its agent connected (placed on): a failed or hung launch is never counted
//! twice, since the slot goes back to `absent` before it is tried again. At most
//! `disruption_budget` nodes are draining or releasing at once.
//!
//! Scale-up is a simulation on a copy of the cluster, as Karpenter's: the pending jobs
//! (highest priority first) are placed on the nodes that are up or launching; a job that
//! still does not fit gets new nodes of the cheapest pool whose node could ever hold it,
//! one at a time, until it fits or the pool is full.

use std::collections::{BTreeMap, BTreeSet};

use nephele_placement::gang::{place_gang, GangRequest};
use nephele_placement::queue::{JobState, WhyPending, MEMBER_BITS};
use nephele_placement::rng::Rng;
use nephele_placement::Cluster;
use nephele_proto::GpuReport;
use serde::{Deserialize, Serialize};

use super::{JobKind, NodeView, RegionScheduler, SchedError, SchedEvent};
use crate::config::{PoolConfig, ProviderKind};

/// Where a slot's node is in its life (see the module table).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", tag = "phase")]
pub enum NodePhase {
    Absent,
    Launching {
        since: u64,
    },
    Up {
        since: u64,
    },
    Draining {
        since: u64,
        deadline: u64,
        /// Ask the provider to remove it once empty (or at the deadline).
        release: bool,
    },
    Releasing {
        since: u64,
    },
}

impl NodePhase {
    pub fn name(&self) -> &'static str {
        match self {
            NodePhase::Absent => "absent",
            NodePhase::Launching { .. } => "launching",
            NodePhase::Up { .. } => "up",
            NodePhase::Draining { .. } => "draining",
            NodePhase::Releasing { .. } => "releasing",
        }
    }

    fn since(&self) -> Option<u64> {
        match self {
            NodePhase::Absent => None,
            NodePhase::Launching { since }
            | NodePhase::Up { since }
            | NodePhase::Draining { since, .. }
            | NodePhase::Releasing { since } => Some(*since),
        }
    }
}

/// What the shell asks a provider to do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NodeAction {
    /// Start a node that joins as `device` (with a fresh join token).
    Launch {
        node: String,
        device: String,
        pool: String,
        profile: String,
        capacity_type: String,
        provider: ProviderKind,
    },
    /// Remove the node (its agent, its machine).
    Release {
        node: String,
        device: String,
        pool: String,
        provider: ProviderKind,
    },
}

pub(super) struct Slot {
    pub(super) name: String,
    pub(super) pool: String,
    pub(super) pool_index: usize,
    pub(super) profile: String,
    pub(super) gpu_model: Option<String>,
    pub(super) price_per_hour: f64,
    /// The node's rated power (its profile's `power_budget_w`), for the ledger.
    pub(super) power_w: f64,
    pub(super) capacity_type: String,
    pub(super) provider: ProviderKind,
    /// The device name a provider launches this slot's node as.
    pub(super) device: Option<String>,
    pub(super) phase: NodePhase,
    /// The pool agent serving it now.
    pub(super) agent: Option<String>,
    /// The agent that served it last, so a reconnecting agent gets its slot back.
    pub(super) last_agent: Option<String>,
    /// Since when its agent is away (the node keeps its work for `lost_after_s`).
    pub(super) away_since: Option<u64>,
    /// Since when it holds nothing.
    pub(super) empty_since: Option<u64>,
    /// Since when everything on it would fit elsewhere (consolidation).
    pub(super) movable_since: Option<u64>,
    /// Where gang members reach it (`MASTER_ADDR`).
    pub(super) address: String,
    pub(super) gpus: Vec<GpuReport>,
    pub(super) note: Option<String>,
    /// When a failed release is tried again.
    pub(super) retry_release_at: Option<u64>,
}

impl Slot {
    pub(super) fn new(
        region: &str,
        pool: &PoolConfig,
        pool_index: usize,
        index: u32,
        name: &str,
        gpu_model: Option<String>,
    ) -> Slot {
        Slot {
            name: name.to_string(),
            pool: pool.name.clone(),
            pool_index,
            profile: pool.node_profile.clone(),
            gpu_model,
            price_per_hour: pool.price_per_hour,
            power_w: nephele_domain::builtin_profiles::builtin(&pool.node_profile)
                .and_then(Result::ok)
                .map_or(0.0, |p| p.device.power_budget_w),
            capacity_type: pool.capacity_type.clone(),
            provider: pool.provider,
            device: (pool.provider != ProviderKind::None)
                .then(|| format!("{region}-{}-{index}", pool.name)),
            phase: NodePhase::Absent,
            agent: None,
            last_agent: None,
            away_since: None,
            empty_since: None,
            movable_since: None,
            address: String::new(),
            gpus: Vec::new(),
            note: None,
            retry_release_at: None,
        }
    }
}

/// A pool's provisioning state.
pub(super) struct PoolState {
    pub(super) name: String,
    pub(super) provider: ProviderKind,
    pub(super) min_nodes: u32,
    pub(super) price_per_hour: f64,
    pub(super) interruptions_per_1000h: u32,
    /// Failed launches or releases in a row, and when to try again.
    pub(super) failures: u32,
    pub(super) retry_at: u64,
}

impl PoolState {
    pub(super) fn new(pool: &PoolConfig) -> PoolState {
        PoolState {
            name: pool.name.clone(),
            provider: pool.provider,
            min_nodes: pool.min_nodes,
            price_per_hour: pool.price_per_hour,
            interruptions_per_1000h: pool.interruptions_per_1000h,
            failures: 0,
            retry_at: 0,
        }
    }

    /// Price per node-hour with the expected cost of interruptions: each one loses
    /// about half an hour of the node's work (a spot pool is not free of risk).
    fn effective_price(&self) -> f64 {
        let interruptions_per_hour = f64::from(self.interruptions_per_1000h) / 1000.0;
        self.price_per_hour * (1.0 + 0.5 * interruptions_per_hour)
    }
}

/// Most nodes one planning pass launches for one job.
const MAX_LAUNCH_PER_JOB: usize = 16;

impl RegionScheduler {
    /// Index of the slot served by `agent`.
    pub(super) fn slot_of_agent(&self, agent: &str) -> Option<usize> {
        self.slots
            .iter()
            .position(|s| s.agent.as_deref() == Some(agent))
    }

    pub(super) fn slot_named(&self, node: &str) -> Option<usize> {
        self.slots.iter().position(|s| s.name == node)
    }

    /// A pool agent connected. Returns the slot it now serves, or `None` when no pool of
    /// this region has its profile or every such slot is taken (it still serves
    /// offloaded requests, but no work is placed on it).
    ///
    /// A provider's node joins as its slot's device name and gets that slot; an agent
    /// enrolled by hand gets a free slot of a pool without a provider, its own last
    /// slot first.
    pub fn agent_joined(
        &mut self,
        agent: &str,
        profile: &str,
        address: &str,
        gpus: Vec<GpuReport>,
        now: u64,
    ) -> Option<String> {
        let index = self
            .slots
            .iter()
            .position(|s| s.agent.as_deref() == Some(agent))
            .or_else(|| {
                self.slots
                    .iter()
                    .position(|s| s.device.as_deref() == Some(agent) && s.agent.is_none())
            })
            .or_else(|| {
                // A slot whose absent agent still holds work there is kept for that
                // agent: another one would be told to start the same processes.
                let holding: BTreeSet<usize> = self
                    .cluster
                    .reservations()
                    .map(|(_, (_, b))| b.node)
                    .collect();
                let free = |(index, s): (usize, &Slot)| {
                    s.profile == profile
                        && s.agent.is_none()
                        && s.provider == ProviderKind::None
                        && !matches!(s.phase, NodePhase::Draining { .. })
                        && (!holding.contains(&index) || s.last_agent.as_deref() == Some(agent))
                };
                let slots = || self.slots.iter().enumerate();
                slots()
                    .position(|(i, s)| free((i, s)) && s.last_agent.as_deref() == Some(agent))
                    .or_else(|| slots().position(|(i, s)| free((i, s)) && s.last_agent.is_none()))
                    .or_else(|| slots().position(free))
            })?;
        let slot = &mut self.slots[index];
        if slot.profile != profile {
            // A provider node that came up with another profile: not this slot's kind.
            return None;
        }
        slot.agent = Some(agent.to_string());
        slot.last_agent = Some(agent.to_string());
        slot.away_since = None;
        slot.address = address.to_string();
        slot.gpus = gpus;
        match slot.phase {
            NodePhase::Draining { .. } => {}
            NodePhase::Up { .. } => self.cluster.node_up(index),
            _ => {
                slot.phase = NodePhase::Up { since: now };
                slot.note = None;
                self.cluster.node_up(index);
            }
        }
        if let Some(pool) = self.pools.get_mut(self.slots[index].pool_index) {
            pool.failures = 0;
        }
        let adopted = self.adopt_recovering(now);
        self.later.extend(adopted);
        Some(self.slots[index].name.clone())
    }

    /// A pool agent went away. Its node takes no new work; its jobs keep their places
    /// (their processes may well still run) until the agent has been away for
    /// `lost_after_s`, when they run again elsewhere.
    pub fn agent_left(&mut self, agent: &str, now: u64) -> Vec<SchedEvent> {
        let Some(index) = self.slot_of_agent(agent) else {
            return Vec::new();
        };
        let slot = &mut self.slots[index];
        slot.agent = None;
        slot.away_since = Some(now);
        self.cluster.set_available(index, false);
        if slot.provider == ProviderKind::None && matches!(slot.phase, NodePhase::Draining { .. }) {
            // A drained node without a provider is gone once its agent leaves.
            return self.node_gone(index, "drained node left", now);
        }
        Vec::new()
    }

    /// The node of slot `index` is gone for good: its work runs again elsewhere.
    fn node_gone(&mut self, index: usize, why: &str, now: u64) -> Vec<SchedEvent> {
        let mut events = self.requeue_node(index, why, now);
        let slot = &mut self.slots[index];
        slot.agent = None;
        slot.away_since = None;
        slot.phase = NodePhase::Absent;
        slot.empty_since = None;
        slot.movable_since = None;
        events.push(SchedEvent::Node {
            node: slot.name.clone(),
            what: why.to_string(),
        });
        events
    }

    /// Every job with a member on node `index` loses its resources and waits again.
    fn requeue_node(&mut self, index: usize, why: &str, now: u64) -> Vec<SchedEvent> {
        let hit = self.queue.node_lost(&mut self.cluster, index, now);
        let mut events = Vec::new();
        for id in hit {
            events.extend(self.on_lost(id, why, now));
        }
        events
    }

    /// Time-driven node transitions: agents away too long, drains at their deadline,
    /// empty drained nodes. Runs at the start of every tick.
    pub(super) fn nodes_tick(&mut self, now: u64) -> Vec<SchedEvent> {
        let mut events = Vec::new();
        let lost_after = self.settings.lost_after_s;
        // One pass over the reservations, not one per node: a tick runs on every
        // batch of submissions, with every node and thousands of jobs.
        let mut reserved = vec![false; self.slots.len()];
        for (_, (_, binding)) in self.cluster.reservations() {
            if let Some(flag) = reserved.get_mut(binding.node) {
                *flag = true;
            }
        }
        let recovering = self.nodes_recovering();
        for (index, has_reservation) in reserved.into_iter().enumerate() {
            let slot = &self.slots[index];
            let mut held = has_reservation || recovering.contains(&index);
            if let Some(away) = slot.away_since {
                if has_reservation && now >= away.saturating_add(lost_after) {
                    let what = format!("agent away for {lost_after} s: its work runs elsewhere");
                    events.extend(self.requeue_node(index, &what, now));
                    events.push(SchedEvent::Node {
                        node: self.slots[index].name.clone(),
                        what,
                    });
                    held = self.holds_work(index);
                }
            }
            let slot = &mut self.slots[index];
            match slot.phase {
                NodePhase::Up { .. } if !held && slot.agent.is_some() => {
                    slot.empty_since.get_or_insert(now);
                }
                _ => slot.empty_since = None,
            }
            if let NodePhase::Draining { deadline, .. } = slot.phase {
                if held && now >= deadline {
                    let what = "interruption deadline reached: what is left runs elsewhere";
                    events.extend(self.requeue_node(index, what, now));
                }
            }
        }
        events
    }

    /// Starts draining `node`: it takes no new work; its serving replicas are started
    /// elsewhere first and leave once their replacements are ready; its jobs get SIGTERM
    /// now (they checkpoint) and run again elsewhere. With `release`, the provider
    /// removes the node once it is empty, or at `deadline` whatever is left.
    pub fn drain(
        &mut self,
        node: &str,
        deadline: u64,
        reason: &str,
        now: u64,
    ) -> Result<Vec<SchedEvent>, SchedError> {
        let index = self
            .slot_named(node)
            .or_else(|| {
                self.slots.iter().position(|s| {
                    s.agent.as_deref() == Some(node) || s.device.as_deref() == Some(node)
                })
            })
            .ok_or_else(|| {
                SchedError::NotFound(format!(
                    "no node {node:?} in region {}; `nephele region nodes {}` lists them",
                    self.region, self.region
                ))
            })?;
        let slot = &mut self.slots[index];
        match slot.phase {
            NodePhase::Up { .. } => {}
            NodePhase::Draining { deadline: old, .. } if deadline < old => {}
            other => {
                return Err(SchedError::Conflict(format!(
                    "node {} is {}, not up",
                    slot.name,
                    other.name()
                )))
            }
        }
        let release = slot.provider != ProviderKind::None;
        slot.phase = NodePhase::Draining {
            since: now,
            deadline,
            release,
        };
        slot.note = Some(reason.to_string());
        self.cluster.set_available(index, false);
        let mut events = vec![SchedEvent::Node {
            node: self.slots[index].name.clone(),
            what: format!("draining: {reason}"),
        }];
        let grace = self
            .settings
            .grace_s
            .min(deadline.saturating_sub(now).saturating_sub(1));
        let on_node: BTreeSet<u64> = self
            .cluster
            .reservations()
            .filter(|(_, (_, b))| b.node == index)
            .map(|(id, _)| id >> MEMBER_BITS)
            .collect();
        for id in on_node {
            let Some(meta) = self.jobs.get(&id) else {
                continue;
            };
            match meta.kind.clone() {
                JobKind::Replica { deployment } => {
                    events.extend(self.replace_replica(&deployment, id, now));
                }
                JobKind::Batch => {
                    if self.queue.evict(id, now, grace) {
                        self.on_stopping(id, "drained", now);
                        events.push(SchedEvent::Preempting {
                            job: self.qualified(id),
                            by: format!("drain of {}", self.slots[index].name),
                            grace_seconds: grace,
                        });
                    }
                }
            }
        }
        // Work restored as running here and not adopted yet runs again elsewhere: its
        // members leave this node's desired state (and are stopped there).
        for id in self.recovering_on(index) {
            events.extend(self.requeue_held(id, "its node is drained", now));
        }
        Ok(events)
    }

    /// The provider's answer to a launch: on failure the slot is free again and the
    /// pool waits before the next try (doubling, at most 300 s).
    pub fn launch_result(
        &mut self,
        node: &str,
        result: Result<(), String>,
        now: u64,
    ) -> Vec<SchedEvent> {
        let Some(index) = self.slot_named(node) else {
            return Vec::new();
        };
        match result {
            Ok(()) => Vec::new(),
            Err(error) => {
                let slot = &mut self.slots[index];
                if !matches!(slot.phase, NodePhase::Launching { .. }) {
                    return Vec::new();
                }
                slot.phase = NodePhase::Absent;
                slot.note = Some(format!("launch failed: {error}"));
                let pool_index = slot.pool_index;
                let wait = self.pool_failed(pool_index, now);
                vec![SchedEvent::Node {
                    node: node.to_string(),
                    what: format!("launch failed ({error}); next try in {wait} s"),
                }]
            }
        }
    }

    /// The provider's answer to a release: the slot is free once it succeeded; a
    /// failure is retried after the pool's backoff.
    pub fn release_result(
        &mut self,
        node: &str,
        result: Result<(), String>,
        now: u64,
    ) -> Vec<SchedEvent> {
        let Some(index) = self.slot_named(node) else {
            return Vec::new();
        };
        match result {
            Ok(()) => {
                let events = self.node_gone(index, "released", now);
                self.slots[index].note = None;
                self.slots[index].last_agent = None;
                events
            }
            Err(error) => {
                let pool_index = self.slots[index].pool_index;
                let wait = self.pool_failed(pool_index, now);
                let slot = &mut self.slots[index];
                // Stays releasing; the planner asks again once the backoff has passed.
                slot.retry_release_at = Some(now + wait);
                slot.note = Some(format!("release failed: {error}"));
                vec![SchedEvent::Node {
                    node: node.to_string(),
                    what: format!("release failed ({error}); next try in {wait} s"),
                }]
            }
        }
    }

    /// What a provider lists for `pool` (after a control-plane restart): a node the
    /// books have but the provider does not run is gone (its work runs elsewhere); one it
    /// runs that the books do not know (its launch was not recorded) is released.
    pub fn provider_listed(
        &mut self,
        pool: &str,
        devices: &[String],
        now: u64,
    ) -> (Vec<NodeAction>, Vec<SchedEvent>) {
        let mut actions = Vec::new();
        let mut events = Vec::new();
        for index in 0..self.slots.len() {
            let slot = &self.slots[index];
            if slot.pool != pool || slot.provider == ProviderKind::None {
                continue;
            }
            let listed = slot
                .device
                .as_ref()
                .is_some_and(|device| devices.contains(device));
            match slot.phase {
                NodePhase::Absent if listed => {
                    self.slots[index].note =
                        Some("running but unknown to the books: released".into());
                    actions.push(self.release(index, now));
                }
                NodePhase::Launching { .. } | NodePhase::Up { .. } | NodePhase::Draining { .. }
                    if !listed && slot.agent.is_none() =>
                {
                    events.extend(self.node_gone(index, "its provider no longer runs it", now));
                }
                _ => {}
            }
        }
        (actions, events)
    }

    /// Records a failed provider call for a pool; returns the wait before its next one.
    fn pool_failed(&mut self, pool_index: usize, now: u64) -> u64 {
        let base = self.settings.nodes.retry_after_s.max(1);
        let Some(pool) = self.pools.get_mut(pool_index) else {
            return base;
        };
        pool.failures = pool.failures.saturating_add(1);
        let wait = base
            .saturating_mul(1u64 << (pool.failures - 1).min(16))
            .min(300);
        pool.retry_at = now + wait;
        wait
    }

    /// Nodes being drained or released now (what the disruption budget limits).
    fn disrupting(&self) -> usize {
        self.slots
            .iter()
            .filter(|s| {
                matches!(
                    s.phase,
                    NodePhase::Draining { .. } | NodePhase::Releasing { .. }
                )
            })
            .count()
    }

    /// What to ask providers for now: launches for pending work that fits nowhere up or
    /// coming, releases of idle or drained nodes and of launches that never joined.
    /// Slots change phase here (launching, releasing), so a second call plans nothing
    /// twice; the shell reports back with [`Self::launch_result`] and
    /// [`Self::release_result`].
    pub fn plan_nodes(&mut self, now: u64) -> (Vec<NodeAction>, Vec<SchedEvent>) {
        let mut actions = Vec::new();
        let mut events = Vec::new();
        let config = self.settings.nodes.clone();
        // 1. Launches that never joined, and releases to retry.
        for index in 0..self.slots.len() {
            let slot = &self.slots[index];
            if slot.provider == ProviderKind::None {
                continue;
            }
            match slot.phase {
                NodePhase::Launching { since }
                    if now >= since.saturating_add(config.join_timeout_s) =>
                {
                    let pool_index = slot.pool_index;
                    self.pool_failed(pool_index, now);
                    self.slots[index].note = Some(format!(
                        "no agent joined within {} s of the launch",
                        config.join_timeout_s
                    ));
                    actions.push(self.release(index, now));
                }
                NodePhase::Up { .. }
                    if slot.agent.is_none()
                        && slot
                            .away_since
                            .is_some_and(|a| now >= a.saturating_add(config.join_timeout_s)) =>
                {
                    self.slots[index].note = Some(format!(
                        "its agent has been away for {} s",
                        config.join_timeout_s
                    ));
                    actions.push(self.release(index, now));
                }
                NodePhase::Releasing { .. } if slot.retry_release_at.is_some_and(|t| now >= t) => {
                    // A release that failed: ask again.
                    actions.push(self.release(index, now));
                }
                NodePhase::Draining {
                    deadline,
                    release: true,
                    ..
                } if !self.holds_work(index) || now >= deadline => {
                    actions.push(self.release(index, now));
                }
                _ => {}
            }
        }
        // 2. Scale-up for pending work.
        let (launches, used) = self.plan_launches(now);
        for index in launches {
            actions.push(self.launch(index, now));
        }
        // 3. Minimum sizes.
        for pool_index in 0..self.pools.len() {
            let pool = &self.pools[pool_index];
            if pool.provider == ProviderKind::None || pool.retry_at > now {
                continue;
            }
            let present = self
                .slots
                .iter()
                .filter(|s| s.pool_index == pool_index && s.phase != NodePhase::Absent)
                .count() as u32;
            let missing = pool.min_nodes.saturating_sub(present);
            let free: Vec<usize> = (0..self.slots.len())
                .filter(|&i| {
                    self.slots[i].pool_index == pool_index
                        && self.slots[i].phase == NodePhase::Absent
                })
                .take(missing as usize)
                .collect();
            for index in free {
                actions.push(self.launch(index, now));
            }
        }
        // 4. Scale-down: empty nodes first (highest index first, which suits
        //    StatefulSets), then consolidation, within the disruption budget.
        let budget = config.disruption_budget as usize;
        let mut idle: Vec<usize> = (0..self.slots.len())
            .filter(|&i| {
                let slot = &self.slots[i];
                slot.provider != ProviderKind::None
                    && matches!(slot.phase, NodePhase::Up { .. })
                    && !used.contains(&i)
                    && slot
                        .empty_since
                        .is_some_and(|e| now >= e.saturating_add(config.scale_down_after_s))
            })
            .collect();
        idle.reverse();
        for index in idle {
            if self.disrupting() >= budget {
                break;
            }
            let pool_index = self.slots[index].pool_index;
            let present = self
                .slots
                .iter()
                .filter(|s| s.pool_index == pool_index && s.phase != NodePhase::Absent)
                .count() as u32;
            if present <= self.pools[pool_index].min_nodes {
                continue;
            }
            self.slots[index].note = Some(format!(
                "empty for {} s",
                now.saturating_sub(self.slots[index].empty_since.unwrap_or(now))
            ));
            actions.push(self.release(index, now));
        }
        if self.disrupting() < budget {
            if let Some(index) = self.consolidation_candidate(now, &used) {
                let deadline = now + config.scale_down_after_s.max(60);
                let name = self.slots[index].name.clone();
                if let Ok(drained) = self.drain(
                    &name,
                    deadline,
                    "consolidation: its replicas fit on other nodes",
                    now,
                ) {
                    events.extend(drained);
                }
            }
        }
        (actions, events)
    }

    fn launch(&mut self, index: usize, now: u64) -> NodeAction {
        let slot = &mut self.slots[index];
        slot.phase = NodePhase::Launching { since: now };
        slot.note = None;
        NodeAction::Launch {
            node: slot.name.clone(),
            device: slot.device.clone().unwrap_or_default(),
            pool: slot.pool.clone(),
            profile: slot.profile.clone(),
            capacity_type: slot.capacity_type.clone(),
            provider: slot.provider,
        }
    }

    fn release(&mut self, index: usize, now: u64) -> NodeAction {
        // Whatever is still there runs elsewhere: the node is going.
        let held = self
            .cluster
            .reservations()
            .any(|(_, (_, b))| b.node == index);
        if held {
            let lost = self.requeue_node(index, "its node was released", now);
            self.later.extend(lost);
        }
        let slot = &mut self.slots[index];
        slot.phase = NodePhase::Releasing { since: now };
        slot.retry_release_at = None;
        slot.empty_since = None;
        slot.movable_since = None;
        // No new work: whatever is left runs elsewhere when the node is gone.
        self.cluster.set_available(index, false);
        NodeAction::Release {
            node: slot.name.clone(),
            device: slot.device.clone().unwrap_or_default(),
            pool: slot.pool.clone(),
            provider: slot.provider,
        }
    }

    /// Which absent slots to launch so that pending work fits, and which existing nodes
    /// that plan counts on (they must not be released meanwhile).
    fn plan_launches(&mut self, now: u64) -> (Vec<usize>, BTreeSet<usize>) {
        let mut launch = Vec::new();
        let mut used = BTreeSet::new();
        if !self
            .pools
            .iter()
            .any(|p| p.provider != ProviderKind::None && p.retry_at <= now)
        {
            return (launch, used);
        }
        // Pending jobs that wait for room (not for quota, preemption or a reservation),
        // highest priority first, then oldest.
        let mut pending: Vec<(u32, u64, u64)> = self
            .queue
            .jobs()
            .filter(|(_, state)| **state == JobState::Pending)
            .filter(|(job, _)| {
                !matches!(
                    self.queue.why_pending(job.id),
                    Some(WhyPending::OverQuota { .. })
                )
            })
            .map(|(job, _)| (job.priority, job.submit, job.id))
            .collect();
        if pending.is_empty() {
            return (launch, used);
        }
        pending.sort_by_key(|(priority, submit, id)| (std::cmp::Reverse(*priority), *submit, *id));
        let mut scratch: Cluster = self.cluster.clone();
        for (index, slot) in self.slots.iter().enumerate() {
            if matches!(slot.phase, NodePhase::Launching { .. }) {
                scratch.node_up(index);
            }
        }
        // Feasibility is all the plan needs: first fit, no fragmentation scoring.
        let policy = nephele_placement::Policy::FirstFit;
        let typical = nephele_placement::TypicalPods::default();
        let mut rng = Rng::new(0);
        let mut scratch_id: u64 = u64::MAX >> 1;
        for (_, _, id) in pending {
            let Some(job) = self.queue.job(id).cloned() else {
                continue;
            };
            let mut try_place = |scratch: &mut Cluster| -> Option<Vec<usize>> {
                scratch_id -= job.members.len() as u64 + 1;
                let gang = GangRequest {
                    first_id: scratch_id,
                    members: job.members.clone(),
                    topology: job.topology,
                };
                let priority = scratch.priority().to_vec();
                place_gang(scratch, &gang, policy, &typical, &priority, &mut rng)
                    .ok()
                    .map(|b| b.iter().map(|b| b.node).collect())
            };
            if let Some(nodes) = try_place(&mut scratch) {
                used.extend(nodes);
                continue;
            }
            // The cheapest pool with a provider whose node could ever hold a member.
            let mut candidates: Vec<usize> = (0..self.pools.len())
                .filter(|&p| {
                    let pool = &self.pools[p];
                    pool.provider != ProviderKind::None
                        && pool.retry_at <= now
                        && self.templates.check(p, &job.members[0]).is_ok()
                })
                .collect();
            candidates.sort_by(|a, b| {
                self.pools[*a]
                    .effective_price()
                    .total_cmp(&self.pools[*b].effective_price())
                    .then(a.cmp(b))
            });
            for pool_index in candidates {
                let absent: Vec<usize> = (0..self.slots.len())
                    .filter(|&i| {
                        self.slots[i].pool_index == pool_index
                            && self.slots[i].phase == NodePhase::Absent
                            && !launch.contains(&i)
                    })
                    .take(MAX_LAUNCH_PER_JOB)
                    .collect();
                let mut added = Vec::new();
                let mut placed = None;
                for index in absent {
                    scratch.node_up(index);
                    added.push(index);
                    if let Some(nodes) = try_place(&mut scratch) {
                        placed = Some(nodes);
                        break;
                    }
                }
                match placed {
                    Some(nodes) => {
                        // Only the new nodes the placement really uses are launched.
                        for index in &added {
                            if !nodes.contains(index) {
                                scratch.node_lost(*index);
                            } else {
                                launch.push(*index);
                            }
                        }
                        used.extend(nodes);
                        break;
                    }
                    None => {
                        for index in added {
                            scratch.node_lost(index);
                        }
                    }
                }
            }
        }
        (launch, used)
    }

    /// An up node of a provider pool that holds only serving replicas, all of which
    /// have fit on the other up nodes that hold work for `scale_down_after_s`: draining
    /// it lets the provider release it. Empty nodes are not counted as room (they are
    /// released themselves), and a pool is not drained below `min_nodes`.
    fn consolidation_candidate(&mut self, now: u64, used: &BTreeSet<usize>) -> Option<usize> {
        let after = self.settings.nodes.scale_down_after_s;
        let holding: BTreeSet<usize> = self
            .cluster
            .reservations()
            .map(|(_, (_, b))| b.node)
            .collect();
        let policy = nephele_placement::Policy::FirstFit;
        let typical = nephele_placement::TypicalPods::default();
        let mut rng = Rng::new(0);
        let mut found = None;
        for index in (0..self.slots.len()).rev() {
            let slot = &self.slots[index];
            let present = self
                .slots
                .iter()
                .filter(|s| s.pool_index == slot.pool_index && s.phase != NodePhase::Absent)
                .count() as u32;
            let eligible = slot.provider != ProviderKind::None
                && matches!(slot.phase, NodePhase::Up { .. })
                && slot.agent.is_some()
                && !used.contains(&index)
                && present > self.pools[slot.pool_index].min_nodes;
            let held: Vec<(u64, nephele_placement::PodRequest)> = self
                .cluster
                .reservations()
                .filter(|(_, (_, b))| b.node == index)
                .map(|(id, (pod, _))| (*id, pod.clone()))
                .collect();
            let only_replicas = !held.is_empty()
                && held.iter().all(|(id, _)| {
                    self.jobs
                        .get(&(id >> MEMBER_BITS))
                        .is_some_and(|m| matches!(m.kind, JobKind::Replica { .. }))
                });
            let movable = eligible && only_replicas && {
                let mut scratch = self.cluster.clone();
                for (id, _) in &held {
                    scratch.unreserve(*id);
                }
                scratch.set_available(index, false);
                for other in 0..self.slots.len() {
                    if !holding.contains(&other) {
                        scratch.set_available(other, false);
                    }
                }
                held.iter().enumerate().all(|(n, (_, pod))| {
                    let id = (u64::MAX >> 2) - n as u64;
                    let priority = scratch.priority().to_vec();
                    nephele_placement::place(&scratch, pod, policy, &typical, &priority, &mut rng)
                        .ok()
                        .is_some_and(|p| scratch.reserve(id, pod, &p.binding).is_ok())
                })
            };
            let slot = &mut self.slots[index];
            if movable {
                let since = *slot.movable_since.get_or_insert(now);
                if found.is_none() && now >= since.saturating_add(after) {
                    found = Some(index);
                }
            } else {
                slot.movable_since = None;
            }
        }
        found
    }

    /// Pools with a provider, and which.
    pub fn provider_pools(&self) -> Vec<(String, ProviderKind)> {
        self.pools
            .iter()
            .filter(|p| p.provider != ProviderKind::None)
            .map(|p| (p.name.clone(), p.provider))
            .collect()
    }

    /// The node slots and what is on them.
    /// Node slots by phase name (`up`, `draining`, …), without building views.
    pub fn node_phase_counts(&self) -> BTreeMap<&'static str, i64> {
        let mut counts: BTreeMap<&'static str, i64> = BTreeMap::new();
        for slot in &self.slots {
            *counts.entry(slot.phase.name()).or_default() += 1;
        }
        counts
    }

    pub fn nodes(&self) -> Vec<NodeView> {
        let mut jobs_on: BTreeMap<usize, Vec<String>> = BTreeMap::new();
        let mut replicas_on: BTreeMap<usize, Vec<String>> = BTreeMap::new();
        for (id, (_, binding)) in self.cluster.reservations() {
            let job = id >> MEMBER_BITS;
            let entry = jobs_on.entry(binding.node).or_default();
            let name = self.qualified(job);
            if !entry.contains(&name) {
                entry.push(name);
            }
            if let Some(JobKind::Replica { deployment }) = self.jobs.get(&job).map(|m| &m.kind) {
                replicas_on
                    .entry(binding.node)
                    .or_default()
                    .push(deployment.clone());
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
                    phase: slot.phase.name().into(),
                    provider: slot.provider.as_str().into(),
                    device: slot.device.clone(),
                    since_unix: slot.phase.since(),
                    note: slot.note.clone(),
                    replicas: replicas_on.remove(&index).unwrap_or_default(),
                    capacity_type: match spec.capacity_type {
                        nephele_placement::CapacityType::Spot => "spot",
                        nephele_placement::CapacityType::OnDemand => "on-demand",
                    }
                    .into(),
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

    /// Slots whose agent is `agent` now, or was before a restart (for restored books).
    pub(super) fn agent_for_node(&self, index: usize) -> Option<&str> {
        let slot = self.slots.get(index)?;
        slot.agent.as_deref().or(slot.last_agent.as_deref())
    }
}
