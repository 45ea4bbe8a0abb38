//! Frames of NSQ's TCP protocol V2: what nsqd sends ([`Frame`]) and what we send ([`Command`]).
//!
//! [`FrameCodec`] is a `tokio-util` codec, so the rest of the client sees frames, never bytes
//! (the mini-redis `frame.rs` split). Every frame from nsqd is
//!
//! ```text
//! [size: u32 BE][frame type: u32 BE][data: size - 4 bytes]
//! ```
//!
//! and the data of a message frame is `[timestamp: i64 BE][attempts: u16 BE][id: 16 bytes][body]`.
//!
//! The decoder never trusts the peer: a size above [`FrameCodec::max_frame_size`] is an error
//! before anything is allocated, every length is checked before it is subtracted from, and an
//! unknown frame type or a message shorter than its 26-byte header is an error, never a panic.
//! The buffer it reserves is therefore bounded by the configured maximum.

use std::fmt;

use bytes::{Buf, BufMut, Bytes, BytesMut};
use tokio_util::codec::{Decoder, Encoder};

use crate::decimal::put_decimal;

/// The four bytes a client sends first to select protocol V2.
pub const MAGIC_V2: &[u8; 4] = b"  V2";

/// Frame type of a response (`OK`, `CLOSE_WAIT`, `_heartbeat_`, IDENTIFY's JSON).
pub(crate) const FRAME_TYPE_RESPONSE: u32 = 0;
/// Frame type of an error (`E_INVALID ...`, `E_FIN_FAILED ...`).
pub(crate) const FRAME_TYPE_ERROR: u32 = 1;
/// Frame type of a message.
pub(crate) const FRAME_TYPE_MESSAGE: u32 = 2;

/// Bytes before the body in a message frame's data: timestamp (8), attempts (2), ID (16).
pub(crate) const MESSAGE_HEADER_LEN: usize = 26;

/// The largest frame accepted unless configured otherwise: nsqd's default `--max-msg-size`
/// (1 MiB) plus headroom for the header.
///
/// Defaults to: `1_048_576 + 1024` bytes.
pub(crate) const DEFAULT_MAX_FRAME_SIZE: usize = 1_048_576 + 1024;

/// The response nsqd sends every heartbeat interval; the client answers `NOP`.
pub(crate) const HEARTBEAT: &[u8] = b"_heartbeat_";

/// A message ID as nsqd writes it: 16 ASCII bytes (hexadecimal in practice).
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct MessageId(pub [u8; 16]);

impl MessageId {
    /// The ID's bytes.
    pub fn as_bytes(&self) -> &[u8; 16] {
        &self.0
    }
}

impl fmt::Display for MessageId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // IDs are ASCII on the wire; anything else is shown escaped rather than rejected.
        for &b in &self.0 {
            if b.is_ascii_graphic() {
                write!(f, "{}", b as char)?;
            } else {
                write!(f, "\\x{b:02x}")?;
            }
        }
        Ok(())
    }
}

impl fmt::Debug for MessageId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "MessageId({self})")
    }
}

/// A message frame, decoded. The body shares the read buffer (no copy).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RawMessage {
    /// When nsqd first received the message, in nanoseconds since the Unix epoch.
    pub timestamp_ns: i64,
    /// How many times nsqd has delivered this message, this delivery included.
    pub attempts: u16,
    /// The ID nsqd gave the message; FIN, REQ and TOUCH name it.
    pub id: MessageId,
    /// The payload.
    pub body: Bytes,
}

/// A frame from nsqd.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Frame {
    /// A response: `OK`, `CLOSE_WAIT`, `_heartbeat_` or IDENTIFY's JSON.
    Response(Bytes),
    /// An error whose text starts with a code such as `E_FIN_FAILED`.
    Error(Bytes),
    /// A message.
    Message(RawMessage),
}

