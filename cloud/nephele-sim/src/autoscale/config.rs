//! Ours' configuration for a trace, and the `--ours-config` override merged over it.

use anyhow::{Context as _, Result};
use nephele_autoscale::config::OursConfig;
use nephele_autoscale::serving::quantile;

use super::AutoscaleOptions;
use crate::autoscale_trace::Workload;

/// Ours' configuration for a workload: the defaults, with the bounds of the run, the
/// p99 target at the p99 of the tune part's end-to-end latency targets, and the
/// admission wait floor at the trace's allowed wait (images: the target floor; LLM
/// requests: the mean wait before prefill their first-token targets allow).
pub fn ours_config(
    workload: &Workload,
    options: &AutoscaleOptions,
    tune_until_us: u64,
) -> OursConfig {
    let mut targets: Vec<f64> = workload
        .requests
        .iter()
        .filter(|r| r.arrival_us < tune_until_us)
        .map(|r| r.target_ms)
        .filter(|t| t.is_finite())
        .collect();
    let p99 = quantile(&mut targets, 0.99).unwrap_or(2_000.0);
    let mut config = OursConfig {
        min_replicas: options.min_replicas,
        max_replicas: options.max_replicas,
        target_p99_ms: p99,
        ..OursConfig::default()
    };
    config.admission.min_wait_ms = workload.target_floor_ms;
    config
}

/// `config` with the fields of `patch` (a JSON object, nested objects merged) in
/// place of its own; validated.
pub fn with_override(config: OursConfig, patch: Option<&serde_json::Value>) -> Result<OursConfig> {
    let Some(patch) = patch else {
        return Ok(config);
    };
    fn merge(into: &mut serde_json::Value, patch: &serde_json::Value) {
        match (into, patch) {
            (serde_json::Value::Object(into), serde_json::Value::Object(patch)) => {
                for (key, value) in patch {
                    match into.get_mut(key) {
                        Some(slot) => merge(slot, value),
                        None => {
                            into.insert(key.clone(), value.clone());
                        }
                    }
                }
            }
            (into, patch) => *into = patch.clone(),
        }
    }
    let mut value = serde_json::to_value(&config)?;
    merge(&mut value, patch);
    let merged: OursConfig =
        serde_json::from_value(value).context("--ours-config: not an OursConfig")?;
    merged
        .validate()
        .context("--ours-config: invalid configuration")?;
    Ok(merged)
}
