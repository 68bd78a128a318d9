//! The federation actor: the single writer of the control plane's durable state.
//!
//! It owns the [`Store`], the cluster CA and the manifest-signing key. API handlers and
//! gateway sessions send it messages; it validates, commits, and pushes each affected
//! agent its whole desired state (level-triggered, so a resend is always safe). Routing
//! of offloaded requests is the region actors' job, not this one's.

mod builds;
pub mod fleet;
pub mod usage;

use std::collections::HashMap;
use std::time::Instant;

use actix::prelude::*;
use nephele_domain::{AgentRole, FirmwareProfile, Labels};
use nephele_net::{ClusterCa, PeerIdentity};
use nephele_proto::{
    CloudMessage, DeploymentPhase, DesiredState, ErrorCode, ErrorFrame, Heartbeat, Hello,
    JoinAccepted, JoinRequest, ModelManifest, ModelVariant, TensorSpec, VariantKind, Welcome,
    PROTOCOL_VERSION,
};
use serde::Serialize;
use tokio::sync::mpsc::UnboundedSender;

pub use builds::{Begin, BeginModel, GetModel, ModelFailed, ModelProgress, ModelState};

use crate::config::CloudConfig;
use crate::region::{
    InterruptNode, PoolJoined, PoolLeft, PoolReport, RegionActor, SyncDeployments,
};
use crate::scheduler::PoolWork;
use crate::store::{
    ApiTokenRecord, DeploymentRecord, DeviceRecord, JoinTokenRecord, ModelRecord, Store, Table,
    VariantRecord,
};

pub fn now_unix() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

pub fn sha256_hex(bytes: &[u8]) -> String {
    hex::encode(ring::digest::digest(&ring::digest::SHA256, bytes).as_ref())
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

fn random_alnum(len: usize) -> String {
    use rand::Rng as _;
    const ALPHABET: &[u8] = b"abcdefghijklmnopqrstuvwxyz0123456789";
    let mut rng = rand::rng();
    (0..len)
        .map(|_| ALPHABET[rng.random_range(0..ALPHABET.len())] as char)
        .collect()
}

/// Errors the REST API maps to HTTP statuses.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ApiError {
    #[error("{0}")]
    BadRequest(String),
    #[error("{0}")]
    NotFound(String),
    #[error("{0}")]
    Conflict(String),
    #[error("{0}")]
    Unauthorized(String),
    #[error("{0}")]
    Forbidden(String),
    /// A body over its route's limit (413), saying the limit.
    #[error("{0}")]
    TooLarge(String),
    /// Too many at once (429), with the seconds to wait.
    #[error("{message}")]
    Busy { message: String, retry_after_s: u64 },
    #[error("{0}")]
    Internal(String),
    /// The control plane cannot take this now (its etcd cluster has no quorum): 503,
    /// retry later. Nothing was changed.
    #[error("{0}")]
    Unavailable(String),
}

impl From<crate::store::StoreError> for ApiError {
    fn from(error: crate::store::StoreError) -> Self {
        match error {
            crate::store::StoreError::Unavailable(_) | crate::store::StoreError::Fenced(_) => {
                ApiError::Unavailable(error.to_string())
            }
            _ => ApiError::Internal(error.to_string()),
        }
    }
}

/// A connected agent's session as the federation sees it.
struct Session {
    id: u64,
    tx: UnboundedSender<CloudMessage>,
    /// The session's QUIC connection, for the address it is reached at now (QUIC
    /// follows a device whose address changes without a new session).
    connection: quinn::Connection,
    connected_at: Instant,
    local_endpoint: String,
    role: AgentRole,
    region: String,
}

struct Telemetry {
    received_at: Instant,
    heartbeat: Heartbeat,
}

