//! The federation core's API commands and queries: join tokens, devices, models,
//! deployments, API tokens, regions, usage. Same contract as `fleet_core.rs`: the time comes
//! in as an argument, writes and effects go out in the [`Output`].

use std::collections::BTreeMap;

use nephele_domain::AgentRole;
use nephele_proto::{
    CloudMessage, DeploymentPhase, ErrorCode, ErrorFrame, ModelManifest, ModelVariant, TensorSpec,
    VariantKind,
};

use super::fleet::device_labels;
use super::fleet_core::{Effect, FleetCore, Output};
use super::fleet_store::{Record, Write};
use super::usage::UsageTotals;
use super::views::*;
use super::{sha256_hex, ApiError};
use crate::store::{
    DeploymentRecord, DeviceRecord, JoinTokenRecord, ModelRecord, Table, VariantRecord,
};

/// A model that a build (`model_build`) loaded and derived variants from, off the
/// actor's thread, with the pushed file and every shippable variant file already
/// written as blobs: the core only signs and records the manifest.
pub struct PutModel {
    pub name: String,
    /// The pushed file's SHA-256 and size, and the manifest entry of each shippable
    /// variant ([`PutModel::digest`]): hashed by the build, not on the actor's thread,
    /// which hundreds of megabytes of files would hold up.
    pub sha256: [u8; 32],
    pub size: u64,
    pub shipped: Vec<ModelVariant>,
    pub inputs: Vec<nephele_runtime::TensorInfo>,
    pub outputs: Vec<nephele_runtime::TensorInfo>,
    pub variants: nephele_runtime::variants::VariantSet,
    /// What the variants were measured on, e.g. `360 labelled rows`.
    pub validation: String,
    /// The SHA-256 of the labelled rows, when they were labelled.
    pub validation_sha256: Option<String>,
    /// The manifest format: `nephele_runtime::FORMAT_ONNX` or `FORMAT_CANDLE_BERT`.
    pub format: String,
    /// The `--input` specs applied to the file (already in `bytes`).
    pub input_specs: Vec<String>,
    /// Recurrent state (`--state INPUT=OUTPUT`), checked against the model.
    pub recurrent_state: Vec<nephele_proto::StateBinding>,
    /// The tenant that pushed it.
    pub tenant: String,
}

/// A new join token: its id and secret are drawn by the shell.
pub struct NewJoinToken {
    pub region: Option<String>,
    pub ttl_s: Option<u64>,
    pub id: String,
    pub secret: String,
}

pub(crate) fn sha256_of(bytes: &[u8]) -> [u8; 32] {
    let digest = ring::digest::digest(&ring::digest::SHA256, bytes);
    let mut sha256 = [0u8; 32];
    sha256.copy_from_slice(digest.as_ref());
    sha256
}

impl PutModel {
    /// The digests a [`PutModel`] carries, computed from the pushed file and the
    /// variants (on the build's thread): `(sha256, size, shipped)`.
    pub fn digest(
        pushed: &[u8],
        variants: &nephele_runtime::variants::VariantSet,
    ) -> ([u8; 32], u64, Vec<ModelVariant>) {
        (
            sha256_of(pushed),
            pushed.len() as u64,
            variants.shippable().filter_map(manifest_variant).collect(),
        )
    }
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

impl FleetCore {
    // ------------------------------------------------------------------------------
    // Join tokens
    // ------------------------------------------------------------------------------

    pub fn create_join_token(
        &mut self,
        now_unix: u64,
        new: NewJoinToken,
    ) -> Output<Result<JoinTokenView, ApiError>> {
        self.writes_only(|core| core.create_join_token_checked(now_unix, new))
    }

