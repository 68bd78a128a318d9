//! The federation core: the fleet's state and its rules, without IO.
//!
//! It holds a mirror of the fleet's durable records (join tokens, devices, models,
//! deployments, API tokens, usage totals), loaded once at start and changed only by its
//! own writes, plus what lives only while the control plane runs (agent sessions,
//! telemetry, measured link and compute times, the pool work regions placed, model
//! builds in flight). Every command is a method: it takes the time as an argument and
//! returns an [`Output`]: the reply, the writes to persist, and the effects to carry out
//! once they are durable (send an agent its desired state, tell a region about a pool
//! agent). The actor ([`super::FederationActor`]) is its shell: it commits the writes
//! through a [`super::fleet_store::FleetStore`] and, if the commit fails, calls
//! [`FleetCore::rollback`], which undoes everything the command changed, so the mirror
//! never holds what the store does not; the reply becomes the store's error and no
//! effect is carried out.
//!
//! Agent session and heartbeat commands are here; API commands are in `fleet_core_api.rs`,
//! model builds in `builds.rs`.

use std::collections::{BTreeMap, HashMap};

use nephele_domain::{AgentRole, FirmwareProfile, Labels};
use nephele_net::PeerIdentity;
use nephele_proto::{
    CloudMessage, DeploymentPhase, DeploymentTelemetry, DesiredState, ErrorCode, ErrorFrame,
    GpuReport, Heartbeat, Hello, InterruptionNotice, JobMemberStatus, JoinAccepted, JoinRequest,
    Welcome, PROTOCOL_VERSION,
};

use super::authority::Authority;
use super::builds::Build;
use super::fleet::{self, Catalog};
use super::fleet_store::{Record, Snapshot, Write};
use super::profiles::ProfileCache;
use super::usage::{Counting, UsageHour, UsageTotals, USAGE_RETENTION_HOURS};
use super::{constant_time_eq, sha256_hex};
use crate::config::CloudConfig;
use crate::scheduler::{PoolWork, ReplicaSpec};
use crate::store::{
    ApiTokenRecord, AuditRecord, DeviceRecord, JoinTokenRecord, Table, TenantRecord,
};
use crate::variants::Caps;

/// What a command asks of the shell.
#[derive(Debug)]
pub struct Output<R> {
    pub reply: R,
    /// Commit these (all or nothing) before anything else; on failure, roll back.
    pub persist: Vec<Write>,
    /// Carry these out, in order, once `persist` is durable.
    pub effects: Vec<Effect>,
}

#[derive(Debug, Clone)]
pub enum Effect {
    /// Send a message on a device's session.
    Send {
        device: String,
        session: u64,
        message: CloudMessage,
    },
    /// The connection this command came with is now the device's session `session`
    /// (one it had before is replaced and ends).
    Register { device: String, session: u64 },
    /// End the device's session (its writer stops; the gateway closes the connection).
    EndSession { device: String, session: u64 },
    /// Tell a region.
    Region(RegionNote),
    /// Remove these blobs (hex sha256) from the blob store: the model versions that
    /// shipped them were deleted and nothing left ships them.
    DeleteBlobs { sha256s: Vec<String> },
}

/// What a region is told.
#[derive(Debug, Clone)]
pub enum RegionNote {
    /// A pool agent connected (the shell adds its connection).
    PoolJoined {
        region: String,
        name: String,
        session_id: u64,
        profile: String,
        address: String,
        gpus: Vec<GpuReport>,
        jobs: Vec<JobMemberStatus>,
    },
    /// A pool agent's heartbeat.
    PoolReport {
        region: String,
        name: String,
        session_id: u64,
        deployments: Vec<DeploymentTelemetry>,
        jobs: Vec<JobMemberStatus>,
    },
    /// A node's interruption notice (spot reclaim).
    Interrupt {
        region: String,
        node: String,
        seconds: u64,
        source: String,
    },
    /// An agent's session ended (every region).
    PoolLeft { name: String, session_id: u64 },
    /// The deployments that may offload, with their latency targets (every region).
    Sync(Vec<(ReplicaSpec, u32)>),
    /// A tenant created, changed or deleted (every region).
    Tenant {
        tenant: crate::config::TenantConfig,
        removed: bool,
    },
}

/// A connected agent's session as the core sees it.
#[derive(Debug, Clone)]
pub struct SessionInfo {
    pub id: u64,
    pub connected_ms: u64,
    pub local_endpoint: String,
    pub role: AgentRole,
    pub region: String,
    /// What the last desired state sent on this session said ([`desired_fingerprint`]):
    /// a change that leaves a device's state as it was sends it nothing.
    pub sent: Option<[u8; 16]>,
}

/// The content of a desired state (its assignments and jobs, not its generation) in
/// 16 bytes of SHA-256; `None` when it cannot be encoded (it is then always sent, and
/// the session's writer reports why it cannot go).
pub(super) fn desired_fingerprint(desired: &DesiredState) -> Option<[u8; 16]> {
    let bytes = nephele_proto::encode_payload(&(&desired.assignments, &desired.jobs)).ok()?;
    let digest = ring::digest::digest(&ring::digest::SHA256, &bytes);
    digest.as_ref()[..16].try_into().ok()
}

