//! The agent's local HTTP endpoint for applications on the device.
//!
//! | route                          | does                                               |
//! |--------------------------------|----------------------------------------------------|
//! | `POST /v1/infer/{deployment}`  | `{"shape": [1, 64], "data": [...]}` or `{"inputs": {NAME: {"dtype", "shape", "data"}}}` → output(s), where computed; with `Inference-Header-Content-Length`, the binary form ([`crate::binary_body`]); 410 with the reason once the control plane removed the device |
//! | `GET /v1/status`               | agent, connection, deployments and job members as JSON |
//! | `GET /metrics`                 | Prometheus text                                    |
//! | `GET /healthz`                 | 200 when the process is up                         |

use std::convert::Infallible;
use std::sync::Arc;

use http_body_util::{BodyExt as _, Full, Limited};
use hyper::body::{Bytes, Incoming};
use hyper::{Method, Request, Response, StatusCode};
use serde::{Deserialize, Serialize};

use crate::agent::Agent;
use crate::serving::{Location, ServeError};

/// Largest request body accepted.
pub const MAX_BODY_BYTES: usize = 16 * 1024 * 1024;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct InferBody {
    pub shape: Vec<u32>,
    pub data: Vec<f32>,
}

#[derive(Debug, Serialize)]
pub struct InferReply {
    pub shape: Vec<u32>,
    pub data: Vec<f32>,
    pub computed_by: String,
    #[serde(rename = "where")]
    pub location: Location,
    pub latency_ms: f64,
    /// The local answer was below the deployment's confidence threshold and this is
    /// the cloud's answer.
    pub hard_example: bool,
}

impl From<crate::serving::Answer> for InferReply {
    fn from(answer: crate::serving::Answer) -> Self {
        InferReply {
            shape: answer.output.shape,
            data: answer.output.data,
            computed_by: answer.computed_by,
            location: answer.location,
            latency_ms: answer.latency.as_secs_f64() * 1000.0,
            hard_example: answer.hard_example,
        }
    }
}

pub async fn serve(listener: tokio::net::TcpListener, agent: Arc<Agent>) {
    loop {
        let (stream, _) = match listener.accept().await {
            Ok(accepted) => accepted,
            Err(error) => {
                tracing::warn!(%error, "accept failed");
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        let agent = agent.clone();
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |request| handle(request, agent.clone()));
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
                .await;
        });
    }
}

fn json<T: Serialize>(status: StatusCode, body: &T) -> Response<Full<Bytes>> {
    let bytes = serde_json::to_vec(body).unwrap_or_else(|_| b"{}".to_vec());
    let mut response = Response::new(Full::new(Bytes::from(bytes)));
    *response.status_mut() = status;
    response.headers_mut().insert(
        "content-type",
        hyper::header::HeaderValue::from_static("application/json"),
    );
    response
}

fn error(status: StatusCode, message: impl std::fmt::Display) -> Response<Full<Bytes>> {
    json(
        status,
        &serde_json::json!({"error": status.canonical_reason().unwrap_or(""), "message": message.to_string()}),
    )
}

async fn handle(
    request: Request<Incoming>,
    agent: Arc<Agent>,
) -> Result<Response<Full<Bytes>>, Infallible> {
    let path = request.uri().path().to_string();
    let response = match (request.method(), path.as_str()) {
        (&Method::GET, "/healthz") => json(StatusCode::OK, &serde_json::json!({"status": "ok"})),
        (&Method::GET, "/metrics") => {
            agent
                .server
                .metrics
                .gauge(
                    "nephele_agent_resident_memory_bytes",
                    "Resident set size of the agent.",
                    &[],
                )
                .set(crate::agent::rss_bytes() as i64);
            let connected = agent.server.is_connected();
            agent
                .server
                .metrics
                .gauge(
                    "nephele_agent_connected",
                    "1 while a session with the control plane is up.",
                    &[],
                )
                .set(i64::from(connected));
            let mut response = Response::new(Full::new(Bytes::from(agent.server.metrics.render())));
            response.headers_mut().insert(
                "content-type",
                hyper::header::HeaderValue::from_static("text/plain; version=0.0.4"),
            );
            response
        }
        (&Method::GET, "/v1/status") => status(&agent),
        (&Method::POST, route) if route.starts_with("/v1/infer/") => {
            match agent.server.removed() {
                // 410: the device, not the request, is the problem, and it lasts.
                Some(reason) => error(
                    StatusCode::GONE,
                    format!(
                        "this device no longer serves: the control plane removed it from the fleet ({reason}); enrol it again with `nephele-edge join --token TOKEN`"
                    ),
                ),
                None => {
                    let deployment = route.trim_start_matches("/v1/infer/").to_string();
                    traced_infer(request, agent, deployment).await
                }
            }
        }
        _ => error(
            StatusCode::NOT_FOUND,
            format!("no route {path}; see /v1/status, /v1/infer/{{deployment}}, /metrics"),
        ),
    };
    Ok(response)
}

