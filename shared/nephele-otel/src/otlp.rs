//! The OTLP trace messages (`opentelemetry/proto/collector/trace/v1` and the messages
//! it uses, field numbers as in opentelemetry-proto 1.x), derived with prost: only the
//! fields nephele sends or reads. Protobuf readers skip what they do not know, so a
//! collector of any 1.x version accepts them.

use prost::Message;

use crate::span::{SpanData, SpanKind, Value};

/// The gRPC method a collector serves (OTLP/gRPC).
pub const EXPORT_PATH: &str = "/opentelemetry.proto.collector.trace.v1.TraceService/Export";

/// Where a collector takes traces under its base address (OTLP/HTTP).
pub const HTTP_TRACES_PATH: &str = "/v1/traces";

/// What an OTLP/HTTP collector answers a failed export with (`google.rpc.Status`,
/// without its details).
#[derive(Clone, PartialEq, Message)]
pub struct RpcStatus {
    #[prost(int32, tag = "1")]
    pub code: i32,
    #[prost(string, tag = "2")]
    pub message: String,
}

#[derive(Clone, PartialEq, Message)]
pub struct ExportTraceServiceRequest {
    #[prost(message, repeated, tag = "1")]
    pub resource_spans: Vec<ResourceSpans>,
}

#[derive(Clone, PartialEq, Message)]
pub struct ExportTraceServiceResponse {
    #[prost(message, optional, tag = "1")]
    pub partial_success: Option<ExportTracePartialSuccess>,
}

#[derive(Clone, PartialEq, Message)]
pub struct ExportTracePartialSuccess {
    #[prost(int64, tag = "1")]
    pub rejected_spans: i64,
    #[prost(string, tag = "2")]
    pub error_message: String,
}

#[derive(Clone, PartialEq, Message)]
pub struct ResourceSpans {
    #[prost(message, optional, tag = "1")]
    pub resource: Option<Resource>,
    #[prost(message, repeated, tag = "2")]
    pub scope_spans: Vec<ScopeSpans>,
}

#[derive(Clone, PartialEq, Message)]
pub struct Resource {
    #[prost(message, repeated, tag = "1")]
    pub attributes: Vec<KeyValue>,
}

#[derive(Clone, PartialEq, Message)]
pub struct ScopeSpans {
    #[prost(message, optional, tag = "1")]
    pub scope: Option<InstrumentationScope>,
    #[prost(message, repeated, tag = "2")]
    pub spans: Vec<Span>,
}

#[derive(Clone, PartialEq, Message)]
pub struct InstrumentationScope {
    #[prost(string, tag = "1")]
    pub name: String,
    #[prost(string, tag = "2")]
    pub version: String,
}

#[derive(Clone, PartialEq, Message)]
pub struct Span {
    #[prost(bytes = "vec", tag = "1")]
    pub trace_id: Vec<u8>,
    #[prost(bytes = "vec", tag = "2")]
    pub span_id: Vec<u8>,
    #[prost(bytes = "vec", tag = "4")]
    pub parent_span_id: Vec<u8>,
    #[prost(string, tag = "5")]
    pub name: String,
    #[prost(int32, tag = "6")]
    pub kind: i32,
    #[prost(fixed64, tag = "7")]
    pub start_time_unix_nano: u64,
    #[prost(fixed64, tag = "8")]
    pub end_time_unix_nano: u64,
    #[prost(message, repeated, tag = "9")]
    pub attributes: Vec<KeyValue>,
    #[prost(message, optional, tag = "15")]
    pub status: Option<Status>,
    /// The W3C trace flags (bits 0-7) and bits 8-9: whether the parent is remote.
    #[prost(fixed32, tag = "16")]
    pub flags: u32,
}

#[derive(Clone, PartialEq, Message)]
pub struct Status {
    #[prost(string, tag = "2")]
    pub message: String,
    /// 0 unset, 1 ok, 2 error.
    #[prost(int32, tag = "3")]
    pub code: i32,
}

#[derive(Clone, PartialEq, Message)]
pub struct KeyValue {
    #[prost(string, tag = "1")]
    pub key: String,
    #[prost(message, optional, tag = "2")]
    pub value: Option<AnyValue>,
}

#[derive(Clone, PartialEq, Message)]
pub struct AnyValue {
    #[prost(oneof = "any_value::Value", tags = "1, 2, 3, 4")]
    pub value: Option<any_value::Value>,
}

