//! The W3C trace context (<https://www.w3.org/TR/trace-context/>): the `traceparent`
//! value `00-<32 hex trace id>-<16 hex parent id>-<2 hex flags>`, parsed as the
//! recommendation says a receiver must (lower-case hex only, no all-zero ids, version
//! `ff` refused, a later version's extra fields ignored) and formatted as version 00.

use std::fmt;

/// Where a span sits: its trace, its own id, and whether the trace is recorded.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct TraceContext {
    pub trace_id: [u8; 16],
    pub span_id: [u8; 8],
    /// The `sampled` flag: the caller records this trace, so its children should too.
    pub sampled: bool,
}

/// Why a `traceparent` value was not taken (the request is then served as the start
/// of a new trace; the value is never an error for the request itself).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TraceparentError {
    Format(&'static str),
    Version(String),
}

impl fmt::Display for TraceparentError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TraceparentError::Format(why) => write!(f, "traceparent {why}"),
            TraceparentError::Version(v) => write!(f, "traceparent version {v} is not valid"),
        }
    }
}

impl std::error::Error for TraceparentError {}

const FLAG_SAMPLED: u8 = 0x01;

impl TraceContext {
    /// Parses a `traceparent` header value.
    pub fn parse(value: &str) -> Result<TraceContext, TraceparentError> {
        let value = value.trim();
        let mut parts = value.split('-');
        let version = parts.next().unwrap_or_default();
        if version.len() != 2 || !is_lower_hex(version) {
            return Err(TraceparentError::Format("version must be two hex digits"));
        }
        if version == "ff" {
            return Err(TraceparentError::Version(version.to_string()));
        }
        let (Some(trace), Some(parent), Some(flags)) = (parts.next(), parts.next(), parts.next())
        else {
            return Err(TraceparentError::Format(
                "must be version-traceid-parentid-flags",
            ));
        };
        // Version 00 has exactly four fields; a later version may append more, which a
        // version-00 reader ignores.
        if version == "00" && parts.next().is_some() {
            return Err(TraceparentError::Format(
                "version 00 has exactly four fields",
            ));
        }
        let trace_id: [u8; 16] =
            decode_hex(trace).ok_or(TraceparentError::Format("trace id must be 32 hex digits"))?;
        let span_id: [u8; 8] = decode_hex(parent)
            .ok_or(TraceparentError::Format("parent id must be 16 hex digits"))?;
        let [flags]: [u8; 1] =
            decode_hex(flags).ok_or(TraceparentError::Format("flags must be two hex digits"))?;
        if trace_id == [0; 16] {
            return Err(TraceparentError::Format("trace id must not be all zeros"));
        }
        if span_id == [0; 8] {
            return Err(TraceparentError::Format("parent id must not be all zeros"));
        }
        Ok(TraceContext {
            trace_id,
            span_id,
            sampled: flags & FLAG_SAMPLED != 0,
        })
    }

    /// The `traceparent` value that makes this span the parent of the next hop.
    pub fn to_traceparent(&self) -> String {
        format!(
            "00-{}-{}-{:02x}",
            hex(&self.trace_id),
            hex(&self.span_id),
            if self.sampled { FLAG_SAMPLED } else { 0 }
        )
    }

    /// The trace id as 32 lower-case hex digits (what collectors and logs show).
    pub fn trace_id_hex(&self) -> String {
        hex(&self.trace_id)
    }

    /// The span id as 16 lower-case hex digits.
    pub fn span_id_hex(&self) -> String {
        hex(&self.span_id)
    }
}

fn is_lower_hex(s: &str) -> bool {
    s.bytes()
        .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

fn decode_hex<const N: usize>(s: &str) -> Option<[u8; N]> {
    if s.len() != 2 * N || !is_lower_hex(s) {
        return None;
    }
    let mut out = [0u8; N];
    for (i, byte) in out.iter_mut().enumerate() {
        *byte = u8::from_str_radix(s.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(out)
}

pub(crate) fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write as _;
    let mut out = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        let _ = write!(out, "{b:02x}");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn parses_the_recommendations_example() {
        let context =
            TraceContext::parse("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")
                .expect("valid");
        assert_eq!(context.trace_id_hex(), "4bf92f3577b34da6a3ce929d0e0e4736");
        assert_eq!(context.span_id_hex(), "00f067aa0ba902b7");
        assert!(context.sampled);
        let unsampled =
            TraceContext::parse("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00")
                .expect("valid");
        assert!(!unsampled.sampled);
    }

    #[test]
    fn refuses_what_the_recommendation_refuses() {
        for bad in [
            "",
            "00",
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e473-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-1",
            "0g-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
        ] {
            assert!(TraceContext::parse(bad).is_err(), "{bad:?} was accepted");
        }
    }

    #[test]
    fn a_later_version_is_read_as_version_00() {
        let context = TraceContext::parse(
            "cc-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-09-what-comes-later",
        )
        .expect("a later version's extra fields are ignored");
        assert!(context.sampled);
    }

    proptest! {
        #[test]
        fn formatting_then_parsing_gives_the_same_context(
            trace_id in any::<[u8; 16]>().prop_filter("not zero", |t| *t != [0; 16]),
            span_id in any::<[u8; 8]>().prop_filter("not zero", |s| *s != [0; 8]),
            sampled in any::<bool>(),
        ) {
            let context = TraceContext { trace_id, span_id, sampled };
            prop_assert_eq!(TraceContext::parse(&context.to_traceparent()), Ok(context));
        }

        #[test]
        fn any_header_value_parses_or_is_refused_without_panicking(value in ".{0,80}") {
            let _ = TraceContext::parse(&value);
        }
    }
}
