//! `nephele bench soak`: an edge agent (a real process) serves steady inference traffic
//! for an hour while its link to the control plane is cut now and then; the memory and
//! CPU of the agent and of the control plane are sampled throughout.
//!
//! The agent reaches the control plane through a [`relay::Relay`] that the soak turns
//! dark for `--outage-s` every `--outage-every-s`: longer than the agent's idle
//! timeout, so each outage ends its session and it reconnects (with backoff) when the
//! link is back, as on a flaky site link. Requests go to the agent's local endpoint and
//! must keep being answered during outages (the model is on the device). What it
//! reports: each process's RSS over time, its spread and drift after the warm-up, the
//! sessions the control plane saw, and requests answered and failed.

mod relay;

use std::path::PathBuf;
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _, Result};
use serde::Serialize;

use nephele_api::{DeploymentStatus, DeviceView, JoinTokenView, TokenRequest};

use crate::bench_fleet::process;
use crate::client::Api;
use crate::demo::{
    spawn_exe, start_cloud, wait_for_file, AgentExe, Fleet, Heldout, HELDOUT_JSON, MODEL_ONNX,
};

#[derive(Debug, Clone, clap::Args)]
pub struct SoakArgs {
    /// How long to run, seconds (warm-up included).
    #[arg(long, default_value_t = 3600)]
    pub duration_s: u64,
    /// The first seconds, left out of the flatness figures (allocator and caches
    /// settling, the first reconnect).
    #[arg(long, default_value_t = 300)]
    pub warmup_s: u64,
    /// Inference requests per second to the agent's local endpoint, paced.
    #[arg(long, default_value_t = 50)]
    pub rps: u32,
    /// Every this many seconds the agent's link to the control plane goes dark…
    #[arg(long, default_value_t = 300)]
    pub outage_every_s: u64,
    /// …for this long: above the agent's 15 s idle timeout, so its session ends and it
    /// reconnects once the link is back (0: no outages).
    #[arg(long, default_value_t = 25)]
    pub outage_s: u64,
    /// The control plane's heartbeat interval (it tells the agent in Welcome).
    #[arg(long, default_value_t = 15_000)]
    pub heartbeat_ms: u32,
    /// Memory and CPU are sampled every this many seconds.
    #[arg(long, default_value_t = 10)]
    pub sample_s: u64,
    /// Where the control plane and the agent keep their data and logs (default: a new
    /// temporary dir).
    #[arg(long)]
    pub dir: Option<PathBuf>,
    /// Run the agent from this binary (the agent as it ships: `target/dist/nephele-edge`
    /// after `cargo build --profile dist -p nephele-edge`) instead
    /// of this CLI's `edge` subcommand; its memory is mostly its binary's code pages.
    #[arg(long)]
    pub agent_bin: Option<PathBuf>,
    /// One JSON document on stdout instead of the table.
    #[arg(long)]
    pub json: bool,
    /// Where `soak-<duration>.json`, `.csv` (every sample) and `.svg` (memory over time)
    /// are written.
    #[arg(long, default_value = "target/bench-results")]
    pub out: PathBuf,
}

const DEVICE: &str = "soak-1";
const PROFILE: &str = "rpi5-8gb";
const REGION: &str = "eu-west";

fn cloud_config(heartbeat_ms: u32) -> String {
    format!(
        r#"api_listen = "127.0.0.1:0"
quic_listen = "127.0.0.1:0"
heartbeat_interval_ms = {heartbeat_ms}

[[region]]
name = "{REGION}"
carbon_zone = "DE"
"#
    )
}

/// One reading of both processes and the traffic so far.
#[derive(Debug, Clone, Serialize)]
pub struct SoakSample {
    pub t_s: f64,
    pub agent_rss_bytes: u64,
    pub cloud_rss_bytes: u64,
    /// Of the RSS, anonymous memory (heap and stacks), where a leak would show; the
    /// rest is code and data pages of the binary, which grow as code paths first run.
    pub agent_anon_bytes: u64,
    pub cloud_anon_bytes: u64,
    /// CPU cores each used since the previous sample.
    pub agent_cpu_cores: f64,
    pub cloud_cpu_cores: f64,
    pub agent_fds: u64,
    pub cloud_fds: u64,
    pub requests_ok: u64,
    pub requests_failed: u64,
    /// p99 of the requests answered since the previous sample, ms.
    pub p99_ms: f64,
    pub link_dark: bool,
    /// Whether the control plane counts the agent online, and its session number.
    pub online: bool,
    pub session: Option<u64>,
}

