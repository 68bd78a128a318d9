//! What the control plane reads from each device's firmware profile, parsed once per
//! distinct profile rather than once per device per read: the capabilities variants
//! are chosen by, and the hardware the API shows. A profile parse takes about 20 µs, so
//! building every device's view from its TOML cost a 10,000-device fleet 0.2 s of the
//! federation actor per `GET /v1/devices` (heartbeats waiting behind it); devices of one
//! model announce the same profile, so they share one parse.

use std::collections::HashMap;
use std::sync::Arc;

use nephele_api::AcceleratorView;
use nephele_domain::FirmwareProfile;

use crate::variants::{caps_of, Caps};

/// One profile as the control plane uses it.
#[derive(Debug)]
pub struct ProfileFacts {
    /// The runtime's capabilities on the device, or why the profile gives none.
    pub caps: Caps,
    /// Its accelerators, CPU cores and memory as the API shows them (empty and zero
    /// for a profile that does not parse).
    pub accelerators: Vec<AcceleratorView>,
    pub cpu_cores: u32,
    pub memory_mb: u64,
}

impl ProfileFacts {
    pub fn parse(profile_toml: &str) -> ProfileFacts {
        match FirmwareProfile::from_toml(profile_toml, None) {
            Ok(profile) => ProfileFacts {
                caps: caps_of(&profile),
                accelerators: profile
                    .accelerators
                    .iter()
                    .map(|a| AcceleratorView {
                        kind: format!("{:?}", a.kind).to_lowercase(),
                        model: a.model.clone(),
                        count: a.count,
                        peak_int8_tops: a
                            .peak_tops
                            .get(&nephele_domain::Precision::Int8)
                            .copied()
                            .unwrap_or(0.0),
                    })
                    .collect(),
                cpu_cores: profile.device.cpu_cores,
                memory_mb: profile.device.memory_mb,
            },
            Err(error) => ProfileFacts {
                caps: Err(error.to_string()),
                accelerators: Vec::new(),
                cpu_cores: 0,
                memory_mb: 0,
            },
        }
    }
}

/// Each device's [`ProfileFacts`], shared between devices that announce the same
/// profile text; a text no device announces any more is forgotten.
#[derive(Debug, Default)]
pub struct ProfileCache {
    by_text: HashMap<String, Arc<ProfileFacts>>,
    by_device: HashMap<String, Arc<ProfileFacts>>,
}

impl ProfileCache {
    /// `device` announces `profile_toml` (parsed only if no device announced it yet).
    pub fn set(&mut self, device: &str, profile_toml: &str) {
        let facts = match self.by_text.get(profile_toml) {
            Some(facts) => Arc::clone(facts),
            None => {
                let facts = Arc::new(ProfileFacts::parse(profile_toml));
                self.by_text
                    .insert(profile_toml.to_string(), Arc::clone(&facts));
                facts
            }
        };
        if let Some(before) = self.by_device.insert(device.to_string(), facts) {
            self.forget_if_unused(before);
        }
    }

    pub fn remove(&mut self, device: &str) {
        if let Some(before) = self.by_device.remove(device) {
            self.forget_if_unused(before);
        }
    }

    pub fn get(&self, device: &str) -> Option<&ProfileFacts> {
        self.by_device.get(device).map(|f| &**f)
    }

    /// Whether `device`'s facts are those of `profile_toml` already.
    pub fn holds(&self, device: &str, profile_toml: &str) -> bool {
        match (self.by_device.get(device), self.by_text.get(profile_toml)) {
            (Some(held), Some(parsed)) => Arc::ptr_eq(held, parsed),
            _ => false,
        }
    }

    /// Distinct profile texts held.
    #[cfg(test)]
    pub fn distinct(&self) -> usize {
        self.by_text.len()
    }

    /// Each device's facts, written out (to compare two caches).
    #[cfg(test)]
    pub fn written(&self) -> std::collections::BTreeMap<String, String> {
        self.by_device
            .iter()
            .map(|(device, facts)| (device.clone(), format!("{facts:?}")))
            .collect()
    }

    fn forget_if_unused(&mut self, facts: Arc<ProfileFacts>) {
        // Held by the text map and by `facts` alone: no device uses it any more.
        if Arc::strong_count(&facts) == 2 {
            self.by_text.retain(|_, f| !Arc::ptr_eq(f, &facts));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const RPI: &str = include_str!("../../../../firmware-profiles/rpi5-8gb.toml");
    const CORAL: &str = include_str!("../../../../firmware-profiles/coral-dev-board.toml");

    #[test]
    fn devices_of_one_profile_share_a_parse_and_a_profile_is_forgotten_with_its_last_device() {
        let mut cache = ProfileCache::default();
        for i in 0..100 {
            cache.set(&format!("pi-{i}"), RPI);
        }
        cache.set("coral-1", CORAL);
        assert_eq!(cache.distinct(), 2);
        let pi = cache.get("pi-7").unwrap();
        assert_eq!(pi.cpu_cores, 4);
        assert_eq!(pi.memory_mb, 8192);
        assert!(pi.caps.is_ok());
        assert!(cache.holds("pi-7", RPI));
        assert!(!cache.holds("pi-7", CORAL));
        assert_eq!(cache.get("coral-1").unwrap().accelerators.len(), 2);

        // The coral announces another profile: its old one goes with it.
        cache.set("coral-1", RPI);
        assert_eq!(cache.distinct(), 1);
        cache.set("coral-1", CORAL);
        cache.remove("coral-1");
        assert_eq!(cache.distinct(), 1);
        assert!(cache.get("coral-1").is_none());
        for i in 0..100 {
            cache.remove(&format!("pi-{i}"));
        }
        assert_eq!(cache.distinct(), 0);
    }

    #[test]
    fn a_profile_that_does_not_parse_gives_no_caps_and_no_hardware() {
        let mut cache = ProfileCache::default();
        cache.set("odd", "this is [not a profile");
        let facts = cache.get("odd").unwrap();
        assert!(facts.caps.is_err());
        assert!(facts.accelerators.is_empty());
        assert_eq!((facts.cpu_cores, facts.memory_mb), (0, 0));
    }
}
