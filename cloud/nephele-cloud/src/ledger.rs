//! What the region's pool nodes were used for, hour by hour: the books chargeback and
//! showback reports are made from (`GET /v1/reports/cost|carbon`, the `reports` module).
//! Pure, no clock: the scheduler calls [`Ledger::accrue`] on every tick with what holds
//! resources now, and the interval since the last call is charged to it.
//!
//! What one member of a job (or one serving replica) costs while it holds its place,
//! per second:
//!
//! | figure         | per second                                                         |
//! |----------------|--------------------------------------------------------------------|
//! | GPU-seconds    | GPUs held (a 500-milli share counts 0.5; a MIG slice its share)     |
//! | CPU-seconds    | cores held                                                         |
//! | node share     | the largest of its shares of the node's CPU, memory and GPUs       |
//! | cost           | node share × the pool's price per node-hour / 3600                  |
//! | energy         | node share × the node's rated power (its profile's `power_budget_w`) |
//!
//! The node share is dominant-resource allocation, as the queue's fairness counts it: a
//! pod holding one of eight GPUs and half the node's memory pays for half the node,
//! since nobody else can use that memory. Energy is the rated (maximum) power, an upper
//! bound: nodes report no power draw yet. Carbon is not kept here: a report multiplies
//! each hour's energy by that hour's measured carbon intensity when it is asked, so
//! figures pushed late still count.
//!
//! What is held is charged from the tick that sees it placed to the tick that sees it
//! gone (a job that ends between two ticks is charged to the next tick, at most
//! `scheduler.tick_ms` more). After a restart, the first tick charges the time since
//! the last written hour to what the books restored as running, which kept running on
//! its nodes while the control plane was down.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

/// Hours kept (90 days, as the grid series keeps).
pub const RETENTION_HOURS: u64 = 90 * 24;

/// Longest interval one call charges: a clock that jumps forward (or a control plane
/// down for longer) is charged at most this much, the rest is left out and logged by
/// the caller.
pub const MAX_GAP_S: u64 = 7 * 24 * 3600;

const HOUR_S: u64 = 3600;

/// Who an amount is charged to.
#[derive(
    Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, schemars::JsonSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum AccountKind {
    /// A job a tenant submitted.
    Job,
    /// A deployment's cloud replicas (charged to the deployment's tenant by the report).
    Deployment,
}

/// An account: a job of a tenant, or a deployment's replicas, in one pool.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct Account {
    /// The job's tenant; for a deployment, the scheduler's serving tenant (the report
    /// knows whose deployment it is).
    pub tenant: String,
    pub kind: AccountKind,
    pub name: String,
    pub pool: String,
}

/// What an account used in one hour (or in any range, summed).
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct Usage {
    /// GPU-milli × seconds (exact: 1,000 of them are one GPU-second).
    pub gpu_milli_seconds: u64,
    /// CPU-milli × seconds.
    pub cpu_milli_seconds: u64,
    /// Memory MiB × seconds.
    pub memory_mib_seconds: u64,
    /// Node-seconds: the node share (see the module's table) × seconds.
    pub node_seconds: f64,
    /// The pool's price unit (its `price_per_hour`).
    pub cost: f64,
    pub energy_kwh: f64,
}

impl Usage {
    pub fn add(&mut self, other: &Usage) {
        self.gpu_milli_seconds = self
            .gpu_milli_seconds
            .saturating_add(other.gpu_milli_seconds);
        self.cpu_milli_seconds = self
            .cpu_milli_seconds
            .saturating_add(other.cpu_milli_seconds);
        self.memory_mib_seconds = self
            .memory_mib_seconds
            .saturating_add(other.memory_mib_seconds);
        self.node_seconds += other.node_seconds;
        self.cost += other.cost;
        self.energy_kwh += other.energy_kwh;
    }

    pub fn gpu_seconds(&self) -> f64 {
        self.gpu_milli_seconds as f64 / 1000.0
    }

    pub fn cpu_seconds(&self) -> f64 {
        self.cpu_milli_seconds as f64 / 1000.0
    }
}

/// A node as its holders pay for it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct NodeRate {
    pub cpu_milli: u64,
    pub memory_mib: u64,
    /// Whole GPUs on the node.
    pub gpus: u8,
    pub price_per_hour: f64,
    pub power_w: f64,
}

