//! Durable control-plane state in an embedded redb database (the default) or an etcd
//! cluster (`store/etcd.rs`, `[store] etcd_endpoints`), plus content-addressed blobs
//! (model files) as plain files in the data dir.
//!
//! One writer per table: the federation actor writes the fleet's tables (tokens,
//! devices, models, deployments); each region actor writes only its own region's rows
//! of the region tables (keys start with `<region>/`). Values are JSON so the file can
//! be inspected with ordinary tools during incidents. Every write is one redb
//! transaction, durable when it returns.

use std::path::{Path, PathBuf};

use redb::{Database, ReadableDatabase, ReadableTable, TableDefinition};
use serde::{de::DeserializeOwned, Deserialize, Serialize};

use nephele_domain::{AgentRole, Labels};

pub mod etcd;

#[derive(Debug, Clone, Copy)]
pub enum Table {
    JoinTokens,
    Devices,
    Models,
    Deployments,
    ApiTokens,
    Meta,
    /// `<region>/<tenant>/<job>` → a region's job (or replica) record.
    RegionJobs,
    /// `<region>/<node>` → a region's node slot.
    RegionNodes,
    /// `<region>` → the rest of a region's books (grid, replica sets, autoscalers).
    RegionState,
    /// `<device>` → what the device reported serving (`federation::usage`).
    Usage,
    /// `<seq>` → one entry of the API's audit log.
    Audit,
    /// `<region>/<hour>` → one hour of a region's ledger (`scheduler::ledger`).
    RegionLedger,
    /// `<hour>/<deployment>` → what devices served of a deployment in one hour
    /// (`federation::usage`).
    UsageHours,
    /// `<name>` → a tenant with its weight and quotas ([`TenantRecord`]).
    Tenants,
}

impl Table {
    /// The table's name (redb's table, etcd's key segment).
    pub fn name(self) -> &'static str {
        match self {
            Table::JoinTokens => "join_tokens",
            Table::Devices => "devices",
            Table::Models => "models",
            Table::Deployments => "deployments",
            Table::ApiTokens => "api_tokens",
            Table::Meta => "meta",
            Table::RegionJobs => "region_jobs",
            Table::RegionNodes => "region_nodes",
            Table::RegionState => "region_state",
            Table::Usage => "usage",
            Table::Audit => "audit",
            Table::RegionLedger => "region_ledger",
            Table::UsageHours => "usage_hours",
            Table::Tenants => "tenants",
        }
    }

    fn definition(self) -> TableDefinition<'static, &'static str, &'static [u8]> {
        TableDefinition::new(self.name())
    }
    const ALL: [Table; 14] = [
        Table::JoinTokens,
        Table::Devices,
        Table::Models,
        Table::Deployments,
        Table::ApiTokens,
        Table::Meta,
        Table::RegionJobs,
        Table::RegionNodes,
        Table::RegionState,
        Table::Usage,
        Table::Audit,
        Table::RegionLedger,
        Table::UsageHours,
        Table::Tenants,
    ];
}

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("state store: {0}")]
    Db(String),
    #[error("state store: corrupt record {key:?}: {cause}")]
    Corrupt { key: String, cause: String },
    #[error("blob store: {0}")]
    Io(#[from] std::io::Error),
    /// The store cannot take writes now (an etcd cluster without a quorum); the API
    /// answers 503 with this.
    #[error("state store unavailable: {0}")]
    Unavailable(String),
    /// This replica lost its leadership (etcd): it must stop acting.
    #[error("state store: {0}")]
    Fenced(String),
}

fn db_error(error: impl std::fmt::Display) -> StoreError {
    StoreError::Db(error.to_string())
}

