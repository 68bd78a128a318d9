//! The starvation reservation (EASY backfilling): whether a job could ever fit, when
//! and where it would fit if running work ended as expected, and whether starting
//! another job could delay it.

use std::collections::BTreeSet;

use super::{reservation_id, JobId, JobState, Queue, Reservation};
use crate::cluster::{Binding, Cluster};

impl Queue {
    /// Whether the job could fit at all, on the same nodes with nothing running (cached
    /// per shape). A job that never fits gets no reservation: it would block the queue
    /// for nothing.
    fn could_ever_fit(&mut self, cluster: &Cluster, job: JobId) -> bool {
        let Some(shape) = self.jobs.get(&job).map(|e| e.shape) else {
            return false;
        };
        if self.empty.as_ref().map(|c| c.nodes.len()) != Some(cluster.nodes.len()) {
            self.empty = Some(Cluster::new(cluster.nodes.clone()));
            self.ever_fits.clear();
        }
        if let Some(known) = self.ever_fits.get(&shape) {
            return *known;
        }
        let Some(empty) = self.empty.take() else {
            return false;
        };
        let fits = self.try_place(&empty, job).is_ok();
        self.empty = Some(empty);
        self.ever_fits.insert(shape, fits);
        fits
    }

    /// When `job` would fit if running work ended when expected, and where; `None`
    /// when it could not fit even on an empty cluster.
    pub(super) fn plan_reservation(
        &mut self,
        cluster: &Cluster,
        job: JobId,
        now: u64,
    ) -> Option<Reservation> {
        if !self.could_ever_fit(cluster, job) {
            return None;
        }
        let priority = self.jobs.get(&job).map(|e| e.job.priority).unwrap_or(0);
        let mut ends: Vec<(u64, JobId)> = self
            .jobs
            .values()
            .filter_map(|e| match e.state {
                JobState::Running { start, .. } => e
                    .remaining
                    .map(|r| (start.saturating_add(r).max(now), e.job.id)),
                JobState::Terminating { deadline, .. } => Some((deadline.max(now), e.job.id)),
                _ => None,
            })
            .collect();
        ends.sort();
        if let Ok(bindings) = self.try_place(cluster, job) {
            return Some(Reservation {
                job,
                priority,
                start: Some(now),
                nodes: bindings.iter().map(|b| b.node).collect(),
            });
        }
        let mut scratch = cluster.clone();
        let mut idx = 0;
        while idx < ends.len() {
            let at = ends[idx].0;
            while idx < ends.len() && ends[idx].0 == at {
                let victim = ends[idx].1;
                if let Some(entry) = self.jobs.get(&victim) {
                    for member in 0..entry.job.members.len() {
                        scratch.unreserve(reservation_id(victim, member));
                    }
                }
                idx += 1;
            }
            if let Ok(bindings) = self.try_place(&scratch, job) {
                return Some(Reservation {
                    job,
                    priority,
                    start: Some(at),
                    nodes: bindings.iter().map(|b| b.node).collect(),
                });
            }
        }
        Some(Reservation {
            job,
            priority,
            start: None,
            nodes: BTreeSet::new(),
        })
    }

    /// Whether starting `job` on `bindings` now could delay the reservation.
    pub(super) fn delays_reservation(
        &self,
        job: JobId,
        bindings: &[Binding],
        now: u64,
    ) -> Option<JobId> {
        let reservation = self.reservation.as_ref()?;
        let entry = self.jobs.get(&job)?;
        if reservation.job == job || entry.job.priority > reservation.priority {
            return None;
        }
        let start = reservation.start?;
        // Sure to be gone by then (expected runtimes are taken as exact)...
        if entry
            .remaining
            .is_some_and(|r| now.saturating_add(r) <= start)
        {
            return None;
        }
        // ...or off the nodes the reserved job will use.
        if bindings
            .iter()
            .all(|b| !reservation.nodes.contains(&b.node))
        {
            return None;
        }
        Some(reservation.job)
    }
}
