//! rustls configurations for the three kinds of connection, and quinn endpoints.
//!
//! | connection            | server authenticated by                 | client authenticated by |
//! |-----------------------|-----------------------------------------|-------------------------|
//! | join (no cert yet)    | CA fingerprint from the join token      | the token's secret      |
//! | agent session         | cluster CA                              | agent cert from the CA  |
//!
//! The server accepts connections without a client certificate only so that agents can
//! join; such connections may send nothing but a `JoinRequest` (enforced by the
//! control plane's gateway). A client certificate that is not signed by the cluster CA
//! fails the TLS handshake itself.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use rustls::crypto::CryptoProvider;
use rustls::server::WebPkiClientVerifier;
use rustls::RootCertStore;
use rustls_pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};

use crate::pinned::{Pin, PinnedVerifier};
use crate::pki::PkiError;

/// The name agents expect in the control plane's certificate, whatever address they
/// dial (like `kubernetes.default` for a Kubernetes API server).
pub const SERVER_NAME: &str = "nephele-cloud";

fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// How long a connection lives without hearing from its peer: long enough to ride
/// out a partition of that length on the same session.
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(15);

/// Streams one agent may have open to the control plane at once (offloaded requests,
/// chunk fetches, renewals); one more waits for a stream to finish (back-pressure, not
/// an error). quinn keeps a table entry for every stream the peer may open, so this is
/// memory per agent on the control plane: at 1024 the two tables took about 70 KB of
/// each agent's 125 KB (`nephele bench fleet`). 100 (quinn's own default) is the
/// most whose tables fit 128 slots, about 4 KB.
pub const AGENT_STREAMS: u32 = 100;

/// The control plane's side of every agent connection: the agent's transport with
///
/// - [`AGENT_STREAMS`];
/// - no keep-alives of its own: agents send theirs (every 3 s), which keep both
///   sides' idle timers and the path's NAT bindings fresh, and a dead agent is still
///   found by the idle timeout; pings from this side too would double the control
///   plane's packets for nothing (10,000 agents: 3,300 a second);
/// - one datagram per send call (no segmentation offload): quinn keeps each
///   connection's send buffer at the largest batch it ever sent, up to ten datagrams
///   (about 6 KB per agent, measured), while what the control plane sends an agent is
///   small (desired states, chunks of a model, answers), so batching buys little.
fn server_transport() -> Arc<quinn::TransportConfig> {
    let mut transport = transport_config(IDLE_TIMEOUT);
    transport.keep_alive_interval(None);
    transport.max_concurrent_bidi_streams(AGENT_STREAMS.into());
    transport.enable_segmentation_offload(false);
    Arc::new(transport)
}

/// The transport every connection uses, with another idle timeout (the shorter of the
/// two sides' applies). Keep-alives go at a fifth of it, at most every 3 s.
fn transport_with_idle(idle: Duration) -> Arc<quinn::TransportConfig> {
    Arc::new(transport_config(idle))
}

fn transport_config(idle: Duration) -> quinn::TransportConfig {
    let mut transport = quinn::TransportConfig::default();
    transport.keep_alive_interval(Some((idle / 5).min(Duration::from_secs(3))));
    transport.max_idle_timeout(Some(
        quinn::IdleTimeout::try_from(idle).unwrap_or(quinn::VarInt::from_u32(15_000).into()),
    ));
    transport.max_concurrent_bidi_streams(1024u32.into());
    // What one peer can make this side buffer, all its streams together (quinn's
    // default is unbounded per connection): 4 frames of the 4 MiB limit.
    transport.receive_window((4 * nephele_proto::MAX_FRAME_BYTES as u32).into());
    transport.max_concurrent_uni_streams(0u32.into());
    transport
}

fn tls_error(error: impl std::fmt::Display) -> PkiError {
    PkiError::Invalid(format!("TLS configuration: {error}"))
}

fn roots(ca_der: &[u8]) -> Result<Arc<RootCertStore>, PkiError> {
    let mut roots = RootCertStore::empty();
    roots
        .add(CertificateDer::from(ca_der.to_vec()))
        .map_err(tls_error)?;
    Ok(Arc::new(roots))
}

