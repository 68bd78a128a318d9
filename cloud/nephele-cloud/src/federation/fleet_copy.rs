//! A read-only copy of the fleet's durable records, from which a standby replica
//! answers reads while another replica leads (or while none can be reached): devices,
//! models, deployments, join tokens, regions and usage, as the leader's API shows them.
//!
//! The copy is a [`FleetCore`] loaded from the store, kept private so that nothing but
//! its views can be asked of it: it runs no command, writes nothing and holds no keys.
//! What lives only in the leader's memory (sessions, heartbeats, what each device
//! reports running) is not in the store, so a copy cannot know it: those fields are
//! `null` in its answers (device `health` is `unknown`, a deployment row's `phase`
//! is `unknown`) rather than the `offline` and `pending` an empty session table would
//! suggest. Models still building on the leader are not in the store either.

use std::collections::HashMap;

use serde::Serialize;
use serde_json::Value;

use super::authority::NoKeys;
use super::fleet_core::FleetCore;
use super::fleet_store::Snapshot;
use super::{ApiError, Principal};
use crate::config::CloudConfig;

/// A read a copy can answer (`GET` only).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CopyRead {
    Devices,
    DeviceUsage(String),
    Models,
    Model(String),
    Deployments,
    Deployment(String),
    DeploymentDevices(String),
    Rollout(String),
    JoinTokens,
    Regions,
}

impl CopyRead {
    /// The read `method` and `path` (without its query) ask for, if a copy can answer
    /// it; `None` for writes and for reads of what only the leader holds (the regions'
    /// books, metrics, logs).
    pub fn parse(method: &str, path: &str) -> Option<CopyRead> {
        if method != "GET" {
            return None;
        }
        let segments: Vec<&str> = path
            .strip_prefix("/v1/")?
            .trim_end_matches('/')
            .split('/')
            .collect();
        let name = |s: &str| (!s.is_empty()).then(|| s.to_string());
        Some(match segments.as_slice() {
            ["devices"] => CopyRead::Devices,
            ["devices", device, "usage"] => CopyRead::DeviceUsage(name(device)?),
            ["models"] => CopyRead::Models,
            ["models", model] => CopyRead::Model(name(model)?),
            ["deployments"] => CopyRead::Deployments,
            ["deployments", deployment] => CopyRead::Deployment(name(deployment)?),
            ["deployments", deployment, "devices"] => {
                CopyRead::DeploymentDevices(name(deployment)?)
            }
            ["deployments", deployment, "rollout"] => CopyRead::Rollout(name(deployment)?),
            ["tokens"] => CopyRead::JoinTokens,
            ["regions"] => CopyRead::Regions,
            _ => return None,
        })
    }
}

impl CopyRead {
    /// The path it reads (for the access table).
    pub fn path(&self) -> String {
        match self {
            CopyRead::Devices => "/v1/devices".into(),
            CopyRead::DeviceUsage(d) => format!("/v1/devices/{d}/usage"),
            CopyRead::Models => "/v1/models".into(),
            CopyRead::Model(m) => format!("/v1/models/{m}"),
            CopyRead::Deployments => "/v1/deployments".into(),
            CopyRead::Deployment(d) => format!("/v1/deployments/{d}"),
            CopyRead::DeploymentDevices(d) => format!("/v1/deployments/{d}/devices"),
            CopyRead::Rollout(d) => format!("/v1/deployments/{d}/rollout"),
            CopyRead::JoinTokens => "/v1/tokens".into(),
            CopyRead::Regions => "/v1/regions".into(),
        }
    }
}

/// Device fields only the leader knows.
const DEVICE_LIVE: [&str; 10] = [
    "online",
    "last_heartbeat_ms_ago",
    "connected_for_s",
    "session",
    "address",
    "rss_bytes",
    "link",
    "local_endpoint",
    "deployments",
    "running",
];
/// A deployment's per-device fields only the leader knows.
const ROW_LIVE: [&str; 11] = [
    "online",
    "ready",
    "current",
    "variant",
    "served_local",
    "served_offloaded",
    "failed",
    "queue_len",
    "service_ms",
    "p50_ms",
    "p99_ms",
];

pub struct FleetCopy {
    core: FleetCore,
}

impl FleetCopy {
    /// A copy of what `snapshot` holds.
    pub fn new(config: CloudConfig, snapshot: Snapshot) -> FleetCopy {
        FleetCopy {
            core: FleetCore::new(config, Box::new(NoKeys), snapshot, 0, HashMap::new()),
        }
    }

