//! One simulated agent's session: what a real agent says on the wire, without running
//! models. It dials the control plane with its own mutual-TLS identity and the real
//! agent's transport settings (idle timeout and keep-alive), sends `Hello`, reads
//! `Welcome` and its desired state, heartbeats at the Welcome's interval, and answers
//! each new desired state as the real agent does: it verifies every assignment's
//! signed manifest, fetches the variant's bytes from the control plane chunk by chunk
//! (each agent its own copy: a cold cache, the costly case) and checks their sha256,
//! then reports Ready in a heartbeat sent at once.
//!
//! What it does not do is load and run the model: the bench measures the control
//! plane, and a real agent's load time is the runtime's (README, inference bench).

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _, Result};
use nephele_net::{write_frame, FrameReader};
use nephele_proto::{
    AgentMessage, Assignment, CloudMessage, DeploymentPhase, DeploymentTelemetry, Digest,
    Heartbeat, Hello, LinkReport, NodeReport, MAX_FRAME_BYTES, PROTOCOL_VERSION,
};

use super::enrol::{Cluster, Identity};

/// The real agent's idle timeout with one control-plane replica
/// (`nephele_edge::session_core::SessionConfig`); keep-alives go every fifth of it.
const IDLE_TIMEOUT: Duration = Duration::from_secs(15);

/// What all simulated agents share.
pub struct Fleet {
    pub server: SocketAddr,
    pub cluster: Cluster,
    /// `edge`, or `pool` for the nodes jobs are placed on.
    pub role: &'static str,
    pub profile_name: String,
    pub profile_toml: String,
    pub started: Instant,
    pub stats: Stats,
}

/// Counters and samples of the whole simulated fleet.
#[derive(Default)]
pub struct Stats {
    pub connected: AtomicUsize,
    pub sessions_lost: AtomicUsize,
    pub heartbeats_sent: AtomicU64,
    pub blob_bytes_fetched: AtomicU64,
    /// When each agent reported a deployment Ready, s since [`Fleet::started`].
    pub ready_at_s: Mutex<Vec<f64>>,
    /// When each agent received a desired state with a new assignment, s since start.
    pub assigned_at_s: Mutex<Vec<f64>>,
    /// How long each agent took to fetch the model's bytes, s, by agent name.
    pub transfer_s: Mutex<HashMap<String, f64>>,
    pub errors: Mutex<HashMap<String, u64>>,
}

impl Stats {
    pub fn error(&self, what: &str) {
        *self
            .errors
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry(what.to_string())
            .or_default() += 1;
    }
}

/// One agent's place in the fleet: its connection while it has one, and whether a
/// deployment is Ready on it (offloaded requests go only through such agents).
#[derive(Default)]
pub struct Slot {
    pub connection: Mutex<Option<quinn::Connection>>,
    pub ready: std::sync::atomic::AtomicBool,
}

/// Runs one agent's session until its connection ends; says why it ended.
pub async fn run(
    fleet: Arc<Fleet>,
    identity: Identity,
    endpoint: quinn::Endpoint,
    slot: Arc<Slot>,
) -> Result<()> {
    let mut config = nephele_net::mtls_client_config(
        &fleet.cluster.ca_der,
        &identity.cert_der,
        &identity.key_pkcs8_der,
    )?;
    nephele_net::set_idle_timeout(&mut config, IDLE_TIMEOUT);
    let connection = endpoint
        .connect_with(config, fleet.server, nephele_net::SERVER_NAME)?
        .await
        .context("mutual-TLS handshake")?;
    let (mut send, recv) = connection.open_bi().await?;
    write_frame(
        &mut send,
        &AgentMessage::Hello(Hello {
            protocol_version: PROTOCOL_VERSION,
            agent_version: env!("CARGO_PKG_VERSION").into(),
            role: fleet.role.into(),
            profile_name: fleet.profile_name.clone(),
            profile_toml: fleet.profile_toml.clone(),
            models_cached: Vec::new(),
            local_endpoint: "127.0.0.1:8700".into(),
            node: NodeReport::default(),
            jobs: Vec::new(),
        }),
    )
    .await?;
    let mut control = FrameReader::new(recv, MAX_FRAME_BYTES);
    let interval = match control.next::<CloudMessage>().await? {
        Some(CloudMessage::Welcome(welcome)) => {
            Duration::from_millis(u64::from(welcome.heartbeat_interval_ms).max(100))
        }
        Some(CloudMessage::Refused(error)) => bail!("refused: {}", error.message),
        other => bail!("expected Welcome, got {other:?}"),
    };
    *slot.connection.lock().unwrap_or_else(|p| p.into_inner()) = Some(connection.clone());
    fleet.stats.connected.fetch_add(1, Ordering::Relaxed);
    let mut agent = Agent {
        name: &identity.name,
        fleet: &fleet,
        connection: &connection,
        send,
        seq: 0,
        generation: 0,
        running: Vec::new(),
    };
    let ended = agent.serve(&mut control, interval, &slot).await;
    fleet.stats.connected.fetch_sub(1, Ordering::Relaxed);
    fleet.stats.sessions_lost.fetch_add(1, Ordering::Relaxed);
    slot.ready.store(false, Ordering::Relaxed);
    *slot.connection.lock().unwrap_or_else(|p| p.into_inner()) = None;
    ended
}

