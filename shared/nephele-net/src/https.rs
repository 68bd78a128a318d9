//! TLS for the REST API (HTTPS over TCP), as the agents' QUIC sessions have it: the
//! server's certificate is issued by the cluster CA for the names operators reach the
//! API by (or is the operator's own, from PEM files), TLS 1.2 and 1.3 with ring, no
//! client certificate (API clients authenticate with bearer tokens). Clients trust the
//! cluster CA, as a kubeconfig's `certificate-authority` does.

use std::path::Path;
use std::sync::Arc;

use rustls::crypto::CryptoProvider;
use rustls::RootCertStore;
use rustls_pki_types::pem::PemObject as _;
use rustls_pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer, ServerName};

use crate::pinned::{Pin, PinnedVerifier};
use crate::pki::{ClusterCa, PkiError};

fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

fn tls_error(error: impl std::fmt::Display) -> PkiError {
    PkiError::Invalid(error.to_string())
}

/// The API server's certificate chain (leaf first) and key.
#[derive(Debug)]
pub struct ApiIdentity {
    pub chain: Vec<CertificateDer<'static>>,
    pub key: PrivateKeyDer<'static>,
    /// Whether the cluster CA issued it (then a client that trusts the CA and asks for
    /// [`crate::SERVER_NAME`] verifies it, whatever address it dialled).
    pub from_cluster_ca: bool,
}

impl ApiIdentity {
    /// A certificate from the cluster CA for `names` (and [`crate::SERVER_NAME`]),
    /// sent with the CA so a client holding only the CA's fingerprint can check it.
    pub fn issued(ca: &ClusterCa, names: &[String]) -> Result<ApiIdentity, PkiError> {
        let (cert, key) = ca.issue_server(names)?;
        Ok(ApiIdentity {
            chain: vec![CertificateDer::from(cert), ca.cert_der().clone()],
            key: PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key)),
            from_cluster_ca: true,
        })
    }

    /// The operator's certificate chain (PEM, leaf first) and private key (PEM:
    /// PKCS#8, PKCS#1 or SEC1).
    pub fn from_pem_files(cert: &Path, key: &Path) -> Result<ApiIdentity, PkiError> {
        let read = |path: &Path| {
            std::fs::read(path)
                .map_err(|e| PkiError::Invalid(format!("cannot read {}: {e}", path.display())))
        };
        let cert_pem = read(cert)?;
        let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(&cert_pem)
            .collect::<Result<_, _>>()
            .map_err(|e| {
                PkiError::Invalid(format!(
                    "{}: not a PEM certificate chain: {e}",
                    cert.display()
                ))
            })?;
        if chain.is_empty() {
            return Err(PkiError::Invalid(format!(
                "{} holds no certificate (expected PEM \"BEGIN CERTIFICATE\" blocks, the server's first)",
                cert.display()
            )));
        }
        let key_pem = read(key)?;
        let key_der = PrivateKeyDer::from_pem_slice(&key_pem).map_err(|e| {
            PkiError::Invalid(format!(
                "{}: not a PEM private key (PKCS#8, PKCS#1 or SEC1): {e}",
                key.display()
            ))
        })?;
        Ok(ApiIdentity {
            chain,
            key: key_der,
            from_cluster_ca: false,
        })
    }
}

/// The API's server configuration (HTTP/1.1 is put in ALPN by the server itself).
pub fn api_server_config(identity: &ApiIdentity) -> Result<rustls::ServerConfig, PkiError> {
    rustls::ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(tls_error)?
        .with_no_client_auth()
        .with_single_cert(identity.chain.clone(), identity.key.clone_key())
        .map_err(|e| {
            tls_error(format!(
                "the API's certificate and key do not go together: {e}"
            ))
        })
}

/// How a replica reaching another replica's API checks it: against the cluster CA
/// (its certificate names [`crate::SERVER_NAME`]), or, when operators gave their own
/// certificate, by that exact leaf certificate (every replica is given the same one).
pub fn api_peer_client_config(
    ca_der: &[u8],
    identity: &ApiIdentity,
) -> Result<rustls::ClientConfig, PkiError> {
    let builder = rustls::ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(tls_error)?;
    let config = if identity.from_cluster_ca {
        let mut roots = RootCertStore::empty();
        roots
            .add(CertificateDer::from(ca_der.to_vec()))
            .map_err(tls_error)?;
        builder.with_root_certificates(roots).with_no_client_auth()
    } else {
        builder
            .dangerous()
            .with_custom_certificate_verifier(PinnedVerifier::new(
                Pin::Leaf(identity.chain[0].to_vec()),
                provider(),
            ))
            .with_no_client_auth()
    };
    let mut config = config;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(config)
}

/// The name a replica asks for when it dials another's API (see
/// [`api_peer_client_config`]).
pub fn api_peer_server_name() -> ServerName<'static> {
    ServerName::try_from(crate::SERVER_NAME)
        .unwrap_or_else(|_| ServerName::from(std::net::Ipv4Addr::LOCALHOST))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_issued_identity_makes_a_server_config_and_its_peer_trusts_it() {
        let ca = ClusterCa::generate("test").expect("ca");
        let identity = ApiIdentity::issued(&ca, &["localhost".into()]).expect("issued");
        assert_eq!(identity.chain.len(), 2);
        assert!(identity.from_cluster_ca);
        api_server_config(&identity).expect("server config");
        api_peer_client_config(ca.cert_der(), &identity).expect("client config");
    }

    #[test]
    fn files_that_are_not_pem_are_refused_saying_what_was_expected() {
        let dir = std::env::temp_dir().join(format!("nephele-https-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let cert = dir.join("cert.pem");
        let key = dir.join("key.pem");
        std::fs::write(&cert, "not a certificate").expect("write");
        std::fs::write(&key, "not a key").expect("write");
        let error = ApiIdentity::from_pem_files(&cert, &key)
            .unwrap_err()
            .to_string();
        assert!(error.contains("holds no certificate"), "{error}");
        let missing = ApiIdentity::from_pem_files(&dir.join("absent.pem"), &key)
            .unwrap_err()
            .to_string();
        assert!(missing.contains("cannot read"), "{missing}");
        // A real chain and key, as an operator's files would be.
        let ca = ClusterCa::generate("test").expect("ca");
        let (leaf, key_der) = ca.issue_server(&["api.example".into()]).expect("issued");
        std::fs::write(&cert, crate::pki::der_to_pem("CERTIFICATE", &leaf)).expect("write");
        std::fs::write(&key, crate::pki::der_to_pem("PRIVATE KEY", &key_der)).expect("write");
        let identity = ApiIdentity::from_pem_files(&cert, &key).expect("loads");
        assert!(!identity.from_cluster_ca);
        api_server_config(&identity).expect("server config");
        api_peer_client_config(ca.cert_der(), &identity).expect("pinned client config");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