fn status(agent: &Agent) -> Response<Full<Bytes>> {
    let connected = agent.server.is_connected();
    json(
        StatusCode::OK,
        &serde_json::json!({
            "name": agent.enrolment.config.name,
            "role": agent.enrolment.config.role,
            "region": agent.enrolment.config.region,
            "profile": agent.profile_name,
            "connected": connected,
            "removed": agent.server.removed(),
            "usage": {
                "pending": crate::serving::lock(&agent.usage).pending(),
                "dropped": crate::serving::lock(&agent.usage).dropped(),
            },
            "certificate_not_after_unix": nephele_net::pki::validity_unix(&agent.identity().0).ok().map(|(_, not_after)| not_after),
            "inference_slots": agent.server.n_slots,
            "rss_bytes": crate::agent::rss_bytes(),
            "deployments": agent.server.telemetry().iter().map(|t| serde_json::json!({
                "name": t.deployment,
                "phase": match &t.phase {
                    nephele_proto::DeploymentPhase::Pending => "pending".to_string(),
                    nephele_proto::DeploymentPhase::Downloading => "downloading".to_string(),
                    nephele_proto::DeploymentPhase::Ready => "ready".to_string(),
                    nephele_proto::DeploymentPhase::Failed(reason) => format!("failed: {reason}"),
                },
                "variant": t.variant,
                "served_local": t.served_local,
                "served_offloaded": t.served_offloaded,
                "failed": t.failed,
                "queue_len": t.queue_len,
                "p50_ms": t.p50_us as f64 / 1000.0,
                "p99_ms": t.p99_us as f64 / 1000.0,
                "tails": agent.server.deployment(&t.deployment).map(|d| d.loaded_tails()).unwrap_or_default()
                    .iter().map(|(variant, bytes)| serde_json::json!({"variant": variant, "bytes": bytes})).collect::<Vec<_>>(),
                "sessions": agent.server.graph(&t.deployment).filter(|g| !g.state.is_empty()).map(|g| g.session_stats()),
                "batching": agent.server.graph(&t.deployment).and_then(|g| g.model.batch_axis().map(|axis| {
                    serde_json::json!({"axis": axis, "stats": g.batching_stats()})
                })),
            })).collect::<Vec<_>>(),
            "jobs": agent.job_statuses().iter().map(|s| serde_json::json!({
                "job": s.job,
                "attempt": s.attempt,
                "member": s.member,
                "state": match &s.state {
                    nephele_proto::MemberState::Running { pid, .. } => format!("running (pid {pid})"),
                    nephele_proto::MemberState::Stopping { pid } => format!("stopping (pid {pid})"),
                    nephele_proto::MemberState::Exited { code: Some(code), .. } => format!("exited {code}"),
                    nephele_proto::MemberState::Exited { signal: Some(signal), .. } => format!("killed by signal {signal}"),
                    nephele_proto::MemberState::Exited { .. } => "exited (status lost)".to_string(),
                    nephele_proto::MemberState::FailedToStart(why) => format!("failed to start: {why}"),
                },
            })).collect::<Vec<_>>(),
        }),
    )
}

/// A request of named typed tensors: `{"inputs": {NAME: {"dtype", "shape", "data"}}}`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct TypedBody {
    inputs: std::collections::HashMap<String, nephele_runtime::graph_model::NamedTensor>,
    /// A stateful model's session: its state inputs may then be left out.
    #[serde(default)]
    session: Option<String>,
    /// This is the session's last request: its state is dropped after it.
    #[serde(default)]
    end: bool,
}

