//! The configuration of [`crate::Ours`], with its defaults and validation. Every field
//! has a default a deployment can start from; [`OursConfig::validate`] says in a
//! sentence what is wrong with a bad one.

use serde::{Deserialize, Serialize};

use crate::forecast::ForecasterKind;

/// A configuration that cannot work, with what to change.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ConfigError {
    #[error("min_replicas ({min}) is above max_replicas ({max})")]
    Bounds { min: u32, max: u32 },
    #[error("max_replicas must be at least 1")]
    NoReplicas,
    #[error("{field} must be {expected}, not {value}")]
    OutOfRange {
        field: &'static str,
        expected: &'static str,
        value: f64,
    },
    #[error("{field} must be at least 1 ms")]
    ZeroDuration { field: &'static str },
    #[error("forecast model: {0}")]
    Forecaster(String),
}

pub(crate) fn check_range(
    field: &'static str,
    value: f64,
    low: f64,
    high: f64,
    expected: &'static str,
) -> Result<(), ConfigError> {
    if value.is_finite() && value >= low && value <= high {
        Ok(())
    } else {
        Err(ConfigError::OutOfRange {
            field,
            expected,
            value,
        })
    }
}

pub(crate) fn check_duration(field: &'static str, value: u64) -> Result<(), ConfigError> {
    if value == 0 {
        Err(ConfigError::ZeroDuration { field })
    } else {
        Ok(())
    }
}

pub(crate) fn check_bounds(min: u32, max: u32) -> Result<(), ConfigError> {
    if max == 0 {
        return Err(ConfigError::NoReplicas);
    }
    if min > max {
        return Err(ConfigError::Bounds { min, max });
    }
    Ok(())
}

/// The rate forecast and the pre-warm it drives.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct ForecastConfig {
    /// Off: no predictive floor and no warm pool (reactive only).
    pub enabled: bool,
    /// Bucket the forecaster is fed: 60 s.
    pub bucket_ms: u64,
    /// How far ahead the pre-warm looks past the cold start: 5 min in all (the seed's
    /// "next 5 minutes"); the floor covers buckets up to cold start + one tick, capped
    /// at this.
    pub horizon_ms: u64,
    /// EWMA with α = 0.3: of the kinds measured (`nephele sim autoscale`, tune parts
    /// of both traces, 1–5 min ahead), the lowest error on the GenAI trace and within
    /// 5% of the lowest on the Azure one; Holt-Winters with a daily season did no
    /// better at these horizons (see the README).
    pub model: ForecasterKind,
}

impl Default for ForecastConfig {
    fn default() -> Self {
        ForecastConfig {
            enabled: true,
            bucket_ms: 60_000,
            horizon_ms: 300_000,
            model: ForecasterKind::Ewma { alpha: 0.3 },
        }
    }
}

/// The warm pool.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct WarmConfig {
    pub enabled: bool,
    /// Quantile of the recent under-forecast (actual − forecast, at the cold-start
    /// horizon) the pool covers: 0.8 (chosen on the tune parts of both traces).
    pub quantile: f64,
    /// How many recent buckets the quantile is taken over: 1440 (a day of minutes).
    pub history_buckets: usize,
    /// At most this many warm replicas: 8.
    pub max_warm: u32,
}

impl Default for WarmConfig {
    fn default() -> Self {
        WarmConfig {
            enabled: true,
            quantile: 0.8,
            history_buckets: 1440,
            max_warm: 8,
        }
    }
}

/// Admission control.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct AdmissionConfig {
    /// Off: admit everything (what HPA and KPA do).
    pub enabled: bool,
    /// A request may wait this many mean service times before it starts: 1.0 (so its
    /// latency stays within about twice its service time).
    pub wait_multiple: f64,
    /// …and at least this long: 1 s.
    pub min_wait_ms: f64,
    /// Retry-After is at least this: 1 s.
    pub min_retry_after_ms: u64,
}

