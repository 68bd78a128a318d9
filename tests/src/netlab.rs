//! Two hosts on one machine, with a network between them that a test can impair: the
//! agent runs in a Linux network namespace of its own, the control plane and the test
//! stay in the test's namespace, and every packet between them crosses a user-space
//! link emulator that delays, jitters, loses, rate-limits or cuts it.
//!
//! ```text
//!   test's namespace                                 namespace `nph<pid>e<n>`
//!   control plane  10.201.K.1 ─ tun ⇄ emulator ⇄ tun ─ 10.201.K.2 (→ .3)  agent's QUIC
//!   test (HTTP)    10.202.K.1 ──────── veth ──────── 10.202.K.2  agent's local endpoint
//! ```
//!
//! The emulated link is two TUN devices, one in each namespace, whose IP packets the
//! test process reads and writes; in between, each direction is a
//! [`nephele_net::link::Bottleneck`] (rate and queue, as `tbf`) plus a delay, jitter
//! that never reorders, and random loss. This machine's kernel has no `sch_netem`
//! (`tc qdisc … netem` answers "Specified qdisc kind is unknown"), which is why the
//! impairment is the project's own and not the kernel's. A partition drops everything
//! both ways until healed. The veth pair is only the test's management path (it asks
//! the agent how it is doing during a partition): the agent dials the control plane's
//! address on the emulated link, so no control traffic takes it.
//!
//! Needs root (CAP_NET_ADMIN), `/dev/net/tun` and iproute2's `ip`, which `tests/run.sh`
//! installs when missing. [`Lab::start`] says which is absent; under CI that fails the
//! test, elsewhere the test is skipped with that reason.

// The workspace forbids unsafe code; this module needs two system calls that std does
// not wrap: TUNSETIFF, which attaches a file to a TUN device, and poll, so that the
// emulator's threads can stop. Each is one call on a descriptor this module owns.
#![allow(unsafe_code)]

use std::collections::BTreeSet;
use std::fs::File;
use std::io::{Read as _, Write as _};
use std::net::Ipv4Addr;
use std::os::fd::AsRawFd as _;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _, Result};
use nephele_net::link::{Bottleneck, LinkShape};

/// How the link treats packets, the same each way.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Impairment {
    /// Added to every packet, one way (half the round trip it adds).
    pub delay: Duration,
    /// Each packet's delay varies uniformly by up to this much either side; packets are
    /// never reordered (a later one waits for an earlier one), as netem's jitter with a
    /// rate limit behaves.
    pub jitter: Duration,
    /// Probability that a packet is lost, each way, independently.
    pub loss: f64,
    /// Bits per second each way.
    pub rate_bps: f64,
}

impl Impairment {
    /// A clean link: no delay, no loss, 10 Gbit/s.
    pub const CLEAN: Impairment = Impairment {
        delay: Duration::ZERO,
        jitter: Duration::ZERO,
        loss: 0.0,
        rate_bps: 10e9,
    };

    fn shape(&self) -> LinkShape {
        LinkShape::new(self.delay * 2, self.rate_bps)
    }
}

/// What crossed the link, both directions together.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LabStats {
    pub packets: u64,
    /// Bytes of the packets carried (IP headers included).
    pub bytes: u64,
    /// Lost at random ([`Impairment::loss`]).
    pub lost: u64,
    /// Dropped because the link was cut.
    pub cut: u64,
    /// Dropped because the bottleneck's buffer was full.
    pub overflowed: u64,
}

#[derive(Default)]
struct Counters {
    packets: AtomicU64,
    bytes: AtomicU64,
    lost: AtomicU64,
    cut: AtomicU64,
    overflowed: AtomicU64,
}

/// State the emulator's threads share with the test.
struct Control {
    impairment: Mutex<Impairment>,
    partitioned: AtomicBool,
    stop: AtomicBool,
    counters: Counters,
    /// Source addresses of the packets that came from the agent's side.
    edge_sources: Mutex<BTreeSet<Ipv4Addr>>,
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// A network namespace holding the agent, joined to the test's by an emulated link.
pub struct Lab {
    /// The agent's namespace, for `ip netns exec`.
    pub netns: String,
    /// The control plane's address on the emulated link (listen on it).
    pub cloud_ip: Ipv4Addr,
    /// The agent's address on the emulated link now.
    pub edge_ip: Ipv4Addr,
    /// The agent's address on the management path (its local endpoint listens here).
    pub edge_management_ip: Ipv4Addr,
    edge_tun: String,
    control: Arc<Control>,
    threads: Vec<JoinHandle<()>>,
}

/// iproute2's `ip`: from PATH, or where Debian puts it (PATH may lack /usr/sbin).
fn ip_program() -> &'static str {
    ["/usr/sbin/ip", "/sbin/ip", "/usr/bin/ip", "/bin/ip"]
        .into_iter()
        .find(|path| std::path::Path::new(path).exists())
        .unwrap_or("ip")
}