async fn infer_typed(
    agent: Arc<Agent>,
    deployment: &str,
    value: serde_json::Value,
) -> Response<Full<Bytes>> {
    let parsed: TypedBody = match serde_json::from_value(value) {
        Ok(parsed) => parsed,
        Err(e) => {
            return error(
                StatusCode::BAD_REQUEST,
                format!("invalid typed request: {e}; expected {{\"inputs\": {{NAME: {{\"dtype\": \"i64\", \"shape\": [1, 4], \"data\": [...]}}}}, \"session\": ID (optional), \"end\": false}}"),
            )
        }
    };
    answer_typed(
        agent,
        deployment,
        parsed.inputs,
        (parsed.session, parsed.end),
        false,
    )
    .await
}

/// Serves a typed request and answers it, in JSON or (with `binary_outputs`) in the
/// binary form ([`crate::binary_body`]).
async fn answer_typed(
    agent: Arc<Agent>,
    deployment: &str,
    inputs: std::collections::HashMap<String, nephele_runtime::graph_model::NamedTensor>,
    (session, end): (Option<String>, bool),
    binary_outputs: bool,
) -> Response<Full<Bytes>> {
    if end && session.is_none() {
        return error(
            StatusCode::BAD_REQUEST,
            "\"end\": true closes a session: give \"session\": ID as well",
        );
    }
    if agent.server.graph(deployment).is_none() {
        if let Some(single) = agent.server.deployment(deployment) {
            return answer_single_named(agent, &single, inputs, session, binary_outputs).await;
        }
    }
    let session = session.map(|id| crate::graph_serving::SessionRef { id, end });
    let answer = match agent.server.serve_graph(deployment, inputs, session).await {
        Ok(answer) => answer,
        Err(e) => return serve_error(e),
    };
    let meta = serde_json::json!({
        "computed_by": answer.computed_by,
        "where": answer.location,
        "latency_ms": answer.latency.as_secs_f64() * 1000.0,
        "session": answer.session,
        "batch_size": answer.batch,
    });
    match (binary_outputs, meta) {
        (true, serde_json::Value::Object(meta)) => {
            match crate::binary_body::encode_typed(&answer.outputs, meta) {
                Ok((body, header)) => binary(body, header),
                Err(e) => error(StatusCode::INTERNAL_SERVER_ERROR, e),
            }
        }
        (_, mut meta) => {
            meta["outputs"] = serde_json::json!(answer.outputs);
            json(StatusCode::OK, &meta)
        }
    }
}

/// A named request to a deployment of one f32 tensor in and out: served as the plain
/// form is, answered under the file's own names, so a client that speaks the named
/// form to every model needs no second form.
async fn answer_single_named(
    agent: Arc<Agent>,
    single: &crate::serving::Deployment,
    mut inputs: std::collections::HashMap<String, nephele_runtime::graph_model::NamedTensor>,
    session: Option<String>,
    binary_outputs: bool,
) -> Response<Full<Bytes>> {
    let name = single.name.clone();
    let input_name = single.input_name();
    if session.is_some() {
        return error(
            StatusCode::BAD_REQUEST,
            format!("deployment {name}'s model keeps no state, so it takes no session; push a stateful model with --state INPUT=OUTPUT"),
        );
    }
    let given: Vec<String> = inputs.keys().cloned().collect();
    let tensor = match inputs.remove(&input_name) {
        Some(tensor) if inputs.is_empty() => tensor,
        _ => {
            return error(
                StatusCode::BAD_REQUEST,
                format!(
                    "deployment {name} takes one input, {input_name:?} (f32); the request names {given:?}"
                ),
            )
        }
    };
    if tensor.dtype != "f32" {
        return error(
            StatusCode::BAD_REQUEST,
            format!(
                "input {input_name:?} of deployment {name} is f32, not {}",
                tensor.dtype
            ),
        );
    }
    let Ok(shape) = tensor
        .shape
        .iter()
        .map(|d| u32::try_from(*d))
        .collect::<Result<Vec<u32>, _>>()
    else {
        return error(
            StatusCode::BAD_REQUEST,
            format!("input {input_name:?}: a dimension is too large"),
        );
    };
    let input = nephele_proto::Tensor {
        shape,
        data: tensor.data.iter().map(|v| *v as f32).collect(),
    };
    let answer = match agent.server.serve(&name, input).await {
        Ok(answer) => answer,
        Err(e) => return serve_error(e),
    };
    let mut outputs = std::collections::HashMap::new();
    outputs.insert(
        single.output_name(),
        nephele_runtime::graph_model::NamedTensor {
            dtype: "f32".to_string(),
            shape: answer.output.shape.iter().map(|d| *d as usize).collect(),
            data: answer.output.data.iter().map(|v| f64::from(*v)).collect(),
        },
    );
    let meta = serde_json::json!({
        "computed_by": answer.computed_by,
        "where": answer.location,
        "latency_ms": answer.latency.as_secs_f64() * 1000.0,
        "hard_example": answer.hard_example,
        "batch_size": 1,
    });
    match (binary_outputs, meta) {
        (true, serde_json::Value::Object(meta)) => {
            match crate::binary_body::encode_typed(&outputs, meta) {
                Ok((body, header)) => binary(body, header),
                Err(e) => error(StatusCode::INTERNAL_SERVER_ERROR, e),
            }
        }
        (_, mut meta) => {
            meta["outputs"] = serde_json::json!(outputs);
            json(StatusCode::OK, &meta)
        }
    }
}

