//! The agent's targets (`manifest`, `onnx`; cargo feature `edge`). A file of its own so
//! that the workspace's tests replay the same bodies over the corpora and the kept
//! crashes in every CI run (`tests/tests/fuzz_seeds.rs` includes it by path), without
//! building the agent for AFL.

use nephele_proto::decode_payload;

/// The fixed manifest-signing key of the `manifest` target (the seed is public: this
/// is a test key, it signs nothing real).
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
/// /v1/models/NAME` (model_build) and as `nephele model inspect` does: `input_spec::prepare`
/// (decode, refuse an empty graph, fold constant `If`s), then the import's choice of
/// path (`import::load_unchecked`: the batched path, else the typed one). Nothing is
/// run (a push also runs a typed model once on zeros).
///
/// The runtime deliberately turns a panic inside tract's parser into an `Err`
/// (`guard_parser`), so the binary uses `afl::fuzz_nohook!`: such a caught panic is an
/// answer, and only a panic that escapes the runtime aborts.
pub fn onnx(data: &[u8]) {
    use nephele_runtime::{import, input_spec};
    let Ok(prepared) = input_spec::prepare("fuzz", data, &[]) else {
        return;
    };
    let _ = import::load_unchecked("fuzz", &prepared);
}
