//! What consumers send: the command parser, and the error frames nsqd answers bad input with.
//!
//! A pure, bounded decoder over the connection's read buffer: a command line longer than
//! `max_line` or an IDENTIFY/AUTH body longer than `max_body` is refused before it is
//! buffered, and every malformed command gets the fatal error frame nsqd v1.3.0 sends for it
//! (`protocol_v2.go`), with the same code and text. Whether a well-formed command is allowed
//! in the connection's state is the connection's business (`connection.rs`).

use bytes::{Buf, Bytes, BytesMut};

use crate::nsq::frame::MessageId;

/// A command from a consumer, parsed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum ClientCommand {
    /// `IDENTIFY` with its JSON body.
    Identify(Bytes),
    /// `AUTH` with the secret.
    Auth(Bytes),
    /// `SUB <topic> <channel>`, names as sent (checked by the connection).
    Sub { topic: Bytes, channel: Bytes },
    /// `RDY [count]`; a count too large for 64 bits is `u64::MAX`.
    Rdy(u64),
    /// `FIN <id>`.
    Fin(MessageId),
    /// `REQ <id> <delay_ms>`; a delay too large for 64 bits is `u64::MAX`.
    Req(MessageId, u64),
    /// `TOUCH <id>`.
    Touch(MessageId),
    /// `NOP`.
    Nop,
    /// `CLS`.
    Cls,
    /// `PUB`, `MPUB` or `DPUB` (named): this endpoint takes no messages.
    Publish(&'static str),
}

/// An error frame: its text starts with nsqd's code. A fatal one closes the connection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ErrorFrame {
    pub(crate) text: String,
    pub(crate) fatal: bool,
}

impl ErrorFrame {
    /// An error after which the connection is closed (`E_INVALID`, `E_BAD_BODY`, ...).
    pub(crate) fn fatal(code: &str, detail: impl std::fmt::Display) -> Self {
        ErrorFrame {
            text: format!("{code} {detail}"),
            fatal: true,
        }
    }

    /// An error that leaves the connection open (`E_FIN_FAILED`, `E_REQ_FAILED`,
    /// `E_TOUCH_FAILED`).
    pub(crate) fn non_fatal(code: &str, detail: impl std::fmt::Display) -> Self {
        ErrorFrame {
            text: format!("{code} {detail}"),
            fatal: false,
        }
    }

    /// The code at the start of the text.
    #[cfg(test)]
    pub(crate) fn code(&self) -> &str {
        self.text.split(' ').next().unwrap_or("")
    }
}

/// Parses commands out of a read buffer, bounded in what it waits for.
#[derive(Debug, Clone, Copy)]
pub(crate) struct CommandParser {
    /// The longest command line, without its `\n`.
    pub(crate) max_line: usize,
    /// The largest IDENTIFY or AUTH body.
    pub(crate) max_body: usize,
}

/// A parameter as nsqd's errors show it: lossy UTF-8, cut at 64 bytes.
fn shown(bytes: &[u8]) -> String {
    let cut = &bytes[..bytes.len().min(64)];
    let mut text = String::from_utf8_lossy(cut).into_owned();
    if cut.len() < bytes.len() {
        text.push_str("...");
    }
    text
}

/// nsqd's `ByteToBase10`: decimal digits only (none is 0); saturates instead of wrapping.
fn base10(bytes: &[u8]) -> Option<u64> {
    bytes.iter().try_fold(0u64, |n, &d| {
        d.is_ascii_digit()
            .then(|| n.saturating_mul(10).saturating_add(u64::from(d - b'0')))
    })
}

fn message_id(param: &[u8]) -> Result<MessageId, ErrorFrame> {
    <[u8; 16]>::try_from(param)
        .map(MessageId)
        .map_err(|_| ErrorFrame::fatal("E_INVALID", "invalid message ID"))
}

