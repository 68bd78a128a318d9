//! Loads and validates every file in `firmware-profiles/`, and checks that the set
//! compiled into the binaries is exactly that folder.

#![allow(clippy::unwrap_used)]

use std::path::PathBuf;

use nephele_domain::{builtin_profiles, DeviceClass, FirmwareProfile, Precision};

fn profiles_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../firmware-profiles")
}

#[test]
fn every_profile_file_is_valid() {
    let mut names = Vec::new();
    for entry in std::fs::read_dir(profiles_dir()).expect("firmware-profiles/ exists") {
        let path = entry.expect("dir entry").path();
        if path.extension().and_then(|e| e.to_str()) != Some("toml") {
            continue;
        }
        let stem = path
            .file_stem()
            .and_then(|s| s.to_str())
            .expect("utf-8 name")
            .to_string();
        let text = std::fs::read_to_string(&path).expect("readable");
        let profile = FirmwareProfile::from_toml(&text, Some(&stem))
            .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        assert!(
            profile.peak_tops(Precision::Fp32) > 0.0 || profile.peak_tops(Precision::Int8) > 0.0
        );
        names.push(stem);
    }
    names.sort();
    assert!(
        names.len() >= 8,
        "need at least 8 device classes, found {names:?}"
    );
    let mut builtin = builtin_profiles::builtin_names();
    builtin.sort();
    assert_eq!(
        builtin, names,
        "builtin_profiles.rs must list exactly the files in firmware-profiles/"
    );
    for name in &names {
        builtin_profiles::builtin(name)
            .expect("listed")
            .expect("valid");
    }
}

#[test]
fn the_fleet_covers_edge_and_cloud_classes() {
    let profiles: Vec<FirmwareProfile> = builtin_profiles::BUILTIN
        .iter()
        .map(|(name, text)| FirmwareProfile::from_toml(text, Some(name)).expect("valid"))
        .collect();
    let edge = profiles
        .iter()
        .filter(|p| p.device.class == DeviceClass::Edge)
        .count();
    let cloud: Vec<&FirmwareProfile> = profiles
        .iter()
        .filter(|p| p.device.class == DeviceClass::Cloud)
        .collect();
    assert!(edge >= 5, "edge classes: {edge}");
    assert!(cloud.len() >= 3, "cloud classes: {}", cloud.len());
    // MIG slices are children of a physical GPU: never more memory than the GPU has.
    let with_mig = cloud
        .iter()
        .flat_map(|p| &p.accelerators)
        .filter(|a| !a.mig.is_empty())
        .count();
    assert!(
        with_mig >= 1,
        "at least one GPU class declares MIG profiles"
    );
}
