//! A lock server's URL: its members, and how to reach them (plaintext or
//! TLS) with which credentials.
//!
//! - `locksmith://host[:port][,host[:port]...][?token_file=FILE]`
//! - `locksmith+tls://host[:port][,...]?ca=FILE[&cert=FILE&key=FILE][&token_file=FILE]`:
//!   TLS, checking the server's certificate against the CA in `ca`; with
//!   `cert` and `key`, a client certificate too (mutual TLS), which a server
//!   with authentication on takes as the client's identity.
//!
//! - `session_transport=framed` (the default) or `session_transport=grpc`:
//!   how the session stream travels. `framed` is the stream's messages on a
//!   connection of its own with no HTTP/2 under them, about half of a
//!   request's round trip on a fast network (`locksmith_proto::framed`);
//!   `grpc` is the `Session` call, for a path that passes only HTTP/2 (a
//!   gRPC proxy) or a server from before the framed stream. The other calls
//!   always use gRPC.
//!
//! The bearer token comes from the file `token_file` names, or else from the
//! environment variable `LOCKSMITH_TOKEN`, never from the URL itself, so it
//! shows neither in `ps` nor in messages. It goes with every call as
//! `authorization: Bearer <token>`, marked sensitive.

use std::collections::HashSet;
use std::path::Path;
use std::sync::Arc;

use locksmith_proto::v1::locksmith_client::LocksmithClient;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tonic::metadata::{Ascii, MetadataValue};
use tonic::service::interceptor::InterceptedService;
use tonic::service::Interceptor;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};

use super::{invalid_url, DEFAULT_PORT};
use crate::error::Result;

/// The environment variable a client takes its bearer token from (unless the
/// URL names a `token_file`).
pub const TOKEN_ENV: &str = "LOCKSMITH_TOKEN";

/// The lock service's client stub with the URL's credentials on every call.
pub type Stub = LocksmithClient<InterceptedService<Channel, Credentials>>;

/// Adds the bearer token, if any, to every call (a tonic [`Interceptor`]).
#[derive(Clone, Default)]
pub struct Credentials {
    authorization: Option<MetadataValue<Ascii>>,
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let token = self.authorization.as_ref().map(|_| "***");
        f.debug_struct("Credentials")
            .field("token", &token)
            .finish()
    }
}

impl Interceptor for Credentials {
    fn call(
        &mut self,
        mut request: tonic::Request<()>,
    ) -> std::result::Result<tonic::Request<()>, tonic::Status> {
        if let Some(value) = &self.authorization {
            request
                .metadata_mut()
                .insert("authorization", value.clone());
        }
        Ok(request)
    }
}

/// A parsed `locksmith://` or `locksmith+tls://` URL.
#[derive(Clone)]
pub struct ServerUrl {
    addresses: Vec<String>,
    tls: Option<Tls>,
    credentials: Credentials,
    session_transport: SessionTransport,
}

/// How a session stream travels (the URL's `session_transport`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) enum SessionTransport {
    /// Framed messages on a connection of their own, no HTTP/2.
    #[default]
    Framed,
    /// The gRPC `Session` call.
    Grpc,
}

/// Addresses and whether TLS is on: the TLS config holds the client's
/// private key, which no debug output may show.
impl std::fmt::Debug for ServerUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServerUrl")
            .field("addresses", &self.addresses)
            .field("tls", &self.tls.is_some())
            .field("credentials", &self.credentials)
            .field("session_transport", &self.session_transport)
            .finish()
    }
}

