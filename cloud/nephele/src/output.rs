//! How API commands print: a table for people (the default), `-o json` (or `--json`)
//! and `-o yaml` for machines and for reading nested answers.

use std::sync::atomic::{AtomicBool, Ordering};

use serde_json::Value;

/// `-o`'s values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Output {
    Table,
    Json,
    Yaml,
}

static YAML: AtomicBool = AtomicBool::new(false);

/// Chooses YAML for this process's printed answers.
pub fn use_yaml(yaml: bool) {
    YAML.store(yaml, Ordering::Relaxed);
}

pub fn yaml() -> bool {
    YAML.load(Ordering::Relaxed)
}

/// A key written bare when YAML reads it back as the same string.
fn plain_key(key: &str) -> bool {
    !key.is_empty()
        && key
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-' || c == '.')
        && !matches!(
            key,
            "true" | "false" | "null" | "yes" | "no" | "on" | "off" | "~"
        )
        && key.parse::<f64>().is_err()
}

fn scalar(value: &Value) -> String {
    match value {
        // Double-quoted YAML scalars take JSON's escapes.
        Value::String(text) => serde_json::to_string(text).unwrap_or_default(),
        Value::Array(items) if items.is_empty() => "[]".into(),
        Value::Object(map) if map.is_empty() => "{}".into(),
        other => other.to_string(),
    }
}

fn key(key: &str) -> String {
    if plain_key(key) {
        key.to_string()
    } else {
        serde_json::to_string(key).unwrap_or_default()
    }
}

fn nested(value: &Value) -> bool {
    matches!(value, Value::Array(a) if !a.is_empty())
        || matches!(value, Value::Object(m) if !m.is_empty())
}

fn write(value: &Value, indent: usize, out: &mut String) {
    let pad = " ".repeat(indent);
    match value {
        Value::Object(map) if !map.is_empty() => {
            for (k, v) in map {
                if nested(v) {
                    out.push_str(&format!("{pad}{}:\n", key(k)));
                    write(v, indent + 2, out);
                } else {
                    out.push_str(&format!("{pad}{}: {}\n", key(k), scalar(v)));
                }
            }
        }
        Value::Array(items) if !items.is_empty() => {
            for item in items {
                if nested(item) {
                    // The item's first line goes after the dash, the rest under it.
                    let mut inner = String::new();
                    write(item, indent + 2, &mut inner);
                    let inner = inner.trim_start();
                    out.push_str(&format!("{pad}- {inner}"));
                } else {
                    out.push_str(&format!("{pad}- {}\n", scalar(item)));
                }
            }
        }
        other => out.push_str(&format!("{pad}{}\n", scalar(other))),
    }
}

/// `value` as a YAML document.
pub fn to_yaml(value: &Value) -> String {
    let mut out = String::new();
    write(value, 0, &mut out);
    out
}

/// Writes `bytes` to stdout; a reader that stopped early (`nephele completion bash |
/// head -1`) is not an error.
pub fn write_stdout(bytes: &[u8]) -> anyhow::Result<()> {
    use std::io::Write as _;
    let mut out = std::io::stdout().lock();
    match out.write_all(bytes).and_then(|()| out.flush()) {
        Err(error) if error.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        other => Ok(other?),
    }
}

/// For the commands that talk to the API and print (every one but the servers,
/// simulations and benchmarks): a reader that goes away early (`nephele device list
/// | head -1`) ends the process quietly, as it ends `ls` or `git log`, wherever the
/// printing happens, instead of a panic at the next `println!`. Rust ignores SIGPIPE
/// so that writes return an error; these commands write only to stdout and to their
/// HTTP connection (sent with `MSG_NOSIGNAL`), so its default action is safe here.
/// The long-running commands keep it ignored: their sockets and child pipes must
/// never end the process.
pub fn end_quietly_on_closed_stdout() {
    // Called first thing in `main`, before any thread starts.
    sigpipe::reset();
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn yaml_of_nested_answers() {
        let value = json!([
            {"name": "d", "tenant": "team-a", "devices": [{"device": "cam-1", "ready": true}],
             "warnings": [], "selector": "", "rollout": null, "8": "x: y", "p99_ms": 1.5},
            "plain"
        ]);
        let text = to_yaml(&value);
        let expected = "- \"8\": \"x: y\"\n  devices:\n    - device: \"cam-1\"\n      ready: true\n  name: \"d\"\n  p99_ms: 1.5\n  rollout: null\n  selector: \"\"\n  tenant: \"team-a\"\n  warnings: []\n- \"plain\"\n";
        assert_eq!(text, expected);
        assert_eq!(to_yaml(&json!({})), "{}\n");
        assert_eq!(
            to_yaml(&json!({"a": {"b": [1, 2]}})),
            "a:\n  b:\n    - 1\n    - 2\n"
        );
    }
}
