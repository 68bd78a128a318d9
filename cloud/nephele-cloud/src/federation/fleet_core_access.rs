//! The federation core's access records: API tokens (created, listed, rotated and
//! revoked; only their hashes are kept), the audit log, tenants as the API shows them,
//! and which tenant owns a model or deployment name. Same contract as
//! `fleet_core.rs`: the time comes in as an argument, writes go out in the [`Output`].

use super::access::{visible, Principal, Role};
use super::fleet_core::{FleetCore, Output};
use super::fleet_store::{Record, Write};
use super::views::{ApiTokenSpec, ApiTokenView, DeploymentStatus, ModelView};
use super::{constant_time_eq, sha256_hex, ApiError};
use crate::store::{ApiTokenRecord, AuditRecord, Table};

/// Audit entries kept; older ones are dropped as new ones are written.
pub const AUDIT_KEPT: usize = 10_000;

/// Longest life a token may be given (ten years).
pub const MAX_TOKEN_TTL_S: u64 = 10 * 366 * 24 * 3600;

/// A new API token's id and secret, drawn by the shell.
pub struct NewSecret {
    pub id: String,
    pub secret: String,
}

/// An audit entry before the core numbers it.
pub struct AuditEntry {
    pub unix_ms: u64,
    pub principal: Option<Principal>,
    pub method: String,
    pub path: String,
    pub status: u16,
    pub peer: String,
}

fn token_state(record: &ApiTokenRecord, now_unix: u64) -> &'static str {
    if record.revoked_unix.is_some() {
        "revoked"
    } else if record.expires_unix.is_some_and(|at| now_unix >= at) {
        "expired"
    } else {
        "active"
    }
}

fn token_view(record: &ApiTokenRecord, now_unix: u64, token: Option<String>) -> ApiTokenView {
    ApiTokenView {
        id: record.id.clone(),
        name: record.name.clone(),
        role: record.role,
        tenant: record.tenant.clone(),
        state: token_state(record, now_unix).into(),
        created_unix: record.created_unix,
        created_by: record.created_by.clone(),
        expires_unix: record.expires_unix,
        revoked_unix: record.revoked_unix,
        rotated_unix: record.rotated_unix,
        token,
    }
}

impl FleetCore {
    // ------------------------------------------------------------------------------
    // API tokens
    // ------------------------------------------------------------------------------

    /// The first admin API token, when there is none (a fresh control plane): its
    /// hash is written, and the token is returned once, for the operator.
    pub fn bootstrap_admin_token(
        &mut self,
        now_unix: u64,
        id: String,
        secret: String,
    ) -> Output<Option<String>> {
        self.begin();
        if !self.records.api_tokens.is_empty() {
            return self.finish(None, Vec::new());
        }
        let token = format!("{id}.{secret}");
        self.write(Write::Put(Record::ApiToken(ApiTokenRecord {
            id,
            sha256: sha256_hex(token.as_bytes()),
            role: Role::Admin,
            tenant: crate::store::default_tenant(),
            created_unix: now_unix,
            name: "bootstrap-admin".into(),
            created_by: "bootstrap".into(),
            expires_unix: None,
            revoked_unix: None,
            rotated_unix: None,
        })));
        self.finish(Some(token), Vec::new())
    }

    /// A new admin token of tenant `default`, whatever tokens exist (the break-glass way
    /// back when every admin token was rotated, revoked or lost: run on the control
    /// plane's own machine, against its store, while it is stopped), and its audit
    /// entry. Other tokens are left as they are.
    pub fn break_glass_admin_token(
        &mut self,
        now_unix: u64,
        id: String,
        secret: String,
    ) -> Output<String> {
        self.begin();
        let token = format!("{id}.{secret}");
        self.write(Write::Put(Record::ApiToken(ApiTokenRecord {
            id: id.clone(),
            sha256: sha256_hex(token.as_bytes()),
            role: Role::Admin,
            tenant: crate::store::default_tenant(),
            created_unix: now_unix,
            name: "break-glass-admin".into(),
            created_by: "break-glass (nephele-cloud --reset-admin-token, on the data dir)".into(),
            expires_unix: None,
            revoked_unix: None,
            rotated_unix: None,
        })));
        self.append_audit(AuditEntry {
            unix_ms: now_unix * 1000,
            principal: Some(Principal {
                token: id,
                role: Role::Admin,
                tenant: crate::store::default_tenant(),
            }),
            method: "POST".into(),
            path: "/break-glass/admin-token".into(),
            status: 201,
            peer: "local".into(),
        });
        self.finish(token, Vec::new())
    }

