//! The REST API (actix-web, JSON). Every `/v1` route needs `Authorization: Bearer
//! <token>`; `/healthz` and `/metrics` are open (bind the API to a private address).
//!
//! The token is checked before any body is read ([`authenticate_first`], a middleware
//! that runs before the handlers' extractors): an unauthenticated upload costs the
//! control plane its headers, not its body. A declared body over its route's limit
//! ([`body_limit`]) is refused with 413 before it is read; a body without a declared
//! length is cut at 1 MiB (models 512 MiB, grids 4 MiB) and its handler checks the
//! route's own limit. At most [`MAX_CONCURRENT_UPLOADS`] model uploads are read at once
//! ([`read_upload`]; 429 with `Retry-After` past that). Failed logins are logged with
//! the peer's address (never the token) and counted.
//!
//! Handlers parse and check input, then forward to the federation actor; they hold no
//! policy. API JSON types are their own set, separate from wire and store types.

/// Asks the federation actor and counts the route's outcome (also used by the
/// submodules' routes, so defined before them).
macro_rules! forward {
    ($state:expr, $route:literal, $message:expr) => {{
        let result = $state
            .federation
            .send($message)
            .await
            .map_err(mailbox)
            .and_then(|r| r);
        count(&$state, $route, result.is_ok());
        result
    }};
}

mod access;
pub mod openapi;
mod page;
mod problem;
mod reports;
mod tenants;
mod watch;

use actix::Addr;
use actix_web::{http::StatusCode, web, HttpRequest, HttpResponse, ResponseError};
use serde::Deserialize;

pub use problem::{error_body, parse_json, PROBLEM_JSON};

use crate::federation::access::required;
use crate::federation::*;
use crate::region::{
    DeleteJob, DrainNode, GetGrid, GetJob, GetReplicas, InterruptNode, JobLogs, ListJobs,
    ListNodes, OfferJob, PushGrid, RegionActor, SubmitJob,
};
use crate::scheduler::{
    choose_region_for, JobSpec, JobView, RegionWeightsConfig, SchedError, AUTO_REGION,
};

pub struct ApiState {
    pub federation: Addr<FederationActor>,
    pub metrics: nephele_telemetry::Registry,
    /// Region actors by name, for the job routes.
    pub regions: std::collections::HashMap<String, Addr<RegionActor>>,
    pub default_region: String,
    /// For jobs submitted with `"region": "auto"`.
    pub region_weights: RegionWeightsConfig,
    /// Where model builds write the variant files (the store's blob directory).
    pub blob_dir: std::path::PathBuf,
    /// Pushes kept until their builds end, so an acknowledged push survives a crash.
    pub pushes: crate::pending_pushes::PendingPushes,
    /// Per-token request rates.
    pub rate: crate::api_rate::RateLimiter,
    /// Changes for `GET /v1/watch`.
    pub watch: crate::watch::Hub,
    /// Spans of API requests.
    pub tracer: nephele_otel::Tracer,
}

/// Each `/v1` request as a server span (under the caller's `traceparent`, a new trace
/// without one), named by its route's pattern, refusals included: outside
/// [`authenticate_first`], whose principal it names once known.
pub async fn traced(
    request: actix_web::dev::ServiceRequest,
    next: actix_web::middleware::Next<impl actix_web::body::MessageBody + 'static>,
) -> Result<actix_web::dev::ServiceResponse<actix_web::body::BoxBody>, actix_web::Error> {
    use actix_web::HttpMessage;
    let tracer = request
        .app_data::<web::Data<ApiState>>()
        .map(|state| state.tracer.clone())
        .filter(|tracer| tracer.is_enabled() && request.path().starts_with("/v1/"));
    let Some(tracer) = tracer else {
        return next.call(request).await.map(|r| r.map_into_boxed_body());
    };
    let caller = request
        .headers()
        .get("traceparent")
        .and_then(|value| value.to_str().ok())
        .and_then(|value| nephele_otel::TraceContext::parse(value).ok());
    let route = request
        .match_pattern()
        .unwrap_or_else(|| request.path().to_string());
    let method = request.method().to_string();
    let mut span = tracer.server(format!("{method} {route}"), caller);
    span.set("http.request.method", &method);
    span.set("http.route", &route);
    let response = nephele_otel::current::scope(span.context(), next.call(request))
        .await
        .map(|r| r.map_into_boxed_body());
    let status = match &response {
        Ok(response) => {
            if let Some(principal) = response.request().extensions().get::<Principal>() {
                span.set("nephele.tenant", &principal.tenant);
                span.set("nephele.api_token", &principal.token);
            }
            response.status()
        }
        Err(error) => error.as_response_error().status_code(),
    };
    span.set("http.response.status_code", u32::from(status.as_u16()));
    if status.is_server_error() {
        span.fail(status);
    }
    response
}

/// Largest grid push accepted (a year of hours is about 0.9 MB).
pub const MAX_GRID_BYTES: usize = 4 * 1024 * 1024;

/// Largest job spec accepted.
pub const MAX_JOB_BYTES: usize = 64 * 1024;

/// Largest model upload accepted.
pub const MAX_MODEL_BYTES: usize = 512 * 1024 * 1024;

/// Largest body of any other route (tokens, deployments, interruption notices).
pub const MAX_SMALL_BODY_BYTES: usize = 1024 * 1024;

/// Model uploads read at the same time; the next one is refused with 429.
pub const MAX_CONCURRENT_UPLOADS: usize = 2;

