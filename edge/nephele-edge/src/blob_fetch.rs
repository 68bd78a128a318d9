//! Blobs (model files) from the control plane over QUIC, a chunk per request stream:
//! `FetchChunk { sha256, offset, len }` answered by `Chunk { total_size, data }`. The
//! agent resumes from its partial file and measures its link while it fetches; the
//! fleet benchmark's simulated agents fetch whole blobs the same way.

use anyhow::{bail, Context as _, Result};
use nephele_net::{read_frame, write_frame};
use nephele_proto::{
    RequestBody, StreamRequest, StreamResponse, CHUNK_BYTES, MAX_FRAME_BYTES, PROTOCOL_VERSION,
};

/// The chunk of blob `digest` at `offset` (at most [`CHUNK_BYTES`]); an error when the
/// control plane refuses, answers something else, or says the blob is not `size`
/// bytes (the size its signed manifest gives).
pub async fn fetch_chunk(
    connection: &quinn::Connection,
    digest: &[u8; 32],
    offset: u64,
    size: u64,
) -> Result<Vec<u8>> {
    let (mut send, mut recv) = connection.open_bi().await?;
    write_frame(
        &mut send,
        &StreamRequest {
            protocol_version: PROTOCOL_VERSION,
            body: RequestBody::FetchChunk {
                sha256: *digest,
                offset,
                len: CHUNK_BYTES,
            },
        },
    )
    .await?;
    let _ = send.finish();
    match read_frame::<StreamResponse>(&mut recv, MAX_FRAME_BYTES)
        .await?
        .context("no chunk")?
    {
        StreamResponse::Chunk { total_size, data } => {
            if total_size != size || data.is_empty() {
                bail!(
                    "blob {} is {total_size} bytes at the control plane but the manifest says {size}",
                    hex::encode(digest)
                );
            }
            Ok(data)
        }
        StreamResponse::Error(error) => bail!("control plane: {}", error.message),
        StreamResponse::Inferred(_)
        | StreamResponse::Logs { .. }
        | StreamResponse::Certificate { .. } => bail!("unexpected answer to a chunk request"),
    }
}

/// The whole blob, chunk after chunk (no cache, no resume).
pub async fn fetch_blob(
    connection: &quinn::Connection,
    digest: &[u8; 32],
    size: u64,
) -> Result<Vec<u8>> {
    let mut bytes = Vec::with_capacity(size as usize);
    while (bytes.len() as u64) < size {
        let chunk = fetch_chunk(connection, digest, bytes.len() as u64, size).await?;
        bytes.extend_from_slice(&chunk);
    }
    Ok(bytes)
}
