//! `nephele-edge run`: start-up, the reconciler, and the streams the region opens.
//!
//! The session with the control plane (connect, backoff, replicas, heartbeats,
//! removal) is [`crate::session_core`], a state machine without IO, driven by
//! [`crate::session`].
//!
//! Local serving goes on in every state: a lost control plane only stops offload.
//! Offline-first: each desired state is kept on the device once applied
//! ([`crate::persisted`]), and at start the kept one is applied before any session, so
//! a device restarted while the control plane is unreachable serves again from its
//! verified cache; the control plane's state, when it comes, reloads only what
//! changed. A `Refused` with `Unauthorized` (the device was deleted, or its
//! certificate superseded) unloads everything, stops job members, and is kept: the
//! local endpoint answers 410 with the reason until the device enrols again.
//!
//! A pool agent also runs job members (`crate::jobs`): every `DesiredState`'s `jobs`
//! go to its `JobRunner` at once (not through the model reconciler, which may be busy
//! loading a model for minutes), its statuses ride in every `Heartbeat` and in `Hello`,
//! and the control plane reads members' logs with `JobLogs` request streams. SIGUSR1
//! sends an `InterruptionNotice` on the control stream (again on each new session
//! while the notice has time left).

use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _, Result};
use nephele_domain::FirmwareProfile;
use nephele_net::{read_frame, write_frame};
use nephele_proto::{
    digest_hex, DeploymentPhase, DesiredState, ErrorCode, ErrorFrame, InferResponse, InferStage,
    JobMemberStatus, ModelManifest, NodeReport, Payload, RequestBody, StreamRequest,
    StreamResponse, VariantKind, CHUNK_BYTES, MAX_FRAME_BYTES, PROTOCOL_VERSION,
};
use tokio::sync::watch;

use crate::config::Enrolment;
use crate::jobs::{JobRunner, JobRunnerConfig, SupervisorCommand};
use crate::reconcile_plan::Step;
use crate::serving::{lock, Deployment, Server};
use crate::RunArgs;

/// Resolves `--profile NAME` (built in, or a path to a TOML file), or detects the host.
pub fn resolve_profile(name: Option<&String>) -> Result<(String, String, FirmwareProfile)> {
    match name {
        Some(name) if name.ends_with(".toml") => {
            let text = std::fs::read_to_string(name)
                .with_context(|| format!("cannot read profile {name}"))?;
            let profile = FirmwareProfile::from_toml(&text, None)?;
            Ok((profile.device.name.clone(), text, profile))
        }
        Some(name) => {
            let Some(found) = nephele_domain::builtin_profiles::builtin(name) else {
                bail!(
                    "unknown firmware profile {name:?}; built-in profiles: {} (or pass a path to a .toml file)",
                    nephele_domain::builtin_profiles::builtin_names().join(", ")
                );
            };
            let text = nephele_domain::builtin_profiles::BUILTIN
                .iter()
                .find(|(n, _)| n == name)
                .map(|(_, t)| t.to_string())
                .unwrap_or_default();
            Ok((name.clone(), text, found?))
        }
        None => {
            let (cores, memory_mb) = host();
            let profile = FirmwareProfile::detected(cores, memory_mb, std::env::consts::ARCH);
            let text = toml::to_string(&profile)?;
            Ok(("detected".into(), text, profile))
        }
    }
}

