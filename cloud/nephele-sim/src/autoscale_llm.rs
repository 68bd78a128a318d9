//! The LLM replica of `nephele sim autoscale`: continuous batching (iteration-level
//! scheduling, Orca, OSDI 2022) with chunked prefill and a KV-cache budget, as vLLM V1
//! serves, stepped in virtual time with step times measured on real hardware.
//!
//! **Performance profile.** Llama-2-70B (FP16) with tensor parallelism 2 on two H100
//! SXM 80 GB: the configuration the Splitwise authors profiled (Patel et al., ISCA
//! 2024, the paper that published the Azure code trace) and released with their
//! simulator, `Mutinifni/splitwise-sim`, file `data/perf_model.csv` (commit
//! `378088013a54df6f2052c27ff5ae6ea7619c3ecc`). The tables below are the medians of its
//! `llama2-70b, h100-80gb, tensor_parallel = 2` rows (five repetitions per point):
//! - `prompt_time` against the tokens in the batch (prompt size × batch size; the
//!   prompt-size sweep at batch 1 and the batch sweep of 512-token prompts pooled per
//!   token count, as SplitwiseSim's `DatabasePerformanceModel` pools them);
//! - `token_time` (one decode iteration) against the batch size, 512-token prompts.
//!   The batch-64 rows are left out: they are faster than batch 32 (42 ms against
//!   52 ms, prompt time 0.36 s against 2.4 s), so that batch cannot have run whole.
//!   Decode context beyond the profiled one (512 prompt tokens + on average 64
//!   generated) adds its KV-cache read at 3.1 TB/s, the rate the batch-1 prompt-size
//!   sweep implies (37.0 ms at 576 tokens of context, 37.8 ms at 8,192).
//!
//! A step that mixes prefill and decode costs 1.1 × the prefill time of all its tokens
//! (SplitwiseSim's `get_iteration_duration`); a prefill-only step the prefill time;
//! a decode-only step the decode time.
//!
//! **Scheduler** (vLLM V1's, simplified): every step has a budget of
//! `max_num_batched_tokens` = 2,048 tokens (vLLM's `SchedulerConfig` default, also
//! SplitwiseSim's baseline `max_batch_tokens`); running requests go first in arrival
//! order, each decoding one token, then the prompts being prefilled get chunks, then
//! waiting requests are admitted in arrival order while the budget, `max_num_seqs`
//! (256) and the KV cache allow. A request reserves the KV cache of its prompt and
//! its output at admission (its output length is in the trace; vLLM allocates blocks
//! as it goes and preempts when they run out: reserving up front means no preemption
//! here, one simplification). Its first token comes at the end of the step that
//! finishes its prompt, then one token per step.
//!
//! **KV-cache budget**: 2 × 81,559 MiB (the H100 80 GB's memory as `nvidia-smi`
//! reports it) × 0.9 (vLLM's default `gpu_memory_utilization`) − 137.96 GB of weights
//! (68.98 B parameters × 2 bytes) − 3 GB for activations and CUDA graphs (an
//! assumption) = 12.98 GB, at 327,680 bytes per token (80 layers × 8 KV heads × 128 ×
//! 2 (K and V) × 2 bytes, grouped-query attention): 39,604 tokens. Consistent with the
//! profile: its batch of 32 × 640 tokens (20,480) ran, its batch of 64 × 640 (40,960)
//! did not behave as if it had.

use serde::Serialize;
use std::collections::VecDeque;

use crate::autoscale_trace::Request;

/// Measured step times of one replica and its scheduler's limits.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct LlmProfile {
    pub model: &'static str,
    pub gpu: &'static str,
    pub gpus_per_replica: u32,
    pub tensor_parallel: u32,
    pub source: &'static str,
    /// (tokens in the step, ms): prefill.
    pub prefill_ms: Vec<(f64, f64)>,
    /// (sequences in the step, ms): decode at the profiled context.
    pub decode_ms: Vec<(f64, f64)>,
    /// Mean context (tokens) of a sequence in the decode profile.
    pub profiled_context: f64,
    pub kv_bytes_per_token: f64,
    /// KV-cache read rate for context beyond the profiled one (bytes/s).
    pub kv_read_bytes_per_s: f64,
    /// A step with both prefill and decode costs this × the prefill time.
    pub mixed_factor: f64,
    pub kv_capacity_tokens: u64,
    pub max_num_batched_tokens: u32,
    pub max_num_seqs: u32,
}

/// A request alone on an idle replica.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Isolated {
    pub ttft_ms: f64,
    pub e2e_ms: f64,
    /// Mean time between output tokens (0 with one output token).
    pub tbt_ms: f64,
}

