//! Preemption: the cost of evicting a victim and the cheapest victim set that
//! really makes room for a job now.

use std::collections::{BTreeMap, BTreeSet};

use super::{JobId, JobState, Queue};
use crate::cluster::Cluster;

/// Cost of evicting a victim: lower priority first, then least work lost, then smallest.
type VictimKey = (u32, u64, u64, u64, JobId);
/// Cost of a victim set on one node: count, highest priority, work lost, size, node.
type SetCost = (usize, u32, u64, u64, usize);

impl Queue {
    fn victim_key(&self, victim: JobId, now: u64) -> VictimKey {
        let entry = &self.jobs[&victim];
        let start = match entry.state {
            JobState::Running { start, .. } => start,
            _ => now,
        };
        (
            entry.job.priority,
            now.saturating_sub(start),
            entry.demand.gpu_milli,
            entry.demand.cpu_milli,
            victim,
        )
    }

    /// The cheapest victim set that makes room for `job` now, if any: fewest victims,
    /// then the cheapest (see [`VictimKey`]); every returned set has been checked to
    /// make the job fit.
    pub(super) fn choose_victims(
        &mut self,
        cluster: &mut Cluster,
        job: JobId,
        now: u64,
    ) -> Option<(Vec<JobId>, BTreeSet<usize>)> {
        let entry = self.jobs.get(&job)?;
        let priority = entry.job.priority;
        let single = entry.job.members.len() == 1;
        let pod = entry.job.members[0].clone();
        let mut candidates: Vec<(VictimKey, JobId)> = self
            .jobs
            .values()
            .filter(|e| {
                e.job.preemptible
                    && e.job.priority < priority
                    && matches!(e.state, JobState::Running { .. })
            })
            .map(|e| (self.victim_key(e.job.id, now), e.job.id))
            .collect();
        if candidates.is_empty() {
            return None;
        }
        candidates.sort();
        if single {
            // Per node: victims with a member there, cheapest first.
            let mut by_node: BTreeMap<usize, Vec<(VictimKey, JobId)>> = BTreeMap::new();
            for (key, victim) in &candidates {
                if let Some(JobState::Running { bindings, .. }) = self.state(*victim) {
                    let nodes: BTreeSet<usize> = bindings.iter().map(|b| b.node).collect();
                    for node in nodes {
                        by_node.entry(node).or_default().push((*key, *victim));
                    }
                }
            }
            let mut best: Option<(SetCost, Vec<JobId>)> = None;
            for (node, victims) in by_node {
                // Fewest first: any single victim that suffices, else the cheapest prefix.
                let mut found: Option<Vec<JobId>> = None;
                for (_, victim) in &victims {
                    if self.with_released(cluster, &[*victim], |_, c| c.check(node, &pod).is_ok()) {
                        found = Some(vec![*victim]);
                        break;
                    }
                }
                if found.is_none() && victims.len() > 1 {
                    let all: Vec<JobId> = victims.iter().map(|(_, v)| *v).collect();
                    let mut prefix = Vec::new();
                    for victim in &all {
                        prefix.push(*victim);
                        if prefix.len() > 1
                            && self
                                .with_released(cluster, &prefix, |_, c| c.check(node, &pod).is_ok())
                        {
                            found = Some(prefix.clone());
                            break;
                        }
                    }
                }
                let Some(set) = found else { continue };
                let keys: Vec<VictimKey> = set.iter().map(|v| self.victim_key(*v, now)).collect();
                let cost = (
                    set.len(),
                    keys.iter().map(|k| k.0).max().unwrap_or(0),
                    keys.iter().map(|k| k.1).sum::<u64>(),
                    keys.iter().map(|k| k.2 + k.3).sum::<u64>(),
                    node,
                );
                if best.as_ref().is_none_or(|(c, _)| cost < *c) {
                    best = Some((cost, set));
                }
            }
            return best.map(|(cost, set)| (set, BTreeSet::from([cost.4])));
        }
        // Gang: the shortest cheapest-first prefix that lets the gang fit (binary search;
        // fitting is monotone in practice), then drop victims on nodes the gang does not use.
        let all: Vec<JobId> = candidates.iter().map(|(_, v)| *v).collect();
        let fits = |queue: &mut Self, cluster: &mut Cluster, set: &[JobId]| {
            queue.with_released(cluster, set, |q, c| q.try_place(c, job).ok())
        };
        fits(self, cluster, &all)?;
        let (mut lo, mut hi) = (1usize, all.len());
        while lo < hi {
            let mid = (lo + hi) / 2;
            if fits(self, cluster, &all[..mid]).is_some() {
                hi = mid;
            } else {
                lo = mid + 1;
            }
        }
        let prefix = all[..lo].to_vec();
        let bindings = fits(self, cluster, &prefix)?;
        let used: BTreeSet<usize> = bindings.iter().map(|b| b.node).collect();
        let pruned: Vec<JobId> = prefix
            .iter()
            .copied()
            .filter(|v| match self.state(*v) {
                Some(JobState::Running { bindings, .. }) => {
                    bindings.iter().any(|b| used.contains(&b.node))
                }
                _ => false,
            })
            .collect();
        match fits(self, cluster, &pruned) {
            Some(bindings) if !pruned.is_empty() => {
                Some((pruned, bindings.iter().map(|b| b.node).collect()))
            }
            _ => Some((prefix, used)),
        }
    }
}
