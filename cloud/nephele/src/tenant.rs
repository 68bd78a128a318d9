//! `nephele tenant …`: tenants with their weights and quotas, as API objects
//! (`/v1/tenants`). Creating, changing and deleting them takes an admin token.

use anyhow::{bail, Result};
use serde_json::{json, Value};

use crate::client::{print, s, when, ApiArgs};

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

/// The PUT body: `current` (a tenant's view, or `{}`) with the flags applied.
fn body(current: &Value, quotas: &QuotaArgs, unlimited: &[String]) -> Result<Value> {
    let mut out = json!({
        "weight": current.get("weight").cloned().unwrap_or(json!(1.0)),
    });
    for key in [
        "quota_gpu_milli",
        "quota_cpu_milli",
        "quota_memory_mib",
        "quota_jobs",
        "quota_replicas",
    ] {
        if let Some(value) = current.get(key).filter(|v| !v.is_null()) {
            out[key] = value.clone();
        }
    }
    if let Some(weight) = quotas.weight {
        out["weight"] = json!(weight);
    }
    for (key, value) in [
        ("quota_gpu_milli", quotas.gpu_milli),
        ("quota_cpu_milli", quotas.cpu_milli),
        ("quota_memory_mib", quotas.memory_mib),
        ("quota_jobs", quotas.jobs.map(u64::from)),
        ("quota_replicas", quotas.replicas.map(u64::from)),
    ] {
        if let Some(value) = value {
            out[key] = json!(value);
        }
    }
    for name in unlimited {
        let key = match name.trim() {
            "gpu" => "quota_gpu_milli",
            "cpu" => "quota_cpu_milli",
            "memory" => "quota_memory_mib",
            "jobs" => "quota_jobs",
            "replicas" => "quota_replicas",
            other => bail!(
                "--unlimited {other:?}: give gpu, cpu, memory, jobs or replicas (comma-separated)"
            ),
        };
        if let Some(map) = out.as_object_mut() {
            map.remove(key);
        }
    }
    Ok(out)
}

fn quota(t: &Value, key: &str) -> String {
    match t.get(key).and_then(Value::as_u64) {
        Some(q) => q.to_string(),
        None => "-".into(),
    }
}

fn print_list(v: &Value) {
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
    for t in v.as_array().into_iter().flatten() {
        println!(
            "{:<14} {:>6} {:>10} {:>10} {:>11} {:>6} {:>9} {:>7} {:>7} {:>12}",
            s(t, "name"),
            s(t, "weight"),
            quota(t, "quota_gpu_milli"),
            quota(t, "quota_cpu_milli"),
            quota(t, "quota_memory_mib"),
            quota(t, "quota_jobs"),
            quota(t, "quota_replicas"),
            s(t, "api_tokens"),
            s(t, "models"),
            s(t, "deployments")
        );
    }
    println!("(quotas per region; - is unlimited)");
}

fn print_one(t: &Value) {
    println!("tenant {} (weight {})", s(t, "name"), s(t, "weight"));
    println!(
        "  quotas per region: GPU milli {}, CPU milli {}, memory MiB {}, jobs {}, replicas {} (- is unlimited)",
        quota(t, "quota_gpu_milli"),
        quota(t, "quota_cpu_milli"),
        quota(t, "quota_memory_mib"),
        quota(t, "quota_jobs"),
        quota(t, "quota_replicas")
    );
    println!(
        "  holds: {} API token(s), {} model version(s), {} deployment(s) asking for {} replica(s)",
        s(t, "api_tokens"),
        s(t, "models"),
        s(t, "deployments"),
        s(t, "replicas_asked")
    );
    println!(
        "  created {}, changed {} by {}{}",
        when(t.get("created_unix")),
        when(t.get("updated_unix")),
        s(t, "updated_by"),
        if t["declared_in_config"] == true {
            " (declared in the control plane's config)"
        } else {
            ""
        }
    );
}

pub fn run(args: ApiArgs, command: TenantCommand) -> Result<()> {
    let api = args.client();
    match command {
        TenantCommand::List => {
            let value = api.get("/v1/tenants")?;
            print(args.json, &value, print_list);
        }
        TenantCommand::Get { name } => {
            let value = api.get(&format!("/v1/tenants/{name}"))?;
            print(args.json, &value, print_one);
        }
        TenantCommand::Create { name, quotas } => {
            let exists = api
                .get("/v1/tenants")?
                .as_array()
                .is_some_and(|all| all.iter().any(|t| t["name"] == name.as_str()));
            if exists {
                bail!("tenant {name} exists; change it with `nephele tenant set {name} …`");
            }
            let value = api.put_json(
                &format!("/v1/tenants/{name}"),
                &body(&json!({}), &quotas, &[])?,
            )?;
            print(args.json, &value, |t| {
                println!("tenant {} created", s(t, "name"));
                print_one(t);
            });
        }
        TenantCommand::Set {
            name,
            quotas,
            unlimited,
        } => {
            let current = api.get(&format!("/v1/tenants/{name}"))?;
            let value = api.put_json(
                &format!("/v1/tenants/{name}"),
                &body(&current, &quotas, &unlimited)?,
            )?;
            print(args.json, &value, |t| {
                println!("tenant {} changed", s(t, "name"));
                print_one(t);
            });
        }
        TenantCommand::Delete { name } => {
            let value = api.delete(&format!("/v1/tenants/{name}"))?;
            print(args.json, &value, |t| {
                println!("tenant {} deleted", s(t, "name"))
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
        let current = json!({"name": "team-a", "weight": 2.0, "quota_gpu_milli": 4000,
                             "quota_jobs": 10, "quota_cpu_milli": null});
        let quotas = QuotaArgs {
            replicas: Some(3),
            ..none()
        };
        let out = body(&current, &quotas, &["jobs".into()]).unwrap();
        assert_eq!(
            out,
            json!({"weight": 2.0, "quota_gpu_milli": 4000, "quota_replicas": 3})
        );
        assert!(body(&current, &none(), &["disk".into()]).is_err());
    }
}