/// Piecewise-linear through `points` (sorted by x), extended linearly past both ends.
fn interpolate(points: &[(f64, f64)], x: f64) -> f64 {
    match points {
        [] => 0.0,
        [(_, y)] => *y,
        _ => {
            let at = points
                .windows(2)
                .position(|pair| x <= pair[1].0)
                .unwrap_or(points.len() - 2);
            let ((x0, y0), (x1, y1)) = (points[at], points[at + 1]);
            let slope = if x1 > x0 { (y1 - y0) / (x1 - x0) } else { 0.0 };
            y0 + slope * (x - x0)
        }
    }
}

impl LlmProfile {
    /// Llama-2-70B, TP 2 on two H100 SXM 80 GB (see the module documentation).
    pub fn llama2_70b_h100_tp2() -> LlmProfile {
        let weights_bytes = 68.98e9 * 2.0;
        let memory_bytes = 2.0 * 81_559.0 * 1_048_576.0 * 0.9;
        let kv_bytes_per_token = 80.0 * 8.0 * 128.0 * 2.0 * 2.0;
        let kv_bytes = memory_bytes - weights_bytes - 3e9;
        LlmProfile {
            model: "Llama-2-70B (FP16)",
            gpu: "H100-SXM-80GB",
            gpus_per_replica: 2,
            tensor_parallel: 2,
            source: "Splitwise (Patel et al., ISCA 2024): medians of the llama2-70b/h100-80gb/TP2 rows of Mutinifni/splitwise-sim data/perf_model.csv",
            prefill_ms: vec![
                (128.0, 48.33),
                (256.0, 51.85),
                (512.0, 83.83),
                (1024.0, 157.21),
                (2048.0, 300.29),
                (4096.0, 622.46),
                (8192.0, 1266.31),
                (16384.0, 2397.77),
            ],
            decode_ms: vec![
                (1.0, 37.00),
                (2.0, 37.39),
                (4.0, 39.98),
                (8.0, 40.40),
                (16.0, 41.97),
                (32.0, 52.26),
            ],
            profiled_context: 576.0,
            kv_bytes_per_token,
            kv_read_bytes_per_s: 3.1e12,
            mixed_factor: 1.1,
            kv_capacity_tokens: (kv_bytes / kv_bytes_per_token).floor().max(1.0) as u64,
            max_num_batched_tokens: 2048,
            max_num_seqs: 256,
        }
    }

    /// A prefill of `tokens` (all in one step).
    pub fn prefill_step_ms(&self, tokens: f64) -> f64 {
        interpolate(&self.prefill_ms, tokens).max(1.0)
    }

    /// A decode step of `sequences` whose contexts sum to `context_tokens`.
    pub fn decode_step_ms(&self, sequences: usize, context_tokens: f64) -> f64 {
        let batch = sequences.max(1) as f64;
        let extra = (context_tokens - batch * self.profiled_context).max(0.0);
        interpolate(&self.decode_ms, batch).max(1.0)
            + extra * self.kv_bytes_per_token / self.kv_read_bytes_per_s * 1000.0
    }

    /// One step of `prefill` prompt tokens and `decodes` decoding sequences.
    pub fn step_ms(&self, prefill: u32, decodes: usize, context_tokens: f64) -> f64 {
        match (prefill, decodes) {
            (0, _) => self.decode_step_ms(decodes, context_tokens),
            (_, 0) => self.prefill_step_ms(f64::from(prefill)),
            _ => self.mixed_factor * self.prefill_step_ms(f64::from(prefill) + decodes as f64),
        }
    }

    /// The request alone on an idle replica: its prompt in budget-sized chunks, then
    /// one decode step per further token at batch 1.
    pub fn isolated(&self, prompt: u32, output: u32) -> Isolated {
        let budget = self.max_num_batched_tokens.max(1);
        let mut left = prompt.max(1);
        let mut ttft_ms = 0.0;
        while left > 0 {
            let chunk = left.min(budget);
            ttft_ms += self.prefill_step_ms(f64::from(chunk));
            left -= chunk;
        }
        let mut decode_ms = 0.0;
        for index in 1..output.max(1) {
            let context = f64::from(prompt) + f64::from(index);
            decode_ms += self.decode_step_ms(1, context);
        }
        Isolated {
            ttft_ms,
            e2e_ms: ttft_ms + decode_ms,
            tbt_ms: if output >= 2 {
                decode_ms / f64::from(output - 1)
            } else {
                0.0
            },
        }
    }

    /// Milliseconds of prefill per prompt token in a full mixed step (for wait
    /// estimates).
    pub fn ms_per_prefill_token(&self) -> f64 {
        let budget = f64::from(self.max_num_batched_tokens.max(1));
        self.mixed_factor * self.prefill_step_ms(budget) / budget
    }
}

