//! Length-prefixed frames with a hard size limit, and the bincode 2 payload encoding.

use serde::{de::DeserializeOwned, Serialize};

use crate::MAX_FRAME_BYTES;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FrameError {
    #[error("frame of {len} bytes exceeds the {max}-byte limit")]
    TooLarge { len: usize, max: usize },
    #[error("malformed frame: {0}")]
    Malformed(String),
    #[error("frame has {0} trailing bytes after the message")]
    TrailingBytes(usize),
    #[error("message could not be encoded: {0}")]
    Encode(String),
}

fn config() -> bincode::config::Configuration<
    bincode::config::LittleEndian,
    bincode::config::Varint,
    bincode::config::Limit<MAX_FRAME_BYTES>,
> {
    bincode::config::standard().with_limit::<MAX_FRAME_BYTES>()
}

/// Encodes a message's payload (no length prefix).
pub fn encode_payload<T: Serialize>(message: &T) -> Result<Vec<u8>, FrameError> {
    let payload = bincode::serde::encode_to_vec(message, config())
        .map_err(|error| FrameError::Encode(error.to_string()))?;
    if payload.len() > MAX_FRAME_BYTES {
        return Err(FrameError::TooLarge {
            len: payload.len(),
            max: MAX_FRAME_BYTES,
        });
    }
    Ok(payload)
}

/// Decodes a payload, requiring that it is consumed exactly. Never panics on any input;
/// the bincode limit bounds every allocation a hostile length could ask for.
pub fn decode_payload<T: DeserializeOwned>(payload: &[u8]) -> Result<T, FrameError> {
    if payload.len() > MAX_FRAME_BYTES {
        return Err(FrameError::TooLarge {
            len: payload.len(),
            max: MAX_FRAME_BYTES,
        });
    }
    let (message, read) = bincode::serde::decode_from_slice(payload, config())
        .map_err(|error| FrameError::Malformed(error.to_string()))?;
    if read != payload.len() {
        return Err(FrameError::TrailingBytes(payload.len() - read));
    }
    Ok(message)
}

/// Encodes a message as one frame: 4-byte big-endian length, then the payload.
pub fn encode_frame<T: Serialize>(message: &T) -> Result<Vec<u8>, FrameError> {
    let payload = encode_payload(message)?;
    let mut frame = Vec::with_capacity(4 + payload.len());
    frame.extend_from_slice(&(payload.len() as u32).to_be_bytes());
    frame.extend_from_slice(&payload);
    Ok(frame)
}

/// Sans-IO frame splitter: feed it bytes as they arrive, take whole frames out.
///
/// After an error the decoder is poisoned (the byte stream has lost its framing), and
/// the owner must close the stream.
#[derive(Debug)]
pub struct FrameDecoder {
    buffer: Vec<u8>,
    max_frame: usize,
    poisoned: bool,
}

impl FrameDecoder {
    pub fn new(max_frame: usize) -> Self {
        FrameDecoder {
            buffer: Vec::new(),
            max_frame: max_frame.min(MAX_FRAME_BYTES),
            poisoned: false,
        }
    }

    pub fn push(&mut self, bytes: &[u8]) {
        self.buffer.extend_from_slice(bytes);
    }

    /// The length announced by a 4-byte prefix, checked against the limit.
    pub fn check_len(prefix: [u8; 4], max_frame: usize) -> Result<usize, FrameError> {
        let len = u32::from_be_bytes(prefix) as usize;
        if len > max_frame {
            return Err(FrameError::TooLarge {
                len,
                max: max_frame,
            });
        }
        Ok(len)
    }

    /// Returns the next whole message, `Ok(None)` when more bytes are needed.
    pub fn next_frame<T: DeserializeOwned>(&mut self) -> Result<Option<T>, FrameError> {
        if self.poisoned {
            return Err(FrameError::Malformed("decoder already failed".into()));
        }
        if self.buffer.len() < 4 {
            return Ok(None);
        }
        let prefix = [
            self.buffer[0],
            self.buffer[1],
            self.buffer[2],
            self.buffer[3],
        ];
        let len = Self::check_len(prefix, self.max_frame).inspect_err(|_| self.poisoned = true)?;
        if self.buffer.len() < 4 + len {
            return Ok(None);
        }
        let result = decode_payload(&self.buffer[4..4 + len]);
        self.buffer.drain(..4 + len);
        result.inspect_err(|_| self.poisoned = true).map(Some)
    }

    /// Bytes received but not yet part of a whole frame.
    pub fn pending(&self) -> usize {
        self.buffer.len()
    }
}
