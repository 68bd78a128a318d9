//! A shaped network link in user space: a UDP relay on loopback that delays and
//! rate-limits datagrams in each direction, so that real QUIC (with its handshake,
//! congestion control and flow control) can be measured over a link of a chosen round
//! trip and bandwidth without root, kernel modules or network namespaces.
//!
//! Each direction is a FIFO bottleneck, as `tc`'s `tbf` followed by `netem delay`:
//!
//! ```text
//! departs(p)   = max(arrives(p), departs(p − 1)) + bytes(p) · 8 / rate
//! delivered(p) = departs(p) + rtt / 2
//! ```
//!
//! A datagram that would find more than `queue_bytes` waiting is dropped (drop-tail),
//! as a router's buffer would. Datagrams are never reordered. Delivery times are exact
//! to the tokio timer's resolution (1 ms): datagrams due within the same millisecond
//! leave together, so the average rate is exact and the burst is at most one
//! millisecond's worth.
//!
//! Clients connect to [`ShapedLink::local_addr`]; each client address gets its own
//! socket towards the upstream server (as a NAT would), so several connections can
//! share one link and its bottleneck.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use std::sync::mpsc as std_mpsc;
use std::time::Instant;

use tokio::net::UdpSocket;
use tokio::task::JoinHandle;

/// The shape of a link: round trip, bandwidth each way, and the bottleneck's buffer.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LinkShape {
    /// Round trip added by propagation (half each way).
    pub rtt: Duration,
    /// Bits per second in each direction.
    pub rate_bps: f64,
    /// Bytes the bottleneck buffers before it drops.
    pub queue_bytes: usize,
}

impl LinkShape {
    /// `rate_bps` each way, `rtt` round trip, and a buffer of one bandwidth-delay product
    /// but at least 64 KiB (a common router sizing rule).
    pub fn new(rtt: Duration, rate_bps: f64) -> Self {
        let bdp = (rate_bps / 8.0 * rtt.as_secs_f64()) as usize;
        Self {
            rtt,
            rate_bps,
            queue_bytes: bdp.max(64 * 1024),
        }
    }
}

/// Counters of what crossed the link.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LinkStats {
    pub datagrams: u64,
    pub bytes: u64,
    /// Datagrams dropped because the bottleneck's buffer was full.
    pub dropped: u64,
}

#[derive(Default)]
struct Counters {
    datagrams: AtomicU64,
    bytes: AtomicU64,
    dropped: AtomicU64,
}

/// One direction's bottleneck: when the datagram now being sent will have left. Pure
/// (time is an argument), so other carriers of packets reuse it: the e2e tests' TUN
/// link between network namespaces (`tests/src/netlab.rs`) shapes IP packets with it.
#[derive(Debug, Clone)]
pub struct Bottleneck {
    shape: LinkShape,
    busy_until: Instant,
}

impl Bottleneck {
    /// An idle bottleneck of `shape` at `now`.
    pub fn new(shape: LinkShape, now: Instant) -> Self {
        Self {
            shape,
            busy_until: now,
        }
    }

    /// Changes the shape from now on; what was admitted keeps its delivery time.
    pub fn set_shape(&mut self, shape: LinkShape) {
        self.shape = shape;
    }

    /// When a datagram of `bytes` arriving at `now` is delivered, or `None` when the
    /// buffer is full.
    pub fn admit(&mut self, now: Instant, bytes: usize) -> Option<Instant> {
        let backlog = self.busy_until.saturating_duration_since(now);
        let queued_bytes = backlog.as_secs_f64() * self.shape.rate_bps / 8.0;
        if queued_bytes > self.shape.queue_bytes as f64 {
            return None;
        }
        let serialise = Duration::from_secs_f64(bytes as f64 * 8.0 / self.shape.rate_bps);
        self.busy_until = self.busy_until.max(now) + serialise;
        Some(self.busy_until + self.shape.rtt / 2)
    }
}

/// A datagram admitted by a [`Bottleneck`]: when, what, from which socket, to whom.
type Due = (Instant, Vec<u8>, Arc<std::net::UdpSocket>, SocketAddr);

/// Sends what a [`Bottleneck`] admitted, each datagram at its delivery time. The sender
/// is a thread of its own that sleeps to the microsecond, not a tokio task: tokio's
/// timer rounds up to whole milliseconds, which would add up to 2 ms to every round
/// trip, as much as a fast link's whole transfer.
struct Direction {
    bottleneck: Mutex<Bottleneck>,
    queue: Mutex<Option<std_mpsc::Sender<Due>>>,
    counters: Arc<Counters>,
    /// While set, every datagram is dropped (a cut cable).
    cut: AtomicBool,
}

