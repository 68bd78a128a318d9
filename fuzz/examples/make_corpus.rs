//! Writes the seed corpora under fuzz/corpus from the project's real data:
//!
//! - frame_decoder: every message of shared/nephele-proto/tests/golden.txt (the codec's
//!   own encodings, checked by that crate's golden test), decoded here to be sure, and
//!   framed as `[kind][chunk][length prefix][payload]`; plus two frames back to back, a
//!   truncated frame and one with a corrupted byte;
//! - manifest: the golden `ModelManifest` (signed by the target with its fixed key), a
//!   `DesiredState` whose assignment carries it signed with that key, and an explicit
//!   key, signature and manifest triple;
//! - firmware_profile: firmware-profiles/*.toml;
//! - cloud_config: deploy/cloud.example.toml and a one-region config;
//! - onnx: the digits model (shared/models/digits-mlp/model.onnx), the runtime's typed
//!   three-input example (`synthetic::typed_example`), a small dense MLP and a small CNN
//!   (`synthetic::conv_net`: a layer for each of the runtime's convolution kernels);
//!
//! each with a truncated and a corrupted copy. Run from the fuzz folder:
//!   cargo run --example make_corpus --features edge
//! It rewrites the seed files it names and leaves any other file of corpus/ alone.

use std::path::{Path, PathBuf};

use nephele_proto::{
    decode_payload, encode_payload, AgentMessage, CloudMessage, DesiredState, JoinRequest,
    JoinResponse, ModelManifest, SignedManifest, StreamRequest, StreamResponse,
};
use ring::signature::KeyPair;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn write(target: &str, name: &str, bytes: &[u8]) {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("corpus")
        .join(target);
    std::fs::create_dir_all(&dir).expect("create corpus dir");
    std::fs::write(dir.join(name), bytes).expect("write seed");
}

/// A seed, a copy cut in half and a copy with one byte flipped in the middle.
fn write_with_damage(target: &str, name: &str, bytes: &[u8]) {
    write(target, name, bytes);
    write(
        target,
        &format!("{name}.truncated"),
        &bytes[..bytes.len() / 2],
    );
    let mut corrupted = bytes.to_vec();
    let middle = corrupted.len() / 2;
    corrupted[middle] ^= 0xa5;
    write(target, &format!("{name}.corrupted"), &corrupted);
}

fn unhex(text: &str) -> Vec<u8> {
    (0..text.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&text[i..i + 2], 16).expect("hex"))
        .collect()
}

fn frame(payload: &[u8]) -> Vec<u8> {
    let mut frame = (payload.len() as u32).to_be_bytes().to_vec();
    frame.extend_from_slice(payload);
    frame
}

fn golden() -> Vec<(String, Vec<u8>)> {
    let text = std::fs::read_to_string(root().join("shared/nephele-proto/tests/golden.txt"))
        .expect("golden.txt");
    text.lines()
        .map(|line| {
            let (name, hex) = line.rsplit_once(' ').expect("NAME HEX");
            (name.to_string(), unhex(hex))
        })
        .collect()
}

/// The input's kind byte for a golden sample, after checking the bytes decode as it.
fn kind_of(name: &str, payload: &[u8]) -> Option<u8> {
    let kind = name.split("::").next().unwrap_or(name);
    let ok = match kind {
        "JoinRequest" => decode_payload::<JoinRequest>(payload).is_ok(),
        "JoinResponse" => decode_payload::<JoinResponse>(payload).is_ok(),
        "AgentMessage" => decode_payload::<AgentMessage>(payload).is_ok(),
        "CloudMessage" => decode_payload::<CloudMessage>(payload).is_ok(),
        "StreamRequest" => decode_payload::<StreamRequest>(payload).is_ok(),
        "StreamResponse" => decode_payload::<StreamResponse>(payload).is_ok(),
        _ => return None,
    };
    assert!(ok, "golden sample {name} does not decode");
    nephele_fuzz::MESSAGE_KINDS
        .iter()
        .position(|k| *k == kind)
        .map(|i| i as u8)
}

fn slug(name: &str) -> String {
    name.replace("::", "-").replace(' ', "-")
}

fn frame_decoder(golden: &[(String, Vec<u8>)]) {
    let mut previous: Option<(u8, Vec<u8>)> = None;
    for (i, (name, payload)) in golden.iter().enumerate() {
        let Some(kind) = kind_of(name, payload) else {
            continue;
        };
        // Chunk sizes 64 (whole), 1 (byte by byte) and a few in between.
        let chunk = [63u8, 0, 6, 17][i % 4];
        let mut input = vec![kind, chunk];
        input.extend_from_slice(&frame(payload));
        write("frame_decoder", &slug(name), &input);
        if let Some((prev_kind, prev_frame)) = &previous {
            if *prev_kind == kind {
                let mut two = input.clone();
                two.extend_from_slice(prev_frame);
                write("frame_decoder", &format!("{}-two-frames", slug(name)), &two);
            }
        }
        previous = Some((kind, frame(payload)));
    }
    // A truncated frame and a corrupted one (of the largest sample).
    let (name, payload) = golden
        .iter()
        .filter(|(name, _)| !name.starts_with("ModelManifest"))
        .max_by_key(|(_, payload)| payload.len())
        .expect("samples");
    let kind = kind_of(name, payload).expect("message kind");
    let mut input = vec![kind, 63];
    input.extend_from_slice(&frame(payload));
    write(
        "frame_decoder",
        &format!("{}.truncated", slug(name)),
        &input[..input.len() / 2],
    );
    let mut corrupted = input.clone();
    let middle = corrupted.len() / 2;
    corrupted[middle] ^= 0xa5;
    write(
        "frame_decoder",
        &format!("{}.corrupted", slug(name)),
        &corrupted,
    );
}

