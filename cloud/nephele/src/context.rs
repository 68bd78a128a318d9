//! Contexts, as kubeconfig has them: named control planes with their API URL, the CA
//! their API's certificate is checked against, and a token, kept in `$NEPHELE_CLI_CONFIG` or else `~/.config/nephele/config.toml` (mode
//! 0600, since it may hold tokens). `nephele login` checks a token against the API and
//! saves it as a context; `nephele context list|use|current|delete` manage them. A
//! command's API and token come from its flags, then `NEPHELE_API`/`NEPHELE_TOKEN`,
//! then the current context, then `https://127.0.0.1:8080` without a token. The CA
//! comes from `--ca`/`NEPHELE_CA`, then the context (kept in it as PEM, as a
//! kubeconfig's `certificate-authority-data`), else the public CAs.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context as _, Result};
use serde::{Deserialize, Serialize};

use crate::client::{print, ApiArgs};

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// The context commands use when no flag or variable names an API.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub current: Option<String>,
    #[serde(default, rename = "context")]
    pub contexts: Vec<Context>,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Context {
    pub name: String,
    pub api: String,
    /// The token itself (the file is 0600), or a file that holds it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token_file: Option<PathBuf>,
    /// The CA the API's certificate is checked against (PEM), saved by `nephele login
    /// --ca FILE`; none: the public CAs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca: Option<String>,
}

impl Context {
    /// Its token, read from its file when it names one.
    pub fn token(&self) -> Result<String> {
        match (&self.token, &self.token_file) {
            (Some(token), _) => Ok(token.clone()),
            (None, Some(file)) => Ok(std::fs::read_to_string(file)
                .with_context(|| {
                    format!(
                        "context {}: cannot read its token file {}",
                        self.name,
                        file.display()
                    )
                })?
                .trim()
                .to_string()),
            (None, None) => Ok(String::new()),
        }
    }
}

/// Where the contexts are kept.
pub fn path() -> Option<PathBuf> {
    // Not NEPHELE_CONFIG: that is the control plane's configuration file.
    if let Some(path) = std::env::var_os("NEPHELE_CLI_CONFIG").filter(|p| !p.is_empty()) {
        return Some(PathBuf::from(path));
    }
    let base = std::env::var_os("XDG_CONFIG_HOME")
        .filter(|p| !p.is_empty())
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".config")))?;
    Some(base.join("nephele").join("config.toml"))
}

/// The contexts in `path`; none when it does not exist.
pub fn load(path: &Path) -> Result<Config> {
    match std::fs::read_to_string(path) {
        Ok(text) => toml::from_str(&text).with_context(|| {
            format!(
                "{} is not a nephele config ({{current, [[context]] name, api, token | token_file, ca}}); fix or remove it",
                path.display()
            )
        }),
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => Ok(Config::default()),
        Err(error) => Err(error).with_context(|| format!("cannot read {}", path.display())),
    }
}

fn save(path: &Path, config: &Config) -> Result<()> {
    use std::io::Write as _;
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    }
    let text = toml::to_string(config).context("cannot encode the config")?;
    let tmp = path.with_extension("tmp");
    let _ = std::fs::remove_file(&tmp);
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create_new(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
    let mut file = options
        .open(&tmp)
        .with_context(|| format!("cannot write {}", tmp.display()))?;
    file.write_all(text.as_bytes())?;
    file.sync_all()?;
    std::fs::rename(&tmp, path).with_context(|| format!("cannot write {}", path.display()))
}

/// The current context, if the config names one (an unreadable config is an error:
/// it should not be silently ignored).
pub fn current() -> Result<Option<Context>> {
    let Some(path) = path() else {
        return Ok(None);
    };
    let config = load(&path)?;
    let Some(name) = config.current.as_deref() else {
        return Ok(None);
    };
    match config.contexts.iter().find(|c| c.name == name) {
        Some(context) => Ok(Some(context.clone())),
        None => bail!(
            "{}: the current context {name:?} is not defined; `nephele context use NAME` picks another",
            path.display()
        ),
    }
}

#[derive(Debug, Clone, clap::Args)]
pub struct LoginArgs {
    /// The context's name (default: `default`).
    #[arg(long, default_value = "default")]
    pub name: String,
    /// Keep the token in this file and read it from there (else it is kept in the
    /// config, mode 0600).
    #[arg(long)]
    pub token_file: Option<PathBuf>,
}

#[derive(Debug, Clone, clap::Subcommand)]
pub enum ContextCommand {
    /// The contexts, the current one marked.
    List,
    /// Make NAME the current context.
    Use { name: String },
    /// The current context's name and API.
    Current,
    /// Forget a context.
    Delete { name: String },
}

