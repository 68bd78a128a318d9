//! Serving models with several typed inputs and outputs (`nephele_runtime::graph_model`,
//! manifest format `onnx-graph`); requests and answers are named typed tensors
//! (`{"inputs": {"ids": {"dtype": "i64", "shape": [1, 4], "data": [...]}}}`).
//!
//! A model with a batch axis (found at load, [`GraphModel::batch_axis`]) batches
//! requests while the inference slots are busy, as Triton's dynamic batcher does with no
//! queue delay: a request that finds a slot free runs at once; one that waits is taken,
//! when a slot frees, together with the requests waiting behind it that share its shape
//! past the batch axis (up to [`MAX_BATCH_ROWS`] rows, or the axis's bound from push),
//! in arrival order, and each gets its own rows back. So batching adds no wait of its
//! own, and under load the slots run fuller batches. A batch whose run fails is run
//! again one request at a time, so one bad request fails alone. Any other model runs
//! one request per slot.
//!
//! Each request is routed by the same policy as single-tensor deployments
//! ([`nephele_infer_policy::offload::decide`], with the same circuit breaker, round-trip
//! estimate and probes): local while the local queue (the deployment's `max_queue`,
//! waiting or running) has room and the prediction meets the SLO; else, with
//! offload on, to the region's replicas as named typed tensors on the wire
//! ([`crate::typed_wire`]); else refused with 429 and a Retry-After.
//!
//! A stateful model (pushed with `--state INPUT=OUTPUT`) keeps its recurrent state per
//! client session here ([`crate::sessions`]): a request with `"session": ID` may leave
//! the state inputs out, and gets the state its previous request returned (zeros on the
//! first). An offloaded step carries the session's state as inputs and its new state
//! comes back as outputs, so the session goes on here whichever side computed a step.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use nephele_infer_policy::offload::{decide, RemoteEstimate, RequestContext, Route};
use nephele_infer_policy::remote::{probe_if_refused, RemoteEstimator};
use nephele_proto::{Assignment, DeploymentPhase, DeploymentTelemetry, InferStage};
use nephele_runtime::graph_model::{GraphModel, NamedTensor};
use nephele_telemetry::LatencyWindow;

use crate::serving::{lock, Location, OffloadTarget, ServeError, Server};
use crate::sessions::{SessionError, SessionStats, SessionStore};

/// The most rows one batch of a typed model holds (fewer if its batch axis is bounded).
pub const MAX_BATCH_ROWS: usize = 32;

/// Named tensors: a request's inputs or an answer's outputs.
type Tensors = HashMap<String, NamedTensor>;

/// A request waiting for an inference slot on a model with a batch axis.
struct Waiting {
    id: u64,
    request: Tensors,
    key: Option<Vec<Vec<usize>>>,
    rows: usize,
    reply: tokio::sync::oneshot::Sender<Result<(Tensors, usize), ServeError>>,
}

/// Batches run and requests in them, for the status endpoint.
#[derive(Debug, Clone, Copy, Default, serde::Serialize)]
pub struct BatchingStats {
    pub batches: u64,
    pub requests: u64,
    pub largest: u64,
}

/// A request's session: its id, and whether this is its last request.
#[derive(Debug, Clone)]
pub struct SessionRef {
    pub id: String,
    pub end: bool,
}

/// What a session request did, for the answer.
#[derive(Debug, Clone, serde::Serialize)]
pub struct SessionOutcome {
    pub id: String,
    /// This request's position in the session (0 for the first).
    pub step: u64,
    /// The state inputs taken from the session (not sent by the client).
    pub state_from_session: Vec<String>,
    pub ended: bool,
}

/// A graph request's answer.
#[derive(Debug)]
pub struct GraphAnswer {
    pub outputs: HashMap<String, NamedTensor>,
    pub latency: Duration,
    pub session: Option<SessionOutcome>,
    pub location: Location,
    pub computed_by: String,
    /// Requests in the batch this one ran in (1: alone; 0: not run here).
    pub batch: usize,
}

