//! The test nsqd's transport layers, as nsqd's `client_v2.go` upgrades them: TLS (rustls with
//! certificates made here by rcgen), snappy's framing format and raw DEFLATE.
//!
//! The codecs are other implementations than the client's: `snap`'s own frame reader and
//! writer and `flate2`'s streaming writers, so a client that gets the format wrong fails here
//! as it would against nsqd.

#![allow(dead_code)]

use std::io::{Read, Write};
use std::path::PathBuf;
use std::sync::Arc;

use bytes::{Buf, BytesMut};
use rcgen::{BasicConstraints, CertificateParams, IsCa, KeyPair};
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

/// nsqd's `--tls-client-auth-policy`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClientAuth {
    /// No client certificate asked for.
    None,
    /// `require-verify`: a certificate signed by the test CA.
    RequireVerify,
}

/// A CA, a server certificate for `127.0.0.1` and `localhost`, and a client certificate, all
/// written as PEM files into a temporary directory.
pub struct Pki {
    dir: tempfile::TempDir,
    ca_der: CertificateDer<'static>,
    server_chain: Vec<CertificateDer<'static>>,
    server_key_der: Vec<u8>,
}

impl Pki {
    pub fn new() -> Pki {
        let dir = tempfile::tempdir().unwrap();
        let ca_key = KeyPair::generate().unwrap();
        let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca_params
            .distinguished_name
            .push(rcgen::DnType::CommonName, "nsq-dedupe test CA");
        let ca = ca_params.self_signed(&ca_key).unwrap();
        let server_key = KeyPair::generate().unwrap();
        let server = CertificateParams::new(vec!["127.0.0.1".to_string(), "localhost".to_string()])
            .unwrap()
            .signed_by(&server_key, &ca, &ca_key)
            .unwrap();
        let client_key = KeyPair::generate().unwrap();
        let mut client_params = CertificateParams::new(Vec::<String>::new()).unwrap();
        client_params
            .distinguished_name
            .push(rcgen::DnType::CommonName, "nsq-dedupe test client");
        let client = client_params.signed_by(&client_key, &ca, &ca_key).unwrap();
        let write = |name: &str, text: String| std::fs::write(dir.path().join(name), text).unwrap();
        write("ca.pem", ca.pem());
        write("server.pem", server.pem());
        write("server.key", server_key.serialize_pem());
        write("client.pem", client.pem());
        write("client.key", client_key.serialize_pem());
        // A CA nobody trusts, for the "does not verify" case.
        let other_key = KeyPair::generate().unwrap();
        let mut other = CertificateParams::new(Vec::<String>::new()).unwrap();
        other.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        write("other-ca.pem", other.self_signed(&other_key).unwrap().pem());
        Pki {
            dir,
            ca_der: ca.der().clone(),
            server_chain: vec![server.der().clone()],
            server_key_der: server_key.serialize_der(),
        }
    }

    /// The CA's certificate, for the client's `tls_root_ca_file`.
    pub fn ca_file(&self) -> PathBuf {
        self.dir.path().join("ca.pem")
    }

    /// A CA that did not sign the server's certificate.
    pub fn other_ca_file(&self) -> PathBuf {
        self.dir.path().join("other-ca.pem")
    }

    /// The server certificate (for `127.0.0.1` and `localhost`) and its key, for servers
    /// started as processes.
    pub fn server_files(&self) -> (PathBuf, PathBuf) {
        (
            self.dir.path().join("server.pem"),
            self.dir.path().join("server.key"),
        )
    }

    /// The client certificate and its key.
    pub fn client_files(&self) -> (PathBuf, PathBuf) {
        (
            self.dir.path().join("client.pem"),
            self.dir.path().join("client.key"),
        )
    }

