//! What devices report serving: each agent's usage records ([`nephele_proto::UsageRecord`],
//! kept on the device until counted) are added to the device's totals once per sequence
//! number and acknowledged, so a record resent after a partition or a restart is not
//! counted twice. Read with `GET /v1/devices/{name}/usage`.
//!
//! Each counted record is also added to its deployment's hour ([`UsageHour`], the hour
//! its window started in), with the deployment's tenant, for the chargeback reports
//! (`GET /v1/reports/…`); hours are kept for [`USAGE_RETENTION_HOURS`].

use std::collections::BTreeMap;

use actix::prelude::*;
use nephele_proto::UsageReport;
use serde::{Deserialize, Serialize};

use super::{ApiError, FederationActor};

pub use nephele_api::{Served, UsageTotals};

/// Hours of served requests kept per deployment (90 days, as the ledger keeps).
pub const USAGE_RETENTION_HOURS: u64 = 90 * 24;

/// What the devices served of one deployment in one hour (store key
/// [`UsageHour::key`]).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct UsageHour {
    /// Unix seconds of the hour's start.
    pub hour: u64,
    pub deployment: String,
    /// The deployment's tenant when the first record of the hour was counted (`""`:
    /// the deployment was gone by then).
    pub tenant: String,
    pub served: Served,
    /// Usage records counted into it.
    pub records: u64,
}

impl UsageHour {
    pub fn key_of(hour: u64, deployment: &str) -> String {
        format!("{hour:012}/{deployment}")
    }

    pub fn key(&self) -> String {
        Self::key_of(self.hour, &self.deployment)
    }

    /// The unix hour a record is counted in: the one its window started in.
    pub fn hour_of(record: &nephele_proto::UsageRecord) -> u64 {
        let start_s = record.start_unix_ms / 1000;
        start_s - start_s % 3600
    }
}

/// How a device's totals count its records (each once).
pub trait Counting {
    /// The records of `report` this would count (not counted yet), in order.
    fn new_records<'a>(&self, report: &'a UsageReport) -> Vec<&'a nephele_proto::UsageRecord>;
    /// Adds the records not counted yet; whether anything changed.
    fn apply(&mut self, report: &UsageReport) -> bool;
}

impl Counting for UsageTotals {
    fn new_records<'a>(&self, report: &'a UsageReport) -> Vec<&'a nephele_proto::UsageRecord> {
        let mut last = self.last_seq;
        let mut out = Vec::new();
        for record in &report.records {
            if record.seq > last {
                last = record.seq;
                out.push(record);
            }
        }
        out
    }

    fn apply(&mut self, report: &UsageReport) -> bool {
        let mut changed = report.dropped != self.dropped;
        self.dropped = report.dropped;
        for record in &report.records {
            if record.seq <= self.last_seq {
                continue;
            }
            let served = self
                .deployments
                .entry(record.deployment.clone())
                .or_default();
            served.served_local = served.served_local.saturating_add(record.served_local);
            served.served_offloaded = served
                .served_offloaded
                .saturating_add(record.served_offloaded);
            served.failed = served.failed.saturating_add(record.failed);
            self.last_seq = record.seq;
            self.records += 1;
            if self.first_unix_ms == 0 {
                self.first_unix_ms = record.start_unix_ms;
            }
            self.last_unix_ms = self.last_unix_ms.max(record.end_unix_ms);
            changed = true;
        }
        changed
    }
}

#[derive(Message)]
#[rtype(result = "()")]
pub struct AgentUsage {
    pub name: String,
    pub session_id: u64,
    pub report: UsageReport,
}

impl Handler<AgentUsage> for FederationActor {
    type Result = ();
    fn handle(&mut self, message: AgentUsage, _: &mut Self::Context) {
        let output = self
            .core
            .usage(&message.name, message.session_id, &message.report);
        // Stored before it is acknowledged: when the store refuses, nothing is acked.
        if let Err(error) = self.run(output) {
            tracing::warn!(device = %message.name, %error, "cannot store usage totals; not acknowledged");
        }
    }
}

/// `GET /v1/devices/{name}/usage`.
#[derive(Message)]
#[rtype(result = "Result<UsageTotals, ApiError>")]
pub struct GetUsage {
    pub device: String,
    /// The asking token's tenant: only its deployments' totals are shown.
    pub scope: Option<String>,
}

impl Handler<GetUsage> for FederationActor {
    type Result = Result<UsageTotals, ApiError>;
    fn handle(&mut self, message: GetUsage, _: &mut Self::Context) -> Self::Result {
        self.core
            .usage_for(&message.device, message.scope.as_deref())
    }
}

/// What devices served per deployment in the hours of `[from, to)`, and who owns each
/// deployment now (`GET /v1/reports/…`).
#[derive(Message)]
#[rtype(result = "(Vec<crate::reports::EdgeHour>, BTreeMap<String, String>)")]
pub struct GetEdgeUsage {
    pub from: u64,
    pub to: u64,
}

impl Handler<GetEdgeUsage> for FederationActor {
    type Result = MessageResult<GetEdgeUsage>;
    fn handle(&mut self, message: GetEdgeUsage, _: &mut Self::Context) -> Self::Result {
        MessageResult(self.core.edge_usage_between(message.from, message.to))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use nephele_proto::UsageRecord;

    fn record(seq: u64, local: u64) -> UsageRecord {
        UsageRecord {
            seq,
            start_unix_ms: seq * 10,
            end_unix_ms: seq * 10 + 10,
            deployment: "digits".into(),
            served_local: local,
            served_offloaded: 1,
            failed: 0,
        }
    }

    #[test]
    fn a_record_sent_again_is_counted_once() {
        let mut totals = UsageTotals::default();
        let first = UsageReport {
            records: vec![record(1, 5), record(2, 3)],
            dropped: 0,
        };
        assert!(totals.apply(&first));
        // The acknowledgement was lost: the agent sends 1 and 2 again, with 3.
        let again = UsageReport {
            records: vec![record(1, 5), record(2, 3), record(3, 2)],
            dropped: 0,
        };
        assert!(totals.apply(&again));
        assert!(!totals.apply(&again));
        assert_eq!(totals.last_seq, 3);
        assert_eq!(totals.records, 3);
        assert_eq!(totals.deployments["digits"].served_local, 10);
        assert_eq!(totals.deployments["digits"].served_offloaded, 3);
        assert_eq!((totals.first_unix_ms, totals.last_unix_ms), (10, 40));
    }
}