/// Spread and drift of one process's RSS over the samples after the warm-up.
#[derive(Debug, Clone, Serialize)]
pub struct Flatness {
    pub first_bytes: u64,
    pub last_bytes: u64,
    pub min_bytes: u64,
    pub max_bytes: u64,
    /// (max − min) / min, percent.
    pub spread_pct: f64,
    /// (last − first) / first, percent.
    pub drift_pct: f64,
}

impl Flatness {
    fn of(values: &[u64]) -> Option<Flatness> {
        let (first, last) = (*values.first()?, *values.last()?);
        let min = *values.iter().min()?;
        let max = *values.iter().max()?;
        let pct = |a: u64, b: u64| (a as f64 - b as f64) / (b.max(1) as f64) * 100.0;
        Some(Flatness {
            first_bytes: first,
            last_bytes: last,
            min_bytes: min,
            max_bytes: max,
            spread_pct: pct(max, min),
            drift_pct: pct(last, first),
        })
    }
}

#[derive(Debug, Serialize)]
pub struct SoakReport {
    pub machine: String,
    /// The agent's binary and its size.
    pub agent_binary: String,
    pub duration_s: f64,
    pub warmup_s: u64,
    pub rps_target: u32,
    pub heartbeat_interval_s: f64,
    pub outages: u64,
    pub outage_s: u64,
    pub datagrams_dropped: u64,
    /// Sessions of the agent the control plane saw (distinct session numbers), and
    /// how many reconnects that is.
    pub sessions_seen: usize,
    pub reconnects: usize,
    pub requests_ok: u64,
    pub requests_failed: u64,
    pub requests_failed_while_dark: u64,
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub agent_rss_after_warmup: Option<Flatness>,
    pub cloud_rss_after_warmup: Option<Flatness>,
    pub agent_anon_after_warmup: Option<Flatness>,
    pub cloud_anon_after_warmup: Option<Flatness>,
    pub agent_rss_idle_bytes: u64,
    pub samples: usize,
}

/// The request loop's counters, shared with the sampler.
#[derive(Default)]
struct Traffic {
    ok: AtomicU64,
    failed: AtomicU64,
    failed_dark: AtomicU64,
    /// Latencies (ms) since the sampler last took them.
    window: Mutex<Vec<f64>>,
    /// Every latency, for the run's quantiles (an hour at 50/s is 180,000 numbers).
    all: Mutex<Vec<f64>>,
}