impl Default for AdmissionConfig {
    fn default() -> Self {
        AdmissionConfig {
            enabled: true,
            wait_multiple: 1.0,
            min_wait_ms: 1_000.0,
            min_retry_after_ms: 1_000,
        }
    }
}

/// Everything [`crate::Ours`] decides with. Defaults in brackets.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct OursConfig {
    /// Never fewer replicas than this, warm pool included [1].
    pub min_replicas: u32,
    /// Never more [64].
    pub max_replicas: u32,
    /// How often the region ticks the scaler [5 s].
    pub tick_ms: u64,
    /// Scale out while the p99 latency is above this [2 s].
    pub target_p99_ms: f64,
    /// Scale out while more than this many requests wait per ready replica [1.0].
    pub queue_per_replica: f64,
    /// Replicas are sized so that their slots are this busy at the expected rate [0.7].
    pub target_utilisation: f64,
    /// Scale in only while utilisation is below this (and nothing waits) [0.3].
    pub low_utilisation: f64,
    /// No proportional change while the needed count is within this share of the
    /// current one [0.1].
    pub tolerance: f64,
    /// Scale-out uses the lowest recommendation of this window (0: none) [0].
    pub scale_up_stabilisation_ms: u64,
    /// Scale-in goes no lower than the highest recommendation of this window [300 s].
    pub scale_down_stabilisation_ms: u64,
    /// No scale-in within this long after any change [60 s].
    pub cooldown_ms: u64,
    /// The demand average window, and how long panic lasts after its last reason
    /// [60 s].
    pub stable_window_ms: u64,
    /// Panic when the last tick's demand needs at least this many times the ready
    /// replicas [2.0].
    pub panic_threshold: f64,
    /// One scale-in removes at most current / this [2.0].
    pub max_scale_down_ratio: f64,
    /// Size the backlog term as the replicas that clear the requests in flight and
    /// waiting within one cold start, not at once [false: as before]. It matters when a
    /// request is much shorter than a cold start (LLM completions against a model
    /// load): the replicas started for a backlog would be ready after it has drained.
    /// `nephele sim autoscale --tune` chose it on both traces.
    pub backlog_within_cold_start: bool,
    /// Size the backlog term as the replicas that answer the requests in flight and
    /// waiting within the latency target (`target_p99_ms`), not within one service
    /// time [true]. A request may wait as long as its target allows; sizing it to start
    /// at once asked, for LLM replicas whose latency target is several service times,
    /// for several times the replicas that serve it in time.
    pub backlog_within_target: bool,
    /// Cold start assumed until one is measured [30 s].
    pub default_cold_start_ms: f64,
    /// Service time assumed until one is measured [1 s].
    pub default_service_ms: f64,
    pub forecast: ForecastConfig,
    pub warm: WarmConfig,
    pub admission: AdmissionConfig,
    /// What one replica carries within target, learned from the answers
    /// ([`crate::capacity`]); off: sized with the slots over the service time.
    pub capacity: crate::capacity::CapacityConfig,
}

impl Default for OursConfig {
    fn default() -> Self {
        OursConfig {
            min_replicas: 1,
            max_replicas: 64,
            tick_ms: 5_000,
            target_p99_ms: 2_000.0,
            queue_per_replica: 1.0,
            target_utilisation: 0.7,
            low_utilisation: 0.3,
            tolerance: 0.1,
            scale_up_stabilisation_ms: 0,
            scale_down_stabilisation_ms: 300_000,
            cooldown_ms: 60_000,
            stable_window_ms: 60_000,
            panic_threshold: 2.0,
            max_scale_down_ratio: 2.0,
            backlog_within_cold_start: false,
            backlog_within_target: true,
            default_cold_start_ms: 30_000.0,
            default_service_ms: 1_000.0,
            forecast: ForecastConfig::default(),
            warm: WarmConfig::default(),
            admission: AdmissionConfig::default(),
            capacity: crate::capacity::CapacityConfig::default(),
        }
    }
}

