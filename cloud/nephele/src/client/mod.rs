//! A small blocking client of the REST API, and the CLI commands built on it.

use anyhow::{bail, Context as _, Result};
use clap::builder::TypedValueParser as _;

#[derive(Debug, Clone, clap::Args)]
pub struct ApiArgs {
    /// Control plane API base URL (default: the current context's, else
    /// https://127.0.0.1:8080; `nephele login` saves contexts).
    #[arg(long, env = "NEPHELE_API", global = true)]
    pub api: Option<String>,
    /// The cluster CA to trust for the API's certificate, a PEM file (the control
    /// plane's <data-dir>/ca.pem; default: the current context's, else the public CAs).
    #[arg(long, env = "NEPHELE_CA", global = true)]
    pub ca: Option<std::path::PathBuf>,
    /// API token (default: the current context's; the first admin token is printed on
    /// first start and saved in <data-dir>/admin-token). Never shown in `--help`, even
    /// when it comes from the environment.
    #[arg(long, env = "NEPHELE_TOKEN", global = true, hide_env_values = true)]
    pub token: Option<String>,
    /// Print JSON instead of a table (as `-o json`).
    #[arg(long, global = true)]
    pub json: bool,
    /// How to print answers: table (default), json or yaml.
    #[arg(short = 'o', long = "output", value_enum, global = true)]
    pub output: Option<crate::output::Output>,
    /// Let the replica you reach answer reads from its own copy of the store (a
    /// standby's copy is at most a second old and has no live state: online, health,
    /// readiness), as Nomad's `-stale`; without it reads go to the leader.
    #[arg(long, global = true)]
    pub stale: bool,
}

/// Where a command's API and token come from when neither flag nor variable names them.
const DEFAULT_API: &str = "https://127.0.0.1:8080";

impl ApiArgs {
    /// The arguments with `-o` applied (`-o json` is `--json`; `-o yaml` prints YAML).
    pub fn prepared(mut self) -> ApiArgs {
        self.json |= self.output == Some(crate::output::Output::Json);
        let yaml = self.output == Some(crate::output::Output::Yaml);
        self.json |= yaml;
        crate::output::use_yaml(yaml);
        self
    }

    /// A client of the API these arguments name: flags and variables first, then the
    /// current context (see `context.rs`), then the default. A CA file that cannot be
    /// read is an error: trusting the public CAs instead would only move the failure
    /// to a TLS check that blames something else. An empty token (`NEPHELE_TOKEN=`)
    /// counts as none given, so the context's applies.
    pub fn client(&self) -> Result<Api> {
        let given_token = self.token.as_ref().filter(|t| !t.trim().is_empty());
        let context = if self.api.is_none() || given_token.is_none() {
            crate::context::current().unwrap_or_else(|error| {
                eprintln!("nephele: warning: {error:#}; using flags and defaults");
                None
            })
        } else {
            None
        };
        // A context's token goes only to that context's API.
        let context = context.filter(|c| {
            self.api
                .as_ref()
                .is_none_or(|api| api.trim_end_matches('/') == c.api)
        });
        let base = self
            .api
            .clone()
            .or_else(|| context.as_ref().map(|c| c.api.clone()))
            .unwrap_or_else(|| DEFAULT_API.into());
        let token = match (given_token, &context) {
            (Some(token), _) => token.clone(),
            (None, Some(context)) => context.token().unwrap_or_else(|error| {
                eprintln!("nephele: warning: {error:#}");
                String::new()
            }),
            (None, None) => String::new(),
        };
        let ca = match (&self.ca, &context) {
            (Some(path), _) => Some(read_ca(path)?),
            (None, Some(context)) => context.ca.clone().map(String::into_bytes),
            (None, None) => None,
        };
        let mut api = Api::with_ca(&base, &token, ca.as_deref());
        api.stale = self.stale;
        Ok(api)
    }
}

/// The PEM text of a CA file, checked to hold a certificate.
pub fn read_ca(path: &std::path::Path) -> Result<Vec<u8>> {
    let pem = std::fs::read(path).with_context(|| {
        format!(
            "cannot read the CA file {} (--ca or NEPHELE_CA)",
            path.display()
        )
    })?;
    if tls_config(Some(&pem)).is_none() {
        bail!(
            "{} holds no PEM certificate (give the control plane's <data-dir>/ca.pem)",
            path.display()
        );
    }
    Ok(pem)
}

/// The TLS settings of the CLI's connections: only the given CA's certificates when
/// there are any (as a kubeconfig's certificate authority), else the public CAs.
fn tls_config(ca_pem: Option<&[u8]>) -> Option<ureq::tls::TlsConfig> {
    let pem = ca_pem?;
    let certs: Vec<ureq::tls::Certificate<'static>> = ureq::tls::parse_pem(pem)
        .filter_map(|item| match item {
            Ok(ureq::tls::PemItem::Certificate(cert)) => Some(cert),
            _ => None,
        })
        .collect();
    if certs.is_empty() {
        return None;
    }
    Some(
        ureq::tls::TlsConfig::builder()
            .root_certs(ureq::tls::RootCerts::new_with_certs(&certs))
            .build(),
    )
}

/// An agent builder with the CLI's TLS settings.
fn agent_builder(
    ca_pem: Option<&[u8]>,
) -> ureq::config::ConfigBuilder<ureq::typestate::AgentScope> {
    let builder = ureq::Agent::config_builder().http_status_as_error(false);
    match tls_config(ca_pem) {
        Some(tls) => builder.tls_config(tls),
        None => builder,
    }
}

mod api;
mod deploy;
mod device;
mod grid;
mod job;
mod model;
mod region;
mod show;
mod token;

pub use api::*;
pub use deploy::*;
pub use device::*;
pub use grid::*;
pub use job::*;
pub use model::*;
pub use region::*;
pub(crate) use show::*;
pub use token::*;
