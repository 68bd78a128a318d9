//! `nephele`: the command line for people.
//!
//! It talks to the REST API (`token`, `api-token`, `tenant`, `audit`, `device`, `model`,
//! `deploy`, `rollout`, `job`, `region`, `grid`), and it embeds both
//! server roles (`nephele cloud …` = `nephele-cloud …`, `nephele edge …` =
//! `nephele-edge …`, as k3s does) so that `nephele demo` can start a whole fleet of real
//! processes from this one binary.

mod access;
mod bench;
mod bench_inference;
mod bench_split;
mod client;
mod demo;
mod rollout;
mod sim;

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
    /// Tenants and their quotas.
    Tenant {
        #[command(flatten)]
        api: client::ApiArgs,
        #[command(subcommand)]
        command: access::TenantCommand,
    },
    /// The audit log: every change made through the API, who made it and from where
    /// (admins).
    Audit {
        #[command(flatten)]
        api: client::ApiArgs,
        #[command(flatten)]
        args: access::AuditArgs,
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
    let result = match cli.command {
        Command::Demo(args) => demo::run(args),
        Command::Sim { command } => sim::run(command),
        Command::Bench { command } => bench::run(command),
        Command::Cloud(args) => nephele_cloud::run_cli(args),
        Command::Edge { command } => nephele_edge::run_cli(command),
        Command::Token { api, command } => client::token(api, command),
        Command::Device { api, command } => client::device(api, command),
        Command::Model { api, command } => client::model(api, command),
        Command::Deploy { api, command } => client::deploy(api, command),
        Command::Rollout { api, command } => rollout::run(api, command),
        Command::ApiToken { api, command } => access::api_token(api, command),
        Command::Tenant { api, command } => access::tenant(api, command),
        Command::Audit { api, args } => access::audit(api, args),
        Command::Job { api, command } => client::job(api, command),
        Command::Region { api, command } => client::region(api, command),
        Command::Grid { api, command } => client::grid(api, command),
    };
    if let Err(error) = result {
        eprintln!("nephele: error: {error:#}");
        std::process::exit(1);
    }
}
