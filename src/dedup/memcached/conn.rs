//! A minimal pipelined meta-protocol connection: the store's only way to talk to memcached.
//!
//! A batch of operations needs one compare-and-swap per set, each with the CAS token its own
//! read returned, sent together in one round trip; `async-memcached`'s pipelined write applies
//! one flag list to every item and its client runs one command at a time, so it cannot. This
//! connection speaks the commands the store needs, `mg <key> v c` and `ms <key> <len> C<cas> c`
//! / `ms <key> <len> ME c` (each write answering the item's new CAS token) in pipelines of many
//! keys, the same writes quiet (`q O<n>` in place of `c`: answered only when they fail, with
//! their number, the pipeline closed by `mn`), `ma` and `mg` on the fleet's counters, plus
//! `version` as a liveness probe, and reads the answers back in order (memcached answers a
//! connection's commands in order).
//!
//! See: <https://github.com/memcached/memcached/wiki/MetaCommands>

use std::io;

use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufStream};
use tokio::net::TcpStream;

use crate::decimal::put_decimal;

/// What memcached writes to a connection it turns away when its `-c` limit of connections
/// is reached, before it closes it: an outage, not a refusal of this client.
const TOO_MANY_CONNECTIONS: &[u8] = b"ERROR Too many open connections";

/// How much of an answer that is not memcached's an error message shows: enough to tell the
/// service (`HTTP/1.1 400 Bad Request`, `<!DOCTYPE HTML>`), not a whole binary line.
const ANSWER_EXCERPT_CHARS: usize = 64;

/// Larger values are not ours (a set of 8 ways takes 275 bytes) and are not loaded.
const MAX_VALUE_BYTES: usize = 64 * 1024;

/// One item as read: its value and CAS token, or `None` when the item does not exist.
pub(super) type Read = Option<(Vec<u8>, u64)>;

/// How the server answered one write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Written {
    /// `HD`: stored; the item's new CAS token, if the server gave it.
    Stored(Option<u64>),
    /// `EX`, `NS` or `NF`: another writer got there first (CAS mismatch, add of an existing
    /// item, or CAS on an item that vanished).
    Conflict,
}

/// One write of a pipeline: the key, the new value, the CAS token of the read it follows
/// (`None`: the item did not exist, so write only if it still does not), and whether it is
/// quiet: answered only if it fails, so the item's new CAS token stays unknown.
pub(super) struct Write<'a> {
    pub(super) key: &'a str,
    pub(super) value: &'a [u8],
    pub(super) cas: Option<u64>,
    pub(super) quiet: bool,
}

/// A TCP connection to one memcached that sends pipelines of meta commands.
///
/// A pipeline that is cut short (an error, or the future being dropped on timeout) leaves
/// unread answers on the socket, so the pool discards the connection unless the caller marks
/// it healthy after a complete exchange.
pub(super) struct PipeConn {
    stream: BufStream<TcpStream>,
    line: Vec<u8>,
    /// A pipeline's commands, gathered before one write (kept to reuse its allocation).
    out: Vec<u8>,
}

impl PipeConn {
    /// Connects to `addr` (`host:port`).
    pub(super) async fn connect(addr: &str) -> io::Result<Self> {
        let stream = TcpStream::connect(addr).await?;
        stream.set_nodelay(true)?;
        Ok(PipeConn {
            stream: BufStream::with_capacity(64 * 1024, 64 * 1024, stream),
            line: Vec::with_capacity(128),
            out: Vec::new(),
        })
    }

