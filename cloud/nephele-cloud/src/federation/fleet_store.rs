//! The fleet's durable records as the federation core sees them: what it loads at start
//! ([`Snapshot`]), the writes it asks for ([`Write`]), and the store behind a trait
//! ([`FleetStore`]): the control plane's [`Store`] (redb or etcd) in production, a
//! [`MemoryStore`] in the core's tests.

use std::collections::BTreeMap;
use std::sync::Mutex;

use super::usage::{UsageHour, UsageTotals};
use crate::store::{
    ApiTokenRecord, AuditRecord, DeploymentRecord, DeviceRecord, JoinTokenRecord, ModelRecord,
    Store, StoreError, Table, TenantRecord,
};

/// One durable record of the fleet.
#[derive(Debug, Clone)]
pub enum Record {
    JoinToken(JoinTokenRecord),
    Device(DeviceRecord),
    Model(Box<ModelRecord>),
    Deployment(DeploymentRecord),
    ApiToken(ApiTokenRecord),
    Usage(UsageTotals),
    Audit(AuditRecord),
    UsageHour(UsageHour),
    Tenant(TenantRecord),
}

impl Record {
    pub fn table(&self) -> Table {
        match self {
            Record::JoinToken(_) => Table::JoinTokens,
            Record::Device(_) => Table::Devices,
            Record::Model(_) => Table::Models,
            Record::Deployment(_) => Table::Deployments,
            Record::ApiToken(_) => Table::ApiTokens,
            Record::Usage(_) => Table::Usage,
            Record::Audit(_) => Table::Audit,
            Record::UsageHour(_) => Table::UsageHours,
            Record::Tenant(_) => Table::Tenants,
        }
    }

    pub fn key(&self) -> std::borrow::Cow<'_, str> {
        match self {
            Record::JoinToken(r) => r.id.as_str().into(),
            Record::Device(r) => r.name.as_str().into(),
            Record::Model(r) => r.key().into(),
            Record::Deployment(r) => r.name.as_str().into(),
            Record::ApiToken(r) => r.id.as_str().into(),
            Record::Usage(r) => r.device.as_str().into(),
            Record::Audit(r) => r.key().into(),
            Record::UsageHour(r) => r.key().into(),
            Record::Tenant(r) => r.tenant.name.as_str().into(),
        }
    }

    /// The record as the store keeps it (JSON).
    pub fn to_json(&self) -> Result<Vec<u8>, StoreError> {
        let bytes = match self {
            Record::JoinToken(r) => serde_json::to_vec(r),
            Record::Device(r) => serde_json::to_vec(r),
            Record::Model(r) => serde_json::to_vec(r),
            Record::Deployment(r) => serde_json::to_vec(r),
            Record::ApiToken(r) => serde_json::to_vec(r),
            Record::Usage(r) => serde_json::to_vec(r),
            Record::Audit(r) => serde_json::to_vec(r),
            Record::UsageHour(r) => serde_json::to_vec(r),
            Record::Tenant(r) => serde_json::to_vec(r),
        };
        bytes.map_err(|e| StoreError::Db(e.to_string()))
    }
}

/// A change to the fleet's records (a few per command, short-lived: not worth boxing).
#[derive(Debug, Clone)]
#[allow(clippy::large_enum_variant)]
pub enum Write {
    Put(Record),
    Delete(Table, String),
}

impl Write {
    pub fn table(&self) -> Table {
        match self {
            Write::Put(record) => record.table(),
            Write::Delete(table, _) => *table,
        }
    }

    pub fn key(&self) -> std::borrow::Cow<'_, str> {
        match self {
            Write::Put(record) => record.key(),
            Write::Delete(_, key) => key.as_str().into(),
        }
    }
}

/// Every fleet record the store holds, read once when the core starts.
#[derive(Debug, Clone, Default)]
pub struct Snapshot {
    pub join_tokens: Vec<JoinTokenRecord>,
    pub devices: Vec<DeviceRecord>,
    pub models: Vec<ModelRecord>,
    pub deployments: Vec<DeploymentRecord>,
    pub api_tokens: Vec<ApiTokenRecord>,
    pub usage: Vec<UsageTotals>,
    pub audit: Vec<AuditRecord>,
    pub usage_hours: Vec<UsageHour>,
    pub tenants: Vec<TenantRecord>,
}

