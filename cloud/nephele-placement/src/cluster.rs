//! Cluster state: what each node has left, and the reservations that took the rest.
//!
//! Invariant: for every node, capacity = left + sum of its reservations, per resource and
//! per GPU, after any sequence of `reserve`, `unreserve` and `node_lost` (property-tested
//! in `tests/properties.rs`). Reservations are keyed by id and idempotent.

use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet, HashMap};

use crate::fragmentation::TypicalPods;

use crate::model::{NodeSpec, PodRequest, Reason, MILLI_PER_GPU};

/// Where a pod goes: the node, and milli-GPU taken on each of its GPUs (by GPU index).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Binding {
    pub node: usize,
    pub gpus: Vec<(u8, u32)>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReserveError {
    /// The id is already reserved with a different binding.
    Conflict,
    /// The node cannot hold it (any more).
    DoesNotFit(Reason),
    UnknownNode,
}

#[derive(Debug, Clone)]
pub struct NodeState {
    pub cpu_left: u64,
    pub memory_left: u64,
    pub gpu_left: Vec<u32>,
    pub up: bool,
}

/// Everything that decides whether and how well a node takes a pod. Nodes with equal
/// keys are interchangeable but for their priority, so the placement loop scores each
/// distinct key once instead of each node.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct GroupKey {
    pub gpu_model: Option<u16>,
    pub up: bool,
    pub cpu_left: u64,
    pub memory_left: u64,
    pub gpu_left: Vec<u32>,
}

/// Nodes in one state, and the scores already computed for that state. A state's score
/// for a pod shape never changes, so the cache needs no invalidation: when a node's
/// state changes it simply moves to another group.
#[derive(Debug, Clone, Default)]
pub struct Group {
    /// Members ordered by (rank, node): the first one represents the group.
    pub members: BTreeSet<(u32, usize)>,
    scores: RefCell<Vec<(u32, (i64, i64))>>,
}

impl Group {
    pub(crate) fn cached_score(&self, shape: u32) -> Option<(i64, i64)> {
        self.scores
            .borrow()
            .iter()
            .find(|(id, _)| *id == shape)
            .map(|(_, score)| *score)
    }

    pub(crate) fn store_score(&self, shape: u32, score: (i64, i64)) {
        self.scores.borrow_mut().push((shape, score));
    }
}

/// Interned (pod shape, policy) pairs for the score cache, valid for one target workload.
#[derive(Debug, Clone, Default)]
struct ShapeTable {
    typical: Option<TypicalPods>,
    ids: HashMap<(PodRequest, u8), u32>,
}

#[derive(Debug, Clone)]
pub struct Cluster {
    pub nodes: Vec<NodeSpec>,
    /// Read freely; change only through the methods, which keep `groups` in step.
    pub state: Vec<NodeState>,
    reservations: BTreeMap<u64, (PodRequest, Binding)>,
    /// Tie-break rank of each node (lower wins); by default the node index.
    rank: Vec<u32>,
    /// Nodes by state.
    groups: HashMap<GroupKey, Group>,
    shapes: RefCell<ShapeTable>,
}

impl Cluster {
    pub fn new(nodes: Vec<NodeSpec>) -> Cluster {
        let state = nodes
            .iter()
            .map(|n| NodeState {
                cpu_left: n.cpu_milli,
                memory_left: n.memory_mib,
                gpu_left: vec![MILLI_PER_GPU; usize::from(n.gpus)],
                up: true,
            })
            .collect();
        let rank = (0..nodes.len() as u32).collect();
        let mut cluster = Cluster {
            nodes,
            state,
            reservations: BTreeMap::new(),
            rank,
            groups: HashMap::new(),
            shapes: RefCell::new(ShapeTable::default()),
        };
        cluster.rebuild_groups();
        cluster
    }

    fn key(&self, node: usize) -> GroupKey {
        let state = &self.state[node];
        GroupKey {
            gpu_model: self.nodes[node].gpu_model,
            up: state.up,
            cpu_left: state.cpu_left,
            memory_left: state.memory_left,
            gpu_left: state.gpu_left.clone(),
        }
    }

