//! The QUIC gateway: accepts agent connections and turns streams into actor messages.
//!
//! | peer presented          | allowed                                                |
//! |-------------------------|--------------------------------------------------------|
//! | no certificate          | one join stream (`JoinRequest` → `JoinResponse`)       |
//! | certificate from the CA | control stream (Hello, heartbeats) and request streams |
//! | any other certificate   | nothing: the TLS handshake fails                       |
//!
//! A malformed or oversized frame on a request stream gets an error frame and closes
//! that stream only; on the control stream it closes that agent's connection. Either
//! way the reason is logged and counted, and no other agent is affected.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use actix::Addr;
use nephele_net::{peer_identity, read_frame, write_frame, NetError, PeerIdentity};
use nephele_proto::{
    AgentMessage, CloudMessage, ErrorCode, ErrorFrame, JoinRequest, JoinResponse, RequestBody,
    StreamRequest, StreamResponse, CHUNK_BYTES, MAX_FRAME_BYTES, PROTOCOL_VERSION,
};
use nephele_telemetry::Registry;

use crate::federation::{AgentConnected, AgentDisconnected, AgentHeartbeat, FederationActor, Join};
use crate::region::{Pick, PickPool, PoolLease, RegionActor};

/// Close codes on agent connections.
pub const CLOSE_NORMAL: u32 = 0;
pub const CLOSE_PROTOCOL_VIOLATION: u32 = 2;
pub const CLOSE_REFUSED: u32 = 3;

const CONTROL_FRAME_LIMIT: usize = 1024 * 1024;
const JOIN_FRAME_LIMIT: usize = 64 * 1024;
/// Certificate-less connections (joins) handled at once; more are closed at once.
pub const MAX_JOINS_IN_PROGRESS: usize = 64;
/// Of those, from one IP address: one address cannot take every place (a site behind
/// one NAT enrolling many devices at once retries the ones refused).
pub const MAX_JOINS_PER_ADDRESS: usize = 8;
/// How long a peer has to send a whole first frame (a join request, a Hello, a
/// request on a stream it opened) before the stream or connection is closed.
const FIRST_FRAME_TIMEOUT: Duration = Duration::from_secs(10);
/// How long an agent has to send a whole request on a stream it opened.
const REQUEST_READ_TIMEOUT: Duration = Duration::from_secs(30);

pub struct Gateway {
    pub federation: Addr<FederationActor>,
    pub regions: HashMap<String, Addr<RegionActor>>,
    pub blob_dir: PathBuf,
    pub metrics: Registry,
    /// Certificate-less connections being handled now ([`MAX_JOINS_IN_PROGRESS`]).
    pub joins_in_progress: std::sync::atomic::AtomicUsize,
    /// The same, by remote IP address ([`MAX_JOINS_PER_ADDRESS`]).
    pub joins_by_address: std::sync::Mutex<HashMap<std::net::IpAddr, usize>>,
    /// Spans of offloaded requests (the region's part of a device's trace).
    pub tracer: nephele_otel::Tracer,
}

/// Holds one place among one address's joins in progress; gives it back when dropped.
struct AddressPlace<'a> {
    places: &'a std::sync::Mutex<HashMap<std::net::IpAddr, usize>>,
    address: std::net::IpAddr,
}

impl<'a> AddressPlace<'a> {
    /// A place for `address`, and how many it held before.
    fn take(
        places: &'a std::sync::Mutex<HashMap<std::net::IpAddr, usize>>,
        address: std::net::IpAddr,
    ) -> (AddressPlace<'a>, usize) {
        let mut map = places.lock().unwrap_or_else(|p| p.into_inner());
        let held = map.entry(address).or_insert(0);
        let before = *held;
        *held += 1;
        (AddressPlace { places, address }, before)
    }
}

impl Drop for AddressPlace<'_> {
    fn drop(&mut self) {
        let mut map = self.places.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(held) = map.get_mut(&self.address) {
            *held = held.saturating_sub(1);
            if *held == 0 {
                map.remove(&self.address);
            }
        }
    }
}

/// Holds one place among the joins in progress; gives it back when dropped.
struct JoinPlace<'a>(&'a std::sync::atomic::AtomicUsize);