/// One member placed on a node, as [`Ledger::accrue`] charges it.
#[derive(Debug, Clone, PartialEq)]
pub struct Allocation {
    pub account: Account,
    pub cpu_milli: u64,
    pub memory_mib: u64,
    pub gpu_milli: u64,
    pub node: NodeRate,
}

impl Allocation {
    /// The member's dominant share of its node, in [0, 1].
    pub fn node_share(&self) -> f64 {
        let share = |used: u64, capacity: u64| {
            if capacity == 0 {
                0.0
            } else {
                (used as f64 / capacity as f64).min(1.0)
            }
        };
        share(self.cpu_milli, self.node.cpu_milli)
            .max(share(self.memory_mib, self.node.memory_mib))
            .max(share(self.gpu_milli, u64::from(self.node.gpus) * 1000))
    }

    fn usage(&self, seconds: u64) -> Usage {
        let share = self.node_share();
        let node_seconds = share * seconds as f64;
        let finite = |v: f64| if v.is_finite() && v > 0.0 { v } else { 0.0 };
        Usage {
            gpu_milli_seconds: self.gpu_milli.saturating_mul(seconds),
            cpu_milli_seconds: self.cpu_milli.saturating_mul(seconds),
            memory_mib_seconds: self.memory_mib.saturating_mul(seconds),
            node_seconds,
            cost: node_seconds * finite(self.node.price_per_hour) / HOUR_S as f64,
            energy_kwh: node_seconds * finite(self.node.power_w) / 3.6e6,
        }
    }
}

/// One hour of the ledger as the books store it (`<region>/<hour>` in the region's
/// ledger table).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct HourRecord {
    /// Unix seconds of the hour's start.
    pub hour: u64,
    /// Charged up to here (unix seconds) when the record was written.
    pub accrued_until: u64,
    pub accounts: Vec<(Account, Usage)>,
}

/// The region's usage, hour by hour (see the module's doc).
#[derive(Debug, Clone, Default)]
pub struct Ledger {
    hours: BTreeMap<u64, BTreeMap<Account, Usage>>,
    /// Charged up to here; `None` before the first call.
    accrued_until: Option<u64>,
    /// Hours changed since [`Ledger::take_dirty`].
    dirty: BTreeSet<u64>,
}

/// What one call of [`Ledger::accrue`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Accrued {
    /// Seconds charged.
    pub seconds: u64,
    /// Seconds left out (a gap over [`MAX_GAP_S`]).
    pub skipped_s: u64,
}

impl Ledger {
    /// Charges every allocation for the time since the last call (none on the first).
    /// Time that runs backwards charges nothing and keeps the later mark.
    pub fn accrue(&mut self, now: u64, allocations: &[Allocation]) -> Accrued {
        let Some(from) = self.accrued_until else {
            self.accrued_until = Some(now);
            let hour = now - now % HOUR_S;
            self.hours.entry(hour).or_default();
            self.dirty.insert(hour);
            return Accrued::default();
        };
        if now <= from {
            return Accrued::default();
        }
        let mut accrued = Accrued::default();
        let mut start = from;
        if now - from > MAX_GAP_S {
            accrued.skipped_s = now - from - MAX_GAP_S;
            start = now - MAX_GAP_S;
        }
        accrued.seconds = now - start;
        while start < now {
            let hour = start - start % HOUR_S;
            let end = (hour + HOUR_S).min(now);
            let seconds = end - start;
            // An hour with nothing held is kept too (empty): its record carries the
            // mark a restarted region resumes charging from.
            let accounts = self.hours.entry(hour).or_default();
            for allocation in allocations {
                accounts
                    .entry(allocation.account.clone())
                    .or_default()
                    .add(&allocation.usage(seconds));
            }
            self.dirty.insert(hour);
            start = end;
        }
        self.accrued_until = Some(now);
        self.prune(now);
        accrued
    }

    fn prune(&mut self, now: u64) {
        let oldest = (now - now % HOUR_S).saturating_sub(RETENTION_HOURS * HOUR_S);
        let kept = self.hours.split_off(&oldest);
        let dropped: Vec<u64> = self.hours.keys().copied().collect();
        self.hours = kept;
        for hour in dropped {
            self.dirty.insert(hour);
        }
    }

    /// Charged up to here.
    pub fn accrued_until(&self) -> Option<u64> {
        self.accrued_until
    }