/// A deployment of a graph model on this agent.
pub struct GraphDeployment {
    pub name: String,
    pub model: GraphModel,
    pub model_digest: [u8; 32],
    pub variant: String,
    /// (input, output) pairs of recurrent state.
    pub state: Vec<(String, String)>,
    /// SLO, queue bound and offload, as the region last assigned them.
    pub params: RwLock<Assignment>,
    sessions: Mutex<SessionStore>,
    /// Requests waiting for or holding an inference slot here.
    queued: AtomicU32,
    /// Measured time of one local run (EWMA), µs; 0 before the first.
    service_us: AtomicU64,
    remote: Mutex<RemoteEstimator>,
    served: AtomicU64,
    served_offloaded: AtomicU64,
    failed: AtomicU64,
    latencies: Mutex<LatencyWindow>,
    /// Requests waiting for a slot, in arrival order (a model with a batch axis).
    waiting: Mutex<VecDeque<Waiting>>,
    next_waiting: AtomicU64,
    batching: Mutex<BatchingStats>,
}

impl GraphDeployment {
    pub fn new(
        assignment: Assignment,
        model: GraphModel,
        model_digest: [u8; 32],
        variant: String,
        state: Vec<(String, String)>,
    ) -> Self {
        GraphDeployment {
            name: assignment.deployment.clone(),
            params: RwLock::new(assignment),
            model,
            model_digest,
            variant,
            state,
            queued: AtomicU32::new(0),
            service_us: AtomicU64::new(0),
            remote: Mutex::new(RemoteEstimator::default()),
            served_offloaded: AtomicU64::new(0),
            sessions: Mutex::new(SessionStore::new(
                crate::sessions::DEFAULT_IDLE,
                crate::sessions::DEFAULT_MAX_BYTES,
            )),
            served: AtomicU64::new(0),
            failed: AtomicU64::new(0),
            latencies: Mutex::new(LatencyWindow::new(4096)),
            waiting: Mutex::new(VecDeque::new()),
            next_waiting: AtomicU64::new(0),
            batching: Mutex::new(BatchingStats::default()),
        }
    }

    /// Batches run here and the requests in them (a model with a batch axis).
    pub fn batching_stats(&self) -> BatchingStats {
        *lock(&self.batching)
    }

    /// Takes request `id` from the waiting list, with the requests behind it that share
    /// its batch key, in arrival order, up to the row limit; empty if `id` was taken
    /// already (it is in a batch another request runs).
    fn take_batch(&self, id: u64) -> Vec<Waiting> {
        let mut waiting = lock(&self.waiting);
        let Some(at) = waiting.iter().position(|w| w.id == id) else {
            return Vec::new();
        };
        let limit = self
            .model
            .max_batch_rows()
            .map_or(MAX_BATCH_ROWS, |bound| bound.min(MAX_BATCH_ROWS));
        let own = waiting.remove(at).expect("found above");
        let mut rows = own.rows;
        let mut batch = vec![own];
        let mut k = 0;
        while k < waiting.len() && rows < limit {
            let fits = waiting[k].key == batch[0].key && rows + waiting[k].rows <= limit;
            if fits {
                let next = waiting.remove(k).expect("in range");
                rows += next.rows;
                batch.push(next);
            } else {
                k += 1;
            }
        }
        batch
    }

    /// Records one measured local run (an EWMA with weight 1/8; the first sets it).
    pub fn observe_service(&self, elapsed: Duration) {
        let sample = (elapsed.as_micros() as u64).max(1);
        let _ = self
            .service_us
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |old| {
                Some(if old == 0 {
                    sample
                } else {
                    (old * 7 + sample) / 8
                })
            });
    }

    fn params(&self) -> Assignment {
        self.params
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    pub fn session_stats(&self) -> SessionStats {
        self.sessions
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .stats()
    }

    pub fn telemetry(&self) -> DeploymentTelemetry {
        let latencies = self.latencies.lock().unwrap_or_else(|p| p.into_inner());
        DeploymentTelemetry {
            deployment: self.name.clone(),
            phase: DeploymentPhase::Ready,
            variant: self.variant.clone(),
            served_local: self.served.load(Ordering::Relaxed),
            served_offloaded: self.served_offloaded.load(Ordering::Relaxed),
            failed: self.failed.load(Ordering::Relaxed),
            queue_len: self.queued.load(Ordering::Relaxed),
            p50_us: latencies.quantile(0.5),
            p99_us: latencies.quantile(0.99),
            service_us: self.service_us.load(Ordering::Relaxed),
            model_sha256: self.model_digest,
        }
    }
}

impl Server {
    /// The graph deployment `name`, if this agent runs one.
    pub fn graph(&self, name: &str) -> Option<Arc<GraphDeployment>> {
        self.graphs
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .get(name)
            .cloned()
    }