impl Drop for JoinPlace<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
    }
}

pub async fn run(endpoint: quinn::Endpoint, gateway: Arc<Gateway>) {
    while let Some(incoming) = endpoint.accept().await {
        let gateway = gateway.clone();
        tokio::spawn(async move {
            let remote = incoming.remote_address();
            match incoming.await {
                Ok(connection) => gateway.handle_connection(connection).await,
                Err(error) => {
                    gateway
                        .metrics
                        .counter("nephele_gateway_handshakes_failed_total", "QUIC/TLS handshakes that failed (e.g. a certificate not from the cluster CA).", &[])
                        .inc();
                    tracing::warn!(%remote, %error, "refused connection: handshake failed");
                }
            }
        });
    }
}

fn closed_reason(error: &NetError) -> String {
    error.to_string()
}

impl Gateway {
    async fn handle_connection(self: Arc<Self>, connection: quinn::Connection) {
        match peer_identity(&connection) {
            None => self.handle_join(connection).await,
            Some(identity) => self.handle_session(connection, identity).await,
        }
    }

    async fn handle_join(&self, connection: quinn::Connection) {
        let remote = connection.remote_address();
        // A peer without a certificate gets one stream, a small window, a bounded time
        // and one of a bounded number of places: holding connections open with half a
        // join request costs the control plane little and not for long.
        let (_address_place, from_address) =
            AddressPlace::take(&self.joins_by_address, remote.ip());
        if from_address >= MAX_JOINS_PER_ADDRESS {
            self.count_refused_join("busy_address");
            tracing::warn!(%remote, "closing unauthenticated connection: {MAX_JOINS_PER_ADDRESS} joins from this address in progress already");
            connection.close(
                CLOSE_REFUSED.into(),
                b"too many joins from this address in progress; retry",
            );
            return;
        }
        let busy = self
            .joins_in_progress
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let _place = JoinPlace(&self.joins_in_progress);
        if busy >= MAX_JOINS_IN_PROGRESS {
            self.count_refused_join("busy");
            tracing::warn!(%remote, "closing unauthenticated connection: {MAX_JOINS_IN_PROGRESS} joins in progress already");
            connection.close(CLOSE_REFUSED.into(), b"too many joins in progress; retry");
            return;
        }
        connection.set_receive_window(quinn::VarInt::from_u32(JOIN_FRAME_LIMIT as u32 * 2));
        let Ok(Ok((mut send, mut recv))) =
            tokio::time::timeout(FIRST_FRAME_TIMEOUT, connection.accept_bi()).await
        else {
            connection.close(CLOSE_REFUSED.into(), b"no join request");
            return;
        };
        connection.set_max_concurrent_bi_streams(quinn::VarInt::from_u32(0));
        let read = tokio::time::timeout(
            FIRST_FRAME_TIMEOUT,
            read_frame::<JoinRequest>(&mut recv, JOIN_FRAME_LIMIT),
        )
        .await;
        let Ok(read) = read else {
            self.count_refused_join("timeout");
            tracing::warn!(%remote, "closing unauthenticated connection: no whole join request within {FIRST_FRAME_TIMEOUT:?}");
            connection.close(CLOSE_REFUSED.into(), b"no whole join request in time");
            return;
        };
        let request: JoinRequest = match read {
            Ok(Some(request)) => request,
            Ok(None) => return,
            Err(error) => {
                tracing::warn!(%remote, %error, "closing unauthenticated connection: bad join request");
                connection.close(
                    CLOSE_PROTOCOL_VIOLATION.into(),
                    format!("bad join request: {error}").as_bytes(),
                );
                return;
            }
        };
        let response = match self.federation.send(Join(request)).await {
            Ok(Ok(accepted)) => JoinResponse::Accepted(accepted),
            Ok(Err(refused)) => JoinResponse::Refused(refused),
            Err(error) => {
                JoinResponse::Refused(ErrorFrame::new(ErrorCode::Internal, error.to_string()))
            }
        };
        let _ = write_frame(&mut send, &response).await;
        let _ = send.finish();
        // Let the agent read the answer and close; don't hold the connection forever.
        let _ = tokio::time::timeout(Duration::from_secs(5), connection.closed()).await;
    }

