//! Snappy's framing format, as nsqd speaks it (golang/snappy's stream `Reader` and `Writer`).
//!
//! A stream is a sequence of chunks: one byte of type, three bytes of little-endian length, the
//! data. The stream identifier (`0xff`, `sNaPpY`) comes first and may repeat; data chunks carry
//! the masked CRC-32C of their uncompressed bytes, then either the snappy-compressed block
//! (`0x00`) or the bytes as they are (`0x01`), at most 64 KiB uncompressed each; padding and
//! other skippable chunks (`0x80..=0xfe`) are skipped (none may be longer than a data chunk); the reserved types `0x02..=0x7f` are an
//! error. The block codec is the `snap` crate's; the checksum is the `crc32c` crate's.

use std::io;

use bytes::{Buf, BytesMut};

use super::stream::{invalid, Decode, Encode, MAX_OUTPUT};

const STREAM_IDENTIFIER: &[u8] = b"\xff\x06\x00\x00sNaPpY";
const CHUNK_COMPRESSED: u8 = 0x00;
const CHUNK_UNCOMPRESSED: u8 = 0x01;
const CHUNK_STREAM_ID: u8 = 0xff;
/// The most uncompressed data one chunk carries.
const MAX_BLOCK: usize = 65536;
/// The longest chunk body golang/snappy accepts: checksum plus the worst-case encoding of a
/// full block (`32 + n + n/6`).
const MAX_CHUNK: usize = 4 + 32 + MAX_BLOCK + MAX_BLOCK / 6;

/// The checksum the format stores: CRC-32C, rotated and offset so that a CRC of data that
/// contains CRCs stays strong.
fn masked_crc(data: &[u8]) -> u32 {
    let crc = crc32c::crc32c(data);
    (crc.rotate_right(15)).wrapping_add(0xa282_ead8)
}

/// Writes chunks: the stream identifier once, then each block compressed unless compression
/// saves less than an eighth (golang/snappy's rule).
pub(crate) struct SnappyEncoder {
    started: bool,
    encoder: snap::raw::Encoder,
    scratch: Vec<u8>,
}

impl Default for SnappyEncoder {
    fn default() -> Self {
        SnappyEncoder {
            started: false,
            encoder: snap::raw::Encoder::new(),
            scratch: Vec::new(),
        }
    }
}

impl Encode for SnappyEncoder {
    fn encode(&mut self, input: &[u8], out: &mut Vec<u8>) -> io::Result<()> {
        if !self.started {
            out.extend_from_slice(STREAM_IDENTIFIER);
            self.started = true;
        }
        for block in input.chunks(MAX_BLOCK) {
            self.scratch
                .resize(snap::raw::max_compress_len(block.len()), 0);
            let n = self
                .encoder
                .compress(block, &mut self.scratch)
                .map_err(io::Error::other)?;
            let (kind, body) = if n >= block.len() - block.len() / 8 {
                (CHUNK_UNCOMPRESSED, block)
            } else {
                (CHUNK_COMPRESSED, &self.scratch[..n])
            };
            let len = (4 + body.len()) as u32;
            out.push(kind);
            out.extend_from_slice(&len.to_le_bytes()[..3]);
            out.extend_from_slice(&masked_crc(block).to_le_bytes());
            out.extend_from_slice(body);
        }
        Ok(())
    }
}

/// Reads chunks, checking every checksum.
pub(crate) struct SnappyDecoder {
    seen_identifier: bool,
    decoder: snap::raw::Decoder,
}

impl Default for SnappyDecoder {
    fn default() -> Self {
        SnappyDecoder {
            seen_identifier: false,
            decoder: snap::raw::Decoder::new(),
        }
    }
}

