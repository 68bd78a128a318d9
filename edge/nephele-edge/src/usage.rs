//! What the agent served, kept until the control plane has counted it.
//!
//! Every window (`--usage-window-ms`, a minute by default) the agent turns the growth of
//! each deployment's counters into a [`UsageRecord`] with the next sequence number and
//! appends it to a bounded queue kept on the device (`usage-queue.json`, rewritten
//! atomically after each change). The session sends what is not acknowledged yet with
//! each heartbeat; the control plane counts each sequence number once and acknowledges
//! up to the highest it has, and the agent then forgets those. So a record survives a
//! partition and a restart and is counted exactly once. Past the bound the oldest
//! records are dropped, and counted, and the count travels with the next report.
//!
//! What is served after the last window closed and before a crash (at most one window)
//! is not recorded: counters live in memory.

use std::collections::{BTreeMap, VecDeque};
use std::path::Path;

use nephele_proto::{DeploymentTelemetry, UsageRecord, UsageReport};
use serde::{Deserialize, Serialize};

pub const QUEUE_FILE: &str = "usage-queue.json";

/// Wall-clock time in Unix milliseconds (windows are stamped with it).
pub fn now_unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// The queue (pure: no IO, times as arguments).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct UsageQueue {
    records: VecDeque<UsageRecord>,
    next_seq: u64,
    dropped: u64,
    bound: usize,
}

/// Counters of one deployment at the end of the last window.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counters {
    pub served_local: u64,
    pub served_offloaded: u64,
    pub failed: u64,
    /// The bytes those counters are of: another model version starts from 0.
    pub model_sha256: [u8; 32],
}

impl UsageQueue {
    /// The most records a queue keeps by default: a week of one deployment's minutes.
    pub const DEFAULT_BOUND: usize = 10_080;
    /// The most records one report carries.
    pub const REPORT_MAX: usize = 1_000;

    pub fn new(bound: usize) -> UsageQueue {
        UsageQueue {
            records: VecDeque::new(),
            next_seq: 1,
            dropped: 0,
            bound: bound.max(1),
        }
    }

    /// Records the window `[start, end)` from the counters now and at its start
    /// (`last`, updated to `now`). A deployment that now runs another model version
    /// (a rollout swapped it) counts from 0. One that served nothing, or whose counters
    /// went back (it was loaded again), adds no record for what it cannot tell. Returns
    /// whether anything was added.
    pub fn record_window(
        &mut self,
        start_unix_ms: u64,
        end_unix_ms: u64,
        now: &[DeploymentTelemetry],
        last: &mut BTreeMap<String, Counters>,
    ) -> bool {
        let mut added = false;
        let mut seen = BTreeMap::new();
        for deployment in now {
            let current = Counters {
                served_local: deployment.served_local,
                served_offloaded: deployment.served_offloaded,
                failed: deployment.failed,
                model_sha256: deployment.model_sha256,
            };
            let before = last
                .get(&deployment.deployment)
                .copied()
                .filter(|before| before.model_sha256 == current.model_sha256)
                .unwrap_or_default();
            seen.insert(deployment.deployment.clone(), current);
            let grew = |now: u64, then: u64| now.checked_sub(then);
            let (Some(local), Some(offloaded), Some(failed)) = (
                grew(current.served_local, before.served_local),
                grew(current.served_offloaded, before.served_offloaded),
                grew(current.failed, before.failed),
            ) else {
                // Reloaded: its counters started again from 0 (counted from now).
                continue;
            };
            if local + offloaded + failed == 0 {
                continue;
            }
            self.push(UsageRecord {
                seq: 0,
                start_unix_ms,
                end_unix_ms,
                deployment: deployment.deployment.clone(),
                served_local: local,
                served_offloaded: offloaded,
                failed,
            });
            added = true;
        }
        *last = seen;
        added
    }

    fn push(&mut self, mut record: UsageRecord) {
        record.seq = self.next_seq;
        self.next_seq += 1;
        self.records.push_back(record);
        while self.records.len() > self.bound {
            self.records.pop_front();
            self.dropped += 1;
        }
    }