impl ServerUrl {
    /// Parses the URL and reads the files it names (CA, certificate, key,
    /// token). Connects to nothing.
    pub fn parse(url: &str) -> Result<ServerUrl> {
        let (tls, rest) = if let Some(rest) = url.strip_prefix("locksmith+tls://") {
            (true, rest)
        } else if let Some(rest) = url.strip_prefix("locksmith://") {
            (false, rest)
        } else {
            return Err(invalid_url(
                url,
                "expected locksmith://host[:port][,host[:port]...] or locksmith+tls://…?ca=FILE"
                    .into(),
            ));
        };
        let (authority, query) = match rest.split_once('?') {
            Some((authority, query)) => (authority, query),
            None => (rest, ""),
        };
        let (authority, path) = authority.split_at(authority.find('/').unwrap_or(authority.len()));
        if authority.contains('#') || !path.trim_start_matches('/').is_empty() {
            return Err(invalid_url(url, "a lock server URL takes no path".into()));
        }
        let addresses = addresses(url, authority)?;
        let mut options = Options::default();
        for (key, value) in url::form_urlencoded::parse(query.as_bytes()) {
            let slot = match (&*key, tls) {
                ("token_file", _) => &mut options.token_file,
                ("session_transport", _) => &mut options.session_transport,
                ("ca", true) => &mut options.ca,
                ("cert", true) => &mut options.cert,
                ("key", true) => &mut options.key,
                _ => {
                    let known = if tls {
                        "ca, cert, key, token_file, session_transport"
                    } else {
                        "token_file, session_transport (TLS options need locksmith+tls://)"
                    };
                    return Err(invalid_url(
                        url,
                        format!("unknown option {key:?}: the options are {known}"),
                    ));
                }
            };
            *slot = Some(value.into_owned());
        }
        let tls = if tls { Some(options.tls(url)?) } else { None };
        let session_transport = match options.session_transport.as_deref() {
            None | Some("framed") => SessionTransport::Framed,
            Some("grpc") => SessionTransport::Grpc,
            Some(other) => {
                return Err(invalid_url(
                    url,
                    format!("session_transport {other:?}: it is framed or grpc"),
                ))
            }
        };
        let token = match &options.token_file {
            Some(file) => Some(
                std::fs::read_to_string(file)
                    .map_err(|e| invalid_url(url, format!("token_file {file:?}: {e}")))?,
            ),
            None => std::env::var(TOKEN_ENV).ok(),
        };
        let authorization = match token.as_deref().map(str::trim) {
            None | Some("") => None,
            Some(token) => {
                let mut value =
                    MetadataValue::try_from(format!("Bearer {token}")).map_err(|_| {
                        invalid_url(
                            url,
                            "the token holds characters a header cannot carry".into(),
                        )
                    })?;
                value.set_sensitive(true);
                Some(value)
            }
        };
        Ok(ServerUrl {
            addresses,
            tls,
            credentials: Credentials { authorization },
            session_transport,
        })
    }

    /// The TLS configuration for an HTTP/2 connection the client opens
    /// itself (the gRPC session stream's), if the URL asks for TLS.
    pub(crate) fn rustls(&self) -> Option<Arc<rustls::ClientConfig>> {
        self.tls.as_ref().map(|tls| tls.rustls.clone())
    }

    /// The TLS configuration for a framed session stream's connection: the
    /// same, offering no application protocol (it is not HTTP/2).
    pub(crate) fn framed_rustls(&self) -> Option<Arc<rustls::ClientConfig>> {
        self.tls.as_ref().map(|tls| tls.framed.clone())
    }

    /// How the session stream travels.
    pub(crate) fn session_transport(&self) -> SessionTransport {
        self.session_transport
    }

    /// The members' `host:port`, in order.
    pub fn addresses(&self) -> &[String] {
        &self.addresses
    }

    /// An endpoint for the member at `addr` (`host:port`), over TLS if the
    /// URL says so.
    pub fn endpoint(&self, addr: &str) -> Result<Endpoint> {
        let scheme = if self.tls.is_some() { "https" } else { "http" };
        let endpoint = Endpoint::from_shared(format!("{scheme}://{addr}"))
            .map_err(|e| invalid_url(addr, e.to_string()))?;
        match &self.tls {
            Some(tls) => endpoint
                .tls_config(tls.channel.clone())
                .map_err(|e| invalid_url(addr, e.to_string())),
            None => Ok(endpoint),
        }
    }

    /// What to add to every call: the bearer token, if any.
    pub fn credentials(&self) -> Credentials {
        self.credentials.clone()
    }
}

/// The URL's options as written.
#[derive(Default)]
struct Options {
    ca: Option<String>,
    cert: Option<String>,
    key: Option<String>,
    token_file: Option<String>,
    session_transport: Option<String>,
}

impl Options {
    /// The TLS configuration from the URL's files, each read once.
    fn tls(&self, url: &str) -> Result<Tls> {
        let bad = |what: &str, file: &str, e: &dyn std::fmt::Display| {
            invalid_url(url, format!("{what} {file:?}: {e}"))
        };
        let read = |what: &str, file: &str| {
            std::fs::read(Path::new(file)).map_err(|e| bad(what, file, &e))
        };
        let ca_file = self.ca.as_deref().ok_or_else(|| {
            invalid_url(
                url,
                "locksmith+tls:// needs ?ca=FILE: the CA that signed the server's certificate"
                    .into(),
            )
        })?;
        let ca = read("ca", ca_file)?;
        let identity = match (&self.cert, &self.key) {
            (Some(cert), Some(key)) => Some((cert, read("cert", cert)?, key, read("key", key)?)),
            (None, None) => None,
            _ => {
                return Err(invalid_url(
                    url,
                    "a client certificate needs both cert=FILE and key=FILE".into(),
                ))
            }
        };

        let mut channel = ClientTlsConfig::new().ca_certificate(Certificate::from_pem(&ca));
        if let Some((_, cert, _, key)) = &identity {
            channel = channel.identity(Identity::from_pem(cert, key));
        }

        let mut roots = rustls::RootCertStore::empty();
        for cert in CertificateDer::pem_slice_iter(&ca) {
            let cert = cert.map_err(|e| bad("ca", ca_file, &e))?;
            roots.add(cert).map_err(|e| bad("ca", ca_file, &e))?;
        }
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let builder = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| invalid_url(url, e.to_string()))?
            .with_root_certificates(roots);
        let mut rustls = match identity {
            Some((cert_file, cert, key_file, key)) => {
                let chain = CertificateDer::pem_slice_iter(&cert)
                    .collect::<std::result::Result<Vec<_>, _>>()
                    .map_err(|e| bad("cert", cert_file, &e))?;
                let key =
                    PrivateKeyDer::from_pem_slice(&key).map_err(|e| bad("key", key_file, &e))?;
                builder
                    .with_client_auth_cert(chain, key)
                    .map_err(|e| bad("cert", cert_file, &e))?
            }
            None => builder.with_no_client_auth(),
        };
        let framed = Arc::new(rustls.clone());
        rustls.alpn_protocols = vec![b"h2".to_vec()];
        Ok(Tls {
            channel,
            rustls: Arc::new(rustls),
            framed,
        })
    }
}

