//! The Redis protocol (RESP2) as the store's own connection speaks it (`conn::lean`): commands
//! written once, straight into one buffer for a whole pipeline, and replies parsed in place
//! from the bytes read, a bulk string left where it was read ([`Span`]) in the buffer of its
//! pipeline's replies ([`Replies`]), not copied out.
//!
//! The `redis` crate builds each command as a vector of arguments, copies them into a packed
//! buffer, and parses each reply into a [`redis::Value`] through a decoder of its own; on the
//! hot path, whose values are 0.5–1.6 KB and whose conditional write sends two of them, that
//! was a third of the sidecar's CPU (`docs/design.md`, "Our own RESP client").
//!
//! See: <https://redis.io/docs/latest/develop/reference/protocol-spec/>

use super::recycle;
use crate::decimal::put_decimal;

/// The most elements of an array reply, and bytes of a bulk string, this parser takes: far
/// more than any answer of ours (an item of 64 sets of 8 ways is under 20 KB), and a bound
/// on what a stream that is not Redis's could make us allocate.
const MAX_LEN: usize = 512 * 1024 * 1024;

/// The commands of one pipeline, encoded, and how many.
#[derive(Debug, Default)]
pub(super) struct Commands {
    bytes: Vec<u8>,
    count: usize,
}

impl Commands {
    /// An empty pipeline whose buffer holds `bytes` before it grows (a buffer used before,
    /// when the thread has one: see `recycle`).
    pub(super) fn with_capacity(bytes: usize) -> Self {
        Commands {
            bytes: recycle::pipeline(bytes),
            count: 0,
        }
    }

    /// Appends the command of `args` (its name first).
    pub(super) fn push(&mut self, args: &[&[u8]]) {
        self.bytes.push(b'*');
        put_decimal(&mut self.bytes, args.len() as u64);
        self.bytes.extend_from_slice(b"\r\n");
        for arg in args {
            self.bytes.push(b'$');
            put_decimal(&mut self.bytes, arg.len() as u64);
            self.bytes.extend_from_slice(b"\r\n");
            self.bytes.extend_from_slice(arg);
            self.bytes.extend_from_slice(b"\r\n");
        }
        self.count += 1;
    }

    /// The encoded commands.
    pub(super) fn bytes(&self) -> &[u8] {
        &self.bytes
    }

    /// How many commands.
    pub(super) fn len(&self) -> usize {
        self.count
    }

    /// Whether it holds no command.
    pub(super) fn is_empty(&self) -> bool {
        self.count == 0
    }
}

impl Drop for Commands {
    fn drop(&mut self) {
        recycle::give_pipeline(std::mem::take(&mut self.bytes));
    }
}

/// One reply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Reply {
    /// `$-1` or `*-1`: no value.
    Nil,
    /// `+OK`, the commonest status, told apart without a string.
    Okay,
    /// Any other status (`+…`).
    Status(String),
    /// `:…`.
    Int(i64),
    /// `$…`: a bulk string, where it lies in the bytes it was parsed from.
    Bulk(Span),
    /// `*…`.
    Array(Vec<Reply>),
    /// `-…`: an error reply, its code first (`MOVED 3999 127.0.0.1:7001`, `ERR syntax error`).
    Error(String),
}

impl Reply {
    /// An error reply's code (its first word: `MOVED`, `ERR`, `NOSCRIPT`), if it is one.
    pub(super) fn error_code(&self) -> Option<&str> {
        match self {
            Reply::Error(text) => text.split(' ').next(),
            _ => None,
        }
    }
}

/// Where a bulk string lies in the bytes its reply was parsed from: its first byte's offset,
/// and the offset after its last.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Span {
    start: usize,
    end: usize,
}

impl Span {
    /// Its bytes in `bytes`, those it was parsed from.
    ///
    /// # Panics
    ///
    /// If `bytes` is shorter than the bytes it was parsed from.
    pub(super) fn of<'a>(&self, bytes: &'a [u8]) -> &'a [u8] {
        &bytes[self.start..self.end]
    }

    /// `value`, appended to `bytes`, as a bulk string parsed from them.
    pub(super) fn appended(bytes: &mut Vec<u8>, value: &[u8]) -> Span {
        let start = bytes.len();
        bytes.extend_from_slice(value);
        Span {
            start,
            end: bytes.len(),
        }
    }
}

