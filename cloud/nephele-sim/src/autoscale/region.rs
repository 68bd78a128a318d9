//! The region of one deployment in virtual time: its replicas (starting, ready,
//! draining), the requests they serve or queue, routing, the running totals the
//! scalers' signals are read from, and the GPU time each plot bucket accounts.

use std::collections::{BinaryHeap, VecDeque};

use nephele_autoscale::admission::predicted_wait_ms;
use nephele_autoscale::serving::{least_loaded, SignalWindow, Snapshot};
use nephele_placement::rng::Rng;

use crate::autoscale_llm::{LlmProfile, LlmServer, Produced};
use crate::autoscale_trace::Workload;

/// A replica's life.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Starting,
    Ready,
    Draining,
    Gone,
}

#[derive(Debug, Clone)]
pub(super) struct Replica {
    state: State,
    started_us: u64,
    ready_at_us: u64,
    /// Slot replicas: requests in service and waiting.
    busy: u32,
    queue: VecDeque<u32>,
    /// LLM replicas: the continuous-batching engine.
    llm: Option<LlmServer>,
    /// What this replica adds to the region's totals now (see [`Region::refresh`]).
    counted: Contribution,
}

/// One replica's share of the region's running totals.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
struct Contribution {
    in_flight: u32,
    waiting: u32,
    /// Share of the replica's GPUs drawing full power (0..=1).
    power: f64,
}

impl Replica {
    fn outstanding(&self) -> u32 {
        match &self.llm {
            Some(server) => server.outstanding(),
            None => self.busy + self.queue.len() as u32,
        }
    }

    fn is_idle(&self) -> bool {
        match &self.llm {
            Some(server) => server.is_empty() && !server.stepping,
            None => self.busy == 0 && self.queue.is_empty(),
        }
    }

    /// The least-loaded key for routing: LLM replicas by tokens ahead (Splitwise's
    /// token-JSQ), then requests; slot replicas by requests.
    fn load_key(&self) -> (u64, u32) {
        match &self.llm {
            Some(server) => (server.pending_tokens(), server.outstanding()),
            None => (u64::from(self.outstanding()), 0),
        }
    }
}

/// (time µs, class, sequence number, replica, request): ordered by time, then class,
/// then the order they were scheduled in.
type Event = (u64, u8, u64, u32, u32);

/// Event classes, in the order they are handled at the same instant.
pub(super) const COMPLETE: u8 = 0;
pub(super) const STEP: u8 = 1;
pub(super) const READY: u8 = 2;

#[derive(Debug, Default, Clone, Copy)]
pub(super) struct Bucket {
    pub(super) alive_us: f64,
    /// Replica-µs at full power (busy share × time).
    pub(super) busy_us: f64,
}

/// The region in virtual time under one policy.
pub(super) struct Region<'a> {
    workload: &'a Workload,
    concurrency: u32,
    /// The slots a replica declares to the scaler (what a live region's agents say):
    /// `concurrency`, or for an LLM replica under a scaler that learns its capacity, 1.
    declared_concurrency: u32,
    cold_starts: &'a [f64],
    /// Every cold start drawn is multiplied by this.
    cold_start_scale: f64,
    rng: Rng,
    now_us: u64,
    pub(super) horizon_us: u64,
    pub(super) replicas: Vec<Replica>,
    /// Indices of the replicas not gone.
    live: Vec<usize>,
    buffer: VecDeque<u32>,
    pub(super) events: BinaryHeap<std::cmp::Reverse<Event>>,
    seq: u64,
    pub(super) alive: u32,
    pub(super) ready: u32,
    pub(super) starting: u32,
    total: Contribution,
    accounted_us: u64,
    pub(super) bucket_us: u64,
    pub(super) buckets: Vec<Bucket>,
    /// What the serving core counts between two ticks.
    pub(super) window: SignalWindow,
    /// Per request: latency (ms), or None (not answered: shed).
    pub(super) latency_ms: Vec<Option<f64>>,
    /// Per LLM request: time to its first token (ms).
    pub(super) ttft_ms: Vec<Option<f64>>,
    /// Per request: it waited at the region for a replica to be ready.
    waited_for_replica: Vec<bool>,
    service_sum_ms: f64,
    service_n: u64,
    cold_sum_ms: f64,
    cold_n: u64,
    /// When the last answer went out.
    pub(super) last_answer_us: u64,
    produced: Vec<Produced>,
}

