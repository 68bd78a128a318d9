//! Jobs that run: each placement of a job with a command is an attempt, whose members
//! run as processes on the pool agents of their nodes.
//!
//! The region does not send start or stop commands. It computes, for every pool agent,
//! the members it must be running ([`RegionScheduler::pool_work`]); the federation puts
//! that list in the agent's level-triggered desired state, and the agent starts what it
//! has never started (keyed by job, attempt and member) and stops (SIGTERM, SIGKILL
//! after the grace period) what is no longer listed. So a repeated or lost message does
//! no harm, and a member is never started twice for the same attempt.
//!
//! | job state (queue) | a member reports           | then                                         |
//! |-------------------|----------------------------|----------------------------------------------|
//! | running           | every member exited 0      | succeeded (resources freed)                  |
//! | running           | one exited ≠ 0, was killed, or could not start | the attempt failed: the others are stopped (terminating) |
//! | terminating       | every member ended         | failed attempt: retry after a backoff, or failed for good; else requeued at once (preempted, drained) |
//! | terminating       | grace period over          | the same, without waiting for the reports   |
//!
//! Exits while terminating never count as success or failure: a preempted job that
//! checkpoints and exits runs again from its checkpoint. `RANK`, `WORLD_SIZE`,
//! `LOCAL_RANK`, `MASTER_ADDR` and `MASTER_PORT` follow PyTorch's launcher (and JAX's
//! `jax.distributed.initialize` takes the same), `CUDA_VISIBLE_DEVICES` names the GPUs
//! of the member's binding (MIG slices by the UUIDs their node reported), and
//! `NEPHELE_CHECKPOINT_DIR` is the same for every attempt of a job.

use std::collections::{BTreeMap, BTreeSet};

use nephele_placement::queue::{JobState, MEMBER_BITS};
use nephele_placement::{Binding, JobId};
use nephele_proto::{JobLaunch, JobMemberStatus, MemberState};
use serde::{Deserialize, Serialize};

use super::books::StoredBinding;
use super::{AttemptView, Hold, JobKind, MemberView, RegionScheduler, SchedError, SchedEvent};

/// Attempts kept in a job's history.
const MAX_ATTEMPTS_KEPT: usize = 20;

/// Retries of a failed job unless its spec says otherwise.
pub const DEFAULT_MAX_RETRIES: u32 = 3;

/// Longest wait between a failure and the next attempt.
const MAX_BACKOFF_S: u64 = 3600;

/// How a job ended.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Outcome {
    Succeeded,
    Failed(String),
}

impl Outcome {
    pub fn state(&self) -> &'static str {
        match self {
            Outcome::Succeeded => "succeeded",
            Outcome::Failed(_) => "failed",
        }
    }
}

impl std::fmt::Display for Outcome {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Outcome::Succeeded => write!(f, "succeeded"),
            Outcome::Failed(why) => write!(f, "failed: {why}"),
        }
    }
}

/// A job's attempts and the processes of the current one.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct RunState {
    /// The current (or last) attempt; 0 before the first start.
    pub(super) attempt: u32,
    /// Failed attempts so far.
    pub(super) failures: u32,
    pub(super) members: Vec<MemberView>,
    /// `MASTER_PORT` of the current attempt.
    pub(super) port: Option<u16>,
    /// The current attempt failed (why); its other members are being stopped.
    pub(super) failing: Option<String>,
    pub(super) outcome: Option<Outcome>,
    pub(super) attempts: Vec<AttemptView>,
}

impl RunState {
    pub(super) fn member_views(&self) -> Vec<MemberView> {
        self.members.clone()
    }

    /// Ends the current attempt's record with `outcome` (unless it already has one).
    pub(super) fn end_attempt(&mut self, outcome: &str, now: u64) {
        if let Some(last) = self.attempts.last_mut() {
            if last.attempt == self.attempt && last.outcome.is_none() {
                last.outcome = Some(outcome.to_string());
                last.ended_unix = Some(now);
            }
        }
    }

