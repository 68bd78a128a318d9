//! `nephele region`: regions, their node slots, interruptions and drains.

use anyhow::Result;
use nephele_api::*;

use super::*;

#[derive(Debug, Clone, clap::Subcommand)]
pub enum RegionCommand {
    List,
    /// A region's node slots: who serves them, what is free, which jobs hold them.
    Nodes {
        name: String,
    },
    /// A spot interruption notice for a node: its replicas start elsewhere first, its
    /// jobs checkpoint and run again elsewhere, and it is released.
    Interrupt {
        region: String,
        /// Node slot (`l4-0`) or its agent's name.
        node: String,
        /// Seconds until the node goes.
        #[arg(long, default_value_t = 120)]
        notice: u64,
    },
    /// Move a node's work elsewhere and (in a pool with a provider) release it.
    Drain {
        region: String,
        node: String,
    },
}

pub fn region(args: ApiArgs, command: RegionCommand) -> Result<()> {
    let api = args.client()?;
    match command {
        RegionCommand::List => {
            let regions: Vec<RegionView> = api.get_as("/v1/regions")?;
            show(args.json, &regions, |regions| {
                println!(
                    "{:<12} {:<12} {:>8} {:>7}  POOLS",
                    "NAME", "CARBON ZONE", "DEVICES", "ONLINE"
                );
                for r in regions {
                    let pools: Vec<String> = r
                        .pools
                        .iter()
                        .map(|p| {
                            format!(
                                "{} ({} x {}, {})",
                                p.name, p.max_nodes, p.node_profile, p.capacity_type
                            )
                        })
                        .collect();
                    println!(
                        "{:<12} {:<12} {:>8} {:>7}  {}",
                        r.name,
                        text(r.carbon_zone.as_deref()),
                        r.devices,
                        num(r.online),
                        pools.join(", ")
                    );
                }
            });
        }
        RegionCommand::Interrupt {
            region,
            node,
            notice,
        } => {
            let nodes: Vec<NodeView> = api.post_as(
                &format!("/v1/regions/{region}/nodes/{node}/interrupt"),
                &InterruptBody { notice_s: notice },
            )?;
            show(args.json, &nodes, |_| {
                println!(
                    "node {node} of region {region} drains within {notice} s: its replicas start elsewhere first, its jobs run again elsewhere; see `nephele region nodes {region}`"
                )
            });
        }
        RegionCommand::Drain { region, node } => {
            let nodes: Vec<NodeView> = api.post_as(
                &format!("/v1/regions/{region}/nodes/{node}/drain"),
                &serde_json::json!({}),
            )?;
            show(args.json, &nodes, |_| {
                println!("node {node} of region {region} is draining; see `nephele region nodes {region}`")
            });
        }
        RegionCommand::Nodes { name } => {
            let nodes: Vec<NodeView> = api.get_as(&format!("/v1/regions/{name}/nodes"))?;
            show(args.json, &nodes, |nodes| {
                println!(
                    "{:<10} {:<10} {:<10} {:<9} {:<18} {:>9} {:>10} {:<18} JOBS",
                    "NODE",
                    "POOL",
                    "PHASE",
                    "PROVIDER",
                    "AGENT",
                    "CPU FREE",
                    "MEM FREE",
                    "GPU FREE (milli)"
                );
                for n in nodes {
                    let gpus: Vec<String> = n.gpu_free_milli.iter().map(u32::to_string).collect();
                    println!(
                        "{:<10} {:<10} {:<10} {:<9} {:<18} {:>9} {:>10} {:<18} {}",
                        n.name,
                        n.pool,
                        n.phase,
                        n.provider,
                        text(n.agent.as_deref()),
                        n.cpu_free_milli,
                        n.memory_free_mib,
                        if gpus.is_empty() {
                            "-".into()
                        } else {
                            gpus.join(",")
                        },
                        if n.jobs.is_empty() {
                            "-".into()
                        } else {
                            n.jobs.join(" ")
                        }
                    );
                }
            });
        }
    }
    Ok(())
}
