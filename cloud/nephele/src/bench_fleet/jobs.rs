//! The jobs phase of `nephele bench fleet`: jobs submitted through the REST API, as a
//! platform team's clients would, until the region has placed every one.
//!
//! `clients` threads, each with its own keep-alive HTTPS connection and the admin
//! token, `POST /v1/jobs` as fast as they are answered. Every answer says where the job
//! went (the region runs its queue on each submission); jobs still pending then are
//! placed by the region's queue tick, which the phase waits for by listing the jobs.
//! `jobs_placed_per_sec` is jobs placed over the time from the first submission to the
//! last placement, so it is a throughput of the whole path: HTTP, authentication,
//! validation, the region actor, the placement core and the durable write of each job.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use anyhow::Result;
use nephele_api::JobView;
use serde::Serialize;

use crate::client::Api;

/// What the phase measured.
#[derive(Debug, Default, Clone, Serialize)]
pub struct JobsResult {
    pub jobs: usize,
    pub clients: usize,
    /// Nodes of the pool the jobs go to (simulated pool agents, each a real session).
    pub pool_nodes: usize,
    /// What each job asks.
    pub job_shape: String,
    /// Seconds from the first submission to the last answer.
    pub submit_s: f64,
    pub submitted_per_sec: f64,
    /// Answered `running`: placed by the submission itself.
    pub placed_at_submit: usize,
    /// Placed when the phase ended (at submission or by a later queue tick).
    pub placed: usize,
    /// Seconds from the first submission until `placed` jobs were running.
    pub placed_s: f64,
    pub jobs_placed_per_sec: f64,
    pub submit_p50_ms: f64,
    pub submit_p99_ms: f64,
    pub errors: usize,
    pub error_kinds: Vec<(String, usize)>,
    /// CPU cores the control plane used from the first submission to the last
    /// placement (1.0: one core), and the bench's clients meanwhile: they share the
    /// machine.
    pub cloud_cpu_cores: f64,
    pub bench_cpu_cores: f64,
}

/// The job spec of job `k`: an eighth of one A100 (as a notebook or a small inference
/// job asks), one CPU and 16 GiB, on the bench's `batch` pool.
fn spec(k: usize, pool: &str) -> serde_json::Value {
    serde_json::json!({
        "name": format!("j-{k:06}"),
        "gpus": 1,
        "gpu_milli": 125,
        "cpu_milli": 1000,
        "memory_mib": 16384,
        "node_selector": {"nephele.io/pool": pool},
    })
}

pub const JOB_SHAPE: &str =
    "1 GPU at 125 milli-GPU (an eighth of an A100), 1 CPU, 16 GiB; no command (resources held)";

/// Submits `jobs` jobs from `clients` threads and waits (at most `wait`) until the
/// region has placed them all.
pub fn run(
    api_base: &str,
    admin: &str,
    ca_pem: &[u8],
    pool: &str,
    jobs: usize,
    clients: usize,
    wait: Duration,
) -> Result<JobsResult> {
    let next = AtomicUsize::new(0);
    let placed_at_submit = AtomicUsize::new(0);
    let latencies_ms = Mutex::new(Vec::with_capacity(jobs));
    let errors: Mutex<std::collections::BTreeMap<String, usize>> = Mutex::default();
    let started = Instant::now();
    std::thread::scope(|scope| {
        for _ in 0..clients.max(1) {
            scope.spawn(|| {
                let api = Api::with_ca(api_base, admin, Some(ca_pem));
                let mut mine = Vec::new();
                loop {
                    let k = next.fetch_add(1, Ordering::Relaxed);
                    if k >= jobs {
                        break;
                    }
                    let asked = Instant::now();
                    match api.post_as::<JobView>("/v1/jobs", &spec(k, pool)) {
                        Ok(view) => {
                            mine.push(asked.elapsed().as_secs_f64() * 1e3);
                            if view.state == "running" {
                                placed_at_submit.fetch_add(1, Ordering::Relaxed);
                            }
                        }
                        Err(error) => {
                            *errors
                                .lock()
                                .unwrap_or_else(|p| p.into_inner())
                                .entry(super::error_kind(&error))
                                .or_default() += 1;
                        }
                    }
                }
                latencies_ms
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .extend(mine);
            });
        }
    });
    let submit_s = started.elapsed().as_secs_f64();
    let mut latencies = latencies_ms.into_inner().unwrap_or_else(|p| p.into_inner());
    latencies.sort_by(f64::total_cmp);
    let errors = errors.into_inner().unwrap_or_else(|p| p.into_inner());
    let error_count: usize = errors.values().sum();
    let accepted = jobs - error_count;
    let mut placed = placed_at_submit.load(Ordering::Relaxed);
    let mut placed_s = submit_s;
    if placed < accepted {
        // The rest are placed by the region's queue tick; list until they are.
        let api = Api::with_ca(api_base, admin, Some(ca_pem));
        let deadline = Instant::now() + wait;
        loop {
            if let Ok(views) = api.get_as::<Vec<JobView>>("/v1/jobs") {
                placed = views
                    .iter()
                    .filter(|v| v.name.starts_with("j-") && v.state == "running")
                    .count();
                placed_s = started.elapsed().as_secs_f64();
            }
            if placed >= accepted || Instant::now() > deadline {
                break;
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }
    Ok(JobsResult {
        jobs,
        clients,
        pool_nodes: 0,
        job_shape: JOB_SHAPE.into(),
        submit_s,
        submitted_per_sec: accepted as f64 / submit_s.max(1e-9),
        placed_at_submit: placed_at_submit.load(Ordering::Relaxed),
        placed,
        placed_s,
        jobs_placed_per_sec: placed as f64 / placed_s.max(1e-9),
        submit_p50_ms: super::quantile(&latencies, 0.5),
        submit_p99_ms: super::quantile(&latencies, 0.99),
        errors: error_count,
        error_kinds: errors.into_iter().collect(),
        cloud_cpu_cores: 0.0,
        bench_cpu_cores: 0.0,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn job_specs_are_valid_and_distinct() {
        let a: nephele_api::JobSpec = serde_json::from_value(spec(1, "batch")).expect("a spec");
        let b: nephele_api::JobSpec = serde_json::from_value(spec(2, "batch")).expect("a spec");
        assert_ne!(a.name, b.name);
        assert_eq!(a.gpus, 1);
        assert_eq!(a.gpu_milli, Some(125));
        assert_eq!(
            a.node_selector.get("nephele.io/pool").map(String::as_str),
            Some("batch")
        );
    }
}