/// The replies of a pipeline, in order, and the bytes read that their bulk strings lie in: a
/// value read is used where it was read (decided on, and sent again as `IFEQ`'s old value)
/// while these are kept, and never copied out. The bytes go back to the thread's buffers
/// (`recycle`) when dropped.
#[derive(Debug, Default)]
pub(super) struct Replies {
    bytes: Vec<u8>,
    list: Vec<Reply>,
}

impl Replies {
    /// `list`, parsed from `bytes`.
    pub(super) fn new(bytes: Vec<u8>, list: Vec<Reply>) -> Self {
        Replies { bytes, list }
    }

    /// The bytes of the bulk string at `span`.
    pub(super) fn bulk(&self, span: Span) -> &[u8] {
        span.of(&self.bytes)
    }

    /// How many replies.
    pub(super) fn len(&self) -> usize {
        self.list.len()
    }

    /// The replies, taken out (the bytes stay, for their bulk strings).
    pub(super) fn take_list(&mut self) -> Vec<Reply> {
        std::mem::take(&mut self.list)
    }
}

impl Drop for Replies {
    fn drop(&mut self) {
        recycle::give_pipeline(std::mem::take(&mut self.bytes));
    }
}

/// Bytes that are not a reply of Redis's: the connection is out of step and must go.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Invalid(pub(super) String);

impl std::fmt::Display for Invalid {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "not a Redis reply: {}", self.0)
    }
}

impl std::error::Error for Invalid {}

/// The reply at offset `from` of `bytes` and the offset after it, or `None` when `bytes` holds
/// only the start of one (read more, and parse again from the same offset). Its bulk strings
/// are [`Span`]s of `bytes`.
///
/// # Errors
///
/// [`Invalid`] for bytes that cannot begin a RESP2 reply.
pub(super) fn parse(bytes: &[u8], from: usize) -> Result<Option<(Reply, usize)>, Invalid> {
    let Some((line, mut at)) = line(bytes, from)? else {
        return Ok(None);
    };
    let Some((&kind, rest)) = line.split_first() else {
        return Err(Invalid("an empty line".into()));
    };
    let reply = match kind {
        b'+' if rest == b"OK" => Reply::Okay,
        b'+' => Reply::Status(String::from_utf8_lossy(rest).into_owned()),
        b'-' => Reply::Error(String::from_utf8_lossy(rest).into_owned()),
        b':' => Reply::Int(number(rest)?),
        b'$' => {
            let Some(len) = length(rest)? else {
                return Ok(Some((Reply::Nil, at)));
            };
            let end = at + len;
            if bytes.len() < end + 2 {
                return Ok(None);
            }
            if &bytes[end..end + 2] != b"\r\n" {
                return Err(Invalid("a bulk string not ended by CRLF".into()));
            }
            let value = Span { start: at, end };
            at = end + 2;
            Reply::Bulk(value)
        }
        b'*' => {
            let Some(len) = length(rest)? else {
                return Ok(Some((Reply::Nil, at)));
            };
            // Not sized by `len` before its elements are here: a length is only a claim.
            let mut elements = Vec::new();
            for _ in 0..len {
                let Some((element, next)) = parse(bytes, at)? else {
                    return Ok(None);
                };
                elements.push(element);
                at = next;
            }
            Reply::Array(elements)
        }
        other => {
            return Err(Invalid(format!(
                "a line that starts with {:?}",
                char::from(other)
            )))
        }
    };
    Ok(Some((reply, at)))
}

/// The line of `bytes` from `from` to its CRLF (not included), and the offset after the CRLF;
/// `None` when no CRLF has come yet.
fn line(bytes: &[u8], from: usize) -> Result<Option<(&[u8], usize)>, Invalid> {
    let rest = &bytes[from..];
    let Some(lf) = rest.iter().position(|&b| b == b'\n') else {
        return Ok(None);
    };
    if lf == 0 || rest[lf - 1] != b'\r' {
        return Err(Invalid("a line not ended by CRLF".into()));
    }
    Ok(Some((&rest[..lf - 1], from + lf + 1)))
}

