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
//! first member's node, and a gang the first member's node cannot hold whole is then
//! tried on the other nodes that might, in the policy's order for that member; a soft
//! one spills member by member only when none of them holds it.

use std::collections::BTreeMap;

use crate::cluster::{Binding, Cluster};
use crate::fragmentation::TypicalPods;
use crate::model::{PodRequest, Reason, MILLI_PER_GPU};
use crate::policy::{place, place_on, ranked_nodes, try_place, Policy, Unschedulable};
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
    let args = (policy, typical, priority);
    let topology = gang.topology;
    match (topology, whole_gang(&gang.members)) {
        (Topology::SameNode { hard: true }, Some(whole)) => {
            // No node holds them all: the reasons are the whole gang's.
            let node = place(cluster, &whole, policy, typical, priority, rng)?
                .binding
                .node;
            reserve_members(cluster, gang, topology, args, rng, Some(node))
        }
        // A preference: where it fits whole if anywhere (no reasons needed), else as
        // the first member goes.
        (Topology::SameNode { hard: false }, Some(whole)) => {
            let node =
                try_place(cluster, &whole, policy, typical, priority, rng).map(|p| p.binding.node);
            reserve_members(cluster, gang, topology, args, rng, node)
        }
        // Members that cannot be summed go where the first of them fits best; when the
        // rest do not fit there, another node may hold them all. A preference spills
        // member by member only when no node does.
        (Topology::SameNode { hard }, None) if gang.members.len() > 1 => {
            let one_node = Topology::SameNode { hard: true };
            reserve_members(cluster, gang, one_node, args, rng, None)
                .or_else(|why| place_whole_elsewhere(cluster, gang, args, rng).ok_or(why))
                .or_else(|why| {
                    if hard {
                        Err(why)
                    } else {
                        reserve_members(cluster, gang, topology, args, rng, None)
                    }
                })
        }
        _ => reserve_members(cluster, gang, topology, args, rng, None),
    }
}

/// What every placement of a member takes besides the cluster and the random source.
type Args<'a> = (Policy, &'a TypicalPods, &'a [u32]);

