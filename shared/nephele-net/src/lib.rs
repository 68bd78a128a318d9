//! Networking both sides share: the cluster CA and certificates (rcgen), join tokens,
//! rustls configurations for mutual TLS and for the API's HTTPS, quinn endpoints, and
//! framed message IO on QUIC streams.
//!
//! Policy (who may join, which deployments an agent gets) is not here; this crate only
//! moves bytes securely and reports who is on the other end.

pub mod framing;
pub mod https;
pub mod link;
pub mod pinned;
pub mod pki;
pub mod tls;
pub mod token;
pub mod udp;
pub mod x509;

pub use framing::{read_frame, write_frame, FrameReader, NetError};
pub use pki::{fingerprint, ClusterCa, PkiError};
pub use tls::{
    client_endpoint, join_client_config, mtls_client_config, parse_identity, peer_identity,
    server_config, set_idle_timeout, PeerIdentity, IDLE_TIMEOUT, SERVER_NAME,
};
pub use token::{JoinToken, TokenError};
