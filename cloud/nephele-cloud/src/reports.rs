//! Chargeback and showback: what each tenant's jobs and deployments used over a time
//! range, what it cost and what it emitted (`GET /v1/reports/cost`, `GET
//! /v1/reports/carbon`, `nephele report cost|carbon`). Pure: the API handler gathers
//! the regions' ledgers ([`crate::ledger`]), their measured carbon
//! intensity, the devices' served requests per deployment and hour
//! (the federation's `UsageHour`s) and who owns each deployment, and [`build`] joins
//! them.
//!
//! | figure | from |
//! |---|---|
//! | GPU-seconds, CPU-seconds | the pool nodes' ledgers: what each member held, × seconds |
//! | cost | node share × the pool's `price_per_hour` (the pools' price unit) |
//! | energy | node share × the node's rated power |
//! | carbon | each hour's energy × that hour's measured intensity in the region (`PUT …/grid`); energy in hours without a measurement is reported apart, never guessed |
//! | edge requests | what devices reported serving, locally and offloaded, per deployment |
//!
//! A deployment's cloud replicas are charged to the deployment's tenant (the scheduler
//! runs them in its internal `serving` tenant); a deployment deleted since is charged
//! to the tenant it had when its usage was counted. Ranges are whole hours: `from` is
//! rounded down and `to` up to the hour.

use std::collections::BTreeMap;

use crate::ledger::{AccountKind, Usage};

const HOUR_S: u64 = 3600;

/// Longest range one report covers (the ledgers keep 90 days).
pub const MAX_RANGE_S: u64 = 90 * 24 * HOUR_S;

pub use nephele_api::reports::{CarbonReport, CarbonRow, CostReport, CostRow, GroupBy};

pub use crate::ledger::RegionLedger;

/// What devices served of one deployment in one hour.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct EdgeHour {
    pub hour: u64,
    pub deployment: String,
    pub tenant: String,
    pub served_local: u64,
    pub served_offloaded: u64,
    pub failed: u64,
}

/// Everything a report is made of.
#[derive(Debug, Clone, Default)]
pub struct Inputs {
    pub regions: Vec<RegionLedger>,
    pub edge: Vec<EdgeHour>,
    /// The tenant of each deployment that exists now.
    pub owners: BTreeMap<String, String>,
    /// The scheduler's tenant for serving replicas.
    pub serving_tenant: String,
}

/// The range a report covers: whole hours, `from` inclusive, `to` exclusive.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Range {
    pub from: u64,
    pub to: u64,
}

impl Range {
    /// `from`/`to` (unix seconds) rounded out to whole hours; the default is the last
    /// 24 hours before `now`. Refused: `to` before `from`, or longer than
    /// [`MAX_RANGE_S`].
    pub fn new(from: Option<u64>, to: Option<u64>, now: u64) -> Result<Range, String> {
        let to = to.unwrap_or(now);
        let from = from.unwrap_or(to.saturating_sub(24 * HOUR_S));
        if to < from {
            return Err(format!(
                "to ({to}) is before from ({from}); give from < to, in unix seconds"
            ));
        }
        let from = from - from % HOUR_S;
        let to = to
            .div_ceil(HOUR_S)
            .saturating_mul(HOUR_S)
            .max(from.saturating_add(HOUR_S));
        if to.saturating_sub(from) > MAX_RANGE_S {
            return Err(format!(
                "the range is {} days; reports cover at most 90 days (what the ledgers keep)",
                (to - from) / (24 * HOUR_S)
            ));
        }
        Ok(Range { from, to })
    }

    pub fn contains(&self, hour: u64) -> bool {
        (self.from..self.to).contains(&hour)
    }
}

/// One (tenant, kind, name)'s sums.
#[derive(Debug, Clone, Default)]
struct Sums {
    regions: std::collections::BTreeSet<String>,
    usage: Usage,
    carbon_g: f64,
    energy_with_signal_kwh: f64,
    edge_local: u64,
    edge_offloaded: u64,
    edge_failed: u64,
}

type Key = (String, String, String);

