//! The fleet's routes: join tokens, devices, models, deployments and their rollouts
//! and cloud replicas, answered by the federation actor.

use actix_web::{web, HttpRequest, HttpResponse};

use super::*;

pub use nephele_api::TokenRequest;

pub(super) async fn create_token(
    request: HttpRequest,
    state: web::Data<ApiState>,
    body: web::Bytes,
) -> Result<HttpResponse, ApiError> {
    authorize(&request, &state).await?;
    // An empty body means defaults; anything else must be a valid request.
    let body: TokenRequest = if body.iter().all(u8::is_ascii_whitespace) {
        TokenRequest::default()
    } else {
        parse_json(&body, "{\"region\"?, \"ttl_s\"?}")?
    };
    let view = forward!(
        state,
        "create_token",
        CreateJoinToken {
            region: body.region,
            ttl_s: body.ttl_s
        }
    )?;
    Ok(HttpResponse::Created().json(view))
}

pub(super) async fn list_tokens(
    request: HttpRequest,
    state: web::Data<ApiState>,
) -> Result<HttpResponse, ApiError> {
    authorize(&request, &state).await?;
    let tokens = forward!(state, "list_tokens", ListJoinTokens)?;
    page::answer(&request, tokens, |t| t.id.clone())
}

pub(super) async fn list_devices(
    request: HttpRequest,
    state: web::Data<ApiState>,
) -> Result<HttpResponse, ApiError> {
    let principal = authorize(&request, &state).await?;
    let page = page::Page::parse(request.query_string())?;
    let (devices, total) = forward!(
        state,
        "list_devices",
        ListDevices {
            after: page.after.clone(),
            limit: page.fetch(),
            scope: principal.scope().map(str::to_string),
        }
    )?;
    page::answer_fetched(&request, &page, devices, total, |d| d.name.clone())
}

/// `GET /v1/devices/{name}`: one device, its labels, accelerators and what it runs.
pub(super) async fn get_device(
    request: HttpRequest,
    state: web::Data<ApiState>,
    name: web::Path<String>,
) -> Result<HttpResponse, ApiError> {
    let principal = authorize(&request, &state).await?;
    let view = forward!(
        state,
        "get_device",
        GetDevice {
            name: name.into_inner(),
            scope: principal.scope().map(str::to_string),
        }
    )?;
    Ok(HttpResponse::Ok().json(view))
}

pub(super) async fn delete_device(
    request: HttpRequest,
    state: web::Data<ApiState>,
    name: web::Path<String>,
) -> Result<HttpResponse, ApiError> {
    authorize(&request, &state).await?;
    forward!(state, "delete_device", DeleteDevice(name.into_inner()))?;
    Ok(HttpResponse::NoContent().finish())
}

/// `GET /v1/devices/{name}/usage`: what the device reported serving, per deployment,
/// each record counted once ([`crate::federation::usage`]).
pub(super) async fn device_usage(
    request: HttpRequest,
    state: web::Data<ApiState>,
    name: web::Path<String>,
) -> Result<HttpResponse, ApiError> {
    let principal = authorize(&request, &state).await?;
    let usage = forward!(
        state,
        "device_usage",
        crate::federation::usage::GetUsage {
            device: name.into_inner(),
            scope: principal.scope().map(str::to_string),
        }
    )?;
    Ok(HttpResponse::Ok().json(usage))
}

