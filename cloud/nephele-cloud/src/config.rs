//! Control-plane configuration: a TOML file, every field optional with sane defaults
//! so that `nephele-cloud` with no file at all starts a working single-region plane.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;

use nephele_domain::AcceleratorKind;
use nephele_placement::{CapacityType, MigPartition, MigProfile, NodeSpec};
use serde::{Deserialize, Serialize};

/// The region name that asks the control plane to choose one.
pub const AUTO_REGION: &str = "auto";

/// The tenant serving replicas are charged to; no configured tenant may take the name.
pub const SERVING_TENANT: &str = "serving";

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct CloudConfig {
    /// Where the CA, keys, the redb state and model blobs live. Created on first start.
    pub data_dir: PathBuf,
    /// REST API and `/metrics` (HTTPS unless `[api] plain_http`).
    pub api_listen: SocketAddr,
    /// How the REST API is served: HTTPS with a certificate from the cluster CA (the
    /// default), the operator's certificate, or plain HTTP on loopback.
    pub api: ApiConfig,
    /// QUIC gateway for agents (UDP).
    pub quic_listen: SocketAddr,
    /// Extra DNS names / IPs to put in the gateway's and the API's certificates besides
    /// `nephele-cloud`: every name clients reach this control plane by.
    pub server_names: Vec<String>,
    /// How long a join token lives unless the request says otherwise.
    pub join_token_ttl_s: u64,
    /// API requests each token may make per second, sustained (`api_rate_burst` at
    /// once); more are answered 429 with `Retry-After`.
    pub api_rate_per_s: f64,
    pub api_rate_burst: u32,
    pub heartbeat_interval_ms: u32,
    /// Threads of the QUIC gateway (TLS handshakes, packets, every agent session and
    /// model chunk), apart from the thread the scheduling actors run on; 0 means one
    /// per core.
    pub gateway_threads: usize,
    #[serde(rename = "region")]
    pub regions: Vec<RegionConfig>,
    /// Tenants that jobs are charged to; none configured means one tenant, `default`,
    /// with weight 1 and no quota.
    #[serde(rename = "tenant")]
    pub tenants: Vec<TenantConfig>,
    pub scheduler: SchedulerConfig,
    /// How cloud replicas of offload deployments are scaled.
    pub autoscale: AutoscaleConfig,
    /// How pools with a provider gain and lose nodes.
    pub nodes: NodesConfig,
    /// Where the state lives: the embedded redb file (default) or an etcd cluster.
    pub store: StoreConfig,
    /// Distributed tracing: where spans are exported (OTLP/gRPC).
    pub tracing: TracingConfig,
}

/// How the REST API is served. By default HTTPS, with a certificate the cluster CA
/// issues for `server_names` (and the API's own address when it is a specific one):
/// clients trust the CA (`<data_dir>/ca.pem`), as agents do.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct ApiConfig {
    /// The operator's certificate chain (PEM, the server's first) and private key
    /// (PEM), e.g. from the organisation's CA, instead of one from the cluster CA.
    pub tls_cert: Option<PathBuf>,
    pub tls_key: Option<PathBuf>,
    /// Serve plain HTTP instead of HTTPS (behind a proxy that terminates TLS, or on a
    /// laptop). Tokens then cross the wire in clear, so only on a loopback address
    /// unless `plain_http_any_address` says otherwise.
    pub plain_http: bool,
    pub plain_http_any_address: bool,
}

/// Where this control plane's spans go. Unset, OpenTelemetry's environment variables
/// decide (`OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`, `OTEL_EXPORTER_OTLP_ENDPOINT`, …; see
/// `nephele_otel::settings`); with neither, no spans are recorded, but a request's
/// trace context is still passed on to the pool replica.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct TracingConfig {
    /// The collector's address, e.g. `http://127.0.0.1:4317` (OTLP/gRPC) or
    /// `http://127.0.0.1:4318` (OTLP/HTTP, `/v1/traces` added).
    pub otlp_endpoint: Option<String>,
    /// `grpc` (default) or `http/protobuf`; unset, `OTEL_EXPORTER_OTLP_PROTOCOL`.
    pub otlp_protocol: Option<String>,
    /// Share of new traces recorded, 0 to 1 (default 1); a request that comes with a
    /// trace context follows its caller's decision.
    pub sample_ratio: Option<f64>,
}

