//! Serving one request: local inference or offload, decided per request.
//!
//! | condition (checked in order)                          | action                          |
//! |-------------------------------------------------------|---------------------------------|
//! | agent is a pool replica                               | local                           |
//! | local queue < max_queue and predicted local ≤ SLO     | local                           |
//! | offload allowed and the control plane is connected    | offload; on failure, local      |
//! | local queue < max_queue                               | local (late, but answered)      |
//! | otherwise                                             | refuse with 429 and Retry-After |
//!
//! Predicted local latency = (requests queued or running + 1) × EWMA service time ÷
//! inference slots. No request is dropped silently: each one gets an answer or an error.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use nephele_net::{read_frame, write_frame};
use nephele_proto::{
    Assignment, DeploymentPhase, DeploymentTelemetry, InferRequest, RequestBody, StreamRequest,
    StreamResponse, Tensor, MAX_FRAME_BYTES, PROTOCOL_VERSION,
};
use nephele_telemetry::{LatencyWindow, Registry};
use tokio::sync::Semaphore;

/// What the agent knows about its own load when a request arrives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Load {
    /// Requests queued or running locally for this deployment.
    pub queued: u32,
    /// EWMA of the measured local service time (0 before the first request).
    pub service_us: u64,
    /// Inference slots of this agent.
    pub slots: usize,
}

/// Where one request goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Route {
    Local,
    /// Try the cloud; if that fails, serve locally (`then_local`) or refuse.
    Offload {
        then_local: bool,
        retry_after_ms: u64,
    },
    Reject {
        retry_after_ms: u64,
    },
}

/// The decision table of the module docs, as a pure function.
pub fn route(is_pool: bool, load: Load, slo_ms: u32, max_queue: u32, can_offload: bool) -> Route {
    let slots = load.slots.max(1) as u64;
    let predicted_us = u64::from(load.queued)
        .saturating_add(1)
        .saturating_mul(load.service_us)
        / slots;
    let queue_full = load.queued >= max_queue;
    let late = predicted_us > u64::from(slo_ms) * 1000;
    let retry_after_ms =
        (u64::from(load.queued).saturating_mul(load.service_us) / slots / 1000).max(1);
    if is_pool || (!queue_full && !late) {
        Route::Local
    } else if can_offload {
        Route::Offload {
            then_local: !queue_full,
            retry_after_ms,
        }
    } else if queue_full {
        Route::Reject { retry_after_ms }
    } else {
        Route::Local
    }
}

/// A deployment loaded on this agent.
pub struct Deployment {
    pub name: String,
    pub model: nephele_runtime::Model,
    pub model_digest: [u8; 32],
    pub variant: String,
    pub params: RwLock<Assignment>,
    queued: AtomicU32,
    ewma_service_us: AtomicU64,
    served_local: AtomicU64,
    served_offloaded: AtomicU64,
    failed: AtomicU64,
    latencies: Mutex<LatencyWindow>,
}

impl Deployment {
    pub fn new(
        assignment: Assignment,
        model: nephele_runtime::Model,
        model_digest: [u8; 32],
        variant: String,
    ) -> Self {
        Deployment {
            name: assignment.deployment.clone(),
            model,
            model_digest,
            variant,
            params: RwLock::new(assignment),
            queued: AtomicU32::new(0),
            ewma_service_us: AtomicU64::new(0),
            served_local: AtomicU64::new(0),
            served_offloaded: AtomicU64::new(0),
            failed: AtomicU64::new(0),
            latencies: Mutex::new(LatencyWindow::new(4096)),
        }
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
        }
    }
}

/// Where a request was computed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Location {
    Local,
    Cloud,
}

#[derive(Debug)]
pub struct Answer {
    pub output: Tensor,
    pub computed_by: String,
    pub location: Location,
    pub latency: Duration,
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
}

/// Everything the serving path needs, shared by the HTTP endpoint, the session (pool
/// role) and the reconciler.
pub struct Server {
    pub name: String,
    pub is_pool: bool,
    pub deployments: RwLock<HashMap<String, Arc<Deployment>>>,
    /// Phase of deployments that are not (yet) serving.
    pub phases: Mutex<HashMap<String, DeploymentPhase>>,
    pub connection: Mutex<Option<quinn::Connection>>,
    pub slots: Arc<Semaphore>,
    pub n_slots: usize,
    pub metrics: Registry,
    next_request_id: AtomicU64,
}

