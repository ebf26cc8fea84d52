//! The HTTP/2 `:authority` normalizer in front of the agent's plugin-registration server
//! (`athenz_core::serving::h2_authority`), with the bounds that server uses: the input is all a
//! client sends on one connection. Besides no panic, what a pass promises about what the
//! server receives: whole frames of at most 16 KiB after the preface, each header block
//! decoding (with the server's table, a decoder of its own here) to a header list within the
//! server's limit with any `:authority` a valid authority, and no more than that list size per
//! block on top of the input.
#![no_main]

use athenz_core::serving::h2_authority::{Bounds, rewrite_client_bytes};
use athenz_core::unix_socket::MAX_HEADER_LIST_SIZE;
use fluke_hpack::Decoder;
use libfuzzer_sys::fuzz_target;
use std::sync::LazyLock;

const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
const HEADERS: u8 = 0x1;
const CONTINUATION: u8 = 0x9;
const END_HEADERS: u8 = 0x4;

/// One runtime for every input (the normalizer's timeouts need one; a slice never waits).
static RUNTIME: LazyLock<tokio::runtime::Runtime> = LazyLock::new(|| {
    tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .expect("a Tokio runtime")
});

fuzz_target!(|data: &[u8]| {
    let bounds = Bounds::new(MAX_HEADER_LIST_SIZE);
    let mut out = Vec::new();
    let _ = RUNTIME.block_on(rewrite_client_bytes(data, &mut out, bounds));
    if out.is_empty() {
        return;
    }
    let frames = out
        .strip_prefix(PREFACE)
        .expect("output starts with the preface");
    let mut rest = frames;
    let mut decoder = Decoder::new();
    let mut block: Option<Vec<u8>> = None;
    let mut blocks = 0usize;
    while !rest.is_empty() {
        let (header, after) = rest.split_at_checked(9).expect("a whole frame header");
        let length =
            usize::from(header[0]) << 16 | usize::from(header[1]) << 8 | usize::from(header[2]);
        assert!(length <= 16_384, "a frame of {length} bytes");
        let (payload, after) = after.split_at_checked(length).expect("a whole frame");
        let (kind, flags) = (header[3], header[4]);
        // the normalizer's own blocks: a HEADERS frame without padding or priority, and its
        // CONTINUATION frames (a CONTINUATION the client sent alone passes as it came)
        match (kind, block.as_mut()) {
            (HEADERS, _) => {
                assert!(block.is_none(), "a header block interrupted");
                block = Some(payload.to_vec());
            }
            (CONTINUATION, Some(open)) => open.extend_from_slice(payload),
            _ => assert!(block.is_none(), "a header block interrupted"),
        }
        if flags & END_HEADERS != 0
            && matches!(kind, HEADERS | CONTINUATION)
            && let Some(whole) = block.take()
        {
            blocks += 1;
            let mut list_size = 0;
            decoder
                .decode_with_cb(&whole, |name, value| {
                    list_size += name.len() + value.len() + 32;
                    if &name[..] == b":authority" {
                        assert!(
                            http::uri::Authority::try_from(&value[..]).is_ok(),
                            "an :authority passed on as {value:?}"
                        );
                    }
                })
                .expect("the server can decode what the normalizer encoded");
            assert!(
                list_size <= bounds.header_list_size,
                "a header list of {list_size} bytes"
            );
        }
        rest = after;
    }
    assert!(block.is_none(), "a header block left open");
    assert!(
        out.len() <= data.len() + blocks * (bounds.header_list_size + 9),
        "{} bytes out of {} in, {blocks} header blocks",
        out.len(),
        data.len()
    );
});
