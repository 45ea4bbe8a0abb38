//! The byte streams a connection's frames travel on, and the adapters that compress them.
//!
//! After IDENTIFY a connection may be wrapped in TLS and then in snappy or deflate (nsqd's
//! order). Each layer is one [`AsyncRead`] half and one [`AsyncWrite`] half; the frame reader and
//! the writer task see only the outermost pair ([`ReadHalf`], [`WriteHalf`]).
//!
//! A compression is a pair of [`Encode`] and [`Decode`] steps; [`Encoding`] and [`Decoding`]
//! turn them into async halves:
//! - Writing: each `write` call is encoded whole and ends with a flush point of the compression
//!   (nsqd decodes what we sent at once), then drained to the inner writer. The writer task
//!   writes one batch of commands per call, so one batch is one compressed block.
//! - Reading: bytes from the inner reader are decoded in bounded steps. A decoder never holds
//!   more than [`MAX_INPUT`] undecoded bytes or [`MAX_OUTPUT`] decoded ones, whatever nsqd sends.

use std::io;
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use bytes::{Buf, BytesMut};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// The read side of a connection, whatever layers it has.
pub(crate) type ReadHalf = Box<dyn AsyncRead + Send + Unpin>;
/// The write side of a connection, whatever layers it has.
pub(crate) type WriteHalf = Box<dyn AsyncWrite + Send + Unpin>;

/// Largest amount of undecoded input a [`Decoding`] holds: a whole snappy chunk (at most
/// 64 KiB of data, encoded) fits, with room for the next one's start.
pub(crate) const MAX_INPUT: usize = 160 * 1024;
/// Largest amount of decoded output a [`Decoding`] holds before its reader takes it.
pub(crate) const MAX_OUTPUT: usize = 128 * 1024;

/// One direction's compressor.
pub(crate) trait Encode: Send + Unpin {
    /// Appends `input`, encoded and flushed so the peer can decode all of it, to `out`.
    fn encode(&mut self, input: &[u8], out: &mut Vec<u8>) -> io::Result<()>;
}

/// One direction's decompressor.
pub(crate) trait Decode: Send + Unpin {
    /// Decodes from the front of `input` (removing what it used) into `out`, adding at most
    /// about `MAX_OUTPUT - out.len()` bytes. Doing nothing means it needs more input.
    ///
    /// # Errors
    ///
    /// [`io::ErrorKind::InvalidData`] for input that is not valid in this encoding.
    fn decode(&mut self, input: &mut BytesMut, out: &mut BytesMut) -> io::Result<()>;

    /// Whether the stream may end here (no partial unit pending).
    fn at_boundary(&self, input: &BytesMut) -> bool {
        input.is_empty()
    }
}

/// An [`AsyncWrite`] that encodes everything written with `E` before passing it on.
pub(crate) struct Encoding<W, E> {
    inner: W,
    encoder: E,
    /// Encoded bytes not yet accepted by `inner`.
    pending: Vec<u8>,
    /// How much of `pending` `inner` took.
    sent: usize,
}

impl<W, E> Encoding<W, E> {
    pub(crate) fn new(inner: W, encoder: E) -> Self {
        Encoding {
            inner,
            encoder,
            pending: Vec::new(),
            sent: 0,
        }
    }
}

impl<W: AsyncWrite + Unpin, E: Encode> Encoding<W, E> {
    /// Writes out `pending`.
    fn poll_drain(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        while self.sent < self.pending.len() {
            let n = ready!(Pin::new(&mut self.inner).poll_write(cx, &self.pending[self.sent..]))?;
            if n == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            self.sent += n;
        }
        self.pending.clear();
        self.sent = 0;
        Poll::Ready(Ok(()))
    }
}

impl<W: AsyncWrite + Unpin, E: Encode> AsyncWrite for Encoding<W, E> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        ready!(this.poll_drain(cx))?;
        this.encoder.encode(buf, &mut this.pending)?;
        // Start sending now; what does not fit goes out on the next write or flush.
        match this.poll_drain(cx) {
            Poll::Ready(Err(e)) => Poll::Ready(Err(e)),
            _ => Poll::Ready(Ok(buf.len())),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        ready!(this.poll_drain(cx))?;
        Pin::new(&mut this.inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        ready!(this.poll_drain(cx))?;
        Pin::new(&mut this.inner).poll_shutdown(cx)
    }
}

/// An [`AsyncRead`] that decodes what `inner` yields with `D`.
pub(crate) struct Decoding<R, D> {
    inner: R,
    decoder: D,
    input: BytesMut,
    output: BytesMut,
    eof: bool,
}

impl<R, D> Decoding<R, D> {
    pub(crate) fn new(inner: R, decoder: D) -> Self {
        Decoding {
            inner,
            decoder,
            input: BytesMut::with_capacity(64 * 1024),
            output: BytesMut::with_capacity(64 * 1024),
            eof: false,
        }
    }
}

