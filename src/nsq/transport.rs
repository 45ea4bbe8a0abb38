//! Opening a connection to nsqd: the magic, IDENTIFY, and what IDENTIFY negotiates beyond plain
//! TCP (TLS, snappy or deflate, AUTH), in nsqd's order (`protocol_v2.go`, `IDENTIFY`):
//!
//! 1. IDENTIFY asks for `tls_v1`, `snappy`, `deflate`; nsqd's JSON answer says what it agreed to
//!    and whether it wants AUTH.
//! 2. TLS: the handshake on the same socket, then an `OK` read over TLS.
//! 3. snappy or deflate (never both): both directions switch, then an `OK` read through the
//!    decoder.
//! 4. AUTH with the secret when nsqd asked for it; nsqd answers with the identity it found.
//!
//! Until step 4 is done every frame is read with exact lengths, so no byte of a later layer is
//! ever read by an earlier one. Answers no retry can change become [`Error::Refused`], naming
//! the setting to change ([`Role::setting`]).

use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use serde::Deserialize;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_util::codec::Decoder as _;

use super::deflate::{DeflateDecoder, DeflateEncoder};
use super::error::{broker_error, Error};
use super::frame::{Command, Frame, FrameCodec, HEARTBEAT, MAGIC_V2};
use super::identify::{Identify, IdentifyResponse};
use super::refusal::Role;
use super::secret::AuthSecret;
use super::snappy::{SnappyDecoder, SnappyEncoder};
use super::stream::{Decoding, Encoding, ReadHalf, WriteHalf};
use crate::tls::{TlsFileError, TlsSettings};
use crate::wording::Wording;

/// What a connection asks nsqd for at IDENTIFY beyond plain TCP. Defaults to: nothing.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Transport {
    /// Upgrade to TLS (`tls_v1`). An nsqd that does not agree is refused, never used in the
    /// clear.
    pub tls: Option<TlsSettings>,
    /// Compress the connection. An nsqd that does not agree is used uncompressed.
    pub compression: Compression,
    /// Sent with AUTH when nsqd asks for it.
    pub auth_secret: Option<AuthSecret>,
}

/// Compression of a connection, after TLS.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Compression {
    /// None.
    #[default]
    None,
    /// Snappy's framing format: cheap, for CPU-bound links.
    Snappy,
    /// Raw DEFLATE at a level from 1 to 9, capped by nsqd's `--max-deflate-level`.
    Deflate {
        /// The level asked for.
        level: u32,
    },
}

/// The deflate level when none is given (go-nsq's and nsqd's default).
#[cfg(feature = "sidecar")]
pub(crate) const DEFAULT_DEFLATE_LEVEL: u32 = 6;

/// A [`Transport`] with its files read: ready to open connections.
#[derive(Clone)]
pub(crate) struct Prepared {
    tls: Option<tokio_rustls::TlsConnector>,
    auth_secret: Option<AuthSecret>,
    role: Role,
}

impl Prepared {
    /// Who opens connections with it.
    pub(crate) fn role(&self) -> Role {
        self.role
    }
}

impl Transport {
    /// Checks what can be checked without files or a peer.
    ///
    /// # Errors
    ///
    /// [`Error::Config`] for a deflate level outside 1..=9.
    pub fn validate(&self) -> Result<(), Error> {
        if let Compression::Deflate { level } = self.compression {
            if !(1..=9).contains(&level) {
                return Err(Error::Config {
                    field: "deflate_level",
                    reason: format!("must be 1 (fastest) to 9 (smallest), got {level}"),
                });
            }
        }
        Ok(())
    }

    /// [`Transport::prepare`], its error as [`Error::Config`] naming the go-nsq key.
    pub(crate) fn prepare_for(&self, role: Role) -> Result<Prepared, Error> {
        self.prepare(role).map_err(|error| Error::Config {
            field: match error.what {
                "client certificate" => "tls_cert",
                "client key" => "tls_key",
                _ => "tls_root_ca_file",
            },
            reason: error.to_string(),
        })
    }

    /// Reads the TLS files and builds what every connection shares.
    ///
    /// # Errors
    ///
    /// A TLS file that cannot be used.
    pub(crate) fn prepare(&self, role: Role) -> Result<Prepared, TlsFileError> {
        let tls = match &self.tls {
            None => None,
            Some(settings) => {
                if settings.insecure_skip_verify {
                    tracing::warn!(
                        "TLS certificates of nsqd are not verified (tls_insecure_skip_verify): \
                         anyone on the path can read and change the traffic."
                    );
                }
                let config = crate::tls::client_config(settings)?;
                Some(tokio_rustls::TlsConnector::from(Arc::new(config)))
            }
        };
        if self.auth_secret.is_some() && tls.is_none() {
            tracing::warn!(
                "The AUTH secret will be sent to nsqd over plain TCP (TLS is off): anyone on \
                 the path can read it."
            );
        }
        Ok(Prepared {
            tls,
            auth_secret: self.auth_secret.clone(),
            role,
        })
    }

