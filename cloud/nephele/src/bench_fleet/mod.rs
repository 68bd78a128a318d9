//! `nephele bench fleet`: how many agents one control plane holds, what each costs it,
//! and how fast a change reaches them, on loopback.
//!
//! It starts a real control plane (`nephele cloud`, one region with one GPU pool) and,
//! when offload is measured, one real pool agent (`nephele edge run --role pool`) as
//! child processes, pushes the project's digits model, then, in this process:
//!
//! 1. enrols `--agents` agents through the real join path (a single-use token each
//!    from the REST API, a CSR for the agent's own key over QUIC);
//! 2. connects them all, each its own QUIC connection with its own mutual-TLS
//!    certificate, sending `Hello` and heartbeats at the control plane's interval
//!    ([`session`]);
//! 3. holds them for `--hold-s`, sampling the control plane's memory, CPU and file
//!    descriptors from `/proc` and its heartbeat rate and mailbox lag from `/metrics`;
//! 4. deploys the digits model to `--deploy-agents` of them (a label selector) and
//!    times, per agent, until the control plane's API shows it Ready (polled every
//!    100 ms; each agent fetches the model's bytes itself: a cold cache);
//! 5. sends offloaded requests at `--offload-rps` through those agents to the pool
//!    replica ([`offload`]).
//!
//! Every figure comes from this run; nothing is assumed. The bench and the control
//! plane share the machine's cores, which the report says.

mod dashboard;
mod enrol;
mod jobs;
mod offload;
pub(crate) mod process;
mod session;

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _, Result};
use nephele_api::{DeploymentStatus, JoinTokenView, ModelView, TokenRequest};
use serde::Serialize;

use crate::client::Api;
use crate::demo::{
    spawn, start_cloud, wait_for_file, Fleet as Children, Heldout, HELDOUT_JSON, MODEL_ONNX,
};

#[derive(Debug, Clone, clap::Args)]
pub struct FleetArgs {
    /// Agents to enrol and connect, each its own QUIC connection and certificate.
    #[arg(long, default_value_t = 1000)]
    pub agents: usize,
    /// Of those, how many the deployment selects (at most --agents).
    #[arg(long, default_value_t = 1000)]
    pub deploy_agents: usize,
    /// The control plane's heartbeat interval (it tells agents in Welcome).
    #[arg(long, default_value_t = 15_000)]
    pub heartbeat_ms: u32,
    /// How long to hold the whole fleet connected while measuring, seconds (at least
    /// two heartbeat intervals is best).
    #[arg(long, default_value_t = 35.0)]
    pub hold_s: f64,
    /// New sessions started per second while connecting the fleet. The control plane
    /// does TLS handshakes on its gateway threads (one per core); on a 2-vCPU machine
    /// shared with the simulated fleet, 1,000 a second connected 10,000 agents with no
    /// handshake timing out (README, fleet scale).
    #[arg(long, default_value_t = 500.0)]
    pub connect_rate: f64,
    /// Offloaded requests per second through the region to the pool (0: none, and no
    /// pool agent is started).
    #[arg(long, default_value_t = 1000.0)]
    pub offload_rps: f64,
    #[arg(long, default_value_t = 10.0)]
    pub offload_s: f64,
    /// Jobs submitted through the REST API (`POST /v1/jobs`) after the offload phase,
    /// until all are placed (0: none). Each asks an eighth of an A100; the bench
    /// connects enough simulated pool nodes (DGX A100 profile, 64 such jobs each, plus
    /// a tenth spare) for all of them.
    #[arg(long, default_value_t = 10_000)]
    pub jobs: usize,
    /// HTTPS clients submitting jobs at once, each with its own keep-alive connection
    /// and waiting for each answer before the next submission (a region places a batch
    /// of concurrent submissions in one pass, so more clients give larger batches).
    #[arg(long, default_value_t = 96)]
    pub job_clients: usize,
    /// Refreshes of the web dashboard timed at the end, with the fleet connected and
    /// the jobs queued: the page's counts and pages against the whole lists it read
    /// before it was paged, alternated (0: skip).
    #[arg(long, default_value_t = 10)]
    pub dashboard_rounds: usize,
    /// Where the control plane keeps its data and logs (default: a new temporary dir).
    #[arg(long)]
    pub dir: Option<PathBuf>,
    /// One JSON document on stdout instead of the table.
    #[arg(long)]
    pub json: bool,
    /// Where the results are written: `fleet-<agents>.json` (the report) and
    /// `fleet-<agents>-ready.csv` (each selected agent's time to Ready and transfer).
    #[arg(long, default_value = "target/bench-results")]
    pub out: PathBuf,
}