/// `PUT /v1/models/{name}`: see [`crate::model_build`] for the bodies and query
/// parameters. Answers 202 with the model in state `building` at once, or with
/// `?wait=true` 201 once it is built (400 when the build fails, with the reason).
pub(super) async fn put_model(
    request: HttpRequest,
    state: web::Data<ApiState>,
    name: web::Path<String>,
    query: web::Query<Vec<(String, String)>>,
    payload: web::Payload,
) -> Result<HttpResponse, ApiError> {
    let principal = authorize(&request, &state).await?;
    let name = name.into_inner();
    nephele_domain::validate_name("model", &name).map_err(ApiError::BadRequest)?;
    // The tenant pushed for travels in the query, so a push kept across a restart
    // is built again for the same tenant.
    let mut query = query.into_inner();
    let named: Vec<&str> = query
        .iter()
        .filter(|(k, _)| k == "tenant")
        .map(|(_, v)| v.as_str())
        .collect();
    if named.len() > 1 {
        return Err(ApiError::invalid(
            "tenant",
            "tenant is given more than once",
        ));
    }
    let tenant = acting_tenant(&principal, named.first().copied())?;
    query.retain(|(k, _)| k != "tenant");
    query.push(("tenant".into(), tenant));
    let body = read_upload(payload).await?;
    let is_json = request
        .headers()
        .get(actix_web::http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/json"));
    let push = crate::model_build::parse_push(&query, is_json, &body)?;
    let wait = push.wait;
    let journal = crate::model_build::Journal {
        pushes: state.pushes.clone(),
        request: Some(crate::model_build::KeptRequest {
            query,
            is_json,
            body,
        }),
    };
    let outcome = crate::model_build::start(
        name,
        push,
        state.federation.clone(),
        state.blob_dir.clone(),
        Some(journal),
    )
    .await;
    count(&state, "put_model", outcome.is_ok());
    match outcome? {
        crate::model_build::Started::Existing(view) => Ok(HttpResponse::Ok().json(view)),
        crate::model_build::Started::InFlight(view) => Ok(HttpResponse::Accepted().json(view)),
        crate::model_build::Started::Building { view, done } => {
            if wait {
                let view = done.await.map_err(|_| {
                    ApiError::Internal("the model build ended without a result".into())
                })??;
                Ok(HttpResponse::Created().json(view))
            } else {
                Ok(HttpResponse::Accepted().json(view))
            }
        }
    }
}

pub(super) async fn get_model(
    request: HttpRequest,
    state: web::Data<ApiState>,
    name: web::Path<String>,
) -> Result<HttpResponse, ApiError> {
    let principal = authorize(&request, &state).await?;
    let view = forward!(
        state,
        "get_model",
        GetModel {
            reference: name.into_inner(),
            scope: principal.scope().map(str::to_string),
        }
    )?;
    Ok(HttpResponse::Ok().json(view))
}

/// `DELETE /v1/models/{name}`: a version (`name:version`) or every version of a name;
/// answers with what it deleted.
pub(super) async fn delete_model(
    request: HttpRequest,
    state: web::Data<ApiState>,
    name: web::Path<String>,
) -> Result<HttpResponse, ApiError> {
    let principal = authorize(&request, &state).await?;
    let views = forward!(
        state,
        "delete_model",
        DeleteModel {
            reference: name.into_inner(),
            scope: principal.scope().map(str::to_string),
        }
    )?;
    Ok(HttpResponse::Ok().json(views))
}

pub(super) async fn list_models(
    request: HttpRequest,
    state: web::Data<ApiState>,
) -> Result<HttpResponse, ApiError> {
    let principal = authorize(&request, &state).await?;
    let views = forward!(
        state,
        "list_models",
        ListModels {
            scope: principal.scope().map(str::to_string),
        }
    )?;
    page::answer(&request, views, |m| m.reference.clone())
}

pub(super) async fn create_deployment(
    request: HttpRequest,
    state: web::Data<ApiState>,
    body: web::Bytes,
) -> Result<HttpResponse, ApiError> {
    let principal = authorize(&request, &state).await?;
    let spec: DeploymentSpec = parse_json(&body, DEPLOYMENT_FIELDS)?;
    let tenant = acting_tenant(&principal, spec.tenant.as_deref())?;
    let status = forward!(
        state,
        "create_deployment",
        CreateDeployment { spec, tenant }
    )?;
    Ok(HttpResponse::Created().json(status))
}

pub(super) async fn update_deployment(
    request: HttpRequest,
    state: web::Data<ApiState>,
    name: web::Path<String>,
    body: web::Bytes,
) -> Result<HttpResponse, ApiError> {
    let principal = authorize(&request, &state).await?;
    let spec: DeploymentSpec = parse_json(&body, DEPLOYMENT_FIELDS)?;
    if spec.tenant.is_some() {
        return Err(ApiError::invalid(
            "tenant",
            "a deployment's tenant cannot change; leave tenant out of an update",
        ));
    }
    let status = forward!(
        state,
        "update_deployment",
        UpdateDeployment {
            name: name.into_inner(),
            spec,
            scope: principal.scope().map(str::to_string),
        }
    )?;
    Ok(HttpResponse::Ok().json(status))
}

pub(super) async fn get_rollout(
    request: HttpRequest,
    state: web::Data<ApiState>,
    name: web::Path<String>,
) -> Result<HttpResponse, ApiError> {
    let principal = authorize(&request, &state).await?;
    let name = name.into_inner();
    let status = forward!(
        state,
        "get_rollout",
        GetDeployment {
            name: name.clone(),
            scope: principal.scope().map(str::to_string),
            rows: false,
        }
    )?;
    match status.rollout {
        Some(rollout) => Ok(HttpResponse::Ok().json(rollout)),
        None => Err(ApiError::NotFound(format!(
            "deployment {name} has never been rolled out; `nephele deployment update {name}` starts a rollout"
        ))),
    }
}

pub(super) async fn act_on_rollout(
    request: HttpRequest,
    state: web::Data<ApiState>,
    path: web::Path<(String, String)>,
) -> Result<HttpResponse, ApiError> {
    let principal = authorize(&request, &state).await?;
    let (deployment, action) = path.into_inner();
    let Some(action) = RolloutAction::parse(&action) else {
        return Err(ApiError::NotFound(format!(
            "no rollout action {action:?}; use pause, resume or rollback"
        )));
    };
    let status = forward!(
        state,
        "act_on_rollout",
        ActOnRollout {
            deployment,
            action,
            by: principal.describe(),
            scope: principal.scope().map(str::to_string),
        }
    )?;
    Ok(HttpResponse::Ok().json(status))
}

pub(super) async fn list_deployments(
    request: HttpRequest,
    state: web::Data<ApiState>,
) -> Result<HttpResponse, ApiError> {
    let principal = authorize(&request, &state).await?;
    let rows = with_device_rows(&request)?;
    let statuses = forward!(
        state,
        "list_deployments",
        ListDeployments {
            scope: principal.scope().map(str::to_string),
            rows,
        }
    )?;
    page::answer(&request, statuses, |d| d.name.clone())
}

pub(super) async fn get_deployment(
    request: HttpRequest,
    state: web::Data<ApiState>,
    name: web::Path<String>,
) -> Result<HttpResponse, ApiError> {
    let principal = authorize(&request, &state).await?;
    let rows = with_device_rows(&request)?;
    Ok(HttpResponse::Ok().json(forward!(
        state,
        "get_deployment",
        GetDeployment {
            name: name.into_inner(),
            scope: principal.scope().map(str::to_string),
            rows,
        }
    )?))
}

/// `GET /v1/deployments/{name}/devices`: its device rows, paged by device name (a
/// fleet's thousands of rows a page at a time).
pub(super) async fn deployment_devices(
    request: HttpRequest,
    state: web::Data<ApiState>,
    name: web::Path<String>,
) -> Result<HttpResponse, ApiError> {
    let principal = authorize(&request, &state).await?;
    let status = forward!(
        state,
        "deployment_devices",
        GetDeployment {
            name: name.into_inner(),
            scope: principal.scope().map(str::to_string),
            rows: true,
        }
    )?;
    page::answer(&request, status.devices, |row| row.device.clone())
}

/// `?devices=false` asks a deployment's status without its row per device: the
/// counts only, which is what a fleet of thousands wants to poll.
pub(super) fn with_device_rows(request: &HttpRequest) -> Result<bool, ApiError> {
    let pairs = web::Query::<Vec<(String, String)>>::from_query(request.query_string())
        .map_err(|e| ApiError::BadRequest(format!("bad query: {e}")))?;
    let value = pairs
        .iter()
        .find(|(key, _)| key == "devices")
        .map(|(_, value)| value.as_str());
    match value {
        None | Some("true") => Ok(true),
        Some("false") => Ok(false),
        Some(other) => Err(ApiError::Invalid {
            field: "devices".into(),
            message: format!(
                "devices={other:?}: give true (a row per device, the default) or false (the counts only)"
            ),
        }),
    }
}

pub(super) async fn delete_deployment(
    request: HttpRequest,
    state: web::Data<ApiState>,
    name: web::Path<String>,
) -> Result<HttpResponse, ApiError> {
    let principal = authorize(&request, &state).await?;
    forward!(
        state,
        "delete_deployment",
        DeleteDeployment {
            name: name.into_inner(),
            scope: principal.scope().map(str::to_string),
        }
    )?;
    Ok(HttpResponse::NoContent().finish())
}

/// What a deployment body takes, for errors.
pub(super) const DEPLOYMENT_FIELDS: &str = "{\"name\", \"model\", \"selector\"?, \"slo_ms\"?, \"offload\"?, \"max_queue\"?, \"variant\"?, \"hard_example_threshold\"?, \"replicas\"?, \"rollout\"?, \"tenant\"?}";

/// `GET /v1/deployments/{name}/replicas`: its cloud replicas in every region with
/// pools, and what each region's autoscaler decided.
pub(super) async fn deployment_replicas(
    request: HttpRequest,
    state: web::Data<ApiState>,
    name: web::Path<String>,
) -> Result<HttpResponse, ApiError> {
    let principal = authorize(&request, &state).await?;
    if let Some(tenant) = principal.scope() {
        // Another tenant's deployment is not found here either.
        forward!(
            state,
            "deployment_replicas",
            GetDeployment {
                name: name.to_string(),
                scope: Some(tenant.to_string()),
                rows: false,
            }
        )?;
    }
    let mut views = Vec::new();
    for (_, actor) in regions_to_search(&state, None)? {
        if let Some(view) = actor
            .send(GetReplicas(name.to_string()))
            .await
            .map_err(mailbox)?
        {
            views.push(view);
        }
    }
    count(&state, "deployment_replicas", true);
    Ok(HttpResponse::Ok().json(views))
}
