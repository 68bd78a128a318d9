//! A small blocking client of the REST API, and the CLI commands built on it.

use anyhow::{bail, Context as _, Result};
use clap::builder::TypedValueParser as _;
use nephele_api::*;
use serde_json::Value;

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

pub struct Api {
    base: String,
    token: String,
    agent: ureq::Agent,
    /// The CA trusted for the API's certificate (PEM), if one was given.
    ca: Option<Vec<u8>>,
    /// Reads may be answered from a replica's copy (`?stale`).
    pub stale: bool,
}

impl Api {
    /// A client trusting the public CAs (an API with a certificate from a public CA, or
    /// plain HTTP).
    pub fn new(base: &str, token: &str) -> Api {
        Api::with_ca(base, token, None)
    }

    /// A client trusting `ca_pem` (the cluster CA) for the API's certificate.
    pub fn with_ca(base: &str, token: &str, ca_pem: Option<&[u8]>) -> Api {
        let agent: ureq::Agent = agent_builder(ca_pem)
            .timeout_global(Some(std::time::Duration::from_secs(60)))
            .build()
            .into();
        // The base URL, also when given as the API's `/v1` root (as the demo once
        // printed it): every path the CLI asks starts with `/v1` itself.
        let base = base.trim_end_matches('/');
        let base = base.strip_suffix("/v1").unwrap_or(base);
        Api {
            base: base.to_string(),
            token: token.to_string(),
            agent,
            ca: ca_pem.map(<[u8]>::to_vec),
            stale: false,
        }
    }

    /// The CA this client trusts (PEM), if one was given.
    pub fn ca(&self) -> Option<&[u8]> {
        self.ca.as_deref()
    }

    fn finish(
        &self,
        what: &str,
        response: Result<ureq::http::Response<ureq::Body>, ureq::Error>,
    ) -> Result<Value> {
        Ok(self.finish_listed(what, response)?.value)
    }

    /// As `finish`, keeping what a paged list's answer says besides its items.
    fn finish_listed(
        &self,
        what: &str,
        response: Result<ureq::http::Response<ureq::Body>, ureq::Error>,
    ) -> Result<Answer> {
        let mut response = response.map_err(|error| self.explain(what, error))?;
        let status = response.status().as_u16();
        let header = |name: &str| {
            response
                .headers()
                .get(name)
                .and_then(|v| v.to_str().ok())
                .map(str::to_string)
        };
        if header("x-nephele-stale").as_deref() == Some("true") {
            let age = header("x-nephele-copy-age-ms").unwrap_or_else(|| "?".into());
            let why = header("x-nephele-stale-reason")
                .map(|why| format!(" ({why})"))
                .unwrap_or_default();
            eprintln!(
                "note: answered from a standby's copy of the store, {age} ms old, without live state{why}"
            );
        }
        let next = header("link").as_deref().and_then(next_link);
        let total = header("x-total-count").and_then(|t| t.parse().ok());
        let text = response.body_mut().read_to_string().unwrap_or_default();
        let value: Value = if text.is_empty() {
            Value::Null
        } else {
            serde_json::from_str(&text).unwrap_or(Value::String(text))
        };
        if status >= 400 {
            // Every error of the API is a problem document; anything else (a proxy's
            // page) is shown as it came.
            let (message, field) =
                match serde_json::from_value::<nephele_api::Problem>(value.clone()) {
                    Ok(problem) => (problem.detail, problem.field),
                    Err(_) => (value.to_string(), None),
                };
            let field = field
                .filter(|field| !message.contains(field.as_str()))
                .map(|field| format!(" (field: {field})"))
                .unwrap_or_default();
            bail!("{what} failed ({status}): {message}{field}");
        }
        Ok(Answer { value, next, total })
    }

    /// Up to `wanted` items of the list at `path` (which may carry its own query), read
    /// `chunk` at a time (`?limit=`) by following each page's `Link: rel="next"`, as
    /// `kubectl` reads in chunks: each request costs the control plane a page, not the
    /// whole fleet. A server that answers the list whole (a standby's copy) is taken as
    /// it comes.
    pub fn list_as<T: serde::de::DeserializeOwned>(
        &self,
        path: &str,
        chunk: usize,
        wanted: usize,
    ) -> Result<Listing<T>> {
        let chunk = chunk.clamp(1, 1000).min(wanted.max(1));
        let separator = if path.contains('?') { '&' } else { '?' };
        let mut next = Some(format!("{path}{separator}limit={chunk}"));
        let mut listing = Listing {
            items: Vec::new(),
            total: None,
        };
        while let Some(page) = next.take() {
            if listing.items.len() >= wanted {
                break;
            }
            let what = format!("GET {page}");
            let answer = self.finish_listed(&what, self.get_response(&page))?;
            let items: Vec<T> = typed(&what, answer.value)?;
            listing.total = answer.total.or(listing.total);
            next = answer.next;
            listing.items.extend(items);
        }
        listing.items.truncate(wanted);
        Ok(listing)
    }

    /// GETs `path` as the API's type `T` (`nephele_api`).
    pub fn get_as<T: serde::de::DeserializeOwned>(&self, path: &str) -> Result<T> {
        typed(&format!("GET {path}"), self.get(path)?)
    }

    /// POSTs `body` to `path`, reading the answer as `T`.
    pub fn post_as<T: serde::de::DeserializeOwned>(
        &self,
        path: &str,
        body: &impl serde::Serialize,
    ) -> Result<T> {
        let body = serde_json::to_value(body).context("encode the request")?;
        typed(&format!("POST {path}"), self.post(path, &body)?)
    }

    /// PUTs `body` to `path`, reading the answer as `T`.
    pub fn put_as<T: serde::de::DeserializeOwned>(
        &self,
        path: &str,
        body: &impl serde::Serialize,
    ) -> Result<T> {
        let body = serde_json::to_value(body).context("encode the request")?;
        typed(&format!("PUT {path}"), self.put_json(path, &body)?)
    }

    /// DELETEs `path`, reading the answer as `T`.
    pub fn delete_as<T: serde::de::DeserializeOwned>(&self, path: &str) -> Result<T> {
        typed(&format!("DELETE {path}"), self.delete(path)?)
    }

    /// A failed request said as what it was: a URL that is not one, or a server that
    /// could not be reached (only then is the network to blame).
    fn explain(&self, what: &str, error: ureq::Error) -> anyhow::Error {
        let said = error.to_string();
        // rustls' verdicts come through as IO errors.
        let tls = matches!(error, ureq::Error::Rustls(_) | ureq::Error::Tls(_))
            || said.contains("peer certificate")
            || said.contains("certificate")
            || said.contains("handshake");
        if said.contains("InvalidContentType") && self.base.starts_with("https://") {
            return anyhow::anyhow!(
                "the API at {} did not answer TLS ({what}: {error}); if it is served as plain HTTP (nephele-cloud --plain-http), use http://",
                self.base
            );
        }
        if tls && self.base.starts_with("https://") {
            return anyhow::anyhow!(
                "the API at {} did not pass the TLS check ({what}: {error}); trust the control plane's cluster CA with --ca FILE (NEPHELE_CA; it is <data-dir>/ca.pem there), or save it in a context with nephele login --ca FILE",
                self.base
            );
        }
        if matches!(error, ureq::Error::Protocol(_)) && self.base.starts_with("http://") {
            return anyhow::anyhow!(
                "the API at {} did not answer plain HTTP ({what}: {error}); nephele-cloud serves HTTPS unless started with --plain-http: use https://… and --ca FILE",
                self.base
            );
        }
        match error {
            ureq::Error::BadUri(_) | ureq::Error::Http(_) => anyhow::anyhow!(
                "--api {:?} is not a URL the CLI can use ({error}); give the API's base URL, such as https://127.0.0.1:8080",
                self.base
            ),
            ureq::Error::Rustls(_) | ureq::Error::Tls(_) => anyhow::anyhow!(
                "the API at {} did not pass the TLS check ({what}: {error}); an API served as plain HTTP (--plain-http) is reached with http://",
                self.base
            ),
            ureq::Error::Io(_)
            | ureq::Error::HostNotFound
            | ureq::Error::ConnectionFailed
            | ureq::Error::Timeout(_) => anyhow::anyhow!(
                "cannot reach the API at {} ({what}: {error}); is nephele-cloud running there? (--api or NEPHELE_API)",
                self.base
            ),
            other => anyhow::anyhow!("{what} failed: {other}"),
        }
    }