    /// Who a bearer token speaks for, if it is one of ours, not revoked and not
    /// expired at `now_unix`.
    pub fn authenticate(&self, token: &str, now_unix: u64) -> Option<Principal> {
        let (id, _) = token.split_once('.')?;
        let record = self.records.api_tokens.get(id)?;
        let matches = constant_time_eq(
            sha256_hex(token.as_bytes()).as_bytes(),
            record.sha256.as_bytes(),
        );
        (matches && token_state(record, now_unix) == "active").then(|| Principal {
            token: record.id.clone(),
            role: record.role,
            tenant: record.tenant.clone(),
        })
    }

    /// Why `token` was not accepted, for the 401 (never echoing the token).
    pub fn why_refused(&self, token: &str, now_unix: u64) -> String {
        let record = token
            .split_once('.')
            .and_then(|(id, _)| self.records.api_tokens.get(id));
        match record.map(|r| (r, token_state(r, now_unix))) {
            Some((r, "revoked")) if hash_matches(r, token) => format!(
                "API token {} was revoked; ask an admin for a new one (`nephele api-token create`)",
                r.id
            ),
            Some((r, "expired")) if hash_matches(r, token) => format!(
                "API token {} expired; ask an admin to rotate it (`nephele api-token rotate {}`)",
                r.id, r.id
            ),
            _ => "invalid API token".into(),
        }
    }

    /// Creates an API token: its hash is written, the token returned once.
    pub fn create_api_token(
        &mut self,
        now_unix: u64,
        spec: ApiTokenSpec,
        secret: NewSecret,
        by: &Principal,
    ) -> Output<Result<ApiTokenView, ApiError>> {
        self.writes_only(|core| {
            nephele_domain::validate_name("token name", &spec.name)
                .map_err(|e| ApiError::invalid("name", e))?;
            core.check_tenant(&spec.tenant)?;
            let expires_unix = match spec.ttl_s {
                None => None,
                Some(ttl) if (1..=MAX_TOKEN_TTL_S).contains(&ttl) => Some(now_unix + ttl),
                Some(_) => {
                    return Err(ApiError::invalid(
                        "ttl_s",
                        format!("ttl_s must be 1..={MAX_TOKEN_TTL_S} seconds, or absent for a token that does not expire"),
                    ))
                }
            };
            if core.records.api_tokens.contains_key(&secret.id) {
                return Err(ApiError::Internal(
                    "drew a token id that exists; retry".into(),
                ));
            }
            let token = format!("{}.{}", secret.id, secret.secret);
            let record = ApiTokenRecord {
                id: secret.id,
                sha256: sha256_hex(token.as_bytes()),
                role: spec.role,
                tenant: spec.tenant,
                created_unix: now_unix,
                name: spec.name,
                created_by: by.describe(),
                expires_unix,
                revoked_unix: None,
                rotated_unix: None,
            };
            tracing::info!(token = %record.id, role = %record.role, tenant = %record.tenant, by = %by.describe(), "API token created");
            let view = token_view(&record, now_unix, Some(token));
            core.write(Write::Put(Record::ApiToken(record)));
            Ok(view)
        })
    }

    /// Every API token (revoked ones too), oldest first, without secrets.
    pub fn api_token_views(&self, now_unix: u64) -> Vec<ApiTokenView> {
        let mut views: Vec<ApiTokenView> = self
            .records
            .api_tokens
            .values()
            .map(|r| token_view(r, now_unix, None))
            .collect();
        views.sort_by(|a, b| (a.created_unix, &a.id).cmp(&(b.created_unix, &b.id)));
        views
    }

    fn active_token(&self, id: &str, now_unix: u64) -> Result<&ApiTokenRecord, ApiError> {
        let record = self.records.api_tokens.get(id).ok_or_else(|| {
            ApiError::NotFound(format!(
                "no API token {id}; `nephele api-token list` shows them"
            ))
        })?;
        match token_state(record, now_unix) {
            "revoked" => Err(ApiError::Conflict(format!("API token {id} is revoked"))),
            _ => Ok(record),
        }
    }