/// A length (`-1`: nil, as `None`).
fn length(text: &[u8]) -> Result<Option<usize>, Invalid> {
    match number(text)? {
        -1 => Ok(None),
        len => usize::try_from(len)
            .ok()
            .filter(|&len| len <= MAX_LEN)
            .map(Some)
            .ok_or_else(|| Invalid(format!("a length of {len}"))),
    }
}

fn number(text: &[u8]) -> Result<i64, Invalid> {
    std::str::from_utf8(text)
        .ok()
        .and_then(|text| text.parse().ok())
        .ok_or_else(|| {
            Invalid(format!(
                "{:?} is not a number",
                String::from_utf8_lossy(text)
            ))
        })
}

#[cfg(test)]
pub(super) mod tests {
    use proptest::prelude::*;

    use super::{parse, Commands, Invalid, Replies, Reply};

    /// A reply with its bulk strings' bytes, to compare with what was encoded.
    #[derive(Debug, Clone, PartialEq, Eq)]
    pub(in crate::dedup::redis) enum Owned {
        Nil,
        Okay,
        Status(String),
        Int(i64),
        Bulk(Vec<u8>),
        Array(Vec<Owned>),
        Error(String),
    }

    /// `reply`, parsed from `bytes`, with its bulk strings' bytes.
    fn owned(reply: &Reply, bytes: &[u8]) -> Owned {
        match reply {
            Reply::Nil => Owned::Nil,
            Reply::Okay => Owned::Okay,
            Reply::Status(text) => Owned::Status(text.clone()),
            Reply::Int(n) => Owned::Int(*n),
            Reply::Bulk(span) => Owned::Bulk(span.of(bytes).to_vec()),
            Reply::Array(elements) => {
                Owned::Array(elements.iter().map(|e| owned(e, bytes)).collect())
            }
            Reply::Error(text) => Owned::Error(text.clone()),
        }
    }

    /// Every reply of `replies`, with its bulk strings' bytes.
    pub(in crate::dedup::redis) fn owned_all(replies: &mut Replies) -> Vec<Owned> {
        let list = replies.take_list();
        list.iter()
            .map(|reply| owned(reply, &replies.bytes))
            .collect()
    }

    /// `reply` as Redis writes it.
    fn encode(reply: &Owned, out: &mut Vec<u8>) {
        match reply {
            Owned::Nil => out.extend_from_slice(b"$-1\r\n"),
            Owned::Okay => out.extend_from_slice(b"+OK\r\n"),
            Owned::Status(text) => out.extend_from_slice(format!("+{text}\r\n").as_bytes()),
            Owned::Error(text) => out.extend_from_slice(format!("-{text}\r\n").as_bytes()),
            Owned::Int(n) => out.extend_from_slice(format!(":{n}\r\n").as_bytes()),
            Owned::Bulk(bytes) => {
                out.extend_from_slice(format!("${}\r\n", bytes.len()).as_bytes());
                out.extend_from_slice(bytes);
                out.extend_from_slice(b"\r\n");
            }
            Owned::Array(elements) => {
                out.extend_from_slice(format!("*{}\r\n", elements.len()).as_bytes());
                for element in elements {
                    encode(element, out);
                }
            }
        }
    }

    /// Every reply `bytes` holds, parsed as a connection does: from the start, again from the
    /// same offset whenever a reply is not whole yet.
    fn parse_all(bytes: &[u8]) -> Result<(Vec<Owned>, usize), Invalid> {
        let (mut replies, mut at) = (Vec::new(), 0);
        while let Some((reply, next)) = parse(bytes, at)? {
            replies.push(owned(&reply, bytes));
            at = next;
        }
        Ok((replies, at))
    }

    /// The first reply of `bytes`, with its bytes.
    fn first(bytes: &[u8]) -> Option<(Owned, usize)> {
        parse(bytes, 0)
            .unwrap()
            .map(|(reply, next)| (owned(&reply, bytes), next))
    }

    fn line_text() -> impl Strategy<Value = String> {
        // A status or an error is one line: no CR or LF.
        "[ -~]{0,40}"
    }