    async fn handle_session(
        self: Arc<Self>,
        connection: quinn::Connection,
        identity: PeerIdentity,
    ) {
        let name = identity.name.clone();
        let Ok(Ok((mut control_send, mut control_recv))) =
            tokio::time::timeout(Duration::from_secs(10), connection.accept_bi()).await
        else {
            connection.close(CLOSE_REFUSED.into(), b"no control stream");
            return;
        };
        let first = tokio::time::timeout(
            FIRST_FRAME_TIMEOUT,
            read_frame::<AgentMessage>(&mut control_recv, CONTROL_FRAME_LIMIT),
        )
        .await
        .unwrap_or(Err(NetError::Timeout("no whole Hello in time")));
        let hello = match first {
            Ok(Some(AgentMessage::Hello(hello))) => hello,
            Ok(Some(_)) | Ok(None) => {
                self.protocol_violation(
                    &connection,
                    &name,
                    "the first frame on the control stream must be Hello",
                );
                return;
            }
            Err(error) => {
                self.protocol_violation(&connection, &name, &closed_reason(&error));
                return;
            }
        };
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<Box<CloudMessage>>();
        let connected = self
            .federation
            .send(AgentConnected {
                identity,
                hello,
                tx,
                connection: connection.clone(),
            })
            .await;
        let (session_id, welcome, desired) = match connected {
            Ok(Ok(accepted)) => accepted,
            Ok(Err(refused)) => {
                tracing::warn!(device = %name, error = %refused, "session refused");
                let _ =
                    write_frame(&mut control_send, &CloudMessage::Refused(refused.clone())).await;
                let _ = control_send.finish();
                tokio::time::sleep(Duration::from_millis(200)).await;
                connection.close(CLOSE_REFUSED.into(), refused.message.as_bytes());
                return;
            }
            Err(error) => {
                connection.close(CLOSE_REFUSED.into(), error.to_string().as_bytes());
                return;
            }
        };
        let region = welcome.region.clone();
        let context = Arc::new(StreamContext {
            device: name.clone(),
            region,
            allowed: std::sync::RwLock::new(Allowed::of(&desired)),
        });
        if write_frame(&mut control_send, &CloudMessage::Welcome(welcome))
            .await
            .is_err()
            || write_frame(&mut control_send, &CloudMessage::DesiredState(desired))
                .await
                .is_err()
        {
            self.federation.do_send(AgentDisconnected {
                name,
                session_id,
                reason: "control stream broke during the greeting".into(),
            });
            return;
        }

        let writer_connection = connection.clone();
        let writer_context = context.clone();
        let writer = tokio::spawn(async move {
            while let Some(message) = rx.recv().await {
                let message = *message;
                let refused = matches!(message, CloudMessage::Refused(_));
                if let CloudMessage::DesiredState(desired) = &message {
                    writer_context.allow(desired);
                }
                if write_frame(&mut control_send, &message).await.is_err() {
                    return;
                }
                if refused {
                    tokio::time::sleep(Duration::from_millis(200)).await;
                    writer_connection.close(CLOSE_REFUSED.into(), b"device deleted");
                    return;
                }
            }
            // The federation replaced this session with a newer one.
            writer_connection.close(CLOSE_NORMAL.into(), b"replaced by a newer session");
        });

        let acceptor_connection = connection.clone();
        let acceptor_gateway = self.clone();
        let acceptor_context = context.clone();
        let acceptor = tokio::spawn(async move {
            while let Ok((send, recv)) = acceptor_connection.accept_bi().await {
                let gateway = acceptor_gateway.clone();
                let context = acceptor_context.clone();
                tokio::spawn(
                    async move { gateway.handle_request_stream(send, recv, context).await },
                );
            }
        });

        let reason = loop {
            match read_frame::<AgentMessage>(&mut control_recv, CONTROL_FRAME_LIMIT).await {
                Ok(Some(AgentMessage::Heartbeat(heartbeat))) => {
                    self.federation.do_send(AgentHeartbeat {
                        name: name.clone(),
                        session_id,
                        heartbeat,
                        received: Instant::now(),
                    })
                }
                Ok(Some(AgentMessage::Usage(report))) => {
                    self.federation
                        .do_send(crate::federation::usage::AgentUsage {
                            name: name.clone(),
                            session_id,
                            report,
                        })
                }
                Ok(Some(AgentMessage::Notice(notice))) => {
                    self.federation.do_send(crate::federation::AgentNotice {
                        name: name.clone(),
                        session_id,
                        notice,
                    })
                }
                Ok(Some(AgentMessage::Hello(_))) => {
                    let reason = "a second Hello on the control stream";
                    self.protocol_violation(&connection, &name, reason);
                    break reason.to_string();
                }
                Ok(None) => break "control stream finished".to_string(),
                Err(error) if error.is_protocol_violation() => {
                    let reason = closed_reason(&error);
                    self.protocol_violation(&connection, &name, &reason);
                    break reason;
                }
                Err(error) => break closed_reason(&error),
            }
        };
        writer.abort();
        acceptor.abort();
        self.federation.do_send(AgentDisconnected {
            name,
            session_id,
            reason,
        });
    }