pub fn run(args: SoakArgs) -> Result<()> {
    if args.rps == 0 || args.sample_s == 0 || args.duration_s == 0 {
        bail!("--rps, --sample-s and --duration-s must be at least 1");
    }
    if args.outage_s > 0 && args.outage_s >= args.outage_every_s {
        bail!("--outage-s must be shorter than --outage-every-s");
    }
    let heldout: Heldout = serde_json::from_str(HELDOUT_JSON).context("embedded held-out set")?;
    let agent_exe = AgentExe::new(args.agent_bin.as_deref())?;
    let root = match &args.dir {
        Some(dir) => dir.clone(),
        None => std::env::temp_dir().join(format!("nephele-soak-{}", std::process::id())),
    };
    let _ = std::fs::remove_dir_all(&root);
    std::fs::create_dir_all(&root)?;
    let say = |message: &str| {
        if !args.json {
            eprintln!("[soak] {message}");
        }
    };
    let mut fleet = Fleet {
        children: Vec::new(),
    };
    say(&format!("starting the control plane in {}", root.display()));
    let cloud = start_cloud(&mut fleet, &root, &cloud_config(args.heartbeat_ms))?;
    let api = Api::with_ca(
        &format!("https://{}", cloud.api),
        &cloud.admin_token,
        Some(&cloud.ca_pem),
    );
    let upstream = cloud
        .quic
        .parse()
        .with_context(|| format!("the control plane's QUIC address {:?}", cloud.quic))?;
    let relay = relay::Relay::start(upstream)?;

    say(&format!(
        "enrolling agent {DEVICE} ({PROFILE}) through a relay on {} with a join token",
        relay.addr
    ));
    let token: JoinTokenView = api.post_as(
        "/v1/tokens",
        &TokenRequest {
            region: Some(REGION.into()),
            ttl_s: Some(600),
        },
    )?;
    let token = token.token.context("no token in the response")?;
    let data_dir = root.join(DEVICE);
    let output = Command::new(&agent_exe.exe)
        .args(agent_exe.args(&[
            "join".into(),
            "--server".into(),
            relay.addr.to_string(),
            "--token".into(),
            token,
            "--data-dir".into(),
            data_dir.display().to_string(),
            "--name".into(),
            DEVICE.into(),
            "--role".into(),
            "edge".into(),
            "--profile".into(),
            PROFILE.into(),
            "--label".into(),
            "tier=edge".into(),
        ]))
        .output()?;
    if !output.status.success() {
        bail!(
            "the agent's join failed: {}",
            String::from_utf8_lossy(&output.stderr)
        );
    }
    let ready_file = root.join(format!("{DEVICE}.ready"));
    spawn_exe(
        &mut fleet,
        &agent_exe.exe,
        DEVICE,
        &agent_exe.args(&[
            "run".into(),
            "--data-dir".into(),
            data_dir.display().to_string(),
            "--listen".into(),
            "127.0.0.1:0".into(),
            "--ready-file".into(),
            ready_file.display().to_string(),
        ]),
        &root,
    )?;
    let agent_pid = fleet.children.last().map_or(0, |(_, child)| child.id());
    let ready = wait_for_file(&ready_file, &mut fleet, Duration::from_secs(30))?;
    let endpoint = ready["listen"]
        .as_str()
        .context("the agent's ready file has no listen address")?
        .to_string();
    std::thread::sleep(Duration::from_millis(500));
    let agent_rss_idle_bytes = process::sample(agent_pid).map_or(0, |s| s.rss_bytes);

    say("pushing the digits model and deploying it to the agent (no offload)");
    {
        use base64::Engine as _;
        let _: serde_json::Value = api.put_as(
            "/v1/models/digits-mlp?wait=true",
            &serde_json::json!({
                "onnx_base64": base64::engine::general_purpose::STANDARD.encode(MODEL_ONNX),
                "validation": {"rows": heldout.features, "labels": heldout.labels},
            }),
        )?;
    }
    let _: DeploymentStatus = api.post_as(
        "/v1/deployments",
        &serde_json::json!({"name": "digits", "model": "digits-mlp", "selector": "tier=edge", "slo_ms": 100, "offload": false}),
    )?;
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let status: DeploymentStatus = api.get_as("/v1/deployments/digits")?;
        if status.desired_devices == 1 && status.ready_devices == Some(1) {
            break;
        }
        if Instant::now() > deadline {
            bail!(
                "the deployment was not Ready on the agent within 60 s: {}",
                serde_json::to_string(&status).unwrap_or_default()
            );
        }
        std::thread::sleep(Duration::from_millis(200));
    }

    say(&format!(
        "running {} s: {} requests/s to the agent, its link dark {} s every {} s, samples every {} s",
        args.duration_s, args.rps, args.outage_s, args.outage_every_s, args.sample_s
    ));
    let traffic = Arc::new(Traffic::default());
    let stop = Arc::new(AtomicBool::new(false));
    let dark = Arc::new(AtomicBool::new(false));
    let sender = {
        let (traffic, stop, dark) = (traffic.clone(), stop.clone(), dark.clone());
        let (endpoint, rps) = (endpoint.clone(), args.rps);
        std::thread::spawn(move || drive(&endpoint, rps, &heldout, &traffic, &stop, &dark))
    };

    let started = Instant::now();
    let mut samples: Vec<SoakSample> = Vec::new();
    let mut sessions = std::collections::BTreeSet::new();
    let mut outages = 0u64;
    let mut previous = (process::sample(agent_pid), process::sample(cloud.pid));
    let mut next_sample = Duration::from_secs(args.sample_s);
    let mut next_line = Duration::from_secs(60);
    let total = Duration::from_secs(args.duration_s);
    let result = loop {
        let elapsed = started.elapsed();
        if elapsed >= total {
            break Ok(());
        }
        let secs = elapsed.as_secs();
        let want_dark = args.outage_s > 0
            && secs >= args.outage_every_s
            && secs % args.outage_every_s < args.outage_s
            && elapsed + Duration::from_secs(args.outage_s) < total;
        if want_dark != dark.load(Ordering::Relaxed) {
            relay.set_dark(want_dark);
            dark.store(want_dark, Ordering::Relaxed);
            if want_dark {
                outages += 1;
            }
        }
        if elapsed >= next_sample {
            next_sample += Duration::from_secs(args.sample_s);
            let now = (process::sample(agent_pid), process::sample(cloud.pid));
            let (Some(agent), Some(control)) = now else {
                break Err(anyhow::anyhow!(
                    "the {} exited during the soak; see its log in {}",
                    if now.0.is_none() {
                        "agent"
                    } else {
                        "control plane"
                    },
                    root.display()
                ));
            };
            let cores = |before: &Option<process::Sample>, after: &process::Sample| {
                before
                    .as_ref()
                    .map_or(0.0, |b| process::cores_between(b, after))
            };
            let device: Option<DeviceView> = api
                .get_as::<Vec<DeviceView>>("/v1/devices")
                .ok()
                .and_then(|all| all.into_iter().find(|d| d.name == DEVICE));
            let session = device.as_ref().and_then(|d| d.session);
            if let Some(session) = session {
                sessions.insert(session);
            }
            let mut window =
                std::mem::take(&mut *traffic.window.lock().unwrap_or_else(|p| p.into_inner()));
            window.sort_by(|a, b| a.total_cmp(b));
            samples.push(SoakSample {
                t_s: elapsed.as_secs_f64(),
                agent_rss_bytes: agent.rss_bytes,
                cloud_rss_bytes: control.rss_bytes,
                agent_anon_bytes: agent.anon_bytes,
                cloud_anon_bytes: control.anon_bytes,
                agent_cpu_cores: cores(&previous.0, &agent),
                cloud_cpu_cores: cores(&previous.1, &control),
                agent_fds: agent.fds,
                cloud_fds: control.fds,
                requests_ok: traffic.ok.load(Ordering::Relaxed),
                requests_failed: traffic.failed.load(Ordering::Relaxed),
                p99_ms: crate::bench_fleet::quantile(&window, 0.99),
                link_dark: dark.load(Ordering::Relaxed),
                online: device.as_ref().and_then(|d| d.online).unwrap_or(false),
                session,
            });
            previous = (Some(agent), Some(control));
        }
        if elapsed >= next_line {
            next_line += Duration::from_secs(60);
            if let Some(last) = samples.last() {
                say(&format!(
                    "{:>3}/{} min: agent {:.1} MB, control plane {:.1} MB, {} answered, {} failed, link {}, {} session(s) so far",
                    secs / 60,
                    args.duration_s.div_ceil(60),
                    last.agent_rss_bytes as f64 / 1e6,
                    last.cloud_rss_bytes as f64 / 1e6,
                    last.requests_ok,
                    last.requests_failed,
                    if last.link_dark { "dark" } else { "up" },
                    sessions.len()
                ));
            }
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    stop.store(true, Ordering::Relaxed);
    let _ = sender.join();
    result?;

    let after_warmup = |f: fn(&SoakSample) -> u64| -> Vec<u64> {
        samples
            .iter()
            .filter(|s| s.t_s >= args.warmup_s as f64)
            .map(f)
            .collect()
    };
    let mut all = std::mem::take(&mut *traffic.all.lock().unwrap_or_else(|p| p.into_inner()));
    all.sort_by(|a, b| a.total_cmp(b));
    let report = SoakReport {
        machine: machine(),
        agent_binary: agent_exe.describe(),
        duration_s: started.elapsed().as_secs_f64(),
        warmup_s: args.warmup_s,
        rps_target: args.rps,
        heartbeat_interval_s: f64::from(args.heartbeat_ms) / 1000.0,
        outages,
        outage_s: args.outage_s,
        datagrams_dropped: relay.dropped(),
        sessions_seen: sessions.len(),
        reconnects: sessions.len().saturating_sub(1),
        requests_ok: traffic.ok.load(Ordering::Relaxed),
        requests_failed: traffic.failed.load(Ordering::Relaxed),
        requests_failed_while_dark: traffic.failed_dark.load(Ordering::Relaxed),
        p50_ms: crate::bench_fleet::quantile(&all, 0.5),
        p99_ms: crate::bench_fleet::quantile(&all, 0.99),
        agent_rss_after_warmup: Flatness::of(&after_warmup(|s| s.agent_rss_bytes)),
        cloud_rss_after_warmup: Flatness::of(&after_warmup(|s| s.cloud_rss_bytes)),
        agent_anon_after_warmup: Flatness::of(&after_warmup(|s| s.agent_anon_bytes)),
        cloud_anon_after_warmup: Flatness::of(&after_warmup(|s| s.cloud_anon_bytes)),
        agent_rss_idle_bytes,
        samples: samples.len(),
    };
    write_results(&args, &report, &samples)?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print_table(&report);
        eprintln!(
            "[soak] figures in {}",
            args.out
                .join(format!("soak-{}.{{json,csv,svg}}", args.duration_s))
                .display()
        );
    }
    drop(fleet);
    if args.dir.is_none() {
        let _ = std::fs::remove_dir_all(&root);
    }
    Ok(())
}

