//! A kubelet's plugin-registration client and h2 disagree on one header: kubelet dials the
//! registration socket with grpc-go's default target, so each request's `:authority` is the
//! socket's path (`var/lib/kubelet/plugins_registry/<name>-reg.sock`), which is no authority
//! (RFC 9113 8.3.1); h2, under tonic and hyper, refuses such a request with `PROTOCOL_ERROR`
//! (hyperium/h2#487, open), so a real kubelet never registers a driver served by tonic.
//! (Its CSI client sends `localhost`, kubernetes#112597; only registration is affected.)
//!
//! [`normalize`] sits between such a client and the server: it passes the connection through
//! byte for byte, except that each request's header block is decoded (HPACK, with the client's
//! table) and encoded again (with a table of its own, which the server's decoder follows),
//! with an `:authority` that is not a valid authority replaced by `localhost`. Nothing else of
//! the request changes; the server's answers pass untouched.
//!
//! Whoever can reach the socket (root on the node, or a pod that mounts kubelet's
//! `plugins_registry`) talks to this code before the server's own limits apply, so it holds
//! limits of its own: a frame of at most 16 KiB and a header block of at most 64 KiB; a dynamic
//! table of at most [`MAX_TABLE_SIZE`] bytes; and, in [`Bounds`], a header list decoded only up
//! to the server's limit (the decoding stops there, never after: `h2_authority/hpack.rs` says
//! how), the preface within [`PREFACE_TIMEOUT`] and each frame within [`IDLE_TIMEOUT`] of the
//! previous one. Past any of them, or on input HTTP/2 or HPACK does not allow, the connection
//! is closed on both sides, with a [`NormalizeError`] in the log; nothing panics.

mod hpack;
#[cfg(test)]
mod tests;

use std::time::Duration;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, DuplexStream};

pub use hpack::MAX_TABLE_SIZE;

/// The client connection preface (RFC 9113 3.4).
const PREFACE: &[u8; 24] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
const HEADERS: u8 = 0x1;
const CONTINUATION: u8 = 0x9;
const END_STREAM: u8 = 0x1;
const END_HEADERS: u8 = 0x4;
const PADDED: u8 = 0x8;
const PRIORITY: u8 = 0x20;
/// The largest frame and header block accepted: HTTP/2's default SETTINGS_MAX_FRAME_SIZE for a
/// frame, and 64 KiB for a whole header block (a registration request's is under 200 bytes).
const MAX_FRAME: usize = 16_384;
const MAX_HEADER_BLOCK: usize = 64 * 1024;

/// How long a client may take to send the connection preface: kubelet's own dial timeout for
/// the registration socket. grpc-go writes the preface as soon as the socket connects, so only
/// a client that is not kubelet (or one that gave up already) is still silent by then.
pub const PREFACE_TIMEOUT: Duration = Duration::from_secs(10);

/// How long a client may go without sending a frame before its connection is closed. The
/// server serves a handful of connections at a time (the rest wait), so idle ones would keep
/// kubelet out. kubelet's calls are local and short (it gives `GetInfo` 1 s and
/// `NotifyRegistrationStatus` 5 s); its one idle stretch is between them, while it checks the
/// driver (`NodeGetInfo`, served by the agent at once) and records it in the Node and CSINode
/// objects, seconds at most unless the API server is struggling. 30 s leaves that room; should
/// it ever run longer, kubelet has registered the driver by then and only the verdict's report
/// is at stake.
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(30);

/// What one normalized connection may take.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Bounds {
    /// The header-list size (RFC 9113 6.5.2: names, values and 32 per field) past which a header
    /// block is refused while it is decoded: the limit the server behind applies, so that
    /// nothing it would refuse is ever decoded whole here.
    pub header_list_size: usize,
    /// How long the client may take to send the connection preface.
    pub preface_timeout: Duration,
    /// How long the client may take to send each frame, counted from the previous one.
    pub idle_timeout: Duration,
}

impl Bounds {
    /// [`PREFACE_TIMEOUT`] and [`IDLE_TIMEOUT`], with `header_list_size` the server's header-list
    /// limit (the number given to its `max_header_list_size`).
    pub fn new(header_list_size: u32) -> Self {
        Self {
            header_list_size: usize::try_from(header_list_size).unwrap_or(usize::MAX),
            preface_timeout: PREFACE_TIMEOUT,
            idle_timeout: IDLE_TIMEOUT,
        }
    }
}