    fn protocol_violation(&self, connection: &quinn::Connection, device: &str, reason: &str) {
        self.metrics
            .counter(
                "nephele_gateway_protocol_violations_total",
                "Frames refused as malformed, oversized or out of order.",
                &[("scope", "connection")],
            )
            .inc();
        tracing::warn!(%device, %reason, "closing agent connection: protocol violation");
        connection.close(
            CLOSE_PROTOCOL_VIOLATION.into(),
            format!("protocol violation: {reason}").as_bytes(),
        );
    }

    async fn handle_request_stream(
        self: Arc<Self>,
        mut send: quinn::SendStream,
        mut recv: quinn::RecvStream,
        context: Arc<StreamContext>,
    ) {
        let read = tokio::time::timeout(
            REQUEST_READ_TIMEOUT,
            read_frame::<StreamRequest>(&mut recv, MAX_FRAME_BYTES),
        )
        .await;
        let Ok(read) = read else {
            tracing::warn!(device = %context.device, "closing request stream: no whole request within {REQUEST_READ_TIMEOUT:?}");
            let _ = recv.stop(CLOSE_REFUSED.into());
            let _ = send.reset(CLOSE_REFUSED.into());
            return;
        };
        let request = match read {
            Ok(Some(request)) => request,
            Ok(None) => return,
            Err(error) => {
                self.metrics
                    .counter(
                        "nephele_gateway_protocol_violations_total",
                        "Frames refused as malformed, oversized or out of order.",
                        &[("scope", "stream")],
                    )
                    .inc();
                tracing::warn!(device = %context.device, %error, "closing request stream: bad frame");
                let _ = write_frame(
                    &mut send,
                    &StreamResponse::Error(ErrorFrame::new(
                        ErrorCode::BadRequest,
                        error.to_string(),
                    )),
                )
                .await;
                let _ = send.finish();
                let _ = recv.stop(1u32.into());
                return;
            }
        };
        let response = if request.protocol_version != PROTOCOL_VERSION {
            StreamResponse::Error(ErrorFrame::new(
                ErrorCode::VersionMismatch,
                format!(
                    "request uses protocol {}, gateway speaks {PROTOCOL_VERSION}",
                    request.protocol_version
                ),
            ))
        } else {
            match request.body {
                RequestBody::FetchChunk {
                    sha256,
                    offset,
                    len,
                } if context.may_fetch(&sha256) => self.read_chunk(sha256, offset, len).await,
                RequestBody::FetchChunk { sha256, .. } => {
                    self.refuse_unassigned(&context, "blob", &hex::encode(sha256))
                }
                RequestBody::Infer(infer) if context.may_offload(&infer.deployment) => {
                    self.offload(&context, infer).await
                }
                RequestBody::Infer(infer) => {
                    self.refuse_unassigned(&context, "deployment", &infer.deployment)
                }
                RequestBody::JobLogs { .. } => StreamResponse::Error(ErrorFrame::new(
                    ErrorCode::BadRequest,
                    "job logs are served by pool agents, not by the control plane",
                )),
                RequestBody::RenewCertificate { csr_der } => {
                    let renewed = self
                        .federation
                        .send(crate::federation::RenewCertificate {
                            device: context.device.clone(),
                            csr_der,
                        })
                        .await;
                    match renewed {
                        Ok(Ok(certificate_der)) => StreamResponse::Certificate { certificate_der },
                        Ok(Err(refused)) => StreamResponse::Error(refused),
                        Err(error) => StreamResponse::Error(ErrorFrame::new(
                            ErrorCode::Internal,
                            error.to_string(),
                        )),
                    }
                }
            }
        };
        let _ = write_frame(&mut send, &response).await;
        let _ = send.finish();
    }