    fn all_ended(&self) -> bool {
        !self.members.is_empty()
            && self
                .members
                .iter()
                .all(|m| matches!(m.state.as_str(), "exited" | "failed-to-start" | "lost"))
    }
}

/// What one pool agent must run: the deployments it holds replicas of, and the job
/// members.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PoolWork {
    pub deployments: BTreeSet<String>,
    pub jobs: Vec<JobLaunch>,
}

pub(super) fn has_command(spec: &super::JobSpec) -> bool {
    !spec.command.is_empty()
}

impl RegionScheduler {
    /// The queue placed a job: a new attempt of a job with a command, or a replica that
    /// starts loading its model.
    pub(super) fn on_bound(&mut self, id: JobId, bindings: &[Binding], now: u64) {
        // Only an attempt with processes takes a rendezvous port (finding one scans
        // every job).
        let runs = self
            .jobs
            .get(&id)
            .is_some_and(|m| m.kind == JobKind::Batch && has_command(&m.spec));
        let port = if runs { self.free_port() } else { None };
        let nodes: Vec<String> = bindings
            .iter()
            .map(|b| self.cluster.nodes[b.node].name.clone())
            .collect();
        let master = bindings.first().map(|b| self.address_of(b.node));
        let Some(meta) = self.jobs.get_mut(&id) else {
            return;
        };
        match meta.kind.clone() {
            JobKind::Replica { deployment } => {
                self.replica_placed(&deployment, id, now);
            }
            JobKind::Batch if has_command(&meta.spec) => {
                let run = &mut meta.run;
                run.attempt += 1;
                run.port = port;
                run.failing = None;
                run.members = nodes
                    .iter()
                    .enumerate()
                    .map(|(member, node)| MemberView {
                        member: member as u16,
                        node: node.clone(),
                        state: "launching".into(),
                        pid: None,
                        exit_code: None,
                        signal: None,
                        started_unix: None,
                        finished_unix: None,
                        error: None,
                    })
                    .collect();
                run.attempts.push(AttemptView {
                    attempt: run.attempt,
                    started_unix: now,
                    ended_unix: None,
                    nodes,
                    rendezvous: master
                        .zip(port)
                        .map(|(addr, port)| format!("{addr}:{port}")),
                    outcome: None,
                });
                if run.attempts.len() > MAX_ATTEMPTS_KEPT {
                    run.attempts.remove(0);
                }
            }
            JobKind::Batch => {}
        }
    }

    /// A running job was asked to stop (preempted or its node drained): its members
    /// leave the desired state, so their agents send SIGTERM.
    pub(super) fn on_stopping(&mut self, id: JobId, why: &str, now: u64) {
        let Some(meta) = self.jobs.get_mut(&id) else {
            return;
        };
        let run = &mut meta.run;
        run.end_attempt(why, now);
        for member in &mut run.members {
            if matches!(member.state.as_str(), "launching" | "running") {
                member.state = "stopping".into();
            }
        }
    }

    /// The queue requeued a terminating job whose grace period is over.
    pub(super) fn on_requeued(&mut self, id: JobId, now: u64) -> Vec<SchedEvent> {
        self.waits_again(id, "preempted", now)
    }

    /// A job lost its resources because its node went away.
    pub(super) fn on_lost(&mut self, id: JobId, why: &str, now: u64) -> Vec<SchedEvent> {
        self.waits_again(id, why, now)
    }

