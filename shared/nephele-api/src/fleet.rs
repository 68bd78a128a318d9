//! The fleet: join tokens (`/v1/tokens`), devices (`/v1/devices`), what a device served
//! (`/v1/devices/{name}/usage`) and regions (`/v1/regions`).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// `POST /v1/tokens`: a join token for enrolling a device (an empty body takes the
/// defaults).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct TokenRequest {
    pub region: Option<String>,
    pub ttl_s: Option<u64>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct JoinTokenView {
    pub id: String,
    pub region: String,
    pub expires_unix: u64,
    pub used_by: Option<String>,
    /// Only present in the response that created it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct AcceleratorView {
    pub kind: String,
    pub model: String,
    pub count: u32,
    pub peak_int8_tops: f64,
}

/// The link to the control plane as the agent measures it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct LinkView {
    /// QUIC's smoothed round-trip time, µs.
    pub rtt_us: u64,
    /// Throughput of recent blob transfers, bits per second (0: nothing measured yet).
    pub bandwidth_bps: u64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct DeviceView {
    pub name: String,
    pub role: String,
    pub region: String,
    pub profile: String,
    pub labels: BTreeMap<String, String>,
    pub accelerators: Vec<AcceleratorView>,
    pub cpu_cores: u32,
    pub memory_mb: u64,
    /// `null` in an answer from a standby's copy (`?stale`): only the leader knows.
    pub online: Option<bool>,
    /// `healthy` (heartbeats on time), `stale` (late heartbeats), `offline`; `unknown`
    /// from a standby's copy.
    pub health: String,
    pub last_heartbeat_ms_ago: Option<u64>,
    pub connected_for_s: Option<u64>,
    /// The session now (numbered from 1 per control-plane start): a reconnect gets a
    /// new one, an address change or a short outage that QUIC rides out keeps it.
    pub session: Option<u64>,
    /// Where the control plane reaches the device now (IP:port as it sees it; follows
    /// QUIC connection migration).
    pub address: Option<String>,
    pub rss_bytes: Option<u64>,
    /// The link to the control plane as the agent measures it.
    pub link: Option<LinkView>,
    pub local_endpoint: Option<String>,
    /// Deployments it runs (`null` from a standby's copy).
    pub deployments: Option<usize>,
    /// What it runs, as its last heartbeat said, by deployment name (`null` from a
    /// standby's copy).
    #[serde(default)]
    pub running: Option<Vec<DeviceRunning>>,
}

/// A deployment on a device, as the device's last heartbeat reported it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct DeviceRunning {
    pub deployment: String,
    /// The variant it runs (empty before one loaded).
    pub variant: String,
    /// `ready`, `downloading`, `pending` or `failed: <why>`.
    pub phase: String,
    pub served_local: u64,
    pub served_offloaded: u64,
}

/// What one deployment served on a device, all windows reported so far.
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema,
)]
pub struct Served {
    pub served_local: u64,
    pub served_offloaded: u64,
    pub failed: u64,
}

impl Served {
    pub fn add(&mut self, other: &Served) {
        self.served_local = self.served_local.saturating_add(other.served_local);
        self.served_offloaded = self.served_offloaded.saturating_add(other.served_offloaded);
        self.failed = self.failed.saturating_add(other.failed);
    }
}

/// `GET /v1/devices/{name}/usage`: what a device reported serving, each usage record
/// counted once (also the control plane's record of it).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct UsageTotals {
    pub device: String,
    /// The highest record counted; records up to it are acknowledged.
    pub last_seq: u64,
    /// Records counted.
    pub records: u64,
    /// Records the device dropped because its queue was full (never counted).
    pub dropped: u64,
    /// The first and last window counted, Unix milliseconds (0: none).
    pub first_unix_ms: u64,
    pub last_unix_ms: u64,
    pub deployments: BTreeMap<String, Served>,
}

/// A region's pool of GPU nodes as the API shows it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct PoolView {
    pub name: String,
    /// The firmware profile of its nodes, e.g. `gpu-4x-l4`.
    pub node_profile: String,
    /// `on-demand` or `spot`.
    pub capacity_type: String,
    pub price_per_hour: f64,
    pub max_nodes: u32,
    pub mig_profile: Option<String>,
    pub interruptions_per_1000h: u32,
    /// `none` (enrolled by hand), `local` or `command`.
    pub provider: String,
    pub min_nodes: u32,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct RegionView {
    pub name: String,
    pub carbon_zone: Option<String>,
    pub pools: Vec<PoolView>,
    pub devices: usize,
    /// Devices online now (`null` from a standby's copy).
    pub online: Option<usize>,
    /// Its devices counted by health: `healthy`, `stale` (connected, heartbeats late)
    /// and `offline`, as `GET /v1/devices` shows each (`null` from a standby's copy).
    #[serde(default)]
    pub health: Option<BTreeMap<String, usize>>,
}

/// `POST /v1/regions/{name}/nodes/{node}/interrupt`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct InterruptBody {
    /// Seconds until the node goes (a spot interruption notice; AWS gives 120).
    #[serde(default = "default_notice_s")]
    pub notice_s: u64,
}

impl Default for InterruptBody {
    fn default() -> Self {
        InterruptBody {
            notice_s: default_notice_s(),
        }
    }
}

fn default_notice_s() -> u64 {
    120
}
