//! The HPACK side of the normalizer: each request's header block decoded with the client's
//! dynamic table and encoded again with a table of our own, within bounds that hold while the
//! block is decoded, not after.
//!
//! fluke-hpack decodes a whole block at once, with no bound on what it produces (one 16 KiB
//! frame of 1-byte references to a 4 KiB table entry decodes to some 50 MB) and with a panic on
//! a dynamic table size update cut short (it unwraps that integer). So the block is first walked
//! here, one representation at a time, reading only the integers and string lengths that give
//! each one's extent (RFC 7541 6, no Huffman and no table lookups): a size update is checked and
//! applied here and never reaches the decoder, and each header field representation is handed
//! to the decoder alone, its field counted as RFC 9113 counts a header list's size, the block
//! refused as soon as the count passes the limit the server behind applies. The decoder thus
//! never produces more than that limit plus one field, and never sees a size update.

use super::NormalizeError;
use fluke_hpack::{Decoder, Encoder};

/// The largest dynamic table a client may ask for: HTTP/2's default
/// SETTINGS_HEADER_TABLE_SIZE (RFC 9113 6.5.2), which the server behind keeps (hyper sets no
/// other, and its SETTINGS are what the client's encoder follows). A larger size update is a
/// COMPRESSION_ERROR (RFC 7541 4.2); the table's memory is bounded by it.
pub const MAX_TABLE_SIZE: usize = 4096;

/// What RFC 9113 (6.5.2, after RFC 7541 4.1) adds per field to a header list's size.
const FIELD_OVERHEAD: usize = 32;

/// The most octets one HPACK integer may take: fluke-hpack's own bound (values under 2^28),
/// kept the same here so that the extent this walk finds is the extent the decoder reads.
const MAX_INTEGER_OCTETS: usize = 5;

/// What replaces an invalid `:authority` (what kubelet's CSI client itself sends).
const LOCALHOST: &[u8] = b"localhost";

/// One connection's header blocks, rewritten in turn (the tables carry from one to the next).
pub(super) struct BlockRewriter {
    decoder: Decoder<'static>,
    encoder: Encoder<'static>,
    header_list_size: usize,
}

/// What a representation is, as far as the walk needs to know.
#[derive(Debug, PartialEq, Eq)]
enum Representation {
    /// A header field (indexed or literal, RFC 7541 6.1, 6.2): given to the decoder.
    Field,
    /// A dynamic table size update (RFC 7541 6.3) to this many bytes: applied here.
    SizeUpdate(usize),
}

impl BlockRewriter {
    /// A connection's rewriter, refusing any header list over `header_list_size` bytes.
    pub(super) fn new(header_list_size: usize) -> Self {
        let mut decoder = Decoder::new();
        // never reached (size updates do not get to the decoder), but the decoder's own check
        decoder.set_max_allowed_table_size(MAX_TABLE_SIZE);
        Self {
            decoder,
            encoder: Encoder::new(),
            header_list_size,
        }
    }

    /// `block` (a whole header block, CONTINUATION frames joined) decoded and encoded again,
    /// with an `:authority` that is not a valid authority replaced by `localhost`.
    pub(super) fn rewrite(&mut self, block: &[u8]) -> Result<Vec<u8>, NormalizeError> {
        let limit = self.header_list_size;
        let mut headers: Vec<(Vec<u8>, Vec<u8>)> = Vec::new();
        let mut list_size = 0usize;
        let mut seen_field = false;
        let mut last_was_size_update = false;
        let mut rest = block;
        while !rest.is_empty() {
            let (kind, length) = representation(rest)?;
            let (one, after) = rest.split_at_checked(length).ok_or_else(|| {
                NormalizeError::Protocol("an HPACK representation past its block's end".into())
            })?;
            last_was_size_update = matches!(kind, Representation::SizeUpdate(_));
            match kind {
                Representation::SizeUpdate(size) => {
                    // RFC 7541 4.2: only at the start of a block (h2 holds clients to it too)
                    if seen_field {
                        return Err(NormalizeError::Protocol(
                            "a dynamic table size update after a header field (COMPRESSION_ERROR)"
                                .into(),
                        ));
                    }
                    if size > MAX_TABLE_SIZE {
                        return Err(NormalizeError::Protocol(format!(
                            "a dynamic table size update to {size} bytes, over the \
                             {MAX_TABLE_SIZE} allowed (COMPRESSION_ERROR)"
                        )));
                    }
                    self.decoder.set_max_table_size(size);
                }
                Representation::Field => {
                    seen_field = true;
                    let mut fields = 0usize;
                    self.decoder
                        .decode_with_cb(one, |name, value| {
                            fields += 1;
                            list_size = list_size
                                .saturating_add(name.len())
                                .saturating_add(value.len())
                                .saturating_add(FIELD_OVERHEAD);
                            if list_size <= limit {
                                let value = normalized(&name, &value).to_vec();
                                headers.push((name.into_owned(), value));
                            }
                        })
                        .map_err(|e| {
                            NormalizeError::Protocol(format!("undecodable header block: {e:?}"))
                        })?;
                    if list_size > limit {
                        return Err(NormalizeError::HeaderListTooLarge {
                            limit,
                            counted: list_size,
                        });
                    }
                    // the walk and the decoder agree on extents by construction; if they ever
                    // did not, stop rather than forward a block decoded some other way
                    if fields != 1 {
                        return Err(NormalizeError::Protocol(format!(
                            "an HPACK field representation decoded as {fields} fields"
                        )));
                    }
                }
            }
            rest = after;
        }
        if last_was_size_update {
            return Err(NormalizeError::Protocol(
                "a header block that ends with a dynamic table size update".into(),
            ));
        }
        let mut encoded = Vec::new();
        self.encoder.encode_into(
            headers.iter().map(|(n, v)| (n.as_slice(), v.as_slice())),
            &mut encoded,
        )?;
        Ok(encoded)
    }
}

