//! Which split variants to build: a bounded set of cuts chosen from what they cost, not
//! every single-tensor cut of the graph (a 10.9 MB recognizer has 212 of them; building,
//! storing and loading them all took minutes and gigabytes).
//!
//! The split planner (`nephele_infer_policy::split`) picks, for a device and a link,
//! the cut that minimises head time on the device + transfer of the activation + tail
//! time in the pool. Whatever the device's speed and the link's bandwidth, a cut that
//! needs at least as much compute before it *and* sends at least as many bytes as
//! another is never the better choice, and neither is one that sends at least as many
//! bytes as the model input (the whole offload sends the input with no compute on the
//! device). So only the Pareto frontier of (head FLOPs ↑, activation bytes ↓) below the
//! input size can be picked; [`choose_cuts`] keeps at most `max` of it, spread evenly
//! along the compute axis, each with the reason it was kept.
//!
//! [`cut_costs`] measures every cut's head FLOPs and activation bytes in one typed pass
//! over the model (tract's cost model, batch 1), without building any head or tail.

use std::collections::HashMap;

use tract_onnx::prelude::*;

use crate::RuntimeError;

/// Split variants built per model at most.
pub const MAX_SPLIT_CANDIDATES: usize = 8;

/// What one cut costs, as the planner sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CutCost {
    pub tensor: String,
    /// FLOPs of everything computed before the cut (one row).
    pub head_flops: u64,
    /// Bytes of one row's activation at the cut.
    pub activation_bytes: u64,
}

/// A cut kept for building, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChosenCut {
    pub cost: CutCost,
    pub reason: String,
}

/// The cuts to build, in graph order (`costs` is in graph order). With at most `max`
/// cuts in all, every one is kept (a small model's cuts cost nothing to build, and each
/// can be deployed by name). Otherwise: the frontier described in the module docs,
/// thinned to `max` evenly spaced by head FLOPs (both ends kept).
pub fn choose_cuts(
    costs: &[CutCost],
    input_bytes: u64,
    full_flops: u64,
    max: usize,
) -> Vec<ChosenCut> {
    let share = |flops: u64| 100.0 * flops as f64 / full_flops.max(1) as f64;
    let describe = |cost: &CutCost, why: &str| {
        format!(
            "{why}: {:.1}% of the compute before the cut, {} bytes to send per row (the input is {input_bytes})",
            share(cost.head_flops),
            cost.activation_bytes
        )
    };
    if costs.len() <= max {
        return costs
            .iter()
            .map(|cost| ChosenCut {
                cost: cost.clone(),
                reason: describe(cost, &format!("one of the model's {} cuts", costs.len())),
            })
            .collect();
    }
    // Among equal compute the smallest activation comes first; graph order breaks the
    // remaining ties, so the earliest of equal cuts is the one kept.
    let mut order: Vec<usize> = (0..costs.len()).collect();
    order.sort_by_key(|&i| (costs[i].head_flops, costs[i].activation_bytes, i));
    let mut frontier: Vec<usize> = Vec::new();
    let mut fewest_bytes = input_bytes;
    for i in order {
        if costs[i].activation_bytes < fewest_bytes {
            fewest_bytes = costs[i].activation_bytes;
            frontier.push(i);
        }
    }
    let total = frontier.len();
    let kept: Vec<usize> = if total <= max || max == 0 {
        frontier.iter().copied().take(max).collect()
    } else {
        let mut picked: Vec<usize> = (0..max)
            .map(|k| frontier[(k * (total - 1) + (max - 1) / 2) / (max - 1).max(1)])
            .collect();
        picked.dedup();
        picked
    };
    let mut kept = kept;
    kept.sort_unstable();
    kept.into_iter()
        .map(|i| ChosenCut {
            cost: costs[i].clone(),
            reason: describe(
                &costs[i],
                &format!(
                    "on the frontier of {total} cuts of {} that no other cut or the whole offload beats for every device and link",
                    costs.len()
                ),
            ),
        })
        .collect()
}