    async fn read_chunk(&self, sha256: [u8; 32], offset: u64, len: u32) -> StreamResponse {
        use tokio::io::{AsyncReadExt as _, AsyncSeekExt as _};
        if len == 0 || len > 4 * CHUNK_BYTES {
            return StreamResponse::Error(ErrorFrame::new(
                ErrorCode::BadRequest,
                format!("chunk length must be 1..={}", 4 * CHUNK_BYTES),
            ));
        }
        let path = self.blob_dir.join(hex::encode(sha256));
        let result: std::io::Result<(u64, Vec<u8>)> = async {
            let mut file = tokio::fs::File::open(&path).await?;
            let total_size = file.metadata().await?.len();
            if offset > total_size {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::InvalidInput,
                    "offset beyond end of blob",
                ));
            }
            file.seek(std::io::SeekFrom::Start(offset)).await?;
            let want = (total_size - offset).min(u64::from(len)) as usize;
            let mut data = vec![0u8; want];
            file.read_exact(&mut data).await?;
            Ok((total_size, data))
        }
        .await;
        match result {
            Ok((total_size, data)) => {
                self.metrics
                    .counter(
                        "nephele_gateway_blob_bytes_sent_total",
                        "Model bytes sent to agents.",
                        &[],
                    )
                    .add(data.len() as u64);
                StreamResponse::Chunk { total_size, data }
            }
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => {
                StreamResponse::Error(ErrorFrame::new(
                    ErrorCode::NotFound,
                    format!("no blob {}", hex::encode(sha256)),
                ))
            }
            Err(error) => {
                StreamResponse::Error(ErrorFrame::new(ErrorCode::BadRequest, error.to_string()))
            }
        }
    }

    /// A replica of `deployment`: the agent's own region first, then any other
    /// (federated spill-over). Admission control of the first region that has a ready
    /// replica decides; a shed request is not sent elsewhere (that region is full by its
    /// own measure, and the device keeps serving locally).
    async fn pick_pool(
        &self,
        context: &StreamContext,
        deployment: &str,
        tried: &[String],
    ) -> Result<PoolLease, StreamResponse> {
        let mut order: Vec<&String> = self.regions.keys().collect();
        order.sort_by_key(|name| (**name != context.region, (*name).clone()));
        let mut why = Vec::new();
        for region in order {
            let mut exclude = vec![context.device.clone()];
            exclude.extend(tried.iter().cloned());
            let pick = PickPool {
                deployment: deployment.to_string(),
                exclude,
            };
            match self.regions[region].send(pick).await {
                Ok(Pick::Lease(lease)) => return Ok(lease),
                Ok(Pick::Shed {
                    retry_after_ms,
                    reason,
                }) => {
                    self.count_offload(region, "shed");
                    return Err(StreamResponse::Error(ErrorFrame::overloaded(
                        format!(
                            "region {region} sheds {deployment} ({reason}): more is offered than its replicas can serve in time; retry after {retry_after_ms} ms or serve locally"
                        ),
                        retry_after_ms,
                    )));
                }
                Ok(Pick::NoReplica(reason)) => why.push(reason),
                Err(error) => why.push(format!("region {region}: {error}")),
            }
        }
        self.count_offload(&context.region, "no_replica");
        Err(StreamResponse::Error(ErrorFrame::new(
            ErrorCode::Unavailable,
            if why.is_empty() {
                "no region has replicas".to_string()
            } else {
                why.join("; ")
            },
        )))
    }

    /// Sends the request to a replica and relays its answer. A replica whose stream or
    /// connection breaks before it answers is tried once more elsewhere: inference is
    /// idempotent, and the device gets exactly one answer, the one relayed.
    async fn offload(
        &self,
        context: &StreamContext,
        mut infer: nephele_proto::InferRequest,
    ) -> StreamResponse {
        use nephele_otel::{SpanKind, TraceContext};
        let started = Instant::now();
        let deployment = infer.deployment.clone();
        // The region's part of the device's trace: this span under the device's offload
        // span, the replica's under the one per attempt below.
        let caller = infer.trace.as_ref().and_then(TraceContext::from_wire);
        let mut span = self.tracer.server(format!("offload {deployment}"), caller);
        span.set("nephele.deployment", &deployment);
        span.set("nephele.device", &context.device);
        span.set("nephele.region", &context.region);
        let mut tried: Vec<String> = Vec::new();
        loop {
            let mut pick = self.tracer.child(&span, "pick replica", SpanKind::Internal);
            let lease = match self.pick_pool(context, &deployment, &tried).await {
                Ok(lease) => lease,
                Err(refused) => {
                    if let StreamResponse::Error(error) = &refused {
                        pick.fail(&error.message);
                        span.fail(&error.message);
                    }
                    return refused;
                }
            };
            pick.set("nephele.replica", &lease.name);
            pick.end();
            let mut attempt =
                self.tracer
                    .child(&span, format!("replica {deployment}"), SpanKind::Client);
            attempt.set("nephele.replica", &lease.name);
            attempt.set("nephele.attempt", tried.len() + 1);
            infer.trace = attempt.context().map(|c| c.to_wire());
            let attempt_started = Instant::now();
            let forwarded = forward(&lease.connection, infer.clone()).await;
            if let Err(error) = &forwarded {
                attempt.fail(error);
            }
            if let Ok(StreamResponse::Error(error)) = &forwarded {
                attempt.fail(&error.message);
            }
            attempt.end();
            // A replica that just left (scaled in, drained) answers that it does not
            // serve the deployment: as retryable as a broken stream.
            let forwarded = match forwarded {
                Ok(StreamResponse::Error(error))
                    if matches!(error.code, ErrorCode::NotFound | ErrorCode::Unavailable) =>
                {
                    Err(NetError::Read(format!("replica answered {error}")))
                }
                other => other,
            };
            match forwarded {
                Ok(response) => {
                    let outcome = match &response {
                        StreamResponse::Inferred(_) => {
                            lease.record(attempt_started.elapsed());
                            "ok"
                        }
                        // The replica's queue is full: relayed with its Retry-After, so
                        // the device serves locally until then (not a failure).
                        StreamResponse::Error(error) if error.code == ErrorCode::Overloaded => {
                            "shed"
                        }
                        _ => "error",
                    };
                    span.set("nephele.outcome", outcome);
                    span.set("nephele.replica", &lease.name);
                    if let StreamResponse::Error(error) = &response {
                        span.fail(&error.message);
                    }
                    self.count_offload(&context.region, outcome);
                    self.metrics
                        .histogram(
                            "nephele_offload_latency_seconds",
                            "Gateway time for an offloaded request, pool round trip included.",
                            &[("region", &context.region)],
                            nephele_telemetry::LATENCY_BUCKETS,
                        )
                        .observe(started.elapsed().as_secs_f64());
                    return response;
                }
                Err(error) if tried.is_empty() => {
                    tracing::warn!(device = %context.device, pool = %lease.name, %deployment, %error, "replica failed; re-sending to another");
                    self.count_offload(&context.region, "resent");
                    tried.push(lease.name.clone());
                }
                Err(error) => {
                    span.fail(format!("pool replica {} failed: {error}", lease.name));
                    self.count_offload(&context.region, "error");
                    tracing::warn!(device = %context.device, pool = %lease.name, %deployment, %error, "offload failed");
                    return StreamResponse::Error(ErrorFrame::new(
                        ErrorCode::Unavailable,
                        format!("pool replica {} failed: {error}", lease.name),
                    ));
                }
            }
        }
    }

    /// A request for something this agent is not assigned: refused, logged, counted.
    fn refuse_unassigned(&self, context: &StreamContext, what: &str, name: &str) -> StreamResponse {
        self.metrics
            .counter(
                "nephele_gateway_unassigned_requests_total",
                "Agent requests refused for a blob or deployment the agent is not assigned.",
                &[("kind", what)],
            )
            .inc();
        tracing::warn!(device = %context.device, kind = what, name, "refused a request for something the agent is not assigned");
        StreamResponse::Error(ErrorFrame::new(
            ErrorCode::Unauthorized,
            format!("this agent is not assigned {what} {name}"),
        ))
    }

    fn count_refused_join(&self, reason: &str) {
        self.metrics
            .counter(
                "nephele_gateway_joins_refused_total",
                "Certificate-less connections closed before a join: too many at once, or too slow to send one.",
                &[("reason", reason)],
            )
            .inc();
    }

    fn count_offload(&self, region: &str, outcome: &str) {
        self.metrics
            .counter(
                "nephele_offloads_total",
                "Requests offloaded from agents to pool replicas, by outcome.",
                &[("region", region), ("outcome", outcome)],
            )
            .inc();
    }
}

