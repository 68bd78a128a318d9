//! The fuzz targets of the agent and the control plane (`manifest`, `onnx`,
//! `cloud_config`), replayed over their corpora and kept crashes in every run of the
//! test command. `fuzz/`'s own `cargo test` replays them only with its `edge` and
//! `cloud` features, which build the agent and the control plane a second time; here
//! the target bodies are the very files the AFL++ binaries run (included by path), on
//! the workspace's one build. A seed or a kept crash that panics, aborts or hangs one of
//! them fails this test until the bug is fixed (fuzz/regressions/README.md).

#[path = "../../fuzz/src/cloud_targets.rs"]
mod cloud_targets;
#[path = "../../fuzz/src/edge_targets.rs"]
mod edge_targets;
#[path = "../../fuzz/src/seeds.rs"]
mod seeds;

use std::path::{Path, PathBuf};

fn fuzz_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz")
}

/// Feeds every input of `target` to `body`; returns how many it fed.
fn replay(target: &str, body: fn(&[u8])) -> usize {
    let inputs = seeds::seeds(&fuzz_dir(), target).unwrap_or_else(|e| panic!("{e}"));
    for file in &inputs {
        let bytes = std::fs::read(file).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
        eprintln!("{target}: {} ({} bytes)", file.display(), bytes.len());
        body(&bytes);
    }
    inputs.len()
}

#[test]
fn manifest_seeds_and_kept_crashes() {
    assert!(replay("manifest", edge_targets::manifest) > 0);
}

#[test]
fn onnx_seeds_and_kept_crashes() {
    // The corpus holds whole models and truncated and corrupted ones: uploads that
    // load and uploads that must be refused with an error. A panic of tract's parser
    // that the runtime catches (`guard_parser`) prints its message here and is an
    // answer, not a failure; only one that escapes fails the test.
    assert!(replay("onnx", edge_targets::onnx) > 0);
}

#[test]
fn cloud_config_seeds_and_kept_crashes() {
    assert!(replay("cloud_config", cloud_targets::cloud_config) > 0);
}

/// The AFL++ binaries' list and this file's must not drift apart.
#[test]
fn every_agent_and_control_plane_target_is_replayed_here() {
    let lib = std::fs::read_to_string(fuzz_dir().join("src/lib.rs")).expect("fuzz/src/lib.rs");
    for (name, feature) in [
        ("manifest", "edge"),
        ("onnx", "edge"),
        ("cloud_config", "cloud"),
    ] {
        assert!(
            lib.contains(&format!("(\"{name}\", Some(\"{feature}\"))")),
            "fuzz/src/lib.rs no longer lists {name} under {feature}: update this file"
        );
    }
    // The `TARGETS` entries with a feature: lines `("name", Some("feature")),`.
    let listed = lib
        .lines()
        .filter(|line| line.trim_start().starts_with("(\"") && line.contains(", Some(\""))
        .count();
    assert_eq!(
        listed, 3,
        "fuzz/src/lib.rs lists another featured target: replay it here"
    );
}