fn manifest(golden: &[(String, Vec<u8>)]) {
    let manifest = golden
        .iter()
        .find(|(name, _)| name == "ModelManifest")
        .map(|(_, bytes)| bytes.clone())
        .expect("golden ModelManifest");
    let decoded: ModelManifest = decode_payload(&manifest).expect("manifest decodes");
    let variant = decoded.variants.first().expect("a variant").name.clone();
    // Mode 0: [0][len][variant][manifest], signed by the target.
    let mut input = vec![0, variant.len() as u8];
    input.extend_from_slice(variant.as_bytes());
    input.extend_from_slice(&manifest);
    write_with_damage("manifest", "signed-manifest", &input);

    let key = nephele_fuzz::manifest_key();
    let signature = key.sign(&manifest).as_ref().to_vec();
    // Mode 1: a DesiredState (the golden one) whose assignments carry it, signed.
    let state = golden
        .iter()
        .find(|(name, _)| name == "CloudMessage::DesiredState")
        .map(|(_, bytes)| bytes.clone())
        .expect("golden DesiredState");
    let CloudMessage::DesiredState(mut state) =
        decode_payload::<CloudMessage>(&state).expect("desired state decodes")
    else {
        panic!("not a DesiredState");
    };
    for assignment in &mut state.assignments {
        assignment.model = SignedManifest {
            manifest: manifest.clone(),
            signature: signature.clone(),
        };
        assignment.variant = variant.clone();
    }
    let bytes = encode_payload::<DesiredState>(&state).expect("encode");
    let mut input = vec![1, 0];
    input.extend_from_slice(&bytes);
    write_with_damage("manifest", "desired-state", &input);
    // Mode 2: [2][len][variant][public key][signature][manifest].
    let mut input = vec![2, variant.len() as u8];
    input.extend_from_slice(variant.as_bytes());
    input.extend_from_slice(key.public_key().as_ref());
    input.extend_from_slice(&signature);
    input.extend_from_slice(&manifest);
    write("manifest", "key-signature-manifest", &input);
}

fn firmware_profiles() {
    let dir = root().join("firmware-profiles");
    let mut names: Vec<_> = std::fs::read_dir(&dir)
        .expect("firmware-profiles")
        .map(|e| e.expect("entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "toml"))
        .collect();
    names.sort();
    for (i, path) in names.iter().enumerate() {
        let text = std::fs::read(path).expect("profile");
        let name = path
            .file_name()
            .expect("name")
            .to_string_lossy()
            .into_owned();
        if i == 0 {
            write_with_damage("firmware_profile", &name, &text);
        } else {
            write("firmware_profile", &name, &text);
        }
    }
}

fn cloud_config() {
    let example = std::fs::read(root().join("deploy/cloud.example.toml")).expect("example");
    write_with_damage("cloud_config", "cloud.example.toml", &example);
    write(
        "cloud_config",
        "one-region.toml",
        b"api_listen = \"127.0.0.1:8080\"\n\n[[region]]\nname = \"eu\"\n\n[[region.pool]]\nname = \"cpu\"\nnode_profile = \"x86-cpu-server\"\nmax_nodes = 2\n",
    );
}

fn onnx() {
    let digits = std::fs::read(root().join("shared/models/digits-mlp/model.onnx")).expect("digits");
    write_with_damage("onnx", "digits-mlp.onnx", &digits);
    let typed = nephele_runtime::synthetic::typed_example();
    write_with_damage("onnx", "typed-example.onnx", &typed);
    write(
        "onnx",
        "dense-mlp.onnx",
        &nephele_runtime::synthetic::dense_mlp(4, 8, 2, 3, 1),
    );
    // A small CNN whose 3×3, depthwise and 1×1 layers plan on the runtime's own
    // convolution kernels.
    write_with_damage(
        "onnx",
        "conv-net.onnx",
        &nephele_runtime::synthetic::conv_net(3),
    );
}

fn main() {
    let golden = golden();
    frame_decoder(&golden);
    manifest(&golden);
    firmware_profiles();
    cloud_config();
    onnx();
    println!(
        "seeds written under {}",
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("corpus")
            .display()
    );
}
