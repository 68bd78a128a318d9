//! Replays every file of `corpus/<target>/` and `regressions/<target>/` through the
//! target's function, without AFL: a crash kept as a regression fails here until it is
//! fixed. The agent's and control plane's targets are tested only with their features:
//! all of them with `cargo test --features edge,cloud`. The test command replays those
//! three through the workspace's build instead (`tests/tests/fuzz_seeds.rs`), which
//! already holds the agent and the control plane.

use std::path::Path;

fn replay(target: &str) {
    let body = nephele_fuzz::target(target)
        .unwrap_or_else(|| panic!("{target} is not built without its feature"));
    let here = Path::new(env!("CARGO_MANIFEST_DIR"));
    for file in nephele_fuzz::seeds(here, target).expect("the target's inputs") {
        let bytes = std::fs::read(&file).expect("read input");
        eprintln!("{target}: {}", file.display());
        body(&bytes);
    }
}

#[test]
fn every_target_is_listed() {
    let here = Path::new(env!("CARGO_MANIFEST_DIR"));
    for (name, _) in nephele_fuzz::TARGETS {
        assert!(
            here.join("src/bin").join(format!("{name}.rs")).is_file(),
            "{name}"
        );
        assert!(here.join("corpus").join(name).is_dir(), "corpus/{name}");
    }
}

#[test]
fn frame_decoder() {
    replay("frame_decoder");
}

#[test]
fn firmware_profile() {
    replay("firmware_profile");
}

// The agent's and control plane's targets exist only with their features (a test that
// skipped would pass while checking nothing).
#[cfg(feature = "edge")]
#[test]
fn manifest() {
    replay("manifest");
}

#[cfg(feature = "edge")]
#[test]
fn onnx() {
    replay("onnx");
}

#[cfg(feature = "cloud")]
#[test]
fn cloud_config() {
    replay("cloud_config");
}
