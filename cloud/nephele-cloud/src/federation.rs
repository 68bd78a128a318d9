//! The federation actor: the shell around the fleet core ([`fleet_core::FleetCore`]).
//!
//! The core holds the fleet's state and rules without IO; this actor owns what the core
//! must not: the store (behind [`fleet_store::FleetStore`]), each agent session's sender
//! and QUIC connection, the region actors' addresses, and the metrics. For every message
//! it asks the core, commits the writes the core returns (rolling the core back if the
//! store refuses them, so nothing is sent or acknowledged that is not durable), then
//! carries out the effects: desired states to agents (level-triggered: the whole state,
//! so a resend is always safe) and notes to regions. Routing of offloaded requests is the
//! region actors' job, not this one's.

pub mod access;
mod access_api;
pub(crate) mod authority;
mod builds;
pub mod fleet;
pub mod fleet_copy;
pub mod fleet_core;
mod fleet_core_access;
mod fleet_core_api;
mod fleet_core_rollouts;
mod fleet_core_tenants;
pub mod fleet_store;
mod profiles;
pub use crate::rollout;
pub mod usage;
mod views;

use std::collections::HashMap;
use std::time::Instant;

use actix::prelude::*;
use nephele_net::{ClusterCa, PeerIdentity};
use nephele_proto::{
    CloudMessage, DesiredState, ErrorCode, ErrorFrame, Heartbeat, Hello, JoinAccepted, JoinRequest,
    Welcome,
};
use tokio::sync::mpsc::UnboundedSender;

pub use access::{Access, Principal, Role};
pub use access_api::*;
pub use authority::{Authority, Keys};
pub use builds::{Begin, ModelState, NewBuild};
pub use fleet_core_access::{AuditEntry, NewSecret};
pub use fleet_core_api::{NewJoinToken, PutModel};
pub use fleet_core_rollouts::RolloutAction;
pub use fleet_core_tenants::seeded as seeded_tenants;
pub use views::*;

use self::fleet_core::{Effect, FleetCore, Output, RegionNote};
use crate::config::CloudConfig;
use crate::region::{
    InterruptNode, PoolJoined, PoolLeft, PoolReport, RegionActor, SyncDeployments,
};
use crate::scheduler::PoolWork;
use crate::store::{Store, StoreError};
use fleet_store::FleetStore;

pub use crate::api_error::ApiError;
pub use crate::clock::{now_unix, now_unix_ms, sha256_hex};
pub use crate::notes::{CreateJoinToken, DeleteDevice, SetPoolWork};

/// How often rollouts under way are advanced.
const ROLLOUT_TICK: std::time::Duration = std::time::Duration::from_secs(1);

const DEVICE_ONLINE: &str = "nephele_device_online";
const DEVICE_ONLINE_HELP: &str =
    "Per enrolled device: 1 while its agent has a live session, else 0.";

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

pub(crate) fn random_alnum(len: usize) -> String {
    use rand::Rng as _;
    const ALPHABET: &[u8] = b"abcdefghijklmnopqrstuvwxyz0123456789";
    let mut rng = rand::rng();
    (0..len)
        .map(|_| ALPHABET[rng.random_range(0..ALPHABET.len())] as char)
        .collect()
}

/// A store error as an agent is told it.
fn store_refusal(error: StoreError) -> ErrorFrame {
    ErrorFrame::new(ErrorCode::Internal, error.to_string())
}

/// A connected agent's session as the shell holds it.
struct Connection {
    id: u64,
    tx: UnboundedSender<Box<CloudMessage>>,
    /// For the address it is reached at now (QUIC follows a device whose address
    /// changes without a new session).
    connection: quinn::Connection,
}

pub struct FederationActor {
    core: FleetCore,
    store: Box<dyn FleetStore>,
    regions: HashMap<String, Addr<RegionActor>>,
    connections: HashMap<String, Connection>,
    /// The sender and connection of the agent whose `AgentConnected` is being handled,
    /// until the core registers its session.
    arriving: Option<(UnboundedSender<Box<CloudMessage>>, quinn::Connection)>,
    /// The core's clock: milliseconds since this actor was made.
    started: Instant,
    metrics: nephele_telemetry::Registry,
    /// Where changes are published for watches.
    watch: Option<crate::watch::Hub>,
    /// Audit entries waiting for their group write (`access_api::RecordAudit`).
    audit_pending: Vec<AuditEntry>,
}