/// A tenant as the store keeps it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TenantRecord {
    pub tenant: crate::config::TenantConfig,
    pub created_unix: u64,
    pub updated_unix: u64,
    /// Who made the last change (`config` when the config's `[[tenant]]` created it).
    pub updated_by: String,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct JoinTokenRecord {
    pub id: String,
    pub secret_sha256: String,
    pub region: String,
    pub created_unix: u64,
    pub expires_unix: u64,
    pub used_by: Option<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct DeviceRecord {
    pub name: String,
    pub role: AgentRole,
    pub region: String,
    pub labels: Labels,
    pub cert_sha256: String,
    /// A certificate renewed over a session and not yet used to connect: accepted as
    /// well as `cert_sha256` until the agent first connects with it, which makes it the
    /// current one (so an agent that crashed while storing its new certificate can still
    /// connect with the old).
    #[serde(default)]
    pub next_cert_sha256: Option<String>,
    pub joined_unix: u64,
    /// Last profile the agent announced (name and TOML), kept so offline devices still
    /// show what they are.
    pub profile_name: String,
    pub profile_toml: String,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ModelRecord {
    pub name: String,
    /// The version: the first 12 hex digits of `sha256` (content-addressed, so a
    /// version never changes). Records from before versions have none: they are keyed
    /// by the bare name and read as the version their digest gives.
    #[serde(default)]
    pub version: String,
    pub sha256: String,
    pub size: u64,
    pub created_unix: u64,
    pub inputs: Vec<nephele_runtime::TensorInfo>,
    pub outputs: Vec<nephele_runtime::TensorInfo>,
    pub signed_manifest: Vec<u8>,
    pub signature: Vec<u8>,
    /// Every variant built on push, shipped or not (records from before variants have
    /// none and read as `full` only).
    #[serde(default)]
    pub variants: Vec<VariantRecord>,
    /// What the variants were measured on.
    #[serde(default)]
    pub validation: String,
    /// The manifest format (`onnx`, `candle-bert-gguf`); records from before formats
    /// are ONNX.
    #[serde(default = "onnx_format")]
    pub format: String,
    /// The `--input` specs applied to the pushed file.
    #[serde(default)]
    pub input_specs: Vec<String>,
    /// Recurrent state of a stateful model (`--state INPUT=OUTPUT`).
    #[serde(default)]
    pub recurrent_state: Vec<nephele_proto::StateBinding>,
    /// The SHA-256 of the labelled validation rows its accuracy was measured on
    /// (`None`: no labels), so a rollout compares two versions only on the same rows.
    #[serde(default)]
    pub validation_sha256: Option<String>,
    /// The tenant that pushed it: only its tokens (and admins) see and deploy it.
    #[serde(default = "default_tenant")]
    pub tenant: String,
    /// The order of the versions stored under this name (1 for the first; 0 for those
    /// stored before the order was kept): the latest is the highest, whatever the
    /// clock's one-second resolution says of two pushes in the same second.
    #[serde(default)]
    pub sequence: u64,
}

/// Digits of the sha256 that name a model version.
pub const VERSION_DIGITS: usize = 12;

impl ModelRecord {
    /// The version as shown and referred to (`name:version`).
    pub fn version_id(&self) -> &str {
        if self.version.is_empty() {
            self.sha256.get(..VERSION_DIGITS).unwrap_or(&self.sha256)
        } else {
            &self.version
        }
    }

    /// Where the store keeps it: `name:version`, or the bare name for a record from
    /// before versions.
    pub fn key(&self) -> String {
        if self.version.is_empty() {
            self.name.clone()
        } else {
            format!("{}:{}", self.name, self.version)
        }
    }

    /// `name:version`.
    pub fn reference(&self) -> String {
        format!("{}:{}", self.name, self.version_id())
    }
}

fn onnx_format() -> String {
    nephele_runtime::FORMAT_ONNX.to_string()
}

/// One variant as built and measured on push (the API's view of it is the record).
pub type VariantRecord = nephele_api::VariantView;

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct DeploymentRecord {
    pub name: String,
    pub model: String,
    pub selector: String,
    pub slo_ms: u32,
    pub offload: bool,
    pub max_queue: u32,
    pub created_unix: u64,
    /// `auto` or a variant name (records from before variants read as `auto`).
    #[serde(default = "auto")]
    pub variant: String,
    #[serde(default)]
    pub hard_example_threshold: Option<f32>,
    /// How its cloud replicas are sized and scaled (records from before replicas take
    /// the control plane's defaults).
    #[serde(default)]
    pub replicas: ReplicaSettings,
    /// How its updates roll out (absent: the defaults).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rollout_settings: Option<crate::rollout::RolloutSettings>,
    /// Its latest rollout: under way, or how the last one ended.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rollout: Option<Box<crate::rollout::Rollout>>,
    /// The tenant it belongs to.
    #[serde(default = "default_tenant")]
    pub tenant: String,
}

impl DeploymentRecord {
    /// What its devices run when no rollout holds them apart.
    pub fn runtime(&self) -> crate::rollout::RuntimeSpec {
        crate::rollout::RuntimeSpec {
            model: self.model.clone(),
            variant: self.variant.clone(),
            slo_ms: self.slo_ms,
            offload: self.offload,
            max_queue: self.max_queue,
            hard_example_threshold: self.hard_example_threshold,
        }
    }

    /// The record with `runtime` in place of its own.
    pub fn with_runtime(&self, runtime: &crate::rollout::RuntimeSpec) -> DeploymentRecord {
        DeploymentRecord {
            model: runtime.model.clone(),
            variant: runtime.variant.clone(),
            slo_ms: runtime.slo_ms,
            offload: runtime.offload,
            max_queue: runtime.max_queue,
            hard_example_threshold: runtime.hard_example_threshold,
            ..self.clone()
        }
    }

    /// The rollout under way (progressing or paused), if any.
    pub fn active_rollout(&self) -> Option<&crate::rollout::Rollout> {
        self.rollout.as_deref().filter(|r| r.state.active())
    }

    /// What `device` runs: the new version if a rollout under way moved it.
    pub fn for_device(&self, device: &str) -> std::borrow::Cow<'_, DeploymentRecord> {
        match self.active_rollout() {
            Some(rollout) if rollout.runs_new(device) => {
                std::borrow::Cow::Owned(self.with_runtime(&rollout.to))
            }
            _ => std::borrow::Cow::Borrowed(self),
        }
    }
}

pub use nephele_api::ReplicaSettings;

fn auto() -> String {
    "auto".into()
}

/// An API token: its id (the public half before the dot) and the hash of the whole
/// token; the secret itself is never stored.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ApiTokenRecord {
    pub id: String,
    pub sha256: String,
    pub role: nephele_api::Role,
    pub tenant: String,
    pub created_unix: u64,
    /// What it is for, as its creator said (records from before names have none).
    #[serde(default)]
    pub name: String,
    /// Who created it (`bootstrap` for the first admin token).
    #[serde(default)]
    pub created_by: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_unix: Option<u64>,
    /// When it was revoked: kept, so the audit log's token ids still resolve.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revoked_unix: Option<u64>,
    /// When its secret was last replaced.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rotated_unix: Option<u64>,
}

