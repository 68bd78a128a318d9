//! One actor per configured region: the IO shell around the region's pure cores. It
//! holds the pool agents' connections, routes each offloaded request to a ready replica
//! of its deployment through the serving state of [`crate::serving`] (least
//! outstanding requests, ties by name; admission control; what the autoscaler is told,
//! all by the rules `nephele sim autoscale` replays), ticks the job scheduler
//! ([`crate::scheduler::RegionScheduler`]) and the autoscaler of every deployment
//! (`nephele-autoscale`), carries out what they decide
//! (providers start and stop nodes; pool agents are told what to run through the
//! federation's desired state), and keeps the region's books in the store.
//!
//! Order of every change: the scheduler decides; the books are written (one redb
//! transaction) before anything leaves the actor; then each pool agent whose work
//! changed gets it through the federation, and providers are called. So an attempt
//! that an agent may start is always on disk first, and a restarted control plane
//! never starts it twice.
//!
//! Timers: the scheduler every `scheduler.tick_ms`; the autoscalers and the node
//! planner every `autoscale.tick_ms`.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use actix::prelude::*;
use nephele_autoscale::OursConfig;
use nephele_placement::grid::GridPoint;
use nephele_proto::{DeploymentTelemetry, GpuReport, JobMemberStatus};

use crate::config::AutoscaleConfig;
use crate::notes::{CreateJoinToken, DeleteDevice, SetPoolWork};
use crate::provider::{LaunchRequest, Providers, ReleaseRequest};
use crate::scheduler::{
    GridPushView, GridView, JobOffer, JobSpec, JobView, NodeAction, NodeView, PoolWork,
    RegionChoiceView, RegionScheduler, ReplicaSetView, ReplicaSpec, SchedError, SchedEvent,
};
use crate::serving::{Choice, Fleet, Serving, ServingStats};
use crate::store::{Store, Table};

struct PoolMember {
    session_id: u64,
    connection: quinn::Connection,
}

/// Settings of a region actor from the control plane's config.
#[derive(Debug, Clone)]
pub struct RegionSettings {
    pub tick: Duration,
    pub autoscale: AutoscaleConfig,
    pub policy: OursConfig,
    /// The QUIC address provider-launched agents connect to.
    pub server: String,
}

pub struct RegionActor {
    name: String,
    scheduler: RegionScheduler,
    settings: RegionSettings,
    metrics: Option<nephele_telemetry::Registry>,
    store: Option<Store>,
    /// Where changes to its jobs and nodes are published for watches.
    watch: Option<crate::watch::Hub>,
    /// What was last written per table (jobs, nodes, region) and key: a hash of its
    /// bytes.
    written: [HashMap<String, u64>; 3],
    federation: Option<FederationRecipients>,
    /// What each pool agent was last told to run.
    work_sent: BTreeMap<String, PoolWork>,
    /// The last write of the books was refused: the next writes every record.
    books_behind: bool,
    agents: BTreeMap<String, PoolMember>,
    serving: BTreeMap<String, Serving>,
    /// The autoscalers' state restored from the books, taken when their deployment
    /// appears.
    restored_policies: BTreeMap<String, serde_json::Value>,
    providers: Providers,
    /// When the ledger's hours were last written (unix s).
    ledger_written: u64,
    /// Submissions admitted but not yet placed and written: the group commit
    /// ([`SUBMIT_BATCH_WAIT`]) answers them together after one queue pass and one write.
    submitted: Vec<(nephele_placement::JobId, SubmitReply)>,
    /// When the job and node gauges were last counted.
    gauges_at: Option<std::time::Instant>,
    /// Timer ticks since every record was last written.
    ticks_since_full: u32,
}

/// Up to this many jobs the gauges are counted on every change; above, at most every
/// [`GAUGES_EVERY`].
const GAUGES_EXACT_JOBS: usize = 2_000;
const GAUGES_EVERY: Duration = Duration::from_millis(250);
/// Every this many timer ticks, the timer writes every record (else the records the
/// scheduler knows changed): a safety net for a change made outside the paths that
/// track what they touch, written by the next full write at the latest.
const FULL_WRITE_TICKS: u32 = 10;

type SubmitReply = tokio::sync::oneshot::Sender<Result<JobView, SchedError>>;

/// How long the first of a batch of submissions waits for others before the batch is
/// placed (one queue pass), written (one transaction per table) and answered. Writing
/// each job alone costs one durable commit each, which bounded a region at a few
/// hundred jobs a second; this bounds it by the placement core instead, for 1 ms more
/// latency on a lone submission.
const SUBMIT_BATCH_WAIT: Duration = Duration::from_millis(1);

/// What [`RegionActor::persist`] writes: every record, or the records of the named jobs
/// and the nodes and region record (what a batch of submissions changes).
enum Written {
    All,
    Jobs(Vec<nephele_placement::JobId>),
}

/// The ledger's hours are written at least this often while nothing else changes (at
/// every change of the books too); a crash loses none of it, since the restarted
/// region charges what it restored as running from the last written mark.
const LEDGER_WRITE_S: u64 = 30;

fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

fn unix_now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

fn hash(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3)
    })
}

impl RegionActor {
    pub fn new(scheduler: RegionScheduler, settings: RegionSettings, providers: Providers) -> Self {
        RegionActor {
            name: scheduler.region().to_string(),
            scheduler,
            settings,
            metrics: None,
            store: None,
            watch: None,
            written: Default::default(),
            federation: None,
            work_sent: BTreeMap::new(),
            books_behind: false,
            agents: BTreeMap::new(),
            serving: BTreeMap::new(),
            restored_policies: BTreeMap::new(),
            providers,
            ledger_written: 0,
            submitted: Vec::new(),
            gauges_at: None,
            ticks_since_full: 0,
        }
    }

    /// Publishes changes to its jobs and nodes to `hub` (`GET /v1/watch`).
    pub fn with_watch(mut self, hub: crate::watch::Hub) -> Self {
        self.watch = Some(hub);
        self
    }

