//! The tracer a process holds, and the thread that exports its spans.
//!
//! Spans go into a bounded queue (never waiting: a full queue drops the span and counts
//! it); a thread of its own, with its own single-threaded runtime, takes them in
//! batches (up to [`BATCH`] spans, or whatever came within [`INTERVAL`]) and sends each
//! batch as one OTLP export (gRPC or HTTP, as configured), trying a retryable failure again twice before
//! dropping the batch (counted, and said in the log at most once a minute). The
//! thread is independent of the process's own runtimes (actix's arbiters, the agent's
//! tokio), so a slow collector never slows a request.

use std::sync::mpsc::{self, Receiver, RecvTimeoutError, SyncSender, TrySendError};
use std::sync::Arc;
use std::time::{Duration, Instant};

use nephele_telemetry::{Counter, Registry};

use crate::call::CallError;
use crate::context::TraceContext;
use crate::otlp;
use crate::sampler::Sampler;
use crate::settings::{Endpoint, Protocol, Settings};
use crate::span::{Span, SpanData, SpanKind, Value};

/// Spans waiting for export at most; more are dropped (counted).
pub const QUEUE: usize = 4096;
/// Spans per export at most.
pub const BATCH: usize = 512;
/// How long a span waits for its batch at most.
pub const INTERVAL: Duration = Duration::from_secs(1);
/// Waits before the second and third try of a failed export.
const RETRY_AFTER: [Duration; 2] = [Duration::from_millis(200), Duration::from_secs(1)];

enum Message {
    Span(Box<SpanData>),
    Flush(mpsc::Sender<()>),
}

/// What spans hold to hand themselves in.
pub(crate) struct Shared {
    queue: SyncSender<Message>,
    sampler: Sampler,
    dropped_full: Arc<Counter>,
}

impl Shared {
    pub(crate) fn submit(&self, data: SpanData) {
        match self.queue.try_send(Message::Span(Box::new(data))) {
            Ok(()) => {}
            Err(TrySendError::Full(_)) | Err(TrySendError::Disconnected(_)) => {
                self.dropped_full.inc()
            }
        }
    }
}

/// Makes spans. Cheap to clone; the default is off (spans record nothing but still
/// carry their caller's context to the next hop).
#[derive(Clone, Default)]
pub struct Tracer {
    shared: Option<Arc<Shared>>,
}

impl Tracer {
    /// Tracing off.
    pub fn disabled() -> Tracer {
        Tracer::default()
    }

    /// Starts the export thread for `settings`; `resource` names this process (its
    /// instance, role, region), after the service name and the settings' own.
    /// Counters go to `metrics`.
    pub fn start(
        settings: Settings,
        resource: Vec<(String, Value)>,
        metrics: &Registry,
    ) -> std::io::Result<Tracer> {
        let (queue, spans) = mpsc::sync_channel(QUEUE);
        let help = "Spans not exported, by reason (queue_full: more than the export queue holds; export_failed: the collector did not take them).";
        let counters = Counters {
            exported: metrics.counter(
                "nephele_trace_spans_exported_total",
                "Spans the OTLP collector accepted.",
                &[],
            ),
            failed: metrics.counter(
                "nephele_trace_spans_dropped_total",
                help,
                &[("reason", "export_failed")],
            ),
            rejected: metrics.counter(
                "nephele_trace_spans_dropped_total",
                help,
                &[("reason", "rejected")],
            ),
        };
        let dropped_full = metrics.counter(
            "nephele_trace_spans_dropped_total",
            help,
            &[("reason", "queue_full")],
        );
        let mut all = vec![
            (
                "service.name".to_string(),
                Value::Str(settings.service_name.clone()),
            ),
            (
                "telemetry.sdk.name".to_string(),
                Value::from("nephele-otel"),
            ),
            ("telemetry.sdk.language".to_string(), Value::from("rust")),
        ];
        for (key, value) in settings.resource.iter().cloned().chain(resource) {
            if !all.iter().any(|(k, _)| *k == key) {
                all.push((key, value));
            }
        }
        let sampler = Sampler::new(settings.sample_ratio);
        std::thread::Builder::new()
            .name("otlp-export".into())
            .spawn(move || export_loop(spans, settings, all, counters))?;
        Ok(Tracer {
            shared: Some(Arc::new(Shared {
                queue,
                sampler,
                dropped_full,
            })),
        })
    }

    /// Whether spans are recorded (a collector is configured).
    pub fn is_enabled(&self) -> bool {
        self.shared.is_some()
    }

