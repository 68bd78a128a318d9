//! The scheduling pass: grace periods, order by priority and dominant share, quota,
//! placement, preemption and the starvation reservation (see the module documentation).

use std::collections::{BTreeMap, BTreeSet, HashMap};

use super::{Effect, Entry, JobId, JobState, Queue, WhyPending};
use crate::cluster::Cluster;
use crate::policy::Unschedulable;

impl Queue {
    fn set_why(&mut self, job: JobId, why: WhyPending, effects: &mut Vec<Effect>) {
        if let Some(entry) = self.jobs.get_mut(&job) {
            if entry.why.as_ref() != Some(&why) {
                entry.why = Some(why.clone());
                effects.push(Effect::Pending { job, why });
            }
        }
    }

    /// One scheduling pass at time `now`. See the module documentation for the order.
    pub fn tick(&mut self, cluster: &mut Cluster, now: u64) -> Vec<Effect> {
        let mut effects = Vec::new();
        // 1. Grace periods that have passed.
        let expired: Vec<JobId> = self
            .terminating
            .iter()
            .filter_map(|id| self.jobs.get(id))
            .filter(
                |e| matches!(e.state, JobState::Terminating { deadline, .. } if deadline <= now),
            )
            .map(|e| e.job.id)
            .collect();
        for job in expired {
            self.release(cluster, job);
            if let Some(entry) = self.jobs.get_mut(&job) {
                if let JobState::Terminating {
                    start, deadline, ..
                } = entry.state
                {
                    // Progress up to the preempt signal was checkpointed.
                    let ran = deadline
                        .saturating_sub(self.config.grace_seconds)
                        .saturating_sub(start);
                    entry.remaining = entry.remaining.map(|r| r.saturating_sub(ran).max(1));
                }
                entry.state = JobState::Pending;
                entry.queued_since = now;
                entry.why = None;
            }
            self.reindex(job);
            effects.push(Effect::Requeued { job });
        }
        let pending = &self.pending;
        self.nominations.retain(|job, _| pending.contains(job));
        // The reservation ends when its job is no longer pending.
        if let Some(reservation) = &self.reservation {
            if self.state(reservation.job) != Some(&JobState::Pending) {
                self.reservation = None;
            } else if reservation.start.is_some_and(|s| s <= now) {
                self.reservation_dirty = true;
            }
        }
        if self.reservation_dirty {
            self.reservation_dirty = false;
            if let Some(job) = self.reservation.as_ref().map(|r| r.job) {
                self.reservation = self.plan_reservation(cluster, job, now);
            }
        }

        // 2. Order: classes (highest first), within a class per-tenant FIFO queues.
        let mut classes: BTreeMap<std::cmp::Reverse<u32>, Vec<Vec<JobId>>> = BTreeMap::new();
        let mut pending: Vec<&Entry> = self
            .pending
            .iter()
            .filter_map(|id| self.jobs.get(id))
            .collect();
        pending.sort_by_key(|e| (e.job.submit, e.job.id));
        let lanes = if self.config.fairness {
            self.tenants.len()
        } else {
            1
        };
        for entry in pending {
            let class = if self.config.priorities {
                entry.job.priority
            } else {
                0
            };
            let lane = if self.config.fairness {
                entry.job.tenant
            } else {
                0
            };
            classes
                .entry(std::cmp::Reverse(class))
                .or_insert_with(|| vec![Vec::new(); lanes])[lane]
                .push(entry.job.id);
        }
        let capacity = Self::capacity(cluster);
        let mut no_fit: HashMap<u32, Unschedulable> = HashMap::new();
        let mut no_victims: BTreeSet<(u32, u32)> = BTreeSet::new();
        for (_, mut lanes) in classes {
            // Pass 1: everything in the class that fits without preempting anyone, in
            // fairness order. Pass 2: preemption for what is left, highest priority
            // first, so no preemption counts on room that a job placed later in the
            // same tick takes without one.
            let mut order = Vec::new();
            let mut heads = vec![0usize; lanes.len()];
            loop {
                // 3. Next: the tenant with the lowest weighted dominant share.
                let next = (0..lanes.len())
                    .filter(|l| heads[*l] < lanes[*l].len())
                    .min_by(|a, b| {
                        if self.config.fairness {
                            self.share(&capacity, *a)
                                .total_cmp(&self.share(&capacity, *b))
                                .then(a.cmp(b))
                        } else {
                            a.cmp(b)
                        }
                    });
                let Some(lane) = next else { break };
                let job = lanes[lane][heads[lane]];
                heads[lane] += 1;
                order.push(job);
                self.attempt(
                    cluster,
                    job,
                    now,
                    false,
                    &mut no_fit,
                    &mut no_victims,
                    &mut effects,
                );
            }
            lanes.clear();
            if self.config.preemption {
                let mut left: Vec<(u32, JobId)> = order
                    .into_iter()
                    .filter_map(|job| {
                        let entry = self.jobs.get(&job)?;
                        (entry.state == JobState::Pending).then_some((entry.job.priority, job))
                    })
                    .collect();
                left.sort_by_key(|(priority, _)| std::cmp::Reverse(*priority));
                for (_, job) in left {
                    self.attempt(
                        cluster,
                        job,
                        now,
                        true,
                        &mut no_fit,
                        &mut no_victims,
                        &mut effects,
                    );
                }
            }
        }
        effects
    }

