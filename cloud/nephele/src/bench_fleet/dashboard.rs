//! The dashboard phase of `nephele bench fleet`: what one refresh of the web dashboard
//! costs with the whole fleet connected (and the jobs phase's jobs queued), read as the
//! page reads it: counts and one page of each long list (`now`), against the whole
//! lists the page read before it was paged (`whole_lists`: every device, every
//! deployment with a row per device, every job). Each way is timed `rounds` times in
//! turn over one keep-alive HTTPS connection, its requests one after another; the
//! control plane's CPU is sampled around each refresh.

use std::time::Instant;

use anyhow::Result;
use serde::Serialize;

use super::process;
use crate::client::Api;

/// Rows per page, as the dashboard asks by default.
const PAGE: usize = 100;

/// One way of refreshing, measured.
#[derive(Debug, Default, Clone, Serialize)]
pub struct RefreshCost {
    pub requests: usize,
    /// Response bodies of one refresh (JSON, compact).
    pub bytes: usize,
    pub wall_ms_p50: f64,
    pub wall_ms_max: f64,
    /// Control-plane CPU per refresh, ms: the mean over the rounds (`/proc` counts CPU
    /// in 10 ms ticks), the fleet's own background work over the refresh's wall time
    /// included (0.16 cores at 10,000 agents).
    pub cloud_cpu_ms_mean: f64,
}

#[derive(Debug, Default, Clone, Serialize)]
pub struct DashboardResult {
    pub rounds: usize,
    pub page_size: usize,
    pub now: RefreshCost,
    pub whole_lists: RefreshCost,
}

/// The requests of one refresh: the page's now, or the whole lists it read before.
fn paths(api: &Api, paged: bool, region: &str) -> Result<Vec<String>> {
    let nodes = format!("/v1/regions/{region}/nodes");
    if !paged {
        return Ok(vec![
            "/v1/regions".into(),
            "/v1/devices".into(),
            "/v1/deployments".into(),
            "/v1/jobs".into(),
            nodes,
        ]);
    }
    let mut paths = vec![
        "/v1/regions".into(),
        "/v1/deployments?devices=false".into(),
        format!("/v1/jobs?limit={PAGE}"),
        "/v1/jobs?state=running&limit=1".into(),
        "/v1/jobs?state=pending&limit=1".into(),
        format!("/v1/devices?limit={PAGE}"),
        nodes,
    ];
    let deployments: Vec<nephele_api::DeploymentStatus> =
        api.get_as("/v1/deployments?devices=false")?;
    if let Some(first) = deployments.first() {
        paths.push(format!(
            "/v1/deployments/{}/devices?limit={PAGE}",
            first.name
        ));
    }
    Ok(paths)
}

fn median(values: &mut [f64]) -> f64 {
    values.sort_by(f64::total_cmp);
    values.get(values.len() / 2).copied().unwrap_or(f64::NAN)
}

/// Times `rounds` refreshes each way, alternating.
pub fn run(api: &Api, region: &str, cloud_pid: u32, rounds: usize) -> Result<DashboardResult> {
    let ways = [paths(api, true, region)?, paths(api, false, region)?];
    let mut walls = [Vec::new(), Vec::new()];
    let mut cpus = [0.0f64; 2];
    let mut bytes = [0usize; 2];
    for _ in 0..rounds {
        for (k, way) in ways.iter().enumerate() {
            let before = process::sample(cloud_pid);
            let started = Instant::now();
            let mut read = 0;
            for path in way {
                read += serde_json::to_vec(&api.get(path)?)?.len();
            }
            walls[k].push(started.elapsed().as_secs_f64() * 1000.0);
            if let (Some(from), Some(to)) = (before, process::sample(cloud_pid)) {
                cpus[k] += (to.cpu_s - from.cpu_s).max(0.0) * 1000.0;
            }
            bytes[k] = read;
        }
    }
    let mut cost = |k: usize| RefreshCost {
        requests: ways[k].len(),
        bytes: bytes[k],
        wall_ms_max: walls[k].iter().copied().fold(0.0, f64::max),
        wall_ms_p50: median(&mut walls[k]),
        cloud_cpu_ms_mean: cpus[k] / rounds.max(1) as f64,
    };
    Ok(DashboardResult {
        rounds,
        page_size: PAGE,
        now: cost(0),
        whole_lists: cost(1),
    })
}
