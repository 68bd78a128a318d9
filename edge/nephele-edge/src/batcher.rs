//! The dynamic batcher of one deployment: the tokio shell around the pure
//! [`nephele_infer_policy::batching`] core.
//!
//! Requests of one row each are queued ([`Batcher::submit`]); a driver task takes a
//! batch when the core says one is due (a full batch, or the oldest request has waited
//! for the window), runs it as one batched inference on a blocking thread, and answers
//! each request with its own row of the output. The batch size and window follow the
//! arrival rate ([`BatchController`]) over the service times measured per batch size
//! when the model was loaded ([`nephele_runtime::Model::tune_batches`]).
//!
//! Lifecycle and ordering:
//! - every accepted request gets exactly one answer, its own row, and rows leave the
//!   queue in arrival order; a request the bounded queue cannot take is handed back at
//!   once as [`BatchError::Full`] (back-pressure), never dropped;
//! - the driver takes a due batch only once it holds an inference slot, so while every
//!   slot is busy requests gather into larger batches instead of waiting one by one;
//! - dropping the [`Batcher`] stops the driver after the queue has drained.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use nephele_infer_policy::batching::{ArrivalEstimator, BatchController, BatchQueue, BatchSetting};
use tokio::sync::{oneshot, Notify, Semaphore};

/// The arrival-rate estimate's time constant: a quarter second, so that the window
/// follows a burst within a few hundred milliseconds.
const ARRIVAL_TIME_CONSTANT_US: u64 = 250_000;
use tokio::time::Instant;

/// Why a request was not answered by the model.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum BatchError {
    #[error("the batch queue is full ({capacity} requests waiting)")]
    Full { capacity: usize },
    #[error("{0}")]
    BadInput(String),
    #[error("inference failed: {0}")]
    Failed(String),
}

/// What the batcher is doing, for telemetry and the benchmark.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct BatcherStatus {
    pub setting: BatchSetting,
    pub arrival_rate_per_s: f64,
    pub queued: usize,
    pub batches: u64,
    pub requests: u64,
}

/// One answer: the output row's shape (batch axis 1) and values.
type RowAnswer = Result<(Vec<usize>, Vec<f32>), BatchError>;

struct Pending {
    row: Vec<f32>,
    reply: oneshot::Sender<RowAnswer>,
}

struct State {
    queue: BatchQueue<Pending>,
    arrivals: ArrivalEstimator,
    setting: BatchSetting,
    /// The measured profile plus the per-batch cost of dispatching a batch (a blocking
    /// thread hand-off, the answers), learned from the batches run: what the controller
    /// chooses from. Without it a tiny model looks able to run batch 1 far faster than
    /// the hand-off allows.
    profile: Vec<(usize, u64)>,
    /// EWMA (1/8) of that per-batch overhead, µs.
    overhead_us: u64,
    batches: u64,
    requests: u64,
}

struct Shared {
    model: nephele_runtime::Model,
    /// `(batch size, service µs)` as measured for this model on this machine.
    profile: Vec<(usize, u64)>,
    controller: BatchController,
    slo_us: u64,
    /// `None`: adapt; `Some`: a fixed setting (the benchmark's fixed-size baselines).
    fixed: Option<BatchSetting>,
    state: Mutex<State>,
    arrived: Notify,
    slots: Arc<Semaphore>,
    origin: Instant,
    closed: AtomicBool,
    /// EWMA (1/8) of the measured service time per row of the batches run, µs.
    per_row_us: std::sync::atomic::AtomicU64,
}

