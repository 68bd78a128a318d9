//! The nephele control plane.
//!
//! `nephele-cloud` hosts the federation actor (single writer of durable state), one
//! region actor per configured region (offload routing and the job scheduler;
//! autoscaling next), the QUIC gateway for agents, and the REST API. State lives in redb under the
//! data dir, created on first start together with the cluster CA and the
//! manifest-signing key.
//!
//! Architecture invariant: actors forward and commit; policy that can be pure lives in
//! crates with no actix, tokio or quinn in them (`nephele-domain` today).

pub mod api;
pub mod api_error;
pub mod api_rate;
pub mod clock;
pub mod config;
pub mod federation;
pub mod gateway;
pub mod leader;
pub mod ledger;
pub mod model_build;
pub mod notes;
pub mod pending_pushes;
pub mod provider;
pub mod region;
pub mod replica_sizing;
pub mod reports;
pub mod rollout;
pub mod scheduler;
pub mod serving;
pub mod standby;
pub mod store;
pub mod variants;
pub mod watch;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use actix::Actor as _;
use anyhow::{Context as _, Result};

pub use config::CloudConfig;

/// Command-line flags of `nephele-cloud` (also `nephele cloud`).
#[derive(Debug, Clone, clap::Args)]
pub struct CloudArgs {
    /// TOML configuration file (see deploy/cloud.example.toml). Without it, built-in
    /// defaults: one region, API on 127.0.0.1:8080, QUIC on 127.0.0.1:7443.
    #[arg(long, env = "NEPHELE_CONFIG")]
    pub config: Option<PathBuf>,
    /// Overrides `data_dir` from the config.
    #[arg(long)]
    pub data_dir: Option<PathBuf>,
    /// Overrides `api_listen` (port 0 picks a free port).
    #[arg(long)]
    pub api_listen: Option<SocketAddr>,
    /// Overrides `quic_listen` (port 0 picks a free port).
    #[arg(long)]
    pub quic_listen: Option<SocketAddr>,
    /// Serve the REST API as plain HTTP instead of HTTPS ([api] plain_http), e.g.
    /// behind a proxy that terminates TLS; only on a loopback address unless
    /// --plain-http-any-address.
    #[arg(long)]
    pub plain_http: bool,
    /// Allow plain HTTP on a non-loopback api_listen ([api] plain_http_any_address).
    #[arg(long)]
    pub plain_http_any_address: bool,
    /// The API's certificate chain, PEM, server first ([api] tls_cert; with
    /// --api-key). Default: a certificate from the cluster CA for server_names.
    #[arg(long)]
    pub api_cert: Option<PathBuf>,
    /// The private key of --api-cert, PEM ([api] tls_key).
    #[arg(long)]
    pub api_key: Option<PathBuf>,
    /// When ready, write {"api", "quic", "ca_fingerprint"} as JSON to this file (for
    /// supervisors and tests that bind port 0).
    #[arg(long)]
    pub ready_file: Option<PathBuf>,
    /// Overrides `[store] etcd_endpoints`: keep the state in this etcd cluster
    /// (comma-separated client URLs) instead of the embedded redb file.
    #[arg(long, value_delimiter = ',')]
    pub etcd: Vec<String>,
    /// Overrides `[store] shared_dir`: where model blobs and pushes in flight live,
    /// shared by every replica on one etcd cluster (a network file system).
    #[arg(long)]
    pub shared_dir: Option<PathBuf>,
    /// Print the effective configuration as TOML and exit.
    #[arg(long)]
    pub print_config: bool,
    /// Break glass: with the control plane stopped, add a new admin API token to its
    /// store (other tokens are left as they are), write it to <data-dir>/admin-token,
    /// record it in the audit log, print it and exit. For when every admin token was
    /// rotated, revoked or lost.
    #[arg(long)]
    pub reset_admin_token: bool,
    /// Log lines as `text` (coloured only on a terminal) or `json` (one object per
    /// line, for log collectors). Default: `NEPHELE_LOG_FORMAT`, else text.
    #[arg(long)]
    pub log_format: Option<nephele_logging::Format>,
    /// Overrides `[tracing] otlp_endpoint`: export spans to this collector (e.g.
    /// http://127.0.0.1:4317). Default: OTEL_EXPORTER_OTLP_ENDPOINT.
    #[arg(long)]
    pub otlp_endpoint: Option<String>,
    /// Overrides `[tracing] otlp_protocol`: `grpc` (default) or `http/protobuf`.
    /// Default: OTEL_EXPORTER_OTLP_PROTOCOL.
    #[arg(long)]
    pub otlp_protocol: Option<String>,
    /// Overrides `[tracing] sample_ratio`: share of new traces recorded (0 to 1).
    #[arg(long)]
    pub trace_sample_ratio: Option<f64>,
}