pub use nephele_api::AuditRecord;

/// The tenant of records from before tenants owned models and deployments.
pub fn default_tenant() -> String {
    "default".into()
}

/// Where the records live.
#[derive(Clone)]
enum Backend {
    Redb(std::sync::Arc<Database>),
    Etcd(std::sync::Arc<etcd::Etcd>),
}

/// Cheap to clone: every clone is the same database.
#[derive(Clone)]
pub struct Store {
    backend: Backend,
    blob_dir: PathBuf,
}

pub(crate) fn decode<T: DeserializeOwned>(key: &str, bytes: &[u8]) -> Result<T, StoreError> {
    serde_json::from_slice(bytes).map_err(|e| StoreError::Corrupt {
        key: key.to_string(),
        cause: e.to_string(),
    })
}

impl Store {
    /// The records in the etcd cluster at `endpoints` under `prefix`; blobs in
    /// `shared_dir` (which several control planes must share, see the README).
    pub fn open_etcd(
        shared_dir: &Path,
        endpoints: &[String],
        prefix: &str,
    ) -> Result<Store, StoreError> {
        let blob_dir = shared_dir.join("blobs");
        std::fs::create_dir_all(&blob_dir)?;
        let etcd = etcd::Etcd::connect(endpoints, prefix)?;
        Ok(Store {
            backend: Backend::Etcd(std::sync::Arc::new(etcd)),
            blob_dir,
        })
    }

