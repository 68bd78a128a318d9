//! Serving models with several typed inputs and outputs (`nephele_runtime::graph_model`,
//! manifest format `onnx-graph`): one request at a time per inference slot, no batcher
//! (no batch axis is assumed) and no offload yet; requests and answers are named typed
//! tensors (`{"inputs": {"ids": {"dtype": "i64", "shape": [1, 4], "data": [...]}}}`).
//!
//! A stateful model (pushed with `--state INPUT=OUTPUT`) keeps its recurrent state per
//! client session here ([`crate::sessions`]): a request with `"session": ID` may leave
//! the state inputs out, and gets the state its previous request returned (zeros on the
//! first).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use nephele_proto::{DeploymentPhase, DeploymentTelemetry};
use nephele_runtime::graph_model::{GraphModel, NamedTensor};
use nephele_telemetry::LatencyWindow;

use crate::serving::{ServeError, Server};
use crate::sessions::{SessionError, SessionStats, SessionStore};

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

/// A deployment of a graph model on this agent.
pub struct GraphDeployment {
    pub name: String,
    pub model: GraphModel,
    pub model_digest: [u8; 32],
    pub variant: String,
    /// (input, output) pairs of recurrent state.
    pub state: Vec<(String, String)>,
    sessions: Mutex<SessionStore>,
    served: AtomicU64,
    failed: AtomicU64,
    latencies: Mutex<LatencyWindow>,
}

impl GraphDeployment {
    pub fn new(
        name: String,
        model: GraphModel,
        model_digest: [u8; 32],
        variant: String,
        state: Vec<(String, String)>,
    ) -> Self {
        GraphDeployment {
            name,
            model,
            model_digest,
            variant,
            state,
            sessions: Mutex::new(SessionStore::new(
                crate::sessions::DEFAULT_IDLE,
                crate::sessions::DEFAULT_MAX_BYTES,
            )),
            served: AtomicU64::new(0),
            failed: AtomicU64::new(0),
            latencies: Mutex::new(LatencyWindow::new(4096)),
        }
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
            served_offloaded: 0,
            failed: self.failed.load(Ordering::Relaxed),
            queue_len: 0,
            p50_us: latencies.quantile(0.5),
            p99_us: latencies.quantile(0.99),
            service_us: latencies.quantile(0.5),
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

    /// Runs one request of named typed tensors on graph deployment `name`, on a
    /// blocking thread while holding an inference slot; checked first, so a bad request
    /// is a `BadInput` that names the input and what is wrong.
    pub async fn serve_graph(
        &self,
        name: &str,
        mut request: HashMap<String, NamedTensor>,
        session: Option<SessionRef>,
    ) -> Result<
        (
            HashMap<String, NamedTensor>,
            Duration,
            Option<SessionOutcome>,
        ),
        ServeError,
    > {
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
        let give_back = |checkout: Option<(SessionRef, crate::sessions::Checkout, Vec<String>)>| {
            if let Some((session, taken, _)) = checkout {
                deployment
                    .sessions
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .release(&session.id, taken.state, taken.step);
            }
        };
        if let Err(why) = deployment.model.check(&request) {
            give_back(checkout);
            return Err(ServeError::BadInput(why));
        }
        let permit = self.slots.acquire().await;
        let _permit = match permit {
            Ok(permit) => permit,
            Err(e) => {
                give_back(checkout);
                return Err(ServeError::Failed(e.to_string()));
            }
        };
        let model = deployment.model.clone();
        let result = tokio::task::spawn_blocking(move || model.run(&request))
            .await
            .map_err(|e| ServeError::Failed(e.to_string()))
            .and_then(|r| r.map_err(|e| ServeError::Failed(e.to_string())));
        let elapsed = started.elapsed();
        let outcome = match (&result, checkout) {
            (Ok(outputs), Some((session, taken, from_session))) => {
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
            (Err(_), checkout) => {
                give_back(checkout);
                None
            }
            (Ok(_), None) => None,
        };
        match &result {
            Ok(_) => {
                deployment.served.fetch_add(1, Ordering::Relaxed);
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
        result.map(|outputs| (outputs, elapsed, outcome))
    }
}