    /// Publishes a job or node record's change (`key` as the books have it).
    fn publish(&self, kind: u8, key: &str, action: &'static str) {
        let Some(hub) = &self.watch else { return };
        let Some(rest) = key.strip_prefix(&format!("{}/", self.name)) else {
            return;
        };
        match kind {
            0 => {
                if let Some((tenant, job)) = rest.split_once('/') {
                    // Serving replicas are the deployments' (their own events), not jobs.
                    if tenant != crate::scheduler::SERVING_TENANT {
                        hub.publish(
                            crate::watch::Kind::Job,
                            job,
                            action,
                            Some(tenant),
                            Some(&self.name),
                        );
                    }
                }
            }
            1 => {
                hub.publish(
                    crate::watch::Kind::Node,
                    rest,
                    action,
                    None,
                    Some(&self.name),
                );
            }
            _ => {}
        }
    }

    pub fn with_metrics(mut self, metrics: nephele_telemetry::Registry) -> Self {
        self.metrics = Some(metrics);
        self
    }

    /// Keeps the region's books in `store`; `written` is what is already there (the
    /// restored records), so unchanged records are not written again.
    pub fn with_store(mut self, store: Store) -> Self {
        self.store = Some(store);
        self.remember_written();
        self
    }

    /// The autoscalers' state from the books.
    pub fn with_policies(mut self, policies: BTreeMap<String, serde_json::Value>) -> Self {
        self.restored_policies = policies;
        self
    }

    /// What the federation is told at start-up about every pool agent's work, so an
    /// agent that reconnects first thing keeps its jobs.
    pub fn initial_work(&mut self) -> BTreeMap<String, PoolWork> {
        self.work_sent = self.scheduler.pool_work();
        self.work_sent.clone()
    }

    fn records(&self, which: &Written) -> Vec<(u8, Table, String, Vec<u8>)> {
        let mut out = Vec::new();
        let region = &self.name;
        let jobs = match which {
            Written::All => self.scheduler.job_records(),
            Written::Jobs(ids) => self.scheduler.job_records_of(ids),
        };
        for (key, record) in jobs {
            if let Ok(bytes) = serde_json::to_vec(&record) {
                out.push((0, Table::RegionJobs, format!("{region}/{key}"), bytes));
            }
        }
        for (key, record) in self.scheduler.node_records() {
            if let Ok(bytes) = serde_json::to_vec(&record) {
                out.push((1, Table::RegionNodes, format!("{region}/{key}"), bytes));
            }
        }
        let mut state = self.scheduler.region_record();
        for (deployment, serving) in &self.serving {
            if let Ok(value) = serde_json::to_value(&serving.core.policy) {
                state.autoscalers.insert(deployment.clone(), value);
            }
        }
        if let Ok(bytes) = serde_json::to_vec(&state) {
            out.push((2, Table::RegionState, region.clone(), bytes));
        }
        out
    }

    fn remember_written(&mut self) {
        let records = self.records(&Written::All);
        self.written = Default::default();
        for (kind, _, key, bytes) in records {
            self.written[usize::from(kind)].insert(key, hash(&bytes));
        }
    }

    /// Writes the records that changed since the last write, and deletes the ones
    /// that are gone, in one transaction; false when the store refused them (nothing
    /// that describes them may then leave the actor: the next write is of every record).
    fn persist(&mut self, which: Written) -> bool {
        // After a refused write, the records a batch would leave out may be the ones
        // that were lost: the next write is of every record.
        let which = if std::mem::take(&mut self.books_behind) {
            Written::All
        } else {
            which
        };
        let Some(store) = self.store.clone() else {
            return true;
        };
        const TABLES: [Table; 3] = [Table::RegionJobs, Table::RegionNodes, Table::RegionState];
        let records = self.records(&which);
        let all_jobs = matches!(which, Written::All);
        let mut seen: [std::collections::HashSet<String>; 3] = Default::default();
        let mut ops: Vec<(Table, String, Option<Vec<u8>>)> = Vec::new();
        // (kind, key, put) of each op, for the watch once written.
        let mut changes: Vec<(u8, String, bool)> = Vec::new();
        for (kind, table, key, bytes) in records {
            let digest = hash(&bytes);
            let written = &mut self.written[usize::from(kind)];
            if written.get(&key) != Some(&digest) {
                written.insert(key.clone(), digest);
                changes.push((kind, key.clone(), true));
                ops.push((table, key.clone(), Some(bytes)));
            }
            seen[usize::from(kind)].insert(key);
        }
        // Only a full write sees every job; a batch's write deletes no job.
        for kind in if all_jobs { 0..3 } else { 1..3 } {
            let gone: Vec<String> = self.written[kind]
                .keys()
                .filter(|k| !seen[kind].contains(*k))
                .cloned()
                .collect();
            for key in gone {
                self.written[kind].remove(&key);
                changes.push((kind as u8, key.clone(), false));
                ops.push((TABLES[kind], key, None));
            }
        }
        if let Err(error) = store.write_batch(&ops) {
            tracing::error!(region = %self.name, %error, "cannot write the region's books; the pool agents are not told of the change until they are written");
            // Forget what we believe is written, so the next commit writes it all again.
            self.written = Default::default();
            self.books_behind = true;
            return false;
        }
        for (kind, key, put) in changes {
            self.publish(kind, &key, if put { "put" } else { "delete" });
        }
        true
    }

    /// After any change: books first, then the agents' work; nothing is sent (and no
    /// submission answered) while the books could not be written. Whether they were.
    fn commit(&mut self, which: Written) -> bool {
        if !self.persist(which) {
            return false;
        }
        let Some(federation) = self.federation.clone() else {
            return true;
        };
        let work = self.scheduler.pool_work();
        for (agent, wanted) in &work {
            if self.work_sent.get(agent) != Some(wanted) {
                federation.pool_work.do_send(SetPoolWork {
                    agent: agent.clone(),
                    work: wanted.clone(),
                });
            }
        }
        for agent in self.work_sent.keys() {
            if !work.contains_key(agent) {
                federation.pool_work.do_send(SetPoolWork {
                    agent: agent.clone(),
                    work: PoolWork::default(),
                });
            }
        }
        self.work_sent = work;
        true
    }

