//! The thin tokio shell around [`crate::session_core`]: it dials the control plane,
//! reads control frames, sleeps until the core's deadline, and does what the core's
//! effects say (send a heartbeat, apply a desired state, mark the device removed…).
//! Every decision (when to connect, which replica, how long to wait, when a heartbeat
//! is due, when a session has failed) is the core's.
//!
//! Cancellation safety: the shell waits in one `select!` on the control stream, the
//! core's deadline and the interruption notice. The control stream is read through
//! [`nephele_net::FrameReader`], whose buffer survives a cancelled read, so a desired
//! state arriving slowly across heartbeats is not cut; the other branches hold no
//! partial state. Writes are not raced: each runs to completion (or failure) before the
//! shell waits again.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result};
use nephele_net::{write_frame, FrameReader};
use nephele_proto::{
    AgentMessage, CloudMessage, DesiredState, Heartbeat, Hello, InterruptionNotice, LinkReport,
    MAX_FRAME_BYTES, PROTOCOL_VERSION,
};
use tokio::sync::watch;

use crate::agent::Agent;
use crate::serving::lock;
use crate::session_core::{Effect, Input, SessionConfig, SessionCore};

/// One connection to a replica: its control stream and the tasks it runs.
struct Link {
    connection: quinn::Connection,
    address: SocketAddr,
    send: quinn::SendStream,
    control: FrameReader,
    tasks: Vec<tokio::task::JoinHandle<()>>,
    /// ACK frames received on the connection as of the last heartbeat: more since
    /// then means the path carries the control plane's answers.
    acks_seen: u64,
}

impl Link {
    fn close(self, reason: &[u8]) {
        for task in &self.tasks {
            task.abort();
        }
        self.connection.close(0u32.into(), reason);
    }
}

/// Runs the agent's session with the control plane for as long as the agent runs.
pub async fn run(agent: Arc<Agent>, desired_tx: watch::Sender<Option<DesiredState>>) {
    let config = SessionConfig::for_servers(&agent.enrolment.config.server);
    let mut core = SessionCore::new(
        config,
        Instant::now(),
        rand::random(),
        agent.server.removed(),
    );
    let mut notice_rx = agent.notice.subscribe();
    let mut notices_open = true;
    let mut link: Option<Link> = None;
    let mut shell = Shell {
        agent: &agent,
        desired_tx: &desired_tx,
        told_expired: false,
        warned_edge_jobs: false,
        endpoint: None,
    };
    let mut inputs = VecDeque::from([Input::Notice(*notice_rx.borrow_and_update())]);
    loop {
        while let Some(input) = inputs.pop_front() {
            for effect in core.handle(Instant::now(), input) {
                if let Some(next) = shell.execute(&mut link, effect).await {
                    inputs.push_back(next);
                }
            }
        }
        let deadline = core.deadline().map(tokio::time::Instant::from_std);
        let input = tokio::select! {
            frame = next_frame(&mut link) => match frame {
                Ok(Some(message)) => Input::Frame(message),
                Ok(None) => Input::StreamClosed("the control plane finished the control stream".into()),
                Err(error) => {
                    let silent = link.as_ref().is_some_and(|link| {
                        matches!(link.connection.close_reason(), Some(quinn::ConnectionError::TimedOut))
                    });
                    let reason = format!("control stream: {error}");
                    if silent { Input::Silent(reason) } else { Input::StreamClosed(reason) }
                }
            },
            _ = sleep_until(deadline) => Input::Tick,
            _ = agent.report_now.notified() => Input::ReportNow,
            changed = notice_rx.changed(), if notices_open => match changed {
                Ok(()) => Input::Notice(*notice_rx.borrow_and_update()),
                Err(_) => {
                    notices_open = false;
                    continue;
                }
            },
        };
        inputs.push_back(input);
    }
}

/// The next control frame, or never while there is no connection.
async fn next_frame(
    link: &mut Option<Link>,
) -> Result<Option<CloudMessage>, nephele_net::NetError> {
    match link {
        Some(link) => link.control.next::<CloudMessage>().await,
        None => std::future::pending().await,
    }
}

async fn sleep_until(deadline: Option<tokio::time::Instant>) {
    match deadline {
        Some(deadline) => tokio::time::sleep_until(deadline).await,
        None => std::future::pending().await,
    }
}

struct Shell<'a> {
    agent: &'a Arc<Agent>,
    desired_tx: &'a watch::Sender<Option<DesiredState>>,
    told_expired: bool,
    warned_edge_jobs: bool,
    /// The QUIC client endpoint, kept across connection attempts: one made per attempt
    /// outlived an attempt abandoned on its timeout, and the one-hour soak measured the
    /// agent's memory growing by about 3 MB after each such attempt.
    endpoint: Option<quinn::Endpoint>,
}