/// This host's CPU cores and memory (MB, from /proc/meminfo; 1024 where unknown).
fn host() -> (u32, u64) {
    let cores = std::thread::available_parallelism()
        .map(|n| n.get() as u32)
        .unwrap_or(1);
    let memory_mb = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|text| {
            text.lines()
                .find(|l| l.starts_with("MemTotal:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|kb| kb.parse::<u64>().ok())
        })
        .map(|kb| kb / 1024)
        .unwrap_or(1024);
    (cores, memory_mb)
}

/// Warns, once at start, where the chosen profile contradicts this host: placement,
/// variant choice and batching will assume the profile, not the host.
fn warn_if_profile_contradicts_host(profile: &FirmwareProfile) {
    let (cores, memory_mb) = host();
    for contradiction in profile.contradictions(std::env::consts::ARCH, cores, memory_mb) {
        tracing::warn!(
            "{contradiction}: the control plane will place work and choose variants for the profile, not this host; give --profile matching the host, or omit it to detect the host"
        );
    }
}

/// Resident set size of this process, from /proc (0 where unavailable).
pub fn rss_bytes() -> u64 {
    std::fs::read_to_string("/proc/self/statm")
        .ok()
        .and_then(|text| {
            text.split_whitespace()
                .nth(1)
                .and_then(|p| p.parse::<u64>().ok())
        })
        .map(|pages| pages * 4096)
        .unwrap_or(0)
}

pub struct Agent {
    pub enrolment: Enrolment,
    pub profile_name: String,
    pub profile_toml: String,
    pub server: Arc<Server>,
    pub local_endpoint: String,
    pub started: Instant,
    pub applied_generation: AtomicU64,
    pub cache_dir: PathBuf,
    /// EWMA (1/4) of blob transfer throughput, bits per second (0: none measured).
    pub link_bps: AtomicU64,
    /// The job runner; pool agents only.
    pub jobs: Option<Arc<JobRunner>>,
    /// What `Hello` says of the node (address, GPUs).
    pub node: NodeReport,
    /// Notice reported on SIGUSR1, seconds.
    pub notice_seconds: u32,
    /// When the node goes away, after SIGUSR1 announced it; sessions send it on.
    pub notice: watch::Sender<Option<Instant>>,
    /// The certificate (DER) and key (PKCS#8 DER) sessions connect with: the
    /// enrolment's, then each renewal's ([`crate::renewal`]).
    identity: std::sync::RwLock<(Vec<u8>, Vec<u8>)>,
    /// `--renew-before-days`.
    pub renew_before_days: Option<u32>,
    /// What was served, until the control plane has counted it ([`crate::usage`]).
    pub usage: Mutex<crate::usage::UsageQueue>,
    /// Wakes the task that keeps `usage` on disk.
    pub(crate) usage_changed: tokio::sync::Notify,
    /// Wakes the session to report at once (a desired state was just applied).
    pub(crate) report_now: tokio::sync::Notify,
    usage_window: Duration,
}

impl Agent {
    /// The certificate and key to connect with.
    pub fn identity(&self) -> (Vec<u8>, Vec<u8>) {
        self.identity
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// A renewed certificate and its key, for the next session.
    pub fn set_identity(&self, cert_der: Vec<u8>, key_pkcs8_der: Vec<u8>) {
        *self.identity.write().unwrap_or_else(|p| p.into_inner()) = (cert_der, key_pkcs8_der);
    }

    /// The job members to report (none on an edge agent).
    pub fn job_statuses(&self) -> Vec<JobMemberStatus> {
        self.jobs
            .as_ref()
            .map(|runner| runner.statuses())
            .unwrap_or_default()
    }
}

pub async fn run(args: RunArgs) -> Result<()> {
    // First of all, so that a SIGUSR1 during start-up does not end the agent (its
    // default action); notices given then are reported once the agent is up.
    let interruptions = listen_for_interruptions();
    let enrolment = Enrolment::load(&args.data_dir)?;
    if let Some(role) = &args.role {
        if role != &enrolment.config.role {
            bail!(
                "this device enrolled with role {}, not {role}; re-run join with --role {role} --force to change it",
                enrolment.config.role
            );
        }
    }
    let profile_choice = args
        .profile
        .clone()
        .or_else(|| enrolment.config.profile.clone());
    let (profile_name, profile_toml, profile) = resolve_profile(profile_choice.as_ref())?;
    warn_if_profile_contradicts_host(&profile);
    let host_cores = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1);
    let n_slots = args
        .workers
        .unwrap_or_else(|| (profile.device.cpu_cores as usize).min(host_cores))
        .max(1);
    let metrics = nephele_telemetry::Registry::new();
    let is_pool = enrolment.config.role == "pool";
    let tracer = start_tracer(&args, &enrolment, &metrics)?;
    let server = Arc::new(
        Server::new(
            enrolment.config.name.clone(),
            is_pool,
            n_slots,
            metrics.clone(),
        )
        .with_tracer(tracer),
    );
    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .with_context(|| {
            format!(
                "cannot listen on {}; pick another --listen address",
                args.listen
            )
        })?;
    let local_addr = listener.local_addr()?;
    let cache_dir = args.data_dir.join("models");
    std::fs::create_dir_all(&cache_dir)?;
    // Pool agents run job members; the runner adopts those a previous agent left.
    let jobs = if is_pool {
        let config = JobRunnerConfig::new(&args.data_dir, SupervisorCommand::current()?);
        let runner = tokio::task::spawn_blocking(move || JobRunner::start(config))
            .await
            .context("job runner start")??;
        Some(Arc::new(runner))
    } else {
        None
    };
    let gpus =
        tokio::task::spawn_blocking(|| crate::node::detect_gpus(crate::node::NVIDIA_SMI_TIMEOUT))
            .await
            .unwrap_or_default();
    if !gpus.is_empty() {
        tracing::info!(gpus = gpus.len(), "GPUs found by nvidia-smi");
    }
    let agent = Arc::new(Agent {
        profile_name: profile_name.clone(),
        profile_toml,
        server: server.clone(),
        local_endpoint: local_addr.to_string(),
        started: Instant::now(),
        applied_generation: AtomicU64::new(0),
        link_bps: AtomicU64::new(0),
        cache_dir,
        identity: std::sync::RwLock::new((
            enrolment.cert_der.clone(),
            enrolment.key_pkcs8_der.clone(),
        )),
        renew_before_days: args.renew_before_days,
        usage: Mutex::new(load_usage(&args.data_dir)),
        usage_changed: tokio::sync::Notify::new(),
        report_now: tokio::sync::Notify::new(),
        usage_window: Duration::from_millis(args.usage_window_ms.max(100)),
        enrolment,
        jobs,
        node: NodeReport {
            address: args.advertise_address.trim().to_string(),
            gpus,
        },
        notice_seconds: args.notice_seconds,
        notice: watch::channel(None).0,
    });
    if let Some(interruptions) = interruptions {
        tokio::spawn(relay_interruptions(agent.clone(), interruptions));
    }
    tokio::spawn(crate::http::serve(listener, agent.clone()));
    if let Some(path) = &args.ready_file {
        let ready = serde_json::json!({"listen": local_addr.to_string(), "name": agent.enrolment.config.name});
        crate::config::write_file(path, &serde_json::to_vec(&ready)?, 0o644)?;
    }
    println!(
        "nephele-edge {} ({}, profile {}, {} inference slots) serving on http://{local_addr}",
        agent.enrolment.config.name, agent.enrolment.config.role, profile_name, n_slots
    );
    tokio::spawn(record_usage(agent.clone()));
    tokio::spawn(keep_usage(agent.clone()));
    let restored = restore(&agent);
    let (desired_tx, desired_rx) = watch::channel::<Option<DesiredState>>(None);
    tokio::spawn(reconciler(agent.clone(), desired_rx, restored));
    let session = tokio::spawn(crate::session::run(agent.clone(), desired_tx));
    tokio::select! {
        _ = shutdown_signal() => {
            if let Some(connection) = server.connection.lock().unwrap_or_else(|p| p.into_inner()).take() {
                connection.close(0u32.into(), b"agent shutting down");
            }
            tracing::info!("shutting down");
        }
        result = session => { result?; }
    }
    Ok(())
}

/// The agent's tracer: service `nephele-edge` on devices and `nephele-pool` on pool
/// nodes (so a trace shows which side of the offload a span is on), the device's name,
/// region and role as its resource.
fn start_tracer(
    args: &RunArgs,
    enrolment: &Enrolment,
    metrics: &nephele_telemetry::Registry,
) -> Result<nephele_otel::Tracer> {
    let service = if enrolment.config.role == "pool" {
        "nephele-pool"
    } else {
        "nephele-edge"
    };
    let settings = nephele_otel::Settings::resolve(
        args.otlp_endpoint.as_deref(),
        args.otlp_protocol.as_deref(),
        args.trace_sample_ratio,
        service,
        &|key| std::env::var(key).ok(),
    )
    .map_err(|e| anyhow::anyhow!("tracing: {e}"))?;
    let Some(settings) = settings else {
        return Ok(nephele_otel::Tracer::disabled());
    };
    let collector = settings.collector();
    let protocol = settings.protocol.label();
    let config = &enrolment.config;
    let tracer = nephele_otel::Tracer::start(
        settings,
        vec![
            ("service.instance.id".into(), config.name.clone().into()),
            ("service.version".into(), env!("CARGO_PKG_VERSION").into()),
            ("nephele.device".into(), config.name.clone().into()),
            ("nephele.region".into(), config.region.clone().into()),
            ("nephele.role".into(), config.role.clone().into()),
        ],
        metrics,
    )
    .context("cannot start the trace exporter")?;
    tracing::info!(%collector, protocol, "exporting spans");
    Ok(tracer)
}

#[cfg(unix)]
type Interruptions = tokio::signal::unix::Signal;
#[cfg(not(unix))]
type Interruptions = std::convert::Infallible;

/// SIGUSR1, caught from now on; `None` (logged) where it cannot be.
fn listen_for_interruptions() -> Option<Interruptions> {
    #[cfg(unix)]
    match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::user_defined1()) {
        Ok(usr1) => Some(usr1),
        Err(error) => {
            tracing::warn!(%error, "cannot listen for SIGUSR1; spot interruption notices are off");
            None
        }
    }
    #[cfg(not(unix))]
    None
}

