//! `oracle`: a clairvoyant replica schedule, **not causal and only in the simulator**
//! (like the carbon simulator's `known_ahead`): it knows every future arrival and the
//! cold start each replica it starts will draw. It answers how few GPU-hours any
//! scaler could use while keeping the goal share within target under the same cold
//! starts; no policy that reads only the past can do as well.
//!
//! How the schedule is built:
//! 1. The trace is cut into slots of 5 s. For each slot with arrivals, its requests
//!    alone are replayed on `n` fresh ready replicas for n = 1, 2, … until all are
//!    within target: misses(n), and when the last of them is answered.
//! 2. The share of misses the goal allows (1% of the trace at 99%) is spent where it
//!    saves the most replicas: repeatedly, the slot whose next replica removed adds
//!    the fewest misses gives it up, while the total stays within the allowance.
//! 3. The need at any moment is the largest count of the slots whose requests are
//!    still being served then (a slot holds its replicas until its last answer, as
//!    measured alone), and never below `min_replicas`.
//! 4. The full trace is replayed with that need: every second the oracle keeps the
//!    replicas needed before a replica started now could be ready (releasing the
//!    others: a release is only worth it when the gap is longer than a cold start),
//!    and starts, one at a time, exactly the replicas some coming moment would lack,
//!    each just one cold start (the one it will draw) ahead.
//! 5. If the replay misses the goal (slots share replicas, so alone is not the same
//!    as together), every slot with more misses than planned gets one more replica,
//!    and the replay runs again.
//!
//! It is a reference, not a proven optimum: slots are planned one at a time and the
//! allowance is spent greedily. It starts with the replicas its first moments need
//! already ready (as static starts with its count), and it never sheds.

use serde::Serialize;
use std::collections::BinaryHeap;

use crate::autoscale::{simulate_with, PolicyResult, RunContext, Scaler};
use crate::autoscale_trace::Workload;
use nephele_autoscale::Static;

/// The replicas needed per slot of time.
#[derive(Debug, Clone, PartialEq)]
pub struct OraclePlan {
    pub slot_us: u64,
    pub need: Vec<u32>,
    /// Never fewer than this.
    pub floor: u32,
}

impl OraclePlan {
    fn need_of(&self, slot: u64) -> u32 {
        self.need
            .get(slot as usize)
            .copied()
            .unwrap_or(0)
            .max(self.floor)
    }

    /// The largest need over `[from_us, until_us)`.
    pub fn max_need(&self, from_us: u64, until_us: u64) -> u32 {
        let slot = self.slot_us.max(1);
        if until_us <= from_us {
            return self.need_of(from_us / slot);
        }
        (from_us / slot..=(until_us - 1) / slot)
            .map(|k| self.need_of(k))
            .max()
            .unwrap_or(self.floor)
    }

    /// Whether some moment in `[from_us, until_us)` needs more replicas than
    /// `ready_by` says will serve then.
    pub fn short_between(
        &self,
        from_us: u64,
        until_us: u64,
        ready_by: impl Fn(u64) -> u32,
    ) -> bool {
        if until_us <= from_us {
            return false;
        }
        let slot = self.slot_us.max(1);
        (from_us / slot..=(until_us - 1) / slot).any(|k| {
            let need = self.need_of(k);
            need > 0 && ready_by((k * slot).max(from_us)) < need
        })
    }
}

/// What the oracle run reports besides its result.
#[derive(Debug, Clone, Serialize)]
pub struct OracleInfo {
    pub slot_s: f64,
    /// Replays of the full trace until the goal held.
    pub rounds: usize,
    /// Misses the plan allowed itself (slots replayed alone).
    pub planned_misses: usize,
    pub allowance: usize,
    /// Whether the last replay met the goal.
    pub met_goal: bool,
    pub description: &'static str,
}

/// One slot's requests and their replays alone.
struct Slot {
    start_us: u64,
    range: std::ops::Range<usize>,
    /// misses[n − 1] and answered-by[n − 1] (µs, absolute) with n replicas.
    misses: Vec<usize>,
    end_us: Vec<u64>,
    chosen: usize,
}