    /// Which backend holds the records, for logs.
    pub fn describe(&self) -> &'static str {
        match self.backend {
            Backend::Redb(_) => "redb",
            Backend::Etcd(_) => "etcd",
        }
    }

    fn db(&self) -> Option<&Database> {
        match &self.backend {
            Backend::Redb(db) => Some(db),
            Backend::Etcd(_) => None,
        }
    }

    pub fn open(data_dir: &Path) -> Result<Store, StoreError> {
        Store::open_with_blobs(data_dir, &data_dir.join("blobs"))
    }

    /// The redb file in `data_dir`, blobs in `blob_dir`.
    pub fn open_with_blobs(data_dir: &Path, blob_dir: &Path) -> Result<Store, StoreError> {
        let db = Database::create(data_dir.join("state.redb")).map_err(db_error)?;
        let blob_dir = blob_dir.to_path_buf();
        std::fs::create_dir_all(&blob_dir)?;
        let txn = db.begin_write().map_err(db_error)?;
        for table in Table::ALL {
            txn.open_table(table.definition()).map_err(db_error)?;
        }
        txn.commit().map_err(db_error)?;
        Ok(Store {
            backend: Backend::Redb(std::sync::Arc::new(db)),
            blob_dir,
        })
    }

    /// Every record whose key starts with `prefix`, with its key.
    pub fn list_prefix<T: DeserializeOwned>(
        &self,
        table: Table,
        prefix: &str,
    ) -> Result<Vec<(String, T)>, StoreError> {
        let Some(db) = self.db() else {
            return self.etcd_list(table, prefix);
        };
        let txn = db.begin_read().map_err(db_error)?;
        let open = txn.open_table(table.definition()).map_err(db_error)?;
        let mut out = Vec::new();
        for entry in open.range(prefix..).map_err(db_error)? {
            let (key, value) = entry.map_err(db_error)?;
            let key = key.value().to_string();
            if !key.starts_with(prefix) {
                break;
            }
            let record =
                serde_json::from_slice(value.value()).map_err(|e| StoreError::Corrupt {
                    key: key.clone(),
                    cause: e.to_string(),
                })?;
            out.push((key, record));
        }
        Ok(out)
    }

    /// Writes `puts` (already JSON) and removes `deletes`, in one transaction: all of
    /// it is durable, or none.
    pub fn apply(
        &self,
        table: Table,
        puts: &[(String, Vec<u8>)],
        deletes: &[String],
    ) -> Result<(), StoreError> {
        if puts.is_empty() && deletes.is_empty() {
            return Ok(());
        }
        let Some(db) = self.db() else {
            let mut ops: Vec<etcd::Op> = puts
                .iter()
                .map(|(key, bytes)| etcd::Op::Put {
                    key: self.etcd_key(table, key),
                    value: bytes.clone(),
                })
                .collect();
            ops.extend(deletes.iter().map(|key| etcd::Op::Delete {
                key: self.etcd_key(table, key),
            }));
            return self.etcd()?.txn(&ops);
        };
        let txn = db.begin_write().map_err(db_error)?;
        {
            let mut open = txn.open_table(table.definition()).map_err(db_error)?;
            for (key, bytes) in puts {
                open.insert(key.as_str(), bytes.as_slice())
                    .map_err(db_error)?;
            }
            for key in deletes {
                open.remove(key.as_str()).map_err(db_error)?;
            }
        }
        txn.commit().map_err(db_error)
    }

    /// Puts (`Some(json)`) and deletes (`None`) across tables in one transaction: all
    /// of it is durable, or none (a device removed together with its usage, say).
    pub fn write_batch(&self, ops: &[(Table, String, Option<Vec<u8>>)]) -> Result<(), StoreError> {
        if ops.is_empty() {
            return Ok(());
        }
        let Some(db) = self.db() else {
            let ops: Vec<etcd::Op> = ops
                .iter()
                .map(|(table, key, value)| match value {
                    Some(bytes) => etcd::Op::Put {
                        key: self.etcd_key(*table, key),
                        value: bytes.clone(),
                    },
                    None => etcd::Op::Delete {
                        key: self.etcd_key(*table, key),
                    },
                })
                .collect();
            return self.etcd()?.txn(&ops);
        };
        let txn = db.begin_write().map_err(db_error)?;
        for (table, key, value) in ops {
            let mut open = txn.open_table(table.definition()).map_err(db_error)?;
            match value {
                Some(bytes) => {
                    open.insert(key.as_str(), bytes.as_slice())
                        .map_err(db_error)?;
                }
                None => {
                    open.remove(key.as_str()).map_err(db_error)?;
                }
            }
        }
        txn.commit().map_err(db_error)
    }

    pub fn put<T: Serialize>(&self, table: Table, key: &str, value: &T) -> Result<(), StoreError> {
        let bytes = serde_json::to_vec(value).map_err(db_error)?;
        let Some(db) = self.db() else {
            let key = self.etcd_key(table, key);
            return self.etcd()?.txn(&[etcd::Op::Put { key, value: bytes }]);
        };
        let txn = db.begin_write().map_err(db_error)?;
        {
            let mut open = txn.open_table(table.definition()).map_err(db_error)?;
            open.insert(key, bytes.as_slice()).map_err(db_error)?;
        }
        txn.commit().map_err(db_error)
    }

    pub fn get<T: DeserializeOwned>(
        &self,
        table: Table,
        key: &str,
    ) -> Result<Option<T>, StoreError> {
        let Some(db) = self.db() else {
            let found = self.etcd()?.get(&self.etcd_key(table, key))?;
            return found.map(|bytes| decode(key, &bytes)).transpose();
        };
        let txn = db.begin_read().map_err(db_error)?;
        let open = txn.open_table(table.definition()).map_err(db_error)?;
        let Some(guard) = open.get(key).map_err(db_error)? else {
            return Ok(None);
        };
        serde_json::from_slice(guard.value())
            .map(Some)
            .map_err(|e| StoreError::Corrupt {
                key: key.to_string(),
                cause: e.to_string(),
            })
    }

    pub fn list<T: DeserializeOwned>(&self, table: Table) -> Result<Vec<T>, StoreError> {
        let Some(db) = self.db() else {
            return Ok(self
                .etcd_list(table, "")?
                .into_iter()
                .map(|(_, record)| record)
                .collect());
        };
        let txn = db.begin_read().map_err(db_error)?;
        let open = txn.open_table(table.definition()).map_err(db_error)?;
        let mut out = Vec::new();
        for entry in open.iter().map_err(db_error)? {
            let (key, value) = entry.map_err(db_error)?;
            out.push(
                serde_json::from_slice(value.value()).map_err(|e| StoreError::Corrupt {
                    key: key.value().to_string(),
                    cause: e.to_string(),
                })?,
            );
        }
        Ok(out)
    }

    /// Every record of each of `tables` (its key, its JSON), all read at one point: one
    /// redb read transaction, or one etcd revision.
    pub fn list_together(&self, tables: &[Table]) -> Result<Vec<etcd::KeyValues>, StoreError> {
        let Some(db) = self.db() else {
            let prefixes: Vec<String> = tables.iter().map(|t| self.etcd_key(*t, "")).collect();
            let lists = self.etcd()?.list_together(&prefixes)?;
            return Ok(lists
                .into_iter()
                .zip(&prefixes)
                .map(|(list, prefix)| {
                    list.into_iter()
                        .map(|(key, value)| {
                            let key = key.strip_prefix(prefix.as_str()).unwrap_or(&key);
                            (key.to_string(), value)
                        })
                        .collect()
                })
                .collect());
        };
        let txn = db.begin_read().map_err(db_error)?;
        tables
            .iter()
            .map(|table| {
                let open = txn.open_table(table.definition()).map_err(db_error)?;
                let mut out = Vec::new();
                for entry in open.iter().map_err(db_error)? {
                    let (key, value) = entry.map_err(db_error)?;
                    out.push((key.value().to_string(), value.value().to_vec()));
                }
                Ok(out)
            })
            .collect()
    }

    pub fn delete(&self, table: Table, key: &str) -> Result<bool, StoreError> {
        let Some(db) = self.db() else {
            return self.etcd()?.delete(&self.etcd_key(table, key));
        };
        let txn = db.begin_write().map_err(db_error)?;
        let existed = {
            let mut open = txn.open_table(table.definition()).map_err(db_error)?;
            let removed = open.remove(key).map_err(db_error)?.is_some();
            removed
        };
        txn.commit().map_err(db_error)?;
        Ok(existed)
    }

    /// The etcd client, when the records are in etcd (for leader election).
    pub fn etcd_client(&self) -> Option<std::sync::Arc<etcd::Etcd>> {
        match &self.backend {
            Backend::Etcd(etcd) => Some(etcd.clone()),
            Backend::Redb(_) => None,
        }
    }

    /// Writes `value` at `key` in `table` unless there is one; whether it was written.
    pub fn put_if_absent<T: Serialize>(
        &self,
        table: Table,
        key: &str,
        value: &T,
    ) -> Result<bool, StoreError> {
        let bytes = serde_json::to_vec(value).map_err(db_error)?;
        let Some(db) = self.db() else {
            return self
                .etcd()?
                .put_if_absent(&self.etcd_key(table, key), &bytes);
        };
        let txn = db.begin_write().map_err(db_error)?;
        let written = {
            let mut open = txn.open_table(table.definition()).map_err(db_error)?;
            let exists = open.get(key).map_err(db_error)?.is_some();
            if !exists {
                open.insert(key, bytes.as_slice()).map_err(db_error)?;
            }
            !exists
        };
        txn.commit().map_err(db_error)?;
        Ok(written)
    }

    fn etcd(&self) -> Result<&etcd::Etcd, StoreError> {
        match &self.backend {
            Backend::Etcd(etcd) => Ok(etcd),
            Backend::Redb(_) => Err(StoreError::Db("not an etcd store".into())),
        }
    }

    fn etcd_key(&self, table: Table, key: &str) -> String {
        match &self.backend {
            Backend::Etcd(etcd) => etcd.key(table.name(), key),
            Backend::Redb(_) => key.to_string(),
        }
    }

    /// `table`'s records whose keys start with `prefix`, with their keys (without the
    /// table's prefix), in key order.
    fn etcd_list<T: DeserializeOwned>(
        &self,
        table: Table,
        prefix: &str,
    ) -> Result<Vec<(String, T)>, StoreError> {
        let table_prefix = self.etcd_key(table, "");
        self.etcd()?
            .list(&self.etcd_key(table, prefix))?
            .into_iter()
            .map(|(key, bytes)| {
                let key = key.strip_prefix(&table_prefix).unwrap_or(&key).to_string();
                let record = decode(&key, &bytes)?;
                Ok((key, record))
            })
            .collect()
    }

    pub fn blob_path(&self, sha256_hex: &str) -> PathBuf {
        self.blob_dir.join(sha256_hex)
    }

    /// Writes a blob atomically (temp file, fsync, rename).
    pub fn put_blob(&self, sha256_hex: &str, bytes: &[u8]) -> Result<(), StoreError> {
        write_blob(&self.blob_dir, sha256_hex, bytes)
    }

    pub fn blob_dir(&self) -> &Path {
        &self.blob_dir
    }
}