    /// The server side for the test nsqd.
    pub fn server(&self, client_auth: ClientAuth) -> tokio_rustls::TlsAcceptor {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let builder = rustls::ServerConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .unwrap();
        let builder = match client_auth {
            ClientAuth::None => builder.with_no_client_auth(),
            ClientAuth::RequireVerify => {
                let mut roots = rustls::RootCertStore::empty();
                roots.add(self.ca_der.clone()).unwrap();
                let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
                    roots.into(),
                    provider,
                )
                .build()
                .unwrap();
                builder.with_client_cert_verifier(verifier)
            }
        };
        let key = PrivateKeyDer::Pkcs8(self.server_key_der.clone().into());
        let config = builder
            .with_single_cert(self.server_chain.clone(), key)
            .unwrap();
        tokio_rustls::TlsAcceptor::from(Arc::new(config))
    }
}

/// The compression of one client connection, both directions.
pub enum Codec {
    Plain,
    Snappy {
        /// Bytes received that do not yet make a whole chunk.
        raw: BytesMut,
        decoder: Box<snap::read::FrameDecoder<Feed>>,
        encoder: Box<snap::write::FrameEncoder<Vec<u8>>>,
    },
    Deflate {
        decoder: flate2::write::DeflateDecoder<Vec<u8>>,
        encoder: flate2::write::DeflateEncoder<Vec<u8>>,
    },
}

/// Whole snappy chunks waiting for the frame reader.
#[derive(Default)]
pub struct Feed(BytesMut);

impl Read for Feed {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = buf.len().min(self.0.len());
        buf[..n].copy_from_slice(&self.0[..n]);
        self.0.advance(n);
        Ok(n)
    }
}

impl Codec {
    pub fn snappy() -> Codec {
        Codec::Snappy {
            raw: BytesMut::new(),
            decoder: Box::new(snap::read::FrameDecoder::new(Feed::default())),
            encoder: Box::new(snap::write::FrameEncoder::new(Vec::new())),
        }
    }

    pub fn deflate(level: u32) -> Codec {
        Codec::Deflate {
            decoder: flate2::write::DeflateDecoder::new(Vec::new()),
            encoder: flate2::write::DeflateEncoder::new(
                Vec::new(),
                flate2::Compression::new(level),
            ),
        }
    }

    /// Decodes `wire` (bytes as received) onto `out`.
    pub fn decode(&mut self, wire: &[u8], out: &mut BytesMut) -> std::io::Result<()> {
        match self {
            Codec::Plain => out.extend_from_slice(wire),
            Codec::Snappy { raw, decoder, .. } => {
                raw.extend_from_slice(wire);
                // Hand the frame reader whole chunks only: it must never see half of one.
                loop {
                    if raw.len() < 4 {
                        break;
                    }
                    let len =
                        usize::from(raw[1]) | usize::from(raw[2]) << 8 | usize::from(raw[3]) << 16;
                    if raw.len() < 4 + len {
                        break;
                    }
                    let chunk = raw.split_to(4 + len);
                    decoder.get_mut().0.extend_from_slice(&chunk);
                }
                let mut buf = [0u8; 16 * 1024];
                loop {
                    let n = decoder.read(&mut buf)?;
                    if n == 0 {
                        break;
                    }
                    out.extend_from_slice(&buf[..n]);
                }
            }
            Codec::Deflate { decoder, .. } => {
                decoder.write_all(wire)?;
                decoder.flush()?;
                out.extend_from_slice(decoder.get_ref());
                decoder.get_mut().clear();
            }
        }
        Ok(())
    }

    /// Encodes `data` for the wire, flushed (nsqd flushes its writer after every frame batch).
    pub fn encode(&mut self, data: &[u8]) -> std::io::Result<Vec<u8>> {
        Ok(match self {
            Codec::Plain => data.to_vec(),
            Codec::Snappy { encoder, .. } => {
                encoder.write_all(data)?;
                encoder.flush()?;
                std::mem::take(encoder.get_mut())
            }
            Codec::Deflate { encoder, .. } => {
                encoder.write_all(data)?;
                encoder.flush()?;
                std::mem::take(encoder.get_mut())
            }
        })
    }
}
