//! Serving one request: local inference (through the deployment's dynamic batcher) or
//! offload, decided per request by [`nephele_infer_policy::offload::decide`]:
//!
//! | condition (checked in order)                                   | action                          |
//! |----------------------------------------------------------------|---------------------------------|
//! | agent is a pool replica                                        | local                           |
//! | local queue has room and predicted local ≤ SLO                 | local                           |
//! | cloud connected, predicted remote ≤ SLO, circuit breaker closed | offload; on failure local if within tolerance, else 429 |
//! | local queue has room and predicted local ≤ SLO × 1.25           | local (late, but answered)      |
//! | otherwise                                                      | refuse with 429 and Retry-After |
//!
//! When the region's admission control refuses an offload (429 with a Retry-After, as
//! `ErrorFrame::overloaded`), the agent keeps its requests local until then, without
//! counting it against the circuit breaker; one it cannot serve locally gets 429 with
//! the later of the two Retry-Afters.
//!
//! Predicted local = (requests queued or running + 1) × measured service time per row
//! (as the batcher runs them) ÷ inference slots, times one plus the margin learned from
//! how late local answers have come ([`nephele_infer_policy::lateness`]); predicted remote = the EWMA of measured
//! offload round trips, or the QUIC RTT plus the local service time before the first;
//! an estimate with no sample for a second decays towards the latter, and a request
//! refused while it is stale goes to the cloud as a probe, one at a time
//! ([`nephele_infer_policy::remote`]), so one slow spell never locks offload out.
//! After a local answer, a deployment with a hard-example threshold re-asks the cloud
//! when the answer's top-class probability is below it (joint inference); if the cloud
//! fails, the local answer stands. Every offload waits for its answer only as long as
//! its request has left before the SLO with the lateness tolerance
//! ([`nephele_infer_policy::offload::offload_wait_us`]; less the local run that would
//! follow a failure): a link that goes silent holds no client past its deadline. A
//! hard example then keeps its local answer, and an overflow request gets its 429.
//! Offload failures open the circuit breaker, which keeps requests local until a
//! probe succeeds; the session brings the probe forward when the transport hears from
//! the control plane again ([`Server::path_alive`]). No request is dropped silently:
//! each one gets an answer or an error.
//!
//! A deployment of a split variant (`split@<cut>`) runs its head here, through the
//! batcher, and sends the activation at the cut to the region, whose pool replica runs
//! the tail ([`InferStage::Tail`]); the answer is `where: "split"`. The agent keeps the
//! tail too: while the cloud is unreachable or the breaker is open, or when the remote
//! tail fails, it runs the tail itself (`where: "local"`), so a split deployment
//! degrades to the whole model on the device rather than failing.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use nephele_infer_policy::lateness::LocalLateness;
use nephele_infer_policy::offload::{
    after_local_answer, decide, offload_wait_us, AfterLocal, BreakerConfig, CircuitBreaker,
    OffloadPolicy, RemoteEstimate, RequestContext, Route,
};
use nephele_infer_policy::remote::{offload_overflow, probe_if_refused, RemoteEstimator};
use nephele_net::{read_frame, write_frame};
use nephele_proto::{
    Assignment, DeploymentPhase, DeploymentTelemetry, ErrorCode, InferRequest, InferStage, Payload,
    RequestBody, StreamRequest, StreamResponse, Tensor, MAX_FRAME_BYTES, PROTOCOL_VERSION,
};
use nephele_telemetry::{LatencyWindow, Registry};
use tokio::sync::Semaphore;

use crate::batcher::{BatchError, Batcher};

/// Top-class probability of a classifier's output: the largest softmax value (1 for an
/// empty or non-finite output, so such an answer is never taken as a hard example).
pub fn confidence(logits: &[f32]) -> f64 {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    if logits.is_empty() || !max.is_finite() {
        return 1.0;
    }
    let sum: f64 = logits.iter().map(|v| f64::from(v - max).exp()).sum();
    if sum.is_finite() && sum > 0.0 {
        1.0 / sum
    } else {
        1.0
    }
}

/// A deployment loaded on this agent.
pub struct Deployment {
    pub name: String,
    pub model: nephele_runtime::Model,
    /// Single-row requests go through it; multi-row ones run as they come.
    pub batcher: Batcher,
    /// The offload round trip as measured, aging and re-probed (see
    /// [`nephele_infer_policy::remote`]).
    remote: Mutex<RemoteEstimator>,
    /// How much later than predicted local answers come (see
    /// [`nephele_infer_policy::lateness`]).
    local_lateness: Mutex<LocalLateness>,
    pub model_digest: [u8; 32],
    pub variant: String,
    pub params: RwLock<Assignment>,
    queued: AtomicU32,
    served_local: AtomicU64,
    served_offloaded: AtomicU64,
    failed: AtomicU64,
    latencies: Mutex<LatencyWindow>,
    /// Tails of split variants by variant name, with the bytes of their files: on a
    /// device that runs a split, its own (the local fallback), loaded with the head; on a
    /// pool, those devices asked for, each loaded on its first request by `tail_loader`.
    tails: RwLock<HashMap<String, (nephele_runtime::Model, u64)>>,
    /// Loads a tail by variant name (on a pool); `None` on a device.
    tail_loader: Option<TailLoader>,
    /// Held while a tail loads, so concurrent first requests load it once.
    tail_loading: tokio::sync::Mutex<()>,
    /// The split variant whose head `model` is, on a device that runs one.
    split: Option<String>,
}