impl OursConfig {
    /// Checks every field; the first problem found is the error.
    pub fn validate(&self) -> Result<(), ConfigError> {
        check_bounds(self.min_replicas, self.max_replicas)?;
        check_duration("tick_ms", self.tick_ms)?;
        check_duration("stable_window_ms", self.stable_window_ms)?;
        check_duration("forecast.bucket_ms", self.forecast.bucket_ms)?;
        check_range(
            "target_p99_ms",
            self.target_p99_ms,
            1.0,
            f64::MAX,
            "a positive number of ms",
        )?;
        check_range(
            "queue_per_replica",
            self.queue_per_replica,
            0.0,
            f64::MAX,
            "≥ 0",
        )?;
        check_range(
            "target_utilisation",
            self.target_utilisation,
            0.05,
            1.0,
            "in 0.05..=1",
        )?;
        check_range(
            "low_utilisation",
            self.low_utilisation,
            0.0,
            self.target_utilisation,
            "in 0..=target_utilisation",
        )?;
        check_range("tolerance", self.tolerance, 0.0, 0.9, "in 0..=0.9")?;
        check_range(
            "panic_threshold",
            self.panic_threshold,
            1.0,
            f64::MAX,
            "≥ 1",
        )?;
        check_range(
            "max_scale_down_ratio",
            self.max_scale_down_ratio,
            1.0,
            f64::MAX,
            "≥ 1",
        )?;
        check_range(
            "default_cold_start_ms",
            self.default_cold_start_ms,
            0.0,
            f64::MAX,
            "≥ 0",
        )?;
        check_range(
            "default_service_ms",
            self.default_service_ms,
            0.001,
            f64::MAX,
            "> 0",
        )?;
        check_range("warm.quantile", self.warm.quantile, 0.0, 1.0, "in 0..=1")?;
        check_range(
            "admission.wait_multiple",
            self.admission.wait_multiple,
            0.0,
            f64::MAX,
            "≥ 0",
        )?;
        check_range(
            "admission.min_wait_ms",
            self.admission.min_wait_ms,
            0.0,
            f64::MAX,
            "≥ 0",
        )?;
        self.capacity.validate()?;
        if let Some(problem) = self.forecast.model.problem() {
            return Err(ConfigError::Forecaster(problem));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_validate_and_bad_values_say_which_field() {
        assert_eq!(OursConfig::default().validate(), Ok(()));
        let bad = |edit: fn(&mut OursConfig)| {
            let mut config = OursConfig::default();
            edit(&mut config);
            config.validate().expect_err("refused").to_string()
        };
        assert_eq!(
            bad(|c| c.min_replicas = 99),
            "min_replicas (99) is above max_replicas (64)"
        );
        assert_eq!(
            bad(|c| c.max_replicas = 0),
            "max_replicas must be at least 1"
        );
        assert!(bad(|c| c.tolerance = f64::NAN).starts_with("tolerance must be"));
        assert!(bad(|c| c.low_utilisation = 0.9).starts_with("low_utilisation"));
        assert_eq!(bad(|c| c.tick_ms = 0), "tick_ms must be at least 1 ms");
        assert!(bad(|c| c.forecast.model = ForecasterKind::Ewma { alpha: 2.0 }).contains("alpha"));
    }

    #[test]
    fn a_partial_json_config_takes_the_defaults_for_the_rest() {
        let config: OursConfig =
            serde_json::from_str(r#"{"max_replicas": 8, "warm": {"max_warm": 2}}"#)
                .expect("parses");
        assert_eq!(config.max_replicas, 8);
        assert_eq!(config.warm.max_warm, 2);
        assert_eq!(config.warm.quantile, 0.8);
        assert_eq!(config.tick_ms, 5_000);
    }
}
