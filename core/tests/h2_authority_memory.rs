//! The `:authority` normalizer's memory under an HPACK expansion bomb, measured on the process
//! itself: a test binary of its own, so that nothing else runs in the process while its peak
//! resident size (`VmHWM` in `/proc/self/status`) is read before and after. A 16 KiB HEADERS
//! frame whose block decodes to some 50 MB (a 4 KiB field added to the dynamic table, then
//! 1-byte references to it) must leave the peak where it was: the normalizer refuses the block
//! once its header list passes the server's limit, having kept at most that much. To see this
//! fail: in `hpack.rs`'s `rewrite`, make the callback keep every field (`if true || list_size
//! <= limit`) and the refusal never happen (`if false && list_size > limit`): the peak then
//! rises by the decoded 50 MB or so.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use athenz_core::serving::h2_authority::{Bounds, NormalizeError, rewrite_client_bytes};
use athenz_core::unix_socket::MAX_HEADER_LIST_SIZE;

/// A `/proc/self/status` field, in KiB.
fn status_kib(field: &str) -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = status
        .lines()
        .find(|l| l.starts_with(field))
        .unwrap_or_else(|| panic!("no {field} in /proc/self/status"));
    line[field.len()..]
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .unwrap()
}

/// The client's bytes: the preface, empty SETTINGS, and one 16 KiB HEADERS frame holding the bomb.
fn bomb_connection() -> Vec<u8> {
    let mut block = vec![0x40, 0x06];
    block.extend(b"x-bomb");
    block.extend([0x7f, 0xa1, 0x1e]); // a 4000-byte value: 127 + 3873
    block.extend([b'b'; 4000]);
    block.resize(16_384, 0xbe); // dynamic index 62: x-bomb
    let mut bytes = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
    bytes.extend([0, 0, 0, 0x4, 0, 0, 0, 0, 0]);
    bytes.extend([0x00, 0x40, 0x00, 0x1, 0x5, 0, 0, 0, 1]); // HEADERS, END_STREAM | END_HEADERS
    bytes.extend(block);
    bytes
}

#[test]
fn an_expansion_bomb_leaves_the_peak_resident_size_where_it_was() {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    let input = bomb_connection();
    // the runtime, the input and the output allocated and touched before the first reading
    let mut out = vec![0u8; 64 * 1024];
    out.clear();
    let before = status_kib("VmHWM:");
    let result = runtime.block_on(rewrite_client_bytes(
        &input,
        &mut out,
        Bounds::new(MAX_HEADER_LIST_SIZE),
    ));
    let after = status_kib("VmHWM:");
    eprintln!(
        "VmHWM before {before} KiB, after {after} KiB (VmRSS now {} KiB); {} input bytes, {:?}",
        status_kib("VmRSS:"),
        input.len(),
        result.as_ref().map_err(ToString::to_string),
    );
    // the allowance: the block, the header list up to its limit, one 4 KiB field, and the
    // allocator's rounding; the unbounded decoder's list alone is some 50 MB
    assert!(
        after.saturating_sub(before) < 2 * 1024,
        "the peak rose by {} KiB",
        after - before
    );
    assert!(
        matches!(result, Err(NormalizeError::HeaderListTooLarge { .. })),
        "{result:?}"
    );
}