struct Agent<'a> {
    name: &'a str,
    fleet: &'a Fleet,
    connection: &'a quinn::Connection,
    send: quinn::SendStream,
    seq: u64,
    generation: u64,
    /// What it runs: deployment, variant, the variant's sha256.
    running: Vec<(String, String, Digest)>,
}

impl Agent<'_> {
    async fn serve(
        &mut self,
        control: &mut FrameReader,
        interval: Duration,
        slot: &Slot,
    ) -> Result<()> {
        // The first beat goes at once, as the real agent's does after Welcome.
        let mut next_beat = tokio::time::Instant::now();
        loop {
            tokio::select! {
                frame = control.next::<CloudMessage>() => match frame? {
                    Some(CloudMessage::DesiredState(desired)) => {
                        self.generation = desired.generation;
                        let fresh = self.apply(&desired.assignments).await;
                        slot.ready.store(!self.running.is_empty(), Ordering::Relaxed);
                        if fresh {
                            self.heartbeat().await?;
                            next_beat = tokio::time::Instant::now() + interval;
                        }
                    }
                    Some(CloudMessage::UsageAck { .. }) | Some(CloudMessage::Welcome(_)) => {}
                    Some(CloudMessage::Refused(error)) => bail!("refused: {}", error.message),
                    None => bail!("the control plane finished the control stream"),
                },
                _ = tokio::time::sleep_until(next_beat) => {
                    self.heartbeat().await?;
                    next_beat += interval;
                    let now = tokio::time::Instant::now();
                    if next_beat < now {
                        next_beat = now + interval;
                    }
                }
            }
        }
    }

    /// Makes `assignments` what runs; says whether anything new became Ready.
    async fn apply(&mut self, assignments: &[Assignment]) -> bool {
        let mut fresh = false;
        let mut running = Vec::new();
        for assignment in assignments {
            let kept = self
                .running
                .iter()
                .find(|(name, variant, _)| {
                    name == &assignment.deployment && variant == &assignment.variant
                })
                .cloned();
            if let Some(kept) = kept {
                running.push(kept);
                continue;
            }
            let since = self.fleet.started.elapsed().as_secs_f64();
            self.fleet
                .stats
                .assigned_at_s
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .push(since);
            match self.load(assignment).await {
                Ok(digest) => {
                    fresh = true;
                    running.push((
                        assignment.deployment.clone(),
                        assignment.variant.clone(),
                        digest,
                    ));
                    let at = self.fleet.started.elapsed().as_secs_f64();
                    self.fleet
                        .stats
                        .ready_at_s
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .push(at);
                }
                Err(error) => self.fleet.stats.error(&format!("load: {error:#}")),
            }
        }
        self.running = running;
        fresh
    }

    /// Verifies the assignment's manifest and gets the variant's bytes.
    async fn load(&self, assignment: &Assignment) -> Result<Digest> {
        let (_, variant) = nephele_edge::reconcile_plan::verify_manifest(
            &self.fleet.cluster.manifest_signing_key,
            assignment,
        )
        .map_err(anyhow::Error::msg)?;
        let started = Instant::now();
        let bytes = fetch(self.connection, &variant.sha256, variant.size).await?;
        self.fleet
            .stats
            .transfer_s
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(self.name.to_string(), started.elapsed().as_secs_f64());
        self.fleet
            .stats
            .blob_bytes_fetched
            .fetch_add(bytes.len() as u64, Ordering::Relaxed);
        if ring::digest::digest(&ring::digest::SHA256, &bytes).as_ref() != variant.sha256 {
            bail!("the fetched bytes do not match the manifest's sha256");
        }
        Ok(variant.sha256)
    }

    async fn heartbeat(&mut self) -> Result<()> {
        self.seq += 1;
        let beat = AgentMessage::Heartbeat(Heartbeat {
            seq: self.seq,
            uptime_ms: self.fleet.started.elapsed().as_millis() as u64,
            applied_generation: self.generation,
            rss_bytes: 0,
            deployments: self
                .running
                .iter()
                .map(|(deployment, variant, digest)| DeploymentTelemetry {
                    variant: variant.clone(),
                    model_sha256: *digest,
                    ..DeploymentTelemetry::idle(deployment, DeploymentPhase::Ready)
                })
                .collect(),
            link: LinkReport {
                rtt_us: self.connection.rtt().as_micros() as u64,
                bandwidth_bps: 0,
            },
            jobs: Vec::new(),
        });
        write_frame(&mut self.send, &beat).await?;
        self.fleet
            .stats
            .heartbeats_sent
            .fetch_add(1, Ordering::Relaxed);
        Ok(())
    }
}

/// A blob from the control plane, chunk by chunk, as the real agent fetches it.
async fn fetch(connection: &quinn::Connection, digest: &Digest, size: u64) -> Result<Vec<u8>> {
    nephele_edge::blob_fetch::fetch_blob(connection, digest, size).await
}
