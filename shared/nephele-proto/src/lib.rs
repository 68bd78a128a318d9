//! The wire protocol between agents and the control plane.
//!
//! Every message is a serde type from this crate, encoded with bincode 2 (standard
//! config: little-endian, variable-length integers) and sent as a frame: a 4-byte
//! big-endian length followed by that many payload bytes. Frames larger than
//! [`MAX_FRAME_BYTES`] are refused before any allocation. The first frame on every
//! stream carries [`PROTOCOL_VERSION`] (in `Hello`, `JoinRequest` or `StreamRequest`).
//!
//! Streams (ALPN `nephele/1`, one QUIC connection per agent):
//!
//! | stream            | opened by | first frame       | then                                        |
//! |-------------------|-----------|-------------------|---------------------------------------------|
//! | join              | agent     | `JoinRequest`     | `JoinResponse`, stream ends                 |
//! | control           | agent     | `AgentMessage::Hello` | cloud: `Welcome`, `DesiredState`…; agent: `Heartbeat`… |
//! | request           | either    | `StreamRequest`   | one `StreamResponse`, stream ends           |
//!
//! Version 5 added jobs that run on pool agents (`DesiredState::jobs`, heartbeat
//! `jobs`, `JobLogs`), the node report in `Hello`, spot interruption notices, and
//! `ErrorFrame::retry_after_ms` for admission control.
//! Version 9 added `InferRequest::trace`, the W3C trace context carried from the
//! device's request through the region to the pool replica.
//!
//! This crate does no IO: [`encode_frame`] and [`FrameDecoder`] are pure, so the same
//! code is used by the QUIC shells and by the fuzz/property tests. Domain types are
//! converted at the edges; only types defined here go on the wire.

mod codec;
mod messages;

pub use codec::{decode_payload, encode_frame, encode_payload, FrameDecoder, FrameError};
pub use messages::*;

/// Version of this protocol. Bumped on any incompatible change to a message.
pub const PROTOCOL_VERSION: u32 = 9;

/// ALPN identifier for QUIC connections.
pub const ALPN: &[u8] = b"nephele/1";

/// Hard upper bound of one frame's payload. Model chunks are [`CHUNK_BYTES`], far below.
pub const MAX_FRAME_BYTES: usize = 4 * 1024 * 1024;

/// The largest tensor one inference frame carries: [`MAX_FRAME_BYTES`] less room for
/// the request's other fields (deployment name, shape, ids). The split planner never
/// chooses a cut whose activation or answer is larger.
pub const MAX_TENSOR_BYTES: usize = MAX_FRAME_BYTES - 64 * 1024;

/// Size of one model chunk fetched on its own stream.
pub const CHUNK_BYTES: u32 = 256 * 1024;