    fn create_join_token_checked(
        &mut self,
        now_unix: u64,
        new: NewJoinToken,
    ) -> Result<JoinTokenView, ApiError> {
        let region = new
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
        let ttl_s = new.ttl_s.unwrap_or(self.config.join_token_ttl_s);
        if ttl_s == 0 || ttl_s > 7 * 24 * 3600 {
            return Err(ApiError::BadRequest(
                "ttl_s must be between 1 and 604800 (7 days)".into(),
            ));
        }
        if self.records.join_tokens.contains_key(&new.id) {
            return Err(ApiError::Conflict(format!(
                "a join token {} exists already; try again",
                new.id
            )));
        }
        let record = JoinTokenRecord {
            id: new.id.clone(),
            secret_sha256: sha256_hex(new.secret.as_bytes()),
            region: region.clone(),
            created_unix: now_unix,
            expires_unix: now_unix + ttl_s,
            used_by: None,
        };
        let expires_unix = record.expires_unix;
        self.write(Write::Put(Record::JoinToken(record)));
        let token = nephele_net::JoinToken {
            id: new.id.clone(),
            secret: new.secret,
            ca_fingerprint: self.authority.ca_fingerprint(),
        };
        Ok(JoinTokenView {
            id: new.id,
            region,
            expires_unix,
            used_by: None,
            token: Some(token.to_string()),
        })
    }

    pub fn join_tokens(&self) -> Vec<JoinTokenView> {
        self.records
            .join_tokens
            .values()
            .map(|r| JoinTokenView {
                id: r.id.clone(),
                region: r.region.clone(),
                expires_unix: r.expires_unix,
                used_by: r.used_by.clone(),
                token: None,
            })
            .collect()
    }

    // ------------------------------------------------------------------------------
    // Devices
    // ------------------------------------------------------------------------------

    /// Every enrolled device as the API shows it (`address` is the shell's to fill: it
    /// holds the connections).
    pub fn device_views(&self, now_ms: u64) -> Vec<DeviceView> {
        self.device_views_after(now_ms, None, usize::MAX)
    }

    /// At most `limit` devices in name order, after `after` (a page of the fleet: only
    /// the page's views are built), as [`FleetCore::device_views`] shows them.
    pub fn device_views_after(
        &self,
        now_ms: u64,
        after: Option<&str>,
        limit: usize,
    ) -> Vec<DeviceView> {
        use std::ops::Bound::{Excluded, Unbounded};
        let from = after.map_or(Unbounded, |a| Excluded(a.to_string()));
        self.records
            .devices
            .range((from, Unbounded))
            .take(limit)
            .map(|(_, d)| self.device_view(now_ms, d))
            .collect()
    }

    /// One device's view (`GET /v1/devices/{name}`).
    pub fn device_view_named(&self, now_ms: u64, name: &str) -> Result<DeviceView, ApiError> {
        self.records
            .devices
            .get(name)
            .map(|d| self.device_view(now_ms, d))
            .ok_or_else(|| {
                ApiError::NotFound(format!(
                    "no device named {name}; `nephele device list` shows the enrolled devices"
                ))
            })
    }

    /// `healthy` (heartbeats on time), `stale` (connected, heartbeats late) or
    /// `offline`.
    fn health_of(&self, now_ms: u64, name: &str) -> &'static str {
        let interval = 3 * u64::from(self.config.heartbeat_interval_ms);
        let age = self
            .telemetry
            .get(name)
            .map(|t| now_ms.saturating_sub(t.received_ms));
        match (self.sessions.get(name), age) {
            (None, _) => "offline",
            (Some(_), Some(age)) if age <= interval => "healthy",
            (Some(s), None) if now_ms.saturating_sub(s.connected_ms) <= interval => "healthy",
            _ => "stale",
        }
    }