/// The largest body `method path` takes: models, grids and jobs have their own limits;
/// every other route takes a small JSON body at most.
pub fn body_limit(method: &actix_web::http::Method, path: &str) -> usize {
    let put_or_post =
        *method == actix_web::http::Method::PUT || *method == actix_web::http::Method::POST;
    let segments: Vec<&str> = path.trim_end_matches('/').split('/').collect();
    match segments.as_slice() {
        ["", "v1", "models", _] if put_or_post => MAX_MODEL_BYTES,
        ["", "v1", "regions", _, "grid"] => MAX_GRID_BYTES,
        ["", "v1", "jobs"] => MAX_JOB_BYTES,
        _ => MAX_SMALL_BODY_BYTES,
    }
}

/// Reads a model upload's body, at most [`MAX_CONCURRENT_UPLOADS`] at a time in this
/// process (the next one is refused with 429 and a `Retry-After`), each at most
/// [`MAX_MODEL_BYTES`]. The slot is held while the body is read, not while it builds.
async fn read_upload(payload: web::Payload) -> Result<web::Bytes, ApiError> {
    static SLOTS: tokio::sync::Semaphore =
        tokio::sync::Semaphore::const_new(MAX_CONCURRENT_UPLOADS);
    let _slot = SLOTS.try_acquire().map_err(|_| ApiError::Busy {
        message: format!(
            "{MAX_CONCURRENT_UPLOADS} model uploads are being read already; retry in a few seconds"
        ),
        retry_after_s: 5,
    })?;
    match payload.to_bytes_limited(MAX_MODEL_BYTES).await {
        Ok(Ok(bytes)) => Ok(bytes),
        Ok(Err(error)) => Err(ApiError::BadRequest(format!(
            "the upload was cut short: {error}"
        ))),
        Err(_) => Err(ApiError::TooLarge(format!(
            "the model is larger than the {} limit",
            human_bytes(MAX_MODEL_BYTES as u64)
        ))),
    }
}

/// Checks a `/v1` request before its handler (and so before its body is read): its
/// token ([`authorize`]), its role against what the route needs
/// ([`crate::federation::access::required`]), its token's rate, and a declared body
/// over its route's limit (see the module). The principal is left in the request's
/// extensions for the handler; a change (any method but GET) is written to the audit
/// log with its outcome once answered.
pub async fn authenticate_first(
    request: actix_web::dev::ServiceRequest,
    next: actix_web::middleware::Next<impl actix_web::body::MessageBody + 'static>,
) -> Result<actix_web::dev::ServiceResponse<actix_web::body::BoxBody>, actix_web::Error> {
    use actix_web::HttpMessage;
    // The API's description is public (it holds no data), so tools can read it first.
    let open = request.path() == OPENAPI_PATH;
    let Some(state) = (request.path().starts_with("/v1/") && !open)
        .then(|| request.app_data::<web::Data<ApiState>>().cloned())
        .flatten()
    else {
        return next.call(request).await.map(|r| r.map_into_boxed_body());
    };
    let refuse = |request: actix_web::dev::ServiceRequest, error: ApiError| {
        Ok(request.into_response(error.error_response()))
    };
    let peer = request
        .peer_addr()
        .map(|a| a.ip().to_string())
        .unwrap_or_else(|| "unknown".into());
    let (method, path) = (request.method().to_string(), request.path().to_string());
    let principal = match authorize(request.request(), &state).await {
        Ok(principal) => principal,
        Err(error) => {
            let reason = match &error {
                ApiError::Unauthorized(message) if message.starts_with("missing") => "missing",
                ApiError::Unauthorized(message) if message.contains("revoked") => "revoked",
                ApiError::Unauthorized(message) if message.contains("expired") => "expired",
                ApiError::Unauthorized(_) => "invalid",
                _ => "error",
            };
            tracing::warn!(%peer, %method, %path, reason, "API request refused: not authenticated");
            state
                .metrics
                .counter(
                    "nephele_api_auth_failures_total",
                    "API requests refused before their body was read: token missing, invalid, revoked or expired.",
                    &[("reason", reason)],
                )
                .inc();
            return refuse(request, error);
        }
    };
    let audited = !matches!(method.as_str(), "GET" | "HEAD");
    let audit = |status: u16| {
        state.federation.do_send(RecordAudit(AuditEntry {
            unix_ms: now_unix_ms(),
            principal: Some(principal.clone()),
            method: method.clone(),
            path: path.clone(),
            status,
            peer: peer.clone(),
        }))
    };
    if let Err(message) = principal.check(required(&method, &path), &method, &path) {
        tracing::warn!(%peer, %method, %path, token = %principal.token, "API request refused: role too low");
        state
            .metrics
            .counter(
                "nephele_api_forbidden_total",
                "API requests refused because the token's role is too low for the route.",
                &[("role", principal.role.as_str())],
            )
            .inc();
        if audited {
            audit(StatusCode::FORBIDDEN.as_u16());
        }
        return refuse(request, ApiError::Forbidden(message));
    }
    if let Err(retry_after_s) = state.rate.check(&principal.token) {
        state
            .metrics
            .counter(
                "nephele_api_rate_limited_total",
                "API requests refused with 429 because their token was over its rate.",
                &[],
            )
            .inc();
        return refuse(
            request,
            ApiError::Busy {
                message: format!(
                    "token {} is over its request rate; retry in {retry_after_s} s",
                    principal.token
                ),
                retry_after_s,
            },
        );
    }
    let limit = body_limit(request.method(), request.path());
    let declared = request
        .headers()
        .get(actix_web::http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok());
    if let Some(length) = declared.filter(|length| *length > limit as u64) {
        if audited {
            audit(StatusCode::PAYLOAD_TOO_LARGE.as_u16());
        }
        return refuse(
            request,
            ApiError::TooLarge(format!(
                "a body of {length} bytes is over the {} this route takes ({limit} bytes)",
                human_bytes(limit as u64)
            )),
        );
    }
    request.extensions_mut().insert(principal.clone());
    let response = next.call(request).await.map(|r| r.map_into_boxed_body());
    if audited {
        audit(match &response {
            Ok(response) => response.status().as_u16(),
            Err(error) => error.as_response_error().status_code().as_u16(),
        });
    }
    response
}