    /// The job lost its resources and is pending again, its attempt over (`why`); or,
    /// when that attempt had failed, it goes to backoff or fails for good.
    fn waits_again(&mut self, id: JobId, why: &str, now: u64) -> Vec<SchedEvent> {
        let failing = self
            .jobs
            .get(&id)
            .is_some_and(|meta| meta.run.failing.is_some());
        if failing {
            return self.handle_failure(id, now);
        }
        if let Some(meta) = self.jobs.get_mut(&id) {
            meta.requeues += 1;
            meta.started_unix = None;
            meta.preempted_by = None;
            meta.run.end_attempt(why, now);
            for member in &mut meta.run.members {
                if !matches!(member.state.as_str(), "exited" | "failed-to-start") {
                    member.state = "lost".into();
                }
            }
            meta.run.port = None;
        }
        self.replica_unplaced(id);
        vec![SchedEvent::Requeued {
            job: self.qualified(id),
        }]
    }

    /// The attempt failed and its members have stopped: the job leaves the queue and
    /// runs again after a backoff, or fails for good once its retries are used up.
    fn handle_failure(&mut self, id: JobId, now: u64) -> Vec<SchedEvent> {
        let job = self.queue.job(id).cloned();
        self.queue.remove(&mut self.cluster, id);
        let qualified = self.qualified(id);
        let backoff = self.settings.retry_backoff_s;
        let Some(meta) = self.jobs.get_mut(&id) else {
            return Vec::new();
        };
        let reason = meta
            .run
            .failing
            .take()
            .unwrap_or_else(|| "failed".to_string());
        meta.run.failures += 1;
        meta.run.port = None;
        meta.started_unix = None;
        let attempt = meta.run.attempt;
        let max_retries = meta.spec.max_retries.unwrap_or(DEFAULT_MAX_RETRIES);
        let retry_in_s = (meta.run.failures <= max_retries).then(|| {
            backoff
                .saturating_mul(1u64 << (meta.run.failures - 1).min(20))
                .min(MAX_BACKOFF_S)
        });
        match (retry_in_s, job) {
            (Some(wait), Some(job)) => {
                meta.held = Some((job, Hold::Backoff { until: now + wait }));
                self.holding.insert(id);
            }
            _ => {
                meta.run.outcome = Some(super::run::Outcome::Failed(format!(
                    "{reason} (attempt {attempt}; {} retries used)",
                    meta.run.failures.saturating_sub(1)
                )));
            }
        }
        vec![SchedEvent::Failed {
            job: qualified,
            attempt,
            reason,
            retry_in_s,
        }]
    }

    /// What the pool agent `agent` reports of its job members (every heartbeat, and in
    /// its `Hello` after a restart). Reports of other attempts than the current one are
    /// stale and ignored.
    pub fn member_reports(
        &mut self,
        agent: &str,
        reports: &[JobMemberStatus],
        now: u64,
    ) -> Vec<SchedEvent> {
        let mut touched: BTreeSet<JobId> = BTreeSet::new();
        for report in reports {
            let mut parts = report.job.splitn(3, '/');
            let (Some(tenant), Some(name), Some(uid)) = (parts.next(), parts.next(), parts.next())
            else {
                continue;
            };
            let Some(tenant_index) = self.tenant_position(tenant) else {
                continue;
            };
            let Some(&id) = self.by_name.get(&(tenant_index, name.to_string())) else {
                continue;
            };
            let Some(meta) = self.jobs.get_mut(&id) else {
                continue;
            };
            // Another submission under the same name, or another attempt: stale.
            if uid.parse::<u64>().ok() != Some(meta.uid) || report.attempt != meta.run.attempt {
                continue;
            }
            let Some(member) = meta.run.members.get_mut(usize::from(report.member)) else {
                continue;
            };
            let before = member.clone();
            match &report.state {
                MemberState::Running { pid, started_unix } => {
                    member.state = if member.state == "stopping" {
                        "stopping".into()
                    } else {
                        "running".into()
                    };
                    member.pid = Some(*pid);
                    member.started_unix = Some(*started_unix);
                }
                MemberState::Stopping { pid } => {
                    member.state = "stopping".into();
                    member.pid = Some(*pid);
                }
                MemberState::Exited {
                    code,
                    signal,
                    finished_unix,
                } => {
                    member.state = "exited".into();
                    member.exit_code = *code;
                    member.signal = *signal;
                    member.finished_unix = Some(*finished_unix);
                }
                MemberState::FailedToStart(error) => {
                    member.state = "failed-to-start".into();
                    member.error = Some(error.clone());
                    member.finished_unix = Some(now);
                }
            }
            if *member != before {
                touched.insert(id);
            }
            let _ = agent;
        }
        self.touched.extend(touched.iter().copied());
        let mut events = Vec::new();
        for id in touched {
            events.extend(self.settle(id, now));
        }
        // What the members' states decided may reach beyond these jobs.
        self.touched_all |= !events.is_empty();
        events
    }

