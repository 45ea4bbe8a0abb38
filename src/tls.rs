//! TLS client settings shared by the NSQ connections and the HTTP client: which certificates
//! to trust (the system's roots plus a CA file), an optional client certificate, the lowest
//! protocol version, and the opt-out from verification; and the server side of the serve
//! endpoint (`server_config`). Built on rustls with the ring provider.

use std::fmt;
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::sync::Arc;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject as _;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::{DigitallySignedStruct, RootCertStore, SignatureScheme};

/// How a TLS client checks its peer and presents itself.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TlsSettings {
    /// A PEM file of CA certificates trusted besides the system's roots.
    pub root_ca_file: Option<PathBuf>,
    /// A PEM certificate chain presented to a server that asks for one (nsqd's
    /// `--tls-client-auth-policy`); needs `key_file`.
    pub cert_file: Option<PathBuf>,
    /// The PEM private key of `cert_file`.
    pub key_file: Option<PathBuf>,
    /// Accept any server certificate. Only the server's possession of its key is checked, not
    /// who it is: anyone on the path can read and change the traffic.
    pub insecure_skip_verify: bool,
    /// The lowest protocol version offered.
    pub min_version: TlsVersion,
}

/// The lowest TLS version a client offers. rustls speaks TLS 1.2 and 1.3 only, so the older
/// names go-nsq accepts (`ssl3.0`, `tls1.0`, `tls1.1`) mean TLS 1.2.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum TlsVersion {
    /// TLS 1.2 or 1.3.
    #[default]
    Tls12,
    /// TLS 1.3 only.
    Tls13,
}

impl TlsVersion {
    /// The names accepted by [`FromStr`].
    pub const NAMES: &'static str = "ssl3.0, tls1.0, tls1.1, tls1.2 or tls1.3";
}

impl FromStr for TlsVersion {
    type Err = String;
    fn from_str(text: &str) -> Result<Self, String> {
        match text {
            "ssl3.0" | "tls1.0" | "tls1.1" | "tls1.2" => Ok(TlsVersion::Tls12),
            "tls1.3" => Ok(TlsVersion::Tls13),
            _ => Err(format!("expected {}", TlsVersion::NAMES)),
        }
    }
}

impl fmt::Display for TlsVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            TlsVersion::Tls12 => "tls1.2",
            TlsVersion::Tls13 => "tls1.3",
        })
    }
}

/// A file of the TLS settings that cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("cannot use {what} {path}: {cause}")]
pub struct TlsFileError {
    /// Which file: "CA file", "client certificate", "client key".
    pub what: &'static str,
    /// The file.
    pub path: PathBuf,
    /// Why.
    pub cause: String,
}

/// The system's trusted roots plus the certificates of `ca_file`.
///
/// # Errors
///
/// The CA file cannot be read, or holds no usable CA certificate.
pub(crate) fn roots(ca_file: Option<&Path>) -> Result<RootCertStore, TlsFileError> {
    let mut roots = RootCertStore::empty();
    // A system without a usable store still works with a CA file.
    roots.add_parsable_certificates(rustls_native_certs::load_native_certs().certs);
    if let Some(path) = ca_file {
        let certs = read_certs("CA file", path)?;
        let (added, _) = roots.add_parsable_certificates(certs);
        if added == 0 {
            return Err(file_error(
                "CA file",
                path,
                "none of its certificates is a usable CA",
            ));
        }
    }
    Ok(roots)
}

/// The ring provider every TLS client here uses.
pub(crate) fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// A rustls client configuration for `settings`.
///
/// # Errors
///
/// A file that cannot be read or used, or a certificate without its key.
pub(crate) fn client_config(settings: &TlsSettings) -> Result<rustls::ClientConfig, TlsFileError> {
    let provider = provider();
    let versions: &[&rustls::SupportedProtocolVersion] = match settings.min_version {
        TlsVersion::Tls12 => &[&rustls::version::TLS13, &rustls::version::TLS12],
        TlsVersion::Tls13 => &[&rustls::version::TLS13],
    };
    let builder = rustls::ClientConfig::builder_with_provider(provider.clone())
        .with_protocol_versions(versions)
        .expect("ring supports TLS 1.2 and 1.3");
    let builder = if settings.insecure_skip_verify {
        builder
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(AnyServer(provider)))
    } else {
        builder.with_root_certificates(roots(settings.root_ca_file.as_deref())?)
    };
    match (&settings.cert_file, &settings.key_file) {
        (None, None) => Ok(builder.with_no_client_auth()),
        (Some(cert), Some(key)) => {
            let chain = read_certs("client certificate", cert)?;
            let key_der = PrivateKeyDer::from_pem_file(key)
                .map_err(|error| file_error("client key", key, pem_error(error)))?;
            builder
                .with_client_auth_cert(chain, key_der)
                .map_err(|error| file_error("client key", key, error))
        }
        (Some(cert), None) => Err(file_error(
            "client certificate",
            cert,
            "it needs its private key too (tls_key)",
        )),
        (None, Some(key)) => Err(file_error(
            "client key",
            key,
            "it needs its certificate too (tls_cert)",
        )),
    }
}