impl Shell<'_> {
    /// Does one effect; returns what that produced for the core, if anything.
    async fn execute(&mut self, link: &mut Option<Link>, effect: Effect) -> Option<Input> {
        let agent = self.agent;
        match effect {
            Effect::Connect {
                server,
                timeout,
                idle_timeout,
            } => {
                if let Some(old) = link.take() {
                    old.close(b"reconnecting");
                }
                let attempt = connect(agent, &mut self.endpoint, &server, idle_timeout);
                match tokio::time::timeout(timeout, attempt).await {
                    Ok(Ok(connected)) => {
                        *link = Some(connected);
                        Some(Input::Connected)
                    }
                    Ok(Err(error)) => Some(Input::ConnectFailed(format!("{error:#}"))),
                    Err(_) => Some(Input::ConnectFailed(format!(
                        "connect timed out after {} s",
                        timeout.as_secs_f64()
                    ))),
                }
            }
            Effect::Established { region } => {
                let link = link.as_mut()?;
                tracing::info!(%region, server = %link.address, "connected to the control plane");
                *lock(&agent.server.connection) = Some(link.connection.clone());
                agent.server.path_alive();
                agent
                    .server
                    .metrics
                    .counter(
                        "nephele_agent_sessions_total",
                        "Sessions established with the control plane.",
                        &[],
                    )
                    .inc();
                // Requests the region sends us (pool role) arrive on streams it opens.
                let connection = link.connection.clone();
                let serving = agent.clone();
                link.tasks.push(tokio::spawn(async move {
                    while let Ok((send, recv)) = connection.accept_bi().await {
                        let agent = serving.clone();
                        tokio::spawn(async move {
                            crate::agent::serve_cloud_stream(agent, send, recv).await
                        });
                    }
                }));
                link.tasks.push(tokio::spawn(crate::renewal::keep_renewed(
                    agent.clone(),
                    link.connection.clone(),
                )));
                None
            }
            Effect::SendHeartbeat { seq } => {
                let link = link.as_mut()?;
                // Acknowledgements since the last beat: the path works again even if
                // offloads failed on it (a partition healed on the same session).
                let acks = link.connection.stats().frame_rx.acks;
                if acks > link.acks_seen {
                    link.acks_seen = acks;
                    agent.server.path_alive();
                }
                let beat = AgentMessage::Heartbeat(Heartbeat {
                    seq,
                    uptime_ms: agent.started.elapsed().as_millis() as u64,
                    applied_generation: agent.applied_generation.load(Ordering::Relaxed),
                    rss_bytes: crate::agent::rss_bytes(),
                    deployments: agent.server.telemetry(),
                    link: LinkReport {
                        rtt_us: link.connection.rtt().as_micros() as u64,
                        bandwidth_bps: agent.link_bps.load(Ordering::Relaxed),
                    },
                    jobs: agent.job_statuses(),
                });
                if let Err(error) = write_frame(&mut link.send, &beat).await {
                    return Some(Input::WriteFailed(format!("heartbeat: {error}")));
                }
                // Usage not counted yet goes with every beat until it is acknowledged
                // (counted once by its sequence number, however often it is sent).
                let report = lock(&agent.usage).report();
                if let Some(report) = report {
                    if let Err(error) =
                        write_frame(&mut link.send, &AgentMessage::Usage(report)).await
                    {
                        return Some(Input::WriteFailed(format!("usage: {error}")));
                    }
                }
                None
            }
            Effect::SendNotice { seconds } => {
                let link = link.as_mut()?;
                let notice = AgentMessage::Notice(InterruptionNotice {
                    seconds,
                    source: "SIGUSR1".into(),
                });
                write_frame(&mut link.send, &notice)
                    .await
                    .err()
                    .map(|error| Input::WriteFailed(format!("interruption notice: {error}")))
            }
            Effect::Apply(desired) => {
                // Jobs act now, whatever the model reconciler is busy with.
                match &agent.jobs {
                    Some(runner) => runner.set_desired(desired.jobs.clone()),
                    None if !desired.jobs.is_empty() && !self.warned_edge_jobs => {
                        self.warned_edge_jobs = true;
                        tracing::warn!(members = desired.jobs.len(), "the control plane sent job members to an edge agent; only pool agents run jobs");
                    }
                    None => {}
                }
                let _ = self.desired_tx.send(Some(desired));
                None
            }
            Effect::AckUsage { up_to } => {
                if lock(&agent.usage).ack(up_to) {
                    agent.usage_changed.notify_one();
                }
                None
            }
            Effect::MarkRemoved { reason } => {
                mark_removed(agent, self.desired_tx, &reason);
                None
            }
            Effect::ClearRemoved => {
                // Accepted again (the removal was undone): a member of the fleet once more.
                agent.server.set_removed(None);
                let _ = std::fs::remove_file(
                    agent
                        .enrolment
                        .data_dir
                        .join(crate::persisted::REMOVED_FILE),
                );
                None
            }
            Effect::Close {
                reason,
                established,
                retry_in,
            } => {
                *lock(&agent.server.connection) = None;
                if let Some(old) = link.take() {
                    old.close(b"session ended");
                }
                let retry_in_ms = retry_in.as_millis() as u64;
                if established {
                    tracing::warn!(%reason, retry_in_ms, "session ended; reconnecting");
                } else {
                    tracing::warn!(error = %reason, retry_in_ms, "cannot reach the control plane");
                    if !self.told_expired {
                        if let Some(advice) = crate::renewal::expired_advice(agent) {
                            tracing::error!("{advice}");
                            self.told_expired = true;
                        }
                    }
                }
                None
            }
        }
    }
}

