//! UDP sockets for QUIC endpoints that carry many connections.
//!
//! One socket serves every agent of a control plane. The kernel's default receive
//! buffer (about 208 KiB on Linux) holds some 170 datagrams: a burst of handshakes or
//! keep-alives from a large fleet overflows it while the gateway's threads are busy,
//! and what is dropped is resent only after a loss timer (measured: 613,000 datagrams
//! dropped in one `nephele bench fleet --agents 50000` run, and 134 handshakes timed
//! out). Endpoints that carry many connections ask for [`MANY_CONNECTIONS_BUFFER`].

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use socket2::{Domain, Protocol, Socket, Type};

/// Receive and send buffer asked for a socket that carries many connections. The
/// kernel grants at most `net.core.rmem_max` / `wmem_max`; [`BoundUdp::granted`]
/// says what it gave.
pub const MANY_CONNECTIONS_BUFFER: usize = 8 << 20;

/// A bound UDP socket and the buffers the kernel granted it.
pub struct BoundUdp {
    pub socket: std::net::UdpSocket,
    /// Receive buffer, bytes of payload (Linux reports twice what it counts as
    /// payload; this is halved back).
    pub receive_buffer: usize,
    pub send_buffer: usize,
    /// What was asked for each.
    pub asked: usize,
}

impl BoundUdp {
    /// Whether the kernel granted the receive buffer asked for.
    pub fn granted(&self) -> bool {
        self.receive_buffer >= self.asked
    }

    /// What to tell an operator when it did not.
    pub fn advice(&self) -> String {
        format!(
            "UDP receive buffer is {} KiB, asked {} KiB: the kernel caps it at net.core.rmem_max; \
             a large fleet's bursts of handshakes and keep-alives are then dropped and resent. \
             Raise it (sysctl -w net.core.rmem_max={} net.core.wmem_max={})",
            self.receive_buffer / 1024,
            self.asked / 1024,
            self.asked,
            self.asked
        )
    }
}

/// Binds `address` with receive and send buffers of `buffer` bytes asked (best effort:
/// see [`BoundUdp`] for what was granted).
pub fn bind(address: SocketAddr, buffer: usize) -> std::io::Result<BoundUdp> {
    let socket = Socket::new(
        Domain::for_address(address),
        Type::DGRAM,
        Some(Protocol::UDP),
    )?;
    // Refused sizes are not errors: the socket works with what the kernel gives.
    let _ = socket.set_recv_buffer_size(buffer);
    let _ = socket.set_send_buffer_size(buffer);
    socket.bind(&address.into())?;
    let reported = |size: usize| {
        if cfg!(target_os = "linux") {
            size / 2
        } else {
            size
        }
    };
    Ok(BoundUdp {
        receive_buffer: reported(socket.recv_buffer_size()?),
        send_buffer: reported(socket.send_buffer_size()?),
        asked: buffer,
        socket: socket.into(),
    })
}

/// Least time between two stateless resets the endpoint sends (quinn's default is
/// 20 ms, 50 a second: after a restart, a fleet of 10,000 agents, whose keep-alives
/// and heartbeats arrive some 3,000 a second, would mostly wait out the idle timeout
/// instead). A reset is always smaller than the packet that caused it, so it
/// amplifies nothing.
pub const MIN_RESET_INTERVAL: Duration = Duration::from_micros(100);

/// The endpoint configuration of a server whose connections should end at once when
/// it restarts, not after the peers' idle timeout.
///
/// A QUIC endpoint answers a packet for a connection it does not know with a
/// *stateless reset*, whose token the peer checks against the one it was given for
/// that connection ID; both come from the endpoint's reset key, and quinn drops a
/// packet whose connection ID its generator did not sign before resetting anything.
/// quinn draws both keys at random per process, so a restarted control plane's resets
/// were ones the agents ignored, and they came back only after their 15 s idle
/// timeout. Here both keys are derived from `secret` (the cluster CA's private key:
/// as secret as it must be, the same for every replica of a site, and kept across
/// restarts), so the restarted process resets the old connections on the agents'
/// next packet (a heartbeat, every second) and they reconnect at once.
pub fn restartable_endpoint_config(secret: &[u8]) -> quinn::EndpointConfig {
    use ring::hmac;
    let root = hmac::Key::new(hmac::HMAC_SHA256, secret);
    let reset = hmac::sign(&root, b"nephele/quic/stateless-reset-key/v1");
    let cids = hmac::sign(&root, b"nephele/quic/connection-id-key/v1");
    let mut cid_key = [0u8; 8];
    cid_key.copy_from_slice(&cids.as_ref()[..8]);
    let cid_key = u64::from_le_bytes(cid_key);
    let mut config =
        quinn::EndpointConfig::new(Arc::new(hmac::Key::new(hmac::HMAC_SHA256, reset.as_ref())));
    config
        .cid_generator(move || {
            Box::new(quinn_proto::HashedConnectionIdGenerator::from_key(cid_key))
        })
        .min_reset_interval(MIN_RESET_INTERVAL);
    config
}

