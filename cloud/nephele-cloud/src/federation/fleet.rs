//! The fleet's catalogue and its rules, without IO: which deployments and models
//! exist (each manifest decoded and each selector parsed once, when it is stored, not
//! for every device on every broadcast), whether a new deployment is valid, which
//! deployments run on a device, and the whole desired state each device gets.
//!
//! The federation actor is its shell: it keeps the catalogue in step with every write
//! it makes to the store (it is the store's only writer), loads it at start, and hands
//! in what only it knows per device (the pool work its region placed, the measured
//! link and compute times a split cut is planned from).

use std::collections::{BTreeMap, HashMap};

use nephele_domain::{AgentRole, Labels, Selector};
use nephele_proto::{Assignment, DesiredState, ModelManifest, SignedManifest, VariantKind};

use super::views::DeploymentSpec;
use super::ApiError;
use crate::config::AutoscaleConfig;
use crate::scheduler::{PoolWork, ReplicaSpec};
use crate::store::{DeploymentRecord, DeviceRecord, ModelRecord};
use crate::variants::{Caps, MeasuredTimes, VariantDecision, PLANNED_SPLIT};

/// A deployment with its selector parsed.
#[derive(Debug, Clone)]
struct DeploymentEntry {
    record: DeploymentRecord,
    /// `None`: the stored selector does not parse (it matches no device).
    selector: Option<Selector>,
}

/// A stored model with its manifest decoded.
#[derive(Debug, Clone)]
struct ModelEntry {
    record: ModelRecord,
    manifest: Result<ModelManifest, String>,
}

/// What the federation knows of a device beyond its record, for its desired state.
#[derive(Debug, Clone, Copy, Default)]
pub struct DeviceInputs<'a> {
    /// What its region placed on it (pool agents).
    pub pool_work: Option<&'a PoolWork>,
    /// A pool replica of its region (name, capabilities): where a split tail runs.
    pub pool: Option<(&'a str, &'a Caps)>,
    /// The device's capabilities, worked out once from its profile (`None`: from the
    /// record's profile now).
    pub caps: Option<&'a Caps>,
    /// Batch 1's compute time of whole models as agents measured it, by (device,
    /// model), µs.
    pub measured_full_us: Option<&'a HashMap<(String, String), u64>>,
    /// The link the device last reported.
    pub link: Option<nephele_infer_policy::split::Link>,
}

/// The deployments and models of the fleet.
#[derive(Debug, Clone, Default)]
pub struct Catalog {
    deployments: BTreeMap<String, DeploymentEntry>,
    models: HashMap<String, ModelEntry>,
}

impl Catalog {
    /// The catalogue of what the store holds.
    pub fn load(deployments: Vec<DeploymentRecord>, models: Vec<ModelRecord>) -> Catalog {
        let mut catalog = Catalog::default();
        for model in models {
            catalog.put_model(model);
        }
        for deployment in deployments {
            catalog.put_deployment(deployment);
        }
        catalog
    }

    /// A deployment stored (new or replaced).
    pub fn put_deployment(&mut self, record: DeploymentRecord) {
        let selector = Selector::parse(&record.selector).ok();
        self.deployments
            .insert(record.name.clone(), DeploymentEntry { record, selector });
    }

    /// A deployment deleted; whether there was one.
    pub fn remove_deployment(&mut self, name: &str) -> bool {
        self.deployments.remove(name).is_some()
    }

    /// A model stored (new or replaced).
    pub fn put_model(&mut self, record: ModelRecord) {
        let manifest = nephele_proto::decode_payload::<ModelManifest>(&record.signed_manifest)
            .map_err(|error| error.to_string());
        self.models
            .insert(record.key(), ModelEntry { record, manifest });
    }

    /// A model removed (by its store key); whether there was one.
    pub fn remove_model(&mut self, key: &str) -> bool {
        self.models.remove(key).is_some()
    }

    pub fn deployment(&self, name: &str) -> Option<&DeploymentRecord> {
        self.deployments.get(name).map(|entry| &entry.record)
    }

    /// Every deployment, by name.
    pub fn deployments(&self) -> impl Iterator<Item = &DeploymentRecord> {
        self.deployments.values().map(|entry| &entry.record)
    }

    /// Every model (in no particular order).
    pub fn models(&self) -> impl Iterator<Item = &ModelRecord> {
        self.models.values().map(|entry| &entry.record)
    }

