//! Routes for access: API tokens (admins), the audit log (admins) and tenants. Who may
//! call each is decided before the handler runs (`federation::access::required`).

use actix_web::{web, HttpRequest, HttpResponse};
use serde::Deserialize;

use super::{authorize, count, mailbox, parse_json, ApiState};
use crate::federation::{
    ApiError, ApiTokenSpec, CreateApiToken, ListApiTokens, ListAudit, RevokeApiToken,
    RotateApiToken,
};

/// `POST /v1/api-tokens` `{"name", "role", "tenant", "ttl_s"?}`: 201 with the token,
/// shown this once.
pub async fn create(
    request: HttpRequest,
    state: web::Data<ApiState>,
    body: web::Bytes,
) -> Result<HttpResponse, ApiError> {
    let principal = authorize(&request, &state).await?;
    let spec: ApiTokenSpec = parse_json(
        &body,
        "{\"name\", \"role\": viewer|developer|operator|admin, \"tenant\", \"ttl_s\"?}",
    )?;
    let view = forward!(
        state,
        "create_api_token",
        CreateApiToken {
            spec,
            by: principal,
        }
    )?;
    Ok(HttpResponse::Created().json(view))
}

/// `GET /v1/api-tokens`: every token, revoked and expired ones too, never a secret.
pub async fn list(
    request: HttpRequest,
    state: web::Data<ApiState>,
) -> Result<HttpResponse, ApiError> {
    authorize(&request, &state).await?;
    let tokens = forward!(state, "list_api_tokens", ListApiTokens)?;
    super::page::answer(&request, tokens, |t| t.id.clone())
}

/// `DELETE /v1/api-tokens/{id}`: revokes it at once.
pub async fn revoke(
    request: HttpRequest,
    state: web::Data<ApiState>,
    id: web::Path<String>,
) -> Result<HttpResponse, ApiError> {
    let principal = authorize(&request, &state).await?;
    let view = forward!(
        state,
        "revoke_api_token",
        RevokeApiToken {
            id: id.into_inner(),
            by: principal,
        }
    )?;
    Ok(HttpResponse::Ok().json(view))
}

/// `POST /v1/api-tokens/{id}/rotate`: a new secret, shown this once; the old one stops
/// working at once.
pub async fn rotate(
    request: HttpRequest,
    state: web::Data<ApiState>,
    id: web::Path<String>,
) -> Result<HttpResponse, ApiError> {
    let principal = authorize(&request, &state).await?;
    let view = forward!(
        state,
        "rotate_api_token",
        RotateApiToken {
            id: id.into_inner(),
            by: principal,
        }
    )?;
    Ok(HttpResponse::Ok().json(view))
}

#[derive(Debug, Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct AuditQuery {
    /// Entries after this sequence number (to page forward or follow).
    #[serde(default)]
    after: u64,
    /// At most this many, the newest (default 100, at most 1000).
    limit: Option<usize>,
    tenant: Option<String>,
}

/// `GET /v1/audit[?after=&limit=&tenant=]`: who changed what, when and from where,
/// oldest first.
pub async fn audit(
    request: HttpRequest,
    state: web::Data<ApiState>,
) -> Result<HttpResponse, ApiError> {
    authorize(&request, &state).await?;
    let query = web::Query::<AuditQuery>::from_query(request.query_string())
        .map(web::Query::into_inner)
        .map_err(|e| {
            ApiError::invalid(
                "query",
                format!("bad query ({e}); accepted: after, limit (1..=1000), tenant"),
            )
        })?;
    let limit = query.limit.unwrap_or(100);
    if !(1..=1000).contains(&limit) {
        return Err(ApiError::invalid("limit", "limit must be 1..=1000"));
    }
    let entries = forward!(
        state,
        "list_audit",
        ListAudit {
            after_seq: query.after,
            limit,
            tenant: query.tenant,
        }
    )?;
    Ok(HttpResponse::Ok().json(entries))
}