/// Head FLOPs and activation bytes of each tensor in `cuts`, from one pass over the
/// model typed at batch 1 (`input_shape`: the loaded model's input, batch first). A
/// cut the typed model does not name (tract fused it away while typing) is left out.
pub fn cut_costs(
    name: &str,
    bytes: &[u8],
    input_shape: &[i64],
    cuts: &[String],
) -> Result<Vec<CutCost>, RuntimeError> {
    let load = |cause: String| RuntimeError::Load {
        model: name.to_string(),
        cause,
    };
    let typed = crate::variants::typed_at_batch_one(name, bytes, input_shape)?;
    let wanted: HashMap<&str, usize> = cuts
        .iter()
        .enumerate()
        .map(|(i, c)| (c.as_str(), i))
        .collect();
    let mut found: Vec<Option<CutCost>> = vec![None; cuts.len()];
    let mut flops = 0u64;
    let order = typed.eval_order().map_err(|e| load(format!("{e:#}")))?;
    for id in order {
        let node = typed.node(id);
        let inputs = typed
            .node_input_facts(id)
            .map_err(|e| load(format!("{e:#}")))?;
        for (cost, count) in node.op.cost(&inputs).unwrap_or_default() {
            if matches!(cost, tract_onnx::tract_core::ops::Cost::FMA(_)) {
                flops = flops.saturating_add(2 * count.to_i64().unwrap_or(0).max(0) as u64);
            }
        }
        for slot in 0..node.outputs.len() {
            let outlet = OutletId::new(id, slot);
            let Some(index) = typed
                .outlet_label(outlet)
                .and_then(|label| wanted.get(label))
            else {
                continue;
            };
            let fact = &node.outputs[slot].fact;
            let values: u64 = fact
                .shape
                .iter()
                .map(|d| d.to_i64().unwrap_or(1).max(0) as u64)
                .product();
            found[*index] = Some(CutCost {
                tensor: cuts[*index].clone(),
                head_flops: flops,
                activation_bytes: values * fact.datum_type.size_of() as u64,
            });
        }
    }
    Ok(found.into_iter().flatten().collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn cost(tensor: &str, head_flops: u64, activation_bytes: u64) -> CutCost {
        CutCost {
            tensor: tensor.into(),
            head_flops,
            activation_bytes,
        }
    }

    #[test]
    fn few_cuts_are_all_kept() {
        let costs = vec![cost("a", 10, 500), cost("b", 20, 900)];
        let chosen = choose_cuts(&costs, 100, 100, 8);
        assert_eq!(chosen.len(), 2);
        assert!(chosen[1].reason.contains("one of the model's 2 cuts"));
    }

    #[test]
    fn dominated_and_larger_than_input_cuts_are_dropped() {
        let mut costs: Vec<CutCost> = (0..20)
            .map(|i| cost(&format!("c{i}"), 10 * i, 2_000))
            .collect();
        costs[3] = cost("small", 30, 400);
        costs[4] = cost("same-size-later", 40, 400);
        costs[10] = cost("smaller", 100, 100);
        let chosen = choose_cuts(&costs, 1_000, 200, 8);
        let names: Vec<&str> = chosen.iter().map(|c| c.cost.tensor.as_str()).collect();
        assert_eq!(names, vec!["small", "smaller"]);
        assert!(chosen[0].reason.contains("frontier of 2 cuts of 20"));
    }

    proptest! {
        #[test]
        fn the_choice_is_bounded_undominated_and_in_graph_order(
            raw in proptest::collection::vec((0u64..1_000, 1u64..5_000), 0..60),
            input_bytes in 1u64..6_000,
            max in 1usize..10,
        ) {
            let costs: Vec<CutCost> = raw
                .iter()
                .enumerate()
                .map(|(i, (f, b))| cost(&format!("t{i}"), *f, *b))
                .collect();
            let chosen = choose_cuts(&costs, input_bytes, 1_000, max);
            prop_assert!(chosen.len() <= max);
            let position = |name: &str| costs.iter().position(|c| c.tensor == name);
            let positions: Vec<Option<usize>> =
                chosen.iter().map(|c| position(&c.cost.tensor)).collect();
            prop_assert!(positions.windows(2).all(|w| w[0] < w[1]), "graph order");
            if costs.len() > max {
                for c in &chosen {
                    prop_assert!(c.cost.activation_bytes < input_bytes);
                    prop_assert!(!costs.iter().any(|o| o.head_flops <= c.cost.head_flops
                        && o.activation_bytes < c.cost.activation_bytes));
                }
                // Something on the frontier is always kept when the frontier is not empty.
                let any_below_input = costs.iter().any(|c| c.activation_bytes < input_bytes);
                prop_assert_eq!(!chosen.is_empty(), any_below_input);
            } else {
                prop_assert_eq!(chosen.len(), costs.len());
            }
        }
    }
}