impl Slot {
    fn misses_with(&self, n: usize) -> usize {
        self.misses.get(n.max(1) - 1).copied().unwrap_or(0)
    }

    fn end_with(&self, n: usize) -> u64 {
        let index = (n.max(1) - 1).min(self.end_us.len().saturating_sub(1));
        self.end_us.get(index).copied().unwrap_or(self.start_us)
    }
}

fn without_requests(workload: &Workload) -> Workload {
    Workload {
        name: workload.name.clone(),
        path: workload.path.clone(),
        start_hour: workload.start_hour,
        start_offset_s: workload.start_offset_s,
        concurrency: workload.concurrency,
        gpu: workload.gpu,
        gpus_per_replica: workload.gpus_per_replica,
        llm: workload.llm.clone(),
        service_model: workload.service_model.clone(),
        target_rule: workload.target_rule.clone(),
        target_floor_ms: workload.target_floor_ms,
        requests: Vec::new(),
    }
}

/// Replays `slot`'s requests alone on 1, 2, … fresh replicas until none misses.
fn replay_alone(
    context: &RunContext<'_>,
    shell: &mut Workload,
    start_us: u64,
    range: std::ops::Range<usize>,
    max_replicas: u32,
) -> Slot {
    let requests = &context.workload.requests;
    shell.requests.clear();
    shell
        .requests
        .extend(requests[range.clone()].iter().map(|r| {
            let mut copy = *r;
            copy.arrival_us -= start_us;
            copy
        }));
    let mut slot = Slot {
        start_us,
        range,
        misses: Vec::new(),
        end_us: Vec::new(),
        chosen: 1,
    };
    for n in 1..=max_replicas.max(1) {
        let alone = RunContext {
            workload: shell,
            cold_starts: &[],
            prices: context.prices,
            seed: context.seed,
            bucket_us: 5_000_000,
            tune_until_us: 0,
            initial_replicas: n,
            cold_start_scale: 1.0,
            declared_concurrency: None,
            score_from_us: 0,
        };
        let result = simulate_with("alone", Scaler::Policy(&mut Static::new(n)), &alone);
        let misses = result.met.iter().filter(|m| !**m).count();
        slot.misses.push(misses);
        slot.end_us.push(start_us + result.last_answer_us);
        if misses == 0 {
            break;
        }
    }
    slot.chosen = slot.misses.len();
    slot
}

fn build_need(slots: &[Slot], slot_us: u64, span_us: u64, floor: u32) -> OraclePlan {
    let slot_us = slot_us.max(1);
    let mut need = vec![0u32; (span_us / slot_us) as usize + 2];
    for slot in slots {
        let n = slot.chosen as u32;
        let first = slot.start_us / slot_us;
        let end = slot.end_with(slot.chosen).max(slot.start_us + 1);
        let last = (end - 1) / slot_us;
        for k in first..=last {
            let k = k as usize;
            if k >= need.len() {
                need.resize(k + 1, 0);
            }
            need[k] = need[k].max(n);
        }
    }
    OraclePlan {
        slot_us,
        need,
        floor,
    }
}