    /// A span of `kind` whose parent is `parent`: from another process (`remote`, a
    /// `traceparent` header or a request frame) or from this one. Without a parent it
    /// starts a trace.
    pub fn span(
        &self,
        name: impl Into<String>,
        kind: SpanKind,
        parent: Option<TraceContext>,
        remote: bool,
    ) -> Span {
        let Some(shared) = &self.shared else {
            return Span::passthrough(parent);
        };
        let trace_id = parent.map(|p| p.trace_id).unwrap_or_else(new_trace_id);
        let sampled = shared.sampler.sample(&trace_id, parent.map(|p| p.sampled));
        let context = TraceContext {
            trace_id,
            span_id: new_span_id(),
            sampled,
        };
        if !sampled {
            return Span::unsampled(context);
        }
        Span::recording(
            shared.clone(),
            context,
            parent.map(|p| p.span_id),
            remote && parent.is_some(),
            name.into(),
            kind,
        )
    }

    /// A span handling a request from another process.
    pub fn server(&self, name: impl Into<String>, parent: Option<TraceContext>) -> Span {
        self.span(name, SpanKind::Server, parent, true)
    }

    /// A span of this process under `parent` (a span of this process too).
    pub fn child(&self, parent: &Span, name: impl Into<String>, kind: SpanKind) -> Span {
        self.span(name, kind, parent.context(), false)
    }

    /// Waits (at most `timeout`) until every span recorded so far was exported or
    /// given up on. For a process about to exit.
    pub fn flush(&self, timeout: Duration) -> bool {
        let Some(shared) = &self.shared else {
            return true;
        };
        let (done, wait) = mpsc::channel();
        if shared.queue.send(Message::Flush(done)).is_err() {
            return false;
        }
        wait.recv_timeout(timeout).is_ok()
    }
}

fn new_trace_id() -> [u8; 16] {
    loop {
        let id: [u8; 16] = rand::random();
        if id != [0; 16] {
            return id;
        }
    }
}

fn new_span_id() -> [u8; 8] {
    loop {
        let id: [u8; 8] = rand::random();
        if id != [0; 8] {
            return id;
        }
    }
}

struct Counters {
    exported: Arc<Counter>,
    failed: Arc<Counter>,
    rejected: Arc<Counter>,
}

fn export_loop(
    spans: Receiver<Message>,
    settings: Settings,
    resource: Vec<(String, Value)>,
    counters: Counters,
) {
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => {
            tracing::error!(%error, "trace export cannot start: no spans will be exported");
            return;
        }
    };
    let mut channel = Transport::new(settings.protocol, settings.endpoint.clone());
    let mut batch: Vec<SpanData> = Vec::with_capacity(BATCH);
    let mut deadline = Instant::now() + INTERVAL;
    let mut last_warning: Option<Instant> = None;
    let mut export = |batch: &mut Vec<SpanData>| {
        if batch.is_empty() {
            return;
        }
        let request = otlp::export_request(&resource, batch);
        let result = runtime.block_on(send(&mut channel, &request, settings.timeout));
        let n = batch.len() as u64;
        match result {
            Ok(rejected) => {
                counters.exported.add(n.saturating_sub(rejected));
                counters.rejected.add(rejected);
            }
            Err(error) => {
                counters.failed.add(n);
                if last_warning.is_none_or(|at| at.elapsed() > Duration::from_secs(60)) {
                    last_warning = Some(Instant::now());
                    tracing::warn!(collector = %settings.endpoint.authority(), protocol = settings.protocol.label(), %error, spans = n, "trace export failed; spans dropped (said at most once a minute; see nephele_trace_spans_dropped_total)");
                }
            }
        }
        batch.clear();
    };
    loop {
        let wait = deadline.saturating_duration_since(Instant::now());
        match spans.recv_timeout(wait) {
            Ok(Message::Span(span)) => {
                batch.push(*span);
                if batch.len() >= BATCH {
                    export(&mut batch);
                    deadline = Instant::now() + INTERVAL;
                }
            }
            Ok(Message::Flush(done)) => {
                // What was queued before the flush request came first.
                while let Ok(message) = spans.try_recv() {
                    match message {
                        Message::Span(span) => {
                            batch.push(*span);
                            if batch.len() >= BATCH {
                                export(&mut batch);
                            }
                        }
                        Message::Flush(other) => {
                            let _ = other.send(());
                        }
                    }
                }
                export(&mut batch);
                let _ = done.send(());
            }
            Err(RecvTimeoutError::Timeout) => {
                export(&mut batch);
                deadline = Instant::now() + INTERVAL;
            }
            Err(RecvTimeoutError::Disconnected) => {
                export(&mut batch);
                return;
            }
        }
    }
}

/// The connection to the collector, in the configured protocol.
enum Transport {
    #[cfg(feature = "grpc")]
    Grpc(crate::grpc::Channel),
    Http(crate::http::Channel),
}

