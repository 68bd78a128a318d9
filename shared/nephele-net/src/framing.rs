//! Framed messages on QUIC streams, with the protocol crate's size limit enforced before
//! the payload is read.

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

/// Reads one frame. `Ok(None)` when the peer finished the stream cleanly before a new
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
