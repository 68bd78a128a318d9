//! Who may use the API: API tokens and their roles (`/v1/api-tokens`), tenants
//! (`/v1/tenants`) and the audit log of every change (`/v1/audit`).

use serde::{Deserialize, Serialize};

/// An API token's role, least to most.
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    PartialOrd,
    Ord,
    Hash,
    Serialize,
    Deserialize,
    schemars::JsonSchema,
)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    Viewer,
    Developer,
    Operator,
    Admin,
}

impl Role {
    pub const ALL: [Role; 4] = [Role::Viewer, Role::Developer, Role::Operator, Role::Admin];

    pub fn as_str(self) -> &'static str {
        match self {
            Role::Viewer => "viewer",
            Role::Developer => "developer",
            Role::Operator => "operator",
            Role::Admin => "admin",
        }
    }

    /// The role named `name`, or why there is none.
    pub fn parse(name: &str) -> Result<Role, String> {
        Role::ALL
            .into_iter()
            .find(|r| r.as_str() == name)
            .ok_or_else(|| format!("no role {name:?}; roles: viewer, developer, operator, admin"))
    }
}

impl std::fmt::Display for Role {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// `POST /v1/api-tokens`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ApiTokenSpec {
    /// What it is for (a name: a-z, 0-9 and `-`).
    #[schemars(regex(pattern = r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$"))]
    pub name: String,
    pub role: Role,
    /// The tenant it acts for.
    pub tenant: String,
    /// Seconds until it expires; absent: it does not.
    #[serde(default)]
    pub ttl_s: Option<u64>,
}

/// An API token as listed: never its secret, which only the response that created or
/// rotated it carries (`token`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct ApiTokenView {
    pub id: String,
    pub name: String,
    pub role: Role,
    pub tenant: String,
    /// `active`, `expired` or `revoked`.
    pub state: String,
    pub created_unix: u64,
    pub created_by: String,
    pub expires_unix: Option<u64>,
    pub revoked_unix: Option<u64>,
    pub rotated_unix: Option<u64>,
    /// The whole token (`id.secret`): only in the answer that made it; keep it, it is
    /// not shown again.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token: Option<String>,
}

/// A tenant: its scheduling weight and quotas, and what it holds.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct TenantView {
    pub name: String,
    pub weight: f64,
    pub quota_cpu_milli: Option<u64>,
    pub quota_memory_mib: Option<u64>,
    pub quota_gpu_milli: Option<u64>,
    pub quota_jobs: Option<u32>,
    pub quota_replicas: Option<u32>,
    pub api_tokens: usize,
    pub models: usize,
    pub deployments: usize,
    /// Cloud replicas its deployments ask for (the sum of their `replicas.max`).
    pub replicas_asked: u32,
    /// A `[[tenant]]` of the config declares it (it cannot be deleted through the API).
    pub declared_in_config: bool,
    pub created_unix: u64,
    pub updated_unix: u64,
    pub updated_by: String,
}

/// The body of `PUT /v1/tenants/{name}`: the whole of its weight and quotas (a quota
/// left out is unlimited).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct TenantBody {
    /// Relative entitlement under dominant resource fairness (default 1).
    #[serde(default = "one")]
    pub weight: f64,
    /// Most it may hold at once in each region.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub quota_cpu_milli: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub quota_memory_mib: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub quota_gpu_milli: Option<u64>,
    /// Most jobs it may have in each region that have not ended.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub quota_jobs: Option<u32>,
    /// Most cloud replicas its deployments may ask for in all (their `replicas.max`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub quota_replicas: Option<u32>,
}

impl Default for TenantBody {
    fn default() -> Self {
        TenantBody {
            weight: one(),
            quota_cpu_milli: None,
            quota_memory_mib: None,
            quota_gpu_milli: None,
            quota_jobs: None,
            quota_replicas: None,
        }
    }
}

fn one() -> f64 {
    1.0
}

/// One entry of the audit log: a change asked of the API (allowed or refused), who
/// asked, from where, and how it ended.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct AuditRecord {
    /// Increasing; the record's key.
    pub seq: u64,
    pub unix_ms: u64,
    /// The token's id, or empty when the request had no valid token.
    pub token: String,
    pub role: String,
    pub tenant: String,
    pub method: String,
    pub path: String,
    pub status: u16,
    /// The peer's IP address.
    pub peer: String,
}

impl AuditRecord {
    /// Its key in the store (its `seq`, zero-padded so keys sort by it).
    pub fn key(&self) -> String {
        format!("{:020}", self.seq)
    }
}