impl FederationActor {
    pub fn new(
        config: CloudConfig,
        store: Store,
        ca: ClusterCa,
        signing_key: ring::signature::Ed25519KeyPair,
        regions: HashMap<String, Addr<RegionActor>>,
        metrics: nephele_telemetry::Registry,
        pool_work: HashMap<String, PoolWork>,
    ) -> Result<Self, StoreError> {
        let snapshot = store.load()?;
        // Generations must grow across restarts too: start from the wall clock.
        let generation = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_millis() as u64)
            .unwrap_or(1);
        let core = FleetCore::new(
            config,
            Box::new(Keys { ca, signing_key }),
            snapshot,
            generation,
            pool_work,
        );
        Ok(FederationActor {
            core,
            store: Box::new(store),
            regions,
            connections: HashMap::new(),
            arriving: None,
            started: Instant::now(),
            metrics,
            watch: None,
            audit_pending: Vec::new(),
        })
    }

    /// Publishes what its commands change to `hub` (`GET /v1/watch`).
    pub fn with_watch(mut self, hub: crate::watch::Hub) -> Self {
        self.watch = Some(hub);
        self
    }

    /// Publishes the last command's changes.
    fn publish_changes(&self) {
        let Some(hub) = &self.watch else { return };
        for change in self.core.watched_changes() {
            hub.publish(
                change.kind,
                &change.name,
                change.action,
                change.tenant.as_deref(),
                change.region.as_deref(),
            );
        }
    }

    /// A device came or went (its `online` changed).
    fn publish_device(&self, device: &str) {
        if let Some(hub) = &self.watch {
            hub.publish(crate::watch::Kind::Device, device, "put", None, None);
        }
    }

    /// Creates the first admin API token when there is none (a fresh control plane);
    /// returns it, once, for the operator.
    pub fn bootstrap_admin_token(&mut self) -> Result<Option<String>, StoreError> {
        let output = self
            .core
            .bootstrap_admin_token(now_unix(), random_alnum(8), random_alnum(40));
        self.run(output)
    }

    fn now_ms(&self) -> u64 {
        self.started.elapsed().as_millis() as u64
    }

    /// Commits a command's writes, then carries out its effects. When the store
    /// refuses the writes the core is rolled back and nothing is carried out.
    fn run<R>(&mut self, output: Output<R>) -> Result<R, StoreError> {
        if !output.persist.is_empty() {
            if let Err(error) = self.store.commit(&output.persist) {
                self.core.rollback();
                tracing::warn!(%error, "the store refused a change; nothing was changed");
                return Err(error);
            }
            self.publish_changes();
        }
        self.carry_out(output.effects);
        Ok(output.reply)
    }

    fn carry_out(&mut self, effects: Vec<Effect>) {
        for effect in effects {
            match effect {
                Effect::Send {
                    device,
                    session,
                    message,
                } => {
                    if let Some(connection) =
                        self.connections.get(&device).filter(|c| c.id == session)
                    {
                        let _ = connection.tx.send(Box::new(message));
                    }
                }
                Effect::Register { device, session } => {
                    if let Some((tx, connection)) = self.arriving.take() {
                        // A reconnect replaces the old session; dropping its sender ends
                        // its writer.
                        self.connections.insert(
                            device.clone(),
                            Connection {
                                id: session,
                                tx,
                                connection,
                            },
                        );
                    }
                    self.update_device_gauge(&device);
                    self.publish_device(&device);
                }
                Effect::EndSession { device, session } => {
                    if self.connections.get(&device).map(|c| c.id) == Some(session) {
                        self.connections.remove(&device);
                    }
                    self.update_device_gauge(&device);
                    self.publish_device(&device);
                }
                Effect::Region(note) => self.tell_region(note),
                Effect::DeleteBlobs { sha256s } => match self.store.remove_blobs(&sha256s) {
                    Ok(()) => tracing::info!(blobs = sha256s.len(), "model files removed"),
                    // The records are gone; the files are only space, and say so.
                    Err(error) => {
                        tracing::warn!(%error, "cannot remove the files of a deleted model")
                    }
                },
            }
        }
    }

    fn tell_region(&self, note: RegionNote) {
        match note {
            RegionNote::PoolJoined {
                region,
                name,
                session_id,
                profile,
                address,
                gpus,
                jobs,
            } => {
                let (Some(actor), Some(connection)) =
                    (self.regions.get(&region), self.connections.get(&name))
                else {
                    return;
                };
                actor.do_send(PoolJoined {
                    name,
                    session_id,
                    connection: connection.connection.clone(),
                    profile,
                    address,
                    gpus,
                    jobs,
                });
            }
            RegionNote::PoolReport {
                region,
                name,
                session_id,
                deployments,
                jobs,
            } => {
                if let Some(actor) = self.regions.get(&region) {
                    actor.do_send(PoolReport {
                        name,
                        session_id,
                        deployments,
                        jobs,
                    });
                }
            }
            RegionNote::Interrupt {
                region,
                node,
                seconds,
                source,
            } => {
                if let Some(actor) = self.regions.get(&region) {
                    actor.do_send(InterruptNode {
                        node,
                        seconds,
                        source,
                    });
                }
            }
            RegionNote::PoolLeft { name, session_id } => {
                for actor in self.regions.values() {
                    actor.do_send(PoolLeft {
                        name: name.clone(),
                        session_id,
                    });
                }
            }
            RegionNote::Sync(specs) => {
                for actor in self.regions.values() {
                    actor.do_send(SyncDeployments(specs.clone()));
                }
            }
            RegionNote::Tenant { tenant, removed } => {
                for actor in self.regions.values() {
                    actor.do_send(crate::region::SetTenant {
                        tenant: tenant.clone(),
                        removed,
                    });
                }
            }
        }
    }

    /// The connected count and one device's online series: what a session starting or
    /// ending, a join or a deletion changes (the whole-fleet rebuild below is O(fleet)
    /// and, run on every connect, made connecting 10,000 agents quadratic).
    fn update_device_gauge(&self, device: &str) {
        self.set_connected_count();
        match self.core.records.devices.get(device) {
            Some(d) => self
                .metrics
                .gauge(
                    DEVICE_ONLINE,
                    DEVICE_ONLINE_HELP,
                    &[
                        ("device", d.name.as_str()),
                        ("region", d.region.as_str()),
                        ("role", d.role.as_str()),
                    ],
                )
                .set(i64::from(self.connections.contains_key(device))),
            None => self
                .metrics
                .remove_series(DEVICE_ONLINE, ("device", device)),
        }
    }

    fn set_connected_count(&self) {
        self.metrics
            .gauge(
                "nephele_agents_connected",
                "Agents with a live QUIC session.",
                &[],
            )
            .set(self.connections.len() as i64);
    }

    fn update_connected_gauge(&self) {
        self.set_connected_count();
        let devices = &self.core.records.devices;
        let series: Vec<(Vec<(&str, &str)>, i64)> = devices
            .values()
            .map(|d| {
                (
                    vec![
                        ("device", d.name.as_str()),
                        ("region", d.region.as_str()),
                        ("role", d.role.as_str()),
                    ],
                    i64::from(self.connections.contains_key(&d.name)),
                )
            })
            .collect();
        self.metrics
            .set_gauges(DEVICE_ONLINE, DEVICE_ONLINE_HELP, &series);
    }

    fn count(&self, name: &str, help: &str) {
        self.metrics.counter(name, help, &[]).inc();
    }
}