/// Why a byte stream from nsqd is not a valid sequence of frames.
///
/// Any of these ends the connection (the consumer reconnects); none of them panics.
#[derive(Debug, thiserror::Error)]
pub enum FrameError {
    /// Reading the socket failed.
    #[error("reading from nsqd failed: {0}")]
    Io(std::io::Error),
    /// The size field announced more than we accept.
    #[error("nsqd sent a frame of {size} bytes, above `max_frame_size` = {max} bytes; raise `max_frame_size` if nsqd's `--max-msg-size` is larger")]
    TooLarge {
        /// The announced size.
        size: u64,
        /// The configured limit.
        max: usize,
    },
    /// The size field is smaller than the 4-byte frame type it must contain.
    #[error("nsqd sent a frame of {0} bytes, too short to hold its 4-byte frame type")]
    TooShort(u32),
    /// A message frame shorter than the 26-byte message header.
    #[error(
        "nsqd sent a message frame with {0} bytes of data, shorter than the 26-byte message header"
    )]
    ShortMessage(usize),
    /// A frame type other than 0, 1 or 2.
    #[error("nsqd sent a frame of unknown type {0}")]
    UnknownType(u32),
}

impl From<std::io::Error> for FrameError {
    fn from(error: std::io::Error) -> Self {
        FrameError::Io(error)
    }
}

/// A command we send to nsqd.
///
/// Topic and channel names are not validated here; the consumer and producer validate them
/// once, when they are configured.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Command {
    /// `IDENTIFY` with a JSON body.
    Identify(Bytes),
    /// `AUTH` with the secret as its body.
    Auth(super::secret::AuthSecret),
    /// `SUB <topic> <channel>`.
    Sub {
        /// Topic name.
        topic: String,
        /// Channel name.
        channel: String,
    },
    /// `RDY <count>`.
    Rdy(u32),
    /// `FIN <id>`.
    Fin(MessageId),
    /// `REQ <id> <delay_ms>`.
    Req(MessageId, u64),
    /// `TOUCH <id>`.
    Touch(MessageId),
    /// `NOP`, the answer to a heartbeat.
    Nop,
    /// `CLS`, asking nsqd to stop sending messages.
    Cls,
    /// `PUB <topic>` with one body.
    Pub {
        /// Topic name.
        topic: String,
        /// Message body.
        body: Bytes,
    },
    /// `MPUB <topic>` with several bodies.
    Mpub {
        /// Topic name.
        topic: String,
        /// Message bodies.
        bodies: Vec<Bytes>,
    },
    /// `DPUB <topic> <defer_ms>` with one body.
    Dpub {
        /// Topic name.
        topic: String,
        /// How long nsqd holds the message before delivering it, in milliseconds.
        defer_ms: u64,
        /// Message body.
        body: Bytes,
    },
}