/// `value`, or `localhost` for an `:authority` that is not a valid authority.
fn normalized<'a>(name: &[u8], value: &'a [u8]) -> &'a [u8] {
    if name == b":authority" && http::uri::Authority::try_from(value).is_err() {
        LOCALHOST
    } else {
        value
    }
}

/// The kind and encoded length of the representation `block` starts with (RFC 7541 6), from
/// its integers and string lengths alone.
fn representation(block: &[u8]) -> Result<(Representation, usize), NormalizeError> {
    let first = block.first().copied().unwrap_or_default();
    if first & 0x80 != 0 {
        let (_, used) = integer(block, 7, "indexed header field")?;
        Ok((Representation::Field, used))
    } else if first & 0x40 != 0 {
        Ok((Representation::Field, literal(block, 6)?))
    } else if first & 0x20 != 0 {
        let (size, used) = integer(block, 5, "dynamic table size update")?;
        Ok((Representation::SizeUpdate(size), used))
    } else {
        // without indexing (0000) or never indexed (0001)
        Ok((Representation::Field, literal(block, 4)?))
    }
}

/// The length of the literal header field `block` starts with (RFC 7541 6.2): its name's index
/// in `prefix` bits, a name string when that index is 0, then a value string.
fn literal(block: &[u8], prefix: u32) -> Result<usize, NormalizeError> {
    let (name_index, mut used) = integer(block, prefix, "literal header field")?;
    if name_index == 0 {
        used += string(block.get(used..).unwrap_or_default(), "header name")?;
    }
    used += string(block.get(used..).unwrap_or_default(), "header value")?;
    Ok(used)
}

/// The length of the string literal `buf` starts with (RFC 7541 5.2): its length in 7 bits
/// (the eighth is the Huffman flag), then that many octets.
fn string(buf: &[u8], what: &str) -> Result<usize, NormalizeError> {
    let (length, used) = integer(buf, 7, what)?;
    used.checked_add(length)
        .filter(|&end| end <= buf.len())
        .ok_or_else(|| {
            NormalizeError::Protocol(format!("an HPACK {what} of {length} octets cut short"))
        })
}

