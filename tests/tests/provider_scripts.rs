//! The `command` provider's example scripts (`deploy/providers/`): a Kubernetes
//! StatefulSet of pool agents and Google Cloud's CLI. `deploy/providers/test.sh` runs
//! them against fake `kubectl`, `gcloud`, `curl` and `nephele-edge` executables that
//! record what they were asked and answer as the real tools would; it checks the calls,
//! that the join token never appears on a command line, and the error paths.

#[test]
fn the_example_provider_scripts_call_their_tools_as_documented() {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../deploy/providers/test.sh");
    let output = std::process::Command::new("bash")
        .arg(script)
        .output()
        .expect("run deploy/providers/test.sh");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(
        output.status.success(),
        "deploy/providers/test.sh failed:\n{text}"
    );
    assert!(text.contains("checks passed, 0 failed"), "{text}");
}
