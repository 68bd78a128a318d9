//! `nephele deploy`: deployments to devices and their cloud replicas.

use anyhow::Result;
use nephele_api::*;
use serde_json::Value;

use super::*;

#[derive(Debug, Clone, clap::Subcommand)]
pub enum DeployCommand {
    /// Deploy a model to the devices a label selector picks.
    Create {
        name: String,
        #[arg(long)]
        model: String,
        /// e.g. `tier=edge,site!=lab` (empty: every edge device).
        #[arg(long, default_value = "")]
        selector: String,
        #[arg(long, default_value_t = 50)]
        slo_ms: u32,
        #[arg(long, default_value_t = 64)]
        max_queue: u32,
        /// Never offload to the cloud pool.
        #[arg(long)]
        no_offload: bool,
        /// `auto` (chosen per device from its profile) or a variant of the model, e.g. `int8` or `split@relu1`.
        #[arg(long, default_value = "auto")]
        variant: String,
        /// Re-ask the pool when the local answer's top-class probability is below this (0..1).
        #[arg(long)]
        hard_example_threshold: Option<f32>,
        /// Cloud replicas per region with pools: at least this many...
        #[arg(long)]
        min_replicas: Option<u32>,
        /// ...and at most this many (the autoscaler moves between them).
        #[arg(long)]
        max_replicas: Option<u32>,
        /// Priority of its replicas and requests (higher sheds last; default 500).
        #[arg(long)]
        priority: Option<u32>,
        /// p99 latency of offloaded requests the autoscaler keeps, ms (default: the SLO).
        #[arg(long)]
        target_p99_ms: Option<u32>,
    },
    /// Change a deployment (model version, selector, SLO, …): what devices run is
    /// rolled out in gated steps (`nephele rollout status NAME --watch`).
    Update(crate::rollout::UpdateArgs),
    /// One line per deployment: devices ready of those selected, and what the others do.
    List,
    /// A deployment's status and its devices, the first 50 by name unless asked for more.
    Status {
        name: String,
        /// Show this many devices' rows (the counts cover them all).
        #[arg(long, default_value_t = 50, conflicts_with = "all")]
        devices: usize,
        /// Show every device's row (fetched a page of 1,000 at a time).
        #[arg(long)]
        all: bool,
    },
    /// Its cloud replicas per region, and what each region's autoscaler decided.
    Replicas {
        name: String,
    },
    Delete {
        name: String,
    },
}

/// Up to `wanted` of a deployment's device rows, in name order, a page at a time.
fn deployment_rows(
    api: &Api,
    name: &str,
    wanted: usize,
) -> Result<Vec<nephele_api::DeviceDeploymentStatus>> {
    Ok(api
        .list_as(&format!("/v1/deployments/{name}/devices"), 1000, wanted)?
        .items)
}

/// The NOT READY column: the devices in each other phase, or that none is selected
/// (a deployment that selects no device serves nothing: `0/0` is not ready).
fn not_ready(d: &DeploymentStatus) -> String {
    if d.desired_devices == 0 {
        return "no device selected".to_string();
    }
    let not_ready: Vec<String> = d
        .device_phases
        .iter()
        .flatten()
        .filter(|(phase, n)| phase.as_str() != "ready" && **n > 0)
        .map(|(phase, n)| format!("{n} {phase}"))
        .collect();
    if not_ready.is_empty() {
        "-".to_string()
    } else {
        not_ready.join(", ")
    }
}

/// `nephele deploy list`: one line per deployment, from the counts (no row per device).
fn print_deployment_list(deployments: &[DeploymentStatus]) {
    if deployments.is_empty() {
        println!("no deployments; `nephele deploy create NAME --model MODEL` makes one");
        return;
    }
    println!(
        "{:<20} {:<30} {:<20} {:>13} {:<36} ROLLOUT",
        "DEPLOYMENT", "MODEL", "SELECTOR", "READY", "NOT READY"
    );
    for d in deployments {
        let rollout = d.rollout.as_ref().map_or_else(
            || "-".to_string(),
            |r| format!("{} {}", r.number, num(Some(r.state)).replace('_', " ")),
        );
        println!(
            "{:<20} {:<30} {:<20} {:>13} {:<36} {}",
            d.name,
            d.model,
            if d.selector.is_empty() {
                "-"
            } else {
                d.selector.as_str()
            },
            format!("{}/{}", num(d.ready_devices), d.desired_devices),
            not_ready(d),
            rollout
        );
    }
}

/// Rows a deployment's table shows after a change (`deploy status` fetches its own).
const ROWS_SHOWN: usize = 50;

pub(crate) fn print_deployment(d: &DeploymentStatus) {
    print_deployment_rows(d, ROWS_SHOWN)
}

