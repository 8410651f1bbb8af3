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
    /// The data directory holds something the server cannot trust: a bad record
    /// before the end of the log, or a snapshot that does not check out.
    #[error("corrupt data in {}: {detail}", path.display())]
    Corrupt {
        /// The file.
        path: PathBuf,
        /// What is wrong.
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
    /// The gRPC transport failed.
    #[error("gRPC transport: {0}")]
    Transport(#[from] tonic::transport::Error),
    /// The engine thread stopped unexpectedly (a storage failure while running).
    #[error("lock engine stopped: {0}")]
    EngineStopped(String),
}