    /// Asks the server's version: a round trip that proves it answers.
    ///
    /// # Errors
    ///
    /// [`io::ErrorKind::InvalidData`] when the server answered something memcached does not
    /// (its bytes are then [`PipeConn::last_answer`]): another line, or bytes that are not
    /// the start of memcached's answer followed by the end of the connection (an HTTP
    /// server's error page, whose lines end in LF alone, or a TLS alert).
    /// [`io::ErrorKind::ConnectionRefused`] when memcached turned the connection away (its
    /// `-c` limit of connections reached). Any other error is the connection's.
    pub(super) async fn version(&mut self) -> io::Result<String> {
        self.stream.write_all(b"version\r\n").await?;
        self.stream.flush().await?;
        match self.read_line().await {
            Ok(()) => {}
            // Memcached ends every line with CRLF: bytes that cannot begin its answer, then
            // nothing more, are another service's answer. A start of `VERSION ` cut short
            // is memcached gone mid-answer, an outage.
            Err(err)
                if err.kind() == io::ErrorKind::UnexpectedEof
                    && !self.line.is_empty()
                    && !b"VERSION ".starts_with(&self.line)
                    && !self.line.starts_with(b"VERSION ") =>
            {
                return Err(self.unexpected("version"));
            }
            Err(err) => return Err(err),
        }
        if let Some(version) = self.line.strip_prefix(b"VERSION ") {
            return Ok(String::from_utf8_lossy(version).into_owned());
        }
        if self.line == TOO_MANY_CONNECTIONS {
            return Err(io::Error::new(
                io::ErrorKind::ConnectionRefused,
                "memcached refused the connection: too many open connections (its -c limit)",
            ));
        }
        Err(self.unexpected("version"))
    }

    /// The start of what the server answered last (its first line, without its line end),
    /// for an error message: at most [`ANSWER_EXCERPT_CHARS`] characters, and whether it was
    /// cut.
    pub(super) fn last_answer(&self) -> (String, bool) {
        let line = self.line.split(|&b| b == b'\n').next().unwrap_or_default();
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        let text = String::from_utf8_lossy(line);
        let excerpt: String = text.chars().take(ANSWER_EXCERPT_CHARS).collect();
        let cut = excerpt.len() < text.len();
        (excerpt, cut)
    }

    /// Reads `keys` in one round trip, with their CAS tokens.
    pub(super) async fn get_many(&mut self, keys: &[&str]) -> io::Result<Vec<Read>> {
        let mut out = std::mem::take(&mut self.out);
        out.clear();
        push_reads(&mut out, keys);
        let sent = self.send(&out).await;
        self.out = out;
        sent?;
        self.read_values(keys.len()).await
    }