    /// Logs what the scheduler did and updates the job gauges.
    fn report(&mut self, events: Vec<SchedEvent>) {
        for event in &events {
            match event {
                SchedEvent::Placed { job, nodes } => {
                    tracing::info!(region = %self.name, %job, nodes = ?nodes, "placed")
                }
                SchedEvent::Preempting {
                    job,
                    by,
                    grace_seconds,
                } => {
                    tracing::info!(region = %self.name, %job, by = %by, grace_seconds, "stopping: checkpoint, then stop")
                }
                SchedEvent::Requeued { job } => {
                    tracing::info!(region = %self.name, %job, "lost its resources and waits again")
                }
                SchedEvent::Deferred { job, reason } => {
                    tracing::info!(region = %self.name, %job, %reason, "deferrable job held")
                }
                SchedEvent::Released { job, reason } => {
                    tracing::info!(region = %self.name, %job, %reason, "deferrable job queued")
                }
                SchedEvent::Succeeded { job, attempt } => {
                    tracing::info!(region = %self.name, %job, attempt, "job succeeded")
                }
                SchedEvent::Failed {
                    job,
                    attempt,
                    reason,
                    retry_in_s,
                } => {
                    tracing::warn!(region = %self.name, %job, attempt, %reason, retry_in_s = ?retry_in_s, "job attempt failed")
                }
                SchedEvent::Node { node, what } => {
                    tracing::info!(region = %self.name, %node, %what, "node")
                }
                SchedEvent::Replica { replica, what } => {
                    tracing::info!(region = %self.name, %replica, %what, "replica")
                }
            }
        }
        if let Some(metrics) = &self.metrics {
            for event in &events {
                let kind = match event {
                    SchedEvent::Placed { .. } => "placed",
                    SchedEvent::Preempting { .. } => "preempted",
                    SchedEvent::Requeued { .. } => "requeued",
                    SchedEvent::Deferred { .. } => "deferred",
                    SchedEvent::Released { .. } => "released",
                    SchedEvent::Succeeded { .. } => "succeeded",
                    SchedEvent::Failed { .. } => "failed",
                    SchedEvent::Node { .. } => "node",
                    SchedEvent::Replica { .. } => "replica",
                };
                metrics
                    .counter(
                        "nephele_scheduler_events_total",
                        "Scheduler decisions by region and kind.",
                        &[("region", &self.name), ("kind", kind)],
                    )
                    .inc();
            }
            // Counting takes a pass over every job: with many, at most every
            // GAUGES_EVERY (a batch of submissions is placed every few ms).
            let many = self.scheduler.job_count() > GAUGES_EXACT_JOBS;
            if many && self.gauges_at.is_some_and(|at| at.elapsed() < GAUGES_EVERY) {
                return;
            }
            self.gauges_at = Some(std::time::Instant::now());
            let mut by_state: BTreeMap<&str, i64> = [
                ("deferred", 0),
                ("pending", 0),
                ("running", 0),
                ("terminating", 0),
                ("backoff", 0),
                ("recovering", 0),
                ("succeeded", 0),
                ("failed", 0),
            ]
            .into();
            for (state, n) in self.scheduler.job_state_counts() {
                *by_state.entry(state).or_default() += n;
            }
            for (state, n) in by_state {
                metrics
                    .gauge(
                        "nephele_scheduler_jobs",
                        "Jobs in the region's books by state.",
                        &[("region", &self.name), ("state", state)],
                    )
                    .set(n);
            }
            let by_phase = self.scheduler.node_phase_counts();
            for phase in ["absent", "launching", "up", "draining", "releasing"] {
                metrics
                    .gauge(
                        "nephele_region_nodes",
                        "Node slots of the region by phase.",
                        &[("region", &self.name), ("phase", phase)],
                    )
                    .set(by_phase.get(phase).copied().unwrap_or(0));
            }
        }
    }

    /// Reports events and commits the change.
    fn settle(&mut self, events: Vec<SchedEvent>) {
        // Every record is written: what the batch bookkeeping covers is in it too.
        let _ = self.scheduler.take_touched();
        self.ticks_since_full = 0;
        let changed = !events.is_empty();
        self.report(events);
        let written = self.commit(Written::All);
        self.persist_ledger(changed);
        if written {
            self.answer_submitted();
        }
    }

    /// What to write for the changes the scheduler tracked: those jobs, or every
    /// record when it cannot say.
    fn touched(&mut self) -> Written {
        match self.scheduler.take_touched() {
            Some(ids) => Written::Jobs(ids),
            None => Written::All,
        }
    }

    /// As [`Self::settle`], writing only the records the scheduler knows changed
    /// (every record when it does not know).
    fn settle_touched(&mut self, events: Vec<SchedEvent>) {
        let which = self.touched();
        if matches!(which, Written::All) {
            self.ticks_since_full = 0;
        }
        let changed = !events.is_empty();
        self.report(events);
        let written = self.commit(which);
        self.persist_ledger(changed);
        // A submission is answered once its job is in the books (a refused write keeps
        // it waiting for the next tick's write).
        if written {
            self.answer_submitted();
        }
    }

    /// The group commit of submissions: one queue pass for the batch, one write of
    /// the records it changed (every record when the pass changed more than jobs),
    /// then every submitter gets its job as placed.
    fn flush_submitted(&mut self) {
        if self.submitted.is_empty() {
            return;
        }
        let now = unix_now();
        let mut events = self.scheduler.tick(now);
        for (id, _) in &self.submitted {
            events.extend(self.scheduler.admitted_events(*id));
        }
        self.settle_touched(events);
    }

