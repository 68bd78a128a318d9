//! Harness for end-to-end tests: starts the real `nephele-cloud` and `nephele-edge`
//! binaries (built from this workspace, same profile as the tests) on loopback with
//! port 0, waits for their ready files, and kills them on drop.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _, Result};
use serde_json::Value;

pub mod browser;
pub mod etcd;
pub mod model_versions;
pub mod netlab;

pub const MODEL_ONNX: &[u8] = include_bytes!("../../shared/models/digits-mlp/model.onnx");

/// The cluster CAs of the control planes this test process started (PEM): every
/// [`Http`] client trusts them, as an operator's CLI trusts its cluster's CA. The API is
/// HTTPS, its certificate issued by that CA.
static TRUSTED_CAS: std::sync::Mutex<Vec<Vec<u8>>> = std::sync::Mutex::new(Vec::new());

/// Trusts the CA in `pem_file` from now on (clients made after this call).
pub fn trust_ca(pem_file: &Path) -> Result<()> {
    let pem = std::fs::read(pem_file).with_context(|| format!("read {}", pem_file.display()))?;
    let mut cas = TRUSTED_CAS.lock().unwrap_or_else(|e| e.into_inner());
    if !cas.contains(&pem) {
        cas.push(pem);
    }
    Ok(())
}

fn trusted_certificates() -> Vec<Vec<u8>> {
    TRUSTED_CAS
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .iter()
        .flat_map(|pem| {
            ureq::tls::parse_pem(pem)
                .filter_map(|item| match item {
                    Ok(ureq::tls::PemItem::Certificate(cert)) => Some(cert.der().to_vec()),
                    _ => None,
                })
                .collect::<Vec<_>>()
        })
        .collect()
}

/// The TLS settings of the tests' clients: the trusted cluster CAs (for a test's own
/// `ureq` agent: `.tls_config(tls_config())`).
pub fn tls_config() -> ureq::tls::TlsConfig {
    let ders = trusted_certificates();
    let certs: Vec<ureq::tls::Certificate<'static>> = ders
        .iter()
        .map(|der| ureq::tls::Certificate::from_der(der).to_owned())
        .collect();
    ureq::tls::TlsConfig::builder()
        .root_certs(ureq::tls::RootCerts::new_with_certs(&certs))
        .build()
}

/// A byte stream to an API (TLS for `https://`, else plain TCP) for tests that write
/// raw HTTP, with `timeout` on reads.
pub fn raw_connection(api: &str, timeout: Duration) -> Result<RawConnection> {
    let (tls, addr) = match api.strip_prefix("https://") {
        Some(addr) => (true, addr),
        None => (false, api.trim_start_matches("http://")),
    };
    let tcp = std::net::TcpStream::connect(addr).with_context(|| format!("connect to {addr}"))?;
    tcp.set_read_timeout(Some(timeout))?;
    let socket = tcp.try_clone()?;
    if !tls {
        return Ok(RawConnection {
            stream: Box::new(tcp),
            socket,
        });
    }
    let mut roots = rustls::RootCertStore::empty();
    for der in trusted_certificates() {
        roots.add(rustls_pki_types::CertificateDer::from(der))?;
    }
    let config = rustls::ClientConfig::builder_with_provider(std::sync::Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()?
    .with_root_certificates(roots)
    .with_no_client_auth();
    let name = rustls_pki_types::ServerName::try_from("127.0.0.1".to_string())?;
    let connection = rustls::ClientConnection::new(std::sync::Arc::new(config), name)?;
    Ok(RawConnection {
        stream: Box::new(rustls::StreamOwned::new(connection, tcp)),
        socket,
    })
}

/// What [`raw_connection`] gives: a request is written to it and its answer read.
pub struct RawConnection {
    stream: Box<dyn ReadWrite>,
    /// The same socket, for its timeouts.
    socket: std::net::TcpStream,
}

impl RawConnection {
    pub fn set_read_timeout(&self, timeout: Option<Duration>) -> std::io::Result<()> {
        self.socket.set_read_timeout(timeout)
    }
}

impl std::io::Read for RawConnection {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        self.stream.read(buf)
    }
}

impl std::io::Write for RawConnection {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.stream.write(buf)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        self.stream.flush()
    }
}

trait ReadWrite: std::io::Read + std::io::Write + Send {}
impl<T: std::io::Read + std::io::Write + Send> ReadWrite for T {}
/// A row of the digits model's 64 features (pixel values 0..16), varied by `i`.
pub fn digits_row(i: usize) -> Vec<f32> {
    (0..64).map(|j| ((i * 7 + j) % 16) as f32).collect()
}

pub const HELDOUT_JSON: &str = include_str!("../../shared/models/digits-mlp/heldout.json");

