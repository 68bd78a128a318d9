//! Pure domain types that both the control plane and the agents use: device firmware
//! profiles (accelerators, precisions, power), labels and label selectors, agent roles.
//!
//! This crate deliberately does no IO beyond parsing text it is handed, has no async,
//! and knows nothing of the wire format (see `nephele-proto`) or of any runtime.

pub mod builtin_profiles;
pub mod labels;
pub mod profile;

pub use labels::{LabelError, Labels, Selector};
pub use profile::{
    AcceleratorKind, AcceleratorSpec, DeviceClass, DeviceSpec, FirmwareProfile, MigProfile,
    Precision, ProfileError,
};

use serde::{Deserialize, Serialize};

/// What an agent does for the fleet.
///
/// | role   | runs on            | serves                                  |
/// |--------|--------------------|-----------------------------------------|
/// | `edge` | devices            | local applications; offloads overflow   |
/// | `pool` | cloud GPU nodes    | requests offloaded to its region        |
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum AgentRole {
    #[default]
    Edge,
    Pool,
}

impl AgentRole {
    pub fn as_str(self) -> &'static str {
        match self {
            AgentRole::Edge => "edge",
            AgentRole::Pool => "pool",
        }
    }
}

impl std::str::FromStr for AgentRole {
    type Err = String;
    fn from_str(text: &str) -> Result<Self, Self::Err> {
        match text {
            "edge" => Ok(AgentRole::Edge),
            "pool" => Ok(AgentRole::Pool),
            other => Err(format!(
                "unknown role {other:?}: expected \"edge\" or \"pool\""
            )),
        }
    }
}

impl std::fmt::Display for AgentRole {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Checks that a name is usable as an id for devices, regions, models and deployments:
/// 1 to 63 characters of lowercase ASCII letters, digits and `-`, not starting or ending
/// with `-` (the DNS label rule, so names fit in certificates and URLs unchanged).
pub fn validate_name(kind: &str, name: &str) -> Result<(), String> {
    let ok_chars = name
        .bytes()
        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-');
    if name.is_empty()
        || name.len() > 63
        || !ok_chars
        || name.starts_with('-')
        || name.ends_with('-')
    {
        return Err(format!(
            "invalid {kind} name {name:?}: use 1-63 characters of a-z, 0-9 and '-', not starting or ending with '-'"
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_follow_the_dns_label_rule() {
        for good in ["a", "rpi5-01", "eu-west", "x".repeat(63).as_str()] {
            assert!(validate_name("device", good).is_ok(), "{good}");
        }
        for bad in [
            "",
            "-a",
            "a-",
            "A",
            "a_b",
            "a.b",
            "x".repeat(64).as_str(),
            "é",
        ] {
            assert!(validate_name("device", bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn roles_parse_and_print() {
        assert_eq!("pool".parse::<AgentRole>(), Ok(AgentRole::Pool));
        assert_eq!(AgentRole::Edge.to_string(), "edge");
        assert!("cloud".parse::<AgentRole>().is_err());
    }
}