    /// Decides what the members' states mean for the job (see the module table).
    fn settle(&mut self, id: JobId, now: u64) -> Vec<SchedEvent> {
        let grace = self.settings.grace_s;
        let Some(meta) = self.jobs.get_mut(&id) else {
            return Vec::new();
        };
        match self.queue.state(id) {
            Some(JobState::Running { .. }) => {
                let failure = meta
                    .run
                    .members
                    .iter()
                    .find_map(|m| match m.state.as_str() {
                        "failed-to-start" => Some(format!(
                            "member {} could not start: {}",
                            m.member,
                            m.error.as_deref().unwrap_or("?")
                        )),
                        "exited" => match (m.exit_code, m.signal) {
                            (Some(0), _) => None,
                            (Some(code), _) => {
                                Some(format!("member {} exited with code {code}", m.member))
                            }
                            (None, Some(signal)) => {
                                Some(format!("member {} was killed by signal {signal}", m.member))
                            }
                            (None, None) => Some(format!("member {} ended", m.member)),
                        },
                        _ => None,
                    });
                if let Some(reason) = failure {
                    meta.run.failing = Some(reason.clone());
                    meta.run.end_attempt(&format!("failed: {reason}"), now);
                    for member in &mut meta.run.members {
                        if matches!(member.state.as_str(), "launching" | "running") {
                            member.state = "stopping".into();
                        }
                    }
                    let all_ended = meta.run.all_ended();
                    self.queue.evict(id, now, grace);
                    if all_ended && self.queue.stopped(&mut self.cluster, id, now) {
                        return self.handle_failure(id, now);
                    }
                    return Vec::new();
                }
                let succeeded = meta.run.all_ended()
                    && meta
                        .run
                        .members
                        .iter()
                        .all(|m| m.state == "exited" && m.exit_code == Some(0));
                if succeeded {
                    meta.run.outcome = Some(Outcome::Succeeded);
                    meta.run.end_attempt("succeeded", now);
                    meta.run.port = None;
                    let attempt = meta.run.attempt;
                    self.queue.finish(&mut self.cluster, id, now);
                    return vec![SchedEvent::Succeeded {
                        job: self.qualified(id),
                        attempt,
                    }];
                }
                Vec::new()
            }
            Some(JobState::Terminating { .. }) if meta.run.all_ended() => {
                if !self.queue.stopped(&mut self.cluster, id, now) {
                    return Vec::new();
                }
                self.waits_again(id, "stopped", now)
            }
            _ => Vec::new(),
        }
    }

    /// Held jobs whose wait is over: failed jobs whose backoff has passed join the
    /// queue again; restored jobs whose nodes did not come back in time run again
    /// elsewhere.
    pub(super) fn release_holds(&mut self, now: u64) -> Vec<SchedEvent> {
        let due: Vec<JobId> = self
            .held_jobs()
            .filter(|(_, m)| match &m.held {
                Some((_, Hold::Backoff { until })) => *until <= now,
                Some((_, Hold::Recovering { until, .. })) => *until <= now,
                _ => false,
            })
            .map(|(id, _)| id)
            .collect();
        let mut events = Vec::new();
        for id in due {
            events.extend(self.requeue_held(
                id,
                "its nodes did not come back after a restart",
                now,
            ));
        }
        events
    }

