//! What the reconciler does with a desired state, decided without IO: which
//! deployments go, which run on untouched (only their parameters change), which are
//! fetched and loaded, and which are refused. The rule that matters after a reconnect
//! or a restart: a deployment already running the variant the state names (same
//! sha256) is never reloaded, however often the state is sent. The reconciler in
//! [`crate::agent`] carries the plan out (downloads, loads, swaps).

use std::collections::{HashMap, HashSet};

use nephele_proto::{decode_payload, Assignment, DesiredState, ModelManifest, ModelVariant};

/// What to do with one assignment of the desired state.
#[derive(Debug, Clone, PartialEq)]
pub enum Step {
    /// It runs this variant already: take the new parameters (SLO, queue bound,
    /// offload), reload nothing.
    Keep(Assignment),
    /// Not running, or running other bytes: fetch the variant and load it.
    Load {
        assignment: Assignment,
        manifest: Box<ModelManifest>,
        variant: Box<ModelVariant>,
    },
    /// The manifest does not verify (signature, decoding, variant): not run.
    Refuse { deployment: String, error: String },
}

/// The reconciler's work for one desired state.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Plan {
    /// Running deployments the state no longer names: unloaded.
    pub remove: Vec<String>,
    /// One step per assignment, in the state's order (a name given twice: the first).
    pub steps: Vec<Step>,
}

/// Plans `desired` against what runs (`running`: deployment → sha256 of the bytes it
/// runs), verifying each manifest with the control plane's `signing_key`.
pub fn plan(
    desired: &DesiredState,
    running: &HashMap<String, [u8; 32]>,
    signing_key: &[u8],
) -> Plan {
    let wanted: HashSet<&str> = desired
        .assignments
        .iter()
        .map(|a| a.deployment.as_str())
        .collect();
    let mut remove: Vec<String> = running
        .keys()
        .filter(|name| !wanted.contains(name.as_str()))
        .cloned()
        .collect();
    remove.sort();
    let mut seen = HashSet::new();
    let steps = desired
        .assignments
        .iter()
        .filter(|a| seen.insert(a.deployment.as_str()))
        .map(
            |assignment| match verify_manifest(signing_key, assignment) {
                Err(error) => Step::Refuse {
                    deployment: assignment.deployment.clone(),
                    error,
                },
                Ok((_, variant))
                    if running.get(&assignment.deployment) == Some(&variant.sha256) =>
                {
                    Step::Keep(assignment.clone())
                }
                Ok((manifest, variant)) => Step::Load {
                    assignment: assignment.clone(),
                    manifest: Box::new(manifest),
                    variant: Box::new(variant),
                },
            },
        )
        .collect();
    Plan { remove, steps }
}

/// Checks the manifest's Ed25519 signature, then decodes it and finds the variant.
pub fn verify_manifest(
    signing_key: &[u8],
    assignment: &Assignment,
) -> Result<(ModelManifest, ModelVariant), String> {
    let key = ring::signature::UnparsedPublicKey::new(&ring::signature::ED25519, signing_key);
    key.verify(&assignment.model.manifest, &assignment.model.signature)
        .map_err(|_| "model manifest signature is invalid; refusing to run it".to_string())?;
    let manifest: ModelManifest =
        decode_payload(&assignment.model.manifest).map_err(|e| format!("manifest: {e}"))?;
    let variant = manifest
        .variants
        .iter()
        .find(|v| v.name == assignment.variant)
        .cloned()
        .ok_or_else(|| format!("manifest has no variant {:?}", assignment.variant))?;
    Ok((manifest, variant))
}

#[cfg(test)]
mod tests {
    use super::*;
    use nephele_proto::SignedManifest;
    use proptest::prelude::*;

    struct Key {
        pair: ring::signature::Ed25519KeyPair,
        public: Vec<u8>,
    }

    fn key() -> Key {
        let rng = ring::rand::SystemRandom::new();
        let pkcs8 = ring::signature::Ed25519KeyPair::generate_pkcs8(&rng).expect("key");
        let pair = ring::signature::Ed25519KeyPair::from_pkcs8(pkcs8.as_ref()).expect("key");
        let public = ring::signature::KeyPair::public_key(&pair)
            .as_ref()
            .to_vec();
        Key { pair, public }
    }

    /// An assignment of deployment `name` whose "full" variant has digest `[digest; 32]`.
    fn assignment(key: &Key, name: &str, digest: u8, slo_ms: u32) -> Assignment {
        let manifest = ModelManifest {
            name: "m".into(),
            format: "onnx".into(),
            created_unix: 1,
            inputs: vec![],
            outputs: vec![],
            validation: "none".into(),
            variants: vec![ModelVariant {
                name: "full".into(),
                kind: nephele_proto::VariantKind::Full,
                precision: "fp32".into(),
                sha256: [digest; 32],
                size: 10,
                accuracy: None,
                min_cosine: Some(1.0),
                flops: 0,
            }],
            state: vec![],
        };
        let bytes = nephele_proto::encode_payload(&manifest).expect("encodes");
        Assignment {
            deployment: name.into(),
            model: SignedManifest {
                signature: key.pair.sign(&bytes).as_ref().to_vec(),
                manifest: bytes,
            },
            variant: "full".into(),
            slo_ms,
            offload: true,
            max_queue: 4,
            hard_example_threshold: None,
        }
    }