    fn rebuild_groups(&mut self) {
        self.groups.clear();
        for node in 0..self.nodes.len() {
            let key = self.key(node);
            self.groups
                .entry(key)
                .or_default()
                .members
                .insert((self.rank[node], node));
        }
    }

    /// Moves `node` to the group of its current state; `old` is its key before the change.
    fn regroup(&mut self, node: usize, old: GroupKey) {
        let member = (self.rank[node], node);
        if let Some(group) = self.groups.get_mut(&old) {
            group.members.remove(&member);
            if group.members.is_empty() {
                self.groups.remove(&old);
            }
        }
        let key = self.key(node);
        self.groups.entry(key).or_default().members.insert(member);
    }

    /// Sets the tie-break priority (a rank per node, lower wins).
    pub fn set_priority(&mut self, rank: &[u32]) {
        if rank.len() == self.nodes.len() && rank != self.rank.as_slice() {
            self.rank = rank.to_vec();
            self.rebuild_groups();
        }
    }

    pub fn priority(&self) -> &[u32] {
        &self.rank
    }

    /// Distinct node states, each with its members in (rank, node) order.
    pub fn groups(&self) -> impl Iterator<Item = (&GroupKey, &Group)> {
        self.groups.iter()
    }

    /// The score-cache id of (pod shape, policy code) under `typical`. A different
    /// target workload than last time empties the cache first.
    pub(crate) fn shape_id(&self, pod: &PodRequest, policy_code: u8, typical: &TypicalPods) -> u32 {
        let mut shapes = self.shapes.borrow_mut();
        if shapes.typical.as_ref() != Some(typical) {
            shapes.typical = Some(typical.clone());
            shapes.ids.clear();
            for group in self.groups.values() {
                group.scores.borrow_mut().clear();
            }
        }
        let next = shapes.ids.len() as u32;
        *shapes.ids.entry((pod.clone(), policy_code)).or_insert(next)
    }

    /// Marks a node available or not without touching its reservations (for scratch
    /// copies that must keep work off some nodes).
    pub fn set_available(&mut self, node: usize, up: bool) {
        if node < self.nodes.len() && self.state[node].up != up {
            let old = self.key(node);
            self.state[node].up = up;
            self.regroup(node, old);
        }
    }

    pub fn total_gpu_milli(&self) -> u64 {
        self.nodes
            .iter()
            .map(|n| u64::from(n.gpus) * u64::from(MILLI_PER_GPU))
            .sum()
    }

    pub fn used_gpu_milli(&self) -> u64 {
        self.reservations
            .values()
            .flat_map(|(_, b)| b.gpus.iter().map(|(_, m)| u64::from(*m)))
            .sum()
    }

    /// Why `node` cannot take `pod` now, if it cannot. Cheap checks first.
    pub fn check(&self, node: usize, pod: &PodRequest) -> Result<(), Reason> {
        let spec = &self.nodes[node];
        let state = &self.state[node];
        if !state.up {
            return Err(Reason::NodeDown);
        }
        if state.cpu_left < pod.cpu_milli {
            return Err(Reason::InsufficientCpu);
        }
        if state.memory_left < pod.memory_mib {
            return Err(Reason::InsufficientMemory);
        }
        if pod.num_gpu == 0 {
            return Ok(());
        }
        if spec.gpus == 0 {
            return Err(Reason::NoGpu);
        }
        if !pod.accepts_model(spec.gpu_model) {
            return Err(Reason::GpuModelMismatch);
        }
        let fitting = state
            .gpu_left
            .iter()
            .filter(|left| **left >= pod.gpu_milli)
            .count();
        if fitting < usize::from(pod.num_gpu) {
            return Err(Reason::InsufficientGpu);
        }
        Ok(())
    }

