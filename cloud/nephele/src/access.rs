//! `nephele api-token …` and `nephele audit`: who may use the API, as what, for which
//! tenant, and what they changed (tenants themselves: `tenant.rs`).

use anyhow::Result;
use nephele_api::{ApiTokenSpec, ApiTokenView, AuditRecord, Role};

use crate::client::{show, text, when_unix, ApiArgs};

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

fn print_created(t: &ApiTokenView) {
    println!(
        "API token {} ({}, {} of tenant {}){}:\n  {}",
        t.id,
        t.name,
        t.role,
        t.tenant,
        match t.expires_unix {
            Some(expires) => format!(", expires {}", when_unix(Some(expires))),
            None => String::new(),
        },
        text(t.token.as_deref())
    );
    println!("it is shown only now: keep it (e.g. export NEPHELE_TOKEN=...)");
}

pub fn api_token(args: ApiArgs, command: ApiTokenCommand) -> Result<()> {
    let api = args.client()?;
    match command {
        ApiTokenCommand::Create {
            name,
            role,
            tenant,
            ttl,
        } => {
            let role = Role::parse(&role).map_err(anyhow::Error::msg)?;
            let token: ApiTokenView = api.post_as(
                "/v1/api-tokens",
                &ApiTokenSpec {
                    name,
                    role,
                    tenant,
                    ttl_s: ttl,
                },
            )?;
            show(args.json, &token, print_created);
        }
        ApiTokenCommand::List => {
            let tokens: Vec<ApiTokenView> = api.get_as("/v1/api-tokens")?;
            show(args.json, &tokens, |tokens| {
                println!(
                    "{:<10} {:<18} {:<10} {:<12} {:<8} {:<36} EXPIRES",
                    "ID", "NAME", "ROLE", "TENANT", "STATE", "CREATED"
                );
                for t in tokens {
                    println!(
                        "{:<10} {:<18} {:<10} {:<12} {:<8} {:<36} {}",
                        t.id,
                        t.name,
                        t.role.as_str(),
                        t.tenant,
                        t.state,
                        when_unix(Some(t.created_unix)),
                        match t.expires_unix {
                            Some(e) => when_unix(Some(e)),
                            None => "never".into(),
                        }
                    );
                }
            });
        }
        ApiTokenCommand::Revoke { id } => {
            let token: ApiTokenView = api.delete_as(&format!("/v1/api-tokens/{id}"))?;
            show(args.json, &token, |t| {
                println!("API token {} revoked; it no longer works", t.id)
            });
        }
        ApiTokenCommand::Rotate { id } => {
            let token: ApiTokenView = api.post_as(
                &format!("/v1/api-tokens/{id}/rotate"),
                &serde_json::Value::Null,
            )?;
            show(args.json, &token, print_created);
        }
    }
    Ok(())
}

pub fn audit(api_args: ApiArgs, args: AuditArgs) -> Result<()> {
    let api = api_args.client()?;
    let mut path = format!("/v1/audit?after={}&limit={}", args.after, args.limit);
    if let Some(tenant) = &args.tenant {
        path.push_str(&format!("&tenant={tenant}"));
    }
    let entries: Vec<AuditRecord> = api.get_as(&path)?;
    show(api_args.json, &entries, |entries| {
        println!(
            "{:>6} {:<36} {:<10} {:<10} {:<12} {:<15} {:>6}  REQUEST",
            "SEQ", "WHEN", "TOKEN", "ROLE", "TENANT", "FROM", "STATUS"
        );
        let dash = |t: &str| {
            if t.is_empty() {
                "-".to_string()
            } else {
                t.to_string()
            }
        };
        for e in entries {
            println!(
                "{:>6} {:<36} {:<10} {:<10} {:<12} {:<15} {:>6}  {} {}",
                e.seq,
                when_unix(Some(e.unix_ms / 1000)),
                dash(&e.token),
                dash(&e.role),
                dash(&e.tenant),
                dash(&e.peer),
                e.status,
                e.method,
                e.path
            );
        }
    });
    Ok(())
}