    /// Writes what to ask for into IDENTIFY.
    pub(crate) fn ask(&self, identify: &mut Identify) {
        identify.tls_v1 = self.tls.is_some();
        match self.compression {
            Compression::None => {}
            Compression::Snappy => identify.snappy = true,
            Compression::Deflate { level } => {
                identify.deflate = true;
                identify.deflate_level = level;
            }
        }
    }
}

/// nsqd's answer to AUTH.
#[derive(Debug, Deserialize, Default)]
#[serde(default)]
struct AuthResponse {
    identity: String,
    identity_url: String,
    permission_count: u64,
}

/// Opens a connection to `addr`: magic, IDENTIFY, the upgrades nsqd agreed to, AUTH. Returns
/// the outermost read and write halves and nsqd's settings.
pub(crate) async fn open(
    addr: &str,
    identify: &Identify,
    transport: &Prepared,
    max_frame_size: usize,
) -> Result<(ReadHalf, WriteHalf, IdentifyResponse), Error> {
    let io = |cause| Error::Io {
        addr: addr.to_string(),
        cause,
    };
    let mut codec = FrameCodec::new(max_frame_size);
    let mut tcp = TcpStream::connect(addr).await.map_err(io)?;
    tcp.set_nodelay(true).map_err(io)?;
    let settings = send_identify(addr, identify, transport.role, &mut tcp, &mut codec).await?;
    check_agreement(addr, identify, &settings, transport.role)?;
    let (read, write) = upgrade_tls(addr, tcp, &settings, transport, &mut codec).await?;
    let (mut read, mut write) = compress(addr, &settings, read, write, &mut codec).await?;
    authenticate(
        addr, &settings, transport, &mut read, &mut write, &mut codec,
    )
    .await?;
    Ok((read, write, settings))
}

/// Step 1: the magic and IDENTIFY, and nsqd's answer: its settings.
async fn send_identify(
    addr: &str,
    identify: &Identify,
    role: Role,
    tcp: &mut TcpStream,
    codec: &mut FrameCodec,
) -> Result<IdentifyResponse, Error> {
    let io = |cause| Error::Io {
        addr: addr.to_string(),
        cause,
    };
    let body = serde_json::to_vec(identify).expect("IDENTIFY serialises");
    let mut buf = BytesMut::with_capacity(64 + body.len());
    buf.extend_from_slice(MAGIC_V2);
    Command::Identify(Bytes::from(body)).encode(&mut buf);
    tcp.write_all(&buf).await.map_err(io)?;
    let first = read_exact_frame(tcp, codec).await.map_err(|cause| {
        match cause.get_ref().and_then(|e| e.downcast_ref::<TextAnswer>()) {
            Some(text) => super::refusal::not_nsq(addr, &text.0, role),
            None => io(cause),
        }
    })?;
    let answer = match first {
        Frame::Response(data) => data,
        Frame::Error(text) => {
            let error = broker_error(addr, &text);
            return Err(super::refusal::classify("IDENTIFY", error, role));
        }
        Frame::Message(_) => return Err(unexpected(addr, "IDENTIFY", b"a message")),
    };
    Ok(if answer.first() == Some(&b'{') {
        serde_json::from_slice(&answer).map_err(|e| Error::UnexpectedResponse {
            addr: addr.to_string(),
            command: "IDENTIFY",
            answer: format!("{} ({e})", String::from_utf8_lossy(&answer)),
        })?
    } else if &answer[..] == b"OK" {
        IdentifyResponse::default()
    } else {
        return Err(unexpected(addr, "IDENTIFY", &answer));
    })
}

