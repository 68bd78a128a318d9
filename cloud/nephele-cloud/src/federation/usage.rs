//! What devices report serving: each agent's usage records ([`nephele_proto::UsageRecord`],
//! kept on the device until counted) are added to the device's totals once per sequence
//! number and acknowledged, so a record resent after a partition or a restart is not
//! counted twice. Read with `GET /v1/devices/{name}/usage`.

use std::collections::BTreeMap;

use actix::prelude::*;
use nephele_proto::UsageReport;
use serde::{Deserialize, Serialize};

use super::{ApiError, FederationActor};

/// What one deployment served on a device, all windows reported so far.
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema,
)]
pub struct Served {
    pub served_local: u64,
    pub served_offloaded: u64,
    pub failed: u64,
}

/// A device's usage totals (the store's record and the API's view).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct UsageTotals {
    pub device: String,
    /// The highest record counted; records up to it are acknowledged.
    pub last_seq: u64,
    /// Records counted.
    pub records: u64,
    /// Records the device dropped because its queue was full (never counted).
    pub dropped: u64,
    /// The first and last window counted, Unix milliseconds (0: none).
    pub first_unix_ms: u64,
    pub last_unix_ms: u64,
    pub deployments: BTreeMap<String, Served>,
}

impl UsageTotals {
    /// Adds the records not counted yet; whether anything changed.
    pub fn apply(&mut self, report: &UsageReport) -> bool {
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
pub struct GetUsage(pub String);

impl Handler<GetUsage> for FederationActor {
    type Result = Result<UsageTotals, ApiError>;
    fn handle(&mut self, message: GetUsage, _: &mut Self::Context) -> Self::Result {
        self.core.usage_of(&message.0)
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
