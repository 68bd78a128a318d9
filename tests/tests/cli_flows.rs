//! The README's "The CLI's common flows, as they print": every `$ nephele …` line of
//! the block after `<!-- cli-flows -->` is run, in order, with the real `nephele`
//! binary against a real control plane with the device and pool node the README
//! names, and its standard output is compared with the lines shown under it. `…` in
//! a shown line stands for any text, a line of only `…` for any number of lines, and
//! runs of spaces for any run of spaces. Reads are asked again until they match (at
//! most a minute); everything else runs once and must exit 0.

#![allow(clippy::unwrap_used)]

use std::process::Command;
use std::time::{Duration, Instant};

use nephele_e2e::{bin, Cloud, Edge};

const README: &str = include_str!("../../README.md");

const CONFIG: &str = r#"
heartbeat_interval_ms = 300
[scheduler]
tick_ms = 200
grace_s = 1
[[region]]
name = "eu-west"
[[region.pool]]
name = "l4"
node_profile = "gpu-4x-l4"
"#;

struct Step {
    command: String,
    expected: Vec<String>,
}

/// The steps of the README's block.
fn steps() -> Vec<Step> {
    let after = README
        .split_once("<!-- cli-flows -->")
        .expect("the README has a cli-flows block")
        .1;
    let block = after
        .split_once("```text\n")
        .expect("a ```text block follows the marker")
        .1
        .split_once("\n```")
        .expect("the block ends")
        .0;
    let mut steps: Vec<Step> = Vec::new();
    for line in block.lines() {
        match line.strip_prefix("$ ") {
            Some(command) => steps.push(Step {
                command: command.to_string(),
                expected: Vec::new(),
            }),
            None => steps
                .last_mut()
                .expect("the block starts with a command")
                .expected
                .push(line.to_string()),
        }
    }
    steps
}

/// Whether `line` is what `pattern` shows: `…` any text, spaces any run of spaces.
fn line_matches(pattern: &str, line: &str) -> bool {
    // Both sides with runs of spaces made one, then the pattern's literal pieces in
    // order.
    let squeeze = |s: &str| s.split_whitespace().collect::<Vec<_>>().join(" ");
    let (pattern, line) = (squeeze(pattern), squeeze(line));
    let pieces: Vec<&str> = pattern.split('…').collect();
    if pieces.len() == 1 {
        return pattern == line;
    }
    let (first, last) = (pieces[0], pieces[pieces.len() - 1]);
    if !line.starts_with(first.trim_end()) || !line.ends_with(last.trim_start()) {
        return false;
    }
    let mut rest = &line[first.trim_end().len()..];
    for piece in &pieces[1..pieces.len() - 1] {
        let piece = piece.trim();
        if piece.is_empty() {
            continue;
        }
        match rest.find(piece) {
            Some(at) => rest = &rest[at + piece.len()..],
            None => return false,
        }
    }
    rest.len() >= last.trim_start().len()
}

/// Whether `output`'s lines are `expected`'s (a lone `…` any number of lines).
fn matches(expected: &[String], output: &[&str]) -> bool {
    match expected.split_first() {
        None => output.is_empty(),
        Some((first, rest)) if first.trim() == "…" => {
            (0..=output.len()).any(|skip| matches(rest, &output[skip..]))
        }
        Some((first, rest)) => {
            !output.is_empty() && line_matches(first, output[0]) && matches(rest, &output[1..])
        }
    }
}

fn is_read(command: &str) -> bool {
    let words: Vec<&str> = command.split_whitespace().collect();
    words.len() > 2 && ["list", "status", "get", "logs"].contains(&words[2])
}

#[test]
fn the_readmes_cli_flows_print_what_the_readme_shows() {
    let steps = steps();
    assert!(steps.len() >= 10, "the block has the common flows");
    let cloud = Cloud::start_with("cli-flows", CONFIG).unwrap();
    let _device = Edge::start(
        &cloud,
        "pi-7",
        "eu-west",
        &["--profile", "rpi5-8gb", "--label", "site=lab"],
        &[],
    )
    .unwrap();
    let _pool = Edge::start(
        &cloud,
        "l4-a",
        "eu-west",
        &["--role", "pool", "--profile", "gpu-4x-l4"],
        &[],
    )
    .unwrap();
    cloud.wait_online("pi-7").unwrap();
    cloud.wait_online("l4-a").unwrap();
    let nephele = bin("nephele");
    let path = format!(
        "{}:{}",
        nephele.parent().unwrap().display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let repo = concat!(env!("CARGO_MANIFEST_DIR"), "/..");
    for step in &steps {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let output = Command::new("bash")
                .args(["-c", &step.command])
                .current_dir(repo)
                .env("PATH", &path)
                .env("NEPHELE_API", &cloud.api)
                .env("NEPHELE_CA", cloud.ca_path())
                .env("NEPHELE_TOKEN", &cloud.token)
                .env("NEPHELE_CLI_CONFIG", cloud.dir.join("cli-config.toml"))
                .env_remove("NEPHELE_CONTEXT")
                .output()
                .unwrap();
            let stdout = String::from_utf8_lossy(&output.stdout).to_string();
            let lines: Vec<&str> = stdout.lines().collect();
            let ok = output.status.success() && matches(&step.expected, &lines);
            if ok {
                println!("$ {}\n{stdout}", step.command);
                break;
            }
            if !is_read(&step.command) || Instant::now() > deadline {
                panic!(
                    "`{}` (exit {}) printed:\n{stdout}\nstderr:\n{}\nthe README shows:\n{}",
                    step.command,
                    output.status,
                    String::from_utf8_lossy(&output.stderr),
                    step.expected.join("\n")
                );
            }
            std::thread::sleep(Duration::from_millis(500));
        }
    }
}

#[test]
fn the_matcher_reads_ellipses_and_spaces_as_the_readme_means_them() {
    assert!(line_matches("a   b … d", "a b c c d"));
    assert!(line_matches(
        "expires … UTC (in 60 min)):",
        "expires 2026-12-03 22:30:32 UTC (in 60 min)):"
    ));
    assert!(!line_matches("a b … d", "a c d"));
    assert!(!line_matches("ready", "pending"));
    let expected: Vec<String> = ["x", "…", "z"].iter().map(|s| s.to_string()).collect();
    assert!(matches(&expected, &["x", "y", "y", "z"]));
    assert!(matches(&expected, &["x", "z"]));
    assert!(!matches(&expected, &["x", "y"]));
}
