//! The little HTTP a standby speaks itself: it reads a request's head to decide where
//! the request goes (the leader, or its own copy), and writes the answers it gives
//! itself. Everything else is the leader's API, reached through the forwarded bytes.

use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt as _, AsyncWrite, AsyncWriteExt as _};

/// The most a request head may take (request line and headers).
pub const MAX_HEAD_BYTES: usize = 16 * 1024;
/// How long a client has to send its request head.
pub const HEAD_TIMEOUT: Duration = Duration::from_secs(10);
const MAX_HEADERS: usize = 64;

/// A request's head, and every byte read so far (to be forwarded as they came).
#[derive(Debug)]
pub struct Head {
    pub method: String,
    /// The path, without its query.
    pub path: String,
    pub query: String,
    /// The bearer token, if the request has one.
    pub token: Option<String>,
    pub bytes: Vec<u8>,
}

impl Head {
    /// Whether the client accepts an answer from this replica's copy (`?stale`, as
    /// Nomad and Consul spell it; `stale=false` or `stale=0` asks for the leader).
    pub fn stale(&self) -> bool {
        self.query.split('&').any(|pair| {
            let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
            key == "stale" && value != "false" && value != "0"
        })
    }
}

#[derive(Debug, PartialEq, Eq)]
pub enum HeadError {
    /// The client closed before a whole head came.
    Closed,
    TooLarge,
    Malformed(String),
}

/// Reads until a whole request head has come (bounded by [`MAX_HEAD_BYTES`]).
pub async fn read_head(client: &mut (impl AsyncRead + Unpin)) -> Result<Head, HeadError> {
    let mut bytes = Vec::with_capacity(1024);
    let mut chunk = [0u8; 4096];
    loop {
        let n = client
            .read(&mut chunk)
            .await
            .map_err(|_| HeadError::Closed)?;
        if n == 0 {
            return Err(HeadError::Closed);
        }
        bytes.extend_from_slice(&chunk[..n]);
        let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
        let mut request = httparse::Request::new(&mut headers);
        match request.parse(&bytes) {
            Ok(httparse::Status::Complete(_)) => {
                let target = request.path.unwrap_or("/");
                let (path, query) = target.split_once('?').unwrap_or((target, ""));
                let token = request
                    .headers
                    .iter()
                    .find(|h| h.name.eq_ignore_ascii_case("authorization"))
                    .and_then(|h| std::str::from_utf8(h.value).ok())
                    .and_then(|v| v.strip_prefix("Bearer "))
                    .map(|t| t.trim().to_string());
                return Ok(Head {
                    method: request.method.unwrap_or_default().to_string(),
                    path: path.to_string(),
                    query: query.to_string(),
                    token,
                    bytes,
                });
            }
            Ok(httparse::Status::Partial) if bytes.len() < MAX_HEAD_BYTES => {}
            Ok(httparse::Status::Partial) => return Err(HeadError::TooLarge),
            Err(httparse::Error::TooManyHeaders) => return Err(HeadError::TooLarge),
            Err(error) => return Err(HeadError::Malformed(error.to_string())),
        }
    }
}

/// Writes a whole JSON answer and closes the connection.
pub async fn respond(
    client: &mut (impl AsyncWrite + Unpin),
    status: u16,
    headers: &[(&str, String)],
    body: &serde_json::Value,
) {
    let body = body.to_string();
    let mut response = format!(
        "HTTP/1.1 {status} {}\r\ncontent-type: {}\r\ncontent-length: {}\r\nconnection: close\r\n",
        reason(status),
        if status >= 400 {
            crate::api::PROBLEM_JSON
        } else {
            "application/json"
        },
        body.len()
    );
    for (name, value) in headers {
        // Header values from our own text: keep them on one line of visible ASCII.
        let value: String = value
            .chars()
            .map(|c| {
                if c.is_ascii_graphic() || c == ' ' {
                    c
                } else {
                    '?'
                }
            })
            .collect();
        response.push_str(&format!("{name}: {value}\r\n"));
    }
    response.push_str("\r\n");
    response.push_str(&body);
    let _ = client.write_all(response.as_bytes()).await;
    let _ = client.shutdown().await;
}

fn reason(status: u16) -> &'static str {
    match status {
        200 => "OK",
        400 => "Bad Request",
        401 => "Unauthorized",
        403 => "Forbidden",
        404 => "Not Found",
        431 => "Request Header Fields Too Large",
        503 => "Service Unavailable",
        _ => "Error",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn head(bytes: &[u8]) -> Result<Head, HeadError> {
        read_head(&mut &bytes[..]).await
    }

    #[tokio::test]
    async fn a_head_is_read_whole_with_what_came_after_it() {
        let request =
            b"POST /v1/deployments?x=1 HTTP/1.1\r\nhost: a\r\nAuthorization: Bearer t.s \r\ncontent-length: 2\r\n\r\n{}";
        let head = head(request).await.unwrap();
        assert_eq!(head.method, "POST");
        assert_eq!(head.path, "/v1/deployments");
        assert_eq!(head.query, "x=1");
        assert_eq!(head.token.as_deref(), Some("t.s"));
        assert_eq!(head.bytes, request, "every byte is kept for the leader");
        assert!(!head.stale());
    }

    #[tokio::test]
    async fn stale_is_asked_for_as_nomad_spells_it() {
        for (query, stale) in [
            ("stale", true),
            ("stale=true", true),
            ("a=1&stale", true),
            ("stale=false", false),
            ("stale=0", false),
            ("notstale=1", false),
            ("", false),
        ] {
            let request = format!("GET /v1/devices?{query} HTTP/1.1\r\n\r\n");
            assert_eq!(
                head(request.as_bytes()).await.unwrap().stale(),
                stale,
                "{query}"
            );
        }
        let head = head(b"GET /v1/devices HTTP/1.1\r\n\r\n").await.unwrap();
        assert_eq!(head.token, None);
    }

    #[tokio::test]
    async fn bad_heads_are_refused() {
        assert_eq!(
            head(b"GET /v1/devices HTTP/1.1\r\nhost").await.unwrap_err(),
            HeadError::Closed
        );
        assert!(matches!(
            head(b"\x00\x01 nonsense\r\n\r\n").await.unwrap_err(),
            HeadError::Malformed(_)
        ));
        let long = format!(
            "GET /v1/devices HTTP/1.1\r\nx: {}\r\n\r\n",
            "a".repeat(MAX_HEAD_BYTES)
        );
        assert_eq!(
            head(long.as_bytes()).await.unwrap_err(),
            HeadError::TooLarge
        );
        let many = format!(
            "GET / HTTP/1.1\r\n{}\r\n",
            "x: 1\r\n".repeat(MAX_HEADERS + 1)
        );
        assert_eq!(
            head(many.as_bytes()).await.unwrap_err(),
            HeadError::TooLarge
        );
    }

    #[tokio::test]
    async fn an_answer_is_one_closed_response() {
        let mut out = Vec::new();
        respond(
            &mut out,
            200,
            &[
                ("x-nephele-stale", "true".into()),
                ("x-why", "a\r\nb".into()),
            ],
            &serde_json::json!([1]),
        )
        .await;
        let text = String::from_utf8(out).unwrap();
        assert!(text.starts_with("HTTP/1.1 200 OK\r\n"), "{text}");
        assert!(text.contains("content-length: 3\r\n"), "{text}");
        assert!(text.contains("x-why: a??b\r\n"), "{text}");
        assert!(text.ends_with("\r\n\r\n[1]"), "{text}");
    }
}