/// Where the fleet's records are kept. `commit` is all or nothing and durable when it
/// returns Ok; the core changes nothing it has not been told was committed.
pub trait FleetStore {
    fn load(&self) -> Result<Snapshot, StoreError>;
    fn commit(&self, writes: &[Write]) -> Result<(), StoreError>;
    /// Removes blobs no record needs any more (hex sha256); one already gone is not
    /// an error. Stores without blobs have nothing to do.
    fn remove_blobs(&self, _sha256s: &[String]) -> Result<(), StoreError> {
        Ok(())
    }
}

fn records<T: serde::de::DeserializeOwned>(
    list: Vec<(String, Vec<u8>)>,
) -> Result<Vec<T>, StoreError> {
    list.iter()
        .map(|(key, bytes)| crate::store::decode(key, bytes))
        .collect()
}

impl FleetStore for Store {
    fn remove_blobs(&self, sha256s: &[String]) -> Result<(), StoreError> {
        for digest in sha256s {
            match std::fs::remove_file(self.blob_path(digest)) {
                Err(error) if error.kind() != std::io::ErrorKind::NotFound => {
                    return Err(error.into())
                }
                _ => {}
            }
        }
        Ok(())
    }

    /// The fleet's tables as they were at one point (one read transaction, or one etcd
    /// revision), so a snapshot never holds half of a write.
    fn load(&self) -> Result<Snapshot, StoreError> {
        let tables = [
            Table::JoinTokens,
            Table::Devices,
            Table::Models,
            Table::Deployments,
            Table::ApiTokens,
            Table::Usage,
            Table::Audit,
            Table::UsageHours,
            Table::Tenants,
        ];
        let mut lists = self.list_together(&tables)?.into_iter();
        let mut next = || -> Vec<(String, Vec<u8>)> { lists.next().unwrap_or_default() };
        Ok(Snapshot {
            join_tokens: records(next())?,
            devices: records(next())?,
            models: records(next())?,
            deployments: records(next())?,
            api_tokens: records(next())?,
            usage: records(next())?,
            audit: records(next())?,
            usage_hours: records(next())?,
            tenants: records(next())?,
        })
    }

    fn commit(&self, writes: &[Write]) -> Result<(), StoreError> {
        let ops = writes
            .iter()
            .map(|write| {
                let value = match write {
                    Write::Put(record) => Some(record.to_json()?),
                    Write::Delete(..) => None,
                };
                Ok((write.table(), write.key().to_string(), value))
            })
            .collect::<Result<Vec<_>, StoreError>>()?;
        self.write_batch(&ops)
    }
}

/// The fleet's records in memory, for tests of the core: it can be told to refuse the
/// next commits, as an etcd cluster without a quorum does.
#[derive(Debug, Default)]
pub struct MemoryStore {
    records: Mutex<BTreeMap<(&'static str, String), Record>>,
    refuse: Mutex<bool>,
}

impl MemoryStore {
    /// From now on, commits fail (`true`) or succeed (`false`).
    pub fn refuse_writes(&self, refuse: bool) {
        *self.refuse.lock().unwrap_or_else(|p| p.into_inner()) = refuse;
    }

    /// Every record held, by (table, key).
    pub fn records(&self) -> BTreeMap<(&'static str, String), Record> {
        self.records
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }
}

impl FleetStore for MemoryStore {
    fn load(&self) -> Result<Snapshot, StoreError> {
        let mut snapshot = Snapshot::default();
        for record in self.records().into_values() {
            match record {
                Record::JoinToken(r) => snapshot.join_tokens.push(r),
                Record::Device(r) => snapshot.devices.push(r),
                Record::Model(r) => snapshot.models.push(*r),
                Record::Deployment(r) => snapshot.deployments.push(r),
                Record::ApiToken(r) => snapshot.api_tokens.push(r),
                Record::Usage(r) => snapshot.usage.push(r),
                Record::Audit(r) => snapshot.audit.push(r),
                Record::UsageHour(r) => snapshot.usage_hours.push(r),
                Record::Tenant(r) => snapshot.tenants.push(r),
            }
        }
        Ok(snapshot)
    }

    fn commit(&self, writes: &[Write]) -> Result<(), StoreError> {
        if *self.refuse.lock().unwrap_or_else(|p| p.into_inner()) {
            return Err(StoreError::Unavailable(
                "the store refuses writes (test)".into(),
            ));
        }
        let mut records = self.records.lock().unwrap_or_else(|p| p.into_inner());
        for write in writes {
            let key = (write.table().name(), write.key().to_string());
            match write {
                Write::Put(record) => {
                    records.insert(key, record.clone());
                }
                Write::Delete(..) => {
                    records.remove(&key);
                }
            }
        }
        Ok(())
    }
}
