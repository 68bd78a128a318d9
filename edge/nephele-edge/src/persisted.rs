//! What the agent keeps on the device so that it serves without the control plane
//! (offline-first): the last desired state it was sent, and, once the control plane
//! has removed the device from the fleet, why.
//!
//! | file                  | content                                                        |
//! |-----------------------|----------------------------------------------------------------|
//! | `desired-state.bin`   | magic `NPHDS1`, the SHA-256 of the rest, the desired state (the wire's encoding) |
//! | `removed.txt`         | the control plane's reason, present once the device was removed |
//!
//! The desired state carries each deployment's signed manifest, and the models are in
//! the verified cache (`models/<sha256>`). After a restart the agent applies the kept
//! state as it would a fresh one: each manifest's Ed25519 signature is checked, each
//! blob's SHA-256 is checked when it is read, and what fails is refused (and fetched
//! again once the control plane answers). The checksum here only tells a torn or
//! damaged file from a valid one, so that it is refused as a whole with a clear reason
//! instead of being half decoded. Written atomically (temporary file, sync, rename,
//! directory sync), 0600: nothing in it is secret, but it says what the device runs.

use std::path::Path;

use nephele_proto::{decode_payload, encode_payload, DesiredState};

use crate::config::write_file;

pub const DESIRED_FILE: &str = "desired-state.bin";
pub const REMOVED_FILE: &str = "removed.txt";
const MAGIC: &[u8; 6] = b"NPHDS1";

/// Keeps `desired` as the state to serve after a restart.
pub fn save_desired(data_dir: &Path, desired: &DesiredState) -> anyhow::Result<()> {
    let payload = encode_payload(desired)?;
    let mut bytes = Vec::with_capacity(MAGIC.len() + 32 + payload.len());
    bytes.extend_from_slice(MAGIC);
    bytes.extend_from_slice(ring::digest::digest(&ring::digest::SHA256, &payload).as_ref());
    bytes.extend_from_slice(&payload);
    write_file(&data_dir.join(DESIRED_FILE), &bytes, 0o600)
}

/// The kept desired state: `Ok(None)` when there is none, `Err` with the reason when
/// the file is there but is not a whole, valid one.
pub fn load_desired(data_dir: &Path) -> Result<Option<DesiredState>, String> {
    let path = data_dir.join(DESIRED_FILE);
    let bytes = match std::fs::read(&path) {
        Ok(bytes) => bytes,
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(error) => return Err(format!("cannot read {}: {error}", path.display())),
    };
    decode_desired(&bytes).map(Some)
}

fn decode_desired(bytes: &[u8]) -> Result<DesiredState, String> {
    let header = MAGIC.len() + 32;
    if bytes.len() < header || &bytes[..MAGIC.len()] != MAGIC {
        return Err("not a desired-state file (bad header or cut short)".into());
    }
    let (sum, payload) = bytes[MAGIC.len()..].split_at(32);
    if ring::digest::digest(&ring::digest::SHA256, payload).as_ref() != sum {
        return Err("checksum mismatch: the file is damaged or was cut short".into());
    }
    decode_payload(payload).map_err(|error| format!("cannot decode: {error}"))
}

/// Forgets the kept desired state (a missing file is fine).
pub fn forget_desired(data_dir: &Path) -> std::io::Result<()> {
    match std::fs::remove_file(data_dir.join(DESIRED_FILE)) {
        Err(error) if error.kind() != std::io::ErrorKind::NotFound => Err(error),
        _ => Ok(()),
    }
}

/// Records that the control plane removed this device, and why.
pub fn save_removed(data_dir: &Path, reason: &str) -> anyhow::Result<()> {
    write_file(&data_dir.join(REMOVED_FILE), reason.as_bytes(), 0o600)
}

/// Why the control plane removed this device, if it did.
pub fn load_removed(data_dir: &Path) -> Option<String> {
    std::fs::read_to_string(data_dir.join(REMOVED_FILE))
        .ok()
        .map(|reason| reason.trim().to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state() -> DesiredState {
        DesiredState {
            generation: 7,
            assignments: Vec::new(),
            jobs: Vec::new(),
        }
    }

    fn dir(label: &str) -> std::path::PathBuf {
        let dir = std::env::temp_dir().join(format!(
            "nephele-persisted-{label}-{}-{}",
            std::process::id(),
            rand::random::<u32>()
        ));
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    #[test]
    fn a_kept_state_comes_back_whole_and_a_damaged_one_is_refused() {
        let dir = dir("roundtrip");
        assert_eq!(load_desired(&dir), Ok(None));
        save_desired(&dir, &state()).unwrap();
        assert_eq!(load_desired(&dir), Ok(Some(state())));
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt as _;
            let mode = std::fs::metadata(dir.join(DESIRED_FILE))
                .unwrap()
                .permissions()
                .mode();
            assert_eq!(mode & 0o777, 0o600);
        }

        let good = std::fs::read(dir.join(DESIRED_FILE)).unwrap();
        // One bit flipped in the payload, the file cut short, a foreign file, nothing.
        let mut flipped = good.clone();
        *flipped.last_mut().unwrap() ^= 1;
        let damaged: [(&[u8], &str); 4] = [
            (&flipped, "checksum mismatch"),
            (&good[..good.len() - 1], "checksum mismatch"),
            (b"{\"generation\": 7}", "not a desired-state file"),
            (b"", "not a desired-state file"),
        ];
        for (bytes, reason) in damaged {
            std::fs::write(dir.join(DESIRED_FILE), bytes).unwrap();
            let error = load_desired(&dir).unwrap_err();
            assert!(error.contains(reason), "{error}");
        }
        forget_desired(&dir).unwrap();
        forget_desired(&dir).unwrap();
        assert_eq!(load_desired(&dir), Ok(None));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn the_removal_reason_is_kept() {
        let dir = dir("removed");
        assert_eq!(load_removed(&dir), None);
        save_removed(&dir, "this device was deleted from the fleet\n").unwrap();
        assert_eq!(
            load_removed(&dir).as_deref(),
            Some("this device was deleted from the fleet")
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
