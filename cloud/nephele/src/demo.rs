//! `nephele demo`: a whole fleet on loopback, from this one binary.
//!
//! Starts a control plane with two regions, three edge agents with different firmware
//! profiles and one pool agent as real processes (real QUIC, real mutual TLS), enrols
//! them with join tokens, pushes the project's digits model, deploys it to the edge
//! devices, and sends each device a burst of the model's held-out samples. The smallest
//! device gets more concurrent requests than its single inference slot can answer
//! within the SLO, so part of its burst is offloaded to the pool. Last, it submits jobs
//! to eu-west's scheduler, where the pool agent fills a node slot.
//!
//! All agents share this machine's cores, so the demo gives each the inference slots
//! its class would have relative to the others (`--workers`), not the host's.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _, Result};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use nephele_api::{
    DeploymentStatus, DeviceView, JobLogsView, JobView, JoinTokenView, ModelView, PrioritySpec,
    ReplicaSetView, TokenRequest,
};

use crate::client::Api;

pub(crate) const MODEL_ONNX: &[u8] = include_bytes!("../../../shared/models/digits-mlp/model.onnx");
pub(crate) const HELDOUT_JSON: &str =
    include_str!("../../../shared/models/digits-mlp/heldout.json");

#[derive(Debug, Clone, clap::Args)]
pub struct DemoArgs {
    /// Print one JSON object instead of tables.
    #[arg(long)]
    pub json: bool,
    /// Leave the fleet running after the burst (Ctrl-C to stop).
    #[arg(long)]
    pub keep_running: bool,
    /// The API's port on 127.0.0.1. Default: with --keep-running 8080 (so a saved
    /// `nephele login` context keeps working from one run to the next) unless another
    /// process holds it, otherwise any free port.
    #[arg(long, value_name = "PORT")]
    pub api_port: Option<u16>,
    /// Requests sent to each device (the smallest device gets twice as many).
    #[arg(long, default_value_t = 360)]
    pub requests: usize,
    /// Keep the demo's data dirs and logs here instead of a temporary folder.
    #[arg(long)]
    pub dir: Option<PathBuf>,
    /// Run the agents from this binary instead of this CLI's `edge` subcommand: the
    /// agent as it ships, `target/dist/nephele-edge` after `cargo build --profile dist
    /// -p nephele-edge`. Most of an idle agent's resident memory is the code pages of
    /// its binary, so its `rss_idle_mb` is the shipped agent's only with this.
    #[arg(long)]
    pub agent_bin: Option<PathBuf>,
}

/// How the demo starts an agent: a binary and the arguments before the agent's own.
pub(crate) struct AgentExe {
    pub(crate) exe: PathBuf,
    pub(crate) prefix: Vec<String>,
}

impl AgentExe {
    /// `bin` (an agent binary, e.g. `nephele-edge`), else this CLI's `edge`
    /// subcommand.
    pub(crate) fn new(bin: Option<&Path>) -> Result<AgentExe> {
        match bin {
            Some(bin) => {
                if !bin.is_file() {
                    bail!(
                        "--agent-bin {}: no such file; build it with `cargo build --profile dist -p nephele-edge` (target/dist/nephele-edge)",
                        bin.display()
                    );
                }
                Ok(AgentExe {
                    exe: bin.to_path_buf(),
                    prefix: Vec::new(),
                })
            }
            None => Ok(AgentExe {
                exe: std::env::current_exe().context("cannot find this executable")?,
                prefix: vec!["edge".into()],
            }),
        }
    }

    /// `prefix` + `args`.
    pub(crate) fn args(&self, args: &[String]) -> Vec<String> {
        self.prefix.iter().chain(args).cloned().collect()
    }

    /// What the report says about it: the path and its size.
    pub(crate) fn describe(&self) -> String {
        let size = std::fs::metadata(&self.exe).map_or(0, |m| m.len());
        format!(
            "{}{} ({:.1} MB)",
            self.exe.display(),
            if self.prefix.is_empty() { "" } else { " edge" },
            size as f64 / 1e6
        )
    }
}