impl Actor for FederationActor {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        let effects = self.core.started();
        self.carry_out(effects);
        self.update_connected_gauge();
        ctx.run_interval(ROLLOUT_TICK, |actor, _| {
            let output = actor.core.tick_rollouts(now_unix_ms());
            for (deployment, outcome) in &output.reply {
                actor
                    .metrics
                    .counter(
                        "nephele_rollouts_finished_total",
                        "Rollouts that ended, by deployment and outcome (complete, rolled_back).",
                        &[("deployment", deployment), ("outcome", outcome)],
                    )
                    .inc();
            }
            // A refused write is retried on the next tick (the core was rolled back).
            let _ = actor.run(output);
        });
    }
}

impl Handler<SetPoolWork> for FederationActor {
    type Result = ();
    fn handle(&mut self, message: SetPoolWork, _: &mut Self::Context) {
        let effects = self.core.set_pool_work(&message.agent, message.work);
        self.carry_out(effects);
    }
}

// ----------------------------------------------------------------------------------
// Gateway messages
// ----------------------------------------------------------------------------------

#[derive(Message)]
#[rtype(result = "Result<JoinAccepted, ErrorFrame>")]
pub struct Join(pub JoinRequest);

impl Handler<Join> for FederationActor {
    type Result = Result<JoinAccepted, ErrorFrame>;
    fn handle(&mut self, message: Join, _: &mut Self::Context) -> Self::Result {
        let output = self.core.join(now_unix(), message.0);
        let result = self.run(output).map_err(store_refusal).and_then(|r| r);
        match &result {
            Ok(accepted) => {
                self.count(
                    "nephele_agents_joined_total",
                    "Agents enrolled with a join token.",
                );
                self.update_device_gauge(&accepted.agent_id);
            }
            Err(error) => {
                self.count("nephele_joins_refused_total", "Join attempts refused.");
                tracing::warn!(%error, "join refused");
            }
        }
        result
    }
}