    /// Answers the submissions written so far with their jobs as they are now.
    fn answer_submitted(&mut self) {
        for (id, reply) in std::mem::take(&mut self.submitted) {
            let view = self.scheduler.job_view(id).ok_or_else(|| {
                SchedError::NotFound("the job vanished during its first pass".into())
            });
            if let Ok(view) = &view {
                tracing::info!(region = %self.name, job = %format!("{}/{}", view.tenant, view.name), state = view.state, "job submitted");
            }
            let _ = reply.send(view);
        }
    }

    /// Writes the ledger's changed hours (`<region>/<hour>`), when `now` is asked or
    /// [`LEDGER_WRITE_S`] has passed since the last write.
    fn persist_ledger(&mut self, now: bool) {
        let Some(store) = self.store.clone() else {
            return;
        };
        let time = unix_now();
        if !now && time < self.ledger_written + LEDGER_WRITE_S {
            return;
        }
        self.ledger_written = time;
        let records = self.scheduler.take_ledger_records();
        if records.is_empty() {
            return;
        }
        let mut puts = Vec::new();
        let mut deletes = Vec::new();
        for (hour, record) in &records {
            let key = format!("{}/{hour:012}", self.name);
            match record.as_ref().map(serde_json::to_vec) {
                Some(Ok(bytes)) => puts.push((key, bytes)),
                Some(Err(_)) => {}
                None => deletes.push(key),
            }
        }
        if let Err(error) = store.apply(Table::RegionLedger, &puts, &deletes) {
            tracing::error!(region = %self.name, %error, "cannot write the region's ledger; tried again later");
            self.scheduler
                .ledger_unwritten(records.into_iter().map(|(hour, _)| hour));
        }
    }

    /// The current hour's carbon as the region's decisions see it (0 without a signal).
    fn grid_gauge(&self, grid: &GridView) {
        if let Some(metrics) = &self.metrics {
            metrics
                .gauge(
                    "nephele_grid_carbon_g_per_kwh",
                    "Carbon intensity of the current hour as the region's carbon decisions see it (measured or forecast; 0 without a fresh signal), gCO2eq/kWh.",
                    &[("region", &self.name)],
                )
                .set(grid.outlook.first().map_or(0, |h| h.carbon_g_per_kwh.round() as i64));
        }
    }

    /// An autoscaler for `spec`'s deployment: the restored one, else a new one with
    /// the deployment's bounds and latency target.
    fn policy_for(&mut self, spec: &ReplicaSpec, target_p99_ms: u32) -> nephele_autoscale::Ours {
        let mut config = self.settings.policy.clone();
        config.min_replicas = spec.min;
        config.max_replicas = spec.max.max(spec.min).max(1);
        config.tick_ms = self.settings.autoscale.tick_ms;
        config.target_p99_ms = f64::from(target_p99_ms.max(1));
        if let Some(value) = self.restored_policies.remove(&spec.deployment) {
            if let Ok(mut restored) = serde_json::from_value::<nephele_autoscale::Ours>(value) {
                restored.config = config.clone();
                return restored;
            }
        }
        nephele_autoscale::Ours::new(config.clone()).unwrap_or_else(|error| {
            tracing::warn!(region = %self.name, deployment = %spec.deployment, %error, "autoscaler config refused; defaults used");
            let mut fallback = OursConfig {
                min_replicas: spec.min,
                max_replicas: spec.max.max(spec.min).max(1),
                ..OursConfig::default()
            };
            fallback.tick_ms = self.settings.autoscale.tick_ms.max(100);
            nephele_autoscale::Ours::new(fallback)
                .unwrap_or_else(|_| unreachable!("the defaults are valid"))
        })
    }

    /// One autoscaler tick for every deployment, then the node planner.
    fn autoscale(&mut self, ctx: &mut Context<Self>) {
        let now = unix_now();
        let now_ms = unix_now_ms();
        let mut events = Vec::new();
        let deployments = self.scheduler.replica_deployments();
        for deployment in deployments {
            let Some(spec) = self.scheduler.replica_spec(&deployment).cloned() else {
                continue;
            };
            let (ready, starting, _) = self.scheduler.replica_counts(&deployment);
            let cold_start_ms = self.scheduler.cold_start_ms(&deployment);
            let ready_agents = self.scheduler.ready_agents(&deployment);
            let Some(serving) = self.serving.get_mut(&deployment) else {
                continue;
            };
            let fleet = Fleet {
                ready,
                starting,
                cold_start_ms,
                priority: spec.priority,
            };
            let desired = serving.tick(now_ms, &ready_agents, fleet).desired;
            if let Ok((_, scaled)) = self.scheduler.scale(&deployment, desired, now) {
                events.extend(scaled);
            }
            if let Some(metrics) = &self.metrics {
                metrics
                    .gauge(
                        "nephele_replicas_desired",
                        "Replicas the autoscaler asks for, per region and deployment.",
                        &[("region", &self.name), ("deployment", &deployment)],
                    )
                    .set(i64::from(desired));
                metrics
                    .gauge(
                        "nephele_replicas_ready",
                        "Ready replicas per region and deployment.",
                        &[("region", &self.name), ("deployment", &deployment)],
                    )
                    .set(i64::from(ready));
            }
        }
        let (actions, planned) = self.scheduler.plan_nodes(now);
        events.extend(planned);
        if events.is_empty() {
            // Nothing scaled or planned: the autoscalers' state and the nodes are
            // written (the region and node records), not every job again.
            self.settle_touched(events);
        } else {
            self.settle(events);
        }
        for action in actions {
            self.carry_out(action, ctx);
        }
    }