/// Where the control plane keeps its records. Model blobs stay in `data_dir` either way.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct StoreConfig {
    /// Client URLs of an etcd cluster (`http://host:2379`, several for several
    /// members); empty: the embedded redb file `state.redb` in the data dir.
    pub etcd_endpoints: Vec<String>,
    /// Key prefix of this control plane's records in etcd.
    pub etcd_prefix: String,
    /// Where model blobs and pushes in flight live (default: the data dir). Replicas
    /// that share an etcd cluster must share this directory too (a network file
    /// system), so that whichever leads has every model.
    pub shared_dir: Option<PathBuf>,
}

impl Default for StoreConfig {
    fn default() -> Self {
        StoreConfig {
            etcd_endpoints: Vec::new(),
            etcd_prefix: "/nephele/".into(),
            shared_dir: None,
        }
    }
}

/// The autoscaler each region ticks for the cloud replicas of every deployment that
/// may offload (see `nephele-autoscale`).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct AutoscaleConfig {
    /// How often each region decides, in milliseconds (at least 100).
    pub tick_ms: u64,
    /// Replicas per region of a deployment that may offload, unless the deployment
    /// says otherwise.
    pub min_replicas: u32,
    pub max_replicas: u32,
    /// Priority of serving replicas (above `batch`, 100, so they preempt batch work;
    /// below `production`, 1000), unless the deployment says otherwise.
    pub replica_priority: u32,
    /// What one replica asks of its node unless the deployment says otherwise: CPU
    /// and memory; the GPU share is sized from the model (see the README).
    pub replica_cpu_milli: u64,
    pub replica_memory_mib: u64,
    /// The autoscaler's own settings (`[autoscale.policy]`: stabilisation windows,
    /// thresholds, forecast, warm pool, admission; see `nephele-autoscale`). Its
    /// replica bounds and latency target come from each deployment.
    pub policy: nephele_autoscale::OursConfig,
}

impl Default for AutoscaleConfig {
    fn default() -> Self {
        AutoscaleConfig {
            tick_ms: 5000,
            min_replicas: 1,
            max_replicas: 8,
            replica_priority: 500,
            replica_cpu_milli: 1000,
            replica_memory_mib: 1024,
            policy: nephele_autoscale::OursConfig::default(),
        }
    }
}

/// Node provisioning: when pools with a provider add and release nodes.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct NodesConfig {
    /// A node that has held nothing this long (seconds) is released, down to the
    /// pool's `min_nodes`.
    pub scale_down_after_s: u64,
    /// Most nodes being drained or released at once (a disruption budget).
    pub disruption_budget: u32,
    /// A launched node that has not connected after this long (seconds) is released
    /// and launched again.
    pub join_timeout_s: u64,
    /// First wait after a failed launch or release (seconds); it doubles per failure
    /// in a row, up to 300 s.
    pub retry_after_s: u64,
    /// The `local` provider.
    pub local: LocalProviderConfig,
}

impl Default for NodesConfig {
    fn default() -> Self {
        NodesConfig {
            scale_down_after_s: 120,
            disruption_budget: 1,
            join_timeout_s: 120,
            retry_after_s: 5,
            local: LocalProviderConfig::default(),
        }
    }
}

/// The `local` provider runs pool agents as processes on this machine.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct LocalProviderConfig {
    /// The agent program and the arguments before its subcommand; empty: the
    /// `nephele-edge` next to this binary, or this binary's `edge` subcommand when it
    /// is `nephele`.
    pub agent_command: Vec<String>,
    /// Seconds between asking for a node and starting its agent. It stands for a
    /// cloud machine's boot and image pull, which a local process does not have.
    pub boot_delay_s: f64,
    /// Inference slots of each local pool agent (`nephele-edge run --workers`).
    pub workers: u32,
    /// Where the nodes' data dirs go; empty: `<data_dir>/nodes`.
    pub data_dir: Option<PathBuf>,
}