impl CommandParser {
    /// The next whole command in `src`, consuming it; `Ok(None)` while it is incomplete.
    ///
    /// # Errors
    ///
    /// The fatal error frame nsqd answers the command with; the buffer is then left as it
    /// was and the connection must be closed.
    pub(crate) fn parse(&self, src: &mut BytesMut) -> Result<Option<ClientCommand>, ErrorFrame> {
        let window = &src[..src.len().min(self.max_line + 1)];
        let Some(end) = memchr::memchr(b'\n', window) else {
            if src.len() > self.max_line {
                return Err(ErrorFrame::fatal(
                    "E_INVALID",
                    format_args!("command line longer than {} bytes", self.max_line),
                ));
            }
            return Ok(None);
        };
        let mut line = &src[..end];
        if let [rest @ .., b'\r'] = line {
            line = rest;
        }
        let params = Params::of(line);
        let name = params[0];
        let command = match name {
            b"IDENTIFY" | b"AUTH" => {
                let label = if name == b"AUTH" { "AUTH" } else { "IDENTIFY" };
                if label == "AUTH" && params.len() != 1 {
                    return Err(ErrorFrame::fatal(
                        "E_INVALID",
                        "AUTH invalid number of parameters",
                    ));
                }
                return self.with_body(src, end + 1, label);
            }
            b"SUB" => {
                if params.len() < 3 {
                    return Err(ErrorFrame::fatal(
                        "E_INVALID",
                        "SUB insufficient number of parameters",
                    ));
                }
                ClientCommand::Sub {
                    topic: Bytes::copy_from_slice(params[1]),
                    channel: Bytes::copy_from_slice(params[2]),
                }
            }
            b"RDY" => match params.get(1) {
                None => ClientCommand::Rdy(1),
                Some(count) => ClientCommand::Rdy(base10(count).ok_or_else(|| {
                    ErrorFrame::fatal(
                        "E_INVALID",
                        format_args!("RDY could not parse count {}", shown(count)),
                    )
                })?),
            },
            b"FIN" | b"TOUCH" => {
                let label = if name == b"FIN" { "FIN" } else { "TOUCH" };
                if params.len() < 2 {
                    return Err(ErrorFrame::fatal(
                        "E_INVALID",
                        format_args!("{label} insufficient number of params"),
                    ));
                }
                let id = message_id(params[1])?;
                if label == "FIN" {
                    ClientCommand::Fin(id)
                } else {
                    ClientCommand::Touch(id)
                }
            }
            b"REQ" => {
                if params.len() < 3 {
                    return Err(ErrorFrame::fatal(
                        "E_INVALID",
                        "REQ insufficient number of params",
                    ));
                }
                let id = message_id(params[1])?;
                let delay = base10(params[2]).ok_or_else(|| {
                    ErrorFrame::fatal(
                        "E_INVALID",
                        format_args!("REQ could not parse timeout {}", shown(params[2])),
                    )
                })?;
                ClientCommand::Req(id, delay)
            }
            b"NOP" => ClientCommand::Nop,
            b"CLS" => ClientCommand::Cls,
            b"PUB" => ClientCommand::Publish("PUB"),
            b"MPUB" => ClientCommand::Publish("MPUB"),
            b"DPUB" => ClientCommand::Publish("DPUB"),
            other => {
                return Err(ErrorFrame::fatal(
                    "E_INVALID",
                    format_args!("invalid command {}", shown(other)),
                ))
            }
        };
        src.advance(end + 1);
        Ok(Some(command))
    }

    /// IDENTIFY or AUTH: the line (`line_len` bytes with its `\n`), a 4-byte size, the body.
    fn with_body(
        &self,
        src: &mut BytesMut,
        line_len: usize,
        label: &'static str,
    ) -> Result<Option<ClientCommand>, ErrorFrame> {
        let Some(size) = src.get(line_len..line_len + 4) else {
            return Ok(None);
        };
        // nsqd reads the size as a signed 32-bit integer.
        let size = i32::from_be_bytes([size[0], size[1], size[2], size[3]]);
        if size > 0 && size as usize > self.max_body {
            return Err(ErrorFrame::fatal(
                "E_BAD_BODY",
                format_args!("{label} body too big {size} > {}", self.max_body),
            ));
        }
        if size <= 0 {
            return Err(ErrorFrame::fatal(
                "E_BAD_BODY",
                format_args!("{label} invalid body size {size}"),
            ));
        }
        let total = line_len + 4 + size as usize;
        if src.len() < total {
            // Bounded: the size was checked against `max_body` above.
            src.reserve(total - src.len());
            return Ok(None);
        }
        src.advance(line_len + 4);
        let body = src.split_to(size as usize).freeze();
        Ok(Some(if label == "AUTH" {
            ClientCommand::Auth(body)
        } else {
            ClientCommand::Identify(body)
        }))
    }
}