/// SIGUSR1 announces that the node goes away within `--notice-seconds`: each one
/// (re)sets the deadline the sessions report.
#[cfg(unix)]
async fn relay_interruptions(agent: Arc<Agent>, mut usr1: Interruptions) {
    while usr1.recv().await.is_some() {
        let seconds = agent.notice_seconds;
        tracing::warn!(
            seconds,
            "SIGUSR1: this node will be taken away; telling the control plane"
        );
        agent.notice.send_replace(Some(
            Instant::now() + Duration::from_secs(u64::from(seconds)),
        ));
    }
}

#[cfg(not(unix))]
async fn relay_interruptions(_agent: Arc<Agent>, never: Interruptions) {
    match never {}
}

async fn shutdown_signal() {
    #[cfg(unix)]
    {
        let mut term =
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(term) => term,
                Err(_) => return std::future::pending().await,
            };
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = term.recv() => {}
        }
    }
    #[cfg(not(unix))]
    let _ = tokio::signal::ctrl_c().await;
}

/// One inference request from the control plane: a single tensor through the
/// deployment (or a split variant's tail), or a typed model's named tensors (a stateful
/// model's state comes with them and goes back in the answer; nothing is kept here).
async fn serve_infer(agent: &Arc<Agent>, infer: nephele_proto::InferRequest) -> StreamResponse {
    let unavailable =
        |error: String| StreamResponse::Error(ErrorFrame::new(ErrorCode::Unavailable, error));
    let answer = match (infer.input, &infer.stage) {
        (Payload::Tensor(input), InferStage::Whole) => {
            agent.server.serve(&infer.deployment, input).await
        }
        (Payload::Tensor(input), InferStage::Tail { variant }) => {
            agent
                .server
                .serve_tail(&infer.deployment, variant, input)
                .await
        }
        (typed @ Payload::Typed(_), InferStage::Whole) => {
            let request = match crate::typed_wire::from_payload(&typed) {
                Ok(request) => request,
                Err(error) => {
                    return StreamResponse::Error(ErrorFrame::new(ErrorCode::BadRequest, error))
                }
            };
            return match agent
                .server
                .serve_graph(&infer.deployment, request, None)
                .await
            {
                Ok(answer) => match crate::typed_wire::to_payload(&answer.outputs) {
                    Ok(output) => StreamResponse::Inferred(InferResponse {
                        request_id: infer.request_id,
                        output,
                        computed_by: answer.computed_by,
                        compute_us: answer.latency.as_micros() as u64,
                    }),
                    Err(error) => unavailable(error),
                },
                Err(error) => serve_error_frame(error),
            };
        }
        (Payload::Typed(_), InferStage::Tail { .. }) => {
            return StreamResponse::Error(ErrorFrame::new(
                ErrorCode::BadRequest,
                "split variants of typed models are not built, so there is no tail to run",
            ))
        }
    };
    match answer {
        Ok(answer) => StreamResponse::Inferred(InferResponse {
            request_id: infer.request_id,
            output: Payload::Tensor(answer.output),
            computed_by: answer.computed_by,
            compute_us: answer.latency.as_micros() as u64,
        }),
        Err(error) => serve_error_frame(error),
    }
}