/// Why a connection was dropped.
#[derive(Debug, thiserror::Error)]
pub enum NormalizeError {
    /// Reading or writing either side failed.
    #[error("HTTP/2 authority normalizer: {0}")]
    Io(#[from] std::io::Error),
    /// The client broke HTTP/2's framing or HPACK, or went past a frame or header-block bound.
    #[error("HTTP/2 authority normalizer: {0}")]
    Protocol(String),
    /// A header block decoded to more than the server accepts; refused as soon as the count
    /// passed the limit, `counted` bytes in (at most the limit and one field).
    #[error(
        "HTTP/2 authority normalizer: a header list over the server's limit of {limit} bytes \
         (refused at {counted} bytes decoded)"
    )]
    HeaderListTooLarge {
        /// The header-list limit ([`Bounds::header_list_size`]).
        limit: usize,
        /// The header-list size counted when the block was refused.
        counted: usize,
    },
    /// The client did not send what was due in time.
    #[error("HTTP/2 authority normalizer: no {waiting_for} from the client within {after:?}")]
    TimedOut {
        /// What was awaited: the preface or a frame.
        waiting_for: &'static str,
        /// The bound that passed.
        after: Duration,
    },
}

/// Serves `client` through a new in-memory connection whose other end is returned (give it to
/// the HTTP/2 server), within `bounds`; the copying runs on a task of its own until either side
/// closes, or until the client breaks a bound, which closes both.
pub fn normalize<C>(client: C, bounds: Bounds) -> DuplexStream
where
    C: AsyncRead + AsyncWrite + Send + Unpin + 'static,
{
    let (ours, server_side) = tokio::io::duplex(64 * 1024);
    tokio::spawn(async move {
        let (client_read, mut client_write) = tokio::io::split(client);
        let (mut server_read, server_write) = tokio::io::split(ours);
        let answers = async {
            let _ = tokio::io::copy(&mut server_read, &mut client_write).await;
            let _ = client_write.shutdown().await;
        };
        tokio::pin!(answers);
        tokio::select! {
            ended = rewrite_requests(client_read, server_write, &bounds) => match ended {
                // the client is done sending: the server's last answers still go back
                Ok(()) => answers.await,
                // ending the task drops both connections: the server's reads end, and the
                // client's socket closes
                Err(e) => log_end(&e),
            },
            // the server closed its end: nothing is left to relay
            () = &mut answers => {}
        }
    });
    server_side
}

/// Logs why a connection was dropped: what a client did wrong where it says something about
/// the client, a failed read or write (usually a client gone) for debugging only.
fn log_end(e: &NormalizeError) {
    match e {
        NormalizeError::Io(_) => tracing::debug!(error = %e, "registration connection ended"),
        NormalizeError::TimedOut { .. } => {
            tracing::info!(error = %e, "registration connection closed");
        }
        NormalizeError::Protocol(_) | NormalizeError::HeaderListTooLarge { .. } => {
            tracing::warn!(error = %e, "registration connection refused");
        }
    }
}

/// The request side of [`normalize`] over bytes in memory, the fuzz target's entry
/// (`fuzz/fuzz_targets/h2_authority.rs`): `input` is all a client sent on one connection, and
/// what the server would receive is appended to `out` (up to the error, if any). It never waits
/// (a slice is always ready), but its timeouts need a Tokio runtime with time enabled.
pub async fn rewrite_client_bytes(
    input: &[u8],
    out: &mut Vec<u8>,
    bounds: Bounds,
) -> Result<(), NormalizeError> {
    rewrite_requests(input, out, &bounds).await
}

/// Copies the client's frames to the server, rewriting each header block.
async fn rewrite_requests<R, W>(
    mut from: R,
    mut to: W,
    bounds: &Bounds,
) -> Result<(), NormalizeError>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let mut preface = [0u8; 24];
    tokio::time::timeout(bounds.preface_timeout, from.read_exact(&mut preface))
        .await
        .map_err(|_| NormalizeError::TimedOut {
            waiting_for: "HTTP/2 preface",
            after: bounds.preface_timeout,
        })??;
    if &preface != PREFACE {
        return Err(NormalizeError::Protocol(
            "the client did not start with the HTTP/2 preface".into(),
        ));
    }
    to.write_all(&preface).await?;
    let mut rewriter = hpack::BlockRewriter::new(bounds.header_list_size);
    while let Some(frame) = next_frame(&mut from, bounds.idle_timeout).await? {
        if frame.kind != HEADERS {
            to.write_all(&frame.header).await?;
            to.write_all(&frame.payload).await?;
            continue;
        }
        let mut block = header_fragment(&frame)?.to_vec();
        let mut flags = frame.flags;
        while flags & END_HEADERS == 0 {
            let next = next_frame(&mut from, bounds.idle_timeout)
                .await?
                .ok_or_else(|| {
                    NormalizeError::Protocol("the connection ended inside a header block".into())
                })?;
            if next.kind != CONTINUATION || next.stream != frame.stream {
                return Err(NormalizeError::Protocol(
                    "a header block was interrupted by another frame".into(),
                ));
            }
            if block.len() + next.payload.len() > MAX_HEADER_BLOCK {
                return Err(NormalizeError::Protocol(format!(
                    "a header block over {MAX_HEADER_BLOCK} bytes"
                )));
            }
            block.extend_from_slice(&next.payload);
            flags = next.flags;
        }
        let encoded = rewriter.rewrite(&block)?;
        write_header_block(&mut to, frame.stream, frame.flags & END_STREAM, &encoded).await?;
    }
    to.shutdown().await?;
    Ok(())
}