    /// One placement attempt for `job`; with `preempt` false a job that does not fit is
    /// left for the preemption pass (when preemption is on) without further ado.
    #[allow(clippy::too_many_arguments)]
    fn attempt(
        &mut self,
        cluster: &mut Cluster,
        job: JobId,
        now: u64,
        preempt: bool,
        no_fit: &mut HashMap<u32, Unschedulable>,
        no_victims: &mut BTreeSet<(u32, u32)>,
        effects: &mut Vec<Effect>,
    ) {
        let Some(entry) = self.jobs.get(&job) else {
            return;
        };
        let (tenant, demand, shape, priority) = (
            entry.job.tenant,
            entry.demand,
            entry.shape,
            entry.job.priority,
        );
        let aged = self
            .config
            .aging_seconds
            .is_some_and(|a| now.saturating_sub(entry.queued_since) >= a);
        if let Some(resource) = self.over_quota(tenant, demand) {
            self.set_why(job, WhyPending::OverQuota { resource }, effects);
            return;
        }
        // Unknown start: everything of the same or lower priority waits behind it.
        if let Some(reservation) = &self.reservation {
            if reservation.start.is_none()
                && reservation.job != job
                && priority <= reservation.priority
            {
                let reserved = reservation.job;
                self.set_why(job, WhyPending::BehindReservation { reserved }, effects);
                return;
            }
        }
        // Cluster only fills up within a tick, so a shape that did not fit still does not.
        let placed = match no_fit.get(&shape) {
            Some(why) => Err(why.clone()),
            None => self.try_place(cluster, job),
        };
        match placed {
            Ok(bindings) => {
                let taken = self.nominations.iter().find(|(other, (p, nodes))| {
                    **other != job
                        && *p >= priority
                        && bindings.iter().any(|b| nodes.contains(&b.node))
                });
                if let Some((other, _)) = taken {
                    let other = *other;
                    self.set_why(job, WhyPending::NominatedFor { job: other }, effects);
                    return;
                }
                if let Some(reserved) = self.delays_reservation(job, &bindings, now) {
                    self.set_why(job, WhyPending::BehindReservation { reserved }, effects);
                    return;
                }
                if self.commit(cluster, job, &bindings, now) {
                    self.nominations.remove(&job);
                    if priority > self.reservation.as_ref().map_or(u32::MAX, |r| r.priority) {
                        // Higher-priority work may take what the reservation counted on.
                        self.reservation_dirty = true;
                    }
                    if self.reservation.as_ref().is_some_and(|r| r.job == job) {
                        self.reservation = None;
                    }
                    effects.push(Effect::Bind { job, bindings });
                }
            }
            Err(why) => {
                no_fit.insert(shape, why.clone());
                if self.config.preemption && !preempt {
                    return;
                }
                if self.config.preemption && !no_victims.contains(&(shape, priority)) {
                    // Already waiting for enough preempted work to leave?
                    let terminating: Vec<JobId> = self.terminating.iter().copied().collect();
                    if !terminating.is_empty()
                        && self.with_released(cluster, &terminating, |q, c| {
                            q.try_place(c, job).is_ok()
                        })
                    {
                        self.set_why(job, WhyPending::WaitingForPreemption, effects);
                        return;
                    }
                    match self.choose_victims(cluster, job, now) {
                        Some((victims, nodes)) => {
                            let deadline = now.saturating_add(self.config.grace_seconds);
                            self.nominations.insert(job, (priority, nodes));
                            for victim in victims {
                                if let Some(v) = self.jobs.get_mut(&victim) {
                                    let old = std::mem::replace(&mut v.state, JobState::Pending);
                                    v.state = match old {
                                        JobState::Running { start, bindings } => {
                                            JobState::Terminating {
                                                start,
                                                deadline,
                                                bindings,
                                            }
                                        }
                                        other => other,
                                    };
                                }
                                self.reindex(victim);
                                self.preemptions += 1;
                                effects.push(Effect::Preempt {
                                    victim,
                                    by: job,
                                    grace_seconds: self.config.grace_seconds,
                                });
                            }
                            self.reservation_dirty = true;
                            self.set_why(job, WhyPending::WaitingForPreemption, effects);
                            return;
                        }
                        None => {
                            no_victims.insert((shape, priority));
                        }
                    }
                }
                if aged {
                    let replace = match &self.reservation {
                        None => true,
                        Some(r) => r.job != job && priority > r.priority,
                    };
                    if replace {
                        if let Some(planned) = self.plan_reservation(cluster, job, now) {
                            self.reservation = Some(planned);
                        }
                    }
                }
                self.set_why(job, WhyPending::Unschedulable(why), effects);
            }
        }
    }
}