#[derive(Debug, Clone)]
pub(super) struct Telemetry {
    pub received_ms: u64,
    pub heartbeat: Heartbeat,
}

/// How to undo one change a command made (newest first).
#[derive(Debug)]
enum Undo {
    Record(Write),
    Session(String, Option<SessionInfo>),
    Telemetry(String, Option<Box<Telemetry>>),
    Build(String, Option<Build>),
}

/// The durable records the core mirrors (models and deployments are in the
/// [`Catalog`]).
#[derive(Debug, Default)]
pub(super) struct Records {
    pub join_tokens: BTreeMap<String, JoinTokenRecord>,
    pub devices: BTreeMap<String, DeviceRecord>,
    pub api_tokens: BTreeMap<String, ApiTokenRecord>,
    pub usage: BTreeMap<String, UsageTotals>,
    /// The newest audit entries, by key (at most `fleet_core_access::AUDIT_KEPT`).
    pub audit: BTreeMap<String, AuditRecord>,
    /// What devices served per deployment and hour, by [`UsageHour::key`].
    pub usage_hours: BTreeMap<String, UsageHour>,
    /// Tenants by name.
    pub tenants: BTreeMap<String, TenantRecord>,
}

pub struct FleetCore {
    pub(super) config: CloudConfig,
    pub(super) authority: Box<dyn Authority + Send + Sync>,
    pub(super) records: Records,
    pub(super) catalog: Catalog,
    /// Each device's capabilities and hardware, worked out from its profile when its
    /// record is loaded or written (not per deployment on every broadcast, nor per
    /// device on every read of the fleet).
    pub(super) profiles: ProfileCache,
    pub(super) sessions: BTreeMap<String, SessionInfo>,
    pub(super) telemetry: HashMap<String, Telemetry>,
    /// Per device, the link bandwidth its split cuts were last planned for (bits/s).
    planned_bps: HashMap<String, u64>,
    /// Per (device, model): batch 1's compute time of the whole model as the agent
    /// measured it (µs), from heartbeats of a deployment running `full` or a weights-only
    /// int8 variant; kept when the device moves on to a split head.
    measured_full_us: HashMap<(String, String), u64>,
    /// Per (device, model): the measured time its split cut was last planned with.
    planned_full_us: HashMap<(String, String), u64>,
    /// What each pool agent must run, as its region last said.
    pool_work: HashMap<String, PoolWork>,
    /// Models pushed and not yet stored.
    pub(super) builds: HashMap<String, Build>,
    generation: u64,
    next_session_id: u64,
    /// The current command's writes, and how to undo its changes.
    pending: Vec<Write>,
    journal: Vec<Undo>,
}

fn refuse(code: ErrorCode, message: impl Into<String>) -> ErrorFrame {
    ErrorFrame::new(code, message)
}

impl FleetCore {
    /// The core over what the store holds. `first_generation` must exceed every
    /// generation an earlier run sent (the shell passes the wall clock in ms);
    /// `pool_work` is what the regions restored from their books.
    pub fn new(
        config: CloudConfig,
        authority: Box<dyn Authority + Send + Sync>,
        snapshot: Snapshot,
        first_generation: u64,
        pool_work: HashMap<String, PoolWork>,
    ) -> FleetCore {
        let Snapshot {
            join_tokens,
            devices,
            models,
            deployments,
            api_tokens,
            usage,
            audit,
            usage_hours,
            tenants,
        } = snapshot;
        let records = Records {
            join_tokens: join_tokens.into_iter().map(|r| (r.id.clone(), r)).collect(),
            devices: devices.into_iter().map(|r| (r.name.clone(), r)).collect(),
            api_tokens: api_tokens.into_iter().map(|r| (r.id.clone(), r)).collect(),
            usage: usage.into_iter().map(|r| (r.device.clone(), r)).collect(),
            audit: audit.into_iter().map(|r| (r.key(), r)).collect(),
            usage_hours: usage_hours.into_iter().map(|r| (r.key(), r)).collect(),
            tenants: tenants
                .into_iter()
                .map(|r| (r.tenant.name.clone(), r))
                .collect(),
        };
        // The shell writes the config's tenants before it loads the snapshot; a core
        // made from anything else (a test's) gets them in memory alike.
        let mut records = records;
        for record in super::seeded_tenants(&config, &records.tenants, 0) {
            records.tenants.insert(record.tenant.name.clone(), record);
        }
        let mut profiles = ProfileCache::default();
        for device in records.devices.values() {
            profiles.set(&device.name, &device.profile_toml);
        }
        FleetCore {
            config,
            authority,
            records,
            profiles,
            catalog: Catalog::load(deployments, models),
            sessions: BTreeMap::new(),
            telemetry: HashMap::new(),
            planned_bps: HashMap::new(),
            measured_full_us: HashMap::new(),
            planned_full_us: HashMap::new(),
            pool_work,
            builds: HashMap::new(),
            generation: first_generation,
            next_session_id: 1,
            pending: Vec::new(),
            journal: Vec::new(),
        }
    }