fn human_bytes(bytes: u64) -> String {
    match bytes {
        b if b >= 1 << 20 && b % (1 << 20) == 0 => format!("{} MiB", b >> 20),
        b if b >= 1 << 10 && b % (1 << 10) == 0 => format!("{} KiB", b >> 10),
        b => format!("{b} bytes"),
    }
}

fn mailbox(error: actix::MailboxError) -> ApiError {
    ApiError::Internal(format!("control plane busy: {error}"))
}

/// What a request without a bearer token is told.
pub const MISSING_TOKEN: &str = "missing bearer token: send `Authorization: Bearer <token>` (the admin token is printed on first start and kept in <data-dir>/admin-token)";

async fn authorize(request: &HttpRequest, state: &ApiState) -> Result<Principal, ApiError> {
    // Already authenticated by the middleware, before the body was read.
    if let Some(principal) = actix_web::HttpMessage::extensions(request)
        .get::<Principal>()
        .cloned()
    {
        return Ok(principal);
    }
    let header = request
        .headers()
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    let token = header
        .strip_prefix("Bearer ")
        .ok_or_else(|| ApiError::Unauthorized(MISSING_TOKEN.into()))?;
    state
        .federation
        .send(Authenticate(token.trim().to_string()))
        .await
        .map_err(mailbox)?
        .map_err(ApiError::Unauthorized)
}

fn count(state: &ApiState, route: &'static str, ok: bool) {
    state
        .metrics
        .counter(
            "nephele_api_requests_total",
            "REST API requests by route and outcome.",
            &[
                ("route", route),
                ("outcome", if ok { "ok" } else { "error" }),
            ],
        )
        .inc();
}

/// As `forward!`, to a region actor whose answer is a scheduler result.
macro_rules! ask_region {
    ($state:expr, $route:literal, $actor:expr, $message:expr) => {{
        let result = $actor
            .send($message)
            .await
            .map_err(mailbox)
            .and_then(|r| r.map_err(ApiError::from));
        count(&$state, $route, result.is_ok());
        result
    }};
}

pub use nephele_api::TokenRequest;

