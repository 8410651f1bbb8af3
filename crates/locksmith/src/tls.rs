//! TLS settings shared by the backends: the CA and client certificate files
//! a URL names (`ca`, `cert`, `key`), and rustls's process-wide crypto
//! provider.

#[cfg(any(feature = "etcd", feature = "zookeeper"))]
use std::path::{Path, PathBuf};

/// The PEM files of a TLS URL (`etcds://`, `zks://`).
#[cfg(any(feature = "etcd", feature = "zookeeper"))]
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct TlsFiles {
    /// The CA the servers' certificates must chain to.
    pub ca: PathBuf,
    /// The client certificate and its key.
    pub identity: Option<(PathBuf, PathBuf)>,
}

/// The contents of [`TlsFiles`], checked to hold PEM of the expected kind.
#[cfg(any(feature = "etcd", feature = "zookeeper"))]
pub(crate) struct TlsPem {
    pub ca: String,
    pub identity: Option<(String, String)>,
}

#[cfg(any(feature = "etcd", feature = "zookeeper"))]
impl TlsFiles {
    /// From the URL's `ca`, `cert` and `key` options: `ca` is required
    /// (`scheme` names the URL form in the error), `cert` and `key` go
    /// together.
    pub fn from_options(
        scheme: &str,
        ca: Option<PathBuf>,
        cert: Option<PathBuf>,
        key: Option<PathBuf>,
    ) -> Result<TlsFiles, String> {
        let ca = ca.ok_or_else(|| {
            format!("{scheme} needs ca=<PEM file>, the CA that signed the servers' certificates")
        })?;
        let identity = match (cert, key) {
            (Some(cert), Some(key)) => Some((cert, key)),
            (None, None) => None,
            _ => {
                return Err(
                    "cert= and key= go together (the client certificate and its key)".into(),
                )
            }
        };
        Ok(TlsFiles { ca, identity })
    }

    /// Reads the files; one that cannot be read or holds no PEM of the
    /// expected kind is named in the error.
    pub fn read(&self) -> Result<TlsPem, String> {
        let ca = read(&self.ca, "ca", "CERTIFICATE-----")?;
        let identity = match &self.identity {
            None => None,
            Some((cert, key)) => Some((
                read(cert, "cert", "CERTIFICATE-----")?,
                read(key, "key", "PRIVATE KEY-----")?,
            )),
        };
        Ok(TlsPem { ca, identity })
    }
}

#[cfg(any(feature = "etcd", feature = "zookeeper"))]
fn read(path: &Path, option: &str, kind: &str) -> Result<String, String> {
    let pem = std::fs::read_to_string(path)
        .map_err(|e| format!("{option}={}: cannot read: {e}", path.display()))?;
    if !pem.contains(kind) {
        return Err(format!(
            "{option}={}: no PEM \"{kind}\" in the file",
            path.display()
        ));
    }
    Ok(pem)
}

/// rustls needs a process-wide crypto provider when a client crate builds
/// its configuration without naming one (and several are compiled in);
/// install ring's unless the application installed one already.
#[cfg(any(feature = "redis", feature = "zookeeper"))]
pub(crate) fn ensure_crypto_provider() {
    if rustls::crypto::CryptoProvider::get_default().is_none() {
        let _ = rustls::crypto::ring::default_provider().install_default();
    }
}