    /// Serves one request of named typed tensors on graph deployment `name`, here (on
    /// a blocking thread, holding an inference slot) or in the cloud, as the module
    /// describes; checked first, so a bad request is a `BadInput` that names the input
    /// and what is wrong.
    pub async fn serve_graph(
        &self,
        name: &str,
        mut request: HashMap<String, NamedTensor>,
        session: Option<SessionRef>,
    ) -> Result<GraphAnswer, ServeError> {
        let started = Instant::now();
        let deployment = match self.graph(name) {
            Some(deployment) => deployment,
            None if self.deployment(name).is_some() => {
                return Err(ServeError::BadInput(format!(
                    "deployment {name} takes one tensor: {{\"shape\": [...], \"data\": [...]}}, not named inputs"
                )))
            }
            None => return Err(ServeError::NotFound(name.to_string())),
        };
        // A session fills in the state inputs the client left out.
        let mut checkout = None;
        if let Some(session) = &session {
            if deployment.state.is_empty() {
                return Err(ServeError::BadInput(format!(
                    "deployment {name}'s model keeps no state, so it takes no session; push a stateful model with --state INPUT=OUTPUT"
                )));
            }
            let taken = deployment
                .sessions
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .checkout(&session.id, Instant::now())
                .map_err(|e| match e {
                    SessionError::Busy => ServeError::Conflict(e.to_string()),
                    SessionError::BadId(_) => ServeError::BadInput(e.to_string()),
                })?;
            let mut from_session = Vec::new();
            for (input, _) in &deployment.state {
                if request.contains_key(input) {
                    continue;
                }
                let value = taken
                    .state
                    .get(input)
                    .cloned()
                    .or_else(|| deployment.model.zeros_for(input));
                if let Some(value) = value {
                    request.insert(input.clone(), value);
                    from_session.push(input.clone());
                }
            }
            checkout = Some((session.clone(), taken, from_session));
        }
        let result = match deployment.model.check(&request) {
            Err(why) => Err(ServeError::BadInput(why)),
            Ok(()) => self.route_graph(&deployment, request, started).await,
        };
        let outcome = match (&result, checkout) {
            (Ok((outputs, _, _, _)), Some((session, taken, from_session))) => {
                let next: HashMap<String, NamedTensor> = deployment
                    .state
                    .iter()
                    .filter_map(|(input, output)| {
                        outputs.get(output).map(|t| (input.clone(), t.clone()))
                    })
                    .collect();
                deployment
                    .sessions
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .store(&session.id, next, session.end, Instant::now());
                Some(SessionOutcome {
                    id: session.id,
                    step: taken.step,
                    state_from_session: from_session,
                    ended: session.end,
                })
            }
            (Err(_), Some((session, taken, _))) => {
                // Not served: the session keeps the state it had.
                deployment
                    .sessions
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .release(&session.id, taken.state, taken.step);
                None
            }
            (_, None) => None,
        };
        let elapsed = started.elapsed();
        match &result {
            Ok(_) => {
                deployment
                    .latencies
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .record(elapsed.as_micros() as u64);
            }
            Err(_) => {
                deployment.failed.fetch_add(1, Ordering::Relaxed);
            }
        }
        result.map(|(outputs, location, computed_by, batch)| GraphAnswer {
            outputs,
            latency: elapsed,
            session: outcome,
            location,
            computed_by,
            batch,
        })
    }