pub struct FederationActor {
    config: CloudConfig,
    store: Store,
    ca: ClusterCa,
    signing_key: ring::signature::Ed25519KeyPair,
    regions: HashMap<String, Addr<RegionActor>>,
    sessions: HashMap<String, Session>,
    telemetry: HashMap<String, Telemetry>,
    /// Per device, the link bandwidth its split cuts were last planned for (bits/s).
    planned_bps: HashMap<String, u64>,
    /// Per (device, model): batch 1's compute time of the whole model as the agent
    /// measured it (µs), from heartbeats of a deployment running `full` or a weights-only
    /// int8 variant; kept when the device moves on to a split head.
    measured_full_us: HashMap<(String, String), u64>,
    /// Per (device, model): the measured time its split cut was last planned with.
    planned_full_us: HashMap<(String, String), u64>,
    /// What each pool agent must run, as its region last said: the deployments it
    /// holds replicas of, and its job members.
    pool_work: HashMap<String, PoolWork>,
    /// Models pushed and not yet stored ([`builds`]).
    builds: HashMap<String, builds::Build>,
    /// The deployments and models, kept in step with the store ([`fleet`]).
    catalog: fleet::Catalog,
    generation: u64,
    next_session_id: u64,
    metrics: nephele_telemetry::Registry,
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
    ) -> Result<Self, crate::store::StoreError> {
        let catalog =
            fleet::Catalog::load(store.list(Table::Deployments)?, store.list(Table::Models)?);
        // Generations must grow across restarts too: start from the wall clock.
        let generation = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_millis() as u64)
            .unwrap_or(1);
        Ok(FederationActor {
            config,
            store,
            ca,
            signing_key,
            regions,
            sessions: HashMap::new(),
            telemetry: HashMap::new(),
            planned_bps: HashMap::new(),
            measured_full_us: HashMap::new(),
            planned_full_us: HashMap::new(),
            pool_work,
            builds: HashMap::new(),
            catalog,
            generation,
            next_session_id: 1,
            metrics,
        })
    }

    fn refuse(code: ErrorCode, message: impl Into<String>) -> ErrorFrame {
        ErrorFrame::new(code, message)
    }

    fn join(&mut self, request: JoinRequest) -> Result<JoinAccepted, ErrorFrame> {
        use ErrorCode::*;
        if request.protocol_version != PROTOCOL_VERSION {
            return Err(Self::refuse(
                VersionMismatch,
                format!(
                    "agent speaks protocol {}, this control plane speaks {PROTOCOL_VERSION}; upgrade the older side",
                    request.protocol_version
                ),
            ));
        }
        nephele_domain::validate_name("device", &request.name)
            .map_err(|e| Self::refuse(BadRequest, e))?;
        let role: AgentRole = request
            .role
            .parse()
            .map_err(|e: String| Self::refuse(BadRequest, e))?;
        let internal = |e: crate::store::StoreError| Self::refuse(Internal, e.to_string());
        let mut token: JoinTokenRecord = self
            .store
            .get(Table::JoinTokens, &request.token_id)
            .map_err(internal)?
            .ok_or_else(|| {
                Self::refuse(
                    Unauthorized,
                    "unknown join token; create one with `nephele token create`",
                )
            })?;
        if !constant_time_eq(
            sha256_hex(request.token_secret.as_bytes()).as_bytes(),
            token.secret_sha256.as_bytes(),
        ) {
            return Err(Self::refuse(
                Unauthorized,
                "join token secret does not match",
            ));
        }
        if let Some(device) = &token.used_by {
            return Err(Self::refuse(
                Unauthorized,
                format!("join token {} was already used by {device}; tokens are single-use, create a new one", token.id),
            ));
        }
        if now_unix() > token.expires_unix {
            return Err(Self::refuse(
                Unauthorized,
                format!("join token {} expired; create a new one", token.id),
            ));
        }
        if self
            .store
            .get::<DeviceRecord>(Table::Devices, &request.name)
            .map_err(internal)?
            .is_some()
        {
            return Err(Self::refuse(
                BadRequest,
                format!(
                    "a device named {} is already enrolled; pick another name or delete it first (`nephele device delete {}`)",
                    request.name, request.name
                ),
            ));
        }
        let mut labels = Labels::new();
        for (key, value) in &request.labels {
            nephele_domain::labels::parse_label(&format!("{key}={value}"))
                .map_err(|e| Self::refuse(BadRequest, e.to_string()))?;
            labels.insert(key.clone(), value.clone());
        }
        labels.insert("nephele.io/role".into(), role.to_string());
        labels.insert("nephele.io/region".into(), token.region.clone());
        let certificate_der = self
            .ca
            .sign_agent_csr(&request.csr_der, &request.name, role.as_str())
            .map_err(|e| Self::refuse(BadRequest, e.to_string()))?;
        // The token is spent and the device enrolled in one transaction: a crash leaves
        // both or neither, so a token is never spent for nothing, and never enrols two.
        token.used_by = Some(request.name.clone());
        let device = DeviceRecord {
            name: request.name.clone(),
            role,
            region: token.region.clone(),
            labels,
            cert_sha256: hex::encode(nephele_net::fingerprint(&certificate_der)),
            next_cert_sha256: None,
            joined_unix: now_unix(),
            profile_name: String::new(),
            profile_toml: String::new(),
        };
        let json = |e: serde_json::Error| Self::refuse(Internal, e.to_string());
        self.store
            .put_together(&[
                (
                    Table::JoinTokens,
                    &token.id,
                    serde_json::to_value(&token).map_err(json)?,
                ),
                (
                    Table::Devices,
                    &device.name,
                    serde_json::to_value(&device).map_err(json)?,
                ),
            ])
            .map_err(internal)?;
        self.metrics
            .counter(
                "nephele_agents_joined_total",
                "Agents enrolled with a join token.",
                &[],
            )
            .inc();
        tracing::info!(device = %device.name, role = %role, region = %device.region, "agent joined");
        Ok(JoinAccepted {
            agent_id: device.name,
            region: device.region,
            certificate_der,
            ca_der: self.ca.cert_der().to_vec(),
            manifest_signing_key: ring::signature::KeyPair::public_key(&self.signing_key)
                .as_ref()
                .to_vec(),
        })
    }

    /// Whether `deployment` runs on `device` ([`fleet::Catalog::runs_on`]).
    fn assignment_matches(&self, device: &DeviceRecord, deployment: &DeploymentRecord) -> bool {
        self.catalog
            .runs_on(device, deployment, self.pool_work.get(&device.name))
    }

    /// Tells every region which deployments may offload.
    fn sync_regions(&self) {
        let specs = self.catalog.replica_specs(&self.config.autoscale);
        for region in self.regions.values() {
            region.do_send(SyncDeployments(specs.clone()));
        }
    }

    /// The device's whole desired state at the current generation.
    fn desired_for(&self, device: &DeviceRecord) -> DesiredState {
        // A pool replica's profile and times matter only to a cut planned per device.
        let pool = if self.catalog.plans_split(device) {
            self.pool_replica(&device.region)
        } else {
            None
        };
        let inputs = fleet::DeviceInputs {
            pool_work: self.pool_work.get(&device.name),
            pool: pool
                .as_ref()
                .map(|(name, profile)| (name.as_str(), profile.as_str())),
            measured_full_us: Some(&self.measured_full_us),
            link: self.link_of(&device.name),
        };
        self.catalog.desired_for(device, inputs, self.generation)
    }

    /// A connected pool replica in `region` (the first by name) and its profile: what a
    /// split tail from that region runs on.
    fn pool_replica(&self, region: &str) -> Option<(String, String)> {
        let mut names: Vec<&String> = self.sessions.keys().collect();
        names.sort();
        names.into_iter().find_map(|name| {
            let device = self
                .store
                .get::<DeviceRecord>(Table::Devices, name)
                .ok()??;
            (device.role == AgentRole::Pool && device.region == region)
                .then_some((device.name, device.profile_toml))
        })
    }

    /// Keeps the whole-model compute times a heartbeat reports (deployments running
    /// `full` or a weights-only int8 variant, which computes at full's speed).
    fn record_measured_times(&mut self, name: &str, heartbeat: &Heartbeat) {
        for telemetry in &heartbeat.deployments {
            if telemetry.service_us == 0 || telemetry.phase != DeploymentPhase::Ready {
                continue;
            }
            if let Some(model) = self
                .catalog
                .whole_model_of(&telemetry.deployment, &telemetry.variant)
            {
                self.measured_full_us
                    .insert((name.to_string(), model.to_string()), telemetry.service_us);
            }
        }
    }

    /// The link a device last reported, once it has measured a transfer.
    fn link_of(&self, device: &str) -> Option<nephele_infer_policy::split::Link> {
        let link = self.telemetry.get(device)?.heartbeat.link;
        (link.bandwidth_bps > 0).then_some(nephele_infer_policy::split::Link {
            bandwidth_bps: link.bandwidth_bps as f64,
            rtt_us: link.rtt_us as f64,
        })
    }

    /// Re-plans a device's split cuts when its reported bandwidth has moved by more than
    /// the replanning threshold since the last plan, and pushes it the new desired
    /// state if it runs a `variant = "split"` deployment.
    fn replan_if_link_moved(&mut self, name: &str) {
        let Some(link) = self.link_of(name) else {
            return;
        };
        let threshold = nephele_infer_policy::split::ReplanConfig::default().relative_threshold;
        let apart = |now: f64, then: f64| (now - then).abs() > threshold * then;
        let moved_link = self
            .planned_bps
            .get(name)
            .is_none_or(|&planned| apart(link.bandwidth_bps, planned as f64));
        // A compute time measured since the last plan (or moved as much) re-plans too:
        // the first plan of a device is made from its profile's peak TOPS.
        let moved_times: Vec<((String, String), u64)> = self
            .measured_full_us
            .iter()
            .filter(|((device, _), _)| device == name)
            .filter(|(key, &us)| {
                self.planned_full_us
                    .get(*key)
                    .is_none_or(|&planned| apart(us as f64, planned as f64))
            })
            .map(|(key, &us)| (key.clone(), us))
            .collect();
        if !moved_link && moved_times.is_empty() {
            return;
        }
        self.planned_bps
            .insert(name.to_string(), link.bandwidth_bps as u64);
        self.planned_full_us.extend(moved_times);
        let Ok(Some(device)) = self.store.get::<DeviceRecord>(Table::Devices, name) else {
            return;
        };
        if !self.catalog.plans_split(&device) {
            return;
        }
        self.generation += 1;
        let desired = self.desired_for(&device);
        tracing::info!(device = %name, bandwidth_bps = link.bandwidth_bps, rtt_us = link.rtt_us, "link or measured compute time moved; split cuts re-planned");
        if let Some(session) = self.sessions.get(name) {
            let _ = session.tx.send(CloudMessage::DesiredState(desired));
        }
    }

    /// Pushes every connected agent its desired state after a change.
    fn broadcast(&mut self) {
        self.generation += 1;
        let names: Vec<String> = self.sessions.keys().cloned().collect();
        for name in names {
            let Ok(Some(device)) = self.store.get::<DeviceRecord>(Table::Devices, &name) else {
                continue;
            };
            let desired = self.desired_for(&device);
            if let Some(session) = self.sessions.get(&name) {
                let _ = session.tx.send(CloudMessage::DesiredState(desired));
            }
        }
    }

    fn update_connected_gauge(&self) {
        self.metrics
            .gauge(
                "nephele_agents_connected",
                "Agents with a live QUIC session.",
                &[],
            )
            .set(self.sessions.len() as i64);
    }
}

