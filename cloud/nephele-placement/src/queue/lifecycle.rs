//! What happens to a job from outside a pass: it ends on its own, is removed,
//! adopted after a restart, evicted, stops, or loses its node.

use std::collections::BTreeSet;

use super::{reservation_id, Job, JobId, JobState, Queue, QueueError, MEMBER_BITS};
use crate::cluster::{Binding, Cluster};

impl Queue {
    /// The job ended on its own (completed or failed). Releases its resources; a
    /// pending or finished job is left alone. Returns whether it was running or
    /// terminating.
    pub fn finish(&mut self, cluster: &mut Cluster, job: JobId, now: u64) -> bool {
        let Some(entry) = self.jobs.get(&job) else {
            return false;
        };
        let expected_end = match &entry.state {
            JobState::Running { start, .. } => entry.remaining.map(|r| start.saturating_add(r)),
            JobState::Terminating { deadline, .. } => Some(*deadline),
            _ => return false,
        };
        // Ending earlier than planned frees capacity the reservation did not count on.
        if expected_end.is_none_or(|end| now < end) {
            self.reservation_dirty = true;
        }
        self.release(cluster, job);
        if let Some(entry) = self.jobs.get_mut(&job) {
            entry.state = JobState::Finished { at: now };
        }
        self.reindex(job);
        true
    }

    /// Removes a job in any state, as when its owner cancels it or a finished job is
    /// forgotten: a running or terminating job gives its resources back first. The job
    /// leaves no trace (a later tick drops a reservation or nominations it held).
    /// Returns whether the job existed.
    pub fn remove(&mut self, cluster: &mut Cluster, job: JobId) -> bool {
        let Some(entry) = self.jobs.get(&job) else {
            return false;
        };
        if matches!(
            entry.state,
            JobState::Running { .. } | JobState::Terminating { .. }
        ) {
            // Freed capacity the reservation did not count on.
            self.reservation_dirty = true;
        }
        self.release(cluster, job);
        self.jobs.remove(&job);
        self.reindex(job);
        self.nominations.remove(&job);
        true
    }

    /// Adds a job that is already running at `bindings` (restored books after a
    /// control-plane restart, once its nodes are back): its members are reserved exactly
    /// there, also on nodes that take no new work (the processes run there), and it is
    /// running since `start`. When a binding no longer fits (the node changed, or
    /// something else took the room), nothing is reserved and the job is left pending.
    /// Returns whether it was adopted as running.
    pub fn adopt(
        &mut self,
        cluster: &mut Cluster,
        job: Job,
        bindings: &[Binding],
        start: u64,
    ) -> Result<bool, QueueError> {
        let id = job.id;
        let members = job.members.clone();
        self.submit(job)?;
        if bindings.len() != members.len() {
            return Ok(false);
        }
        for (member, (pod, binding)) in members.iter().zip(bindings).enumerate() {
            if cluster
                .restore(reservation_id(id, member), pod, binding)
                .is_err()
            {
                for done in 0..member {
                    cluster.unreserve(reservation_id(id, done));
                }
                return Ok(false);
            }
        }
        if let Some(entry) = self.jobs.get_mut(&id) {
            entry.state = JobState::Running {
                start,
                bindings: bindings.to_vec(),
            };
            entry.why = None;
            let (tenant, demand) = (entry.job.tenant, entry.demand);
            self.usage[tenant].add(demand);
        }
        self.reindex(id);
        Ok(true)
    }

    /// Asks a running job to stop within `grace_seconds` for a reason of the shell's
    /// (its node is drained, its attempt failed): it becomes terminating, keeps its
    /// resources until then, and is requeued by the tick after the deadline (or at once
    /// by [`Queue::stopped`]). Not counted as a preemption. Returns whether it was
    /// running.
    pub fn evict(&mut self, job: JobId, now: u64, grace_seconds: u64) -> bool {
        let Some(entry) = self.jobs.get_mut(&job) else {
            return false;
        };
        let JobState::Running { start, bindings } = &entry.state else {
            return false;
        };
        entry.state = JobState::Terminating {
            start: *start,
            deadline: now.saturating_add(grace_seconds),
            bindings: bindings.clone(),
        };
        self.reindex(job);
        true
    }

    /// A terminating job's processes have all exited before its grace deadline: its
    /// resources are given back now and it waits again, as when the deadline passes.
    /// Returns whether it was terminating.
    pub fn stopped(&mut self, cluster: &mut Cluster, job: JobId, now: u64) -> bool {
        let Some(entry) = self.jobs.get(&job) else {
            return false;
        };
        if !matches!(entry.state, JobState::Terminating { .. }) {
            return false;
        }
        self.reservation_dirty = true;
        self.release(cluster, job);
        if let Some(entry) = self.jobs.get_mut(&job) {
            if let JobState::Terminating { start, .. } = entry.state {
                let ran = now.saturating_sub(start);
                entry.remaining = entry.remaining.map(|r| r.saturating_sub(ran).max(1));
            }
            entry.state = JobState::Pending;
            entry.queued_since = now;
            entry.why = None;
        }
        self.reindex(job);
        true
    }

    /// A node went away: its jobs (every member of a gang with one member there) lose
    /// their resources and wait again. Returns their ids.
    pub fn node_lost(&mut self, cluster: &mut Cluster, node: usize, now: u64) -> Vec<JobId> {
        let hit: BTreeSet<JobId> = cluster
            .reservations()
            .filter(|(_, (_, b))| b.node == node)
            .map(|(id, _)| id >> MEMBER_BITS)
            .filter(|job| self.jobs.contains_key(job))
            .collect();
        for job in &hit {
            self.release(cluster, *job);
            if let Some(entry) = self.jobs.get_mut(job) {
                entry.state = JobState::Pending;
                entry.queued_since = now;
                entry.why = None;
            }
            self.reindex(*job);
        }
        cluster.node_lost(node);
        self.reservation_dirty = true;
        hit.into_iter().collect()
    }

    /// Gives back a running or terminating job's reservations and tenant usage.
    pub(super) fn release(&mut self, cluster: &mut Cluster, job: JobId) {
        let Some(entry) = self.jobs.get(&job) else {
            return;
        };
        if !matches!(
            entry.state,
            JobState::Running { .. } | JobState::Terminating { .. }
        ) {
            return;
        }
        for member in 0..entry.job.members.len() {
            cluster.unreserve(reservation_id(job, member));
        }
        let (tenant, demand) = (entry.job.tenant, entry.demand);
        self.usage[tenant].sub(demand);
    }
}