impl Direction {
    fn start(shape: LinkShape, counters: Arc<Counters>) -> std::io::Result<Arc<Self>> {
        let (queue, due) = std_mpsc::channel::<Due>();
        std::thread::Builder::new()
            .name("shaped-link".into())
            .spawn(move || {
                // Ends when the link is dropped (the sender side goes away).
                while let Ok((at, datagram, socket, to)) = due.recv() {
                    let wait = at.saturating_duration_since(Instant::now());
                    if !wait.is_zero() {
                        std::thread::sleep(wait);
                    }
                    send_now(&socket, &datagram, to);
                }
            })?;
        Ok(Arc::new(Self {
            bottleneck: Mutex::new(Bottleneck {
                shape,
                busy_until: Instant::now(),
            }),
            queue: Mutex::new(Some(queue)),
            counters,
            cut: AtomicBool::new(false),
        }))
    }

    fn carry(&self, datagram: Vec<u8>, socket: Arc<std::net::UdpSocket>, to: SocketAddr) {
        if self.cut.load(Ordering::Relaxed) {
            self.counters.dropped.fetch_add(1, Ordering::Relaxed);
            return;
        }
        let now = Instant::now();
        let admitted = lock(&self.bottleneck).admit(now, datagram.len());
        match admitted {
            Some(at) => {
                self.counters.datagrams.fetch_add(1, Ordering::Relaxed);
                self.counters
                    .bytes
                    .fetch_add(datagram.len() as u64, Ordering::Relaxed);
                if let Some(queue) = lock(&self.queue).as_ref() {
                    let _ = queue.send((at, datagram, socket, to));
                }
            }
            None => {
                self.counters.dropped.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    fn stop(&self) {
        lock(&self.queue).take();
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Sends on a socket that tokio also reads (so it is non-blocking): a full socket
/// buffer is waited out briefly; a datagram that still cannot go is lost, which UDP
/// allows and QUIC recovers.
fn send_now(socket: &std::net::UdpSocket, datagram: &[u8], to: SocketAddr) {
    for _ in 0..100 {
        match socket.send_to(datagram, to) {
            Err(error) if error.kind() == std::io::ErrorKind::WouldBlock => {
                std::thread::sleep(Duration::from_micros(50));
            }
            _ => return,
        }
    }
}

fn check_rate(rate_bps: f64) -> std::io::Result<()> {
    if rate_bps.is_finite() && rate_bps > 0.0 {
        return Ok(());
    }
    Err(std::io::Error::new(
        std::io::ErrorKind::InvalidInput,
        format!("link rate must be a positive number of bits per second, got {rate_bps}"),
    ))
}

/// A UDP socket on `bind` for tokio to read and a clone for a sender thread to write.
fn socket_pair(bind: SocketAddr) -> std::io::Result<(UdpSocket, Arc<std::net::UdpSocket>)> {
    let socket = std::net::UdpSocket::bind(bind)?;
    socket.set_nonblocking(true)?;
    let writer = Arc::new(socket.try_clone()?);
    Ok((UdpSocket::from_std(socket)?, writer))
}

/// A running shaped link; dropping it stops the relay.
pub struct ShapedLink {
    local: SocketAddr,
    shape: Mutex<LinkShape>,
    counters: Arc<Counters>,
    tasks: Arc<Mutex<Vec<JoinHandle<()>>>>,
    /// Up and down; stopping them ends their sender threads.
    directions: [Arc<Direction>; 2],
}

impl std::fmt::Debug for ShapedLink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ShapedLink")
            .field("local", &self.local)
            .field("shape", &*lock(&self.shape))
            .finish()
    }
}

/// Largest datagram relayed (QUIC's are at most 1,500 bytes on a normal path).
const MAX_DATAGRAM: usize = 65_535;

impl ShapedLink {
    /// Listens on an ephemeral loopback port and relays to `upstream` through a link of
    /// `shape`. Must be called inside a tokio runtime.
    pub async fn start(upstream: SocketAddr, shape: LinkShape) -> std::io::Result<Self> {
        check_rate(shape.rate_bps)?;
        let bind: SocketAddr = if upstream.is_ipv6() {
            (std::net::Ipv6Addr::LOCALHOST, 0).into()
        } else {
            (std::net::Ipv4Addr::LOCALHOST, 0).into()
        };
        let (front, front_writer) = socket_pair(bind)?;
        let front = Arc::new(front);
        let local = front.local_addr()?;
        let counters = Arc::new(Counters::default());
        let up = Direction::start(shape, counters.clone())?;
        let down = Direction::start(shape, counters.clone())?;
        let directions = [up.clone(), down.clone()];
        let tasks = Arc::new(Mutex::new(Vec::new()));
        let relay_tasks = tasks.clone();
        let relay = tokio::spawn(async move {
            // Client address → its socket towards the upstream (the writing half).
            let mut clients: HashMap<SocketAddr, Arc<std::net::UdpSocket>> = HashMap::new();
            let mut buffer = vec![0u8; MAX_DATAGRAM];
            loop {
                let Ok((len, client)) = front.recv_from(&mut buffer).await else {
                    // ICMP errors surface here on some systems; the link stays up.
                    continue;
                };
                let back = match clients.get(&client) {
                    Some(socket) => socket.clone(),
                    None => {
                        let Ok((reader, writer)) = socket_pair(bind) else {
                            continue;
                        };
                        clients.insert(client, writer.clone());
                        // The upstream's answers to this client come back down the link.
                        let (front_writer, down) = (front_writer.clone(), down.clone());
                        let task = tokio::spawn(async move {
                            let mut buffer = vec![0u8; MAX_DATAGRAM];
                            while let Ok((len, from)) = reader.recv_from(&mut buffer).await {
                                if from == upstream {
                                    down.carry(
                                        buffer[..len].to_vec(),
                                        front_writer.clone(),
                                        client,
                                    );
                                }
                            }
                        });
                        lock(&relay_tasks).push(task);
                        writer
                    }
                };
                up.carry(buffer[..len].to_vec(), back, upstream);
            }
        });
        lock(&tasks).push(relay);
        Ok(Self {
            local,
            shape: Mutex::new(shape),
            counters,
            tasks,
            directions,
        })
    }

    /// Where clients send to reach the upstream through the link.
    pub fn local_addr(&self) -> SocketAddr {
        self.local
    }

    pub fn shape(&self) -> LinkShape {
        *lock(&self.shape)
    }

    /// Changes the link's round trip, rate and buffer from now on (a link that slows
    /// down or recovers). Datagrams already admitted keep their delivery times, and
    /// none overtakes another. A rate that is not positive is refused.
    pub fn set_shape(&self, shape: LinkShape) -> std::io::Result<()> {
        check_rate(shape.rate_bps)?;
        for direction in &self.directions {
            lock(&direction.bottleneck).shape = shape;
        }
        *lock(&self.shape) = shape;
        Ok(())
    }

    /// Cuts the link (every datagram either way is dropped, counted in
    /// [`LinkStats::dropped`]) or mends it. Datagrams admitted before the cut are still
    /// delivered.
    pub fn set_cut(&self, cut: bool) {
        for direction in &self.directions {
            direction.cut.store(cut, Ordering::Relaxed);
        }
    }

    pub fn stats(&self) -> LinkStats {
        LinkStats {
            datagrams: self.counters.datagrams.load(Ordering::Relaxed),
            bytes: self.counters.bytes.load(Ordering::Relaxed),
            dropped: self.counters.dropped.load(Ordering::Relaxed),
        }
    }
}

impl Drop for ShapedLink {
    fn drop(&mut self) {
        for task in lock(&self.tasks).drain(..) {
            task.abort();
        }
        for direction in &self.directions {
            direction.stop();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_bottleneck_serialises_at_the_rate_and_adds_half_the_round_trip() {
        let shape = LinkShape {
            rtt: Duration::from_millis(10),
            rate_bps: 8e6, // 1 byte per µs
            queue_bytes: 10_000,
        };
        let now = Instant::now();
        let mut link = Bottleneck {
            shape,
            busy_until: now,
        };
        // Back to back: each 1,000-byte datagram leaves 1 ms after the previous one.
        let first = link.admit(now, 1_000).unwrap();
        let second = link.admit(now, 1_000).unwrap();
        assert_eq!(
            first - now,
            Duration::from_millis(1) + Duration::from_millis(5)
        );
        assert_eq!(second - first, Duration::from_millis(1));
        // An idle link starts afresh.
        let later = now + Duration::from_secs(1);
        assert_eq!(
            link.admit(later, 1_000).unwrap() - later,
            Duration::from_millis(6)
        );
    }

    #[test]
    fn a_full_buffer_drops_and_then_recovers() {
        let shape = LinkShape {
            rtt: Duration::ZERO,
            rate_bps: 8e6,
            queue_bytes: 3_000,
        };
        let now = Instant::now();
        let mut link = Bottleneck {
            shape,
            busy_until: now,
        };
        let admitted = (0..10).filter(|_| link.admit(now, 1_000).is_some()).count();
        // 1,000 in service plus 3,000 waiting; the fifth finds more than the buffer.
        assert_eq!(admitted, 4);
        assert!(link.admit(now + Duration::from_millis(4), 1_000).is_some());
    }

    #[test]
    fn the_buffer_holds_one_bandwidth_delay_product_or_64_kib() {
        assert_eq!(
            LinkShape::new(Duration::from_millis(10), 100e6).queue_bytes,
            125_000
        );
        assert_eq!(
            LinkShape::new(Duration::from_millis(10), 1e6).queue_bytes,
            64 * 1024
        );
    }

    #[tokio::test]
    async fn datagrams_cross_in_both_directions_with_the_delay() {
        let server = UdpSocket::bind("127.0.0.1:0").await.unwrap();
        let upstream = server.local_addr().unwrap();
        let link = ShapedLink::start(upstream, LinkShape::new(Duration::from_millis(40), 8e6))
            .await
            .unwrap();
        let client = UdpSocket::bind("127.0.0.1:0").await.unwrap();
        let started = std::time::Instant::now();
        client.send_to(b"ping", link.local_addr()).await.unwrap();
        let mut buffer = [0u8; 16];
        let (len, from) = server.recv_from(&mut buffer).await.unwrap();
        assert_eq!(&buffer[..len], b"ping");
        server.send_to(b"pong", from).await.unwrap();
        let (len, _) = client.recv_from(&mut buffer).await.unwrap();
        assert_eq!(&buffer[..len], b"pong");
        // Half the round trip each way; the timer may round up, never down.
        assert!(started.elapsed() >= Duration::from_millis(40));
        let stats = link.stats();
        assert_eq!((stats.datagrams, stats.bytes, stats.dropped), (2, 8, 0));
    }

    #[tokio::test]
    async fn a_rate_that_is_not_positive_is_refused() {
        let error = ShapedLink::start(
            "127.0.0.1:9".parse().unwrap(),
            LinkShape::new(Duration::ZERO, 0.0),
        )
        .await
        .unwrap_err();
        assert!(error.to_string().contains("positive"), "{error}");
    }

    /// Time for one datagram from `client` through `link` to `server`.
    async fn one_way(link: &ShapedLink, client: &UdpSocket, server: &UdpSocket) -> Duration {
        let started = std::time::Instant::now();
        client.send_to(b"ping", link.local_addr()).await.unwrap();
        let mut buffer = [0u8; 16];
        server.recv_from(&mut buffer).await.unwrap();
        started.elapsed()
    }

    #[tokio::test]
    async fn a_link_can_slow_down_and_recover() {
        let server = UdpSocket::bind("127.0.0.1:0").await.unwrap();
        let upstream = server.local_addr().unwrap();
        let link = ShapedLink::start(upstream, LinkShape::new(Duration::from_millis(200), 8e6))
            .await
            .unwrap();
        let client = UdpSocket::bind("127.0.0.1:0").await.unwrap();
        assert!(one_way(&link, &client, &server).await >= Duration::from_millis(100));
        link.set_shape(LinkShape::new(Duration::ZERO, 8e6)).unwrap();
        assert_eq!(link.shape().rtt, Duration::ZERO);
        // Nothing is queued now, so the next datagram crosses at once (well under the
        // 100 ms it took before, whatever the machine's load).
        assert!(one_way(&link, &client, &server).await < Duration::from_millis(100));
        assert!(link
            .set_shape(LinkShape::new(Duration::ZERO, f64::NAN))
            .is_err());
    }

    #[tokio::test]
    async fn a_cut_link_drops_everything_until_it_is_mended() {
        let server = UdpSocket::bind("127.0.0.1:0").await.unwrap();
        let link = ShapedLink::start(
            server.local_addr().unwrap(),
            LinkShape::new(Duration::ZERO, 8e6),
        )
        .await
        .unwrap();
        let client = UdpSocket::bind("127.0.0.1:0").await.unwrap();
        one_way(&link, &client, &server).await;
        link.set_cut(true);
        client.send_to(b"lost", link.local_addr()).await.unwrap();
        let mut buffer = [0u8; 16];
        let heard =
            tokio::time::timeout(Duration::from_millis(200), server.recv_from(&mut buffer)).await;
        assert!(heard.is_err(), "a datagram crossed a cut link");
        assert_eq!(link.stats().dropped, 1);
        link.set_cut(false);
        one_way(&link, &client, &server).await;
        assert_eq!(link.stats().datagrams, 2);
    }
}