/// Builds the schedule and replays the trace under it.
pub fn run_oracle(
    context: &RunContext<'_>,
    goal: f64,
    floor: u32,
    max_replicas: u32,
    max_cold_start_us: u64,
) -> (PolicyResult, OracleInfo, OraclePlan) {
    const SLOT_US: u64 = 5_000_000;
    const MAX_ROUNDS: usize = 40;
    let requests = &context.workload.requests;
    let span_us = requests.last().map_or(0, |r| r.arrival_us);
    let mut shell = without_requests(context.workload);
    let mut slots = Vec::new();
    let mut first = 0;
    while first < requests.len() {
        let start_us = requests[first].arrival_us / SLOT_US * SLOT_US;
        let end = first + requests[first..].partition_point(|r| r.arrival_us < start_us + SLOT_US);
        slots.push(replay_alone(
            context,
            &mut shell,
            start_us,
            first..end,
            max_replicas,
        ));
        first = end;
    }
    // What serves each slot alone with no miss: the reactive reference's need.
    let generous = build_need(&slots, SLOT_US, span_us, floor);
    // Spend the allowance where a replica buys the fewest misses.
    let allowance = ((1.0 - goal).max(0.0) * requests.len() as f64).floor() as usize;
    let mut heap = BinaryHeap::new();
    let cost = |slot: &Slot| slot.misses_with(slot.chosen - 1) - slot.misses_with(slot.chosen);
    for (index, slot) in slots.iter().enumerate() {
        if slot.chosen > 1 {
            heap.push(std::cmp::Reverse((cost(slot), index)));
        }
    }
    let mut planned = 0usize;
    while let Some(std::cmp::Reverse((added, index))) = heap.pop() {
        if planned + added > allowance {
            break;
        }
        planned += added;
        let slot = &mut slots[index];
        slot.chosen -= 1;
        if slot.chosen > 1 {
            heap.push(std::cmp::Reverse((cost(slot), index)));
        }
    }
    let mut rounds = 0;
    loop {
        rounds += 1;
        let plan = build_need(&slots, SLOT_US, span_us, floor);
        let run = RunContext {
            initial_replicas: plan.max_need(0, max_cold_start_us),
            ..crate::autoscale::context_clone(context)
        };
        let result = simulate_with("oracle", Scaler::Oracle(&plan), &run);
        let met_goal = result.within_slo >= goal;
        let mut bumped = false;
        if !met_goal {
            for slot in &mut slots {
                let missed = result.met[slot.range.clone()]
                    .iter()
                    .filter(|m| !**m)
                    .count();
                if missed > slot.misses_with(slot.chosen) && (slot.chosen as u32) < max_replicas {
                    slot.chosen += 1;
                    bumped = true;
                }
            }
        }
        if met_goal || !bumped || rounds >= MAX_ROUNDS {
            let planned_misses = slots.iter().map(|s| s.misses_with(s.chosen)).sum();
            return (
                result,
                OracleInfo {
                    slot_s: SLOT_US as f64 / 1e6,
                    rounds,
                    planned_misses,
                    allowance,
                    met_goal,
                    description: "clairvoyant, simulator only: knows every future arrival and each replica's cold start; starts replicas one cold start ahead of need",
                },
                generous,
            );
        }
    }
}

/// The cheapest reactive bound found, and how it was searched.
#[derive(Debug, Clone, Serialize)]
pub struct ReactiveInfo {
    pub floor: u32,
    pub hold_s: f64,
    pub within_slo: f64,
    pub gpu_hours: f64,
    /// Whether some (floor, hold) met the goal (else the best within is reported).
    pub met_goal: bool,
    /// (hold s, floor, within, GPU-hours) of every run of the search.
    pub searched: Vec<(f64, u32, f64, f64)>,
    pub description: &'static str,
}