/// Who an entry is charged to, as the report shows it.
fn charged_to(
    inputs: &Inputs,
    tenant: &str,
    kind: &AccountKind,
    name: &str,
    edge_tenants: &BTreeMap<String, String>,
) -> (String, &'static str) {
    match kind {
        AccountKind::Job => (tenant.to_string(), "job"),
        AccountKind::Deployment => {
            let owner = inputs
                .owners
                .get(name)
                .or_else(|| edge_tenants.get(name))
                .cloned()
                .unwrap_or_else(|| {
                    if tenant == inputs.serving_tenant {
                        String::new()
                    } else {
                        tenant.to_string()
                    }
                });
            (owner, "deployment")
        }
    }
}

fn sums(inputs: &Inputs, range: Range, scope: Option<&str>, group: GroupBy) -> BTreeMap<Key, Sums> {
    // A deleted deployment's tenant, as its edge usage recorded it.
    let mut edge_tenants: BTreeMap<String, String> = BTreeMap::new();
    for hour in &inputs.edge {
        if !hour.tenant.is_empty() {
            edge_tenants.insert(hour.deployment.clone(), hour.tenant.clone());
        }
    }
    let key_of = |tenant: String, kind: &str, name: &str| -> Key {
        match group {
            GroupBy::Workload => (tenant, kind.to_string(), name.to_string()),
            GroupBy::Tenant => (tenant.clone(), "tenant".to_string(), tenant),
        }
    };
    let visible = |tenant: &str| scope.is_none_or(|s| s == tenant);
    let mut out: BTreeMap<Key, Sums> = BTreeMap::new();
    for region in &inputs.regions {
        for (hour, tenant, kind, name, usage) in &region.entries {
            if !range.contains(*hour) {
                continue;
            }
            let (tenant, kind) = charged_to(inputs, tenant, kind, name, &edge_tenants);
            if !visible(&tenant) {
                continue;
            }
            let sums = out.entry(key_of(tenant, kind, name)).or_default();
            sums.regions.insert(region.region.clone());
            sums.usage.add(usage);
            if let Some(intensity) = region
                .carbon
                .get(hour)
                .filter(|c| c.is_finite() && **c >= 0.0)
            {
                sums.carbon_g += usage.energy_kwh * intensity;
                sums.energy_with_signal_kwh += usage.energy_kwh;
            }
        }
    }
    for hour in &inputs.edge {
        if !range.contains(hour.hour) {
            continue;
        }
        let tenant = inputs
            .owners
            .get(&hour.deployment)
            .cloned()
            .unwrap_or_else(|| hour.tenant.clone());
        if !visible(&tenant) {
            continue;
        }
        let sums = out
            .entry(key_of(tenant, "deployment", &hour.deployment))
            .or_default();
        sums.edge_local += hour.served_local;
        sums.edge_offloaded += hour.served_offloaded;
        sums.edge_failed += hour.failed;
    }
    out
}

/// The cost report of `range`, for `scope`'s tenant only when given.
pub fn cost(inputs: &Inputs, range: Range, scope: Option<&str>, group: GroupBy) -> CostReport {
    let mut total = CostRow {
        kind: "total".into(),
        ..CostRow::default()
    };
    let mut regions = std::collections::BTreeSet::new();
    let rows: Vec<CostRow> = sums(inputs, range, scope, group)
        .into_iter()
        .map(|((tenant, kind, name), s)| {
            regions.extend(s.regions.iter().cloned());
            let row = CostRow {
                tenant,
                kind,
                name,
                regions: s.regions.into_iter().collect(),
                gpu_seconds: s.usage.gpu_seconds(),
                cpu_seconds: s.usage.cpu_seconds(),
                cost: s.usage.cost,
                edge_requests_local: s.edge_local,
                edge_requests_offloaded: s.edge_offloaded,
                edge_requests_failed: s.edge_failed,
            };
            total.gpu_seconds += row.gpu_seconds;
            total.cpu_seconds += row.cpu_seconds;
            total.cost += row.cost;
            total.edge_requests_local += row.edge_requests_local;
            total.edge_requests_offloaded += row.edge_requests_offloaded;
            total.edge_requests_failed += row.edge_requests_failed;
            row
        })
        .collect();
    total.regions = regions.into_iter().collect();
    CostReport {
        from: range.from,
        to: range.to,
        rows,
        total,
    }
}