/// Step 2: the TLS handshake when nsqd agreed to it, and its `OK`; the halves to build on.
async fn upgrade_tls(
    addr: &str,
    tcp: TcpStream,
    settings: &IdentifyResponse,
    transport: &Prepared,
    codec: &mut FrameCodec,
) -> Result<(ReadHalf, WriteHalf), Error> {
    Ok(match &transport.tls {
        Some(connector) if settings.tls_v1 => {
            let host = addr.rsplit_once(':').map_or(addr, |(host, _)| host);
            let name = crate::tls::server_name(host).map_err(|reason| Error::Refused {
                addr: addr.to_string(),
                command: "TLS",
                text: reason,
                advice: "give nsqd's address by a name or IP address its certificate carries"
                    .into(),
            })?;
            let stream = connector
                .connect(name, tcp)
                .await
                .map_err(|cause| super::refusal::tls_failure(addr, cause, transport.role))?;
            let (r, w) = tokio::io::split(stream);
            let mut read: ReadHalf = Box::new(r);
            // Under TLS 1.3 the server judges our certificate after our side of the handshake
            // is done: its refusal arrives as an alert on this first read.
            match read_exact_frame(&mut read, codec).await {
                Ok(frame) => expect_ok_frame(addr, "TLS", frame)?,
                Err(cause) => return Err(super::refusal::tls_failure(addr, cause, transport.role)),
            }
            (read, Box::new(w))
        }
        _ => {
            let (r, w) = tcp.into_split();
            (Box::new(r), Box::new(w))
        }
    })
}

/// Step 3: snappy or deflate when nsqd agreed to it, both directions, and its `OK`; the halves
/// wrapped in them.
async fn compress(
    addr: &str,
    settings: &IdentifyResponse,
    mut read: ReadHalf,
    mut write: WriteHalf,
    codec: &mut FrameCodec,
) -> Result<(ReadHalf, WriteHalf), Error> {
    if settings.snappy {
        read = Box::new(Decoding::new(read, SnappyDecoder::default()));
        write = Box::new(Encoding::new(write, SnappyEncoder::default()));
        expect_ok(addr, "snappy", &mut read, codec).await?;
    } else if settings.deflate {
        read = Box::new(Decoding::new(read, DeflateDecoder::default()));
        write = Box::new(Encoding::new(
            write,
            DeflateEncoder::new(settings.deflate_level.clamp(1, 9)),
        ));
        expect_ok(addr, "deflate", &mut read, codec).await?;
    }
    Ok((read, write))
}

/// Step 4: AUTH with the secret when nsqd asks for it.
async fn authenticate(
    addr: &str,
    settings: &IdentifyResponse,
    transport: &Prepared,
    read: &mut ReadHalf,
    write: &mut WriteHalf,
    codec: &mut FrameCodec,
) -> Result<(), Error> {
    if settings.auth_required {
        let Some(secret) = &transport.auth_secret else {
            return Err(Error::Refused {
                addr: addr.to_string(),
                command: "IDENTIFY",
                text: "nsqd requires AUTH (it runs with --auth-http-address)".into(),
                advice: Wording::from("set the secret with ")
                    .then(transport.role.setting("auth_secret")),
            });
        };
        auth(addr, secret, read, write, codec, transport.role).await?;
    } else if transport.auth_secret.is_some() {
        tracing::debug!(nsqd = %addr, "nsqd does not require AUTH; the secret is not sent.");
    }
    Ok(())
}

/// Refuses an answer that differs from what we asked where the difference matters.
fn check_agreement(
    addr: &str,
    asked: &Identify,
    settings: &IdentifyResponse,
    role: Role,
) -> Result<(), Error> {
    let surprise = (settings.tls_v1 && !asked.tls_v1)
        || (settings.snappy && !asked.snappy)
        || (settings.deflate && !asked.deflate)
        || (settings.snappy && settings.deflate);
    if surprise {
        return Err(Error::UnexpectedResponse {
            addr: addr.to_string(),
            command: "IDENTIFY",
            answer: "an upgrade this client did not ask for".into(),
        });
    }
    if asked.tls_v1 && !settings.tls_v1 {
        return Err(Error::Refused {
            addr: addr.to_string(),
            command: "IDENTIFY",
            text: "nsqd did not agree to TLS (it has no --tls-cert and --tls-key)".into(),
            advice: Wording::from("give nsqd a certificate, or remove ")
                .then(role.setting("tls_v1")),
        });
    }
    for (wanted, agreed, name) in [
        (asked.snappy, settings.snappy, "snappy"),
        (asked.deflate, settings.deflate, "deflate"),
    ] {
        if wanted && !agreed {
            tracing::info!(nsqd = %addr, "nsqd did not agree to {name} (its --{name}=false); the connection is not compressed.");
        }
    }
    Ok(())
}

