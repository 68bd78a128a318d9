//! What the federation core signs with: the cluster CA (agent certificates) and the
//! manifest-signing key. Behind a trait so the core holds no key material type of its
//! own; the control plane's [`Keys`] is the one implementation.

use nephele_net::ClusterCa;

pub trait Authority {
    /// A certificate for an agent's CSR, with the device's name and role (the CSR's
    /// subject is not used).
    fn sign_agent_csr(&self, csr_der: &[u8], name: &str, role: &str) -> Result<Vec<u8>, String>;
    /// The signature of a model manifest (Ed25519).
    fn sign_manifest(&self, manifest: &[u8]) -> Vec<u8>;
    /// The manifest-signing public key agents verify with.
    fn manifest_public_key(&self) -> Vec<u8>;
    /// The cluster CA certificate (DER).
    fn ca_der(&self) -> Vec<u8>;
    /// sha256 of the CA certificate, pinned by join tokens.
    fn ca_fingerprint(&self) -> [u8; 32];
}

/// The control plane's CA and manifest-signing key.
pub struct Keys {
    pub ca: ClusterCa,
    pub signing_key: ring::signature::Ed25519KeyPair,
}

impl Authority for Keys {
    fn sign_agent_csr(&self, csr_der: &[u8], name: &str, role: &str) -> Result<Vec<u8>, String> {
        self.ca
            .sign_agent_csr(csr_der, name, role)
            .map_err(|e| e.to_string())
    }

    fn sign_manifest(&self, manifest: &[u8]) -> Vec<u8> {
        self.signing_key.sign(manifest).as_ref().to_vec()
    }

    fn manifest_public_key(&self) -> Vec<u8> {
        ring::signature::KeyPair::public_key(&self.signing_key)
            .as_ref()
            .to_vec()
    }

    fn ca_der(&self) -> Vec<u8> {
        self.ca.cert_der().to_vec()
    }

    fn ca_fingerprint(&self) -> [u8; 32] {
        self.ca.fingerprint()
    }
}

/// What a read-only copy of the fleet holds instead of keys: nothing. A
/// [`super::fleet_copy::FleetCopy`] only answers reads, which sign nothing, so these
/// are never asked; were they, they refuse or give nothing.
pub(crate) struct NoKeys;

impl Authority for NoKeys {
    fn sign_agent_csr(&self, _: &[u8], _: &str, _: &str) -> Result<Vec<u8>, String> {
        Err("a read-only copy of the fleet signs nothing".into())
    }

    fn sign_manifest(&self, _: &[u8]) -> Vec<u8> {
        Vec::new()
    }

    fn manifest_public_key(&self) -> Vec<u8> {
        Vec::new()
    }

    fn ca_der(&self) -> Vec<u8> {
        Vec::new()
    }

    fn ca_fingerprint(&self) -> [u8; 32] {
        [0; 32]
    }
}
