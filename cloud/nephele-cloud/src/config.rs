//! Control-plane configuration: a TOML file, every field optional with sane defaults
//! so that `nephele-cloud` with no file at all starts a working single-region plane.

use std::net::SocketAddr;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct CloudConfig {
    /// Where the CA, keys, the redb state and model blobs live. Created on first start.
    pub data_dir: PathBuf,
    /// REST API and `/metrics`.
    pub api_listen: SocketAddr,
    /// QUIC gateway for agents (UDP).
    pub quic_listen: SocketAddr,
    /// Extra DNS names / IPs to put in the gateway certificate besides `nephele-cloud`.
    pub server_names: Vec<String>,
    /// How long a join token lives unless the request says otherwise.
    pub join_token_ttl_s: u64,
    pub heartbeat_interval_ms: u32,
    #[serde(rename = "region")]
    pub regions: Vec<RegionConfig>,
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

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
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
    #[serde(default)]
    pub max_nodes: u32,
}

fn default_capacity_type() -> String {
    "on-demand".into()
}

impl Default for CloudConfig {
    fn default() -> Self {
        CloudConfig {
            data_dir: PathBuf::from("nephele-data"),
            api_listen: SocketAddr::from(([127, 0, 0, 1], 8080)),
            quic_listen: SocketAddr::from(([127, 0, 0, 1], 7443)),
            server_names: vec!["localhost".into(), "127.0.0.1".into()],
            join_token_ttl_s: 3600,
            heartbeat_interval_ms: 1000,
            regions: vec![RegionConfig {
                name: "default".into(),
                carbon_zone: None,
                pools: vec![PoolConfig {
                    name: "gpu".into(),
                    node_profile: "gpu-4x-l4".into(),
                    capacity_type: "on-demand".into(),
                    price_per_hour: 3.0,
                    max_nodes: 4,
                }],
            }],
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
        if self.regions.is_empty() {
            return Err("at least one [[region]] is required".into());
        }
        let mut seen = std::collections::BTreeSet::new();
        for region in &self.regions {
            nephele_domain::validate_name("region", &region.name)?;
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
            }
        }
        if self.heartbeat_interval_ms < 100 {
            return Err("heartbeat_interval_ms must be at least 100".into());
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

#[cfg(test)]
mod tests {
    use super::*;

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
        assert!(CloudConfig::from_toml("bogus = 1").is_err());
        assert!(CloudConfig::from_toml("[[region]]\nname=\"a\"\n[[region]]\nname=\"a\"").is_err());
    }
}
