//! The fleet core's rules on records built here: no store, no actor.

use super::*;
use crate::store::{ReplicaSettings, VariantRecord};
use nephele_proto::ModelVariant;
use proptest::prelude::*;
use std::collections::BTreeSet;

pub(in crate::federation) fn device(
    name: &str,
    role: AgentRole,
    labels: &[(&str, &str)],
) -> DeviceRecord {
    DeviceRecord {
        name: name.into(),
        role,
        region: "eu".into(),
        labels: labels
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        cert_sha256: String::new(),
        next_cert_sha256: None,
        joined_unix: 0,
        profile_name: "rpi4".into(),
        profile_toml: String::new(),
    }
}

fn variant_record(name: &str, rejected: Option<&str>) -> VariantRecord {
    VariantRecord {
        name: name.into(),
        precision: "fp32".into(),
        size: 100,
        flops: 0,
        accuracy_pct: None,
        min_cosine: Some(1.0),
        top1_agreement: None,
        cut: None,
        rejected: rejected.map(str::to_string),
        status: String::new(),
        note: None,
        accepted_on: None,
        reason: None,
    }
}

/// A model with a shipped `full`, a shipped `int8w` (weights-only int8) and a
/// rejected `int8`.
pub(in crate::federation) fn model(name: &str) -> ModelRecord {
    let variant = |name: &str, kind| ModelVariant {
        name: name.into(),
        kind,
        precision: "fp32".into(),
        sha256: [7; 32],
        size: 100,
        accuracy: None,
        min_cosine: Some(1.0),
        flops: 0,
    };
    let manifest = ModelManifest {
        name: name.into(),
        format: "onnx".into(),
        created_unix: 0,
        inputs: vec![],
        outputs: vec![],
        validation: "none".into(),
        variants: vec![
            variant("full", VariantKind::Full),
            variant("int8w", VariantKind::Int8Weights),
        ],
        state: vec![],
    };
    ModelRecord {
        name: name.into(),
        version: String::new(),
        sha256: "00".into(),
        size: 4096,
        created_unix: 0,
        inputs: vec![],
        outputs: vec![],
        signed_manifest: nephele_proto::encode_payload(&manifest).expect("encodes"),
        signature: vec![1, 2, 3],
        variants: vec![
            variant_record("full", None),
            variant_record("int8w", None),
            variant_record("int8", Some("cosine 0.9 below 0.99")),
        ],
        validation: "none".into(),
        validation_sha256: None,
        format: "onnx".into(),
        input_specs: vec![],
        recurrent_state: vec![],
        tenant: "default".into(),
        sequence: 0,
    }
}

pub(in crate::federation) fn spec(
    name: &str,
    model: &str,
    selector: &str,
    variant: &str,
) -> DeploymentSpec {
    DeploymentSpec {
        name: name.into(),
        model: model.into(),
        selector: selector.into(),
        slo_ms: 50,
        offload: true,
        max_queue: 64,
        variant: variant.into(),
        hard_example_threshold: None,
        replicas: ReplicaSettings::default(),
        rollout: None,
        tenant: None,
    }
}

#[test]
fn the_latest_version_is_the_last_stored_even_within_one_second() {
    // Two pushes in the same second: the clock cannot order them, the sequence does,
    // whatever their versions' names sort as.
    let mut catalog = Catalog::load(vec![], vec![]);
    for version in ["zzz", "aaa"] {
        let mut record = model("m");
        record.version = version.into();
        record.created_unix = 100;
        record.sequence = catalog.next_sequence("m");
        catalog.put_model(record);
    }
    assert_eq!(catalog.latest("m").map(|m| m.version.as_str()), Some("aaa"));
    assert_eq!(
        catalog.resolve("m").map(|m| m.version.as_str()),
        Some("aaa")
    );
    let order: Vec<&str> = catalog
        .versions("m")
        .iter()
        .map(|m| m.version.as_str())
        .collect();
    assert_eq!(order, ["zzz", "aaa"]);
    // Versions stored before the sequence was kept (0) come first, by time.
    let mut old = model("m");
    old.version = "old".into();
    old.created_unix = 200;
    catalog.put_model(old);
    assert_eq!(catalog.versions("m")[0].version, "old");
    assert_eq!(catalog.next_sequence("m"), 3);
}

fn catalog_with(deployments: &[(&str, &str)]) -> Catalog {
    let mut catalog = Catalog::load(vec![], vec![model("m")]);
    for (name, selector) in deployments {
        let record = catalog
            .validate(spec(name, "m", selector, "auto"), 1, "default")
            .expect("valid");
        catalog.put_deployment(record);
    }
    catalog
}