/// A rustls server configuration presenting the PEM chain `cert` with its PEM key `key`,
/// asking no client certificate.
///
/// # Errors
///
/// A file that cannot be read or used, or a key that does not fit the certificate.
#[cfg(feature = "sidecar")]
pub(crate) fn server_config(cert: &Path, key: &Path) -> Result<rustls::ServerConfig, TlsFileError> {
    let chain = read_certs("server certificate", cert)?;
    let key_der = PrivateKeyDer::from_pem_file(key)
        .map_err(|error| file_error("server key", key, pem_error(error)))?;
    rustls::ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .expect("ring supports the default versions")
        .with_no_client_auth()
        .with_single_cert(chain, key_der)
        .map_err(|error| file_error("server key", key, error))
}

/// The name a server's certificate must carry: an IP address or a DNS name.
///
/// # Errors
///
/// When `host` is neither.
pub(crate) fn server_name(host: &str) -> Result<ServerName<'static>, String> {
    let host = host.trim_start_matches('[').trim_end_matches(']');
    ServerName::try_from(host.to_string())
        .map_err(|_| format!("{host:?} is neither an IP address nor a DNS name"))
}

fn read_certs(
    what: &'static str,
    path: &Path,
) -> Result<Vec<CertificateDer<'static>>, TlsFileError> {
    let certs: Vec<_> = CertificateDer::pem_file_iter(path)
        .map_err(|error| file_error(what, path, pem_error(error)))?
        .collect::<Result<_, _>>()
        .map_err(|error| file_error(what, path, error))?;
    if certs.is_empty() {
        return Err(file_error(what, path, "no PEM certificate in it"));
    }
    Ok(certs)
}

/// A PEM error as a reason: "cannot read it" for I/O, else what is wrong with the contents.
fn pem_error(error: rustls::pki_types::pem::Error) -> String {
    match error {
        rustls::pki_types::pem::Error::Io(error) => format!("cannot read it: {error}"),
        rustls::pki_types::pem::Error::NoItemsFound => "no PEM item of that kind in it".into(),
        other => format!("not valid PEM: {other:?}"),
    }
}

fn file_error(what: &'static str, path: &Path, cause: impl fmt::Display) -> TlsFileError {
    TlsFileError {
        what,
        path: path.to_owned(),
        cause: cause.to_string(),
    }
}

/// Accepts any certificate, but still checks the handshake's signatures with it, so the peer
/// must hold the key of the certificate it shows.
#[derive(Debug)]
struct AnyServer(Arc<CryptoProvider>);

impl ServerCertVerifier for AnyServer {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_accept_go_nsq_names() {
        assert_eq!("tls1.0".parse(), Ok(TlsVersion::Tls12));
        assert_eq!("tls1.3".parse(), Ok(TlsVersion::Tls13));
        assert_eq!(
            "1.2".parse::<TlsVersion>(),
            Err("expected ssl3.0, tls1.0, tls1.1, tls1.2 or tls1.3".into())
        );
    }

    #[test]
    fn files_that_cannot_be_used_are_named() {
        let missing = TlsSettings {
            root_ca_file: Some("/nonexistent/ca.pem".into()),
            ..TlsSettings::default()
        };
        let error = client_config(&missing).unwrap_err();
        assert_eq!(error.what, "CA file");
        assert!(
            error
                .to_string()
                .starts_with("cannot use CA file /nonexistent/ca.pem: "),
            "{error}"
        );
        let half = TlsSettings {
            cert_file: Some("/tmp/cert.pem".into()),
            ..TlsSettings::default()
        };
        assert_eq!(
            client_config(&half).unwrap_err().to_string(),
            "cannot use client certificate /tmp/cert.pem: it needs its private key too (tls_key)"
        );
        assert!(server_name("127.0.0.1").is_ok());
        assert!(server_name("nsqd-1.example").is_ok());
    }
}