/// A 200 in the binary form: `header` bytes of JSON, then the values.
fn binary(body: Vec<u8>, header: usize) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::from(body)));
    let headers = response.headers_mut();
    headers.insert(
        "content-type",
        hyper::header::HeaderValue::from_static("application/octet-stream"),
    );
    if let Ok(value) = hyper::header::HeaderValue::from_str(&header.to_string()) {
        headers.insert(crate::binary_body::HEADER_LENGTH, value);
    }
    response
}

/// A request in the binary form ([`crate::binary_body`]).
async fn infer_binary(
    agent: Arc<Agent>,
    deployment: &str,
    header_length: &str,
    body: &[u8],
) -> Response<Full<Bytes>> {
    use crate::binary_body::BinaryRequest;
    match crate::binary_body::parse(header_length, body) {
        Err(e) => error(StatusCode::BAD_REQUEST, e),
        Ok(BinaryRequest::Typed { header, inputs }) => {
            answer_typed(
                agent,
                deployment,
                inputs,
                (header.session, header.end),
                header.binary_outputs,
            )
            .await
        }
        Ok(BinaryRequest::Single { header, data }) => {
            let input = nephele_proto::Tensor {
                shape: header.shape,
                data,
            };
            match agent.server.serve(deployment, input).await {
                Ok(answer) if header.binary_outputs => {
                    let meta = serde_json::json!({
                        "computed_by": answer.computed_by,
                        "where": answer.location,
                        "latency_ms": answer.latency.as_secs_f64() * 1000.0,
                        "hard_example": answer.hard_example,
                    });
                    let serde_json::Value::Object(meta) = meta else {
                        return error(StatusCode::INTERNAL_SERVER_ERROR, "answer header");
                    };
                    let (body, header) = crate::binary_body::encode_single(
                        &answer.output.shape,
                        &answer.output.data,
                        meta,
                    );
                    binary(body, header)
                }
                Ok(answer) => json(StatusCode::OK, &InferReply::from(answer)),
                Err(e) => serve_error(e),
            }
        }
    }
}

/// Serves an inference request as a span of the caller's trace (its `traceparent`
/// header; a new trace without one, or with one that is not valid), current while it
/// is served so that an offload carries it on.
async fn traced_infer(
    request: Request<Incoming>,
    agent: Arc<Agent>,
    deployment: String,
) -> Response<Full<Bytes>> {
    let caller = request
        .headers()
        .get("traceparent")
        .and_then(|value| value.to_str().ok())
        .and_then(|value| nephele_otel::TraceContext::parse(value).ok());
    let tracer = agent.server.tracer.clone();
    let mut span = tracer.server("POST /v1/infer/{deployment}", caller);
    span.set("http.request.method", "POST");
    span.set("http.route", "/v1/infer/{deployment}");
    span.set("nephele.deployment", &deployment);
    let context = span.context();
    let response = nephele_otel::current::scope(context, infer(request, agent, &deployment)).await;
    span.set(
        "http.response.status_code",
        u32::from(response.status().as_u16()),
    );
    if response.status().is_server_error() {
        span.fail(response.status());
    }
    response
}