impl Shared {
    fn now_us(&self) -> u64 {
        self.origin.elapsed().as_micros() as u64
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// How to batch one deployment.
#[derive(Debug, Clone)]
pub struct BatcherConfig {
    /// Requests that may wait (beyond that, [`BatchError::Full`]).
    pub capacity: usize,
    /// The latency objective: no window makes a request wait past it.
    pub slo_us: u64,
    /// Service time per batch size, from [`nephele_runtime::Model::tune_batches`].
    pub profile: Vec<(usize, u64)>,
    /// Fix the setting instead of adapting it.
    pub fixed: Option<BatchSetting>,
}

/// The batcher of one deployment (cheap to share behind an `Arc`).
pub struct Batcher {
    shared: Arc<Shared>,
}

impl Batcher {
    /// Starts the driver task on the current tokio runtime.
    pub fn start(
        model: nephele_runtime::Model,
        config: BatcherConfig,
        slots: Arc<Semaphore>,
    ) -> Batcher {
        let setting = config.fixed.unwrap_or(BatchSetting::UNBATCHED);
        let shared = Arc::new(Shared {
            model,
            profile: config.profile.clone(),
            controller: BatchController::default(),
            slo_us: config.slo_us,
            fixed: config.fixed,
            state: Mutex::new(State {
                queue: BatchQueue::new(config.capacity),
                arrivals: ArrivalEstimator::new(ARRIVAL_TIME_CONSTANT_US),
                setting,
                profile: config.profile,
                overhead_us: 0,
                batches: 0,
                requests: 0,
            }),
            arrived: Notify::new(),
            slots,
            origin: Instant::now(),
            closed: AtomicBool::new(false),
            per_row_us: std::sync::atomic::AtomicU64::new(0),
        });
        tokio::spawn(drive(shared.clone()));
        Batcher { shared }
    }

    /// Queues one input row (without the batch axis) and waits for its output row.
    pub async fn submit(&self, row: Vec<f32>) -> RowAnswer {
        let (reply, answer) = oneshot::channel();
        {
            let mut state = self.shared.lock();
            let now = self.shared.now_us();
            state.arrivals.observe(now);
            if self.shared.fixed.is_none() {
                let rate = state.arrivals.rate(now);
                state.setting =
                    self.shared
                        .controller
                        .choose(rate, &state.profile, self.shared.slo_us);
            }
            let capacity = state.queue.capacity();
            state
                .queue
                .push(Pending { row, reply }, now)
                .map_err(|_| BatchError::Full { capacity })?;
        }
        self.shared.arrived.notify_one();
        answer
            .await
            .unwrap_or_else(|_| Err(BatchError::Failed("the batcher stopped".into())))
    }

    /// Measured service time per request as batches run now (0 before the first):
    /// what a new request costs the local queue.
    pub fn per_row_service_us(&self) -> u64 {
        self.shared.per_row_us.load(Ordering::Relaxed)
    }

    pub fn status(&self) -> BatcherStatus {
        let state = self.shared.lock();
        BatcherStatus {
            setting: state.setting,
            arrival_rate_per_s: state.arrivals.rate(self.shared.now_us()),
            queued: state.queue.len(),
            batches: state.batches,
            requests: state.requests,
        }
    }
}

impl Drop for Batcher {
    fn drop(&mut self) {
        self.shared.closed.store(true, Ordering::Release);
        self.shared.arrived.notify_one();
    }
}

/// The driver: wait until a batch is due, then for an inference slot, then take the
/// batch (it may have grown while every slot was busy) and run it on a blocking
/// thread. No slot is held while idle: the slots are shared with other deployments.
async fn drive(shared: Arc<Shared>) {
    loop {
        loop {
            let deadline = {
                let state = shared.lock();
                let setting = state.setting;
                if state.queue.ready(shared.now_us(), &setting) {
                    break;
                }
                state.queue.next_deadline_us(&setting)
            };
            match deadline {
                Some(at_us) => {
                    let at = shared.origin + std::time::Duration::from_micros(at_us);
                    tokio::select! {
                        _ = tokio::time::sleep_until(at) => {}
                        _ = shared.arrived.notified() => {}
                    }
                }
                None if shared.closed.load(Ordering::Acquire) => return,
                None => shared.arrived.notified().await,
            }
        }
        let Ok(permit) = shared.slots.clone().acquire_owned().await else {
            return;
        };
        let batch = {
            let mut state = shared.lock();
            // The setting says when to dispatch; what is dispatched is everything queued
            // up to the largest size that fits the SLO, so a backlog (a burst the rate
            // estimate has not caught up with, or every slot busy) drains in large
            // batches instead of one by one.
            // A fixed setting (the benchmark's baselines) takes exactly its size.
            let take = match shared.fixed {
                Some(fixed) => fixed,
                None => BatchSetting {
                    max_batch: take_limit(&state.profile, shared.slo_us)
                        .max(state.setting.max_batch),
                    window_us: state.setting.window_us,
                },
            };
            let batch = state.queue.take_batch(&take);
            state.batches += 1;
            state.requests += batch.len() as u64;
            batch
        };
        let shared = shared.clone();
        tokio::spawn(async move {
            let _permit = permit;
            run_batch(&shared, batch).await;
        });
    }
}

/// The largest measured batch size whose service time (with the dispatch overhead) fits
/// the SLO; 1 when none does.
fn take_limit(profile: &[(usize, u64)], slo_us: u64) -> usize {
    profile
        .iter()
        .filter(|(_, service)| *service <= slo_us)
        .map(|(size, _)| *size)
        .max()
        .unwrap_or(1)
        .max(1)
}

async fn run_batch(shared: &Arc<Shared>, batch: Vec<Pending>) {
    let row_shape: Vec<usize> = shared.model.input().shape[1..]
        .iter()
        .map(|d| (*d).max(1) as usize)
        .collect();
    let row_len: usize = row_shape.iter().product();
    // A row of the wrong length is answered alone, so it cannot fail the others.
    let (good, bad): (Vec<Pending>, Vec<Pending>) =
        batch.into_iter().partition(|p| p.row.len() == row_len);
    for pending in bad {
        let got = pending.row.len();
        let _ = pending.reply.send(Err(BatchError::BadInput(format!(
            "{got} values for an input row of {row_len}"
        ))));
    }
    if good.is_empty() {
        return;
    }
    let mut shape = vec![good.len()];
    shape.extend_from_slice(&row_shape);
    let data: Vec<f32> = good.iter().flat_map(|p| p.row.iter().copied()).collect();
    let model = shared.model.clone();
    let rows = good.len() as u64;
    let started = Instant::now();
    let result = tokio::task::spawn_blocking(move || model.infer(&shape, &data))
        .await
        .map_err(|e| e.to_string())
        .and_then(|r| r.map_err(|e| e.to_string()));
    if result.is_ok() {
        let elapsed_us = started.elapsed().as_micros() as u64;
        // What this batch cost beyond its measured service time.
        let measured = shared
            .profile
            .iter()
            .filter(|(size, _)| *size as u64 <= rows)
            .map(|(size, service)| (rows / *size as u64).max(1) * service)
            .min()
            .unwrap_or(0);
        let extra = elapsed_us.saturating_sub(measured);
        {
            let mut state = shared.lock();
            state.overhead_us = if state.batches <= 1 {
                extra
            } else {
                (state.overhead_us * 7 + extra) / 8
            };
            let overhead = state.overhead_us;
            state.profile = shared
                .profile
                .iter()
                .map(|(size, service)| (*size, service + overhead))
                .collect();
        }
        let sample = (elapsed_us / rows).max(1);
        let previous = shared.per_row_us.load(Ordering::Relaxed);
        let next = if previous == 0 {
            sample
        } else {
            (previous * 7 + sample) / 8
        };
        shared.per_row_us.store(next.max(1), Ordering::Relaxed);
    }
    match result {
        Ok((out_shape, out)) => {
            let per_row = out.len() / good.len().max(1);
            let mut row_out_shape = out_shape.clone();
            if let Some(first) = row_out_shape.first_mut() {
                *first = 1;
            }
            for (i, pending) in good.into_iter().enumerate() {
                let row = out[i * per_row..(i + 1) * per_row].to_vec();
                let _ = pending.reply.send(Ok((row_out_shape.clone(), row)));
            }
        }
        Err(cause) => {
            for pending in good {
                let _ = pending.reply.send(Err(BatchError::Failed(cause.clone())));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MODEL: &[u8] = include_bytes!("../../../shared/models/digits-mlp/model.onnx");

    fn model() -> nephele_runtime::Model {
        nephele_runtime::Model::load_onnx("digits", MODEL).expect("demo model loads")
    }

    fn row(seed: usize) -> Vec<f32> {
        (0..64)
            .map(|i| ((seed * 131 + i * 17) % 97) as f32 / 97.0)
            .collect()
    }

    /// Many concurrent callers: every accepted request gets exactly its own row (the
    /// output of its own input, so nothing was swapped, reordered or lost), and every
    /// refused one was refused explicitly.
    async fn check_every_request_is_answered_with_its_own_row(config: BatcherConfig) {
        let model = model();
        let expected: Vec<Vec<f32>> = (0..400)
            .map(|i| model.infer(&[64], &row(i)).expect("runs").1)
            .collect();
        let batcher = Arc::new(Batcher::start(model, config, Arc::new(Semaphore::new(2))));
        let tasks: Vec<_> = (0..400)
            .map(|i| {
                let batcher = batcher.clone();
                tokio::spawn(async move { (i, batcher.submit(row(i)).await) })
            })
            .collect();
        let (mut answered, mut refused) = (0, 0);
        for task in tasks {
            let (i, result) = task.await.expect("task");
            match result {
                Ok((shape, out)) => {
                    assert_eq!(shape, vec![1, 10]);
                    for (a, b) in out.iter().zip(&expected[i]) {
                        assert!((a - b).abs() <= 1e-4 * a.abs().max(1.0), "request {i}");
                    }
                    answered += 1;
                }
                Err(BatchError::Full { .. }) => refused += 1,
                Err(other) => panic!("request {i}: {other}"),
            }
        }
        assert_eq!(answered + refused, 400);
        assert!(answered > 0);
        let status = batcher.status();
        assert_eq!(status.requests, answered as u64);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn adaptive_batching_answers_every_request_with_its_own_row() {
        let profile = model().tune_batches(64, 5).expect("profile");
        check_every_request_is_answered_with_its_own_row(BatcherConfig {
            capacity: 1000,
            slo_us: 50_000,
            profile,
            fixed: None,
        })
        .await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_full_queue_refuses_explicitly_and_loses_nothing() {
        check_every_request_is_answered_with_its_own_row(BatcherConfig {
            capacity: 8,
            slo_us: 50_000,
            profile: vec![(1, 10)],
            fixed: Some(BatchSetting {
                max_batch: 4,
                window_us: 2_000,
            }),
        })
        .await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_row_of_the_wrong_length_fails_alone() {
        let batcher = Batcher::start(
            model(),
            BatcherConfig {
                capacity: 16,
                slo_us: 50_000,
                profile: vec![(1, 10)],
                fixed: Some(BatchSetting {
                    max_batch: 4,
                    window_us: 5_000,
                }),
            },
            Arc::new(Semaphore::new(1)),
        );
        let (good, bad) = tokio::join!(batcher.submit(row(1)), batcher.submit(vec![0.0; 3]));
        assert!(good.is_ok(), "{good:?}");
        assert!(matches!(bad, Err(BatchError::BadInput(_))), "{bad:?}");
    }
}