/// Directory holding the workspace's binaries for the profile these tests run in.
fn bin_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("test executable path");
    // target/<profile>/deps/<test> → target/<profile>
    exe.parent()
        .and_then(Path::parent)
        .expect("target dir")
        .to_path_buf()
}

/// Path of a workspace binary, building it first (once per test process) so that
/// `cargo test` alone is enough.
pub fn bin(name: &str) -> PathBuf {
    static BUILT: OnceLock<()> = OnceLock::new();
    BUILT.get_or_init(|| {
        let release = bin_dir().ends_with("release");
        let mut command = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
        // The test process's environment carries variables cargo sets for tests
        // (CARGO_PKG_*, OUT_DIR, library paths, …) that build scripts such as ring's
        // track; passing them on would recompile half the tree. Keep only the basics.
        command.env_clear();
        for key in [
            "PATH",
            "HOME",
            "CARGO_HOME",
            "RUSTUP_HOME",
            "RUSTUP_TOOLCHAIN",
            "CARGO_TARGET_DIR",
            "TMPDIR",
            "USER",
            "CI",
        ] {
            if let Some(value) = std::env::var_os(key) {
                command.env(key, value);
            }
        }
        command
            .current_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/.."))
            // Same target selection as `cargo test --workspace`, so that feature
            // unification matches and nothing is compiled twice: this only links the bins.
            .args(["build", "--workspace", "--all-targets"]);
        if release {
            command.arg("--release");
        }
        let status = command.status().expect("run cargo build");
        assert!(status.success(), "building the binaries failed");
    });
    bin_dir().join(name)
}

pub fn temp_dir(label: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!(
        "nephele-e2e-{label}-{}-{}",
        std::process::id(),
        Instant::now().elapsed().as_nanos() ^ rand_suffix()
    ));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("temp dir");
    dir
}

fn rand_suffix() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0)
}

