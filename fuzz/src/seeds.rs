//! The inputs a replay feeds a target: every file of `corpus/<target>/` and then of
//! `regressions/<target>/`, each folder sorted by name. Used by `tests/replay.rs` and,
//! included by path, by the workspace's `tests/tests/fuzz_seeds.rs`.

use std::path::{Path, PathBuf};

/// `fuzz_dir` is this crate's folder. Fails when the corpus has no seed: a replay
/// that fed nothing would pass while checking nothing.
pub fn seeds(fuzz_dir: &Path, target: &str) -> Result<Vec<PathBuf>, String> {
    let corpus = files(&fuzz_dir.join("corpus").join(target))?;
    if corpus.is_empty() {
        return Err(format!(
            "{}: no seeds (fuzz/README.md, \"Corpora\", says how to write them)",
            fuzz_dir.join("corpus").join(target).display()
        ));
    }
    let regressions = fuzz_dir.join("regressions").join(target);
    let kept = if regressions.is_dir() {
        files(&regressions)?
    } else {
        Vec::new()
    };
    Ok(corpus.into_iter().chain(kept).collect())
}

fn files(dir: &Path) -> Result<Vec<PathBuf>, String> {
    let entries = std::fs::read_dir(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let mut files = Vec::new();
    for entry in entries {
        let path = entry.map_err(|e| format!("{}: {e}", dir.display()))?.path();
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
        if path.is_file() && name != ".gitkeep" && name != "README.md" {
            files.push(path);
        }
    }
    files.sort();
    Ok(files)
}
