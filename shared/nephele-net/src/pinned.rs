//! The one server-certificate verifier that does not go by a root store alone: a
//! pinned certificate. Two pins exist: the cluster CA by its SHA-256 (a join, whose
//! token carries the CA's fingerprint: the chain must contain that CA and the leaf
//! verify against it, names and dates included) and one exact leaf certificate (one
//! replica calling another's API when operators gave their own certificate). Either
//! way the handshake's signatures are checked with the provider's algorithms.

use std::sync::Arc;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::WebPkiServerVerifier;
use rustls::crypto::CryptoProvider;
use rustls::{DigitallySignedStruct, RootCertStore, SignatureScheme};
use rustls_pki_types::{CertificateDer, ServerName, UnixTime};

/// What a [`PinnedVerifier`] accepts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Pin {
    /// A chain holding the CA with this SHA-256, its leaf verified against that CA.
    CaFingerprint([u8; 32]),
    /// Exactly this leaf certificate (DER).
    Leaf(Vec<u8>),
}

/// A [`ServerCertVerifier`] for a [`Pin`].
#[derive(Debug)]
pub struct PinnedVerifier {
    pin: Pin,
    provider: Arc<CryptoProvider>,
}

impl PinnedVerifier {
    pub fn new(pin: Pin, provider: Arc<CryptoProvider>) -> Arc<Self> {
        Arc::new(Self { pin, provider })
    }
}

impl ServerCertVerifier for PinnedVerifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        match &self.pin {
            Pin::Leaf(leaf) if end_entity.as_ref() == leaf.as_slice() => {
                Ok(ServerCertVerified::assertion())
            }
            Pin::Leaf(_) => Err(rustls::Error::General(
                "the other replica's API certificate is not the one this replica was given".into(),
            )),
            Pin::CaFingerprint(fingerprint) => {
                let ca = intermediates
                    .iter()
                    .find(|cert| crate::pki::fingerprint(cert) == *fingerprint)
                    .ok_or_else(|| {
                        rustls::Error::General(
                            "the server's CA does not match the fingerprint in the join token"
                                .into(),
                        )
                    })?;
                let mut roots = RootCertStore::empty();
                roots
                    .add(ca.clone().into_owned())
                    .map_err(|e| rustls::Error::General(format!("pinned CA unusable: {e}")))?;
                WebPkiServerVerifier::builder_with_provider(Arc::new(roots), self.provider.clone())
                    .build()
                    .map_err(|e| rustls::Error::General(e.to_string()))?
                    .verify_server_cert(end_entity, &[], server_name, ocsp_response, now)
            }
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.provider
            .signature_verification_algorithms
            .supported_schemes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn provider() -> Arc<CryptoProvider> {
        Arc::new(rustls::crypto::ring::default_provider())
    }

    fn check(pin: Pin, leaf: &[u8], chain: &[&[u8]]) -> Result<ServerCertVerified, rustls::Error> {
        let chain: Vec<CertificateDer<'_>> =
            chain.iter().map(|c| CertificateDer::from(*c)).collect();
        PinnedVerifier::new(pin, provider()).verify_server_cert(
            &CertificateDer::from(leaf),
            &chain,
            &ServerName::try_from(crate::SERVER_NAME).expect("name"),
            &[],
            UnixTime::now(),
        )
    }

    #[test]
    fn each_pin_accepts_what_it_names_and_nothing_else() {
        let ca = crate::ClusterCa::generate("pinned-test").expect("ca");
        let other = crate::ClusterCa::generate("other").expect("ca");
        let (leaf, _) = ca.issue_server(&[]).expect("leaf");
        let (stranger, _) = other.issue_server(&[]).expect("leaf");
        let by_ca = Pin::CaFingerprint(ca.fingerprint());
        assert!(check(by_ca.clone(), &leaf, &[ca.cert_der()]).is_ok());
        // Another CA's chain, or the right CA with a leaf it did not sign.
        let wrong = check(by_ca.clone(), &stranger, &[other.cert_der()]).unwrap_err();
        assert!(wrong.to_string().contains("fingerprint"), "{wrong}");
        assert!(check(by_ca, &stranger, &[ca.cert_der()]).is_err());
        let by_leaf = Pin::Leaf(leaf.clone());
        assert!(check(by_leaf.clone(), &leaf, &[]).is_ok());
        let wrong = check(by_leaf, &stranger, &[]).unwrap_err();
        assert!(wrong.to_string().contains("not the one"), "{wrong}");
    }
}
