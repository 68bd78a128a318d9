//! Framed messages on QUIC streams, with the protocol crate's size limit enforced before
//! the payload is read.
//!
//! Two ways to read:
//! - [`read_frame`] reads exactly one frame and never past it. It is **not
//!   cancel-safe**: dropped while a frame is half-read, the bytes it took are lost and
//!   the stream's framing with them. Use it where the read is not raced against anything
//!   (a one-shot answer, under a timeout that abandons the stream).
//! - [`FrameReader`] owns the stream and a [`FrameDecoder`] that keeps partial frames
//!   between calls, so [`FrameReader::next`] is cancel-safe: it may sit in a
//!   `tokio::select!` beside a heartbeat tick, and a frame that arrives across many
//!   cancelled calls still comes out whole. Use it for any stream read inside
//!   `select!`.

use nephele_proto::{decode_payload, encode_frame, FrameDecoder, FrameError, MAX_FRAME_BYTES};
use serde::{de::DeserializeOwned, Serialize};

#[derive(Debug, thiserror::Error)]
pub enum NetError {
    #[error(transparent)]
    Frame(#[from] FrameError),
    #[error("stream read failed: {0}")]
    Read(String),
    #[error("stream write failed: {0}")]
    Write(String),
    #[error("connection failed: {0}")]
    Connect(String),
    #[error("timed out: {0}")]
    Timeout(&'static str),
}

impl NetError {
    /// Whether the peer sent something this side refuses (as opposed to a broken link).
    pub fn is_protocol_violation(&self) -> bool {
        matches!(self, NetError::Frame(_))
    }
}

/// Writes one frame.
pub async fn write_frame<T: Serialize>(
    send: &mut quinn::SendStream,
    message: &T,
) -> Result<(), NetError> {
    let frame = encode_frame(message)?;
    send.write_all(&frame)
        .await
        .map_err(|error| NetError::Write(error.to_string()))
}

/// Reads one frame (not cancel-safe: see the module; in `select!`, use
/// [`FrameReader`]). `Ok(None)` when the peer finished the stream cleanly before a new
/// frame began. A length above `max_frame` (capped at [`MAX_FRAME_BYTES`]) is refused
/// without reading the payload.
pub async fn read_frame<T: DeserializeOwned>(
    recv: &mut quinn::RecvStream,
    max_frame: usize,
) -> Result<Option<T>, NetError> {
    let mut prefix = [0u8; 4];
    let mut filled = 0;
    while filled < 4 {
        match recv.read(&mut prefix[filled..]).await {
            Ok(Some(n)) => filled += n,
            Ok(None) if filled == 0 => return Ok(None),
            Ok(None) => {
                return Err(
                    FrameError::Malformed("stream ended inside a length prefix".into()).into(),
                )
            }
            Err(error) => return Err(NetError::Read(error.to_string())),
        }
    }
    let len = FrameDecoder::check_len(prefix, max_frame.min(MAX_FRAME_BYTES))?;
    let mut payload = vec![0u8; len];
    recv.read_exact(&mut payload)
        .await
        .map_err(|error| match error {
            quinn::ReadExactError::FinishedEarly(_) => {
                NetError::Frame(FrameError::Malformed("stream ended inside a frame".into()))
            }
            quinn::ReadExactError::ReadError(error) => NetError::Read(error.to_string()),
        })?;
    Ok(Some(decode_payload(&payload)?))
}

/// Bytes asked of the stream at a time by [`FrameReader`].
const READ_CHUNK: usize = 64 * 1024;

/// A stream's frames, read through a buffer that survives cancellation (see the
/// module): the only await is quinn's cancel-safe `read_chunk`, and what it returns is
/// in the decoder before the next await.
pub struct FrameReader {
    recv: quinn::RecvStream,
    decoder: FrameDecoder,
}

impl FrameReader {
    /// Reads `recv`'s frames, each at most `max_frame` bytes (capped at
    /// [`MAX_FRAME_BYTES`]).
    pub fn new(recv: quinn::RecvStream, max_frame: usize) -> Self {
        FrameReader {
            recv,
            decoder: FrameDecoder::new(max_frame),
        }
    }

    /// The next frame; `Ok(None)` when the peer finished the stream between frames.
    /// Cancel-safe. A length above the limit is refused as soon as its prefix is in,
    /// so at most one frame (plus one read) is ever buffered.
    pub async fn next<T: DeserializeOwned>(&mut self) -> Result<Option<T>, NetError> {
        loop {
            if let Some(message) = self.decoder.next_frame()? {
                return Ok(Some(message));
            }
            match self.recv.read_chunk(READ_CHUNK, true).await {
                Ok(Some(chunk)) => self.decoder.push(&chunk.bytes),
                Ok(None) if self.decoder.pending() == 0 => return Ok(None),
                Ok(None) => {
                    return Err(FrameError::Malformed(format!(
                        "stream ended inside a frame ({} bytes of it received)",
                        self.decoder.pending()
                    ))
                    .into())
                }
                Err(error) => return Err(NetError::Read(error.to_string())),
            }
        }
    }

    /// Bytes received but not yet part of a whole frame.
    pub fn pending(&self) -> usize {
        self.decoder.pending()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    /// A QUIC connection on loopback: the server's side and the client's side.
    async fn connected() -> (quinn::Endpoint, quinn::Connection, quinn::Connection) {
        let ca = crate::ClusterCa::generate("framing-test").expect("ca");
        let (cert, key) = ca.issue_server(&[]).expect("server cert");
        let config = crate::server_config(ca.cert_der(), &cert, &key).expect("server config");
        let server = quinn::Endpoint::server(config, "127.0.0.1:0".parse().expect("addr"))
            .expect("server endpoint");
        let addr = server.local_addr().expect("addr");
        let mut client = crate::client_endpoint(addr).expect("client endpoint");
        client.set_default_client_config(
            crate::join_client_config(ca.fingerprint()).expect("client config"),
        );
        let connecting = client.connect(addr, crate::SERVER_NAME).expect("connect");
        let incoming = server.accept().await.expect("incoming");
        let (server_side, client_side) = tokio::join!(incoming, connecting);
        (
            server,
            server_side.expect("server side"),
            client_side.expect("client side"),
        )
    }

    #[tokio::test]
    async fn frames_arriving_across_cancelled_reads_come_out_whole() {
        let (_server, server_side, client_side) = connected().await;
        let messages: Vec<Vec<u8>> = [200_000usize, 3, 70_000, 0, 150_001]
            .iter()
            .enumerate()
            .map(|(i, len)| (0..*len).map(|b| (b * 31 + i) as u8).collect())
            .collect();
        let sent = messages.clone();
        // The writer sends each frame in 4 KiB pieces with pauses, so that a reader
        // racing a 1 ms tick is cancelled in the middle of frames (and of prefixes)
        // over and over, as a heartbeat cancels a control-stream read on a slow link.
        let writer = tokio::spawn(async move {
            let (mut send, _recv) = server_side.open_bi().await.expect("open");
            for message in &sent {
                let frame = nephele_proto::encode_frame(message).expect("encode");
                for piece in frame.chunks(4096) {
                    send.write_all(piece).await.expect("write");
                    tokio::time::sleep(Duration::from_millis(2)).await;
                }
            }
            send.finish().expect("finish");
            let _ = send.stopped().await;
        });
        let (_send, recv) = client_side.accept_bi().await.expect("accept");
        let mut reader = FrameReader::new(recv, MAX_FRAME_BYTES);
        let mut tick = tokio::time::interval(Duration::from_millis(1));
        let (mut got, mut cancelled_mid_frame) = (Vec::new(), 0usize);
        loop {
            tokio::select! {
                frame = reader.next::<Vec<u8>>() => match frame.expect("a whole frame") {
                    Some(message) => got.push(message),
                    None => break,
                },
                _ = tick.tick() => {
                    if reader.pending() > 0 {
                        cancelled_mid_frame += 1;
                    }
                }
            }
        }
        writer.await.expect("writer");
        assert_eq!(got, messages);
        assert!(
            cancelled_mid_frame > 20,
            "reads were cancelled mid-frame only {cancelled_mid_frame} times"
        );
    }

    #[tokio::test]
    async fn an_oversized_prefix_is_refused_before_its_payload_and_a_cut_frame_is_an_error() {
        let (_server, server_side, client_side) = connected().await;
        let writer = tokio::spawn(async move {
            for bytes in [(1_000_000u32).to_be_bytes().to_vec(), {
                let mut cut = nephele_proto::encode_frame(&vec![7u8; 100]).expect("encode");
                cut.truncate(50);
                cut
            }] {
                let (mut send, _recv) = server_side.open_bi().await.expect("open");
                send.write_all(&bytes).await.expect("write");
                send.finish().expect("finish");
                let _ = send.stopped().await;
            }
        });
        let (_send, recv) = client_side.accept_bi().await.expect("accept");
        let error = FrameReader::new(recv, 1024)
            .next::<Vec<u8>>()
            .await
            .expect_err("too large");
        assert!(error.is_protocol_violation(), "{error}");
        assert!(error.to_string().contains("1000000"), "{error}");
        let (_send, recv) = client_side.accept_bi().await.expect("accept");
        let error = FrameReader::new(recv, 1024)
            .next::<Vec<u8>>()
            .await
            .expect_err("cut");
        assert!(
            error.to_string().contains("ended inside a frame"),
            "{error}"
        );
        writer.await.expect("writer");
    }
}
