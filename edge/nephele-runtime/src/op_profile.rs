//! Where a model's time goes in tract: every node of the batch-1 plan timed as it runs
//! (the plan's own evaluation, with a clock around each node), summed per operator.
//! `nephele bench inference --only profile` prints it beside onnxruntime's own per-node
//! profile of the same file, which is how the gap on the CNNs is located.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use tract_onnx::prelude::*;
use tract_onnx::tract_core::plan::eval;

use crate::{Model, RuntimeError};

/// One operator kind of a plan: how many nodes run it and their time per run.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct OpTime {
    /// tract's name for the optimised operator (`Conv`, `OptMatMul`, `Add`, …).
    pub op: String,
    pub nodes: usize,
    /// Mean time per model run, µs, summed over those nodes.
    pub us_per_run: f64,
    /// Share of the timed nodes' total, 0–1.
    pub share: f64,
}

impl Model {
    /// Times each node of the batch-1 plan over `runs` runs (after one untimed run) on
    /// zero input, and returns the operators by time, largest first. The clock around
    /// each node costs well under a microsecond, so small models' totals come out a
    /// little above their plain run time.
    pub fn op_profile(&self, runs: usize) -> Result<Vec<OpTime>, RuntimeError> {
        let fail = |cause: String| RuntimeError::Run {
            model: self.name.clone(),
            cause,
        };
        if self.candle.is_some() {
            return Err(fail("a candle model has no tract plan to profile".into()));
        }
        let plan = self
            .plan(0)
            .ok_or_else(|| fail("the batch-1 plan is missing".into()))?
            .plan()
            .clone();
        let mut shape = vec![1usize];
        shape.extend(self.input.shape[1..].iter().map(|d| (*d).max(1) as usize));
        let input = Tensor::zero::<f32>(&shape).map_err(|e| fail(format!("{e:#}")))?;
        let mut per_node: BTreeMap<usize, (String, Duration)> = BTreeMap::new();
        for run in 0..=runs.max(1) {
            let mut state = TypedSimpleState::new(&plan).map_err(|e| fail(format!("{e:#}")))?;
            let timed = run > 0;
            state
                .run_plan_with_eval(
                    tvec!(input.clone().into()),
                    |ctx, op_state, node, inputs| {
                        let started = Instant::now();
                        let out = eval(ctx, op_state, node, inputs);
                        if timed {
                            let entry = per_node
                                .entry(node.id)
                                .or_insert_with(|| (node.op.name().to_string(), Duration::ZERO));
                            entry.1 += started.elapsed();
                        }
                        out
                    },
                )
                .map_err(|e| fail(format!("{e:#}")))?;
        }
        let mut per_op: BTreeMap<String, (usize, Duration)> = BTreeMap::new();
        for (op, time) in per_node.into_values() {
            let entry = per_op.entry(op).or_default();
            entry.0 += 1;
            entry.1 += time;
        }
        let total: f64 = per_op.values().map(|(_, t)| t.as_secs_f64()).sum();
        let runs = runs.max(1) as f64;
        let mut ops: Vec<OpTime> = per_op
            .into_iter()
            .map(|(op, (nodes, time))| OpTime {
                op,
                nodes,
                us_per_run: time.as_secs_f64() * 1e6 / runs,
                share: if total > 0.0 {
                    time.as_secs_f64() / total
                } else {
                    0.0
                },
            })
            .collect();
        ops.sort_by(|a, b| b.us_per_run.total_cmp(&a.us_per_run));
        Ok(ops)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_digits_model_spends_its_time_in_its_matrix_products() {
        let bytes = include_bytes!("../../../shared/models/digits-mlp/model.onnx");
        let model = Model::load_onnx("digits", bytes).expect("loads");
        let ops = model.op_profile(20).expect("profiles");
        assert!(!ops.is_empty());
        let shares: f64 = ops.iter().map(|o| o.share).sum();
        assert!((shares - 1.0).abs() < 1e-9, "shares add up: {shares}");
        assert!(ops.windows(2).all(|w| w[0].us_per_run >= w[1].us_per_run));
        assert!(ops.iter().all(|o| o.nodes >= 1 && o.us_per_run >= 0.0));
        // An MLP: its dense layers are the product operators (the runtime's own,
        // `dense.rs`), and they lead.
        assert_eq!(ops[0].op, "NepheleDense", "{ops:?}");
        assert_eq!(ops[0].nodes, 3, "{ops:?}");
    }
}
