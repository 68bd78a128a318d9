//! Chargeback and showback (`/v1/reports/cost`, `/v1/reports/carbon`): what each
//! tenant's jobs and deployments used, cost and emitted over a range of whole hours.

use serde::{Deserialize, Serialize};

/// How rows are grouped.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, schemars::JsonSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum GroupBy {
    /// One row per tenant.
    Tenant,
    /// One row per job or deployment (the default).
    #[default]
    Workload,
}

/// One row of a cost report.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct CostRow {
    pub tenant: String,
    /// `job`, `deployment`, or `tenant` when grouped by tenant.
    pub kind: String,
    pub name: String,
    /// Regions whose pools it used.
    pub regions: Vec<String>,
    pub gpu_seconds: f64,
    pub cpu_seconds: f64,
    /// In the pools' price unit (their `price_per_hour`).
    pub cost: f64,
    /// Requests devices answered themselves.
    pub edge_requests_local: u64,
    /// Requests devices sent to the cloud (answered by the replicas above).
    pub edge_requests_offloaded: u64,
    pub edge_requests_failed: u64,
}

/// A cost report.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct CostReport {
    /// Unix seconds, whole hours (`to` exclusive).
    pub from: u64,
    pub to: u64,
    pub rows: Vec<CostRow>,
    pub total: CostRow,
}

/// One row of a carbon report.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct CarbonRow {
    pub tenant: String,
    pub kind: String,
    pub name: String,
    pub regions: Vec<String>,
    /// Energy at the nodes' rated power, kWh.
    pub energy_kwh: f64,
    /// gCO₂eq of the energy in hours with a measured intensity.
    pub carbon_g: f64,
    /// Energy in hours without a measured intensity (not in `carbon_g`).
    pub energy_without_signal_kwh: f64,
    /// `carbon_g` / the energy it covers; `None` when no hour had a measurement.
    pub intensity_g_per_kwh: Option<f64>,
}

/// A carbon report.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct CarbonReport {
    pub from: u64,
    pub to: u64,
    pub rows: Vec<CarbonRow>,
    pub total: CarbonRow,
}

/// The query of both reports.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ReportQuery {
    /// Unix seconds; rounded down to the hour. Default: 24 hours before `to`.
    pub from: Option<u64>,
    /// Unix seconds; rounded up to the hour. Default: now.
    pub to: Option<u64>,
    /// `workload` (a row per job and deployment, the default) or `tenant`.
    #[serde(default)]
    pub group: GroupBy,
    /// Only this tenant's rows (admins; other tokens see their own tenant's only).
    pub tenant: Option<String>,
    /// One region's pools only.
    pub region: Option<String>,
}