pub fn init_tracing(format: Option<nephele_logging::Format>) {
    nephele_logging::init_with("info,quinn=warn,actix_server=warn", format);
}

/// Loads the configuration with flag overrides applied.
pub fn load_config(args: &CloudArgs) -> Result<CloudConfig> {
    let mut config = match &args.config {
        Some(path) => {
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("cannot read config file {}", path.display()))?;
            CloudConfig::from_toml(&text)
                .map_err(|e| anyhow::anyhow!("invalid config {}: {e}", path.display()))?
        }
        None => CloudConfig::default(),
    };
    if let Some(dir) = &args.data_dir {
        config.data_dir = dir.clone();
    }
    if let Some(addr) = args.api_listen {
        config.api_listen = addr;
    }
    if let Some(addr) = args.quic_listen {
        config.quic_listen = addr;
    }
    config.api.plain_http |= args.plain_http;
    config.api.plain_http_any_address |= args.plain_http_any_address;
    if let Some(cert) = &args.api_cert {
        config.api.tls_cert = Some(cert.clone());
    }
    if let Some(key) = &args.api_key {
        config.api.tls_key = Some(key.clone());
    }
    if !args.etcd.is_empty() {
        config.store.etcd_endpoints = args.etcd.clone();
    }
    if let Some(dir) = &args.shared_dir {
        config.store.shared_dir = Some(dir.clone());
    }
    if let Some(endpoint) = &args.otlp_endpoint {
        config.tracing.otlp_endpoint = Some(endpoint.clone());
    }
    if let Some(protocol) = &args.otlp_protocol {
        config.tracing.otlp_protocol = Some(protocol.clone());
    }
    if let Some(ratio) = args.trace_sample_ratio {
        config.tracing.sample_ratio = Some(ratio);
    }
    Ok(config)
}

/// Entry point of the binary: runs until SIGINT/SIGTERM.
pub fn run_cli(args: CloudArgs) -> Result<()> {
    init_tracing(args.log_format);
    let config = load_config(&args)?;
    if args.print_config {
        print!("{}", toml::to_string_pretty(&config)?);
        return Ok(());
    }
    if args.reset_admin_token {
        return reset_admin_token(config);
    }
    let quic_runtime = gateway_runtime(config.gateway_threads)?;
    let served = actix_rt::System::new().block_on(serve(
        config,
        args.ready_file,
        quic_runtime.handle().clone(),
    ));
    quic_runtime.shutdown_timeout(std::time::Duration::from_secs(1));
    served
}

/// The QUIC gateway's runtime: threads of its own, so TLS handshakes, packets and
/// model chunks for thousands of agents run beside the scheduling actors' thread
/// rather than on it (on one thread, a reconnect storm's handshakes starved every
/// session: README, fleet scale).
fn gateway_runtime(threads: usize) -> Result<tokio::runtime::Runtime> {
    let threads = match threads {
        0 => std::thread::available_parallelism().map_or(2, |n| n.get()),
        n => n,
    };
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(threads)
        .thread_name("quic-gateway")
        .enable_all()
        .build()
        .context("cannot start the QUIC gateway's threads")
}

#[cfg(unix)]
fn restrict(path: &Path, mode: u32) -> Result<()> {
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
        .with_context(|| format!("cannot set permissions on {}", path.display()))
}