    /// Jobs restored from the books as running on node `index`, not adopted yet.
    pub(super) fn recovering_on(&self, index: usize) -> Vec<JobId> {
        let Some(name) = self.slots.get(index).map(|s| s.name.as_str()) else {
            return Vec::new();
        };
        self.held_jobs()
            .filter(|(_, m)| match &m.held {
                Some((_, Hold::Recovering { bindings, .. })) => {
                    bindings.iter().any(|b| b.node == name)
                }
                _ => false,
            })
            .map(|(id, _)| id)
            .collect()
    }

    /// The node slots that jobs restored as running (not adopted yet) were bound to.
    pub(super) fn nodes_recovering(&self) -> BTreeSet<usize> {
        let mut nodes = BTreeSet::new();
        for (_, meta) in self.held_jobs() {
            if let Some((_, Hold::Recovering { bindings, .. })) = &meta.held {
                nodes.extend(bindings.iter().filter_map(|b| self.slot_named(&b.node)));
            }
        }
        nodes
    }

    /// Whether node `index` holds work: members placed there, or jobs restored as
    /// running there (their processes may still run) that are not adopted yet.
    pub(super) fn holds_work(&self, index: usize) -> bool {
        self.cluster
            .reservations()
            .any(|(_, (_, binding))| binding.node == index)
            || !self.recovering_on(index).is_empty()
    }

    /// A held job joins the queue again now; one restored as running starts a new
    /// attempt (`why` says why its last one ended).
    pub(super) fn requeue_held(&mut self, id: JobId, why: &str, now: u64) -> Vec<SchedEvent> {
        let mut events = Vec::new();
        let Some(meta) = self.jobs.get_mut(&id) else {
            return events;
        };
        let Some((mut job, hold)) = meta.held.take() else {
            return events;
        };
        if matches!(hold, Hold::Recovering { .. }) {
            meta.run.end_attempt(why, now);
            meta.run.members.clear();
            meta.run.port = None;
            meta.requeues += 1;
            meta.started_unix = None;
            events.push(SchedEvent::Requeued {
                job: format!("{}/{}", self.tenants[meta.tenant], meta.name),
            });
        }
        job.submit = now;
        if self.queue.submit(job.clone()).is_err() {
            // Cannot happen (the id left the queue); keep it held rather than lose it.
            if let Some(meta) = self.jobs.get_mut(&id) {
                meta.held = Some((job, hold));
                self.holding.insert(id);
            }
        }
        events
    }

    /// A port in the rendezvous range that no running attempt uses.
    fn free_port(&self) -> Option<u16> {
        let used: BTreeSet<u16> = self.jobs.values().filter_map(|m| m.run.port).collect();
        let [first, last] = self.settings.rendezvous_ports;
        (first..=last).find(|p| !used.contains(p))
    }

    /// Where other gang members reach node `index`.
    pub(super) fn address_of(&self, index: usize) -> String {
        self.slots
            .get(index)
            .map(|s| s.address.clone())
            .filter(|a| !a.is_empty())
            .unwrap_or_else(|| "127.0.0.1".into())
    }