    /// Runs one provider call off the actor; the answer comes back as a message.
    fn carry_out(&mut self, action: NodeAction, ctx: &mut Context<Self>) {
        let me = ctx.address();
        let region = self.name.clone();
        match action {
            NodeAction::Launch {
                node,
                device,
                pool,
                profile,
                capacity_type,
                provider,
            } => {
                let Some(provider) = self.providers.get(provider, &pool) else {
                    me.do_send(ProviderDone {
                        node,
                        launch: true,
                        result: Err(format!("pool {pool} has no provider configured")),
                    });
                    return;
                };
                let Some(federation) = self.federation.clone() else {
                    return;
                };
                let server = self.settings.server.clone();
                tracing::info!(%region, %node, %device, %pool, "asking the provider for a node");
                actix_rt::spawn(async move {
                    let token = federation
                        .join_tokens
                        .send(CreateJoinToken {
                            region: Some(region.clone()),
                            ttl_s: Some(600),
                        })
                        .await;
                    let result = match token {
                        Ok(Ok(view)) => match view.token {
                            Some(token) => {
                                provider
                                    .launch(LaunchRequest {
                                        region,
                                        pool,
                                        node: node.clone(),
                                        device,
                                        profile,
                                        capacity_type,
                                        server,
                                        token,
                                    })
                                    .await
                            }
                            None => Err("no join token was returned".into()),
                        },
                        Ok(Err(error)) => Err(format!("cannot create a join token: {error}")),
                        Err(error) => Err(format!("cannot create a join token: {error}")),
                    };
                    me.do_send(ProviderDone {
                        node,
                        launch: true,
                        result,
                    });
                });
            }
            NodeAction::Release {
                node,
                device,
                pool,
                provider,
            } => {
                let Some(provider) = self.providers.get(provider, &pool) else {
                    me.do_send(ProviderDone {
                        node,
                        launch: false,
                        result: Ok(()),
                    });
                    return;
                };
                tracing::info!(%region, %node, %device, %pool, "asking the provider to remove a node");
                let federation = self.federation.clone();
                actix_rt::spawn(async move {
                    let result = provider
                        .release(ReleaseRequest {
                            region,
                            pool,
                            node: node.clone(),
                            device: device.clone(),
                        })
                        .await;
                    if result.is_ok() {
                        // The name is free for the slot's next node.
                        if let Some(federation) = federation {
                            let _ = federation.delete_device.send(DeleteDevice(device)).await;
                        }
                    }
                    me.do_send(ProviderDone {
                        node,
                        launch: false,
                        result,
                    });
                });
            }
        }
    }
}

impl Actor for RegionActor {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        ctx.run_interval(self.settings.tick, |actor, _| {
            let now = unix_now();
            let events = actor.scheduler.tick(now);
            if actor.metrics.is_some() {
                let grid = actor.scheduler.grid_view(now);
                actor.grid_gauge(&grid);
            }
            actor.ticks_since_full += 1;
            if actor.ticks_since_full >= FULL_WRITE_TICKS {
                actor.settle(events);
            } else {
                // The records this tick and the batches before it changed, as the
                // scheduler tracked them (every record when it cannot say: holds
                // released, nodes changed, replicas moved), not every job again.
                actor.settle_touched(events);
            }
        });
        let autoscale = Duration::from_millis(self.settings.autoscale.tick_ms);
        ctx.run_interval(autoscale, |actor, ctx| actor.autoscale(ctx));
    }
}

/// Where a region sends what it asks of the federation: a recipient per message, not
/// the federation actor's address.
#[derive(Clone)]
pub struct FederationRecipients {
    pub pool_work: Recipient<SetPoolWork>,
    pub join_tokens: Recipient<CreateJoinToken>,
    pub delete_device: Recipient<DeleteDevice>,
}

/// The federation's recipients, once it exists (it is started after the regions).
#[derive(Message)]
#[rtype(result = "()")]
pub struct SetFederation(pub FederationRecipients);

impl Handler<SetFederation> for RegionActor {
    type Result = ();
    fn handle(&mut self, message: SetFederation, ctx: &mut Self::Context) {
        self.federation = Some(message.0);
        let _ = self.commit(Written::All);
        // What the providers run now, against the books (they may have changed while
        // this control plane was down).
        for (pool, kind) in self.scheduler.provider_pools() {
            let Some(provider) = self.providers.get(kind, &pool) else {
                continue;
            };
            let me = ctx.address();
            let region = self.name.clone();
            actix_rt::spawn(async move {
                if let Some(listed) = provider.list(&region, &pool).await {
                    me.do_send(ProviderListed { pool, listed });
                }
            });
        }
        // Plan nodes now rather than at the first autoscaler tick.
        self.autoscale(ctx);
    }
}

/// What a provider lists for one pool.
#[derive(Message)]
#[rtype(result = "()")]
struct ProviderListed {
    pool: String,
    listed: Result<Vec<String>, String>,
}

impl Handler<ProviderListed> for RegionActor {
    type Result = ();
    fn handle(&mut self, message: ProviderListed, ctx: &mut Self::Context) {
        match message.listed {
            Ok(devices) => {
                let (actions, events) =
                    self.scheduler
                        .provider_listed(&message.pool, &devices, unix_now());
                self.settle(events);
                for action in actions {
                    self.carry_out(action, ctx);
                }
            }
            Err(error) => {
                tracing::warn!(region = %self.name, pool = %message.pool, %error, "the provider's list failed; the books are kept as they are")
            }
        }
    }
}

/// A provider call ended.
#[derive(Message)]
#[rtype(result = "()")]
struct ProviderDone {
    node: String,
    launch: bool,
    result: Result<(), String>,
}

impl Handler<ProviderDone> for RegionActor {
    type Result = ();
    fn handle(&mut self, message: ProviderDone, _: &mut Self::Context) {
        let now = unix_now();
        if let Err(error) = &message.result {
            tracing::warn!(region = %self.name, node = %message.node, %error, launch = message.launch, "provider call failed");
            if let Some(metrics) = &self.metrics {
                metrics
                    .counter(
                        "nephele_provider_failures_total",
                        "Provider calls (launch or release) that failed or timed out.",
                        &[("region", &self.name)],
                    )
                    .inc();
            }
        }
        let events = if message.launch {
            self.scheduler
                .launch_result(&message.node, message.result, now)
        } else {
            self.scheduler
                .release_result(&message.node, message.result, now)
        };
        self.settle(events);
    }
}

