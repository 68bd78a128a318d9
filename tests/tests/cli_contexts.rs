//! The CLI as kubectl users expect it, run as a binary against a real control plane:
//! `nephele login` checks a token and saves it as a context (0600), later commands take
//! their API and token from it, `nephele context list|use|current|delete`, `-o
//! json|yaml`, and shell completions.

#![allow(clippy::unwrap_used)]

use std::path::Path;
use std::process::Command;

use nephele_e2e::{bin, temp_dir, Cloud};
use serde_json::Value;

/// Runs `nephele args` with only `config` for its contexts (no API or token in the
/// environment): success, stdout, stderr.
fn nephele(config: &Path, args: &[&str]) -> (bool, String, String) {
    let output = Command::new(bin("nephele"))
        .args(args)
        .env_remove("NEPHELE_API")
        .env_remove("NEPHELE_TOKEN")
        .env_remove("NEPHELE_CA")
        .env("NEPHELE_CLI_CONFIG", config)
        .output()
        .unwrap();
    (
        output.status.success(),
        String::from_utf8_lossy(&output.stdout).to_string(),
        String::from_utf8_lossy(&output.stderr).to_string(),
    )
}

#[test]
fn login_saves_a_context_that_later_commands_use() {
    let cloud = Cloud::start("contexts").expect("cloud");
    let dir = temp_dir("cli-contexts");
    let config = dir.join("nephele.toml");
    let token_file = cloud.dir.join("data").join("admin-token");
    assert!(token_file.exists(), "{}", token_file.display());

    // The API is HTTPS with a certificate from the cluster CA: without the CA the
    // login is refused at the TLS check, saying what to give, and nothing is saved.
    let ca = cloud.ca_path();
    let ca = ca.to_str().unwrap();
    let (ok, _, err) = nephele(
        &config,
        &[
            "login",
            "--api",
            &cloud.api,
            "--token-file",
            token_file.to_str().unwrap(),
        ],
    );
    assert!(
        !ok && err.contains("did not pass the TLS check") && err.contains("--ca"),
        "{err}"
    );
    // A TLS failure is not blamed on the token.
    assert!(!err.contains("did not accept this token"), "{err}");
    assert!(!config.exists());
    // So is a CA file that holds no certificate.
    let (ok, _, err) = nephele(
        &config,
        &[
            "login",
            "--api",
            &cloud.api,
            "--ca",
            token_file.to_str().unwrap(),
            "--token-file",
            token_file.to_str().unwrap(),
        ],
    );
    assert!(!ok && err.contains("holds no PEM certificate"), "{err}");
    assert!(!config.exists());
    // A wrong token is refused at login, and nothing is saved.
    let wrong = dir.join("wrong-token");
    std::fs::write(&wrong, "forged.token").unwrap();
    let (ok, _, err) = nephele(
        &config,
        &[
            "login",
            "--api",
            &cloud.api,
            "--ca",
            ca,
            "--token-file",
            wrong.to_str().unwrap(),
            "--name",
            "lab",
        ],
    );
    assert!(!ok && err.contains("401"), "{err}");
    assert!(!config.exists());

    let (ok, out, err) = nephele(
        &config,
        &[
            "login",
            "--api",
            &cloud.api,
            "--ca",
            ca,
            "--token-file",
            token_file.to_str().unwrap(),
            "--name",
            "lab",
        ],
    );
    assert!(ok, "{out}{err}");
    assert!(out.contains("context lab is current"), "{out}");
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt as _;
        let mode = std::fs::metadata(&config).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
    }
    // The token stays in its file; the config names the file, and keeps the CA (so
    // later commands check the API's certificate against it with no flag).
    let saved = std::fs::read_to_string(&config).unwrap();
    assert!(!saved.contains(&cloud.token), "{saved}");
    assert!(saved.contains("BEGIN CERTIFICATE"), "{saved}");

    // Commands now reach the control plane with the context's API and token.
    let (ok, out, err) = nephele(&config, &["region", "list", "--json"]);
    assert!(ok, "{err}");
    let regions: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(regions.as_array().unwrap().len(), 2, "{out}");
    let (ok, out, err) = nephele(&config, &["tenant", "list", "-o", "yaml"]);
    assert!(ok, "{err}");
    assert!(out.starts_with("- api_tokens: 1\n"), "{out}");
    assert!(out.contains("  name: \"default\"\n"), "{out}");
    let (ok, out, _) = nephele(&config, &["tenant", "list", "-o", "json"]);
    assert!(ok);
    let tenants: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(tenants[0]["name"], "default");

    // A second context; `use` switches, `current` says which, `delete` forgets.
    let (ok, _, err) = nephele(
        &config,
        &[
            "login",
            "--api",
            &cloud.api,
            "--ca",
            ca,
            "--token-file",
            token_file.to_str().unwrap(),
            "--name",
            "other",
        ],
    );
    assert!(ok, "{err}");
    let (ok, out, _) = nephele(&config, &["context", "list"]);
    assert!(
        ok && out.contains("*  other") && out.contains("lab"),
        "{out}"
    );
    let (ok, out, _) = nephele(&config, &["context", "use", "lab"]);
    assert!(ok, "{out}");
    let (ok, out, _) = nephele(&config, &["context", "current"]);
    assert!(ok && out.starts_with("lab ("), "{out}");
    let (ok, _, err) = nephele(&config, &["context", "use", "nowhere"]);
    assert!(!ok && err.contains("no context \"nowhere\""), "{err}");
    let (ok, _, _) = nephele(&config, &["context", "delete", "lab"]);
    assert!(ok);
    let (ok, _, err) = nephele(&config, &["context", "current"]);
    assert!(!ok && err.contains("no current context"), "{err}");

    // Shell completions name the commands.
    for shell in ["bash", "zsh", "fish"] {
        let (ok, out, err) = nephele(&config, &["completion", shell]);
        assert!(ok, "{err}");
        assert!(
            out.contains("api-token") && out.contains("rollout"),
            "{shell}"
        );
    }
}