    /// Every (hour, account, usage) with `from_hour <= hour < to_hour`.
    pub fn range(
        &self,
        from_hour: u64,
        to_hour: u64,
    ) -> impl Iterator<Item = (u64, &Account, &Usage)> + '_ {
        self.hours
            .range(from_hour..to_hour.max(from_hour))
            .flat_map(|(hour, accounts)| accounts.iter().map(move |(a, u)| (*hour, a, u)))
    }

    /// The hours changed since the last call: each one's record, or `None` for an
    /// hour dropped (past the retention). The caller writes them.
    pub fn take_dirty(&mut self) -> Vec<(u64, Option<HourRecord>)> {
        let dirty = std::mem::take(&mut self.dirty);
        let until = self.accrued_until.unwrap_or(0);
        dirty
            .into_iter()
            .map(|hour| {
                let record = self.hours.get(&hour).map(|accounts| HourRecord {
                    hour,
                    accrued_until: until,
                    accounts: accounts.iter().map(|(a, u)| (a.clone(), *u)).collect(),
                });
                (hour, record)
            })
            .collect()
    }

    /// Marks hours as not written (a write that failed is tried again).
    pub fn mark_dirty(&mut self, hours: impl IntoIterator<Item = u64>) {
        self.dirty.extend(hours);
    }

    /// The ledger from its stored hours: charging resumes from the latest
    /// `accrued_until` among them.
    pub fn restore(records: impl IntoIterator<Item = HourRecord>) -> Ledger {
        let mut ledger = Ledger::default();
        for record in records {
            ledger.accrued_until =
                Some(ledger.accrued_until.unwrap_or(0).max(record.accrued_until));
            ledger
                .hours
                .insert(record.hour, record.accounts.into_iter().collect());
        }
        ledger
    }
}

/// One region's ledger entries in the range, and its measured carbon per hour.
#[derive(Debug, Clone, Default)]
pub struct RegionLedger {
    pub region: String,
    /// (hour, tenant as the scheduler has it, kind, name, usage).
    pub entries: Vec<(u64, String, AccountKind, String, Usage)>,
    /// Measured gCO₂eq/kWh per unix hour.
    pub carbon: BTreeMap<u64, f64>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn node() -> NodeRate {
        NodeRate {
            cpu_milli: 48_000,
            memory_mib: 196_608,
            gpus: 4,
            price_per_hour: 3.6,
            power_w: 1_200.0,
        }
    }

    fn allocation(name: &str, gpu_milli: u64) -> Allocation {
        Allocation {
            account: Account {
                tenant: "team-a".into(),
                kind: AccountKind::Job,
                name: name.into(),
                pool: "l4".into(),
            },
            cpu_milli: 4_000,
            memory_mib: 16_384,
            gpu_milli,
            node: node(),
        }
    }

    fn total(ledger: &Ledger) -> BTreeMap<Account, Usage> {
        let mut out: BTreeMap<Account, Usage> = BTreeMap::new();
        for (_, account, usage) in ledger.range(0, u64::MAX) {
            out.entry(account.clone()).or_default().add(usage);
        }
        out
    }

    #[test]
    fn one_gpu_of_four_for_an_hour_pays_a_quarter_of_the_node() {
        let mut ledger = Ledger::default();
        let held = [allocation("train", 1000)];
        ledger.accrue(7200, &held);
        ledger.accrue(7200 + 1800, &held);
        ledger.accrue(7200 + 3600, &held);
        let usage = total(&ledger)[&held[0].account];
        assert_eq!(usage.gpu_milli_seconds, 3_600_000);
        assert_eq!(usage.gpu_seconds(), 3600.0);
        assert_eq!(usage.cpu_seconds(), 4.0 * 3600.0);
        assert!((usage.cost - 0.9).abs() < 1e-9, "{}", usage.cost);
        assert!(
            (usage.energy_kwh - 0.3).abs() < 1e-9,
            "{}",
            usage.energy_kwh
        );
    }

    #[test]
    fn memory_dominates_when_it_is_the_larger_share() {
        let mut held = allocation("big-memory", 0);
        held.memory_mib = 98_304;
        assert!((held.node_share() - 0.5).abs() < 1e-12);
    }

    #[test]
    fn an_interval_across_hours_is_split_at_the_hour() {
        let mut ledger = Ledger::default();
        let held = [allocation("train", 500)];
        ledger.accrue(3600 - 600, &held);
        ledger.accrue(3600 + 300, &held);
        let hours: Vec<(u64, u64)> = ledger
            .range(0, u64::MAX)
            .map(|(h, _, u)| (h, u.gpu_milli_seconds))
            .collect();
        assert_eq!(hours, vec![(0, 500 * 600), (3600, 500 * 300)]);
    }

