//! Gangs: a job of N members is placed entirely or not at all.
//!
//! Members are placed one after another, each reserved before the next is placed so it
//! sees its predecessors; if a member finds no place, every member reserved so far is
//! released before returning. The call is the unit of atomicity (the cluster is
//! single-writer, `&mut`), so nobody observes a partial gang, and a failure leaves the
//! cluster's capacity exactly as it was. Placing a gang whose members are already
//! reserved returns their bindings (idempotent).
//!
//! Topology: `Topology::SameNode` as a hard constraint restricts every member to the
//! node of the first; as a soft preference the members are tried on that node first.

use std::collections::BTreeMap;

use crate::cluster::{Binding, Cluster};
use crate::fragmentation::TypicalPods;
use crate::model::{PodRequest, Reason};
use crate::policy::{place, place_on, Policy, Unschedulable};
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
    let ids = gang.first_id..gang.first_id + gang.members.len() as u64;
    let existing: BTreeMap<u64, Binding> = ids
        .filter_map(|id| Some((id, cluster.reservation(id)?.1.clone())))
        .collect();
    if !existing.is_empty() {
        // Already placed (a retried call): the whole gang is there, or the ids clash
        // with something else.
        return if existing.len() == gang.members.len() {
            Ok(existing.into_values().collect())
        } else {
            Err(Unschedulable {
                rejected: BTreeMap::from([(Reason::InsufficientGpu, 0)]),
            })
        };
    }
    let mut bindings: Vec<Binding> = Vec::with_capacity(gang.members.len());
    for (offset, member) in gang.members.iter().enumerate() {
        let anchor = bindings.first().map(|b| b.node);
        let placement = match (gang.topology, anchor) {
            (Topology::SameNode { hard }, Some(node)) => {
                match place_on(cluster, node, member, policy, typical) {
                    Err(why) if hard => Err(why),
                    Err(_) => place(cluster, member, policy, typical, priority, rng),
                    ok => ok,
                }
            }
            _ => place(cluster, member, policy, typical, priority, rng),
        };
        let reserved = placement.and_then(|placement| {
            cluster
                .reserve(gang.first_id + offset as u64, member, &placement.binding)
                .map(|()| placement.binding)
                .map_err(|_| Unschedulable {
                    rejected: BTreeMap::from([(Reason::InsufficientGpu, 1)]),
                })
        });
        match reserved {
            Ok(binding) => bindings.push(binding),
            Err(why) => {
                for done in 0..offset {
                    cluster.unreserve(gang.first_id + done as u64);
                }
                return Err(why);
            }
        }
    }
    Ok(bindings)
}
