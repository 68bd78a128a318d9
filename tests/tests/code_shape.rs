//! The code stays a size one can carry on: no Rust source file outside the test crate
//! and vendored code is over 1,500 lines (a file holds one concern; a larger one is
//! split by concern into a module directory, as `client/`, `scheduler/` and `api/`).

use std::path::{Path, PathBuf};

const ROOT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/..");
const MAX_LINES: usize = 1500;

/// Every `.rs` file under `dir`, leaving out build output, the test crate's own
/// tests and vendored crates.
fn sources(root: &Path, dir: &Path, found: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        let relative = path.strip_prefix(root).unwrap_or(&path).to_path_buf();
        let skip = [
            "target",
            ".git",
            "tests/tests",
            "shared/vendor",
            "node_modules",
        ]
        .iter()
        .any(|s| relative == Path::new(s));
        if skip {
            continue;
        }
        if path.is_dir() {
            sources(root, &path, found);
        } else if path.extension().is_some_and(|e| e == "rs") {
            found.push(path);
        }
    }
}

#[test]
fn no_source_file_is_over_1500_lines() {
    let root = Path::new(ROOT).canonicalize().expect("workspace root");
    let mut files = Vec::new();
    sources(&root, &root, &mut files);
    assert!(
        files.len() > 100,
        "only {} sources found under {}",
        files.len(),
        root.display()
    );
    let mut over: Vec<String> = files
        .iter()
        .filter_map(|file| {
            let lines = std::fs::read_to_string(file).ok()?.lines().count();
            (lines > MAX_LINES).then(|| {
                format!(
                    "{} ({lines} lines)",
                    file.strip_prefix(&root).unwrap_or(file).display()
                )
            })
        })
        .collect();
    over.sort();
    assert!(
        over.is_empty(),
        "over {MAX_LINES} lines; split by concern into a module directory: {}",
        over.join(", ")
    );
}