    fn reply() -> impl Strategy<Value = Owned> {
        let leaf = prop_oneof![
            Just(Owned::Nil),
            Just(Owned::Okay),
            line_text()
                .prop_filter("+OK is Okay", |text| text != "OK")
                .prop_map(Owned::Status),
            line_text().prop_map(Owned::Error),
            any::<i64>().prop_map(Owned::Int),
            proptest::collection::vec(any::<u8>(), 0..200).prop_map(Owned::Bulk),
        ];
        leaf.prop_recursive(3, 24, 6, |inner| {
            proptest::collection::vec(inner, 0..6).prop_map(Owned::Array)
        })
    }

    proptest! {
        /// Replies cut at any byte come out whole and in order once their bytes are there,
        /// and never before.
        #[test]
        fn replies_split_anywhere_parse_whole(
            replies in proptest::collection::vec(reply(), 1..5),
        ) {
            let mut bytes = Vec::new();
            for reply in &replies {
                encode(reply, &mut bytes);
            }
            let (whole, used) = parse_all(&bytes).unwrap();
            prop_assert_eq!(&whole, &replies);
            prop_assert_eq!(used, bytes.len());
            for cut in 0..bytes.len() {
                let (some, used) = parse_all(&bytes[..cut]).unwrap();
                prop_assert!(used <= cut);
                prop_assert_eq!(&some[..], &replies[..some.len()]);
                let (rest, _) = parse_all(&bytes[used..]).unwrap();
                prop_assert_eq!(some.len() + rest.len(), replies.len());
            }
        }

        /// A pipeline of commands reads back, as the server reads it, as arrays of its
        /// arguments.
        #[test]
        fn commands_encode_as_arrays_of_bulk_strings(
            commands in proptest::collection::vec(
                proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..64), 1..6),
                0..6,
            ),
        ) {
            let mut pipe = Commands::with_capacity(0);
            for args in &commands {
                let args: Vec<&[u8]> = args.iter().map(Vec::as_slice).collect();
                pipe.push(&args);
            }
            prop_assert_eq!(pipe.len(), commands.len());
            prop_assert_eq!(pipe.is_empty(), commands.is_empty());
            let (read, used) = parse_all(pipe.bytes()).unwrap();
            prop_assert_eq!(used, pipe.bytes().len());
            let expected: Vec<Owned> = commands
                .iter()
                .map(|args| Owned::Array(args.iter().cloned().map(Owned::Bulk).collect()))
                .collect();
            prop_assert_eq!(read, expected);
        }
    }

    #[test]
    fn nil_errors_and_codes() {
        assert_eq!(first(b"$-1\r\n"), Some((Owned::Nil, 5)));
        assert_eq!(first(b"*-1\r\n"), Some((Owned::Nil, 5)));
        let moved = parse(b"-MOVED 3999 127.0.0.1:6381\r\n", 0)
            .unwrap()
            .unwrap()
            .0;
        assert_eq!(moved.error_code(), Some("MOVED"));
        assert_eq!(Reply::Okay.error_code(), None);
        assert_eq!(
            first(b"*2\r\n$3\r\nfoo\r\n:7\r\n").unwrap().0,
            Owned::Array(vec![Owned::Bulk(b"foo".to_vec()), Owned::Int(7)])
        );
    }

    /// A bulk string is where it was read: a span of the bytes, from the offset parsed at.
    #[test]
    fn a_bulk_string_is_a_span_of_the_bytes_read() {
        let bytes = b":1\r\n$5\r\nhello\r\n";
        let (reply, next) = parse(bytes, 4).unwrap().unwrap();
        assert_eq!(next, bytes.len());
        let Reply::Bulk(span) = reply else {
            panic!("{reply:?}");
        };
        assert_eq!(span.of(bytes), b"hello");
        assert_eq!(span.of(bytes).as_ptr(), bytes[8..].as_ptr());
    }

    #[test]
    fn bytes_that_are_not_resp_are_refused() {
        for bad in [
            &b"HTTP/1.1 400 Bad Request\r\n"[..],
            b"+OK\n",
            b"\r\n",
            b":x\r\n",
            b"$-2\r\n",
            b"$3\r\nfoobar\r\n",
            b"*9999999999999\r\n",
        ] {
            assert!(parse(bad, 0).is_err(), "{:?}", String::from_utf8_lossy(bad));
        }
    }
}