/// The integer `buf` starts with in `prefix` bits (RFC 7541 5.1), and the octets it took: the
/// same reading as fluke-hpack's, [`MAX_INTEGER_OCTETS`] included.
fn integer(buf: &[u8], prefix: u32, what: &str) -> Result<(usize, usize), NormalizeError> {
    let cut_short = || NormalizeError::Protocol(format!("an HPACK {what} cut short"));
    let mask = u8::MAX >> (8 - prefix);
    let (&first, rest) = buf.split_first().ok_or_else(cut_short)?;
    let mut value = usize::from(first & mask);
    if value < usize::from(mask) {
        return Ok((value, 1));
    }
    for (i, &octet) in rest.iter().enumerate() {
        value += usize::from(octet & 0x7f) << (7 * i);
        if octet & 0x80 == 0 {
            return Ok((value, i + 2));
        }
        if i + 2 == MAX_INTEGER_OCTETS {
            return Err(NormalizeError::Protocol(format!(
                "an HPACK {what} with an integer over {MAX_INTEGER_OCTETS} octets"
            )));
        }
    }
    Err(cut_short())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    /// A literal header field with incremental indexing and a literal name (RFC 7541 6.2.1),
    /// strings unencoded (lengths under 127 only are in one octet; longer ones continue).
    fn indexed_literal(name: &[u8], value: &[u8]) -> Vec<u8> {
        let mut out = vec![0x40];
        for s in [name, value] {
            let mut length = Vec::new();
            fluke_hpack::encoder::encode_integer_into(s.len(), 7, 0, &mut length).unwrap();
            out.extend(length);
            out.extend(s);
        }
        out
    }

    fn refused(block: &[u8]) -> String {
        BlockRewriter::new(16 * 1024)
            .rewrite(block)
            .unwrap_err()
            .to_string()
    }

    /// The walk reads each representation's extent as the decoder does: over a block of every
    /// kind, each extent given to the decoder alone decodes as one field.
    #[test]
    fn the_walk_finds_each_representations_extent() {
        let mut block = vec![0x20, 0x3f, 0xe1, 0x1f]; // size updates to 0, then 4096
        block.push(0x82); // :method GET (static)
        block.extend(indexed_literal(b"x-long", &[b'v'; 300]));
        block.extend([0x04, 0x02, b'/', b'x']); // :path without indexing, name indexed
        block.extend([0x10, 0x01, b'n', 0x01, b'v']); // never indexed, literal name
        block.push(0xbe); // dynamic index 62: x-long
        let mut walked = Vec::new();
        let mut rest = &block[..];
        while !rest.is_empty() {
            let (kind, length) = representation(rest).unwrap();
            walked.push(kind);
            rest = &rest[length..];
        }
        use Representation::*;
        assert_eq!(
            walked,
            [
                SizeUpdate(0),
                SizeUpdate(4096),
                Field,
                Field,
                Field,
                Field,
                Field
            ]
        );
        let encoded = BlockRewriter::new(16 * 1024).rewrite(&block).unwrap();
        let decoded = Decoder::new().decode(&encoded).unwrap();
        assert_eq!(decoded.len(), 5);
        assert_eq!(decoded[4], (b"x-long".to_vec(), vec![b'v'; 300]));
    }

    /// (b) A size update over 4096 is a COMPRESSION_ERROR. To see this fail: drop the
    /// `size > MAX_TABLE_SIZE` check in `rewrite` (fluke-hpack, told the same cap, then panics
    /// on its own assertion; without `set_max_allowed_table_size` too, the block is accepted).
    #[test]
    fn a_table_size_update_over_4096_is_refused() {
        // 001 11111, then 4097 - 31 = 4066 in 7-bit groups: 0xe2 0x1f
        let err = refused(&[0x3f, 0xe2, 0x1f, 0x82]);
        assert!(err.contains("size update to 4097 bytes"), "{err}");
        assert!(err.contains("COMPRESSION_ERROR"), "{err}");
        // a size update after a field, legal in fluke-hpack, is not in RFC 7541 4.2
        let err = refused(&[0x82, 0x20]);
        assert!(err.contains("after a header field"), "{err}");
        let err = refused(&[0x20]);
        assert!(
            err.contains("ends with a dynamic table size update"),
            "{err}"
        );
    }

    /// (c) A size update cut short is an error, not a panic (fluke-hpack unwraps that integer).
    /// To see this fail: in `representation`, return `Representation::Field` for a size update
    /// (it then reaches the decoder, whose panic fails this test).
    #[test]
    fn a_truncated_size_update_is_an_error() {
        for block in [&[0x3f][..], &[0x3f, 0xff], &[0x82, 0x3f, 0x80]] {
            let err = refused(block);
            assert!(
                err.contains("dynamic table size update cut short")
                    || err.contains("after a header field"),
                "{block:x?}: {err}"
            );
        }
        let err = refused(&[0x3f, 0xff, 0xff, 0xff, 0xff, 0x01]);
        assert!(err.contains("over 5 octets"), "{err}");
        // and a string or index cut short
        assert!(refused(&[0x40, 0x05, b'a']).contains("header name of 5 octets cut short"));
        assert!(refused(&[0xff]).contains("indexed header field cut short"));
    }

    /// (a) A block of 1-byte references to a 4 KiB table entry is refused once its list passes
    /// the limit: what was decoded (the error's `counted`, every name and value the decoder
    /// produced for the block plus 32 per field) stays under the limit plus one field. To see
    /// this fail: make the `list_size > limit` check `false` (the whole block then decodes,
    /// some 50 MB, and is accepted).
    #[test]
    fn an_expansion_bomb_is_refused_before_decoding_past_the_limit() {
        let value = vec![b'b'; 4000];
        let field = b"x-bomb".len() + value.len() + FIELD_OVERHEAD;
        let mut block = indexed_literal(b"x-bomb", &value);
        let references = 16 * 1024 - block.len();
        block.resize(16 * 1024, 0xbe); // dynamic index 62, the entry above
        let err = BlockRewriter::new(16 * 1024).rewrite(&block).unwrap_err();
        let NormalizeError::HeaderListTooLarge { limit, counted } = err else {
            panic!("{err}");
        };
        assert_eq!(limit, 16 * 1024);
        assert!(counted > limit && counted <= limit + field, "{counted}");
        // what the unbounded decoder would have made of it
        let whole = (references + 1) * (field - FIELD_OVERHEAD);
        assert!(whole > 45_000_000, "{whole}");
    }

    #[test]
    fn only_an_invalid_authority_changes() {
        let mut rewriter = BlockRewriter::new(16 * 1024);
        let mut block = indexed_literal(b":authority", b"var/lib/kubelet/x.sock");
        block.extend(indexed_literal(b"x-other", b"var/lib/kubelet/x.sock"));
        let decoded = Decoder::new()
            .decode(&rewriter.rewrite(&block).unwrap())
            .unwrap();
        assert_eq!(decoded[0].1, b"localhost");
        assert_eq!(decoded[1].1, b"var/lib/kubelet/x.sock");
    }
}