/// A command line's parameters, split at spaces as nsqd splits them: the first three (all
/// any command reads) and how many there are, without allocating for each command.
struct Params<'a> {
    first: [&'a [u8]; 3],
    len: usize,
}

impl<'a> Params<'a> {
    fn of(line: &'a [u8]) -> Self {
        let mut params = Params {
            first: [&[]; 3],
            len: 0,
        };
        for param in line.split(|&b| b == b' ') {
            if let Some(place) = params.first.get_mut(params.len) {
                *place = param;
            }
            params.len += 1;
        }
        params
    }

    fn len(&self) -> usize {
        self.len
    }

    fn get(&self, index: usize) -> Option<&'a [u8]> {
        self.first.get(index).filter(|_| index < self.len).copied()
    }
}

impl<'a> std::ops::Index<usize> for Params<'a> {
    type Output = &'a [u8];

    fn index(&self, index: usize) -> &Self::Output {
        assert!(index < self.len, "parameter {index} of {}", self.len);
        &self.first[index]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::nsq::frame::Command;
    use proptest::prelude::*;

    const PARSER: CommandParser = CommandParser {
        max_line: 256,
        max_body: 1024,
    };

    fn parse_all(input: &[u8]) -> (Vec<ClientCommand>, Option<ErrorFrame>) {
        let mut buf = BytesMut::from(input);
        let mut out = Vec::new();
        loop {
            match PARSER.parse(&mut buf) {
                Ok(Some(command)) => out.push(command),
                Ok(None) => return (out, None),
                Err(error) => return (out, Some(error)),
            }
        }
    }

    fn refusal(input: &[u8]) -> String {
        parse_all(input).1.expect("a refusal").text
    }

    #[test]
    fn parses_what_our_client_sends() {
        let id = MessageId(*b"0123456789abcdef");
        let sent = [
            Command::Identify(Bytes::from_static(b"{\"a\":1}")),
            Command::Sub {
                topic: "t".into(),
                channel: "c".into(),
            },
            Command::Rdy(7),
            Command::Fin(id),
            Command::Req(id, 1500),
            Command::Touch(id),
            Command::Nop,
            Command::Cls,
        ];
        let mut wire = BytesMut::new();
        for command in &sent {
            command.encode(&mut wire);
        }
        let (got, error) = parse_all(&wire);
        assert_eq!(error, None);
        assert_eq!(
            got,
            vec![
                ClientCommand::Identify(Bytes::from_static(b"{\"a\":1}")),
                ClientCommand::Sub {
                    topic: Bytes::from_static(b"t"),
                    channel: Bytes::from_static(b"c")
                },
                ClientCommand::Rdy(7),
                ClientCommand::Fin(id),
                ClientCommand::Req(id, 1500),
                ClientCommand::Touch(id),
                ClientCommand::Nop,
                ClientCommand::Cls,
            ]
        );
    }

    #[test]
    fn parameters_past_those_a_command_reads_are_ignored_as_nsqd_ignores_them() {
        let id = MessageId(*b"0123456789abcdef");
        let (got, error) =
            parse_all(b"FIN 0123456789abcdef x y z\nREQ 0123456789abcdef 5 x y\nSUB t c x\n");
        assert_eq!(error, None);
        assert_eq!(
            got,
            vec![
                ClientCommand::Fin(id),
                ClientCommand::Req(id, 5),
                ClientCommand::Sub {
                    topic: Bytes::from_static(b"t"),
                    channel: Bytes::from_static(b"c")
                },
            ]
        );
        assert_eq!(
            refusal(b"AUTH x y z w\n"),
            "E_INVALID AUTH invalid number of parameters"
        );
    }

    #[test]
    fn bad_commands_get_nsqds_errors() {
        let cases: [(&[u8], &str); 14] = [
            (b"FOO bar\n", "E_INVALID invalid command FOO"),
            (b"\n", "E_INVALID invalid command "),
            (
                b"SUB t\n",
                "E_INVALID SUB insufficient number of parameters",
            ),
            (b"RDY x\n", "E_INVALID RDY could not parse count x"),
            (b"RDY -1\n", "E_INVALID RDY could not parse count -1"),
            (b"FIN\n", "E_INVALID FIN insufficient number of params"),
            (b"FIN short\n", "E_INVALID invalid message ID"),
            (b"TOUCH\n", "E_INVALID TOUCH insufficient number of params"),
            (
                b"REQ 0123456789abcdef\n",
                "E_INVALID REQ insufficient number of params",
            ),
            (
                b"REQ 0123456789abcdef 1s\n",
                "E_INVALID REQ could not parse timeout 1s",
            ),
            (b"AUTH x\n", "E_INVALID AUTH invalid number of parameters"),
            (
                b"IDENTIFY\n\0\0\x04\x01",
                "E_BAD_BODY IDENTIFY body too big 1025 > 1024",
            ),
            (
                b"IDENTIFY\n\0\0\0\0",
                "E_BAD_BODY IDENTIFY invalid body size 0",
            ),
            (
                b"AUTH\n\xff\xff\xff\xff",
                "E_BAD_BODY AUTH invalid body size -1",
            ),
        ];
        for (input, expected) in cases {
            assert_eq!(
                refusal(input),
                expected,
                "{:?}",
                String::from_utf8_lossy(input)
            );
        }
        let long = vec![b'N'; 300];
        assert_eq!(
            refusal(&long),
            "E_INVALID command line longer than 256 bytes"
        );
    }

    #[test]
    fn a_line_ending_in_cr_and_rdy_without_count_parse_as_nsqd_does() {
        let (got, error) = parse_all(b"NOP\r\nRDY\nRDY 99999999999999999999999\nPUB t\n");
        assert_eq!(error, None);
        assert_eq!(
            got,
            vec![
                ClientCommand::Nop,
                ClientCommand::Rdy(1),
                ClientCommand::Rdy(u64::MAX),
                ClientCommand::Publish("PUB"),
            ]
        );
    }

    #[test]
    fn waits_for_the_whole_body() {
        let mut buf = BytesMut::from(&b"IDENTIFY\n\0\0\0\x02{"[..]);
        assert_eq!(PARSER.parse(&mut buf), Ok(None));
        buf.extend_from_slice(b"}NOP\n");
        assert_eq!(
            PARSER.parse(&mut buf),
            Ok(Some(ClientCommand::Identify(Bytes::from_static(b"{}"))))
        );
        assert_eq!(PARSER.parse(&mut buf), Ok(Some(ClientCommand::Nop)));
    }

    proptest! {
        /// Arbitrary bytes in arbitrary chunks: commands or one fatal error frame with one of
        /// nsqd's codes, never a panic, and the buffer never holds more than a line and a body
        /// beyond what was fed.
        #[test]
        fn arbitrary_bytes_get_commands_or_nsqds_fatal_errors(
            data in proptest::collection::vec(any::<u8>(), 0..2048),
            cuts in proptest::collection::vec(1usize..128, 1..32),
            commands in proptest::collection::vec(prop_oneof![
                Just(&b"NOP\n"[..]), Just(&b"RDY 3\n"[..]), Just(&b"IDENTIFY\n"[..]),
                Just(&b"AUTH\n"[..]), Just(&b"FIN 0123456789abcdef\n"[..]), Just(&b"SUB a b\n"[..]),
            ], 0..8),
        ) {
            let mut input = Vec::new();
            for (i, command) in commands.iter().enumerate() {
                input.extend_from_slice(command);
                input.extend_from_slice(&data[..data.len().min(i * 7)]);
            }
            input.extend_from_slice(&data);
            let mut buf = BytesMut::new();
            let mut pos = 0;
            let mut cut = cuts.iter().cycle();
            'feed: while pos < input.len() {
                let n = (*cut.next().unwrap()).min(input.len() - pos);
                buf.extend_from_slice(&input[pos..pos + n]);
                pos += n;
                loop {
                    match PARSER.parse(&mut buf) {
                        Ok(Some(_)) => {}
                        Ok(None) => break,
                        Err(error) => {
                            prop_assert!(error.fatal);
                            prop_assert!(matches!(error.code(), "E_INVALID" | "E_BAD_BODY"), "{}", error.text);
                            break 'feed;
                        }
                    }
                }
                prop_assert!(buf.len() <= PARSER.max_line + 1 + 4 + PARSER.max_body + 128);
            }
        }
    }
}