/// `--log-format json` gives one JSON object per log line (for log collectors) and a
/// format that is not one is refused, saying which are.
#[test]
fn log_format_flag_gives_json_lines() {
    let dir = temp_dir("log-format");
    let (ok, _, err) = {
        let output = Command::new(bin("nephele-cloud"))
            .args(["--log-format", "yaml", "--print-config"])
            .output()
            .unwrap();
        (
            output.status.success(),
            String::from_utf8_lossy(&output.stdout).to_string(),
            String::from_utf8_lossy(&output.stderr).to_string(),
        )
    };
    assert!(!ok && err.contains("use text or json"), "{err}");

    let log = dir.join("cloud.log");
    let mut child = Command::new(bin("nephele-cloud"))
        .args([
            "--log-format",
            "json",
            "--api-listen",
            "127.0.0.1:0",
            "--quic-listen",
            "127.0.0.1:0",
            "--data-dir",
        ])
        .arg(dir.join("data"))
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let begun = std::time::Instant::now();
    let lines = loop {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        let lines: Vec<Value> = text
            .lines()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .collect();
        if !lines.is_empty() || begun.elapsed() > std::time::Duration::from_secs(30) {
            break lines;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    };
    std::thread::sleep(std::time::Duration::from_millis(500));
    let _ = child.kill();
    let _ = child.wait();
    assert!(
        !lines.is_empty(),
        "{}",
        std::fs::read_to_string(&log).unwrap_or_default()
    );
    for line in &lines {
        assert!(
            line["level"].is_string() && line["fields"].is_object(),
            "{line}"
        );
    }
    let text = std::fs::read_to_string(&log).unwrap();
    // Every other line is the first start's admin-token banner, printed for the
    // operator (not a log record).
    for line in text.lines() {
        assert!(
            serde_json::from_str::<Value>(line).is_ok()
                || line.starts_with("nephele-cloud: created the admin API token")
                || line.starts_with("  "),
            "{line}"
        );
    }
    assert!(!text.contains('\u{1b}'), "no escape codes");
}

/// Corners a new user hit: a CA file that cannot be read is an error (not a warning
/// followed by a TLS failure that blames something else), an empty `NEPHELE_TOKEN=`
/// leaves the context's token in force, two pushes of one name in the same second
/// each print their own version and the latest is the last pushed, and a reader that
/// stops early (`| head -1`) is not a panic, whichever command prints.
#[test]
fn the_clis_corners_fail_loudly_and_name_the_right_version() {
    let cloud = Cloud::start("cli-corners").expect("cloud");
    let dir = temp_dir("cli-corners");
    let config = dir.join("nephele.toml");
    let token_file = cloud.dir.join("data").join("admin-token");
    let ca = cloud.ca_path();
    let (ok, _, err) = nephele(
        &config,
        &[
            "login",
            "--api",
            &cloud.api,
            "--ca",
            ca.to_str().unwrap(),
            "--token-file",
            token_file.to_str().unwrap(),
        ],
    );
    assert!(ok, "{err}");

    let (ok, _, err) = nephele(&config, &["region", "list", "--ca", "/nope.pem"]);
    assert!(
        !ok && err.contains("cannot read the CA file /nope.pem"),
        "{err}"
    );
    assert!(!err.contains("warning"), "{err}");

    let output = Command::new(bin("nephele"))
        .args(["region", "list", "--json"])
        .env_remove("NEPHELE_API")
        .env_remove("NEPHELE_CA")
        .env("NEPHELE_TOKEN", "")
        .env("NEPHELE_CLI_CONFIG", &config)
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "an empty NEPHELE_TOKEN replaced the context's token: {}",
        String::from_utf8_lossy(&output.stderr)
    );

    // A bad name is refused before the file is even read.
    let (ok, _, err) = nephele(
        &config,
        &["model", "push", "Bad_Name", "/no/such/model.onnx"],
    );
    assert!(!ok && err.contains("invalid model name"), "{err}");

    // Two versions of `m`, pushed back to back.
    let mut printed = Vec::new();
    for seed in [1, 2] {
        let file = dir.join(format!("m{seed}.onnx"));
        std::fs::write(
            &file,
            nephele_runtime::synthetic::dense_mlp(4, 8, 1, 2, seed),
        )
        .unwrap();
        let (ok, out, err) = nephele(
            &config,
            &["model", "push", "m", file.to_str().unwrap(), "--json"],
        );
        assert!(ok, "{err}");
        let view: Value = serde_json::from_str(&out).unwrap();
        assert_eq!(view["state"], "ready", "{out}");
        printed.push(view["reference"].as_str().unwrap().to_string());
    }
    assert_ne!(printed[0], printed[1]);
    let (ok, out, err) = nephele(&config, &["model", "get", "m", "--json"]);
    assert!(ok, "{err}");
    let latest: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(latest["reference"], printed[1].as_str(), "{out}");

    // `| head -1`: the reader goes away early.
    for (binary, args) in [
        ("nephele", vec!["completion", "bash"]),
        ("nephele-edge", vec!["profiles"]),
        // Any table printer of the API's commands (the process ends as `ls` would).
        ("nephele", vec!["region", "list"]),
        ("nephele", vec!["model", "list"]),
        ("nephele", vec!["device", "list", "-o", "yaml"]),
    ] {
        use std::io::Read as _;
        let mut child = Command::new(bin(binary))
            .args(&args)
            .env("NEPHELE_CLI_CONFIG", &config)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        // The reader gone before (nearly always) the first write: it meets a
        // closed pipe.
        drop(child.stdout.take());
        let mut err = String::new();
        child
            .stderr
            .take()
            .unwrap()
            .read_to_string(&mut err)
            .unwrap();
        let status = child.wait().unwrap();
        use std::os::unix::process::ExitStatusExt as _;
        let quiet = status.success() || status.signal() == Some(13);
        assert!(
            quiet && !err.contains("panicked") && !err.contains("error"),
            "{binary} {args:?} with its reader gone: {status} {err}"
        );
    }
}