/// `nephele login`: checks the API and token (`--api`, `--token` or the variables, or
/// `--token-file`) and saves them as a context, made current.
pub fn login(api: ApiArgs, args: LoginArgs) -> Result<()> {
    let path = path().context("no HOME or NEPHELE_CLI_CONFIG: nowhere to keep contexts")?;
    let Some(base) = api.api.clone() else {
        bail!("nephele login needs --api URL (or NEPHELE_API): the control plane's API, e.g. https://10.0.0.5:8080 (and --ca FILE, its cluster CA)");
    };
    let token = match (&args.token_file, &api.token) {
        (Some(file), _) => std::fs::read_to_string(file)
            .with_context(|| format!("cannot read {}", file.display()))?
            .trim()
            .to_string(),
        (None, Some(token)) if !token.is_empty() => token.clone(),
        _ => bail!("nephele login needs a token: --token-file FILE, or --token / NEPHELE_TOKEN"),
    };
    let ca = api.ca.as_deref().map(crate::client::read_ca).transpose()?;
    // One call that every role may make says whether the token works here (and the
    // CA, whether the API is the one it says it is).
    let client = crate::client::Api::with_ca(&base, &token, ca.as_deref());
    let tenants: Vec<nephele_api::TenantView> = client.get_as("/v1/tenants").map_err(|error| {
        // Only a refusal of the token is the token's fault: a TLS failure (a wrong
        // or missing CA) or an unreachable API says so itself.
        let text = format!("{error:#}");
        if text.contains("401") || text.contains("403") {
            error.context("the API did not accept this token")
        } else {
            error.context(format!("cannot check the token at {base}"))
        }
    })?;
    let tenant = tenants
        .first()
        .map_or_else(|| "-".to_string(), |t| t.name.clone());
    let mut config = load(&path)?;
    config.contexts.retain(|c| c.name != args.name);
    config.contexts.push(Context {
        name: args.name.clone(),
        api: base.trim_end_matches('/').to_string(),
        token: args.token_file.is_none().then_some(token),
        token_file: args.token_file.clone(),
        ca: ca.map(|pem| String::from_utf8_lossy(&pem).into_owned()),
    });
    config.current = Some(args.name.clone());
    save(&path, &config)?;
    let view =
        serde_json::json!({"context": args.name, "api": base, "tenant": tenant, "config": path});
    print(api.json, &view, |_| {
        println!(
            "logged in to {base} as a token of tenant {tenant}; context {} is current (kept in {})",
            args.name,
            path.display()
        )
    });
    Ok(())
}

pub fn context(api: ApiArgs, command: ContextCommand) -> Result<()> {
    let path = path().context("no HOME or NEPHELE_CLI_CONFIG: nowhere to keep contexts")?;
    let mut config = load(&path)?;
    let known =
        |config: &Config, name: &str| -> Result<()> {
            if config.contexts.iter().any(|c| c.name == name) {
                return Ok(());
            }
            let names: Vec<&str> = config.contexts.iter().map(|c| c.name.as_str()).collect();
            bail!(
            "no context {name:?}; contexts: {} (`nephele login --api URL --name NAME` adds one)",
            if names.is_empty() { "none".to_string() } else { names.join(", ") }
        )
        };
    match command {
        ContextCommand::List => {
            let view: Vec<serde_json::Value> = config
                .contexts
                .iter()
                .map(|c| {
                    serde_json::json!({
                        "name": c.name,
                        "api": c.api,
                        "current": config.current.as_deref() == Some(c.name.as_str()),
                        "token_from": if c.token_file.is_some() { "file" } else if c.token.is_some() { "config" } else { "none" },
                    })
                })
                .collect();
            print(api.json, &serde_json::Value::from(view), |v| {
                println!("{:<3}{:<16} {:<40} TOKEN", "", "NAME", "API");
                for c in v.as_array().into_iter().flatten() {
                    println!(
                        "{:<3}{:<16} {:<40} {}",
                        if c["current"] == true { "*" } else { "" },
                        c["name"].as_str().unwrap_or("-"),
                        c["api"].as_str().unwrap_or("-"),
                        c["token_from"].as_str().unwrap_or("-")
                    );
                }
            });
        }
        ContextCommand::Use { name } => {
            known(&config, &name)?;
            config.current = Some(name.clone());
            save(&path, &config)?;
            println!("context {name} is current");
        }
        ContextCommand::Current => match current()? {
            Some(c) => println!("{} ({})", c.name, c.api),
            None => bail!("no current context; `nephele login --api URL` makes one"),
        },
        ContextCommand::Delete { name } => {
            known(&config, &name)?;
            config.contexts.retain(|c| c.name != name);
            if config.current.as_deref() == Some(name.as_str()) {
                config.current = None;
            }
            save(&path, &config)?;
            println!("context {name} deleted");
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn contexts_round_trip_and_tokens_come_from_files() {
        let dir = std::env::temp_dir().join(format!("nephele-ctx-{}", std::process::id()));
        let path = dir.join("config.toml");
        let token_file = dir.join("token");
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(&token_file, "abc.def\n").unwrap();
        let config = Config {
            current: Some("prod".into()),
            contexts: vec![
                Context {
                    name: "prod".into(),
                    api: "https://10.0.0.5:8080".into(),
                    token: None,
                    token_file: Some(token_file),
                    ca: Some(
                        "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n".into(),
                    ),
                },
                Context {
                    name: "lab".into(),
                    api: "http://127.0.0.1:8080".into(),
                    token: Some("x.y".into()),
                    token_file: None,
                    ca: None,
                },
            ],
        };
        save(&path, &config).unwrap();
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt as _;
            let mode = std::fs::metadata(&path).unwrap().permissions().mode();
            assert_eq!(mode & 0o777, 0o600);
        }
        let back = load(&path).unwrap();
        assert_eq!(back, config);
        assert_eq!(back.contexts[0].token().unwrap(), "abc.def");
        assert_eq!(back.contexts[1].token().unwrap(), "x.y");
        assert_eq!(load(&dir.join("absent.toml")).unwrap(), Config::default());
        std::fs::write(&path, "current = 3").unwrap();
        assert!(load(&path).is_err());
        let _ = std::fs::remove_dir_all(&dir);
    }
}