/// [`read_frame`] within `idle`.
async fn next_frame<R: AsyncRead + Unpin>(
    from: &mut R,
    idle: Duration,
) -> Result<Option<Frame>, NormalizeError> {
    tokio::time::timeout(idle, read_frame(from))
        .await
        .map_err(|_| NormalizeError::TimedOut {
            waiting_for: "frame",
            after: idle,
        })?
}

/// One frame: its 9-byte header as read, and its payload.
struct Frame {
    header: [u8; 9],
    kind: u8,
    flags: u8,
    stream: u32,
    payload: Vec<u8>,
}

/// The next frame, or `None` at a clean end of the connection.
async fn read_frame<R: AsyncRead + Unpin>(from: &mut R) -> Result<Option<Frame>, NormalizeError> {
    let mut header = [0u8; 9];
    match from.read_exact(&mut header).await {
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(e) => return Err(e.into()),
    }
    let length =
        usize::from(header[0]) << 16 | usize::from(header[1]) << 8 | usize::from(header[2]);
    if length > MAX_FRAME {
        return Err(NormalizeError::Protocol(format!(
            "a frame of {length} bytes (the limit is {MAX_FRAME})"
        )));
    }
    let mut payload = vec![0u8; length];
    from.read_exact(&mut payload).await?;
    Ok(Some(Frame {
        header,
        kind: header[3],
        flags: header[4],
        stream: u32::from_be_bytes([header[5], header[6], header[7], header[8]]) & 0x7fff_ffff,
        payload,
    }))
}

/// A HEADERS frame's header block fragment: without its padding and priority fields.
fn header_fragment(frame: &Frame) -> Result<&[u8], NormalizeError> {
    let mut body = frame.payload.as_slice();
    let mut padding = 0;
    if frame.flags & PADDED != 0 {
        let (&pad, rest) = body
            .split_first()
            .ok_or_else(|| NormalizeError::Protocol("a padded HEADERS frame is empty".into()))?;
        padding = usize::from(pad);
        body = rest;
    }
    if frame.flags & PRIORITY != 0 {
        body = body.get(5..).ok_or_else(|| {
            NormalizeError::Protocol("a HEADERS frame too short for its priority".into())
        })?;
    }
    body.get(..body.len().saturating_sub(padding))
        .filter(|_| padding <= body.len())
        .ok_or_else(|| NormalizeError::Protocol("HEADERS padding longer than the frame".into()))
}

/// Writes `block` as a HEADERS frame (and CONTINUATION frames past [`MAX_FRAME`]).
async fn write_header_block<W: AsyncWrite + Unpin>(
    to: &mut W,
    stream: u32,
    end_stream: u8,
    block: &[u8],
) -> Result<(), NormalizeError> {
    let chunks: Vec<&[u8]> = if block.is_empty() {
        vec![block]
    } else {
        block.chunks(MAX_FRAME).collect()
    };
    for (i, chunk) in chunks.iter().enumerate() {
        let (kind, mut flags) = if i == 0 {
            (HEADERS, end_stream)
        } else {
            (CONTINUATION, 0)
        };
        if i + 1 == chunks.len() {
            flags |= END_HEADERS;
        }
        let length = u32::try_from(chunk.len())
            .map_err(|_| NormalizeError::Protocol("a header block chunk too long".into()))?;
        let mut header = [0u8; 9];
        header[..3].copy_from_slice(&length.to_be_bytes()[1..]);
        header[3] = kind;
        header[4] = flags;
        header[5..].copy_from_slice(&stream.to_be_bytes());
        to.write_all(&header).await?;
        to.write_all(chunk).await?;
    }
    Ok(())
}