    fn auth(&self) -> String {
        format!("Bearer {}", self.token)
    }

    /// A streaming GET (no overall timeout): the response, for reading as it comes.
    pub fn stream(
        &self,
        path: &str,
        last_event_id: Option<&str>,
    ) -> Result<ureq::http::Response<ureq::Body>> {
        let agent: ureq::Agent = agent_builder(self.ca()).build().into();
        let mut request = agent
            .get(format!("{}{path}", self.base))
            .header("authorization", self.auth())
            .header("accept", "text/event-stream");
        if let Some(id) = last_event_id {
            request = request.header("last-event-id", id);
        }
        let mut response = request
            .call()
            .map_err(|error| self.explain(&format!("GET {path}"), error))?;
        if response.status().as_u16() >= 400 {
            let text = response.body_mut().read_to_string().unwrap_or_default();
            let value: Value = serde_json::from_str(&text).unwrap_or(Value::String(text));
            bail!(
                "GET {path} failed ({}): {}",
                response.status().as_u16(),
                value["detail"].as_str().unwrap_or(&value.to_string())
            );
        }
        Ok(response)
    }

    pub fn get(&self, path: &str) -> Result<Value> {
        self.finish(&format!("GET {path}"), self.get_response(path))
    }

    fn get_response(&self, path: &str) -> Result<ureq::http::Response<ureq::Body>, ureq::Error> {
        let query = match (self.stale, path.contains('?')) {
            (false, _) => "",
            (true, false) => "?stale",
            (true, true) => "&stale",
        };
        self.agent
            .get(format!("{}{path}{query}", self.base))
            .header("authorization", self.auth())
            .call()
    }

    pub fn post(&self, path: &str, body: &Value) -> Result<Value> {
        let response = self
            .agent
            .post(format!("{}{path}", self.base))
            .header("authorization", self.auth())
            .send_json(body);
        self.finish(&format!("POST {path}"), response)
    }

    pub fn put_json(&self, path: &str, body: &Value) -> Result<Value> {
        let response = self
            .agent
            .put(format!("{}{path}", self.base))
            .header("authorization", self.auth())
            .send_json(body);
        self.finish(&format!("PUT {path}"), response)
    }

    /// PUTs a file as the body, streamed from disk with an upload bar (see
    /// [`crate::upload`]), with no overall timeout: a large model over a slow link
    /// takes what it takes (each read and write still times out).
    pub fn put_file(&self, path: &str, upload: crate::upload::Upload) -> Result<Value> {
        let agent: ureq::Agent = agent_builder(self.ca())
            .timeout_connect(Some(std::time::Duration::from_secs(10)))
            .timeout_recv_response(Some(std::time::Duration::from_secs(300)))
            .build()
            .into();
        let response = agent
            .put(format!("{}{path}", self.base))
            .header("authorization", self.auth())
            .header("content-type", "application/octet-stream")
            .header("content-length", upload.len().to_string())
            .send(ureq::SendBody::from_owned_reader(upload));
        self.finish(&format!("PUT {path}"), response)
    }

    pub fn delete(&self, path: &str) -> Result<Value> {
        let response = self
            .agent
            .delete(format!("{}{path}", self.base))
            .header("authorization", self.auth())
            .call();
        self.finish(&format!("DELETE {path}"), response)
    }
}

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

/// How a long list is read and how much of it is shown.
#[derive(Debug, Clone, clap::Args)]
pub struct ListArgs {
    /// Show at most this many (the first, in key order); the table then says how many
    /// the whole list holds.
    #[arg(long, value_name = "N")]
    pub limit: Option<usize>,
    /// Items asked per request (1 to 1000): a fleet of 10,000 is read in pages, each
    /// costing the control plane a page rather than the whole list.
    #[arg(long, value_name = "N", default_value_t = 500,
          value_parser = clap::value_parser!(u16).range(1..=1000).map(usize::from))]
    pub chunk_size: usize,
}

impl ListArgs {
    /// The items of the list at `path`, as these arguments ask.
    pub fn read<T: serde::de::DeserializeOwned>(
        &self,
        api: &Api,
        path: &str,
    ) -> Result<Listing<T>> {
        api.list_as(path, self.chunk_size, self.limit.unwrap_or(usize::MAX))
    }
}

#[derive(Debug, Clone, clap::Subcommand)]
pub enum DeviceCommand {
    /// Every enrolled device: role, region, profile, health, address, memory (read a
    /// page at a time, in name order).
    List {
        #[command(flatten)]
        list: ListArgs,
    },
    /// Remove a device; its certificate stops working at once.
    Delete { name: String },
    /// What a device reported serving, per deployment (each usage record counted once,
    /// also what it served while the control plane was unreachable).
    Usage { name: String },
}

