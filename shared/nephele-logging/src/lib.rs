//! How every nephele process logs, to stderr:
//! - levels from `RUST_LOG` (`level` and `target=level`, comma-separated; the same
//!   syntax as `EnvFilter` short of span filters, without its regex engine), else the
//!   process's default;
//! - `NEPHELE_LOG_FORMAT=json` for one JSON object per line (for log collectors), else
//!   text, coloured only when stderr is a terminal (no escape codes in the journal or
//!   in files);
//! - a request an HTTP server's parser refused (actix-web logs it at ERROR under
//!   `actix_http::h1::dispatcher`) is the client's fault, not the server's: it is
//!   logged as a WARN under `nephele::http` instead and counted ([`client_errors`]).

use std::io::IsTerminal as _;
use std::sync::atomic::{AtomicU64, Ordering};

use tracing_subscriber::layer::SubscriberExt as _;
use tracing_subscriber::util::SubscriberInitExt as _;

/// Where actix-web logs the requests its parser refused, at ERROR.
const CLIENT_ERROR_TARGET: &str = "actix_http::h1::dispatcher";

static CLIENT_ERRORS: AtomicU64 = AtomicU64::new(0);

/// Requests refused as malformed by an HTTP server's parser since the process started
/// (the API exports it as `nephele_api_malformed_requests_total`).
pub fn client_errors() -> u64 {
    CLIENT_ERRORS.load(Ordering::Relaxed)
}

/// Whether an event is a parser's refusal of a client's request.
fn is_client_error(metadata: &tracing::Metadata<'_>) -> bool {
    metadata.target() == CLIENT_ERROR_TARGET && *metadata.level() == tracing::Level::ERROR
}

/// Counts the parser's refusals.
struct ClientErrors;

impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for ClientErrors {
    fn on_event(&self, event: &tracing::Event<'_>, _: tracing_subscriber::layer::Context<'_, S>) {
        if is_client_error(event.metadata()) {
            CLIENT_ERRORS.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// The line format, saying a parser's refusal as a warning of `nephele::http` (an
/// event cannot be re-emitted from inside the subscriber, so it is rewritten here).
struct Formatter<F> {
    inner: F,
    json: bool,
}

impl<S, N, F> tracing_subscriber::fmt::FormatEvent<S, N> for Formatter<F>
where
    S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>,
    N: for<'a> tracing_subscriber::fmt::FormatFields<'a> + 'static,
    F: tracing_subscriber::fmt::FormatEvent<S, N>,
{
    fn format_event(
        &self,
        ctx: &tracing_subscriber::fmt::FmtContext<'_, S, N>,
        mut writer: tracing_subscriber::fmt::format::Writer<'_>,
        event: &tracing::Event<'_>,
    ) -> std::fmt::Result {
        use tracing_subscriber::fmt::time::FormatTime as _;
        if !is_client_error(event.metadata()) {
            return self.inner.format_event(ctx, writer, event);
        }
        let mut message = Message(String::new());
        event.record(&mut message);
        let text = format!("a client's request was refused as malformed: {}", message.0);
        let mut time = String::new();
        tracing_subscriber::fmt::time::SystemTime
            .format_time(&mut tracing_subscriber::fmt::format::Writer::new(&mut time))?;
        if self.json {
            let line = serde_json::json!({
                "timestamp": time,
                "level": "WARN",
                "fields": {"message": text},
                "target": "nephele::http",
            });
            writeln!(writer, "{line}")
        } else {
            writeln!(writer, "{time}  WARN nephele::http: {text}")
        }
    }
}

/// An event's `message` field as text.
struct Message(String);

impl tracing::field::Visit for Message {
    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
        if field.name() == "message" {
            self.0 = format!("{value:?}");
        }
    }
}

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
    let registry = tracing_subscriber::registry()
        .with::<tracing_subscriber::filter::Targets>(filter)
        .with(ClientErrors);
    let _ = match format {
        Format::Json => registry
            .with(
                tracing_subscriber::fmt::layer()
                    .json()
                    .event_format(Formatter {
                        inner: tracing_subscriber::fmt::format().json(),
                        json: true,
                    })
                    .with_writer(std::io::stderr),
            )
            .try_init(),
        Format::Text => registry
            .with(
                tracing_subscriber::fmt::layer()
                    .with_ansi(std::io::stderr().is_terminal())
                    .event_format(Formatter {
                        inner: tracing_subscriber::fmt::format()
                            .with_ansi(std::io::stderr().is_terminal()),
                        json: false,
                    })
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

    /// A writer into a shared buffer, for reading what the fmt layer printed.
    #[derive(Clone, Default)]
    struct Buffer(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

    impl std::io::Write for Buffer {
        fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
            self.0
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .extend_from_slice(bytes);
            Ok(bytes.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn a_parsers_refusal_is_a_counted_warning_not_an_error() {
        let buffer = Buffer::default();
        let writer = buffer.clone();
        let subscriber = tracing_subscriber::registry().with(ClientErrors).with(
            tracing_subscriber::fmt::layer()
                .with_ansi(false)
                .event_format(Formatter {
                    inner: tracing_subscriber::fmt::format().with_ansi(false),
                    json: false,
                })
                .with_writer(move || writer.clone()),
        );
        let before = client_errors();
        tracing::subscriber::with_default(subscriber, || {
            tracing::error!(target: "actix_http::h1::dispatcher", "stream error: request parse error: invalid Header provided");
            tracing::error!(target: "nephele_cloud::region", "a real error");
        });
        assert_eq!(client_errors(), before + 1);
        let text = String::from_utf8(buffer.0.lock().expect("lock").clone()).expect("utf-8");
        assert!(
            text.contains("WARN nephele::http: a client's request was refused as malformed: stream error: request parse error: invalid Header provided"),
            "{text}"
        );
        assert!(!text.contains("ERROR actix_http"), "{text}");
        assert!(
            text.contains("ERROR nephele_cloud::region: a real error"),
            "{text}"
        );
    }

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
