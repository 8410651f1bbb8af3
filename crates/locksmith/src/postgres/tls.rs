//! TLS: `sslmode` and `sslrootcert` as libpq reads them, on rustls.
//!
//! tokio-postgres itself knows `disable`, `prefer` and `require` and leaves
//! certificate checks to the TLS connector; this module builds that
//! connector. Without a root certificate nothing is checked (libpq's
//! `prefer` and `require`: encryption only); with one (`sslrootcert=`, or
//! `verify-ca` / `verify-full`, whose default is libpq's
//! `~/.postgresql/root.crt`) the server's chain must lead to it, and for
//! `verify-full` its certificate must name the host of the URL. `sslcert`
//! and `sslkey` (together) are the client certificate, for servers that ask
//! for one (`clientcert=verify-ca|verify-full`, or `cert` authentication).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::WebPkiServerVerifier;
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::{CertificateError, DigitallySignedStruct, RootCertStore, SignatureScheme};
use tokio_postgres::tls::MakeTlsConnect;
use tokio_postgres_rustls::MakeRustlsConnect;

/// `sslmode`, as libpq spells it (`allow` is not supported).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SslMode {
    Disable,
    Prefer,
    Require,
    VerifyCa,
    VerifyFull,
}

impl SslMode {
    pub fn parse(value: &str) -> Option<SslMode> {
        Some(match value {
            "disable" => SslMode::Disable,
            "prefer" => SslMode::Prefer,
            "require" => SslMode::Require,
            "verify-ca" => SslMode::VerifyCa,
            "verify-full" => SslMode::VerifyFull,
            _ => return None,
        })
    }

    /// What tokio-postgres needs to know: whether TLS is tried, or required.
    pub fn negotiation(self) -> tokio_postgres::config::SslMode {
        match self {
            SslMode::Disable => tokio_postgres::config::SslMode::Disable,
            SslMode::Prefer => tokio_postgres::config::SslMode::Prefer,
            _ => tokio_postgres::config::SslMode::Require,
        }
    }
}

/// The TLS connector of every connection of one backend.
#[derive(Clone)]
pub(crate) struct Tls(pub MakeRustlsConnect);

impl std::fmt::Debug for Tls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Tls")
    }
}

impl Tls {
    /// The connector for `mode`, checking certificates against the PEM file
    /// `root` (all of its certificates are trusted), or the default root
    /// file for `verify-*` when `root` is `None`; `identity` is the client
    /// certificate (chain) and key, PEM files. Errors are plain messages,
    /// for an invalid-URL error.
    pub fn new(
        mode: SslMode,
        root: Option<&Path>,
        identity: Option<(&Path, &Path)>,
    ) -> Result<Tls, String> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let root = match (mode, root) {
            (_, Some(root)) => Some(root.to_owned()),
            (SslMode::VerifyCa | SslMode::VerifyFull, None) => Some(default_root()?),
            _ => None,
        };
        let builder = rustls::ClientConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(|e| e.to_string())?;
        let config = match root {
            None => builder
                .dangerous()
                .with_custom_certificate_verifier(Arc::new(AnyCertificate(provider))),
            Some(root) => {
                let roots = Arc::new(load_roots(&root)?);
                if mode == SslMode::VerifyFull {
                    builder.with_root_certificates(roots)
                } else {
                    let chain = WebPkiServerVerifier::builder_with_provider(roots, provider)
                        .build()
                        .map_err(|e| e.to_string())?;
                    builder
                        .dangerous()
                        .with_custom_certificate_verifier(Arc::new(AnyName(chain)))
                }
            }
        };
        let config = match identity {
            None => config.with_no_client_auth(),
            Some((cert, key)) => {
                let (chain, key) = load_identity(cert, key)?;
                config
                    .with_client_auth_cert(chain, key)
                    .map_err(|e| format!("sslcert {}: {e}", cert.display()))?
            }
        };
        Ok(Tls(MakeRustlsConnect::new(config)))
    }
}

impl Tls {
    /// The connector for one connection to `host` (the name its certificate
    /// is checked against).
    pub fn connect_to<S>(&self, host: &str) -> <MakeRustlsConnect as MakeTlsConnect<S>>::TlsConnect
    where
        MakeRustlsConnect: MakeTlsConnect<S, Error = std::convert::Infallible>,
    {
        match self.0.clone().make_tls_connect(host) {
            Ok(connect) => connect,
            Err(never) => match never {},
        }
    }
}

/// libpq's default root file, `~/.postgresql/root.crt`, if it exists.
fn default_root() -> Result<PathBuf, String> {
    let path = std::env::var_os("HOME")
        .map(|home| Path::new(&home).join(".postgresql").join("root.crt"))
        .filter(|path| path.is_file());
    path.ok_or_else(|| {
        "verify-ca and verify-full need the CA certificate: sslrootcert=<PEM file> \
         (~/.postgresql/root.crt does not exist)"
            .to_owned()
    })
}

fn load_roots(path: &Path) -> Result<RootCertStore, String> {
    let unreadable = |e: rustls::pki_types::pem::Error| {
        format!(
            "sslrootcert {}: cannot read certificates: {e}",
            path.display()
        )
    };
    let mut roots = RootCertStore::empty();
    for cert in CertificateDer::pem_file_iter(path).map_err(unreadable)? {
        roots
            .add(cert.map_err(unreadable)?)
            .map_err(|e| format!("sslrootcert {}: {e}", path.display()))?;
    }
    if roots.is_empty() {
        return Err(format!(
            "sslrootcert {}: no certificate in the file",
            path.display()
        ));
    }
    Ok(roots)
}

/// The client certificate chain of `sslcert` and the private key of
/// `sslkey` (PKCS#8, PKCS#1 or SEC1, unencrypted).
fn load_identity(
    cert: &Path,
    key: &Path,
) -> Result<(Vec<CertificateDer<'static>>, PrivateKeyDer<'static>), String> {
    let chain = CertificateDer::pem_file_iter(cert)
        .and_then(|certs| certs.collect::<Result<Vec<_>, _>>())
        .map_err(|e| format!("sslcert {}: cannot read certificates: {e}", cert.display()))?;
    if chain.is_empty() {
        return Err(format!(
            "sslcert {}: no certificate in the file",
            cert.display()
        ));
    }
    let key = PrivateKeyDer::from_pem_file(key).map_err(|e| {
        format!(
            "sslkey {}: cannot read an unencrypted private key: {e}",
            key.display()
        )
    })?;
    Ok((chain, key))
}

/// `prefer` and `require` without a root certificate: any certificate (the
/// handshake signatures are still checked, so the server holds its key).
#[derive(Debug)]
struct AnyCertificate(Arc<CryptoProvider>);

impl ServerCertVerifier for AnyCertificate {
    fn verify_server_cert(
        &self,
        _: &CertificateDer<'_>,
        _: &[CertificateDer<'_>],
        _: &ServerName<'_>,
        _: &[u8],
        _: UnixTime,
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

/// `verify-ca`: the chain must lead to a trusted root; the name is not checked
/// (webpki checks the chain first, so a wrong name alone is all it forgives).
#[derive(Debug)]
struct AnyName(Arc<WebPkiServerVerifier>);

impl ServerCertVerifier for AnyName {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        match self
            .0
            .verify_server_cert(end_entity, intermediates, server_name, ocsp_response, now)
        {
            Err(rustls::Error::InvalidCertificate(
                CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
            )) => Ok(ServerCertVerified::assertion()),
            other => other,
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.supported_verify_schemes()
    }
}
