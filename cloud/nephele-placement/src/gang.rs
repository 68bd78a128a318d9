//! Gangs: a job of N members is placed entirely or not at all.
//!
//! Members are placed one after another, each reserved before the next is placed so it
//! sees its predecessors; if a member finds no place, every member reserved so far is
//! released before returning. The call is the unit of atomicity (the cluster is
//! single-writer, `&mut`), so nobody observes a partial gang, and a failure leaves the
//! cluster's capacity exactly as it was. Placing a gang whose members are already
//! reserved returns their bindings (idempotent).
//!
//! Topology: `Topology::SameNode` as a hard constraint puts every member on one node; as
//! a soft preference the members are tried on one node first. That node is where the
//! policy places the gang as a whole when its members can be summed into one request
//! exactly ([`whole_gang`]: alike but for CPU, memory and whole GPUs), so the gang goes
//! where it fits whole, not where its first member fits best (a packing policy's
//! choice for one GPU is often a node with little else free); otherwise it is the
//! first member's node.

use std::collections::BTreeMap;

use crate::cluster::{Binding, Cluster};
use crate::fragmentation::TypicalPods;
use crate::model::{PodRequest, Reason, MILLI_PER_GPU};
use crate::policy::{place, place_on, try_place, Policy, Unschedulable};
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
    let whole = match (gang.topology, whole_gang(&gang.members)) {
        (Topology::SameNode { hard: true }, Some(whole)) => {
            // No node holds them all: the reasons are the whole gang's.
            Some(
                place(cluster, &whole, policy, typical, priority, rng)?
                    .binding
                    .node,
            )
        }
        // A preference: where it fits whole if anywhere (no reasons needed), else as
        // the first member goes.
        (Topology::SameNode { hard: false }, Some(whole)) => {
            try_place(cluster, &whole, policy, typical, priority, rng).map(|p| p.binding.node)
        }
        _ => None,
    };
    let mut bindings: Vec<Binding> = Vec::with_capacity(gang.members.len());
    for (offset, member) in gang.members.iter().enumerate() {
        let anchor = whole.or_else(|| bindings.first().map(|b| b.node));
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

/// One request standing for all of a same-node gang's members together, when summing
/// them is exact: every member alike but for CPU, memory and how many whole GPUs it
/// takes (no GPU shares, MIG slices, multi-GPU NVLink terms, spread or anti-affinity,
/// which a sum would not mean). A node can take it exactly when the members fit on
/// that node one after another.
fn whole_gang(members: &[PodRequest]) -> Option<PodRequest> {
    let first = members.first()?;
    let alike = |m: &PodRequest| {
        m.gpu_models == first.gpu_models
            && m.node_selector == first.node_selector
            && m.tolerations == first.tolerations
            && m.spot_ok == first.spot_ok
            && m.data_location == first.data_location
            && m.runtime_minutes == first.runtime_minutes
            && m.checkpoint_minutes == first.checkpoint_minutes
    };
    let summable = |m: &PodRequest| {
        m.mig_profile.is_none()
            && m.spread.is_none()
            && m.anti_affinity.is_none()
            && !(m.same_nvlink && m.num_gpu > 1)
            && (m.num_gpu == 0 || m.gpu_milli == MILLI_PER_GPU)
    };
    if members.len() < 2 || !members.iter().all(|m| alike(m) && summable(m)) {
        return None;
    }
    let num_gpu: u32 = members.iter().map(|m| u32::from(m.num_gpu)).sum();
    Some(PodRequest {
        cpu_milli: members.iter().map(|m| m.cpu_milli).sum(),
        memory_mib: members.iter().map(|m| m.memory_mib).sum(),
        num_gpu: u8::try_from(num_gpu).ok()?,
        gpu_milli: if num_gpu > 0 { MILLI_PER_GPU } else { 0 },
        same_nvlink: false,
        ..first.clone()
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::NodeSpec;

    fn node(name: &str) -> NodeSpec {
        NodeSpec {
            name: name.into(),
            cpu_milli: 64_000,
            memory_mib: 262_144,
            gpus: 8,
            gpu_model: Some(0),
            ..NodeSpec::default()
        }
    }

    fn gpu_pod() -> PodRequest {
        PodRequest {
            cpu_milli: 4_000,
            memory_mib: 8_192,
            num_gpu: 1,
            gpu_milli: 1000,
            ..PodRequest::default()
        }
    }

    /// Node 0 with `used` of its 8 GPUs taken, node 1 empty.
    fn cluster(used: u64) -> Cluster {
        let mut cluster = Cluster::new(vec![node("part"), node("free")]);
        for id in 0..used {
            let binding = Binding {
                node: 0,
                gpus: vec![(id as u8, 1000)],
                mig: None,
            };
            cluster.reserve(100 + id, &gpu_pod(), &binding).unwrap();
        }
        cluster
    }

    fn gang(members: usize, hard: bool) -> GangRequest {
        GangRequest {
            first_id: 1,
            members: vec![gpu_pod(); members],
            topology: Topology::SameNode { hard },
        }
    }

    fn place(
        cluster: &mut Cluster,
        gang: &GangRequest,
        policy: Policy,
    ) -> Result<Vec<Binding>, Unschedulable> {
        let priority = cluster.shared_priority();
        place_gang(
            cluster,
            gang,
            policy,
            &TypicalPods::default(),
            &priority,
            &mut Rng::new(1),
        )
    }

    #[test]
    fn a_same_node_gang_goes_where_it_fits_whole_not_where_its_first_member_fits_best() {
        // Every policy but random prefers the fuller node for one GPU, which holds 2 of
        // the 3 members; the empty node holds them all.
        for policy in Policy::DETERMINISTIC {
            for hard in [true, false] {
                let mut cluster = cluster(6);
                let placed = place(&mut cluster, &gang(3, hard), policy)
                    .unwrap_or_else(|why| panic!("{policy:?} hard={hard}: {why}"));
                assert!(
                    placed.iter().all(|b| b.node == 1),
                    "{policy:?} hard={hard}: {placed:?}"
                );
                assert!(cluster.accounting_holds());
            }
        }
    }

    #[test]
    fn a_gang_no_node_holds_whole_fails_when_hard_and_spreads_when_soft() {
        for policy in Policy::DETERMINISTIC {
            let mut cluster = cluster(6);
            let why = place(&mut cluster, &gang(9, true), policy).unwrap_err();
            assert!(why.nodes() > 0, "{policy:?}: says which nodes refused");
            assert!(
                cluster.reservation(1).is_none(),
                "nothing of it is left behind"
            );
            let placed = place(&mut cluster, &gang(9, false), policy).unwrap();
            assert_eq!(placed.len(), 9, "{policy:?}");
            assert!(placed.iter().any(|b| b.node == 0) && placed.iter().any(|b| b.node == 1));
        }
    }

    #[test]
    fn members_that_differ_in_more_than_size_are_placed_as_before() {
        let mut cluster = cluster(0);
        let mut picky = gpu_pod();
        picky.node_selector.insert("zone".into(), "a".into());
        let gang = GangRequest {
            first_id: 1,
            members: vec![gpu_pod(), picky],
            topology: Topology::SameNode { hard: true },
        };
        let why = place(&mut cluster, &gang, Policy::Fgd).unwrap_err();
        assert!(
            why.rejected.contains_key(&Reason::NodeSelectorMismatch),
            "{why}"
        );
    }
}
