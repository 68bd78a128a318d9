//! Tenants as API objects: `GET /v1/tenants` (any role: its own tenant; admins all),
//! `GET /v1/tenants/{name}`, `PUT /v1/tenants/{name}` (admins: create, or replace its
//! weight and quotas) and `DELETE /v1/tenants/{name}` (admins; refused while it holds
//! anything). The rules are in `federation/fleet_core_tenants.rs`.

use actix_web::{web, HttpRequest, HttpResponse};

use super::{authorize, count, mailbox, parse_json, regions_to_search, ApiState};
use crate::config::TenantConfig;
use crate::federation::{ApiError, DeleteTenant, GetTenant, ListTenants, PutTenant};
use crate::region::TenantJobs;

pub use nephele_api::TenantBody;

/// `GET /v1/tenants`: the caller's tenant (admins: every tenant).
pub async fn list(
    request: HttpRequest,
    state: web::Data<ApiState>,
) -> Result<HttpResponse, ApiError> {
    let principal = authorize(&request, &state).await?;
    let views = forward!(
        state,
        "list_tenants",
        ListTenants {
            scope: principal.scope().map(str::to_string),
        }
    )?;
    Ok(HttpResponse::Ok().json(views))
}

/// `GET /v1/tenants/{name}`.
pub async fn get(
    request: HttpRequest,
    state: web::Data<ApiState>,
    name: web::Path<String>,
) -> Result<HttpResponse, ApiError> {
    let principal = authorize(&request, &state).await?;
    let view = forward!(
        state,
        "get_tenant",
        GetTenant {
            name: name.into_inner(),
            scope: principal.scope().map(str::to_string),
        }
    )?;
    Ok(HttpResponse::Ok().json(view))
}

/// `PUT /v1/tenants/{name}` with a [`TenantBody`]: 201 created, 200 changed.
pub async fn put(
    request: HttpRequest,
    state: web::Data<ApiState>,
    name: web::Path<String>,
    body: web::Bytes,
) -> Result<HttpResponse, ApiError> {
    let principal = authorize(&request, &state).await?;
    let body: TenantBody = parse_json(
        &body,
        "{\"weight\"?, \"quota_gpu_milli\"?, \"quota_cpu_milli\"?, \"quota_memory_mib\"?, \"quota_jobs\"?, \"quota_replicas\"?}",
    )?;
    let name = name.into_inner();
    let spec = TenantConfig {
        name: name.clone(),
        weight: body.weight,
        quota_cpu_milli: body.quota_cpu_milli,
        quota_memory_mib: body.quota_memory_mib,
        quota_gpu_milli: body.quota_gpu_milli,
        quota_jobs: body.quota_jobs,
        quota_replicas: body.quota_replicas,
    };
    let (created, view) = forward!(
        state,
        "put_tenant",
        PutTenant {
            name,
            spec,
            by: principal,
        }
    )?;
    Ok(if created {
        HttpResponse::Created().json(view)
    } else {
        HttpResponse::Ok().json(view)
    })
}

/// `DELETE /v1/tenants/{name}`: refused (409) while any region holds a job of it that
/// has not ended, or it has API tokens, models or deployments.
pub async fn delete(
    request: HttpRequest,
    state: web::Data<ApiState>,
    name: web::Path<String>,
) -> Result<HttpResponse, ApiError> {
    let principal = authorize(&request, &state).await?;
    let name = name.into_inner();
    let mut holding = Vec::new();
    for (region, actor) in regions_to_search(&state, None)? {
        let jobs = actor
            .send(TenantJobs(name.clone()))
            .await
            .map_err(mailbox)?;
        if jobs > 0 {
            holding.push(format!("{jobs} in {region}"));
        }
    }
    if !holding.is_empty() {
        count(&state, "delete_tenant", false);
        return Err(ApiError::Conflict(format!(
            "tenant {name} has jobs that have not ended ({}); delete them first",
            holding.join(", ")
        )));
    }
    let view = forward!(
        state,
        "delete_tenant",
        DeleteTenant {
            name,
            by: principal,
        }
    )?;
    Ok(HttpResponse::Ok().json(view))
}