#[cfg(not(unix))]
fn restrict(_: &Path, _: u32) -> Result<()> {
    Ok(())
}

/// Writes a secret readable by its owner only: created 0600 (never readable by others,
/// not even between a write and a chmod) under a temporary name, then renamed.
pub(crate) fn write_secret(path: &Path, bytes: &[u8]) -> Result<()> {
    use std::io::Write as _;
    let tmp = path.with_extension("tmp");
    let _ = std::fs::remove_file(&tmp);
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create_new(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
    let mut file = options
        .open(&tmp)
        .with_context(|| format!("cannot create {}", tmp.display()))?;
    file.write_all(bytes)
        .and_then(|()| file.sync_all())
        .with_context(|| format!("cannot write {}", tmp.display()))?;
    std::fs::rename(&tmp, path).with_context(|| format!("cannot write {}", path.display()))
}

/// Builds again every push acknowledged before a restart whose build had not ended;
/// returns once each is registered (so the API shows it `building` from the start).
async fn resume_pushes(
    pushes: &pending_pushes::PendingPushes,
    federation: &actix::Addr<federation::FederationActor>,
    blob_dir: &Path,
) {
    for (kept, body) in pushes.kept() {
        let push = match model_build::parse_push(&kept.query, kept.is_json, &body.into()) {
            Ok(push) => push,
            Err(error) => {
                tracing::warn!(model = %kept.name, %error, "dropping a push kept before a restart");
                pushes.forget(&kept.name);
                continue;
            }
        };
        tracing::info!(model = %kept.name, bytes = kept.body_len, "building again a push acknowledged before the restart");
        let journal = model_build::Journal {
            pushes: pushes.clone(),
            request: None,
        };
        let name = kept.name;
        if let Err(error) = model_build::start(
            name.clone(),
            push,
            federation.clone(),
            blob_dir.to_path_buf(),
            Some(journal),
        )
        .await
        {
            tracing::warn!(model = %name, %error, "the push kept before the restart was not built again; dropped");
            pushes.forget(&name);
        }
    }
}

/// The tracer of this control plane: spans exported to the configured collector, or
/// none recorded (trace context still passed on) when no collector is named.
fn start_tracer(
    settings: Option<nephele_otel::Settings>,
    config: &CloudConfig,
    metrics: &nephele_telemetry::Registry,
) -> Result<nephele_otel::Tracer> {
    let Some(settings) = settings else {
        return Ok(nephele_otel::Tracer::disabled());
    };
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .unwrap_or_default();
    let regions: Vec<&str> = config.regions.iter().map(|r| r.name.as_str()).collect();
    let collector = settings.collector();
    let protocol = settings.protocol.label();
    let ratio = settings.sample_ratio;
    let tracer = nephele_otel::Tracer::start(
        settings,
        vec![
            (
                "service.instance.id".into(),
                format!("{host}:{}", std::process::id()).into(),
            ),
            ("service.version".into(), env!("CARGO_PKG_VERSION").into()),
            ("nephele.regions".into(), regions.join(",").into()),
        ],
        metrics,
    )
    .context("cannot start the trace exporter")?;
    tracing::info!(%collector, protocol, sample_ratio = ratio, "exporting spans");
    Ok(tracer)
}

/// The tenants: those the config declares are created when the store has none of that
/// name (so a `[[tenant]]` added to the config appears at the next start); after that
/// they are API objects, and the stored values count.
fn seed_tenants(
    store: &store::Store,
    config: &config::CloudConfig,
    now: u64,
) -> anyhow::Result<Vec<config::TenantConfig>> {
    let stored: std::collections::BTreeMap<String, store::TenantRecord> = store
        .list_prefix::<store::TenantRecord>(store::Table::Tenants, "")?
        .into_iter()
        .map(|(_, record)| (record.tenant.name.clone(), record))
        .collect();
    let mut all = stored.clone();
    for record in federation::seeded_tenants(config, &stored, now) {
        store.put(store::Table::Tenants, &record.tenant.name, &record)?;
        tracing::info!(tenant = %record.tenant.name, "tenant created from the config");
        all.insert(record.tenant.name.clone(), record);
    }
    Ok(all.into_values().map(|r| r.tenant).collect())
}

/// Loads the cluster CA, or creates it on first start.
fn load_or_create_ca(data_dir: &Path) -> Result<nephele_net::ClusterCa> {
    let cert_path = data_dir.join("ca.pem");
    let key_path = data_dir.join("ca.key");
    if cert_path.exists() {
        let cert = std::fs::read_to_string(&cert_path)?;
        let key = std::fs::read_to_string(&key_path).with_context(|| {
            format!(
                "{} exists but {} does not",
                cert_path.display(),
                key_path.display()
            )
        })?;
        return nephele_net::ClusterCa::from_pem(&cert, &key)
            .context("cluster CA files are unreadable");
    }
    let cluster_id: String = hex::encode(rand::random::<[u8; 4]>());
    let ca = nephele_net::ClusterCa::generate(&cluster_id)?;
    write_secret(&key_path, ca.key_pem.as_bytes())?;
    std::fs::write(&cert_path, &ca.cert_pem)?;
    tracing::info!(fingerprint = %hex::encode(ca.fingerprint()), "created cluster CA");
    Ok(ca)
}

fn load_or_create_signing_key(data_dir: &Path) -> Result<ring::signature::Ed25519KeyPair> {
    let path = data_dir.join("manifest-signing.pk8");
    let pkcs8 = load_or_create_signing_pkcs8(data_dir)?;
    ring::signature::Ed25519KeyPair::from_pkcs8(&pkcs8)
        .map_err(|_| anyhow::anyhow!("{} is not a valid Ed25519 PKCS#8 key", path.display()))
}

/// The cluster CA and the manifest-signing key every replica sharing an etcd cluster
/// uses: kept in the store's `meta` table, created by the first replica (from its data
/// dir's, when it had some: a control plane moved onto etcd keeps its CA), and copied
/// into each replica's data dir for operators' tools. etcd then holds private keys, as
/// it holds Kubernetes' Secrets: give it TLS and authentication in production.
fn shared_secrets(
    store: &store::Store,
    data_dir: &Path,
) -> Result<(nephele_net::ClusterCa, ring::signature::Ed25519KeyPair)> {
    use base64::Engine as _;
    use store::Table;
    #[derive(serde::Serialize, serde::Deserialize)]
    struct Secrets {
        ca_cert_pem: String,
        ca_key_pem: String,
        signing_pkcs8_b64: String,
    }
    let b64 = base64::engine::general_purpose::STANDARD;
    let secrets = match store.get::<Secrets>(Table::Meta, "secrets")? {
        Some(secrets) => secrets,
        None => {
            let ca = load_or_create_ca(data_dir)?;
            let pkcs8 = load_or_create_signing_pkcs8(data_dir)?;
            let mine = Secrets {
                ca_cert_pem: ca.cert_pem.clone(),
                ca_key_pem: ca.key_pem.clone(),
                signing_pkcs8_b64: b64.encode(&pkcs8),
            };
            if store.put_if_absent(Table::Meta, "secrets", &mine)? {
                tracing::info!(
                    "stored the cluster CA and the manifest-signing key for every replica"
                );
            }
            store
                .get::<Secrets>(Table::Meta, "secrets")?
                .context("the shared secrets vanished from the store")?
        }
    };
    let ca = nephele_net::ClusterCa::from_pem(&secrets.ca_cert_pem, &secrets.ca_key_pem)
        .context("the cluster CA in the store is unreadable")?;
    let pkcs8 = b64
        .decode(&secrets.signing_pkcs8_b64)
        .context("the manifest-signing key in the store is not base64")?;
    let signing = ring::signature::Ed25519KeyPair::from_pkcs8(&pkcs8).map_err(|_| {
        anyhow::anyhow!("the manifest-signing key in the store is not a valid Ed25519 PKCS#8 key")
    })?;
    write_secret(&data_dir.join("ca.key"), secrets.ca_key_pem.as_bytes())?;
    std::fs::write(data_dir.join("ca.pem"), &secrets.ca_cert_pem)?;
    write_secret(&data_dir.join("manifest-signing.pk8"), &pkcs8)?;
    Ok((ca, signing))
}

/// The manifest-signing key's PKCS#8 document from the data dir, created on first start.
fn load_or_create_signing_pkcs8(data_dir: &Path) -> Result<Vec<u8>> {
    let path = data_dir.join("manifest-signing.pk8");
    let pkcs8 = if path.exists() {
        std::fs::read(&path)?
    } else {
        let rng = ring::rand::SystemRandom::new();
        let document = ring::signature::Ed25519KeyPair::generate_pkcs8(&rng)
            .map_err(|_| anyhow::anyhow!("cannot generate the manifest-signing key"))?;
        write_secret(&path, document.as_ref())?;
        document.as_ref().to_vec()
    };
    Ok(pkcs8)
}

/// The names the API's certificate from the cluster CA is issued for: the configured
/// server names and the API's own address when it is a specific one.
fn api_names(config: &CloudConfig) -> Vec<String> {
    let mut names = config.server_names.clone();
    let ip = config.api_listen.ip();
    if !ip.is_unspecified() && !names.contains(&ip.to_string()) {
        names.push(ip.to_string());
    }
    names
}

/// The API's TLS identity: the operator's files, or a certificate from the cluster CA;
/// `None` with `[api] plain_http`.
fn api_identity(
    config: &CloudConfig,
    ca: &nephele_net::ClusterCa,
) -> Result<Option<nephele_net::https::ApiIdentity>> {
    if config.api.plain_http {
        return Ok(None);
    }
    let identity = match (&config.api.tls_cert, &config.api.tls_key) {
        (Some(cert), Some(key)) => nephele_net::https::ApiIdentity::from_pem_files(cert, key)
            .map_err(|e| {
                anyhow::anyhow!("[api] tls_cert / tls_key (--api-cert / --api-key): {e}")
            })?,
        _ => nephele_net::https::ApiIdentity::issued(ca, &api_names(config))?,
    };
    Ok(Some(identity))
}

/// Runs the control plane inside an actix system until the API server stops.
/// Serves until the API server stops. `quic_runtime` is the runtime the QUIC gateway runs
/// on (its endpoint, every agent's session); the caller owns and shuts it down.
/// `--reset-admin-token`: see [`CloudArgs::reset_admin_token`].
fn reset_admin_token(config: CloudConfig) -> Result<()> {
    use federation::fleet_store::FleetStore as _;
    let (store, data_dir, _) = open_state(&config).context(
        "cannot open the store; stop nephele-cloud first (the break-glass reset writes to its store directly)",
    )?;
    let snapshot = store
        .load()
        .context("cannot read the fleet's records from the store")?;
    let mut core = federation::fleet_core::FleetCore::new(
        config,
        Box::new(federation::authority::NoKeys),
        snapshot,
        0,
        HashMap::new(),
    );
    let output = core.break_glass_admin_token(
        federation::now_unix(),
        federation::random_alnum(8),
        federation::random_alnum(40),
    );
    store
        .commit(&output.persist)
        .context("cannot write the new token to the store")?;
    let path = data_dir.join("admin-token");
    write_secret(&path, output.reply.as_bytes())?;
    println!(
        "nephele-cloud: added a break-glass admin API token (recorded in the audit log; shown once; also saved to {}):\n  {}",
        path.display(),
        output.reply
    );
    Ok(())
}

/// The data dir and shared dir (made and resolved) and the store they hold, redb in
/// the data dir or etcd as the config says.
fn open_state(config: &CloudConfig) -> Result<(store::Store, PathBuf, PathBuf)> {
    let data_dir = config.data_dir.clone();
    std::fs::create_dir_all(&data_dir)
        .with_context(|| format!("cannot create data dir {}", data_dir.display()))?;
    // Absolute: paths under it (checkpoints, the local provider's nodes) are handed to
    // other processes with other working directories.
    let data_dir = std::fs::canonicalize(&data_dir)
        .with_context(|| format!("cannot resolve data dir {}", data_dir.display()))?;
    restrict(&data_dir, 0o700)?;
    // Model blobs and pushes in flight: the data dir, or a directory every replica
    // shares.
    let shared_dir = match &config.store.shared_dir {
        Some(dir) => {
            std::fs::create_dir_all(dir)
                .with_context(|| format!("cannot create shared dir {}", dir.display()))?;
            std::fs::canonicalize(dir)?
        }
        None => data_dir.clone(),
    };
    let store = if config.store.etcd_endpoints.is_empty() {
        store::Store::open_with_blobs(&data_dir, &shared_dir.join("blobs"))
            .with_context(|| format!("cannot open state in {}", data_dir.display()))?
    } else {
        let endpoints = &config.store.etcd_endpoints;
        let store = store::Store::open_etcd(&shared_dir, endpoints, &config.store.etcd_prefix)
            .with_context(|| {
                format!(
                    "cannot reach the etcd cluster at {} (is it running? check [store] etcd_endpoints or --etcd)",
                    endpoints.join(",")
                )
            })?;
        tracing::info!(endpoints = %endpoints.join(","), prefix = %config.store.etcd_prefix, "state in etcd");
        store
    };
    Ok((store, data_dir, shared_dir))
}

pub async fn serve(
    config: CloudConfig,
    ready_file: Option<PathBuf>,
    quic_runtime: tokio::runtime::Handle,
) -> Result<()> {
    config
        .validate()
        .map_err(|e| anyhow::anyhow!("invalid config: {e}"))?;
    // Before anything is opened: a wrong collector address is said at once.
    let tracing_settings = nephele_otel::Settings::resolve(
        config.tracing.otlp_endpoint.as_deref(),
        config.tracing.otlp_protocol.as_deref(),
        config.tracing.sample_ratio,
        "nephele-cloud",
        &|key| std::env::var(key).ok(),
    )
    .map_err(|e| anyhow::anyhow!("tracing: {e}"))?;
    let (store, data_dir, shared_dir) = open_state(&config)?;
    // The CA first: a standby serves HTTPS (and checks the leader's) before it leads.
    let (ca, signing_key) = if store.etcd_client().is_some() {
        shared_secrets(&store, &data_dir)?
    } else {
        (
            load_or_create_ca(&data_dir)?,
            load_or_create_signing_key(&data_dir)?,
        )
    };
    let identity = api_identity(&config, &ca)?;
    let api_tls = identity
        .as_ref()
        .map(nephele_net::https::api_server_config)
        .transpose()?;
    if let Some(etcd) = store.etcd_client() {
        let me = leader::LeaderInfo {
            host: std::fs::read_to_string("/proc/sys/kernel/hostname")
                .map(|h| h.trim().to_string())
                .unwrap_or_default(),
            pid: std::process::id(),
            api: config.api_listen.to_string(),
            quic: config.quic_listen.to_string(),
        };
        // Until it leads, its API port forwards to the leader's.
        let reads = standby::reads::Reads::new(store.clone(), config.clone());
        let tls = match (&api_tls, &identity) {
            (Some(server), Some(identity)) => Some(standby::Tls {
                server: Arc::new(server.clone()),
                leader: Arc::new(nephele_net::https::api_peer_client_config(
                    ca.cert_der(),
                    identity,
                )?),
            }),
            _ => None,
        };
        let forwarder =
            standby::Forwarder::start(config.api_listen, etcd.clone(), me.clone(), reads, tls)
                .await?;
        leader::lead(etcd, me, &data_dir).await?;
        forwarder.stop().await;
    }
    let ca_fingerprint = hex::encode(ca.fingerprint());
    let blob_dir = store.blob_dir().to_path_buf();
    let pushes = pending_pushes::PendingPushes::open(&shared_dir)
        .with_context(|| format!("cannot create {}/pushes", shared_dir.display()))?;

    let (server_cert, server_key) = ca.issue_server(&config.server_names)?;
    let quic_config = nephele_net::server_config(ca.cert_der(), &server_cert, &server_key)?;
    // Made inside the gateway's runtime, so quinn drives the endpoint and every
    // connection on its threads.
    let udp = nephele_net::udp::bind(
        config.quic_listen,
        nephele_net::udp::MANY_CONNECTIONS_BUFFER,
    )
    .with_context(|| format!("cannot bind QUIC gateway on {} (UDP)", config.quic_listen))?;
    if !udp.granted() {
        tracing::warn!(listen = %config.quic_listen, "{}", udp.advice());
    }
    let endpoint = {
        let _inside = quic_runtime.enter();
        // Keys kept across restarts: the agents' sessions end at the restarted
        // process's first answer, not at their idle timeout.
        nephele_net::udp::endpoint_with(
            nephele_net::udp::restartable_endpoint_config(ca.key_pem.as_bytes()),
            udp.socket,
            Some(quic_config),
        )
    }
    .with_context(|| format!("cannot start the QUIC gateway on {}", config.quic_listen))?;
    let quic_addr = endpoint.local_addr()?;

    let metrics = nephele_telemetry::Registry::new();
    let tracer = start_tracer(tracing_settings, &config, &metrics)?;
    let now = federation::now_unix();
    let local_provider = config
        .regions
        .iter()
        .flat_map(|r| &r.pools)
        .any(|p| p.provider == config::ProviderKind::Local)
        .then(|| {
            Arc::new(provider::local::LocalProvider::new(
                &config.nodes.local,
                &data_dir,
            ))
        });
    // Changes published for watches (`GET /v1/watch`), numbered from this start.
    let hub = watch::Hub::new(federation::now_unix_ms());
    let tenants = seed_tenants(&store, &config, now)?;
    let mut regions = HashMap::new();
    let mut initial_work = HashMap::new();
    for region in &config.regions {
        let mut scheduler = scheduler::RegionScheduler::new(region, &tenants, &config.scheduler)
            .map_err(|e| anyhow::anyhow!("region {}: {e}", region.name))?
            .with_nodes(
                config.nodes.clone(),
                (u64::from(config.heartbeat_interval_ms) * 10 / 1000).max(30),
            )
            .with_default_checkpoint_root(&data_dir.join("checkpoints").display().to_string());
        // The region's books from the last run.
        let prefix = format!("{}/", region.name);
        let jobs: Vec<scheduler::JobRecord> = store
            .list_prefix(store::Table::RegionJobs, &prefix)?
            .into_iter()
            .map(|(_, record)| record)
            .collect();
        let nodes: Vec<scheduler::NodeRecord> = store
            .list_prefix(store::Table::RegionNodes, &prefix)?
            .into_iter()
            .map(|(_, record)| record)
            .collect();
        let state: Option<scheduler::RegionRecord> =
            store.get(store::Table::RegionState, &region.name)?;
        let restored_jobs = jobs.len();
        let policies = state
            .as_ref()
            .map(|s| s.autoscalers.clone())
            .unwrap_or_default();
        for problem in scheduler.restore(jobs, nodes, state, now) {
            tracing::warn!(region = %region.name, %problem, "restoring the region's books");
        }
        let ledger: Vec<scheduler::ledger::HourRecord> = store
            .list_prefix(store::Table::RegionLedger, &prefix)?
            .into_iter()
            .map(|(_, record)| record)
            .collect();
        scheduler.restore_ledger(ledger);
        if restored_jobs > 0 {
            tracing::info!(region = %region.name, jobs = restored_jobs, "restored the region's books");
        }
        let providers = provider::Providers::new(
            local_provider.clone(),
            region
                .pools
                .iter()
                .filter_map(|p| p.command.clone().map(|c| (p.name.clone(), c))),
        );
        let settings = region::RegionSettings {
            tick: std::time::Duration::from_millis(config.scheduler.tick_ms),
            autoscale: config.autoscale.clone(),
            policy: config.autoscale.policy.clone(),
            server: quic_addr.to_string(),
        };
        let mut actor = region::RegionActor::new(scheduler, settings, providers)
            .with_watch(hub.clone())
            .with_metrics(metrics.clone())
            .with_store(store.clone())
            .with_policies(policies);
        initial_work.extend(actor.initial_work());
        regions.insert(region.name.clone(), actor.start());
    }
    let mut federation = federation::FederationActor::new(
        config.clone(),
        store,
        ca,
        signing_key,
        regions.clone(),
        metrics.clone(),
        initial_work,
    )
    .context("cannot read the fleet's deployments and models from the store")?
    .with_watch(hub.clone());
    if let Some(token) = federation.bootstrap_admin_token()? {
        let path = data_dir.join("admin-token");
        write_secret(&path, token.as_bytes())?;
        println!(
            "nephele-cloud: created the admin API token (shown once; also saved to {}):\n  {token}",
            path.display()
        );
    }
    let federation = federation.start();
    for region in regions.values() {
        region.do_send(region::SetFederation(region::FederationRecipients {
            pool_work: federation.clone().recipient(),
            join_tokens: federation.clone().recipient(),
            delete_device: federation.clone().recipient(),
        }));
    }

    let regions_for_api = regions.clone();
    let gateway = Arc::new(gateway::Gateway {
        federation: federation.clone(),
        regions,
        blob_dir: blob_dir.clone(),
        metrics: metrics.clone(),
        joins_in_progress: std::sync::atomic::AtomicUsize::new(0),
        joins_by_address: std::sync::Mutex::new(HashMap::new()),
        tracer: tracer.clone(),
    });
    let api_tracer = tracer;
    quic_runtime.spawn(gateway::run(endpoint.clone(), gateway));

    resume_pushes(&pushes, &federation, &blob_dir).await;
    let state = actix_web::web::Data::new(api::ApiState {
        federation,
        metrics,
        regions: regions_for_api,
        default_region: config.default_region().to_string(),
        region_weights: config.scheduler.region_weights,
        blob_dir,
        pushes,
        rate: api_rate::RateLimiter::new(config.api_rate_per_s, config.api_rate_burst),
        watch: hub,
        tracer: api_tracer,
    });
    let server = actix_web::HttpServer::new(move || {
        actix_web::App::new()
            .app_data(state.clone())
            .wrap(actix_web::middleware::from_fn(api::authenticate_first))
            .wrap(actix_web::middleware::from_fn(api::traced))
            .configure(api::routes)
    })
    .workers(2);
    let server = match api_tls {
        Some(tls) => server.bind_rustls_0_23(config.api_listen, tls),
        None => server.bind(config.api_listen),
    }
    .with_context(|| format!("cannot bind the API on {}", config.api_listen))?;
    let scheme = if config.api.plain_http {
        "http"
    } else {
        "https"
    };
    let ca_path = data_dir.join("ca.pem");
    let api_addr = server
        .addrs()
        .first()
        .copied()
        .context("API bound no address")?;
    let running = server.run();

    if let Some(path) = ready_file {
        let ready = serde_json::json!({
            "api": api_addr.to_string(),
            "api_url": format!("{scheme}://{api_addr}"),
            "ca": ca_path,
            "quic": quic_addr.to_string(),
            "ca_fingerprint": ca_fingerprint,
            "data_dir": data_dir,
        });
        let tmp = path.with_extension("tmp");
        std::fs::write(&tmp, serde_json::to_vec_pretty(&ready)?)?;
        std::fs::rename(&tmp, &path)?;
    }
    println!(
        "nephele-cloud ready: API {scheme}://{api_addr}  QUIC {quic_addr}  CA sha256 {ca_fingerprint} ({})",
        ca_path.display()
    );
    if config.api.plain_http {
        tracing::warn!(listen = %api_addr, "the API is served as plain HTTP ([api] plain_http): tokens cross the wire in clear");
    }
    running.await.context("API server failed")?;
    endpoint.close(0u32.into(), b"control plane shutting down");
    endpoint.wait_idle().await;
    Ok(())
}