impl Default for LocalProviderConfig {
    fn default() -> Self {
        LocalProviderConfig {
            agent_command: Vec::new(),
            boot_delay_s: 0.0,
            workers: 1,
            data_dir: None,
        }
    }
}

/// How a pool gets its nodes.
#[derive(
    Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq, Default, schemars::JsonSchema,
)]
#[serde(rename_all = "lowercase")]
pub enum ProviderKind {
    /// Nodes are enrolled by hand; each fills a free slot when it connects.
    #[default]
    None,
    /// Pool agents started and stopped as processes on the control plane's machine.
    Local,
    /// Operator scripts add and remove nodes (`[region.pool.command]`).
    Command,
}

impl ProviderKind {
    pub fn as_str(self) -> &'static str {
        match self {
            ProviderKind::None => "none",
            ProviderKind::Local => "local",
            ProviderKind::Command => "command",
        }
    }
}

/// The `command` provider's scripts for one pool (see deploy/providers/README.md).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CommandProviderConfig {
    /// Adds a node: run with NEPHELE_REGION, NEPHELE_POOL, NEPHELE_NODE,
    /// NEPHELE_PROFILE, NEPHELE_CAPACITY_TYPE, NEPHELE_SERVER and NEPHELE_JOIN_TOKEN.
    pub add: String,
    /// Removes a node: run with NEPHELE_REGION, NEPHELE_POOL and NEPHELE_NODE.
    pub remove: String,
    /// Lists the nodes it manages, one name per line (optional).
    #[serde(default)]
    pub list: Option<String>,
    /// A script still running after this many seconds is killed and counts as failed.
    #[serde(default = "default_script_timeout")]
    pub timeout_s: u64,
}

fn default_script_timeout() -> u64 {
    300
}

/// A tenant: its dominant-resource-fairness weight and quotas. A `[[tenant]]` of the
/// config creates the tenant at start when the store has none of that name; after
/// that the tenant is an API object (`PUT /v1/tenants/{name}`), and its stored values
/// are the ones that count.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct TenantConfig {
    pub name: String,
    /// Relative entitlement under dominant resource fairness (default 1).
    #[serde(default = "one")]
    pub weight: f64,
    /// Most this tenant may hold at once in each region; absent means unlimited.
    #[serde(default)]
    pub quota_cpu_milli: Option<u64>,
    #[serde(default)]
    pub quota_memory_mib: Option<u64>,
    #[serde(default)]
    pub quota_gpu_milli: Option<u64>,
    /// Most jobs it may have in each region at once, waiting or running (finished ones
    /// do not count); absent means unlimited.
    #[serde(default)]
    pub quota_jobs: Option<u32>,
    /// Most cloud replicas its deployments may ask for in all (the sum of their
    /// `replicas.max`, per region); absent means unlimited.
    #[serde(default)]
    pub quota_replicas: Option<u32>,
}

impl TenantConfig {
    /// A tenant named `name` with weight 1 and no quotas.
    pub fn named(name: &str) -> TenantConfig {
        TenantConfig {
            name: name.to_string(),
            weight: 1.0,
            quota_cpu_milli: None,
            quota_memory_mib: None,
            quota_gpu_milli: None,
            quota_jobs: None,
            quota_replicas: None,
        }
    }

    /// What is wrong with it, naming the field: `(field, message)`.
    pub fn problem(&self) -> Option<(&'static str, String)> {
        if let Err(message) = nephele_domain::validate_name("tenant", &self.name) {
            return Some(("name", message));
        }
        if self.name == SERVING_TENANT {
            return Some((
                "name",
                format!(
                    "tenant {:?} is reserved for serving replicas; choose another name",
                    self.name
                ),
            ));
        }
        if !self.weight.is_finite() || self.weight <= 0.0 || self.weight > 1e6 {
            return Some((
                "weight",
                format!("tenant {}: weight must be > 0 (and at most 1e6)", self.name),
            ));
        }
        None
    }
}