/// Reserves the members one after another, each on `anchor` when given (else on the
/// first member's node for a same-node gang, where the policy puts it otherwise);
/// releases what it reserved when one fails.
fn reserve_members(
    cluster: &mut Cluster,
    gang: &GangRequest,
    topology: Topology,
    (policy, typical, priority): Args,
    rng: &mut Rng,
    anchor: Option<usize>,
) -> Result<Vec<Binding>, Unschedulable> {
    let mut bindings: Vec<Binding> = Vec::with_capacity(gang.members.len());
    for (offset, member) in gang.members.iter().enumerate() {
        let anchor = anchor.or_else(|| bindings.first().map(|b| b.node));
        let placement = match (topology, anchor) {
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

/// A same-node gang whose members cannot be summed, not held by the node its first
/// member went to: tried whole on each node that could hold it, best first for that
/// member under the policy, until one takes every member. Nodes in one state take the gang alike, so one
/// of each group is tried (every node when a member's anti-affinity or spread tells
/// nodes apart, or the caller ranks them otherwise), and only where the members' CPU,
/// memory and GPU share together fit: O(groups) checks, only when the first node fails.
fn place_whole_elsewhere(
    cluster: &mut Cluster,
    gang: &GangRequest,
    args: Args,
    rng: &mut Rng,
) -> Option<Vec<Binding>> {
    let (policy, typical, priority) = args;
    let first = gang.members.first()?;
    let cpu: u64 = gang.members.iter().map(|m| m.cpu_milli).sum();
    let memory: u64 = gang.members.iter().map(|m| m.memory_mib).sum();
    let gpu_milli: u64 = gang
        .members
        .iter()
        .filter(|m| m.mig_profile.is_none())
        .map(|m| u64::from(m.num_gpu) * u64::from(m.gpu_milli))
        .sum();
    let roomy = |node: &usize| {
        let state = &cluster.state[*node];
        state.up
            && state.cpu_left >= cpu
            && state.memory_left >= memory
            && state.gpu_left.iter().map(|g| u64::from(*g)).sum::<u64>() >= gpu_milli
    };
    let node_by_node = !cluster.is_own_priority(priority)
        || gang
            .members
            .iter()
            .any(|m| m.anti_affinity.is_some() || m.spread.is_some());
    let candidates: Vec<usize> = if node_by_node {
        (0..cluster.nodes.len()).filter(roomy).collect()
    } else {
        cluster
            .groups()
            .filter_map(|group| group.first().map(|(_, node)| node))
            .filter(roomy)
            .collect()
    };
    let order = ranked_nodes(cluster, candidates, first, policy, typical, priority);
    let hard = Topology::SameNode { hard: true };
    order
        .into_iter()
        .find_map(|node| reserve_members(cluster, gang, hard, args, rng, Some(node)).ok())
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

    /// Half a GPU, then three whole ones: packing policies put the half on the fuller
    /// node, whose two free GPUs cannot then take the second member's three.
    fn unlike_gang(hard: bool) -> GangRequest {
        let mut half = gpu_pod();
        half.gpu_milli = 500;
        let mut three = gpu_pod();
        three.num_gpu = 3;
        GangRequest {
            first_id: 1,
            members: vec![half, three],
            topology: Topology::SameNode { hard },
        }
    }

    /// `cluster(used)` with `gpus` whole GPUs of node 1 taken too.
    fn cluster_with_node_1_using(used: u64, gpus: u8) -> Cluster {
        let mut cluster = cluster(used);
        let mut pod = gpu_pod();
        pod.num_gpu = gpus;
        let binding = Binding {
            node: 1,
            gpus: (0..gpus).map(|g| (g, 1000)).collect(),
            mig: None,
        };
        cluster.reserve(50, &pod, &binding).unwrap();
        cluster
    }

    /// Node 0 with 6 GPUs taken, node 1 empty: the empty node takes the whole gang.
    fn lands_on_the_empty_node(gang: &GangRequest, policy: Policy) {
        let mut roomy = cluster(6);
        let placed =
            place(&mut roomy, gang, policy).unwrap_or_else(|why| panic!("{policy:?}: {why}"));
        assert!(placed.iter().all(|b| b.node == 1), "{policy:?}: {placed:?}");
        assert!(roomy.accounting_holds());
    }

    #[test]
    fn a_hard_gang_of_unlike_members_goes_where_all_fit_not_where_the_first_fits_best() {
        let gang = unlike_gang(true);
        for policy in Policy::DETERMINISTIC {
            lands_on_the_empty_node(&gang, policy);
            // With the empty node also partly taken, no node holds both: refused, and
            // nothing is left behind.
            let mut cluster = cluster_with_node_1_using(6, 6);
            assert!(place(&mut cluster, &gang, policy).is_err(), "{policy:?}");
            assert!(cluster.reservation(1).is_none() && cluster.reservation(2).is_none());
            assert!(cluster.accounting_holds());
        }
    }

    #[test]
    fn a_soft_gang_of_unlike_members_spills_only_when_no_node_holds_it() {
        let gang = unlike_gang(false);
        for policy in Policy::DETERMINISTIC {
            lands_on_the_empty_node(&gang, policy);
            // One GPU free on node 0, two on node 1: three GPUs fit nowhere, refused.
            let mut tight = cluster_with_node_1_using(7, 6);
            assert!(place(&mut tight, &gang, policy).is_err(), "{policy:?}");
            assert!(tight.accounting_holds());
            // Three free on each node: neither takes both, so they go apart rather
            // than be refused.
            let mut apart = cluster_with_node_1_using(5, 5);
            let placed =
                place(&mut apart, &gang, policy).unwrap_or_else(|why| panic!("{policy:?}: {why}"));
            assert_eq!(placed.len(), 2);
            assert_ne!(placed[0].node, placed[1].node, "{policy:?}");
            assert!(apart.accounting_holds());
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