pub mod any_value {
    #[derive(Clone, PartialEq, prost::Oneof)]
    pub enum Value {
        #[prost(string, tag = "1")]
        StringValue(String),
        #[prost(bool, tag = "2")]
        BoolValue(bool),
        #[prost(int64, tag = "3")]
        IntValue(i64),
        #[prost(double, tag = "4")]
        DoubleValue(f64),
    }
}

const STATUS_ERROR: i32 = 2;
const FLAG_HAS_IS_REMOTE: u32 = 0x100;
const FLAG_IS_REMOTE: u32 = 0x200;

pub fn key_value(key: &str, value: &Value) -> KeyValue {
    let value = match value {
        Value::Str(s) => any_value::Value::StringValue(s.clone()),
        Value::Bool(b) => any_value::Value::BoolValue(*b),
        Value::Int(i) => any_value::Value::IntValue(*i),
        Value::F64(f) => any_value::Value::DoubleValue(*f),
    };
    KeyValue {
        key: key.to_string(),
        value: Some(AnyValue { value: Some(value) }),
    }
}

fn span(data: &SpanData) -> Span {
    let mut flags = if data.context.sampled { 1 } else { 0 };
    if data.parent.is_some() {
        flags |= FLAG_HAS_IS_REMOTE;
        if data.parent_is_remote {
            flags |= FLAG_IS_REMOTE;
        }
    }
    Span {
        trace_id: data.context.trace_id.to_vec(),
        span_id: data.context.span_id.to_vec(),
        parent_span_id: data.parent.map(|p| p.to_vec()).unwrap_or_default(),
        name: data.name.clone(),
        kind: match data.kind {
            SpanKind::Internal => 1,
            SpanKind::Server => 2,
            SpanKind::Client => 3,
        },
        start_time_unix_nano: data.start_unix_nanos,
        end_time_unix_nano: data.end_unix_nanos.max(data.start_unix_nanos),
        attributes: data
            .attributes
            .iter()
            .map(|(key, value)| key_value(key, value))
            .collect(),
        status: data.error.as_ref().map(|message| Status {
            message: message.clone(),
            code: STATUS_ERROR,
        }),
        flags,
    }
}

/// One export request: this process's resource and its spans.
pub fn export_request(resource: &[(String, Value)], spans: &[SpanData]) -> Vec<u8> {
    ExportTraceServiceRequest {
        resource_spans: vec![ResourceSpans {
            resource: Some(Resource {
                attributes: resource
                    .iter()
                    .map(|(key, value)| key_value(key, value))
                    .collect(),
            }),
            scope_spans: vec![ScopeSpans {
                scope: Some(InstrumentationScope {
                    name: "nephele".into(),
                    version: env!("CARGO_PKG_VERSION").into(),
                }),
                spans: spans.iter().map(span).collect(),
            }],
        }],
    }
    .encode_to_vec()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::context::TraceContext;

    #[test]
    fn an_export_request_decodes_to_what_was_recorded() {
        let data = SpanData {
            context: TraceContext {
                trace_id: [1; 16],
                span_id: [2; 8],
                sampled: true,
            },
            parent: Some([3; 8]),
            parent_is_remote: true,
            name: "offload resnet".into(),
            kind: SpanKind::Client,
            start_unix_nanos: 10,
            end_unix_nanos: 20,
            attributes: vec![
                ("nephele.deployment".into(), Value::Str("resnet".into())),
                ("nephele.batch".into(), Value::Int(4)),
            ],
            error: Some("replica failed".into()),
        };
        let bytes = export_request(&[("service.name".into(), Value::Str("x".into()))], &[data]);
        let decoded = ExportTraceServiceRequest::decode(bytes.as_slice()).expect("decodes");
        let spans = &decoded.resource_spans[0].scope_spans[0].spans;
        assert_eq!(spans.len(), 1);
        let span = &spans[0];
        assert_eq!(span.trace_id, vec![1; 16]);
        assert_eq!(span.parent_span_id, vec![3; 8]);
        assert_eq!(span.kind, 3);
        assert_eq!(span.flags, 0x301);
        assert_eq!(span.status.as_ref().map(|s| s.code), Some(2));
        assert_eq!(
            span.attributes[1].value,
            Some(AnyValue {
                value: Some(any_value::Value::IntValue(4))
            })
        );
    }
}
