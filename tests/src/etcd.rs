//! An etcd cluster on loopback for the tests of the etcd-backed store: real `etcd`
//! processes (Debian's `etcd-server`, which `tests/run.sh` installs), each with its own
//! data dir and ports, that a test can kill with SIGKILL and start again.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _, Result};

struct Member {
    name: String,
    client_url: String,
    peer_url: String,
    child: Option<Child>,
}

/// A running cluster; dropping it kills its members and removes their data.
pub struct EtcdCluster {
    dir: PathBuf,
    initial_cluster: String,
    token: String,
    members: Vec<Member>,
}

/// A free TCP port on loopback below the kernel's ephemeral range (free when asked;
/// etcd binds it a moment later, and again when a killed member restarts). A port from
/// the ephemeral range, where `bind(0)` finds one, can be taken in between as the local
/// end of any outgoing connection (a health check, another test's client): a clean
/// clone's CI run once failed so ("bind: address already in use", 2026-12-07). Below
/// the range only another listener can take it, and the ports handed out here are never
/// handed out twice.
fn free_port() -> Result<u16> {
    use std::collections::BTreeSet;
    use std::hash::BuildHasher as _;
    use std::sync::Mutex;
    static GIVEN: Mutex<BTreeSet<u16>> = Mutex::new(BTreeSet::new());
    const LOWEST: u16 = 10_000;
    let ephemeral_low = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|text| text.split_whitespace().next()?.parse::<u16>().ok())
        .unwrap_or(32_768);
    let span = ephemeral_low.saturating_sub(LOWEST);
    if span < 1_000 {
        // No room below the range on this machine: the kernel's choice, as before.
        return Ok(std::net::TcpListener::bind("127.0.0.1:0")?
            .local_addr()?
            .port());
    }
    let random = std::collections::hash_map::RandomState::new();
    let mut given = GIVEN.lock().unwrap_or_else(|e| e.into_inner());
    for attempt in 0..1_000u32 {
        let port = LOWEST + (random.hash_one(attempt) % u64::from(span)) as u16;
        if !given.contains(&port) && std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
            given.insert(port);
            return Ok(port);
        }
    }
    bail!("no free port on loopback between {LOWEST} and {ephemeral_low}")
}

/// The etcd binary, if installed.
fn etcd_binary() -> Option<PathBuf> {
    ["/usr/bin/etcd", "/usr/local/bin/etcd"]
        .into_iter()
        .map(PathBuf::from)
        .find(|path| path.exists())
}

impl EtcdCluster {
    /// `size` members, healthy; `None` when etcd is not installed and the test may be
    /// skipped (outside CI; under CI this fails).
    pub fn start(label: &str, size: usize) -> Result<Option<EtcdCluster>> {
        if etcd_binary().is_none() {
            crate::require(
                "etcd (Debian's etcd-server), for the etcd store tests",
                false,
            );
            return Ok(None);
        }
        let dir = crate::temp_dir(&format!("etcd-{label}"));
        let mut members = Vec::new();
        for n in 0..size {
            members.push(Member {
                name: format!("m{n}"),
                client_url: format!("http://127.0.0.1:{}", free_port()?),
                peer_url: format!("http://127.0.0.1:{}", free_port()?),
                child: None,
            });
        }
        let initial_cluster = members
            .iter()
            .map(|m| format!("{}={}", m.name, m.peer_url))
            .collect::<Vec<_>>()
            .join(",");
        let mut cluster = EtcdCluster {
            token: dir
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default(),
            dir,
            initial_cluster,
            members,
        };
        for n in 0..size {
            cluster.spawn(n)?;
        }
        for n in 0..size {
            cluster.wait_healthy(n)?;
        }
        Ok(Some(cluster))
    }

    /// Client URLs of every member, for `nephele-cloud --etcd`.
    pub fn endpoints(&self) -> Vec<String> {
        self.members.iter().map(|m| m.client_url.clone()).collect()
    }

    fn spawn(&mut self, n: usize) -> Result<()> {
        let binary = etcd_binary().context("etcd is not installed")?;
        let member = &self.members[n];
        let data = self.dir.join(&member.name);
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join(format!("{}.log", member.name)))?;
        let child = Command::new(binary)
            .args(["--name", &member.name])
            .arg("--data-dir")
            .arg(&data)
            .args(["--listen-client-urls", &member.client_url])
            .args(["--advertise-client-urls", &member.client_url])
            .args(["--listen-peer-urls", &member.peer_url])
            .args(["--initial-advertise-peer-urls", &member.peer_url])
            .args(["--initial-cluster", &self.initial_cluster])
            .args(["--initial-cluster-state", "new"])
            .args(["--initial-cluster-token", &self.token])
            // A region's books are written in one transaction (see the README).
            .args(["--max-txn-ops", "4096"])
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .context("start etcd")?;
        self.members[n].child = Some(child);
        Ok(())
    }

    /// Waits until member `n` says it is healthy (it has a leader).
    pub fn wait_healthy(&self, n: usize) -> Result<()> {
        let url = format!("{}/health", self.members[n].client_url);
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let healthy = ureq::get(&url)
                .call()
                .ok()
                .and_then(|mut r| r.body_mut().read_to_string().ok())
                .is_some_and(|body| body.contains("\"health\":\"true\""));
            if healthy {
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!(
                    "etcd member {n} not healthy within 60 s; its log:\n{}",
                    std::fs::read_to_string(self.dir.join(format!("{}.log", self.members[n].name)))
                        .unwrap_or_default()
                );
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// SIGKILLs member `n`, as a machine lost would be.
    pub fn kill(&mut self, n: usize) {
        if let Some(mut child) = self.members[n].child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts member `n` again on its data dir.
    pub fn restart(&mut self, n: usize) -> Result<()> {
        self.kill(n);
        self.spawn(n)
    }
}

impl Drop for EtcdCluster {
    fn drop(&mut self) {
        for n in 0..self.members.len() {
            self.kill(n);
        }
        if std::thread::panicking() {
            eprintln!("etcd data and logs kept in {}", self.dir.display());
        } else {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}
