//! The nephele agent, for devices (`edge` role) and cloud GPU nodes (`pool` role).
//!
//! `join` enrols the device with a single-use token and keeps its key, certificate and
//! the cluster CA in the data dir. `run` keeps one mutual-TLS QUIC session to the
//! control plane (reconnecting with backoff), reconciles the desired state it receives,
//! serves inference on a local HTTP endpoint, and offloads what it cannot serve within
//! the deployment's SLO. A `pool` agent serves the requests its region forwards and
//! runs the job members its region places on it (`jobs`), each under a supervisor
//! (the hidden `supervise` subcommand) so that members outlive an agent restart.
//!
//! Deliberately absent: actix-web, the scheduler, anything the control plane alone needs.

pub mod agent;
pub mod batcher;
pub mod binary_body;
pub mod blob_fetch;
pub mod config;
pub mod enrol;
pub mod graph_serving;
pub mod http;
pub mod jobs;
pub mod node;
pub mod persisted;
pub mod reconcile_plan;
pub mod renewal;
pub mod servers;
pub mod serving;
pub mod session;
pub mod session_core;
pub mod sessions;
pub mod typed_wire;
pub mod usage;

use std::net::SocketAddr;
use std::path::PathBuf;

use anyhow::Result;

pub const DEFAULT_DATA_DIR: &str = "/var/lib/nephele-edge";

#[derive(Debug, Clone, clap::Subcommand)]
pub enum EdgeCommand {
    /// Enrol this device with a join token (once).
    Join(JoinArgs),
    /// Run the agent (after `join`).
    ///
    /// Spot interruption: on SIGUSR1 the agent tells the control plane that this node
    /// will be taken away within --notice-seconds (an interruption notice; the region
    /// drains the node). Send it from the provider's notice hook, e.g.
    /// `kill -USR1 $(pidof nephele-edge)`. A notice given while the control plane is
    /// unreachable is sent when the session is back, with the time left.
    ///
    /// Pool agents run job members under supervisors; stopping the agent leaves them
    /// running, and the next agent on the same data dir adopts them.
    Run(RunArgs),
    /// List the firmware profiles built into this binary.
    Profiles,
    /// Run one job member and record its exit (started by a pool agent; not for people).
    #[command(hide = true)]
    Supervise(jobs::SuperviseArgs),
}

#[derive(Debug, Clone, clap::Args)]
pub struct JoinArgs {
    /// Control plane QUIC address, HOST:PORT; several, comma-separated, for replicas
    /// of the control plane (the agent uses whichever answers).
    #[arg(long)]
    pub server: String,
    /// Join token from `nephele token create` (or POST /v1/tokens).
    #[arg(long, env = "NEPHELE_JOIN_TOKEN", hide_env_values = true)]
    pub token: String,
    #[arg(long, default_value = DEFAULT_DATA_DIR)]
    pub data_dir: PathBuf,
    /// Device name (lowercase letters, digits, '-'); defaults to the host name.
    #[arg(long)]
    pub name: Option<String>,
    /// `edge` for devices, `pool` for cloud GPU nodes.
    #[arg(long, default_value = "edge")]
    pub role: String,
    /// Firmware profile name (see `nephele-edge profiles`); detected when omitted.
    #[arg(long)]
    pub profile: Option<String>,
    /// Labels for deployment selectors, KEY=VALUE (repeatable).
    #[arg(long = "label")]
    pub labels: Vec<String>,
    /// Replace an existing enrolment in the data dir.
    #[arg(long)]
    pub force: bool,
}