impl Deployment {
    /// The model's input name, as the file declares it.
    pub fn input_name(&self) -> String {
        self.model.input().name.clone()
    }

    /// The name of what an answer is: the file's output (a split variant's head ends at
    /// its cut, so the answer is named from its tail, the rest of the file).
    pub fn output_name(&self) -> String {
        if let Some(split) = &self.split {
            if let Some((tail, _)) = self
                .tails
                .read()
                .unwrap_or_else(|p| p.into_inner())
                .get(split)
            {
                return tail.output().name.clone();
            }
        }
        self.model.output().name.clone()
    }

    pub fn new(
        assignment: Assignment,
        model: nephele_runtime::Model,
        batcher: Batcher,
        model_digest: [u8; 32],
        variant: String,
    ) -> Self {
        Deployment {
            name: assignment.deployment.clone(),
            model,
            batcher,
            remote: Mutex::new(RemoteEstimator::default()),
            local_lateness: Mutex::new(LocalLateness::default()),
            model_digest,
            variant,
            params: RwLock::new(assignment),
            queued: AtomicU32::new(0),
            served_local: AtomicU64::new(0),
            served_offloaded: AtomicU64::new(0),
            failed: AtomicU64::new(0),
            latencies: Mutex::new(LatencyWindow::new(4096)),
            tails: RwLock::new(HashMap::new()),
            tail_loader: None,
            tail_loading: tokio::sync::Mutex::new(()),
            split: None,
        }
    }

    /// With the tails of split variants (by variant name) loaded, and, on a device
    /// that runs one, the split variant whose head `model` is.
    pub fn with_tails(
        mut self,
        tails: HashMap<String, (nephele_runtime::Model, u64)>,
        split: Option<String>,
    ) -> Self {
        self.tails = RwLock::new(tails);
        self.split = split;
        self
    }

    /// With tails loaded on demand by `loader` (a pool replica).
    pub fn with_tail_loader(mut self, loader: TailLoader) -> Self {
        self.tail_loader = Some(loader);
        self
    }

    /// The tails loaded here, by variant name, with the bytes of their files.
    pub fn loaded_tails(&self) -> Vec<(String, u64)> {
        let mut tails: Vec<(String, u64)> = self
            .tails
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .map(|(name, (_, bytes))| (name.clone(), *bytes))
            .collect();
        tails.sort();
        tails
    }

    fn tail(&self, variant: &str) -> Option<nephele_runtime::Model> {
        self.tails
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .get(variant)
            .map(|(model, _)| model.clone())
    }

    fn params(&self) -> Assignment {
        self.params
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    pub fn telemetry(&self) -> DeploymentTelemetry {
        let latencies = self.latencies.lock().unwrap_or_else(|p| p.into_inner());
        DeploymentTelemetry {
            deployment: self.name.clone(),
            phase: DeploymentPhase::Ready,
            variant: self.variant.clone(),
            served_local: self.served_local.load(Ordering::Relaxed),
            served_offloaded: self.served_offloaded.load(Ordering::Relaxed),
            failed: self.failed.load(Ordering::Relaxed),
            queue_len: self.queued.load(Ordering::Relaxed),
            p50_us: latencies.quantile(0.5),
            p99_us: latencies.quantile(0.99),
            service_us: self.batcher.measured_service_us(),
            model_sha256: self.model_digest,
        }
    }
}

/// Loads the tail of a split variant by name: the model and the bytes of its file, or
/// why not (an unknown variant, a failed download or load).
pub type TailLoader = Arc<
    dyn Fn(
            String,
        ) -> std::pin::Pin<
            Box<
                dyn std::future::Future<Output = Result<(nephele_runtime::Model, u64), String>>
                    + Send,
            >,
        > + Send
        + Sync,
>;

/// What an offload is for: the deployment's name, where its outcome is counted (the
/// round-trip estimate, the offloaded count), and how long it may wait.
pub(crate) struct OffloadTarget<'a> {
    pub name: &'a str,
    pub remote: &'a Mutex<RemoteEstimator>,
    pub offloaded: &'a AtomicU64,
    /// How long to wait for the answer ([`Server::offload_wait`]).
    pub wait: Duration,
}

/// Why an offload gave no answer.
#[derive(Debug)]
enum OffloadError {
    /// The region's admission control refused it, saying when to try again.
    Shed {
        retry_after_ms: u64,
        message: String,
    },
    /// The replica could not take this input (`BadRequest`): the path works, so the
    /// breaker is left alone; the device's own run gives the client the reason.
    BadInput(String),
    /// The path or the replica failed (counts against the circuit breaker).
    Failed(String),
    /// No answer within the request's time left (counts against the breaker; the wait
    /// is a lower bound of this round trip, and teaches the estimate so).
    TimedOut(Duration),
}

impl std::fmt::Display for OffloadError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            OffloadError::Shed {
                retry_after_ms,
                message,
            } => write!(
                f,
                "shed by the region (retry after {retry_after_ms} ms): {message}"
            ),
            OffloadError::BadInput(message) => {
                write!(f, "the pool could not take this input: {message}")
            }
            OffloadError::Failed(message) => write!(f, "{message}"),
            OffloadError::TimedOut(after) => write!(
                f,
                "no answer within the {} ms the request had left",
                after.as_millis()
            ),
        }
    }
}