#[derive(Message)]
#[rtype(result = "Result<(u64, Welcome, DesiredState), ErrorFrame>")]
pub struct AgentConnected {
    pub identity: PeerIdentity,
    pub hello: Hello,
    /// Boxed: tokio's channel allocates its first block of 32 slots at creation, which
    /// for the message itself was about 3 KB per agent, for a box 256 bytes.
    pub tx: UnboundedSender<Box<CloudMessage>>,
    pub connection: quinn::Connection,
}

impl Handler<AgentConnected> for FederationActor {
    type Result = Result<(u64, Welcome, DesiredState), ErrorFrame>;
    fn handle(&mut self, message: AgentConnected, _: &mut Self::Context) -> Self::Result {
        let now_ms = self.now_ms();
        let output = self
            .core
            .agent_connected(now_ms, &message.identity, message.hello);
        self.arriving = Some((message.tx, message.connection));
        let result = self.run(output).map_err(store_refusal).and_then(|r| r);
        self.arriving = None;
        result
    }
}

#[derive(Message)]
#[rtype(result = "()")]
pub struct AgentHeartbeat {
    pub name: String,
    pub session_id: u64,
    pub heartbeat: Heartbeat,
    /// When the gateway read it: the time to the handler is the federation's lag.
    pub received: std::time::Instant,
}

impl Handler<AgentHeartbeat> for FederationActor {
    type Result = ();
    fn handle(&mut self, message: AgentHeartbeat, _: &mut Self::Context) {
        self.metrics
            .histogram(
                "nephele_heartbeat_lag_seconds",
                "From the gateway reading an agent's heartbeat to the federation handling it (its mailbox wait).",
                &[],
                &[0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0],
            )
            .observe(message.received.elapsed().as_secs_f64());
        let now_ms = self.now_ms();
        let effects =
            self.core
                .heartbeat(now_ms, &message.name, message.session_id, message.heartbeat);
        self.carry_out(effects);
    }
}

/// A pool agent relays its provider's interruption notice (spot reclaim).
#[derive(Message)]
#[rtype(result = "()")]
pub struct AgentNotice {
    pub name: String,
    pub session_id: u64,
    pub notice: nephele_proto::InterruptionNotice,
}

impl Handler<AgentNotice> for FederationActor {
    type Result = ();
    fn handle(&mut self, message: AgentNotice, _: &mut Self::Context) {
        let effects = self
            .core
            .notice(&message.name, message.session_id, &message.notice);
        self.carry_out(effects);
    }
}

#[derive(Message)]
#[rtype(result = "()")]
pub struct AgentDisconnected {
    pub name: String,
    pub session_id: u64,
    pub reason: String,
}

impl Handler<AgentDisconnected> for FederationActor {
    type Result = ();
    fn handle(&mut self, message: AgentDisconnected, _: &mut Self::Context) {
        let effects = self
            .core
            .disconnected(&message.name, message.session_id, &message.reason);
        self.carry_out(effects);
    }
}