impl Actor for FederationActor {
    type Context = Context<Self>;

    fn started(&mut self, _: &mut Self::Context) {
        self.sync_regions();
    }
}

/// A region's word on what one pool agent must run (level-triggered: the whole list).
#[derive(Message)]
#[rtype(result = "()")]
pub struct SetPoolWork {
    pub agent: String,
    pub work: PoolWork,
}

impl Handler<SetPoolWork> for FederationActor {
    type Result = ();
    fn handle(&mut self, message: SetPoolWork, _: &mut Self::Context) {
        if self.pool_work.get(&message.agent) == Some(&message.work) {
            return;
        }
        if message.work == PoolWork::default() {
            self.pool_work.remove(&message.agent);
        } else {
            self.pool_work.insert(message.agent.clone(), message.work);
        }
        if !self.sessions.contains_key(&message.agent) {
            return;
        }
        let Ok(Some(device)) = self
            .store
            .get::<DeviceRecord>(Table::Devices, &message.agent)
        else {
            return;
        };
        self.generation += 1;
        let desired = self.desired_for(&device);
        if let Some(session) = self.sessions.get(&message.agent) {
            let _ = session.tx.send(CloudMessage::DesiredState(desired));
        }
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
        let result = self.join(message.0);
        if let Err(error) = &result {
            self.metrics
                .counter("nephele_joins_refused_total", "Join attempts refused.", &[])
                .inc();
            tracing::warn!(%error, "join refused");
        }
        result
    }
}

#[derive(Message)]
#[rtype(result = "Result<(u64, Welcome, DesiredState), ErrorFrame>")]
pub struct AgentConnected {
    pub identity: PeerIdentity,
    pub hello: Hello,
    pub tx: UnboundedSender<CloudMessage>,
    pub connection: quinn::Connection,
}

impl Handler<AgentConnected> for FederationActor {
    type Result = Result<(u64, Welcome, DesiredState), ErrorFrame>;
    fn handle(&mut self, message: AgentConnected, _: &mut Self::Context) -> Self::Result {
        use ErrorCode::*;
        let AgentConnected {
            identity,
            hello,
            tx,
            connection,
        } = message;
        if hello.protocol_version != PROTOCOL_VERSION {
            return Err(Self::refuse(
                VersionMismatch,
                format!(
                    "agent speaks protocol {}, control plane {PROTOCOL_VERSION}",
                    hello.protocol_version
                ),
            ));
        }
        let mut device: DeviceRecord = self
            .store
            .get(Table::Devices, &identity.name)
            .map_err(|e| Self::refuse(Internal, e.to_string()))?
            .ok_or_else(|| {
                Self::refuse(
                    Unauthorized,
                    format!(
                        "device {} is not enrolled (deleted?); join again with a new token",
                        identity.name
                    ),
                )
            })?;
        let presented = hex::encode(identity.cert_sha256);
        if device.next_cert_sha256.as_deref() == Some(presented.as_str()) {
            // The first connection with a renewed certificate: the old one is retired.
            device.cert_sha256 = presented;
            device.next_cert_sha256 = None;
            self.store
                .put(Table::Devices, &device.name, &device)
                .map_err(|e| Self::refuse(Internal, e.to_string()))?;
            tracing::info!(device = %device.name, "renewed certificate in use; the previous one is retired");
        } else if device.cert_sha256 != presented {
            return Err(Self::refuse(
                Unauthorized,
                "this certificate was superseded or revoked; join again",
            ));
        }
        if hello.role != device.role.as_str() {
            return Err(Self::refuse(
                BadRequest,
                format!(
                    "device {} enrolled with role {}, but runs as {}; re-join to change roles",
                    device.name, device.role, hello.role
                ),
            ));
        }
        let profile = FirmwareProfile::from_toml(&hello.profile_toml, None)
            .map_err(|e| Self::refuse(BadRequest, format!("invalid firmware profile: {e}")))?;
        if device.profile_name != hello.profile_name || device.profile_toml != hello.profile_toml {
            device.profile_name = hello.profile_name.clone();
            device.profile_toml = hello.profile_toml.clone();
            self.store
                .put(Table::Devices, &device.name, &device)
                .map_err(|e| Self::refuse(Internal, e.to_string()))?;
        }
        let session_id = self.next_session_id;
        self.next_session_id += 1;
        // A reconnect replaces the old session; dropping its sender ends its writer.
        self.sessions.insert(
            device.name.clone(),
            Session {
                id: session_id,
                tx,
                connection: connection.clone(),
                connected_at: Instant::now(),
                local_endpoint: hello.local_endpoint.clone(),
                role: device.role,
                region: device.region.clone(),
            },
        );
        if device.role == AgentRole::Pool {
            if let Some(region) = self.regions.get(&device.region) {
                let address = if hello.node.address.is_empty() {
                    hello
                        .local_endpoint
                        .rsplit_once(':')
                        .map(|(host, _)| host.trim_matches(['[', ']']).to_string())
                        .unwrap_or_default()
                } else {
                    hello.node.address.clone()
                };
                region.do_send(PoolJoined {
                    name: device.name.clone(),
                    session_id,
                    connection,
                    profile: profile.device.name.clone(),
                    address,
                    gpus: hello.node.gpus.clone(),
                    jobs: hello.jobs.clone(),
                });
            }
        }
        self.update_connected_gauge();
        tracing::info!(device = %device.name, role = %device.role, profile = %hello.profile_name, "agent connected");
        let desired = self.desired_for(&device);
        Ok((
            session_id,
            Welcome {
                agent_id: device.name.clone(),
                region: device.region.clone(),
                heartbeat_interval_ms: self.config.heartbeat_interval_ms,
            },
            desired,
        ))
    }
}