#[derive(Debug, Clone, clap::Subcommand)]
pub enum ModelCommand {
    /// Upload an ONNX file, or a BERT sentence encoder for candle (`--bert-sequence`).
    /// The control plane derives its variants (int8 weights, head/tail splits for ONNX)
    /// and checks each against the full model on the validation rows.
    Push {
        name: String,
        /// The ONNX file; with `--bert-sequence`, a directory with `model.safetensors`
        /// and `config.json` (a Hugging Face BERT checkpoint).
        file: std::path::PathBuf,
        /// Push FILE as a BERT encoder run by candle, taking rows of this many token ids.
        #[arg(long, value_name = "TOKENS")]
        bert_sequence: Option<usize>,
        /// JSON with the rows to check variants on: `{"rows" or "features": [[...]],
        /// "labels": [...]}` (labels optional), or for a model with named typed inputs
        /// `{"typed_rows": [{NAME: {"dtype", "shape", "data"}}, ...]}`. Without it,
        /// synthetic rows are used, which measures agreement but not accuracy.
        #[arg(long)]
        validation: Option<std::path::PathBuf>,
        /// Shape, type or fixed value of an input, applied to the file by the control
        /// plane (repeatable): `x=N,3,48,320` (sizes, or names for symbolic dimensions),
        /// `ids=1,S..512:i64` (a name with the largest size a request may give),
        /// `bytes=1,2048:i32`, `sr=scalar:i64=16000` (folded in as a constant).
        #[arg(long = "input", value_name = "NAME=DIMS[:DTYPE][=VALUE]")]
        inputs: Vec<String>,
        /// A recurrent state of the model (repeatable): what OUTPUT returns is fed back
        /// as INPUT on the same session's next request, kept on the device, so a
        /// streaming client sends only its new chunk (`--state state=stateN`).
        #[arg(long = "state", value_name = "INPUT=OUTPUT")]
        state: Vec<String>,
        /// What a variant's outputs must keep of full's to ship (repeatable, per output
        /// with `OUTPUT=`): `cosine:0.99` (the default), `argmax` (the same class at 99%
        /// of positions), `topk:5`, `detections:score=0.5,axis=1,from=4` (the same
        /// candidates above the score, with the same class, on 99% of rows).
        #[arg(long = "accept", value_name = "[OUTPUT=]RULE")]
        accept: Vec<String>,
        /// Return once uploaded, while the variants are still being built (see `model get`).
        #[arg(long)]
        no_wait: bool,
    },
    /// One model: its state (`building`, `ready`, `failed`), build progress and variants.
    Get {
        name: String,
    },
    List,
    /// Inspect an ONNX file locally, before any push: inputs, outputs, types, symbolic
    /// dimensions, opsets, operators, whether this version of nephele loads it, and the
    /// `--input` flags that would make it load.
    Inspect {
        file: std::path::PathBuf,
        /// As for `push`: check the file as it would load with these applied.
        #[arg(long = "input", value_name = "NAME=DIMS[:DTYPE][=VALUE]")]
        inputs: Vec<String>,
    },
}

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

pub(crate) fn print(json: bool, value: &Value, table: impl FnOnce(&Value)) {
    if json && crate::output::yaml() {
        print!("{}", crate::output::to_yaml(value));
    } else if json {
        println!(
            "{}",
            serde_json::to_string_pretty(value).unwrap_or_default()
        );
    } else {
        table(value);
    }
}

/// An answer read as the API's type `T`; one that is not a `T` means this CLI and the
/// control plane speak different versions of the API.
/// An answer's body, with what a paged list's answer says besides its items.
struct Answer {
    value: Value,
    /// The next page's path and query (`Link: <…>; rel="next"`), absent on the last.
    next: Option<String>,
    /// The whole list's size (`X-Total-Count`).
    total: Option<usize>,
}

/// What [`Api::list_as`] read: the items, and how many the whole list holds when the
/// server said.
pub struct Listing<T> {
    pub items: Vec<T>,
    pub total: Option<usize>,
}

impl<T> Listing<T> {
    /// A line saying the table shows part of the list, when it does.
    pub fn left_out(&self, noun: &str) -> Option<String> {
        self.total
            .filter(|total| *total > self.items.len())
            .map(|total| {
                format!(
                    "{} of {total} {noun} shown; --limit N shows more",
                    self.items.len()
                )
            })
    }
}

/// The target of a `Link` header's `rel="next"` entry.
fn next_link(link: &str) -> Option<String> {
    link.split(',').find_map(|entry| {
        let (target, params) = entry.trim().split_once(';')?;
        params
            .split(';')
            .any(|p| p.trim() == "rel=\"next\"")
            .then(|| {
                target
                    .trim()
                    .strip_prefix('<')?
                    .strip_suffix('>')
                    .map(str::to_string)
            })
            .flatten()
    })
}

pub(crate) fn typed<T: serde::de::DeserializeOwned>(what: &str, value: Value) -> Result<T> {
    serde_json::from_value(value).with_context(|| {
        format!("{what}: the answer is not what this version of nephele expects; use a CLI of the control plane's version")
    })
}

/// Prints a typed answer: JSON or YAML when asked (exactly the API's document), else
/// the table.
pub(crate) fn show<T: serde::Serialize>(json: bool, view: &T, table: impl FnOnce(&T)) {
    if json {
        let value = serde_json::to_value(view).unwrap_or(Value::Null);
        print(json, &value, |_| {});
    } else {
        table(view);
    }
}

/// `-` for nothing, the text otherwise.
pub(crate) fn text(value: Option<&str>) -> String {
    value.map_or_else(|| "-".to_string(), str::to_string)
}

/// A number (or anything) as the API's JSON writes it (`1.0`, not `1`), `-` for none.
pub(crate) fn num<T: serde::Serialize>(value: Option<T>) -> String {
    match value.map(|v| serde_json::to_value(v).unwrap_or(Value::Null)) {
        None | Some(Value::Null) => "-".into(),
        Some(Value::String(text)) => text,
        Some(other) => other.to_string(),
    }
}