    // ------------------------------------------------------------------------------
    // Changes, journalled so a failed commit can be undone
    // ------------------------------------------------------------------------------

    /// Starts a command: what the last one changed is now durable (or had no writes).
    pub(super) fn begin(&mut self) {
        self.pending.clear();
        self.journal.clear();
    }

    /// Ends a command with its reply and effects, handing over its writes.
    pub(super) fn finish<R>(&mut self, reply: R, effects: Vec<Effect>) -> Output<R> {
        Output {
            reply,
            persist: std::mem::take(&mut self.pending),
            effects,
        }
    }

    /// A command whose only outputs are its reply and its writes (no effects).
    pub(super) fn writes_only<R>(&mut self, command: impl FnOnce(&mut Self) -> R) -> Output<R> {
        self.begin();
        let reply = command(self);
        self.finish(reply, Vec::new())
    }

    /// The last command's writes could not be committed: undo everything it changed.
    pub fn rollback(&mut self) {
        self.pending.clear();
        while let Some(undo) = self.journal.pop() {
            match undo {
                Undo::Record(write) => {
                    self.apply(&write);
                }
                Undo::Session(name, Some(session)) => {
                    self.sessions.insert(name, session);
                }
                Undo::Session(name, None) => {
                    self.sessions.remove(&name);
                }
                Undo::Telemetry(name, Some(telemetry)) => {
                    self.telemetry.insert(name, *telemetry);
                }
                Undo::Telemetry(name, None) => {
                    self.telemetry.remove(&name);
                }
                Undo::Build(name, Some(build)) => {
                    self.builds.insert(name, build);
                }
                Undo::Build(name, None) => {
                    self.builds.remove(&name);
                }
            }
        }
    }

    /// Writes a record: into the mirror now, to the store by the shell.
    /// What the last command changed of what watches follow (devices, models,
    /// deployments), as (kind, name, action, tenant, region): read from its journal,
    /// so a delete still knows the tenant and region of what it deleted.
    pub fn watched_changes(&self) -> Vec<crate::watch::Change> {
        use crate::watch::{Change, Kind};
        let mut changes: Vec<Change> = Vec::new();
        for undo in &self.journal {
            let Undo::Record(undo) = undo else { continue };
            let (table, key) = (undo.table(), undo.key().to_string());
            let before = match undo {
                Write::Put(record) => Some(record),
                Write::Delete(..) => None,
            };
            let (kind, name, exists, tenant, region) = match table {
                Table::Devices => {
                    let now = self.records.devices.get(&key);
                    let region = now.map(|d| d.region.clone()).or_else(|| match before {
                        Some(Record::Device(d)) => Some(d.region.clone()),
                        _ => None,
                    });
                    (Kind::Device, key.clone(), now.is_some(), None, region)
                }
                Table::Models => {
                    let now = self.catalog.model(&key);
                    let (name, tenant) = match (now, before) {
                        (Some(m), _) => (m.name.clone(), Some(m.tenant.clone())),
                        (None, Some(Record::Model(m))) => (m.name.clone(), Some(m.tenant.clone())),
                        _ => (key.clone(), None),
                    };
                    (Kind::Model, name, now.is_some(), tenant, None)
                }
                Table::Deployments => {
                    let now = self.catalog.deployment(&key);
                    let tenant = match (now, before) {
                        (Some(d), _) => Some(d.tenant.clone()),
                        (None, Some(Record::Deployment(d))) => Some(d.tenant.clone()),
                        _ => None,
                    };
                    (Kind::Deployment, key.clone(), now.is_some(), tenant, None)
                }
                _ => continue,
            };
            let action = if exists { "put" } else { "delete" };
            if !changes
                .iter()
                .any(|c| c.kind == kind && c.name == name && c.action == action)
            {
                changes.push(Change {
                    kind,
                    name,
                    action,
                    tenant,
                    region,
                });
            }
        }
        changes
    }

    pub(super) fn write(&mut self, write: Write) {
        let undo = self.apply(&write);
        self.journal.push(Undo::Record(undo));
        self.pending.push(write);
    }

    pub(super) fn set_session(&mut self, name: &str, session: Option<SessionInfo>) {
        let before = match session {
            Some(session) => self.sessions.insert(name.to_string(), session),
            None => self.sessions.remove(name),
        };
        self.journal.push(Undo::Session(name.to_string(), before));
    }

    pub(super) fn remove_telemetry(&mut self, name: &str) {
        let before = self.telemetry.remove(name).map(Box::new);
        self.journal.push(Undo::Telemetry(name.to_string(), before));
    }

