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
//!
//! This file holds the state, the middleware, authentication, body limits and the
//! route table; the handlers live by area in `fleet` (tokens, devices, models,
//! deployments), `jobs`, `regions` (grid, nodes), `tenants`, `reports` and `watch`.

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

mod fleet;
mod jobs;
mod regions;

pub use fleet::*;
pub use jobs::*;
pub use regions::*;

// ----------------------------------------------------------------------------------
// Jobs: the region schedulers
// ----------------------------------------------------------------------------------

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

async fn metrics(state: web::Data<ApiState>) -> HttpResponse {
    // Requests the HTTP parser refused (the client's fault: logged as warnings).
    let malformed = state.metrics.counter(
        "nephele_api_malformed_requests_total",
        "HTTP requests refused as malformed before reaching a handler (logged as warnings).",
        &[],
    );
    malformed.add(nephele_logging::client_errors().saturating_sub(malformed.get()));
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
