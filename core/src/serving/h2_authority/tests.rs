//! The normalizer as a connection: kubelet's request through a real h2 server, and hostile
//! input ending the connection with the error that names it. (The HPACK walk and budget alone
//! are tested in `hpack.rs`.)

#![allow(clippy::unwrap_used, clippy::expect_used)]

use super::*;
use crate::unix_socket::MAX_HEADER_LIST_SIZE;
use fluke_hpack::{Decoder, Encoder};
use hyper_util::rt::{TokioExecutor, TokioIo};

const SOCKET_PATH: &[u8] = b"var/lib/kubelet/plugins_registry/csi.athenz.io-reg.sock";

/// How long a test waits for what must happen at once, so that a broken normalizer fails the
/// test instead of hanging it (never a measurement).
const PATIENCE: Duration = Duration::from_secs(10);

/// The bounds the registration server uses.
fn bounds() -> Bounds {
    Bounds::new(MAX_HEADER_LIST_SIZE)
}

/// The same with timeouts short enough for a test to wait them out.
fn impatient() -> Bounds {
    Bounds {
        preface_timeout: Duration::from_millis(50),
        idle_timeout: Duration::from_millis(50),
        ..bounds()
    }
}

/// A frame's bytes.
fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let mut out = (u32::try_from(payload.len()).unwrap().to_be_bytes()[1..]).to_vec();
    out.extend([kind, flags]);
    out.extend(stream.to_be_bytes());
    out.extend(payload);
    out
}

/// The preface and an empty SETTINGS frame, then a HEADERS frame carrying `block`.
fn request_with_block(block: &[u8]) -> Vec<u8> {
    let mut bytes = PREFACE.to_vec();
    bytes.extend(frame(0x4, 0, 0, &[]));
    bytes.extend(frame(HEADERS, END_HEADERS | END_STREAM, 1, block));
    bytes
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
    request_with_block(&block)
}

/// A header block of 16 KiB that decodes to some 50 MB: one ~4 KiB field added to the
/// dynamic table, then 1-byte references to it.
fn expansion_bomb() -> Vec<u8> {
    let mut block = vec![0x40, 0x06];
    block.extend(b"x-bomb");
    block.extend([0x7f, 0xa1, 0x1e]); // 4000 = 127 + 3873
    block.extend([b'b'; 4000]);
    block.resize(MAX_FRAME, 0xbe); // dynamic index 62: x-bomb
    block
}

/// Serves one connection with hyper's HTTP/2 server (h2 underneath, as tonic) and the header
/// limit the registration server sets, through the normalizer when `normalizing` has its
/// bounds, answering 200 with the request's authority in a header; returns the client's end.
fn server(normalizing: Option<Bounds>) -> DuplexStream {
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
        let mut builder = hyper::server::conn::http2::Builder::new(TokioExecutor::new());
        builder.max_header_list_size(MAX_HEADER_LIST_SIZE);
        let _ = match normalizing {
            Some(bounds) => {
                builder
                    .serve_connection(TokioIo::new(normalize(server, bounds)), service)
                    .await
            }
            None => {
                builder
                    .serve_connection(TokioIo::new(server), service)
                    .await
            }
        };
    });
    client
}

/// Sends `request` and reads frames until the first answer on stream 1: HEADERS (decoded)
/// or RST_STREAM (its error code).
async fn answer(mut conn: DuplexStream, request: &[u8]) -> Result<Vec<(Vec<u8>, Vec<u8>)>, u32> {
    conn.write_all(request).await.unwrap();
    let mut decoder = Decoder::new();
    loop {
        let f = tokio::time::timeout(PATIENCE, read_frame(&mut conn))
            .await
            .expect("no answer in time")
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

/// Sends `request` and reads until the connection closes; the kinds of the frames read.
async fn closed_after(mut conn: DuplexStream, request: &[u8]) -> Vec<u8> {
    conn.write_all(request).await.unwrap();
    let mut kinds = Vec::new();
    loop {
        match tokio::time::timeout(PATIENCE, read_frame(&mut conn))
            .await
            .expect("the connection stayed open")
        {
            Ok(Some(f)) => kinds.push(f.kind),
            Ok(None) | Err(_) => return kinds,
        }
    }
}

fn header<'a>(headers: &'a [(Vec<u8>, Vec<u8>)], name: &str) -> Option<&'a [u8]> {
    headers
        .iter()
        .find(|(n, _)| n == name.as_bytes())
        .map(|(_, v)| v.as_slice())
}

/// (e) kubelet's registration request: refused by h2 as sent, served once normalized.
#[tokio::test]
async fn h2_refuses_a_socket_path_as_authority_and_the_normalizer_makes_it_localhost() {
    // the disagreement itself: 0x1 is PROTOCOL_ERROR, what kubelet logged
    assert_eq!(
        answer(server(None), &kubelet_request(SOCKET_PATH)).await,
        Err(0x1)
    );
    let headers = answer(server(Some(bounds())), &kubelet_request(SOCKET_PATH))
        .await
        .unwrap();
    assert_eq!(header(&headers, ":status"), Some(&b"200"[..]));
    assert_eq!(header(&headers, "x-authority"), Some(&b"localhost"[..]));
}

