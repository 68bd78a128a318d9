//! One OTLP/HTTP export: the encoded request POSTed as `application/x-protobuf` to the
//! collector's traces path, the answer's body (an `ExportTraceServiceResponse`) back.
//! HTTP/1.1 by hyper; the connection is kept between calls and made again after it
//! breaks or the collector closes it.

use bytes::Bytes;
use http_body_util::{BodyExt as _, Full, Limited};
use hyper::client::conn::http1::SendRequest;
use hyper_util::rt::TokioIo;

use crate::call::CallError;
use crate::settings::Endpoint;

/// The largest answer taken from a collector (an export answer is a few bytes).
const MAX_ANSWER_BYTES: usize = 1 << 20;
/// The most of a failed answer's text said in the log.
const MAX_MESSAGE_CHARS: usize = 200;

/// A connection to one OTLP/HTTP collector.
pub struct Channel {
    endpoint: Endpoint,
    send: Option<SendRequest<Full<Bytes>>>,
}

impl Channel {
    pub fn new(endpoint: Endpoint) -> Channel {
        Channel {
            endpoint,
            send: None,
        }
    }

    /// POSTs one encoded export request; the answer's body.
    pub async fn export(&mut self, message: &[u8]) -> Result<Bytes, CallError> {
        let result = self.call(message).await;
        if matches!(result, Err(CallError::Connect(_) | CallError::Transport(_))) {
            self.send = None;
        }
        result
    }

    async fn connect(&mut self) -> Result<SendRequest<Full<Bytes>>, CallError> {
        if let Some(send) = self.send.take() {
            if !send.is_closed() {
                return Ok(send);
            }
        }
        let tcp = tokio::net::TcpStream::connect((self.endpoint.host.as_str(), self.endpoint.port))
            .await
            .map_err(|e| CallError::Connect(format!("{}: {e}", self.endpoint.authority())))?;
        let _ = tcp.set_nodelay(true);
        let (send, connection) = hyper::client::conn::http1::handshake(TokioIo::new(tcp))
            .await
            .map_err(|e| CallError::Connect(format!("HTTP/1.1: {e}")))?;
        tokio::spawn(async move {
            let _ = connection.await;
        });
        Ok(send)
    }

    async fn call(&mut self, message: &[u8]) -> Result<Bytes, CallError> {
        let transport = |e: hyper::Error| CallError::Transport(e.to_string());
        let mut send = self.connect().await?;
        send.ready().await.map_err(transport)?;
        let request = http::Request::builder()
            .method("POST")
            .uri(self.endpoint.path.as_str())
            .header(http::header::HOST, self.endpoint.authority())
            .header(http::header::CONTENT_TYPE, "application/x-protobuf")
            .header(
                http::header::USER_AGENT,
                concat!("nephele-otel/", env!("CARGO_PKG_VERSION")),
            )
            .body(Full::new(Bytes::copy_from_slice(message)))
            .map_err(|e| CallError::Transport(e.to_string()))?;
        let answer = send.send_request(request).await.map_err(transport)?;
        // Kept for the next call only once this one has been answered in full.
        let status = answer.status();
        let is_protobuf = answer
            .headers()
            .get(http::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.starts_with("application/x-protobuf"));
        let body = Limited::new(answer.into_body(), MAX_ANSWER_BYTES)
            .collect()
            .await
            .map_err(|e| CallError::Transport(format!("reading the answer: {e}")))?
            .to_bytes();
        self.send = Some(send);
        if status.is_success() {
            return Ok(if is_protobuf { body } else { Bytes::new() });
        }
        let message = failure_message(&body, is_protobuf);
        let message = if status == http::StatusCode::NOT_FOUND && message.is_empty() {
            format!(
                "nothing at {} (is it an OTLP/HTTP port? OTLP/HTTP is usually 4318, OTLP/gRPC 4317)",
                self.endpoint.url()
            )
        } else {
            message
        };
        Err(CallError::Http {
            status: status.as_u16(),
            message,
        })
    }
}

/// What a failed answer says: the `google.rpc.Status` message of a protobuf body, or
/// the start of a text one.
fn failure_message(body: &[u8], is_protobuf: bool) -> String {
    use prost::Message as _;
    if is_protobuf {
        return crate::otlp::RpcStatus::decode(body)
            .map(|status| status.message)
            .unwrap_or_default();
    }
    String::from_utf8_lossy(body)
        .trim()
        .chars()
        .take(MAX_MESSAGE_CHARS)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failed_answer_says_what_the_collector_said() {
        use prost::Message as _;
        let status = crate::otlp::RpcStatus {
            code: 3,
            message: "span 4 has no name".into(),
        };
        assert_eq!(
            failure_message(&status.encode_to_vec(), true),
            "span 4 has no name"
        );
        assert_eq!(failure_message(b"\xff\xff\xff", true), "");
        assert_eq!(
            failure_message(b"  quota exceeded\n", false),
            "quota exceeded"
        );
        assert_eq!(
            failure_message("x".repeat(1000).as_bytes(), false).len(),
            MAX_MESSAGE_CHARS
        );
    }
}
