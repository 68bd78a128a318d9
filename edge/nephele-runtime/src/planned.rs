//! A plan with its idle run states kept for the next run.
//!
//! tract's `plan.run(inputs)` makes a fresh state per call (a value slot per node, the
//! constants cloned into it, every operator asked for its state, a session id) and
//! drops it after: about 0.8 µs of the MLP's 5 µs at batch 1 on the development
//! machine. A state run to its end has reset its turn (`SimpleState::run` clears
//! every value and resolved symbol), so it can run the next request as it is; states
//! are kept here, one per caller running at that moment, and reused. Only for plans
//! whose operators keep no state of their own between runs: a state carried from one
//! request into another would be wrong, so a stateful plan gets a fresh state per run,
//! as before. A run that fails drops its state.

use std::sync::{Arc, Mutex};

use tract_onnx::prelude::*;

/// A runnable plan and its idle states.
#[derive(Debug)]
pub struct Planned {
    plan: Arc<TypedRunnableModel>,
    /// States that ran to completion; `None` when the plan's operators keep state
    /// between runs (states are then never kept).
    idle: Option<Mutex<Vec<TypedSimpleState>>>,
}

impl Planned {
    /// `plan`, probing once whether its operators keep state between runs.
    pub fn new(plan: Arc<TypedRunnableModel>) -> TractResult<Planned> {
        let probe = plan.spawn()?;
        let stateless = probe.op_states.iter().all(Option::is_none);
        Ok(Planned {
            plan,
            idle: stateless.then(|| Mutex::new(vec![probe])),
        })
    }

    pub fn plan(&self) -> &Arc<TypedRunnableModel> {
        &self.plan
    }

    /// Runs `inputs` on an idle state (or a new one), keeping the state when it ran.
    pub fn run(&self, inputs: TVec<TValue>) -> TractResult<TVec<TValue>> {
        let Some(idle) = &self.idle else {
            return self.plan.run(inputs);
        };
        let taken = idle.lock().unwrap_or_else(|p| p.into_inner()).pop();
        let mut state = match taken {
            Some(state) => state,
            None => self.plan.spawn()?,
        };
        let outputs = state.run(inputs)?;
        idle.lock().unwrap_or_else(|p| p.into_inner()).push(state);
        Ok(outputs)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const DIGITS: &[u8] = include_bytes!("../../../shared/models/digits-mlp/model.onnx");

    fn digits_plan() -> Arc<TypedRunnableModel> {
        tract_onnx::onnx()
            .model_for_read(&mut &DIGITS[..])
            .and_then(|m| m.with_input_fact(0, f32::fact([1, 64]).into()))
            .and_then(|m| m.into_optimized())
            .and_then(|m| m.into_runnable())
            .expect("the digits model plans")
    }

    fn row(seed: usize) -> TVec<TValue> {
        let values: Vec<f32> = (0..64).map(|i| ((i * 7 + seed * 13) % 17) as f32).collect();
        tvec!(Tensor::from_shape(&[1, 64], &values).unwrap().into())
    }

    /// A reused state answers each request as a fresh one does, also from several
    /// threads at once, and keeps no more states than callers ran at the same time.
    #[test]
    fn reused_states_answer_as_fresh_ones() {
        let plan = digits_plan();
        let planned = Arc::new(Planned::new(plan.clone()).unwrap());
        assert!(planned.idle.is_some(), "the MLP's operators keep no state");
        let expected: Vec<Tensor> = (0..8)
            .map(|seed| plan.run(row(seed)).unwrap()[0].clone().into_tensor())
            .collect();
        let threads: Vec<_> = (0..4)
            .map(|t| {
                let (planned, expected) = (planned.clone(), expected.clone());
                std::thread::spawn(move || {
                    for round in 0..50 {
                        let seed = (t + round) % 8;
                        let got = planned.run(row(seed)).unwrap()[0].clone().into_tensor();
                        assert_eq!(got, expected[seed], "thread {t} round {round}");
                    }
                })
            })
            .collect();
        for thread in threads {
            thread.join().unwrap();
        }
        let idle = planned.idle.as_ref().unwrap().lock().unwrap().len();
        assert!((1..=4).contains(&idle), "{idle} idle states for 4 callers");
    }
}
