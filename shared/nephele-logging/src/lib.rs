//! How every nephele process logs, to stderr:
//! - levels from `RUST_LOG` (`level` and `target=level`, comma-separated; the same
//!   syntax as `EnvFilter` short of span filters, without its regex engine), else the
//!   process's default;
//! - `NEPHELE_LOG_FORMAT=json` for one JSON object per line (for log collectors), else
//!   text, coloured only when stderr is a terminal (no escape codes in the journal or
//!   in files).

use std::io::IsTerminal as _;

use tracing_subscriber::layer::SubscriberExt as _;
use tracing_subscriber::util::SubscriberInitExt as _;

/// The log line format (`--log-format text|json`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    Text,
    Json,
}

/// `NEPHELE_LOG_FORMAT`'s value as a format, or why it is not one.
pub fn parse_format(value: &str) -> Result<Format, String> {
    match value.trim().to_ascii_lowercase().as_str() {
        "" | "text" => Ok(Format::Text),
        "json" => Ok(Format::Json),
        other => Err(format!(
            "NEPHELE_LOG_FORMAT={other:?} is not a log format; use text or json"
        )),
    }
}

/// Installs the process's logger (once; later calls do nothing). `default_filter` is
/// used when `RUST_LOG` is unset or not a filter (said on stderr).
pub fn init(default_filter: &str) {
    init_with(default_filter, None);
}

/// As [`init`], with the format a `--log-format` flag gave (it wins over
/// `NEPHELE_LOG_FORMAT`).
pub fn init_with(default_filter: &str, format: Option<Format>) {
    let filter = match std::env::var("RUST_LOG") {
        Ok(value) => value.parse().unwrap_or_else(|error| {
            eprintln!(
                "RUST_LOG={value:?} is not a filter ({error}); give levels such as \"info,quinn=warn\"; using {default_filter:?}"
            );
            default_filter.parse().unwrap_or_default()
        }),
        Err(_) => default_filter.parse().unwrap_or_default(),
    };
    let format = format.unwrap_or_else(|| {
        parse_format(&std::env::var("NEPHELE_LOG_FORMAT").unwrap_or_default()).unwrap_or_else(
            |error| {
                eprintln!("{error}; logging text");
                Format::Text
            },
        )
    });
    let registry =
        tracing_subscriber::registry().with::<tracing_subscriber::filter::Targets>(filter);
    let _ = match format {
        Format::Json => registry
            .with(
                tracing_subscriber::fmt::layer()
                    .json()
                    .with_writer(std::io::stderr),
            )
            .try_init(),
        Format::Text => registry
            .with(
                tracing_subscriber::fmt::layer()
                    .with_ansi(std::io::stderr().is_terminal())
                    .with_writer(std::io::stderr),
            )
            .try_init(),
    };
}

impl std::str::FromStr for Format {
    type Err = String;
    fn from_str(value: &str) -> Result<Format, String> {
        parse_format(value).map_err(|e| e.replace("NEPHELE_LOG_FORMAT=", "--log-format "))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_are_text_by_default_json_when_asked_and_refused_otherwise() {
        assert_eq!(parse_format(""), Ok(Format::Text));
        assert_eq!(parse_format("TEXT"), Ok(Format::Text));
        assert_eq!(parse_format(" json "), Ok(Format::Json));
        assert!(parse_format("yaml")
            .unwrap_err()
            .contains("use text or json"));
    }
}