/// The latency target of an LLM request, from the Splitwise paper's P99 SLOs (its
/// Table of SLOs; `get_slo` in splitwise-sim `notebooks/plots.ipynb`): each a
/// slowdown over the request alone.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct SlowdownTarget {
    pub ttft: f64,
    pub tbt: f64,
    pub e2e: f64,
}

impl SlowdownTarget {
    /// P99: TTFT 6×, TBT 5×, E2E 5×.
    pub const SPLITWISE_P99: SlowdownTarget = SlowdownTarget {
        ttft: 6.0,
        tbt: 5.0,
        e2e: 5.0,
    };
    /// P90: TTFT 3×, TBT 1.5×, E2E 1.5× (for the sensitivity runs).
    pub const SPLITWISE_P90: SlowdownTarget = SlowdownTarget {
        ttft: 3.0,
        tbt: 1.5,
        e2e: 1.5,
    };
}

/// One admitted request.
#[derive(Debug, Clone)]
struct Sequence {
    request: u32,
    prompt_left: u32,
    out_left: u32,
    context: u32,
    reserved: u32,
    /// Tokens it has in the step under way.
    scheduled: u32,
}

/// What a finished step produced.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Produced {
    FirstToken(u32),
    Done(u32),
}

/// One replica's engine: waiting queue, running batch, KV cache.
#[derive(Debug, Clone, Default)]
pub struct LlmServer {
    waiting: VecDeque<u32>,
    running: Vec<Sequence>,
    kv_used: u64,
    /// A step is under way.
    pub stepping: bool,
    /// Prompt tokens not yet prefilled (waiting and running).
    prefill_left: u64,
}

impl LlmServer {
    /// Requests admitted to the batch.
    pub fn running(&self) -> u32 {
        self.running.len() as u32
    }

    /// Requests not admitted yet.
    pub fn waiting(&self) -> u32 {
        self.waiting.len() as u32
    }

    pub fn outstanding(&self) -> u32 {
        self.running() + self.waiting()
    }

    pub fn is_empty(&self) -> bool {
        self.running.is_empty() && self.waiting.is_empty()
    }

    /// Work ahead of a new request, in tokens: the prompts left to prefill plus one
    /// per decoding sequence (SplitwiseSim's token-JSQ routing key).
    pub fn pending_tokens(&self) -> u64 {
        self.prefill_left + self.running.iter().filter(|s| s.prompt_left == 0).count() as u64
    }

    /// Prompt tokens to prefill before a request queued now would start its own.
    pub fn prefill_ahead(&self) -> u64 {
        self.prefill_left
    }

    pub fn enqueue(&mut self, request: u32, requests: &[Request]) {
        self.prefill_left += u64::from(requests[request as usize].prompt_tokens.max(1));
        self.waiting.push_back(request);
    }

    /// Plans the next step; its duration in µs, or None when there is nothing to run.
    pub fn plan_step(&mut self, profile: &LlmProfile, requests: &[Request]) -> Option<u64> {
        let mut left = profile.max_num_batched_tokens.max(1);
        let mut decodes = 0usize;
        let mut context = 0.0;
        let mut prefill = 0u32;
        for sequence in &mut self.running {
            sequence.scheduled = 0;
        }
        for sequence in &mut self.running {
            if left == 0 {
                break;
            }
            if sequence.prompt_left == 0 && sequence.out_left > 0 {
                sequence.scheduled = 1;
                left -= 1;
                decodes += 1;
                context += f64::from(sequence.context);
            }
        }
        for sequence in &mut self.running {
            if left == 0 {
                break;
            }
            if sequence.prompt_left > 0 {
                let chunk = sequence.prompt_left.min(left);
                sequence.scheduled = chunk;
                left -= chunk;
                prefill += chunk;
            }
        }
        while left > 0 && (self.running.len() as u32) < profile.max_num_seqs {
            let Some(&request) = self.waiting.front() else {
                break;
            };
            let r = &requests[request as usize];
            let prompt = r.prompt_tokens.max(1);
            let reserved = prompt + r.output_tokens.max(1);
            // A request larger than the whole cache runs alone rather than never.
            if self.kv_used + u64::from(reserved) > profile.kv_capacity_tokens
                && !self.running.is_empty()
            {
                break;
            }
            self.waiting.pop_front();
            self.kv_used += u64::from(reserved);
            let chunk = prompt.min(left);
            left -= chunk;
            prefill += chunk;
            self.running.push(Sequence {
                request,
                prompt_left: prompt,
                out_left: r.output_tokens.max(1),
                context: 0,
                reserved,
                scheduled: chunk,
            });
        }
        if prefill == 0 && decodes == 0 {
            self.stepping = false;
            return None;
        }
        self.stepping = true;
        let ms = profile.step_ms(prefill, decodes, context);
        Some(((ms * 1000.0).round() as u64).max(1))
    }