fn one() -> f64 {
    1.0
}

/// How each region's job scheduler runs (see `nephele_placement::queue`).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct SchedulerConfig {
    /// Placement policy: `ours` (fragmentation-aware, the default), `fgd`, `best-fit`,
    /// `first-fit`, `dot-product`, `gpu-packing` or `random`.
    pub policy: String,
    /// How often the queue is retried when nothing else happens.
    pub tick_ms: u64,
    /// Time a preempted job has to checkpoint before its resources are taken.
    pub grace_s: u64,
    /// Wait after which a job that still does not fit gets the starvation reservation
    /// (0 disables reservations).
    pub aging_s: u64,
    pub preemption: bool,
    /// Dominant resource fairness across tenants (else FIFO across tenants).
    pub fairness: bool,
    /// How jobs submitted with `"region": "auto"` weigh carbon, price and free capacity.
    pub region_weights: nephele_api::RegionWeightsConfig,
    /// Where jobs' checkpoint directories go (`NEPHELE_CHECKPOINT_DIR` =
    /// `<checkpoint_root>/<region>/<tenant>/<job>`, the same for every attempt). Pool
    /// nodes must all see it (a shared mount); empty: `<data_dir>/checkpoints`, which
    /// only nodes on this machine (the `local` provider) share.
    pub checkpoint_root: Option<PathBuf>,
    /// First and last port handed to gangs as `MASTER_PORT` (one per running attempt).
    pub rendezvous_ports: [u16; 2],
    /// After a control-plane restart, how long (seconds) a job that was running may
    /// wait for its nodes' agents to report back before it runs again elsewhere.
    pub recover_timeout_s: u64,
    /// First wait before a failed job runs again (seconds); doubles per failure.
    pub retry_backoff_s: u64,
}

