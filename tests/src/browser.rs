//! A real headless Chromium, driven over WebDriver (Debian's `chromium` and
//! `chromium-driver`, which `tests/run.sh` installs), for tests of the dashboard: load a
//! page, wait until a script says it has rendered, read the DOM, take a screenshot.
//!
//! The control plane's API certificate is trusted by its key alone
//! (`--ignore-certificate-errors-spki-list` with the SHA-256 of the certificate's
//! public key, read from the TLS handshake), not by turning certificate checks off.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _, Result};
use base64::Engine as _;
use serde_json::{json, Value};

pub const CHROMIUM: &str = "/usr/bin/chromium";
pub const CHROMEDRIVER: &str = "/usr/bin/chromedriver";

/// Whether this machine has both (the test script installs them).
pub fn available() -> bool {
    Path::new(CHROMIUM).exists() && Path::new(CHROMEDRIVER).exists()
}

/// The base64 SHA-256 of the public key (SubjectPublicKeyInfo) of the certificate the
/// HTTPS server at `addr` (`host:port`) presents, as Chromium's SPKI list takes it.
pub fn spki_pin(addr: &str) -> Result<String> {
    let mut tcp = std::net::TcpStream::connect(addr).with_context(|| format!("connect {addr}"))?;
    tcp.set_read_timeout(Some(Duration::from_secs(10)))?;
    // Only the server's certificate is wanted here: the chain is checked by the caller's
    // other clients, which trust the cluster CA.
    #[derive(Debug)]
    struct Any;
    impl rustls::client::danger::ServerCertVerifier for Any {
        fn verify_server_cert(
            &self,
            _: &rustls_pki_types::CertificateDer<'_>,
            _: &[rustls_pki_types::CertificateDer<'_>],
            _: &rustls_pki_types::ServerName<'_>,
            _: &[u8],
            _: rustls_pki_types::UnixTime,
        ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
            Ok(rustls::client::danger::ServerCertVerified::assertion())
        }
        fn verify_tls12_signature(
            &self,
            _: &[u8],
            _: &rustls_pki_types::CertificateDer<'_>,
            _: &rustls::DigitallySignedStruct,
        ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
            Ok(rustls::client::danger::HandshakeSignatureValid::assertion())
        }
        fn verify_tls13_signature(
            &self,
            _: &[u8],
            _: &rustls_pki_types::CertificateDer<'_>,
            _: &rustls::DigitallySignedStruct,
        ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
            Ok(rustls::client::danger::HandshakeSignatureValid::assertion())
        }
        fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
            rustls::crypto::ring::default_provider()
                .signature_verification_algorithms
                .supported_schemes()
        }
    }
    let config = rustls::ClientConfig::builder_with_provider(std::sync::Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()?
    .dangerous()
    .with_custom_certificate_verifier(std::sync::Arc::new(Any))
    .with_no_client_auth();
    let name = rustls_pki_types::ServerName::try_from("127.0.0.1".to_string())?;
    let mut connection = rustls::ClientConnection::new(std::sync::Arc::new(config), name)?;
    while connection.is_handshaking() {
        connection.complete_io(&mut tcp)?;
    }
    let leaf = connection
        .peer_certificates()
        .and_then(|chain| chain.first())
        .context("the server sent no certificate")?;
    let (_, certificate) = x509_parser::parse_x509_certificate(leaf.as_ref())
        .map_err(|e| anyhow::anyhow!("the server's certificate does not parse: {e}"))?;
    let digest = ring::digest::digest(
        &ring::digest::SHA256,
        certificate.tbs_certificate.subject_pki.raw,
    );
    Ok(base64::engine::general_purpose::STANDARD.encode(digest.as_ref()))
}

/// One Chromium session behind its own chromedriver; both end on drop.
pub struct Browser {
    driver: Child,
    base: String,
    session: String,
    http: ureq::Agent,
    profile: PathBuf,
}

fn free_port() -> Result<u16> {
    let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
    Ok(listener.local_addr()?.port())
}

impl Browser {
    /// Starts chromedriver and a headless Chromium (`width` × `height`), trusting the
    /// certificate keys in `spki_pins`; its profile lives in `dir`.
    pub fn start(dir: &Path, spki_pins: &[String], width: u32, height: u32) -> Result<Browser> {
        if !available() {
            bail!("{CHROMIUM} or {CHROMEDRIVER} is missing; tests/run.sh installs Debian's chromium and chromium-driver");
        }
        let port = free_port()?;
        let log = std::fs::File::create(dir.join("chromedriver.log"))?;
        let driver = Command::new(CHROMEDRIVER)
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .context("start chromedriver")?;
        let base = format!("http://127.0.0.1:{port}");
        let http: ureq::Agent = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .timeout_global(Some(Duration::from_secs(60)))
            .build()
            .into();
        let profile = dir.join("chromium-profile");
        std::fs::create_dir_all(&profile)?;
        let mut browser = Browser {
            driver,
            base,
            session: String::new(),
            http,
            profile,
        };
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Ok(status) = browser.call("GET", "/status", None) {
                if status["ready"] == true {
                    break;
                }
            }
            if Instant::now() > deadline {
                bail!("chromedriver did not get ready within 20 s");
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let mut args = vec![
            "--headless=new".to_string(),
            // Root in a container: Chromium's sandbox needs user namespaces it may not have.
            "--no-sandbox".into(),
            "--disable-gpu".into(),
            "--disable-dev-shm-usage".into(),
            "--disable-quic".into(),
            "--no-first-run".into(),
            "--disable-background-networking".into(),
            "--disable-component-update".into(),
            "--disable-sync".into(),
            format!("--user-data-dir={}", browser.profile.display()),
            format!("--window-size={width},{height}"),
        ];
        if !spki_pins.is_empty() {
            args.push(format!(
                "--ignore-certificate-errors-spki-list={}",
                spki_pins.join(",")
            ));
        }
        let created = browser.call(
            "POST",
            "/session",
            Some(&json!({"capabilities": {"alwaysMatch": {
                "browserName": "chrome",
                "goog:chromeOptions": {"binary": CHROMIUM, "args": args}
            }}})),
        )?;
        browser.session = created["sessionId"]
            .as_str()
            .with_context(|| format!("no session: {created}"))?
            .to_string();
        Ok(browser)
    }

    /// One WebDriver call: its `value`, or the error it answered.
    fn call(&self, method: &str, path: &str, body: Option<&Value>) -> Result<Value> {
        let url = format!("{}{path}", self.base);
        let mut response = match (method, body) {
            ("GET", _) => self.http.get(&url).call()?,
            ("DELETE", _) => self.http.delete(&url).call()?,
            (_, Some(body)) => self.http.post(&url).send_json(body)?,
            (_, None) => self.http.post(&url).send_json(json!({}))?,
        };
        let status = response.status().as_u16();
        let answer: Value = serde_json::from_str(&response.body_mut().read_to_string()?)?;
        if status != 200 {
            bail!("WebDriver {method} {path}: {status} {answer}");
        }
        Ok(answer["value"].clone())
    }

    pub fn goto(&self, url: &str) -> Result<()> {
        self.call(
            "POST",
            &format!("/session/{}/url", self.session),
            Some(&json!({ "url": url })),
        )?;
        Ok(())
    }

    /// Runs `script` (a function body; `return` gives the value) in the page.
    pub fn eval(&self, script: &str) -> Result<Value> {
        self.call(
            "POST",
            &format!("/session/{}/execute/sync", self.session),
            Some(&json!({ "script": script, "args": [] })),
        )
    }

    /// Runs `script` until it returns something truthy (or `timeout` passes).
    pub fn wait_for(&self, what: &str, script: &str, timeout: Duration) -> Result<Value> {
        let deadline = Instant::now() + timeout;
        let mut last = Value::Null;
        while Instant::now() < deadline {
            last = self.eval(script)?;
            let truthy = match &last {
                Value::Null => false,
                Value::Bool(b) => *b,
                Value::Number(n) => n.as_f64() != Some(0.0),
                Value::String(s) => !s.is_empty(),
                _ => true,
            };
            if truthy {
                return Ok(last);
            }
            std::thread::sleep(Duration::from_millis(250));
        }
        bail!("waited {timeout:?} for {what}; last: {last}")
    }

    /// A PNG of the whole viewport, written to `path`; its bytes.
    pub fn screenshot(&self, path: &Path) -> Result<Vec<u8>> {
        let encoded = self.call(
            "GET",
            &format!("/session/{}/screenshot", self.session),
            None,
        )?;
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(encoded.as_str().context("no screenshot")?)
            .context("screenshot is not base64")?;
        std::fs::write(path, &bytes)?;
        Ok(bytes)
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        if !self.session.is_empty() {
            let _ = self.call("DELETE", &format!("/session/{}", self.session), None);
        }
        let _ = self.driver.kill();
        let _ = self.driver.wait();
    }
}

impl Browser {
    /// A PNG of the element `css` selects (scrolled into view first), written to
    /// `path`; its bytes.
    pub fn element_screenshot(&self, css: &str, path: &Path) -> Result<Vec<u8>> {
        let found = self.call(
            "POST",
            &format!("/session/{}/element", self.session),
            Some(&json!({"using": "css selector", "value": css})),
        )?;
        // The W3C element reference key.
        let id = found["element-6066-11e4-a52e-4f735466cecf"]
            .as_str()
            .with_context(|| format!("no element {css}: {found}"))?
            .to_string();
        let encoded = self.call(
            "GET",
            &format!("/session/{}/element/{id}/screenshot", self.session),
            None,
        )?;
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(encoded.as_str().context("no screenshot")?)
            .context("screenshot is not base64")?;
        std::fs::write(path, &bytes)?;
        Ok(bytes)
    }
}

/// The width and height of a PNG (from its IHDR chunk).
pub fn png_size(bytes: &[u8]) -> Option<(u32, u32)> {
    if bytes.len() < 24 || &bytes[..8] != b"\x89PNG\r\n\x1a\n" || &bytes[12..16] != b"IHDR" {
        return None;
    }
    let word =
        |at: usize| u32::from_be_bytes([bytes[at], bytes[at + 1], bytes[at + 2], bytes[at + 3]]);
    Some((word(16), word(20)))
}