/// What the demo says last: where to look while the fleet runs (with
/// `--keep-running`), or how to keep it up; logs only where they outlive the demo.
fn closing_lines(
    api_addr: &str,
    quic_addr: &str,
    root: &std::path::Path,
    keep_running: bool,
    kept_dir: bool,
    endpoints: &[String],
) -> Vec<String> {
    let token = root.join("cloud-data/admin-token");
    let ca = root.join("cloud-data/ca.pem");
    let mut lines = Vec::new();
    if keep_running {
        lines.push(format!(
            "dashboard: https://{api_addr}/   API: https://{api_addr}   metrics: https://{api_addr}/metrics"
        ));
        lines.push(format!(
            "     (HTTPS with the demo's own cluster CA, {}: import it in a browser, or pass it as below)",
            ca.display()
        ));
        lines.push(format!(
            "     try: nephele device list --api https://{api_addr} --ca {} --token $(cat {})",
            ca.display(),
            token.display()
        ));
        lines.push(format!(
            "      or: curl --cacert {} -H \"Authorization: Bearer $(cat {})\" https://{api_addr}/v1/devices",
            ca.display(),
            token.display()
        ));
        lines.push(format!("agent endpoints: {}", endpoints.join(", ")));
        lines.push(format!(
            "agents join at {quic_addr} (QUIC): nephele token create --region eu-west, then nephele-edge join --server {quic_addr} --token …"
        ));
    } else {
        lines.push(
            "the fleet stops now; run `nephele demo --keep-running` to keep it up and explore it \
             (dashboard, API, CLI)"
                .to_string(),
        );
    }
    if keep_running || kept_dir {
        lines.push(format!("logs and data: {}", root.display()));
    }
    lines
}

#[derive(Deserialize)]
pub(crate) struct Heldout {
    pub(crate) features: Vec<Vec<f32>>,
    pub(crate) labels: Vec<usize>,
}

struct DeviceSpec {
    name: &'static str,
    profile: &'static str,
    role: &'static str,
    region: &'static str,
    labels: &'static [&'static str],
    workers: usize,
    /// Concurrent clients in the burst.
    concurrency: usize,
    /// Multiple of `--requests` sent to this device.
    burst_factor: usize,
}

const FLEET: &[DeviceSpec] = &[
    DeviceSpec {
        name: "coral-1",
        profile: "coral-dev-board",
        role: "edge",
        region: "eu-west",
        labels: &["tier=edge", "site=plant"],
        workers: 1,
        concurrency: 32,
        burst_factor: 2,
    },
    DeviceSpec {
        name: "pi-1",
        profile: "rpi5-hailo8l",
        role: "edge",
        region: "eu-west",
        labels: &["tier=edge", "site=lab"],
        workers: 1,
        concurrency: 4,
        burst_factor: 1,
    },
    DeviceSpec {
        name: "jetson-1",
        profile: "jetson-orin-nano-8gb",
        role: "edge",
        region: "us-east",
        labels: &["tier=edge", "site=lab"],
        workers: 2,
        concurrency: 4,
        burst_factor: 1,
    },
    DeviceSpec {
        name: "pool-1",
        profile: "gpu-4x-l4",
        role: "pool",
        region: "eu-west",
        labels: &[],
        workers: 2,
        concurrency: 0,
        burst_factor: 0,
    },
];

/// The demo's control-plane config; `API_LISTEN` is replaced by the API's address.
const CLOUD_CONFIG: &str = r#"
api_listen = "API_LISTEN"
quic_listen = "127.0.0.1:0"
heartbeat_interval_ms = 500

[[region]]
name = "eu-west"
carbon_zone = "DE"
[[region.pool]]
name = "l4"
node_profile = "gpu-4x-l4"
capacity_type = "spot"
price_per_hour = 2.9
max_nodes = 4

[[region]]
name = "us-east"
carbon_zone = "US-MIDA-PJM"
"#;

/// Where the demo's API listens: `--api-port`, else 8080 with `--keep-running` when
/// it is free, else any free port (a test or a second demo may run beside this one).
fn api_listen(args: &DemoArgs) -> String {
    let port = args.api_port.unwrap_or_else(|| {
        let stable = 8080;
        let free = std::net::TcpListener::bind(("127.0.0.1", stable)).is_ok();
        if args.keep_running && free {
            stable
        } else {
            if args.keep_running {
                progress(
                    args.json,
                    "127.0.0.1:8080 is taken: the API gets a free port (--api-port N chooses one)",
                );
            }
            0
        }
    });
    format!("127.0.0.1:{port}")
}