/// The carbon report of `range`, for `scope`'s tenant only when given.
pub fn carbon(inputs: &Inputs, range: Range, scope: Option<&str>, group: GroupBy) -> CarbonReport {
    let mut total = CarbonRow {
        kind: "total".into(),
        ..CarbonRow::default()
    };
    let mut with_signal_total = 0.0;
    let mut regions = std::collections::BTreeSet::new();
    let rows: Vec<CarbonRow> = sums(inputs, range, scope, group)
        .into_iter()
        .filter(|(_, s)| s.usage.energy_kwh > 0.0 || !s.regions.is_empty())
        .map(|((tenant, kind, name), s)| {
            regions.extend(s.regions.iter().cloned());
            with_signal_total += s.energy_with_signal_kwh;
            let row = CarbonRow {
                tenant,
                kind,
                name,
                regions: s.regions.into_iter().collect(),
                energy_kwh: s.usage.energy_kwh,
                carbon_g: s.carbon_g,
                energy_without_signal_kwh: (s.usage.energy_kwh - s.energy_with_signal_kwh).max(0.0),
                intensity_g_per_kwh: (s.energy_with_signal_kwh > 0.0)
                    .then(|| s.carbon_g / s.energy_with_signal_kwh),
            };
            total.energy_kwh += row.energy_kwh;
            total.carbon_g += row.carbon_g;
            total.energy_without_signal_kwh += row.energy_without_signal_kwh;
            row
        })
        .collect();
    total.regions = regions.into_iter().collect();
    total.intensity_g_per_kwh =
        (with_signal_total > 0.0).then(|| total.carbon_g / with_signal_total);
    CarbonReport {
        from: range.from,
        to: range.to,
        rows,
        total,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn usage(gpu_s: u64, cost: f64, energy_kwh: f64) -> Usage {
        Usage {
            gpu_milli_seconds: gpu_s * 1000,
            cpu_milli_seconds: gpu_s * 4000,
            memory_mib_seconds: 0,
            node_seconds: gpu_s as f64 / 4.0,
            cost,
            energy_kwh,
        }
    }

    fn inputs() -> Inputs {
        Inputs {
            regions: vec![
                RegionLedger {
                    region: "eu-west".into(),
                    entries: vec![
                        (
                            0,
                            "team-a".into(),
                            AccountKind::Job,
                            "train".into(),
                            usage(3600, 0.9, 0.3),
                        ),
                        (
                            3600,
                            "team-a".into(),
                            AccountKind::Job,
                            "train".into(),
                            usage(1800, 0.45, 0.15),
                        ),
                        (
                            0,
                            "serving".into(),
                            AccountKind::Deployment,
                            "digits".into(),
                            usage(900, 0.2, 0.1),
                        ),
                        (
                            0,
                            "team-b".into(),
                            AccountKind::Job,
                            "eval".into(),
                            usage(60, 0.01, 0.01),
                        ),
                    ],
                    carbon: BTreeMap::from([(0, 400.0)]),
                },
                RegionLedger {
                    region: "us-west".into(),
                    entries: vec![(
                        0,
                        "serving".into(),
                        AccountKind::Deployment,
                        "digits".into(),
                        usage(100, 0.05, 0.02),
                    )],
                    carbon: BTreeMap::new(),
                },
            ],
            edge: vec![EdgeHour {
                hour: 0,
                deployment: "digits".into(),
                tenant: "team-b".into(),
                served_local: 90,
                served_offloaded: 10,
                failed: 1,
            }],
            owners: BTreeMap::from([("digits".to_string(), "team-b".to_string())]),
            serving_tenant: "serving".into(),
        }
    }

    fn row<'a>(report: &'a CostReport, name: &str) -> &'a CostRow {
        report
            .rows
            .iter()
            .find(|r| r.name == name)
            .unwrap_or_else(|| panic!("no row {name}: {report:#?}"))
    }

    #[test]
    fn replicas_are_charged_to_the_deployments_tenant_with_its_edge_requests() {
        let range = Range::new(Some(0), Some(7200), 7200).unwrap();
        let report = cost(&inputs(), range, None, GroupBy::Workload);
        let digits = row(&report, "digits");
        assert_eq!(digits.tenant, "team-b");
        assert_eq!(digits.kind, "deployment");
        assert_eq!(digits.regions, vec!["eu-west", "us-west"]);
        assert_eq!(digits.gpu_seconds, 1000.0);
        assert!((digits.cost - 0.25).abs() < 1e-12);
        assert_eq!(
            (
                digits.edge_requests_local,
                digits.edge_requests_offloaded,
                digits.edge_requests_failed
            ),
            (90, 10, 1)
        );
        let train = row(&report, "train");
        assert_eq!(train.gpu_seconds, 5400.0);
        assert!((report.total.cost - (0.9 + 0.45 + 0.25 + 0.01)).abs() < 1e-12);
    }

    #[test]
    fn a_tenant_sees_only_its_own_rows() {
        let range = Range::new(Some(0), Some(7200), 7200).unwrap();
        let report = cost(&inputs(), range, Some("team-a"), GroupBy::Workload);
        assert_eq!(report.rows.len(), 1, "{report:#?}");
        assert_eq!(report.rows[0].name, "train");
        let by_tenant = cost(&inputs(), range, None, GroupBy::Tenant);
        let names: Vec<&str> = by_tenant.rows.iter().map(|r| r.name.as_str()).collect();
        assert_eq!(names, vec!["team-a", "team-b"]);
    }

    #[test]
    fn carbon_counts_only_measured_hours_and_says_what_it_left_out() {
        let range = Range::new(Some(0), Some(7200), 7200).unwrap();
        let report = carbon(&inputs(), range, None, GroupBy::Workload);
        let train = report.rows.iter().find(|r| r.name == "train").unwrap();
        assert!((train.carbon_g - 0.3 * 400.0).abs() < 1e-9);
        assert!((train.energy_without_signal_kwh - 0.15).abs() < 1e-12);
        assert_eq!(train.intensity_g_per_kwh, Some(400.0));
        let digits = report.rows.iter().find(|r| r.name == "digits").unwrap();
        // eu-west's hour 0 is measured, us-west has no signal.
        assert!((digits.carbon_g - 0.1 * 400.0).abs() < 1e-9);
        assert!((digits.energy_without_signal_kwh - 0.02).abs() < 1e-12);
    }

    #[test]
    fn the_range_is_whole_hours_and_bounded() {
        assert_eq!(
            Range::new(Some(3601), Some(7201), 0).unwrap(),
            Range {
                from: 3600,
                to: 10800
            }
        );
        assert_eq!(Range::new(None, None, 7200).unwrap().from, 0);
        assert!(Range::new(Some(10), Some(5), 0).is_err());
        assert!(Range::new(Some(0), Some(MAX_RANGE_S + 3600), 0).is_err());
        let only_the_second_hour = Range::new(Some(3600), Some(7200), 0).unwrap();
        let report = cost(&inputs(), only_the_second_hour, None, GroupBy::Workload);
        assert_eq!(report.rows.len(), 1);
        assert_eq!(report.rows[0].gpu_seconds, 1800.0);
    }

    proptest! {
        /// Grouping by tenant or by workload, and splitting the range in two, never
        /// changes the totals.
        #[test]
        fn totals_do_not_depend_on_grouping_or_splitting(split in 0u64..3) {
            let data = inputs();
            let whole = Range::new(Some(0), Some(7200), 0).unwrap();
            let a = cost(&data, whole, None, GroupBy::Workload).total;
            let b = cost(&data, whole, None, GroupBy::Tenant).total;
            prop_assert!((a.cost - b.cost).abs() < 1e-12);
            prop_assert_eq!(a.gpu_seconds, b.gpu_seconds);
            prop_assert_eq!(a.edge_requests_local, b.edge_requests_local);
            let cut = split * 3600;
            let mut parts = 0.0;
            for (from, to) in [(0, cut), (cut, 7200)] {
                if to > from {
                    parts += cost(&data, Range::new(Some(from), Some(to), 0).unwrap(), None, GroupBy::Workload).total.cost;
                }
            }
            prop_assert!((parts - a.cost).abs() < 1e-12);
            let tenants: f64 = ["team-a", "team-b"]
                .iter()
                .map(|t| cost(&data, whole, Some(t), GroupBy::Workload).total.cost)
                .sum();
            prop_assert!((tenants - a.cost).abs() < 1e-12);
        }
    }
}