/// Everything the run measured.
#[derive(Debug, Default, Serialize)]
pub struct FleetReport {
    pub machine: String,
    pub agents_requested: usize,
    pub agents_connected: usize,
    pub heartbeat_interval_s: f64,
    pub enrol_s: f64,
    pub enrolled_per_sec: f64,
    pub join_retries: usize,
    pub connect_s: f64,
    pub cloud_rss_bytes_before_agents: u64,
    /// After enrolment, before any session: what the device records take.
    pub cloud_rss_bytes_enrolled: u64,
    pub cloud_rss_bytes_connected: u64,
    pub cloud_rss_bytes_per_agent: f64,
    /// CPU cores the control plane used while holding the fleet (1.0: one core).
    pub cloud_cpu_cores_held: f64,
    pub cloud_cpu_us_per_heartbeat: f64,
    /// CPU cores this bench process (the simulated fleet) used meanwhile.
    pub bench_cpu_cores_held: f64,
    pub cloud_fds: u64,
    pub cloud_fd_limit: Option<u64>,
    pub heartbeats_per_sec: f64,
    pub heartbeats_expected_per_sec: f64,
    /// Upper bound of the histogram bucket holding the 99th percentile of the
    /// federation's mailbox wait for a heartbeat.
    pub heartbeat_lag_p99_s: Option<f64>,
    pub deploy_agents: usize,
    pub model_bytes: u64,
    pub model_transfer: &'static str,
    pub deploy_ready_p50_s: f64,
    pub deploy_ready_p99_s: f64,
    /// `null` (NaN) when not every selected agent was Ready within 120 s; how many were.
    pub deploy_all_ready_s: f64,
    pub deploy_ready_count: usize,
    /// Per agent, Ready as the API shows it less the time the agent spent fetching the
    /// model's bytes: what the goal "p99 ≤ 2 s plus the model transfer time" measures.
    pub deploy_ready_less_transfer_p99_s: f64,
    pub deploy_transfer_p50_s: f64,
    pub deploy_transfer_p99_s: f64,
    /// When agents sent their Ready report (agent side), p99 and last.
    pub deploy_reported_p99_s: f64,
    pub deploy_reported_max_s: f64,
    /// When agents received the desired state with the deployment, p99 and last.
    pub deploy_assigned_p99_s: f64,
    pub deploy_assigned_max_s: f64,
    pub offload_rps: f64,
    pub offload_errors: u64,
    pub offload: Option<offload::OffloadResult>,
    /// Jobs placed per second through the REST API, end to end (0 without `--jobs`).
    pub jobs_placed_per_sec: f64,
    pub jobs: Option<jobs::JobsResult>,
    /// One dashboard refresh with the whole fleet connected (without `--dashboard-rounds 0`).
    pub dashboard: Option<dashboard::DashboardResult>,
    pub sessions_lost: usize,
    /// UDP datagrams dropped on this machine during the run because a socket's
    /// receive buffer was full (every process's sockets, the control plane's and the
    /// simulated fleet's alike); `null` off Linux. Resent by QUIC after a loss timer,
    /// so many of them slow handshakes until some time out.
    pub udp_receive_buffer_drops: Option<u64>,
    pub agent_errors: BTreeMap<String, u64>,
    pub cloud_alive: bool,
}

const REGION: &str = "bench";
const DEPLOYMENT: &str = "digits";
/// The pool the jobs phase places jobs on, and its nodes' profile.
const JOB_POOL: &str = "batch";
const JOB_POOL_PROFILE: &str = "dgx-a100-80gb";
/// Jobs of the bench's shape one node of that profile holds (8 GPUs × 8 eighths).
const JOBS_PER_NODE: usize = 64;

/// Simulated pool nodes for `jobs` jobs: enough for all, and a tenth spare.
fn pool_nodes_for(jobs: usize) -> usize {
    if jobs == 0 {
        0
    } else {
        (jobs * 11 / 10).div_ceil(JOBS_PER_NODE)
    }
}

fn cloud_config(heartbeat_ms: u32, pool_nodes: usize) -> String {
    format!(
        r#"api_listen = "127.0.0.1:0"
quic_listen = "127.0.0.1:0"
heartbeat_interval_ms = {heartbeat_ms}
# The bench is the API's only client and submits as fast as it can.
api_rate_per_s = 1000000.0
api_rate_burst = 1000000

[[region]]
name = "{REGION}"
carbon_zone = "DE"
[[region.pool]]
name = "l4"
node_profile = "gpu-4x-l4"
capacity_type = "on-demand"
price_per_hour = 2.9
max_nodes = 1
[[region.pool]]
name = "{JOB_POOL}"
node_profile = "{JOB_POOL_PROFILE}"
capacity_type = "on-demand"
price_per_hour = 32.8
max_nodes = {}
"#,
        pool_nodes.max(1)
    )
}

