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
//! - with [`BatcherConfig::admit_within_us`], a request whose predicted completion
//!   ([`predicted_completion_us`]: the batches in flight, the batches ahead, its own)
//!   is past the admission limit is refused at once as [`BatchError::Late`] with a
//!   retry-after, rather than queued to be answered late (Triton's queue policy with
//!   `REJECT`). The prediction's error is learned from the answers' measured latencies
//!   ([`AdmissionControl`], a margin aimed at the 99.9th percentile); a request that finds the
//!   batcher idle is always admitted. Past capacity (arrivals at least as fast as the
//!   drain size is served) the limit is also capped at what keeps the device busy
//!   ([`overload_limit_us`]), so a standing queue does not sit at the bound;
//! - the driver takes a due batch only once it holds an inference slot, so while every
//!   slot is busy requests gather into larger batches instead of waiting one by one;
//! - dropping the [`Batcher`] stops the driver after the queue has drained.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use nephele_infer_policy::batching::{
    batch_service_us, drain_size, overload_limit_us, predicted_completion_us, AdmissionControl,
    ArrivalEstimator, BatchController, BatchQueue, BatchSetting, DEFAULT_ERROR_QUANTILE_Z,
};
use tokio::sync::{oneshot, Notify, Semaphore};

/// The arrival-rate estimate's time constant: a quarter second, so that the window
/// follows a burst within a few hundred milliseconds.
const ARRIVAL_TIME_CONSTANT_US: u64 = 250_000;
/// A pause longer than this between a batch ending with work waiting and the next
/// starting is not counted as dispatch overhead.
const MAX_DISPATCH_GAP_US: u64 = 5_000;
use tokio::time::Instant;

