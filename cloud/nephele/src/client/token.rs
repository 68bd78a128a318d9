//! `nephele token`: join tokens for enrolling devices.

use anyhow::Result;
use nephele_api::*;

use super::*;

#[derive(Debug, Clone, clap::Subcommand)]
pub enum TokenCommand {
    /// Create a single-use join token.
    Create {
        #[arg(long)]
        region: Option<String>,
        /// Lifetime in seconds (default from the config, 3600).
        #[arg(long)]
        ttl: Option<u64>,
    },
    /// List join tokens (never their secrets).
    List,
}

pub fn token(args: ApiArgs, command: TokenCommand) -> Result<()> {
    let api = args.client()?;
    match command {
        TokenCommand::Create { region, ttl } => {
            let token: JoinTokenView =
                api.post_as("/v1/tokens", &TokenRequest { region, ttl_s: ttl })?;
            show(args.json, &token, |t| {
                let secret = text(t.token.as_deref());
                println!(
                    "join token for region {} (single use, expires {}):\n  {secret}",
                    t.region,
                    when_unix(Some(t.expires_unix)),
                );
                println!(
                    "enrol a device with:\n  nephele-edge join --server HOST:PORT --token {secret}"
                );
            });
        }
        TokenCommand::List => {
            let tokens: Vec<JoinTokenView> = api.get_as("/v1/tokens")?;
            show(args.json, &tokens, |tokens| {
                println!("{:<10} {:<12} {:<36} USED BY", "ID", "REGION", "EXPIRES");
                for t in tokens {
                    println!(
                        "{:<10} {:<12} {:<36} {}",
                        t.id,
                        t.region,
                        when_unix(Some(t.expires_unix)),
                        text(t.used_by.as_deref())
                    );
                }
            });
        }
    }
    Ok(())
}
