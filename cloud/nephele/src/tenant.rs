//! `nephele tenant …`: tenants with their weights and quotas, as API objects
//! (`/v1/tenants`). Creating, changing and deleting them takes an admin token.

use anyhow::{bail, Result};
use nephele_api::{TenantBody, TenantView};

use crate::client::{num, show, when_unix, ApiArgs};

#[derive(Debug, Clone, clap::Subcommand)]
pub enum TenantCommand {
    /// Tenants, their quotas and what they hold (yours; admins see all).
    List,
    /// One tenant.
    Get { name: String },
    /// Create a tenant (admins).
    Create {
        name: String,
        #[command(flatten)]
        quotas: QuotaArgs,
    },
    /// Change a tenant's weight or quotas (admins); what is not given stays.
    Set {
        name: String,
        #[command(flatten)]
        quotas: QuotaArgs,
        /// Make these quotas unlimited: gpu, cpu, memory, jobs, replicas (comma-separated).
        #[arg(long, value_delimiter = ',')]
        unlimited: Vec<String>,
    },
    /// Delete a tenant (admins); refused while it has jobs, API tokens, models or
    /// deployments.
    Delete { name: String },
}

#[derive(Debug, Clone, clap::Args)]
pub struct QuotaArgs {
    /// Relative entitlement under dominant resource fairness.
    #[arg(long)]
    pub weight: Option<f64>,
    /// Most GPU milli it may hold at once in each region (1000 = one GPU).
    #[arg(long)]
    pub gpu_milli: Option<u64>,
    /// Most CPU milli it may hold at once in each region.
    #[arg(long)]
    pub cpu_milli: Option<u64>,
    /// Most memory (MiB) it may hold at once in each region.
    #[arg(long)]
    pub memory_mib: Option<u64>,
    /// Most jobs it may have in each region that have not ended.
    #[arg(long)]
    pub jobs: Option<u32>,
    /// Most cloud replicas its deployments may ask for in all.
    #[arg(long)]
    pub replicas: Option<u32>,
}

/// The PUT body: `current` (a tenant's weight and quotas, or the defaults) with the
/// flags applied.
fn body(current: TenantBody, quotas: &QuotaArgs, unlimited: &[String]) -> Result<TenantBody> {
    let mut out = current;
    if let Some(weight) = quotas.weight {
        out.weight = weight;
    }
    out.quota_gpu_milli = quotas.gpu_milli.or(out.quota_gpu_milli);
    out.quota_cpu_milli = quotas.cpu_milli.or(out.quota_cpu_milli);
    out.quota_memory_mib = quotas.memory_mib.or(out.quota_memory_mib);
    out.quota_jobs = quotas.jobs.or(out.quota_jobs);
    out.quota_replicas = quotas.replicas.or(out.quota_replicas);
    for name in unlimited {
        match name.trim() {
            "gpu" => out.quota_gpu_milli = None,
            "cpu" => out.quota_cpu_milli = None,
            "memory" => out.quota_memory_mib = None,
            "jobs" => out.quota_jobs = None,
            "replicas" => out.quota_replicas = None,
            other => bail!(
                "--unlimited {other:?}: give gpu, cpu, memory, jobs or replicas (comma-separated)"
            ),
        }
    }
    Ok(out)
}

/// A tenant's weight and quotas as a PUT takes them.
fn as_body(t: &TenantView) -> TenantBody {
    TenantBody {
        weight: t.weight,
        quota_cpu_milli: t.quota_cpu_milli,
        quota_memory_mib: t.quota_memory_mib,
        quota_gpu_milli: t.quota_gpu_milli,
        quota_jobs: t.quota_jobs,
        quota_replicas: t.quota_replicas,
    }
}

fn quota<T: ToString>(value: Option<T>) -> String {
    value.map_or_else(|| "-".into(), |q| q.to_string())
}