#[derive(Message)]
#[rtype(result = "()")]
pub struct AgentHeartbeat {
    pub name: String,
    pub session_id: u64,
    pub heartbeat: Heartbeat,
}

impl Handler<AgentHeartbeat> for FederationActor {
    type Result = ();
    fn handle(&mut self, message: AgentHeartbeat, _: &mut Self::Context) {
        if self.sessions.get(&message.name).map(|s| s.id) != Some(message.session_id) {
            return;
        }
        self.record_measured_times(&message.name, &message.heartbeat);
        if let Some(session) = self.sessions.get(&message.name) {
            if session.role == AgentRole::Pool {
                if let Some(region) = self.regions.get(&session.region) {
                    region.do_send(PoolReport {
                        name: message.name.clone(),
                        session_id: message.session_id,
                        deployments: message.heartbeat.deployments.clone(),
                        jobs: message.heartbeat.jobs.clone(),
                    });
                }
            }
        }
        self.telemetry.insert(
            message.name.clone(),
            Telemetry {
                received_at: Instant::now(),
                heartbeat: message.heartbeat,
            },
        );
        self.replan_if_link_moved(&message.name);
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
        if self.sessions.get(&message.name).map(|s| s.id) != Some(message.session_id) {
            return;
        }
        tracing::warn!(device = %message.name, seconds = message.notice.seconds, source = %message.notice.source, "interruption notice from a pool agent");
        let Ok(Some(device)) = self
            .store
            .get::<DeviceRecord>(Table::Devices, &message.name)
        else {
            return;
        };
        if let Some(region) = self.regions.get(&device.region) {
            region.do_send(InterruptNode {
                node: message.name,
                seconds: u64::from(message.notice.seconds),
                source: format!("from the node: {}", message.notice.source),
            });
        }
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
        if self.sessions.get(&message.name).map(|s| s.id) == Some(message.session_id) {
            self.sessions.remove(&message.name);
            tracing::info!(device = %message.name, reason = %message.reason, "agent disconnected");
        }
        for region in self.regions.values() {
            region.do_send(PoolLeft {
                name: message.name.clone(),
                session_id: message.session_id,
            });
        }
        self.update_connected_gauge();
    }
}

// ----------------------------------------------------------------------------------
// API messages and their JSON views
// ----------------------------------------------------------------------------------

#[derive(Debug, Serialize)]
pub struct JoinTokenView {
    pub id: String,
    pub region: String,
    pub expires_unix: u64,
    pub used_by: Option<String>,
    /// Only present in the response that created it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub token: Option<String>,
}

#[derive(Message)]
#[rtype(result = "Result<JoinTokenView, ApiError>")]
pub struct CreateJoinToken {
    pub region: Option<String>,
    pub ttl_s: Option<u64>,
}

