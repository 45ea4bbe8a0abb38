//! The Redis protocol (RESP2) as the store's own connection speaks it (`conn::lean`): commands
//! written once, straight into one buffer for a whole pipeline, and replies parsed in place
//! from the bytes read, a bulk string copied once into its own value.
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
    /// `$…`: a bulk string.
    Bulk(Vec<u8>),
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

/// Bytes that are not a reply of Redis's: the connection is out of step and must go.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Invalid(pub(super) String);

impl std::fmt::Display for Invalid {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "not a Redis reply: {}", self.0)
    }
}

impl std::error::Error for Invalid {}

/// The reply at the start of `bytes` and how many bytes it took, or `None` when `bytes` holds
/// only the start of one (read more, and parse again from the same start).
///
/// # Errors
///
/// [`Invalid`] for bytes that cannot begin a RESP2 reply.
pub(super) fn parse(bytes: &[u8]) -> Result<Option<(Reply, usize)>, Invalid> {
    let Some((line, mut at)) = line(bytes, 0)? else {
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
            let value = recycle::copy_of(&bytes[at..end]);
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
                let Some((element, used)) = parse(&bytes[at..])? else {
                    return Ok(None);
                };
                elements.push(element);
                at += used;
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
mod tests {
    use proptest::prelude::*;

    use super::{parse, Commands, Invalid, Reply};

    /// `reply` as Redis writes it.
    fn encode(reply: &Reply, out: &mut Vec<u8>) {
        match reply {
            Reply::Nil => out.extend_from_slice(b"$-1\r\n"),
            Reply::Okay => out.extend_from_slice(b"+OK\r\n"),
            Reply::Status(text) => out.extend_from_slice(format!("+{text}\r\n").as_bytes()),
            Reply::Error(text) => out.extend_from_slice(format!("-{text}\r\n").as_bytes()),
            Reply::Int(n) => out.extend_from_slice(format!(":{n}\r\n").as_bytes()),
            Reply::Bulk(bytes) => {
                out.extend_from_slice(format!("${}\r\n", bytes.len()).as_bytes());
                out.extend_from_slice(bytes);
                out.extend_from_slice(b"\r\n");
            }
            Reply::Array(elements) => {
                out.extend_from_slice(format!("*{}\r\n", elements.len()).as_bytes());
                for element in elements {
                    encode(element, out);
                }
            }
        }
    }

    /// Every reply `bytes` holds, parsed as a connection does: from the start, again from the
    /// same start whenever a reply is not whole yet.
    fn parse_all(bytes: &[u8]) -> Result<(Vec<Reply>, usize), Invalid> {
        let (mut replies, mut at) = (Vec::new(), 0);
        while let Some((reply, used)) = parse(&bytes[at..])? {
            replies.push(reply);
            at += used;
        }
        Ok((replies, at))
    }

    fn line_text() -> impl Strategy<Value = String> {
        // A status or an error is one line: no CR or LF.
        "[ -~]{0,40}"
    }

    fn reply() -> impl Strategy<Value = Reply> {
        let leaf = prop_oneof![
            Just(Reply::Nil),
            Just(Reply::Okay),
            line_text()
                .prop_filter("+OK is Okay", |text| text != "OK")
                .prop_map(Reply::Status),
            line_text().prop_map(Reply::Error),
            any::<i64>().prop_map(Reply::Int),
            proptest::collection::vec(any::<u8>(), 0..200).prop_map(Reply::Bulk),
        ];
        leaf.prop_recursive(3, 24, 6, |inner| {
            proptest::collection::vec(inner, 0..6).prop_map(Reply::Array)
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
            let expected: Vec<Reply> = commands
                .iter()
                .map(|args| Reply::Array(args.iter().cloned().map(Reply::Bulk).collect()))
                .collect();
            prop_assert_eq!(read, expected);
        }
    }

    #[test]
    fn nil_errors_and_codes() {
        assert_eq!(parse(b"$-1\r\n").unwrap(), Some((Reply::Nil, 5)));
        assert_eq!(parse(b"*-1\r\n").unwrap(), Some((Reply::Nil, 5)));
        let moved = parse(b"-MOVED 3999 127.0.0.1:6381\r\n").unwrap().unwrap().0;
        assert_eq!(moved.error_code(), Some("MOVED"));
        assert_eq!(Reply::Okay.error_code(), None);
        assert_eq!(
            parse(b"*2\r\n$3\r\nfoo\r\n:7\r\n").unwrap().unwrap().0,
            Reply::Array(vec![Reply::Bulk(b"foo".to_vec()), Reply::Int(7)])
        );
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
            assert!(parse(bad).is_err(), "{:?}", String::from_utf8_lossy(bad));
        }
    }
}