#[derive(Message)]
#[rtype(result = "()")]
pub struct PoolJoined {
    pub name: String,
    pub session_id: u64,
    pub connection: quinn::Connection,
    pub profile: String,
    /// Where gang members reach the node.
    pub address: String,
    pub gpus: Vec<GpuReport>,
    /// The job members it reports in its Hello.
    pub jobs: Vec<JobMemberStatus>,
}

impl Handler<PoolJoined> for RegionActor {
    type Result = ();
    fn handle(&mut self, message: PoolJoined, _: &mut Self::Context) {
        let now = unix_now();
        let slot = self.scheduler.agent_joined(
            &message.name,
            &message.profile,
            &message.address,
            message.gpus,
            now,
        );
        match &slot {
            Some(slot) => {
                tracing::info!(region = %self.name, pool_agent = %message.name, profile = %message.profile, %slot, "pool agent connected; node up")
            }
            None => {
                tracing::warn!(region = %self.name, pool_agent = %message.name, profile = %message.profile, "pool agent connected, but no [[region.pool]] with this profile has a free slot: no work is placed on it")
            }
        }
        self.agents.insert(
            message.name.clone(),
            PoolMember {
                session_id: message.session_id,
                connection: message.connection,
            },
        );
        let mut events = self
            .scheduler
            .member_reports(&message.name, &message.jobs, now);
        events.extend(self.scheduler.tick(now));
        self.settle(events);
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
        if self.agents.get(&message.name).map(|m| m.session_id) == Some(message.session_id) {
            self.agents.remove(&message.name);
            for serving in self.serving.values_mut() {
                serving.forget(&message.name);
            }
            let now = unix_now();
            let mut events = self.scheduler.agent_left(&message.name, now);
            tracing::info!(region = %self.name, pool_agent = %message.name, "pool agent gone; its node takes no new work");
            events.extend(self.scheduler.tick(now));
            self.settle(events);
        }
    }
}

/// A pool agent's heartbeat: its deployments' telemetry and its job members.
#[derive(Message)]
#[rtype(result = "()")]
pub struct PoolReport {
    pub name: String,
    pub session_id: u64,
    pub deployments: Vec<DeploymentTelemetry>,
    pub jobs: Vec<JobMemberStatus>,
}

impl Handler<PoolReport> for RegionActor {
    type Result = ();
    fn handle(&mut self, message: PoolReport, _: &mut Self::Context) {
        if self.agents.get(&message.name).map(|m| m.session_id) != Some(message.session_id) {
            return;
        }
        let now = unix_now();
        for telemetry in &message.deployments {
            if let Some(serving) = self.serving.get_mut(&telemetry.deployment) {
                serving.report(&message.name, telemetry.clone());
            }
        }
        let mut events = self
            .scheduler
            .replica_reports(&message.name, &message.deployments, now);
        events.extend(
            self.scheduler
                .member_reports(&message.name, &message.jobs, now),
        );
        if !events.is_empty() {
            events.extend(self.scheduler.tick(now));
            self.settle(events);
        } else {
            // Member states (running, pids) changed or not: only those jobs' records
            // are written (and the nodes'), unless more may have changed.
            let which = self.touched();
            self.persist(which);
        }
    }
}

/// The deployments that may offload, as replica specs with their latency targets; sent
/// by the federation at start and on every deployment change.
#[derive(Message)]
#[rtype(result = "()")]
pub struct SyncDeployments(pub Vec<(ReplicaSpec, u32)>);

impl Handler<SyncDeployments> for RegionActor {
    type Result = ();
    fn handle(&mut self, message: SyncDeployments, _: &mut Self::Context) {
        let now = unix_now();
        let now_ms = unix_now_ms();
        let specs: Vec<ReplicaSpec> = message.0.iter().map(|(s, _)| s.clone()).collect();
        self.serving
            .retain(|deployment, _| specs.iter().any(|s| &s.deployment == deployment));
        for (spec, target) in &message.0 {
            if !self.serving.contains_key(&spec.deployment) {
                let policy = self.policy_for(spec, *target);
                self.serving
                    .insert(spec.deployment.clone(), Serving::new(policy, now_ms));
            } else if let Some(serving) = self.serving.get_mut(&spec.deployment) {
                serving.configure(spec.min, spec.max, *target);
            }
        }
        let events = self.scheduler.sync_replica_sets(&specs, now);
        self.settle(events);
    }
}

/// A chosen replica. Its deployment's outstanding count is incremented on creation;
/// drop the lease when the request is done, after [`PoolLease::record`].
pub struct PoolLease {
    pub name: String,
    pub connection: quinn::Connection,
    outstanding: Arc<AtomicU32>,
    stats: Arc<ServingStats>,
}

impl PoolLease {
    /// The request's round trip through the replica (what the autoscaler's p99 is,
    /// judged against the deployment's latency target).
    pub fn record(&self, elapsed: Duration) {
        self.stats.record(elapsed);
    }
}

