//! A span being recorded, and what it becomes when it ends.

use std::sync::Arc;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use crate::context::TraceContext;
use crate::exporter::Shared;

/// What a span describes, as OTLP distinguishes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SpanKind {
    /// Work inside one process (a queue wait, a model run).
    Internal,
    /// The handling of a request that came from another process.
    Server,
    /// A request sent to another process, until its answer.
    Client,
}

/// An attribute's value.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    Str(String),
    Bool(bool),
    Int(i64),
    F64(f64),
}

impl From<&str> for Value {
    fn from(value: &str) -> Value {
        Value::Str(value.to_string())
    }
}
impl From<String> for Value {
    fn from(value: String) -> Value {
        Value::Str(value)
    }
}
impl From<&String> for Value {
    fn from(value: &String) -> Value {
        Value::Str(value.clone())
    }
}
impl From<bool> for Value {
    fn from(value: bool) -> Value {
        Value::Bool(value)
    }
}
impl From<i64> for Value {
    fn from(value: i64) -> Value {
        Value::Int(value)
    }
}
impl From<u64> for Value {
    fn from(value: u64) -> Value {
        Value::Int(i64::try_from(value).unwrap_or(i64::MAX))
    }
}
impl From<u32> for Value {
    fn from(value: u32) -> Value {
        Value::Int(i64::from(value))
    }
}
impl From<usize> for Value {
    fn from(value: usize) -> Value {
        Value::Int(i64::try_from(value).unwrap_or(i64::MAX))
    }
}
impl From<f64> for Value {
    fn from(value: f64) -> Value {
        Value::F64(value)
    }
}

/// A finished span, as exported.
#[derive(Debug, Clone, PartialEq)]
pub struct SpanData {
    pub context: TraceContext,
    pub parent: Option<[u8; 8]>,
    /// The parent was recorded by another process.
    pub parent_is_remote: bool,
    pub name: String,
    pub kind: SpanKind,
    pub start_unix_nanos: u64,
    pub end_unix_nanos: u64,
    pub attributes: Vec<(String, Value)>,
    /// Set when the operation failed: the status message.
    pub error: Option<String>,
}

/// At most this many attributes per span; more are ignored.
pub const MAX_ATTRIBUTES: usize = 32;

/// A span in progress. It ends (and is queued for export, when recorded) when
/// [`Span::end`] is called or when it is dropped, so an early return still records it.
/// A span that is not recorded (tracing off, or a trace not sampled) costs nothing
/// but still carries its context to the next hop.
pub struct Span {
    context: Option<TraceContext>,
    recording: Option<Recording>,
}

struct Recording {
    data: SpanData,
    started: Instant,
    sink: Arc<Shared>,
}

impl Span {
    /// A span that records nothing and passes `context` on unchanged (a process with
    /// tracing off still carries its caller's trace to the next hop).
    pub fn passthrough(context: Option<TraceContext>) -> Span {
        Span {
            context,
            recording: None,
        }
    }

    pub(crate) fn recording(
        sink: Arc<Shared>,
        context: TraceContext,
        parent: Option<[u8; 8]>,
        parent_is_remote: bool,
        name: String,
        kind: SpanKind,
    ) -> Span {
        let start_unix_nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(0);
        Span {
            context: Some(context),
            recording: Some(Recording {
                data: SpanData {
                    context,
                    parent,
                    parent_is_remote,
                    name,
                    kind,
                    start_unix_nanos,
                    end_unix_nanos: start_unix_nanos,
                    attributes: Vec::new(),
                    error: None,
                },
                started: Instant::now(),
                sink,
            }),
        }
    }

    pub(crate) fn unsampled(context: TraceContext) -> Span {
        Span {
            context: Some(context),
            recording: None,
        }
    }

    /// The context the next hop's spans are children of: this span's, or (for a pass
    /// through) the caller's; `None` when there is no trace at all.
    pub fn context(&self) -> Option<TraceContext> {
        self.context
    }

    /// Whether this span is recorded and exported.
    pub fn is_recording(&self) -> bool {
        self.recording.is_some()
    }

    /// Sets an attribute (the first value of a key stays; at most [`MAX_ATTRIBUTES`]).
    pub fn set(&mut self, key: &str, value: impl Into<Value>) {
        if let Some(recording) = &mut self.recording {
            let attributes = &mut recording.data.attributes;
            if attributes.len() < MAX_ATTRIBUTES && !attributes.iter().any(|(k, _)| k == key) {
                attributes.push((key.to_string(), value.into()));
            }
        }
    }

    /// Marks the span failed, with what went wrong.
    pub fn fail(&mut self, message: impl std::fmt::Display) {
        if let Some(recording) = &mut self.recording {
            recording.data.error = Some(message.to_string());
        }
    }

    /// Ends the span now.
    pub fn end(self) {}
}

impl Drop for Span {
    fn drop(&mut self) {
        if let Some(mut recording) = self.recording.take() {
            let elapsed = recording.started.elapsed().as_nanos() as u64;
            recording.data.end_unix_nanos = recording.data.start_unix_nanos.saturating_add(elapsed);
            recording.sink.submit(recording.data);
        }
    }
}