pub fn run(args: FleetArgs) -> Result<()> {
    if args.agents == 0 || args.agents > 100_000 {
        bail!("--agents must be between 1 and 100000");
    }
    if args.deploy_agents > args.agents {
        bail!(
            "--deploy-agents ({}) cannot exceed --agents ({})",
            args.deploy_agents,
            args.agents
        );
    }
    let valid = |x: f64, low: f64| x.is_finite() && x >= low;
    if args.heartbeat_ms < 100 || !valid(args.hold_s, 0.0) || !valid(args.connect_rate, 1e-9) {
        bail!(
            "--heartbeat-ms must be at least 100, --hold-s at least 0 and --connect-rate above 0"
        );
    }
    if !valid(args.offload_rps, 0.0) || !valid(args.offload_s, 0.0) {
        bail!("--offload-rps and --offload-s cannot be negative");
    }
    if args.jobs > 1_000_000 || args.job_clients == 0 || args.job_clients > 1024 {
        bail!("--jobs must be at most 1000000 and --job-clients between 1 and 1024");
    }
    let pool_nodes = pool_nodes_for(args.jobs);
    let udp_drops_before = process::udp_receive_buffer_drops();
    let root = match &args.dir {
        Some(dir) => dir.clone(),
        None => std::env::temp_dir().join(format!("nephele-bench-fleet-{}", std::process::id())),
    };
    let _ = std::fs::remove_dir_all(&root);
    std::fs::create_dir_all(&root).with_context(|| format!("cannot create {}", root.display()))?;
    let say = |message: &str| {
        if !args.json {
            eprintln!("{message}");
        }
    };
    let mut children = Children {
        children: Vec::new(),
    };
    let mut report = FleetReport {
        machine: machine(),
        agents_requested: args.agents,
        heartbeat_interval_s: f64::from(args.heartbeat_ms) / 1000.0,
        deploy_agents: args.deploy_agents,
        model_transfer: "fetched by every agent from the control plane (cold cache)",
        heartbeats_expected_per_sec: args.agents as f64 * 1000.0 / f64::from(args.heartbeat_ms),
        ..FleetReport::default()
    };

    // The control plane.
    say(&format!("starting the control plane in {}", root.display()));
    let cloud = start_cloud(
        &mut children,
        &root,
        &cloud_config(args.heartbeat_ms, pool_nodes),
    )?;
    let cloud_pid = cloud.pid;
    let api_base = format!("https://{}", cloud.api);
    let quic = cloud.quic;
    let server: SocketAddr = quic.parse().context("the QUIC address")?;
    let (admin, ca_pem) = (cloud.admin_token, cloud.ca_pem);
    let api = Api::with_ca(&api_base, &admin, Some(&ca_pem));

    say(&format!(
        "pushing the digits model ({} bytes ONNX)",
        MODEL_ONNX.len()
    ));
    let heldout: Heldout = serde_json::from_str(HELDOUT_JSON).context("embedded held-out set")?;
    let model: ModelView = {
        use base64::Engine as _;
        api.put_as(
            "/v1/models/digits-mlp?wait=true",
            &serde_json::json!({
                "onnx_base64": base64::engine::general_purpose::STANDARD.encode(MODEL_ONNX),
                "validation": {"rows": heldout.features, "labels": heldout.labels},
            }),
        )?
    };
    report.model_bytes = model.size;
    if args.offload_rps > 0.0 {
        say("starting one pool agent (a real `nephele edge run --role pool`) for offloaded requests");
        start_pool_agent(&api, &quic, &root, &mut children)?;
    }
    std::thread::sleep(Duration::from_secs(1));
    let before = process::sample(cloud_pid).context("cannot read the control plane's /proc")?;
    report.cloud_rss_bytes_before_agents = before.rss_bytes;

    // Enrolment.
    let enrol_started = Instant::now();
    say(&format!(
        "enrolling {} agents: join tokens from the API…",
        args.agents
    ));
    let tokens = enrol::tokens(&api_base, &admin, &ca_pem, REGION, args.agents, 4)?;
    let names: Vec<(String, BTreeMap<String, String>)> = (0..args.agents)
        .map(|k| {
            let wave = if k < args.deploy_agents { "1" } else { "0" };
            (
                format!("edge-{k:05}"),
                BTreeMap::from([("wave".to_string(), wave.to_string())]),
            )
        })
        .collect();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let quiet = args.json;
    let total = args.agents;
    let (identities, cluster, retries) = runtime.block_on(enrol::join_all(
        server,
        "edge",
        tokens,
        names,
        4,
        8,
        move |done| {
            if !quiet && (done % 1000 == 0 || done == total) {
                eprintln!("  joined {done}/{total}");
            }
        },
    ))?;
    report.enrol_s = enrol_started.elapsed().as_secs_f64();
    report.enrolled_per_sec = args.agents as f64 / report.enrol_s.max(1e-9);
    report.join_retries = retries;
    std::thread::sleep(Duration::from_millis(500));
    report.cloud_rss_bytes_enrolled = process::sample(cloud_pid).map_or(0, |s| s.rss_bytes);

    // Sessions.
    say(&format!(
        "connecting {} agents at up to {}/s, each its own mutual-TLS QUIC connection",
        args.agents, args.connect_rate
    ));
    let profile_name = "rpi5-8gb".to_string();
    let profile_toml = nephele_edge::agent::resolve_profile(Some(&profile_name))?.1;
    let fleet = Arc::new(session::Fleet {
        server,
        cluster: cluster.clone(),
        role: "edge",
        profile_name,
        profile_toml,
        started: Instant::now(),
        stats: session::Stats::default(),
    });
    let slots: Vec<Arc<session::Slot>> = (0..args.agents)
        .map(|_| Arc::new(session::Slot::default()))
        .collect();
    let connect_started = Instant::now();
    connect_all(
        &runtime,
        &fleet,
        identities,
        &slots,
        args.connect_rate,
        64,
        connect_started,
    )?;
    let connect_deadline =
        connect_started + Duration::from_secs_f64(args.agents as f64 / args.connect_rate + 60.0);
    let mut last_said = Instant::now();
    loop {
        let connected = fleet.stats.connected.load(Ordering::Relaxed);
        if connected >= args.agents || Instant::now() > connect_deadline {
            break;
        }
        if !children_alive(&mut children) {
            break;
        }
        if last_said.elapsed() > Duration::from_secs(5) {
            say(&format!("  connected {connected}/{}", args.agents));
            last_said = Instant::now();
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    report.connect_s = connect_started.elapsed().as_secs_f64();

    // Hold.
    say(&format!(
        "holding {} agents for {:.0} s",
        fleet.stats.connected.load(Ordering::Relaxed),
        args.hold_s
    ));
    let metrics_before = heartbeat_metrics(&api);
    let held_from = process::sample(cloud_pid);
    let bench_from = process::sample(std::process::id());
    std::thread::sleep(Duration::from_secs_f64(args.hold_s));
    let held_to = process::sample(cloud_pid);
    if let (Some(from), Some(to)) = (bench_from, process::sample(std::process::id())) {
        report.bench_cpu_cores_held = process::cores_between(&from, &to);
    }
    let metrics_after = heartbeat_metrics(&api);
    report.agents_connected = fleet.stats.connected.load(Ordering::Relaxed);
    if let (Some(from), Some(to)) = (held_from, held_to) {
        report.cloud_rss_bytes_connected = to.rss_bytes;
        report.cloud_rss_bytes_per_agent = (to.rss_bytes as f64
            - report.cloud_rss_bytes_before_agents as f64)
            / report.agents_connected.max(1) as f64;
        report.cloud_cpu_cores_held = process::cores_between(&from, &to);
        report.cloud_fds = to.fds;
        let wall = to.at.duration_since(from.at).as_secs_f64();
        if let (Some(m0), Some(m1)) = (&metrics_before, &metrics_after) {
            let beats = m1.count.saturating_sub(m0.count);
            report.heartbeats_per_sec = beats as f64 / wall.max(1e-9);
            if beats > 0 {
                report.cloud_cpu_us_per_heartbeat = (to.cpu_s - from.cpu_s) * 1e6 / beats as f64;
            }
            report.heartbeat_lag_p99_s = m1.p99_between(m0);
        }
    }
    report.cloud_fd_limit = fd_limit(cloud_pid);

    // Deployment.
    let mut ready_rows: Vec<(String, f64, Option<f64>)> = Vec::new();
    if args.deploy_agents > 0 && children_alive(&mut children) {
        say(&format!(
            "deploying the digits model to {} agents (selector wave=1)",
            args.deploy_agents
        ));
        let deployed_at = fleet.started.elapsed().as_secs_f64();
        let posted = Instant::now();
        let _: DeploymentStatus = api.post_as(
            "/v1/deployments",
            &serde_json::json!({"name": DEPLOYMENT, "model": "digits-mlp", "selector": "wave=1",
                "slo_ms": 50, "max_queue": 4, "offload": true}),
        )?;
        let mut first_ready: HashMap<String, f64> = HashMap::new();
        let deadline = posted + Duration::from_secs(120);
        loop {
            let status: DeploymentStatus = api.get_as(&format!("/v1/deployments/{DEPLOYMENT}"))?;
            let at = posted.elapsed().as_secs_f64();
            for device in &status.devices {
                if device.role == "edge" && device.ready == Some(true) {
                    first_ready.entry(device.device.clone()).or_insert(at);
                }
            }
            let pool_ready = args.offload_rps == 0.0
                || status
                    .devices
                    .iter()
                    .any(|d| d.role == "pool" && d.ready == Some(true));
            if first_ready.len() >= args.deploy_agents && pool_ready {
                report.deploy_all_ready_s = at;
                report.deploy_ready_count = first_ready.len();
                break;
            }
            if Instant::now() > deadline {
                say(&format!(
                    "  only {}/{} Ready after 120 s",
                    first_ready.len(),
                    args.deploy_agents
                ));
                report.deploy_all_ready_s = f64::NAN;
                report.deploy_ready_count = first_ready.len();
                break;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let transfers = fleet
            .stats
            .transfer_s
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        let mut less: Vec<f64> = first_ready
            .iter()
            .map(|(name, at)| at - transfers.get(name).copied().unwrap_or(0.0))
            .collect();
        less.sort_by(f64::total_cmp);
        report.deploy_ready_less_transfer_p99_s = quantile(&less, 0.99);
        let mut transfer: Vec<f64> = transfers.values().copied().collect();
        transfer.sort_by(f64::total_cmp);
        report.deploy_transfer_p50_s = quantile(&transfer, 0.5);
        report.deploy_transfer_p99_s = quantile(&transfer, 0.99);
        ready_rows = first_ready
            .iter()
            .map(|(name, at)| (name.clone(), *at, transfers.get(name).copied()))
            .collect();
        ready_rows.sort_by(|a, b| a.1.total_cmp(&b.1));
        let mut ready: Vec<f64> = first_ready.into_values().collect();
        ready.sort_by(f64::total_cmp);
        report.deploy_ready_p50_s = quantile(&ready, 0.5);
        report.deploy_ready_p99_s = quantile(&ready, 0.99);
        let assigned = sorted_since(&fleet.stats.assigned_at_s, deployed_at);
        report.deploy_assigned_p99_s = quantile(&assigned, 0.99);
        report.deploy_assigned_max_s = quantile(&assigned, 1.0);
        let reported = sorted_since(&fleet.stats.ready_at_s, deployed_at);
        report.deploy_reported_p99_s = quantile(&reported, 0.99);
        report.deploy_reported_max_s = quantile(&reported, 1.0);
    }

    // Offload.
    if args.offload_rps > 0.0 && args.offload_s > 0.0 && children_alive(&mut children) {
        say(&format!(
            "offloading {} requests/s for {} s through the Ready agents to the pool",
            args.offload_rps, args.offload_s
        ));
        let result = runtime.block_on(offload::run(
            slots.clone(),
            DEPLOYMENT,
            heldout.features.clone(),
            args.offload_rps,
            args.offload_s,
        ));
        report.offload_rps = result.rps;
        report.offload_errors = result.errors;
        report.offload = Some(result);
    }

    // Jobs.
    if args.jobs > 0 && children_alive(&mut children) {
        let result = jobs_phase(
            &args,
            &runtime,
            &api,
            (&api_base, &admin, &ca_pem),
            server,
            &cluster,
            pool_nodes,
            cloud_pid,
        )?;
        report.jobs_placed_per_sec = result.jobs_placed_per_sec;
        report.jobs = Some(result);
    }

    // The dashboard.
    if args.dashboard_rounds > 0 && children_alive(&mut children) {
        say(&format!(
            "timing {} dashboard refreshes each way (counts and pages, whole lists)",
            args.dashboard_rounds
        ));
        report.dashboard = Some(dashboard::run(
            &api,
            REGION,
            cloud_pid,
            args.dashboard_rounds,
        )?);
    }

    report.cloud_alive = children_alive(&mut children);
    report.sessions_lost = fleet.stats.sessions_lost.load(Ordering::Relaxed);
    report.udp_receive_buffer_drops = udp_drops_before
        .zip(process::udp_receive_buffer_drops())
        .map(|(before, after)| after.saturating_sub(before));
    report.agent_errors = fleet
        .stats
        .errors
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .iter()
        .map(|(k, v)| (k.clone(), *v))
        .collect();
    if let Some(last) = process::sample(cloud_pid) {
        report.cloud_fds = report.cloud_fds.max(last.fds);
    }
    runtime.shutdown_timeout(Duration::from_secs(1));
    drop(children);
    if args.dir.is_none() {
        let _ = std::fs::remove_dir_all(&root);
    }
    std::fs::create_dir_all(&args.out)
        .with_context(|| format!("cannot create {}", args.out.display()))?;
    let json_path = args.out.join(format!("fleet-{}.json", args.agents));
    std::fs::write(&json_path, serde_json::to_string_pretty(&report)?)?;
    let mut csv = String::from("agent,ready_s,transfer_s\n");
    for (name, at, transfer) in &ready_rows {
        let transfer = transfer.map_or(String::new(), |t| format!("{t:.4}"));
        csv.push_str(&format!("{name},{at:.4},{transfer}\n"));
    }
    std::fs::write(
        args.out.join(format!("fleet-{}-ready.csv", args.agents)),
        csv,
    )?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print_table(&report);
        println!("  written to {}", json_path.display());
    }
    Ok(())
}

/// Starts a session for each of `identities` at `rate` a second from `connect_started`,
/// each over one of a client endpoint per thousand bound to loopback addresses from
/// `source_base` on; errors are counted in the fleet's stats.
fn connect_all(
    runtime: &tokio::runtime::Runtime,
    fleet: &Arc<session::Fleet>,
    identities: Vec<enrol::Identity>,
    slots: &[Arc<session::Slot>],
    rate: f64,
    source_base: usize,
    connect_started: Instant,
) -> Result<()> {
    let _guard = runtime.enter();
    let endpoints: Vec<quinn::Endpoint> = (0..identities.len().div_ceil(1000))
        .map(|k| enrol::endpoint_from(enrol::source_address(source_base + k)))
        .collect::<Result<_>>()?;
    let fleet = fleet.clone();
    let slots = slots.to_vec();
    runtime.spawn(async move {
        for (k, identity) in identities.into_iter().enumerate() {
            let due = connect_started + Duration::from_secs_f64(k as f64 / rate);
            tokio::time::sleep_until(due.into()).await;
            let (fleet, slot) = (fleet.clone(), slots[k].clone());
            let endpoint = endpoints[k % endpoints.len()].clone();
            tokio::spawn(async move {
                if let Err(error) = session::run(fleet.clone(), identity, endpoint, slot).await {
                    fleet.stats.error(&error_kind(&error));
                }
            });
        }
    });
    Ok(())
}

/// Enrols and connects `pool_nodes` simulated pool agents of the jobs' pool, waits for
/// the region to count them up, then submits the jobs ([`jobs::run`]).
#[allow(clippy::too_many_arguments)]
fn jobs_phase(
    args: &FleetArgs,
    runtime: &tokio::runtime::Runtime,
    api: &Api,
    (api_base, admin, ca_pem): (&str, &str, &[u8]),
    server: SocketAddr,
    cluster: &enrol::Cluster,
    pool_nodes: usize,
    cloud_pid: u32,
) -> Result<jobs::JobsResult> {
    let say = |message: &str| {
        if !args.json {
            eprintln!("{message}");
        }
    };
    say(&format!(
        "enrolling and connecting {pool_nodes} simulated pool nodes ({JOB_POOL_PROFILE}) for {} jobs",
        args.jobs
    ));
    let tokens = enrol::tokens(api_base, admin, ca_pem, REGION, pool_nodes, 4)?;
    let names = (0..pool_nodes)
        .map(|k| (format!("{JOB_POOL}-{k:05}"), BTreeMap::new()))
        .collect();
    let (identities, _, _) =
        runtime.block_on(enrol::join_all(server, "pool", tokens, names, 4, 8, |_| {}))?;
    let profile_toml = nephele_edge::agent::resolve_profile(Some(&JOB_POOL_PROFILE.to_string()))?.1;
    let fleet = Arc::new(session::Fleet {
        server,
        cluster: cluster.clone(),
        role: "pool",
        profile_name: JOB_POOL_PROFILE.into(),
        profile_toml,
        started: Instant::now(),
        stats: session::Stats::default(),
    });
    let slots: Vec<Arc<session::Slot>> = (0..pool_nodes)
        .map(|_| Arc::new(session::Slot::default()))
        .collect();
    connect_all(
        runtime,
        &fleet,
        identities,
        &slots,
        args.connect_rate,
        200,
        Instant::now(),
    )?;
    let deadline =
        Instant::now() + Duration::from_secs_f64(pool_nodes as f64 / args.connect_rate + 60.0);
    loop {
        let nodes: Vec<nephele_api::NodeView> =
            api.get_as(&format!("/v1/regions/{REGION}/nodes"))?;
        let up = nodes.iter().filter(|n| n.pool == JOB_POOL && n.up).count();
        if up >= pool_nodes {
            break;
        }
        if Instant::now() > deadline {
            bail!(
                "only {up} of {pool_nodes} pool nodes came up within the connect time; errors: {:?}",
                fleet.stats.errors.lock().unwrap_or_else(|p| p.into_inner())
            );
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    say(&format!(
        "submitting {} jobs through the REST API from {} clients",
        args.jobs, args.job_clients
    ));
    let (cloud_from, bench_from) = (
        process::sample(cloud_pid),
        process::sample(std::process::id()),
    );
    let mut result = jobs::run(
        api_base,
        admin,
        ca_pem,
        JOB_POOL,
        args.jobs,
        args.job_clients,
        Duration::from_secs(120),
    )?;
    if let (Some(from), Some(to)) = (cloud_from, process::sample(cloud_pid)) {
        result.cloud_cpu_cores = process::cores_between(&from, &to);
    }
    if let (Some(from), Some(to)) = (bench_from, process::sample(std::process::id())) {
        result.bench_cpu_cores = process::cores_between(&from, &to);
    }
    result.pool_nodes = pool_nodes;
    Ok(result)
}

/// Enrols and starts one real pool agent serving the region's replicas.
fn start_pool_agent(
    api: &Api,
    quic: &str,
    root: &std::path::Path,
    children: &mut Children,
) -> Result<()> {
    let token: JoinTokenView = api.post_as(
        "/v1/tokens",
        &TokenRequest {
            region: Some(REGION.into()),
            ttl_s: Some(600),
        },
    )?;
    let token = token.token.context("no token text")?;
    let data_dir = root.join("pool-1");
    let output = std::process::Command::new(std::env::current_exe()?)
        .args([
            "edge",
            "join",
            "--server",
            quic,
            "--token",
            &token,
            "--data-dir",
        ])
        .arg(&data_dir)
        .args([
            "--name",
            "pool-1",
            "--role",
            "pool",
            "--profile",
            "gpu-4x-l4",
        ])
        .output()?;
    if !output.status.success() {
        bail!(
            "the pool agent's join failed: {}",
            String::from_utf8_lossy(&output.stderr)
        );
    }
    let ready = root.join("pool-1.ready");
    spawn(
        children,
        "pool-1",
        &[
            "edge".into(),
            "run".into(),
            "--data-dir".into(),
            data_dir.display().to_string(),
            "--listen".into(),
            "127.0.0.1:0".into(),
            "--workers".into(),
            "2".into(),
            "--ready-file".into(),
            ready.display().to_string(),
        ],
        root,
    )?;
    wait_for_file(&ready, children, Duration::from_secs(30))?;
    Ok(())
}

fn children_alive(children: &mut Children) -> bool {
    children
        .children
        .iter_mut()
        .all(|(_, child)| matches!(child.try_wait(), Ok(None)))
}

/// The first line of an error, without the numbers that make every instance differ.
fn error_kind(error: &anyhow::Error) -> String {
    let text = format!("{error:#}");
    let text: String = text
        .chars()
        .map(|c| if c.is_ascii_digit() { '#' } else { c })
        .collect();
    text.chars().take(160).collect()
}

/// The heartbeat-lag histogram from the control plane's `/metrics`.
struct LagHistogram {
    count: u64,
    /// (upper bound, cumulative count), `+Inf` last.
    buckets: Vec<(f64, u64)>,
}

impl LagHistogram {
    /// The bucket bound under which 99% of the heartbeats handled since `earlier` fell.
    fn p99_between(&self, earlier: &LagHistogram) -> Option<f64> {
        let total = self.count.checked_sub(earlier.count)?;
        if total == 0 {
            return None;
        }
        let want = (total as f64 * 0.99).ceil() as u64;
        self.buckets.iter().find_map(|(bound, cumulative)| {
            let before = earlier
                .buckets
                .iter()
                .find(|(b, _)| b == bound)
                .map_or(0, |(_, c)| *c);
            (cumulative.saturating_sub(before) >= want).then_some(*bound)
        })
    }
}

fn heartbeat_metrics(api: &Api) -> Option<LagHistogram> {
    let text = match api.get("/metrics").ok()? {
        serde_json::Value::String(text) => text,
        _ => return None,
    };
    parse_lag(&text)
}

fn parse_lag(text: &str) -> Option<LagHistogram> {
    let mut count = None;
    let mut buckets = Vec::new();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("nephele_heartbeat_lag_seconds_bucket{le=\"") {
            let (bound, value) = rest.split_once("\"}")?;
            let bound = if bound == "+Inf" {
                f64::INFINITY
            } else {
                bound.parse().ok()?
            };
            buckets.push((bound, value.trim().parse().ok()?));
        } else if let Some(rest) = line.strip_prefix("nephele_heartbeat_lag_seconds_count") {
            count = rest.trim().parse().ok();
        }
    }
    Some(LagHistogram {
        count: count?,
        buckets,
    })
}

fn fd_limit(pid: u32) -> Option<u64> {
    let limits = std::fs::read_to_string(format!("/proc/{pid}/limits")).ok()?;
    let line = limits.lines().find(|l| l.starts_with("Max open files"))?;
    line.split_whitespace().nth(3)?.parse().ok()
}

fn machine() -> String {
    format!(
        "{} (the bench and the control plane share them)",
        process::cpu_and_cores()
    )
}

/// The times in `at_s` as seconds since `since_s`, sorted.
fn sorted_since(at_s: &std::sync::Mutex<Vec<f64>>, since_s: f64) -> Vec<f64> {
    let mut times: Vec<f64> = at_s
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .iter()
        .map(|at| at - since_s)
        .collect();
    times.sort_by(f64::total_cmp);
    times
}

/// The `q` quantile of sorted `values` (nearest rank); 0 when empty.
pub(crate) fn quantile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let rank = ((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    sorted[rank - 1]
}

fn print_table(r: &FleetReport) {
    println!("machine: {}", r.machine);
    let rows: Vec<(&str, String)> = vec![
        (
            "agents connected",
            format!("{} of {}", r.agents_connected, r.agents_requested),
        ),
        (
            "enrolment",
            format!(
                "{:.1} s ({:.0} agents/s, {} retried joins)",
                r.enrol_s, r.enrolled_per_sec, r.join_retries
            ),
        ),
        ("connecting all", format!("{:.1} s", r.connect_s)),
        (
            "control plane RSS",
            format!(
                "{:.1} MB before agents, {:.1} MB enrolled, {:.1} MB connected",
                r.cloud_rss_bytes_before_agents as f64 / 1e6,
                r.cloud_rss_bytes_enrolled as f64 / 1e6,
                r.cloud_rss_bytes_connected as f64 / 1e6
            ),
        ),
        (
            "  per agent",
            format!("{:.1} KB", r.cloud_rss_bytes_per_agent / 1e3),
        ),
        (
            "control plane CPU (held)",
            format!(
                "{:.2} cores, {:.0} µs per heartbeat (the simulated fleet: {:.2} cores)",
                r.cloud_cpu_cores_held, r.cloud_cpu_us_per_heartbeat, r.bench_cpu_cores_held
            ),
        ),
        (
            "heartbeats handled",
            format!(
                "{:.0}/s (expected {:.0}/s at {} s)",
                r.heartbeats_per_sec, r.heartbeats_expected_per_sec, r.heartbeat_interval_s
            ),
        ),
        (
            "heartbeat mailbox lag p99",
            r.heartbeat_lag_p99_s
                .map_or("-".into(), |s| format!("≤ {} s", s)),
        ),
        (
            "file descriptors",
            format!(
                "{} (limit {})",
                r.cloud_fds,
                r.cloud_fd_limit.map_or("?".into(), |l| l.to_string())
            ),
        ),
        (
            "deployment to",
            format!(
                "{} agents, model {} bytes, {}",
                r.deploy_agents, r.model_bytes, r.model_transfer
            ),
        ),
        (
            "  Ready p50 / p99 / all",
            format!(
                "{:.2} / {:.2} / {:.2} s",
                r.deploy_ready_p50_s, r.deploy_ready_p99_s, r.deploy_all_ready_s
            ),
        ),
        (
            "  model transfer p50 / p99",
            format!(
                "{:.2} / {:.2} s",
                r.deploy_transfer_p50_s, r.deploy_transfer_p99_s
            ),
        ),
        (
            "  Ready less transfer p99",
            format!("{:.2} s", r.deploy_ready_less_transfer_p99_s),
        ),
        (
            "  desired state received p99/last",
            format!(
                "{:.2} / {:.2} s",
                r.deploy_assigned_p99_s, r.deploy_assigned_max_s
            ),
        ),
        (
            "  Ready reported p99/last",
            format!(
                "{:.2} / {:.2} s",
                r.deploy_reported_p99_s, r.deploy_reported_max_s
            ),
        ),
        (
            "offloaded",
            r.offload.as_ref().map_or("-".into(), |o| {
                format!(
                    "{:.0}/s of {:.0}/s asked, {} errors, p50 {:.1} ms, p99 {:.1} ms",
                    o.rps, o.target_rps, o.errors, o.p50_ms, o.p99_ms
                )
            }),
        ),
        (
            "jobs placed (REST API)",
            r.jobs.as_ref().map_or("-".into(), |j| {
                format!(
                    "{} of {} in {:.1} s: {:.0}/s ({} at submission; {} clients, {} nodes), submit p50 {:.1} ms, p99 {:.1} ms, {} errors; control plane {:.2} cores, clients {:.2} cores",
                    j.placed, j.jobs, j.placed_s, j.jobs_placed_per_sec, j.placed_at_submit,
                    j.clients, j.pool_nodes, j.submit_p50_ms, j.submit_p99_ms, j.errors,
                    j.cloud_cpu_cores, j.bench_cpu_cores
                )
            }),
        ),
        (
            "dashboard refresh",
            r.dashboard.as_ref().map_or("-".into(), |d| {
                let way = |c: &dashboard::RefreshCost| {
                    format!(
                        "{} requests, {:.1} KB, {:.0} ms (max {:.0}), control plane {:.0} ms CPU",
                        c.requests,
                        c.bytes as f64 / 1000.0,
                        c.wall_ms_p50,
                        c.wall_ms_max,
                        c.cloud_cpu_ms_mean
                    )
                };
                format!(
                    "counts and pages of {}: {}; whole lists: {} (median of {})",
                    d.page_size,
                    way(&d.now),
                    way(&d.whole_lists),
                    d.rounds
                )
            }),
        ),
        ("sessions lost", r.sessions_lost.to_string()),
        (
            "UDP dropped (buffers full)",
            r.udp_receive_buffer_drops
                .map_or_else(|| "-".into(), |n| format!("{n} datagrams, whole machine")),
        ),
    ];
    for (name, value) in rows {
        println!("  {name:<30} {value}");
    }
    for (kind, n) in &r.agent_errors {
        println!("  agent error ×{n}: {kind}");
    }
    if let Some(offload) = &r.offload {
        for (kind, n) in &offload.error_kinds {
            println!("  offload error ×{n}: {kind}");
        }
    }
    if let Some(jobs) = &r.jobs {
        for (kind, n) in &jobs.error_kinds {
            println!("  job error ×{n}: {kind}");
        }
    }
    if !r.cloud_alive {
        println!("  the control plane exited during the run: see its log");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_lag_percentile_counts_only_heartbeats_since_the_earlier_reading() {
        let earlier = parse_lag(
            "nephele_heartbeat_lag_seconds_bucket{le=\"0.001\"} 100\nnephele_heartbeat_lag_seconds_bucket{le=\"0.1\"} 100\nnephele_heartbeat_lag_seconds_bucket{le=\"+Inf\"} 100\nnephele_heartbeat_lag_seconds_count 100\n",
        )
        .expect("parses");
        let later = parse_lag(
            "nephele_heartbeat_lag_seconds_bucket{le=\"0.001\"} 101\nnephele_heartbeat_lag_seconds_bucket{le=\"0.1\"} 200\nnephele_heartbeat_lag_seconds_bucket{le=\"+Inf\"} 200\nnephele_heartbeat_lag_seconds_count 200\n",
        )
        .expect("parses");
        assert_eq!(later.p99_between(&earlier), Some(0.1));
        assert_eq!(later.p99_between(&later), None, "nothing new");
        assert!(parse_lag("nothing here").is_none());
    }

    #[test]
    fn the_job_pool_holds_every_job_with_a_tenth_spare() {
        assert_eq!(pool_nodes_for(0), 0);
        assert_eq!(pool_nodes_for(64), 2);
        assert_eq!(pool_nodes_for(10_000), 172);
        assert!(pool_nodes_for(50_000) * JOBS_PER_NODE >= 55_000);
    }

    #[test]
    fn quantiles_take_the_nearest_rank() {
        let values = [1.0, 2.0, 3.0, 4.0];
        assert_eq!(quantile(&values, 0.5), 2.0);
        assert_eq!(quantile(&values, 0.99), 4.0);
        assert_eq!(quantile(&[], 0.5), 0.0);
    }

    #[test]
    fn error_kinds_do_not_split_on_numbers() {
        let a = error_kind(&anyhow::anyhow!("timed out after 10 s on 127.0.0.5:4433"));
        let b = error_kind(&anyhow::anyhow!("timed out after 12 s on 127.0.0.9:4433"));
        assert_eq!(a, b);
    }
}