    fn device_view(&self, now_ms: u64, device: &DeviceRecord) -> DeviceView {
        let profile = self.profiles.get(&device.name);
        let session = self.sessions.get(&device.name);
        let telemetry = self.telemetry.get(&device.name);
        DeviceView {
            name: device.name.clone(),
            role: device.role.to_string(),
            region: device.region.clone(),
            profile: device.profile_name.clone(),
            labels: device_labels(device),
            accelerators: profile.map(|p| p.accelerators.clone()).unwrap_or_default(),
            cpu_cores: profile.map_or(0, |p| p.cpu_cores),
            memory_mb: profile.map_or(0, |p| p.memory_mb),
            online: Some(session.is_some()),
            health: self.health_of(now_ms, &device.name).into(),
            last_heartbeat_ms_ago: telemetry.map(|t| now_ms.saturating_sub(t.received_ms)),
            connected_for_s: session.map(|s| now_ms.saturating_sub(s.connected_ms) / 1000),
            session: session.map(|s| s.id),
            address: None,
            rss_bytes: telemetry.map(|t| t.heartbeat.rss_bytes),
            link: telemetry.map(|t| super::views::link_view(&t.heartbeat.link)),
            local_endpoint: session.map(|s| s.local_endpoint.clone()),
            deployments: Some(
                telemetry
                    .map(|t| t.heartbeat.deployments.len())
                    .unwrap_or(0),
            ),
            running: Some(
                telemetry
                    .map(|t| {
                        t.heartbeat
                            .deployments
                            .iter()
                            .map(|d| DeviceRunning {
                                deployment: d.deployment.clone(),
                                variant: d.variant.clone(),
                                phase: phase_text(&d.phase),
                                served_local: d.served_local,
                                served_offloaded: d.served_offloaded,
                            })
                            .collect()
                    })
                    .unwrap_or_default(),
            ),
        }
    }

    /// Removes a device and its usage; its session is told why and ended, and its
    /// certificate is refused from now on.
    pub fn delete_device(&mut self, name: &str) -> Output<Result<(), ApiError>> {
        self.begin();
        if !self.records.devices.contains_key(name) {
            let error = ApiError::NotFound(format!("no device named {name}"));
            return self.finish(Err(error), Vec::new());
        }
        self.write(Write::Delete(Table::Devices, name.to_string()));
        // A device enrolled again under the name numbers its usage from 1 again.
        if self.records.usage.contains_key(name) {
            self.write(Write::Delete(Table::Usage, name.to_string()));
        }
        let mut effects = Vec::new();
        if let Some(session) = self.sessions.get(name).map(|s| s.id) {
            self.set_session(name, None);
            effects.push(Effect::Send {
                device: name.to_string(),
                session,
                message: CloudMessage::Refused(ErrorFrame::new(
                    ErrorCode::Unauthorized,
                    "this device was deleted from the fleet",
                )),
            });
            effects.push(Effect::EndSession {
                device: name.to_string(),
                session,
            });
        }
        self.remove_telemetry(name);
        tracing::info!(device = %name, "device deleted");
        self.finish(Ok(()), effects)
    }

    /// A device's usage totals.
    pub fn usage_of(&self, name: &str) -> Result<UsageTotals, ApiError> {
        if !self.records.devices.contains_key(name) {
            return Err(ApiError::NotFound(format!(
                "no device named {name}; `nephele device list` shows the devices"
            )));
        }
        Ok(self
            .records
            .usage
            .get(name)
            .cloned()
            .unwrap_or_else(|| UsageTotals {
                device: name.to_string(),
                ..UsageTotals::default()
            }))
    }

    // ------------------------------------------------------------------------------
    // Models
    // ------------------------------------------------------------------------------

    /// Signs and records a built model's manifest.
    pub fn put_model(
        &mut self,
        now_unix: u64,
        message: PutModel,
    ) -> Output<Result<ModelView, ApiError>> {
        self.writes_only(|core| core.put_model_checked(now_unix, message))
    }

