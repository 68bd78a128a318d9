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
//! | `desired-state.bin`   | the last desired state applied (`crate::persisted`) | 0600 |
//! | `removed.txt`         | why the control plane removed the device, once it has | 0600 |
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

/// Writes `path` atomically with permissions `mode` from its creation (a key is never
/// readable by others, not even between a write and a chmod): a temporary file created
/// with `mode`, synced, then renamed, and the directory synced so that the rename
/// itself survives a power cut.
pub fn write_file(path: &Path, bytes: &[u8], mode: u32) -> Result<()> {
    use std::io::Write as _;
    let tmp = path.with_extension("tmp");
    let _ = std::fs::remove_file(&tmp);
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create_new(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut options, mode);
    #[cfg(not(unix))]
    let _ = mode;
    let mut file = options
        .open(&tmp)
        .with_context(|| format!("cannot create {}", tmp.display()))?;
    file.write_all(bytes)
        .and_then(|()| file.sync_all())
        .with_context(|| format!("cannot write {}", tmp.display()))?;
    std::fs::rename(&tmp, path).with_context(|| format!("cannot write {}", path.display()))?;
    if let Some(dir) = path.parent().and_then(|p| std::fs::File::open(p).ok()) {
        // Best effort: some filesystems refuse to sync a directory.
        let _ = dir.sync_all();
    }
    Ok(())
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
        crate::renewal::roll_forward(data_dir)?;
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    #[cfg(unix)]
    fn files_are_written_whole_with_their_mode_and_replace_what_was_there() {
        use std::os::unix::fs::PermissionsExt as _;
        let dir = std::env::temp_dir().join(format!("nephele-write-file-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let key = dir.join("agent.key");
        // A temporary file left by a crash is not reused with its old mode.
        std::fs::write(key.with_extension("tmp"), b"stale").expect("stale tmp");
        write_file(&key, b"secret", 0o600).expect("written");
        let mode = std::fs::metadata(&key).expect("meta").permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        assert_eq!(std::fs::read(&key).expect("read"), b"secret");
        assert!(!key.with_extension("tmp").exists());
        write_file(&key, b"rotated", 0o600).expect("replaced");
        assert_eq!(std::fs::read(&key).expect("read"), b"rotated");
        write_file(&dir.join("agent.toml"), b"name = 'a'", 0o644).expect("config");
        let mode = std::fs::metadata(dir.join("agent.toml"))
            .expect("meta")
            .permissions()
            .mode()
            & 0o777;
        assert_eq!(mode, 0o644 & !umask_bits());
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// Bits the process's umask clears (read back from a file created 0o777).
    fn umask_bits() -> u32 {
        use std::os::unix::fs::{OpenOptionsExt as _, PermissionsExt as _};
        let probe = std::env::temp_dir().join(format!("nephele-umask-{}", std::process::id()));
        let _ = std::fs::remove_file(&probe);
        std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o777)
            .open(&probe)
            .expect("probe");
        let mode = std::fs::metadata(&probe)
            .expect("meta")
            .permissions()
            .mode()
            & 0o777;
        let _ = std::fs::remove_file(&probe);
        0o777 & !mode
    }
}
