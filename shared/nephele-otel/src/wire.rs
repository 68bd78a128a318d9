//! The trace context in nephele's QUIC frames (`nephele_proto::TraceParent`, carried by
//! `InferRequest::trace`): the same three values as the `traceparent` header, in binary.

use nephele_proto::TraceParent;

use crate::context::TraceContext;

impl TraceContext {
    /// The frame's form of this context, as the parent of the next hop.
    pub fn to_wire(&self) -> TraceParent {
        TraceParent {
            trace_id: self.trace_id,
            span_id: self.span_id,
            flags: u8::from(self.sampled),
        }
    }

    /// The context a frame carries; `None` for an invalid one (all-zero ids), which
    /// is then served as the start of a new trace, as a bad header is.
    pub fn from_wire(wire: &TraceParent) -> Option<TraceContext> {
        (wire.trace_id != [0; 16] && wire.span_id != [0; 8]).then_some(TraceContext {
            trace_id: wire.trace_id,
            span_id: wire.span_id,
            sampled: wire.flags & 1 != 0,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_context_survives_the_frame_and_zero_ids_do_not() {
        let context = TraceContext {
            trace_id: [3; 16],
            span_id: [4; 8],
            sampled: true,
        };
        assert_eq!(TraceContext::from_wire(&context.to_wire()), Some(context));
        let zero = TraceParent {
            trace_id: [0; 16],
            span_id: [4; 8],
            flags: 1,
        };
        assert_eq!(TraceContext::from_wire(&zero), None);
    }
}