    /// Takes resources for reservation `id`. Re-reserving the same id with the same
    /// binding is a no-op; with another binding it is a conflict.
    pub fn reserve(
        &mut self,
        id: u64,
        pod: &PodRequest,
        binding: &Binding,
    ) -> Result<(), ReserveError> {
        if let Some((_, existing)) = self.reservations.get(&id) {
            return if existing == binding {
                Ok(())
            } else {
                Err(ReserveError::Conflict)
            };
        }
        if binding.node >= self.nodes.len() {
            return Err(ReserveError::UnknownNode);
        }
        self.check(binding.node, pod)
            .map_err(ReserveError::DoesNotFit)?;
        let state = &self.state[binding.node];
        // The binding must name exactly num_gpu distinct GPUs, each with room.
        let mut seen = Vec::new();
        for (gpu, milli) in &binding.gpus {
            let left = state.gpu_left.get(usize::from(*gpu)).copied();
            if *milli != pod.gpu_milli
                || seen.contains(gpu)
                || left.is_none_or(|left| left < *milli)
            {
                return Err(ReserveError::DoesNotFit(Reason::InsufficientGpu));
            }
            seen.push(*gpu);
        }
        if seen.len() != usize::from(pod.num_gpu) {
            return Err(ReserveError::DoesNotFit(Reason::InsufficientGpu));
        }
        let old = self.key(binding.node);
        let state = &mut self.state[binding.node];
        state.cpu_left -= pod.cpu_milli;
        state.memory_left -= pod.memory_mib;
        for (gpu, milli) in &binding.gpus {
            state.gpu_left[usize::from(*gpu)] -= milli;
        }
        self.regroup(binding.node, old);
        self.reservations.insert(id, (pod.clone(), binding.clone()));
        Ok(())
    }

    /// Gives back what reservation `id` took. Returns whether it existed.
    pub fn unreserve(&mut self, id: u64) -> bool {
        let Some((pod, binding)) = self.reservations.remove(&id) else {
            return false;
        };
        let old = self.key(binding.node);
        let state = &mut self.state[binding.node];
        state.cpu_left += pod.cpu_milli;
        state.memory_left += pod.memory_mib;
        for (gpu, milli) in &binding.gpus {
            state.gpu_left[usize::from(*gpu)] += milli;
        }
        self.regroup(binding.node, old);
        true
    }

    /// Marks a node down and releases its reservations; returns their ids (the work to
    /// place again).
    pub fn node_lost(&mut self, node: usize) -> Vec<u64> {
        let displaced: Vec<u64> = self
            .reservations
            .iter()
            .filter(|(_, (_, b))| b.node == node)
            .map(|(id, _)| *id)
            .collect();
        for id in &displaced {
            self.unreserve(*id);
        }
        self.set_available(node, false);
        displaced
    }

    pub fn node_up(&mut self, node: usize) {
        self.set_available(node, true);
    }

    pub fn reservations(&self) -> impl Iterator<Item = (&u64, &(PodRequest, Binding))> {
        self.reservations.iter()
    }

    /// Checks the accounting invariant (and that every node is in the group of its
    /// state); used by tests and debug assertions.
    pub fn accounting_holds(&self) -> bool {
        let grouped: usize = self.groups.values().map(|g| g.members.len()).sum();
        let groups_ok = grouped == self.nodes.len()
            && (0..self.nodes.len()).all(|node| {
                self.groups
                    .get(&self.key(node))
                    .is_some_and(|group| group.members.contains(&(self.rank[node], node)))
            });
        groups_ok
            && self.nodes.iter().enumerate().all(|(idx, spec)| {
                let mut cpu = self.state[idx].cpu_left;
                let mut memory = self.state[idx].memory_left;
                let mut gpus: Vec<u64> = self.state[idx]
                    .gpu_left
                    .iter()
                    .map(|g| u64::from(*g))
                    .collect();
                for (pod, binding) in self.reservations.values().filter(|(_, b)| b.node == idx) {
                    cpu += pod.cpu_milli;
                    memory += pod.memory_mib;
                    for (gpu, milli) in &binding.gpus {
                        gpus[usize::from(*gpu)] += u64::from(*milli);
                    }
                }
                cpu == spec.cpu_milli
                    && memory == spec.memory_mib
                    && gpus.iter().all(|g| *g == u64::from(MILLI_PER_GPU))
            })
    }
}
