//! One scheduling pass: the ledger charged, held jobs released, nodes moved on, then the
//! queue run and its effects (placements, preemptions, requeues) committed to the jobs.

use nephele_placement::Effect;

use super::{RegionScheduler, SchedEvent};

impl RegionScheduler {
    /// One scheduling pass at `now` (unix seconds): held jobs whose hour has come join
    /// the queue, then the queue runs.
    pub fn tick(&mut self, now: u64) -> Vec<SchedEvent> {
        self.prune_indexes();
        let charged = self.accrue(now);
        let mut events = std::mem::take(&mut self.later);
        let before = events.len();
        if charged.skipped_s > 0 {
            events.push(SchedEvent::Node {
                node: self.region.clone(),
                what: format!(
                    "the ledger charged {} s and left out {} s of a longer gap (clock jump or a long outage)",
                    charged.seconds, charged.skipped_s
                ),
            });
        }
        events.extend(self.release_deferred(now));
        events.extend(self.release_holds(now));
        events.extend(self.nodes_tick(now));
        // Holds released, nodes changed: records beyond the queue's effects may have
        // changed.
        self.touched_all |= events.len() > before;
        // Every slot counts as supply, launched or not: what the pools can give.
        self.queue.refresh_workload(&self.cluster.nodes, now);
        let effects = self.queue.tick(&mut self.cluster, now);
        for effect in effects {
            match &effect {
                Effect::Bind { job, .. } | Effect::Requeued { job } => {
                    self.touched.insert(*job);
                }
                Effect::Preempt { victim, by, .. } => {
                    self.touched.extend([*victim, *by]);
                }
                Effect::Pending { .. } => {}
            }
            match effect {
                Effect::Bind { job, bindings } => {
                    let nodes = bindings
                        .iter()
                        .map(|b| self.cluster.nodes[b.node].name.clone())
                        .collect();
                    if let Some(meta) = self.jobs.get_mut(&job) {
                        meta.started_unix = Some(now);
                        meta.preempted_by = None;
                    }
                    self.on_bound(job, &bindings, now);
                    events.push(SchedEvent::Placed {
                        job: self.qualified(job),
                        nodes,
                    });
                }
                Effect::Preempt {
                    victim,
                    by,
                    grace_seconds,
                } => {
                    if let Some(meta) = self.jobs.get_mut(&victim) {
                        meta.preempted_by = Some(by);
                    }
                    self.on_stopping(victim, "preempted", now);
                    events.push(SchedEvent::Preempting {
                        job: self.qualified(victim),
                        by: self.qualified(by),
                        grace_seconds,
                    });
                }
                Effect::Requeued { job } => {
                    events.extend(self.on_requeued(job, now));
                }
                Effect::Pending { .. } => {}
            }
        }
        let replicas = self.replicas_tick(now);
        self.touched_all |= !replicas.is_empty();
        events.extend(replicas);
        events
    }
}
