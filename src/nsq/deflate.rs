//! Raw DEFLATE (RFC 1951, no zlib header), as nsqd speaks it (Go's `compress/flate`).
//!
//! Both sides keep one compression stream for the connection's life and make each write
//! decodable at once with a sync flush (an empty stored block), so the dictionary carries over
//! from message to message. The codec is `flate2`'s (miniz_oxide, pure Rust).

use std::io;

use bytes::{Buf, BytesMut};
use flate2::{Compress, Compression, Decompress, FlushCompress, FlushDecompress, Status};

use super::stream::{invalid, Decode, Encode, MAX_OUTPUT};

/// The compressing side, at a level from 1 (fastest) to 9 (smallest).
pub(crate) struct DeflateEncoder(Compress);

impl DeflateEncoder {
    pub(crate) fn new(level: u32) -> Self {
        DeflateEncoder(Compress::new(Compression::new(level.clamp(1, 9)), false))
    }
}

impl Encode for DeflateEncoder {
    fn encode(&mut self, mut input: &[u8], out: &mut Vec<u8>) -> io::Result<()> {
        loop {
            // Room for the input as stored blocks plus the flush marker: one pass normally.
            out.reserve(input.len() + input.len() / 16 + 64);
            let before = self.0.total_in();
            self.0
                .compress_vec(input, out, FlushCompress::Sync)
                .map_err(io::Error::other)?;
            let used = (self.0.total_in() - before) as usize;
            input = &input[used..];
            // Done when all input is in and the flush fitted (space left over).
            if input.is_empty() && out.len() < out.capacity() {
                return Ok(());
            }
        }
    }
}

/// The decompressing side.
pub(crate) struct DeflateDecoder {
    inner: Decompress,
    ended: bool,
}

impl Default for DeflateDecoder {
    fn default() -> Self {
        DeflateDecoder {
            inner: Decompress::new(false),
            ended: false,
        }
    }
}

impl Decode for DeflateDecoder {
    fn decode(&mut self, input: &mut BytesMut, out: &mut BytesMut) -> io::Result<()> {
        if self.ended {
            return Err(invalid("data after the end of the deflate stream"));
        }
        let room = MAX_OUTPUT.saturating_sub(out.len());
        if room == 0 {
            return Ok(());
        }
        let mut buf = Vec::with_capacity(room.min(64 * 1024));
        let before = self.inner.total_in();
        let status = self
            .inner
            .decompress_vec(input, &mut buf, FlushDecompress::Sync)
            .map_err(|e| invalid(&format!("deflate stream is corrupt: {e}")))?;
        input.advance((self.inner.total_in() - before) as usize);
        out.extend_from_slice(&buf);
        if status == Status::StreamEnd {
            self.ended = true;
        }
        Ok(())
    }

    fn at_boundary(&self, input: &BytesMut) -> bool {
        input.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decode_all(decoder: &mut DeflateDecoder, bytes: &[u8]) -> Vec<u8> {
        let mut input = BytesMut::from(bytes);
        let mut out = BytesMut::new();
        let mut all = Vec::new();
        loop {
            decoder.decode(&mut input, &mut out).unwrap();
            if out.is_empty() {
                break;
            }
            all.extend_from_slice(&out);
            out.clear();
        }
        all
    }

    #[test]
    fn each_write_decodes_at_once_and_the_dictionary_carries_over() {
        let mut encoder = DeflateEncoder::new(6);
        let mut decoder = DeflateDecoder::default();
        let mut first = Vec::new();
        encoder.encode(&[b'a'; 300_000], &mut first).unwrap();
        assert_eq!(decode_all(&mut decoder, &first), vec![b'a'; 300_000]);
        let mut second = Vec::new();
        let text = b"the same words again and again, the same words again";
        encoder.encode(text, &mut second).unwrap();
        assert_eq!(decode_all(&mut decoder, &second), text);
        // Sync-flushed: every write ends with the empty stored block 00 00 ff ff.
        assert!(second.ends_with(&[0, 0, 0xff, 0xff]));
    }
}