/// Why a request was not answered by the model.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum BatchError {
    #[error("the batch queue is full ({capacity} requests waiting)")]
    Full { capacity: usize },
    #[error("the request would be answered in {predicted_ms} ms, over the {limit_ms} ms this queue admits now; retry in {retry_after_ms} ms")]
    Late {
        predicted_ms: u64,
        limit_ms: u64,
        retry_after_ms: u64,
    },
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
    /// Requests refused as predicted to be late.
    pub late: u64,
    /// What admission adds to a prediction for its error, µs (`None`: no admission).
    pub admission_margin_us: Option<f64>,
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
    /// EWMA (1/8) of that per-batch overhead, µs: the batch's time beyond its measured
    /// service, plus the gap between the previous batch ending with this one already due
    /// and this one starting (waking the driver, an inference slot, a blocking thread). That
    /// gap idles the model once per batch, so it is what makes batches worth forming
    /// under load even for a model whose compute does not batch.
    overhead_us: u64,
    /// When the last batch ended with the next one already due (µs since `origin`).
    backlogged_since_us: Option<u64>,
    batches: u64,
    requests: u64,
    /// Refused by [`BatcherConfig::admit_within_us`].
    late: u64,
    /// When the batches dispatched so far are expected to be done (µs since `origin`).
    busy_until_us: u64,
    admission: Option<AdmissionControl>,
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

    /// What the driver takes when a batch is due. The setting says when to dispatch;
    /// what is dispatched is everything queued up to the setting's size or, when more
    /// waits (a burst the rate estimate has not caught up with, or every slot busy),
    /// up to the size that drains a backlog fastest ([`drain_size`]: larger only where
    /// batching buys throughput). A fixed setting (the benchmark's baselines) takes
    /// exactly its size.
    fn take(&self, state: &State) -> BatchSetting {
        match self.fixed {
            Some(fixed) => fixed,
            None => BatchSetting {
                max_batch: drain_size(&state.profile, self.budget_us(state))
                    .max(state.setting.max_batch),
                window_us: state.setting.window_us,
            },
        }
    }

    /// The latency the batch settings plan for: the SLO, or, with admission, the limit
    /// it admits up to now (its bound less the learned error margin), so that a machine
    /// whose answers run late gets smaller batches rather than late answers.
    fn budget_us(&self, state: &State) -> u64 {
        state
            .admission
            .as_ref()
            .map_or(self.slo_us, |a| a.limit_us().min(self.slo_us))
            .max(1)
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
    /// Refuse at once ([`BatchError::Late`]) a request predicted to be answered later
    /// than this; `None` queues every request the capacity allows.
    pub admit_within_us: Option<u64>,
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
        // A fresh queue knows nothing of how late its answers run on this machine, and
        // its first answers arrive only after a batch or two: until they do it keeps a
        // quarter of the bound in hand (at least one batch-1 service), which the answers
        // then move to what they measure. The bench measured steady margins of 3–8 ms
        // against a 20 ms bound; starting from one service time (1.5 ms) its p99 past
        // capacity sat at the bound (19.9–20.1 ms), starting from a quarter under it.
        let admission = config.admit_within_us.map(|bound| {
            let prior = batch_service_us(&config.profile, 1)
                .unwrap_or(0)
                .max(bound / 4);
            AdmissionControl::new(bound, DEFAULT_ERROR_QUANTILE_Z, prior)
        });
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
                backlogged_since_us: None,
                batches: 0,
                requests: 0,
                late: 0,
                busy_until_us: 0,
                admission,
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
        // When it was queued (µs since the batcher's origin) and its predicted completion
        // (µs after that), for admission to learn from.
        let (arrived_us, predicted_us) = {
            let mut state = self.shared.lock();
            let now = self.shared.now_us();
            state.arrivals.observe(now);
            let rate = state.arrivals.rate(now);
            if self.shared.fixed.is_none() {
                let budget = self.shared.budget_us(&state);
                state.setting = self.shared.controller.choose(rate, &state.profile, budget);
            }
            let busy_for_us = state.busy_until_us.saturating_sub(now);
            let idle = state.queue.is_empty() && busy_for_us == 0;
            let take = self.shared.take(&state);
            // The head batch is due when the setting says (its window runs from the
            // oldest request's arrival); an empty queue starts a whole window.
            let window_left_us = state
                .queue
                .next_deadline_us(&state.setting)
                .map_or(state.setting.window_us, |due| due.saturating_sub(now));
            let predicted_us = predicted_completion_us(
                state.queue.len(),
                take.max_batch,
                window_left_us,
                busy_for_us,
                &state.profile,
            );
            if let (Some(admission), Some(predicted)) = (state.admission.as_ref(), predicted_us) {
                // Past capacity, no standing queue beyond what keeps the device busy.
                let standing =
                    overload_limit_us(rate, &state.profile, take.max_batch, admission.bound_us());
                let over_standing = standing.is_some_and(|cap| predicted > cap);
                if !idle && (!admission.admits(predicted) || over_standing) {
                    let limit_us = admission.limit_us().min(standing.unwrap_or(u64::MAX));
                    state.late += 1;
                    return Err(BatchError::Late {
                        predicted_ms: predicted.div_ceil(1000),
                        limit_ms: limit_us / 1000,
                        retry_after_ms: predicted.saturating_sub(limit_us).div_ceil(1000).max(1),
                    });
                }
            }
            let capacity = state.queue.capacity();
            state
                .queue
                .push(Pending { row, reply }, now)
                .map_err(|_| BatchError::Full { capacity })?;
            (now, predicted_us)
        };
        self.shared.arrived.notify_one();
        let answer = answer
            .await
            .unwrap_or_else(|_| Err(BatchError::Failed("the batcher stopped".into())));
        // Admission learns its error from here, when the caller has its answer, not
        // from when the batch finished: on a busy machine the task that waits for the
        // answer may itself wait to run, and that wait is part of the latency a client
        // sees (the bench measured p99 past the SLO when it was left out).
        if let (Ok(_), Some(predicted)) = (&answer, predicted_us) {
            let answered_us = self.shared.now_us();
            if let Some(admission) = self.shared.lock().admission.as_mut() {
                admission.observe(predicted, answered_us.saturating_sub(arrived_us));
            }
        }
        answer
    }

    /// Batch 1's compute time as measured when the model was loaded (µs; 0 without a
    /// profile): what the control plane plans with.
    pub fn measured_service_us(&self) -> u64 {
        batch_service_us(&self.shared.profile, 1).unwrap_or(0)
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
            late: state.late,
            admission_margin_us: state.admission.as_ref().map(AdmissionControl::margin_us),
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
            let take = shared.take(&state);
            let batch = state.queue.take_batch(&take);
            let now = shared.now_us();
            let expected = batch_service_us(&state.profile, batch.len()).unwrap_or(0);
            state.busy_until_us = state.busy_until_us.max(now.saturating_add(expected));
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

async fn run_batch(shared: &Arc<Shared>, batch: Vec<Pending>) {
    let row_shape: Vec<usize> = shared.model.input().shape[1..]
        .iter()
        .map(|d| (*d).max(1) as usize)
        .collect();
    // A bad row (wrong length; for an encoder, a value that is no token id) is answered
    // alone, so it cannot fail the others.
    let mut good = Vec::with_capacity(batch.len());
    for pending in batch {
        match shared.model.check_row(&pending.row) {
            Ok(()) => good.push(pending),
            Err(cause) => {
                let _ = pending.reply.send(Err(BatchError::BadInput(cause)));
            }
        }
    }
    if good.is_empty() {
        return;
    }
    let mut shape = vec![good.len()];
    shape.extend_from_slice(&row_shape);
    let data: Vec<f32> = good.iter().flat_map(|p| p.row.iter().copied()).collect();
    let model = shared.model.clone();
    let rows = good.len() as u64;
    // Idle time since the previous batch left work waiting; a longer pause is the
    // driver waiting for a window, not overhead.
    let gap_us = {
        let now = shared.now_us();
        shared
            .lock()
            .backlogged_since_us
            .take()
            .map(|since| now.saturating_sub(since))
            .filter(|gap| *gap <= MAX_DISPATCH_GAP_US)
            .unwrap_or(0)
    };
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
        let extra = elapsed_us.saturating_sub(measured) + gap_us;
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
    // A batch already due: the time until it starts is dispatch overhead (a batch
    // still inside its window is not due, and its wait is the window's).
    let now = shared.now_us();
    let mut state = shared.lock();
    let setting = state.setting;
    if state.queue.ready(now, &setting) {
        state.backlogged_since_us = Some(now);
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
    async fn check_every_request_is_answered_with_its_own_row(
        config: BatcherConfig,
    ) -> BatcherStatus {
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
                Err(BatchError::Full { .. } | BatchError::Late { .. }) => refused += 1,
                Err(other) => panic!("request {i}: {other}"),
            }
        }
        assert_eq!(answered + refused, 400);
        assert!(answered > 0);
        let status = batcher.status();
        assert_eq!(status.requests, answered as u64);
        status
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn adaptive_batching_answers_every_request_with_its_own_row() {
        let profile = model().tune_batches(64, 5).expect("profile");
        check_every_request_is_answered_with_its_own_row(BatcherConfig {
            capacity: 1000,
            slo_us: 50_000,
            profile,
            fixed: None,
            admit_within_us: None,
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
            admit_within_us: None,
        })
        .await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn requests_predicted_late_are_refused_explicitly_and_the_rest_answered() {
        // 400 callers at once against a bound of five batch-1 service times: most are
        // refused as late, each with its own error, and none is lost.
        let status = check_every_request_is_answered_with_its_own_row(BatcherConfig {
            capacity: 1000,
            slo_us: 50_000,
            profile: vec![(1, 1_000), (4, 2_000)],
            fixed: Some(BatchSetting::UNBATCHED),
            admit_within_us: Some(5_000),
        })
        .await;
        assert!(status.late > 0, "{status:?}");
        assert!(status.late < 400, "{status:?}");
    }

    #[tokio::test]
    async fn a_fresh_batcher_keeps_a_quarter_of_its_bound_in_hand() {
        let start = |bound_us: u64| {
            Batcher::start(
                model(),
                BatcherConfig {
                    capacity: 8,
                    slo_us: 50_000,
                    profile: vec![(1, 1_000)],
                    fixed: None,
                    admit_within_us: Some(bound_us),
                },
                Arc::new(Semaphore::new(1)),
            )
            .status()
            .admission_margin_us
        };
        // Before any answer: a quarter of the bound, or one service time if larger.
        assert_eq!(start(20_000), Some(5_000.0));
        assert_eq!(start(2_000), Some(1_000.0));
    }

    #[test]
    fn a_late_refusal_says_when_to_retry() {
        let error = BatchError::Late {
            predicted_ms: 31,
            limit_ms: 20,
            retry_after_ms: 11,
        };
        assert_eq!(
            error.to_string(),
            "the request would be answered in 31 ms, over the 20 ms this queue admits now; retry in 11 ms"
        );
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
                admit_within_us: None,
            },
            Arc::new(Semaphore::new(1)),
        );
        let (good, bad) = tokio::join!(batcher.submit(row(1)), batcher.submit(vec![0.0; 3]));
        assert!(good.is_ok(), "{good:?}");
        assert!(matches!(bad, Err(BatchError::BadInput(_))), "{bad:?}");
    }
}