impl Handler<CreateJoinToken> for FederationActor {
    type Result = Result<JoinTokenView, ApiError>;
    fn handle(&mut self, message: CreateJoinToken, _: &mut Self::Context) -> Self::Result {
        let region = message
            .region
            .unwrap_or_else(|| self.config.default_region().to_string());
        if !self.config.regions.iter().any(|r| r.name == region) {
            return Err(ApiError::BadRequest(format!(
                "unknown region {region:?}; configured regions: {}",
                self.config
                    .regions
                    .iter()
                    .map(|r| r.name.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            )));
        }
        let ttl_s = message.ttl_s.unwrap_or(self.config.join_token_ttl_s);
        if ttl_s == 0 || ttl_s > 7 * 24 * 3600 {
            return Err(ApiError::BadRequest(
                "ttl_s must be between 1 and 604800 (7 days)".into(),
            ));
        }
        let id = random_alnum(8);
        let secret = random_alnum(32);
        let now = now_unix();
        let record = JoinTokenRecord {
            id: id.clone(),
            secret_sha256: sha256_hex(secret.as_bytes()),
            region: region.clone(),
            created_unix: now,
            expires_unix: now + ttl_s,
            used_by: None,
        };
        self.store.put(Table::JoinTokens, &id, &record)?;
        let token = nephele_net::JoinToken {
            id: id.clone(),
            secret,
            ca_fingerprint: self.ca.fingerprint(),
        };
        Ok(JoinTokenView {
            id,
            region,
            expires_unix: record.expires_unix,
            used_by: None,
            token: Some(token.to_string()),
        })
    }
}

#[derive(Message)]
#[rtype(result = "Result<Vec<JoinTokenView>, ApiError>")]
pub struct ListJoinTokens;

impl Handler<ListJoinTokens> for FederationActor {
    type Result = Result<Vec<JoinTokenView>, ApiError>;
    fn handle(&mut self, _: ListJoinTokens, _: &mut Self::Context) -> Self::Result {
        let records: Vec<JoinTokenRecord> = self.store.list(Table::JoinTokens)?;
        Ok(records
            .into_iter()
            .map(|r| JoinTokenView {
                id: r.id,
                region: r.region,
                expires_unix: r.expires_unix,
                used_by: r.used_by,
                token: None,
            })
            .collect())
    }
}

#[derive(Debug, Serialize)]
pub struct AcceleratorView {
    pub kind: String,
    pub model: String,
    pub count: u32,
    pub peak_int8_tops: f64,
}

#[derive(Debug, Serialize)]
pub struct DeviceView {
    pub name: String,
    pub role: String,
    pub region: String,
    pub profile: String,
    pub labels: Labels,
    pub accelerators: Vec<AcceleratorView>,
    pub cpu_cores: u32,
    pub memory_mb: u64,
    pub online: bool,
    /// `healthy` (heartbeats on time), `stale` (late heartbeats), `offline`.
    pub health: String,
    pub last_heartbeat_ms_ago: Option<u64>,
    pub connected_for_s: Option<u64>,
    /// The session now (numbered from 1 per control-plane start): a reconnect gets a
    /// new one, an address change or a short outage that QUIC rides out keeps it.
    pub session: Option<u64>,
    /// Where the control plane reaches the device now (IP:port as it sees it; follows
    /// QUIC connection migration).
    pub address: Option<String>,
    pub rss_bytes: Option<u64>,
    /// The link to the control plane as the agent measures it (QUIC RTT; throughput of
    /// its blob transfers, 0 until one was measured).
    pub link: Option<nephele_proto::LinkReport>,
    pub local_endpoint: Option<String>,
    pub deployments: usize,
}

#[derive(Message)]
#[rtype(result = "Result<Vec<DeviceView>, ApiError>")]
pub struct ListDevices;

impl FederationActor {
    fn device_view(&self, device: &DeviceRecord) -> DeviceView {
        let profile = FirmwareProfile::from_toml(&device.profile_toml, None).ok();
        let session = self.sessions.get(&device.name);
        let telemetry = self.telemetry.get(&device.name);
        let heartbeat_age = telemetry.map(|t| t.received_at.elapsed().as_millis() as u64);
        let interval = u64::from(self.config.heartbeat_interval_ms);
        let health = match (session, heartbeat_age) {
            (None, _) => "offline",
            (Some(_), Some(age)) if age <= 3 * interval => "healthy",
            (Some(s), None) if s.connected_at.elapsed().as_millis() as u64 <= 3 * interval => {
                "healthy"
            }
            _ => "stale",
        };
        DeviceView {
            name: device.name.clone(),
            role: device.role.to_string(),
            region: device.region.clone(),
            profile: device.profile_name.clone(),
            labels: fleet::device_labels(device),
            accelerators: profile
                .as_ref()
                .map(|p| {
                    p.accelerators
                        .iter()
                        .map(|a| AcceleratorView {
                            kind: format!("{:?}", a.kind).to_lowercase(),
                            model: a.model.clone(),
                            count: a.count,
                            peak_int8_tops: a
                                .peak_tops
                                .get(&nephele_domain::Precision::Int8)
                                .copied()
                                .unwrap_or(0.0),
                        })
                        .collect()
                })
                .unwrap_or_default(),
            cpu_cores: profile.as_ref().map(|p| p.device.cpu_cores).unwrap_or(0),
            memory_mb: profile.as_ref().map(|p| p.device.memory_mb).unwrap_or(0),
            online: session.is_some(),
            health: health.into(),
            last_heartbeat_ms_ago: heartbeat_age,
            connected_for_s: session.map(|s| s.connected_at.elapsed().as_secs()),
            session: session.map(|s| s.id),
            address: session.map(|s| s.connection.remote_address().to_string()),
            rss_bytes: telemetry.map(|t| t.heartbeat.rss_bytes),
            link: telemetry.map(|t| t.heartbeat.link),
            local_endpoint: session.map(|s| s.local_endpoint.clone()),
            deployments: telemetry
                .map(|t| t.heartbeat.deployments.len())
                .unwrap_or(0),
        }
    }
}

impl Handler<ListDevices> for FederationActor {
    type Result = Result<Vec<DeviceView>, ApiError>;
    fn handle(&mut self, _: ListDevices, _: &mut Self::Context) -> Self::Result {
        let devices: Vec<DeviceRecord> = self.store.list(Table::Devices)?;
        Ok(devices.iter().map(|d| self.device_view(d)).collect())
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
        use ErrorCode::*;
        let internal = |e: crate::store::StoreError| Self::refuse(Internal, e.to_string());
        let mut device: DeviceRecord = self
            .store
            .get(Table::Devices, &message.device)
            .map_err(internal)?
            .ok_or_else(|| {
                Self::refuse(
                    Unauthorized,
                    format!("device {} is not enrolled (deleted?)", message.device),
                )
            })?;
        let certificate_der = self
            .ca
            .sign_agent_csr(&message.csr_der, &device.name, device.role.as_str())
            .map_err(|e| Self::refuse(BadRequest, e.to_string()))?;
        device.next_cert_sha256 = Some(hex::encode(nephele_net::fingerprint(&certificate_der)));
        self.store
            .put(Table::Devices, &device.name, &device)
            .map_err(internal)?;
        self.metrics
            .counter(
                "nephele_certificates_renewed_total",
                "Agent certificates renewed over a session.",
                &[],
            )
            .inc();
        tracing::info!(device = %device.name, "certificate renewed");
        Ok(certificate_der)
    }
}

#[derive(Message)]
#[rtype(result = "Result<(), ApiError>")]
pub struct DeleteDevice(pub String);

impl Handler<DeleteDevice> for FederationActor {
    type Result = Result<(), ApiError>;
    fn handle(&mut self, message: DeleteDevice, _: &mut Self::Context) -> Self::Result {
        if !self.store.delete(Table::Devices, &message.0)? {
            return Err(ApiError::NotFound(format!("no device named {}", message.0)));
        }
        // A device enrolled again under the name numbers its usage from 1 again.
        self.store.delete(Table::Usage, &message.0)?;
        // Dropping the session's sender ends its writer; the gateway then closes the
        // connection, and the agent's certificate is refused from now on.
        if let Some(session) = self.sessions.remove(&message.0) {
            let _ = session.tx.send(CloudMessage::Refused(ErrorFrame::new(
                ErrorCode::Unauthorized,
                "this device was deleted from the fleet",
            )));
        }
        self.telemetry.remove(&message.0);
        self.update_connected_gauge();
        Ok(())
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct ModelView {
    pub name: String,
    /// Always 1 for now: a name holds one file (pushing other content under it is
    /// refused), so a new version is a new name.
    pub version: u32,
    /// `building` until the variants are built and stored, then `ready`; `failed` with
    /// `error` saying why.
    pub state: ModelState,
    /// How far the build is (while `building`).
    pub progress: Option<nephele_runtime::variants::BuildProgress>,
    pub error: Option<String>,
    /// The `--input` specs applied to the file at push.
    pub input_specs: Vec<String>,
    /// Recurrent state kept per session on devices (`--state INPUT=OUTPUT`).
    pub recurrent_state: Vec<nephele_proto::StateBinding>,
    pub sha256: String,
    pub size: u64,
    pub created_unix: u64,
    pub inputs: Vec<nephele_runtime::TensorInfo>,
    pub outputs: Vec<nephele_runtime::TensorInfo>,
    /// What the variants were measured on.
    pub validation: String,
    /// Every variant built on push; those with `rejected` set are not shipped.
    pub variants: Vec<VariantRecord>,
    /// `onnx` (tract, or onnxruntime) or `candle-bert-gguf` (candle).
    pub format: String,
}

impl From<&ModelRecord> for ModelView {
    fn from(record: &ModelRecord) -> Self {
        let variants = if record.variants.is_empty() {
            vec![VariantRecord {
                name: "full".into(),
                precision: "fp32".into(),
                size: record.size,
                flops: 0,
                accuracy_pct: None,
                min_cosine: Some(1.0),
                top1_agreement: Some(1.0),
                cut: None,
                rejected: None,
                note: None,
                status: String::new(),
                reason: None,
            }]
        } else {
            record.variants.clone()
        };
        let variants = variants
            .into_iter()
            .map(|mut v| {
                v.status = if v.rejected.is_some() {
                    "rejected"
                } else {
                    "shipped"
                }
                .into();
                v.reason = v
                    .rejected
                    .clone()
                    .or_else(|| v.cut.as_ref().map(|c| c.chosen_because.clone()))
                    .or_else(|| v.note.clone())
                    .filter(|r| !r.is_empty());
                v
            })
            .collect();
        ModelView {
            name: record.name.clone(),
            version: 1,
            state: ModelState::Ready,
            progress: None,
            error: None,
            input_specs: record.input_specs.clone(),
            recurrent_state: record.recurrent_state.clone(),
            sha256: record.sha256.clone(),
            size: record.size,
            created_unix: record.created_unix,
            inputs: record.inputs.clone(),
            outputs: record.outputs.clone(),
            validation: record.validation.clone(),
            variants,
            format: record.format.clone(),
        }
    }
}

/// A model that a build (`model_build`) loaded and derived variants from, off the
/// actor's thread, with the pushed file and every shippable variant file already
/// written as blobs: the actor only signs and records the manifest.
#[derive(Message)]
#[rtype(result = "Result<ModelView, ApiError>")]
pub struct PutModel {
    pub name: String,
    pub bytes: Vec<u8>,
    pub inputs: Vec<nephele_runtime::TensorInfo>,
    pub outputs: Vec<nephele_runtime::TensorInfo>,
    pub variants: nephele_runtime::variants::VariantSet,
    /// What the variants were measured on, e.g. `360 labelled rows`.
    pub validation: String,
    /// The manifest format: `nephele_runtime::FORMAT_ONNX` or `FORMAT_CANDLE_BERT`.
    pub format: String,
    /// The `--input` specs applied to the file (already in `bytes`).
    pub input_specs: Vec<String>,
    /// Recurrent state (`--state INPUT=OUTPUT`), checked against the model.
    pub recurrent_state: Vec<nephele_proto::StateBinding>,
}

fn sha256_of(bytes: &[u8]) -> [u8; 32] {
    let digest = ring::digest::digest(&ring::digest::SHA256, bytes);
    let mut sha256 = [0u8; 32];
    sha256.copy_from_slice(digest.as_ref());
    sha256
}

/// The manifest entry of a shippable variant (its files are stored by the caller).
fn manifest_variant(variant: &nephele_runtime::variants::BuiltVariant) -> Option<ModelVariant> {
    let first = variant.files.first()?;
    let kind = match (&variant.cut, variant.name.as_str()) {
        (Some(cut), _) => {
            let tail = variant.files.get(1)?;
            VariantKind::Split {
                cut: cut.tensor.clone(),
                activation_bytes: cut.activation_bytes,
                head_flops: cut.head_flops,
                tail_flops: cut.tail_flops,
                tail_sha256: sha256_of(tail),
                tail_size: tail.len() as u64,
            }
        }
        (None, "int8") => VariantKind::Int8Weights,
        (None, _) => VariantKind::Full,
    };
    Some(ModelVariant {
        name: variant.name.clone(),
        kind,
        precision: variant.precision.clone(),
        sha256: sha256_of(first),
        size: first.len() as u64,
        accuracy: variant.accuracy.map(|a| (a / 100.0) as f32),
        min_cosine: variant.agreement.map(|a| a.min_cosine as f32),
        flops: variant.flops,
    })
}

impl Handler<PutModel> for FederationActor {
    type Result = Result<ModelView, ApiError>;
    fn handle(&mut self, message: PutModel, _: &mut Self::Context) -> Self::Result {
        nephele_domain::validate_name("model", &message.name).map_err(ApiError::BadRequest)?;
        let sha256 = sha256_of(&message.bytes);
        let sha_hex = hex::encode(sha256);
        if let Some(existing) = self
            .store
            .get::<ModelRecord>(Table::Models, &message.name)?
        {
            if existing.sha256 == sha_hex {
                return Ok(ModelView::from(&existing));
            }
            return Err(ApiError::Conflict(format!(
                "model {} already exists with different content; upload under a new name (e.g. {}-v2)",
                message.name, message.name
            )));
        }
        let spec = |info: &nephele_runtime::TensorInfo| TensorSpec {
            name: info.name.clone(),
            shape: info.shape.clone(),
            dtype: info.dtype.clone(),
        };
        let mut shipped = Vec::new();
        for variant in message.variants.shippable() {
            let Some(entry) = manifest_variant(variant) else {
                continue;
            };
            shipped.push(entry);
        }
        if !shipped.iter().any(|v| v.kind == VariantKind::Full) {
            // The builder always ships the pushed file; keep the invariant explicit.
            shipped.insert(
                0,
                ModelVariant {
                    name: "full".into(),
                    kind: VariantKind::Full,
                    precision: "fp32".into(),
                    sha256,
                    size: message.bytes.len() as u64,
                    accuracy: None,
                    min_cosine: Some(1.0),
                    flops: 0,
                },
            );
        }
        let manifest = ModelManifest {
            name: message.name.clone(),
            format: message.format.clone(),
            created_unix: now_unix(),
            inputs: message.inputs.iter().map(spec).collect(),
            outputs: message.outputs.iter().map(spec).collect(),
            validation: message.validation.clone(),
            variants: shipped,
            state: message.recurrent_state.clone(),
        };
        let manifest_bytes = nephele_proto::encode_payload(&manifest)
            .map_err(|e| ApiError::Internal(e.to_string()))?;
        let signature = self.signing_key.sign(&manifest_bytes).as_ref().to_vec();
        let record = ModelRecord {
            name: message.name.clone(),
            sha256: sha_hex,
            size: message.bytes.len() as u64,
            created_unix: manifest.created_unix,
            inputs: message.inputs,
            outputs: message.outputs,
            signed_manifest: manifest_bytes,
            signature,
            variants: message
                .variants
                .variants
                .iter()
                .map(|v| VariantRecord {
                    name: v.name.clone(),
                    precision: v.precision.clone(),
                    size: v.size(),
                    flops: v.flops,
                    accuracy_pct: v.accuracy,
                    min_cosine: v.agreement.map(|a| a.min_cosine),
                    top1_agreement: v.agreement.map(|a| a.top1_agreement),
                    cut: v.cut.clone(),
                    rejected: v.rejected.clone(),
                    note: v
                        .quantization
                        .as_ref()
                        .and_then(nephele_runtime::mixed_precision::summary),
                    status: String::new(),
                    reason: None,
                })
                .collect(),
            validation: message.validation,
            format: message.format,
            input_specs: message.input_specs,
            recurrent_state: message.recurrent_state,
        };
        self.store.put(Table::Models, &record.name, &record)?;
        self.catalog.put_model(record.clone());
        self.builds.remove(&record.name);
        tracing::info!(
            model = %record.name,
            sha256 = %record.sha256,
            size = record.size,
            variants = manifest.variants.len(),
            "model stored"
        );
        Ok(ModelView::from(&record))
    }
}

#[derive(Message)]
#[rtype(result = "Result<Vec<ModelView>, ApiError>")]
pub struct ListModels;

impl Handler<ListModels> for FederationActor {
    type Result = Result<Vec<ModelView>, ApiError>;
    fn handle(&mut self, _: ListModels, _: &mut Self::Context) -> Self::Result {
        let records: Vec<ModelRecord> = self.store.list(Table::Models)?;
        let mut views: Vec<ModelView> = records.iter().map(ModelView::from).collect();
        views.extend(self.build_views());
        Ok(views)
    }
}

#[derive(Debug, Clone, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DeploymentSpec {
    pub name: String,
    pub model: String,
    #[serde(default)]
    pub selector: String,
    #[serde(default = "default_slo_ms")]
    pub slo_ms: u32,
    #[serde(default = "default_true")]
    pub offload: bool,
    #[serde(default = "default_max_queue")]
    pub max_queue: u32,
    /// `auto` (chosen per device from its profile) or a variant name of the model.
    #[serde(default = "default_variant")]
    pub variant: String,
    /// Re-ask the cloud when the local answer's top-class probability is below this.
    #[serde(default)]
    pub hard_example_threshold: Option<f32>,
    /// Its cloud replicas: priority, bounds, latency target and size (each absent
    /// field takes the `[autoscale]` default).
    #[serde(default)]
    pub replicas: crate::store::ReplicaSettings,
}

fn default_variant() -> String {
    "auto".into()
}

fn default_slo_ms() -> u32 {
    50
}
fn default_true() -> bool {
    true
}
fn default_max_queue() -> u32 {
    64
}

#[derive(Message)]
#[rtype(result = "Result<DeploymentStatus, ApiError>")]
pub struct CreateDeployment(pub DeploymentSpec);

impl Handler<CreateDeployment> for FederationActor {
    type Result = Result<DeploymentStatus, ApiError>;
    fn handle(&mut self, message: CreateDeployment, _: &mut Self::Context) -> Self::Result {
        let record = self.catalog.validate(message.0, now_unix())?;
        self.store.put(Table::Deployments, &record.name, &record)?;
        self.catalog.put_deployment(record.clone());
        tracing::info!(deployment = %record.name, model = %record.model, selector = %record.selector, "deployment created");
        self.broadcast();
        self.sync_regions();
        self.deployment_status(&record)
    }
}

#[derive(Debug, Serialize)]
pub struct DeviceDeploymentStatus {
    pub device: String,
    pub role: String,
    pub profile: String,
    pub online: bool,
    pub phase: String,
    pub ready: bool,
    pub variant: String,
    pub served_local: u64,
    pub served_offloaded: u64,
    pub failed: u64,
    pub queue_len: u32,
    /// Batch 1's compute time the agent measured for its variant when it loaded it.
    pub service_ms: f64,
    pub p50_ms: f64,
    pub p99_ms: f64,
}

#[derive(Debug, Serialize)]
pub struct DeploymentStatus {
    pub name: String,
    pub model: String,
    pub selector: String,
    pub slo_ms: u32,
    pub offload: bool,
    pub max_queue: u32,
    /// What the deployment asked for: `auto` or a variant name.
    pub variant: String,
    pub hard_example_threshold: Option<f32>,
    pub desired_devices: usize,
    pub ready_devices: usize,
    pub devices: Vec<DeviceDeploymentStatus>,
}

impl FederationActor {
    fn deployment_status(
        &self,
        deployment: &DeploymentRecord,
    ) -> Result<DeploymentStatus, ApiError> {
        let devices: Vec<DeviceRecord> = self.store.list(Table::Devices)?;
        let mut rows = Vec::new();
        for device in devices
            .iter()
            .filter(|d| self.assignment_matches(d, deployment))
        {
            let telemetry = self.telemetry.get(&device.name).and_then(|t| {
                t.heartbeat
                    .deployments
                    .iter()
                    .find(|d| d.deployment == deployment.name)
            });
            let phase = match telemetry.map(|t| &t.phase) {
                None => "pending".to_string(),
                Some(DeploymentPhase::Pending) => "pending".into(),
                Some(DeploymentPhase::Downloading) => "downloading".into(),
                Some(DeploymentPhase::Ready) => "ready".into(),
                Some(DeploymentPhase::Failed(reason)) => format!("failed: {reason}"),
            };
            let online = self.sessions.contains_key(&device.name);
            rows.push(DeviceDeploymentStatus {
                device: device.name.clone(),
                role: device.role.to_string(),
                profile: device.profile_name.clone(),
                online,
                ready: online && phase == "ready",
                phase,
                variant: telemetry.map(|t| t.variant.clone()).unwrap_or_default(),
                served_local: telemetry.map(|t| t.served_local).unwrap_or(0),
                served_offloaded: telemetry.map(|t| t.served_offloaded).unwrap_or(0),
                failed: telemetry.map(|t| t.failed).unwrap_or(0),
                queue_len: telemetry.map(|t| t.queue_len).unwrap_or(0),
                service_ms: telemetry
                    .map(|t| t.service_us as f64 / 1000.0)
                    .unwrap_or(0.0),
                p50_ms: telemetry.map(|t| t.p50_us as f64 / 1000.0).unwrap_or(0.0),
                p99_ms: telemetry.map(|t| t.p99_us as f64 / 1000.0).unwrap_or(0.0),
            });
        }
        let edge_rows = rows.iter().filter(|r| r.role == "edge");
        Ok(DeploymentStatus {
            name: deployment.name.clone(),
            model: deployment.model.clone(),
            selector: deployment.selector.clone(),
            slo_ms: deployment.slo_ms,
            offload: deployment.offload,
            max_queue: deployment.max_queue,
            variant: deployment.variant.clone(),
            hard_example_threshold: deployment.hard_example_threshold,
            desired_devices: edge_rows.clone().count(),
            ready_devices: edge_rows.filter(|r| r.ready).count(),
            devices: rows,
        })
    }
}

#[derive(Message)]
#[rtype(result = "Result<Vec<DeploymentStatus>, ApiError>")]
pub struct ListDeployments;

impl Handler<ListDeployments> for FederationActor {
    type Result = Result<Vec<DeploymentStatus>, ApiError>;
    fn handle(&mut self, _: ListDeployments, _: &mut Self::Context) -> Self::Result {
        self.catalog
            .deployments()
            .map(|r| self.deployment_status(r))
            .collect()
    }
}

#[derive(Message)]
#[rtype(result = "Result<DeploymentStatus, ApiError>")]
pub struct GetDeployment(pub String);

impl Handler<GetDeployment> for FederationActor {
    type Result = Result<DeploymentStatus, ApiError>;
    fn handle(&mut self, message: GetDeployment, _: &mut Self::Context) -> Self::Result {
        let record = self
            .catalog
            .deployment(&message.0)
            .ok_or_else(|| ApiError::NotFound(format!("no deployment named {}", message.0)))?;
        self.deployment_status(record)
    }
}

#[derive(Message)]
#[rtype(result = "Result<(), ApiError>")]
pub struct DeleteDeployment(pub String);

impl Handler<DeleteDeployment> for FederationActor {
    type Result = Result<(), ApiError>;
    fn handle(&mut self, message: DeleteDeployment, _: &mut Self::Context) -> Self::Result {
        if !self.store.delete(Table::Deployments, &message.0)? {
            return Err(ApiError::NotFound(format!(
                "no deployment named {}",
                message.0
            )));
        }
        self.catalog.remove_deployment(&message.0);
        tracing::info!(deployment = %message.0, "deployment deleted");
        self.broadcast();
        self.sync_regions();
        Ok(())
    }
}

/// Who an API token speaks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Principal {
    pub role: String,
    pub tenant: String,
}

impl Principal {
    /// Admins act for every tenant; other roles only for their own.
    pub fn is_admin(&self) -> bool {
        self.role == "admin"
    }
}

/// Checks an API bearer token; returns its role and tenant.
#[derive(Message)]
#[rtype(result = "Option<Principal>")]
pub struct Authenticate(pub String);

impl Handler<Authenticate> for FederationActor {
    type Result = Option<Principal>;
    fn handle(&mut self, message: Authenticate, _: &mut Self::Context) -> Self::Result {
        let (id, _) = message.0.split_once('.')?;
        let record: ApiTokenRecord = self.store.get(Table::ApiTokens, id).ok()??;
        constant_time_eq(
            sha256_hex(message.0.as_bytes()).as_bytes(),
            record.sha256.as_bytes(),
        )
        .then_some(Principal {
            role: record.role,
            tenant: record.tenant,
        })
    }
}

/// Creates the first admin API token if there is none. Returns it (once).
pub fn ensure_admin_token(store: &Store) -> Result<Option<String>, crate::store::StoreError> {
    let existing: Vec<ApiTokenRecord> = store.list(Table::ApiTokens)?;
    if !existing.is_empty() {
        return Ok(None);
    }
    let id = random_alnum(8);
    let token = format!("{id}.{}", random_alnum(40));
    store.put(
        Table::ApiTokens,
        &id,
        &ApiTokenRecord {
            id: id.clone(),
            sha256: sha256_hex(token.as_bytes()),
            role: "admin".into(),
            tenant: "default".into(),
            created_unix: now_unix(),
        },
    )?;
    Ok(Some(token))
}

#[derive(Debug, Serialize)]
pub struct RegionView {
    pub name: String,
    pub carbon_zone: Option<String>,
    pub pools: Vec<crate::config::PoolConfig>,
    pub devices: usize,
    pub online: usize,
}

#[derive(Message)]
#[rtype(result = "Result<Vec<RegionView>, ApiError>")]
pub struct ListRegions;

impl Handler<ListRegions> for FederationActor {
    type Result = Result<Vec<RegionView>, ApiError>;
    fn handle(&mut self, _: ListRegions, _: &mut Self::Context) -> Self::Result {
        let devices: Vec<DeviceRecord> = self.store.list(Table::Devices)?;
        Ok(self
            .config
            .regions
            .iter()
            .map(|region| {
                let in_region: Vec<&DeviceRecord> =
                    devices.iter().filter(|d| d.region == region.name).collect();
                RegionView {
                    name: region.name.clone(),
                    carbon_zone: region.carbon_zone.clone(),
                    pools: region.pools.clone(),
                    devices: in_region.len(),
                    online: in_region
                        .iter()
                        .filter(|d| self.sessions.contains_key(&d.name))
                        .count(),
                }
            })
            .collect())
    }
}
