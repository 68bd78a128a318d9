//! One gRPC unary call over HTTP/2 (h2), which is all OTLP export needs: a
//! length-prefixed protobuf message up, one message and the `grpc-status` trailer
//! down. The connection is kept between calls and made again after it breaks.

use bytes::{BufMut as _, Bytes, BytesMut};

use crate::call::CallError;
use crate::settings::Endpoint;

/// The largest answer taken from a collector (an export answer is a few bytes).
const MAX_ANSWER_BYTES: usize = 1 << 20;

/// A channel to one gRPC server.
pub struct Channel {
    endpoint: Endpoint,
    send: Option<h2::client::SendRequest<Bytes>>,
}

impl Channel {
    pub fn new(endpoint: Endpoint) -> Channel {
        Channel {
            endpoint,
            send: None,
        }
    }

    async fn connect(&mut self) -> Result<h2::client::SendRequest<Bytes>, CallError> {
        if let Some(send) = &self.send {
            return Ok(send.clone());
        }
        let tcp = tokio::net::TcpStream::connect((self.endpoint.host.as_str(), self.endpoint.port))
            .await
            .map_err(|e| CallError::Connect(format!("{}: {e}", self.endpoint.authority())))?;
        let _ = tcp.set_nodelay(true);
        let (send, connection) = h2::client::handshake(tcp)
            .await
            .map_err(|e| CallError::Connect(format!("HTTP/2 handshake: {e}")))?;
        tokio::spawn(async move {
            let _ = connection.await;
        });
        self.send = Some(send.clone());
        Ok(send)
    }

    /// Calls `path` with one encoded message; the answer's message bytes.
    pub async fn unary(&mut self, path: &str, message: &[u8]) -> Result<Bytes, CallError> {
        let result = self.call(path, message).await;
        if matches!(result, Err(CallError::Connect(_) | CallError::Transport(_))) {
            self.send = None;
        }
        result
    }

    async fn call(&mut self, path: &str, message: &[u8]) -> Result<Bytes, CallError> {
        let transport = |e: h2::Error| CallError::Transport(e.to_string());
        let send = self.connect().await?;
        let mut send = send.ready().await.map_err(transport)?;
        let request = http::Request::builder()
            .method("POST")
            .uri(format!("http://{}{path}", self.endpoint.authority()))
            .header("content-type", "application/grpc")
            .header("te", "trailers")
            .header(
                "user-agent",
                concat!("nephele-otel/", env!("CARGO_PKG_VERSION")),
            )
            .body(())
            .map_err(|e| CallError::Transport(e.to_string()))?;
        let (answer, mut body) = send.send_request(request, false).map_err(transport)?;
        let length = u32::try_from(message.len())
            .map_err(|_| CallError::Transport("message over 4 GiB".into()))?;
        let mut framed = BytesMut::with_capacity(5 + message.len());
        framed.put_u8(0);
        framed.put_u32(length);
        framed.extend_from_slice(message);
        body.send_data(framed.freeze(), true).map_err(transport)?;
        let (head, mut answer) = answer.await.map_err(transport)?.into_parts();
        if head.status != http::StatusCode::OK {
            return Err(CallError::Transport(format!(
                "the collector answered HTTP {} (is it an OTLP/gRPC port?)",
                head.status
            )));
        }
        // A trailers-only answer carries its status in the headers.
        if let Some(status) = grpc_status(&head.headers) {
            status?;
        }
        let mut data = BytesMut::new();
        while let Some(chunk) = answer.data().await {
            let chunk = chunk.map_err(transport)?;
            let _ = answer.flow_control().release_capacity(chunk.len());
            if data.len() + chunk.len() > MAX_ANSWER_BYTES {
                return Err(CallError::Transport("the answer is too large".into()));
            }
            data.extend_from_slice(&chunk);
        }
        let trailers = answer.trailers().await.map_err(transport)?;
        match trailers.as_ref().and_then(grpc_status) {
            Some(status) => status?,
            None => {
                return Err(CallError::Transport(
                    "the answer has no grpc-status (not a gRPC server?)".into(),
                ))
            }
        }
        if data.len() < 5 {
            return Ok(Bytes::new());
        }
        if data[0] != 0 {
            return Err(CallError::Transport(
                "the collector compressed its answer unasked".into(),
            ));
        }
        let length = u32::from_be_bytes([data[1], data[2], data[3], data[4]]) as usize;
        let data = data.freeze();
        data.get(5..5 + length)
            .map(|m| data.slice_ref(m))
            .ok_or_else(|| CallError::Transport("the answer's message is cut short".into()))
    }
}

/// The `grpc-status` in `headers`, as OK or the error it names.
fn grpc_status(headers: &http::HeaderMap) -> Option<Result<(), CallError>> {
    let code = headers
        .get("grpc-status")?
        .to_str()
        .ok()?
        .parse::<u32>()
        .ok()?;
    if code == 0 {
        return Some(Ok(()));
    }
    let message = headers
        .get("grpc-message")
        .and_then(|v| v.to_str().ok())
        .map(percent_decode)
        .unwrap_or_default();
    Some(Err(CallError::Status { code, message }))
}

/// gRPC percent-encodes `grpc-message`.
fn percent_decode(value: &str) -> String {
    let bytes = value.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            if let Some(byte) = value
                .get(i + 1..i + 3)
                .and_then(|h| u8::from_str_radix(h, 16).ok())
            {
                out.push(byte);
                i += 3;
                continue;
            }
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses_read_as_grpc_defines_them() {
        let mut headers = http::HeaderMap::new();
        assert_eq!(grpc_status(&headers), None);
        headers.insert("grpc-status", http::HeaderValue::from_static("0"));
        assert_eq!(grpc_status(&headers), Some(Ok(())));
        headers.insert("grpc-status", http::HeaderValue::from_static("14"));
        headers.insert(
            "grpc-message",
            http::HeaderValue::from_static("try%20again"),
        );
        let error = grpc_status(&headers)
            .and_then(Result::err)
            .expect("an error");
        assert_eq!(
            error,
            CallError::Status {
                code: 14,
                message: "try again".into()
            }
        );
        assert!(error.retryable());
        assert!(!CallError::Status {
            code: 3,
            message: String::new()
        }
        .retryable());
    }
}