    /// The model stored under `key` (`name:version`, or a bare name from before
    /// versions).
    pub fn model(&self, key: &str) -> Option<&ModelRecord> {
        self.models.get(key).map(|entry| &entry.record)
    }

    /// The model a user's reference names: `name:version`, or `name` for its latest
    /// version.
    pub fn resolve(&self, reference: &str) -> Option<&ModelRecord> {
        match reference.split_once(':') {
            Some((name, version)) => self.model(reference).or_else(|| {
                self.models()
                    .find(|m| m.name == name && m.version_id() == version)
            }),
            None => self.latest(reference),
        }
    }

    /// The newest version of model `name`.
    pub fn latest(&self, name: &str) -> Option<&ModelRecord> {
        self.versions(name).pop()
    }

    /// Every version of model `name`, oldest first (by the order they were stored in,
    /// then, for versions stored before that order was kept, by creation time).
    pub fn versions(&self, name: &str) -> Vec<&ModelRecord> {
        let mut versions: Vec<&ModelRecord> = self.models().filter(|m| m.name == name).collect();
        versions.sort_by_key(|m| (m.sequence, m.created_unix, m.key()));
        versions
    }

    /// The `sequence` a new version of model `name` gets: one past its latest.
    pub fn next_sequence(&self, name: &str) -> u64 {
        self.models()
            .filter(|m| m.name == name)
            .map(|m| m.sequence)
            .max()
            .unwrap_or(0)
            + 1
    }

    /// The sha256 of every variant the model stored under `key` ships.
    pub fn variant_digests(&self, key: &str) -> Vec<[u8; 32]> {
        self.models
            .get(key)
            .and_then(|entry| entry.manifest.as_ref().ok())
            .map(|manifest| manifest.variants.iter().map(|v| v.sha256).collect())
            .unwrap_or_default()
    }

    /// The blobs (hex sha256) the model stored under `key` needs: its pushed file and
    /// every file its manifest ships (each variant, and a split variant's tail).
    pub fn blob_digests(&self, key: &str) -> Vec<String> {
        let Some(entry) = self.models.get(key) else {
            return Vec::new();
        };
        let mut digests = vec![entry.record.sha256.clone()];
        if let Ok(manifest) = &entry.manifest {
            for variant in &manifest.variants {
                digests.push(nephele_proto::digest_hex(&variant.sha256));
                if let nephele_proto::VariantKind::Split { tail_sha256, .. } = &variant.kind {
                    digests.push(nephele_proto::digest_hex(tail_sha256));
                }
            }
        }
        digests.sort();
        digests.dedup();
        digests
    }

    /// Checks a new deployment against the catalogue and returns the record to store.
    pub fn validate(
        &self,
        spec: DeploymentSpec,
        now_unix: u64,
        tenant: &str,
    ) -> Result<DeploymentRecord, ApiError> {
        if self.deployments.contains_key(&spec.name) {
            return Err(ApiError::Conflict(format!(
                "deployment {} already exists; `nephele deployment update {}` changes it (rolled out in steps)",
                spec.name, spec.name
            )));
        }
        self.check(spec, now_unix, tenant)
    }