/// Writes a blob into `blob_dir` atomically (temp file, fsync, rename), unless a blob
/// of that digest is there already. Safe from any thread: the model builder writes the
/// variant files itself so that the federation actor never does heavy IO.
pub fn write_blob(blob_dir: &Path, sha256_hex: &str, bytes: &[u8]) -> Result<(), StoreError> {
    use std::io::Write as _;
    let final_path = blob_dir.join(sha256_hex);
    if final_path.exists() {
        return Ok(());
    }
    // Unique per writer, so two builds writing the same blob never share a temp file.
    let tmp = blob_dir.join(format!(
        ".{sha256_hex}.{}.{:?}.tmp",
        std::process::id(),
        std::thread::current().id()
    ));
    let mut file = std::fs::File::create(&tmp)?;
    file.write_all(bytes)?;
    file.sync_all()?;
    std::fs::rename(tmp, final_path)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_survive_reopening() {
        let dir = std::env::temp_dir().join(format!("nephele-store-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let record = DeploymentRecord {
            name: "d".into(),
            model: "m".into(),
            selector: "a=b".into(),
            slo_ms: 5,
            offload: true,
            max_queue: 8,
            created_unix: 1,
            variant: "auto".into(),
            hard_example_threshold: None,
            replicas: Default::default(),
            rollout_settings: None,
            rollout: None,
            tenant: "default".into(),
        };
        {
            let store = Store::open(&dir).unwrap();
            store.put(Table::Deployments, "d", &record).unwrap();
            store.put_blob("abc", b"bytes").unwrap();
        }
        let store = Store::open(&dir).unwrap();
        let back: DeploymentRecord = store.get(Table::Deployments, "d").unwrap().unwrap();
        assert_eq!(back.selector, "a=b");
        let together = store
            .list_together(&[Table::Devices, Table::Deployments])
            .unwrap();
        assert_eq!(together.len(), 2);
        assert!(together[0].is_empty());
        assert_eq!(together[1].len(), 1);
        assert_eq!(together[1][0].0, "d");
        let decoded: DeploymentRecord = decode("d", &together[1][0].1).unwrap();
        assert_eq!(decoded.selector, "a=b");
        assert_eq!(
            store
                .list::<DeploymentRecord>(Table::Deployments)
                .unwrap()
                .len(),
            1
        );
        assert!(store.delete(Table::Deployments, "d").unwrap());
        assert!(!store.delete(Table::Deployments, "d").unwrap());
        assert_eq!(std::fs::read(store.blob_path("abc")).unwrap(), b"bytes");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