/// The error frame for a request this replica did not serve. A full queue is
/// `Overloaded` with its Retry-After: the device then serves locally until then,
/// without counting it against its circuit breaker (as `Unavailable` it was taken for
/// a broken path: a pool filled by a burst opened devices' breakers, and offload
/// stayed shut for seconds after the burst). A request the model cannot take is
/// `BadRequest`: no reason to try another replica.
fn serve_error_frame(error: crate::serving::ServeError) -> StreamResponse {
    use crate::serving::ServeError;
    StreamResponse::Error(match error {
        ServeError::Overloaded { retry_after_ms, .. } => ErrorFrame::overloaded(
            error.to_string(),
            retry_after_ms.min(u64::from(u32::MAX)) as u32,
        ),
        ServeError::BadInput(_) => ErrorFrame::new(ErrorCode::BadRequest, error.to_string()),
        other => ErrorFrame::new(ErrorCode::Unavailable, other.to_string()),
    })
}

pub(crate) async fn serve_cloud_stream(
    agent: Arc<Agent>,
    mut send: quinn::SendStream,
    mut recv: quinn::RecvStream,
) {
    let response = match read_frame::<StreamRequest>(&mut recv, MAX_FRAME_BYTES).await {
        Ok(Some(request)) if request.protocol_version != PROTOCOL_VERSION => {
            StreamResponse::Error(ErrorFrame::new(
                ErrorCode::VersionMismatch,
                format!("agent speaks protocol {PROTOCOL_VERSION}"),
            ))
        }
        Ok(Some(StreamRequest {
            body: RequestBody::Infer(infer),
            ..
        })) => {
            // The replica's part of the device's trace, under the region's span.
            let caller = infer
                .trace
                .as_ref()
                .and_then(nephele_otel::TraceContext::from_wire);
            let tracer = agent.server.tracer.clone();
            let mut span = tracer.server(format!("infer {}", infer.deployment), caller);
            span.set("nephele.deployment", &infer.deployment);
            span.set("nephele.request_id", infer.request_id);
            if let InferStage::Tail { variant } = &infer.stage {
                span.set("nephele.variant", variant);
            }
            let context = span.context();
            let response =
                nephele_otel::current::scope(context, serve_infer(&agent, infer)).await;
            match &response {
                StreamResponse::Inferred(answer) => {
                    span.set("nephele.compute_us", answer.compute_us)
                }
                StreamResponse::Error(error) => span.fail(&error.message),
                _ => {}
            }
            response
        }
        Ok(Some(StreamRequest {
            body:
                RequestBody::JobLogs {
                    job,
                    attempt,
                    member,
                    offset,
                    max_bytes,
                },
            ..
        })) => match agent.jobs.clone() {
            Some(runner) => {
                let read = tokio::task::spawn_blocking(move || {
                    runner.read_log(&job, attempt, member, offset, max_bytes)
                })
                .await;
                match read {
                    Ok(Ok(chunk)) => StreamResponse::Logs {
                        data: chunk.data,
                        size: chunk.size,
                        finished: chunk.finished,
                    },
                    Ok(Err(error)) => StreamResponse::Error(error),
                    Err(error) => StreamResponse::Error(ErrorFrame::new(
                        ErrorCode::Internal,
                        format!("reading the log failed: {error}"),
                    )),
                }
            }
            None => StreamResponse::Error(ErrorFrame::new(
                ErrorCode::BadRequest,
                "this is an edge agent: it runs no jobs, so it has no job logs (they are on the pool agent that ran the member)",
            )),
        },
        Ok(Some(_)) => StreamResponse::Error(ErrorFrame::new(
            ErrorCode::BadRequest,
            "agents serve only inference and job log requests",
        )),
        Ok(None) => return,
        Err(error) => {
            tracing::warn!(%error, "bad request stream from the control plane");
            StreamResponse::Error(ErrorFrame::new(ErrorCode::BadRequest, error.to_string()))
        }
    };
    let _ = write_frame(&mut send, &response).await;
    let _ = send.finish();
}