async fn infer(
    request: Request<Incoming>,
    agent: Arc<Agent>,
    deployment: &str,
) -> Response<Full<Bytes>> {
    let binary_header = request
        .headers()
        .get(crate::binary_body::HEADER_LENGTH)
        .map(|v| v.to_str().map(str::to_string));
    let body = match Limited::new(request.into_body(), MAX_BODY_BYTES)
        .collect()
        .await
    {
        Ok(collected) => collected.to_bytes(),
        Err(e) => {
            return error(
                StatusCode::PAYLOAD_TOO_LARGE,
                format!("request body rejected: {e} (limit {MAX_BODY_BYTES} bytes)"),
            )
        }
    };
    match binary_header {
        Some(Ok(length)) => return infer_binary(agent, deployment, &length, &body).await,
        Some(Err(_)) => {
            return error(
                StatusCode::BAD_REQUEST,
                format!(
                    "{} must be a number of bytes",
                    crate::binary_body::HEADER_LENGTH
                ),
            )
        }
        None => {}
    }
    let value: serde_json::Value = match serde_json::from_slice(&body) {
        Ok(value) => value,
        Err(e) => {
            return error(
                StatusCode::BAD_REQUEST,
                format!("invalid JSON: {e}; expected {{\"shape\": [1, N], \"data\": [...]}} or {{\"inputs\": {{NAME: {{\"dtype\", \"shape\", \"data\"}}}}}}"),
            )
        }
    };
    if value.get("inputs").is_some() {
        return infer_typed(agent, deployment, value).await;
    }
    let parsed: InferBody = match serde_json::from_value(value) {
        Ok(parsed) => parsed,
        Err(e) => {
            return error(
                StatusCode::BAD_REQUEST,
                format!("invalid JSON: {e}; expected {{\"shape\": [1, N], \"data\": [...]}}"),
            )
        }
    };
    if let Some(graph) = agent.server.graph(deployment) {
        let inputs: Vec<String> = graph
            .model
            .inputs()
            .iter()
            .map(|i| format!("{} ({} {:?})", i.name, i.dtype, i.shape))
            .collect();
        return error(
            StatusCode::BAD_REQUEST,
            format!(
                "deployment {deployment} takes named typed inputs: {{\"inputs\": {{NAME: {{\"dtype\", \"shape\", \"data\"}}}}}}; its inputs are {}",
                inputs.join(", ")
            ),
        );
    }
    let input = nephele_proto::Tensor {
        shape: parsed.shape,
        data: parsed.data,
    };
    match agent.server.serve(deployment, input).await {
        Ok(answer) => json(StatusCode::OK, &InferReply::from(answer)),
        Err(e) => serve_error(e),
    }
}

/// The HTTP answer to a request that was not served: 429 with Retry-After when
/// refused under load, 409 for a session's request while its previous one runs.
fn serve_error(e: ServeError) -> Response<Full<Bytes>> {
    match e {
        ServeError::NotFound(name) => error(
            StatusCode::NOT_FOUND,
            format!("deployment {name} is not assigned to this device"),
        ),
        e @ ServeError::NotReady(..) => error(StatusCode::SERVICE_UNAVAILABLE, e),
        e @ ServeError::BadInput(_) => error(StatusCode::BAD_REQUEST, e),
        e @ ServeError::Overloaded { retry_after_ms, .. } => {
            let mut response = error(StatusCode::TOO_MANY_REQUESTS, &e);
            let seconds = retry_after_ms.div_ceil(1000).max(1);
            if let Ok(value) = hyper::header::HeaderValue::from_str(&seconds.to_string()) {
                response.headers_mut().insert("retry-after", value);
            }
            response
        }
        e @ ServeError::Failed(_) => error(StatusCode::INTERNAL_SERVER_ERROR, e),
        e @ ServeError::Conflict(_) => error(StatusCode::CONFLICT, e),
    }
}