fn named(desired: &DesiredState) -> Vec<&str> {
    desired
        .assignments
        .iter()
        .map(|a| a.deployment.as_str())
        .collect()
}

#[test]
fn edge_devices_get_what_their_labels_select() {
    let catalog = catalog_with(&[("cams", "site=north"), ("all", ""), ("gpu", "tier=gpu")]);
    let north = device("n1", AgentRole::Edge, &[("site", "north")]);
    let south = device("s1", AgentRole::Edge, &[("site", "south")]);
    let desired = catalog.desired_for(&north, DeviceInputs::default(), 9);
    assert_eq!(named(&desired), vec!["all", "cams"]);
    assert_eq!(desired.generation, 9);
    assert!(desired.jobs.is_empty());
    assert_eq!(
        named(&catalog.desired_for(&south, DeviceInputs::default(), 9)),
        vec!["all"]
    );
    // The implicit labels select too.
    let catalog = catalog_with(&[("by-name", "nephele.io/name=s1")]);
    assert_eq!(
        named(&catalog.desired_for(&south, DeviceInputs::default(), 1)),
        vec!["by-name"]
    );
}

#[test]
fn pool_agents_get_only_what_their_region_placed_and_only_offloading_deployments() {
    let mut catalog = catalog_with(&[("a", ""), ("b", "")]);
    let mut local_only = catalog
        .validate(spec("c", "m", "", "auto"), 1, "default")
        .unwrap();
    local_only.offload = false;
    catalog.put_deployment(local_only);
    let pool = device("p1", AgentRole::Pool, &[]);
    assert!(catalog
        .desired_for(&pool, DeviceInputs::default(), 1)
        .assignments
        .is_empty());
    let work = PoolWork {
        deployments: BTreeSet::from(["b".to_string(), "c".to_string()]),
        jobs: vec![],
    };
    let inputs = DeviceInputs {
        pool_work: Some(&work),
        ..DeviceInputs::default()
    };
    let desired = catalog.desired_for(&pool, inputs, 1);
    assert_eq!(named(&desired), vec!["b"]);
    assert_eq!(
        desired.assignments[0].variant, "full",
        "pools run the reference"
    );
}

#[test]
fn a_new_deployment_is_checked_against_the_catalogue() {
    let catalog = catalog_with(&[("taken", "")]);
    let refused = |spec: DeploymentSpec| catalog.validate(spec, 1, "default").unwrap_err();
    assert!(
        matches!(refused(spec("x", "nope", "", "auto")), ApiError::NotFound(m) if m.contains("model push"))
    );
    assert!(matches!(
        refused(spec("taken", "m", "", "auto")),
        ApiError::Conflict(_)
    ));
    assert!(matches!(
        refused(spec("Bad Name", "m", "", "auto")),
        ApiError::BadRequest(_)
    ));
    assert!(matches!(
        refused(spec("x", "m", "=v", "auto")),
        ApiError::BadRequest(_)
    ));
    match refused(spec("x", "m", "", "int8")) {
        ApiError::BadRequest(message) => {
            assert!(message.contains("full, int8w"), "{message}")
        }
        other => panic!("{other:?}"),
    }
    assert!(
        matches!(refused(spec("x", "m", "", "split")), ApiError::BadRequest(m) if m.contains("split"))
    );
    let mut slow = spec("x", "m", "", "auto");
    slow.slo_ms = 0;
    assert!(matches!(refused(slow), ApiError::BadRequest(_)));
    let record = catalog
        .validate(spec("x", "m", "", "int8w"), 77, "default")
        .unwrap();
    assert_eq!(
        (record.variant.as_str(), record.created_unix),
        ("int8w", 77)
    );
}

#[test]
fn an_unreadable_stored_manifest_ships_full_and_says_why() {
    let mut broken = model("m");
    broken.signed_manifest = vec![0xff; 3];
    let mut catalog = Catalog::load(vec![], vec![broken]);
    catalog.put_deployment(DeploymentRecord {
        name: "d".into(),
        model: "m".into(),
        selector: String::new(),
        slo_ms: 50,
        offload: true,
        max_queue: 4,
        created_unix: 0,
        variant: "auto".into(),
        hard_example_threshold: None,
        replicas: ReplicaSettings::default(),
        rollout_settings: None,
        rollout: None,
        tenant: "default".into(),
    });
    let edge = device("e", AgentRole::Edge, &[]);
    let desired = catalog.desired_for(&edge, DeviceInputs::default(), 1);
    assert_eq!(desired.assignments[0].variant, "full");
    assert_eq!(catalog.whole_model_of("d", "full"), None);
}