impl Default for SchedulerConfig {
    fn default() -> Self {
        SchedulerConfig {
            policy: "ours".into(),
            tick_ms: 1000,
            grace_s: 30,
            aging_s: 3600,
            preemption: true,
            fairness: true,
            region_weights: Default::default(),
            checkpoint_root: None,
            rendezvous_ports: [29500, 30499],
            recover_timeout_s: 60,
            retry_backoff_s: 10,
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct RegionConfig {
    pub name: String,
    /// Grid zone for carbon intensity and prices (see `../shared/data`), e.g. `DE`.
    #[serde(default)]
    pub carbon_zone: Option<String>,
    #[serde(default, rename = "pool")]
    pub pools: Vec<PoolConfig>,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PoolConfig {
    pub name: String,
    /// A firmware profile name of class `cloud`, e.g. `gpu-4x-l4`.
    pub node_profile: String,
    /// `on-demand` or `spot`.
    #[serde(default = "default_capacity_type")]
    pub capacity_type: String,
    #[serde(default)]
    pub price_per_hour: f64,
    /// Node slots of this pool in the region's scheduler (1..=1024): pool agents with
    /// this profile fill them as they connect.
    #[serde(default = "default_max_nodes")]
    pub max_nodes: u32,
    /// Partition every GPU of the pool's nodes into MIG slices of this profile (one of
    /// the profile's `[[accelerator.mig]]` names, e.g. `1g.10gb`); jobs then ask for
    /// slices with `mig_profile`.
    #[serde(default)]
    pub mig_profile: Option<String>,
    /// Expected provider interruptions per 1000 node-hours (spot pools).
    #[serde(default)]
    pub interruptions_per_1000h: u32,
    /// Who adds and removes this pool's nodes: `none` (enrolled by hand), `local` or
    /// `command`.
    #[serde(default)]
    pub provider: ProviderKind,
    /// Nodes a provider keeps even when idle.
    #[serde(default)]
    pub min_nodes: u32,
    /// The scripts, for `provider = "command"`.
    #[serde(default)]
    pub command: Option<CommandProviderConfig>,
}

fn default_max_nodes() -> u32 {
    4
}

fn default_capacity_type() -> String {
    "on-demand".into()
}

impl Default for CloudConfig {
    fn default() -> Self {
        CloudConfig {
            data_dir: PathBuf::from("nephele-data"),
            api_listen: SocketAddr::from(([127, 0, 0, 1], 8080)),
            api: ApiConfig::default(),
            quic_listen: SocketAddr::from(([127, 0, 0, 1], 7443)),
            server_names: vec!["localhost".into(), "127.0.0.1".into()],
            join_token_ttl_s: 3600,
            api_rate_per_s: 50.0,
            api_rate_burst: 200,
            heartbeat_interval_ms: 1000,
            gateway_threads: 0,
            regions: vec![RegionConfig {
                name: "default".into(),
                carbon_zone: None,
                pools: vec![PoolConfig {
                    name: "gpu".into(),
                    node_profile: "gpu-4x-l4".into(),
                    capacity_type: "on-demand".into(),
                    price_per_hour: 3.0,
                    max_nodes: 4,
                    mig_profile: None,
                    interruptions_per_1000h: 0,
                    provider: ProviderKind::None,
                    min_nodes: 0,
                    command: None,
                }],
            }],
            tenants: Vec::new(),
            scheduler: SchedulerConfig::default(),
            autoscale: AutoscaleConfig::default(),
            nodes: NodesConfig::default(),
            store: StoreConfig::default(),
            tracing: TracingConfig::default(),
        }
    }
}

impl CloudConfig {
    pub fn from_toml(text: &str) -> Result<CloudConfig, String> {
        let config: CloudConfig = toml::from_str(text).map_err(|e| e.to_string())?;
        config.validate()?;
        Ok(config)
    }

    pub fn validate(&self) -> Result<(), String> {
        if !(self.api_rate_per_s.is_finite() && self.api_rate_per_s > 0.0)
            || self.api_rate_burst == 0
        {
            return Err(format!(
                "api_rate_per_s must be a positive number and api_rate_burst at least 1 (got {} and {})",
                self.api_rate_per_s, self.api_rate_burst
            ));
        }
        if self.api.plain_http {
            if !self.api_listen.ip().is_loopback() && !self.api.plain_http_any_address {
                return Err(format!(
                    "plain HTTP is served only on a loopback address, and api_listen is {}: bind 127.0.0.1, serve HTTPS (the default: leave out --plain-http / [api] plain_http), or allow it with --plain-http-any-address ([api] plain_http_any_address = true) behind a network you trust",
                    self.api_listen
                ));
            }
            if self.api.tls_cert.is_some() || self.api.tls_key.is_some() {
                return Err(
                    "[api] tls_cert / tls_key are for HTTPS, and plain_http is set: choose one"
                        .into(),
                );
            }
        }
        if self.api.tls_cert.is_some() != self.api.tls_key.is_some() {
            return Err(
                "[api] tls_cert and tls_key go together: give both (PEM files), or neither for a certificate from the cluster CA".into(),
            );
        }
        for endpoint in &self.store.etcd_endpoints {
            if !endpoint.starts_with("http://") && !endpoint.starts_with("https://") {
                return Err(format!(
                    "[store] etcd_endpoints: {endpoint:?} is not a URL; give etcd's client URLs, e.g. \"http://10.0.0.5:2379\""
                ));
            }
        }
        if !self.store.etcd_prefix.starts_with('/') {
            return Err(format!(
                "[store] etcd_prefix must start with '/', got {:?}",
                self.store.etcd_prefix
            ));
        }
        if self.regions.is_empty() {
            return Err("at least one [[region]] is required".into());
        }
        let mut seen = std::collections::BTreeSet::new();
        for region in &self.regions {
            nephele_domain::validate_name("region", &region.name)?;
            if region.name == AUTO_REGION {
                return Err(format!(
                    "a region may not be called {:?}: jobs use that name to let the control plane choose",
                    AUTO_REGION
                ));
            }
            if !seen.insert(&region.name) {
                return Err(format!("region {:?} is declared twice", region.name));
            }
            for pool in &region.pools {
                nephele_domain::validate_name("pool", &pool.name)?;
                if !matches!(pool.capacity_type.as_str(), "on-demand" | "spot") {
                    return Err(format!(
                        "pool {}: capacity_type must be \"on-demand\" or \"spot\"",
                        pool.name
                    ));
                }
                if !(1..=1024).contains(&pool.max_nodes) {
                    return Err(format!("pool {}: max_nodes must be 1..=1024", pool.name));
                }
                if !pool.price_per_hour.is_finite() || pool.price_per_hour < 0.0 {
                    return Err(format!(
                        "pool {}: price_per_hour must be a number >= 0",
                        pool.name
                    ));
                }
                node_spec(&region.name, pool).map_err(|e| format!("pool {}: {e}", pool.name))?;
                if pool.min_nodes > pool.max_nodes {
                    return Err(format!(
                        "pool {}: min_nodes ({}) is above max_nodes ({})",
                        pool.name, pool.min_nodes, pool.max_nodes
                    ));
                }
                match (pool.provider, &pool.command) {
                    (ProviderKind::Command, None) => {
                        return Err(format!(
                            "pool {}: provider = \"command\" needs [region.pool.command] with `add` and `remove` scripts",
                            pool.name
                        ))
                    }
                    (ProviderKind::Command, Some(command)) => {
                        if command.add.trim().is_empty() || command.remove.trim().is_empty() {
                            return Err(format!(
                                "pool {}: [region.pool.command] add and remove must name scripts",
                                pool.name
                            ));
                        }
                        if command.timeout_s == 0 {
                            return Err(format!(
                                "pool {}: [region.pool.command] timeout_s must be at least 1",
                                pool.name
                            ));
                        }
                    }
                    (_, Some(_)) => {
                        return Err(format!(
                            "pool {}: [region.pool.command] is only for provider = \"command\"",
                            pool.name
                        ))
                    }
                    _ => {}
                }
                if pool.provider == ProviderKind::None && pool.min_nodes > 0 {
                    return Err(format!(
                        "pool {}: min_nodes needs a provider (\"local\" or \"command\") to start nodes",
                        pool.name
                    ));
                }
            }
        }
        let w = &self.scheduler.region_weights;
        if [w.carbon, w.price, w.capacity]
            .iter()
            .any(|v| !v.is_finite() || *v < 0.0)
            || w.carbon + w.price + w.capacity <= 0.0
        {
            return Err(
                "[scheduler.region_weights]: carbon, price and capacity must be numbers >= 0, not all 0"
                    .into(),
            );
        }
        let mut tenants = std::collections::BTreeSet::new();
        for tenant in &self.tenants {
            if let Some((_, message)) = tenant.problem() {
                return Err(message);
            }
            if !tenants.insert(&tenant.name) {
                return Err(format!("tenant {:?} is declared twice", tenant.name));
            }
        }
        if nephele_placement::Policy::parse(&self.scheduler.policy).is_none() {
            return Err(format!(
                "scheduler.policy {:?} is unknown; use one of: {}",
                self.scheduler.policy,
                nephele_placement::Policy::ALL.map(|p| p.name()).join(", ")
            ));
        }
        if self.scheduler.tick_ms < 50 {
            return Err("scheduler.tick_ms must be at least 50".into());
        }
        if self.heartbeat_interval_ms < 100 {
            return Err("heartbeat_interval_ms must be at least 100".into());
        }
        if self.gateway_threads > 1024 {
            return Err("gateway_threads must be at most 1024 (0: one per core)".into());
        }
        let [first_port, last_port] = self.scheduler.rendezvous_ports;
        if first_port == 0 || last_port < first_port {
            return Err(
                "scheduler.rendezvous_ports must be [first, last] with 0 < first <= last".into(),
            );
        }
        let a = &self.autoscale;
        if a.tick_ms < 100 {
            return Err("autoscale.tick_ms must be at least 100".into());
        }
        if a.max_replicas == 0 || a.min_replicas > a.max_replicas || a.max_replicas > 1024 {
            return Err(
                "autoscale: need 0 <= min_replicas <= max_replicas, 1 <= max_replicas <= 1024"
                    .into(),
            );
        }
        if a.replica_cpu_milli == 0 || a.replica_memory_mib == 0 {
            return Err("autoscale: replica_cpu_milli and replica_memory_mib must be > 0".into());
        }
        a.policy
            .validate()
            .map_err(|e| format!("[autoscale.policy]: {e}"))?;
        let n = &self.nodes;
        if n.disruption_budget == 0 || n.join_timeout_s == 0 || n.retry_after_s == 0 {
            return Err(
                "[nodes]: disruption_budget, join_timeout_s and retry_after_s must be at least 1"
                    .into(),
            );
        }
        if !n.local.boot_delay_s.is_finite() || n.local.boot_delay_s < 0.0 {
            return Err("[nodes.local] boot_delay_s must be a number >= 0".into());
        }
        if n.local.workers == 0 {
            return Err("[nodes.local] workers must be at least 1".into());
        }
        Ok(())
    }

    pub fn default_region(&self) -> &str {
        self.regions
            .first()
            .map(|r| r.name.as_str())
            .unwrap_or("default")
    }
}

/// A node template for `pool`, from its built-in firmware profile, and the name of its
/// GPU model (the caller interns it into [`NodeSpec::gpu_model`]).
pub fn node_spec(region: &str, pool: &PoolConfig) -> Result<(NodeSpec, Option<String>), String> {
    let profile = nephele_domain::builtin_profiles::builtin(&pool.node_profile)
        .ok_or_else(|| {
            format!(
                "node_profile {:?} is not a built-in profile; use one of: {}",
                pool.node_profile,
                nephele_domain::builtin_profiles::builtin_names().join(", ")
            )
        })?
        .map_err(|e| format!("profile {}: {e}", pool.node_profile))?;
    let gpu = profile
        .accelerators
        .iter()
        .find(|a| a.kind == AcceleratorKind::Gpu);
    let gpus = gpu.map_or(0, |g| g.count.min(64) as u8);
    let mut mig = Vec::new();
    if let Some(name) = &pool.mig_profile {
        let spec = gpu
            .and_then(|g| g.mig.iter().find(|m| &m.name == name))
            .ok_or_else(|| {
                let known: Vec<&str> = gpu
                    .map(|g| g.mig.iter().map(|m| m.name.as_str()).collect())
                    .unwrap_or_default();
                format!(
                    "mig_profile {name:?} is not offered by {} (MIG profiles: {})",
                    pool.node_profile,
                    if known.is_empty() {
                        "none".to_string()
                    } else {
                        known.join(", ")
                    }
                )
            })?;
        let profile = MigProfile::parse(name)
            .ok_or_else(|| format!("mig_profile {name:?} is not of the form 1g.10gb"))?;
        for index in 0..gpus {
            mig.push(MigPartition {
                gpu: index,
                profile,
                count: spec.max_instances.min(7) as u8,
            });
        }
    }
    let labels = BTreeMap::from([
        ("nephele.io/pool".to_string(), pool.name.clone()),
        ("nephele.io/profile".to_string(), pool.node_profile.clone()),
        ("nephele.io/region".to_string(), region.to_string()),
        (
            "nephele.io/capacity-type".to_string(),
            pool.capacity_type.clone(),
        ),
    ]);
    let spot = pool.capacity_type == "spot";
    Ok((
        NodeSpec {
            name: String::new(),
            cpu_milli: u64::from(profile.device.cpu_cores) * 1000,
            memory_mib: profile.device.memory_mb,
            gpus,
            gpu_model: None,
            mig,
            nvlink_domain: Vec::new(),
            labels,
            taints: Vec::new(),
            location: Default::default(),
            capacity_type: if spot {
                CapacityType::Spot
            } else {
                CapacityType::OnDemand
            },
            price_micro_usd_per_hour: (pool.price_per_hour.max(0.0) * 1e6) as u64,
            interruptions_per_1000h: pool.interruptions_per_1000h,
        },
        gpu.filter(|_| gpus > 0).map(|g| g.model.clone()),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_api_is_https_unless_plain_http_is_asked_for_and_then_on_loopback() {
        let config = CloudConfig::default();
        assert!(!config.api.plain_http && config.api.tls_cert.is_none());
        for good in [
            "[api]\nplain_http = true\n[[region]]\nname=\"a\"",
            "api_listen = \"0.0.0.0:8080\"\n[api]\nplain_http = true\nplain_http_any_address = true\n[[region]]\nname=\"a\"",
            "api_listen = \"0.0.0.0:8080\"\n[api]\ntls_cert = \"c.pem\"\ntls_key = \"k.pem\"\n[[region]]\nname=\"a\"",
        ] {
            CloudConfig::from_toml(good).unwrap_or_else(|e| panic!("{good}: {e}"));
        }
        let refused = CloudConfig::from_toml(
            "api_listen = \"0.0.0.0:8080\"\n[api]\nplain_http = true\n[[region]]\nname=\"a\"",
        )
        .unwrap_err();
        assert!(
            refused.contains("only on a loopback address")
                && refused.contains("--plain-http-any-address"),
            "{refused}"
        );
    }

    #[test]
    fn defaults_are_valid_and_files_override_them() {
        CloudConfig::default().validate().expect("defaults valid");
        let config = CloudConfig::from_toml(
            r#"
api_listen = "127.0.0.1:9000"
[[region]]
name = "eu-west"
carbon_zone = "DE"
[[region.pool]]
name = "l4"
node_profile = "gpu-4x-l4"
capacity_type = "spot"
price_per_hour = 1.2
[[region]]
name = "us-east"
"#,
        )
        .expect("valid");
        assert_eq!(config.regions.len(), 2);
        assert_eq!(config.api_listen.port(), 9000);
        assert_eq!(config.quic_listen.port(), 7443);
        assert!(CloudConfig::from_toml("[[region]]\nname = \"A\"").is_err());
        let example = CloudConfig::from_toml(include_str!("../../../deploy/cloud.example.toml"))
            .expect("the shipped example is valid");
        assert_eq!(example.tenants.len(), 2);
        for bad in [
            "[scheduler]\npolicy = \"magic\"\n[[region]]\nname=\"a\"",
            "[[tenant]]\nname = \"t\"\nweight = 0\n[[region]]\nname=\"a\"",
            "[[region]]\nname=\"a\"\n[[region.pool]]\nname=\"p\"\nnode_profile=\"nope\"",
            "[[region]]\nname=\"a\"\n[[region.pool]]\nname=\"p\"\nnode_profile=\"gpu-4x-l4\"\nmax_nodes=0",
            "[[region]]\nname=\"a\"\n[[region.pool]]\nname=\"p\"\nnode_profile=\"gpu-4x-l4\"\nmig_profile=\"1g.10gb\"",
            "[[region]]\nname=\"auto\"",
            "[scheduler.region_weights]\ncarbon = -1\n[[region]]\nname=\"a\"",
            "[scheduler.region_weights]\ncarbon = 0\nprice = 0\ncapacity = 0\n[[region]]\nname=\"a\"",
            // Plain HTTP off loopback, or with a certificate; half a certificate.
            "api_listen = \"0.0.0.0:8080\"\n[api]\nplain_http = true\n[[region]]\nname=\"a\"",
            "[api]\nplain_http = true\ntls_cert = \"c.pem\"\ntls_key = \"k.pem\"\n[[region]]\nname=\"a\"",
            "[api]\ntls_cert = \"c.pem\"\n[[region]]\nname=\"a\"",
        ] {
            assert!(CloudConfig::from_toml(bad).is_err(), "{bad}");
        }
        assert!(CloudConfig::from_toml("bogus = 1").is_err());
        assert!(CloudConfig::from_toml("[[region]]\nname=\"a\"\n[[region]]\nname=\"a\"").is_err());
    }
}