    /// Who a bearer token speaks for, by the token hashes in the copy (a token made on
    /// the leader since the copy was loaded is not known yet).
    pub fn authenticate(&self, token: &str, now_unix: u64) -> Result<Principal, String> {
        self.core
            .authenticate(token, now_unix)
            .ok_or_else(|| self.core.why_refused(token, now_unix))
    }

    /// The answer to `read` for a token of `scope` (see [`Principal::scope`]), as JSON
    /// in the leader's shapes.
    pub fn answer(&self, read: &CopyRead, scope: Option<&str>) -> Result<Value, ApiError> {
        let core = &self.core;
        match read {
            CopyRead::Devices => {
                let mut devices = json(core.device_views(0))?;
                for device in array(&mut devices) {
                    unknown(device, &DEVICE_LIVE);
                    device["health"] = "unknown".into();
                }
                Ok(devices)
            }
            CopyRead::DeviceUsage(name) => json(core.usage_for(name, scope)?),
            CopyRead::Models => json(core.model_views_for(scope)),
            CopyRead::Model(name) => json(core.model_view_for(name, scope)?),
            CopyRead::Deployments => {
                let mut deployments = json(core.deployment_statuses_for(scope, true))?;
                for deployment in array(&mut deployments) {
                    deployment_unknown(deployment);
                }
                Ok(deployments)
            }
            CopyRead::Deployment(name) => {
                let mut deployment = json(core.deployment_status_for(name, scope, true)?)?;
                deployment_unknown(&mut deployment);
                Ok(deployment)
            }
            CopyRead::DeploymentDevices(name) => {
                let mut deployment = json(core.deployment_status_for(name, scope, true)?)?;
                deployment_unknown(&mut deployment);
                Ok(deployment["devices"].take())
            }
            CopyRead::Rollout(name) => {
                match core.deployment_status_for(name, scope, false)?.rollout {
                    // Everything a rollout holds is in its record: nothing live to hide.
                    Some(rollout) => json(rollout),
                    None => Err(ApiError::NotFound(format!(
                        "deployment {name} has never been rolled out"
                    ))),
                }
            }
            CopyRead::JoinTokens => json(core.join_tokens()),
            CopyRead::Regions => {
                let mut regions = json(core.region_views(0))?;
                for region in array(&mut regions) {
                    unknown(region, &["online", "health"]);
                }
                Ok(regions)
            }
        }
    }
}

fn json(view: impl Serialize) -> Result<Value, ApiError> {
    serde_json::to_value(view).map_err(|e| ApiError::Internal(format!("cannot encode: {e}")))
}

fn array(value: &mut Value) -> impl Iterator<Item = &mut Value> {
    value.as_array_mut().into_iter().flatten()
}

fn unknown(object: &mut Value, fields: &[&str]) {
    for field in fields {
        if let Some(value) = object.get_mut(*field) {
            *value = Value::Null;
        }
    }
}

