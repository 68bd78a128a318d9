//! Serving models with several typed inputs and outputs (`nephele_runtime::graph_model`,
//! manifest format `onnx-graph`): one request at a time per inference slot, no batcher
//! (no batch axis is assumed) and no offload yet; requests and answers are named typed
//! tensors (`{"inputs": {"ids": {"dtype": "i64", "shape": [1, 4], "data": [...]}}}`).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use nephele_proto::{DeploymentPhase, DeploymentTelemetry};
use nephele_runtime::graph_model::{GraphModel, NamedTensor};
use nephele_telemetry::LatencyWindow;

use crate::serving::{ServeError, Server};

/// A deployment of a graph model on this agent.
pub struct GraphDeployment {
    pub name: String,
    pub model: GraphModel,
    pub model_digest: [u8; 32],
    pub variant: String,
    served: AtomicU64,
    failed: AtomicU64,
    latencies: Mutex<LatencyWindow>,
}

impl GraphDeployment {
    pub fn new(name: String, model: GraphModel, model_digest: [u8; 32], variant: String) -> Self {
        GraphDeployment {
            name,
            model,
            model_digest,
            variant,
            served: AtomicU64::new(0),
            failed: AtomicU64::new(0),
            latencies: Mutex::new(LatencyWindow::new(4096)),
        }
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
        request: HashMap<String, NamedTensor>,
    ) -> Result<(HashMap<String, NamedTensor>, Duration), ServeError> {
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
        deployment
            .model
            .check(&request)
            .map_err(ServeError::BadInput)?;
        let _permit = self
            .slots
            .acquire()
            .await
            .map_err(|e| ServeError::Failed(e.to_string()))?;
        let model = deployment.model.clone();
        let result = tokio::task::spawn_blocking(move || model.run(&request))
            .await
            .map_err(|e| ServeError::Failed(e.to_string()))?
            .map_err(|e| ServeError::Failed(e.to_string()));
        let elapsed = started.elapsed();
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
        result.map(|outputs| (outputs, elapsed))
    }
}