/// Applies the latest desired state, one at a time; a newer state supersedes an older
/// one that has not been applied yet. While any deployment is failed (a download cut
/// short, a model that would not load), the last state is applied again every 10 s.
/// `restored` (the state kept on the device) is applied first, so the device serves
/// before, or without, the control plane; each state the control plane sends is kept
/// once applied ([`crate::persisted`]).
async fn reconciler(
    agent: Arc<Agent>,
    mut desired_rx: watch::Receiver<Option<DesiredState>>,
    restored: Option<DesiredState>,
) {
    let every = Duration::from_secs(10);
    let mut retry = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
    retry.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut last: Option<DesiredState> = restored;
    if let Some(desired) = &last {
        reconcile(&agent, desired).await;
        agent
            .applied_generation
            .store(desired.generation, Ordering::Relaxed);
        tracing::info!(
            deployments = desired.assignments.len(),
            ready_ms = agent.started.elapsed().as_millis() as u64,
            "applied the desired state kept on this device"
        );
    }
    loop {
        let mut fresh = false;
        tokio::select! {
            changed = desired_rx.changed() => {
                if changed.is_err() {
                    return;
                }
                last = desired_rx.borrow_and_update().clone();
                fresh = true;
            }
            _ = retry.tick() => {
                let any_failed = agent
                    .server
                    .phases
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .values()
                    .any(|phase| matches!(phase, DeploymentPhase::Failed(_)));
                if !any_failed {
                    continue;
                }
            }
        }
        if let Some(desired) = &last {
            reconcile(&agent, desired).await;
            agent
                .applied_generation
                .store(desired.generation, Ordering::Relaxed);
            if fresh {
                agent.report_now.notify_one();
                let data_dir = agent.enrolment.data_dir.clone();
                let kept = desired.clone();
                let saved = tokio::task::spawn_blocking(move || {
                    crate::persisted::save_desired(&data_dir, &kept)
                })
                .await;
                if let Ok(Err(error)) | Err(error) = saved.map_err(anyhow::Error::from) {
                    tracing::warn!(error = %format!("{error:#}"), "cannot keep the desired state on this device; a restart without the control plane will serve nothing");
                }
            }
        }
    }
}

/// The usage queue kept on the device, or a new one (a damaged file is logged and
/// replaced).
fn load_usage(data_dir: &std::path::Path) -> crate::usage::UsageQueue {
    match crate::usage::UsageQueue::load(data_dir, crate::usage::UsageQueue::DEFAULT_BOUND) {
        Ok(queue) => queue,
        Err((fresh, reason)) => {
            tracing::error!(%reason, "the usage queue kept on this device is unreadable; starting a new one (its records are lost)");
            fresh
        }
    }
}

/// Closes a usage window every `usage_window`: what each deployment served in it
/// becomes a record in the queue.
async fn record_usage(agent: Arc<Agent>) {
    let mut last = std::collections::BTreeMap::new();
    let mut start = crate::usage::now_unix_ms();
    let mut tick = tokio::time::interval_at(
        tokio::time::Instant::now() + agent.usage_window,
        agent.usage_window,
    );
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let end = crate::usage::now_unix_ms();
        let now = agent.server.telemetry();
        let added = lock(&agent.usage).record_window(start, end, &now, &mut last);
        start = end;
        if added {
            agent.usage_changed.notify_one();
        }
    }
}

/// Writes the usage queue to disk after each change (the latest state, in order).
async fn keep_usage(agent: Arc<Agent>) {
    loop {
        agent.usage_changed.notified().await;
        let snapshot = lock(&agent.usage).clone();
        let data_dir = agent.enrolment.data_dir.clone();
        let saved = tokio::task::spawn_blocking(move || snapshot.save(&data_dir)).await;
        if let Ok(Err(error)) | Err(error) = saved.map_err(anyhow::Error::from) {
            tracing::warn!(error = %format!("{error:#}"), "cannot keep the usage queue on this device");
        }
    }
}

/// The desired state kept on the device, to serve before the control plane answers;
/// none when the device was removed from the fleet, or when the kept file is damaged
/// (refused whole, with the reason: the control plane's next state replaces it).
fn restore(agent: &Agent) -> Option<DesiredState> {
    let data_dir = &agent.enrolment.data_dir;
    if let Some(reason) = crate::persisted::load_removed(data_dir) {
        tracing::warn!(%reason, "the control plane removed this device from the fleet; serving nothing (enrol again with `nephele-edge join`)");
        agent.server.set_removed(Some(reason));
        return None;
    }
    match crate::persisted::load_desired(data_dir) {
        Ok(Some(desired)) => {
            tracing::info!(
                generation = desired.generation,
                deployments = desired.assignments.len(),
                "serving the desired state kept on this device until the control plane answers"
            );
            Some(desired)
        }
        Ok(None) => None,
        Err(reason) => {
            agent
                .server
                .metrics
                .counter(
                    "nephele_agent_kept_state_refused_total",
                    "Desired states kept on the device that were refused at start (damaged).",
                    &[],
                )
                .inc();
            tracing::error!(%reason, "the desired state kept on this device is refused; serving nothing until the control plane sends one");
            if let Err(error) = crate::persisted::forget_desired(data_dir) {
                tracing::warn!(%error, "cannot remove the refused desired-state file");
            }
            None
        }
    }
}