pub(crate) fn s(value: &Value, key: &str) -> String {
    match value.get(key) {
        Some(Value::String(text)) => text.clone(),
        Some(Value::Null) | None => "-".into(),
        Some(other) => other.to_string(),
    }
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
                    let labels = if d.labels.is_empty() {
                        "-".to_string()
                    } else {
                        d.labels
                            .iter()
                            .map(|(k, v)| format!("{k}={v}"))
                            .collect::<Vec<_>>()
                            .join(",")
                    };
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

/// The JSON upload: the model in base64 and the validation rows.
pub fn upload_body(model: &[u8], validation: &std::path::Path) -> Result<Value> {
    use base64::Engine as _;
    let text = std::fs::read_to_string(validation)
        .with_context(|| format!("cannot read {}", validation.display()))?;
    let value: Value = serde_json::from_str(&text)
        .with_context(|| format!("{} is not JSON", validation.display()))?;
    // A model with named typed inputs takes requests as rows.
    if let Some(typed) = value.get("typed_rows") {
        return Ok(serde_json::json!({
            "onnx_base64": base64::engine::general_purpose::STANDARD.encode(model),
            "validation": {"typed_rows": typed},
        }));
    }
    let rows = value
        .get("rows")
        .or_else(|| value.get("features"))
        .cloned()
        .with_context(|| {
            format!(
                "{} has no \"rows\" (or \"features\") array of input rows, nor \"typed_rows\" (requests of named typed tensors)",
                validation.display()
            )
        })?;
    Ok(serde_json::json!({
        "onnx_base64": base64::engine::general_purpose::STANDARD.encode(model),
        "validation": {"rows": rows, "labels": value.get("labels").cloned()},
    }))
}

/// The upload of a BERT encoder for candle: the checkpoint directory's
/// `model.safetensors` and `config.json`, the sequence length, and optional validation
/// rows of token ids.
fn bert_upload_body(
    dir: &std::path::Path,
    sequence: usize,
    validation: Option<&std::path::Path>,
) -> Result<Value> {
    use base64::Engine as _;
    let weights_path = dir.join("model.safetensors");
    let weights = std::fs::read(&weights_path).with_context(|| {
        format!(
            "cannot read {} (--bert-sequence takes a checkpoint directory)",
            weights_path.display()
        )
    })?;
    let config_path = dir.join("config.json");
    let config: Value = serde_json::from_str(
        &std::fs::read_to_string(&config_path)
            .with_context(|| format!("cannot read {}", config_path.display()))?,
    )
    .with_context(|| format!("{} is not JSON", config_path.display()))?;
    let mut body = serde_json::json!({
        "bert": {
            "safetensors_base64": base64::engine::general_purpose::STANDARD.encode(&weights),
            "config": config,
            "sequence": sequence,
        }
    });
    if let Some(validation) = validation {
        body["validation"] = upload_body(&[], validation)?["validation"].clone();
    }
    Ok(body)
}

/// The variant table of a model view.
fn print_variants(model: &ModelView) {
    println!(
        "  {:<22} {:<13} {:>9} {:>10} {:>9} {:>10}  STATUS",
        "VARIANT", "PRECISION", "BYTES", "MFLOPS", "ACCURACY", "MIN-COS"
    );
    for v in &model.variants {
        let number = |value: Option<f64>, scale: f64, digits: usize| {
            value.map_or("-".to_string(), |x| format!("{:.*}", digits, x * scale))
        };
        let status = match &v.rejected {
            Some(why) => format!("not shipped: {why}"),
            None => "shipped".into(),
        };
        println!(
            "  {:<22} {:<13} {:>9} {:>10} {:>9} {:>10}  {status}",
            v.name,
            v.precision,
            v.size,
            number(Some(v.flops as f64), 1e-6, 3),
            number(v.accuracy_pct, 1.0, 2),
            number(v.min_cosine, 1.0, 5),
        );
        if let Some(judged) = v.accepted_on.as_deref().filter(|_| v.rejected.is_none()) {
            println!("  {:<22} judged on: {judged}", "");
        }
    }
}

/// Percent-encodes a query parameter value.
fn query_value(value: &str) -> String {
    value
        .bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// Polls a model until it is no longer `building`, drawing its build progress on
/// stderr (a bar on a terminal, a line per step otherwise).
fn wait_for_model(api: &Api, name: &str, json: bool) -> Result<ModelView> {
    use std::io::{IsTerminal as _, Write as _};
    let terminal = std::io::stderr().is_terminal() && !json;
    let started = std::time::Instant::now();
    let mut last_step = String::new();
    loop {
        let model: ModelView = api.get_as(&format!("/v1/models/{name}"))?;
        if model.state != ModelState::Building {
            if terminal {
                eprintln!();
            }
            if model.state == ModelState::Failed {
                bail!(
                    "model {name}: the build failed after {:.1} s: {}",
                    started.elapsed().as_secs_f64(),
                    model.error.as_deref().unwrap_or("no reason given")
                );
            }
            return Ok(model);
        }
        let (done, total, step) = match &model.progress {
            Some(p) => (p.done, p.total, p.step.clone()),
            None => (0, 0, "loading the model".to_string()),
        };
        if terminal {
            let width = 30usize;
            let filled = (done * width).checked_div(total).unwrap_or(0);
            eprint!(
                "\r  building [{}{}] {done}/{total} {:>5.1} s  {:<60.60}",
                "#".repeat(filled),
                ".".repeat(width - filled.min(width)),
                started.elapsed().as_secs_f64(),
                step
            );
            let _ = std::io::stderr().flush();
        } else if step != last_step && !json {
            eprintln!(
                "  building {done}/{total} ({:.1} s): {step}",
                started.elapsed().as_secs_f64()
            );
        }
        last_step = step;
        std::thread::sleep(std::time::Duration::from_millis(250));
    }
}

fn print_model(v: &ModelView) {
    println!(
        "model {} ({}) {}: sha256 {} ({} bytes){}; variants checked on {}",
        v.reference,
        v.format,
        num(Some(v.state)),
        v.sha256,
        v.size,
        if v.input_specs.is_empty() {
            String::new()
        } else {
            format!("; inputs {}", v.input_specs.join(" "))
        },
        v.validation
    );
    if let Some(error) = &v.error {
        println!("  failed: {error}");
    }
    let state: Vec<String> = v
        .recurrent_state
        .iter()
        .map(|b| format!("{}={}", b.input, b.output))
        .collect();
    if !state.is_empty() {
        println!("  state kept per session on devices: {}", state.join(" "));
    }
    print_variants(v);
}

fn print_inspection(v: &Value) {
    println!(
        "{} bytes, producer {}, opsets {}",
        s(v, "file_bytes"),
        s(v, "producer"),
        v["opsets"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|o| o.as_str())
            .collect::<Vec<_>>()
            .join(", ")
    );
    for (title, key) in [("INPUT", "inputs"), ("OUTPUT", "outputs")] {
        println!("  {title:<8} {:<32} {:<8} SHAPE", "NAME", "TYPE");
        for t in v[key].as_array().into_iter().flatten() {
            let dims: Vec<String> = t["dims"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|d| d.as_str().unwrap_or("?").to_string())
                .collect();
            println!(
                "  {:<8} {:<32} {:<8} [{}]",
                "",
                s(t, "name"),
                s(t, "dtype"),
                dims.join(", ")
            );
        }
    }
    let operators: Vec<String> = v["operators"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|o| format!("{}×{}", o[0].as_str().unwrap_or("?"), o[1]))
        .collect();
    println!("  {} nodes: {}", s(v, "nodes"), operators.join(" "));
    let features: Vec<String> = v["agent_features"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|f| {
            format!(
                "`{}` ({})",
                f[0].as_str().unwrap_or("?"),
                f[1].as_str().unwrap_or("?")
            )
        })
        .collect();
    if !features.is_empty() {
        println!(
            "  agents need: {} (not in the agent as it ships, which refuses such a model: build it with --features NAME, or --features full)",
            features.join(", ")
        );
    }
    let ifs = v["ifs_in_file"].as_u64().unwrap_or(0);
    if ifs > 0 {
        let left = v["ifs_left"].as_u64().unwrap_or(ifs);
        println!(
            "  control flow: {ifs} If node(s); {} decided by the given shapes and constants and folded, {left} left",
            ifs.saturating_sub(left)
        );
    }
    match v["load_error"].as_str() {
        None => println!("  loads in nephele: yes, served {}", s(v, "serving")),
        Some(error) => println!("  loads in nephele: no: {error}"),
    }
    for line in v["advice"].as_array().into_iter().flatten() {
        println!("  to do: {}", line.as_str().unwrap_or(""));
    }
}

pub fn model(args: ApiArgs, command: ModelCommand) -> Result<()> {
    let api = args.client()?;
    match command {
        ModelCommand::Push {
            name,
            file,
            bert_sequence,
            validation,
            inputs,
            state,
            accept,
            no_wait,
        } => {
            // Checked here first, so a typo costs no upload.
            nephele_domain::validate_name("model", &name).map_err(anyhow::Error::msg)?;
            for text in &inputs {
                text.parse::<nephele_runtime::input_spec::InputSpec>()
                    .map_err(anyhow::Error::msg)?;
            }
            for text in &accept {
                text.parse::<nephele_runtime::acceptance::Accept>()
                    .map_err(|e| anyhow::anyhow!("--accept: {e}"))?;
            }
            for text in &state {
                if text.split_once('=').is_none_or(|(i, o)| {
                    i.trim().is_empty() || o.trim().is_empty() || o.contains('=')
                }) {
                    anyhow::bail!(
                        "--state {text}: give INPUT=OUTPUT, the model input that takes the state and the output that returns the next one (e.g. --state state=stateN)"
                    );
                }
            }
            let query: Vec<String> = inputs
                .iter()
                .map(|t| format!("input={}", query_value(t)))
                .chain(state.iter().map(|t| format!("state={}", query_value(t))))
                .chain(accept.iter().map(|t| format!("accept={}", query_value(t))))
                .collect();
            let path = if query.is_empty() {
                format!("/v1/models/{name}")
            } else {
                format!("/v1/models/{name}?{}", query.join("&"))
            };
            let answer = match (bert_sequence, validation) {
                (Some(sequence), validation) => {
                    let body = bert_upload_body(&file, sequence, validation.as_deref())?;
                    api.put_json(&path, &body)?
                }
                (None, Some(validation)) => {
                    let bytes = std::fs::read(&file)
                        .with_context(|| format!("cannot read {}", file.display()))?;
                    let body = upload_body(&bytes, &validation)?;
                    api.put_json(&path, &body)?
                }
                (None, None) => {
                    let upload = crate::upload::Upload::open(&file, &name, args.json)?;
                    api.put_file(&path, upload)?
                }
            };
            let model: ModelView = typed(&format!("PUT {path}"), answer)?;
            let model = if model.state == ModelState::Building && !no_wait {
                if !args.json {
                    eprintln!(
                        "model {name} uploaded ({} bytes); building its variants",
                        model.size
                    );
                }
                // This push's version, not the name's latest: another push of the
                // name may finish first.
                wait_for_model(&api, &model.reference, args.json)?
            } else {
                model
            };
            show(args.json, &model, print_model);
        }
        ModelCommand::Get { name } => {
            let model: ModelView = api.get_as(&format!("/v1/models/{name}"))?;
            show(args.json, &model, print_model);
        }
        ModelCommand::Inspect { file, inputs } => {
            let specs = inputs
                .iter()
                .map(|t| t.parse().map_err(anyhow::Error::msg))
                .collect::<Result<Vec<nephele_runtime::input_spec::InputSpec>>>()?;
            let bytes =
                std::fs::read(&file).with_context(|| format!("cannot read {}", file.display()))?;
            let name = file
                .file_stem()
                .map(|s| s.to_string_lossy().to_string())
                .unwrap_or_else(|| "model".into());
            let report = nephele_runtime::input_spec::inspect(&name, &bytes, &specs)
                .map_err(|e| anyhow::anyhow!("{e}; is {} an ONNX file?", file.display()))?;
            let value = serde_json::to_value(&report)?;
            print(args.json, &value, print_inspection);
        }
        ModelCommand::List => {
            let models: Vec<ModelView> = api.get_as("/v1/models")?;
            show(args.json, &models, |models| {
                println!(
                    "{:<34} {:<17} {:>10} SHA256",
                    "MODEL:VERSION", "FORMAT", "BYTES"
                );
                for m in models {
                    println!(
                        "{:<34} {:<17} {:>10} {}",
                        m.reference, m.format, m.size, m.sha256
                    );
                    print_variants(m);
                }
            });
        }
    }
    Ok(())
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
        let not_ready: Vec<String> = d
            .device_phases
            .iter()
            .flatten()
            .filter(|(phase, n)| phase.as_str() != "ready" && **n > 0)
            .map(|(phase, n)| format!("{n} {phase}"))
            .collect();
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
            if not_ready.is_empty() {
                "-".to_string()
            } else {
                not_ready.join(", ")
            },
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
                    // The autoscaler's decision is its own document (`nephele_autoscale`).
                    let decision = r
                        .autoscaler
                        .as_ref()
                        .and_then(|a| a.get("decision"))
                        .filter(|d| !d.is_null());
                    if let Some(d) = decision {
                        println!(
                            "  autoscaler: {} mode, {} warm; {}",
                            s(d, "mode"),
                            s(d, "warm"),
                            s(d, "reason")
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

// Parsed once per invocation from the command line; boxing the big variant would only
// make the clap derive harder to read.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, clap::Subcommand)]
pub enum JobCommand {
    /// Queue a job (one pod, or a gang of `--members` identical pods placed all or none)
    /// in a region's scheduler; prints where it went or why it waits.
    Submit {
        name: String,
        /// Region to queue in; `auto` lets the control plane choose by carbon, price
        /// and free capacity.
        #[arg(long)]
        region: Option<String>,
        /// Tenant to charge (admins only; default: the token's tenant).
        #[arg(long)]
        tenant: Option<String>,
        /// Finish within this long (`90m`, `8h`, `2d`) or by this unix second: the job
        /// may wait for a lower-carbon hour (needs --runtime).
        #[arg(long)]
        deadline: Option<String>,
        /// `best-effort`, `batch`, `production`, `system` or a number.
        #[arg(long, default_value = "batch")]
        priority: String,
        #[arg(long, default_value_t = 1)]
        members: u16,
        /// Per member.
        #[arg(long, default_value_t = 0)]
        gpus: u8,
        /// Share of one GPU in milli-GPU (with --gpus 1).
        #[arg(long)]
        gpu_milli: Option<u32>,
        /// Acceptable GPU model, e.g. "NVIDIA L4" (repeat for several).
        #[arg(long = "gpu-model")]
        gpu_models: Vec<String>,
        /// One MIG slice of this profile instead of GPUs, e.g. 1g.10gb.
        #[arg(long)]
        mig_profile: Option<String>,
        #[arg(long, default_value_t = 1000)]
        cpu_milli: u64,
        #[arg(long, default_value_t = 1024)]
        memory_mib: u64,
        /// `any`, `same-node` or `prefer-same-node`.
        #[arg(long, default_value = "any")]
        topology: String,
        /// Expected runtime in seconds (lets backfilling use the gap before a reservation).
        #[arg(long)]
        runtime: Option<u64>,
        /// Never preempt it (default: preemptible below `production`).
        #[arg(long)]
        no_preempt: bool,
        /// May run on spot capacity.
        #[arg(long)]
        spot_ok: bool,
        /// Required node label, `key=value` (repeat for several).
        #[arg(long = "selector")]
        selectors: Vec<String>,
        /// Environment of every member, `KEY=VALUE` (repeat for several).
        #[arg(long = "env")]
        env: Vec<String>,
        /// Working directory of every member on its node.
        #[arg(long)]
        workdir: Option<String>,
        /// Times a failed attempt is retried (default 3).
        #[arg(long)]
        retries: Option<u32>,
        /// The program each member runs and its arguments, after `--`
        /// (e.g. `-- python3 train.py --epochs 3`). Without it the job only holds
        /// its resources.
        #[arg(last = true)]
        command: Vec<String>,
    },
    /// A member's output (stdout and stderr as they came), from its pool node.
    Logs {
        name: String,
        /// Which member (its RANK).
        #[arg(long, default_value_t = 0)]
        member: u16,
        /// Which attempt (default: the current one).
        #[arg(long)]
        attempt: Option<u32>,
        /// Keep printing as the member writes, until it exits.
        #[arg(long, short = 'f')]
        follow: bool,
        #[arg(long)]
        region: Option<String>,
        #[arg(long)]
        tenant: Option<String>,
    },
    /// Jobs with their state and nodes.
    List {
        #[arg(long)]
        region: Option<String>,
        #[arg(long)]
        tenant: Option<String>,
        /// Only the jobs in this state.
        #[arg(long, value_parser = nephele_cloud::api::JOB_STATES)]
        state: Option<String>,
        #[command(flatten)]
        list: ListArgs,
    },
    /// One job: placement, or why it is not placed.
    Get {
        name: String,
        #[arg(long)]
        region: Option<String>,
        #[arg(long)]
        tenant: Option<String>,
    },
    /// Cancel or end a job; its resources go back at once.
    Delete {
        name: String,
        #[arg(long)]
        region: Option<String>,
        #[arg(long)]
        tenant: Option<String>,
    },
}

fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// `90m`, `8h`, `2d` (from `now`) or a unix second.
fn parse_deadline(text: &str, now: u64) -> Result<u64> {
    let text = text.trim();
    let (number, unit) = text.split_at(
        text.find(|c: char| !c.is_ascii_digit())
            .unwrap_or(text.len()),
    );
    let value: u64 = number
        .parse()
        .with_context(|| format!("--deadline {text:?}: expected 90m, 8h, 2d or a unix second"))?;
    let seconds = match unit {
        "" => return Ok(value),
        "s" => value,
        "m" => value * 60,
        "h" => value * 3600,
        "d" => value * 86_400,
        _ => bail!("--deadline {text:?}: the unit must be s, m, h or d"),
    };
    Ok(now + seconds)
}

#[derive(Debug, Clone, clap::Subcommand)]
pub enum GridCommand {
    /// What a region's carbon decisions see: the signal and the next hours, measured or
    /// forecast.
    Show {
        region: String,
        /// Hours to list (up to 72).
        #[arg(long, default_value_t = 24)]
        hours: usize,
    },
    /// Push hourly measurements from files in the `../shared/data` format (Electricity
    /// Maps carbon intensity, GreenDCC prices), as a carbon feed would, and a
    /// carbon-intensity provider's forecast (`--forecast`).
    Push {
        region: String,
        /// A carbon-intensity file (`Carbon Intensity gCO₂eq/kWh (direct)` column).
        #[arg(long)]
        carbon: Option<std::path::PathBuf>,
        /// A price file (`Price (USD/MWh)` column).
        #[arg(long)]
        prices: Option<std::path::PathBuf>,
        /// A provider's carbon forecast: Electricity Maps' forecast JSON, the Carbon
        /// Intensity API's (GB) JSON, or a CSV as Electricity Maps exports it. Kept
        /// beside the measurements and used, while fresh, instead of the region's own
        /// forecast for the hours it covers.
        #[arg(long)]
        forecast: Option<std::path::PathBuf>,
        /// When the forecast was made (UTC, `2023-08-31T09:50Z`); default: the file's
        /// `updatedAt`, else now.
        #[arg(long)]
        issued: Option<String>,
        /// Who made the forecast (default: from the file).
        #[arg(long)]
        source: Option<String>,
        /// Replay a past series as if live: this hour of the files (UTC,
        /// `2023-07-01T12:00`) becomes the current hour, and nothing after it is sent.
        #[arg(long)]
        as_of: Option<String>,
        /// Days of history to send, ending at --as-of (or now).
        #[arg(long, default_value_t = 60)]
        days: u64,
    },
}

pub fn grid(args: ApiArgs, command: GridCommand) -> Result<()> {
    let api = args.client()?;
    match command {
        GridCommand::Show { region, hours } => {
            let grid: GridView = api.get_as(&format!("/v1/regions/{region}/grid"))?;
            show(args.json, &grid, |g| print_grid(g, hours));
        }
        GridCommand::Push {
            region,
            carbon,
            prices,
            forecast,
            issued,
            source,
            as_of,
            days,
        } => {
            if carbon.is_none() && prices.is_none() && forecast.is_none() {
                bail!("nothing to push: give --carbon FILE, --prices FILE and/or --forecast FILE");
            }
            if (issued.is_some() || source.is_some()) && forecast.is_none() {
                bail!("--issued and --source describe a --forecast FILE; give one");
            }
            let forecast = match &forecast {
                None => None,
                Some(path) => {
                    let text = std::fs::read_to_string(path)
                        .with_context(|| format!("cannot read {}", path.display()))?;
                    let read = crate::grid_forecast::parse(&path.display().to_string(), &text)?;
                    let issued_unix = match &issued {
                        Some(text) => crate::grid_forecast::parse_utc_seconds(text)
                            .with_context(|| {
                                format!("--issued {text:?}: expected a UTC time such as 2023-08-31T09:50Z")
                            })?,
                        None => read.issued_unix.unwrap_or_else(unix_now),
                    };
                    Some(GridForecastBody {
                        issued_unix,
                        source: source.clone().unwrap_or(read.source),
                        points: read
                            .hours
                            .iter()
                            .map(|(hour, carbon)| GridForecastPointBody {
                                unix: hour * 3600,
                                carbon_g_per_kwh: *carbon,
                            })
                            .collect(),
                    })
                }
            };
            let now_hour = (unix_now() / 3600) as i64;
            let anchor = match &as_of {
                Some(text) => nephele_sim::trace::parse_utc_hour(text).with_context(|| {
                    format!("--as-of {text:?}: expected a UTC time such as 2023-07-01T12:00")
                })?,
                None => now_hour,
            };
            let shift = now_hour - anchor;
            let first = anchor - days.max(1) as i64 * 24 + 1;
            let mut hours: std::collections::BTreeMap<i64, (Option<f64>, Option<f64>)> =
                Default::default();
            for path in carbon.iter().chain(prices.iter()) {
                let (kind, series) = nephele_sim::trace::load_grid_file(path)?;
                let span = (
                    series.start_hour,
                    series.start_hour + series.values.len() as i64 - 1,
                );
                let mut used = 0;
                for (i, value) in series.values.iter().enumerate() {
                    let hour = series.start_hour + i as i64;
                    if hour < first || hour > anchor {
                        continue;
                    }
                    let entry = hours.entry(hour + shift).or_default();
                    match kind {
                        nephele_sim::trace::GridColumn::Carbon => entry.0 = Some(*value),
                        nephele_sim::trace::GridColumn::Price => entry.1 = Some(*value),
                    }
                    used += 1;
                }
                if used == 0 {
                    bail!(
                        "{} covers {} … {} UTC, none of it in the {days} days up to {} UTC; to replay it as if live, pass --as-of with a time inside it",
                        path.display(),
                        nephele_sim::trace::format_utc_hour(span.0),
                        nephele_sim::trace::format_utc_hour(span.1),
                        nephele_sim::trace::format_utc_hour(anchor)
                    );
                }
            }
            let points: Vec<GridPointBody> = hours
                .iter()
                .filter(|(hour, _)| **hour >= 0)
                .map(|(hour, (carbon, price))| GridPointBody {
                    unix: *hour as u64 * 3600,
                    carbon_g_per_kwh: *carbon,
                    price_per_mwh: *price,
                })
                .collect();
            let sent = points.len();
            let body = GridPushBody { points, forecast };
            let pushed: GridPushView = api.put_as(&format!("/v1/regions/{region}/grid"), &body)?;
            show(args.json, &pushed, |v| {
                if sent > 0 {
                    println!(
                        "region {region}: sent {sent} hours ({} … {} UTC of the files{}), kept {}, {} older than the 90 days a region keeps",
                        nephele_sim::trace::format_utc_hour(first),
                        nephele_sim::trace::format_utc_hour(anchor),
                        if shift != 0 { ", replayed as the hours up to now" } else { "" },
                        v.kept,
                        v.too_old
                    );
                }
                if let Some(hours) = v.forecast_hours {
                    println!(
                        "region {region}: provider forecast of {hours} hours stored{}",
                        match v.replaced_forecast_issued_unix {
                            Some(issued) => format!(", replacing the one issued {}", utc(issued)),
                            None => String::new(),
                        }
                    );
                }
                print_grid(&v.grid, 12);
            });
        }
    }
    Ok(())
}

fn print_grid(v: &GridView, hours: usize) {
    println!(
        "grid of region {} (zone {}): signal {}, {} hours measured, newest {}, {} deferred job(s)",
        v.region,
        text(v.carbon_zone.as_deref()),
        v.signal,
        v.measured_hours,
        v.latest_measured_unix.map_or("-".into(), utc),
        v.deferred_jobs
    );
    if let Some(note) = &v.note {
        println!("  {note}");
    }
    if let Some(f) = &v.forecast {
        println!(
            "  provider forecast: {} issued {}, {} hours ({} … {}), {}",
            f.source,
            utc(f.issued_unix),
            f.hours,
            utc(f.first_unix),
            utc(f.last_unix),
            if f.fresh {
                "used for the hours it covers"
            } else {
                "stale (over 12 h old): not used"
            }
        );
    }
    if v.outlook.is_empty() {
        return;
    }
    println!(
        "  {:<20} {:>12} {:<9} {:>10}",
        "HOUR", "gCO2eq/kWh", "", "PRICE/MWh"
    );
    for hour in v.outlook.iter().take(hours.clamp(1, 72)) {
        println!(
            "  {:<20} {:>12.1} {:<9} {:>10}",
            utc(hour.unix),
            hour.carbon_g_per_kwh,
            match hour.source.as_str() {
                "measured" => "measured",
                "provider" => "provider",
                _ => "forecast",
            },
            hour.price_per_mwh.map_or("-".into(), |p| format!("{p:.1}"))
        );
    }
    if let Some(best) = v
        .outlook
        .iter()
        .filter(|h| h.carbon_g_per_kwh.is_finite())
        .min_by(|a, b| a.carbon_g_per_kwh.total_cmp(&b.carbon_g_per_kwh))
    {
        println!(
            "  greenest hour in the next {}: {} at {:.1} g/kWh",
            v.outlook.len(),
            utc(best.unix),
            best.carbon_g_per_kwh
        );
    }
}

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

fn query(region: &Option<String>, tenant: &Option<String>) -> String {
    let mut parts = Vec::new();
    if let Some(region) = region {
        parts.push(format!("region={region}"));
    }
    if let Some(tenant) = tenant {
        parts.push(format!("tenant={tenant}"));
    }
    if parts.is_empty() {
        String::new()
    } else {
        format!("?{}", parts.join("&"))
    }
}

fn job_nodes(job: &JobView) -> String {
    let nodes: Vec<String> = job
        .placement
        .iter()
        .map(|m| {
            let gpus: Vec<String> = m
                .gpus
                .iter()
                .map(|g| {
                    if g.milli == 1000 {
                        g.gpu.to_string()
                    } else {
                        format!("{}:{}m", g.gpu, g.milli)
                    }
                })
                .collect();
            if gpus.is_empty() {
                m.node.clone()
            } else {
                format!("{}[{}]", m.node, gpus.join(","))
            }
        })
        .collect();
    if nodes.is_empty() {
        "-".into()
    } else {
        nodes.join(" ")
    }
}

/// `YYYY-MM-DD HH:00 UTC` of a unix second.
fn utc(unix: u64) -> String {
    format!(
        "{} UTC",
        nephele_sim::trace::format_utc_hour((unix / 3600) as i64)
    )
}

fn print_carbon_plan(job: &JobView) {
    if let Some(plan) = &job.deferral {
        println!(
            "  carbon: {} (deadline {}, starts by {} at the latest)",
            plan.reason,
            utc(plan.deadline_unix),
            utc(plan.latest_start_unix)
        );
        if let (Some(then), Some(now)) = (plan.carbon_at_submit, plan.carbon_now) {
            if plan.state == "released" {
                println!(
                    "  carbon: {now:.0} g/kWh at release against {then:.0} had it started on submission ({:+.1}%)",
                    (now - then) / then.max(1e-9) * 100.0
                );
            }
        }
    }
    if let Some(choice) = &job.region_choice {
        println!("  region: {} ({})", choice.chosen, choice.reason);
        for c in &choice.candidates {
            let carbon = c
                .carbon_g_per_kwh
                .map_or("-".into(), |v| format!("{v:.0} g/kWh"));
            let price = c
                .price_per_mwh
                .map_or("-".into(), |v| format!("{v:.1}/MWh"));
            let verdict = match (c.score, &c.excluded) {
                (Some(score), _) => format!("score {score:.2}"),
                (None, Some(why)) => format!("excluded: {why}"),
                _ => "-".into(),
            };
            println!(
                "    {:<12} {:>10} {:>10} free {:>6} {}  {verdict}",
                c.region,
                carbon,
                price,
                num(Some(c.free)),
                choice.unit
            );
        }
    }
}

fn print_job(job: &JobView) {
    println!(
        "job {}/{} in region {}: {} (priority {}, {} member(s))",
        job.tenant, job.name, job.region, job.state, job.priority, job.spec.members
    );
    print_carbon_plan(job);
    match job.state.as_str() {
        "deferred" => {}
        "pending" => {
            if let Some(why) = &job.why_pending {
                println!("  not placed: {}", why.message);
                if let Some(hint) = &why.hint {
                    println!("  hint: {hint}");
                }
            }
        }
        "backoff" => println!(
            "  attempt {} failed; runs again at {}",
            job.attempt,
            when_unix(job.retry_at_unix)
        ),
        "succeeded" | "failed" => println!("  {}", text(job.outcome.as_deref())),
        state => {
            println!("  nodes: {}", job_nodes(job));
            if state == "terminating" {
                println!(
                    "  stopping ({}); resources taken at {}",
                    match &job.preempted_by {
                        None => "drained or failed".to_string(),
                        Some(by) => format!("preempted by {by}"),
                    },
                    when_unix(job.grace_deadline_unix)
                );
            }
        }
    }
    if !job.members.is_empty() {
        println!("  attempt {}:", job.attempt);
        println!(
            "    {:<6} {:<10} {:<16} {:>8} {:>6}",
            "MEMBER", "NODE", "STATE", "PID", "EXIT"
        );
        for m in &job.members {
            let exit = match (m.exit_code, m.signal) {
                (Some(code), _) => code.to_string(),
                (_, Some(signal)) => format!("sig {signal}"),
                _ => "-".into(),
            };
            println!(
                "    {:<6} {:<10} {:<16} {:>8} {:>6}",
                m.member,
                m.node,
                m.state,
                num(m.pid),
                exit
            );
        }
    }
    if job.attempts.len() > 1 {
        println!("  attempts:");
        for a in &job.attempts {
            println!(
                "    #{:<3} started {}  {}",
                a.attempt,
                when_unix(Some(a.started_unix)),
                a.outcome.as_deref().unwrap_or("running")
            );
        }
    }
}

/// A unix second as a UTC date and time, with how long ago or from now.
/// A time as a date with its age (`2026-12-03 13:07:15 UTC (in 83 min)`), `-` for none.
pub(crate) fn when_unix(unix: Option<u64>) -> String {
    let Some(unix) = unix else {
        return "-".into();
    };
    let now = unix_now();
    let days = unix / 86_400;
    let (h, m, sec) = (unix % 86_400 / 3600, unix % 3600 / 60, unix % 60);
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    let relative = if unix > now {
        format!("in {}", span(unix - now))
    } else {
        format!("{} ago", span(now - unix))
    };
    format!("{year:04}-{month:02}-{day:02} {h:02}:{m:02}:{sec:02} UTC ({relative})")
}

fn span(seconds: u64) -> String {
    match seconds {
        0..=119 => format!("{seconds} s"),
        120..=7199 => format!("{} min", seconds / 60),
        7200..=172_799 => format!("{} h", seconds / 3600),
        _ => format!("{} d", seconds / 86_400),
    }
}

pub fn job(args: ApiArgs, command: JobCommand) -> Result<()> {
    let api = args.client()?;
    match command {
        JobCommand::Submit {
            name,
            region,
            tenant,
            deadline,
            priority,
            members,
            gpus,
            gpu_milli,
            gpu_models,
            mig_profile,
            cpu_milli,
            memory_mib,
            topology,
            runtime,
            no_preempt,
            spot_ok,
            selectors,
            env,
            workdir,
            retries,
            command,
        } => {
            let mut spec = JobSpec::named(&name);
            for pair in env {
                let (key, value) = pair
                    .split_once('=')
                    .with_context(|| format!("--env {pair:?} is not KEY=VALUE"))?;
                spec.env.insert(key.into(), value.into());
            }
            for selector in selectors {
                let (key, value) = selector
                    .split_once('=')
                    .with_context(|| format!("--selector {selector:?} is not key=value"))?;
                spec.node_selector.insert(key.into(), value.into());
            }
            spec.region = region;
            spec.tenant = tenant;
            spec.priority = Some(match priority.parse::<u32>() {
                Ok(value) => PrioritySpec::Value(value),
                Err(_) => PrioritySpec::Class(priority),
            });
            spec.members = members;
            spec.gpus = gpus;
            spec.gpu_milli = gpu_milli;
            spec.gpu_models = gpu_models;
            spec.mig_profile = mig_profile;
            spec.cpu_milli = cpu_milli;
            spec.memory_mib = memory_mib;
            spec.topology =
                serde_json::from_value(Value::String(topology.clone())).map_err(|_| {
                    anyhow::anyhow!(
                        "--topology {topology:?}: give any, same-node or prefer-same-node"
                    )
                })?;
            spec.expected_runtime_s = runtime;
            spec.spot_ok = spot_ok;
            if no_preempt {
                spec.preemptible = Some(false);
            }
            if !command.is_empty() {
                spec.command = command;
                spec.working_dir = workdir;
            } else if !spec.env.is_empty() || workdir.is_some() {
                bail!("--env and --workdir need a command after `--`");
            }
            spec.max_retries = retries;
            if let Some(deadline) = deadline {
                spec.deadline_unix = Some(parse_deadline(&deadline, unix_now())?);
            }
            let job: JobView = api.post_as("/v1/jobs", &spec)?;
            show(args.json, &job, print_job);
        }
        JobCommand::List {
            region,
            tenant,
            state,
            list,
        } => {
            let mut path = format!("/v1/jobs{}", query(&region, &tenant));
            if let Some(state) = state {
                path.push(if path.contains('?') { '&' } else { '?' });
                path.push_str(&format!("state={state}"));
            }
            let listing = list.read::<JobView>(&api, &path)?;
            show(args.json, &listing.items, |jobs| {
                println!(
                    "{:<10} {:<20} {:<10} {:<12} {:>8} {:>7}  NODES / WHY",
                    "TENANT", "NAME", "REGION", "STATE", "PRIORITY", "MEMBERS"
                );
                for j in jobs {
                    let detail = match j.state.as_str() {
                        "pending" => text(j.why_pending.as_ref().map(|w| w.message.as_str())),
                        "deferred" => text(j.deferral.as_ref().map(|d| d.reason.as_str())),
                        _ => job_nodes(j),
                    };
                    println!(
                        "{:<10} {:<20} {:<10} {:<12} {:>8} {:>7}  {}",
                        j.tenant, j.name, j.region, j.state, j.priority, j.spec.members, detail
                    );
                }
                if let Some(line) = listing.left_out("jobs") {
                    println!("{line}");
                }
            });
        }
        JobCommand::Get {
            name,
            region,
            tenant,
        } => {
            let job: JobView =
                api.get_as(&format!("/v1/jobs/{name}{}", query(&region, &tenant)))?;
            show(args.json, &job, print_job);
        }
        JobCommand::Logs {
            name,
            member,
            attempt,
            follow,
            region,
            tenant,
        } => {
            let mut offset = 0u64;
            let mut base = query(&region, &tenant);
            base.push(if base.is_empty() { '?' } else { '&' });
            base.push_str(&format!("member={member}"));
            if let Some(attempt) = attempt {
                base.push_str(&format!("&attempt={attempt}"));
            }
            loop {
                let logs: JobLogsView =
                    api.get_as(&format!("/v1/jobs/{name}/logs{base}&offset={offset}"))?;
                if args.json && !follow {
                    show(true, &logs, |_| {});
                    return Ok(());
                }
                print!("{}", logs.data);
                use std::io::Write as _;
                let _ = std::io::stdout().flush();
                offset = logs.next_offset;
                let (finished, size) = (logs.finished, logs.size);
                if offset < size {
                    continue;
                }
                if !follow || finished {
                    break;
                }
                std::thread::sleep(std::time::Duration::from_millis(500));
            }
        }
        JobCommand::Delete {
            name,
            region,
            tenant,
        } => {
            let job: JobView =
                api.delete_as(&format!("/v1/jobs/{name}{}", query(&region, &tenant)))?;
            show(args.json, &job, |j| {
                println!("deleted job {}/{} (was {})", j.tenant, j.name, j.state)
            });
        }
    }
    Ok(())
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_next_page_is_read_from_the_link_header() {
        assert_eq!(
            next_link("</v1/devices?limit=2&after=cam-1>; rel=\"next\"").as_deref(),
            Some("/v1/devices?limit=2&after=cam-1")
        );
        assert_eq!(
            next_link("</a>; rel=\"prev\", </b?after=x>; rel=\"next\"").as_deref(),
            Some("/b?after=x")
        );
        assert_eq!(next_link("</a>; rel=\"prev\""), None);
        assert_eq!(next_link("garbage"), None);
    }

    #[test]
    fn deadlines_parse_relative_or_absolute() {
        assert_eq!(parse_deadline("8h", 1000).expect("ok"), 1000 + 8 * 3600);
        assert_eq!(parse_deadline("90m", 0).expect("ok"), 5400);
        assert_eq!(parse_deadline("2d", 0).expect("ok"), 172_800);
        assert_eq!(parse_deadline("1700000000", 5).expect("ok"), 1_700_000_000);
        assert!(parse_deadline("8 hours", 0).is_err());
        assert!(parse_deadline("h", 0).is_err());
        assert!(parse_deadline("3w", 0).is_err());
    }

    #[test]
    fn the_api_url_may_be_given_with_its_v1_root() {
        for given in [
            "http://cp:8080",
            "http://cp:8080/",
            "http://cp:8080/v1",
            "http://cp:8080/v1/",
        ] {
            assert_eq!(Api::new(given, "").base, "http://cp:8080", "{given}");
        }
    }
}