impl Server {
    pub fn new(name: String, is_pool: bool, n_slots: usize, metrics: Registry) -> Self {
        Server {
            name,
            is_pool,
            deployments: RwLock::new(HashMap::new()),
            phases: Mutex::new(HashMap::new()),
            connection: Mutex::new(None),
            slots: Arc::new(Semaphore::new(n_slots.max(1))),
            n_slots: n_slots.max(1),
            metrics,
            next_request_id: AtomicU64::new(1),
        }
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
        let params = deployment.params();
        let connection = if params.offload {
            self.connection()
        } else {
            None
        };
        let load = Load {
            queued: deployment.queued.load(Ordering::Relaxed),
            service_us: deployment.ewma_service_us.load(Ordering::Relaxed),
            slots: self.n_slots,
        };
        let decision = route(
            self.is_pool,
            load,
            params.slo_ms,
            params.max_queue,
            connection.is_some(),
        );
        let result = match (decision, connection) {
            (
                Route::Offload {
                    then_local,
                    retry_after_ms,
                },
                Some(connection),
            ) => match self.offload(&connection, &deployment, input.clone()).await {
                Ok(answer) => Ok(answer),
                Err(error) => {
                    self.metrics
                        .counter(
                            "nephele_agent_offload_failures_total",
                            "Offloads that failed (then served locally or refused).",
                            &[("deployment", &deployment.name)],
                        )
                        .inc();
                    tracing::debug!(deployment = %deployment.name, %error, "offload failed");
                    if !then_local {
                        return Err(self.reject(&deployment, retry_after_ms));
                    }
                    self.run_local(&deployment, input).await
                }
            },
            (Route::Reject { retry_after_ms }, _) => {
                return Err(self.reject(&deployment, retry_after_ms))
            }
            _ => self.run_local(&deployment, input).await,
        };
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

    fn reject(&self, deployment: &Deployment, retry_after_ms: u64) -> ServeError {
        deployment.failed.fetch_add(1, Ordering::Relaxed);
        self.count(&deployment.name, "rejected");
        ServeError::Overloaded {
            deployment: deployment.name.clone(),
            retry_after_ms,
        }
    }

    fn count(&self, deployment: &str, outcome: &str) {
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
        let result = async {
            let _permit = self
                .slots
                .acquire()
                .await
                .map_err(|e| ServeError::Failed(e.to_string()))?;
            let model = deployment.model.clone();
            let compute_started = Instant::now();
            let shape: Vec<usize> = input.shape.iter().map(|d| *d as usize).collect();
            let output = tokio::task::spawn_blocking(move || model.infer(&shape, &input.data))
                .await
                .map_err(|e| ServeError::Failed(e.to_string()))?
                .map_err(|e| match e {
                    nephele_runtime::RuntimeError::BadInput { cause, .. } => {
                        ServeError::BadInput(cause)
                    }
                    other => ServeError::Failed(other.to_string()),
                })?;
            let sample = compute_started.elapsed().as_micros() as u64;
            let previous = deployment.ewma_service_us.load(Ordering::Relaxed);
            let next = if previous == 0 {
                sample
            } else {
                (previous * 7 + sample) / 8
            };
            deployment
                .ewma_service_us
                .store(next.max(1), Ordering::Relaxed);
            Ok(output)
        }
        .await;
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
        })
    }

    async fn offload(
        &self,
        connection: &quinn::Connection,
        deployment: &Arc<Deployment>,
        input: Tensor,
    ) -> Result<Answer, String> {
        let request_id = self.next_request_id.fetch_add(1, Ordering::Relaxed);
        let slo = Duration::from_millis(u64::from(deployment.params().slo_ms));
        let exchange = async {
            let (mut send, mut recv) = connection.open_bi().await.map_err(|e| e.to_string())?;
            write_frame(
                &mut send,
                &StreamRequest {
                    protocol_version: PROTOCOL_VERSION,
                    body: RequestBody::Infer(InferRequest {
                        deployment: deployment.name.clone(),
                        request_id,
                        input,
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
        let response = tokio::time::timeout((slo * 20).max(Duration::from_secs(2)), exchange)
            .await
            .map_err(|_| "offload timed out".to_string())??;
        match response {
            StreamResponse::Inferred(inferred) => {
                deployment.served_offloaded.fetch_add(1, Ordering::Relaxed);
                Ok(Answer {
                    output: inferred.output,
                    computed_by: inferred.computed_by,
                    location: Location::Cloud,
                    latency: Duration::ZERO,
                })
            }
            StreamResponse::Error(error) => Err(error.to_string()),
            StreamResponse::Chunk { .. } => {
                Err("unexpected chunk in answer to an inference request".into())
            }
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
        for (name, phase) in self.phases.lock().unwrap_or_else(|p| p.into_inner()).iter() {
            if !rows.iter().any(|r| &r.deployment == name) {
                rows.push(DeploymentTelemetry::idle(name, phase.clone()));
            }
        }
        rows.sort_by(|a, b| a.deployment.cmp(&b.deployment));
        rows
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(is_pool: bool, queued: u32, service_us: u64, can_offload: bool, expected: Route) {
        let load = Load {
            queued,
            service_us,
            slots: 2,
        };
        // SLO 1 ms, queue bound 8.
        assert_eq!(
            route(is_pool, load, 1, 8, can_offload),
            expected,
            "pool={is_pool} queued={queued} service={service_us}us offload={can_offload}"
        );
    }

    #[test]
    fn routing_follows_the_decision_table() {
        use Route::*;
        // Idle, fast: local.
        check(false, 0, 100, true, Local);
        // Before any measurement the predicted time is 0: local.
        check(false, 3, 0, true, Local);
        // Predicted (5+1) * 400 / 2 = 1200 us > 1 ms: offload, local if that fails.
        check(
            false,
            5,
            400,
            true,
            Offload {
                then_local: true,
                retry_after_ms: 1,
            },
        );
        // Late but offload impossible: still answered locally.
        check(false, 5, 400, false, Local);
        // Queue full: offload, else refuse with a hint of 8 * 1000 / 2 / 1000 = 4 ms.
        check(
            false,
            8,
            1000,
            true,
            Offload {
                then_local: false,
                retry_after_ms: 4,
            },
        );
        check(false, 8, 1000, false, Reject { retry_after_ms: 4 });
        // Pool replicas never offload.
        check(true, 100, 10_000, true, Local);
    }

    #[test]
    fn huge_numbers_do_not_overflow() {
        let load = Load {
            queued: u32::MAX,
            service_us: u64::MAX,
            slots: 0,
        };
        assert!(matches!(
            route(false, load, u32::MAX, u32::MAX, false),
            Route::Reject { .. }
        ));
    }
}