/// Runs `ip` with `args`; its error output on failure.
fn ip(args: &[&str]) -> Result<()> {
    let output = Command::new(ip_program())
        .args(args)
        .stdin(Stdio::null())
        .output()
        .with_context(|| format!("run ip {}", args.join(" ")))?;
    if !output.status.success() {
        bail!(
            "ip {} failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&output.stderr).trim()
        );
    }
    Ok(())
}

/// Why this machine cannot host a lab, if it cannot.
fn missing_prerequisite() -> Option<String> {
    let root = std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("Uid:"))
                .and_then(|l| l.split_whitespace().nth(2).map(|uid| uid == "0"))
        })
        .unwrap_or(false);
    if !root {
        return Some("root (to make network namespaces and TUN devices)".into());
    }
    if !std::path::Path::new("/dev/net/tun").exists() {
        return Some("/dev/net/tun".into());
    }
    let ip_runs = Command::new(ip_program())
        .arg("-V")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !ip_runs {
        return Some("iproute2's `ip`".into());
    }
    None
}

/// Deletes namespaces left by test processes that died before tidying up.
fn remove_stale_namespaces() {
    let Ok(output) = Command::new(ip_program()).args(["netns", "list"]).output() else {
        return;
    };
    for line in String::from_utf8_lossy(&output.stdout).lines() {
        let Some(name) = line.split_whitespace().next() else {
            continue;
        };
        let Some(pid) = name
            .strip_prefix("nph")
            .and_then(|rest| rest.split_once('e'))
            .and_then(|(pid, _)| pid.parse::<i32>().ok())
        else {
            continue;
        };
        if !crate::alive(pid) {
            let _ = ip(&["netns", "del", name]);
        }
    }
}

const TUNSETIFF: libc::c_ulong = 0x4004_54ca;
const IFF_TUN: libc::c_short = 0x0001;
const IFF_NO_PI: libc::c_short = 0x1000;

/// Creates TUN device `name` (in this process's namespace) and returns the file that
/// carries its packets; the device goes away when the file is closed.
fn open_tun(name: &str) -> Result<File> {
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/net/tun")
        .context("open /dev/net/tun")?;
    // struct ifreq: the name (16 bytes, NUL-terminated), then the flags (a short).
    let mut request = [0u8; 40];
    if name.len() >= 16 {
        bail!("interface name {name} is longer than 15 bytes");
    }
    request[..name.len()].copy_from_slice(name.as_bytes());
    request[16..18].copy_from_slice(&(IFF_TUN | IFF_NO_PI).to_ne_bytes());
    // SAFETY: `file` is an open /dev/net/tun descriptor and `request` is a 40-byte
    // buffer laid out as the `struct ifreq` TUNSETIFF reads and writes.
    let status = unsafe { libc::ioctl(file.as_raw_fd(), TUNSETIFF, request.as_mut_ptr()) };
    if status < 0 {
        return Err(std::io::Error::last_os_error()).context(format!("TUNSETIFF {name}"));
    }
    Ok(file)
}