struct StreamContext {
    device: String,
    region: String,
    /// What this agent's latest desired state lets it ask for.
    allowed: std::sync::RwLock<Allowed>,
}

/// What an agent may ask of the control plane on its request streams: offloads for
/// the deployments it is assigned, and the blobs of their models' variants (a split
/// variant's tail included). Replaced each time a desired state is sent to it, before
/// it is sent, so an agent never learns of a model it may not fetch yet.
#[derive(Debug, Default)]
struct Allowed {
    deployments: std::collections::HashSet<String>,
    blobs: std::collections::HashSet<nephele_proto::Digest>,
}

impl Allowed {
    fn of(desired: &nephele_proto::DesiredState) -> Allowed {
        let mut allowed = Allowed::default();
        for assignment in &desired.assignments {
            allowed.deployments.insert(assignment.deployment.clone());
            // The manifest's signature was made by this control plane; its variants
            // are what the agent will fetch.
            let Ok(manifest) = nephele_proto::decode_payload::<nephele_proto::ModelManifest>(
                &assignment.model.manifest,
            ) else {
                continue;
            };
            for variant in &manifest.variants {
                allowed.blobs.insert(variant.sha256);
                if let nephele_proto::VariantKind::Split { tail_sha256, .. } = &variant.kind {
                    allowed.blobs.insert(*tail_sha256);
                }
            }
        }
        allowed
    }
}