    /// Reads the answers of `count` reads (`mg <key> v c`), in order.
    async fn read_values(&mut self, count: usize) -> io::Result<Vec<Read>> {
        let mut reads = Vec::with_capacity(count);
        for _ in 0..count {
            self.read_line().await?;
            if self.line.starts_with(b"EN") {
                reads.push(None);
                continue;
            }
            let Some(header) = self.line.strip_prefix(b"VA ") else {
                return Err(self.unexpected("mg"));
            };
            let (len, cas) = parse_value_header(header).ok_or_else(|| self.unexpected("mg"))?;
            if len > MAX_VALUE_BYTES {
                // Not a value we wrote: skip it (keeping the connection in step) and hand back
                // an empty value, which the store counts as unreadable and overwrites.
                let skip = len as u64 + 2;
                let skipped =
                    tokio::io::copy(&mut (&mut self.stream).take(skip), &mut tokio::io::sink())
                        .await?;
                if skipped != skip {
                    return Err(io::ErrorKind::UnexpectedEof.into());
                }
                reads.push(Some((Vec::new(), cas)));
                continue;
            }
            let mut value = vec![0; len + 2];
            self.stream.read_exact(&mut value).await?;
            if !value.ends_with(b"\r\n") {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    "memcached value not terminated by CRLF",
                ));
            }
            value.truncate(len);
            reads.push(Some((value, cas)));
        }
        Ok(reads)
    }

    /// Writes `writes` in one round trip, each as a compare-and-swap or an add; each answered
    /// write asks for the item's new CAS token, each quiet one is answered only if it fails.
    pub(super) async fn set_many(&mut self, writes: &[Write<'_>]) -> io::Result<Vec<Written>> {
        Ok(self.read_and_set_many(&[], writes).await?.1)
    }

    /// Reads `keys` (as [`PipeConn::get_many`]), then writes `writes` (as
    /// [`PipeConn::set_many`]), in one round trip.
    ///
    /// A quiet write carries its index as the opaque token (`O<n>`), which memcached repeats in
    /// a failure's answer; the pipeline then ends with `mn`, answered `MN` after every other
    /// answer, so we know that the quiet writes not named before it were stored.
    pub(super) async fn read_and_set_many(
        &mut self,
        keys: &[&str],
        writes: &[Write<'_>],
    ) -> io::Result<(Vec<Read>, Vec<Written>)> {
        let mut out = std::mem::take(&mut self.out);
        out.clear();
        push_reads(&mut out, keys);
        let mut quiet = 0;
        for (index, write) in writes.iter().enumerate() {
            out.extend_from_slice(b"ms ");
            out.extend_from_slice(write.key.as_bytes());
            out.push(b' ');
            put_decimal(&mut out, write.value.len() as u64);
            match write.cas {
                Some(cas) => {
                    out.extend_from_slice(b" C");
                    put_decimal(&mut out, cas);
                }
                None => out.extend_from_slice(b" ME"),
            }
            if write.quiet {
                quiet += 1;
                out.extend_from_slice(b" q O");
                put_decimal(&mut out, index as u64);
                out.extend_from_slice(b"\r\n");
            } else {
                out.extend_from_slice(b" c\r\n");
            }
            out.extend_from_slice(write.value);
            out.extend_from_slice(b"\r\n");
        }
        if quiet > 0 {
            out.extend_from_slice(b"mn\r\n");
        }
        let sent = self.send(&out).await;
        self.out = out;
        sent?;
        let reads = self.read_values(keys.len()).await?;
        // Until answered otherwise, a quiet write was stored (its token unknown).
        let mut written = vec![Written::Stored(None); writes.len()];
        // The answered writes, in order, and how many of them are still to be answered.
        let mut answered = writes.iter().enumerate().filter(|(_, w)| !w.quiet);
        let mut unanswered = writes.len() - quiet;
        loop {
            if quiet == 0 && unanswered == 0 {
                return Ok((reads, written));
            }
            self.read_line().await?;
            if quiet > 0 && self.line.as_slice() == b"MN" {
                if unanswered == 0 {
                    return Ok((reads, written));
                }
                return Err(self.unexpected("mn"));
            }
            let flags = self.line.get(2..).unwrap_or_default();
            let index = match flag_number(flags, b'O') {
                Some(index) if quiet > 0 => usize::try_from(index)
                    .ok()
                    .filter(|&i| writes.get(i).is_some_and(|w| w.quiet)),
                _ => answered.next().map(|(i, _)| {
                    unanswered -= 1;
                    i
                }),
            };
            let Some(index) = index else {
                return Err(self.unexpected("ms"));
            };
            written[index] = match self.line.get(..2) {
                Some(b"HD") if !writes[index].quiet => Written::Stored(flag_number(flags, b'c')),
                Some(b"EX" | b"NS" | b"NF") => Written::Conflict,
                _ => return Err(self.unexpected("ms")),
            };
        }
    }

    /// Writes `bytes` straight to the socket: a pipeline is gathered in one buffer already,
    /// so it goes out without a copy into the stream's write buffer (which every write
    /// leaves empty, flushed).
    async fn send(&mut self, bytes: &[u8]) -> io::Result<()> {
        self.stream.get_mut().write_all(bytes).await
    }

    /// Adds `delta` to the counter `key` (made with `delta` and a lifetime of `ttl_secs` if it
    /// does not exist) and reads the counters `counters`, in one round trip; a counter that does
    /// not exist reads as 0.
    pub(super) async fn add_and_read(
        &mut self,
        key: &str,
        delta: u64,
        ttl_secs: u64,
        counters: &[String],
    ) -> io::Result<Vec<u64>> {
        let mut out = std::mem::take(&mut self.out);
        out.clear();
        out.extend_from_slice(b"ma ");
        out.extend_from_slice(key.as_bytes());
        out.extend_from_slice(b" N");
        put_decimal(&mut out, ttl_secs);
        out.extend_from_slice(b" J");
        put_decimal(&mut out, delta);
        out.extend_from_slice(b" D");
        put_decimal(&mut out, delta);
        out.extend_from_slice(b"\r\n");
        for counter in counters {
            out.extend_from_slice(b"mg ");
            out.extend_from_slice(counter.as_bytes());
            out.extend_from_slice(b" v\r\n");
        }
        let sent = self.send(&out).await;
        self.out = out;
        sent?;
        self.read_line().await?;
        if !self.line.starts_with(b"HD") {
            return Err(self.unexpected("ma"));
        }
        let mut values = Vec::with_capacity(counters.len());
        for _ in counters {
            self.read_line().await?;
            if self.line.starts_with(b"EN") {
                values.push(0);
                continue;
            }
            let len = self
                .line
                .strip_prefix(b"VA ")
                .and_then(|h| std::str::from_utf8(h).ok()?.split(' ').next()?.parse().ok())
                .filter(|&len: &usize| len <= 20)
                .ok_or_else(|| self.unexpected("mg"))?;
            let mut value = vec![0; len + 2];
            self.stream.read_exact(&mut value).await?;
            let number = std::str::from_utf8(&value[..len])
                .ok()
                .and_then(|v| v.trim().parse().ok())
                .ok_or_else(|| {
                    io::Error::new(io::ErrorKind::InvalidData, "a counter is not a number")
                })?;
            values.push(number);
        }
        Ok(values)
    }

    /// Reads one CRLF-terminated line into `self.line`, without the CRLF.
    async fn read_line(&mut self) -> io::Result<()> {
        self.line.clear();
        let n = self.stream.read_until(b'\n', &mut self.line).await?;
        if n == 0 {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
        if !self.line.ends_with(b"\r\n") {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
        self.line.truncate(self.line.len() - 2);
        Ok(())
    }

    fn unexpected(&self, command: &str) -> io::Error {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!(
                "unexpected answer to `{command}`: {:?}",
                String::from_utf8_lossy(&self.line)
            ),
        )
    }
}

/// Appends a read of each of `keys`, with its CAS token (`mg <key> v c`), to `out`.
fn push_reads(out: &mut Vec<u8>, keys: &[&str]) {
    for key in keys {
        out.extend_from_slice(b"mg ");
        out.extend_from_slice(key.as_bytes());
        out.extend_from_slice(b" v c\r\n");
    }
}

/// Parses `<len> c<cas>` (flags in any order) from a `VA` line.
fn parse_value_header(header: &[u8]) -> Option<(usize, u64)> {
    let text = std::str::from_utf8(header).ok()?;
    let (len, flags) = text.split_once(' ')?;
    Some((len.parse().ok()?, flag_number(flags.as_bytes(), b'c')?))
}

/// The number of the flag `flag` (`c<cas>`, `O<opaque>`) among the space-separated return
/// flags `flags`.
fn flag_number(flags: &[u8], flag: u8) -> Option<u64> {
    flags.split(|&b| b == b' ').find_map(|f| {
        std::str::from_utf8(f.strip_prefix(&[flag])?)
            .ok()?
            .parse()
            .ok()
    })
}

#[cfg(test)]
mod tests {
    use super::{flag_number, parse_value_header};

    #[test]
    fn value_header_gives_length_and_cas() {
        assert_eq!(parse_value_header(b"35 c17"), Some((35, 17)));
        assert_eq!(parse_value_header(b"0 t-1 c9"), Some((0, 9)));
        assert_eq!(parse_value_header(b"35"), None);
        assert_eq!(parse_value_header(b"x c1"), None);
    }

    #[test]
    fn a_write_answer_gives_its_cas() {
        assert_eq!(flag_number(b" c42", b'c'), Some(42));
        assert_eq!(flag_number(b"", b'c'), None);
        assert_eq!(flag_number(b" t-1 c7", b'c'), Some(7));
        assert_eq!(flag_number(b" O12", b'O'), Some(12));
        assert_eq!(flag_number(b" O12", b'c'), None);
    }
}