/// Waits up to `timeout` for `file` to be readable.
fn readable(file: &File, timeout: Duration) -> bool {
    let mut poll = libc::pollfd {
        fd: file.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    let millis = timeout.as_millis().min(i32::MAX as u128) as libc::c_int;
    // SAFETY: one valid pollfd for a descriptor `file` keeps open during the call.
    let ready = unsafe { libc::poll(&mut poll, 1, millis) };
    ready > 0 && poll.revents & libc::POLLIN != 0
}

/// A small deterministic generator for loss and jitter (xorshift64*).
struct Dice(u64);

impl Dice {
    fn unit(&mut self) -> f64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        (self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// Carries packets read from `from` to `to`, impaired; `from_edge` when `from` is the
/// agent's side (whose source addresses are recorded).
fn carry(from: File, mut to: File, control: Arc<Control>, from_edge: bool) -> Vec<JoinHandle<()>> {
    let (due_tx, due_rx) = mpsc::channel::<(Instant, Vec<u8>)>();
    let sender = std::thread::Builder::new()
        .name("netlab-send".into())
        .spawn(move || {
            while let Ok((at, packet)) = due_rx.recv() {
                let wait = at.saturating_duration_since(Instant::now());
                if !wait.is_zero() {
                    std::thread::sleep(wait);
                }
                // A packet the kernel refuses is lost, as on a real link.
                let _ = to.write(&packet);
            }
        })
        .expect("spawn the link's sender");
    let reader = std::thread::Builder::new()
        .name("netlab-read".into())
        .spawn(move || {
            let mut from = from;
            let mut dice = Dice(if from_edge { 0x9e37_79b9 } else { 0x7f4a_7c15 });
            let mut bottleneck = Bottleneck::new(lock(&control.impairment).shape(), Instant::now());
            let mut last_due = Instant::now();
            let mut buffer = vec![0u8; 65_536];
            while !control.stop.load(Ordering::Relaxed) {
                if !readable(&from, Duration::from_millis(50)) {
                    continue;
                }
                let Ok(len) = from.read(&mut buffer) else {
                    continue;
                };
                let packet = buffer[..len].to_vec();
                if from_edge && len >= 20 && packet[0] >> 4 == 4 {
                    let source = Ipv4Addr::new(packet[12], packet[13], packet[14], packet[15]);
                    lock(&control.edge_sources).insert(source);
                }
                let counters = &control.counters;
                if control.partitioned.load(Ordering::Relaxed) {
                    counters.cut.fetch_add(1, Ordering::Relaxed);
                    continue;
                }
                let impairment = *lock(&control.impairment);
                if dice.unit() < impairment.loss {
                    counters.lost.fetch_add(1, Ordering::Relaxed);
                    continue;
                }
                bottleneck.set_shape(impairment.shape());
                let now = Instant::now();
                let Some(due) = bottleneck.admit(now, len) else {
                    counters.overflowed.fetch_add(1, Ordering::Relaxed);
                    continue;
                };
                let spread = impairment.jitter.as_secs_f64() * (2.0 * dice.unit() - 1.0);
                let due = if spread >= 0.0 {
                    due + Duration::from_secs_f64(spread)
                } else {
                    due.checked_sub(Duration::from_secs_f64(-spread))
                        .unwrap_or(due)
                        .max(now)
                };
                last_due = last_due.max(due);
                counters.packets.fetch_add(1, Ordering::Relaxed);
                counters.bytes.fetch_add(len as u64, Ordering::Relaxed);
                if due_tx.send((last_due, packet)).is_err() {
                    break;
                }
            }
        })
        .expect("spawn the link's reader");
    vec![reader, sender]
}

/// Distinguishes the labs of one test process.
static LABS: AtomicU32 = AtomicU32::new(0);

impl Lab {
    /// A namespace for an agent, joined by a clean link; `None` when this machine cannot
    /// host one and the test may be skipped (outside CI; under CI this fails).
    pub fn start() -> Result<Option<Lab>> {
        if let Some(missing) = missing_prerequisite() {
            crate::require(
                &format!("{missing}, for the network-namespace tests"),
                false,
            );
            return Ok(None);
        }
        remove_stale_namespaces();
        let pid = std::process::id();
        let n = LABS.fetch_add(1, Ordering::Relaxed);
        // A /24 per lab: distinct within this process, and across processes unless two
        // that share pid % 40 run at once (cargo runs test binaries one at a time).
        let subnet = ((pid % 40) * 6 + n % 6 + 1) as u8;
        let netns = format!("nph{pid}e{n}");
        let (cloud_tun, edge_tun) = (format!("nph{pid}t{n}"), format!("nph{pid}u{n}"));
        let (cloud_veth, edge_veth) = (format!("nph{pid}v{n}"), format!("nph{pid}w{n}"));
        let cloud_ip = Ipv4Addr::new(10, 201, subnet, 1);
        let edge_ip = Ipv4Addr::new(10, 201, subnet, 2);
        let cloud_management_ip = Ipv4Addr::new(10, 202, subnet, 1);
        let edge_management_ip = Ipv4Addr::new(10, 202, subnet, 2);
        ip(&["netns", "add", &netns])?;
        let control = Arc::new(Control {
            impairment: Mutex::new(Impairment::CLEAN),
            partitioned: AtomicBool::new(false),
            stop: AtomicBool::new(false),
            counters: Counters::default(),
            edge_sources: Mutex::new(BTreeSet::new()),
        });
        // From here on, dropping `lab` tidies up whatever was made.
        let mut lab = Lab {
            netns: netns.clone(),
            cloud_ip,
            edge_ip,
            edge_management_ip,
            edge_tun: edge_tun.clone(),
            control: control.clone(),
            threads: Vec::new(),
        };
        let cloud_side = open_tun(&cloud_tun)?;
        let edge_side = open_tun(&edge_tun)?;
        ip(&["link", "set", &edge_tun, "netns", &netns])?;
        let cloud_cidr = format!("{cloud_ip}/24");
        let edge_cidr = format!("{edge_ip}/24");
        ip(&["addr", "add", &cloud_cidr, "dev", &cloud_tun])?;
        ip(&["link", "set", &cloud_tun, "up"])?;
        for args in [
            vec!["link", "set", "lo", "up"],
            vec!["addr", "add", edge_cidr.as_str(), "dev", edge_tun.as_str()],
            vec!["link", "set", edge_tun.as_str(), "up"],
        ] {
            let mut full = vec!["-n", netns.as_str()];
            full.extend(args);
            ip(&full)?;
        }
        // So that removing the agent's first address keeps the one added after it.
        for scope in ["all", edge_tun.as_str()] {
            let path = format!("/proc/sys/net/ipv4/conf/{scope}/promote_secondaries");
            let status = Command::new("ip")
                .args([
                    "netns",
                    "exec",
                    &netns,
                    "sh",
                    "-c",
                    &format!("echo 1 > {path}"),
                ])
                .status()?;
            if !status.success() {
                bail!("could not set {path} in {netns}");
            }
        }
        ip(&[
            "link",
            "add",
            &cloud_veth,
            "type",
            "veth",
            "peer",
            "name",
            &edge_veth,
            "netns",
            &netns,
        ])?;
        ip(&[
            "addr",
            "add",
            &format!("{cloud_management_ip}/24"),
            "dev",
            &cloud_veth,
        ])?;
        ip(&["link", "set", &cloud_veth, "up"])?;
        ip(&[
            "-n",
            &netns,
            "addr",
            "add",
            &format!("{edge_management_ip}/24"),
            "dev",
            &edge_veth,
        ])?;
        ip(&["-n", &netns, "link", "set", &edge_veth, "up"])?;
        let up = carry(
            edge_side.try_clone()?,
            cloud_side.try_clone()?,
            control.clone(),
            true,
        );
        let down = carry(cloud_side, edge_side, control, false);
        lab.threads.extend(up);
        lab.threads.extend(down);
        Ok(Some(lab))
    }

    /// The prefix that runs a command in the agent's namespace.
    pub fn exec_prefix(&self) -> Vec<String> {
        [ip_program(), "netns", "exec", &self.netns]
            .iter()
            .map(|s| s.to_string())
            .collect()
    }

    /// Impairs the link from now on (packets already in flight keep their times).
    pub fn impair(&self, impairment: Impairment) {
        *lock(&self.control.impairment) = impairment;
    }

    /// Cuts the link both ways: nothing crosses until [`Lab::heal`].
    pub fn partition(&self) {
        self.control.partitioned.store(true, Ordering::Relaxed);
    }

    pub fn heal(&self) {
        self.control.partitioned.store(false, Ordering::Relaxed);
    }

    pub fn stats(&self) -> LabStats {
        let c = &self.control.counters;
        LabStats {
            packets: c.packets.load(Ordering::Relaxed),
            bytes: c.bytes.load(Ordering::Relaxed),
            lost: c.lost.load(Ordering::Relaxed),
            cut: c.cut.load(Ordering::Relaxed),
            overflowed: c.overflowed.load(Ordering::Relaxed),
        }
    }

    /// The source addresses seen on packets from the agent's side.
    pub fn edge_sources(&self) -> Vec<Ipv4Addr> {
        lock(&self.control.edge_sources).iter().copied().collect()
    }

    /// Moves the agent to a new address on the link (as a device given a new lease by
    /// DHCP, or moving between networks): the new one is added, the old one removed.
    /// Sockets bound to the unspecified address send from the new one from then on.
    pub fn change_edge_address(&mut self) -> Result<Ipv4Addr> {
        let [a, b, c, d] = self.edge_ip.octets();
        let next = Ipv4Addr::new(a, b, c, if d >= 250 { 2 } else { d + 1 });
        let (new_cidr, old_cidr) = (format!("{next}/24"), format!("{}/24", self.edge_ip));
        ip(&[
            "-n",
            &self.netns,
            "addr",
            "add",
            &new_cidr,
            "dev",
            &self.edge_tun,
        ])?;
        ip(&[
            "-n",
            &self.netns,
            "addr",
            "del",
            &old_cidr,
            "dev",
            &self.edge_tun,
        ])?;
        self.edge_ip = next;
        Ok(next)
    }
}

impl Drop for Lab {
    fn drop(&mut self) {
        self.control.stop.store(true, Ordering::Relaxed);
        for thread in self.threads.drain(..) {
            let _ = thread.join();
        }
        // The TUN files are closed with the threads; deleting the namespace removes the
        // veth pair too.
        let _ = ip(&["netns", "del", &self.netns]);
    }
}