    /// Where a checked request runs, and its outputs.
    async fn route_graph(
        &self,
        deployment: &Arc<GraphDeployment>,
        request: HashMap<String, NamedTensor>,
        started: Instant,
    ) -> Result<(Tensors, Location, String, usize), ServeError> {
        if self.is_pool {
            return self.run_graph_local(deployment, request, false).await;
        }
        let params = deployment.params();
        let connection = if params.offload {
            self.offload_connection()
        } else {
            None
        };
        let local_service_us = deployment.service_us.load(Ordering::Relaxed);
        let now_us = self.now_us();
        let remote = connection.as_ref().map(|connection| {
            let fallback_us =
                (connection.rtt().as_micros() as u64).saturating_add(local_service_us);
            RemoteEstimate {
                rtt_us: lock(&deployment.remote).estimate_us(now_us, fallback_us),
                cloud_queue_us: 0,
                cloud_service_us: 0,
            }
        });
        // The queue bound, as for single-tensor deployments: `max_queue` requests
        // waiting or running here.
        let queued = deployment.queued.load(Ordering::Relaxed);
        let context = RequestContext {
            queue_ahead: queued,
            local_service_us,
            slots: self.n_slots as u32,
            local_queue_capacity: params.max_queue,
            remote,
            deadline_us: u64::from(params.slo_ms) * 1000,
            local_margin_permille: 0,
        };
        let route = decide(&context, &self.policy, &mut self.breaker(), now_us);
        let route = probe_if_refused(
            route,
            connection.is_some(),
            &mut lock(&deployment.remote),
            &mut self.breaker(),
            now_us,
        );
        let refuse = |retry_after_ms: u64| {
            self.count(&deployment.name, "rejected");
            ServeError::Overloaded {
                deployment: deployment.name.clone(),
                retry_after_ms: retry_after_ms.max(self.shed_ms()).max(1),
            }
        };
        match (route, connection) {
            (Route::Offload { fallback_local }, Some(connection)) => {
                let payload =
                    crate::typed_wire::to_payload(&request).map_err(ServeError::BadInput)?;
                // As for single-tensor deployments: until the deadline, leaving time
                // for the local run a failure falls back to when there is.
                let then_local_us = if fallback_local {
                    context.predicted_local_us()
                } else {
                    0
                };
                let wait = self
                    .offload_wait(params.slo_ms, started, then_local_us, &connection)
                    .or_else(|| self.offload_wait(params.slo_ms, started, 0, &connection))
                    .unwrap_or_else(|| connection.rtt());
                let target = OffloadTarget {
                    name: &deployment.name,
                    remote: &deployment.remote,
                    offloaded: &deployment.served_offloaded,
                    wait,
                };
                let offloaded = self
                    .offload_payload(&connection, target, payload, InferStage::Whole)
                    .await
                    .and_then(|(output, computed_by)| {
                        crate::typed_wire::from_payload(&output)
                            .map(|outputs| (outputs, computed_by))
                            .map_err(|e| format!("the replica's answer: {e}"))
                    });
                match offloaded {
                    Ok((outputs, computed_by)) => {
                        self.count(&deployment.name, "cloud");
                        Ok((outputs, Location::Cloud, computed_by, 0))
                    }
                    Err(error) if fallback_local => {
                        tracing::debug!(deployment = %deployment.name, %error, "offload failed; serving here");
                        self.run_graph_local(deployment, request, true).await
                    }
                    Err(error) => {
                        tracing::debug!(deployment = %deployment.name, %error, "offload failed; refusing");
                        Err(refuse((local_service_us / 1000).max(1)))
                    }
                }
            }
            (Route::Reject { retry_after_ms }, _) => Err(refuse(retry_after_ms)),
            (Route::Offload { .. }, None) | (Route::Local, _) => {
                self.run_graph_local(deployment, request, true).await
            }
        }
    }

    /// Runs a request here: waits for an inference slot (counted in the deployment's
    /// queue), then runs the model on a blocking thread. With `bounded` (a device; a
    /// pool takes a fleet's overflow), a request that finds the queue full now (others
    /// came in since the decision) is refused rather than left to wait past its SLO.
    async fn run_graph_local(
        &self,
        deployment: &Arc<GraphDeployment>,
        request: HashMap<String, NamedTensor>,
        bounded: bool,
    ) -> Result<(Tensors, Location, String, usize), ServeError> {
        let params = deployment.params();
        let ahead = deployment.queued.fetch_add(1, Ordering::Relaxed);
        let _queued = QueueSlot(&deployment.queued);
        if bounded && ahead >= params.max_queue {
            self.count(&deployment.name, "rejected");
            let service_ms = deployment.service_us.load(Ordering::Relaxed) / 1000;
            return Err(ServeError::Overloaded {
                deployment: deployment.name.clone(),
                retry_after_ms: service_ms.max(1).max(self.shed_ms()),
            });
        }
        if deployment.model.batch_axis().is_some() {
            let (outputs, batch) = self.run_graph_batched(deployment, request).await?;
            deployment.served.fetch_add(1, Ordering::Relaxed);
            self.count(&deployment.name, "local");
            return Ok((outputs, Location::Local, self.name.clone(), batch));
        }
        let _permit = self
            .slots
            .acquire()
            .await
            .map_err(|e| ServeError::Failed(e.to_string()))?;
        let model = deployment.model.clone();
        let run_started = Instant::now();
        let outputs = tokio::task::spawn_blocking(move || model.run(&request))
            .await
            .map_err(|e| ServeError::Failed(e.to_string()))?
            .map_err(|e| match e {
                // Values the model cannot take (an index past its table): the caller's
                // to fix, a 400.
                nephele_runtime::RuntimeError::BadInput { cause, .. } => {
                    ServeError::BadInput(cause)
                }
                other => ServeError::Failed(other.to_string()),
            })?;
        deployment.observe_service(run_started.elapsed());
        deployment.served.fetch_add(1, Ordering::Relaxed);
        self.count(&deployment.name, "local");
        Ok((outputs, Location::Local, self.name.clone(), 1))
    }