/// The URL's TLS settings, for tonic's channel and for a connection the
/// client opens itself (tonic's configuration cannot be used there).
#[derive(Clone)]
struct Tls {
    channel: ClientTlsConfig,
    rustls: Arc<rustls::ClientConfig>,
    /// `rustls` without ALPN, for the framed session stream.
    framed: Arc<rustls::ClientConfig>,
}

/// The `host:port` of each member in the URL's authority, in order.
fn addresses(url: &str, authority: &str) -> Result<Vec<String>> {
    let mut addresses = Vec::new();
    let mut seen = HashSet::new();
    for part in authority.split(',') {
        // Each member through the URL parser, which checks hosts and ports.
        let parsed = url::Url::parse(&format!("locksmith://{part}"))
            .map_err(|e| invalid_url(url, format!("member {part:?}: {e}")))?;
        let host = parsed
            .host_str()
            .filter(|h| !h.is_empty())
            .ok_or_else(|| invalid_url(url, format!("member {part:?} has no host")))?;
        if !parsed.username().is_empty() || parsed.password().is_some() {
            return Err(invalid_url(url, "members take no user or password".into()));
        }
        let addr = format!("{host}:{}", parsed.port().unwrap_or(DEFAULT_PORT));
        if seen.insert(addr.clone()) {
            addresses.push(addr);
        }
    }
    Ok(addresses)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::Error;

    fn addresses_of(url: &str) -> Result<Vec<String>> {
        ServerUrl::parse(url).map(|u| u.addresses)
    }

    #[test]
    fn one_or_many_members() {
        assert_eq!(
            addresses_of("locksmith://127.0.0.1:7000").unwrap(),
            ["127.0.0.1:7000"]
        );
        assert_eq!(
            addresses_of("locksmith://example.org").unwrap(),
            ["example.org:7420"]
        );
        assert_eq!(addresses_of("locksmith://[::1]:9/").unwrap(), ["[::1]:9"]);
        assert_eq!(
            addresses_of("locksmith://a:1,b,[::1]:3,a:1").unwrap(),
            ["a:1", "b:7420", "[::1]:3"],
            "in order, default port, duplicates once"
        );
        for bad in [
            "locksmith://",
            "locksmith://h:1/path",
            "locksmith://h?x=1",
            "locksmith://h?ca=x",
            "locksmith://a:1,",
            "locksmith://a:1,,b:2",
            "locksmith://a:99999",
            "locksmith://u:p@h:1",
            "locksmith+tls://h:1",
            "locksmith+tls://h:1?ca=/nonexistent/ca.pem",
            "http://h",
        ] {
            assert!(
                matches!(addresses_of(bad), Err(Error::InvalidUrl { .. })),
                "{bad}"
            );
        }
    }

    #[test]
    fn the_session_stream_is_framed_unless_the_url_asks_for_grpc() {
        let transport = |url: &str| ServerUrl::parse(url).map(|u| u.session_transport());
        assert_eq!(
            transport("locksmith://h").unwrap(),
            SessionTransport::Framed
        );
        assert_eq!(
            transport("locksmith://h?session_transport=framed").unwrap(),
            SessionTransport::Framed
        );
        assert_eq!(
            transport("locksmith://h?session_transport=grpc").unwrap(),
            SessionTransport::Grpc
        );
        let Err(Error::InvalidUrl { reason, .. }) = transport("locksmith://h?session_transport=h3")
        else {
            panic!("an unknown transport is refused");
        };
        assert!(reason.contains("framed or grpc"), "{reason}");
    }
}