impl<R: AsyncRead + Unpin, D: Decode> AsyncRead for Decoding<R, D> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        loop {
            if !this.output.is_empty() {
                let n = this.output.len().min(buf.remaining());
                buf.put_slice(&this.output[..n]);
                this.output.advance(n);
                return Poll::Ready(Ok(()));
            }
            // Called even without new input: a decoder may hold output it had no room for.
            this.decoder.decode(&mut this.input, &mut this.output)?;
            if !this.output.is_empty() {
                continue;
            }
            if this.eof {
                return Poll::Ready(if this.decoder.at_boundary(&this.input) {
                    Ok(())
                } else {
                    Err(io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        "the connection ended inside a compressed block",
                    ))
                });
            }
            if this.input.len() >= MAX_INPUT {
                return Poll::Ready(Err(invalid("a compressed unit larger than any nsqd sends")));
            }
            this.input.reserve(32 * 1024);
            let filled = ready!(tokio_util::io::poll_read_buf(
                Pin::new(&mut this.inner),
                cx,
                &mut this.input
            ))?;
            if filled == 0 {
                this.eof = true;
            }
        }
    }
}

/// An [`io::ErrorKind::InvalidData`] error saying what was wrong.
pub(crate) fn invalid(what: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, what.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::nsq::deflate::{DeflateDecoder, DeflateEncoder};
    use crate::nsq::snappy::{SnappyDecoder, SnappyEncoder};
    use proptest::prelude::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// Yields its chunks one read at a time, as a socket does.
    struct Chunks(std::collections::VecDeque<Vec<u8>>);

    impl AsyncRead for Chunks {
        fn poll_read(
            self: Pin<&mut Self>,
            _cx: &mut Context<'_>,
            buf: &mut ReadBuf<'_>,
        ) -> Poll<io::Result<()>> {
            let this = self.get_mut();
            if let Some(mut chunk) = this.0.pop_front() {
                let n = chunk.len().min(buf.remaining());
                buf.put_slice(&chunk[..n]);
                if n < chunk.len() {
                    this.0.push_front(chunk.split_off(n));
                }
            }
            Poll::Ready(Ok(()))
        }
    }

    fn split(bytes: &[u8], cuts: &[usize]) -> Chunks {
        let mut chunks = std::collections::VecDeque::new();
        let mut rest = bytes;
        for &cut in cuts {
            if rest.is_empty() {
                break;
            }
            let (head, tail) = rest.split_at(cut.min(rest.len()).max(1));
            chunks.push_back(head.to_vec());
            rest = tail;
        }
        if !rest.is_empty() {
            chunks.push_back(rest.to_vec());
        }
        Chunks(chunks)
    }

    /// Reads everything, checking after every read that the decoder's buffers stay bounded.
    fn drain<D: Decode>(mut reader: Decoding<Chunks, D>) -> io::Result<Vec<u8>> {
        futures::executor::block_on(async {
            let mut all = Vec::new();
            let mut buf = [0u8; 4096];
            // Each read consumes input or ends the stream, so this is bounded by the input.
            loop {
                let n = reader.read(&mut buf).await?;
                assert!(reader.input.len() <= MAX_INPUT + 64 * 1024);
                assert!(reader.output.len() <= MAX_OUTPUT + 64 * 1024);
                if n == 0 {
                    return Ok(all);
                }
                all.extend_from_slice(&buf[..n]);
            }
        })
    }

    fn encode<E: Encode>(encoder: E, writes: &[Vec<u8>]) -> Vec<u8> {
        futures::executor::block_on(async {
            let mut out = Encoding::new(Vec::new(), encoder);
            for write in writes {
                out.write_all(write).await.unwrap();
                out.flush().await.unwrap();
            }
            out.inner
        })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(32))]

        #[test]
        fn random_bytes_never_panic_nor_buffer_without_bound(
            bytes in proptest::collection::vec(any::<u8>(), 0..100_000),
            cuts in proptest::collection::vec(1usize..70_000, 0..16),
            snappy_header in any::<bool>(),
        ) {
            let mut snappy = if snappy_header { b"\xff\x06\x00\x00sNaPpY".to_vec() } else { Vec::new() };
            snappy.extend_from_slice(&bytes);
            let _ = drain(Decoding::new(split(&snappy, &cuts), SnappyDecoder::default()));
            let _ = drain(Decoding::new(split(&bytes, &cuts), DeflateDecoder::default()));
        }

        #[test]
        fn writes_decode_to_the_same_bytes_however_they_arrive(
            writes in proptest::collection::vec(
                proptest::collection::vec(0u8..4, 0..70_000), 1..5),
            cuts in proptest::collection::vec(1usize..70_000, 0..16),
            level in 1u32..=9,
        ) {
            let expected: Vec<u8> = writes.concat();
            let wire = encode(SnappyEncoder::default(), &writes);
            prop_assert_eq!(drain(Decoding::new(split(&wire, &cuts), SnappyDecoder::default())).unwrap(), expected.clone());
            let wire = encode(DeflateEncoder::new(level), &writes);
            prop_assert_eq!(drain(Decoding::new(split(&wire, &cuts), DeflateDecoder::default())).unwrap(), expected);
        }
    }
}
