//! Gangs: a job of N members is placed entirely or not at all.
//!
//! Members are placed one after another on a scratch copy of the cluster, each seeing
//! the reservations of the members before it; only when every member has a place are
//! the reservations committed to the real cluster. A failure leaves the cluster exactly
//! as it was: no partial reservation is ever left behind.
//!
//! Topology: `Topology::SameNode` as a hard constraint restricts every member to the
//! node of the first; as a soft preference the members are tried on that node first.

use std::collections::BTreeMap;

use crate::cluster::{Binding, Cluster};
use crate::fragmentation::TypicalPods;
use crate::model::{PodRequest, Reason};
use crate::policy::{place, Policy, Unschedulable};
use crate::rng::Rng;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Topology {
    /// Members may go anywhere.
    Any,
    /// All members on one node (one NVLink domain).
    SameNode { hard: bool },
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GangRequest {
    /// Reservation id of the first member; member `i` uses `first_id + i`.
    pub first_id: u64,
    pub members: Vec<PodRequest>,
    pub topology: Topology,
}

/// Places all members or none. On success the reservations are committed to `cluster`
/// and the bindings returned in member order.
pub fn place_gang(
    cluster: &mut Cluster,
    gang: &GangRequest,
    policy: Policy,
    typical: &TypicalPods,
    priority: &[u32],
    rng: &mut Rng,
) -> Result<Vec<Binding>, Unschedulable> {
    let mut scratch = cluster.clone();
    let mut bindings: Vec<Binding> = Vec::with_capacity(gang.members.len());
    for (offset, member) in gang.members.iter().enumerate() {
        let anchor = bindings.first().map(|b| b.node);
        // Restrict the choice by priority: with a same-node topology the anchor node
        // comes first (soft) or is the only candidate (hard).
        let member_priority: Vec<u32> = match (gang.topology, anchor) {
            (Topology::SameNode { .. }, Some(node)) => priority
                .iter()
                .enumerate()
                .map(|(idx, rank)| {
                    if idx == node {
                        0
                    } else {
                        rank.saturating_add(1)
                    }
                })
                .collect(),
            _ => priority.to_vec(),
        };
        let placement = match (gang.topology, anchor) {
            (Topology::SameNode { hard: true }, Some(node)) => match scratch.check(node, member) {
                Ok(()) => {
                    let mut only = scratch.clone();
                    for other in 0..only.nodes.len() {
                        if other != node {
                            only.set_available(other, false);
                        }
                    }
                    place(&only, member, policy, typical, &member_priority, rng)
                }
                Err(reason) => Err(Unschedulable {
                    rejected: BTreeMap::from([(reason, 1)]),
                }),
            },
            (Topology::SameNode { hard: false }, Some(node))
                if scratch.check(node, member).is_ok() =>
            {
                let mut only = scratch.clone();
                for other in 0..only.nodes.len() {
                    if other != node {
                        only.set_available(other, false);
                    }
                }
                place(&only, member, policy, typical, &member_priority, rng)
            }
            _ => place(&scratch, member, policy, typical, &member_priority, rng),
        };
        let placement = placement?;
        scratch
            .reserve(gang.first_id + offset as u64, member, &placement.binding)
            .map_err(|_| Unschedulable {
                rejected: BTreeMap::from([(Reason::InsufficientGpu, 1)]),
            })?;
        bindings.push(placement.binding);
    }
    *cluster = scratch;
    Ok(bindings)
}