/// The control plane's QUIC server configuration: mutual TLS with the cluster CA, with
/// certificate-less connections allowed for joining.
pub fn server_config(
    ca_der: &[u8],
    cert_der: &[u8],
    key_pkcs8_der: &[u8],
) -> Result<quinn::ServerConfig, PkiError> {
    let verifier = WebPkiClientVerifier::builder_with_provider(roots(ca_der)?, provider())
        .allow_unauthenticated()
        .build()
        .map_err(tls_error)?;
    let chain = vec![
        CertificateDer::from(cert_der.to_vec()),
        CertificateDer::from(ca_der.to_vec()),
    ];
    let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key_pkcs8_der.to_vec()));
    let mut tls = rustls::ServerConfig::builder_with_provider(provider())
        .with_protocol_versions(&[&rustls::version::TLS13])
        .map_err(tls_error)?
        .with_client_cert_verifier(verifier)
        .with_single_cert(chain, key)
        .map_err(tls_error)?;
    tls.alpn_protocols = vec![nephele_proto::ALPN.to_vec()];
    let quic = quinn::crypto::rustls::QuicServerConfig::try_from(tls).map_err(tls_error)?;
    let mut config = quinn::ServerConfig::with_crypto(Arc::new(quic));
    config.transport_config(server_transport());
    Ok(config)
}

/// Client configuration for an enrolled agent: trusts only the cluster CA and presents
/// the agent's certificate.
pub fn mtls_client_config(
    ca_der: &[u8],
    cert_der: &[u8],
    key_pkcs8_der: &[u8],
) -> Result<quinn::ClientConfig, PkiError> {
    let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key_pkcs8_der.to_vec()));
    let mut tls = rustls::ClientConfig::builder_with_provider(provider())
        .with_protocol_versions(&[&rustls::version::TLS13])
        .map_err(tls_error)?
        .with_root_certificates(roots(ca_der)?)
        .with_client_auth_cert(vec![CertificateDer::from(cert_der.to_vec())], key)
        .map_err(tls_error)?;
    tls.alpn_protocols = vec![nephele_proto::ALPN.to_vec()];
    finish_client(tls)
}

/// Client configuration for joining: the server is trusted when its chain ends in a CA
/// whose sha256 equals `ca_fingerprint` and the leaf verifies against that CA.
pub fn join_client_config(ca_fingerprint: [u8; 32]) -> Result<quinn::ClientConfig, PkiError> {
    let verifier = PinnedVerifier::new(Pin::CaFingerprint(ca_fingerprint), provider());
    let mut tls = rustls::ClientConfig::builder_with_provider(provider())
        .with_protocol_versions(&[&rustls::version::TLS13])
        .map_err(tls_error)?
        .dangerous()
        .with_custom_certificate_verifier(verifier)
        .with_no_client_auth();
    tls.alpn_protocols = vec![nephele_proto::ALPN.to_vec()];
    finish_client(tls)
}

fn finish_client(tls: rustls::ClientConfig) -> Result<quinn::ClientConfig, PkiError> {
    let quic = quinn::crypto::rustls::QuicClientConfig::try_from(tls).map_err(tls_error)?;
    let mut config = quinn::ClientConfig::new(Arc::new(quic));
    config.transport_config(transport_with_idle(IDLE_TIMEOUT));
    Ok(config)
}

/// Sets a client's idle timeout: an agent that has other control-plane replicas to
/// try notices a dead one sooner (a dead peer's UDP port is silent, not refusing).
pub fn set_idle_timeout(config: &mut quinn::ClientConfig, idle: Duration) {
    config.transport_config(transport_with_idle(idle));
}

/// A QUIC client endpoint on an ephemeral port of the right address family.
pub fn client_endpoint(server: SocketAddr) -> std::io::Result<quinn::Endpoint> {
    let bind: SocketAddr = if server.is_ipv6() {
        "[::]:0".parse().map_err(std::io::Error::other)?
    } else {
        "0.0.0.0:0".parse().map_err(std::io::Error::other)?
    };
    quinn::Endpoint::client(bind)
}

/// Who is on the other end of an authenticated agent connection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeerIdentity {
    pub name: String,
    pub role: String,
    /// sha256 of the certificate, to tell a current certificate from a superseded one.
    pub cert_sha256: [u8; 32],
}

/// Reads the agent identity from the certificate the peer presented, if any. The TLS
/// layer has already verified the chain against the cluster CA.
pub fn peer_identity(connection: &quinn::Connection) -> Option<PeerIdentity> {
    let certs = connection
        .peer_identity()?
        .downcast::<Vec<CertificateDer<'static>>>()
        .ok()?;
    parse_identity(certs.first()?)
}

/// Agent name (CN) and role (OU) of an agent certificate.
pub fn parse_identity(cert_der: &[u8]) -> Option<PeerIdentity> {
    let cert = crate::x509::Certificate::parse(cert_der).ok()?;
    Some(PeerIdentity {
        name: cert.common_name?,
        role: cert.organizational_unit?,
        cert_sha256: crate::pki::fingerprint(cert_der),
    })
}
