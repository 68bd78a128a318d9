//! The fuzz targets' bodies, one function per target. The AFL++ binaries in `src/bin`
//! (built by `cargo afl build --features afl`, see fuzz/run.sh) call them on every
//! input, and `tests/replay.rs` calls them on every file of `corpus/` and
//! `regressions/` with plain `cargo test`, so a crash found by the fuzzer is replayed
//! without AFL.
//!
//! A target treats every `Err` of the project's code as a correct answer to a hostile
//! input: only a panic, an abort or a hang is a finding. The few `assert!`s check
//! properties the code documents (a decoded message encodes back to bytes that decode
//! to the same thing; a poisoned frame decoder stays poisoned).

use nephele_proto::{
    decode_payload, encode_payload, AgentMessage, CloudMessage, FrameDecoder, FrameError,
    JoinRequest, JoinResponse, StreamRequest, StreamResponse, MAX_FRAME_BYTES,
};
use serde::{de::DeserializeOwned, Serialize};

mod seeds;
pub use seeds::seeds;

/// Every target: its name (the binary, `corpus/<name>`, `regressions/<name>`) and the
/// cargo feature it needs beyond `afl` (the binaries' `required-features`).
pub const TARGETS: [(&str, Option<&str>); 5] = [
    ("frame_decoder", None),
    ("firmware_profile", None),
    ("manifest", Some("edge")),
    ("onnx", Some("edge")),
    ("cloud_config", Some("cloud")),
];

/// A target's body, when this build has its feature.
pub fn target(name: &str) -> Option<fn(&[u8])> {
    match name {
        "frame_decoder" => Some(frame_decoder),
        "firmware_profile" => Some(firmware_profile),
        #[cfg(feature = "edge")]
        "manifest" => Some(manifest),
        #[cfg(feature = "edge")]
        "onnx" => Some(onnx),
        #[cfg(feature = "cloud")]
        "cloud_config" => Some(cloud_config),
        _ => None,
    }
}

/// The wire message types a frame can carry, selected by the input's first byte.
pub const MESSAGE_KINDS: [&str; 6] = [
    "JoinRequest",
    "JoinResponse",
    "AgentMessage",
    "CloudMessage",
    "StreamRequest",
    "StreamResponse",
];

/// Input: `[kind][chunk][bytes…]`. `kind % 6` picks the message type (see
/// [`MESSAGE_KINDS`]); the bytes are fed to a [`FrameDecoder`] in pieces of
/// `chunk % 64 + 1` bytes, as a QUIC stream delivers them, taking every whole frame out
/// after each piece; the bytes are also decoded as one bare payload.
pub fn frame_decoder(data: &[u8]) {
    let [kind, chunk, bytes @ ..] = data else {
        return;
    };
    let chunk = usize::from(*chunk % 64) + 1;
    match kind % 6 {
        0 => frames::<JoinRequest>(bytes, chunk),
        1 => frames::<JoinResponse>(bytes, chunk),
        2 => frames::<AgentMessage>(bytes, chunk),
        3 => frames::<CloudMessage>(bytes, chunk),
        4 => frames::<StreamRequest>(bytes, chunk),
        _ => frames::<StreamResponse>(bytes, chunk),
    }
}

fn frames<T: Serialize + DeserializeOwned + MessageChecks>(bytes: &[u8], chunk: usize) {
    let mut decoder = FrameDecoder::new(MAX_FRAME_BYTES);
    'feed: for piece in bytes.chunks(chunk) {
        decoder.push(piece);
        loop {
            match decoder.next_frame::<T>() {
                Ok(Some(message)) => round_trip(&message),
                Ok(None) => break,
                Err(_) => {
                    // The stream lost its framing: the decoder must stay failed.
                    assert!(
                        decoder.next_frame::<T>().is_err(),
                        "a failed FrameDecoder must stay poisoned"
                    );
                    break 'feed;
                }
            }
        }
    }
    if let Ok(message) = decode_payload::<T>(bytes) {
        round_trip(&message);
    }
    if let [a, b, c, d, ..] = *bytes {
        match FrameDecoder::check_len([a, b, c, d], MAX_FRAME_BYTES) {
            Ok(len) => assert!(len <= MAX_FRAME_BYTES),
            Err(FrameError::TooLarge { len, .. }) => assert!(len > MAX_FRAME_BYTES),
            Err(other) => panic!("check_len answered {other:?}"),
        }
    }
}

/// A decoded message encodes again, and those bytes decode to a message that encodes
/// to the very same bytes (compared as bytes: a NaN in a tensor is not equal to itself).
fn round_trip<T: Serialize + DeserializeOwned + MessageChecks>(message: &T) {
    message.checks();
    let Ok(first) = encode_payload(message) else {
        return;
    };
    let again: T = decode_payload(&first).expect("an encoded message decodes again");
    let second = encode_payload(&again).expect("a decoded message encodes again");
    assert_eq!(
        first, second,
        "encode(decode(encode(m))) differs from encode(m)"
    );
}

/// What the receiving side runs on a decoded message before using it.
trait MessageChecks {
    fn checks(&self) {}
}

impl MessageChecks for JoinRequest {}
impl MessageChecks for JoinResponse {}
impl MessageChecks for AgentMessage {}
impl MessageChecks for CloudMessage {}
impl MessageChecks for StreamResponse {
    fn checks(&self) {
        if let StreamResponse::Inferred(answer) = self {
            let _ = answer.output.validate();
            let _ = answer.output.data_bytes();
        }
    }
}
impl MessageChecks for StreamRequest {
    fn checks(&self) {
        if let nephele_proto::RequestBody::Infer(request) = &self.body {
            let _ = request.input.validate();
            let _ = request.input.data_bytes();
        }
    }
}

/// Input: a firmware profile's TOML text (not UTF-8: the lossy conversion).
/// `FirmwareProfile::from_toml` parses and validates; a profile it accepts is accepted
/// again under its own name, and again after being written out as TOML.
pub fn firmware_profile(data: &[u8]) {
    use nephele_domain::FirmwareProfile;
    let text = String::from_utf8_lossy(data);
    let _ = FirmwareProfile::from_toml(&text, Some("rpi5-8gb"));
    let Ok(profile) = FirmwareProfile::from_toml(&text, None) else {
        return;
    };
    assert!(
        FirmwareProfile::from_toml(&text, Some(&profile.device.name)).is_ok(),
        "a valid profile is refused under its own name"
    );
    if let Ok(written) = toml::to_string(&profile) {
        let again = FirmwareProfile::from_toml(&written, None);
        assert!(
            again.is_ok(),
            "a valid profile written as TOML is refused: {again:?}\n{written}"
        );
    }
}

#[cfg(feature = "edge")]
mod edge_targets;
#[cfg(feature = "edge")]
pub use edge_targets::{manifest, manifest_key, onnx};

#[cfg(feature = "cloud")]
mod cloud_targets;
#[cfg(feature = "cloud")]
pub use cloud_targets::cloud_config;