    /// The oldest records not acknowledged yet (at most [`Self::REPORT_MAX`]); none
    /// when everything is acknowledged.
    pub fn report(&self) -> Option<UsageReport> {
        (!self.records.is_empty()).then(|| UsageReport {
            records: self
                .records
                .iter()
                .take(Self::REPORT_MAX)
                .cloned()
                .collect(),
            dropped: self.dropped,
        })
    }

    /// Forgets the records up to `up_to`; whether any were.
    pub fn ack(&mut self, up_to: u64) -> bool {
        let before = self.records.len();
        while self.records.front().is_some_and(|r| r.seq <= up_to) {
            self.records.pop_front();
        }
        self.records.len() != before
    }

    pub fn pending(&self) -> usize {
        self.records.len()
    }

    pub fn dropped(&self) -> u64 {
        self.dropped
    }

    /// The queue kept in `data_dir`, or a new one (a damaged file is reported and
    /// replaced: the sequence goes on from after the highest it could read, if any).
    pub fn load(data_dir: &Path, bound: usize) -> Result<UsageQueue, (UsageQueue, String)> {
        let path = data_dir.join(QUEUE_FILE);
        let text = match std::fs::read(&path) {
            Ok(text) => text,
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => {
                return Ok(UsageQueue::new(bound))
            }
            Err(error) => return Err((UsageQueue::new(bound), error.to_string())),
        };
        match serde_json::from_slice::<UsageQueue>(&text) {
            Ok(mut queue) => {
                queue.bound = bound.max(1);
                while queue.records.len() > queue.bound {
                    queue.records.pop_front();
                    queue.dropped += 1;
                }
                Ok(queue)
            }
            Err(error) => Err((UsageQueue::new(bound), format!("{error}"))),
        }
    }