    /// Revokes a token at once (kept as revoked). The last active admin token cannot
    /// be revoked: nobody could manage tokens after it.
    pub fn revoke_api_token(
        &mut self,
        now_unix: u64,
        id: &str,
        by: &Principal,
    ) -> Output<Result<ApiTokenView, ApiError>> {
        self.writes_only(|core| {
            let mut record = core.active_token(id, now_unix)?.clone();
            let other_admins = core.records.api_tokens.values().any(|r| {
                r.id != id && r.role == Role::Admin && token_state(r, now_unix) == "active"
            });
            if record.role == Role::Admin && !other_admins {
                return Err(ApiError::Conflict(format!(
                    "API token {id} is the last active admin token; create another admin token before revoking it"
                )));
            }
            record.revoked_unix = Some(now_unix);
            tracing::info!(token = %id, by = %by.describe(), "API token revoked");
            let view = token_view(&record, now_unix, None);
            core.write(Write::Put(Record::ApiToken(record)));
            Ok(view)
        })
    }

    /// Gives a token a new secret (same id, role, tenant and expiry; an expired token
    /// is given a fresh life of its first length): the old secret stops working at once.
    pub fn rotate_api_token(
        &mut self,
        now_unix: u64,
        id: &str,
        secret: String,
        by: &Principal,
    ) -> Output<Result<ApiTokenView, ApiError>> {
        self.writes_only(|core| {
            let mut record = core.active_token(id, now_unix)?.clone();
            let token = format!("{}.{secret}", record.id);
            record.sha256 = sha256_hex(token.as_bytes());
            if let Some(expires) = record.expires_unix {
                let life =
                    expires.saturating_sub(record.rotated_unix.unwrap_or(record.created_unix));
                record.expires_unix = Some(now_unix + life.max(1));
            }
            record.rotated_unix = Some(now_unix);
            tracing::info!(token = %id, by = %by.describe(), "API token rotated");
            let view = token_view(&record, now_unix, Some(token));
            core.write(Write::Put(Record::ApiToken(record)));
            Ok(view)
        })
    }

    // ------------------------------------------------------------------------------
    // Audit log
    // ------------------------------------------------------------------------------

    /// Appends an entry (numbered after the newest), dropping the oldest past
    /// [`AUDIT_KEPT`].
    pub fn record_audit(&mut self, entry: AuditEntry) -> Output<()> {
        self.record_audits(vec![entry])
    }

    /// Appends `entries` in order, in one write.
    pub fn record_audits(&mut self, entries: Vec<AuditEntry>) -> Output<()> {
        self.writes_only(|core| {
            for entry in entries {
                core.append_audit(entry);
            }
        })
    }

    fn append_audit(&mut self, entry: AuditEntry) {
        let core = self;
        {
            let seq = core
                .records
                .audit
                .values()
                .next_back()
                .map_or(1, |r| r.seq + 1);
            let (token, role, tenant) = match entry.principal {
                Some(p) => (p.token, p.role.to_string(), p.tenant),
                None => (String::new(), String::new(), String::new()),
            };
            core.write(Write::Put(Record::Audit(AuditRecord {
                seq,
                unix_ms: entry.unix_ms,
                token,
                role,
                tenant,
                method: entry.method,
                path: entry.path,
                status: entry.status,
                peer: entry.peer,
            })));
            let over = core.records.audit.len().saturating_sub(AUDIT_KEPT);
            let oldest: Vec<String> = core.records.audit.keys().take(over).cloned().collect();
            for key in oldest {
                core.write(Write::Delete(Table::Audit, key));
            }
        }
    }

    /// The newest `limit` entries after `after_seq` (oldest first), those of `tenant`
    /// only when named.
    pub fn audit_views(
        &self,
        after_seq: u64,
        limit: usize,
        tenant: Option<&str>,
    ) -> Vec<AuditRecord> {
        let mut newest: Vec<AuditRecord> = self
            .records
            .audit
            .values()
            .rev()
            .filter(|r| r.seq > after_seq)
            .filter(|r| tenant.is_none_or(|t| r.tenant == t))
            .take(limit)
            .cloned()
            .collect();
        newest.reverse();
        newest
    }