/// The reactive reference: each slot's need (the replicas that serve its requests
/// alone with no miss) learnt only when the slot has ended (no foresight: a scaler
/// told exactly what the arrivals it has seen needed), with a standing floor and a
/// hold (scale-down stabilisation): every floor up to `max_floor` with holds of 0,
/// 60, 300 and 900 s; the cheapest that meets the goal. Replicas pay the same cold starts. Not a
/// proof that no causal scaler does better: it is the best of this family.
pub fn run_reactive_bound(
    context: &RunContext<'_>,
    plan: &OraclePlan,
    goal: f64,
    min_floor: u32,
    max_floor: u32,
) -> (PolicyResult, ReactiveInfo) {
    const HOLDS_S: [f64; 4] = [0.0, 60.0, 300.0, 900.0];
    let run = |floor: u32, hold_s: f64| {
        simulate_with(
            "reactive-ref",
            Scaler::Reactive {
                plan,
                floor,
                hold_us: (hold_s * 1e6) as u64,
            },
            &RunContext {
                initial_replicas: floor,
                ..crate::autoscale::context_clone(context)
            },
        )
    };
    let mut searched = Vec::new();
    let mut best: Option<(PolicyResult, u32, f64)> = None;
    let mut closest: Option<(PolicyResult, u32, f64)> = None;
    // Every floor: the share within is not monotone in it (routing and scale-in
    // interact), so no bisection.
    for hold_s in HOLDS_S {
        for floor in min_floor.max(1)..=max_floor.max(min_floor.max(1)) {
            let result = run(floor, hold_s);
            searched.push((hold_s, floor, result.within_slo, result.gpu_hours));
            if result.within_slo >= goal {
                if best
                    .as_ref()
                    .is_none_or(|(b, _, _)| result.gpu_hours < b.gpu_hours)
                {
                    best = Some((result, floor, hold_s));
                }
            } else if closest
                .as_ref()
                .is_none_or(|(c, _, _)| result.within_slo > c.within_slo)
            {
                closest = Some((result, floor, hold_s));
            }
        }
    }
    let met_goal = best.is_some();
    let chosen = best.or(closest);
    let (result, floor, hold_s) = match chosen {
        Some(chosen) => chosen,
        None => (run(min_floor.max(1), 0.0), min_floor.max(1), 0.0),
    };
    let info = ReactiveInfo {
        floor,
        hold_s,
        within_slo: result.within_slo,
        gpu_hours: result.gpu_hours,
        met_goal,
        searched,
        description: "not a policy, simulator only: told at the end of each 5-s slot how many replicas would have served its requests with no miss, never before; keeps a floor and the largest need of the last hold",
    };
    (result, info)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::autoscale_trace::{gpu_price, Request};
    use crate::trace::HourlySeries;
    use std::path::PathBuf;

    #[test]
    fn the_oracle_starts_replicas_one_cold_start_ahead_and_releases_them_after() {
        // One request at 0 and 200 s; three at 100 s that cannot wait for each other
        // (1 s each, 1.5 s allowed); every cold start 20 s.
        let at = |s: u64| Request::timed(s * 1_000_000, 1_000.0, 1_500.0);
        let workload = Workload {
            name: "test".into(),
            path: PathBuf::from("test.csv"),
            start_hour: 0,
            start_offset_s: 0.0,
            concurrency: 1,
            gpu: gpu_price("A10G-24GB").expect("row"),
            gpus_per_replica: 1,
            llm: None,
            service_model: "fixed".into(),
            target_rule: "test".into(),
            target_floor_ms: 500.0,
            requests: vec![at(0), at(100), at(100), at(100), at(200)],
        };
        let prices = HourlySeries {
            zone: "X".into(),
            start_hour: 0,
            values: vec![100.0; 24],
            filled: 0,
            duplicates: 0,
            estimated: 0,
        };
        let context = RunContext {
            workload: &workload,
            cold_starts: &[20_000.0],
            prices: &prices,
            seed: 1,
            bucket_us: 15_000_000,
            tune_until_us: 100_000_000,
            initial_replicas: 1,
            cold_start_scale: 1.0,
            declared_concurrency: None,
            score_from_us: 0,
        };
        let (result, info, _) = run_oracle(&context, 0.99, 1, 8, 20_000_000);
        assert_eq!(result.outside, 0);
        assert!(info.met_goal);
        // Two more replicas from 80 s (ready at 100 s) until the slot's need is past
        // the next cold start's horizon (105 s): 200 + 2 × 25 replica-seconds.
        let expected = (200.0 + 2.0 * 25.0) / 3600.0;
        assert!(
            (result.gpu_hours - expected).abs() < 2.0 / 3600.0,
            "{} against {expected}",
            result.gpu_hours
        );
        assert_eq!(result.peak_replicas, 3);
    }

    #[test]
    fn the_plan_answers_the_largest_need_and_what_is_short() {
        let plan = OraclePlan {
            slot_us: 10,
            need: vec![0, 3, 1, 0],
            floor: 1,
        };
        assert_eq!(plan.max_need(0, 10), 1);
        assert_eq!(plan.max_need(5, 15), 3);
        assert_eq!(plan.max_need(20, 100), 1);
        assert!(plan.short_between(0, 20, |_| 2));
        assert!(!plan.short_between(0, 20, |at| if at >= 10 { 3 } else { 1 }));
        assert!(!plan.short_between(20, 20, |_| 0));
    }
}