    /// What every pool agent must run now. Jobs restored from the books and waiting for
    /// their nodes keep their members listed for those nodes' agents, so an agent that
    /// reconnects after a control-plane restart keeps running them.
    pub fn pool_work(&self) -> BTreeMap<String, PoolWork> {
        let mut work: BTreeMap<String, PoolWork> = BTreeMap::new();
        for slot in &self.slots {
            if let Some(agent) = &slot.agent {
                work.entry(agent.clone()).or_default();
            }
        }
        for (id, meta) in self
            .with_processes
            .iter()
            .filter_map(|id| self.jobs.get_key_value(id))
        {
            // Jobs without processes have nothing for an agent to run.
            let wants_work = match &meta.kind {
                JobKind::Replica { .. } => true,
                JobKind::Batch => has_command(&meta.spec) && meta.run.failing.is_none(),
            };
            if !wants_work {
                continue;
            }
            let bindings: Vec<Binding> = match (&meta.held, self.queue.state(*id)) {
                (Some((_, Hold::Recovering { bindings, .. })), _) => match self.resolve(bindings) {
                    Some(resolved) => resolved,
                    None => continue,
                },
                (None, Some(JobState::Running { bindings, .. })) => bindings.clone(),
                _ => continue,
            };
            match &meta.kind {
                JobKind::Replica { deployment } => {
                    for binding in &bindings {
                        if let Some(agent) = self.agent_for_node(binding.node) {
                            work.entry(agent.to_string())
                                .or_default()
                                .deployments
                                .insert(deployment.clone());
                        }
                    }
                }
                JobKind::Batch if has_command(&meta.spec) && meta.run.failing.is_none() => {
                    for (member, launch) in self.launches(*id, &bindings).into_iter().enumerate() {
                        if let Some(agent) = bindings
                            .get(member)
                            .and_then(|b| self.agent_for_node(b.node))
                        {
                            work.entry(agent.to_string()).or_default().jobs.push(launch);
                        }
                    }
                }
                JobKind::Batch => {}
            }
        }
        work
    }

    /// Stored bindings (node names) as cluster bindings.
    pub(super) fn resolve(&self, stored: &[StoredBinding]) -> Option<Vec<Binding>> {
        stored
            .iter()
            .map(|b| {
                Some(Binding {
                    node: self.slot_named(&b.node)?,
                    gpus: b.gpus.clone(),
                    mig: b.mig,
                })
            })
            .collect()
    }

    /// The launches of a job's current attempt, one per member, in member order.
    fn launches(&self, id: JobId, bindings: &[Binding]) -> Vec<JobLaunch> {
        let Some(meta) = self.jobs.get(&id) else {
            return Vec::new();
        };
        let tenant = &self.tenants[meta.tenant];
        let key = format!("{tenant}/{}/{}", meta.name, meta.uid);
        let world = bindings.len();
        let master = bindings
            .first()
            .map(|b| self.address_of(b.node))
            .unwrap_or_default();
        let checkpoint = format!(
            "{}/{}/{}/{}",
            self.settings.checkpoint_root.trim_end_matches('/'),
            self.region,
            tenant,
            meta.name
        );
        let mut argv = meta.spec.command.clone();
        argv.extend(meta.spec.args.iter().cloned());
        bindings
            .iter()
            .enumerate()
            .map(|(member, binding)| {
                let local_rank = bindings[..member]
                    .iter()
                    .filter(|b| b.node == binding.node)
                    .count();
                let local_world = bindings.iter().filter(|b| b.node == binding.node).count();
                let mut env: Vec<(String, String)> = meta
                    .spec
                    .env
                    .iter()
                    .map(|(k, v)| (k.clone(), v.clone()))
                    .collect();
                let ours = [
                    ("RANK", member.to_string()),
                    ("WORLD_SIZE", world.to_string()),
                    ("LOCAL_RANK", local_rank.to_string()),
                    ("LOCAL_WORLD_SIZE", local_world.to_string()),
                    ("MASTER_ADDR", master.clone()),
                    (
                        "MASTER_PORT",
                        meta.run.port.map(|p| p.to_string()).unwrap_or_default(),
                    ),
                    (
                        "CUDA_VISIBLE_DEVICES",
                        self.visible_devices(id, member, binding),
                    ),
                    ("NEPHELE_CHECKPOINT_DIR", checkpoint.clone()),
                    ("NEPHELE_JOB", format!("{tenant}/{}", meta.name)),
                    ("NEPHELE_JOB_ATTEMPT", meta.run.attempt.to_string()),
                    ("NEPHELE_JOB_MEMBER", member.to_string()),
                    ("NEPHELE_REGION", self.region.clone()),
                    (
                        "NEPHELE_NODE",
                        self.cluster.nodes[binding.node].name.clone(),
                    ),
                ];
                // Ours win over the user's: a job cannot lie to itself about its rank.
                env.retain(|(k, _)| !ours.iter().any(|(o, _)| o == k));
                env.extend(ours.into_iter().map(|(k, v)| (k.to_string(), v)));
                JobLaunch {
                    job: key.clone(),
                    attempt: meta.run.attempt,
                    member: member as u16,
                    argv: argv.clone(),
                    env,
                    working_dir: meta.spec.working_dir.clone().unwrap_or_default(),
                    grace_ms: self.settings.grace_s.saturating_mul(1000),
                }
            })
            .collect()
    }

