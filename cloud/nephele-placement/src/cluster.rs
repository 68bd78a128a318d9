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

/// Index of a group slot; slots are reused, so a slot is identified over time by
/// (id, generation).
pub type GroupId = u32;

/// Nodes in one state.
#[derive(Debug, Clone)]
pub struct Group {
    pub key: GroupKey,
    /// Members ordered by (rank, node): the first one represents the group.
    pub members: BTreeSet<(u32, usize)>,
    /// Bumped whenever the slot is given to a new key: a score computed for
    /// (slot, generation) stays valid until then.
    generation: u64,
}

impl Group {
    /// The representative: the member with the lowest rank.
    pub fn first(&self) -> Option<(u32, usize)> {
        self.members.first().copied()
    }
}

/// A score key: compared lexicographically, higher is better.
pub type Score = (i64, i64);

/// For one (pod shape, policy): the feasible groups ordered best first, kept in step
/// with the cluster lazily by replaying the log of changed groups. Because a group's
/// score for a shape depends only on its state, a decision costs O(changes since this
/// shape was last placed · log groups), not O(groups).
#[derive(Debug, Clone, Default)]
struct ShapeIndex {
    /// Absolute log position this index has applied.
    synced: u64,
    /// (score reversed, representative rank, group): the first entry is the choice.
    order: BTreeSet<(std::cmp::Reverse<Score>, u32, GroupId)>,
    /// What `order` holds for each group: its generation, and the score and rank
    /// (`None` when the group cannot take the shape).
    entries: HashMap<GroupId, (u64, Option<(Score, u32)>)>,
}

/// Interned (pod shape, policy) pairs and their indexes, valid for one target workload.
#[derive(Debug, Clone, Default)]
struct ShapeTable {
    typical: Option<TypicalPods>,
    ids: HashMap<(PodRequest, u8), u32>,
    indexes: Vec<ShapeIndex>,
}

/// Groups that changed (members, representative, or their slot's key), in order.
#[derive(Debug, Clone, Default)]
struct ChangeLog {
    /// Absolute position of `changed[0]`.
    base: u64,
    changed: Vec<GroupId>,
}

impl ChangeLog {
    fn end(&self) -> u64 {
        self.base + self.changed.len() as u64
    }
}

#[derive(Debug, Clone)]
pub struct Cluster {
    pub nodes: Vec<NodeSpec>,
    /// Read freely; change only through the methods, which keep `groups` in step.
    pub state: Vec<NodeState>,
    reservations: BTreeMap<u64, (PodRequest, Binding)>,
    /// Tie-break rank of each node (lower wins); by default the node index.
    rank: Vec<u32>,
    /// Nodes by state: slots, the slot of each live key, free slots.
    groups: Vec<Option<Group>>,
    by_key: HashMap<GroupKey, GroupId>,
    free_slots: Vec<GroupId>,
    generations: u64,
    log: ChangeLog,
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
            groups: Vec::new(),
            by_key: HashMap::new(),
            free_slots: Vec::new(),
            generations: 0,
            log: ChangeLog::default(),
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

    /// Regroups every node from scratch; every index starts over.
    fn rebuild_groups(&mut self) {
        self.groups.clear();
        self.by_key.clear();
        self.free_slots.clear();
        self.log = ChangeLog::default();
        {
            let mut shapes = self.shapes.borrow_mut();
            shapes.ids.clear();
            shapes.indexes.clear();
        }
        for node in 0..self.nodes.len() {
            let key = self.key(node);
            self.join_group(node, key);
        }
    }

    /// Puts `node` into the group of `key`, creating it if needed; logs the change.
    fn join_group(&mut self, node: usize, key: GroupKey) {
        let member = (self.rank[node], node);
        let id = match self.by_key.get(&key) {
            Some(id) => *id,
            None => {
                self.generations += 1;
                let group = Group {
                    key: key.clone(),
                    members: BTreeSet::new(),
                    generation: self.generations,
                };
                let id = match self.free_slots.pop() {
                    Some(id) => {
                        self.groups[id as usize] = Some(group);
                        id
                    }
                    None => {
                        self.groups.push(Some(group));
                        (self.groups.len() - 1) as GroupId
                    }
                };
                self.by_key.insert(key, id);
                id
            }
        };
        if let Some(group) = self.groups[id as usize].as_mut() {
            group.members.insert(member);
        }
        self.log_change(id);
    }

    fn log_change(&mut self, id: GroupId) {
        self.log.changed.push(id);
        // Bound the log: past a few times the number of groups, replaying it costs
        // more than rescanning, so drop it and let indexes rescan.
        if self.log.changed.len() > 4 * self.by_key.len() + 1024 {
            self.log.base = self.log.end();
            self.log.changed.clear();
        }
    }

