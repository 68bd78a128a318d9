//! The federation actor's messages for access: authenticating API tokens, managing
//! them, the audit log and tenants (the rules are in `fleet_core_access.rs`).

use actix::prelude::*;

use super::fleet_core_access::{AuditEntry, NewSecret};
use super::views::{ApiTokenSpec, ApiTokenView, TenantView};
use super::{now_unix, random_alnum, ApiError, FederationActor, Principal};
use crate::store::AuditRecord;

/// Checks an API bearer token: who it speaks for, or why it is refused.
#[derive(Message)]
#[rtype(result = "Result<Principal, String>")]
pub struct Authenticate(pub String);

impl Handler<Authenticate> for FederationActor {
    type Result = Result<Principal, String>;
    fn handle(&mut self, message: Authenticate, _: &mut Self::Context) -> Self::Result {
        let now = now_unix();
        self.core
            .authenticate(&message.0, now)
            .ok_or_else(|| self.core.why_refused(&message.0, now))
    }
}

#[derive(Message)]
#[rtype(result = "Result<ApiTokenView, ApiError>")]
pub struct CreateApiToken {
    pub spec: ApiTokenSpec,
    pub by: Principal,
}

impl Handler<CreateApiToken> for FederationActor {
    type Result = Result<ApiTokenView, ApiError>;
    fn handle(&mut self, message: CreateApiToken, _: &mut Self::Context) -> Self::Result {
        let secret = NewSecret {
            id: random_alnum(8),
            secret: random_alnum(40),
        };
        let output = self
            .core
            .create_api_token(now_unix(), message.spec, secret, &message.by);
        self.run(output)?
    }
}

#[derive(Message)]
#[rtype(result = "Result<Vec<ApiTokenView>, ApiError>")]
pub struct ListApiTokens;

impl Handler<ListApiTokens> for FederationActor {
    type Result = Result<Vec<ApiTokenView>, ApiError>;
    fn handle(&mut self, _: ListApiTokens, _: &mut Self::Context) -> Self::Result {
        Ok(self.core.api_token_views(now_unix()))
    }
}

#[derive(Message)]
#[rtype(result = "Result<ApiTokenView, ApiError>")]
pub struct RevokeApiToken {
    pub id: String,
    pub by: Principal,
}

impl Handler<RevokeApiToken> for FederationActor {
    type Result = Result<ApiTokenView, ApiError>;
    fn handle(&mut self, message: RevokeApiToken, _: &mut Self::Context) -> Self::Result {
        let output = self
            .core
            .revoke_api_token(now_unix(), &message.id, &message.by);
        self.run(output)?
    }
}

#[derive(Message)]
#[rtype(result = "Result<ApiTokenView, ApiError>")]
pub struct RotateApiToken {
    pub id: String,
    pub by: Principal,
}

impl Handler<RotateApiToken> for FederationActor {
    type Result = Result<ApiTokenView, ApiError>;
    fn handle(&mut self, message: RotateApiToken, _: &mut Self::Context) -> Self::Result {
        let output =
            self.core
                .rotate_api_token(now_unix(), &message.id, random_alnum(40), &message.by);
        self.run(output)?
    }
}

/// Appends to the audit log (sent after the change was answered).
#[derive(Message)]
#[rtype(result = "()")]
pub struct RecordAudit(pub AuditEntry);

/// How long the first audit entry waits for others before they are written together:
/// one durable write per request capped the API's write rate at the disk's sync rate.
const AUDIT_BATCH_WAIT: std::time::Duration = std::time::Duration::from_millis(2);

impl Handler<RecordAudit> for FederationActor {
    type Result = ();
    fn handle(&mut self, message: RecordAudit, ctx: &mut Self::Context) {
        if self.audit_pending.is_empty() {
            ctx.run_later(AUDIT_BATCH_WAIT, |actor, _| actor.flush_audit());
        }
        self.audit_pending.push(message.0);
    }
}

impl FederationActor {
    /// Writes the audit entries waiting for their group write.
    fn flush_audit(&mut self) {
        if self.audit_pending.is_empty() {
            return;
        }
        let entries = std::mem::take(&mut self.audit_pending);
        let output = self.core.record_audits(entries);
        if let Err(error) = self.run(output) {
            tracing::warn!(%error, "cannot write the audit log");
        }
    }
}

#[derive(Message)]
#[rtype(result = "Result<Vec<AuditRecord>, ApiError>")]
pub struct ListAudit {
    pub after_seq: u64,
    pub limit: usize,
    pub tenant: Option<String>,
}

impl Handler<ListAudit> for FederationActor {
    type Result = Result<Vec<AuditRecord>, ApiError>;
    fn handle(&mut self, message: ListAudit, _: &mut Self::Context) -> Self::Result {
        // A request answered before this one is in the log it reads.
        self.flush_audit();
        Ok(self
            .core
            .audit_views(message.after_seq, message.limit, message.tenant.as_deref()))
    }
}

#[derive(Message)]
#[rtype(result = "Result<Vec<TenantView>, ApiError>")]
pub struct ListTenants {
    pub scope: Option<String>,
}

impl Handler<ListTenants> for FederationActor {
    type Result = Result<Vec<TenantView>, ApiError>;
    fn handle(&mut self, message: ListTenants, _: &mut Self::Context) -> Self::Result {
        Ok(self.core.tenant_views(message.scope.as_deref()))
    }
}

/// `GET /v1/tenants/{name}`.
#[derive(Message)]
#[rtype(result = "Result<TenantView, ApiError>")]
pub struct GetTenant {
    pub name: String,
    pub scope: Option<String>,
}

impl Handler<GetTenant> for FederationActor {
    type Result = Result<TenantView, ApiError>;
    fn handle(&mut self, message: GetTenant, _: &mut Self::Context) -> Self::Result {
        self.core.tenant(&message.name, message.scope.as_deref())
    }
}

/// `PUT /v1/tenants/{name}` (admins): whether it was created, and the tenant.
#[derive(Message)]
#[rtype(result = "Result<(bool, TenantView), ApiError>")]
pub struct PutTenant {
    pub name: String,
    pub spec: crate::config::TenantConfig,
    pub by: Principal,
}

impl Handler<PutTenant> for FederationActor {
    type Result = Result<(bool, TenantView), ApiError>;
    fn handle(&mut self, message: PutTenant, _: &mut Self::Context) -> Self::Result {
        let output = self
            .core
            .put_tenant(now_unix(), &message.name, message.spec, &message.by);
        self.run(output)?
    }
}

/// `DELETE /v1/tenants/{name}` (admins), once no region holds a job of it.
#[derive(Message)]
#[rtype(result = "Result<TenantView, ApiError>")]
pub struct DeleteTenant {
    pub name: String,
    pub by: Principal,
}

impl Handler<DeleteTenant> for FederationActor {
    type Result = Result<TenantView, ApiError>;
    fn handle(&mut self, message: DeleteTenant, _: &mut Self::Context) -> Self::Result {
        let output = self.core.delete_tenant(&message.name, &message.by);
        self.run(output)?
    }
}