/// The split tail a device running a split variant keeps (to run the whole model when
/// the cloud cannot take the tail), loaded, and that variant's name; nothing for other
/// variants. A pool loads tails on demand instead ([`tail_loader`]).
async fn load_tails(
    agent: &Arc<Agent>,
    manifest: &ModelManifest,
    variant: &nephele_proto::ModelVariant,
) -> anyhow::Result<(
    HashMap<String, (nephele_runtime::Model, u64)>,
    Option<String>,
)> {
    let mut tails = HashMap::new();
    if agent.server.is_pool || !matches!(variant.kind, VariantKind::Split { .. }) {
        return Ok((tails, None));
    }
    let loaded = load_tail(agent, manifest, variant)
        .await
        .map_err(|e| anyhow::anyhow!("tail of {}: {e}", variant.name))?;
    tails.insert(variant.name.clone(), loaded);
    Ok((tails, Some(variant.name.clone())))
}

/// Fetches (from the cache or the control plane) and loads the tail of split variant
/// `split`, with the bytes of its file.
async fn load_tail(
    agent: &Arc<Agent>,
    manifest: &ModelManifest,
    split: &nephele_proto::ModelVariant,
) -> Result<(nephele_runtime::Model, u64), String> {
    let VariantKind::Split {
        tail_sha256,
        tail_size,
        ..
    } = &split.kind
    else {
        return Err(format!("{} is not a split variant", split.name));
    };
    let bytes = fetch_model(agent, tail_sha256, *tail_size)
        .await
        .map_err(|e| format!("{e:#}"))?;
    let size = bytes.len() as u64;
    let name = format!("{}:{}:tail", manifest.name, split.name);
    let model = tokio::task::spawn_blocking(move || {
        // A tail runs one activation at a time (unbatched): no larger plans are built,
        // so the parsed model they would start from need not be kept.
        nephele_runtime::Model::load_variant(&name, &bytes, None)
            .map(nephele_runtime::Model::single_row_only)
    })
    .await
    .map_err(|e| e.to_string())?
    .map_err(|e| e.to_string())?;
    Ok((model, size))
}

/// On a pool, loads a model's split tails when a device first sends that cut, so a
/// pool holds only the tails in use (each one once, whatever the number of devices).
fn tail_loader(agent: &Arc<Agent>, manifest: &ModelManifest) -> crate::serving::TailLoader {
    let agent = Arc::clone(agent);
    let manifest = Arc::new(manifest.clone());
    Arc::new(move |variant: String| {
        let agent = Arc::clone(&agent);
        let manifest = Arc::clone(&manifest);
        Box::pin(async move {
            let split = manifest
                .variants
                .iter()
                .find(|v| v.name == variant && matches!(v.kind, VariantKind::Split { .. }))
                .ok_or_else(|| format!("model {} has no split variant {variant}", manifest.name))?;
            load_tail(&agent, &manifest, split).await
        })
    })
}

/// Loads a model with several typed inputs and outputs, checks that it runs on zeros,
/// and serves it as a graph deployment (no batcher; offload as the assignment says).
async fn load_graph(
    agent: &Arc<Agent>,
    assignment: &nephele_proto::Assignment,
    manifest: &ModelManifest,
    variant: &nephele_proto::ModelVariant,
    bytes: Vec<u8>,
) {
    use nephele_runtime::graph_model::GraphModel;
    let name = assignment.deployment.as_str();
    let model_name = manifest.name.clone();
    let loaded = tokio::task::spawn_blocking(move || {
        let model = GraphModel::load(&model_name, &bytes)?;
        // Timed: the first estimate of local service time, before any request.
        let started = std::time::Instant::now();
        model.run(&model.zeros())?;
        Ok::<_, nephele_runtime::RuntimeError>((model, started.elapsed()))
    })
    .await;
    match loaded {
        Ok(Ok((model, first_run))) => {
            let batch_axis = model.batch_axis().map(str::to_string);
            let deployment = crate::graph_serving::GraphDeployment::new(
                assignment.clone(),
                model,
                variant.sha256,
                variant.name.clone(),
                manifest
                    .state
                    .iter()
                    .map(|b| (b.input.clone(), b.output.clone()))
                    .collect(),
            );
            deployment.observe_service(first_run);
            agent
                .server
                .graphs
                .write()
                .unwrap_or_else(|p| p.into_inner())
                .insert(name.to_string(), Arc::new(deployment));
            agent
                .server
                .phases
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .remove(name);
            count_load(agent, name);
            tracing::info!(deployment = %name, model = %manifest.name, batch_axis = ?batch_axis, "deployment ready (typed inputs)");
        }
        Ok(Err(error)) => {
            tracing::error!(deployment = %name, %error, "model failed to load");
            set_phase(agent, name, DeploymentPhase::Failed(error.to_string()));
        }
        Err(error) => set_phase(agent, name, DeploymentPhase::Failed(error.to_string())),
    }
}

/// Counts a model loaded for a deployment: a reconnect that reloads what already runs
/// shows here.
fn count_load(agent: &Agent, deployment: &str) {
    agent
        .server
        .metrics
        .counter(
            "nephele_agent_model_loads_total",
            "Models loaded for a deployment since the agent started.",
            &[("deployment", deployment)],
        )
        .inc();
}

fn set_phase(agent: &Agent, deployment: &str, phase: DeploymentPhase) {
    agent
        .server
        .phases
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .insert(deployment.to_string(), phase);
}