/// An enrolled agent, on its mutual-TLS session, asks for a certificate for a new key
/// before its current one expires. Signed with the device's name and role (the CSR's
/// subject is not used); accepted beside the current certificate until first used.
#[derive(Message)]
#[rtype(result = "Result<Vec<u8>, ErrorFrame>")]
pub struct RenewCertificate {
    pub device: String,
    pub csr_der: Vec<u8>,
}

impl Handler<RenewCertificate> for FederationActor {
    type Result = Result<Vec<u8>, ErrorFrame>;
    fn handle(&mut self, message: RenewCertificate, _: &mut Self::Context) -> Self::Result {
        let output = self
            .core
            .renew_certificate(&message.device, &message.csr_der);
        let result = self.run(output).map_err(store_refusal).and_then(|r| r);
        if result.is_ok() {
            self.count(
                "nephele_certificates_renewed_total",
                "Agent certificates renewed over a session.",
            );
        }
        result
    }
}

// ----------------------------------------------------------------------------------
// API messages
// ----------------------------------------------------------------------------------

impl Handler<CreateJoinToken> for FederationActor {
    type Result = Result<JoinTokenView, ApiError>;
    fn handle(&mut self, message: CreateJoinToken, _: &mut Self::Context) -> Self::Result {
        let new = NewJoinToken {
            region: message.region,
            ttl_s: message.ttl_s,
            id: random_alnum(8),
            secret: random_alnum(32),
        };
        let output = self.core.create_join_token(now_unix(), new);
        self.run(output)?
    }
}

#[derive(Message)]
#[rtype(result = "Result<Vec<JoinTokenView>, ApiError>")]
pub struct ListJoinTokens;

impl Handler<ListJoinTokens> for FederationActor {
    type Result = Result<Vec<JoinTokenView>, ApiError>;
    fn handle(&mut self, _: ListJoinTokens, _: &mut Self::Context) -> Self::Result {
        Ok(self.core.join_tokens())
    }
}

/// At most `limit` devices in name order after `after`, and how many are enrolled
/// (only the views asked for are built: a page of a large fleet costs a page).
#[derive(Message)]
#[rtype(result = "Result<(Vec<DeviceView>, usize), ApiError>")]
pub struct ListDevices {
    pub after: Option<String>,
    pub limit: usize,
    /// The asking token's tenant (`None`: an admin's, which sees everything).
    pub scope: Option<String>,
}

impl Handler<ListDevices> for FederationActor {
    type Result = Result<(Vec<DeviceView>, usize), ApiError>;
    fn handle(&mut self, message: ListDevices, _: &mut Self::Context) -> Self::Result {
        let mut views =
            self.core
                .device_views_after(self.now_ms(), message.after.as_deref(), message.limit);
        for view in &mut views {
            view.address = self.session_address(view);
            self.core.scope_device_view(view, message.scope.as_deref());
        }
        Ok((views, self.core.records.devices.len()))
    }
}

/// `GET /v1/devices/{name}`: one device, as `scope` may see it.
#[derive(Message)]
#[rtype(result = "Result<DeviceView, ApiError>")]
pub struct GetDevice {
    pub name: String,
    pub scope: Option<String>,
}

impl Handler<GetDevice> for FederationActor {
    type Result = Result<DeviceView, ApiError>;
    fn handle(&mut self, message: GetDevice, _: &mut Self::Context) -> Self::Result {
        let mut view = self.core.device_view_named(self.now_ms(), &message.name)?;
        view.address = self.session_address(&view);
        self.core
            .scope_device_view(&mut view, message.scope.as_deref());
        Ok(view)
    }
}

impl FederationActor {
    /// The peer address of the device's live session, when the connection held is
    /// the session its view names (a replaced connection's address is not shown).
    fn session_address(&self, view: &DeviceView) -> Option<String> {
        self.connections
            .get(&view.name)
            .filter(|c| Some(c.id) == view.session)
            .map(|c| c.connection.remote_address().to_string())
    }
}