    /// Runs a request on a model with a batch axis, as the module describes: it waits
    /// in line for a slot; whoever gets a slot first runs its own request with those
    /// behind it that fit, and answers them. The request's outputs and its batch's size.
    async fn run_graph_batched(
        &self,
        deployment: &Arc<GraphDeployment>,
        request: Tensors,
    ) -> Result<(Tensors, usize), ServeError> {
        let id = deployment.next_waiting.fetch_add(1, Ordering::Relaxed);
        let (reply, mut answer) = tokio::sync::oneshot::channel();
        lock(&deployment.waiting).push_back(Waiting {
            id,
            key: deployment.model.batch_key(&request),
            rows: deployment.model.rows(&request),
            request,
            reply,
        });
        // A caller that goes away leaves no request behind in the line.
        let _in_line = InLine(deployment, id);
        let permit = tokio::select! {
            biased;
            answered = &mut answer => {
                return answered.unwrap_or_else(|_| Err(ServeError::Failed("the batch it was in was dropped".into())));
            }
            permit = self.slots.acquire() => permit.map_err(|e| ServeError::Failed(e.to_string()))?,
        };
        let batch = deployment.take_batch(id);
        if batch.is_empty() {
            // Taken into a batch another request is running.
            drop(permit);
            return answer.await.unwrap_or_else(|_| {
                Err(ServeError::Failed("the batch it was in was dropped".into()))
            });
        }
        let size = batch.len();
        let model = deployment.model.clone();
        let run_started = Instant::now();
        let (requests, replies): (Vec<Tensors>, Vec<_>) =
            batch.into_iter().map(|w| (w.request, w.reply)).unzip();
        let results = tokio::task::spawn_blocking(move || {
            let refs: Vec<&Tensors> = requests.iter().collect();
            match model.run_batch(&refs) {
                Ok(outputs) => outputs.into_iter().map(Ok).collect::<Vec<_>>(),
                // One bad request must not fail the others: each alone.
                Err(_) if refs.len() > 1 => refs.iter().map(|r| model.run(r)).collect(),
                Err(error) => vec![Err(error)],
            }
        })
        .await
        .map_err(|e| ServeError::Failed(e.to_string()))?;
        drop(permit);
        let elapsed = run_started.elapsed();
        // The service time per request, as the queue prediction counts requests.
        deployment.observe_service(elapsed / size as u32);
        {
            let mut stats = lock(&deployment.batching);
            stats.batches += 1;
            stats.requests += size as u64;
            stats.largest = stats.largest.max(size as u64);
        }
        let mut own = None;
        for (result, reply) in results.into_iter().zip(replies) {
            let result = result.map(|outputs| (outputs, size)).map_err(|e| match e {
                nephele_runtime::RuntimeError::BadInput { cause, .. } => {
                    ServeError::BadInput(cause)
                }
                other => ServeError::Failed(other.to_string()),
            });
            if own.is_none() {
                own = Some(result);
            } else {
                let _ = reply.send(result);
            }
        }
        own.unwrap_or_else(|| Err(ServeError::Failed("the batch ran no request".into())))
    }
}

/// A request's place in a batching line; taken out if its caller goes away first.
struct InLine<'a>(&'a GraphDeployment, u64);

impl Drop for InLine<'_> {
    fn drop(&mut self) {
        lock(&self.0.waiting).retain(|w| w.id != self.1);
    }
}

/// Holds one place in a deployment's queue; gives it back when dropped.
struct QueueSlot<'a>(&'a AtomicU32);

impl Drop for QueueSlot<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}