impl Command {
    /// The command's name on the wire, as errors name it.
    pub fn name(&self) -> &'static str {
        match self {
            Command::Identify(_) => "IDENTIFY",
            Command::Auth(_) => "AUTH",
            Command::Sub { .. } => "SUB",
            Command::Rdy(_) => "RDY",
            Command::Fin(_) => "FIN",
            Command::Req(..) => "REQ",
            Command::Touch(_) => "TOUCH",
            Command::Nop => "NOP",
            Command::Cls => "CLS",
            Command::Pub { .. } => "PUB",
            Command::Mpub { .. } => "MPUB",
            Command::Dpub { .. } => "DPUB",
        }
    }

    /// Appends the command's wire form to `dst`.
    pub fn encode(&self, dst: &mut BytesMut) {
        match self {
            Command::Identify(body) => {
                dst.put_slice(b"IDENTIFY\n");
                put_body(dst, body);
            }
            Command::Auth(secret) => {
                dst.put_slice(b"AUTH\n");
                put_body(dst, secret.bytes());
            }
            Command::Sub { topic, channel } => {
                dst.reserve(6 + topic.len() + channel.len());
                dst.put_slice(b"SUB ");
                dst.put_slice(topic.as_bytes());
                dst.put_u8(b' ');
                dst.put_slice(channel.as_bytes());
                dst.put_u8(b'\n');
            }
            Command::Rdy(count) => {
                dst.put_slice(b"RDY ");
                put_decimal(dst, u64::from(*count));
                dst.put_u8(b'\n');
            }
            Command::Fin(id) => {
                dst.reserve(21);
                dst.put_slice(b"FIN ");
                dst.put_slice(&id.0);
                dst.put_u8(b'\n');
            }
            Command::Req(id, delay_ms) => {
                dst.put_slice(b"REQ ");
                dst.put_slice(&id.0);
                dst.put_u8(b' ');
                put_decimal(dst, *delay_ms);
                dst.put_u8(b'\n');
            }
            Command::Touch(id) => {
                dst.put_slice(b"TOUCH ");
                dst.put_slice(&id.0);
                dst.put_u8(b'\n');
            }
            Command::Nop => dst.put_slice(b"NOP\n"),
            Command::Cls => dst.put_slice(b"CLS\n"),
            Command::Pub { topic, body } => {
                dst.put_slice(b"PUB ");
                dst.put_slice(topic.as_bytes());
                dst.put_u8(b'\n');
                put_body(dst, body);
            }
            Command::Mpub { topic, bodies } => {
                dst.put_slice(b"MPUB ");
                dst.put_slice(topic.as_bytes());
                dst.put_u8(b'\n');
                let size: usize = 4 + bodies.iter().map(|b| 4 + b.len()).sum::<usize>();
                dst.reserve(4 + size);
                dst.put_u32(size as u32);
                dst.put_u32(bodies.len() as u32);
                for body in bodies {
                    put_body(dst, body);
                }
            }
            Command::Dpub {
                topic,
                defer_ms,
                body,
            } => {
                dst.put_slice(b"DPUB ");
                dst.put_slice(topic.as_bytes());
                dst.put_u8(b' ');
                put_decimal(dst, *defer_ms);
                dst.put_u8(b'\n');
                put_body(dst, body);
            }
        }
    }
}

fn put_body(dst: &mut BytesMut, body: &[u8]) {
    dst.reserve(4 + body.len());
    dst.put_u32(body.len() as u32);
    dst.put_slice(body);
}

/// Decodes [`Frame`]s from nsqd and encodes [`Command`]s to it.
#[derive(Debug, Clone)]
pub struct FrameCodec {
    max_frame_size: usize,
}

impl FrameCodec {
    /// A codec that refuses frames whose size field exceeds `max_frame_size` bytes.
    pub fn new(max_frame_size: usize) -> Self {
        FrameCodec { max_frame_size }
    }

    /// The largest size field accepted.
    pub fn max_frame_size(&self) -> usize {
        self.max_frame_size
    }
}

impl Default for FrameCodec {
    fn default() -> Self {
        FrameCodec::new(DEFAULT_MAX_FRAME_SIZE)
    }
}

impl Decoder for FrameCodec {
    type Item = Frame;
    type Error = FrameError;

    fn decode(&mut self, src: &mut BytesMut) -> Result<Option<Frame>, FrameError> {
        if src.len() < 4 {
            return Ok(None);
        }
        let size = u32::from_be_bytes([src[0], src[1], src[2], src[3]]);
        if size as u64 > self.max_frame_size as u64 {
            return Err(FrameError::TooLarge {
                size: size.into(),
                max: self.max_frame_size,
            });
        }
        if size < 4 {
            return Err(FrameError::TooShort(size));
        }
        let total = 4 + size as usize;
        if src.len() < total {
            // Bounded: `size` was checked against `max_frame_size` above.
            src.reserve(total - src.len());
            return Ok(None);
        }
        let frame_type = u32::from_be_bytes([src[4], src[5], src[6], src[7]]);
        // Check the type and the message length before consuming anything, so an error leaves
        // the buffer as it was (useful in logs and tests).
        let data_len = size as usize - 4;
        match frame_type {
            FRAME_TYPE_RESPONSE | FRAME_TYPE_ERROR => {}
            FRAME_TYPE_MESSAGE if data_len < MESSAGE_HEADER_LEN => {
                return Err(FrameError::ShortMessage(data_len));
            }
            FRAME_TYPE_MESSAGE => {}
            other => return Err(FrameError::UnknownType(other)),
        }
        let mut data = src.split_to(total).freeze();
        data.advance(8);
        Ok(Some(match frame_type {
            FRAME_TYPE_RESPONSE => Frame::Response(data),
            FRAME_TYPE_ERROR => Frame::Error(data),
            _ => {
                let timestamp_ns = data.get_i64();
                let attempts = data.get_u16();
                let mut id = [0u8; 16];
                data.copy_to_slice(&mut id);
                Frame::Message(RawMessage {
                    timestamp_ns,
                    attempts,
                    id: MessageId(id),
                    body: data,
                })
            }
        }))
    }
}

