//! Model pushes answered `202 building` survive a control-plane crash.
//!
//! A build runs on a thread and lives in memory (the federation's `builds` module); before
//! this journal, a control plane killed mid-build forgot a push it had acknowledged, and
//! the model was gone. Now the push, as it came (the body and its query), is kept in
//! `<data dir>/pushes/` before the answer, and forgotten when its build is stored or has
//! failed; at start every push still kept is built again (the same file under the same
//! name, so a push whose model was stored just before the crash finds it and ends).
//!
//! | file          | content                                            |
//! |---------------|----------------------------------------------------|
//! | `NAME.body`   | the request body as uploaded                       |
//! | `NAME.json`   | query, content type, the body's length and SHA-256 |
//!
//! The body is written first and the description last, each atomically (0600: a model
//! may be proprietary), so a description names a whole body; one found without its
//! body, or with a body that does not match, is dropped with a warning, as is a body
//! without a description (a crash before the push was acknowledged).

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// The journal directory.
#[derive(Debug, Clone)]
pub struct PendingPushes {
    dir: PathBuf,
}

/// A push kept until its build ends.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct KeptPush {
    pub name: String,
    pub query: Vec<(String, String)>,
    pub is_json: bool,
    pub body_len: u64,
    pub body_sha256: String,
}

impl PendingPushes {
    pub fn open(data_dir: &Path) -> std::io::Result<PendingPushes> {
        let dir = data_dir.join("pushes");
        std::fs::create_dir_all(&dir)?;
        Ok(PendingPushes { dir })
    }

    fn paths(&self, name: &str) -> (PathBuf, PathBuf) {
        (
            self.dir.join(format!("{name}.body")),
            self.dir.join(format!("{name}.json")),
        )
    }

    /// Keeps a push before it is acknowledged.
    pub fn keep(
        &self,
        name: &str,
        query: &[(String, String)],
        is_json: bool,
        body: &[u8],
    ) -> anyhow::Result<()> {
        let (body_path, meta_path) = self.paths(name);
        crate::write_secret(&body_path, body)?;
        let kept = KeptPush {
            name: name.to_string(),
            query: query.to_vec(),
            is_json,
            body_len: body.len() as u64,
            body_sha256: crate::clock::sha256_hex(body),
        };
        crate::write_secret(&meta_path, &serde_json::to_vec(&kept)?)?;
        sync_dir(&self.dir);
        Ok(())
    }

    /// Forgets a push whose build has ended (stored or failed).
    pub fn forget(&self, name: &str) {
        let (body_path, meta_path) = self.paths(name);
        // The description first: a body without one is dropped at the next start.
        for path in [meta_path, body_path] {
            if let Err(error) = std::fs::remove_file(&path) {
                if error.kind() != std::io::ErrorKind::NotFound {
                    tracing::warn!(path = %path.display(), %error, "cannot remove a finished push");
                }
            }
        }
    }

    /// The pushes still kept, with their bodies; what is damaged or incomplete is
    /// dropped (and logged).
    pub fn kept(&self) -> Vec<(KeptPush, Vec<u8>)> {
        let Ok(entries) = std::fs::read_dir(&self.dir) else {
            return Vec::new();
        };
        let mut names: Vec<String> = entries
            .filter_map(|entry| entry.ok())
            .filter_map(|entry| entry.file_name().to_str().map(str::to_string))
            .filter_map(|file| {
                file.strip_suffix(".json")
                    .or_else(|| file.strip_suffix(".body"))
                    .map(str::to_string)
            })
            .collect();
        names.sort();
        names.dedup();
        let mut found = Vec::new();
        for name in names {
            match self.read(&name) {
                Ok(push) => found.push(push),
                Err(reason) => {
                    tracing::warn!(model = %name, %reason, "dropping a push kept before a restart");
                    self.forget(&name);
                }
            }
        }
        found
    }

    fn read(&self, name: &str) -> Result<(KeptPush, Vec<u8>), String> {
        let (body_path, meta_path) = self.paths(name);
        let meta = std::fs::read(&meta_path).map_err(|_| {
            "its body is there but not its description: it was never acknowledged".to_string()
        })?;
        let kept: KeptPush =
            serde_json::from_slice(&meta).map_err(|e| format!("unreadable description: {e}"))?;
        let body = std::fs::read(&body_path).map_err(|e| format!("its body is missing: {e}"))?;
        if body.len() as u64 != kept.body_len
            || crate::clock::sha256_hex(&body) != kept.body_sha256
            || kept.name != name
        {
            return Err("its body does not match its description".into());
        }
        Ok((kept, body))
    }
}

fn sync_dir(dir: &Path) {
    if let Ok(dir) = std::fs::File::open(dir) {
        let _ = dir.sync_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_kept_push_comes_back_until_forgotten_and_a_damaged_one_is_dropped() {
        let dir = std::env::temp_dir().join(format!(
            "nephele-pushes-{}-{}",
            std::process::id(),
            rand::random::<u32>()
        ));
        let pushes = PendingPushes::open(&dir).unwrap();
        assert!(pushes.kept().is_empty());
        let query = vec![("input".to_string(), "x=1,4".to_string())];
        pushes.keep("digits", &query, false, b"onnx bytes").unwrap();
        pushes.keep("other", &[], true, b"{}").unwrap();
        let kept = pushes.kept();
        assert_eq!(kept.len(), 2);
        assert_eq!(kept[0].0.name, "digits");
        assert_eq!(kept[0].0.query, query);
        assert_eq!(kept[0].1, b"onnx bytes");
        assert!(kept[1].0.is_json);

        pushes.forget("digits");
        assert_eq!(pushes.kept().len(), 1);
        // A body changed on disk, and a body whose description never came: dropped.
        std::fs::write(dir.join("pushes/other.body"), b"{ }").unwrap();
        std::fs::write(dir.join("pushes/orphan.body"), b"half").unwrap();
        assert!(pushes.kept().is_empty());
        assert_eq!(std::fs::read_dir(dir.join("pushes")).unwrap().count(), 0);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