/// What each running deployment runs: its name and the sha256 of its bytes.
fn running_digests(server: &Server) -> HashMap<String, [u8; 32]> {
    let mut running: HashMap<String, [u8; 32]> = server
        .deployments
        .read()
        .unwrap_or_else(|p| p.into_inner())
        .iter()
        .map(|(name, deployment)| (name.clone(), deployment.model_digest))
        .collect();
    for (name, graph) in server
        .graphs
        .read()
        .unwrap_or_else(|p| p.into_inner())
        .iter()
    {
        running.insert(name.clone(), graph.model_digest);
    }
    running
}

async fn reconcile(agent: &Arc<Agent>, desired: &DesiredState) {
    let server = &agent.server;
    let plan = crate::reconcile_plan::plan(
        desired,
        &running_digests(server),
        &agent.enrolment.signing_key,
    );
    for name in &plan.remove {
        tracing::info!(deployment = %name, "deployment removed");
    }
    server
        .deployments
        .write()
        .unwrap_or_else(|p| p.into_inner())
        .retain(|name, _| !plan.remove.contains(name));
    server
        .graphs
        .write()
        .unwrap_or_else(|p| p.into_inner())
        .retain(|name, _| !plan.remove.contains(name));
    let wanted: HashSet<&str> = desired
        .assignments
        .iter()
        .map(|a| a.deployment.as_str())
        .collect();
    lock(&server.phases).retain(|name, _| wanted.contains(name.as_str()));

    for step in plan.steps {
        let (assignment, manifest, variant) = match step {
            Step::Refuse { deployment, error } => {
                tracing::error!(%deployment, %error, "refusing deployment");
                set_phase(agent, &deployment, DeploymentPhase::Failed(error));
                continue;
            }
            Step::Keep(assignment) => {
                // Runs these bytes already: new parameters, nothing reloaded.
                let name = &assignment.deployment;
                if let Some(existing) = server.graph(name) {
                    *existing.params.write().unwrap_or_else(|p| p.into_inner()) = assignment;
                } else if let Some(existing) = server.deployment(name) {
                    *existing.params.write().unwrap_or_else(|p| p.into_inner()) = assignment;
                }
                continue;
            }
            Step::Load {
                assignment,
                manifest,
                variant,
            } => (assignment, *manifest, *variant),
        };
        let assignment = &assignment;
        let name = assignment.deployment.clone();
        set_phase(agent, &name, DeploymentPhase::Downloading);
        let bytes = match fetch_model(agent, &variant.sha256, variant.size).await {
            Ok(bytes) => bytes,
            Err(error) => {
                let message = format!("{error:#}");
                tracing::warn!(deployment = %name, error = %message, "model download failed; will retry on the next desired state");
                set_phase(agent, &name, DeploymentPhase::Failed(message));
                continue;
            }
        };
        if manifest.format == nephele_runtime::graph_model::FORMAT_ONNX_GRAPH {
            load_graph(agent, assignment, &manifest, &variant, bytes).await;
            continue;
        }
        // Tails of split variants: a device running a split keeps its own (to run the
        // whole model when the cloud cannot take the tail); a pool loads a tail when a
        // device first sends it that cut.
        let (tails, split) = match load_tails(agent, &manifest, &variant).await {
            Ok(found) => found,
            Err(error) => {
                let message = format!("{error:#}");
                tracing::warn!(deployment = %name, error = %message, "split tail not loaded; will retry on the next desired state");
                set_phase(agent, &name, DeploymentPhase::Failed(message));
                continue;
            }
        };
        let loader = server.is_pool.then(|| tail_loader(agent, &manifest));
        let model_name = manifest.name.clone();
        let format = manifest.format.clone();
        let input_shape = manifest
            .inputs
            .first()
            .map(|spec| spec.shape.clone())
            .unwrap_or_default();
        // A pool replica takes the overflow of a whole fleet, so its queue is not the
        // per-device bound of the deployment.
        let capacity = if server.is_pool {
            POOL_QUEUE_CAPACITY
        } else {
            assignment.max_queue as usize
        };
        // Up to 64 rows per batch, never more than may queue.
        let max_batch = capacity.clamp(1, 64);
        let loaded = tokio::task::spawn_blocking(move || {
            #[allow(unused_mut)]
            let mut model = nephele_runtime::Model::load_shipped(
                &model_name,
                &bytes,
                &format,
                &input_shape,
            )?;
            #[cfg(feature = "onnxruntime")]
            match model.attach_onnxruntime(&bytes) {
                Ok(()) => match model.choose_backend(20) {
                    Ok(choice) => tracing::info!(model = %model_name, ?choice, "backend chosen by measurement"),
                    Err(error) => tracing::warn!(model = %model_name, %error, "backend measurement failed; tract"),
                },
                Err(error) => tracing::info!(model = %model_name, %error, "onnxruntime not available; tract"),
            }
            // The batcher chooses batch sizes from what each size costs on this device.
            let profile = model.tune_batches(max_batch, 5)?;
            Ok::<_, nephele_runtime::RuntimeError>((model, profile))
        })
        .await;
        match loaded {
            Ok(Ok((model, profile))) => {
                tracing::info!(deployment = %name, ?profile, "measured service time per batch size (µs)");
                let batcher = crate::batcher::Batcher::start(
                    model.clone(),
                    crate::batcher::BatcherConfig {
                        capacity,
                        slo_us: u64::from(assignment.slo_ms) * 1000,
                        profile,
                        fixed: None,
                        // The same bound the offload policy accepts local work within:
                        // what the router admitted on a coarser estimate and the
                        // batcher then predicts to be later than that is refused (429)
                        // instead of answered late.
                        admit_within_us: Some(server.local_bound_us(assignment.slo_ms)),
                    },
                    server.slots.clone(),
                );
                let deployment = Deployment::new(
                    assignment.clone(),
                    model,
                    batcher,
                    variant.sha256,
                    variant.name.clone(),
                )
                .with_tails(tails, split);
                let deployment = Arc::new(match loader {
                    Some(loader) => deployment.with_tail_loader(loader),
                    None => deployment,
                });
                server
                    .deployments
                    .write()
                    .unwrap_or_else(|p| p.into_inner())
                    .insert(name.clone(), deployment);
                server
                    .phases
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .remove(&name);
                count_load(agent, &name);
                server
                    .metrics
                    .gauge(
                        "nephele_agent_slo_milliseconds",
                        "Each deployment's latency objective on this agent (what alerts compare its p99 with).",
                        &[("deployment", &name)],
                    )
                    .set(i64::from(assignment.slo_ms));
                tracing::info!(deployment = %name, model = %manifest.name, variant = %variant.name, "deployment ready");
            }
            Ok(Err(error)) => {
                tracing::error!(deployment = %name, %error, "model failed to load");
                set_phase(agent, &name, DeploymentPhase::Failed(error.to_string()));
            }
            Err(error) => set_phase(agent, &name, DeploymentPhase::Failed(error.to_string())),
        }
    }
}