impl<'a> Region<'a> {
    pub(super) fn new(
        workload: &'a Workload,
        cold_starts: &'a [f64],
        seed: u64,
        bucket_us: u64,
        cold_start_scale: f64,
        declared_concurrency: Option<u32>,
    ) -> Region<'a> {
        let horizon_us = workload.requests.last().map_or(0, |r| r.arrival_us);
        Region {
            workload,
            concurrency: workload.concurrency.max(1),
            declared_concurrency: declared_concurrency.unwrap_or(workload.concurrency).max(1),
            cold_starts,
            cold_start_scale: if cold_start_scale.is_finite() && cold_start_scale >= 0.0 {
                cold_start_scale
            } else {
                1.0
            },
            rng: Rng::new(seed),
            now_us: 0,
            horizon_us,
            replicas: Vec::new(),
            live: Vec::new(),
            buffer: VecDeque::new(),
            events: BinaryHeap::new(),
            seq: 0,
            alive: 0,
            ready: 0,
            starting: 0,
            total: Contribution::default(),
            accounted_us: 0,
            bucket_us: bucket_us.max(1),
            buckets: vec![Bucket::default(); (horizon_us / bucket_us.max(1)) as usize + 1],
            window: SignalWindow::default(),
            latency_ms: vec![None; workload.requests.len()],
            ttft_ms: vec![None; workload.requests.len()],
            waited_for_replica: vec![false; workload.requests.len()],
            service_sum_ms: 0.0,
            service_n: 0,
            cold_sum_ms: 0.0,
            cold_n: 0,
            last_answer_us: 0,
            produced: Vec::new(),
        }
    }

    fn push(&mut self, at_us: u64, class: u8, a: u32, b: u32) {
        self.seq += 1;
        self.events
            .push(std::cmp::Reverse((at_us, class, self.seq, a, b)));
    }

    /// Integrates GPU time and power up to `to_us` (accounting stops at the last
    /// arrival).
    pub(super) fn advance(&mut self, to_us: u64) {
        let from = self.accounted_us;
        let to = to_us.min(self.horizon_us);
        if to > from {
            let mut at = from;
            while at < to {
                let index = (at / self.bucket_us) as usize;
                let end = ((index as u64 + 1) * self.bucket_us).min(to);
                let span = (end - at) as f64;
                if let Some(bucket) = self.buckets.get_mut(index) {
                    bucket.alive_us += f64::from(self.alive) * span;
                    bucket.busy_us += self.total.power * span;
                }
                at = end;
            }
            self.accounted_us = to;
        }
        self.now_us = self.now_us.max(to_us);
    }

    /// Recomputes what replica `index` adds to the totals after a change.
    fn refresh(&mut self, index: usize) {
        let replica = &self.replicas[index];
        let gone = replica.state == State::Gone;
        let now = match &replica.llm {
            _ if gone => Contribution::default(),
            Some(server) => Contribution {
                in_flight: server.running(),
                waiting: server.waiting(),
                power: if server.stepping { 1.0 } else { 0.0 },
            },
            None => Contribution {
                in_flight: replica.busy,
                waiting: replica.queue.len() as u32,
                power: f64::from(replica.busy) / f64::from(self.concurrency),
            },
        };
        let before = replica.counted;
        self.total.in_flight = self.total.in_flight + now.in_flight - before.in_flight;
        self.total.waiting = self.total.waiting + now.waiting - before.waiting;
        self.total.power += now.power - before.power;
        self.replicas[index].counted = now;
    }

    /// The cold start the next replica started would pay (µs), without drawing it.
    pub(super) fn peek_cold_start_us(&self) -> u64 {
        if self.cold_starts.is_empty() {
            return 0;
        }
        let mut rng = self.rng.clone();
        let ms = self.cold_starts[rng.below(self.cold_starts.len() as u64) as usize];
        (ms * self.cold_start_scale * 1000.0) as u64
    }

    pub(super) fn start_replica(&mut self, ready_now: bool) {
        let cold_ms = if ready_now || self.cold_starts.is_empty() {
            0.0
        } else {
            self.cold_starts[self.rng.below(self.cold_starts.len() as u64) as usize]
                * self.cold_start_scale
        };
        let ready_at_us = self.now_us + (cold_ms * 1000.0) as u64;
        let index = self.replicas.len() as u32;
        self.replicas.push(Replica {
            state: if ready_now {
                State::Ready
            } else {
                State::Starting
            },
            started_us: self.now_us,
            ready_at_us,
            busy: 0,
            queue: VecDeque::new(),
            llm: self.workload.llm.as_ref().map(|_| LlmServer::default()),
            counted: Contribution::default(),
        });
        self.alive += 1;
        self.live.push(index as usize);
        if ready_now {
            self.ready += 1;
        } else {
            self.starting += 1;
            self.push(ready_at_us, READY, index, 0);
        }
    }

    fn best_ready(&self) -> Option<usize> {
        least_loaded(
            self.live
                .iter()
                .filter(|&&index| self.replicas[index].state == State::Ready)
                .map(|&index| (self.replicas[index].load_key(), index)),
        )
    }

    fn begin(&mut self, index: usize, request: u32) {
        let service_ms = self.workload.requests[request as usize].service_ms;
        self.replicas[index].busy += 1;
        self.refresh(index);
        let done = self.now_us + (service_ms * 1000.0).round() as u64;
        self.push(done, COMPLETE, index as u32, request);
    }

    /// Starts replica `index`'s next step if it is an idle LLM replica with work.
    fn kick(&mut self, index: usize) {
        let workload = self.workload;
        let Some(profile) = workload.llm.as_ref() else {
            return;
        };
        let requests = &workload.requests;
        let Some(server) = self.replicas[index].llm.as_mut() else {
            return;
        };
        if server.stepping {
            return;
        }
        if let Some(duration_us) = server.plan_step(profile, requests) {
            let at = self.now_us + duration_us;
            self.push(at, STEP, index as u32, 0);
        }
        self.refresh(index);
    }

    pub(super) fn route(&mut self, request: u32) {
        let Some(index) = self.best_ready() else {
            if let Some(waited) = self.waited_for_replica.get_mut(request as usize) {
                *waited = true;
            }
            self.buffer.push_back(request);
            return;
        };
        if let Some(server) = self.replicas[index].llm.as_mut() {
            server.enqueue(request, &self.workload.requests);
            self.refresh(index);
            self.kick(index);
        } else if self.replicas[index].busy < self.concurrency {
            self.begin(index, request);
        } else {
            self.replicas[index].queue.push_back(request);
            self.refresh(index);
        }
    }

    /// The wait the gate is asked about: before the request would start at the
    /// replica it would go to, or until the first starting replica is ready. LLM
    /// replicas: the prompt tokens ahead of it at a full step's prefill rate.
    pub(super) fn predicted_wait_ms(&self, service_ms: f64) -> f64 {
        let per_token_ms = self
            .workload
            .llm
            .as_ref()
            .map(LlmProfile::ms_per_prefill_token);
        if let Some(index) = self.best_ready() {
            let replica = &self.replicas[index];
            return match (&replica.llm, per_token_ms) {
                (Some(server), Some(per_token)) => server.prefill_ahead() as f64 * per_token,
                _ => predicted_wait_ms(replica.outstanding(), self.concurrency, service_ms, None),
            };
        }
        let first_ready = self
            .live
            .iter()
            .map(|&index| &self.replicas[index])
            .filter(|r| r.state == State::Starting)
            .map(|r| r.ready_at_us)
            .min();
        match (first_ready, per_token_ms) {
            (Some(at), Some(per_token)) => {
                let ahead: u64 = self
                    .buffer
                    .iter()
                    .map(|&r| u64::from(self.workload.requests[r as usize].prompt_tokens))
                    .sum();
                at.saturating_sub(self.now_us) as f64 / 1000.0 + ahead as f64 * per_token
            }
            (Some(at), None) => predicted_wait_ms(
                self.buffer.len() as u32,
                self.concurrency,
                service_ms,
                Some(at.saturating_sub(self.now_us) as f64 / 1000.0),
            ),
            (None, _) => f64::INFINITY,
        }
    }

    fn answered(&mut self, request: u32) {
        let arrival_us = self.workload.requests[request as usize].arrival_us;
        let latency_ms = (self.now_us - arrival_us) as f64 / 1000.0;
        self.latency_ms[request as usize] = Some(latency_ms);
        let within = self.workload.requests[request as usize]
            .within(latency_ms, self.ttft_ms[request as usize]);
        let found_replica = !self
            .waited_for_replica
            .get(request as usize)
            .is_some_and(|w| *w);
        self.window.answer(latency_ms, within, found_replica);
        self.service_sum_ms += self.workload.requests[request as usize].service_ms;
        self.service_n += 1;
        self.last_answer_us = self.last_answer_us.max(self.now_us);
    }

    pub(super) fn complete(&mut self, index: usize, request: u32) {
        self.answered(request);
        let state = self.replicas[index].state;
        self.replicas[index].busy -= 1;
        self.refresh(index);
        if let Some(next) = self.replicas[index].queue.pop_front() {
            self.begin(index, next);
        } else if state == State::Draining && self.replicas[index].busy == 0 {
            self.retire(index);
        }
    }

    /// An LLM replica's step ended: apply it, answer what finished, start the next.
    pub(super) fn step_done(&mut self, index: usize) {
        let mut produced = std::mem::take(&mut self.produced);
        produced.clear();
        if let Some(server) = self.replicas[index].llm.as_mut() {
            server.finish_step(&mut produced);
        }
        for item in &produced {
            match *item {
                Produced::FirstToken(request) => {
                    let arrival_us = self.workload.requests[request as usize].arrival_us;
                    self.ttft_ms[request as usize] =
                        Some((self.now_us - arrival_us) as f64 / 1000.0);
                }
                Produced::Done(request) => self.answered(request),
            }
        }
        self.produced = produced;
        self.refresh(index);
        self.kick(index);
        if self.replicas[index].state == State::Draining && self.replicas[index].is_idle() {
            self.retire(index);
        }
    }

    pub(super) fn become_ready(&mut self, index: usize) {
        if self.replicas[index].state != State::Starting {
            return;
        }
        self.replicas[index].state = State::Ready;
        self.starting -= 1;
        self.ready += 1;
        self.cold_sum_ms += (self.now_us - self.replicas[index].started_us) as f64 / 1000.0;
        self.cold_n += 1;
        self.refresh(index);
        while let Some(request) = self.buffer.pop_front() {
            self.route(request);
        }
    }

    fn retire(&mut self, index: usize) {
        self.replicas[index].state = State::Gone;
        self.refresh(index);
        self.alive -= 1;
        self.live.retain(|&live| live != index);
    }

    /// Carries out a desired count.
    pub(super) fn scale_to(&mut self, desired: u32) {
        let active = self.ready + self.starting;
        if desired > active {
            for _ in active..desired {
                self.start_replica(false);
            }
            return;
        }
        let mut remove = active - desired;
        // Starting replicas first, the furthest from ready first.
        let mut starting: Vec<usize> = self
            .live
            .iter()
            .copied()
            .filter(|&i| self.replicas[i].state == State::Starting)
            .collect();
        starting.sort_by_key(|&i| std::cmp::Reverse((self.replicas[i].ready_at_us, i)));
        for index in starting {
            if remove == 0 {
                break;
            }
            self.starting -= 1;
            self.retire(index);
            remove -= 1;
        }
        // Then ready ones, least outstanding first, the newest first among equals.
        let mut ready: Vec<usize> = self
            .live
            .iter()
            .copied()
            .filter(|&i| self.replicas[i].state == State::Ready)
            .collect();
        ready.sort_by_key(|&i| (self.replicas[i].load_key(), std::cmp::Reverse(i)));
        for index in ready {
            if remove == 0 {
                break;
            }
            self.replicas[index].state = State::Draining;
            self.ready -= 1;
            self.refresh(index);
            if self.replicas[index].is_idle() {
                self.retire(index);
            }
            remove -= 1;
        }
    }

    /// Replicas (ready, or starting and ready by `at_us`) that will serve at `at_us`.
    pub(super) fn ready_by(&self, at_us: u64) -> u32 {
        self.live
            .iter()
            .map(|&index| &self.replicas[index])
            .filter(|r| {
                r.state == State::Ready || r.state == State::Starting && r.ready_at_us <= at_us
            })
            .count() as u32
    }

    /// What the replicas are now, for the serving core to close the window with.
    pub(super) fn snapshot(&self) -> Snapshot {
        Snapshot {
            in_flight: self.total.in_flight,
            queued: self.buffer.len() as u32 + self.total.waiting,
            ready: self.ready,
            starting: self.starting,
            service_ms: self.mean_service_ms().unwrap_or(0.0),
            concurrency: self.declared_concurrency,
            cold_start_ms: (self.cold_n > 0).then(|| self.cold_sum_ms / self.cold_n as f64),
            priority: 0,
        }
    }

    /// Mean service time of the requests answered so far (LLM: latency alone).
    pub(super) fn mean_service_ms(&self) -> Option<f64> {
        (self.service_n > 0).then(|| self.service_sum_ms / self.service_n as f64)
    }
}