    fn state(assignments: Vec<Assignment>) -> DesiredState {
        DesiredState {
            generation: 1,
            assignments,
            jobs: vec![],
        }
    }

    #[test]
    fn manifests_are_verified_before_use() {
        let key = key();
        let good = assignment(&key, "d", 1, 10);
        let (manifest, variant) = verify_manifest(&key.public, &good).expect("valid");
        assert_eq!((manifest.name.as_str(), variant.size), ("m", 10));

        let mut tampered = good.clone();
        let last = tampered.model.manifest.len() - 1;
        tampered.model.manifest[last] ^= 1;
        assert!(verify_manifest(&key.public, &tampered)
            .unwrap_err()
            .contains("signature"));

        let other = self::key();
        assert!(
            verify_manifest(&key.public, &assignment(&other, "d", 1, 10)).is_err(),
            "a manifest signed by another key is refused"
        );

        let mut wrong_variant = good;
        wrong_variant.variant = "int8".into();
        assert!(verify_manifest(&key.public, &wrong_variant)
            .unwrap_err()
            .contains("no variant"));
    }

    #[test]
    fn a_reconnect_with_the_same_state_reloads_nothing() {
        let key = key();
        let running = HashMap::from([("a".to_string(), [1; 32]), ("b".to_string(), [2; 32])]);
        // The same models, with a new SLO for one of them.
        let desired = state(vec![
            assignment(&key, "a", 1, 10),
            assignment(&key, "b", 2, 25),
        ]);
        let plan = plan(&desired, &running, &key.public);
        assert!(plan.remove.is_empty());
        assert!(
            plan.steps.iter().all(|step| matches!(step, Step::Keep(_))),
            "{plan:?}"
        );
        assert!(matches!(&plan.steps[1], Step::Keep(a) if a.slo_ms == 25));
    }

    #[test]
    fn new_bytes_load_and_what_is_no_longer_named_goes() {
        let key = key();
        let running = HashMap::from([("a".to_string(), [1; 32]), ("gone".to_string(), [9; 32])]);
        let mut bad = assignment(&key, "bad", 3, 10);
        bad.model.signature[0] ^= 1;
        let desired = state(vec![
            assignment(&key, "a", 7, 10),
            assignment(&key, "new", 4, 10),
            bad,
        ]);
        let plan = plan(&desired, &running, &key.public);
        assert_eq!(plan.remove, vec!["gone".to_string()]);
        assert!(matches!(&plan.steps[0], Step::Load { variant, .. } if variant.sha256 == [7; 32]));
        assert!(
            matches!(&plan.steps[1], Step::Load { assignment, .. } if assignment.deployment == "new")
        );
        assert!(
            matches!(&plan.steps[2], Step::Refuse { deployment, error } if deployment == "bad" && error.contains("signature"))
        );
    }

    #[test]
    fn a_removed_device_unloads_everything() {
        let key = key();
        let running = HashMap::from([("a".to_string(), [1; 32]), ("b".to_string(), [2; 32])]);
        let plan = plan(&state(vec![]), &running, &key.public);
        assert_eq!(plan.remove, vec!["a".to_string(), "b".to_string()]);
        assert!(plan.steps.is_empty());
    }

    proptest! {
        /// For any running set and any state: one step per named deployment; what runs
        /// the named bytes is kept, never loaded; everything else named is loaded or
        /// refused; what is not named is removed, and only that.
        #[test]
        fn the_plan_reloads_exactly_what_changed(
            running in proptest::collection::hash_map(0u8..6, 0u8..4, 0..6),
            wanted in proptest::collection::vec((0u8..6, 0u8..4, any::<bool>()), 0..8),
        ) {
            let key = key();
            let running: HashMap<String, [u8; 32]> = running
                .into_iter()
                .map(|(name, digest)| (format!("d{name}"), [digest; 32]))
                .collect();
            let assignments: Vec<Assignment> = wanted
                .iter()
                .map(|&(name, digest, tampered)| {
                    let mut a = assignment(&key, &format!("d{name}"), digest, 10);
                    if tampered {
                        a.model.signature[5] ^= 0x20;
                    }
                    a
                })
                .collect();
            let plan = plan(&state(assignments.clone()), &running, &key.public);
            let named: HashSet<&str> = assignments.iter().map(|a| a.deployment.as_str()).collect();
            prop_assert_eq!(plan.steps.len(), named.len());
            for name in running.keys() {
                prop_assert_eq!(plan.remove.contains(name), !named.contains(name.as_str()));
            }
            for (step, &(name, digest, tampered)) in plan.steps.iter().zip(
                wanted.iter().filter({
                    let mut seen = HashSet::new();
                    move |(name, _, _)| seen.insert(*name)
                }),
            ) {
                let runs_it = running.get(&format!("d{name}")) == Some(&[digest; 32]);
                match step {
                    Step::Refuse { .. } => prop_assert!(tampered),
                    Step::Keep(_) => prop_assert!(!tampered && runs_it),
                    Step::Load { .. } => prop_assert!(!tampered && !runs_it),
                }
            }
        }
    }
}
