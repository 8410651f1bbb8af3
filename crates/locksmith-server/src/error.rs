//! Errors that stop the server from starting or running.

use std::path::PathBuf;

/// Why the server cannot start or had to stop.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ServerError {
    /// A file operation in the data directory failed.
    #[error("{context}: {source}")]
    Io {
        /// What the server was doing.
        context: String,
        /// The underlying error.
        source: std::io::Error,
    },
    /// The data directory holds something the server cannot trust: a damaged
    /// log frame before valid ones, a snapshot or manifest that does not check
    /// out. The files are left as they are.
    #[error("corrupt data in {}: {detail}", path.display())]
    Corrupt {
        /// The file.
        path: PathBuf,
        /// What is wrong, where (byte offsets), and what an operator can do.
        detail: String,
    },
    /// A file the data directory must hold is missing: a snapshot or log
    /// segment its manifest names, or the manifest itself.
    #[error("missing {}: {detail}", path.display())]
    Missing {
        /// The file.
        path: PathBuf,
        /// Why it must exist, and what an operator can do.
        detail: String,
    },
    /// The data directory was written by a release whose format this one does
    /// not read.
    #[error("{}: {detail}", path.display())]
    Incompatible {
        /// The file.
        path: PathBuf,
        /// What it is, and what an operator can do.
        detail: String,
    },
    /// Another server process uses the data directory.
    #[error("data directory {} is in use by another locksmith server", .0.display())]
    DataDirInUse(PathBuf),
    /// The listen address cannot be bound.
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        /// The address.
        addr: std::net::SocketAddr,
        /// The underlying error.
        source: std::io::Error,
    },
    /// A TLS certificate, key or CA file, or the auth file, cannot be used:
    /// unreadable, not PEM, or (the auth file) not valid. Says which and why,
    /// never a secret.
    #[error("{}: {detail}", path.display())]
    Security {
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        detail: String,
    },
    /// The gRPC transport failed.
    #[error("gRPC transport: {0}")]
    Transport(#[from] tonic::transport::Error),
    /// The engine thread stopped unexpectedly (a storage failure while running).
    #[error("lock engine stopped: {0}")]
    EngineStopped(String),
    /// The settings do not make a working server.
    #[error("invalid configuration: {0}")]
    Config(String),
    /// The member's Raft layer failed (openraft stopped).
    #[error("Raft: {0}")]
    Raft(String),
}
