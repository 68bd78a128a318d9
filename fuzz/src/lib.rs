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

/// The fixed manifest-signing key of the `manifest` target (the seed is public: this
/// is a test key, it signs nothing real).
#[cfg(feature = "edge")]
pub fn manifest_key() -> ring::signature::Ed25519KeyPair {
    ring::signature::Ed25519KeyPair::from_seed_unchecked(&[0x5e; 32])
        .expect("a 32-byte seed is a key")
}

/// Input: `[mode][len][variant name: len bytes][rest…]`, then by `mode % 3`:
/// 0: `rest` is a manifest's bytes, signed with the fixed key, verified by the agent's
///    `reconcile_plan::verify_manifest` (signature, decode, variant lookup);
/// 1: `rest` is a whole `DesiredState` as the control plane sends it, planned by
///    `reconcile_plan::plan` with the fixed key;
/// 2: `rest` is `[public key: 32][signature: 64][manifest…]`, all arbitrary.
#[cfg(feature = "edge")]
pub fn manifest(data: &[u8]) {
    use nephele_edge::reconcile_plan::{plan, verify_manifest};
    use nephele_proto::{Assignment, DesiredState, SignedManifest};
    use ring::signature::KeyPair;

    let [mode, len, rest @ ..] = data else {
        return;
    };
    let len = usize::from(*len).min(rest.len());
    let (variant, rest) = rest.split_at(len);
    let variant = String::from_utf8_lossy(variant).into_owned();
    let key = manifest_key();
    let public = key.public_key().as_ref().to_vec();
    let assignment = |manifest: Vec<u8>, signature: Vec<u8>| Assignment {
        deployment: "fuzz".into(),
        model: SignedManifest {
            manifest,
            signature,
        },
        variant: variant.clone(),
        slo_ms: 100,
        offload: false,
        max_queue: 8,
        hard_example_threshold: None,
    };
    match mode % 3 {
        0 => {
            let signature = key.sign(rest).as_ref().to_vec();
            let signed = assignment(rest.to_vec(), signature);
            if let Ok((manifest, found)) = verify_manifest(&public, &signed) {
                assert_eq!(found.name, variant, "verify_manifest found another variant");
                assert!(manifest.variants.iter().any(|v| v.name == variant));
            }
            // The same bytes under a signature of other bytes are refused.
            let mut forged = signed.clone();
            forged.model.manifest.push(0);
            assert!(
                verify_manifest(&public, &forged).is_err(),
                "a manifest whose signature does not match was accepted"
            );
        }
        1 => {
            if let Ok(desired) = decode_payload::<DesiredState>(rest) {
                let running = std::collections::HashMap::from([("fuzz".to_string(), [0u8; 32])]);
                let _ = plan(&desired, &running, &public);
            }
        }
        _ => {
            if rest.len() < 96 {
                return;
            }
            let (key, rest) = rest.split_at(32);
            let (signature, manifest) = rest.split_at(64);
            let _ = verify_manifest(key, &assignment(manifest.to_vec(), signature.to_vec()));
        }
    }
}

/// Input: an uploaded ONNX file, handled as the control plane handles `PUT
/// /v1/models/NAME` (model_build): `input_spec::prepare` (decode, refuse an empty
/// graph, fold constant `If`s), then the runtime's `Model::load_onnx` and, for a model
/// it does not take as one f32 input and output, `GraphModel::load`. Nothing is run.
///
/// The runtime deliberately turns a panic inside tract's parser into an `Err`
/// (`guard_parser`), so the binary uses `afl::fuzz_nohook!`: such a caught panic is an
/// answer, and only a panic that escapes the runtime aborts.
#[cfg(feature = "edge")]
pub fn onnx(data: &[u8]) {
    use nephele_runtime::{graph_model::GraphModel, input_spec, Model, RuntimeError};
    let Ok(prepared) = input_spec::prepare("fuzz", data, &[]) else {
        return;
    };
    match Model::load_onnx("fuzz", &prepared) {
        Err(RuntimeError::Unsupported { .. }) => {
            let _ = GraphModel::load("fuzz", &prepared);
        }
        Ok(_) | Err(_) => {}
    }
}

/// Input: a control-plane config file (`nephele-cloud --config`), parsed and validated
/// by `CloudConfig::from_toml`. An accepted config is printed as `--print-config`
/// prints it, and that text must be accepted again.
#[cfg(feature = "cloud")]
pub fn cloud_config(data: &[u8]) {
    use nephele_cloud::config::CloudConfig;
    let text = String::from_utf8_lossy(data);
    let Ok(config) = CloudConfig::from_toml(&text) else {
        return;
    };
    assert!(
        config.validate().is_ok(),
        "from_toml accepted an invalid config"
    );
    if let Ok(printed) = toml::to_string_pretty(&config) {
        let again = CloudConfig::from_toml(&printed);
        assert!(
            again.is_ok(),
            "--print-config output is refused: {again:?}\n{printed}"
        );
    }
}