    /// Applies the step that just ended: prefill chunks, one token per decoding
    /// sequence; first tokens and finished requests go to `produced` (in batch order).
    pub fn finish_step(&mut self, produced: &mut Vec<Produced>) {
        self.stepping = false;
        let mut index = 0;
        while index < self.running.len() {
            let sequence = &mut self.running[index];
            let scheduled = sequence.scheduled;
            sequence.scheduled = 0;
            if scheduled > 0 {
                if sequence.prompt_left > 0 {
                    sequence.prompt_left -= scheduled.min(sequence.prompt_left);
                    sequence.context += scheduled;
                    self.prefill_left = self.prefill_left.saturating_sub(u64::from(scheduled));
                    if sequence.prompt_left == 0 {
                        sequence.out_left -= 1;
                        sequence.context += 1;
                        produced.push(Produced::FirstToken(sequence.request));
                    }
                } else {
                    sequence.out_left -= 1;
                    sequence.context += 1;
                }
            }
            if sequence.prompt_left == 0 && sequence.out_left == 0 {
                let done = self.running.remove(index);
                self.kv_used = self.kv_used.saturating_sub(u64::from(done.reserved));
                produced.push(Produced::Done(done.request));
            } else {
                index += 1;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(prompt: u32, output: u32) -> Request {
        Request {
            arrival_us: 0,
            service_ms: 0.0,
            target_ms: f64::INFINITY,
            prompt_tokens: prompt,
            output_tokens: output,
            ttft_target_ms: f64::INFINITY,
            tbt_target_ms: f64::INFINITY,
        }
    }

    #[test]
    fn the_profile_interpolates_the_measured_medians() {
        let p = LlmProfile::llama2_70b_h100_tp2();
        assert!((p.prefill_step_ms(2048.0) - 300.29).abs() < 1e-9);
        assert!((p.prefill_step_ms(1536.0) - (157.21 + 300.29) / 2.0).abs() < 1e-9);
        assert!((p.decode_step_ms(1, 576.0) - 37.0).abs() < 1e-9);
        // 7,616 more tokens of context at batch 1: +0.8 ms, as measured.
        let longer = p.decode_step_ms(1, 8192.0) - 37.0;
        assert!((longer - 0.805).abs() < 0.01, "{longer}");
        assert_eq!(p.kv_capacity_tokens, 39_604);
        // Mixed: 1.1 × the prefill of all tokens.
        assert!((p.step_ms(1000, 24, 0.0) - 1.1 * 157.21).abs() < 1e-6);
    }

    #[test]
    fn isolated_latency_chunks_the_prompt_then_decodes_at_batch_one() {
        let p = LlmProfile::llama2_70b_h100_tp2();
        let alone = p.isolated(3000, 3);
        let ttft = 300.29 + p.prefill_step_ms(952.0);
        assert!((alone.ttft_ms - ttft).abs() < 1e-9);
        let decode = p.decode_step_ms(1, 3001.0) + p.decode_step_ms(1, 3002.0);
        assert!((alone.e2e_ms - ttft - decode).abs() < 1e-9);
        assert!((alone.tbt_ms - decode / 2.0).abs() < 1e-9);
    }

    #[test]
    fn a_step_decodes_first_then_chunks_prompts_within_the_budget_and_the_cache() {
        let mut p = LlmProfile::llama2_70b_h100_tp2();
        p.kv_capacity_tokens = 4000;
        let requests = vec![request(1500, 2), request(1500, 3), request(1500, 1)];
        let mut server = LlmServer::default();
        for index in 0..3 {
            server.enqueue(index, &requests);
        }
        // Step 1: the first two fit the cache (1502 + 1503); the third waits for it.
        let first = server.plan_step(&p, &requests).expect("work");
        assert_eq!((server.running(), server.waiting()), (2, 1));
        assert_eq!(first, (p.prefill_step_ms(2048.0) * 1000.0).round() as u64);
        let mut produced = Vec::new();
        server.finish_step(&mut produced);
        assert_eq!(produced, vec![Produced::FirstToken(0)]);
        // Step 2: request 0 decodes, request 1 finishes its prompt (952 tokens).
        let second = server.plan_step(&p, &requests).expect("work");
        assert_eq!(
            second,
            (1.1 * p.prefill_step_ms(953.0) * 1000.0).round() as u64
        );
        produced.clear();
        server.finish_step(&mut produced);
        assert_eq!(produced, vec![Produced::Done(0), Produced::FirstToken(1)]);
        // Request 0's cache is free: request 2 is admitted next step.
        server.plan_step(&p, &requests).expect("work");
        assert_eq!((server.running(), server.waiting()), (2, 0));
    }
}
