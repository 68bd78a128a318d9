//! `nephele device`: the enrolled devices and what they served.

use anyhow::Result;
use nephele_api::*;

use super::*;

#[derive(Debug, Clone, clap::Subcommand)]
pub enum DeviceCommand {
    /// Every enrolled device: role, region, profile, health, address, memory (read a
    /// page at a time, in name order).
    List {
        #[command(flatten)]
        list: ListArgs,
    },
    /// One device: labels, accelerators, health, link and what it runs.
    Get { name: String },
    /// Remove a device; its certificate stops working at once.
    Delete { name: String },
    /// What a device reported serving, per deployment (each usage record counted once,
    /// also what it served while the control plane was unreachable).
    Usage { name: String },
}

pub fn device(args: ApiArgs, command: DeviceCommand) -> Result<()> {
    let api = args.client()?;
    match command {
        DeviceCommand::List { list } => {
            let listing = list.read::<DeviceView>(&api, "/v1/devices")?;
            show(args.json, &listing.items, |devices| {
                println!(
                    "{:<14} {:<5} {:<10} {:<22} {:<8} {:>6} {:>9} {:>8} {:>10}  {:<21}  LABELS",
                    "NAME",
                    "ROLE",
                    "REGION",
                    "PROFILE",
                    "HEALTH",
                    "CORES",
                    "RSS MB",
                    "RTT MS",
                    "LINK MBIT",
                    "ADDRESS"
                );
                for d in devices {
                    let rss = d
                        .rss_bytes
                        .map(|r| format!("{:.1}", r as f64 / 1e6))
                        .unwrap_or("-".into());
                    let link = |value: Option<u64>, scale: f64| {
                        value
                            .filter(|v| *v > 0)
                            .map(|v| format!("{:.1}", v as f64 / scale))
                            .unwrap_or("-".into())
                    };
                    let labels = labels(d);
                    println!(
                        "{:<14} {:<5} {:<10} {:<22} {:<8} {:>6} {:>9} {:>8} {:>10}  {:<21}  {labels}",
                        d.name,
                        d.role,
                        d.region,
                        d.profile,
                        d.health,
                        d.cpu_cores,
                        rss,
                        link(d.link.map(|l| l.rtt_us), 1e3),
                        link(d.link.map(|l| l.bandwidth_bps), 1e6),
                        text(d.address.as_deref())
                    );
                }
                if let Some(line) = listing.left_out("devices") {
                    println!("{line}");
                }
            });
        }
        DeviceCommand::Get { name } => {
            let device: DeviceView = api.get_as(&format!("/v1/devices/{name}"))?;
            show(args.json, &device, print_device);
        }
        DeviceCommand::Delete { name } => {
            api.delete(&format!("/v1/devices/{name}"))?;
            println!("deleted device {name}");
        }
        DeviceCommand::Usage { name } => {
            let usage: UsageTotals = api.get_as(&format!("/v1/devices/{name}/usage"))?;
            show(args.json, &usage, |usage| {
                println!(
                    "{:<24} {:>12} {:>12} {:>8}",
                    "DEPLOYMENT", "LOCAL", "OFFLOADED", "FAILED"
                );
                for (deployment, served) in &usage.deployments {
                    println!(
                        "{:<24} {:>12} {:>12} {:>8}",
                        deployment, served.served_local, served.served_offloaded, served.failed
                    );
                }
                if usage.deployments.is_empty() {
                    println!("(nothing reported yet: devices report every usage window, a minute by default)");
                }
                println!(
                    "{} usage records counted (last {}); {} dropped on the device",
                    usage.records, usage.last_seq, usage.dropped
                );
            });
        }
    }
    Ok(())
}

/// `nephele device get`: one device, a line per aspect.
fn print_device(d: &DeviceView) {
    println!(
        "device {} ({}, region {}): {}",
        d.name, d.role, d.region, d.health
    );
    println!("  profile       {}", d.profile);
    println!("  labels        {}", labels(d));
    println!(
        "  cpu           {} cores, {} MB memory{}",
        d.cpu_cores,
        d.memory_mb,
        d.rss_bytes
            .map(|r| format!(", agent RSS {:.1} MB", r as f64 / 1e6))
            .unwrap_or_default()
    );
    let accelerators: Vec<String> = d
        .accelerators
        .iter()
        .map(|a| {
            format!(
                "{}× {} {} ({} int8 TOPS)",
                a.count, a.kind, a.model, a.peak_int8_tops
            )
        })
        .collect();
    println!(
        "  accelerators  {}",
        if accelerators.is_empty() {
            "none".to_string()
        } else {
            accelerators.join(", ")
        }
    );
    println!("  address       {}", text(d.address.as_deref()));
    if let Some(link) = d.link {
        let bandwidth = if link.bandwidth_bps == 0 {
            "nothing measured yet".to_string()
        } else {
            format!("{:.1} Mbit/s", link.bandwidth_bps as f64 / 1e6)
        };
        println!(
            "  link          RTT {:.1} ms, {bandwidth}",
            link.rtt_us as f64 / 1e3
        );
    }
    if let Some(ago) = d.last_heartbeat_ms_ago {
        println!("  heartbeat     {:.1} s ago", ago as f64 / 1e3);
    }
    if let Some(endpoint) = &d.local_endpoint {
        println!("  local API     {endpoint}");
    }
    match &d.running {
        Some(running) if !running.is_empty() => {
            println!(
                "  {:<24} {:<14} {:<12} {:>10} {:>10}",
                "DEPLOYMENT", "VARIANT", "PHASE", "LOCAL", "OFFLOADED"
            );
            for r in running {
                println!(
                    "  {:<24} {:<14} {:<12} {:>10} {:>10}",
                    r.deployment, r.variant, r.phase, r.served_local, r.served_offloaded
                );
            }
        }
        _ => println!("  runs          nothing (of the deployments this token sees)"),
    }
}

/// `k=v,k=v`, `-` for none.
fn labels(d: &DeviceView) -> String {
    if d.labels.is_empty() {
        "-".to_string()
    } else {
        d.labels
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect::<Vec<_>>()
            .join(",")
    }
}