fn sha256(bytes: &[u8]) -> [u8; 32] {
    let mut out = [0u8; 32];
    out.copy_from_slice(ring::digest::digest(&ring::digest::SHA256, bytes).as_ref());
    out
}

/// Returns the verified bytes of a blob, from the cache or fetched in chunks (each on
/// its own stream; a cut resumes from the last whole chunk on the next attempt).
async fn fetch_model(agent: &Arc<Agent>, digest: &[u8; 32], size: u64) -> Result<Vec<u8>> {
    let hex = digest_hex(digest);
    let cache_path = agent.cache_dir.join(&hex);
    let mut damaged = false;
    if let Ok(bytes) = tokio::fs::read(&cache_path).await {
        if sha256(&bytes) == *digest {
            return Ok(bytes);
        }
        // Refused and removed, so that no later read takes it either.
        tracing::warn!(blob = %hex, "cached model is corrupt (sha256 mismatch); removed, fetching it again");
        agent
            .server
            .metrics
            .counter(
                "nephele_agent_corrupt_cache_total",
                "Cached models found damaged (sha256 mismatch) and fetched again.",
                &[],
            )
            .inc();
        let _ = tokio::fs::remove_file(&cache_path).await;
        damaged = true;
    }
    let partial_path = agent.cache_dir.join(format!("{hex}.partial"));
    let mut bytes = tokio::fs::read(&partial_path).await.unwrap_or_default();
    bytes.truncate((bytes.len() as u64 / u64::from(CHUNK_BYTES) * u64::from(CHUNK_BYTES)) as usize);
    let connection = agent
        .server
        .connection
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .clone()
        .with_context(|| {
            if damaged {
                "the cached copy was damaged (sha256 mismatch) and the control plane is not reachable to fetch it again"
            } else {
                "not cached on this device and the control plane is not reachable to fetch it"
            }
        })?;
    while (bytes.len() as u64) < size {
        let chunk_started = Instant::now();
        let data =
            crate::blob_fetch::fetch_chunk(&connection, digest, bytes.len() as u64, size).await?;
        bytes.extend_from_slice(&data);
        // Throughput of the transfer itself: the chunk's time less one round trip (the
        // request), at least a tenth of it; chunks under 16 KiB are mostly round trip
        // and are not sampled.
        if data.len() >= 16 * 1024 {
            let elapsed = chunk_started.elapsed().as_secs_f64();
            let rtt = connection.rtt().as_secs_f64();
            let seconds = (elapsed - rtt).max(elapsed / 10.0).max(1e-6);
            let sample = (data.len() as f64 * 8.0 / seconds) as u64;
            let previous = agent.link_bps.load(Ordering::Relaxed);
            let next = if previous == 0 {
                sample
            } else {
                (previous * 3 + sample) / 4
            };
            agent.link_bps.store(next.max(1), Ordering::Relaxed);
        }
        tokio::fs::write(&partial_path, &bytes).await?;
    }
    if sha256(&bytes) != *digest {
        let _ = tokio::fs::remove_file(&partial_path).await;
        bail!("downloaded model {hex} does not match its sha256; discarded");
    }
    crate::config::write_file(&cache_path, &bytes, 0o644)?;
    let _ = tokio::fs::remove_file(&partial_path).await;
    agent
        .server
        .metrics
        .counter(
            "nephele_agent_model_bytes_downloaded_total",
            "Model bytes downloaded from the control plane.",
            &[],
        )
        .add(size);
    Ok(bytes)
}

/// Requests a pool replica queues per deployment before it refuses.
pub const POOL_QUEUE_CAPACITY: usize = 4096;