fn wait_ready(path: &Path, child: &mut Child, log: &Path) -> Result<Value> {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if let Ok(text) = std::fs::read_to_string(path) {
            if let Ok(value) = serde_json::from_str(&text) {
                return Ok(value);
            }
        }
        if let Ok(Some(status)) = child.try_wait() {
            bail!(
                "process exited early ({status}):\n{}",
                std::fs::read_to_string(log).unwrap_or_default()
            );
        }
        if Instant::now() > deadline {
            bail!("timed out waiting for {}", path.display());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Starts `binary` with `args`, behind `prefix` when there is one (`ip netns exec NS`,
/// which execs the binary, so the child is the binary itself).
fn spawn_logged(prefix: &[String], binary: &str, args: &[String], log: &Path) -> Result<Child> {
    let file = std::fs::File::create(log)?;
    let mut command = match prefix.split_first() {
        Some((program, rest)) => {
            let mut command = Command::new(program);
            command.args(rest).arg(bin(binary));
            command
        }
        None => Command::new(bin(binary)),
    };
    command
        .args(args)
        .env("RUST_LOG", "info,quinn=warn")
        .stdin(Stdio::null())
        .stdout(file.try_clone()?)
        .stderr(file)
        .spawn()
        .with_context(|| format!("start {binary}"))
}

pub struct Cloud {
    pub dir: PathBuf,
    pub api: String,
    pub quic: String,
    pub token: String,
    child: Child,
    starts: usize,
    /// Flags given at every start (`--etcd …`).
    extra_args: Vec<String>,
}

pub const TWO_REGIONS: &str = r#"
heartbeat_interval_ms = 300
[scheduler]
tick_ms = 200
grace_s = 1
[[region]]
name = "eu-west"
[[region.pool]]
name = "l4"
node_profile = "gpu-4x-l4"
[[region]]
name = "us-east"
"#;

impl Cloud {
    /// Posts `deployment` and waits until it is ready on one edge device and the pool
    /// replica; returns its status.
    pub fn deploy_on_one_edge_and_the_pool(&self, deployment: Value) -> Value {
        let name = deployment["name"].as_str().unwrap_or_default().to_string();
        self.post("/v1/deployments", &deployment)
            .unwrap_or_else(|e| panic!("deploy {name}: {e:#}"));
        self.wait_for(
            &format!("/v1/deployments/{name}"),
            &format!("{name} ready on the edge and the pool"),
            |v| {
                v["ready_devices"] == 1
                    && v["devices"]
                        .as_array()
                        .map(|d| d.len() == 2 && d.iter().all(|r| r["ready"] == true))
                        .unwrap_or(false)
            },
        )
        .unwrap_or_else(|e| panic!("{name} never became ready: {e:#}"))
    }

    pub fn start(label: &str) -> Result<Cloud> {
        Cloud::start_with(label, TWO_REGIONS)
    }

    /// The control plane's resident memory now, bytes (from /proc).
    pub fn rss_bytes(&self) -> Option<u64> {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id())).ok()?;
        let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
        let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
        Some(kib * 1024)
    }

    /// A control plane with this configuration (TOML).
    pub fn start_with(label: &str, config: &str) -> Result<Cloud> {
        Cloud::start_listening(label, config, "127.0.0.1:0")
    }

    /// [`Cloud::start_with`], its QUIC endpoint on `quic` (an address on a
    /// [`netlab::Lab`]'s link, say); the API stays on loopback.
    pub fn start_listening(label: &str, config: &str, quic: &str) -> Result<Cloud> {
        Cloud::start_full(label, config, quic, &[])
    }

    /// [`Cloud::start_with`] with these extra flags (`--plain-http`, `--api-cert …`).
    pub fn start_with_args(label: &str, config: &str, args: &[String]) -> Result<Cloud> {
        Cloud::start_full(label, config, "127.0.0.1:0", args)
    }

    /// [`Cloud::start_with`], its state in the etcd cluster at `endpoints`.
    pub fn start_on_etcd(label: &str, config: &str, endpoints: &[String]) -> Result<Cloud> {
        Cloud::start_full(
            label,
            config,
            "127.0.0.1:0",
            &["--etcd".to_string(), endpoints.join(",")],
        )
    }

    /// A control-plane replica on the etcd cluster at `endpoints`, sharing `shared_dir`
    /// with the other replicas, on ports chosen now (so agents can be given every
    /// replica's address before it leads). Returns at once: a standby writes its ready
    /// file only when it comes to lead ([`Cloud::wait_leading`]).
    pub fn replica(
        label: &str,
        config: &str,
        endpoints: &[String],
        shared_dir: &Path,
    ) -> Result<Cloud> {
        let dir = temp_dir(label);
        std::fs::write(dir.join("cloud.toml"), config)?;
        let api_port = std::net::TcpListener::bind("127.0.0.1:0")?
            .local_addr()?
            .port();
        let quic_port = std::net::UdpSocket::bind("127.0.0.1:0")?
            .local_addr()?
            .port();
        let mut cloud = Cloud {
            dir,
            api: format!("https://127.0.0.1:{api_port}"),
            quic: format!("127.0.0.1:{quic_port}"),
            token: String::new(),
            child: Command::new("true").spawn()?,
            starts: 0,
            extra_args: vec![
                "--etcd".into(),
                endpoints.join(","),
                "--shared-dir".into(),
                shared_dir.display().to_string(),
            ],
        };
        cloud.spawn_replica()?;
        Ok(cloud)
    }

    fn spawn_replica(&mut self) -> Result<()> {
        self.starts += 1;
        let _ = std::fs::remove_file(self.dir.join("cloud.ready"));
        let args = self.args(&self.addr(), &self.quic);
        self.child = spawn_logged(&[], "nephele-cloud", &args, &self.log_path())?;
        // A standby serves HTTPS with the cluster CA before it leads: trust it as soon
        // as the replica has written it.
        let ca = self.ca_path();
        let deadline = Instant::now() + Duration::from_secs(20);
        while !ca.exists() && Instant::now() < deadline {
            if let Ok(Some(status)) = self.child.try_wait() {
                bail!(
                    "replica exited ({status}):\n{}",
                    std::fs::read_to_string(self.log_path()).unwrap_or_default()
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        trust_ca(&ca)?;
        Ok(())
    }

    /// The API's address (`host:port`, no scheme).
    pub fn addr(&self) -> String {
        self.api
            .trim_start_matches("https://")
            .trim_start_matches("http://")
            .to_string()
    }

    /// The cluster CA's certificate (PEM), which the API's certificate is issued by.
    pub fn ca_path(&self) -> PathBuf {
        self.dir.join("data/ca.pem")
    }

    /// Starts this replica again (after [`Cloud::kill9`]) without waiting for it.
    pub fn restart_replica(&mut self) -> Result<()> {
        self.stop();
        self.spawn_replica()
    }

    /// Waits up to `seconds` for this replica to lead (its ready file); how long.
    pub fn wait_leading(&mut self, seconds: u64) -> Result<Duration> {
        let begun = Instant::now();
        let ready = self.dir.join("cloud.ready");
        let log = self.log_path();
        loop {
            if std::fs::read_to_string(&ready)
                .ok()
                .and_then(|t| serde_json::from_str::<Value>(&t).ok())
                .is_some()
            {
                return Ok(begun.elapsed());
            }
            if let Ok(Some(status)) = self.child.try_wait() {
                bail!(
                    "replica exited ({status}):\n{}",
                    std::fs::read_to_string(&log).unwrap_or_default()
                );
            }
            if begun.elapsed() > Duration::from_secs(seconds) {
                bail!("replica did not lead within {seconds} s");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The replica's process id (to pause it with SIGSTOP, say).
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Whether the process has exited, and how.
    pub fn exited(&mut self) -> Option<std::process::ExitStatus> {
        self.child.try_wait().ok().flatten()
    }

    fn start_full(label: &str, config: &str, quic: &str, extra_args: &[String]) -> Result<Cloud> {
        let dir = temp_dir(label);
        std::fs::write(dir.join("cloud.toml"), config)?;
        let mut cloud = Cloud {
            dir,
            api: String::new(),
            quic: String::new(),
            token: String::new(),
            child: Command::new("true").spawn()?,
            starts: 0,
            extra_args: extra_args.to_vec(),
        };
        cloud.launch("127.0.0.1:0", quic)?;
        Ok(cloud)
    }

    fn args(&self, api: &str, quic: &str) -> Vec<String> {
        let ready = self.dir.join("cloud.ready");
        let args: Vec<String> = vec![
            "--config".into(),
            self.dir.join("cloud.toml").display().to_string(),
            "--data-dir".into(),
            self.dir.join("data").display().to_string(),
            "--api-listen".into(),
            api.into(),
            "--quic-listen".into(),
            quic.into(),
            "--ready-file".into(),
            ready.display().to_string(),
        ];
        args.into_iter().chain(self.extra_args.clone()).collect()
    }

    fn launch(&mut self, api: &str, quic: &str) -> Result<()> {
        self.starts += 1;
        let ready = self.dir.join("cloud.ready");
        let _ = std::fs::remove_file(&ready);
        let log = self.log_path();
        let args = self.args(api, quic);
        self.child = spawn_logged(&[], "nephele-cloud", &args, &log)?;
        let value = wait_ready(&ready, &mut self.child, &log)?;
        self.api = value["api_url"].as_str().context("api_url")?.to_string();
        trust_ca(Path::new(value["ca"].as_str().context("ca")?))?;
        self.quic = value["quic"].as_str().context("quic")?.to_string();
        self.token = std::fs::read_to_string(self.dir.join("data/admin-token"))?
            .trim()
            .to_string();
        Ok(())
    }

    pub fn log_path(&self) -> PathBuf {
        self.dir.join(format!("cloud-{}.log", self.starts))
    }

    /// All log output of every start so far.
    pub fn logs(&self) -> String {
        (1..=self.starts)
            .map(|n| {
                std::fs::read_to_string(self.dir.join(format!("cloud-{n}.log"))).unwrap_or_default()
            })
            .collect::<Vec<_>>()
            .join("\n")
    }

    pub fn stop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Restarts on the same ports and data dir.
    /// Kills the control plane with SIGKILL (no shutdown), as a crash would.
    pub fn kill9(&mut self) {
        self.stop();
    }

    pub fn restart(&mut self) -> Result<()> {
        self.stop();
        let api = self.addr();
        let quic = self.quic.clone();
        self.launch(&api, &quic)
    }

    pub fn client(&self) -> Http {
        Http::new(Some(self.token.clone()))
    }

    pub fn get(&self, path: &str) -> Result<Value> {
        self.client()
            .request("GET", &format!("{}{path}", self.api), None)
    }

    pub fn delete(&self, path: &str) -> Result<Value> {
        self.client()
            .request("DELETE", &format!("{}{path}", self.api), None)
    }

    /// Runs the `nephele` CLI against this control plane with `token`: whether it
    /// succeeded, and what it printed (stdout, then stderr).
    pub fn cli_as(&self, token: &str, args: &[&str]) -> (bool, String) {
        let output = Command::new(bin("nephele"))
            .args(args)
            .args(["--api", &self.api, "--token", token])
            .env("NEPHELE_CA", self.ca_path())
            .output()
            .expect("run nephele");
        (
            output.status.success(),
            format!(
                "{}{}",
                String::from_utf8_lossy(&output.stdout),
                String::from_utf8_lossy(&output.stderr)
            ),
        )
    }

    /// Starts an edge agent `edge-1` in `region`, labelled `tier=edge` and reporting
    /// its usage every 300 ms, and waits until it serves the deployment `digits`
    /// (which selects `tier=edge`).
    pub fn edge_serving_digits(&self, region: &str) -> Result<Edge> {
        let edge = Edge::start(
            self,
            "edge-1",
            region,
            &["--profile", "rpi5-8gb", "--label", "tier=edge"],
            &["--usage-window-ms", "300"],
        )?;
        self.wait_for("/v1/deployments/digits", "digits ready", |v| {
            v["ready_devices"] == 1
        })?;
        Ok(edge)
    }

    /// Waits until every node slot of `region` is up with its agent (pools whose
    /// provider starts them at once: `min_nodes` = `max_nodes`).
    pub fn wait_pool_nodes_up(&self, region: &str) -> Result<Value> {
        self.wait_long(
            &format!("/v1/regions/{region}/nodes"),
            "every pool node up",
            60,
            |v| {
                v.as_array().is_some_and(|nodes| {
                    nodes
                        .iter()
                        .all(|n| n["phase"] == "up" && !n["agent"].is_null())
                })
            },
        )
    }

    /// Waits up to `seconds` (instead of 60).
    pub fn wait_long(
        &self,
        path: &str,
        what: &str,
        seconds: u64,
        check: impl Fn(&Value) -> bool,
    ) -> Result<Value> {
        let deadline = Instant::now() + Duration::from_secs(seconds);
        loop {
            let value = self.get(path)?;
            if check(&value) {
                return Ok(value);
            }
            if Instant::now() > deadline {
                bail!("timed out after {seconds} s waiting for {what}; last {path}: {value:#}");
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    pub fn post(&self, path: &str, body: &Value) -> Result<Value> {
        self.client()
            .request("POST", &format!("{}{path}", self.api), Some(body))
    }

    pub fn put_model(&self, name: &str, bytes: &[u8]) -> Result<(u16, Value)> {
        self.client().raw(
            "PUT",
            &format!("{}/v1/models/{name}?wait=true", self.api),
            bytes,
        )
    }

    pub fn join_token(&self, region: &str, ttl_s: u64) -> Result<String> {
        let value = self.post(
            "/v1/tokens",
            &serde_json::json!({"region": region, "ttl_s": ttl_s}),
        )?;
        Ok(value["token"].as_str().context("token")?.to_string())
    }

    /// Waits until device `name` is online; returns the device list.
    pub fn wait_online(&self, name: &str) -> Result<Value> {
        self.wait_for("/v1/devices", &format!("{name} online"), |v| {
            v.as_array()
                .is_some_and(|a| a.iter().any(|d| d["name"] == name && d["online"] == true))
        })
    }

    /// Waits until `check` holds for GET `path`, or fails with the last value.
    pub fn wait_for(
        &self,
        path: &str,
        what: &str,
        check: impl Fn(&Value) -> bool,
    ) -> Result<Value> {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let value = self.get(path)?;
            if check(&value) {
                return Ok(value);
            }
            if Instant::now() > deadline {
                bail!("timed out waiting for {what}; last {path}: {value:#}");
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

impl Drop for Cloud {
    fn drop(&mut self) {
        self.stop();
        // The local provider's nodes, and their jobs' processes, outlive the control
        // plane on purpose (as machines would): end them with the test.
        kill_processes_of(&self.dir);
        // Keep the data dir and logs of a failed test for diagnosis; tidy up otherwise.
        if std::thread::panicking() {
            eprintln!(
                "logs and data of this test are kept in {}",
                self.dir.display()
            );
        } else {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

/// Every process of this user that mentions `dir` in its command line, working
/// directory or environment (the local provider's agents, their job supervisors and
/// members), except this one.
pub fn processes_of(dir: &Path) -> Vec<i32> {
    let needle = dir.display().to_string();
    let me = std::process::id() as i32;
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| *pid != me)
        .filter(|pid| {
            let read =
                |what: &str| std::fs::read(format!("/proc/{pid}/{what}")).unwrap_or_default();
            let mentions = |bytes: Vec<u8>| String::from_utf8_lossy(&bytes).contains(&needle);
            let cwd = std::fs::read_link(format!("/proc/{pid}/cwd"))
                .map(|p| p.display().to_string().starts_with(&needle))
                .unwrap_or(false);
            cwd || mentions(read("cmdline")) || mentions(read("environ"))
        })
        .collect()
}

/// SIGKILLs [`processes_of`] `dir`.
pub fn kill_processes_of(dir: &Path) {
    for pid in processes_of(dir) {
        let _ = Command::new("kill")
            .args(["-9", &pid.to_string()])
            .stderr(Stdio::null())
            .status();
    }
}

/// Whether a process is alive (not a zombie).
pub fn alive(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map(|stat| {
            stat.rsplit_once(')')
                .and_then(|(_, rest)| rest.split_whitespace().next())
                .is_some_and(|state| state != "Z")
        })
        .unwrap_or(false)
}

/// A test that needs something `tests/run.sh` prepares (PyPI packages, the traces
/// beside the checkout): under CI, where it is always prepared, its absence fails the
/// test; elsewhere the test says why it is skipped and returns.
pub fn require(what: &str, present: bool) -> bool {
    if present {
        return true;
    }
    if std::env::var("CI").is_ok_and(|v| v == "true" || v == "1") {
        panic!("{what} is missing, and CI always prepares it: run `bash tests/run.sh`");
    }
    use std::io::Write as _;
    let _ = writeln!(
        std::io::stderr(),
        "skipped: {what} is missing (run `bash tests/run.sh`, which prepares it)"
    );
    false
}

/// A JSON array of numbers as f64 (anything else NaN).
pub fn floats(v: &Value) -> Vec<f64> {
    v.as_array()
        .into_iter()
        .flatten()
        .map(|x| x.as_f64().unwrap_or(f64::NAN))
        .collect()
}

/// Largest |got − want| (NaN counts as infinitely far).
pub fn max_abs_diff(got: &[f64], want: &[f64]) -> f64 {
    assert_eq!(got.len(), want.len(), "answer sizes differ");
    got.iter()
        .zip(want)
        .map(|(g, w)| {
            let d = (g - w).abs();
            if d.is_nan() {
                f64::INFINITY
            } else {
                d
            }
        })
        .fold(0.0, f64::max)
}

/// The venv `shared/models/registry/prepare.sh` builds (Python with JAX).
pub fn venv_python() -> PathBuf {
    PathBuf::from(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../target/models/venv/bin/python"
    ))
}

/// `tests/programs/<name>`.
pub fn program(name: &str) -> PathBuf {
    PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/programs")).join(name)
}

/// Runs `nephele-edge join`; returns (success, combined output).
pub fn join(
    cloud: &Cloud,
    data_dir: &Path,
    name: &str,
    token: &str,
    extra: &[&str],
) -> Result<(bool, String)> {
    join_via(&cloud.quic, data_dir, name, token, extra)
}

/// [`join`] through `server` (a relay such as a `ShapedLink` in front of the cloud).
pub fn join_via(
    server: &str,
    data_dir: &Path,
    name: &str,
    token: &str,
    extra: &[&str],
) -> Result<(bool, String)> {
    join_from(&[], server, data_dir, name, token, extra)
}

/// [`join_via`] run behind `prefix` (`ip netns exec NS`, from another host).
pub fn join_from(
    prefix: &[String],
    server: &str,
    data_dir: &Path,
    name: &str,
    token: &str,
    extra: &[&str],
) -> Result<(bool, String)> {
    let mut args: Vec<String> = vec![
        "join".into(),
        "--server".into(),
        server.into(),
        "--token".into(),
        token.into(),
        "--data-dir".into(),
        data_dir.display().to_string(),
        "--name".into(),
        name.into(),
    ];
    args.extend(extra.iter().map(|s| s.to_string()));
    let output = match prefix.split_first() {
        Some((program, rest)) => Command::new(program)
            .args(rest)
            .arg(bin("nephele-edge"))
            .args(&args)
            .output()?,
        None => Command::new(bin("nephele-edge")).args(&args).output()?,
    };
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    Ok((output.status.success(), text))
}

pub struct Edge {
    pub name: String,
    pub dir: PathBuf,
    pub endpoint: String,
    child: Child,
    /// `nephele-edge run`'s arguments (after the data dir, listen address and ready
    /// file), used again by [`Edge::restart`].
    pub run_args: Vec<String>,
    starts: usize,
    /// What the agent runs behind (`ip netns exec NS` in a [`netlab::Lab`]).
    prefix: Vec<String>,
    /// Where its local endpoint listens (port 0: any).
    listen: String,
}

impl Edge {
    /// Enrols (with a fresh token) and runs an agent.
    pub fn start(
        cloud: &Cloud,
        name: &str,
        region: &str,
        join_args: &[&str],
        run_args: &[&str],
    ) -> Result<Edge> {
        Edge::start_via(cloud, &cloud.quic, name, region, join_args, run_args)
    }

    /// A pool agent (`--role pool`, profile `gpu-4x-l4`) named `name` in `region`:
    /// where offloaded requests and split tails run.
    pub fn pool(cloud: &Cloud, name: &str, region: &str) -> Result<Edge> {
        Edge::start(
            cloud,
            name,
            region,
            &["--role", "pool", "--profile", "gpu-4x-l4"],
            &[],
        )
    }

    /// [`Edge::start`] with the agent reaching the cloud through `server` (a relay
    /// such as a `ShapedLink`), for its enrolment and its session.
    pub fn start_via(
        cloud: &Cloud,
        server: &str,
        name: &str,
        region: &str,
        join_args: &[&str],
        run_args: &[&str],
    ) -> Result<Edge> {
        Edge::enrol_and_run(
            cloud,
            &[],
            "127.0.0.1",
            server,
            name,
            region,
            join_args,
            run_args,
        )
    }

    /// An agent on the far side of `lab`'s link: it enrols and runs in the lab's
    /// namespace, reaching the control plane (which must listen on `lab.cloud_ip`)
    /// across the emulated link; its local endpoint is on the management path.
    pub fn start_in(
        lab: &netlab::Lab,
        cloud: &Cloud,
        name: &str,
        region: &str,
        join_args: &[&str],
        run_args: &[&str],
    ) -> Result<Edge> {
        Edge::enrol_and_run(
            cloud,
            &lab.exec_prefix(),
            &lab.edge_management_ip.to_string(),
            &cloud.quic,
            name,
            region,
            join_args,
            run_args,
        )
    }

    #[allow(clippy::too_many_arguments)]
    fn enrol_and_run(
        cloud: &Cloud,
        prefix: &[String],
        listen_ip: &str,
        server: &str,
        name: &str,
        region: &str,
        join_args: &[&str],
        run_args: &[&str],
    ) -> Result<Edge> {
        let dir = cloud.dir.join(name);
        let token = cloud.join_token(region, 600)?;
        let (ok, output) = join_from(prefix, server, &dir, name, &token, join_args)?;
        if !ok {
            bail!("join {name} failed: {output}");
        }
        let mut edge = Edge {
            name: name.into(),
            endpoint: String::new(),
            dir,
            child: Command::new("true").spawn()?,
            run_args: run_args.iter().map(|s| s.to_string()).collect(),
            starts: 0,
            prefix: prefix.to_vec(),
            listen: format!("{listen_ip}:0"),
        };
        edge.launch()?;
        Ok(edge)
    }

    /// Runs an agent on a data dir that is already enrolled (a copy of another's, say).
    pub fn run_existing(name: &str, dir: &Path, run_args: &[&str]) -> Result<Edge> {
        let mut edge = Edge {
            name: name.into(),
            endpoint: String::new(),
            dir: dir.to_path_buf(),
            child: Command::new("true").spawn()?,
            run_args: run_args.iter().map(|s| s.to_string()).collect(),
            starts: 0,
            prefix: Vec::new(),
            listen: "127.0.0.1:0".into(),
        };
        edge.launch()?;
        Ok(edge)
    }

    /// Starts `nephele-edge run` on the data dir (each start logs to a file of its own)
    /// and waits for its ready file.
    fn launch(&mut self) -> Result<()> {
        self.starts += 1;
        let ready = self.dir.join("ready.json");
        let _ = std::fs::remove_file(&ready);
        let mut args: Vec<String> = vec![
            "run".into(),
            "--data-dir".into(),
            self.dir.display().to_string(),
            "--listen".into(),
            self.listen.clone(),
            "--ready-file".into(),
            ready.display().to_string(),
        ];
        args.extend(self.run_args.iter().cloned());
        let log = self.log_path(self.starts);
        self.child = spawn_logged(&self.prefix, "nephele-edge", &args, &log)?;
        let value = wait_ready(&ready, &mut self.child, &log)?;
        self.endpoint = format!("http://{}", value["listen"].as_str().context("listen")?);
        Ok(())
    }

    fn log_path(&self, start: usize) -> PathBuf {
        match start {
            1 => self.dir.join("agent.log"),
            n => self.dir.join(format!("agent-{n}.log")),
        }
    }

    /// Kills the agent with SIGKILL, as a crash or a power cut would.
    pub fn kill9(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Kills the agent (SIGKILL) and starts it again on the same data dir; returns when
    /// its local endpoint listens (on a new port).
    pub fn restart(&mut self) -> Result<()> {
        self.kill9();
        self.launch()
    }

    /// The agent's `/v1/status`.
    pub fn status(&self) -> Result<Value> {
        Http::new(None).request("GET", &format!("{}/v1/status", self.endpoint), None)
    }

    /// The value of a metric (summed over its label sets matching `labels`) on the
    /// agent's `/metrics`; 0 when absent.
    pub fn metric(&self, name: &str, labels: &str) -> Result<f64> {
        let text = ureq::get(&format!("{}/metrics", self.endpoint))
            .call()?
            .body_mut()
            .read_to_string()?;
        Ok(text
            .lines()
            .filter(|line| line.starts_with(name) && line.contains(labels))
            .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
            .sum())
    }

    pub fn infer(&self, deployment: &str, row: &[f32]) -> Result<(u16, Value)> {
        let body = serde_json::json!({"shape": [1, row.len()], "data": row});
        let client = Http::new(None);
        client.raw_json(
            "POST",
            &format!("{}/v1/infer/{deployment}", self.endpoint),
            &body,
        )
    }

    /// All log output of every start so far.
    pub fn logs(&self) -> String {
        (1..=self.starts)
            .map(|n| std::fs::read_to_string(self.log_path(n)).unwrap_or_default())
            .collect::<Vec<_>>()
            .join("\n")
    }
}

impl Drop for Edge {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub struct Http {
    agent: ureq::Agent,
    token: Option<String>,
}

impl Http {
    pub fn new(token: Option<String>) -> Http {
        Http {
            agent: ureq::Agent::config_builder()
                .http_status_as_error(false)
                .timeout_global(Some(Duration::from_secs(30)))
                .tls_config(tls_config())
                .build()
                .into(),
            token,
        }
    }

    fn auth(&self) -> String {
        format!("Bearer {}", self.token.clone().unwrap_or_default())
    }

    pub fn raw_json(&self, method: &str, url: &str, body: &Value) -> Result<(u16, Value)> {
        let request = match method {
            "POST" => self.agent.post(url),
            _ => self.agent.put(url),
        };
        let mut response = request
            .header("authorization", self.auth())
            .send_json(body)?;
        let status = response.status().as_u16();
        let text = response.body_mut().read_to_string()?;
        Ok((
            status,
            serde_json::from_str(&text).unwrap_or(Value::String(text)),
        ))
    }

    pub fn raw(&self, method: &str, url: &str, bytes: &[u8]) -> Result<(u16, Value)> {
        let request = match method {
            "POST" => self.agent.post(url),
            _ => self.agent.put(url),
        };
        let mut response = request.header("authorization", self.auth()).send(bytes)?;
        let status = response.status().as_u16();
        let text = response.body_mut().read_to_string()?;
        Ok((
            status,
            serde_json::from_str(&text).unwrap_or(Value::String(text)),
        ))
    }

    /// POSTs `bytes` with the `inference-header-content-length` header (the binary
    /// inference form): the status, that header of the answer, and its bytes.
    pub fn post_binary(
        &self,
        url: &str,
        header_length: usize,
        bytes: &[u8],
    ) -> Result<(u16, Option<usize>, Vec<u8>)> {
        let mut response = self
            .agent
            .post(url)
            .header(
                "inference-header-content-length",
                &header_length.to_string(),
            )
            .send(bytes)?;
        let status = response.status().as_u16();
        let length = response
            .headers()
            .get("inference-header-content-length")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse().ok());
        let body = response.body_mut().read_to_vec()?;
        Ok((status, length, body))
    }

    /// A GET's status, headers (names in lower case) and JSON body, whatever the status.
    pub fn get_full(
        &self,
        url: &str,
    ) -> Result<(u16, std::collections::HashMap<String, String>, Value)> {
        let mut response = self
            .agent
            .get(url)
            .header("authorization", self.auth())
            .call()?;
        let status = response.status().as_u16();
        let headers = response
            .headers()
            .iter()
            .map(|(name, value)| {
                (
                    name.as_str().to_lowercase(),
                    value.to_str().unwrap_or_default().to_string(),
                )
            })
            .collect();
        let text = response.body_mut().read_to_string()?;
        Ok((
            status,
            headers,
            serde_json::from_str(&text).unwrap_or(Value::String(text)),
        ))
    }

    pub fn request(&self, method: &str, url: &str, body: Option<&Value>) -> Result<Value> {
        let mut response = match (method, body) {
            ("GET", _) => self
                .agent
                .get(url)
                .header("authorization", self.auth())
                .call()?,
            ("DELETE", _) => self
                .agent
                .delete(url)
                .header("authorization", self.auth())
                .call()?,
            (_, Some(body)) => self
                .agent
                .post(url)
                .header("authorization", self.auth())
                .send_json(body)?,
            (_, None) => self
                .agent
                .post(url)
                .header("authorization", self.auth())
                .send_empty()?,
        };
        let status = response.status().as_u16();
        let text = response.body_mut().read_to_string()?;
        let value: Value = if text.is_empty() {
            Value::Null
        } else {
            serde_json::from_str(&text).unwrap_or(Value::String(text))
        };
        if status >= 400 {
            bail!("{method} {url} → {status}: {value}");
        }
        Ok(value)
    }
}

/// The sorted `name`s of a list the API returned (devices, models, deployments).
pub fn names(value: &Value) -> Vec<String> {
    let mut names: Vec<String> = value
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|v| v["name"].as_str().map(str::to_string))
        .collect();
    names.sort();
    names
}

#[derive(serde::Deserialize)]
pub struct Heldout {
    pub features: Vec<Vec<f32>>,
    pub labels: Vec<usize>,
}

pub fn heldout() -> Heldout {
    serde_json::from_str(HELDOUT_JSON).expect("held-out set")
}