/// Where a request was computed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Location {
    Local,
    Cloud,
    /// The head here, the tail in the cloud.
    Split,
}

#[derive(Debug)]
pub struct Answer {
    pub output: Tensor,
    pub computed_by: String,
    pub location: Location,
    pub latency: Duration,
    /// The local answer was not confident enough and this is the cloud's.
    pub hard_example: bool,
}

#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error("deployment {0} is not assigned to this device")]
    NotFound(String),
    #[error("deployment {0} is not ready on this device yet ({1})")]
    NotReady(String, String),
    #[error("bad input: {0}")]
    BadInput(String),
    #[error("overloaded: the local queue for {deployment} is full and offload is not possible; retry after {retry_after_ms} ms")]
    Overloaded {
        deployment: String,
        retry_after_ms: u64,
    },
    #[error("inference failed: {0}")]
    Failed(String),
    /// The request conflicts with one in progress (a session's previous chunk).
    #[error("conflict: {0}")]
    Conflict(String),
}

/// Everything the serving path needs, shared by the HTTP endpoint, the session (pool
/// role) and the reconciler.
pub struct Server {
    pub name: String,
    pub is_pool: bool,
    pub deployments: RwLock<HashMap<String, Arc<Deployment>>>,
    /// Deployments of models with several typed inputs and outputs
    /// ([`crate::graph_serving`]).
    pub graphs: RwLock<HashMap<String, Arc<crate::graph_serving::GraphDeployment>>>,
    /// Phase of deployments that are not (yet) serving.
    pub phases: Mutex<HashMap<String, DeploymentPhase>>,
    pub connection: Mutex<Option<quinn::Connection>>,
    pub slots: Arc<Semaphore>,
    pub n_slots: usize,
    pub metrics: Registry,
    next_request_id: AtomicU64,
    /// One breaker for the agent's path to the cloud, shared by its deployments.
    breaker: Mutex<CircuitBreaker>,
    /// Until when (µs on `origin`) the region sheds this agent's offloads (its
    /// admission control answered 429 with a Retry-After): requests stay local.
    shed_until_us: AtomicU64,
    pub(crate) policy: OffloadPolicy,
    origin: Instant,
    /// Why the control plane removed this device from the fleet, once it has: the
    /// device then serves nothing and says so.
    removed: RwLock<Option<String>>,
    /// Spans of the requests served here and of their offloads.
    pub tracer: nephele_otel::Tracer,
}

impl Server {
    pub fn new(name: String, is_pool: bool, n_slots: usize, metrics: Registry) -> Self {
        Server {
            name,
            is_pool,
            deployments: RwLock::new(HashMap::new()),
            graphs: RwLock::new(HashMap::new()),
            phases: Mutex::new(HashMap::new()),
            connection: Mutex::new(None),
            slots: Arc::new(Semaphore::new(n_slots.max(1))),
            n_slots: n_slots.max(1),
            metrics,
            next_request_id: AtomicU64::new(1),
            breaker: Mutex::new(CircuitBreaker::new(BreakerConfig::default())),
            shed_until_us: AtomicU64::new(0),
            policy: OffloadPolicy::default(),
            origin: Instant::now(),
            removed: RwLock::new(None),
            tracer: nephele_otel::Tracer::disabled(),
        }
    }

    /// The same server, recording spans with `tracer`.
    pub fn with_tracer(mut self, tracer: nephele_otel::Tracer) -> Self {
        self.tracer = tracer;
        self
    }