#[derive(Debug, Clone, clap::Args)]
pub struct RunArgs {
    #[arg(long, default_value = DEFAULT_DATA_DIR)]
    pub data_dir: PathBuf,
    /// Log lines as `text` (coloured only on a terminal) or `json` (one object per
    /// line, for log collectors). Default: `NEPHELE_LOG_FORMAT`, else text.
    #[arg(long)]
    pub log_format: Option<nephele_logging::Format>,
    /// Must match the role the device enrolled with, when given.
    #[arg(long)]
    pub role: Option<String>,
    /// Overrides the profile chosen at join.
    #[arg(long)]
    pub profile: Option<String>,
    /// Local endpoint for applications (inference, /metrics, /v1/status).
    #[arg(long, default_value = "127.0.0.1:8700")]
    pub listen: SocketAddr,
    /// Concurrent inference slots; defaults to min(profile CPU cores, host cores).
    #[arg(long)]
    pub workers: Option<usize>,
    /// When ready, write {"listen", "name"} as JSON to this file.
    #[arg(long)]
    pub ready_file: Option<PathBuf>,
    /// Host or IP other members of a job gang reach this node at (reported to the
    /// control plane); empty: the host part of --listen.
    #[arg(long, default_value = "")]
    pub advertise_address: String,
    /// Seconds of notice to report when SIGUSR1 announces a spot interruption.
    #[arg(long, default_value_t = 120)]
    pub notice_seconds: u32,
    /// Renew the agent's certificate (a new key, over the session) when fewer than
    /// this many days of its validity are left. Default: with a third left.
    #[arg(long)]
    pub renew_before_days: Option<u32>,
    /// Length of a usage window: what each deployment served in it is kept on the
    /// device until the control plane has counted it (`crate::usage`).
    #[arg(long, default_value_t = 60_000)]
    pub usage_window_ms: u64,
    /// Export spans to this collector (e.g. http://127.0.0.1:4317 over OTLP/gRPC,
    /// http://127.0.0.1:4318 over OTLP/HTTP). Default:
    /// OTEL_EXPORTER_OTLP_TRACES_ENDPOINT, else OTEL_EXPORTER_OTLP_ENDPOINT, else no
    /// spans are recorded (a request's trace context is still passed on).
    #[arg(long)]
    pub otlp_endpoint: Option<String>,
    /// `grpc` or `http/protobuf`. Default: OTEL_EXPORTER_OTLP_PROTOCOL, else `grpc`
    /// (`http/protobuf` in a build without the `otlp-grpc` feature, as the agent ships).
    #[arg(long)]
    pub otlp_protocol: Option<String>,
    /// Share of new traces recorded (0 to 1, default 1); a request with a
    /// `traceparent` header follows its caller's decision.
    #[arg(long)]
    pub trace_sample_ratio: Option<f64>,
}

pub fn init_tracing(format: Option<nephele_logging::Format>) {
    nephele_logging::init_with("info,quinn=warn", format);
}

/// Entry point of the binary.
pub fn run_cli(command: EdgeCommand) -> Result<()> {
    // The supervisor runs on a small runtime of its own and logs nothing: what it has
    // to say goes to the member's status file and log.
    if let EdgeCommand::Supervise(args) = &command {
        return jobs::supervisor::supervise(args);
    }
    init_tracing(match &command {
        EdgeCommand::Run(args) => args.log_format,
        _ => None,
    });
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    match command {
        EdgeCommand::Join(args) => runtime.block_on(enrol::join(args)),
        EdgeCommand::Run(args) => runtime.block_on(agent::run(args)),
        EdgeCommand::Supervise(_) => Ok(()),
        EdgeCommand::Profiles => {
            let mut table = String::new();
            for (name, text) in nephele_domain::builtin_profiles::BUILTIN {
                table += &match nephele_domain::FirmwareProfile::from_toml(text, Some(name)) {
                    Ok(profile) => format!(
                        "{name:<24} {:<6} {:>6} cores {:>8} MB  {}\n",
                        format!("{:?}", profile.device.class).to_lowercase(),
                        profile.device.cpu_cores,
                        profile.device.memory_mb,
                        profile.device.display_name
                    ),
                    Err(error) => format!("{name:<24} invalid: {error}\n"),
                };
            }
            // A reader that stops early (`| head`) is not an error.
            use std::io::Write as _;
            let mut out = std::io::stdout().lock();
            match out.write_all(table.as_bytes()).and_then(|()| out.flush()) {
                Err(error) if error.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
                other => Ok(other?),
            }
        }
    }
}