async fn create_token(
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

async fn list_tokens(
    request: HttpRequest,
    state: web::Data<ApiState>,
) -> Result<HttpResponse, ApiError> {
    authorize(&request, &state).await?;
    let tokens = forward!(state, "list_tokens", ListJoinTokens)?;
    page::answer(&request, tokens, |t| t.id.clone())
}

async fn list_devices(
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
async fn get_device(
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

async fn delete_device(
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
async fn device_usage(
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
async fn put_model(
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

async fn get_model(
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
async fn delete_model(
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

async fn list_models(
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

async fn create_deployment(
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

async fn update_deployment(
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

async fn get_rollout(
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

async fn act_on_rollout(
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

async fn list_deployments(
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

async fn get_deployment(
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
async fn deployment_devices(
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
fn with_device_rows(request: &HttpRequest) -> Result<bool, ApiError> {
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

async fn delete_deployment(
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

async fn list_regions(
    request: HttpRequest,
    state: web::Data<ApiState>,
) -> Result<HttpResponse, ApiError> {
    authorize(&request, &state).await?;
    Ok(HttpResponse::Ok().json(forward!(state, "list_regions", ListRegions)?))
}

// ----------------------------------------------------------------------------------
// Jobs: the region schedulers
// ----------------------------------------------------------------------------------

impl From<SchedError> for ApiError {
    fn from(error: SchedError) -> Self {
        match error {
            SchedError::BadRequest(m) => ApiError::BadRequest(m),
            SchedError::Invalid { field, message } => ApiError::Invalid { field, message },
            SchedError::NotFound(m) => ApiError::NotFound(m),
            SchedError::Conflict(m) => ApiError::Conflict(m),
        }
    }
}

/// What a deployment body takes, for errors.
const DEPLOYMENT_FIELDS: &str = "{\"name\", \"model\", \"selector\"?, \"slo_ms\"?, \"offload\"?, \"max_queue\"?, \"variant\"?, \"hard_example_threshold\"?, \"replicas\"?, \"rollout\"?, \"tenant\"?}";

/// The tenant a request acts for: its token's, or (admins only) the one it names.
fn acting_tenant(principal: &Principal, requested: Option<&str>) -> Result<String, ApiError> {
    match requested {
        None => Ok(principal.tenant.clone()),
        Some(tenant) if tenant == principal.tenant || principal.is_admin() => {
            Ok(tenant.to_string())
        }
        Some(tenant) => Err(ApiError::Forbidden(format!(
            "tenant: this token acts for tenant {}, not {tenant}; only admin tokens act for another tenant",
            principal.tenant
        ))),
    }
}

fn region_actor(state: &ApiState, name: &str) -> Result<Addr<RegionActor>, ApiError> {
    state.regions.get(name).cloned().ok_or_else(|| {
        let mut known: Vec<&str> = state.regions.keys().map(String::as_str).collect();
        known.sort_unstable();
        ApiError::NotFound(format!("no region {name:?}; regions: {}", known.join(", ")))
    })
}

/// The named region, or every region (sorted by name) when none is named.
fn regions_to_search(
    state: &ApiState,
    name: Option<&str>,
) -> Result<Vec<(String, Addr<RegionActor>)>, ApiError> {
    match name {
        Some(name) => Ok(vec![(name.to_string(), region_actor(state, name)?)]),
        None => {
            let mut all: Vec<(String, Addr<RegionActor>)> = state
                .regions
                .iter()
                .map(|(n, a)| (n.clone(), a.clone()))
                .collect();
            all.sort_by(|a, b| a.0.cmp(&b.0));
            Ok(all)
        }
    }
}

#[derive(Debug, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct JobQuery {
    pub region: Option<String>,
    pub tenant: Option<String>,
    /// `?stale`: any replica may answer (a standby from its copy, where it can). The
    /// leader always may, so it accepts and ignores it.
    #[serde(default, rename = "stale")]
    pub _stale: Option<String>,
    /// Pagination of `GET /v1/jobs` ([`page`]).
    #[serde(default, rename = "limit")]
    pub _limit: Option<String>,
    #[serde(default, rename = "after")]
    pub _after: Option<String>,
    /// `GET /v1/jobs?state=`: only the jobs in that state ([`JOB_STATES`]).
    pub state: Option<String>,
}

/// What `GET /v1/jobs?state=` takes: a job's states as [`JobView::state`] names them.
pub const JOB_STATES: [&str; 9] = [
    "deferred",
    "pending",
    "running",
    "terminating",
    "backoff",
    "recovering",
    "succeeded",
    "failed",
    "finished",
];

fn parse_query(request: &HttpRequest) -> Result<JobQuery, ApiError> {
    web::Query::<JobQuery>::from_query(request.query_string())
        .map(web::Query::into_inner)
        .map_err(|e| {
            ApiError::BadRequest(format!(
                "bad query ({e}); accepted: region, tenant, stale (and limit, after, state on lists)"
            ))
        })
}

/// `POST /v1/jobs` with a [`JobSpec`]: queues it and answers with where it went or why it
/// is not placed yet.
async fn submit_job(
    request: HttpRequest,
    state: web::Data<ApiState>,
    body: web::Bytes,
) -> Result<HttpResponse, ApiError> {
    let principal = authorize(&request, &state).await?;
    if body.len() > MAX_JOB_BYTES {
        return Err(ApiError::BadRequest(format!(
            "job spec of {} bytes; at most {MAX_JOB_BYTES}",
            body.len()
        )));
    }
    let spec: JobSpec = parse_json(
        &body,
        "{\"name\", \"gpus\"?, \"members\"?, \"cpu_milli\"?, \"memory_mib\"?, \"priority\"?, ...} (see the README's API section)",
    )?;
    let tenant = acting_tenant(&principal, spec.tenant.as_deref())?;
    let (region, choice) = match spec.region.as_deref() {
        Some(AUTO_REGION) => {
            let mut offers = Vec::new();
            for (_, actor) in regions_to_search(&state, None)? {
                offers.push(
                    actor
                        .send(OfferJob { spec: spec.clone() })
                        .await
                        .map_err(mailbox)?,
                );
            }
            let choice = choose_region_for(&offers, state.region_weights)?;
            (choice.chosen.clone(), Some(choice))
        }
        Some(name) => (name.to_string(), None),
        None => (state.default_region.clone(), None),
    };
    let actor = region_actor(&state, &region)?;
    let result = ask_region!(
        state,
        "submit_job",
        actor,
        SubmitJob {
            tenant,
            spec,
            choice,
        }
    );
    Ok(HttpResponse::Created().json(result?))
}

pub use nephele_api::{GridForecastBody, GridForecastPointBody, GridPointBody, GridPushBody};

/// `PUT /v1/regions/{name}/grid` (admins: a carbon feed's token): hourly measured
/// carbon intensity and prices, and a provider's forecast; all of it is stored or none.
async fn push_grid(
    request: HttpRequest,
    state: web::Data<ApiState>,
    name: web::Path<String>,
    body: web::Bytes,
) -> Result<HttpResponse, ApiError> {
    // Admins only (a feed acts for every tenant): see `access::required`.
    authorize(&request, &state).await?;
    if body.len() > MAX_GRID_BYTES {
        return Err(ApiError::BadRequest(format!(
            "grid push of {} bytes; at most {MAX_GRID_BYTES} (send a year in several pushes)",
            body.len()
        )));
    }
    let parsed: GridPushBody = serde_json::from_slice(&body).map_err(|e| {
        ApiError::BadRequest(format!(
            "invalid grid push ({e}); expected {{\"points\": [{{\"unix\", \"carbon_g_per_kwh\"?, \"price_per_mwh\"?}}, ...], \"forecast\"?: {{\"issued_unix\", \"source\", \"points\": [{{\"unix\", \"carbon_g_per_kwh\"}}, ...]}}}}"
        ))
    })?;
    if parsed
        .forecast
        .as_ref()
        .is_some_and(|f| f.source.trim().is_empty() || f.source.len() > 64)
    {
        return Err(ApiError::BadRequest(
            "forecast.source must name the provider in 1 to 64 characters".into(),
        ));
    }
    let forecast = parsed
        .forecast
        .as_ref()
        .map(|f| crate::scheduler::ForecastPush {
            issued: f.issued_unix,
            source: f.source.trim().to_string(),
            points: f
                .points
                .iter()
                .map(|p| nephele_placement::grid::ForecastPoint {
                    hour: p.unix / nephele_placement::grid::HOUR_S,
                    carbon: p.carbon_g_per_kwh,
                })
                .collect(),
        });
    let points = parsed
        .points
        .iter()
        .map(|p| nephele_placement::grid::GridPoint {
            hour: p.unix / nephele_placement::grid::HOUR_S,
            carbon: p.carbon_g_per_kwh,
            price: p.price_per_mwh,
        })
        .collect();
    let actor = region_actor(&state, &name)?;
    let result = ask_region!(state, "push_grid", actor, PushGrid { points, forecast });
    Ok(HttpResponse::Ok().json(result?))
}

/// `GET /v1/regions/{name}/grid`: the signal, and the next 72 hours as the carbon
/// decisions see them.
async fn get_grid(
    request: HttpRequest,
    state: web::Data<ApiState>,
    name: web::Path<String>,
) -> Result<HttpResponse, ApiError> {
    authorize(&request, &state).await?;
    let actor = region_actor(&state, &name)?;
    let view = actor.send(GetGrid).await.map_err(mailbox)?;
    count(&state, "get_grid", true);
    Ok(HttpResponse::Ok().json(view))
}

/// `GET /v1/jobs[?region=&tenant=&state=]`: the caller's tenant's jobs; admins see every
/// tenant's unless they name one.
async fn list_jobs(
    request: HttpRequest,
    state: web::Data<ApiState>,
) -> Result<HttpResponse, ApiError> {
    let principal = authorize(&request, &state).await?;
    let query = parse_query(&request)?;
    if let Some(wanted) = query.state.as_deref() {
        if !JOB_STATES.contains(&wanted) {
            return Err(ApiError::Invalid {
                field: "state".into(),
                message: format!("state={wanted:?}: give one of {}", JOB_STATES.join(", ")),
            });
        }
    }
    let tenant = match query.tenant.as_deref() {
        None if principal.is_admin() => None,
        requested => Some(acting_tenant(&principal, requested)?),
    };
    // Each region builds only its page's views (a count is a page of one); their pages
    // merged in key order hold the whole list's page.
    let page = page::Page::parse(request.query_string())?;
    let window = page.is_paged().then(|| (page.after.clone(), page.fetch()));
    let (mut jobs, mut total) = (Vec::<JobView>::new(), 0);
    for (_, actor) in regions_to_search(&state, query.region.as_deref())? {
        let (views, matching) = actor
            .send(ListJobs {
                tenant: tenant.clone(),
                state: query.state.clone(),
                page: window.clone(),
            })
            .await
            .map_err(mailbox)?;
        jobs.extend(views);
        total += matching;
    }
    count(&state, "list_jobs", true);
    let key = |j: &JobView| format!("{}/{}/{}", j.region, j.tenant, j.name);
    if page.is_paged() {
        jobs.sort_by_cached_key(key);
    }
    page::answer_fetched(&request, &page, jobs, total, key)
}

/// Finds the caller's job `name` in the named region or, without one, in the only
/// region that has it.
async fn find_job(
    state: &ApiState,
    principal: &Principal,
    query: &JobQuery,
    name: &str,
) -> Result<(Addr<RegionActor>, String, JobView), ApiError> {
    let tenant = acting_tenant(principal, query.tenant.as_deref())?;
    let mut found = Vec::new();
    let mut searched = Vec::new();
    let mut other_error = None;
    for (region, actor) in regions_to_search(state, query.region.as_deref())? {
        match actor
            .send(GetJob {
                tenant: tenant.clone(),
                name: name.to_string(),
            })
            .await
            .map_err(mailbox)?
        {
            Ok(view) => found.push((actor, region, view)),
            Err(SchedError::NotFound(_)) => searched.push(region),
            Err(error) => other_error = other_error.or(Some(error)),
        }
    }
    match found.len() {
        // Not found anywhere: say where it was looked for, not only the last region.
        0 => Err(other_error.map(ApiError::from).unwrap_or_else(|| {
            ApiError::NotFound(format!(
                "no job named {name} for tenant {tenant} in {} {}{}",
                if searched.len() == 1 {
                    "region"
                } else {
                    "regions"
                },
                searched.join(", "),
                if query.tenant.is_none() {
                    " (another tenant's job needs ?tenant=, admins only)"
                } else {
                    ""
                }
            ))
        })),
        1 => {
            let (actor, _, view) = found.remove(0);
            Ok((actor, tenant, view))
        }
        _ => Err(ApiError::Conflict(format!(
            "job {name} exists in regions {}; add ?region=",
            found
                .iter()
                .map(|(_, r, _)| r.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        ))),
    }
}

/// `GET /v1/jobs/{name}[?region=&tenant=]`: state, placement, and why it is pending.
async fn get_job(
    request: HttpRequest,
    state: web::Data<ApiState>,
    name: web::Path<String>,
) -> Result<HttpResponse, ApiError> {
    let principal = authorize(&request, &state).await?;
    let query = parse_query(&request)?;
    let result = find_job(&state, &principal, &query, &name).await;
    count(&state, "get_job", result.is_ok());
    Ok(HttpResponse::Ok().json(result?.2))
}

/// `DELETE /v1/jobs/{name}[?region=&tenant=]`: cancels or ends it; its resources go
/// back at once. Answers with the job as it was.
async fn delete_job(
    request: HttpRequest,
    state: web::Data<ApiState>,
    name: web::Path<String>,
) -> Result<HttpResponse, ApiError> {
    let principal = authorize(&request, &state).await?;
    let query = parse_query(&request)?;
    let (actor, tenant, _) = find_job(&state, &principal, &query, &name).await?;
    let result = ask_region!(
        state,
        "delete_job",
        actor,
        DeleteJob {
            tenant,
            name: name.into_inner(),
        }
    );
    Ok(HttpResponse::Ok().json(result?))
}

/// `GET /v1/regions/{name}/nodes`: the region's node slots, who serves them, what is
/// free and which jobs hold them.
async fn list_nodes(
    request: HttpRequest,
    state: web::Data<ApiState>,
    name: web::Path<String>,
) -> Result<HttpResponse, ApiError> {
    let principal = authorize(&request, &state).await?;
    let actor = region_actor(&state, &name)?;
    let mut nodes = actor.send(ListNodes).await.map_err(mailbox)?;
    if let Some(tenant) = principal.scope() {
        // Other tenants' job and deployment names stay hidden.
        let deployments: std::collections::HashSet<String> = forward!(
            state,
            "list_deployments",
            ListDeployments {
                scope: Some(tenant.to_string()),
                rows: false,
            }
        )?
        .into_iter()
        .map(|d| d.name)
        .collect();
        for node in &mut nodes {
            crate::federation::access::scope_node_view(node, tenant, &deployments);
        }
    }
    count(&state, "list_nodes", true);
    Ok(HttpResponse::Ok().json(nodes))
}

#[derive(Debug, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct LogQuery {
    pub region: Option<String>,
    pub tenant: Option<String>,
    #[serde(default)]
    pub member: u16,
    pub attempt: Option<u32>,
    #[serde(default)]
    pub offset: u64,
    pub max_bytes: Option<u32>,
    /// `?stale`, accepted and ignored, as on [`JobQuery`].
    #[serde(default, rename = "stale")]
    pub _stale: Option<String>,
}

/// Most log bytes one call returns.
pub const MAX_LOG_BYTES: u32 = 1024 * 1024;

/// `GET /v1/jobs/{name}/logs[?member=&attempt=&offset=&max_bytes=&region=&tenant=]`: a
/// job member's output (stdout and stderr as they came), read from its pool agent,
/// from `offset`. `finished` says the member has exited (the log will not grow);
/// follow a running one by asking again from `next_offset`.
async fn job_logs(
    request: HttpRequest,
    state: web::Data<ApiState>,
    name: web::Path<String>,
) -> Result<HttpResponse, ApiError> {
    let principal = authorize(&request, &state).await?;
    let query = web::Query::<LogQuery>::from_query(request.query_string())
        .map(web::Query::into_inner)
        .map_err(|e| {
            ApiError::BadRequest(format!(
                "bad query ({e}); accepted: member, attempt, offset, max_bytes, region, tenant"
            ))
        })?;
    let job_query = JobQuery {
        region: query.region.clone(),
        tenant: query.tenant.clone(),
        ..JobQuery::default()
    };
    let (actor, tenant, view) = find_job(&state, &principal, &job_query, &name).await?;
    let max_bytes = query
        .max_bytes
        .unwrap_or(256 * 1024)
        .clamp(1, MAX_LOG_BYTES);
    let (connection, body) = ask_region!(
        state,
        "job_logs",
        actor,
        JobLogs {
            tenant,
            name: name.to_string(),
            member: query.member,
            attempt: query.attempt,
            offset: query.offset,
            max_bytes,
        }
    )?;
    let attempt = match &body {
        nephele_proto::RequestBody::JobLogs { attempt, .. } => *attempt,
        _ => view.attempt,
    };
    let exchange = async {
        let (mut send, mut recv) = connection
            .open_bi()
            .await
            .map_err(|e| ApiError::Internal(format!("cannot reach the node's agent: {e}")))?;
        nephele_net::write_frame(
            &mut send,
            &nephele_proto::StreamRequest {
                protocol_version: nephele_proto::PROTOCOL_VERSION,
                body,
            },
        )
        .await
        .map_err(|e| ApiError::Internal(format!("cannot ask the node's agent: {e}")))?;
        let _ = send.finish();
        nephele_net::read_frame::<nephele_proto::StreamResponse>(
            &mut recv,
            nephele_proto::MAX_FRAME_BYTES,
        )
        .await
        .map_err(|e| ApiError::Internal(format!("the node's agent did not answer: {e}")))?
        .ok_or_else(|| ApiError::Internal("the node's agent closed the stream".into()))
    };
    let response = tokio::time::timeout(std::time::Duration::from_secs(15), exchange)
        .await
        .map_err(|_| ApiError::Internal("the node's agent did not answer in 15 s".into()))??;
    match response {
        nephele_proto::StreamResponse::Logs {
            data,
            size,
            finished,
        } => Ok(HttpResponse::Ok().json(nephele_api::JobLogsView {
            job: name.to_string(),
            attempt,
            member: query.member,
            offset: query.offset,
            next_offset: query.offset + data.len() as u64,
            size,
            finished,
            data: String::from_utf8_lossy(&data).into_owned(),
        })),
        nephele_proto::StreamResponse::Error(error) => Err(match error.code {
            nephele_proto::ErrorCode::NotFound => ApiError::NotFound(error.message),
            nephele_proto::ErrorCode::BadRequest => ApiError::BadRequest(error.message),
            _ => ApiError::Internal(error.message),
        }),
        _ => Err(ApiError::Internal(
            "the node's agent answered something else than a log".into(),
        )),
    }
}

pub use nephele_api::InterruptBody;

/// `POST /v1/regions/{name}/nodes/{node}/interrupt` (admin) `{"notice_s"}`: the node's
/// provider will take it away (a spot interruption): its replicas start elsewhere
/// first, its jobs checkpoint and run again elsewhere, and it is released.
async fn interrupt_node(
    request: HttpRequest,
    state: web::Data<ApiState>,
    path: web::Path<(String, String)>,
    body: web::Bytes,
) -> Result<HttpResponse, ApiError> {
    // Operators and admins: see `access::required`.
    authorize(&request, &state).await?;
    let parsed: InterruptBody = if body.is_empty() {
        InterruptBody::default()
    } else {
        serde_json::from_slice(&body).map_err(|e| {
            ApiError::BadRequest(format!("invalid notice ({e}); expected {{\"notice_s\"}}"))
        })?
    };
    if parsed.notice_s == 0 || parsed.notice_s > 3600 {
        return Err(ApiError::BadRequest(
            "notice_s must be 1..=3600 seconds".into(),
        ));
    }
    let (region, node) = path.into_inner();
    let actor = region_actor(&state, &region)?;
    let result = ask_region!(
        state,
        "interrupt_node",
        actor,
        InterruptNode {
            node,
            seconds: parsed.notice_s,
            source: "API".into(),
        }
    );
    Ok(HttpResponse::Ok().json(result?))
}

/// `POST /v1/regions/{name}/nodes/{node}/drain` (admin): move its work elsewhere and,
/// in a pool with a provider, release it.
async fn drain_node(
    request: HttpRequest,
    state: web::Data<ApiState>,
    path: web::Path<(String, String)>,
) -> Result<HttpResponse, ApiError> {
    // Operators and admins: see `access::required`.
    authorize(&request, &state).await?;
    let (region, node) = path.into_inner();
    let actor = region_actor(&state, &region)?;
    let result = ask_region!(state, "drain_node", actor, DrainNode { node });
    Ok(HttpResponse::Ok().json(result?))
}

/// `GET /v1/deployments/{name}/replicas`: its cloud replicas in every region with
/// pools, and what each region's autoscaler decided.
async fn deployment_replicas(
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

async fn metrics(state: web::Data<ApiState>) -> HttpResponse {
    HttpResponse::Ok()
        .content_type("text/plain; version=0.0.4")
        .body(state.metrics.render())
}

/// A read-only dashboard: one static page that calls the API with the token the user
/// enters (kept in the browser's local storage).
async fn dashboard() -> HttpResponse {
    HttpResponse::Ok()
        .content_type("text/html; charset=utf-8")
        .insert_header((
            "content-security-policy",
            "default-src 'self'; script-src 'unsafe-inline' 'self'; style-src 'unsafe-inline'",
        ))
        .body(include_str!("dashboard.html"))
}

/// Where the OpenAPI document is served (without a token).
pub const OPENAPI_PATH: &str = "/v1/openapi.json";

/// `GET /v1/openapi.json`: the API's OpenAPI 3 document ([`openapi::document`]).
async fn openapi_json() -> HttpResponse {
    static DOCUMENT: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    HttpResponse::Ok().content_type("application/json").body(
        DOCUMENT
            .get_or_init(|| openapi::document().to_string())
            .clone(),
    )
}

async fn healthz() -> HttpResponse {
    HttpResponse::Ok().json(serde_json::json!({"status": "ok"}))
}

fn json_error(error: impl std::fmt::Display) -> actix_web::Error {
    let message = error.to_string();
    actix_web::error::InternalError::from_response(
        message.clone(),
        ApiError::BadRequest(format!("invalid JSON body: {message}")).error_response(),
    )
    .into()
}

/// A route's resource: a method it does not take is answered `405` with `Allow` and
/// the API's error shape, naming the methods it takes.
fn resource(path: &str, allow: &'static str) -> actix_web::Resource {
    web::resource(path).default_service(web::to(move |request: HttpRequest| async move {
        let mut response = problem::problem(
            StatusCode::METHOD_NOT_ALLOWED,
            "method_not_allowed",
            "Method not allowed",
            format!(
                "{} is not allowed on {}; it takes {allow}",
                request.method(),
                request.path()
            ),
        );
        response.headers_mut().insert(
            actix_web::http::header::ALLOW,
            actix_web::http::header::HeaderValue::from_static(allow),
        );
        response
    }))
}

/// `GET /readyz`: whether this replica serves the API now (the federation answers
/// within a second); `/healthz` says only that the process is up.
async fn readyz(state: web::Data<ApiState>) -> HttpResponse {
    let answered = tokio::time::timeout(
        std::time::Duration::from_secs(1),
        state.federation.send(ListRegions),
    )
    .await;
    match answered {
        Ok(Ok(Ok(_))) => HttpResponse::Ok().json(serde_json::json!({"status": "ready"})),
        _ => HttpResponse::ServiceUnavailable()
            .insert_header(("retry-after", "1"))
            .json(serde_json::json!({
                "error": "unavailable",
                "message": "the control plane's fleet state did not answer within a second; retry",
            })),
    }
}

/// All routes, for `App::configure`.
pub fn routes(config: &mut web::ServiceConfig) {
    config
        .app_data(
            web::JsonConfig::default()
                .limit(1024 * 1024)
                .error_handler(|e, _| json_error(e)),
        )
        .app_data(web::PayloadConfig::default().limit(MAX_SMALL_BODY_BYTES))
        .service(resource("/", "GET").route(web::get().to(dashboard)))
        .service(resource("/healthz", "GET").route(web::get().to(healthz)))
        .service(resource("/readyz", "GET").route(web::get().to(readyz)))
        .service(resource("/metrics", "GET").route(web::get().to(metrics)))
        .service(resource(OPENAPI_PATH, "GET").route(web::get().to(openapi_json)))
        .service(
            resource("/v1/tokens", "GET, POST")
                .route(web::post().to(create_token))
                .route(web::get().to(list_tokens)),
        )
        .service(resource("/v1/devices", "GET").route(web::get().to(list_devices)))
        .service(
            resource("/v1/devices/{name}", "GET, DELETE")
                .route(web::get().to(get_device))
                .route(web::delete().to(delete_device)),
        )
        .service(resource("/v1/devices/{name}/usage", "GET").route(web::get().to(device_usage)))
        .service(resource("/v1/models", "GET").route(web::get().to(list_models)))
        .service(
            resource("/v1/models/{name}", "GET, PUT, POST, DELETE")
                .route(web::get().to(get_model))
                .route(web::put().to(put_model))
                .route(web::post().to(put_model))
                .route(web::delete().to(delete_model)),
        )
        .service(
            resource("/v1/deployments", "GET, POST")
                .route(web::post().to(create_deployment))
                .route(web::get().to(list_deployments)),
        )
        .service(
            resource("/v1/deployments/{name}", "GET, PUT, DELETE")
                .route(web::get().to(get_deployment))
                .route(web::put().to(update_deployment))
                .route(web::delete().to(delete_deployment)),
        )
        .service(
            resource("/v1/deployments/{name}/devices", "GET")
                .route(web::get().to(deployment_devices)),
        )
        .service(
            resource("/v1/deployments/{name}/rollout", "GET").route(web::get().to(get_rollout)),
        )
        .service(
            resource("/v1/deployments/{name}/rollout/{action}", "POST")
                .route(web::post().to(act_on_rollout)),
        )
        .service(
            resource("/v1/deployments/{name}/replicas", "GET")
                .route(web::get().to(deployment_replicas)),
        )
        .service(resource("/v1/regions", "GET").route(web::get().to(list_regions)))
        .service(resource("/v1/regions/{name}/nodes", "GET").route(web::get().to(list_nodes)))
        .service(
            resource("/v1/regions/{name}/nodes/{node}/interrupt", "POST")
                .route(web::post().to(interrupt_node)),
        )
        .service(
            resource("/v1/regions/{name}/nodes/{node}/drain", "POST")
                .route(web::post().to(drain_node)),
        )
        .service(
            resource("/v1/regions/{name}/grid", "GET, PUT")
                .app_data(web::PayloadConfig::default().limit(MAX_GRID_BYTES))
                .route(web::put().to(push_grid))
                .route(web::get().to(get_grid)),
        )
        .service(
            resource("/v1/jobs", "GET, POST")
                .route(web::post().to(submit_job))
                .route(web::get().to(list_jobs)),
        )
        .service(
            resource("/v1/jobs/{name}", "GET, DELETE")
                .route(web::get().to(get_job))
                .route(web::delete().to(delete_job)),
        )
        .service(resource("/v1/jobs/{name}/logs", "GET").route(web::get().to(job_logs)))
        .service(
            resource("/v1/api-tokens", "GET, POST")
                .route(web::post().to(access::create))
                .route(web::get().to(access::list)),
        )
        .service(resource("/v1/api-tokens/{id}", "DELETE").route(web::delete().to(access::revoke)))
        .service(
            resource("/v1/api-tokens/{id}/rotate", "POST").route(web::post().to(access::rotate)),
        )
        .service(resource("/v1/audit", "GET").route(web::get().to(access::audit)))
        .service(resource("/v1/tenants", "GET").route(web::get().to(tenants::list)))
        .service(
            resource("/v1/tenants/{name}", "GET, PUT, DELETE")
                .route(web::get().to(tenants::get))
                .route(web::put().to(tenants::put))
                .route(web::delete().to(tenants::delete)),
        )
        .service(resource("/v1/reports/cost", "GET").route(web::get().to(reports::cost)))
        .service(resource("/v1/reports/carbon", "GET").route(web::get().to(reports::carbon)))
        .service(resource("/v1/watch", "GET").route(web::get().to(watch::watch)))
        .default_service(web::to(|| async {
            ApiError::NotFound("no such route; see the README's API section".into())
                .error_response()
        }));
}
