//! `nephele`: the command line for people.
//!
//! It talks to the REST API (`token`, `api-token`, `tenant`, `audit`, `device`, `model`,
//! `deploy`, `rollout`, `job`, `region`, `grid`), and it embeds both
//! server roles (`nephele cloud …` = `nephele-cloud …`, `nephele edge …` =
//! `nephele-edge …`, as k3s does) so that `nephele demo` can start a whole fleet of real
//! processes from this one binary.

mod access;
mod bench;
mod bench_fleet;
mod bench_inference;
mod bench_soak;
mod bench_split;
mod client;
mod context;
mod demo;
mod grid_forecast;
mod output;
mod report;
mod rollout;
mod sim;
mod tenant;
mod upload;
mod watch;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "nephele",
    version,
    about = "Federated edge-cloud orchestrator for ML workloads"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Start a control plane, agents and a pool on loopback, deploy a real model, drive a burst.
    Demo(demo::DemoArgs),
    /// Replay real cluster traces through the placement core.
    Sim {
        #[command(subcommand)]
        command: sim::SimCommand,
    },
    /// Benchmarks that print their figures.
    Bench {
        #[command(subcommand)]
        command: bench::BenchCommand,
    },
    /// Run the control plane (same as `nephele-cloud`).
    Cloud(nephele_cloud::CloudArgs),
    /// Run the agent (same as `nephele-edge`).
    Edge {
        #[command(subcommand)]
        command: nephele_edge::EdgeCommand,
    },
    /// Join tokens for enrolling devices.
    Token {
        #[command(flatten)]
        api: client::ApiArgs,
        #[command(subcommand)]
        command: client::TokenCommand,
    },
    /// Enrolled devices.
    Device {
        #[command(flatten)]
        api: client::ApiArgs,
        #[command(subcommand)]
        command: client::DeviceCommand,
    },
    /// Models (ONNX).
    Model {
        #[command(flatten)]
        api: client::ApiArgs,
        #[command(subcommand)]
        command: client::ModelCommand,
    },
    /// Deployments of models to devices.
    Deploy {
        #[command(flatten)]
        api: client::ApiArgs,
        #[command(subcommand)]
        command: client::DeployCommand,
    },
    /// A deployment's rollout of a new version: status, pause, resume, undo.
    Rollout {
        #[command(flatten)]
        api: client::ApiArgs,
        #[command(subcommand)]
        command: rollout::RolloutCommand,
    },
    /// API tokens: who may use the API, with which role, for which tenant (admins).
    ApiToken {
        #[command(flatten)]
        api: client::ApiArgs,
        #[command(subcommand)]
        command: access::ApiTokenCommand,
    },
    /// Tenants and their weights and quotas: list, get, create, set, delete.
    Tenant {
        #[command(flatten)]
        api: client::ApiArgs,
        #[command(subcommand)]
        command: tenant::TenantCommand,
    },
    /// The audit log: every change made through the API, who made it and from where
    /// (admins).
    Audit {
        #[command(flatten)]
        api: client::ApiArgs,
        #[command(flatten)]
        args: access::AuditArgs,
    },
    /// Chargeback and showback: cost and carbon per job, deployment or tenant over a range.
    Report {
        #[command(flatten)]
        api: client::ApiArgs,
        #[command(subcommand)]
        command: report::ReportCommand,
    },
    /// Follow changes to devices, models, deployments, jobs and nodes as they happen.
    Watch {
        #[command(flatten)]
        api: client::ApiArgs,
        #[command(flatten)]
        args: watch::WatchArgs,
    },
    /// Check an API URL and token and save them as a context (made current).
    Login {
        #[command(flatten)]
        api: client::ApiArgs,
        #[command(flatten)]
        args: context::LoginArgs,
    },
    /// Contexts: named control planes with their API and token (as kubeconfig's).
    Context {
        #[command(flatten)]
        api: client::ApiArgs,
        #[command(subcommand)]
        command: context::ContextCommand,
    },
    /// Print a shell completion script: `source <(nephele completion bash)`.
    Completion {
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
    /// Jobs in the regions' schedulers (gangs, priorities, fair share, quotas).
    Job {
        #[command(flatten)]
        api: client::ApiArgs,
        #[command(subcommand)]
        command: client::JobCommand,
    },
    /// Regions and their node slots.
    Region {
        #[command(flatten)]
        api: client::ApiArgs,
        #[command(subcommand)]
        command: client::RegionCommand,
    },
    /// Each region's grid signal: carbon intensity and prices, measured and forecast
    /// (what carbon-aware jobs plan with).
    Grid {
        #[command(flatten)]
        api: client::ApiArgs,
        #[command(subcommand)]
        command: client::GridCommand,
    },
}

fn main() {
    let cli = Cli::parse();
    if !matches!(
        cli.command,
        Command::Demo(_)
            | Command::Sim { .. }
            | Command::Bench { .. }
            | Command::Cloud(_)
            | Command::Edge { .. }
    ) {
        output::end_quietly_on_closed_stdout();
    }
    let result = match cli.command {
        Command::Demo(args) => demo::run(args),
        Command::Sim { command } => sim::run(command),
        Command::Bench { command } => bench::run(command),
        Command::Cloud(args) => nephele_cloud::run_cli(args),
        Command::Edge { command } => nephele_edge::run_cli(command),
        Command::Token { api, command } => client::token(api.prepared(), command),
        Command::Device { api, command } => client::device(api.prepared(), command),
        Command::Model { api, command } => client::model(api.prepared(), command),
        Command::Deploy { api, command } => client::deploy(api.prepared(), command),
        Command::Rollout { api, command } => rollout::run(api.prepared(), command),
        Command::ApiToken { api, command } => access::api_token(api.prepared(), command),
        Command::Tenant { api, command } => tenant::run(api.prepared(), command),
        Command::Audit { api, args } => access::audit(api.prepared(), args),
        Command::Report { api, command } => report::run(api.prepared(), command),
        Command::Watch { api, args } => watch::run(api.prepared(), args),
        Command::Login { api, args } => context::login(api.prepared(), args),
        Command::Context { api, command } => context::context(api.prepared(), command),
        Command::Completion { shell } => {
            use clap::CommandFactory as _;
            let mut script = Vec::new();
            clap_complete::generate(shell, &mut Cli::command(), "nephele", &mut script);
            output::write_stdout(&script)
        }
        Command::Job { api, command } => client::job(api.prepared(), command),
        Command::Region { api, command } => client::region(api.prepared(), command),
        Command::Grid { api, command } => client::grid(api.prepared(), command),
    };
    if let Err(error) = result {
        eprintln!("nephele: error: {error:#}");
        std::process::exit(1);
    }
}
