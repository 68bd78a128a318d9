//! Offloaded requests at a fixed rate: open-loop (a request is sent on schedule
//! whether or not earlier ones were answered, so a slow region shows as latency and
//! errors, not as a politely lower rate), each on its own QUIC stream of a simulated
//! agent that runs the deployment, round robin over them, as the real agent offloads:
//! `StreamRequest::Infer` to the region, which queues it for a pool replica.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use nephele_net::{read_frame, write_frame};
use nephele_proto::{
    InferRequest, InferStage, Payload, RequestBody, StreamRequest, StreamResponse, Tensor,
    MAX_FRAME_BYTES, PROTOCOL_VERSION,
};

use super::session::Slot;

/// What an offload run measured.
#[derive(Debug, Default, Clone, serde::Serialize)]
pub struct OffloadResult {
    pub target_rps: f64,
    pub seconds: f64,
    pub sent: u64,
    pub answered: u64,
    pub errors: u64,
    /// Answered requests per second over the run.
    pub rps: f64,
    pub p50_ms: f64,
    pub p99_ms: f64,
    /// Error messages and how often each came (at most 5 kinds).
    pub error_kinds: Vec<(String, u64)>,
}

/// Sends requests for `deployment` at `rps` for `seconds` through the Ready agents in
/// `slots`; `rows` are the inputs, taken in turn.
pub async fn run(
    slots: Vec<Arc<Slot>>,
    deployment: &str,
    rows: Vec<Vec<f32>>,
    rps: f64,
    seconds: f64,
) -> OffloadResult {
    let ready: Vec<quinn::Connection> = slots
        .iter()
        .filter(|slot| slot.ready.load(Ordering::Relaxed))
        .filter_map(|slot| {
            slot.connection
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .clone()
        })
        .collect();
    let mut result = OffloadResult {
        target_rps: rps,
        seconds,
        ..OffloadResult::default()
    };
    if ready.is_empty() || rows.is_empty() || rps <= 0.0 {
        return result;
    }
    let latencies = Arc::new(Mutex::new(Vec::new()));
    let errors = Arc::new(Mutex::new(std::collections::HashMap::<String, u64>::new()));
    let answered = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let total = (rps * seconds).round() as u64;
    let mut tasks = tokio::task::JoinSet::new();
    for k in 0..total {
        // The schedule, not the previous answer, says when the next request goes.
        let due = started + Duration::from_secs_f64(k as f64 / rps);
        tokio::time::sleep_until(due.into()).await;
        let connection = ready[k as usize % ready.len()].clone();
        let row = rows[k as usize % rows.len()].clone();
        let (deployment, latencies, errors, answered) = (
            deployment.to_string(),
            latencies.clone(),
            errors.clone(),
            answered.clone(),
        );
        tasks.spawn(async move {
            let sent = Instant::now();
            match tokio::time::timeout(
                Duration::from_secs(10),
                infer(&connection, &deployment, k, row),
            )
            .await
            {
                Ok(Ok(())) => {
                    answered.fetch_add(1, Ordering::Relaxed);
                    latencies
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .push(sent.elapsed().as_secs_f64() * 1000.0);
                }
                Ok(Err(error)) => {
                    *errors
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .entry(error)
                        .or_default() += 1
                }
                Err(_) => {
                    *errors
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .entry("no answer within 10 s".into())
                        .or_default() += 1
                }
            }
        });
        // Reap finished requests as it goes, so the set stays small.
        while tasks.try_join_next().is_some() {}
    }
    while tasks.join_next().await.is_some() {}
    let elapsed = started.elapsed().as_secs_f64();
    let mut latencies = std::mem::take(&mut *latencies.lock().unwrap_or_else(|p| p.into_inner()));
    latencies.sort_by(f64::total_cmp);
    let errors = std::mem::take(&mut *errors.lock().unwrap_or_else(|p| p.into_inner()));
    result.sent = total;
    result.answered = answered.load(Ordering::Relaxed);
    result.errors = errors.values().sum();
    result.rps = result.answered as f64 / elapsed.max(1e-9);
    result.p50_ms = super::quantile(&latencies, 0.5);
    result.p99_ms = super::quantile(&latencies, 0.99);
    let mut kinds: Vec<(String, u64)> = errors.into_iter().collect();
    kinds.sort_by_key(|kind| std::cmp::Reverse(kind.1));
    kinds.truncate(5);
    result.error_kinds = kinds;
    result
}

/// One offloaded request; an error says what went wrong.
async fn infer(
    connection: &quinn::Connection,
    deployment: &str,
    id: u64,
    row: Vec<f32>,
) -> Result<(), String> {
    let (mut send, mut recv) = connection
        .open_bi()
        .await
        .map_err(|e| format!("open stream: {e}"))?;
    let request = StreamRequest {
        protocol_version: PROTOCOL_VERSION,
        body: RequestBody::Infer(InferRequest {
            deployment: deployment.to_string(),
            request_id: id,
            input: Payload::Tensor(Tensor {
                shape: vec![1, row.len() as u32],
                data: row,
            }),
            stage: InferStage::Whole,
            trace: None,
        }),
    };
    write_frame(&mut send, &request)
        .await
        .map_err(|e| format!("send: {e}"))?;
    let _ = send.finish();
    match read_frame::<StreamResponse>(&mut recv, MAX_FRAME_BYTES).await {
        Ok(Some(StreamResponse::Inferred(_))) => Ok(()),
        Ok(Some(StreamResponse::Error(error))) => {
            Err(format!("{:?}: {}", error.code, error.message))
        }
        Ok(Some(_)) => Err("unexpected answer".into()),
        Ok(None) => Err("stream closed without an answer".into()),
        Err(error) => Err(format!("read: {error}")),
    }
}
