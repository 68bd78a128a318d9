//! Cluster state: what each node has left, and the reservations that took the rest.
//!
//! Invariant: for every node, capacity = left + sum of its reservations, per resource and
//! per GPU, after any sequence of `reserve`, `unreserve` and `node_lost` (property-tested
//! in `tests/properties.rs`). Reservations are keyed by id and idempotent.

use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

/// Hash maps of the placement path: keys are node states and pod shapes hashed on
/// every decision, where SipHash cost a fifth of a decision's instructions; foldhash
/// is several times faster and still seeded per map.
pub(crate) type FastMap<K, V> = HashMap<K, V, foldhash::fast::RandomState>;
pub(crate) type FastSet<K> = std::collections::HashSet<K, foldhash::fast::RandomState>;

use crate::fragmentation::TypicalPods;
use crate::policy::Objective;

use crate::model::{CapacityType, NodeSpec, PodRequest, Reason, TaintEffect, MILLI_PER_GPU};

/// Where a pod goes: the node, and milli-GPU taken on each of its GPUs (by GPU index).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Binding {
    pub node: usize,
    pub gpus: Vec<(u8, u32)>,
    /// For a MIG pod: the index of the node's MIG partition it takes a slice of.
    pub mig: Option<u16>,
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
    /// Free slices per MIG partition (in `NodeSpec::mig` order).
    pub mig_free: Vec<u8>,
    pub up: bool,
}

/// Everything that decides whether and how well a node takes a pod. Nodes with equal
/// keys are interchangeable but for their priority, so the placement loop scores each
/// distinct key once instead of each node.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct GroupKey {
    /// Interned static facts (labels, taints, capacity type, price, region/zone, MIG
    /// and NVLink layout): nodes that differ there never share a group.
    pub class: u32,
    pub gpu_model: Option<u16>,
    pub up: bool,
    pub cpu_left: u64,
    pub memory_left: u64,
    pub gpu_left: Vec<u32>,
    pub mig_free: Vec<u8>,
}

/// The static facts of a node that filters and scorers read (everything but its name,
/// its rack and its capacity, which the state holds).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct NodeClass {
    labels: BTreeMap<String, String>,
    taints: Vec<crate::model::Taint>,
    capacity_type: crate::model::CapacityType,
    price: u64,
    interruptions: u32,
    region: u16,
    zone: u16,
    mig: Vec<crate::model::MigPartition>,
    nvlink: Vec<u8>,
    gpus: u8,
}

impl NodeClass {
    fn of(node: &NodeSpec) -> NodeClass {
        NodeClass {
            labels: node.labels.clone(),
            taints: node.taints.clone(),
            capacity_type: node.capacity_type,
            price: node.price_micro_usd_per_hour,
            interruptions: node.interruptions_per_1000h,
            region: node.location.region,
            zone: node.location.zone,
            mig: node.mig.clone(),
            nvlink: node.nvlink_domain.clone(),
            gpus: node.gpus,
        }
    }
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

/// A node score in thousandths of a point; higher is better.
pub type Score = i64;

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
    /// What `order` holds for each group slot; `None` for slots not seen.
    entries: Vec<Option<IndexEntry>>,
}

/// A group's generation when it was scored, and its score and representative rank
/// (`None` when the group cannot take the shape).
type IndexEntry = (u64, Option<(Score, u32)>);