    /// Checks a deployment spec (new or an update) of `tenant` and returns the record it
    /// makes, its model resolved to a version. Another tenant's model is not found.
    pub fn check(
        &self,
        spec: DeploymentSpec,
        now_unix: u64,
        tenant: &str,
    ) -> Result<DeploymentRecord, ApiError> {
        nephele_domain::validate_name("deployment", &spec.name).map_err(ApiError::BadRequest)?;
        Selector::parse(&spec.selector).map_err(|e| ApiError::BadRequest(e.to_string()))?;
        if spec.slo_ms == 0 || spec.slo_ms > 600_000 {
            return Err(ApiError::BadRequest(
                "slo_ms must be between 1 and 600000".into(),
            ));
        }
        if spec.max_queue == 0 || spec.max_queue > 100_000 {
            return Err(ApiError::BadRequest(
                "max_queue must be between 1 and 100000".into(),
            ));
        }
        if let Some(threshold) = spec.hard_example_threshold {
            if !(threshold > 0.0 && threshold < 1.0) {
                return Err(ApiError::BadRequest(
                    "hard_example_threshold must be a probability strictly between 0 and 1".into(),
                ));
            }
        }
        crate::replica_sizing::validate(&spec.replicas).map_err(ApiError::BadRequest)?;
        if let Some(settings) = &spec.rollout {
            settings.validate().map_err(ApiError::BadRequest)?;
        }
        let Some(model) = self.resolve(&spec.model).filter(|m| m.tenant == tenant) else {
            let known: Vec<String> = match spec.model.split_once(':') {
                Some((name, _)) => self
                    .versions(name)
                    .iter()
                    .filter(|m| m.tenant == tenant)
                    .map(|m| m.reference())
                    .collect(),
                None => Vec::new(),
            };
            return Err(ApiError::NotFound(if known.is_empty() {
                format!(
                    "no model named {}; upload it first (`nephele model push`)",
                    spec.model
                )
            } else {
                format!(
                    "model {} has no such version; it has {}",
                    spec.model,
                    known.join(", ")
                )
            }));
        };
        let view = super::views::model_view(model);
        let shippable = || view.variants.iter().filter(|v| v.rejected.is_none());
        if spec.variant == PLANNED_SPLIT {
            if !shippable().any(|v| v.cut.is_some()) {
                return Err(ApiError::BadRequest(format!(
                    "model {} has no shippable split variant for the planner to choose from",
                    spec.model
                )));
            }
        } else if spec.variant != "auto" && !shippable().any(|v| v.name == spec.variant) {
            let shipped: Vec<&str> = shippable().map(|v| v.name.as_str()).collect();
            return Err(ApiError::BadRequest(format!(
                "model {} has no shippable variant {:?}; choose auto, split (the planner picks the cut per device) or one of {}",
                spec.model,
                spec.variant,
                shipped.join(", ")
            )));
        }
        Ok(DeploymentRecord {
            name: spec.name,
            tenant: tenant.to_string(),
            model: model.key(),
            selector: spec.selector,
            slo_ms: spec.slo_ms,
            offload: spec.offload,
            max_queue: spec.max_queue,
            created_unix: now_unix,
            variant: spec.variant,
            hard_example_threshold: spec.hard_example_threshold,
            replicas: spec.replicas,
            rollout_settings: spec.rollout,
            rollout: None,
        })
    }

    /// Whether `deployment` runs on `device`: on an edge device, when its selector
    /// matches; on a pool agent, when it may offload and its region placed a replica
    /// there.
    pub fn runs_on(
        &self,
        device: &DeviceRecord,
        deployment: &DeploymentRecord,
        pool_work: Option<&PoolWork>,
    ) -> bool {
        match device.role {
            AgentRole::Edge => self
                .deployments
                .get(&deployment.name)
                .and_then(|entry| entry.selector.as_ref())
                .is_some_and(|selector| selector.matches_by(|key| device_label(device, key))),
            AgentRole::Pool => {
                deployment.offload
                    && pool_work.is_some_and(|work| work.deployments.contains(&deployment.name))
            }
        }
    }

    /// Whether an edge device runs a deployment whose cut is planned per device
    /// (`variant = "split"`): its desired state then depends on its link.
    pub fn plans_split(&self, device: &DeviceRecord) -> bool {
        device.role == AgentRole::Edge
            && self
                .deployments()
                .any(|d| d.variant == PLANNED_SPLIT && self.runs_on(device, d, None))
    }

    /// The model a deployment runs, when `variant` computes the whole model at full's
    /// speed (`full`, or weights-only int8): a compute time measured with it is the
    /// whole model's.
    pub fn whole_model_of(&self, deployment: &str, variant: &str) -> Option<&str> {
        let model = self.models.get(&self.deployment(deployment)?.model)?;
        let whole = model.manifest.as_ref().ok()?.variants.iter().any(|v| {
            v.name == variant && matches!(v.kind, VariantKind::Full | VariantKind::Int8Weights)
        });
        whole.then_some(model.record.name.as_str())
    }

    /// Every deployment that may offload, as its regions' replica spec and its latency
    /// target (ms).
    pub fn replica_specs(&self, defaults: &AutoscaleConfig) -> Vec<(ReplicaSpec, u32)> {
        self.deployments()
            .filter(|d| d.offload)
            .map(|d| {
                let model_bytes = self.model(&d.model).map_or(0, |m| m.size);
                crate::replica_sizing::replica_spec(d, model_bytes, defaults)
            })
            .collect()
    }