impl Decode for SnappyDecoder {
    fn decode(&mut self, input: &mut BytesMut, out: &mut BytesMut) -> io::Result<()> {
        while input.len() >= 4 && out.len() + MAX_BLOCK <= MAX_OUTPUT {
            let kind = input[0];
            let len =
                usize::from(input[1]) | usize::from(input[2]) << 8 | usize::from(input[3]) << 16;
            if !self.seen_identifier && kind != CHUNK_STREAM_ID {
                return Err(invalid("snappy stream without its stream identifier"));
            }
            if len > MAX_CHUNK {
                return Err(invalid("snappy chunk longer than the format allows"));
            }
            if input.len() < 4 + len {
                return Ok(());
            }
            let body = &input[4..4 + len];
            match kind {
                CHUNK_STREAM_ID => {
                    if body != &STREAM_IDENTIFIER[4..] {
                        return Err(invalid("snappy stream identifier is wrong"));
                    }
                    self.seen_identifier = true;
                }
                CHUNK_COMPRESSED | CHUNK_UNCOMPRESSED => {
                    if len < 4 {
                        return Err(invalid("snappy chunk too short for its checksum"));
                    }
                    let crc = u32::from_le_bytes([body[0], body[1], body[2], body[3]]);
                    let data = &body[4..];
                    let start = out.len();
                    if kind == CHUNK_COMPRESSED {
                        let n = snap::raw::decompress_len(data)
                            .map_err(|_| invalid("snappy block is corrupt"))?;
                        if n > MAX_BLOCK {
                            return Err(invalid("snappy block longer than 64 KiB"));
                        }
                        out.resize(start + n, 0);
                        self.decoder
                            .decompress(data, &mut out[start..])
                            .map_err(|_| invalid("snappy block is corrupt"))?;
                    } else {
                        if data.len() > MAX_BLOCK {
                            return Err(invalid("snappy block longer than 64 KiB"));
                        }
                        out.extend_from_slice(data);
                    }
                    if masked_crc(&out[start..]) != crc {
                        return Err(invalid("snappy chunk checksum mismatch"));
                    }
                }
                0x02..=0x7f => return Err(invalid("snappy chunk of a reserved type")),
                _ => {}
            }
            input.advance(4 + len);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decode_all(bytes: &[u8]) -> io::Result<Vec<u8>> {
        let mut decoder = SnappyDecoder::default();
        let mut input = BytesMut::from(bytes);
        let mut out = BytesMut::new();
        let mut all = Vec::new();
        loop {
            decoder.decode(&mut input, &mut out)?;
            if out.is_empty() {
                break;
            }
            all.extend_from_slice(&out);
            out.clear();
        }
        assert!(input.is_empty(), "{} bytes left undecoded", input.len());
        Ok(all)
    }

    #[test]
    fn round_trips_and_writes_the_identifier_once() {
        let mut encoder = SnappyEncoder::default();
        let mut wire = Vec::new();
        encoder
            .encode(b"hello hello hello hello", &mut wire)
            .unwrap();
        encoder.encode(&[7u8; 200_000], &mut wire).unwrap();
        assert!(wire.starts_with(STREAM_IDENTIFIER));
        assert_eq!(
            wire.windows(STREAM_IDENTIFIER.len())
                .filter(|w| *w == STREAM_IDENTIFIER)
                .count(),
            1
        );
        let mut expected = b"hello hello hello hello".to_vec();
        expected.extend_from_slice(&[7u8; 200_000]);
        assert_eq!(decode_all(&wire).unwrap(), expected);
    }

    /// golang/snappy's encoding of "OK", written by nsqd after the upgrade: identifier, then
    /// an uncompressed chunk (compression would not save an eighth).
    #[test]
    fn reads_what_go_writes() {
        let mut wire = STREAM_IDENTIFIER.to_vec();
        let data = b"\x00\x00\x00\x06\x00\x00\x00\x00OK";
        wire.push(CHUNK_UNCOMPRESSED);
        wire.extend_from_slice(&((4 + data.len()) as u32).to_le_bytes()[..3]);
        wire.extend_from_slice(&masked_crc(data).to_le_bytes());
        wire.extend_from_slice(data);
        assert_eq!(decode_all(&wire).unwrap(), data);
        // The known CRC-32C check value, masked, pins the checksum to the format's.
        assert_eq!(crc32c::crc32c(b"123456789"), 0xe306_9283);
    }

    #[test]
    fn refuses_bad_checksums_and_reserved_chunks() {
        let mut encoder = SnappyEncoder::default();
        let mut wire = Vec::new();
        encoder.encode(b"some data", &mut wire).unwrap();
        let last = wire.len() - 1;
        wire[last] ^= 1;
        assert!(decode_all(&wire).is_err());
        let mut reserved = STREAM_IDENTIFIER.to_vec();
        reserved.extend_from_slice(&[0x02, 0, 0, 0]);
        assert!(decode_all(&reserved).is_err());
        assert!(
            decode_all(b"\x01\x05\x00\x00abcde").is_err(),
            "no identifier"
        );
    }
}