    // ------------------------------------------------------------------------------
    // Tenants and what they own
    // ------------------------------------------------------------------------------

    /// Model names belong to the tenant that first pushed them: another tenant's push
    /// under the name is refused (names are unique across the fleet).
    pub(super) fn check_model_owner(&self, name: &str, tenant: &str) -> Result<(), ApiError> {
        let stored = self.catalog.versions(name).into_iter().map(|m| &m.tenant);
        let building = self.builds.get(name).map(|b| &b.tenant);
        if stored.chain(building).any(|owner| owner != tenant) {
            return Err(ApiError::Conflict(format!(
                "the model name {name} is taken by another tenant; choose another name"
            )));
        }
        Ok(())
    }

    /// The deployment `name` if `scope` may see and change it; another tenant's is
    /// not found.
    pub fn owned_deployment(&self, name: &str, scope: Option<&str>) -> Result<(), ApiError> {
        match self.catalog.deployment(name) {
            Some(d) if visible(scope, &d.tenant) => Ok(()),
            _ => Err(ApiError::NotFound(format!(
                "no deployment named {name}{}",
                scope.map_or_else(String::new, |t| format!(" in tenant {t}"))
            ))),
        }
    }

    /// The models `scope` sees.
    pub fn model_views_for(&self, scope: Option<&str>) -> Vec<ModelView> {
        let mut views = self.model_views();
        views.retain(|v| visible(scope, &v.tenant));
        views
    }

    /// A model `scope` sees; another tenant's is not found.
    pub fn model_view_for(
        &self,
        reference: &str,
        scope: Option<&str>,
    ) -> Result<ModelView, ApiError> {
        let name = reference.split_once(':').map_or(reference, |(n, _)| n);
        match self.model_view(reference) {
            Ok(view) if visible(scope, &view.tenant) => Ok(view),
            Ok(_) => Err(ApiError::NotFound(format!(
                "no model named {name}; `nephele model list` shows the models"
            ))),
            Err(error) => Err(error),
        }
    }

    /// A device's view as `scope` may see it: the device (shared hardware) in full, the
    /// deployments it runs only where they are `scope`'s, so another tenant's names and
    /// request counts stay hidden.
    pub fn scope_device_view(&self, view: &mut nephele_api::DeviceView, scope: Option<&str>) {
        if scope.is_none() {
            return;
        }
        if let Some(running) = view.running.as_mut() {
            running.retain(|r| self.deployment_visible(&r.deployment, scope));
            view.deployments = Some(running.len());
        }
    }

    /// A device's served totals as `scope` may see them: only its own deployments'.
    pub fn usage_for(
        &self,
        device: &str,
        scope: Option<&str>,
    ) -> Result<nephele_api::UsageTotals, ApiError> {
        let mut usage = self.usage_of(device)?;
        if scope.is_some() {
            usage
                .deployments
                .retain(|name, _| self.deployment_visible(name, scope));
        }
        Ok(usage)
    }

    /// Whether deployment `name` exists and `scope` sees it.
    fn deployment_visible(&self, name: &str, scope: Option<&str>) -> bool {
        self.catalog
            .deployment(name)
            .is_some_and(|d| visible(scope, &d.tenant))
    }

    /// The deployments `scope` sees, each with its device rows when `rows`.
    pub fn deployment_statuses_for(
        &self,
        scope: Option<&str>,
        rows: bool,
    ) -> Vec<DeploymentStatus> {
        self.catalog
            .deployments()
            .filter(|d| visible(scope, &d.tenant))
            .map(|d| self.status_with(d, rows))
            .collect()
    }

    /// A deployment `scope` sees, with its device rows when `rows`; another tenant's
    /// is not found.
    pub fn deployment_status_for(
        &self,
        name: &str,
        scope: Option<&str>,
        rows: bool,
    ) -> Result<DeploymentStatus, ApiError> {
        self.owned_deployment(name, scope)?;
        self.deployment_status_with(name, rows)
    }
}

fn hash_matches(record: &ApiTokenRecord, token: &str) -> bool {
    constant_time_eq(
        sha256_hex(token.as_bytes()).as_bytes(),
        record.sha256.as_bytes(),
    )
}

#[cfg(test)]
#[path = "fleet_core_access_tests.rs"]
mod tests;
