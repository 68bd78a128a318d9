//! A UDP relay between one agent and the control plane's QUIC port that the soak can
//! turn dark: while dark it drops every datagram both ways, as a cut link or a dead
//! access point would, so the agent's session times out and is established again
//! when the light comes back. Nothing is rewritten: QUIC and its mutual TLS run end to
//! end through it.

use std::net::{SocketAddr, UdpSocket};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use anyhow::{Context as _, Result};

pub struct Relay {
    /// Where the agent sends (its `--server`).
    pub addr: SocketAddr,
    dark: Arc<AtomicBool>,
    stop: Arc<AtomicBool>,
    dropped: Arc<AtomicU64>,
    threads: Vec<JoinHandle<()>>,
}

impl Relay {
    /// Relays between a new loopback port and `upstream` (one client: the last
    /// address that sent to it).
    pub fn start(upstream: SocketAddr) -> Result<Relay> {
        let front = UdpSocket::bind("127.0.0.1:0").context("cannot bind the relay's port")?;
        let back =
            UdpSocket::bind("127.0.0.1:0").context("cannot bind the relay's upstream port")?;
        back.connect(upstream)
            .with_context(|| format!("cannot aim the relay at {upstream}"))?;
        // Both loops look at the stop flag at least this often.
        for socket in [&front, &back] {
            socket.set_read_timeout(Some(Duration::from_millis(100)))?;
        }
        let addr = front.local_addr()?;
        let front = Arc::new(front);
        let back = Arc::new(back);
        let client: Arc<Mutex<Option<SocketAddr>>> = Arc::new(Mutex::new(None));
        let dark = Arc::new(AtomicBool::new(false));
        let stop = Arc::new(AtomicBool::new(false));
        let dropped = Arc::new(AtomicU64::new(0));
        let mut threads = Vec::new();
        {
            let (front, back, client) = (front.clone(), back.clone(), client.clone());
            let (dark, stop, dropped) = (dark.clone(), stop.clone(), dropped.clone());
            threads.push(std::thread::spawn(move || {
                let mut buf = vec![0u8; 65_536];
                while !stop.load(Ordering::Relaxed) {
                    let Ok((n, from)) = front.recv_from(&mut buf) else {
                        continue;
                    };
                    *client.lock().unwrap_or_else(|p| p.into_inner()) = Some(from);
                    if dark.load(Ordering::Relaxed) {
                        dropped.fetch_add(1, Ordering::Relaxed);
                    } else {
                        let _ = back.send(&buf[..n]);
                    }
                }
            }));
        }
        {
            let (dark, stop, dropped) = (dark.clone(), stop.clone(), dropped.clone());
            threads.push(std::thread::spawn(move || {
                let mut buf = vec![0u8; 65_536];
                while !stop.load(Ordering::Relaxed) {
                    // A refused send (nothing listening upstream) comes back as an
                    // error here too; either way there is nothing to forward.
                    let Ok(n) = back.recv(&mut buf) else {
                        continue;
                    };
                    let to = *client.lock().unwrap_or_else(|p| p.into_inner());
                    match to {
                        Some(to) if !dark.load(Ordering::Relaxed) => {
                            let _ = front.send_to(&buf[..n], to);
                        }
                        _ => {
                            dropped.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                }
            }));
        }
        Ok(Relay {
            addr,
            dark,
            stop,
            dropped,
            threads,
        })
    }

    /// Drops everything from now on (`true`) or relays again (`false`).
    pub fn set_dark(&self, dark: bool) {
        self.dark.store(dark, Ordering::Relaxed);
    }

    /// Datagrams dropped so far (while dark).
    pub fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for thread in self.threads.drain(..) {
            let _ = thread.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn datagrams_pass_both_ways_and_none_while_dark() {
        let server = UdpSocket::bind("127.0.0.1:0").unwrap();
        server
            .set_read_timeout(Some(Duration::from_millis(500)))
            .unwrap();
        let relay = Relay::start(server.local_addr().unwrap()).unwrap();
        let client = UdpSocket::bind("127.0.0.1:0").unwrap();
        client
            .set_read_timeout(Some(Duration::from_millis(500)))
            .unwrap();
        let mut buf = [0u8; 16];

        client.send_to(b"ping", relay.addr).unwrap();
        let (n, via) = server.recv_from(&mut buf).unwrap();
        assert_eq!(&buf[..n], b"ping");
        server.send_to(b"pong", via).unwrap();
        let (n, from) = client.recv_from(&mut buf).unwrap();
        assert_eq!((&buf[..n], from), (&b"pong"[..], relay.addr));

        relay.set_dark(true);
        client.send_to(b"lost", relay.addr).unwrap();
        assert!(
            server.recv_from(&mut buf).is_err(),
            "nothing passes while dark"
        );
        server.send_to(b"lost", via).unwrap();
        assert!(client.recv_from(&mut buf).is_err(), "nor the other way");
        assert_eq!(relay.dropped(), 2);

        relay.set_dark(false);
        client.send_to(b"again", relay.addr).unwrap();
        let (n, _) = server.recv_from(&mut buf).unwrap();
        assert_eq!(&buf[..n], b"again");
    }
}