fn deployment_unknown(deployment: &mut Value) {
    unknown(deployment, &["ready_devices", "device_phases", "totals"]);
    if let Some(rows) = deployment.get_mut("devices") {
        for row in array(rows) {
            unknown(row, &ROW_LIVE);
            row["phase"] = "unknown".into();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::federation::fleet::tests::{device, model, spec};
    use crate::federation::fleet_store::{FleetStore, MemoryStore, Record, Write};
    use crate::store::ApiTokenRecord;
    use nephele_domain::AgentRole;

    #[test]
    fn reads_are_told_from_writes_and_from_what_only_the_leader_has() {
        use CopyRead::*;
        assert_eq!(CopyRead::parse("GET", "/v1/devices"), Some(Devices));
        assert_eq!(CopyRead::parse("GET", "/v1/devices/"), Some(Devices));
        assert_eq!(
            CopyRead::parse("GET", "/v1/devices/cam-1/usage"),
            Some(DeviceUsage("cam-1".into()))
        );
        assert_eq!(
            CopyRead::parse("GET", "/v1/models/m"),
            Some(Model("m".into()))
        );
        assert_eq!(
            CopyRead::parse("GET", "/v1/deployments/d"),
            Some(Deployment("d".into()))
        );
        assert_eq!(CopyRead::parse("GET", "/v1/tokens"), Some(JoinTokens));
        assert_eq!(CopyRead::parse("GET", "/v1/regions"), Some(Regions));
        for (method, path) in [
            ("POST", "/v1/deployments"),
            ("DELETE", "/v1/devices/cam-1"),
            ("PUT", "/v1/models/m"),
            ("GET", "/v1/jobs"),
            ("GET", "/v1/deployments/d/replicas"),
            ("GET", "/v1/regions/eu/nodes"),
            ("GET", "/metrics"),
            ("GET", "/v1/models//x"),
            ("GET", "/v2/models"),
        ] {
            assert_eq!(CopyRead::parse(method, path), None, "{method} {path}");
        }
    }

    #[test]
    fn a_copy_answers_from_the_store_and_says_what_it_cannot_know() {
        let store = MemoryStore::default();
        let token = "tok1.secret";
        let deployment = crate::federation::fleet::Catalog::load(vec![], vec![model("m")])
            .validate(spec("d", "m", "", "auto"), 1, "default")
            .expect("valid");
        store
            .commit(&[
                Write::Put(Record::Model(Box::new(model("m")))),
                Write::Put(Record::Device(device("cam-1", AgentRole::Edge, &[]))),
                Write::Put(Record::Deployment(deployment)),
                Write::Put(Record::ApiToken(ApiTokenRecord {
                    id: "tok1".into(),
                    sha256: crate::federation::sha256_hex(token.as_bytes()),
                    role: crate::federation::Role::Admin,
                    tenant: "default".into(),
                    created_unix: 1,
                    name: String::new(),
                    created_by: String::new(),
                    expires_unix: None,
                    revoked_unix: None,
                    rotated_unix: None,
                })),
            ])
            .expect("commit");
        let copy = FleetCopy::new(CloudConfig::default(), store.load().expect("load"));

        let admin = copy.authenticate(token, 2).expect("known");
        assert_eq!(admin.role, crate::federation::Role::Admin);
        assert!(copy.authenticate("tok1.wrong", 2).is_err());
        assert!(copy.authenticate("nobody.secret", 2).is_err());
        // Another tenant's viewer sees none of this tenant's models or deployments.
        let other = Some("team-b");
        assert_eq!(
            copy.answer(&CopyRead::Models, other).expect("models"),
            serde_json::json!([])
        );
        assert!(matches!(
            copy.answer(&CopyRead::Deployment("d".into()), other),
            Err(ApiError::NotFound(_))
        ));

        let devices = copy.answer(&CopyRead::Devices, None).expect("devices");
        assert_eq!(devices[0]["name"], "cam-1");
        assert_eq!(devices[0]["health"], "unknown");
        assert_eq!(devices[0]["online"], Value::Null);
        assert_eq!(devices[0]["region"], "eu");

        let deployment = copy
            .answer(&CopyRead::Deployment("d".into()), None)
            .expect("deployment");
        // A record from before versions reads as the version its digest gives.
        assert_eq!(deployment["model"], "m:00");
        assert_eq!(deployment["devices"][0]["current"], Value::Null);
        assert_eq!(deployment["desired_devices"], 1);
        assert_eq!(deployment["ready_devices"], Value::Null);
        assert_eq!(deployment["devices"][0]["device"], "cam-1");
        assert_eq!(deployment["devices"][0]["phase"], "unknown");
        assert_eq!(deployment["devices"][0]["ready"], Value::Null);
        assert_eq!(deployment["device_phases"], Value::Null);
        // The rows alone, as the leader pages them; a copy answers them whole.
        let rows = copy
            .answer(&CopyRead::DeploymentDevices("d".into()), None)
            .expect("rows");
        assert_eq!(rows, deployment["devices"]);
        assert_eq!(
            CopyRead::parse("GET", "/v1/deployments/d/devices"),
            Some(CopyRead::DeploymentDevices("d".into()))
        );

        let models = copy.answer(&CopyRead::Models, None).expect("models");
        assert_eq!(models[0]["name"], "m");
        assert!(matches!(
            copy.answer(&CopyRead::Model("nope".into()), None),
            Err(ApiError::NotFound(_))
        ));
        assert!(matches!(
            copy.answer(&CopyRead::Deployment("nope".into()), None),
            Err(ApiError::NotFound(_))
        ));
        assert_eq!(
            CopyRead::parse("GET", "/v1/deployments/d/rollout"),
            Some(CopyRead::Rollout("d".into()))
        );
        assert!(matches!(
            copy.answer(&CopyRead::Rollout("d".into()), None),
            Err(ApiError::NotFound(ref m)) if m.contains("never been rolled out")
        ));
    }
}