/// Dials `server`, opens the control stream and sends `Hello`.
/// The client endpoint for `address`: the one kept from earlier attempts when it is of
/// the address's family, else a new one, kept for the next attempts.
fn endpoint_for(
    kept: &mut Option<quinn::Endpoint>,
    address: std::net::SocketAddr,
) -> Result<quinn::Endpoint> {
    if let Some(endpoint) = kept {
        if endpoint
            .local_addr()
            .is_ok_and(|local| local.is_ipv4() == address.is_ipv4())
        {
            return Ok(endpoint.clone());
        }
    }
    let endpoint = nephele_net::client_endpoint(address)?;
    *kept = Some(endpoint.clone());
    Ok(endpoint)
}

async fn connect(
    agent: &Arc<Agent>,
    kept: &mut Option<quinn::Endpoint>,
    server: &str,
    idle_timeout: Duration,
) -> Result<Link> {
    let config = &agent.enrolment.config;
    let address = crate::enrol::resolve(server).await?;
    let endpoint = endpoint_for(kept, address)?;
    let (cert_der, key_der) = agent.identity();
    let mut client_config =
        nephele_net::mtls_client_config(&agent.enrolment.ca_der, &cert_der, &key_der)?;
    nephele_net::set_idle_timeout(&mut client_config, idle_timeout);
    let connection = endpoint
        .connect_with(client_config, address, nephele_net::SERVER_NAME)?
        .await
        .context("QUIC/TLS connection failed")?;
    let (mut send, recv) = connection.open_bi().await?;
    let cached: Vec<[u8; 32]> = agent
        .server
        .deployments
        .read()
        .unwrap_or_else(|p| p.into_inner())
        .values()
        .map(|d| d.model_digest)
        .collect();
    write_frame(
        &mut send,
        &AgentMessage::Hello(Hello {
            protocol_version: PROTOCOL_VERSION,
            agent_version: env!("CARGO_PKG_VERSION").into(),
            role: config.role.clone(),
            profile_name: agent.profile_name.clone(),
            profile_toml: agent.profile_toml.clone(),
            models_cached: cached,
            local_endpoint: agent.local_endpoint.clone(),
            node: agent.node.clone(),
            jobs: agent.job_statuses(),
        }),
    )
    .await?;
    Ok(Link {
        connection,
        address,
        send,
        control: FrameReader::new(recv, MAX_FRAME_BYTES),
        tasks: Vec::new(),
        acks_seen: 0,
    })
}

/// The control plane removed this device (deleted, or its certificate superseded):
/// it stops serving and running jobs, forgets its desired state, and keeps the reason
/// (across restarts) for its local endpoint to give.
fn mark_removed(agent: &Agent, desired_tx: &watch::Sender<Option<DesiredState>>, reason: &str) {
    if agent.server.removed().as_deref() == Some(reason) {
        return;
    }
    tracing::error!(%reason, "the control plane removed this device from the fleet; it stops serving");
    // Nothing is served from now on, not even until the reconciler has run.
    let server = &agent.server;
    server
        .deployments
        .write()
        .unwrap_or_else(|p| p.into_inner())
        .clear();
    server
        .graphs
        .write()
        .unwrap_or_else(|p| p.into_inner())
        .clear();
    lock(&server.phases).clear();
    // Durable before it is announced: once the endpoint answers 410, a kill -9 or a
    // power cut must not bring the device back serving its kept desired state.
    if let Err(error) = crate::persisted::save_removed(&agent.enrolment.data_dir, reason) {
        tracing::warn!(error = %format!("{error:#}"), "cannot keep the removal on this device");
    }
    server.set_removed(Some(reason.to_string()));
    if let Some(runner) = &agent.jobs {
        runner.set_desired(Vec::new());
    }
    // Level-triggered: the empty state unloads every deployment and is kept as such.
    let _ = desired_tx.send(Some(DesiredState {
        generation: 0,
        assignments: Vec::new(),
        jobs: Vec::new(),
    }));
}