    /// Why the control plane removed this device, if it did.
    pub fn removed(&self) -> Option<String> {
        self.removed
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Marks the device removed from the fleet (`None`: a member again).
    pub fn set_removed(&self, reason: Option<String>) {
        *self.removed.write().unwrap_or_else(|p| p.into_inner()) = reason;
    }

    pub fn deployment(&self, name: &str) -> Option<Arc<Deployment>> {
        self.deployments
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .get(name)
            .cloned()
    }

    /// Whether a session with the control plane is up.
    pub fn is_connected(&self) -> bool {
        self.connection().is_some()
    }

    fn connection(&self) -> Option<quinn::Connection> {
        self.connection
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
            .filter(|c| c.close_reason().is_none())
    }

    /// How long the region still sheds offloads, ms (0: it does not).
    pub(crate) fn shed_ms(&self) -> u64 {
        self.shed_until_us
            .load(Ordering::Relaxed)
            .saturating_sub(self.now_us())
            .div_ceil(1000)
    }

    /// The connection to offload over, unless the region sheds now.
    pub(crate) fn offload_connection(&self) -> Option<quinn::Connection> {
        (self.shed_ms() == 0).then(|| self.connection()).flatten()
    }

    /// Serves one request, locally or in the cloud (see the module table).
    pub async fn serve(&self, deployment_name: &str, input: Tensor) -> Result<Answer, ServeError> {
        let started = Instant::now();
        let Some(deployment) = self.deployment(deployment_name) else {
            let phase = self
                .phases
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .get(deployment_name)
                .cloned();
            return Err(match phase {
                Some(phase) => ServeError::NotReady(
                    deployment_name.to_string(),
                    format!("{phase:?}").to_lowercase(),
                ),
                None => ServeError::NotFound(deployment_name.to_string()),
            });
        };
        input.validate().map_err(ServeError::BadInput)?;
        if let (Some(variant), false) = (deployment.split.clone(), self.is_pool) {
            let result = self
                .serve_split(&deployment, &variant, input, started)
                .await;
            return self.finish(&deployment, started, result);
        }
        let params = deployment.params();
        let connection = if params.offload {
            self.offload_connection()
        } else {
            None
        };
        let local_service_us = deployment.batcher.per_row_service_us();
        let now_us = self.now_us();
        let remote = connection.as_ref().map(|connection| {
            // Before a measurement, and as a stale one decays: the path's RTT plus the
            // service time as here.
            let fallback_us =
                (connection.rtt().as_micros() as u64).saturating_add(local_service_us);
            RemoteEstimate {
                rtt_us: lock(&deployment.remote).estimate_us(now_us, fallback_us),
                cloud_queue_us: 0,
                cloud_service_us: 0,
            }
        });
        let context = RequestContext {
            queue_ahead: deployment.queued.load(Ordering::Relaxed),
            local_service_us,
            slots: self.n_slots as u32,
            local_queue_capacity: params.max_queue,
            remote,
            deadline_us: u64::from(params.slo_ms) * 1000,
            local_margin_permille: lock(&deployment.local_lateness).margin_permille(),
        };
        let decision = if self.is_pool {
            Route::Local
        } else {
            let route = decide(&context, &self.policy, &mut self.breaker(), now_us);
            // A refusal while the estimate is stale goes to the cloud as a probe, so a
            // slow spell cannot lock the deployment out of offload.
            probe_if_refused(
                route,
                connection.is_some(),
                &mut lock(&deployment.remote),
                &mut self.breaker(),
                now_us,
            )
        };
        let result = match (decision, connection) {
            (Route::Offload { fallback_local }, Some(connection)) => {
                // A failed offload that falls back leaves time for the local run.
                let then_local_us = if fallback_local {
                    context.predicted_local_us()
                } else {
                    0
                };
                // When that leaves less than a round trip, the offload (predicted in
                // time) may use all the time left, and a fallback answers late.
                let wait = self
                    .offload_wait(params.slo_ms, started, then_local_us, &connection)
                    .or_else(|| self.offload_wait(params.slo_ms, started, 0, &connection))
                    .unwrap_or_else(|| connection.rtt());
                match self
                    .offload(
                        &connection,
                        &deployment,
                        input.clone(),
                        InferStage::Whole,
                        wait,
                    )
                    .await
                {
                    Ok(answer) => Ok(answer),
                    Err(error) => {
                        tracing::debug!(deployment = %deployment.name, %error, "offload failed");
                        if !fallback_local {
                            let retry_after_ms =
                                (local_service_us / 1000).max(1).max(self.shed_ms());
                            return Err(self.reject(&deployment, retry_after_ms));
                        }
                        self.run_local(&deployment, input).await
                    }
                }
            }
            (Route::Reject { retry_after_ms }, _) => {
                return Err(self.reject(&deployment, retry_after_ms.max(self.shed_ms())))
            }
            (Route::Offload { .. }, None) | (Route::Local, _) => {
                let mut local = self.run_local(&deployment, input.clone()).await;
                if local.is_ok() && !self.is_pool {
                    lock(&deployment.local_lateness).observe(
                        context.predicted_local_us(),
                        started.elapsed().as_micros() as u64,
                        context.deadline_us,
                    );
                }
                // The local queue refused it (full, or predicted past what it admits
                // now): overflow goes to the cloud when it can be answered in time there
                // (or as a probe of a stale estimate) and the breaker allows, before a 429.
                if let (Err(ServeError::Overloaded { .. }), false, true) =
                    (&local, self.is_pool, params.offload)
                {
                    if let Some(connection) = self.offload_connection() {
                        let now_us = self.now_us();
                        let fallback_us =
                            (connection.rtt().as_micros() as u64).saturating_add(local_service_us);
                        let go = {
                            let mut estimator = lock(&deployment.remote);
                            let predicted_us = estimator.estimate_us(now_us, fallback_us);
                            offload_overflow(
                                predicted_us,
                                u64::from(params.slo_ms) * 1000,
                                &mut estimator,
                                &mut self.breaker(),
                                now_us,
                            )
                        };
                        let wait = self.offload_wait(params.slo_ms, started, 0, &connection);
                        if let (true, Some(wait)) = (go, wait) {
                            match self
                                .offload(
                                    &connection,
                                    &deployment,
                                    input.clone(),
                                    InferStage::Whole,
                                    wait,
                                )
                                .await
                            {
                                Ok(answer) => local = Ok(answer),
                                Err(error) => {
                                    tracing::debug!(deployment = %deployment.name, %error, "overflow offload failed; refusing");
                                    if let Err(ServeError::Overloaded { retry_after_ms, .. }) =
                                        &mut local
                                    {
                                        *retry_after_ms = (*retry_after_ms).max(self.shed_ms());
                                    }
                                }
                            }
                        }
                    }
                }
                match (&local, params.hard_example_threshold, self.connection()) {
                    (Ok(answer), Some(threshold), Some(connection)) if !self.is_pool => self
                        .hard_example(&deployment, &connection, input, answer, threshold, started)
                        .await
                        .map_or(local, Ok),
                    _ => local,
                }
            }
        };
        self.finish(&deployment, started, result)
    }

    /// Counts and times one request's outcome.
    fn finish(
        &self,
        deployment: &Arc<Deployment>,
        started: Instant,
        result: Result<Answer, ServeError>,
    ) -> Result<Answer, ServeError> {
        let mut answer = result.inspect_err(|_| {
            deployment.failed.fetch_add(1, Ordering::Relaxed);
        })?;
        answer.latency = started.elapsed();
        let latency_us = answer.latency.as_micros() as u64;
        deployment
            .latencies
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .record(latency_us);
        let location = match answer.location {
            Location::Local => "local",
            Location::Cloud => "cloud",
            Location::Split => "split",
        };
        self.count(&deployment.name, location);
        self.metrics
            .histogram(
                "nephele_agent_request_latency_seconds",
                "End-to-end latency of inference requests at the agent.",
                &[("deployment", &deployment.name), ("where", location)],
                nephele_telemetry::LATENCY_BUCKETS,
            )
            .observe(answer.latency.as_secs_f64());
        Ok(answer)
    }

    pub(crate) fn now_us(&self) -> u64 {
        self.origin.elapsed().as_micros() as u64
    }

    pub(crate) fn breaker(&self) -> std::sync::MutexGuard<'_, CircuitBreaker> {
        self.breaker.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The latest answer local serving may give for a deployment with this SLO: the
    /// SLO plus the offload policy's lateness tolerance (what [`decide`] accepts
    /// locally when nothing better is at hand).
    pub fn local_bound_us(&self, slo_ms: u32) -> u64 {
        self.policy
            .latest_answer_us(u64::from(slo_ms).saturating_mul(1000))
    }

    /// How long an offload of a request that arrived at `started` may wait for its
    /// answer: what is left of [`Self::local_bound_us`], less `then_local_us` for a
    /// local run that would follow a failure. `None` when that is less than a round
    /// trip on `connection`.
    pub(crate) fn offload_wait(
        &self,
        slo_ms: u32,
        started: Instant,
        then_local_us: u64,
        connection: &quinn::Connection,
    ) -> Option<Duration> {
        offload_wait_us(
            self.local_bound_us(slo_ms),
            started.elapsed().as_micros() as u64,
            then_local_us,
            connection.rtt().as_micros() as u64,
        )
        .map(Duration::from_micros)
    }

    /// The transport heard from the control plane (its acknowledgements of this
    /// agent's packets, or a new session): an open breaker lets its probe go now, so
    /// offload comes back with the path rather than after the breaker's backoff.
    pub fn path_alive(&self) {
        let now_us = self.now_us();
        let mut breaker = self.breaker();
        let before = breaker.state();
        breaker.on_path_alive(now_us);
        if before != breaker.state() {
            tracing::debug!("the path to the control plane answers; the breaker's probe may go");
        }
    }

    /// State of the breaker on the path to the cloud, for telemetry and tests.
    pub fn breaker_state(&self) -> nephele_infer_policy::offload::BreakerState {
        self.breaker().state()
    }

    /// Joint inference: when the local answer is not confident enough and the breaker
    /// allows, the cloud's answer replaces it. `None` keeps the local answer (confident,
    /// breaker open, or the cloud failed).
    async fn hard_example(
        &self,
        deployment: &Arc<Deployment>,
        connection: &quinn::Connection,
        input: Tensor,
        local: &Answer,
        threshold: f32,
        started: Instant,
    ) -> Option<Answer> {
        let confidence = confidence(&local.output.data);
        // The local answer is in hand: the cloud's is worth waiting for only until the
        // request's deadline, and not at all when no round trip fits before it (the
        // breaker is not asked then, so its probe is not spent).
        let wait = self.offload_wait(deployment.params().slo_ms, started, 0, connection)?;
        let now_us = self.now_us();
        let verdict = after_local_answer(
            confidence,
            f64::from(threshold),
            &mut self.breaker(),
            now_us,
        );
        if verdict != AfterLocal::HardExampleToCloud {
            return None;
        }
        self.metrics
            .counter(
                "nephele_agent_hard_examples_total",
                "Local answers below the confidence threshold, re-asked in the cloud.",
                &[("deployment", &deployment.name)],
            )
            .inc();
        match self
            .offload(connection, deployment, input, InferStage::Whole, wait)
            .await
        {
            Ok(mut answer) => {
                // It was computed locally too; count it once, as offloaded.
                deployment.served_local.fetch_sub(1, Ordering::Relaxed);
                answer.hard_example = true;
                Some(answer)
            }
            Err(error) => {
                tracing::debug!(deployment = %deployment.name, %error, "hard example not answered by the cloud; keeping the local answer");
                None
            }
        }
    }

    fn reject(&self, deployment: &Deployment, retry_after_ms: u64) -> ServeError {
        deployment.failed.fetch_add(1, Ordering::Relaxed);
        self.count(&deployment.name, "rejected");
        ServeError::Overloaded {
            deployment: deployment.name.clone(),
            retry_after_ms,
        }
    }

    pub(crate) fn count(&self, deployment: &str, outcome: &str) {
        self.metrics
            .counter(
                "nephele_agent_requests_total",
                "Inference requests by where they were served.",
                &[("deployment", deployment), ("outcome", outcome)],
            )
            .inc();
    }

    async fn run_local(
        &self,
        deployment: &Arc<Deployment>,
        input: Tensor,
    ) -> Result<Answer, ServeError> {
        deployment.queued.fetch_add(1, Ordering::Relaxed);
        self.metrics
            .gauge(
                "nephele_agent_queue_length",
                "Requests queued or running locally.",
                &[("deployment", &deployment.name)],
            )
            .add(1);
        let row_len: i64 = deployment.model.input().shape[1..].iter().product();
        let single_row = input.data.len() as i64 == row_len
            && input.shape.first().is_none_or(|d| {
                *d == 1 || input.shape.len() + 1 == deployment.model.input().shape.len()
            });
        let result = if single_row {
            let max_queue = deployment.params().max_queue;
            deployment
                .batcher
                .submit(input.data)
                .await
                .map_err(|error| match error {
                    BatchError::Full { .. } => ServeError::Overloaded {
                        deployment: deployment.name.clone(),
                        retry_after_ms: (u64::from(max_queue)
                            * deployment.batcher.per_row_service_us()
                            / 1000)
                            .max(1),
                    },
                    BatchError::Late { retry_after_ms, .. } => ServeError::Overloaded {
                        deployment: deployment.name.clone(),
                        retry_after_ms,
                    },
                    BatchError::BadInput(cause) => ServeError::BadInput(cause),
                    BatchError::Failed(cause) => ServeError::Failed(cause),
                })
        } else {
            self.run_unbatched(deployment.model.clone(), input).await
        };
        deployment.queued.fetch_sub(1, Ordering::Relaxed);
        self.metrics
            .gauge(
                "nephele_agent_queue_length",
                "Requests queued or running locally.",
                &[("deployment", &deployment.name)],
            )
            .add(-1);
        let (shape, data) = result?;
        deployment.served_local.fetch_add(1, Ordering::Relaxed);
        Ok(Answer {
            output: Tensor {
                shape: shape.iter().map(|d| *d as u32).collect(),
                data,
            },
            computed_by: self.name.clone(),
            location: Location::Local,
            latency: Duration::ZERO,
            hard_example: false,
        })
    }

    /// A split deployment: the head here (through the batcher, so it batches and is
    /// admitted like any local work), then the tail in the region's pool, or here when
    /// the cloud cannot take it.
    async fn serve_split(
        &self,
        deployment: &Arc<Deployment>,
        variant: &str,
        input: Tensor,
        started: Instant,
    ) -> Result<Answer, ServeError> {
        let head = self.run_local(deployment, input).await?;
        let activation = head.output;
        let params = deployment.params();
        let connection = if params.offload {
            self.connection()
        } else {
            None
        };
        // The remote tail waits until the deadline (the local tail that follows a
        // failure is not counted: its time here is not measured apart from the head's).
        let wait = connection
            .as_ref()
            .and_then(|c| self.offload_wait(params.slo_ms, started, 0, c));
        if let (Some(connection), Some(wait)) = (connection, wait) {
            if self.breaker().allow(self.now_us()) {
                let stage = InferStage::Tail {
                    variant: variant.to_string(),
                };
                match self
                    .offload(&connection, deployment, activation.clone(), stage, wait)
                    .await
                {
                    Ok(mut answer) => {
                        // The head ran here; count the request once, as offloaded.
                        deployment.served_local.fetch_sub(1, Ordering::Relaxed);
                        answer.location = Location::Split;
                        return Ok(answer);
                    }
                    Err(error) => {
                        tracing::debug!(deployment = %deployment.name, %error, "remote tail failed; running it here");
                    }
                }
            }
        }
        let output = self.run_tail(deployment, variant, activation).await?;
        Ok(Answer {
            output,
            computed_by: self.name.clone(),
            location: Location::Local,
            latency: Duration::ZERO,
            hard_example: false,
        })
    }

    /// Runs the tail of split variant `variant` of a deployment on `activation` (the
    /// head's output at the cut): what a pool replica does for a device's split request.
    pub async fn serve_tail(
        &self,
        deployment_name: &str,
        variant: &str,
        activation: Tensor,
    ) -> Result<Answer, ServeError> {
        let started = Instant::now();
        let deployment = self
            .deployment(deployment_name)
            .ok_or_else(|| ServeError::NotFound(deployment_name.to_string()))?;
        activation.validate().map_err(ServeError::BadInput)?;
        let result = self
            .run_tail(&deployment, variant, activation)
            .await
            .map(|output| {
                deployment.served_local.fetch_add(1, Ordering::Relaxed);
                Answer {
                    output,
                    computed_by: self.name.clone(),
                    location: Location::Local,
                    latency: Duration::ZERO,
                    hard_example: false,
                }
            });
        self.finish(&deployment, started, result)
    }

    async fn run_tail(
        &self,
        deployment: &Arc<Deployment>,
        variant: &str,
        activation: Tensor,
    ) -> Result<Tensor, ServeError> {
        let tail = match (deployment.tail(variant), &deployment.tail_loader) {
            (Some(tail), _) => tail,
            (None, Some(loader)) => {
                let _loading = deployment.tail_loading.lock().await;
                match deployment.tail(variant) {
                    Some(tail) => tail,
                    None => {
                        let (tail, bytes) = loader(variant.to_string())
                            .await
                            .map_err(ServeError::Failed)?;
                        tracing::info!(deployment = %deployment.name, %variant, bytes, "split tail loaded on first request");
                        deployment
                            .tails
                            .write()
                            .unwrap_or_else(|p| p.into_inner())
                            .insert(variant.to_string(), (tail.clone(), bytes));
                        tail
                    }
                }
            }
            (None, None) => {
                return Err(ServeError::BadInput(format!(
                    "deployment {} has no tail for variant {variant} here",
                    deployment.name
                )))
            }
        };
        let (shape, data) = self.run_unbatched(tail, activation).await?;
        Ok(Tensor {
            shape: shape.iter().map(|d| *d as u32).collect(),
            data,
        })
    }

    /// Runs `model` on `input` as it is (no batcher), on a blocking thread while
    /// holding an inference slot.
    async fn run_unbatched(
        &self,
        model: nephele_runtime::Model,
        input: Tensor,
    ) -> Result<(Vec<usize>, Vec<f32>), ServeError> {
        let _permit = self
            .slots
            .acquire()
            .await
            .map_err(|e| ServeError::Failed(e.to_string()))?;
        let shape: Vec<usize> = input.shape.iter().map(|d| *d as usize).collect();
        tokio::task::spawn_blocking(move || model.infer(&shape, &input.data))
            .await
            .map_err(|e| ServeError::Failed(e.to_string()))?
            .map_err(|e| match e {
                nephele_runtime::RuntimeError::BadInput { cause, .. } => {
                    ServeError::BadInput(cause)
                }
                other => ServeError::Failed(other.to_string()),
            })
    }

    /// Sends one request to the cloud; the outcome feeds the circuit breaker and the
    /// round-trip estimate.
    async fn offload(
        &self,
        connection: &quinn::Connection,
        deployment: &Arc<Deployment>,
        input: Tensor,
        stage: InferStage,
        wait: Duration,
    ) -> Result<Answer, String> {
        let target = OffloadTarget {
            name: &deployment.name,
            remote: &deployment.remote,
            offloaded: &deployment.served_offloaded,
            wait,
        };
        let (output, computed_by) = self
            .offload_payload(connection, target, Payload::Tensor(input), stage)
            .await?;
        match output {
            Payload::Tensor(output) => Ok(Answer {
                output,
                computed_by,
                location: Location::Cloud,
                latency: Duration::ZERO,
                hard_example: false,
            }),
            Payload::Typed(_) => Err("the replica answered with named tensors".into()),
        }
    }

    /// Sends one request (a single tensor or named typed tensors) to the cloud: the
    /// outcome feeds the circuit breaker, the round-trip estimate and the metrics. The
    /// answer and the agent that computed it.
    pub(crate) async fn offload_payload(
        &self,
        connection: &quinn::Connection,
        target: OffloadTarget<'_>,
        input: Payload,
        stage: InferStage,
    ) -> Result<(Payload, String), String> {
        // Too large for one frame: a property of the request, not of the cloud's
        // health, so the breaker does not hear of it (the caller serves it here).
        let bytes = input.data_bytes();
        if bytes > nephele_proto::MAX_TENSOR_BYTES {
            lock(target.remote).on_no_sample();
            return Err(format!(
                "{bytes} bytes is over the {} a request may carry",
                nephele_proto::MAX_TENSOR_BYTES
            ));
        }
        let started = Instant::now();
        let result = self
            .offload_exchange(connection, &target, input, stage)
            .await;
        let now_us = self.now_us();
        match &result {
            Ok(_) => {
                self.breaker().on_success(now_us);
                let sample = (started.elapsed().as_micros() as u64).max(1);
                lock(target.remote).on_sample(now_us, sample);
                target.offloaded.fetch_add(1, Ordering::Relaxed);
            }
            Err(OffloadError::Shed {
                retry_after_ms,
                message,
            }) => {
                lock(target.remote).on_no_sample();
                // The region is healthy and said so: not a failure of the path, so
                // the breaker is left alone; requests stay local until Retry-After.
                let until = now_us.saturating_add(retry_after_ms.saturating_mul(1000));
                self.shed_until_us.fetch_max(until, Ordering::Relaxed);
                tracing::debug!(deployment = %target.name, %message, retry_after_ms, "the region sheds offloads");
                self.metrics
                    .counter(
                        "nephele_agent_offloads_shed_total",
                        "Offloads the region refused with a Retry-After (admission control); served locally or refused.",
                        &[("deployment", target.name)],
                    )
                    .inc();
            }
            Err(OffloadError::BadInput(message)) => {
                lock(target.remote).on_no_sample();
                tracing::debug!(deployment = %target.name, %message, "the pool could not take an input");
            }
            Err(OffloadError::TimedOut(after)) => {
                // Censored: the round trip took at least this long.
                lock(target.remote).on_sample(now_us, (after.as_micros() as u64).max(1));
                self.breaker().on_failure(now_us);
                self.metrics
                    .counter(
                        "nephele_agent_offload_timeouts_total",
                        "Offloads with no answer within the time their request had left (then served locally or refused).",
                        &[("deployment", target.name)],
                    )
                    .inc();
            }
            Err(OffloadError::Failed(_)) => {
                lock(target.remote).on_no_sample();
                self.breaker().on_failure(now_us);
                self.metrics
                    .counter(
                        "nephele_agent_offload_failures_total",
                        "Offloads that failed (then served locally or refused).",
                        &[("deployment", target.name)],
                    )
                    .inc();
            }
        }
        result.map_err(|e| e.to_string())
    }

    async fn offload_exchange(
        &self,
        connection: &quinn::Connection,
        target: &OffloadTarget<'_>,
        input: Payload,
        stage: InferStage,
    ) -> Result<(Payload, String), OffloadError> {
        let request_id = self.next_request_id.fetch_add(1, Ordering::Relaxed);
        // A child of the request being served (its HTTP span), and the parent of the
        // region's span: its context travels in the frame.
        let mut span = self.tracer.span(
            format!("offload {}", target.name),
            nephele_otel::SpanKind::Client,
            nephele_otel::current::current(),
            false,
        );
        span.set("nephele.deployment", target.name);
        span.set("nephele.request_id", request_id);
        if let InferStage::Tail { variant } = &stage {
            span.set("nephele.variant", variant);
        }
        let trace = span.context().map(|c| c.to_wire());
        let result = self
            .offload_frame(connection, target, request_id, input, stage, trace)
            .await;
        match &result {
            Ok((_, computed_by)) => span.set("nephele.computed_by", computed_by),
            Err(error) => span.fail(error),
        }
        result
    }

    /// One offload request on its own stream, and its answer.
    #[allow(clippy::too_many_arguments)]
    async fn offload_frame(
        &self,
        connection: &quinn::Connection,
        target: &OffloadTarget<'_>,
        request_id: u64,
        input: Payload,
        stage: InferStage,
        trace: Option<nephele_proto::TraceParent>,
    ) -> Result<(Payload, String), OffloadError> {
        let exchange = async {
            let (mut send, mut recv) = connection.open_bi().await.map_err(|e| e.to_string())?;
            write_frame(
                &mut send,
                &StreamRequest {
                    protocol_version: PROTOCOL_VERSION,
                    body: RequestBody::Infer(InferRequest {
                        deployment: target.name.to_string(),
                        request_id,
                        input,
                        stage,
                        trace,
                    }),
                },
            )
            .await
            .map_err(|e| e.to_string())?;
            let _ = send.finish();
            read_frame::<StreamResponse>(&mut recv, MAX_FRAME_BYTES)
                .await
                .map_err(|e| e.to_string())?
                .ok_or_else(|| "the control plane closed the stream".to_string())
        };
        let response = tokio::time::timeout(target.wait, exchange)
            .await
            .map_err(|_| OffloadError::TimedOut(target.wait))?
            .map_err(OffloadError::Failed)?;
        match response {
            StreamResponse::Inferred(inferred) => {
                inferred.output.validate().map_err(|e| {
                    OffloadError::Failed(format!("the replica's answer is malformed: {e}"))
                })?;
                Ok((inferred.output, inferred.computed_by))
            }
            StreamResponse::Error(error) => match (error.code, error.retry_after_ms) {
                (ErrorCode::Overloaded, Some(retry_after_ms)) => Err(OffloadError::Shed {
                    retry_after_ms: u64::from(retry_after_ms),
                    message: error.message,
                }),
                (ErrorCode::BadRequest, _) => Err(OffloadError::BadInput(error.message)),
                _ => Err(OffloadError::Failed(error.to_string())),
            },
            StreamResponse::Chunk { .. }
            | StreamResponse::Logs { .. }
            | StreamResponse::Certificate { .. } => Err(OffloadError::Failed(
                "unexpected answer to an inference request".into(),
            )),
        }
    }

    /// Telemetry for every deployment this agent was asked to run.
    pub fn telemetry(&self) -> Vec<DeploymentTelemetry> {
        let mut rows: Vec<DeploymentTelemetry> = self
            .deployments
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .values()
            .map(|d| d.telemetry())
            .collect();
        rows.extend(
            self.graphs
                .read()
                .unwrap_or_else(|p| p.into_inner())
                .values()
                .map(|g| g.telemetry()),
        );
        for (name, phase) in self.phases.lock().unwrap_or_else(|p| p.into_inner()).iter() {
            if !rows.iter().any(|r| &r.deployment == name) {
                rows.push(DeploymentTelemetry::idle(name, phase.clone()));
            }
        }
        rows.sort_by(|a, b| a.deployment.cmp(&b.deployment));
        rows
    }
}

pub(crate) fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn confidence_is_the_top_softmax_probability() {
        assert!((confidence(&[0.0, 0.0]) - 0.5).abs() < 1e-12);
        assert!(confidence(&[10.0, 0.0, 0.0]) > 0.99);
        assert!((confidence(&[1.0; 10]) - 0.1).abs() < 1e-12);
        // Huge logits do not overflow; odd outputs are never "hard".
        assert!((confidence(&[1e30, 0.0]) - 1.0).abs() < 1e-12);
        assert_eq!(confidence(&[]), 1.0);
        assert_eq!(confidence(&[f32::NAN, 1.0]), 1.0);
        assert_eq!(confidence(&[f32::INFINITY, 1.0]), 1.0);
    }
}
