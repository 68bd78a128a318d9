//! Architecture invariants on the dependency graph (see ARCHITECTURE.md): pure crates
//! carry no async runtime, actor system, QUIC or ML runtime; the edge agent does not
//! link actix-web.

use std::process::Command;

fn dependency_tree(package: &str) -> Vec<String> {
    let output = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
        .current_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/.."))
        .args([
            "tree",
            "--offline",
            "-p",
            package,
            "-e",
            "normal",
            "--prefix",
            "none",
            "--format",
            "{p}",
        ])
        .output()
        .expect("run cargo tree");
    assert!(
        output.status.success(),
        "cargo tree failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout)
        .lines()
        .filter_map(|line| line.split_whitespace().next().map(str::to_string))
        .collect()
}

fn assert_free_of(package: &str, forbidden: &[&str]) {
    let tree = dependency_tree(package);
    assert!(
        tree.iter().any(|name| name == package),
        "{package} not in its own tree: {tree:?}"
    );
    for name in forbidden {
        assert!(
            !tree.iter().any(|dep| dep == name),
            "{package} must not depend on {name}"
        );
    }
}

const RUNTIMES: &[&str] = &[
    "tokio",
    "actix",
    "actix-web",
    "actix-rt",
    "quinn",
    "tract-onnx",
    "tract-core",
    "candle-core",
];

#[test]
fn pure_crates_have_no_runtime_in_their_dependency_tree() {
    for package in [
        "nephele-domain",
        "nephele-api",
        "nephele-proto",
        "nephele-telemetry",
        "nephele-placement",
        "nephele-autoscale",
        "nephele-sim",
    ] {
        assert_free_of(package, RUNTIMES);
    }
}

/// The API's contract is serde and schemars only: a client links no server, wire,
/// store or runtime crate for it.
#[test]
fn the_api_crate_is_serde_only() {
    let tree = dependency_tree("nephele-api");
    for name in &tree {
        assert!(
            !name.starts_with("nephele-") || name == "nephele-api",
            "nephele-api must not depend on {name}"
        );
    }
    assert_free_of("nephele-api", RUNTIMES);
    assert_free_of(
        "nephele-api",
        &["ureq", "redb", "bincode", "rustls", "prost"],
    );
}

#[test]
fn the_edge_agent_does_not_link_the_control_plane() {
    assert_free_of(
        "nephele-edge",
        &["actix-web", "actix", "redb", "nephele-cloud"],
    );
}