impl Drop for PoolLease {
    fn drop(&mut self) {
        self.outstanding.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Where an offloaded request goes.
pub enum Pick {
    Lease(PoolLease),
    /// Admission control refused it: answer 429 with this Retry-After.
    Shed {
        retry_after_ms: u32,
        reason: String,
    },
    /// No ready replica of the deployment here.
    NoReplica(String),
}

#[derive(Message)]
#[rtype(result = "Pick")]
pub struct PickPool {
    pub deployment: String,
    /// Never route to this agent (a pool agent offloading to itself), nor to these
    /// (a retry after a failed replica).
    pub exclude: Vec<String>,
}

impl Handler<PickPool> for RegionActor {
    type Result = MessageResult<PickPool>;
    fn handle(&mut self, message: PickPool, _: &mut Self::Context) -> Self::Result {
        let ready = self.scheduler.ready_agents(&message.deployment);
        let agents = &self.agents;
        let Some(serving) = self.serving.get_mut(&message.deployment) else {
            return MessageResult(Pick::NoReplica(format!(
                "deployment {} has no replicas in region {}",
                message.deployment, self.name
            )));
        };
        let live: Vec<&String> = ready
            .iter()
            .filter(|a| !message.exclude.contains(a))
            .filter(|a| {
                agents
                    .get(*a)
                    .is_some_and(|m| m.connection.close_reason().is_none())
            })
            .collect();
        let (agent, outstanding) = match serving.offer(unix_now_ms(), live) {
            Choice::Replica { agent, outstanding } => (agent, outstanding),
            Choice::NoReplica => {
                return MessageResult(Pick::NoReplica(format!(
                    "no ready replica of {} in region {}",
                    message.deployment, self.name
                )))
            }
            Choice::Shed {
                retry_after_ms,
                reason,
            } => {
                if let Some(metrics) = &self.metrics {
                    metrics
                        .counter(
                            "nephele_admission_shed_total",
                            "Offloaded requests refused by admission control (429 with Retry-After).",
                            &[("region", &self.name), ("deployment", &message.deployment)],
                        )
                        .inc();
                }
                return MessageResult(Pick::Shed {
                    retry_after_ms: retry_after_ms.min(u64::from(u32::MAX)) as u32,
                    reason: format!("{reason:?}"),
                });
            }
        };
        let connection = self.agents[&agent].connection.clone();
        MessageResult(Pick::Lease(PoolLease {
            name: agent,
            connection,
            outstanding,
            stats: serving.stats(),
        }))
    }
}

/// A spot interruption notice (from the API or the node's agent): drain the node
/// within `seconds`.
#[derive(Message)]
#[rtype(result = "Result<Vec<NodeView>, SchedError>")]
pub struct InterruptNode {
    /// Node slot, device or agent name.
    pub node: String,
    pub seconds: u64,
    pub source: String,
}

impl Handler<InterruptNode> for RegionActor {
    type Result = Result<Vec<NodeView>, SchedError>;
    fn handle(&mut self, message: InterruptNode, _: &mut Self::Context) -> Self::Result {
        let now = unix_now();
        let events = self.scheduler.drain(
            &message.node,
            now + message.seconds,
            &format!(
                "interruption notice ({}): the node goes in {} s",
                message.source, message.seconds
            ),
            now,
        )?;
        let mut events = events;
        events.extend(self.scheduler.tick(now));
        self.settle(events);
        Ok(self.scheduler.nodes())
    }
}

/// `POST /v1/regions/{name}/nodes/{node}/drain`: move its work away and (with a
/// provider) release it.
#[derive(Message)]
#[rtype(result = "Result<Vec<NodeView>, SchedError>")]
pub struct DrainNode {
    pub node: String,
}

impl Handler<DrainNode> for RegionActor {
    type Result = Result<Vec<NodeView>, SchedError>;
    fn handle(&mut self, message: DrainNode, _: &mut Self::Context) -> Self::Result {
        let now = unix_now();
        let deadline = now + self.settings.autoscale.tick_ms / 1000 * 60 + 600;
        let mut events =
            self.scheduler
                .drain(&message.node, deadline, "drained by an operator", now)?;
        events.extend(self.scheduler.tick(now));
        self.settle(events);
        Ok(self.scheduler.nodes())
    }
}

/// `GET /v1/deployments/{name}/replicas`: this region's replicas of a deployment.
#[derive(Message)]
#[rtype(result = "Option<ReplicaSetView>")]
pub struct GetReplicas(pub String);

impl Handler<GetReplicas> for RegionActor {
    type Result = MessageResult<GetReplicas>;
    fn handle(&mut self, message: GetReplicas, _: &mut Self::Context) -> Self::Result {
        let mut view = self.scheduler.replica_set_view(&message.0);
        if let (Some(view), Some(serving)) = (view.as_mut(), self.serving.get(&message.0)) {
            view.autoscaler = Some(serving.autoscaler_view());
        }
        MessageResult(view)
    }
}

/// Where a job member's log is: a connection to its agent and the request to send.
#[derive(Message)]
#[rtype(result = "Result<(quinn::Connection, nephele_proto::RequestBody), SchedError>")]
pub struct JobLogs {
    pub tenant: String,
    pub name: String,
    pub member: u16,
    pub attempt: Option<u32>,
    pub offset: u64,
    pub max_bytes: u32,
}

impl Handler<JobLogs> for RegionActor {
    type Result = Result<(quinn::Connection, nephele_proto::RequestBody), SchedError>;
    fn handle(&mut self, message: JobLogs, _: &mut Self::Context) -> Self::Result {
        let (agent, job, attempt, member) = self.scheduler.log_target(
            &message.tenant,
            &message.name,
            message.member,
            message.attempt,
        )?;
        let connection = self
            .agents
            .get(&agent)
            .map(|m| m.connection.clone())
            .ok_or_else(|| {
                SchedError::NotFound(format!(
                    "the node agent {agent} holding that log is not connected now; try again when it is"
                ))
            })?;
        Ok((
            connection,
            nephele_proto::RequestBody::JobLogs {
                job,
                attempt,
                member,
                offset: message.offset,
                max_bytes: message.max_bytes,
            },
        ))
    }
}

/// `POST /v1/jobs`, for an authenticated tenant.
#[derive(Message)]
#[rtype(result = "Result<JobView, SchedError>")]
pub struct SubmitJob {
    pub tenant: String,
    pub spec: JobSpec,
    /// How the region was chosen, for `"region": "auto"`.
    pub choice: Option<RegionChoiceView>,
}

impl Handler<SubmitJob> for RegionActor {
    type Result = ResponseFuture<Result<JobView, SchedError>>;
    fn handle(&mut self, message: SubmitJob, ctx: &mut Self::Context) -> Self::Result {
        let admitted =
            self.scheduler
                .admit(&message.tenant, message.spec, message.choice, unix_now());
        let id = match admitted {
            Ok(id) => id,
            Err(error) => return Box::pin(std::future::ready(Err(error))),
        };
        let (reply, answer) = tokio::sync::oneshot::channel();
        if self.submitted.is_empty() {
            ctx.run_later(SUBMIT_BATCH_WAIT, |actor, _| actor.flush_submitted());
        }
        self.submitted.push((id, reply));
        Box::pin(async move {
            answer.await.unwrap_or_else(|_| {
                Err(SchedError::NotFound(
                    "the region stopped before the job was written; list the jobs to see whether it was".into(),
                ))
            })
        })
    }
}

#[derive(Message)]
#[rtype(result = "Result<JobView, SchedError>")]
pub struct GetJob {
    pub tenant: String,
    pub name: String,
}

impl Handler<GetJob> for RegionActor {
    type Result = Result<JobView, SchedError>;
    fn handle(&mut self, message: GetJob, _: &mut Self::Context) -> Self::Result {
        self.scheduler.get(&message.tenant, &message.name)
    }
}

#[derive(Message)]
#[rtype(result = "Result<JobView, SchedError>")]
pub struct DeleteJob {
    pub tenant: String,
    pub name: String,
}

impl Handler<DeleteJob> for RegionActor {
    type Result = Result<JobView, SchedError>;
    fn handle(&mut self, message: DeleteJob, _: &mut Self::Context) -> Self::Result {
        let (view, events) = self
            .scheduler
            .delete(&message.tenant, &message.name, unix_now())?;
        tracing::info!(region = %self.name, job = %format!("{}/{}", view.tenant, view.name), "job deleted");
        self.settle(events);
        Ok(view)
    }
}

/// Jobs of one tenant, or of all (`None`, admins), in one state or all, a page of them
/// or all ([`RegionScheduler::list_page`]); and how many there are.
#[derive(Message)]
#[rtype(result = "(Vec<JobView>, usize)")]
pub struct ListJobs {
    pub tenant: Option<String>,
    pub state: Option<String>,
    /// A key to start after and how many to return, in key order.
    pub page: Option<(Option<String>, usize)>,
}

impl Handler<ListJobs> for RegionActor {
    type Result = MessageResult<ListJobs>;
    fn handle(&mut self, message: ListJobs, _: &mut Self::Context) -> Self::Result {
        MessageResult(
            self.scheduler.list_page(
                message.tenant.as_deref(),
                message.state.as_deref(),
                message
                    .page
                    .as_ref()
                    .map(|(after, fetch)| (after.as_deref(), *fetch)),
            ),
        )
    }
}

#[derive(Message)]
#[rtype(result = "Vec<NodeView>")]
pub struct ListNodes;

impl Handler<ListNodes> for RegionActor {
    type Result = Vec<NodeView>;
    fn handle(&mut self, _: ListNodes, _: &mut Self::Context) -> Self::Result {
        self.scheduler.nodes()
    }
}

/// What this region offers a job, for `"region": "auto"`.
#[derive(Message)]
#[rtype(result = "JobOffer")]
pub struct OfferJob {
    pub spec: JobSpec,
}

impl Handler<OfferJob> for RegionActor {
    type Result = MessageResult<OfferJob>;
    fn handle(&mut self, message: OfferJob, _: &mut Self::Context) -> Self::Result {
        MessageResult(self.scheduler.offer(&message.spec, unix_now()))
    }
}

/// `PUT /v1/regions/{name}/grid`: measurements from a carbon (and price) feed.
#[derive(Message)]
#[rtype(result = "Result<GridPushView, SchedError>")]
pub struct PushGrid {
    pub points: Vec<GridPoint>,
    pub forecast: Option<crate::scheduler::ForecastPush>,
}

impl Handler<PushGrid> for RegionActor {
    type Result = Result<GridPushView, SchedError>;
    fn handle(&mut self, message: PushGrid, _: &mut Self::Context) -> Self::Result {
        let (view, events) =
            self.scheduler
                .push_grid(&message.points, message.forecast.as_ref(), unix_now())?;
        tracing::info!(region = %self.name, kept = view.kept, too_old = view.too_old, forecast_hours = ?view.forecast_hours, signal = view.grid.signal, "grid signal stored");
        self.settle(events);
        self.grid_gauge(&view.grid);
        Ok(view)
    }
}

/// `GET /v1/regions/{name}/grid`.
#[derive(Message)]
#[rtype(result = "GridView")]
pub struct GetGrid;

impl Handler<GetGrid> for RegionActor {
    type Result = MessageResult<GetGrid>;
    fn handle(&mut self, _: GetGrid, _: &mut Self::Context) -> Self::Result {
        MessageResult(self.scheduler.grid_view(unix_now()))
    }
}

/// The ledger's hours in `[from, to)` (unix seconds) and their measured carbon, for
/// `GET /v1/reports/…`.
#[derive(Message)]
#[rtype(result = "crate::reports::RegionLedger")]
pub struct GetLedger {
    pub from: u64,
    pub to: u64,
}

impl Handler<GetLedger> for RegionActor {
    type Result = MessageResult<GetLedger>;
    fn handle(&mut self, message: GetLedger, _: &mut Self::Context) -> Self::Result {
        MessageResult(self.scheduler.ledger_between(message.from, message.to))
    }
}

/// A tenant created, changed or deleted (from the federation).
#[derive(Message)]
#[rtype(result = "()")]
pub struct SetTenant {
    pub tenant: crate::config::TenantConfig,
    pub removed: bool,
}

impl Handler<SetTenant> for RegionActor {
    type Result = ();
    fn handle(&mut self, message: SetTenant, _: &mut Self::Context) {
        if message.removed {
            self.scheduler.remove_tenant(&message.tenant.name);
        } else {
            self.scheduler.set_tenant(&message.tenant);
        }
        tracing::info!(region = %self.name, tenant = %message.tenant.name, removed = message.removed, "tenant updated");
    }
}

/// How many jobs of a tenant have not ended here (`DELETE /v1/tenants/{name}` asks
/// every region first).
#[derive(Message)]
#[rtype(result = "usize")]
pub struct TenantJobs(pub String);

impl Handler<TenantJobs> for RegionActor {
    type Result = usize;
    fn handle(&mut self, message: TenantJobs, _: &mut Self::Context) -> usize {
        self.scheduler.active_jobs(&message.0)
    }
}
