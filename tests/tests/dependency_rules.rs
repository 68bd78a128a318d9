//! Architecture invariants on the dependency graph (see ARCHITECTURE.md): pure crates
//! carry no async runtime, actor system, QUIC or ML runtime; the edge agent does not
//! link actix-web.

use std::process::Command;

/// `cargo tree --offline ARGS`' output, from the workspace root.
fn cargo_tree(args: &[&str]) -> String {
    let output = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
        .current_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/.."))
        .args(["tree", "--offline"])
        .args(args)
        .output()
        .expect("run cargo tree");
    assert!(
        output.status.success(),
        "cargo tree failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}

fn dependency_tree(package: &str) -> Vec<String> {
    dependency_tree_with(package, &[])
}

fn dependency_tree_with(package: &str, extra: &[&str]) -> Vec<String> {
    let mut args = vec![
        "-p", package, "-e", "normal", "--prefix", "none", "--format", "{p}",
    ];
    args.extend_from_slice(extra);
    cargo_tree(&args)
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

/// The agent as it ships (its default features, README "The agent's binary") carries
/// none of the optional crates that make it large: candle, tract's attention operators
/// (tract-transformers), OTLP/gRPC (h2). (rustfft stays in the tree, a dependency of
/// tract-core; the linker drops it when no FFT operator is registered, `onnx-fft`.)
#[test]
fn the_agent_as_it_ships_leaves_its_optional_parts_out() {
    let tree = dependency_tree("nephele-edge");
    assert!(tree.iter().any(|name| name == "tract-onnx"), "{tree:?}");
    for name in ["candle-core", "h2", "tract-transformers"] {
        assert!(
            !tree.iter().any(|dep| dep == name),
            "the shipped agent must not link {name}"
        );
    }
}

/// `package version` → its features, for the whole workspace with these edge kinds.
fn features(edges: &str) -> std::collections::BTreeMap<String, String> {
    cargo_tree(&[
        "--workspace",
        "-e",
        edges,
        "--prefix",
        "none",
        "--format",
        "{p}|{f}",
    ])
    .lines()
    .filter_map(|line| {
        let (package, features) = line.split_once('|')?;
        // `name vX.Y.Z (path)`: the name and version say which crate it is.
        let mut words = package.split_whitespace();
        let key = format!("{} {}", words.next()?, words.next()?);
        let features = features.trim().trim_end_matches("(*)").trim().to_string();
        Some((key, features))
    })
    .collect()
}

/// The README's two commands share one build: `cargo test --release --workspace`
/// (dev-dependencies included) must not turn on a feature of any crate that `cargo run`
/// and `cargo build --release --workspace` also build, or everything above that crate
/// is compiled twice (it was 17 minutes once, when proptest's defaults turned on
/// features of regex-syntax, rustix and bit-vec).
#[test]
fn tests_and_binaries_build_every_shared_crate_with_the_same_features() {
    let built = features("normal,build");
    let tested = features("normal,build,dev");
    let differ: Vec<String> = built
        .iter()
        .filter_map(|(package, features)| {
            let with_tests = tested.get(package)?;
            (with_tests != features)
                .then(|| format!("{package}: [{features}] built, [{with_tests}] tested"))
        })
        .collect();
    assert!(
        differ.is_empty(),
        "dev-dependencies change the features of crates the binaries share, so the test command would build them again: {differ:#?}; turn those features off in the dev-dependency (default-features = false) or on in the workspace"
    );
}
