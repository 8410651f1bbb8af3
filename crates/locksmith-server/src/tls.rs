//! TLS on the server's port (`--tls-cert`, `--tls-key`, `--tls-client-ca`),
//! for clients and for members alike.
//!
//! - The port speaks TLS only: a plaintext client gets its connection closed
//!   (the handshake fails in the accept loop, module `accept`).
//! - With a client CA, a client may present a certificate signed by it
//!   (mutual TLS), which then identifies it to the auth file (module `auth`);
//!   a client without one still connects and must use a token.
//! - Members must present one: the Raft service refuses a peer without a
//!   verified client certificate. A member connects to its peers with its own
//!   certificate and key and checks theirs against the client CA, so the CA
//!   that signs the members' certificates is the one given as
//!   `--tls-client-ca`.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::WebPkiClientVerifier;
use tokio_rustls::TlsAcceptor;
use tonic::transport::{Certificate, ClientTlsConfig, Identity};

use crate::error::ServerError;

/// The PEM files of the server's TLS.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsFiles {
    /// The server's certificate chain (its own first). Members use it as
    /// their client certificate towards each other too.
    pub cert: PathBuf,
    /// Its private key.
    pub key: PathBuf,
    /// CA certificates whose client certificates are accepted (mutual TLS,
    /// optional for clients, required of members); also what members check
    /// each other's server certificates against. Needed for a cluster.
    pub client_ca: Option<PathBuf>,
}

/// The loaded TLS setup.
#[derive(Clone)]
pub(crate) struct Tls {
    /// Accepts clients' and members' connections.
    pub acceptor: TlsAcceptor,
    /// How this member connects to the others, when a client CA is set.
    pub peer: Option<ClientTlsConfig>,
}

impl Tls {
    /// Reads the files and builds both sides.
    pub(crate) fn load(files: &TlsFiles) -> Result<Tls, ServerError> {
        let bad = |path: &Path, detail: String| ServerError::Security {
            path: path.to_owned(),
            detail,
        };
        let certs = CertificateDer::pem_file_iter(&files.cert)
            .and_then(|certs| certs.collect::<Result<Vec<_>, _>>())
            .map_err(|e| bad(&files.cert, format!("not a PEM certificate chain: {e}")))?;
        if certs.is_empty() {
            return Err(bad(&files.cert, "holds no certificate".into()));
        }
        let key = PrivateKeyDer::from_pem_file(&files.key)
            .map_err(|e| bad(&files.key, format!("not a PEM private key: {e}")))?;
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let builder = rustls::ServerConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(|e| bad(&files.cert, e.to_string()))?;
        let (builder, peer) = match &files.client_ca {
            Some(ca) => {
                let mut roots = rustls::RootCertStore::empty();
                let ca_certs = CertificateDer::pem_file_iter(ca)
                    .and_then(|certs| certs.collect::<Result<Vec<_>, _>>())
                    .map_err(|e| bad(ca, format!("not PEM CA certificates: {e}")))?;
                for cert in ca_certs {
                    roots
                        .add(cert)
                        .map_err(|e| bad(ca, format!("not a usable CA certificate: {e}")))?;
                }
                if roots.is_empty() {
                    return Err(bad(ca, "holds no CA certificate".into()));
                }
                let verifier =
                    WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
                        .allow_unauthenticated()
                        .build()
                        .map_err(|e| bad(ca, e.to_string()))?;
                let pem = |path: &Path| {
                    std::fs::read(path).map_err(|e| bad(path, format!("cannot read: {e}")))
                };
                let peer = ClientTlsConfig::new()
                    .ca_certificate(Certificate::from_pem(pem(ca)?))
                    .identity(Identity::from_pem(pem(&files.cert)?, pem(&files.key)?));
                (builder.with_client_cert_verifier(verifier), Some(peer))
            }
            None => (builder.with_no_client_auth(), None),
        };
        let mut config = builder
            .with_single_cert(certs, key)
            .map_err(|e| bad(&files.key, format!("does not match the certificate: {e}")))?;
        config.alpn_protocols = vec![b"h2".to_vec()];
        Ok(Tls {
            acceptor: TlsAcceptor::from(Arc::new(config)),
            peer,
        })
    }
}