    /// `CUDA_VISIBLE_DEVICES` for a member: its GPUs' indices, or its MIG slice's UUID
    /// as the node reported it (the k-th slice of that profile on that GPU for the k-th
    /// reservation holding one, in reservation order); empty for CPU-only members, which
    /// hides every GPU from them.
    fn visible_devices(&self, id: JobId, member: usize, binding: &Binding) -> String {
        let spec = &self.cluster.nodes[binding.node];
        if let Some(partition) = binding.mig.and_then(|p| spec.mig.get(usize::from(p))) {
            let profile = partition.profile.to_string();
            let reported: Vec<&str> = self
                .slots
                .get(binding.node)
                .and_then(|s| s.gpus.iter().find(|g| g.index == u32::from(partition.gpu)))
                .map(|g| {
                    g.mig
                        .iter()
                        .filter(|m| m.profile == profile)
                        .map(|m| m.uuid.as_str())
                        .collect()
                })
                .unwrap_or_default();
            let me = (id << MEMBER_BITS) | member as u64;
            let rank = self
                .cluster
                .reservations()
                .filter(|(_, (_, b))| b.node == binding.node && b.mig == binding.mig)
                .filter(|(rid, _)| **rid < me)
                .count();
            return reported
                .get(rank)
                .map(|u| u.to_string())
                .unwrap_or_else(|| partition.gpu.to_string());
        }
        binding
            .gpus
            .iter()
            .map(|(gpu, _)| gpu.to_string())
            .collect::<Vec<_>>()
            .join(",")
    }

    /// Where a member's log is: the agent of its node in that attempt, the job's wire
    /// key, the attempt and the member.
    pub fn log_target(
        &self,
        tenant: &str,
        name: &str,
        member: u16,
        attempt: Option<u32>,
    ) -> Result<(String, String, u32, u16), SchedError> {
        let id = self.lookup(tenant, name)?;
        let meta = self
            .jobs
            .get(&id)
            .ok_or_else(|| SchedError::NotFound(format!("no job {name:?}")))?;
        if !has_command(&meta.spec) {
            return Err(SchedError::BadRequest(format!(
                "job {tenant}/{name} has no command, so no log"
            )));
        }
        let attempt = attempt.unwrap_or(meta.run.attempt);
        let record = meta
            .run
            .attempts
            .iter()
            .find(|a| a.attempt == attempt)
            .ok_or_else(|| {
                SchedError::NotFound(if meta.run.attempt == 0 {
                    format!("job {tenant}/{name} has not started yet")
                } else {
                    format!(
                        "job {tenant}/{name} has no attempt {attempt} (attempts: 1..={})",
                        meta.run.attempt
                    )
                })
            })?;
        let node = record.nodes.get(usize::from(member)).ok_or_else(|| {
            SchedError::BadRequest(format!(
                "job {tenant}/{name} has members 0..{}",
                record.nodes.len()
            ))
        })?;
        let agent = self
            .slot_named(node)
            .and_then(|i| self.agent_for_node(i))
            .ok_or_else(|| {
                SchedError::NotFound(format!(
                    "node {node} of attempt {attempt} is gone, and its logs with it"
                ))
            })?;
        Ok((
            agent.to_string(),
            format!("{tenant}/{name}/{}", meta.uid),
            attempt,
            member,
        ))
    }
}