    #[test]
    fn a_long_gap_is_charged_up_to_the_cap_and_says_what_it_left_out() {
        let mut ledger = Ledger::default();
        let held = [allocation("train", 1000)];
        ledger.accrue(0, &held);
        let accrued = ledger.accrue(MAX_GAP_S + 100, &held);
        assert_eq!(accrued.skipped_s, 100);
        assert_eq!(accrued.seconds, MAX_GAP_S);
    }

    #[test]
    fn hours_past_the_retention_are_dropped_and_written_as_deleted() {
        let mut ledger = Ledger::default();
        let held = [allocation("train", 1000)];
        ledger.accrue(0, &held);
        ledger.accrue(10, &held);
        ledger.take_dirty();
        ledger.accrue(RETENTION_HOURS * HOUR_S + 5 * HOUR_S, &[]);
        let dirty = ledger.take_dirty();
        assert!(dirty.contains(&(0, None)), "{dirty:?}");
        assert_eq!(ledger.range(0, u64::MAX).count(), 0);
    }

    #[test]
    fn the_mark_is_written_before_anything_is_held() {
        // A region starts, then places a job: a crash before anything is charged must
        // still find where charging stands.
        let mut ledger = Ledger::default();
        ledger.accrue(100, &[]);
        ledger.accrue(101, &[]);
        let records: Vec<HourRecord> = ledger
            .take_dirty()
            .into_iter()
            .filter_map(|(_, r)| r)
            .collect();
        assert_eq!(records.len(), 1);
        let held = [allocation("train", 1000)];
        let mut restored = Ledger::restore(records);
        restored.accrue(160, &held);
        assert_eq!(
            total(&restored)[&held[0].account].gpu_milli_seconds,
            1000 * 59
        );
    }

    #[test]
    fn a_restored_ledger_resumes_where_its_records_end() {
        let mut ledger = Ledger::default();
        let held = [allocation("train", 1000)];
        ledger.accrue(100, &held);
        ledger.accrue(400, &held);
        let records: Vec<HourRecord> = ledger
            .take_dirty()
            .into_iter()
            .filter_map(|(_, r)| r)
            .collect();
        let mut restored = Ledger::restore(records);
        assert_eq!(restored.accrued_until(), Some(400));
        // The control plane was down from 400 to 1000; the job ran on.
        restored.accrue(1000, &held);
        assert_eq!(
            total(&restored)[&held[0].account].gpu_milli_seconds,
            1000 * 900
        );
    }

    proptest! {
        /// However the ticks fall, what is charged is the allocation × the time from
        /// the first tick to the last, split into whole hours that add up.
        #[test]
        fn charges_add_up_whatever_the_ticks(
            start in 0u64..100_000,
            steps in proptest::collection::vec(0u64..5_000, 1..40),
            gpu_milli in 0u64..4_000,
        ) {
            let held = [allocation("train", gpu_milli)];
            let mut ledger = Ledger::default();
            let mut now = start;
            ledger.accrue(now, &held);
            for step in &steps {
                now += step;
                ledger.accrue(now, &held);
            }
            let seconds = now - start;
            let usage = total(&ledger).get(&held[0].account).copied().unwrap_or_default();
            prop_assert_eq!(usage.gpu_milli_seconds, gpu_milli * seconds);
            prop_assert_eq!(usage.cpu_milli_seconds, 4_000 * seconds);
            let expected_cost = held[0].node_share() * seconds as f64 * 3.6 / 3600.0;
            prop_assert!((usage.cost - expected_cost).abs() <= 1e-9 * expected_cost.max(1.0));
            for (hour, _, usage) in ledger.range(0, u64::MAX) {
                prop_assert_eq!(hour % HOUR_S, 0);
                prop_assert!(usage.cpu_milli_seconds <= 4_000 * HOUR_S);
            }
        }

        /// Time going backwards never charges and never moves the mark back.
        #[test]
        fn time_going_back_charges_nothing(first in 1_000u64..10_000, back in 1u64..1_000) {
            let held = [allocation("train", 1000)];
            let mut ledger = Ledger::default();
            ledger.accrue(first, &held);
            ledger.accrue(first - back, &held);
            prop_assert_eq!(ledger.accrued_until(), Some(first));
            prop_assert_eq!(ledger.range(0, u64::MAX).count(), 0);
        }
    }
}