fn print_list(tenants: &[TenantView]) {
    println!(
        "{:<14} {:>6} {:>10} {:>10} {:>11} {:>6} {:>9} {:>7} {:>7} {:>12}",
        "TENANT",
        "WEIGHT",
        "GPU-MILLI",
        "CPU-MILLI",
        "MEMORY-MIB",
        "JOBS",
        "REPLICAS",
        "TOKENS",
        "MODELS",
        "DEPLOYMENTS"
    );
    for t in tenants {
        println!(
            "{:<14} {:>6} {:>10} {:>10} {:>11} {:>6} {:>9} {:>7} {:>7} {:>12}",
            t.name,
            num(Some(t.weight)),
            quota(t.quota_gpu_milli),
            quota(t.quota_cpu_milli),
            quota(t.quota_memory_mib),
            quota(t.quota_jobs),
            quota(t.quota_replicas),
            t.api_tokens,
            t.models,
            t.deployments
        );
    }
    println!("(quotas per region; - is unlimited)");
}

fn print_one(t: &TenantView) {
    println!("tenant {} (weight {})", t.name, num(Some(t.weight)));
    println!(
        "  quotas per region: GPU milli {}, CPU milli {}, memory MiB {}, jobs {}, replicas {} (- is unlimited)",
        quota(t.quota_gpu_milli),
        quota(t.quota_cpu_milli),
        quota(t.quota_memory_mib),
        quota(t.quota_jobs),
        quota(t.quota_replicas)
    );
    println!(
        "  holds: {} API token(s), {} model version(s), {} deployment(s) asking for {} replica(s)",
        t.api_tokens, t.models, t.deployments, t.replicas_asked
    );
    println!(
        "  created {}, changed {} by {}{}",
        when_unix(Some(t.created_unix)),
        when_unix(Some(t.updated_unix)),
        t.updated_by,
        if t.declared_in_config {
            " (declared in the control plane's config)"
        } else {
            ""
        }
    );
}

pub fn run(args: ApiArgs, command: TenantCommand) -> Result<()> {
    let api = args.client()?;
    match command {
        TenantCommand::List => {
            let tenants: Vec<TenantView> = api.get_as("/v1/tenants")?;
            show(args.json, &tenants, |t| print_list(t));
        }
        TenantCommand::Get { name } => {
            let tenant: TenantView = api.get_as(&format!("/v1/tenants/{name}"))?;
            show(args.json, &tenant, print_one);
        }
        TenantCommand::Create { name, quotas } => {
            let tenants: Vec<TenantView> = api.get_as("/v1/tenants")?;
            if tenants.iter().any(|t| t.name == name) {
                bail!("tenant {name} exists; change it with `nephele tenant set {name} …`");
            }
            let tenant: TenantView = api.put_as(
                &format!("/v1/tenants/{name}"),
                &body(TenantBody::default(), &quotas, &[])?,
            )?;
            show(args.json, &tenant, |t| {
                println!("tenant {} created", t.name);
                print_one(t);
            });
        }
        TenantCommand::Set {
            name,
            quotas,
            unlimited,
        } => {
            let current: TenantView = api.get_as(&format!("/v1/tenants/{name}"))?;
            let tenant: TenantView = api.put_as(
                &format!("/v1/tenants/{name}"),
                &body(as_body(&current), &quotas, &unlimited)?,
            )?;
            show(args.json, &tenant, |t| {
                println!("tenant {} changed", t.name);
                print_one(t);
            });
        }
        TenantCommand::Delete { name } => {
            let tenant: TenantView = api.delete_as(&format!("/v1/tenants/{name}"))?;
            show(args.json, &tenant, |t| {
                println!("tenant {} deleted", t.name)
            });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn none() -> QuotaArgs {
        QuotaArgs {
            weight: None,
            gpu_milli: None,
            cpu_milli: None,
            memory_mib: None,
            jobs: None,
            replicas: None,
        }
    }

    #[test]
    fn set_keeps_what_is_not_given_and_drops_what_is_made_unlimited() {
        let current = TenantBody {
            weight: 2.0,
            quota_gpu_milli: Some(4000),
            quota_jobs: Some(10),
            ..TenantBody::default()
        };
        let quotas = QuotaArgs {
            replicas: Some(3),
            ..none()
        };
        let out = body(current.clone(), &quotas, &["jobs".into()]).unwrap();
        assert_eq!(
            out,
            TenantBody {
                weight: 2.0,
                quota_gpu_milli: Some(4000),
                quota_replicas: Some(3),
                ..TenantBody::default()
            }
        );
        assert!(body(current, &none(), &["disk".into()]).is_err());
    }
}