/// Sends AUTH and reads nsqd's answer, answering heartbeats meanwhile.
async fn auth(
    addr: &str,
    secret: &AuthSecret,
    read: &mut ReadHalf,
    write: &mut WriteHalf,
    codec: &mut FrameCodec,
    role: Role,
) -> Result<(), Error> {
    let io = |cause| Error::Io {
        addr: addr.to_string(),
        cause,
    };
    send(write, &Command::Auth(secret.clone()))
        .await
        .map_err(io)?;
    loop {
        match read_exact_frame(read, codec).await.map_err(io)? {
            Frame::Response(data) if &data[..] == HEARTBEAT => {
                send(write, &Command::Nop).await.map_err(io)?;
            }
            Frame::Response(data) => {
                let answer: AuthResponse = serde_json::from_slice(&data).unwrap_or_default();
                tracing::info!(
                    nsqd = %addr,
                    identity = %answer.identity,
                    identity_url = %answer.identity_url,
                    permission_count = answer.permission_count,
                    "Authenticated to nsqd."
                );
                return Ok(());
            }
            Frame::Error(text) => {
                let error = broker_error(addr, &text);
                return Err(super::refusal::classify("AUTH", error, role));
            }
            Frame::Message(_) => return Err(unexpected(addr, "AUTH", b"a message")),
        }
    }
}

async fn send(write: &mut WriteHalf, command: &Command) -> std::io::Result<()> {
    let mut buf = BytesMut::new();
    command.encode(&mut buf);
    write.write_all(&buf).await?;
    write.flush().await
}

/// Reads the `OK` that ends an upgrade step.
async fn expect_ok(
    addr: &str,
    step: &'static str,
    read: &mut ReadHalf,
    codec: &mut FrameCodec,
) -> Result<(), Error> {
    let frame = read_exact_frame(read, codec)
        .await
        .map_err(|cause| Error::Io {
            addr: addr.to_string(),
            cause: std::io::Error::new(
                cause.kind(),
                format!("reading nsqd's OK after the {step} upgrade: {cause}"),
            ),
        })?;
    expect_ok_frame(addr, step, frame)
}

fn expect_ok_frame(addr: &str, step: &'static str, frame: Frame) -> Result<(), Error> {
    match frame {
        Frame::Response(data) if &data[..] == b"OK" => Ok(()),
        Frame::Response(data) => Err(unexpected(addr, step, &data)),
        Frame::Error(text) => Err(broker_error(addr, &text)),
        Frame::Message(_) => Err(unexpected(addr, step, b"a message")),
    }
}

/// Text where a frame's size belongs: the peer speaks another protocol, such as HTTP.
#[derive(Debug, thiserror::Error)]
#[error("the answer starts with {0:?}, text where a frame's size belongs")]
struct TextAnswer(String);

/// Reads one frame, taking exactly its bytes from `read`.
///
/// # Errors
///
/// The socket's, or `InvalidData` for a size out of bounds; its inner error is a
/// [`TextAnswer`] when the size is printable text.
async fn read_exact_frame<R: AsyncRead + Unpin>(
    read: &mut R,
    codec: &mut FrameCodec,
) -> std::io::Result<Frame> {
    let mut size = [0u8; 4];
    read.read_exact(&mut size).await?;
    let len = u32::from_be_bytes(size) as usize;
    // A size whose four bytes are all printable is over 500 MB: no frame, but the start of a
    // text answer ("HTTP/1.1 400", "<!DOCTYPE").
    if size.iter().all(|b| b.is_ascii_graphic() || *b == b' ') {
        let text = String::from_utf8_lossy(&size).into_owned();
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            TextAnswer(text),
        ));
    }
    if len < 4 || len > codec.max_frame_size() {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!(
                "frame of {len} bytes (the limit is {})",
                codec.max_frame_size()
            ),
        ));
    }
    let mut buf = BytesMut::with_capacity(4 + len);
    buf.extend_from_slice(&size);
    buf.resize(4 + len, 0);
    read.read_exact(&mut buf[4..]).await?;
    match codec.decode(&mut buf) {
        Ok(Some(frame)) => Ok(frame),
        Ok(None) => Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            "a frame shorter than its size",
        )),
        Err(error) => Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            error.to_string(),
        )),
    }
}

fn unexpected(addr: &str, command: &'static str, answer: &[u8]) -> Error {
    Error::UnexpectedResponse {
        addr: addr.to_string(),
        command,
        answer: String::from_utf8_lossy(answer).into_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settings_are_named_for_each_role() {
        assert_eq!(
            Role::Consumer.setting("auth_secret").to_string(),
            "`--auth-secret` (`consumer_opt.auth_secret`)"
        );
        assert_eq!(
            Role::Consumer.setting("tls_v1").to_string(),
            "`--tls` (`consumer_opt.tls_v1`)"
        );
        assert_eq!(
            Role::Producer.setting("tls_root_ca_file").to_string(),
            "`--producer-opt tls_root_ca_file,…` (`producer_opt.tls_root_ca_file`)"
        );
    }
}