/// A QUIC endpoint on `socket`, driven by the tokio runtime it is made in (the caller
/// must be inside one), serving with `server` when given.
pub fn endpoint(
    socket: std::net::UdpSocket,
    server: Option<quinn::ServerConfig>,
) -> std::io::Result<quinn::Endpoint> {
    endpoint_with(quinn::EndpointConfig::default(), socket, server)
}

/// [`endpoint`] with a chosen endpoint configuration (a server's
/// [`restartable_endpoint_config`]).
pub fn endpoint_with(
    config: quinn::EndpointConfig,
    socket: std::net::UdpSocket,
    server: Option<quinn::ServerConfig>,
) -> std::io::Result<quinn::Endpoint> {
    quinn::Endpoint::new(config, server, socket, Arc::new(quinn::TokioRuntime))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A server on `addr` in a runtime of its own, holding what it accepts; dropping
    /// the runtime is a crash (nothing is sent).
    fn crashable_server(
        config: quinn::EndpointConfig,
        ca: &crate::ClusterCa,
        addr: SocketAddr,
    ) -> (tokio::runtime::Runtime, SocketAddr) {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .expect("runtime");
        let (cert, key) = ca.issue_server(&[]).expect("server cert");
        let server = crate::server_config(ca.cert_der(), &cert, &key).expect("server config");
        let socket = bind(addr, 64 * 1024).expect("bind").socket;
        let endpoint = {
            let _inside = runtime.enter();
            endpoint_with(config, socket, Some(server)).expect("endpoint")
        };
        let local = endpoint.local_addr().expect("addr");
        runtime.spawn(async move {
            let mut held = Vec::new();
            while let Some(incoming) = endpoint.accept().await {
                if let Ok(connection) = incoming.await {
                    held.push(connection);
                }
            }
        });
        (runtime, local)
    }

    #[test]
    fn a_restarted_server_resets_old_connections_only_with_the_same_secret() {
        let ca = crate::ClusterCa::generate("reset-test").expect("ca");
        let secret = ca.key_pem.as_bytes().to_vec();
        let client_runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .expect("runtime");
        let (first, addr) = crashable_server(
            restartable_endpoint_config(&secret),
            &ca,
            "127.0.0.1:0".parse().expect("addr"),
        );
        let connection = client_runtime.block_on(async {
            let mut client = crate::client_endpoint(addr).expect("client endpoint");
            client.set_default_client_config(
                crate::join_client_config(ca.fingerprint()).expect("client config"),
            );
            client
                .connect(addr, crate::SERVER_NAME)
                .expect("connect")
                .await
                .expect("connected")
        });
        let poke = |connection: &quinn::Connection, wait: Duration| {
            client_runtime.block_on(async {
                if let Ok((mut send, _recv)) = connection.open_bi().await {
                    let _ = send.write_all(b"are you there").await;
                }
                tokio::time::timeout(wait, connection.closed()).await
            })
        };
        drop(first);
        // Restarted with quinn's own keys (fresh each process): the packet is dropped
        // and the client hears nothing until its idle timeout.
        let (second, _) = crashable_server(quinn::EndpointConfig::default(), &ca, addr);
        assert!(
            poke(&connection, Duration::from_secs(2)).is_err(),
            "a server with fresh keys (or a crash that sent something) ended the connection"
        );
        drop(second);
        // Restarted with the same secret: the client's next packet is reset at once.
        let (_third, _) = crashable_server(restartable_endpoint_config(&secret), &ca, addr);
        let ended = poke(&connection, Duration::from_secs(5));
        assert!(
            matches!(ended, Ok(quinn::ConnectionError::Reset)),
            "expected a stateless reset, got {ended:?}"
        );
    }

    #[test]
    fn a_socket_gets_a_buffer_and_says_whether_it_is_the_one_asked() {
        let small = bind("127.0.0.1:0".parse().unwrap(), 64 * 1024).expect("bind");
        assert!(small.socket.local_addr().unwrap().port() > 0);
        // 64 KiB is under every kernel's cap.
        assert!(small.granted(), "{}", small.advice());
        let huge = bind("127.0.0.1:0".parse().unwrap(), 1 << 30).expect("bind");
        assert!(!huge.granted());
        assert!(
            huge.advice().contains("net.core.rmem_max"),
            "{}",
            huge.advice()
        );
    }
}