    pub(super) fn set_build(&mut self, name: &str, build: Option<Build>) {
        let before = match build {
            Some(build) => self.builds.insert(name.to_string(), build),
            None => self.builds.remove(name),
        };
        self.journal.push(Undo::Build(name.to_string(), before));
    }

    /// Applies a write to the mirror; returns the write that undoes it.
    fn apply(&mut self, write: &Write) -> Write {
        let table = write.table();
        let key = write.key().to_string();
        let record = match write {
            Write::Put(record) => Some(record.clone()),
            Write::Delete(..) => None,
        };
        let before: Option<Record> = match table {
            Table::JoinTokens => {
                replace(&mut self.records.join_tokens, &key, record, |r| match r {
                    Record::JoinToken(r) => Some(r),
                    _ => None,
                })
                .map(Record::JoinToken)
            }
            Table::Devices => {
                let before = replace(&mut self.records.devices, &key, record, |r| match r {
                    Record::Device(r) => Some(r),
                    _ => None,
                });
                match self.records.devices.get(&key) {
                    Some(now) if !self.profiles.holds(&key, &now.profile_toml) => {
                        self.profiles.set(&key, &now.profile_toml);
                    }
                    Some(_) => {}
                    None => self.profiles.remove(&key),
                }
                before.map(Record::Device)
            }
            Table::ApiTokens => replace(&mut self.records.api_tokens, &key, record, |r| match r {
                Record::ApiToken(r) => Some(r),
                _ => None,
            })
            .map(Record::ApiToken),
            Table::Usage => replace(&mut self.records.usage, &key, record, |r| match r {
                Record::Usage(r) => Some(r),
                _ => None,
            })
            .map(Record::Usage),
            Table::Audit => replace(&mut self.records.audit, &key, record, |r| match r {
                Record::Audit(r) => Some(r),
                _ => None,
            })
            .map(Record::Audit),
            Table::UsageHours => {
                replace(&mut self.records.usage_hours, &key, record, |r| match r {
                    Record::UsageHour(r) => Some(r),
                    _ => None,
                })
                .map(Record::UsageHour)
            }
            Table::Tenants => replace(&mut self.records.tenants, &key, record, |r| match r {
                Record::Tenant(r) => Some(r),
                _ => None,
            })
            .map(Record::Tenant),
            Table::Models => {
                let before = self.catalog.model(&key).cloned();
                match record {
                    Some(Record::Model(model)) => self.catalog.put_model(*model),
                    _ => {
                        self.catalog.remove_model(&key);
                    }
                }
                before.map(|m| Record::Model(Box::new(m)))
            }
            Table::Deployments => {
                let before = self.catalog.deployment(&key).cloned();
                match record {
                    Some(Record::Deployment(deployment)) => self.catalog.put_deployment(deployment),
                    _ => {
                        self.catalog.remove_deployment(&key);
                    }
                }
                before.map(Record::Deployment)
            }
            Table::Meta
            | Table::RegionJobs
            | Table::RegionNodes
            | Table::RegionState
            | Table::RegionLedger => None,
        };
        match before {
            Some(record) => Write::Put(record),
            None => Write::Delete(table, key),
        }
    }

    // ------------------------------------------------------------------------------
    // Desired state
    // ------------------------------------------------------------------------------

    /// The device's whole desired state at the current generation.
    pub(super) fn desired_for(&self, device: &DeviceRecord) -> DesiredState {
        // A pool replica's profile and times matter only to a cut planned per device.
        let pool = if self.catalog.plans_split(device) {
            self.pool_replica(&device.region)
        } else {
            None
        };
        let inputs = fleet::DeviceInputs {
            pool_work: self.pool_work.get(&device.name),
            pool,
            caps: self.profiles.get(&device.name).map(|p| &p.caps),
            measured_full_us: Some(&self.measured_full_us),
            link: self.link_of(&device.name),
        };
        self.catalog.desired_for(device, inputs, self.generation)
    }

    /// A connected pool replica in `region` (the first by name) and its capabilities:
    /// what a split tail from that region runs on.
    fn pool_replica(&self, region: &str) -> Option<(&str, &Caps)> {
        self.sessions.keys().find_map(|name| {
            let device = self.records.devices.get(name)?;
            let caps = &self.profiles.get(name)?.caps;
            (device.role == AgentRole::Pool && device.region == region)
                .then_some((device.name.as_str(), caps))
        })
    }

    /// The message sending `device` its desired state now, if it is connected.
    /// The connected device `name`'s desired state, unless it says what the last one
    /// sent on its session said: a change elsewhere in the fleet (another device's
    /// deployment, a new generation) costs this device no message, no reconcile and
    /// no report.
    pub(super) fn send_desired(&mut self, name: &str) -> Option<Effect> {
        let device = self.records.devices.get(name)?;
        let session = self.sessions.get(name)?;
        let desired = self.desired_for(device);
        let fingerprint = desired_fingerprint(&desired);
        if fingerprint.is_some() && session.sent == fingerprint {
            return None;
        }
        let id = session.id;
        self.note_sent(name, fingerprint);
        Some(Effect::Send {
            device: name.to_string(),
            session: id,
            message: CloudMessage::DesiredState(desired),
        })
    }

