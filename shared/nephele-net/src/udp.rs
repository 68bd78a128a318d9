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

/// A QUIC endpoint on `socket`, driven by the tokio runtime it is made in (the caller
/// must be inside one), serving with `server` when given.
pub fn endpoint(
    socket: std::net::UdpSocket,
    server: Option<quinn::ServerConfig>,
) -> std::io::Result<quinn::Endpoint> {
    quinn::Endpoint::new(
        quinn::EndpointConfig::default(),
        server,
        socket,
        Arc::new(quinn::TokioRuntime),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

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