/// Sends `rps` requests a second to the agent until `stop`, one at a time on a paced
/// schedule (a late answer delays the next one rather than piling up requests).
fn drive(
    endpoint: &str,
    rps: u32,
    heldout: &Heldout,
    traffic: &Traffic,
    stop: &AtomicBool,
    dark: &AtomicBool,
) {
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(Duration::from_secs(10)))
        .build()
        .into();
    let interval = Duration::from_secs_f64(1.0 / f64::from(rps));
    let mut next = Instant::now();
    let mut i = 0usize;
    while !stop.load(Ordering::Relaxed) {
        let now = Instant::now();
        if now < next {
            std::thread::sleep(next - now);
        }
        next = next.max(Instant::now() - interval) + interval;
        let row = i % heldout.labels.len();
        i += 1;
        let body = serde_json::json!({"shape": [1, 64], "data": heldout.features[row]});
        let sent = Instant::now();
        let answered = agent
            .post(format!("http://{endpoint}/v1/infer/digits"))
            .send_json(&body)
            .ok()
            .filter(|r| r.status().as_u16() == 200)
            .and_then(|mut r| r.body_mut().read_json::<serde_json::Value>().ok())
            .is_some_and(|reply| reply["data"].is_array());
        let ms = sent.elapsed().as_secs_f64() * 1000.0;
        if answered {
            traffic.ok.fetch_add(1, Ordering::Relaxed);
            traffic
                .window
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .push(ms);
            traffic
                .all
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .push(ms);
        } else {
            traffic.failed.fetch_add(1, Ordering::Relaxed);
            if dark.load(Ordering::Relaxed) {
                traffic.failed_dark.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
}

fn write_results(args: &SoakArgs, report: &SoakReport, samples: &[SoakSample]) -> Result<()> {
    std::fs::create_dir_all(&args.out)
        .with_context(|| format!("cannot create {}", args.out.display()))?;
    let stem = args.out.join(format!("soak-{}", args.duration_s));
    std::fs::write(
        stem.with_extension("json"),
        serde_json::to_string_pretty(report)?,
    )?;
    let mut csv = String::from(
        "t_s,agent_rss_bytes,cloud_rss_bytes,agent_anon_bytes,cloud_anon_bytes,agent_cpu_cores,cloud_cpu_cores,agent_fds,cloud_fds,requests_ok,requests_failed,p99_ms,link_dark,online,session\n",
    );
    for s in samples {
        csv += &format!(
            "{:.1},{},{},{},{},{:.4},{:.4},{},{},{},{},{:.3},{},{},{}\n",
            s.t_s,
            s.agent_rss_bytes,
            s.cloud_rss_bytes,
            s.agent_anon_bytes,
            s.cloud_anon_bytes,
            s.agent_cpu_cores,
            s.cloud_cpu_cores,
            s.agent_fds,
            s.cloud_fds,
            s.requests_ok,
            s.requests_failed,
            s.p99_ms,
            s.link_dark,
            s.online,
            s.session.map_or(String::new(), |n| n.to_string())
        );
    }
    std::fs::write(stem.with_extension("csv"), csv)?;
    let line = |name: &str, colour: usize, f: fn(&SoakSample) -> u64| nephele_sim::plot::XyLine {
        name: name.into(),
        points: samples
            .iter()
            .map(|s| (s.t_s / 60.0, f(s) as f64 / 1e6))
            .collect(),
        colour,
        dashed: false,
    };
    let svg = nephele_sim::plot::svg_xy(
        &format!(
            "Soak: RSS over {} min, {} req/s, link dark {} s every {} s",
            args.duration_s / 60,
            args.rps,
            args.outage_s,
            args.outage_every_s
        ),
        "minutes",
        "RSS (MB)",
        &[
            line("edge agent", 0, |s| s.agent_rss_bytes),
            line("control plane", 1, |s| s.cloud_rss_bytes),
            line("agent, anonymous", 2, |s| s.agent_anon_bytes),
            line("control plane, anonymous", 3, |s| s.cloud_anon_bytes),
        ],
    );
    std::fs::write(stem.with_extension("svg"), svg)?;
    Ok(())
}

fn machine() -> String {
    format!(
        "{} (the soak, the agent and the control plane share them)",
        process::cpu_and_cores()
    )
}

fn print_table(r: &SoakReport) {
    let mb = |b: u64| b as f64 / 1e6;
    let flat = |f: &Option<Flatness>| {
        f.as_ref()
            .map_or("no samples after the warm-up".into(), |f| {
                format!(
                    "{:.1} → {:.1} MB (min {:.1}, max {:.1}): spread {:.1}%, drift {:+.1}%",
                    mb(f.first_bytes),
                    mb(f.last_bytes),
                    mb(f.min_bytes),
                    mb(f.max_bytes),
                    f.spread_pct,
                    f.drift_pct
                )
            })
    };
    println!("machine: {}", r.machine);
    println!("agent: {}", r.agent_binary);
    let rows: Vec<(&str, String)> = vec![
        (
            "ran",
            format!(
                "{:.0} s ({} s warm-up), heartbeat every {:.0} s",
                r.duration_s, r.warmup_s, r.heartbeat_interval_s
            ),
        ),
        (
            "link outages",
            format!(
                "{} × {} s ({} datagrams dropped)",
                r.outages, r.outage_s, r.datagrams_dropped
            ),
        ),
        (
            "agent sessions",
            format!("{} ({} reconnects)", r.sessions_seen, r.reconnects),
        ),
        (
            "requests",
            format!(
                "{} answered, {} failed ({} while the link was dark), p50 {:.2} ms, p99 {:.2} ms",
                r.requests_ok, r.requests_failed, r.requests_failed_while_dark, r.p50_ms, r.p99_ms
            ),
        ),
        (
            "agent RSS idle",
            format!("{:.1} MB (before the model)", mb(r.agent_rss_idle_bytes)),
        ),
        ("agent RSS", flat(&r.agent_rss_after_warmup)),
        ("  of it anonymous", flat(&r.agent_anon_after_warmup)),
        ("control plane RSS", flat(&r.cloud_rss_after_warmup)),
        ("  of it anonymous", flat(&r.cloud_anon_after_warmup)),
    ];
    for (label, value) in rows {
        println!("  {label:<20} {value}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flatness_is_spread_and_drift_in_percent() {
        let f = Flatness::of(&[100, 104, 98, 102]).expect("samples");
        assert_eq!((f.min_bytes, f.max_bytes), (98, 104));
        assert!((f.spread_pct - 6.0 / 98.0 * 100.0).abs() < 1e-9);
        assert!((f.drift_pct - 2.0).abs() < 1e-9);
        assert!(Flatness::of(&[]).is_none());
    }
}