/// Ends the job members that a pool agent's supervisors still run (they outlive their
/// agent on purpose), from their status files: the demo's last cleanup, which needs
/// neither the API nor its token.
struct MemberReaper {
    data_dirs: Vec<PathBuf>,
}

impl Drop for MemberReaper {
    fn drop(&mut self) {
        for dir in &self.data_dirs {
            if let Ok(layout) = nephele_edge::jobs::files::JobLayout::new(dir) {
                let killed = layout.kill_running_members();
                if killed > 0 {
                    eprintln!(
                        "[demo] ended {killed} job member(s) still running under {}",
                        dir.display()
                    );
                }
            }
        }
    }
}

/// Deletes every job and waits (up to 10 s) until no agent reports a running member.
fn stop_jobs(api: &Api, endpoints: &[String]) {
    let names: Vec<String> = api
        .get_as::<Vec<JobView>>("/v1/jobs")
        .unwrap_or_default()
        .into_iter()
        .map(|job| job.name)
        .collect();
    for name in &names {
        let _ = api.delete(&format!("/v1/jobs/{name}"));
    }
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while std::time::Instant::now() < deadline {
        let running = endpoints.iter().any(|endpoint| {
            Api::new(&format!("http://{endpoint}"), "")
                .get("/v1/status")
                .ok()
                .and_then(|v| v["jobs"].as_array().cloned())
                .unwrap_or_default()
                .iter()
                .any(|member| {
                    member["state"]
                        .as_str()
                        .is_some_and(|s| s.starts_with("running") || s.starts_with("stopping"))
                })
        });
        if !running {
            return;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Child processes, killed when dropped.
pub(crate) struct Fleet {
    pub(crate) children: Vec<(String, Child)>,
}

impl Drop for Fleet {
    fn drop(&mut self) {
        for (_, child) in &mut self.children {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

pub(crate) fn spawn(fleet: &mut Fleet, label: &str, args: &[String], log_dir: &Path) -> Result<()> {
    let exe = std::env::current_exe().context("cannot find this executable")?;
    spawn_exe(fleet, &exe, label, args, log_dir)
}

/// As [`spawn`], running `exe`.
pub(crate) fn spawn_exe(
    fleet: &mut Fleet,
    exe: &Path,
    label: &str,
    args: &[String],
    log_dir: &Path,
) -> Result<()> {
    let log = std::fs::File::create(log_dir.join(format!("{label}.log")))?;
    let child = Command::new(exe)
        .args(args)
        .stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log)
        .spawn()
        .with_context(|| format!("cannot start {label}"))?;
    fleet.children.push((label.to_string(), child));
    Ok(())
}

/// A control plane started as a child process: where it listens and the admin's access.
pub(crate) struct StartedCloud {
    /// HOST:PORT of the REST API (HTTPS).
    pub(crate) api: String,
    /// HOST:PORT of the QUIC gateway.
    pub(crate) quic: String,
    pub(crate) admin_token: String,
    /// The cluster CA, which the API's certificate is from.
    pub(crate) ca_pem: Vec<u8>,
    pub(crate) pid: u32,
}

/// Starts `nephele cloud` with `config`, its data in `root/cloud-data`, and waits (up
/// to 30 s) until it is ready.
pub(crate) fn start_cloud(fleet: &mut Fleet, root: &Path, config: &str) -> Result<StartedCloud> {
    std::fs::write(root.join("cloud.toml"), config)?;
    let ready_file = root.join("cloud.ready");
    spawn(
        fleet,
        "cloud",
        &[
            "cloud".into(),
            "--config".into(),
            root.join("cloud.toml").display().to_string(),
            "--data-dir".into(),
            root.join("cloud-data").display().to_string(),
            "--ready-file".into(),
            ready_file.display().to_string(),
        ],
        root,
    )?;
    let pid = fleet.children.last().map_or(0, |(_, child)| child.id());
    let ready = wait_for_file(&ready_file, fleet, Duration::from_secs(30))?;
    let address = |key: &str| {
        ready[key]
            .as_str()
            .map(str::to_string)
            .with_context(|| format!("the control plane's ready file has no {key}"))
    };
    Ok(StartedCloud {
        api: address("api")?,
        quic: address("quic")?,
        admin_token: std::fs::read_to_string(root.join("cloud-data/admin-token"))?
            .trim()
            .to_string(),
        ca_pem: std::fs::read(root.join("cloud-data/ca.pem"))
            .context("the control plane wrote no ca.pem in its data dir")?,
        pid,
    })
}

pub(crate) fn wait_for_file(path: &Path, fleet: &mut Fleet, timeout: Duration) -> Result<Value> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Ok(text) = std::fs::read_to_string(path) {
            if let Ok(value) = serde_json::from_str(&text) {
                return Ok(value);
            }
        }
        for (label, child) in &mut fleet.children {
            if let Ok(Some(status)) = child.try_wait() {
                bail!("{label} exited early ({status}); see its log");
            }
        }
        if Instant::now() > deadline {
            bail!("timed out waiting for {}", path.display());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[derive(Debug, Serialize)]
struct DeviceReport {
    name: String,
    profile: String,
    region: String,
    requests: usize,
    local: usize,
    offloaded: usize,
    rejected: usize,
    p50_ms: f64,
    p99_ms: f64,
    local_p50_ms: f64,
    local_p99_ms: f64,
    offloaded_p50_ms: f64,
    offloaded_p99_ms: f64,
    accuracy: f64,
    /// Agent resident memory before any model was deployed, and after the burst.
    rss_idle_mb: f64,
    rss_model_mb: f64,
}

fn quantile_ms(samples: &mut [f64], q: f64) -> f64 {
    if samples.is_empty() {
        return 0.0;
    }
    samples.sort_by(|a, b| a.total_cmp(b));
    let rank = ((q * samples.len() as f64).ceil() as usize).clamp(1, samples.len());
    (samples[rank - 1] * 1000.0).round() / 1000.0
}

fn argmax(values: &[f32]) -> usize {
    values
        .iter()
        .enumerate()
        .max_by(|a, b| a.1.total_cmp(b.1))
        .map(|(i, _)| i)
        .unwrap_or(0)
}

struct Sample {
    latency_ms: f64,
    cloud: bool,
    correct: bool,
}

fn burst(
    endpoint: &str,
    heldout: &Heldout,
    total: usize,
    concurrency: usize,
) -> (Vec<Sample>, usize) {
    let next = Arc::new(AtomicUsize::new(0));
    let samples = Arc::new(Mutex::new(Vec::with_capacity(total)));
    let rejected = Arc::new(AtomicUsize::new(0));
    std::thread::scope(|scope| {
        for _ in 0..concurrency.max(1) {
            let next = next.clone();
            let samples = samples.clone();
            let rejected = rejected.clone();
            scope.spawn(move || {
                let agent: ureq::Agent = ureq::Agent::config_builder()
                    .http_status_as_error(false)
                    .timeout_global(Some(Duration::from_secs(30)))
                    .build()
                    .into();
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    if i >= total {
                        return;
                    }
                    let row = i % heldout.labels.len();
                    let body = serde_json::json!({"shape": [1, 64], "data": heldout.features[row]});
                    let started = Instant::now();
                    let response = agent
                        .post(format!("http://{endpoint}/v1/infer/digits"))
                        .send_json(&body);
                    let latency_ms = started.elapsed().as_secs_f64() * 1000.0;
                    let Ok(mut response) = response else {
                        rejected.fetch_add(1, Ordering::Relaxed);
                        continue;
                    };
                    if response.status().as_u16() != 200 {
                        rejected.fetch_add(1, Ordering::Relaxed);
                        continue;
                    }
                    let Ok(reply) = response.body_mut().read_json::<Value>() else {
                        rejected.fetch_add(1, Ordering::Relaxed);
                        continue;
                    };
                    let output: Vec<f32> = reply["data"]
                        .as_array()
                        .map(|a| {
                            a.iter()
                                .filter_map(|x| x.as_f64())
                                .map(|x| x as f32)
                                .collect()
                        })
                        .unwrap_or_default();
                    samples
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .push(Sample {
                            latency_ms,
                            cloud: reply["where"] == "cloud",
                            correct: argmax(&output) == heldout.labels[row],
                        });
                }
            });
        }
    });
    let samples = std::mem::take(&mut *samples.lock().unwrap_or_else(|p| p.into_inner()));
    (samples, rejected.load(Ordering::Relaxed))
}

/// Blocks until SIGINT or SIGTERM, so that the fleet is torn down by `Fleet`'s drop.
fn wait_for_shutdown_signal() -> Result<()> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async {
        #[cfg(unix)]
        {
            let mut term =
                tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = term.recv() => {}
            }
        }
        #[cfg(not(unix))]
        tokio::signal::ctrl_c().await?;
        Ok::<(), anyhow::Error>(())
    })
}

fn progress(json: bool, message: &str) {
    if !json {
        eprintln!("[demo] {message}");
    }
}

pub fn run(args: DemoArgs) -> Result<()> {
    let started = Instant::now();
    let heldout: Heldout = serde_json::from_str(HELDOUT_JSON).context("embedded held-out set")?;
    let root = match &args.dir {
        Some(dir) => dir.clone(),
        None => std::env::temp_dir().join(format!("nephele-demo-{}", std::process::id())),
    };
    let _ = std::fs::remove_dir_all(&root);
    std::fs::create_dir_all(&root)?;
    let agent_exe = AgentExe::new(args.agent_bin.as_deref())?;
    // Dropped after `fleet` (declared before it): once the agents are gone, any job
    // member still running is ended from its status file, with no API involved.
    let reaper = MemberReaper {
        data_dirs: FLEET
            .iter()
            .filter(|d| d.role == "pool")
            .map(|d| root.join(d.name))
            .collect(),
    };
    let mut fleet = Fleet {
        children: Vec::new(),
    };

    progress(
        args.json,
        &format!(
            "starting the control plane (2 regions) in {}",
            root.display()
        ),
    );
    let StartedCloud {
        api: api_addr,
        quic: quic_addr,
        admin_token,
        ca_pem,
        ..
    } = start_cloud(
        &mut fleet,
        &root,
        &CLOUD_CONFIG.replace("API_LISTEN", &api_listen(&args)),
    )?;
    let api = Api::with_ca(&format!("https://{api_addr}"), &admin_token, Some(&ca_pem));

    progress(
        args.json,
        "enrolling 3 edge agents and 1 pool agent with single-use join tokens",
    );
    for device in FLEET {
        let token: JoinTokenView = api.post_as(
            "/v1/tokens",
            &TokenRequest {
                region: Some(device.region.to_string()),
                ttl_s: Some(600),
            },
        )?;
        let token = token.token.context("no token in response")?;
        let data_dir = root.join(device.name);
        let mut join = vec![
            "join".to_string(),
            "--server".into(),
            quic_addr.clone(),
            "--token".into(),
            token,
            "--data-dir".into(),
            data_dir.display().to_string(),
            "--name".into(),
            device.name.into(),
            "--role".into(),
            device.role.into(),
            "--profile".into(),
            device.profile.into(),
        ];
        for label in device.labels {
            join.push("--label".into());
            join.push(label.to_string());
        }
        let output = Command::new(&agent_exe.exe)
            .args(agent_exe.args(&join))
            .output()?;
        if !output.status.success() {
            bail!(
                "join of {} failed: {}",
                device.name,
                String::from_utf8_lossy(&output.stderr)
            );
        }
        let ready_file = root.join(format!("{}.ready", device.name));
        spawn_exe(
            &mut fleet,
            &agent_exe.exe,
            device.name,
            &agent_exe.args(&[
                "run".into(),
                "--data-dir".into(),
                data_dir.display().to_string(),
                "--listen".into(),
                "127.0.0.1:0".into(),
                "--workers".into(),
                device.workers.to_string(),
                "--ready-file".into(),
                ready_file.display().to_string(),
            ]),
            &root,
        )?;
    }
    let mut endpoints = Vec::new();
    for device in FLEET {
        let ready = wait_for_file(
            &root.join(format!("{}.ready", device.name)),
            &mut fleet,
            Duration::from_secs(30),
        )?;
        endpoints.push(
            ready["listen"]
                .as_str()
                .context("agent ready file")?
                .to_string(),
        );
    }

    let agent_rss = |endpoint: &str| -> f64 {
        let http = Api::new(&format!("http://{endpoint}"), "");
        let rss = http
            .get("/v1/status")
            .ok()
            .and_then(|v| v["rss_bytes"].as_f64())
            .unwrap_or(0.0);
        (rss / 1e6 * 10.0).round() / 10.0
    };
    std::thread::sleep(Duration::from_millis(500));
    let rss_idle: Vec<f64> = endpoints.iter().map(|e| agent_rss(e)).collect();

    progress(
        args.json,
        &format!(
            "pushing the digits model ({} bytes ONNX) with its held-out set, and deploying it to tier=edge",
            MODEL_ONNX.len()
        ),
    );
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
    for variant in &model.variants {
        progress(
            args.json,
            &format!(
                "  variant {:<18} {:>6} bytes, accuracy {}%{}",
                variant.name,
                variant.size,
                variant
                    .accuracy_pct
                    .map_or("-".into(), |a| format!("{a:.2}")),
                variant
                    .rejected
                    .as_ref()
                    .map_or(String::new(), |why| format!(" (not shipped: {why})")),
            ),
        );
    }
    let _: DeploymentStatus = api.post_as(
        "/v1/deployments",
        &serde_json::json!({"name": "digits", "model": "digits-mlp", "selector": "tier=edge", "slo_ms": 20, "max_queue": 4, "offload": true}),
    )?;
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let status: DeploymentStatus = api.get_as("/v1/deployments/digits")?;
        let pool_ready = status
            .devices
            .iter()
            .any(|d| d.role == "pool" && d.ready == Some(true));
        if status.ready_devices == Some(status.desired_devices)
            && status.desired_devices == 3
            && pool_ready
        {
            break;
        }
        if Instant::now() > deadline {
            bail!(
                "deployment did not become ready within 60 s: {}",
                serde_json::to_string(&status).unwrap_or_default()
            );
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    progress(
        args.json,
        "deployment ready on 3 edge devices and the pool; driving the burst",
    );

    let mut reports = Vec::new();
    for ((device, endpoint), rss_idle_mb) in FLEET.iter().zip(&endpoints).zip(&rss_idle) {
        if device.role != "edge" {
            continue;
        }
        let total = args.requests * device.burst_factor;
        progress(
            args.json,
            &format!(
                "{}: {total} requests, {} concurrent",
                device.name, device.concurrency
            ),
        );
        let (samples, rejected) = burst(endpoint, &heldout, total, device.concurrency);
        let mut all: Vec<f64> = samples.iter().map(|s| s.latency_ms).collect();
        let mut local: Vec<f64> = samples
            .iter()
            .filter(|s| !s.cloud)
            .map(|s| s.latency_ms)
            .collect();
        let mut cloud: Vec<f64> = samples
            .iter()
            .filter(|s| s.cloud)
            .map(|s| s.latency_ms)
            .collect();
        let correct = samples.iter().filter(|s| s.correct).count();
        reports.push(DeviceReport {
            name: device.name.into(),
            profile: device.profile.into(),
            region: device.region.into(),
            requests: total,
            local: local.len(),
            offloaded: cloud.len(),
            rejected,
            p50_ms: quantile_ms(&mut all, 0.5),
            p99_ms: quantile_ms(&mut all, 0.99),
            local_p50_ms: quantile_ms(&mut local, 0.5),
            local_p99_ms: quantile_ms(&mut local, 0.99),
            offloaded_p50_ms: quantile_ms(&mut cloud, 0.5),
            offloaded_p99_ms: quantile_ms(&mut cloud, 0.99),
            accuracy: if samples.is_empty() {
                0.0
            } else {
                ((correct as f64 / samples.len() as f64) * 10_000.0).round() / 10_000.0
            },
            rss_idle_mb: *rss_idle_mb,
            rss_model_mb: agent_rss(endpoint),
        });
    }
    // Let one more heartbeat carry the final counters to the control plane.
    std::thread::sleep(Duration::from_millis(700));
    let status: DeploymentStatus = api.get_as("/v1/deployments/digits")?;
    let devices: Vec<DeviceView> = api.get_as("/v1/devices")?;

    // The region scheduler: the pool agent fills one node slot of eu-west's spot pool,
    // beside the cloud replica of `digits` the region placed there.
    let replicas: Vec<ReplicaSetView> = api.get_as("/v1/deployments/digits/replicas")?;
    progress(
        args.json,
        "submitting three jobs to eu-west's scheduler (a fine-tune, a gang that runs, one too big)",
    );
    let mut jobs: Vec<JobView> = Vec::new();
    for body in [
        serde_json::json!({"name": "finetune", "region": "eu-west", "gpus": 2,
            "priority": "production", "spot_ok": true, "cpu_milli": 16000,
            "memory_mib": 65536, "expected_runtime_s": 7200,
            "command": ["sh", "-c", "echo fine-tuning; sleep 3600"]}),
        serde_json::json!({"name": "sweep", "region": "eu-west", "members": 2, "gpus": 1,
            "gpu_milli": 500, "topology": "same-node", "priority": "best-effort",
            "spot_ok": true, "cpu_milli": 4000, "memory_mib": 16384, "expected_runtime_s": 60,
            "command": ["sh", "-c", "echo \"rank $RANK of $WORLD_SIZE on $NEPHELE_NODE, rendezvous $MASTER_ADDR:$MASTER_PORT, GPU $CUDA_VISIBLE_DEVICES\""]}),
    ] {
        jobs.push(api.post_as("/v1/jobs", &body)?);
    }
    // A job no pool of the region could ever run is refused at once, with the reason.
    let refused = match api.post_as::<JobView>(
        "/v1/jobs",
        &serde_json::json!({"name": "pretrain", "region": "eu-west", "members": 2, "gpus": 8,
            "spot_ok": true}),
    ) {
        Ok(_) => "accepted (unexpected)".to_string(),
        Err(error) => format!("{error:#}"),
    };
    // The gang's members run as processes on the pool node and print what they see.
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut sweep: JobView = api.get_as("/v1/jobs/sweep")?;
    while sweep.state != "succeeded" && sweep.state != "failed" && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(200));
        sweep = api.get_as("/v1/jobs/sweep")?;
    }
    let mut sweep_logs = Vec::new();
    for member in 0..2 {
        let log = api
            .get_as::<JobLogsView>(&format!("/v1/jobs/sweep/logs?member={member}"))
            .map(|v| v.data.trim().to_string())
            .unwrap_or_else(|e| format!("(no log: {e:#})"));
        sweep_logs.push(log);
    }
    jobs[0] = api.get_as("/v1/jobs/finetune")?;
    jobs[1] = sweep;

    if args.json {
        println!(
            "{}",
            serde_json::to_string(&serde_json::json!({
                "devices": reports,
                "jobs": jobs,
                "refused_job": refused,
                "sweep_logs": sweep_logs,
                "replicas": replicas,
                "api": format!("https://{api_addr}"),
                "ca": root.join("cloud-data/ca.pem"),
                "agent_binary": agent_exe.describe(),
                "elapsed_s": started.elapsed().as_secs_f64(),
            }))?
        );
    } else {
        println!();
        println!(
            "{:<10} {:<22} {:<8} {:>6} {:>9} {:>8} {:>7} {:>7} {:>9} {:>9} {:>8} {:>8} {:>9}",
            "DEVICE",
            "PROFILE",
            "REGION",
            "LOCAL",
            "OFFLOADED",
            "REJECTED",
            "P50 MS",
            "P99 MS",
            "LOCAL P50",
            "LOCAL P99",
            "OFFL P50",
            "OFFL P99",
            "ACCURACY"
        );
        for r in &reports {
            println!(
                "{:<10} {:<22} {:<8} {:>6} {:>9} {:>8} {:>7.3} {:>7.3} {:>9.3} {:>9.3} {:>8.3} {:>8.3} {:>8.2}%",
                r.name, r.profile, r.region, r.local, r.offloaded, r.rejected, r.p50_ms, r.p99_ms,
                r.local_p50_ms, r.local_p99_ms, r.offloaded_p50_ms, r.offloaded_p99_ms, r.accuracy * 100.0
            );
        }
        let memory: Vec<String> = reports
            .iter()
            .map(|r| {
                format!(
                    "{} {:.1} MB idle, {:.1} MB with the model",
                    r.name, r.rss_idle_mb, r.rss_model_mb
                )
            })
            .collect();
        println!("edge agent memory (RSS): {}", memory.join("; "));
        println!("  (agents run from {})", agent_exe.describe());
        println!();
        println!("control plane view (from agent heartbeats):");
        for row in &status.devices {
            println!(
                "  {:<10} {:<5} {:<22} phase={:<6} local={:<5} offloaded={:<5} p50={}ms p99={}ms",
                row.device,
                row.role,
                row.profile,
                row.phase,
                crate::client::num(row.served_local),
                crate::client::num(row.served_offloaded),
                crate::client::num(row.p50_ms),
                crate::client::num(row.p99_ms)
            );
        }
        let online = devices.iter().filter(|d| d.online == Some(true)).count();
        println!("{online} agents online");
        for region in &replicas {
            let placed: Vec<String> = region
                .replicas
                .iter()
                .map(|r| {
                    format!(
                        "{} {} on {}",
                        r.name,
                        r.state,
                        r.agent.as_deref().unwrap_or("-")
                    )
                })
                .collect();
            println!(
                "cloud replicas of digits in {} (`nephele deploy replicas digits`): {}",
                region.region,
                placed.join(", ")
            );
        }
        println!();
        println!("jobs in region eu-west (`nephele job list`):");
        for job in &jobs {
            let detail = if job.state == "pending" {
                job.why_pending
                    .as_ref()
                    .map_or(String::new(), |w| w.message.clone())
            } else if job.outcome.is_some() {
                format!(
                    "attempt {}, members on {}",
                    job.attempt,
                    job.attempts
                        .first()
                        .map_or(String::new(), |a| a.nodes.join(","))
                )
            } else {
                job.placement
                    .iter()
                    .map(|m| {
                        let gpus: Vec<String> = m.gpus.iter().map(|g| g.gpu.to_string()).collect();
                        format!("{}[gpu {}]", m.node, gpus.join(","))
                    })
                    .collect::<Vec<_>>()
                    .join(" ")
            };
            let priority = match &job.spec.priority {
                Some(PrioritySpec::Class(class)) => class.clone(),
                _ => "batch".to_string(),
            };
            println!(
                "  {:<10} {:<11} {:<10} {}",
                job.name, priority, job.state, detail
            );
        }
        println!("  pretrain   refused: {refused}");
        println!("sweep's members ran on the pool node (`nephele job logs sweep --member N`):");
        for (member, log) in sweep_logs.iter().enumerate() {
            println!("  [{member}] {log}");
        }
        println!();
        for line in closing_lines(
            &api_addr.to_string(),
            &quic_addr,
            &root,
            args.keep_running,
            args.dir.is_some(),
            &endpoints,
        ) {
            println!("{line}");
        }
        println!("finished in {:.1} s", started.elapsed().as_secs_f64());
    }

    if args.keep_running {
        eprintln!(
            "[demo] fleet is running; Ctrl-C (or SIGTERM) stops it and every process it started"
        );
        wait_for_shutdown_signal()?;
    }
    // Job members run under supervisors that outlive their agent on purpose (an agent
    // restart must not kill a job), so the demo ends its jobs through the API before it
    // stops the fleet, and then (should the API have refused: a rotated token) ends
    // what still runs from the pool agents' status files.
    stop_jobs(&api, &endpoints);
    drop(fleet);
    drop(reaper);
    if args.dir.is_none() {
        let _ = std::fs::remove_dir_all(&root);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_demo_points_only_at_what_still_runs() {
        let root = std::path::Path::new("/tmp/nephele-demo-x");
        let endpoints = ["http://127.0.0.1:9001".to_string()];
        let gone = closing_lines(
            "127.0.0.1:8080",
            "127.0.0.1:9443",
            root,
            false,
            false,
            &endpoints,
        )
        .join("\n");
        assert!(
            !gone.contains("http://") && !gone.contains("https://"),
            "{gone}"
        );
        assert!(
            !gone.contains("/tmp/nephele-demo-x"),
            "a removed folder: {gone}"
        );
        assert!(gone.contains("--keep-running"), "{gone}");
        let kept = closing_lines(
            "127.0.0.1:8080",
            "127.0.0.1:9443",
            root,
            false,
            true,
            &endpoints,
        )
        .join("\n");
        assert!(
            kept.contains("logs and data: /tmp/nephele-demo-x"),
            "{kept}"
        );
        let up = closing_lines(
            "127.0.0.1:8080",
            "127.0.0.1:9443",
            root,
            true,
            false,
            &endpoints,
        )
        .join("\n");
        assert!(
            up.contains(
                "nephele device list --api https://127.0.0.1:8080 --ca /tmp/nephele-demo-x/cloud-data/ca.pem --token"
            ),
            "{up}"
        );
        assert!(
            !up.contains("8080/v1 "),
            "the CLI's --api takes the base URL: {up}"
        );
        assert!(
            up.contains("curl --cacert /tmp/nephele-demo-x/cloud-data/ca.pem"),
            "{up}"
        );
        assert!(up.contains("http://127.0.0.1:9001"), "{up}");
        assert!(
            up.contains("nephele-edge join --server 127.0.0.1:9443"),
            "{up}"
        );
    }
}