    /// The whole desired state of `device` at `generation`.
    pub fn desired_for(
        &self,
        device: &DeviceRecord,
        inputs: DeviceInputs<'_>,
        generation: u64,
    ) -> DesiredState {
        let mut assignments = Vec::new();
        for deployment in self.deployments() {
            if !self.runs_on(device, deployment, inputs.pool_work) {
                continue;
            }
            let deployment = &*deployment.for_device(&device.name);
            let Some(model) = self.models.get(&deployment.model) else {
                continue;
            };
            let mut variant = self.variant_for(device, deployment, model, inputs);
            if deployment.active_rollout().is_some() && is_split(model, &variant.variant) {
                // A split's tail runs on the pool replicas, which move to the new
                // version only when the rollout completes: until then a device keeps
                // the whole model, never a head whose tail is another version's.
                variant = VariantDecision {
                    variant: "full".into(),
                    why: "a rollout is under way: no split until it completes".into(),
                };
            }
            tracing::debug!(device = %device.name, deployment = %deployment.name, variant = %variant.variant, why = %variant.why, "variant chosen");
            assignments.push(Assignment {
                deployment: deployment.name.clone(),
                model: SignedManifest {
                    manifest: model.record.signed_manifest.clone(),
                    signature: model.record.signature.clone(),
                },
                variant: variant.variant,
                slo_ms: deployment.slo_ms,
                offload: deployment.offload,
                max_queue: deployment.max_queue,
                hard_example_threshold: deployment.hard_example_threshold,
            });
        }
        let jobs = match device.role {
            AgentRole::Pool => inputs
                .pool_work
                .map(|work| work.jobs.clone())
                .unwrap_or_default(),
            AgentRole::Edge => Vec::new(),
        };
        DesiredState {
            generation,
            assignments,
            jobs,
        }
    }

    fn variant_for(
        &self,
        device: &DeviceRecord,
        deployment: &DeploymentRecord,
        model: &ModelEntry,
        inputs: DeviceInputs<'_>,
    ) -> VariantDecision {
        let manifest = match &model.manifest {
            Ok(manifest) => manifest,
            Err(error) => {
                return VariantDecision {
                    variant: "full".into(),
                    why: format!("stored manifest unreadable: {error}"),
                }
            }
        };
        let own;
        let caps = match inputs.caps {
            Some(caps) => caps,
            None => {
                own = crate::variants::device_caps(&device.profile_toml);
                &own
            }
        };
        if device.role == AgentRole::Edge && deployment.variant == PLANNED_SPLIT {
            let time_of = |device: &str| {
                inputs
                    .measured_full_us
                    .and_then(|times| times.get(&(device.to_string(), model.record.name.clone())))
                    .copied()
            };
            let measured = MeasuredTimes {
                device_full_us: time_of(&device.name),
                pool_full_us: inputs.pool.and_then(|(name, _)| time_of(name)),
            };
            return crate::variants::split_for(
                manifest,
                caps,
                inputs.pool.map(|(_, caps)| caps),
                inputs.link,
                measured,
            );
        }
        crate::variants::variant_for(device.role, caps, manifest, &deployment.variant)
    }
}

/// Whether `variant` of the model is a split head.
fn is_split(model: &ModelEntry, variant: &str) -> bool {
    model.manifest.as_ref().is_ok_and(|manifest| {
        manifest
            .variants
            .iter()
            .any(|v| v.name == variant && matches!(v.kind, VariantKind::Split { .. }))
    })
}

/// A device's labels plus the implicit ones every device has.
/// One of [`device_labels`], looked up without building the map: what a selector
/// reads when it is matched against every device of a fleet.
pub fn device_label<'a>(device: &'a DeviceRecord, key: &str) -> Option<&'a str> {
    match key {
        "nephele.io/role" => Some(device.role.as_str()),
        "nephele.io/region" => Some(&device.region),
        "nephele.io/profile" if !device.profile_name.is_empty() => Some(&device.profile_name),
        "nephele.io/name" => Some(&device.name),
        _ => device.labels.get(key).map(String::as_str),
    }
}

pub fn device_labels(device: &DeviceRecord) -> Labels {
    let mut labels = device.labels.clone();
    labels.insert("nephele.io/role".into(), device.role.to_string());
    labels.insert("nephele.io/region".into(), device.region.clone());
    if !device.profile_name.is_empty() {
        labels.insert("nephele.io/profile".into(), device.profile_name.clone());
    }
    labels.insert("nephele.io/name".into(), device.name.clone());
    labels
}

#[cfg(test)]
#[path = "fleet_tests.rs"]
pub(super) mod tests;