#[tokio::test]
async fn a_valid_authority_passes_unchanged() {
    let headers = answer(server(Some(bounds())), &kubelet_request(b"csi.example:443"))
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
    let headers = answer(server(Some(bounds())), &request).await.unwrap();
    assert_eq!(header(&headers, "x-authority"), Some(&b"localhost"[..]));
}

/// Runs the request side alone on `input`; its result.
async fn rewrite(input: Vec<u8>) -> Result<(), NormalizeError> {
    rewrite_requests(std::io::Cursor::new(input), tokio::io::sink(), &bounds()).await
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

    let garbage = request_with_block(&[0xff, 0xff, 0xff, 0xff, 0xff]);
    let err = rewrite(garbage).await.unwrap_err();
    assert!(err.to_string().contains("over 5 octets"), "{err}");

    let unknown_index = request_with_block(&[0xff, 0x7f]); // index 254: no such entry
    let err = rewrite(unknown_index).await.unwrap_err();
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

/// (a) A 16 KiB HEADERS frame that expands to some 50 MB is refused once its list passes the
/// server's limit, at most one field past it (how much was decoded is the error's `counted`;
/// the process's memory is measured in `core/tests/h2_authority_memory.rs`), and the
/// connection is closed on both sides. To see this fail: make `hpack.rs`'s
/// `list_size > limit` check `false`.
#[tokio::test]
async fn an_expansion_bomb_is_refused_within_the_header_list_limit() {
    let err = rewrite(request_with_block(&expansion_bomb()))
        .await
        .unwrap_err();
    let NormalizeError::HeaderListTooLarge { limit, counted } = err else {
        panic!("{err}");
    };
    assert_eq!(limit, 16 * 1024);
    assert!(counted <= limit + 4038, "{counted}");
    assert!(err.to_string().contains("limit of 16384 bytes"), "{err}");

    // through the server: no answer to stream 1, the connection closed
    let kinds = closed_after(
        server(Some(bounds())),
        &request_with_block(&expansion_bomb()),
    )
    .await;
    assert!(!kinds.contains(&HEADERS), "{kinds:?}");
}

/// (b) and (c) as a connection: a size update over 4096 and one cut short end it with a
/// protocol error, not a panic (the panic would fail this test; `hpack.rs` says how to break
/// each guard).
#[tokio::test]
async fn table_size_updates_over_4096_or_cut_short_end_the_connection() {
    let err = rewrite(request_with_block(&[0x3f, 0xe2, 0x1f, 0x82]))
        .await
        .unwrap_err();
    assert!(
        matches!(&err, NormalizeError::Protocol(m) if m.contains("COMPRESSION_ERROR")),
        "{err}"
    );
    let err = rewrite(request_with_block(&[0x3f])).await.unwrap_err();
    assert!(
        matches!(&err, NormalizeError::Protocol(m) if m.contains("size update cut short")),
        "{err}"
    );
    // and up to the limit it is taken
    let mut encoder = Encoder::new();
    let mut block = vec![0x3f, 0xe1, 0x1f]; // 4096
    block.extend(encoder.encode([(&b":method"[..], &b"GET"[..]), (b":authority", SOCKET_PATH)]));
    rewrite(request_with_block(&block)).await.unwrap();
}

/// (d) A client silent before its preface, or after a frame, is cut off once the bound
/// passes; through the server, the connection closes. To see this fail: remove the
/// `tokio::time::timeout` in `next_frame` (or in `rewrite_requests` for the preface); the
/// tests then wait out [`PATIENCE`] and fail.
#[tokio::test]
async fn an_idle_client_is_cut_off() {
    // the client's end stays open and sends nothing (the preface) or nothing more (a frame)
    for (sent, waiting_for) in [
        (Vec::new(), "HTTP/2 preface"),
        (request_with_block(&[0x82, 0x84]), "frame"),
    ] {
        let (mut client, normalizer_side) = tokio::io::duplex(1024);
        client.write_all(&sent).await.unwrap();
        let err = tokio::time::timeout(
            PATIENCE,
            rewrite_requests(normalizer_side, tokio::io::sink(), &impatient()),
        )
        .await
        .expect("the idle client was not cut off")
        .unwrap_err();
        assert!(
            matches!(err, NormalizeError::TimedOut { waiting_for: w, .. } if w == waiting_for),
            "{err}"
        );
        drop(client);
    }

    // through the server: its SETTINGS, the ACK of the client's, then the close
    let mut preface = PREFACE.to_vec();
    preface.extend(frame(0x4, 0, 0, &[]));
    let kinds = closed_after(server(Some(impatient())), &preface).await;
    assert!(kinds.contains(&0x4), "{kinds:?}");
}