/// Interned (pod shape, objective) pairs and their indexes, valid for one target
/// workload.
#[derive(Debug, Clone, Default)]
struct ShapeTable {
    typical: Option<TypicalPods>,
    objectives: Vec<Objective>,
    /// Per objective (the index in `objectives`): each pod shape's index id.
    ids: Vec<FastMap<PodRequest, u32>>,
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
    /// Tie-break rank of each node (lower wins); by default the node index. Shared by
    /// copies of the cluster, so [`Cluster::is_own_priority`] recognises it by address.
    rank: Arc<[u32]>,
    /// Static class of each node (see `GroupKey::class`).
    class: Vec<u32>,
    /// The highest node price per GPU (or per node without GPUs), micro-USD/h, for
    /// normalising the cost scorer.
    pub(crate) max_price_per_gpu: f64,
    /// Nodes by state: slots, the slot of each live key, free slots.
    groups: Vec<Option<Group>>,
    /// The slot of each node's group.
    group_of: Vec<GroupId>,
    by_key: FastMap<GroupKey, GroupId>,
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
                mig_free: n.mig.iter().map(|p| p.count).collect(),
                up: true,
            })
            .collect();
        let rank = (0..nodes.len() as u32).collect();
        let mut classes: HashMap<NodeClass, u32> = HashMap::new();
        let class = nodes
            .iter()
            .map(|n| {
                let next = classes.len() as u32;
                *classes.entry(NodeClass::of(n)).or_insert(next)
            })
            .collect();
        let max_price_per_gpu = nodes
            .iter()
            .map(|n| n.price_micro_usd_per_hour as f64 / f64::from(n.gpus.max(1)))
            .fold(0.0, f64::max);
        let mut cluster = Cluster {
            nodes,
            state,
            reservations: BTreeMap::new(),
            rank,
            class,
            max_price_per_gpu,
            groups: Vec::new(),
            group_of: Vec::new(),
            by_key: FastMap::default(),
            free_slots: Vec::new(),
            generations: 0,
            log: ChangeLog::default(),
            shapes: RefCell::new(ShapeTable::default()),
        };
        cluster.rebuild_groups();
        cluster
    }

    /// The group key of `node`'s current state.
    pub(crate) fn key(&self, node: usize) -> GroupKey {
        let state = &self.state[node];
        GroupKey {
            class: self.class[node],
            gpu_model: self.nodes[node].gpu_model,
            up: state.up,
            cpu_left: state.cpu_left,
            memory_left: state.memory_left,
            gpu_left: state.gpu_left.clone(),
            mig_free: state.mig_free.clone(),
        }
    }

    /// Regroups every node from scratch; every index starts over.
    fn rebuild_groups(&mut self) {
        self.groups.clear();
        self.group_of = vec![0; self.nodes.len()];
        self.by_key.clear();
        self.free_slots.clear();
        self.log = ChangeLog::default();
        {
            let mut shapes = self.shapes.borrow_mut();
            shapes.objectives.clear();
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
        self.group_of[node] = id;
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

    /// Moves `node` from its group to the group of its current state.
    fn regroup(&mut self, node: usize) {
        let member = (self.rank[node], node);
        let id = self.group_of[node];
        let mut emptied = false;
        if let Some(group) = self.groups[id as usize].as_mut() {
            group.members.remove(&member);
            emptied = group.members.is_empty();
        }
        if emptied {
            if let Some(group) = self.groups[id as usize].take() {
                self.by_key.remove(&group.key);
            }
            self.free_slots.push(id);
        }
        self.log_change(id);
        let key = self.key(node);
        self.join_group(node, key);
    }

    /// The slot of `node`'s group: nodes in one slot are in the same state now.
    pub(crate) fn group_of(&self, node: usize) -> usize {
        self.group_of[node] as usize
    }

    /// How many group slots there are (live or free): a bound for [`Cluster::group_of`].
    pub(crate) fn group_slots(&self) -> usize {
        self.groups.len()
    }

    /// Sets the tie-break priority (a rank per node, lower wins).
    pub fn set_priority(&mut self, rank: &[u32]) {
        if rank.len() == self.nodes.len() && !self.is_own_priority(rank) {
            self.rank = rank.into();
            self.rebuild_groups();
        }
    }

    pub fn priority(&self) -> &[u32] {
        &self.rank
    }

    /// The tie-break order as a handle shared with this cluster and its copies: a
    /// caller that places on a `&mut` copy (a gang) while holding the order passes
    /// this, and the placement path recognises it without comparing every rank.
    pub fn shared_priority(&self) -> Arc<[u32]> {
        Arc::clone(&self.rank)
    }

    /// Whether `priority` is this cluster's own order (its index then applies): the
    /// same slice as [`Cluster::priority`] or [`Cluster::shared_priority`] in O(1),
    /// an equal one by comparing (O(nodes)).
    pub fn is_own_priority(&self, priority: &[u32]) -> bool {
        std::ptr::eq(priority, &*self.rank) || priority == &*self.rank
    }

    /// Distinct node states, each with its members in (rank, node) order.
    pub fn groups(&self) -> impl Iterator<Item = &Group> {
        self.groups.iter().flatten()
    }

    /// The index id of (pod shape, policy code) under `typical`. A different target
    /// workload than last time empties every index first.
    pub(crate) fn shape_id(
        &self,
        pod: &PodRequest,
        objective: &Objective,
        typical: &TypicalPods,
    ) -> u32 {
        let mut shapes = self.shapes.borrow_mut();
        // A new target workload, or many objectives (carbon intensities change every
        // hour): start over rather than keep indexes nobody will use again.
        if shapes.typical.as_ref() != Some(typical) || shapes.objectives.len() > 16 {
            shapes.typical = Some(typical.clone());
            shapes.objectives.clear();
            shapes.ids.clear();
            shapes.indexes.clear();
        }
        let objective_id = match shapes.objectives.iter().position(|o| o == objective) {
            Some(idx) => idx,
            None => {
                shapes.objectives.push(objective.clone());
                shapes.ids.push(FastMap::default());
                shapes.objectives.len() - 1
            }
        };
        if let Some(id) = shapes.ids[objective_id].get(pod) {
            return *id;
        }
        let id = shapes.indexes.len() as u32;
        shapes.ids[objective_id].insert(pod.clone(), id);
        shapes.indexes.push(ShapeIndex {
            synced: u64::MAX,
            ..ShapeIndex::default()
        });
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
            let slot = id as usize;
            if index.entries.len() <= slot {
                index.entries.resize(slot + 1, None);
            }
            let previous = index.entries[slot];
            if let Some((_, Some((old_score, old_rank)))) = previous {
                index
                    .order
                    .remove(&(std::cmp::Reverse(old_score), old_rank, id));
            }
            let Some(group) = live else {
                index.entries[slot] = None;
                return;
            };
            let Some((rank, node)) = group.first() else {
                index.entries[slot] = None;
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
            index.entries[slot] = Some((group.generation, scored.map(|value| (value, rank))));
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
            self.state[node].up = up;
            self.regroup(node);
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

    /// Why `node` cannot take `pod` now, if it cannot. Cheap and static checks first;
    /// anti-affinity, which reads the other reservations, last.
    pub fn check(&self, node: usize, pod: &PodRequest) -> Result<(), Reason> {
        self.check_resources(node, pod)?;
        if let Some(group) = pod.anti_affinity {
            if self
                .reservations
                .values()
                .any(|(other, binding)| binding.node == node && other.anti_affinity == Some(group))
            {
                return Err(Reason::AntiAffinity);
            }
        }
        Ok(())
    }

    /// [`Cluster::check`] without anti-affinity: what depends on the node's own state
    /// (the same for every node of a group).
    pub(crate) fn check_resources(&self, node: usize, pod: &PodRequest) -> Result<(), Reason> {
        let spec = &self.nodes[node];
        let state = &self.state[node];
        if !state.up {
            return Err(Reason::NodeDown);
        }
        if pod
            .node_selector
            .iter()
            .any(|(key, value)| spec.labels.get(key) != Some(value))
        {
            return Err(Reason::NodeSelectorMismatch);
        }
        if spec.taints.iter().any(|taint| {
            taint.effect == TaintEffect::NoSchedule && !pod.tolerations.contains(&taint.key)
        }) {
            return Err(Reason::UntoleratedTaint);
        }
        if spec.capacity_type == CapacityType::Spot && !pod.spot_ok {
            return Err(Reason::SpotNotAllowed);
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
        if let Some(profile) = pod.mig_profile {
            let free = spec
                .mig
                .iter()
                .zip(&state.mig_free)
                .any(|(partition, free)| partition.profile == profile && *free > 0);
            return if free {
                Ok(())
            } else {
                Err(Reason::NoMigSlice)
            };
        }
        let fits = |gpu: usize| !spec.is_mig(gpu as u8) && state.gpu_left[gpu] >= pod.gpu_milli;
        if self.fitting_gpus(node, pod) < usize::from(pod.num_gpu) {
            return Err(Reason::InsufficientGpu);
        }
        if pod.same_nvlink && pod.num_gpu > 1 && !spec.nvlink_domain.is_empty() {
            let mut per_domain: BTreeMap<u8, usize> = BTreeMap::new();
            for gpu in (0..state.gpu_left.len()).filter(|g| fits(*g)) {
                *per_domain
                    .entry(spec.nvlink_domain_of(gpu as u8))
                    .or_default() += 1;
            }
            if per_domain.values().all(|n| *n < usize::from(pod.num_gpu)) {
                return Err(Reason::NvlinkDomain);
            }
        }
        Ok(())
    }

    /// Non-MIG GPUs of `node` with room for one of `pod`'s GPUs.
    fn fitting_gpus(&self, node: usize, pod: &PodRequest) -> usize {
        let spec = &self.nodes[node];
        let left = &self.state[node].gpu_left;
        (0..left.len())
            .filter(|g| !spec.is_mig(*g as u8) && left[*g] >= pod.gpu_milli)
            .count()
    }

    /// Every resource of `node` that is too short for `pod` now: CPU, memory, the GPU
    /// model and free GPUs, each checked on its own (where [`Cluster::check`] stops at
    /// the first, so CPU, checked before GPUs, would look like the only reason). Empty
    /// when the resources fit; static reasons (down, selector, taint, spot, MIG,
    /// NVLink) are not reported here.
    pub fn shortages(&self, node: usize, pod: &PodRequest) -> Vec<Reason> {
        let spec = &self.nodes[node];
        let state = &self.state[node];
        let mut short = Vec::new();
        if state.cpu_left < pod.cpu_milli {
            short.push(Reason::InsufficientCpu);
        }
        if state.memory_left < pod.memory_mib {
            short.push(Reason::InsufficientMemory);
        }
        if pod.num_gpu > 0 && pod.mig_profile.is_none() {
            if spec.gpus == 0 {
                short.push(Reason::NoGpu);
            } else if !pod.accepts_model(spec.gpu_model) {
                short.push(Reason::GpuModelMismatch);
            } else {
                if self.fitting_gpus(node, pod) < usize::from(pod.num_gpu) {
                    short.push(Reason::InsufficientGpu);
                }
            }
        }
        short
    }

    /// Takes resources for reservation `id`. Re-reserving the same id with the same
    /// binding is a no-op; with another binding it is a conflict.
    pub fn reserve(
        &mut self,
        id: u64,
        pod: &PodRequest,
        binding: &Binding,
    ) -> Result<(), ReserveError> {
        self.reserve_on(id, pod, binding, false)
    }

    /// Puts back a reservation that was just taken off (a trial without it): on a node
    /// that takes no new work (its agent away, drained) too, since that work runs there.
    pub fn restore(
        &mut self,
        id: u64,
        pod: &PodRequest,
        binding: &Binding,
    ) -> Result<(), ReserveError> {
        self.reserve_on(id, pod, binding, true)
    }

    fn reserve_on(
        &mut self,
        id: u64,
        pod: &PodRequest,
        binding: &Binding,
        even_unavailable: bool,
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
        let unavailable = even_unavailable && !self.state[binding.node].up;
        if unavailable {
            self.state[binding.node].up = true;
        }
        let checked = self.check(binding.node, pod);
        if unavailable {
            self.state[binding.node].up = false;
        }
        checked.map_err(ReserveError::DoesNotFit)?;
        self.validate_gpus(pod, binding)
            .map_err(ReserveError::DoesNotFit)?;
        let state = &mut self.state[binding.node];
        state.cpu_left -= pod.cpu_milli;
        state.memory_left -= pod.memory_mib;
        for (gpu, milli) in &binding.gpus {
            state.gpu_left[usize::from(*gpu)] -= milli;
        }
        if let Some(partition) = binding.mig {
            state.mig_free[usize::from(partition)] -= 1;
        }
        self.regroup(binding.node);
        self.reservations.insert(id, (pod.clone(), binding.clone()));
        Ok(())
    }

    /// Whether `binding` names GPUs (or a MIG slice) that can hold `pod` now: exactly
    /// `num_gpu` distinct non-MIG GPUs with room (in one NVLink domain when asked), or
    /// one free slice of the pod's profile on its parent GPU.
    fn validate_gpus(&self, pod: &PodRequest, binding: &Binding) -> Result<(), Reason> {
        let spec = &self.nodes[binding.node];
        let state = &self.state[binding.node];
        if let Some(profile) = pod.mig_profile {
            let partition = binding.mig.map(usize::from);
            let ok = partition.is_some_and(|idx| {
                spec.mig.get(idx).is_some_and(|p| {
                    p.profile == profile
                        && state.mig_free[idx] > 0
                        && binding.gpus == [(p.gpu, profile.milli())]
                        && state.gpu_left[usize::from(p.gpu)] >= profile.milli()
                })
            });
            return if ok { Ok(()) } else { Err(Reason::NoMigSlice) };
        }
        if binding.mig.is_some() {
            return Err(Reason::NoMigSlice);
        }
        let mut seen = Vec::new();
        for (gpu, milli) in &binding.gpus {
            let left = state.gpu_left.get(usize::from(*gpu)).copied();
            if *milli != pod.gpu_milli
                || seen.contains(gpu)
                || spec.is_mig(*gpu)
                || left.is_none_or(|left| left < *milli)
            {
                return Err(Reason::InsufficientGpu);
            }
            seen.push(*gpu);
        }
        if seen.len() != usize::from(pod.num_gpu) {
            return Err(Reason::InsufficientGpu);
        }
        if pod.same_nvlink {
            let domains: BTreeSet<u8> = seen.iter().map(|g| spec.nvlink_domain_of(*g)).collect();
            if domains.len() > 1 {
                return Err(Reason::NvlinkDomain);
            }
        }
        Ok(())
    }

    /// Gives back what reservation `id` took. Returns whether it existed.
    pub fn unreserve(&mut self, id: u64) -> bool {
        let Some((pod, binding)) = self.reservations.remove(&id) else {
            return false;
        };
        let state = &mut self.state[binding.node];
        state.cpu_left += pod.cpu_milli;
        state.memory_left += pod.memory_mib;
        for (gpu, milli) in &binding.gpus {
            state.gpu_left[usize::from(*gpu)] += milli;
        }
        if let Some(partition) = binding.mig {
            state.mig_free[usize::from(partition)] += 1;
        }
        self.regroup(binding.node);
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
                    .filter(|id| **id == self.group_of[node])
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
                let mut slices: Vec<u64> = self.state[idx]
                    .mig_free
                    .iter()
                    .map(|f| u64::from(*f))
                    .collect();
                for (_, binding) in self.reservations.values().filter(|(_, b)| b.node == idx) {
                    if let Some(partition) = binding.mig {
                        slices[usize::from(partition)] += 1;
                    }
                }
                let slices_ok = spec
                    .mig
                    .iter()
                    .zip(&slices)
                    .all(|(p, n)| u64::from(p.count) == *n);
                slices_ok
                    && cpu == spec.cpu_milli
                    && memory == spec.memory_mib
                    && gpus.iter().all(|g| *g == u64::from(MILLI_PER_GPU))
            })
    }
}