impl StreamContext {
    fn allow(&self, desired: &nephele_proto::DesiredState) {
        *self.allowed.write().unwrap_or_else(|p| p.into_inner()) = Allowed::of(desired);
    }

    fn may_offload(&self, deployment: &str) -> bool {
        self.allowed
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .deployments
            .contains(deployment)
    }

    fn may_fetch(&self, blob: &nephele_proto::Digest) -> bool {
        self.allowed
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .blobs
            .contains(blob)
    }
}

/// One request to a pool replica and its answer.
async fn forward(
    connection: &quinn::Connection,
    infer: nephele_proto::InferRequest,
) -> Result<StreamResponse, NetError> {
    let (mut pool_send, mut pool_recv) = connection
        .open_bi()
        .await
        .map_err(|e| NetError::Connect(e.to_string()))?;
    write_frame(
        &mut pool_send,
        &StreamRequest {
            protocol_version: PROTOCOL_VERSION,
            body: RequestBody::Infer(infer),
        },
    )
    .await?;
    let _ = pool_send.finish();
    tokio::time::timeout(
        Duration::from_secs(30),
        read_frame(&mut pool_recv, MAX_FRAME_BYTES),
    )
    .await
    .map_err(|_| NetError::Timeout("pool replica did not answer in 30 s"))?
    .and_then(|frame| frame.ok_or_else(|| NetError::Read("pool replica closed the stream".into())))
}