impl Handler<DeleteDevice> for FederationActor {
    type Result = Result<(), ApiError>;
    fn handle(&mut self, message: DeleteDevice, _: &mut Self::Context) -> Self::Result {
        let output = self.core.delete_device(&message.0);
        let result = self.run(output)?;
        self.update_device_gauge(&message.0);
        result
    }
}

impl Message for PutModel {
    type Result = Result<ModelView, ApiError>;
}

impl Handler<PutModel> for FederationActor {
    type Result = Result<ModelView, ApiError>;
    fn handle(&mut self, message: PutModel, _: &mut Self::Context) -> Self::Result {
        let output = self.core.put_model(now_unix(), message);
        self.run(output)?
    }
}

/// The models a tenant sees (`scope`; `None`: every tenant's).
#[derive(Message)]
#[rtype(result = "Result<Vec<ModelView>, ApiError>")]
pub struct ListModels {
    pub scope: Option<String>,
}

impl Handler<ListModels> for FederationActor {
    type Result = Result<Vec<ModelView>, ApiError>;
    fn handle(&mut self, message: ListModels, _: &mut Self::Context) -> Self::Result {
        Ok(self.core.model_views_for(message.scope.as_deref()))
    }
}

/// An asynchronous push registers its build ([`FleetCore::begin_model`]).
#[derive(Message)]
#[rtype(result = "Result<Begin, ApiError>")]
pub struct BeginModel {
    pub name: String,
    pub sha256: String,
    pub size: u64,
    pub format: String,
    pub input_specs: Vec<String>,
    pub now_unix: u64,
    pub tenant: String,
}

impl Handler<BeginModel> for FederationActor {
    type Result = Result<Begin, ApiError>;
    fn handle(&mut self, message: BeginModel, _: &mut Self::Context) -> Self::Result {
        let new = NewBuild {
            name: message.name,
            tenant: message.tenant,
            sha256: message.sha256,
            size: message.size,
            format: message.format,
            input_specs: message.input_specs,
        };
        self.core.begin_model(message.now_unix, new)
    }
}

/// The build thread's progress.
#[derive(Message)]
#[rtype(result = "()")]
pub struct ModelProgress {
    pub name: String,
    pub sha256: String,
    pub progress: nephele_runtime::variants::BuildProgress,
}

impl Handler<ModelProgress> for FederationActor {
    type Result = ();
    fn handle(&mut self, message: ModelProgress, _: &mut Self::Context) {
        self.core
            .model_progress(&message.name, &message.sha256, message.progress);
    }
}

/// A build failed (kept, with the reason, until the name is pushed again).
#[derive(Message)]
#[rtype(result = "()")]
pub struct ModelFailed {
    pub name: String,
    pub sha256: String,
    pub error: String,
}

impl Handler<ModelFailed> for FederationActor {
    type Result = ();
    fn handle(&mut self, message: ModelFailed, _: &mut Self::Context) {
        self.core
            .model_failed(&message.name, &message.sha256, message.error);
    }
}

/// `GET /v1/models/{name}`: a stored model, or one being built or failed.
#[derive(Message)]
#[rtype(result = "Result<ModelView, ApiError>")]
pub struct GetModel {
    pub reference: String,
    pub scope: Option<String>,
}

impl Handler<GetModel> for FederationActor {
    type Result = Result<ModelView, ApiError>;
    fn handle(&mut self, message: GetModel, _: &mut Self::Context) -> Self::Result {
        self.core
            .model_view_for(&message.reference, message.scope.as_deref())
    }
}

/// `DELETE /v1/models/{name}`: a model version, or every version of a name.
#[derive(Message)]
#[rtype(result = "Result<Vec<ModelView>, ApiError>")]
pub struct DeleteModel {
    pub reference: String,
    pub scope: Option<String>,
}

impl Handler<DeleteModel> for FederationActor {
    type Result = Result<Vec<ModelView>, ApiError>;
    fn handle(&mut self, message: DeleteModel, _: &mut Self::Context) -> Self::Result {
        let output = self
            .core
            .delete_model(&message.reference, message.scope.as_deref());
        self.run(output)?
    }
}