    /// Records what the last desired state sent on `name`'s session said (undone with
    /// the command when its writes cannot be committed, as the send then is not made).
    fn note_sent(&mut self, name: &str, fingerprint: Option<[u8; 16]>) {
        let Some(session) = self.sessions.get_mut(name) else {
            return;
        };
        let before = session.clone();
        session.sent = fingerprint;
        self.journal
            .push(Undo::Session(name.to_string(), Some(before)));
    }

    /// A new generation of desired states begins.
    pub(super) fn bump_generation(&mut self) {
        self.generation += 1;
    }

    /// After a change (a new generation), the desired state of every connected agent
    /// whose state it changed.
    pub(super) fn broadcast(&mut self) -> Vec<Effect> {
        self.bump_generation();
        let names: Vec<String> = self.sessions.keys().cloned().collect();
        names
            .iter()
            .filter_map(|name| self.send_desired(name))
            .collect()
    }

    /// Tells every region which deployments may offload.
    pub(super) fn sync_regions(&self) -> Effect {
        Effect::Region(RegionNote::Sync(
            self.catalog.replica_specs(&self.config.autoscale),
        ))
    }

    /// What the shell does when it starts.
    pub fn started(&mut self) -> Vec<Effect> {
        self.begin();
        vec![self.sync_regions()]
    }

    /// The link a device last reported, once it has measured a transfer.
    fn link_of(&self, device: &str) -> Option<nephele_infer_policy::split::Link> {
        let link = self.telemetry.get(device)?.heartbeat.link;
        (link.bandwidth_bps > 0).then_some(nephele_infer_policy::split::Link {
            bandwidth_bps: link.bandwidth_bps as f64,
            rtt_us: link.rtt_us as f64,
        })
    }

    /// Whether `name`'s session is `session_id` (messages of a replaced session are
    /// ignored).
    fn is_current(&self, name: &str, session_id: u64) -> bool {
        self.sessions.get(name).map(|s| s.id) == Some(session_id)
    }

    // ------------------------------------------------------------------------------
    // Agents: join, connect, heartbeat, notices, disconnect, renewal, pool work
    // ------------------------------------------------------------------------------

    /// An agent asks to enrol with a join token.
    pub fn join(
        &mut self,
        now_unix: u64,
        request: JoinRequest,
    ) -> Output<Result<JoinAccepted, ErrorFrame>> {
        self.writes_only(|core| core.join_checked(now_unix, request))
    }

