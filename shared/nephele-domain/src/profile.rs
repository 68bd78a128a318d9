//! Firmware profiles: what a class of device can do, as declared in
//! `firmware-profiles/*.toml`. Agents advertise the profile they run with; the control
//! plane chooses model variants and places work from it.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Precision {
    Fp32,
    Tf32,
    Bf16,
    Fp16,
    Fp8,
    Int8,
    Int4,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum AcceleratorKind {
    Cpu,
    Gpu,
    Npu,
    Tpu,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DeviceClass {
    Edge,
    Cloud,
}

/// A MIG (multi-instance GPU) profile: a hardware slice of one physical GPU.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MigProfile {
    pub name: String,
    pub memory_mb: u64,
    pub compute_slices: u32,
    pub max_instances: u32,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AcceleratorSpec {
    pub kind: AcceleratorKind,
    pub model: String,
    pub count: u32,
    /// Dedicated memory per unit; 0 means it shares system memory.
    pub memory_mb: u64,
    pub precisions: Vec<Precision>,
    pub tdp_w: f64,
    /// Peak dense tera-operations per second per unit, by precision.
    pub peak_tops: BTreeMap<Precision, f64>,
    #[serde(default)]
    pub mig: Vec<MigProfile>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DeviceSpec {
    pub name: String,
    pub display_name: String,
    pub vendor: String,
    pub class: DeviceClass,
    pub arch: String,
    pub cpu_model: String,
    pub cpu_cores: u32,
    pub memory_mb: u64,
    pub power_budget_w: f64,
    pub source: String,
}

/// One device class. Parse with [`FirmwareProfile::from_toml`], which also validates.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FirmwareProfile {
    pub device: DeviceSpec,
    #[serde(default, rename = "accelerator")]
    pub accelerators: Vec<AcceleratorSpec>,
}

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ProfileError {
    #[error("profile is not valid TOML for the schema: {0}")]
    Parse(String),
    #[error("profile {profile}: {problem}")]
    Invalid { profile: String, problem: String },
}

impl FirmwareProfile {
    /// Parses and validates a profile. `expected_name`, when given (the file stem), must
    /// equal `device.name`.
    pub fn from_toml(text: &str, expected_name: Option<&str>) -> Result<Self, ProfileError> {
        let profile: FirmwareProfile =
            toml::from_str(text).map_err(|error| ProfileError::Parse(error.to_string()))?;
        profile.validate()?;
        if let Some(expected) = expected_name {
            if expected != profile.device.name {
                return Err(profile.invalid(format!(
                    "device.name {:?} must equal the file name {expected:?}",
                    profile.device.name
                )));
            }
        }
        Ok(profile)
    }

    fn invalid(&self, problem: String) -> ProfileError {
        ProfileError::Invalid {
            profile: self.device.name.clone(),
            problem,
        }
    }

    /// Checks the rules the schema cannot express. See `firmware-profiles/README.md`.
    pub fn validate(&self) -> Result<(), ProfileError> {
        let device = &self.device;
        crate::validate_name("profile", &device.name).map_err(|e| self.invalid(e))?;
        if device.cpu_cores == 0 || device.memory_mb == 0 {
            return Err(self.invalid("cpu_cores and memory_mb must be > 0".into()));
        }
        if !(device.power_budget_w > 0.0 && device.power_budget_w.is_finite()) {
            return Err(self.invalid("power_budget_w must be a positive number".into()));
        }
        if !matches!(device.arch.as_str(), "aarch64" | "x86_64") {
            return Err(self.invalid(format!("arch {:?} must be aarch64 or x86_64", device.arch)));
        }
        if !device.source.starts_with("https://") {
            return Err(self.invalid("source must be an https:// reference to public specs".into()));
        }
        for accel in &self.accelerators {
            let what = format!("accelerator {:?}", accel.model);
            if accel.count == 0 {
                return Err(self.invalid(format!("{what}: count must be > 0")));
            }
            if accel.precisions.is_empty() {
                return Err(self.invalid(format!("{what}: precisions must not be empty")));
            }
            if !(accel.tdp_w > 0.0 && accel.tdp_w.is_finite()) {
                return Err(self.invalid(format!("{what}: tdp_w must be > 0")));
            }
            for precision in &accel.precisions {
                if !accel.peak_tops.contains_key(precision) {
                    return Err(self.invalid(format!("{what}: no peak_tops for {precision:?}")));
                }
            }
            for (precision, tops) in &accel.peak_tops {
                if !accel.precisions.contains(precision) {
                    return Err(self.invalid(format!(
                        "{what}: peak_tops lists {precision:?}, which is not in precisions"
                    )));
                }
                if !(*tops > 0.0 && tops.is_finite()) {
                    return Err(
                        self.invalid(format!("{what}: peak_tops {precision:?} must be > 0"))
                    );
                }
            }
            if !accel.mig.is_empty() && accel.kind != AcceleratorKind::Gpu {
                return Err(self.invalid(format!("{what}: only GPUs have MIG profiles")));
            }
            for mig in &accel.mig {
                if mig.memory_mb == 0 || mig.memory_mb > accel.memory_mb {
                    return Err(self.invalid(format!(
                        "{what}: MIG {} memory must be within the GPU's {} MB",
                        mig.name, accel.memory_mb
                    )));
                }
                if !(1..=7).contains(&mig.compute_slices) || !(1..=7).contains(&mig.max_instances) {
                    return Err(self.invalid(format!(
                        "{what}: MIG {} compute_slices and max_instances must be 1..=7",
                        mig.name
                    )));
                }
            }
        }
        let has = |kind| self.accelerators.iter().any(|a| a.kind == kind);
        match device.class {
            DeviceClass::Cloud if !has(AcceleratorKind::Gpu) => {
                Err(self.invalid("a cloud profile needs at least one GPU accelerator".into()))
            }
            DeviceClass::Edge if !has(AcceleratorKind::Cpu) => {
                Err(self.invalid("an edge profile needs its CPU accelerator entry".into()))
            }
            _ => Ok(()),
        }
    }

    /// The precisions any accelerator of this device can run.
    pub fn precisions(&self) -> Vec<Precision> {
        let mut all: Vec<Precision> = self
            .accelerators
            .iter()
            .flat_map(|a| a.precisions.iter().copied())
            .collect();
        all.sort();
        all.dedup();
        all
    }

    /// Peak TOPS over all units for a precision (0 when unsupported).
    pub fn peak_tops(&self, precision: Precision) -> f64 {
        self.accelerators
            .iter()
            .filter_map(|a| a.peak_tops.get(&precision).map(|t| t * f64::from(a.count)))
            .sum()
    }

    /// A profile for a machine with no declared profile, from what the agent detected.
    /// Where this profile contradicts the host an agent runs on (another architecture,
    /// more cores, or more than 10% more memory than the host has): each said as a
    /// sentence, empty when the profile could describe the host. An agent still runs
    /// with a contradicting profile (a lab emulates devices so), but says so.
    pub fn contradictions(
        &self,
        host_arch: &str,
        host_cores: u32,
        host_memory_mb: u64,
    ) -> Vec<String> {
        let device = &self.device;
        let mut found = Vec::new();
        if !device.arch.is_empty() && device.arch != host_arch {
            found.push(format!(
                "profile {} is for {}, this host is {host_arch}",
                device.name, device.arch
            ));
        }
        if device.cpu_cores > host_cores {
            found.push(format!(
                "profile {} says {} CPU cores, this host has {host_cores}",
                device.name, device.cpu_cores
            ));
        }
        if device.memory_mb > host_memory_mb + host_memory_mb / 10 {
            found.push(format!(
                "profile {} says {} MB of memory, this host has {host_memory_mb} MB",
                device.name, device.memory_mb
            ));
        }
        found
    }

    pub fn detected(cpu_cores: u32, memory_mb: u64, arch: &str) -> FirmwareProfile {
        // Without a datasheet, assume a modern core: 2 FMA units x 8 f32 lanes x 2.5 GHz.
        let fp32_tops = f64::from(cpu_cores.max(1)) * 2.0 * 8.0 * 2.0 * 2.5e9 / 1e12;
        FirmwareProfile {
            device: DeviceSpec {
                name: "detected".into(),
                display_name: format!("detected host ({cpu_cores} cores, {memory_mb} MB)"),
                vendor: "unknown".into(),
                class: DeviceClass::Edge,
                arch: arch.into(),
                cpu_model: "unknown".into(),
                cpu_cores: cpu_cores.max(1),
                memory_mb: memory_mb.max(1),
                power_budget_w: 65.0,
                source: "https://github.com/nephele/nephele/firmware-profiles#detected".into(),
            },
            accelerators: vec![AcceleratorSpec {
                kind: AcceleratorKind::Cpu,
                model: "host CPU".into(),
                count: 1,
                memory_mb: 0,
                precisions: vec![Precision::Fp32, Precision::Int8],
                tdp_w: 65.0,
                peak_tops: BTreeMap::from([
                    (Precision::Fp32, fp32_tops),
                    (Precision::Int8, fp32_tops * 4.0),
                ]),
                mig: Vec::new(),
            }],
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_profile_that_contradicts_its_host_is_told_and_one_that_fits_is_not() {
        let profile = FirmwareProfile::detected(4, 8192, "aarch64");
        assert!(profile.contradictions("aarch64", 4, 8192).is_empty());
        assert!(
            profile.contradictions("aarch64", 8, 7800).is_empty(),
            "within 10%"
        );
        let said = profile.contradictions("x86_64", 2, 4096);
        assert_eq!(said.len(), 3, "{said:?}");
        assert!(
            said[0].contains("is for aarch64, this host is x86_64"),
            "{said:?}"
        );
        assert!(said[1].contains("4 CPU cores, this host has 2"), "{said:?}");
        assert!(
            said[2].contains("8192 MB of memory, this host has 4096 MB"),
            "{said:?}"
        );
    }

    const PI: &str = r#"
[device]
name = "pi"
display_name = "Pi"
vendor = "v"
class = "edge"
arch = "aarch64"
cpu_model = "A76"
cpu_cores = 4
memory_mb = 8192
power_budget_w = 12.0
source = "https://example.org"

[[accelerator]]
kind = "cpu"
model = "A76"
count = 1
memory_mb = 0
precisions = ["fp32", "int8"]
tdp_w = 10.0
[accelerator.peak_tops]
fp32 = 0.1
int8 = 0.4
"#;

    #[test]
    fn a_valid_profile_parses() {
        let profile = FirmwareProfile::from_toml(PI, Some("pi")).expect("valid");
        assert_eq!(profile.precisions(), vec![Precision::Fp32, Precision::Int8]);
        assert!((profile.peak_tops(Precision::Int8) - 0.4).abs() < 1e-12);
    }

    #[test]
    fn broken_profiles_say_what_is_wrong() {
        let cases = [
            (PI.replace("fp32 = 0.1\n", ""), "no peak_tops"),
            (PI.replace("cpu_cores = 4", "cpu_cores = 0"), "cpu_cores"),
            (
                PI.replace("name = \"pi\"", "name = \"Pi!\""),
                "invalid profile name",
            ),
            (PI.replace("class = \"edge\"", "class = \"cloud\""), "GPU"),
            (PI.replace("arch = \"aarch64\"", "arch = \"mips\""), "arch"),
            (
                PI.replace("vendor = \"v\"", "vendor = \"v\"\ncolour = 1"),
                "unknown field",
            ),
        ];
        for (text, expected) in cases {
            let error = FirmwareProfile::from_toml(&text, None)
                .expect_err(expected)
                .to_string();
            assert!(
                error.contains(expected),
                "{error} should mention {expected}"
            );
        }
        let error = FirmwareProfile::from_toml(PI, Some("other"))
            .unwrap_err()
            .to_string();
        assert!(error.contains("file name"), "{error}");
    }

    #[test]
    fn detected_profiles_are_valid() {
        FirmwareProfile::detected(2, 4096, "x86_64")
            .validate()
            .expect("valid");
    }
}