impl Transport {
    fn new(protocol: Protocol, endpoint: Endpoint) -> Transport {
        match protocol {
            #[cfg(feature = "grpc")]
            Protocol::Grpc => Transport::Grpc(crate::grpc::Channel::new(endpoint)),
            // `Settings::resolve` refuses gRPC in a build without it.
            #[cfg(not(feature = "grpc"))]
            Protocol::Grpc => Transport::Http(crate::http::Channel::new(endpoint)),
            Protocol::HttpProtobuf => Transport::Http(crate::http::Channel::new(endpoint)),
        }
    }

    /// One export request; the answer's `ExportTraceServiceResponse` bytes.
    async fn export(&mut self, request: &[u8]) -> Result<bytes::Bytes, CallError> {
        match self {
            #[cfg(feature = "grpc")]
            Transport::Grpc(channel) => channel.unary(otlp::EXPORT_PATH, request).await,
            Transport::Http(channel) => channel.export(request).await,
        }
    }
}

/// One batch, tried up to three times; the number of spans the collector rejected.
async fn send(
    channel: &mut Transport,
    request: &[u8],
    timeout: Duration,
) -> Result<u64, CallError> {
    let mut tries = RETRY_AFTER.iter();
    loop {
        let result = tokio::time::timeout(timeout, channel.export(request))
            .await
            .unwrap_or_else(|_| {
                Err(CallError::Transport(format!(
                    "no answer within {} ms",
                    timeout.as_millis()
                )))
            });
        match result {
            Ok(answer) => {
                use prost::Message as _;
                let rejected = otlp::ExportTraceServiceResponse::decode(answer)
                    .ok()
                    .and_then(|a| a.partial_success)
                    .map(|p| p.rejected_spans.max(0) as u64)
                    .unwrap_or(0);
                return Ok(rejected);
            }
            Err(error) if error.retryable() => match tries.next() {
                Some(pause) => tokio::time::sleep(*pause).await,
                None => return Err(error),
            },
            Err(error) => return Err(error),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_disabled_tracer_passes_its_callers_context_on() {
        let tracer = Tracer::disabled();
        let caller = TraceContext {
            trace_id: [5; 16],
            span_id: [6; 8],
            sampled: true,
        };
        let span = tracer.server("infer", Some(caller));
        assert!(!span.is_recording());
        assert_eq!(span.context(), Some(caller));
        let child = tracer.child(&span, "offload", SpanKind::Client);
        assert_eq!(child.context(), Some(caller));
        assert_eq!(tracer.server("infer", None).context(), None);
    }

    #[test]
    fn a_collector_that_is_down_loses_spans_counted_and_never_blocks_a_request() {
        // A port nothing listens on.
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map(|a| a.port())
            .expect("a free port");
        let settings = Settings::resolve(
            Some(&format!("http://127.0.0.1:{port}")),
            None,
            None,
            "test",
            &|_| None,
        )
        .expect("valid")
        .expect("on");
        let metrics = Registry::new();
        let tracer = Tracer::start(settings, Vec::new(), &metrics).expect("started");
        let total = QUEUE + 1000;
        for i in 0..total {
            let mut span = tracer.server("infer", None);
            assert!(span.is_recording());
            span.set("i", i);
        }
        assert!(tracer.flush(Duration::from_secs(30)), "the flush ends");
        let read = |reason: &str| {
            metrics
                .counter(
                    "nephele_trace_spans_dropped_total",
                    "",
                    &[("reason", reason)],
                )
                .get()
        };
        let exported = metrics
            .counter("nephele_trace_spans_exported_total", "", &[])
            .get();
        assert_eq!(exported, 0);
        assert!(
            read("queue_full") > 0,
            "more than the queue holds was dropped"
        );
        assert_eq!(
            read("queue_full") + read("export_failed"),
            total as u64,
            "every span is accounted for"
        );
    }

    /// One request a collector was sent: its path, content type and body.
    type Received = (String, String, Vec<u8>);

    /// A real OTLP/HTTP collector on loopback (hyper's server): answers each export
    /// with the next status of `answers` (then 200), keeping what it was sent.
    struct Collector {
        port: u16,
        received: Arc<std::sync::Mutex<Vec<Received>>>,
        connections: Arc<std::sync::atomic::AtomicUsize>,
        _runtime: tokio::runtime::Runtime,
    }

    impl Collector {
        fn start(answers: Vec<u16>) -> Collector {
            use http_body_util::{BodyExt as _, Full};
            let runtime = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(1)
                .enable_all()
                .build()
                .expect("runtime");
            let listener = runtime
                .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
                .expect("bind");
            let port = listener.local_addr().expect("addr").port();
            let received = Arc::new(std::sync::Mutex::new(Vec::new()));
            let answers = Arc::new(std::sync::Mutex::new(answers.into_iter()));
            let kept = received.clone();
            let connections = Arc::new(std::sync::atomic::AtomicUsize::new(0));
            let accepted = connections.clone();
            runtime.spawn(async move {
                while let Ok((tcp, _)) = listener.accept().await {
                    accepted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                    let (kept, answers) = (kept.clone(), answers.clone());
                    tokio::spawn(async move {
                        let service = hyper::service::service_fn(
                            move |request: http::Request<hyper::body::Incoming>| {
                                let (kept, answers) = (kept.clone(), answers.clone());
                                async move {
                                    let path = request.uri().path().to_string();
                                    let kind = request
                                        .headers()
                                        .get("content-type")
                                        .and_then(|v| v.to_str().ok())
                                        .unwrap_or_default()
                                        .to_string();
                                    let body = request.into_body().collect().await?.to_bytes();
                                    kept.lock().expect("lock").push((path, kind, body.to_vec()));
                                    let status =
                                        answers.lock().expect("lock").next().unwrap_or(200);
                                    let answer = if status == 200 {
                                        use prost::Message as _;
                                        otlp::ExportTraceServiceResponse::default().encode_to_vec()
                                    } else {
                                        b"try later".to_vec()
                                    };
                                    http::Response::builder()
                                        .status(status)
                                        .header(
                                            "content-type",
                                            if status == 200 {
                                                "application/x-protobuf"
                                            } else {
                                                "text/plain"
                                            },
                                        )
                                        .body(Full::new(bytes::Bytes::from(answer)))
                                        .map(Ok::<_, hyper::Error>)
                                        .expect("a well-formed answer")
                                }
                            },
                        );
                        let _ = hyper::server::conn::http1::Builder::new()
                            .serve_connection(hyper_util::rt::TokioIo::new(tcp), service)
                            .await;
                    });
                }
            });
            Collector {
                port,
                received,
                connections,
                _runtime: runtime,
            }
        }
    }

    fn http_tracer(port: u16, metrics: &Registry) -> Tracer {
        let settings = Settings::resolve(
            Some(&format!("http://127.0.0.1:{port}")),
            Some("http/protobuf"),
            None,
            "test",
            &|_| None,
        )
        .expect("valid")
        .expect("on");
        Tracer::start(settings, Vec::new(), metrics).expect("started")
    }

    #[test]
    fn over_otlp_http_spans_reach_the_collector_as_protobuf_on_one_connection() {
        use prost::Message as _;
        let collector = Collector::start(vec![503]);
        let metrics = Registry::new();
        let tracer = http_tracer(collector.port, &metrics);
        for round in 0..2 {
            for i in 0..3 {
                let mut span = tracer.server(format!("infer-{round}-{i}"), None);
                span.set("i", i as u64);
            }
            assert!(tracer.flush(Duration::from_secs(30)), "the flush ends");
        }
        let received = collector.received.lock().expect("lock").clone();
        // The first export was answered 503 (retryable) and sent again.
        assert_eq!(received.len(), 3, "{received:?}");
        let mut names = Vec::new();
        for (path, kind, body) in &received[1..] {
            assert_eq!(path, "/v1/traces");
            assert_eq!(kind, "application/x-protobuf");
            let request = otlp::ExportTraceServiceRequest::decode(body.as_slice()).expect("OTLP");
            for resource in &request.resource_spans {
                for scope in &resource.scope_spans {
                    names.extend(scope.spans.iter().map(|s| s.name.clone()));
                }
            }
        }
        assert_eq!(
            collector
                .connections
                .load(std::sync::atomic::Ordering::SeqCst),
            1,
            "the connection is kept between exports"
        );
        names.sort();
        assert_eq!(names.len(), 6, "{names:?}");
        assert_eq!(names[0], "infer-0-0");
        assert_eq!(
            metrics
                .counter("nephele_trace_spans_exported_total", "", &[])
                .get(),
            6
        );
    }

    #[test]
    fn over_otlp_http_a_refused_export_is_counted_and_not_sent_again() {
        let collector = Collector::start(vec![400]);
        let metrics = Registry::new();
        let tracer = http_tracer(collector.port, &metrics);
        drop(tracer.server("refused", None));
        assert!(tracer.flush(Duration::from_secs(30)), "the flush ends");
        assert_eq!(
            collector.received.lock().expect("lock").len(),
            1,
            "not retried"
        );
        assert_eq!(
            metrics
                .counter(
                    "nephele_trace_spans_dropped_total",
                    "",
                    &[("reason", "export_failed")]
                )
                .get(),
            1
        );
    }
}
