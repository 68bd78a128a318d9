//! One actor per configured region. It tracks the region's pool agents, picks the
//! replica for each offloaded request (least outstanding requests, ties by name), and
//! runs the region's job scheduler ([`crate::scheduler::RegionScheduler`], a pure core):
//! pool agents fill node slots as they connect, the API submits and deletes jobs, and a
//! timer retries the queue every `scheduler.tick_ms`. Autoscaling will live here too.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use actix::prelude::*;

use nephele_placement::grid::GridPoint;

use crate::scheduler::{
    GridPushView, GridView, JobOffer, JobSpec, JobView, NodeView, RegionChoiceView,
    RegionScheduler, SchedError, SchedEvent,
};

struct PoolMember {
    session_id: u64,
    connection: quinn::Connection,
    outstanding: Arc<AtomicU32>,
}

pub struct RegionActor {
    name: String,
    pools: BTreeMap<String, PoolMember>,
    scheduler: RegionScheduler,
    tick: Duration,
    metrics: Option<nephele_telemetry::Registry>,
}

fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

impl RegionActor {
    pub fn new(scheduler: RegionScheduler, tick: Duration) -> Self {
        RegionActor {
            name: scheduler.region().to_string(),
            pools: BTreeMap::new(),
            scheduler,
            tick,
            metrics: None,
        }
    }

    pub fn with_metrics(mut self, metrics: nephele_telemetry::Registry) -> Self {
        self.metrics = Some(metrics);
        self
    }

    /// Logs what the scheduler did and updates the job gauges. Carrying jobs out on the
    /// pool agents (start, checkpoint-then-stop) is the next step; today a placement
    /// holds its resources until the job is deleted.
    fn report(&self, events: Vec<SchedEvent>) {
        for event in &events {
            match event {
                SchedEvent::Placed { job, nodes } => {
                    tracing::info!(region = %self.name, %job, nodes = ?nodes, "job placed")
                }
                SchedEvent::Preempting {
                    job,
                    by,
                    grace_seconds,
                } => {
                    tracing::info!(region = %self.name, %job, by = %by, grace_seconds, "job preempted: checkpoint, then stop")
                }
                SchedEvent::Requeued { job } => {
                    tracing::info!(region = %self.name, %job, "job lost its resources and waits again")
                }
                SchedEvent::Deferred { job, reason } => {
                    tracing::info!(region = %self.name, %job, %reason, "deferrable job held")
                }
                SchedEvent::Released { job, reason } => {
                    tracing::info!(region = %self.name, %job, %reason, "deferrable job queued")
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
                };
                metrics
                    .counter(
                        "nephele_scheduler_events_total",
                        "Scheduler decisions by region and kind.",
                        &[("region", &self.name), ("kind", kind)],
                    )
                    .inc();
            }
            let mut by_state: BTreeMap<&str, i64> = [
                ("deferred", 0),
                ("pending", 0),
                ("running", 0),
                ("terminating", 0),
            ]
            .into();
            for job in self.scheduler.list(None) {
                *by_state.entry(job.state).or_default() += 1;
            }
            for (state, n) in by_state {
                metrics
                    .gauge(
                        "nephele_scheduler_jobs",
                        "Jobs in the region's queue by state.",
                        &[("region", &self.name), ("state", state)],
                    )
                    .set(n);
            }
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
}

impl Actor for RegionActor {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        ctx.run_interval(self.tick, |actor, _| {
            let now = unix_now();
            let events = actor.scheduler.tick(now);
            actor.report(events);
            if actor.metrics.is_some() {
                let grid = actor.scheduler.grid_view(now);
                actor.grid_gauge(&grid);
            }
        });
    }
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
        let slot = self.scheduler.agent_joined(&message.name, &message.profile);
        match &slot {
            Some(slot) => {
                tracing::info!(region = %self.name, pool_agent = %message.name, profile = %message.profile, %slot, "pool replica available; node slot up")
            }
            None => {
                tracing::warn!(region = %self.name, pool_agent = %message.name, profile = %message.profile, "pool replica available for offload, but no [[region.pool]] with this profile has a free slot: no jobs are placed on it")
            }
        }
        self.pools.insert(
            message.name,
            PoolMember {
                session_id: message.session_id,
                connection: message.connection,
                outstanding: Arc::new(AtomicU32::new(0)),
            },
        );
        if slot.is_some() {
            let events = self.scheduler.tick(unix_now());
            self.report(events);
        }
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
            let requeued = self.scheduler.agent_left(&message.name, unix_now());
            tracing::info!(region = %self.name, pool_agent = %message.name, requeued = ?requeued, "pool replica gone");
            let mut events: Vec<SchedEvent> = requeued
                .into_iter()
                .map(|job| SchedEvent::Requeued { job })
                .collect();
            events.extend(self.scheduler.tick(unix_now()));
            self.report(events);
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
        Some(PoolLease {
            name: name.clone(),
            connection: member.connection.clone(),
            outstanding: member.outstanding.clone(),
        })
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
    type Result = Result<JobView, SchedError>;
    fn handle(&mut self, message: SubmitJob, _: &mut Self::Context) -> Self::Result {
        let (view, events) = self.scheduler.submit_chosen(
            &message.tenant,
            message.spec,
            message.choice,
            unix_now(),
        )?;
        tracing::info!(region = %self.name, job = %format!("{}/{}", view.tenant, view.name), state = view.state, "job submitted");
        self.report(events);
        Ok(view)
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
        self.report(events);
        Ok(view)
    }
}

/// Jobs of one tenant, or of all (`None`, admins).
#[derive(Message)]
#[rtype(result = "Vec<JobView>")]
pub struct ListJobs {
    pub tenant: Option<String>,
}

impl Handler<ListJobs> for RegionActor {
    type Result = Vec<JobView>;
    fn handle(&mut self, message: ListJobs, _: &mut Self::Context) -> Self::Result {
        self.scheduler.list(message.tenant.as_deref())
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
}

impl Handler<PushGrid> for RegionActor {
    type Result = Result<GridPushView, SchedError>;
    fn handle(&mut self, message: PushGrid, _: &mut Self::Context) -> Self::Result {
        let (view, events) = self.scheduler.push_grid(&message.points, unix_now())?;
        tracing::info!(region = %self.name, kept = view.kept, too_old = view.too_old, signal = view.grid.signal, "grid measurements stored");
        self.report(events);
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
