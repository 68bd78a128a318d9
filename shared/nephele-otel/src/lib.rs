//! Distributed tracing for every nephele process.
//!
//! A request's path (a device's HTTP request, the agent, the QUIC offload, the region,
//! the pool replica and back) is one trace: each process records its own spans and
//! carries the W3C trace context (`traceparent`) to the next hop, over HTTP as the
//! header and over QUIC in the request frame. Spans are exported over OTLP (gRPC, or
//! HTTP with protobuf bodies) to the collector the operator names (`--otlp-endpoint`,
//! or the standard `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` / `OTEL_EXPORTER_OTLP_ENDPOINT`;
//! `OTEL_EXPORTER_OTLP_PROTOCOL` chooses). OTLP/gRPC is the `grpc` feature (h2), so a
//! small build, like the agent as it ships, exports over OTLP/HTTP only.
//!
//! Shape, as elsewhere in nephele: the rules are pure and tested alone
//! ([`context`]: parsing and formatting `traceparent`; [`sampler`]: which traces are
//! recorded; [`settings`]: what the flags and environment configure; [`otlp`]: the
//! protobuf messages), and the IO is a thin shell ([`exporter`]: a thread of its own
//! that batches and sends, [`grpc`]: one unary call over HTTP/2, [`http`]: one POST
//! over HTTP/1.1). Recording a span
//! never blocks and never fails the request it describes: a full queue drops the span
//! and counts it (`nephele_trace_spans_dropped_total`).

pub mod call;
pub mod context;
pub mod current;
pub mod exporter;
#[cfg(feature = "grpc")]
pub mod grpc;
pub mod http;
pub mod otlp;
pub mod sampler;
pub mod settings;
pub mod span;
mod wire;

pub use context::{TraceContext, TraceparentError};
pub use exporter::Tracer;
pub use settings::{Protocol, Settings};
pub use span::{Span, SpanKind, Value};