    /// Keeps the queue in `data_dir` (atomically, 0600).
    pub fn save(&self, data_dir: &Path) -> anyhow::Result<()> {
        crate::config::write_file(
            &data_dir.join(QUEUE_FILE),
            &serde_json::to_vec(self)?,
            0o600,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use nephele_proto::DeploymentPhase;
    use proptest::prelude::*;

    fn telemetry(name: &str, local: u64, offloaded: u64, failed: u64) -> DeploymentTelemetry {
        let mut t = DeploymentTelemetry::idle(name, DeploymentPhase::Ready);
        t.served_local = local;
        t.served_offloaded = offloaded;
        t.failed = failed;
        t
    }

    #[test]
    fn a_new_model_version_counts_from_zero() {
        let mut queue = UsageQueue::new(100);
        let mut last = BTreeMap::new();
        let mut old = telemetry("a", 100, 0, 0);
        old.model_sha256 = [1; 32];
        assert!(queue.record_window(0, 10, &[old], &mut last));
        // Swapped to another version: its counters started again, and what it served
        // since (7) is counted, not lost.
        let mut new = telemetry("a", 7, 0, 0);
        new.model_sha256 = [2; 32];
        assert!(queue.record_window(10, 20, &[new], &mut last));
        let served: Vec<u64> = queue.records.iter().map(|r| r.served_local).collect();
        assert_eq!(served, vec![100, 7]);
        // The same bytes loaded again (counters back) still add nothing they cannot tell.
        let mut again = telemetry("a", 3, 0, 0);
        again.model_sha256 = [2; 32];
        assert!(!queue.record_window(20, 30, &[again], &mut last));
    }

    #[test]
    fn windows_become_numbered_records_until_acknowledged() {
        let mut queue = UsageQueue::new(100);
        let mut last = BTreeMap::new();
        assert!(!queue.record_window(0, 10, &[telemetry("a", 0, 0, 0)], &mut last));
        assert!(queue.report().is_none());
        assert!(queue.record_window(
            10,
            20,
            &[telemetry("a", 5, 2, 1), telemetry("b", 1, 0, 0)],
            &mut last
        ));
        assert!(!queue.record_window(
            20,
            30,
            &[telemetry("a", 5, 2, 1), telemetry("b", 1, 0, 0)],
            &mut last
        ));
        assert!(queue.record_window(30, 40, &[telemetry("a", 9, 2, 1)], &mut last));
        let report = queue.report().unwrap();
        let seqs: Vec<u64> = report.records.iter().map(|r| r.seq).collect();
        assert_eq!(seqs, vec![1, 2, 3]);
        assert_eq!(
            (
                report.records[0].served_local,
                report.records[0].served_offloaded,
                report.records[0].failed
            ),
            (5, 2, 1)
        );
        assert_eq!(report.records[2].served_local, 4);
        // A reload (counters back to 0) adds nothing for that window.
        assert!(!queue.record_window(40, 50, &[telemetry("a", 1, 0, 0)], &mut last));
        assert!(queue.record_window(50, 60, &[telemetry("a", 3, 0, 0)], &mut last));
        assert!(queue.ack(2));
        assert!(!queue.ack(2));
        let seqs: Vec<u64> = queue
            .report()
            .unwrap()
            .records
            .iter()
            .map(|r| r.seq)
            .collect();
        assert_eq!(seqs, vec![3, 4]);
        assert!(queue.ack(u64::MAX));
        assert!(queue.report().is_none());
    }

    #[test]
    fn the_queue_survives_a_restart_and_a_damaged_file_is_replaced() {
        let dir = std::env::temp_dir().join(format!(
            "nephele-usage-{}-{}",
            std::process::id(),
            rand::random::<u32>()
        ));
        std::fs::create_dir_all(&dir).unwrap();
        let mut queue = UsageQueue::load(&dir, 10).unwrap();
        let mut last = BTreeMap::new();
        queue.record_window(0, 10, &[telemetry("a", 2, 0, 0)], &mut last);
        queue.save(&dir).unwrap();
        let mut back = UsageQueue::load(&dir, 10).unwrap();
        assert_eq!(back, queue);
        // Numbering goes on after a restart, whose counters start from 0 again.
        back.record_window(10, 20, &[telemetry("a", 1, 0, 0)], &mut BTreeMap::new());
        assert_eq!(back.report().unwrap().records[1].seq, 2);
        std::fs::write(dir.join(QUEUE_FILE), b"{not json").unwrap();
        let (fresh, reason) = UsageQueue::load(&dir, 10).unwrap_err();
        assert!(fresh.report().is_none());
        assert!(!reason.is_empty());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    proptest! {
        /// Whatever the windows and acknowledgements: numbers never repeat or skip, the
        /// queue never holds more than its bound, and what is kept plus what was
        /// acknowledged plus what was dropped is every record made.
        #[test]
        fn nothing_is_numbered_twice_lost_unaccounted_or_kept_past_the_bound(
            steps in proptest::collection::vec((0u64..4, 0u64..4, any::<bool>()), 1..200),
            bound in 1usize..20,
        ) {
            let mut queue = UsageQueue::new(bound);
            let mut last = BTreeMap::new();
            let (mut local, mut other) = (0u64, 0u64);
            let mut acked = 0u64;
            for (i, (grow_a, grow_b, ack)) in steps.into_iter().enumerate() {
                local += grow_a;
                other += grow_b;
                let t = i as u64 * 10;
                queue.record_window(t, t + 10, &[telemetry("a", local, 0, 0), telemetry("b", 0, other, 0)], &mut last);
                prop_assert!(queue.pending() <= bound);
                if ack {
                    if let Some(report) = queue.report() {
                        let up_to = report.records.last().map(|r| r.seq).unwrap_or(0);
                        let n = report.records.len() as u64;
                        prop_assert!(queue.ack(up_to));
                        acked += n;
                    }
                }
                let made = queue.next_seq - 1;
                prop_assert_eq!(acked + queue.pending() as u64 + queue.dropped(), made);
                if let Some(report) = queue.report() {
                    for pair in report.records.windows(2) {
                        prop_assert_eq!(pair[1].seq, pair[0].seq + 1);
                    }
                }
            }
        }
    }
}
