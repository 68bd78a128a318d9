//! What `join` leaves in the data dir, and how `run` reads it back.
//!
//! | file                  | content                                      | mode |
//! |-----------------------|----------------------------------------------|------|
//! | `agent.toml`          | server, name, region, role, profile, labels  | 0644 |
//! | `ca.pem`              | cluster CA certificate                       | 0644 |
//! | `agent.pem`           | this agent's certificate                     | 0644 |
//! | `agent.key`           | this agent's private key (never leaves)      | 0600 |
//! | `manifest-signing.pub`| Ed25519 key that signs model manifests (hex) | 0644 |
//! | `models/<sha256>`     | verified model cache                         | 0644 |
//! | `jobs/`               | pool agents: job state, member logs and dirs (`crate::jobs`) | |

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::{Context as _, Result};
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AgentConfig {
    pub server: String,
    pub name: String,
    pub region: String,
    pub role: String,
    #[serde(default)]
    pub profile: Option<String>,
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
}

pub struct Enrolment {
    pub config: AgentConfig,
    pub ca_der: Vec<u8>,
    pub cert_der: Vec<u8>,
    pub key_pkcs8_der: Vec<u8>,
    pub signing_key: Vec<u8>,
    pub data_dir: PathBuf,
}

pub fn write_file(path: &Path, bytes: &[u8], mode: u32) -> Result<()> {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, bytes).with_context(|| format!("cannot write {}", tmp.display()))?;
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt as _;
        std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(mode))?;
    }
    #[cfg(not(unix))]
    let _ = mode;
    std::fs::rename(&tmp, path).with_context(|| format!("cannot write {}", path.display()))
}

impl Enrolment {
    pub fn load(data_dir: &Path) -> Result<Enrolment> {
        let config_path = data_dir.join("agent.toml");
        let text = std::fs::read_to_string(&config_path).with_context(|| {
            format!(
                "{} not found: enrol this device first with `nephele-edge join --server HOST:PORT --token TOKEN --data-dir {}`",
                config_path.display(),
                data_dir.display()
            )
        })?;
        let config: AgentConfig = toml::from_str(&text)
            .with_context(|| format!("{} is not a valid agent config", config_path.display()))?;
        let read_pem = |name: &str| -> Result<Vec<u8>> {
            let path = data_dir.join(name);
            let text = std::fs::read_to_string(&path)
                .with_context(|| format!("cannot read {}; re-run join", path.display()))?;
            nephele_net::pki::pem_to_der(&text)
                .with_context(|| format!("{} is not valid PEM", path.display()))
        };
        let signing_hex = std::fs::read_to_string(data_dir.join("manifest-signing.pub"))
            .context("cannot read manifest-signing.pub; re-run join")?;
        Ok(Enrolment {
            config,
            ca_der: read_pem("ca.pem")?,
            cert_der: read_pem("agent.pem")?,
            key_pkcs8_der: read_pem("agent.key")?,
            signing_key: hex::decode(signing_hex.trim())
                .context("manifest-signing.pub is not hex")?,
            data_dir: data_dir.to_path_buf(),
        })
    }
}
