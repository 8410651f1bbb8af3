//! TLS on the server's port (`--tls-cert`, `--tls-key`, `--tls-client-ca`,
//! `--tls-peer-ca`), for clients and for members alike.
//!
//! - The port speaks TLS only: a plaintext client gets its connection closed
//!   (the handshake fails in the accept loop, module `accept`).
//! - With a client CA, a client may present a certificate signed by it
//!   (mutual TLS), which then identifies it to the auth file (module `auth`);
//!   a client without one still connects and must use a token.
//! - Members are certified by a CA of their own, the peer CA: each presents
//!   its `--tls-cert` to the others and checks theirs against the peer CA,
//!   and the Raft service hears only a peer whose certificate chains to it.
//!   Kept apart from the client CA, so that no client's certificate passes
//!   as a member's.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::UnixTime;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::danger::ClientCertVerifier;
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
    /// CA certificates whose client certificates are accepted from clients
    /// (mutual TLS, optional for them).
    pub client_ca: Option<PathBuf>,
    /// CA certificates that sign the members' certificates: what members
    /// check each other against, in both directions. Needed for a cluster.
    pub peer_ca: Option<PathBuf>,
}

/// The loaded TLS setup.
#[derive(Clone)]
pub(crate) struct Tls {
    /// Accepts clients' and members' connections.
    pub acceptor: TlsAcceptor,
    /// How this member connects to the others, when a peer CA is set.
    pub peer: Option<PeerTls>,
    /// Who may send Raft traffic.
    pub members: MemberCheck,
}

/// How a member connects to the others over TLS: its certificate, and the
/// peer CA it checks theirs against.
#[derive(Clone)]
pub(crate) struct PeerTls {
    /// For gRPC channels (tonic's).
    pub grpc: ClientTlsConfig,
    /// For the framed replication stream's connections (no ALPN: it is not
    /// HTTP/2).
    pub framed: Arc<rustls::ClientConfig>,
}

/// Who the Raft service hears.
#[derive(Clone)]
pub(crate) enum MemberCheck {
    /// Anyone: the port is plaintext, and members are not authenticated.
    Open,
    /// Only a peer whose certificate chains to the peer CA.
    Certified(Arc<dyn ClientCertVerifier>),
    /// Nobody: TLS without a peer CA (a server that has no peers).
    Closed,
}

impl MemberCheck {
    /// Whether a Raft message may be heard.
    pub(crate) fn check<T>(&self, request: &tonic::Request<T>) -> Result<(), tonic::Status> {
        let chain = request.peer_certs();
        self.admits(chain.as_deref().map(Vec::as_slice))
            .map_err(tonic::Status::unauthenticated)
    }

    /// Whether the caller presented a member's certificate (never true
    /// without TLS, where nobody is certified).
    pub(crate) fn certifies<T>(&self, request: &tonic::Request<T>) -> bool {
        matches!(self, MemberCheck::Certified(_)) && self.check(request).is_ok()
    }

    /// Whether the certificate chain a connection presented (its own first)
    /// makes it a member; the reason when it does not.
    pub(crate) fn admits(&self, chain: Option<&[CertificateDer<'static>]>) -> Result<(), String> {
        match self {
            MemberCheck::Open => Ok(()),
            MemberCheck::Closed => {
                Err("this server has no peers: it was started with TLS but no --tls-peer-ca".into())
            }
            MemberCheck::Certified(verifier) => {
                let Some((own, intermediates)) = chain.and_then(|chain| chain.split_first()) else {
                    return Err("members' traffic needs a certificate of the peer CA".into());
                };
                verifier
                    .verify_client_cert(own, intermediates, UnixTime::now())
                    .map(drop)
                    .map_err(|e| {
                        format!("members' traffic needs a certificate of the peer CA: {e}")
                    })
            }
        }
    }
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
        let authorities = |ca: &Path| {
            let certs = CertificateDer::pem_file_iter(ca)
                .and_then(|certs| certs.collect::<Result<Vec<_>, _>>())
                .map_err(|e| bad(ca, format!("not PEM CA certificates: {e}")))?;
            if certs.is_empty() {
                return Err(bad(ca, "holds no CA certificate".into()));
            }
            Ok(certs)
        };
        let roots = |cas: &[&PathBuf]| {
            let mut roots = rustls::RootCertStore::empty();
            for ca in cas {
                for cert in authorities(ca)? {
                    roots
                        .add(cert)
                        .map_err(|e| bad(ca, format!("not a usable CA certificate: {e}")))?;
                }
            }
            Ok::<_, ServerError>(Arc::new(roots))
        };
        // One handshake serves clients and members: it accepts a
        // certificate of either CA, and the Raft service then asks for the
        // peer CA's alone.
        let accepted: Vec<&PathBuf> = files.client_ca.iter().chain(&files.peer_ca).collect();
        let builder = match accepted.first() {
            Some(first) => builder.with_client_cert_verifier(
                WebPkiClientVerifier::builder_with_provider(roots(&accepted)?, provider.clone())
                    .allow_unauthenticated()
                    .build()
                    .map_err(|e| bad(first, e.to_string()))?,
            ),
            None => builder.with_no_client_auth(),
        };
        let (peer, members) = match &files.peer_ca {
            Some(ca) => {
                let peer_roots = roots(&[ca])?;
                let verifier = WebPkiClientVerifier::builder_with_provider(
                    peer_roots.clone(),
                    provider.clone(),
                )
                .build()
                .map_err(|e| bad(ca, e.to_string()))?;
                let pem = |path: &Path| {
                    std::fs::read(path).map_err(|e| bad(path, format!("cannot read: {e}")))
                };
                let grpc = ClientTlsConfig::new()
                    .ca_certificate(Certificate::from_pem(pem(ca)?))
                    .identity(Identity::from_pem(pem(&files.cert)?, pem(&files.key)?));
                let framed = rustls::ClientConfig::builder_with_provider(provider)
                    .with_safe_default_protocol_versions()
                    .map_err(|e| bad(ca, e.to_string()))?
                    .with_root_certificates(peer_roots)
                    .with_client_auth_cert(certs.clone(), key.clone_key())
                    .map_err(|e| bad(&files.key, format!("does not match the certificate: {e}")))?;
                let peer = PeerTls {
                    grpc,
                    framed: Arc::new(framed),
                };
                (Some(peer), MemberCheck::Certified(verifier))
            }
            None => (None, MemberCheck::Closed),
        };
        let mut config = builder
            .with_single_cert(certs, key)
            .map_err(|e| bad(&files.key, format!("does not match the certificate: {e}")))?;
        config.alpn_protocols = vec![b"h2".to_vec()];
        Ok(Tls {
            acceptor: TlsAcceptor::from(Arc::new(config)),
            peer,
            members,
        })
    }
}