impl Encoder<Command> for FrameCodec {
    type Error = std::io::Error;

    fn encode(&mut self, item: Command, dst: &mut BytesMut) -> Result<(), std::io::Error> {
        item.encode(dst);
        Ok(())
    }
}

impl Encoder<&Command> for FrameCodec {
    type Error = std::io::Error;

    fn encode(&mut self, item: &Command, dst: &mut BytesMut) -> Result<(), std::io::Error> {
        item.encode(dst);
        Ok(())
    }
}

/// The code at the start of an error frame's text, such as `E_FIN_FAILED`.
pub(crate) fn error_code(text: &[u8]) -> &[u8] {
    let end = text.iter().position(|&b| b == b' ').unwrap_or(text.len());
    &text[..end]
}

/// Whether an error frame leaves the connection open: nsqd closes it after every other error.
///
/// Matches on the code prefix only; nsqd appends detail such as the message ID.
pub(crate) fn is_non_fatal_error(text: &[u8]) -> bool {
    matches!(
        error_code(text),
        b"E_FIN_FAILED"
            | b"E_REQ_FAILED"
            | b"E_TOUCH_FAILED"
            | b"E_PUB_FAILED"
            | b"E_MPUB_FAILED"
            | b"E_DPUB_FAILED"
    )
}

/// Encodes a frame as nsqd would; used by tests and benchmarks to build input.
#[cfg(feature = "sidecar")]
pub(crate) fn encode_frame(frame_type: u32, data: &[u8], dst: &mut BytesMut) {
    dst.reserve(8 + data.len());
    dst.put_u32(4 + data.len() as u32);
    dst.put_u32(frame_type);
    dst.put_slice(data);
}