/// A new deployment of `tenant`.
#[derive(Message)]
#[rtype(result = "Result<DeploymentStatus, ApiError>")]
pub struct CreateDeployment {
    pub spec: DeploymentSpec,
    pub tenant: String,
}

impl Handler<CreateDeployment> for FederationActor {
    type Result = Result<DeploymentStatus, ApiError>;
    fn handle(&mut self, message: CreateDeployment, _: &mut Self::Context) -> Self::Result {
        let output = self
            .core
            .create_deployment(now_unix(), message.spec, &message.tenant);
        self.run(output)?
    }
}

/// Replaces a deployment's spec (a change of what devices run is rolled out in steps).
#[derive(Message)]
#[rtype(result = "Result<DeploymentStatus, ApiError>")]
pub struct UpdateDeployment {
    pub name: String,
    pub spec: DeploymentSpec,
    pub scope: Option<String>,
}

impl Handler<UpdateDeployment> for FederationActor {
    type Result = Result<DeploymentStatus, ApiError>;
    fn handle(&mut self, message: UpdateDeployment, _: &mut Self::Context) -> Self::Result {
        self.core
            .owned_deployment(&message.name, message.scope.as_deref())?;
        let output = self
            .core
            .update_deployment(now_unix_ms(), &message.name, message.spec);
        self.run(output)?
    }
}

/// Pauses, resumes or rolls back a deployment's rollout.
#[derive(Message)]
#[rtype(result = "Result<DeploymentStatus, ApiError>")]
pub struct ActOnRollout {
    pub deployment: String,
    pub action: RolloutAction,
    /// Who asked, for the rollout's history.
    pub by: String,
    pub scope: Option<String>,
}

impl Handler<ActOnRollout> for FederationActor {
    type Result = Result<DeploymentStatus, ApiError>;
    fn handle(&mut self, message: ActOnRollout, _: &mut Self::Context) -> Self::Result {
        self.core
            .owned_deployment(&message.deployment, message.scope.as_deref())?;
        let output = self.core.rollout_action(
            now_unix_ms(),
            &message.deployment,
            message.action,
            &message.by,
        );
        self.run(output)?
    }
}

#[derive(Message)]
#[rtype(result = "Result<Vec<DeploymentStatus>, ApiError>")]
pub struct ListDeployments {
    pub scope: Option<String>,
    /// Each with a row per device (else the counts only).
    pub rows: bool,
}

impl Handler<ListDeployments> for FederationActor {
    type Result = Result<Vec<DeploymentStatus>, ApiError>;
    fn handle(&mut self, message: ListDeployments, _: &mut Self::Context) -> Self::Result {
        Ok(self
            .core
            .deployment_statuses_for(message.scope.as_deref(), message.rows))
    }
}

#[derive(Message)]
#[rtype(result = "Result<DeploymentStatus, ApiError>")]
pub struct GetDeployment {
    pub name: String,
    pub scope: Option<String>,
    /// With a row per device (else the counts only).
    pub rows: bool,
}

impl Handler<GetDeployment> for FederationActor {
    type Result = Result<DeploymentStatus, ApiError>;
    fn handle(&mut self, message: GetDeployment, _: &mut Self::Context) -> Self::Result {
        self.core
            .deployment_status_for(&message.name, message.scope.as_deref(), message.rows)
    }
}

#[derive(Message)]
#[rtype(result = "Result<(), ApiError>")]
pub struct DeleteDeployment {
    pub name: String,
    pub scope: Option<String>,
}

impl Handler<DeleteDeployment> for FederationActor {
    type Result = Result<(), ApiError>;
    fn handle(&mut self, message: DeleteDeployment, _: &mut Self::Context) -> Self::Result {
        self.core
            .owned_deployment(&message.name, message.scope.as_deref())?;
        let output = self.core.delete_deployment(&message.name);
        self.run(output)?
    }
}

#[derive(Message)]
#[rtype(result = "Result<Vec<RegionView>, ApiError>")]
pub struct ListRegions;

impl Handler<ListRegions> for FederationActor {
    type Result = Result<Vec<RegionView>, ApiError>;
    fn handle(&mut self, _: ListRegions, _: &mut Self::Context) -> Self::Result {
        Ok(self.core.region_views(self.now_ms()))
    }
}
