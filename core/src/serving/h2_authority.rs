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

use fluke_hpack::{Decoder, Encoder};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, DuplexStream};

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
/// What replaces an invalid `:authority` (what kubelet's CSI client itself sends).
const LOCALHOST: &[u8] = b"localhost";

/// Why a connection was dropped.
#[derive(Debug, thiserror::Error)]
pub enum NormalizeError {
    /// Reading or writing either side failed.
    #[error("HTTP/2 authority normalizer: {0}")]
    Io(#[from] std::io::Error),
    /// The client broke HTTP/2's framing or HPACK.
    #[error("HTTP/2 authority normalizer: {0}")]
    Protocol(String),
}

/// Serves `client` through a new in-memory connection whose other end is returned (give it to
/// the HTTP/2 server); the copying runs on a task of its own until either side closes.
pub fn normalize<C>(client: C) -> DuplexStream
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
        let requests = async {
            if let Err(e) = rewrite_requests(client_read, server_write).await {
                tracing::debug!(error = %e, "registration connection ended");
            }
        };
        tokio::join!(answers, requests);
    });
    server_side
}

/// Copies the client's frames to the server, rewriting each header block.
async fn rewrite_requests<R, W>(mut from: R, mut to: W) -> Result<(), NormalizeError>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let mut preface = [0u8; 24];
    from.read_exact(&mut preface).await?;
    if &preface != PREFACE {
        return Err(NormalizeError::Protocol(
            "the client did not start with the HTTP/2 preface".into(),
        ));
    }
    to.write_all(&preface).await?;
    let mut decoder = Decoder::new();
    let mut encoder = Encoder::new();
    while let Some(frame) = read_frame(&mut from).await? {
        if frame.kind != HEADERS {
            to.write_all(&frame.header).await?;
            to.write_all(&frame.payload).await?;
            continue;
        }
        let mut block = header_fragment(&frame)?.to_vec();
        let mut flags = frame.flags;
        while flags & END_HEADERS == 0 {
            let next = read_frame(&mut from).await?.ok_or_else(|| {
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
        let headers = decoder
            .decode(&block)
            .map_err(|e| NormalizeError::Protocol(format!("undecodable header block: {e:?}")))?;
        let encoded = encoder.encode(
            headers
                .iter()
                .map(|(name, value)| (name.as_slice(), normalized(name, value))),
        );
        write_header_block(&mut to, frame.stream, frame.flags & END_STREAM, &encoded).await?;
    }
    to.shutdown().await?;
    Ok(())
}

/// `value`, or `localhost` for an `:authority` that is not a valid authority.
fn normalized<'a>(name: &[u8], value: &'a [u8]) -> &'a [u8] {
    if name == b":authority" && http::uri::Authority::try_from(value).is_err() {
        LOCALHOST
    } else {
        value
    }
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

#[cfg(test)]
mod tests {
    use super::*;
    use hyper_util::rt::{TokioExecutor, TokioIo};

    const SOCKET_PATH: &[u8] = b"var/lib/kubelet/plugins_registry/csi.athenz.io-reg.sock";

    /// A frame's bytes.
    fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
        let mut out = (u32::try_from(payload.len()).unwrap().to_be_bytes()[1..]).to_vec();
        out.extend([kind, flags]);
        out.extend(stream.to_be_bytes());
        out.extend(payload);
        out
    }

    /// What grpc-go sends for a unary call on a Unix socket dialed by path: the preface, empty
    /// SETTINGS, and one request's HEADERS (END_STREAM: no body needed here).
    fn kubelet_request(authority: &[u8]) -> Vec<u8> {
        let mut encoder = Encoder::new();
        let block = encoder.encode([
            (&b":method"[..], &b"POST"[..]),
            (b":scheme", b"http"),
            (b":path", b"/pluginregistration.Registration/GetInfo"),
            (b":authority", authority),
            (b"content-type", b"application/grpc"),
            (b"te", b"trailers"),
        ]);
        let mut bytes = PREFACE.to_vec();
        bytes.extend(frame(0x4, 0, 0, &[]));
        bytes.extend(frame(HEADERS, END_HEADERS | END_STREAM, 1, &block));
        bytes
    }

    /// Serves one connection with hyper's HTTP/2 server (h2 underneath, as tonic), answering
    /// 200 with the request's authority in a header; returns the client's end.
    fn server(normalizing: bool) -> DuplexStream {
        let (client, server) = tokio::io::duplex(64 * 1024);
        let service = hyper::service::service_fn(|req: http::Request<hyper::body::Incoming>| {
            let authority = req
                .uri()
                .authority()
                .map(|a| a.to_string())
                .unwrap_or_default();
            async move {
                http::Response::builder()
                    .header("x-authority", authority)
                    .body(http_body_util::Empty::<bytes::Bytes>::new())
            }
        });
        tokio::spawn(async move {
            let builder = hyper::server::conn::http2::Builder::new(TokioExecutor::new());
            if normalizing {
                let _ = builder
                    .serve_connection(TokioIo::new(normalize(server)), service)
                    .await;
            } else {
                let _ = builder
                    .serve_connection(TokioIo::new(server), service)
                    .await;
            }
        });
        client
    }

    /// Sends `request` and reads frames until the first answer on stream 1: HEADERS (decoded)
    /// or RST_STREAM (its error code).
    async fn answer(
        mut conn: DuplexStream,
        request: &[u8],
    ) -> Result<Vec<(Vec<u8>, Vec<u8>)>, u32> {
        conn.write_all(request).await.unwrap();
        let mut decoder = Decoder::new();
        loop {
            let f = tokio::time::timeout(std::time::Duration::from_secs(5), read_frame(&mut conn))
                .await
                .expect("no answer within 5 s")
                .unwrap()
                .expect("the server closed without answering");
            match (f.kind, f.stream) {
                (HEADERS, 1) => return Ok(decoder.decode(header_fragment(&f).unwrap()).unwrap()),
                (0x3, 1) => {
                    return Err(u32::from_be_bytes(f.payload[..4].try_into().unwrap()));
                }
                _ => {}
            }
        }
    }

    fn header<'a>(headers: &'a [(Vec<u8>, Vec<u8>)], name: &str) -> Option<&'a [u8]> {
        headers
            .iter()
            .find(|(n, _)| n == name.as_bytes())
            .map(|(_, v)| v.as_slice())
    }

    #[tokio::test]
    async fn h2_refuses_a_socket_path_as_authority_and_the_normalizer_makes_it_localhost() {
        // the disagreement itself: 0x1 is PROTOCOL_ERROR, what kubelet logged
        assert_eq!(
            answer(server(false), &kubelet_request(SOCKET_PATH)).await,
            Err(0x1)
        );
        let headers = answer(server(true), &kubelet_request(SOCKET_PATH))
            .await
            .unwrap();
        assert_eq!(header(&headers, ":status"), Some(&b"200"[..]));
        assert_eq!(header(&headers, "x-authority"), Some(&b"localhost"[..]));
    }

    #[tokio::test]
    async fn a_valid_authority_passes_unchanged() {
        let headers = answer(server(true), &kubelet_request(b"csi.example:443"))
            .await
            .unwrap();
        assert_eq!(
            header(&headers, "x-authority"),
            Some(&b"csi.example:443"[..])
        );
    }

    #[tokio::test]
    async fn a_header_block_split_over_continuation_frames_is_joined() {
        let mut encoder = Encoder::new();
        let block = encoder.encode([
            (&b":method"[..], &b"POST"[..]),
            (b":scheme", b"http"),
            (b":path", b"/x"),
            (b":authority", SOCKET_PATH),
        ]);
        let (first, second) = block.split_at(block.len() / 2);
        let mut request = PREFACE.to_vec();
        request.extend(frame(0x4, 0, 0, &[]));
        request.extend(frame(HEADERS, END_STREAM, 1, first));
        request.extend(frame(CONTINUATION, END_HEADERS, 1, second));
        let headers = answer(server(true), &request).await.unwrap();
        assert_eq!(header(&headers, "x-authority"), Some(&b"localhost"[..]));
    }

    /// Runs the request side alone on `input`; its result.
    async fn rewrite(input: Vec<u8>) -> Result<(), NormalizeError> {
        rewrite_requests(std::io::Cursor::new(input), tokio::io::sink()).await
    }

    #[tokio::test]
    async fn hostile_input_ends_the_connection_naming_what_was_wrong() {
        let err = rewrite(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n".to_vec())
            .await
            .unwrap_err();
        assert!(err.to_string().contains("preface"), "{err}");

        let mut oversized = PREFACE.to_vec();
        oversized.extend([0x01, 0x00, 0x00, HEADERS, 0, 0, 0, 0, 1]); // 65536 bytes
        let err = rewrite(oversized).await.unwrap_err();
        assert!(err.to_string().contains("65536 bytes"), "{err}");

        let mut interrupted = PREFACE.to_vec();
        interrupted.extend(frame(HEADERS, 0, 1, &[0x82]));
        interrupted.extend(frame(0x0, 0, 1, b"data"));
        let err = rewrite(interrupted).await.unwrap_err();
        assert!(err.to_string().contains("interrupted"), "{err}");

        let mut garbage = PREFACE.to_vec();
        garbage.extend(frame(
            HEADERS,
            END_HEADERS,
            1,
            &[0xff, 0xff, 0xff, 0xff, 0xff],
        ));
        let err = rewrite(garbage).await.unwrap_err();
        assert!(err.to_string().contains("undecodable"), "{err}");

        let mut bad_padding = PREFACE.to_vec();
        bad_padding.extend(frame(HEADERS, END_HEADERS | PADDED, 1, &[200, 0x82]));
        let err = rewrite(bad_padding).await.unwrap_err();
        assert!(err.to_string().contains("padding"), "{err}");

        let mut cut = PREFACE.to_vec();
        cut.extend(frame(HEADERS, 0, 1, &[0x82]));
        let err = rewrite(cut).await.unwrap_err();
        assert!(err.to_string().contains("ended inside"), "{err}");
    }
}