/// Encodes a message frame as nsqd would; used by tests and benchmarks to build input.
pub fn encode_message_frame(msg: &RawMessage, dst: &mut BytesMut) {
    dst.reserve(8 + MESSAGE_HEADER_LEN + msg.body.len());
    dst.put_u32((4 + MESSAGE_HEADER_LEN + msg.body.len()) as u32);
    dst.put_u32(FRAME_TYPE_MESSAGE);
    dst.put_i64(msg.timestamp_ns);
    dst.put_u16(msg.attempts);
    dst.put_slice(&msg.id.0);
    dst.put_slice(&msg.body);
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn message(body: &'static [u8]) -> RawMessage {
        RawMessage {
            timestamp_ns: 1_700_000_000_000_000_000,
            attempts: 3,
            id: MessageId(*b"0123456789abcdef"),
            body: Bytes::from_static(body),
        }
    }

    #[test]
    fn decodes_each_frame_type() {
        let mut buf = BytesMut::new();
        encode_frame(FRAME_TYPE_RESPONSE, b"OK", &mut buf);
        encode_frame(FRAME_TYPE_ERROR, b"E_INVALID bad", &mut buf);
        encode_message_frame(&message(b"hello"), &mut buf);
        let mut codec = FrameCodec::default();
        assert_eq!(
            codec.decode(&mut buf).unwrap(),
            Some(Frame::Response(Bytes::from_static(b"OK")))
        );
        assert_eq!(
            codec.decode(&mut buf).unwrap(),
            Some(Frame::Error(Bytes::from_static(b"E_INVALID bad")))
        );
        assert_eq!(
            codec.decode(&mut buf).unwrap(),
            Some(Frame::Message(message(b"hello")))
        );
        assert_eq!(codec.decode(&mut buf).unwrap(), None);
        assert!(buf.is_empty());
    }

    #[test]
    fn empty_body_message_is_valid() {
        let mut buf = BytesMut::new();
        encode_message_frame(&message(b""), &mut buf);
        let frame = FrameCodec::default().decode(&mut buf).unwrap();
        assert_eq!(frame, Some(Frame::Message(message(b""))));
    }

    #[test]
    fn waits_for_a_whole_frame() {
        let mut whole = BytesMut::new();
        encode_message_frame(&message(b"split me"), &mut whole);
        let mut codec = FrameCodec::default();
        let mut buf = BytesMut::new();
        for (i, b) in whole.iter().enumerate() {
            buf.put_u8(*b);
            let out = codec.decode(&mut buf).unwrap();
            if i + 1 < whole.len() {
                assert_eq!(out, None, "frame decoded early at byte {i}");
            } else {
                assert_eq!(out, Some(Frame::Message(message(b"split me"))));
            }
        }
    }

    #[test]
    fn rejects_oversized_frames_before_allocating() {
        let mut buf = BytesMut::from(&[0xff, 0xff, 0xff, 0xff, 0, 0, 0, 0][..]);
        let err = FrameCodec::new(1024).decode(&mut buf).unwrap_err();
        assert!(
            matches!(
                err,
                FrameError::TooLarge {
                    size: 0xffff_ffff,
                    max: 1024
                }
            ),
            "{err}"
        );
        assert!(buf.capacity() < 1024, "capacity {} grew", buf.capacity());
    }

    #[test]
    fn rejects_short_message_and_unknown_type_and_tiny_size() {
        let mut buf = BytesMut::new();
        encode_frame(FRAME_TYPE_MESSAGE, &[0u8; 25], &mut buf);
        let err = FrameCodec::default().decode(&mut buf).unwrap_err();
        assert!(matches!(err, FrameError::ShortMessage(25)), "{err}");

        let mut buf = BytesMut::new();
        encode_frame(7, b"??", &mut buf);
        let err = FrameCodec::default().decode(&mut buf).unwrap_err();
        assert!(matches!(err, FrameError::UnknownType(7)), "{err}");

        for size in 0..4u32 {
            let mut buf = BytesMut::new();
            buf.put_u32(size);
            buf.put_u32(0);
            let err = FrameCodec::default().decode(&mut buf).unwrap_err();
            assert!(matches!(err, FrameError::TooShort(s) if s == size), "{err}");
        }
    }

    #[test]
    fn encodes_commands() {
        let id = MessageId(*b"0123456789abcdef");
        let cases: Vec<(Command, &[u8])> = vec![
            (Command::Fin(id), b"FIN 0123456789abcdef\n"),
            (Command::Req(id, 1500), b"REQ 0123456789abcdef 1500\n"),
            (Command::Req(id, 0), b"REQ 0123456789abcdef 0\n"),
            (Command::Touch(id), b"TOUCH 0123456789abcdef\n"),
            (Command::Rdy(2500), b"RDY 2500\n"),
            (Command::Nop, b"NOP\n"),
            (Command::Cls, b"CLS\n"),
            (
                Command::Sub {
                    topic: "t".into(),
                    channel: "c".into(),
                },
                b"SUB t c\n",
            ),
            (
                Command::Pub {
                    topic: "t".into(),
                    body: Bytes::from_static(b"ab"),
                },
                b"PUB t\n\0\0\0\x02ab",
            ),
            (
                Command::Dpub {
                    topic: "t".into(),
                    defer_ms: 10,
                    body: Bytes::from_static(b"ab"),
                },
                b"DPUB t 10\n\0\0\0\x02ab",
            ),
            (
                Command::Mpub {
                    topic: "t".into(),
                    bodies: vec![Bytes::from_static(b"a"), Bytes::from_static(b"bc")],
                },
                b"MPUB t\n\0\0\0\x0f\0\0\0\x02\0\0\0\x01a\0\0\0\x02bc",
            ),
            (
                Command::Identify(Bytes::from_static(b"{}")),
                b"IDENTIFY\n\0\0\0\x02{}",
            ),
        ];
        for (command, wire) in cases {
            let mut buf = BytesMut::new();
            command.encode(&mut buf);
            assert_eq!(&buf[..], wire, "{command:?}");
        }
    }

    #[test]
    fn classifies_error_codes_by_prefix() {
        assert!(is_non_fatal_error(
            b"E_FIN_FAILED FIN 0123456789abcdef failed ID not in flight"
        ));
        assert!(is_non_fatal_error(b"E_TOUCH_FAILED"));
        assert!(is_non_fatal_error(b"E_MPUB_FAILED x"));
        assert!(!is_non_fatal_error(
            b"E_INVALID RDY count 3000 out of range 0-2500"
        ));
        assert!(!is_non_fatal_error(b"E_FIN_FAILEDX"));
        assert!(!is_non_fatal_error(b""));
    }

    proptest! {
        /// Random bytes in random chunks: the decoder returns frames or an error, never panics,
        /// and never lets the buffer grow far beyond the input plus the frame limit.
        #[test]
        fn random_bytes_never_panic(
            data in proptest::collection::vec(any::<u8>(), 0..4096),
            cuts in proptest::collection::vec(1usize..64, 1..64),
            max in 0usize..2048,
        ) {
            let mut codec = FrameCodec::new(max);
            let mut buf = BytesMut::new();
            let mut pos = 0;
            let mut cut = cuts.iter().cycle();
            'feed: while pos < data.len() {
                let n = (*cut.next().unwrap()).min(data.len() - pos);
                buf.extend_from_slice(&data[pos..pos + n]);
                pos += n;
                loop {
                    match codec.decode(&mut buf) {
                        Ok(Some(Frame::Message(m))) => prop_assert!(m.body.len() + MESSAGE_HEADER_LEN + 4 <= max),
                        Ok(Some(_)) => {}
                        Ok(None) => break,
                        Err(_) => break 'feed,
                    }
                }
                prop_assert!(buf.capacity() <= 2 * (data.len() + max) + 64, "capacity {}", buf.capacity());
            }
        }

        /// Valid frames cut anywhere decode to exactly what was encoded.
        #[test]
        fn valid_frames_survive_any_chunking(
            bodies in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..300), 1..20),
            cuts in proptest::collection::vec(1usize..100, 1..32),
        ) {
            let mut wire = BytesMut::new();
            let mut expected = Vec::new();
            for (i, body) in bodies.iter().enumerate() {
                let msg = RawMessage {
                    timestamp_ns: i as i64,
                    attempts: i as u16,
                    id: MessageId(*b"fedcba9876543210"),
                    body: Bytes::copy_from_slice(body),
                };
                encode_message_frame(&msg, &mut wire);
                expected.push(Frame::Message(msg));
                encode_frame(FRAME_TYPE_RESPONSE, body, &mut wire);
                expected.push(Frame::Response(Bytes::copy_from_slice(body)));
            }
            let mut codec = FrameCodec::default();
            let mut buf = BytesMut::new();
            let mut got = Vec::new();
            let mut pos = 0;
            let mut cut = cuts.iter().cycle();
            while pos < wire.len() {
                let n = (*cut.next().unwrap()).min(wire.len() - pos);
                buf.extend_from_slice(&wire[pos..pos + n]);
                pos += n;
                while let Some(frame) = codec.decode(&mut buf).unwrap() {
                    got.push(frame);
                }
            }
            prop_assert_eq!(got, expected);
        }
    }
}