#[test]
fn measured_times_count_only_for_variants_that_compute_the_whole_model() {
    let catalog = catalog_with(&[("d", "")]);
    assert_eq!(catalog.whole_model_of("d", "full"), Some("m"));
    assert_eq!(catalog.whole_model_of("d", "int8w"), Some("m"));
    assert_eq!(catalog.whole_model_of("d", "split-3"), None);
    assert_eq!(catalog.whole_model_of("gone", "full"), None);
}

#[test]
fn replica_specs_cover_the_offloading_deployments_with_their_model_size() {
    let mut catalog = catalog_with(&[("a", ""), ("b", "")]);
    let mut local_only = catalog
        .validate(spec("c", "m", "", "auto"), 1, "default")
        .unwrap();
    local_only.offload = false;
    catalog.put_deployment(local_only);
    let specs = catalog.replica_specs(&AutoscaleConfig::default());
    assert_eq!(specs.len(), 2);
    assert!(catalog.remove_deployment("a"));
    assert!(!catalog.remove_deployment("a"));
    assert_eq!(catalog.replica_specs(&AutoscaleConfig::default()).len(), 1);
}

proptest! {
    /// Kept in step by puts and removes, the catalogue answers as one loaded afresh
    /// from the same records would (what a restarted or newly elected control plane
    /// loads), and a device never gets a deployment twice or one it should not run.
    #[test]
    fn the_catalogue_kept_in_step_equals_one_loaded_afresh(
        ops in proptest::collection::vec((0u8..6, any::<bool>(), 0u8..3), 0..40),
        site in 0u8..3,
    ) {
        let mut catalog = Catalog::load(vec![], vec![model("m")]);
        let mut records: BTreeMap<String, DeploymentRecord> = BTreeMap::new();
        for (name, put, selector) in ops {
            let name = format!("d{name}");
            if put {
                let selector = match selector {
                    0 => String::new(),
                    n => format!("site=s{n}"),
                };
                catalog.remove_deployment(&name);
                let record = catalog.validate(spec(&name, "m", &selector, "auto"), 1, "default").unwrap();
                records.insert(name, record.clone());
                catalog.put_deployment(record);
            } else {
                prop_assert_eq!(catalog.remove_deployment(&name), records.remove(&name).is_some());
            }
        }
        let fresh = Catalog::load(records.values().cloned().collect(), vec![model("m")]);
        let edge = device("e", AgentRole::Edge, &[("site", &format!("s{site}"))]);
        let kept = catalog.desired_for(&edge, DeviceInputs::default(), 3);
        prop_assert_eq!(&kept, &fresh.desired_for(&edge, DeviceInputs::default(), 3));
        let names = named(&kept);
        let unique: BTreeSet<&str> = names.iter().copied().collect();
        prop_assert_eq!(unique.len(), names.len());
        let selecting = format!("site=s{site}");
        for name in names {
            let selector = &records[name].selector;
            prop_assert!(selector.is_empty() || *selector == selecting);
        }
    }
}

proptest! {
    /// A selector matched key by key on a device ([`device_label`]) answers as on the
    /// device's whole label map ([`device_labels`]), derived labels included (a device
    /// label named like a derived one is overridden by it).
    #[test]
    fn selectors_match_a_device_key_by_key_as_on_its_label_map(
        terms in proptest::collection::vec((0u8..4, 0u8..7, 0u8..3), 1..4),
        own in proptest::collection::vec((0u8..7, 0u8..3), 0..4),
        pool in any::<bool>(),
        no_profile in any::<bool>(),
    ) {
        let keys = ["site", "tier", "nephele.io/role", "nephele.io/region",
            "nephele.io/profile", "nephele.io/name", "zone"];
        let values = ["eu", "edge", "x"];
        let labels: Vec<(&str, &str)> = own
            .iter()
            .map(|&(k, v)| (keys[k as usize], values[v as usize]))
            .collect();
        let role = if pool { AgentRole::Pool } else { AgentRole::Edge };
        let mut record = device("x", role, &labels);
        if no_profile {
            record.profile_name.clear();
        }
        let text: Vec<String> = terms
            .iter()
            .map(|&(op, k, v)| {
                let (key, value) = (keys[k as usize], values[v as usize]);
                match op {
                    0 => format!("{key}={value}"),
                    1 => format!("{key}!={value}"),
                    2 => key.to_string(),
                    _ => format!("!{key}"),
                }
            })
            .collect();
        let selector = nephele_domain::Selector::parse(&text.join(",")).expect("valid selector");
        prop_assert_eq!(
            selector.matches_by(|key| device_label(&record, key)),
            selector.matches(&device_labels(&record))
        );
    }
}
