//! `nephele api-token …` and `nephele audit`: who may use the API, as what, for which
//! tenant, and what they changed (tenants themselves: `tenant.rs`).

use anyhow::Result;
use serde_json::Value;

use crate::client::{print, s, when, ApiArgs};

#[derive(Debug, Clone, clap::Subcommand)]
pub enum ApiTokenCommand {
    /// Create an API token (admins); the token is printed this once.
    Create {
        /// What it is for (a-z, 0-9 and `-`).
        name: String,
        /// viewer (reads), developer (its tenant's models, deployments, jobs),
        /// operator (and devices, nodes, join tokens) or admin (everything).
        #[arg(long)]
        role: String,
        #[arg(long)]
        tenant: String,
        /// Seconds until it expires (default: it does not).
        #[arg(long)]
        ttl: Option<u64>,
    },
    /// List API tokens (never their secrets).
    List,
    /// Revoke a token at once.
    Revoke { id: String },
    /// Give a token a new secret (printed this once); the old one stops working.
    Rotate { id: String },
}

#[derive(Debug, Clone, clap::Args)]
pub struct AuditArgs {
    /// Only entries after this sequence number.
    #[arg(long, default_value_t = 0)]
    pub after: u64,
    /// The newest this many (1..=1000).
    #[arg(long, default_value_t = 50)]
    pub limit: usize,
    #[arg(long)]
    pub tenant: Option<String>,
}

fn print_created(v: &Value) {
    println!(
        "API token {} ({}, {} of tenant {}){}:\n  {}",
        s(v, "id"),
        s(v, "name"),
        s(v, "role"),
        s(v, "tenant"),
        match v.get("expires_unix").filter(|e| !e.is_null()) {
            Some(expires) => format!(", expires {}", when(Some(expires))),
            None => String::new(),
        },
        s(v, "token")
    );
    println!("it is shown only now: keep it (e.g. export NEPHELE_TOKEN=...)");
}

pub fn api_token(args: ApiArgs, command: ApiTokenCommand) -> Result<()> {
    let api = args.client();
    match command {
        ApiTokenCommand::Create {
            name,
            role,
            tenant,
            ttl,
        } => {
            let value = api.post(
                "/v1/api-tokens",
                &serde_json::json!({"name": name, "role": role, "tenant": tenant, "ttl_s": ttl}),
            )?;
            print(args.json, &value, print_created);
        }
        ApiTokenCommand::List => {
            let value = api.get("/v1/api-tokens")?;
            print(args.json, &value, |v| {
                println!(
                    "{:<10} {:<18} {:<10} {:<12} {:<8} {:<36} EXPIRES",
                    "ID", "NAME", "ROLE", "TENANT", "STATE", "CREATED"
                );
                for t in v.as_array().into_iter().flatten() {
                    println!(
                        "{:<10} {:<18} {:<10} {:<12} {:<8} {:<36} {}",
                        s(t, "id"),
                        s(t, "name"),
                        s(t, "role"),
                        s(t, "tenant"),
                        s(t, "state"),
                        when(t.get("created_unix")),
                        match t.get("expires_unix").filter(|e| !e.is_null()) {
                            Some(e) => when(Some(e)),
                            None => "never".into(),
                        }
                    );
                }
            });
        }
        ApiTokenCommand::Revoke { id } => {
            let value = api.delete(&format!("/v1/api-tokens/{id}"))?;
            print(args.json, &value, |v| {
                println!("API token {} revoked; it no longer works", s(v, "id"))
            });
        }
        ApiTokenCommand::Rotate { id } => {
            let value = api.post(&format!("/v1/api-tokens/{id}/rotate"), &Value::Null)?;
            print(args.json, &value, print_created);
        }
    }
    Ok(())
}

pub fn audit(api_args: ApiArgs, args: AuditArgs) -> Result<()> {
    let api = api_args.client();
    let mut path = format!("/v1/audit?after={}&limit={}", args.after, args.limit);
    if let Some(tenant) = &args.tenant {
        path.push_str(&format!("&tenant={tenant}"));
    }
    let value = api.get(&path)?;
    print(api_args.json, &value, |v| {
        println!(
            "{:>6} {:<36} {:<10} {:<10} {:<12} {:<15} {:>6}  REQUEST",
            "SEQ", "WHEN", "TOKEN", "ROLE", "TENANT", "FROM", "STATUS"
        );
        for e in v.as_array().into_iter().flatten() {
            let seconds = e.get("unix_ms").and_then(Value::as_u64).map(|ms| ms / 1000);
            println!(
                "{:>6} {:<36} {:<10} {:<10} {:<12} {:<15} {:>6}  {} {}",
                s(e, "seq"),
                when(seconds.map(Value::from).as_ref()),
                s(e, "token"),
                s(e, "role"),
                s(e, "tenant"),
                s(e, "peer"),
                s(e, "status"),
                s(e, "method"),
                s(e, "path")
            );
        }
    });
    Ok(())
}