/// A deployment's status, with at most `max_rows` of its device rows and a line
/// saying how many edge devices the table leaves out.
fn print_deployment_rows(d: &DeploymentStatus, max_rows: usize) {
    println!(
        "deployment {} (model {}, selector {:?}, SLO {} ms): {}/{} devices ready",
        d.name,
        d.model,
        d.selector,
        d.slo_ms,
        num(d.ready_devices),
        d.desired_devices
    );
    if let Some(r) = &d.rollout {
        println!(
            "  rollout {} {}: {} of {} devices told to run {}; {}",
            r.number,
            num(Some(r.state)).replace('_', " "),
            r.moved_devices.len(),
            r.selected_devices,
            r.to.model,
            r.gate
        );
    }
    for warning in &d.warnings {
        println!("  warning: {warning}");
    }
    // The fleet at a glance, when some of it is not ready (a table may show a page).
    let phases = d.device_phases.iter().flatten();
    if phases
        .clone()
        .any(|(phase, n)| phase.as_str() != "ready" && *n > 0)
    {
        let counts: Vec<String> = phases.map(|(phase, n)| format!("{n} {phase}")).collect();
        println!("  edge devices: {}", counts.join(", "));
    }
    println!(
        "  {:<14} {:<5} {:<22} {:<12} {:<16} {:<22} {:>8} {:>9} {:>10} {:>8} {:>8}",
        "DEVICE",
        "ROLE",
        "PROFILE",
        "PHASE",
        "VARIANT",
        "MODEL",
        "LOCAL",
        "OFFLOADED",
        "COMPUTE MS",
        "P50 MS",
        "P99 MS"
    );
    for row in d.devices.iter().take(max_rows) {
        println!(
            "  {:<14} {:<5} {:<22} {:<12} {:<16} {:<22} {:>8} {:>9} {:>10} {:>8} {:>8}",
            row.device,
            row.role,
            row.profile,
            row.phase,
            text(row.variant.as_deref()),
            // The version it is told to run; `*` while it still runs another.
            format!(
                "{}{}",
                row.model,
                if row.current == Some(false) { "*" } else { "" }
            ),
            num(row.served_local),
            num(row.served_offloaded),
            num(row.service_ms),
            num(row.p50_ms),
            num(row.p99_ms)
        );
    }
    let shown = d
        .devices
        .iter()
        .take(max_rows)
        .filter(|r| r.role == "edge")
        .count();
    let edge_total: usize = d.device_phases.iter().flatten().map(|(_, n)| n).sum();
    if edge_total > shown {
        let more = edge_total - shown;
        println!(
            "  … {more} more edge device{} (nephele deploy status {} --devices N, or --all)",
            if more == 1 { "" } else { "s" },
            d.name
        );
    }
}

pub fn deploy(args: ApiArgs, command: DeployCommand) -> Result<()> {
    let api = args.client()?;
    match command {
        DeployCommand::Create {
            name,
            model,
            selector,
            slo_ms,
            max_queue,
            no_offload,
            variant,
            hard_example_threshold,
            min_replicas,
            max_replicas,
            priority,
            target_p99_ms,
        } => {
            let mut replicas = serde_json::Map::new();
            for (key, value) in [
                ("min", min_replicas),
                ("max", max_replicas),
                ("priority", priority),
                ("target_p99_ms", target_p99_ms),
            ] {
                if let Some(value) = value {
                    replicas.insert(key.into(), Value::from(value));
                }
            }
            let status: DeploymentStatus = api.post_as(
                "/v1/deployments",
                &serde_json::json!({"name": name, "model": model, "selector": selector, "slo_ms": slo_ms, "max_queue": max_queue, "offload": !no_offload, "variant": variant, "hard_example_threshold": hard_example_threshold, "replicas": replicas}),
            )?;
            show(args.json, &status, print_deployment);
        }
        DeployCommand::Update(update) => crate::rollout::update(&args, update)?,
        DeployCommand::Replicas { name } => {
            let sets: Vec<ReplicaSetView> =
                api.get_as(&format!("/v1/deployments/{name}/replicas"))?;
            show(args.json, &sets, |sets| {
                if sets.is_empty() {
                    println!("deployment {name} has no cloud replicas (no region has pools, or it does not offload)");
                }
                for r in sets {
                    println!(
                        "region {}: {} ready, {} starting, {} pending of {} desired (min {}, max {}, priority {})",
                        r.region, r.ready, r.starting, r.pending, r.desired, r.min, r.max, r.priority,
                    );
                    let decision = r.autoscaler.as_ref().and_then(|a| a.decision.as_ref());
                    if let Some(d) = decision {
                        println!(
                            "  autoscaler: {} mode, {} warm; {}",
                            d.mode, d.warm, d.reason
                        );
                    }
                    println!(
                        "  {:<16} {:<9} {:<10} {:<18} {:>10}",
                        "REPLICA", "STATE", "NODE", "AGENT", "COLD START"
                    );
                    for replica in &r.replicas {
                        let cold = replica
                            .cold_start_ms
                            .map(|ms| format!("{:.1} s", ms as f64 / 1000.0))
                            .unwrap_or_else(|| "-".into());
                        println!(
                            "  {:<16} {:<9} {:<10} {:<18} {:>10}",
                            replica.name,
                            replica.state,
                            text(replica.node.as_deref()),
                            text(replica.agent.as_deref()),
                            cold
                        );
                        if let Some(why) = &replica.why_pending {
                            println!("    not placed: {}", why.message);
                            if let Some(hint) = &why.hint {
                                println!("    hint: {hint}");
                            }
                        }
                        if let Some(error) = &replica.error {
                            println!("    failed: {error}");
                        }
                    }
                }
            });
        }
        DeployCommand::List => {
            let deployments: Vec<DeploymentStatus> = api.get_as("/v1/deployments?devices=false")?;
            show(args.json, &deployments, |deployments| {
                print_deployment_list(deployments)
            });
        }
        DeployCommand::Status { name, devices, all } => {
            let mut status: DeploymentStatus =
                api.get_as(&format!("/v1/deployments/{name}?devices=false"))?;
            let wanted = if all { usize::MAX } else { devices };
            status.devices = deployment_rows(&api, &name, wanted)?;
            show(args.json, &status, |status| {
                print_deployment_rows(status, usize::MAX)
            });
        }
        DeployCommand::Delete { name } => {
            api.delete(&format!("/v1/deployments/{name}"))?;
            println!("deleted deployment {name}");
        }
    }
    Ok(())
}