    /// Moves `node` to the group of its current state; `old` is its key before the change.
    fn regroup(&mut self, node: usize, old: GroupKey) {
        let member = (self.rank[node], node);
        if let Some(&id) = self.by_key.get(&old) {
            let mut emptied = false;
            if let Some(group) = self.groups[id as usize].as_mut() {
                group.members.remove(&member);
                emptied = group.members.is_empty();
            }
            if emptied {
                self.groups[id as usize] = None;
                self.by_key.remove(&old);
                self.free_slots.push(id);
            }
            self.log_change(id);
        }
        let key = self.key(node);
        self.join_group(node, key);
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
    pub fn groups(&self) -> impl Iterator<Item = &Group> {
        self.groups.iter().flatten()
    }

    /// The index id of (pod shape, policy code) under `typical`. A different target
    /// workload than last time empties every index first.
    pub(crate) fn shape_id(&self, pod: &PodRequest, policy_code: u8, typical: &TypicalPods) -> u32 {
        let mut shapes = self.shapes.borrow_mut();
        if shapes.typical.as_ref() != Some(typical) {
            shapes.typical = Some(typical.clone());
            shapes.ids.clear();
            shapes.indexes.clear();
        }
        let next = shapes.ids.len() as u32;
        let id = *shapes.ids.entry((pod.clone(), policy_code)).or_insert(next);
        if id as usize == shapes.indexes.len() {
            shapes.indexes.push(ShapeIndex {
                synced: u64::MAX,
                ..ShapeIndex::default()
            });
        }
        id
    }

    /// The best group for shape `shape`: brings its index up to date, calling `score`
    /// (on a group's representative node; `None` = cannot take it) only for groups
    /// that are new since the index last saw them, then returns the best entry's
    /// representative node. Ties in score go to the lower rank.
    pub(crate) fn best_for_shape(
        &self,
        shape: u32,
        mut score: impl FnMut(usize) -> Option<Score>,
    ) -> Option<(Score, usize)> {
        let mut shapes = self.shapes.borrow_mut();
        let index = shapes.indexes.get_mut(shape as usize)?;
        let mut update = |index: &mut ShapeIndex, id: GroupId| {
            let live = self.groups.get(id as usize).and_then(Option::as_ref);
            let previous = index.entries.get(&id).copied();
            if let Some((_, Some((old_score, old_rank)))) = previous {
                index
                    .order
                    .remove(&(std::cmp::Reverse(old_score), old_rank, id));
            }
            let Some(group) = live else {
                index.entries.remove(&id);
                return;
            };
            let Some((rank, node)) = group.first() else {
                index.entries.remove(&id);
                return;
            };
            let scored = match previous {
                Some((generation, entry)) if generation == group.generation => {
                    entry.map(|(s, _)| s)
                }
                _ => score(node),
            };
            if let Some(value) = scored {
                index.order.insert((std::cmp::Reverse(value), rank, id));
            }
            index
                .entries
                .insert(id, (group.generation, scored.map(|value| (value, rank))));
        };
        if index.synced < self.log.base || index.synced > self.log.end() {
            // New, or too far behind the log: rescan every slot. Scores of groups it
            // already knows (same generation) are kept; `update` drops dead slots.
            index.order.clear();
            for id in 0..self.groups.len() as GroupId {
                update(index, id);
            }
        } else {
            let from = (index.synced - self.log.base) as usize;
            for &id in &self.log.changed[from..] {
                update(index, id);
            }
        }
        index.synced = self.log.end();
        index
            .order
            .first()
            .and_then(|(std::cmp::Reverse(value), _, id)| {
                let group = self.groups.get(*id as usize)?.as_ref()?;
                Some((*value, group.first()?.1))
            })
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

    /// Reservation `id`, if held.
    pub fn reservation(&self, id: u64) -> Option<&(PodRequest, Binding)> {
        self.reservations.get(&id)
    }

    pub fn reservations(&self) -> impl Iterator<Item = (&u64, &(PodRequest, Binding))> {
        self.reservations.iter()
    }

    /// Checks the accounting invariant (and that every node is in the group of its
    /// state); used by tests and debug assertions.
    pub fn accounting_holds(&self) -> bool {
        let grouped: usize = self.groups().map(|g| g.members.len()).sum();
        let groups_ok = grouped == self.nodes.len()
            && (0..self.nodes.len()).all(|node| {
                self.by_key
                    .get(&self.key(node))
                    .and_then(|id| self.groups.get(*id as usize)?.as_ref())
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