    fn join_checked(
        &mut self,
        now_unix: u64,
        request: JoinRequest,
    ) -> Result<JoinAccepted, ErrorFrame> {
        use ErrorCode::*;
        if request.protocol_version != PROTOCOL_VERSION {
            return Err(refuse(
                VersionMismatch,
                format!(
                    "agent speaks protocol {}, this control plane speaks {PROTOCOL_VERSION}; upgrade the older side",
                    request.protocol_version
                ),
            ));
        }
        nephele_domain::validate_name("device", &request.name)
            .map_err(|e| refuse(BadRequest, e))?;
        let role: AgentRole = request
            .role
            .parse()
            .map_err(|e: String| refuse(BadRequest, e))?;
        let mut token = self
            .records
            .join_tokens
            .get(&request.token_id)
            .cloned()
            .ok_or_else(|| {
                refuse(
                    Unauthorized,
                    "unknown join token; create one with `nephele token create`",
                )
            })?;
        if !constant_time_eq(
            sha256_hex(request.token_secret.as_bytes()).as_bytes(),
            token.secret_sha256.as_bytes(),
        ) {
            return Err(refuse(Unauthorized, "join token secret does not match"));
        }
        if let Some(device) = &token.used_by {
            return Err(refuse(
                Unauthorized,
                format!("join token {} was already used by {device}; tokens are single-use, create a new one", token.id),
            ));
        }
        if now_unix > token.expires_unix {
            return Err(refuse(
                Unauthorized,
                format!("join token {} expired; create a new one", token.id),
            ));
        }
        if self.records.devices.contains_key(&request.name) {
            return Err(refuse(
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
                .map_err(|e| refuse(BadRequest, e.to_string()))?;
            labels.insert(key.clone(), value.clone());
        }
        labels.insert("nephele.io/role".into(), role.to_string());
        labels.insert("nephele.io/region".into(), token.region.clone());
        let certificate_der = self
            .authority
            .sign_agent_csr(&request.csr_der, &request.name, role.as_str())
            .map_err(|e| refuse(BadRequest, e))?;
        // The token is spent and the device enrolled in one commit: a crash leaves both
        // or neither, so a token is never spent for nothing, and never enrols two.
        token.used_by = Some(request.name.clone());
        let device = DeviceRecord {
            name: request.name.clone(),
            role,
            region: token.region.clone(),
            labels,
            cert_sha256: hex::encode(nephele_net::fingerprint(&certificate_der)),
            next_cert_sha256: None,
            joined_unix: now_unix,
            profile_name: String::new(),
            profile_toml: String::new(),
        };
        self.write(Write::Put(Record::JoinToken(token)));
        self.write(Write::Put(Record::Device(device.clone())));
        tracing::info!(device = %device.name, role = %role, region = %device.region, "agent joined");
        Ok(JoinAccepted {
            agent_id: device.name,
            region: device.region,
            certificate_der,
            ca_der: self.authority.ca_der(),
            manifest_signing_key: self.authority.manifest_public_key(),
        })
    }

    /// An enrolled agent opened its session with `hello`, presenting the certificate
    /// `identity` describes. The reply is its session id, welcome and desired state.
    pub fn agent_connected(
        &mut self,
        now_ms: u64,
        identity: &PeerIdentity,
        hello: Hello,
    ) -> Output<Result<(u64, Welcome, DesiredState), ErrorFrame>> {
        self.begin();
        match self.connect_checked(now_ms, identity, hello) {
            Ok((reply, effects)) => self.finish(Ok(reply), effects),
            Err(error) => {
                // Nothing was changed before a refusal.
                self.finish(Err(error), Vec::new())
            }
        }
    }

    #[allow(clippy::type_complexity)]
    fn connect_checked(
        &mut self,
        now_ms: u64,
        identity: &PeerIdentity,
        hello: Hello,
    ) -> Result<((u64, Welcome, DesiredState), Vec<Effect>), ErrorFrame> {
        use ErrorCode::*;
        if hello.protocol_version != PROTOCOL_VERSION {
            return Err(refuse(
                VersionMismatch,
                format!(
                    "agent speaks protocol {}, control plane {PROTOCOL_VERSION}",
                    hello.protocol_version
                ),
            ));
        }
        let mut device = self
            .records
            .devices
            .get(&identity.name)
            .cloned()
            .ok_or_else(|| {
                refuse(
                    Unauthorized,
                    format!(
                        "device {} is not enrolled (deleted?); join again with a new token",
                        identity.name
                    ),
                )
            })?;
        let presented = hex::encode(identity.cert_sha256);
        let mut changed = false;
        if device.next_cert_sha256.as_deref() == Some(presented.as_str()) {
            // The first connection with a renewed certificate: the old one is retired.
            device.cert_sha256 = presented;
            device.next_cert_sha256 = None;
            changed = true;
            tracing::info!(device = %device.name, "renewed certificate in use; the previous one is retired");
        } else if device.cert_sha256 != presented {
            return Err(refuse(
                Unauthorized,
                "this certificate was superseded or revoked; join again",
            ));
        }
        if hello.role != device.role.as_str() {
            return Err(refuse(
                BadRequest,
                format!(
                    "device {} enrolled with role {}, but runs as {}; re-join to change roles",
                    device.name, device.role, hello.role
                ),
            ));
        }
        let profile = FirmwareProfile::from_toml(&hello.profile_toml, None)
            .map_err(|e| refuse(BadRequest, format!("invalid firmware profile: {e}")))?;
        if device.profile_name != hello.profile_name || device.profile_toml != hello.profile_toml {
            device.profile_name = hello.profile_name.clone();
            device.profile_toml = hello.profile_toml.clone();
            changed = true;
        }
        if changed {
            self.write(Write::Put(Record::Device(device.clone())));
        }
        let session_id = self.next_session_id;
        // Ids are never reused, even when the commit fails.
        self.next_session_id += 1;
        self.set_session(
            &device.name,
            Some(SessionInfo {
                id: session_id,
                connected_ms: now_ms,
                local_endpoint: hello.local_endpoint.clone(),
                role: device.role,
                region: device.region.clone(),
                sent: None,
            }),
        );
        let mut effects = vec![Effect::Register {
            device: device.name.clone(),
            session: session_id,
        }];
        if device.role == AgentRole::Pool {
            let address = if hello.node.address.is_empty() {
                hello
                    .local_endpoint
                    .rsplit_once(':')
                    .map(|(host, _)| host.trim_matches(['[', ']']).to_string())
                    .unwrap_or_default()
            } else {
                hello.node.address.clone()
            };
            effects.push(Effect::Region(RegionNote::PoolJoined {
                region: device.region.clone(),
                name: device.name.clone(),
                session_id,
                profile: profile.device.name.clone(),
                address,
                gpus: hello.node.gpus.clone(),
                jobs: hello.jobs.clone(),
            }));
        }
        tracing::info!(device = %device.name, role = %device.role, profile = %hello.profile_name, "agent connected");
        let desired = self.desired_for(&device);
        self.note_sent(&device.name, desired_fingerprint(&desired));
        let welcome = Welcome {
            agent_id: device.name.clone(),
            region: device.region.clone(),
            heartbeat_interval_ms: self.config.heartbeat_interval_ms,
        };
        Ok(((session_id, welcome, desired), effects))
    }

    /// A heartbeat on session `session_id` of agent `name`.
    pub fn heartbeat(
        &mut self,
        now_ms: u64,
        name: &str,
        session_id: u64,
        heartbeat: Heartbeat,
    ) -> Vec<Effect> {
        self.begin();
        let Some(session) = self.sessions.get(name).filter(|s| s.id == session_id) else {
            return Vec::new();
        };
        let mut effects = Vec::new();
        if session.role == AgentRole::Pool {
            effects.push(Effect::Region(RegionNote::PoolReport {
                region: session.region.clone(),
                name: name.to_string(),
                session_id,
                deployments: heartbeat.deployments.clone(),
                jobs: heartbeat.jobs.clone(),
            }));
        }
        self.record_measured_times(name, &heartbeat);
        self.telemetry.insert(
            name.to_string(),
            Telemetry {
                received_ms: now_ms,
                heartbeat,
            },
        );
        effects.extend(self.replan_if_link_moved(name));
        effects
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

    /// Re-plans a device's split cuts when its reported bandwidth has moved by more than
    /// the replanning threshold since the last plan (or a compute time was measured
    /// since), and sends it the new desired state if it runs a `variant = "split"`
    /// deployment.
    fn replan_if_link_moved(&mut self, name: &str) -> Option<Effect> {
        let link = self.link_of(name)?;
        let threshold = nephele_infer_policy::split::ReplanConfig::default().relative_threshold;
        let apart = |now: f64, then: f64| (now - then).abs() > threshold * then;
        let moved_link = self
            .planned_bps
            .get(name)
            .is_none_or(|&planned| apart(link.bandwidth_bps, planned as f64));
        // The first plan of a device is made from its profile's peak TOPS.
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
            return None;
        }
        self.planned_bps
            .insert(name.to_string(), link.bandwidth_bps as u64);
        self.planned_full_us.extend(moved_times);
        let device = self.records.devices.get(name)?;
        if !self.catalog.plans_split(device) {
            return None;
        }
        self.generation += 1;
        tracing::info!(device = %name, bandwidth_bps = link.bandwidth_bps, rtt_us = link.rtt_us, "link or measured compute time moved; split cuts re-planned");
        self.send_desired(name)
    }

    /// A pool agent relays its provider's interruption notice (spot reclaim).
    pub fn notice(
        &mut self,
        name: &str,
        session_id: u64,
        notice: &InterruptionNotice,
    ) -> Vec<Effect> {
        self.begin();
        if !self.is_current(name, session_id) {
            return Vec::new();
        }
        tracing::warn!(device = %name, seconds = notice.seconds, source = %notice.source, "interruption notice from a pool agent");
        let Some(device) = self.records.devices.get(name) else {
            return Vec::new();
        };
        vec![Effect::Region(RegionNote::Interrupt {
            region: device.region.clone(),
            node: name.to_string(),
            seconds: u64::from(notice.seconds),
            source: format!("from the node: {}", notice.source),
        })]
    }

    /// Session `session_id` of `name` ended.
    pub fn disconnected(&mut self, name: &str, session_id: u64, reason: &str) -> Vec<Effect> {
        self.begin();
        let mut effects = Vec::new();
        if self.is_current(name, session_id) {
            self.set_session(name, None);
            effects.push(Effect::EndSession {
                device: name.to_string(),
                session: session_id,
            });
            tracing::info!(device = %name, reason = %reason, "agent disconnected");
        }
        effects.push(Effect::Region(RegionNote::PoolLeft {
            name: name.to_string(),
            session_id,
        }));
        effects
    }

    /// A region's word on what one pool agent must run (the whole list).
    pub fn set_pool_work(&mut self, agent: &str, work: PoolWork) -> Vec<Effect> {
        self.begin();
        if self.pool_work.get(agent) == Some(&work) {
            return Vec::new();
        }
        if work == PoolWork::default() {
            self.pool_work.remove(agent);
        } else {
            self.pool_work.insert(agent.to_string(), work);
        }
        if !self.records.devices.contains_key(agent) || !self.sessions.contains_key(agent) {
            return Vec::new();
        }
        self.generation += 1;
        self.send_desired(agent).into_iter().collect()
    }

    /// An enrolled agent, on its mutual-TLS session, asks for a certificate for a new
    /// key before its current one expires. Accepted beside the current certificate
    /// until first used.
    pub fn renew_certificate(
        &mut self,
        device: &str,
        csr_der: &[u8],
    ) -> Output<Result<Vec<u8>, ErrorFrame>> {
        use ErrorCode::*;
        self.begin();
        let Some(mut record) = self.records.devices.get(device).cloned() else {
            let error = refuse(
                Unauthorized,
                format!("device {device} is not enrolled (deleted?)"),
            );
            return self.finish(Err(error), Vec::new());
        };
        let certificate_der =
            match self
                .authority
                .sign_agent_csr(csr_der, &record.name, record.role.as_str())
            {
                Ok(der) => der,
                Err(error) => return self.finish(Err(refuse(BadRequest, error)), Vec::new()),
            };
        record.next_cert_sha256 = Some(hex::encode(nephele_net::fingerprint(&certificate_der)));
        tracing::info!(device = %record.name, "certificate renewed");
        self.write(Write::Put(Record::Device(record)));
        self.finish(Ok(certificate_der), Vec::new())
    }

    /// A device's usage report on session `session_id`: counted once per record,
    /// stored, then acknowledged (an acknowledged record is never lost).
    pub fn usage(
        &mut self,
        name: &str,
        session_id: u64,
        report: &nephele_proto::UsageReport,
    ) -> Output<()> {
        self.begin();
        if !self.is_current(name, session_id) {
            return self.finish((), Vec::new());
        }
        let mut totals = self
            .records
            .usage
            .get(name)
            .cloned()
            .unwrap_or_else(|| UsageTotals {
                device: name.to_string(),
                ..UsageTotals::default()
            });
        let fresh = totals.new_records(report);
        self.count_usage_hours(&fresh);
        let changed = totals.apply(report);
        let up_to = totals.last_seq;
        if changed {
            self.write(Write::Put(Record::Usage(totals)));
        }
        let ack = self.ack(name, session_id, up_to);
        self.finish((), vec![ack])
    }

    /// Adds records not counted yet to their deployments' hours (in the same command
    /// as the device's totals, so each is counted once in both), and forgets hours past
    /// the retention.
    fn count_usage_hours(&mut self, fresh: &[&nephele_proto::UsageRecord]) {
        let mut hours: BTreeMap<String, UsageHour> = BTreeMap::new();
        for record in fresh {
            let hour = UsageHour::hour_of(record);
            let key = UsageHour::key_of(hour, &record.deployment);
            let entry = hours.entry(key.clone()).or_insert_with(|| {
                self.records
                    .usage_hours
                    .get(&key)
                    .cloned()
                    .unwrap_or_else(|| UsageHour {
                        hour,
                        deployment: record.deployment.clone(),
                        tenant: self
                            .catalog
                            .deployment(&record.deployment)
                            .map(|d| d.tenant.clone())
                            .unwrap_or_default(),
                        ..UsageHour::default()
                    })
            });
            entry.served.add(&super::usage::Served {
                served_local: record.served_local,
                served_offloaded: record.served_offloaded,
                failed: record.failed,
            });
            entry.records += 1;
        }
        let newest = hours.values().map(|h| h.hour).max();
        for (_, hour) in hours {
            self.write(Write::Put(Record::UsageHour(hour)));
        }
        if let Some(newest) = newest {
            let cutoff = UsageHour::key_of(newest.saturating_sub(USAGE_RETENTION_HOURS * 3600), "");
            let old: Vec<String> = self
                .records
                .usage_hours
                .range(..cutoff)
                .map(|(k, _)| k.clone())
                .collect();
            for key in old {
                self.write(Write::Delete(Table::UsageHours, key));
            }
        }
    }

    /// What devices served per deployment in the hours of `[from, to)` (unix
    /// seconds), and the tenant of every deployment that exists now, for reports.
    pub fn edge_usage_between(
        &self,
        from: u64,
        to: u64,
    ) -> (Vec<crate::reports::EdgeHour>, BTreeMap<String, String>) {
        let hours = self
            .records
            .usage_hours
            .range(UsageHour::key_of(from, "")..UsageHour::key_of(to, ""))
            .map(|(_, h)| crate::reports::EdgeHour {
                hour: h.hour,
                deployment: h.deployment.clone(),
                tenant: h.tenant.clone(),
                served_local: h.served.served_local,
                served_offloaded: h.served.served_offloaded,
                failed: h.served.failed,
            })
            .collect();
        let owners = self
            .catalog
            .deployments()
            .map(|d| (d.name.clone(), d.tenant.clone()))
            .collect();
        (hours, owners)
    }

    fn ack(&self, name: &str, session_id: u64, up_to: u64) -> Effect {
        Effect::Send {
            device: name.to_string(),
            session: session_id,
            message: CloudMessage::UsageAck { up_to },
        }
    }

    /// What a pool agent's region placed on it.
    pub(super) fn pool_work_of(&self, name: &str) -> Option<&PoolWork> {
        self.pool_work.get(name)
    }

    /// The sessions now, by device.
    pub fn sessions(&self) -> &BTreeMap<String, SessionInfo> {
        &self.sessions
    }
}

/// Replaces `key` in `map` with the record `record` unwraps to (or removes it);
/// returns what was there.
fn replace<T>(
    map: &mut BTreeMap<String, T>,
    key: &str,
    record: Option<Record>,
    unwrap: impl Fn(Record) -> Option<T>,
) -> Option<T> {
    match record.and_then(unwrap) {
        Some(value) => map.insert(key.to_string(), value),
        None => map.remove(key),
    }
}

#[cfg(test)]
#[path = "fleet_core_tests.rs"]
mod tests;
