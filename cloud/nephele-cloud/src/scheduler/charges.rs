//! The scheduler's side of the ledger ([`super::ledger`]): what holds a place on a node
//! now, as allocations to charge, and the ledger's records for the books.

use nephele_placement::queue::JobState;
use nephele_placement::{Binding, Job};

use super::{Hold, JobKind, RegionScheduler};
use crate::ledger::{Account, AccountKind, Accrued, Allocation, HourRecord, Ledger, NodeRate};

impl RegionScheduler {
    /// Every member that holds a place now: running and terminating jobs and replicas,
    /// and those restored as running that wait for their agents (their processes run).
    pub(super) fn allocations(&self) -> Vec<Allocation> {
        let mut out = Vec::new();
        for (job, state) in self.queue.jobs() {
            let bindings = match state {
                JobState::Running { bindings, .. } | JobState::Terminating { bindings, .. } => {
                    bindings
                }
                JobState::Pending | JobState::Finished { .. } => continue,
            };
            self.charge(job, bindings, &mut out);
        }
        for (_, meta) in self.held_jobs() {
            if let Some((job, Hold::Recovering { bindings, .. })) = &meta.held {
                if let Some(resolved) = self.resolve(bindings) {
                    self.charge(job, &resolved, &mut out);
                }
            }
        }
        out
    }

    fn charge(&self, job: &Job, bindings: &[Binding], out: &mut Vec<Allocation>) {
        let Some(meta) = self.jobs.get(&job.id) else {
            return;
        };
        let (kind, name) = match &meta.kind {
            JobKind::Batch => (AccountKind::Job, meta.name.clone()),
            JobKind::Replica { deployment } => (AccountKind::Deployment, deployment.clone()),
        };
        for (member, binding) in job.members.iter().zip(bindings) {
            let (Some(slot), Some(node)) = (
                self.slots.get(binding.node),
                self.cluster.nodes.get(binding.node),
            ) else {
                continue;
            };
            out.push(Allocation {
                account: Account {
                    tenant: self.tenants[meta.tenant].clone(),
                    kind: kind.clone(),
                    name: name.clone(),
                    pool: slot.pool.clone(),
                },
                cpu_milli: member.cpu_milli,
                memory_mib: member.memory_mib,
                gpu_milli: member.gpu_total(),
                node: NodeRate {
                    cpu_milli: node.cpu_milli,
                    memory_mib: node.memory_mib,
                    gpus: node.gpus,
                    price_per_hour: slot.price_per_hour,
                    power_w: slot.power_w,
                },
            });
        }
    }

    /// Charges what held a place since the last call; called first thing on every
    /// tick, before the tick changes what is placed.
    pub(super) fn accrue(&mut self, now: u64) -> Accrued {
        // Nothing to charge within the second already charged: the allocations (one
        // per running job) are not worth gathering for every batch of submissions.
        if self
            .ledger
            .accrued_until()
            .is_some_and(|until| now <= until)
        {
            return Accrued::default();
        }
        let allocations = self.allocations();
        self.ledger.accrue(now, &allocations)
    }

    /// The ledger, for reports.
    pub fn ledger(&self) -> &Ledger {
        &self.ledger
    }

    /// The ledger's hours changed since the last call, for the books (`None`: delete).
    pub fn take_ledger_records(&mut self) -> Vec<(u64, Option<HourRecord>)> {
        self.ledger.take_dirty()
    }

    /// Hours whose write failed, to be written again.
    pub fn ledger_unwritten(&mut self, hours: impl IntoIterator<Item = u64>) {
        self.ledger.mark_dirty(hours);
    }

    /// The ledger from the books.
    pub fn restore_ledger(&mut self, records: Vec<HourRecord>) {
        self.ledger = Ledger::restore(records);
    }
}

impl RegionScheduler {
    /// The ledger's entries for the hours in `[from, to)` (unix seconds) and the
    /// region's measured carbon in those hours, for a report.
    pub fn ledger_between(&self, from: u64, to: u64) -> crate::ledger::RegionLedger {
        let entries: Vec<_> = self
            .ledger
            .range(from, to)
            .map(|(hour, account, usage)| {
                (
                    hour,
                    account.tenant.clone(),
                    account.kind.clone(),
                    account.name.clone(),
                    *usage,
                )
            })
            .collect();
        let carbon = entries
            .iter()
            .map(|(hour, ..)| *hour)
            .collect::<std::collections::BTreeSet<u64>>()
            .into_iter()
            .filter_map(|hour| self.grid.carbon_at(hour / 3600).map(|c| (hour, c)))
            .collect();
        crate::ledger::RegionLedger {
            region: self.region.clone(),
            entries,
            carbon,
        }
    }
}
