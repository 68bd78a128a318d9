//! A region's grid signal (`/v1/regions/{name}/grid`): measured carbon intensity and
//! prices, a provider's forecast, and the outlook carbon-aware jobs plan with.

use serde::{Deserialize, Serialize};

/// One hour of a region's grid outlook.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct GridHourView {
    pub unix: u64,
    pub carbon_g_per_kwh: f64,
    /// A measurement (else a forecast).
    pub measured: bool,
    /// `measured`, `provider` (a carbon-intensity provider's forecast, pushed with
    /// `nephele grid push --forecast`) or `model` (the project's own forecast).
    pub source: String,
    pub price_per_mwh: Option<f64>,
}

/// The provider forecast a region holds.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct ProviderForecastView {
    pub source: String,
    pub issued_unix: u64,
    /// Hours it has a value for.
    pub hours: usize,
    pub first_unix: u64,
    pub last_unix: u64,
    /// Used now (issued at most 12 hours ago); else the project's own forecast is.
    pub fresh: bool,
}

/// `GET /v1/regions/{name}/grid`: what the region's carbon decisions see.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct GridView {
    pub region: String,
    pub carbon_zone: Option<String>,
    /// `fresh`, `stale` (newest measurement too old: jobs do not wait) or `none`.
    pub signal: String,
    pub note: Option<String>,
    /// The provider forecast held, if one was pushed.
    pub forecast: Option<ProviderForecastView>,
    pub measured_hours: usize,
    pub latest_measured_unix: Option<u64>,
    /// From the current hour on (72 h), measured where pushed, forecast otherwise.
    pub outlook: Vec<GridHourView>,
    pub deferred_jobs: usize,
}

/// `PUT /v1/regions/{name}/grid`: what the push kept.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct GridPushView {
    pub kept: usize,
    /// Points older than the 90 days a region keeps, not stored.
    pub too_old: usize,
    /// Hours of the provider forecast pushed, if one was.
    pub forecast_hours: Option<usize>,
    /// When the forecast it replaced was issued.
    pub replaced_forecast_issued_unix: Option<u64>,
    pub grid: GridView,
}

/// `PUT /v1/regions/{name}/grid` (admins): measured hours and a provider's forecast.
/// One measured hour of a grid push.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct GridPointBody {
    /// Any second of the hour (UTC); the hour it falls in is stored.
    pub unix: u64,
    pub carbon_g_per_kwh: Option<f64>,
    pub price_per_mwh: Option<f64>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct GridPushBody {
    /// Measured hours.
    #[serde(default)]
    pub points: Vec<GridPointBody>,
    /// A carbon-intensity provider's forecast, kept beside the measurements (never
    /// mixed with them) and replacing the forecast held when it is newer.
    #[serde(default)]
    pub forecast: Option<GridForecastBody>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct GridForecastBody {
    /// When the provider made it (unix seconds; its `updatedAt`).
    pub issued_unix: u64,
    /// Who made it (e.g. `electricitymaps`), for operators.
    pub source: String,
    pub points: Vec<GridForecastPointBody>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct GridForecastPointBody {
    /// Any second of the hour (UTC).
    pub unix: u64,
    pub carbon_g_per_kwh: f64,
}