    fn put_model_checked(
        &mut self,
        now_unix: u64,
        message: PutModel,
    ) -> Result<ModelView, ApiError> {
        nephele_domain::validate_name("model", &message.name).map_err(ApiError::BadRequest)?;
        self.check_model_owner(&message.name, &message.tenant)?;
        let sha256 = message.sha256;
        let sha_hex = hex::encode(sha256);
        if let Some(existing) = self
            .catalog
            .versions(&message.name)
            .into_iter()
            .find(|m| m.sha256 == sha_hex)
        {
            // Content-addressed: the same file is the same version.
            let view = super::views::model_view(existing);
            self.set_build(&message.name, None);
            return Ok(view);
        }
        let version = sha_hex[..crate::store::VERSION_DIGITS].to_string();
        let spec = |info: &nephele_runtime::TensorInfo| TensorSpec {
            name: info.name.clone(),
            shape: info.shape.clone(),
            dtype: info.dtype.clone(),
        };
        let mut shipped: Vec<ModelVariant> = message.shipped.clone();
        if !shipped.iter().any(|v| v.kind == VariantKind::Full) {
            // The builder always ships the pushed file; keep the invariant explicit.
            shipped.insert(
                0,
                ModelVariant {
                    name: "full".into(),
                    kind: VariantKind::Full,
                    precision: "fp32".into(),
                    sha256,
                    size: message.size,
                    accuracy: None,
                    min_cosine: Some(1.0),
                    flops: 0,
                },
            );
        }
        let manifest = ModelManifest {
            name: message.name.clone(),
            format: message.format.clone(),
            created_unix: now_unix,
            inputs: message.inputs.iter().map(spec).collect(),
            outputs: message.outputs.iter().map(spec).collect(),
            validation: message.validation.clone(),
            variants: shipped,
            state: message.recurrent_state.clone(),
        };
        let manifest_bytes = nephele_proto::encode_payload(&manifest)
            .map_err(|e| ApiError::Internal(e.to_string()))?;
        let signature = self.authority.sign_manifest(&manifest_bytes);
        let record = ModelRecord {
            name: message.name.clone(),
            version,
            sha256: sha_hex,
            size: message.size,
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
                    cut: v.cut.as_ref().map(super::views::cut_view),
                    rejected: v.rejected.clone(),
                    note: v
                        .quantization
                        .as_ref()
                        .and_then(nephele_runtime::mixed_precision::summary),
                    accepted_on: v.accepted_on.clone(),
                    status: String::new(),
                    reason: None,
                })
                .collect(),
            validation: message.validation,
            validation_sha256: message.validation_sha256,
            format: message.format,
            input_specs: message.input_specs,
            recurrent_state: message.recurrent_state,
            tenant: message.tenant,
            sequence: self.catalog.next_sequence(&message.name),
        };
        let view = super::views::model_view(&record);
        tracing::info!(
            model = %record.reference(),
            sha256 = %record.sha256,
            size = record.size,
            variants = manifest.variants.len(),
            "model stored"
        );
        let name = record.name.clone();
        self.write(Write::Put(Record::Model(Box::new(record))));
        self.set_build(&name, None);
        Ok(view)
    }

    /// Deletes a model version (`name:version`), or every version of a name and its
    /// failed build (`name`), as `scope` may: another tenant's model is not found.
    /// Refused while a deployment runs a version it would remove (also as either side
    /// of a rollout under way), or while the name is being built. The blobs stay (they
    /// are content-addressed and may serve another model).
    pub fn delete_model(
        &mut self,
        reference: &str,
        scope: Option<&str>,
    ) -> Output<Result<Vec<ModelView>, ApiError>> {
        self.begin();
        let mut blobs = Vec::new();
        let reply = self.delete_model_checked(reference, scope, &mut blobs);
        let effects = if blobs.is_empty() {
            Vec::new()
        } else {
            vec![Effect::DeleteBlobs { sha256s: blobs }]
        };
        self.finish(reply, effects)
    }

    fn delete_model_checked(
        &mut self,
        reference: &str,
        scope: Option<&str>,
        blobs: &mut Vec<String>,
    ) -> Result<Vec<ModelView>, ApiError> {
        // Visibility first: another tenant's model reads as absent.
        self.model_view_for(reference, scope)?;
        let (name, version) = match reference.split_once(':') {
            Some((name, version)) => (name, Some(version)),
            None => (reference, None),
        };
        if let Some(build) = self.builds.get(name).filter(|b| b.error.is_none()) {
            let view = build.view(name);
            if version.is_none_or(|v| v == view.version) {
                return Err(ApiError::Conflict(format!(
                    "model {name} is being built; wait for it (`nephele model get {name}`) and delete it then"
                )));
            }
        }
        let doomed: Vec<ModelRecord> = match version {
            Some(_) => self
                .catalog
                .resolve(reference)
                .cloned()
                .into_iter()
                .collect(),
            None => self.catalog.versions(name).into_iter().cloned().collect(),
        };
        let users: Vec<String> = self
            .catalog
            .deployments()
            .filter(|d| {
                let mut runs = vec![d.model.as_str()];
                if let Some(rollout) = d.active_rollout() {
                    runs.extend([rollout.from.model.as_str(), rollout.to.model.as_str()]);
                }
                doomed.iter().any(|m| runs.contains(&m.key().as_str()))
            })
            .map(|d| d.name.clone())
            .collect();
        if !users.is_empty() {
            return Err(ApiError::Conflict(format!(
                "{reference} is deployed by {}; delete those deployments or update them to another version first",
                users.join(", ")
            )));
        }
        let mut deleted: Vec<ModelView> = doomed.iter().map(super::views::model_view).collect();
        let mut freed: Vec<String> = doomed
            .iter()
            .flat_map(|record| self.catalog.blob_digests(&record.key()))
            .collect();
        for record in &doomed {
            self.write(Write::Delete(Table::Models, record.key()));
        }
        // Their files go too, unless a version left (of any name: storage is by
        // content) still ships them, or a build in flight pushed the same file (its
        // variants, written by the build before it registers, are the same files).
        let kept: std::collections::HashSet<String> = self
            .catalog
            .models()
            .flat_map(|m| self.catalog.blob_digests(&m.key()))
            .collect();
        let building_same = |record: &ModelRecord| {
            self.builds
                .values()
                .any(|b| b.error.is_none() && b.sha256 == record.sha256)
        };
        if doomed.iter().any(building_same) {
            freed.clear();
        }
        freed.retain(|digest| !kept.contains(digest));
        freed.sort();
        freed.dedup();
        *blobs = freed;
        // A failed build of the name goes with it (its view said `failed`).
        if let Some(build) = self.builds.get(name).cloned() {
            if version.is_none_or(|v| v == build.view(name).version) {
                deleted.push(build.view(name));
                self.set_build(name, None);
            }
        }
        for view in &deleted {
            tracing::info!(model = %view.reference, "model deleted");
        }
        Ok(deleted)
    }

    // ------------------------------------------------------------------------------
    // Deployments
    // ------------------------------------------------------------------------------

    pub fn create_deployment(
        &mut self,
        now_unix: u64,
        spec: DeploymentSpec,
        tenant: &str,
    ) -> Output<Result<DeploymentStatus, ApiError>> {
        self.begin();
        let record = match self
            .catalog
            .validate(spec, now_unix, tenant)
            .and_then(|record| self.check_replica_quota(&record).map(|()| record))
        {
            Ok(record) => record,
            Err(error) => return self.finish(Err(error), Vec::new()),
        };
        tracing::info!(deployment = %record.name, model = %record.model, selector = %record.selector, "deployment created");
        self.write(Write::Put(Record::Deployment(record.clone())));
        let mut effects = self.broadcast();
        effects.push(self.sync_regions());
        let status = self.status_of(&record);
        self.finish(Ok(status), effects)
    }

    pub fn delete_deployment(&mut self, name: &str) -> Output<Result<(), ApiError>> {
        self.begin();
        if self.catalog.deployment(name).is_none() {
            let error = ApiError::NotFound(format!("no deployment named {name}"));
            return self.finish(Err(error), Vec::new());
        }
        self.write(Write::Delete(Table::Deployments, name.to_string()));
        tracing::info!(deployment = %name, "deployment deleted");
        let mut effects = self.broadcast();
        effects.push(self.sync_regions());
        self.finish(Ok(()), effects)
    }

    pub fn deployment_status(&self, name: &str) -> Result<DeploymentStatus, ApiError> {
        self.deployment_status_with(name, true)
    }

    /// [`Self::deployment_status`], with its device rows only when `rows`.
    pub fn deployment_status_with(
        &self,
        name: &str,
        rows: bool,
    ) -> Result<DeploymentStatus, ApiError> {
        let record = self
            .catalog
            .deployment(name)
            .ok_or_else(|| ApiError::NotFound(format!("no deployment named {name}")))?;
        Ok(self.status_with(record, rows))
    }

    pub fn deployment_statuses(&self) -> Vec<DeploymentStatus> {
        self.catalog
            .deployments()
            .map(|r| self.status_of(r))
            .collect()
    }

    pub(super) fn status_of(&self, deployment: &DeploymentRecord) -> DeploymentStatus {
        self.status_with(deployment, true)
    }

    /// A deployment's status, with a row per device when `rows` (else only the counts:
    /// one pass over the fleet without building a row per device, for fleets of
    /// thousands).
    pub(super) fn status_with(
        &self,
        deployment: &DeploymentRecord,
        rows: bool,
    ) -> DeploymentStatus {
        let mut table = Vec::new();
        let mut phases: BTreeMap<String, usize> = BTreeMap::new();
        let mut totals = DeploymentTotals::default();
        let (mut desired, mut ready) = (0, 0);
        for device in self.records.devices.values().filter(|d| {
            self.catalog
                .runs_on(d, deployment, self.pool_work_of(&d.name))
        }) {
            let telemetry = self.telemetry.get(&device.name).and_then(|t| {
                t.heartbeat
                    .deployments
                    .iter()
                    .find(|d| d.deployment == deployment.name)
            });
            let online = self.sessions.contains_key(&device.name);
            let (kind, reason) = match telemetry.map(|t| &t.phase) {
                None | Some(DeploymentPhase::Pending) => ("pending", None),
                Some(DeploymentPhase::Downloading) => ("downloading", None),
                Some(DeploymentPhase::Ready) => ("ready", None),
                Some(DeploymentPhase::Failed(reason)) => ("failed", Some(reason)),
            };
            if device.role == AgentRole::Edge {
                desired += 1;
                ready += usize::from(online && kind == "ready");
                let counted = if online { kind } else { "offline" };
                *phases.entry(counted.to_string()).or_default() += 1;
            }
            if let Some(t) = telemetry {
                totals.served_local = totals.served_local.saturating_add(t.served_local);
                totals.served_offloaded =
                    totals.served_offloaded.saturating_add(t.served_offloaded);
                totals.failed = totals.failed.saturating_add(t.failed);
                totals.worst_p99_ms = totals.worst_p99_ms.max(t.p99_us as f64 / 1000.0);
                if !t.variant.is_empty() {
                    *totals.variants.entry(t.variant.clone()).or_default() += 1;
                }
            }
            if !rows {
                continue;
            }
            let phase = match reason {
                Some(reason) => format!("failed: {reason}"),
                None => kind.to_string(),
            };
            let model_key = deployment.for_device(&device.name).model.clone();
            table.push(DeviceDeploymentStatus {
                model: self
                    .catalog
                    .model(&model_key)
                    .map_or_else(|| model_key.clone(), |m| m.reference()),
                current: Some(self.runs_model(&device.name, &deployment.name, &model_key)),
                device: device.name.clone(),
                role: device.role.to_string(),
                profile: device.profile_name.clone(),
                online: Some(online),
                ready: Some(online && phase == "ready"),
                phase,
                // The leader always knows these (zero before a heartbeat); only a
                // standby's copy leaves them null.
                variant: Some(telemetry.map(|t| t.variant.clone()).unwrap_or_default()),
                served_local: Some(telemetry.map(|t| t.served_local).unwrap_or(0)),
                served_offloaded: Some(telemetry.map(|t| t.served_offloaded).unwrap_or(0)),
                failed: Some(telemetry.map(|t| t.failed).unwrap_or(0)),
                queue_len: Some(telemetry.map(|t| t.queue_len).unwrap_or(0)),
                service_ms: Some(
                    telemetry
                        .map(|t| t.service_us as f64 / 1000.0)
                        .unwrap_or(0.0),
                ),
                p50_ms: Some(telemetry.map(|t| t.p50_us as f64 / 1000.0).unwrap_or(0.0)),
                p99_ms: Some(telemetry.map(|t| t.p99_us as f64 / 1000.0).unwrap_or(0.0)),
            });
        }
        let mut warnings = Vec::new();
        if desired == 0 {
            let edge_devices = self
                .records
                .devices
                .values()
                .filter(|d| d.role == AgentRole::Edge)
                .count();
            warnings.push(match (edge_devices, deployment.selector.is_empty()) {
                (0, _) => "no edge device is enrolled yet: the deployment runs on devices as they join".to_string(),
                (n, true) => format!("none of the {n} enrolled edge devices runs it yet"),
                (n, false) => format!(
                    "selector {:?} matches none of the {n} enrolled edge devices: it runs on devices that join or are labelled to match (`nephele device list` shows their labels)",
                    deployment.selector
                ),
            });
        } else if deployment.selector.is_empty() {
            warnings.push(format!(
                "no selector: it runs on every edge device ({desired} now, and each that joins); give --selector KEY=VALUE to choose them"
            ));
        }
        DeploymentStatus {
            name: deployment.name.clone(),
            tenant: deployment.tenant.clone(),
            model: self
                .catalog
                .model(&deployment.model)
                .map_or_else(|| deployment.model.clone(), |m| m.reference()),
            selector: deployment.selector.clone(),
            slo_ms: deployment.slo_ms,
            offload: deployment.offload,
            max_queue: deployment.max_queue,
            variant: deployment.variant.clone(),
            hard_example_threshold: deployment.hard_example_threshold,
            replicas: deployment.replicas.clone(),
            rollout_settings: deployment.rollout_settings.clone(),
            desired_devices: desired,
            ready_devices: Some(ready),
            device_phases: Some(phases),
            totals: Some(totals),
            devices: table,
            warnings,
            rollout: self.rollout_view(deployment),
        }
    }

    // ------------------------------------------------------------------------------
    // Regions
    // ------------------------------------------------------------------------------

    pub fn region_views(&self, now_ms: u64) -> Vec<RegionView> {
        self.config
            .regions
            .iter()
            .map(|region| {
                let in_region: Vec<&DeviceRecord> = self
                    .records
                    .devices
                    .values()
                    .filter(|d| d.region == region.name)
                    .collect();
                RegionView {
                    name: region.name.clone(),
                    carbon_zone: region.carbon_zone.clone(),
                    pools: region.pools.iter().map(super::views::pool_view).collect(),
                    devices: in_region.len(),
                    online: Some(
                        in_region
                            .iter()
                            .filter(|d| self.sessions.contains_key(&d.name))
                            .count(),
                    ),
                    health: Some(in_region.iter().fold(BTreeMap::new(), |mut counts, d| {
                        *counts
                            .entry(self.health_of(now_ms, &d.name).to_string())
                            .or_default() += 1;
                        counts
                    })),
                }
            })
            .collect()
    }
}
