//! One Redis server and its command connection ([`Server`]), and what every
//! kind of endpoint (a server, Sentinel's primary, a Redis Cluster) shares:
//! Redis errors with what was being done, the client and TLS certificates a
//! URL makes, and a page of `SCAN`.

use std::time::Duration;

use ::redis::aio::{ConnectionManager, ConnectionManagerConfig};
use ::redis::{ErrorKind, FromRedisValue, RedisError, ServerErrorKind};

use super::config::Config;
use super::BACKEND;
use crate::error::{Error, Result};
use crate::tls::ensure_crypto_provider;

/// A Redis error with what was being done, as the source of [`Error::Backend`].
#[derive(Debug)]
pub(crate) struct Failure {
    context: String,
    source: Option<RedisError>,
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.source {
            Some(source) => write!(f, "{}: {source}", self.context),
            None => f.write_str(&self.context),
        }
    }
}

impl std::error::Error for Failure {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.source.as_ref().map(|e| e as _)
    }
}

/// Wraps a Redis error as [`Error::Backend`] with context.
pub(crate) fn failure(context: impl Into<String>, source: RedisError) -> Error {
    Error::backend(
        BACKEND,
        Failure {
            context: context.into(),
            source: Some(source),
        },
    )
}

/// An [`Error::Backend`] without an underlying Redis error.
pub(crate) fn problem(context: impl Into<String>) -> Error {
    Error::backend(
        BACKEND,
        Failure {
            context: context.into(),
            source: None,
        },
    )
}

/// Whether a Redis error is about reaching the primary (worth retrying, and,
/// behind Sentinel, a hint that the primary moved) rather than about the
/// request. On a cluster a redirection that outlived the cluster client's own
/// retries means the cluster is still settling a failover.
pub(super) fn is_unreachable(e: &RedisError) -> bool {
    is_demotion(e)
        || e.is_io_error()
        || e.is_timeout()
        || e.is_connection_dropped()
        || e.is_connection_refusal()
        || matches!(
            e.kind(),
            ErrorKind::Server(
                ServerErrorKind::BusyLoading
                    | ServerErrorKind::TryAgain
                    | ServerErrorKind::ClusterDown
                    | ServerErrorKind::MasterDown
                    | ServerErrorKind::ReadOnly
                    | ServerErrorKind::Moved
                    | ServerErrorKind::Ask
            )
        )
}

/// Whether Redis answered a blocked command (the `WAIT` after a grant) with
/// `UNBLOCKED`: the node became a replica while the command waited, that is,
/// a failover. Redis has no error kind for it, and in a pipeline the error is
/// that of one of its commands.
fn is_demotion(e: &RedisError) -> bool {
    e.clone()
        .into_server_errors()
        .is_some_and(|errors| errors.iter().any(|(_, e)| e.code() == "UNBLOCKED"))
}

/// Whether an error is about reaching Redis (worth retrying) rather than about
/// the request.
pub(crate) fn is_transient(error: &Error) -> bool {
    let Error::Backend { source, .. } = error else {
        return false;
    };
    match source.downcast_ref::<Failure>() {
        Some(Failure {
            source: Some(e), ..
        }) => is_unreachable(e),
        Some(Failure { source: None, .. }) => true,
        None => false,
    }
}

/// The CA and client certificate the URL names, for the `redis` crate.
pub(crate) fn certificates(config: &Config) -> Result<Option<::redis::TlsCertificates>> {
    if config.tls_ca.is_none() && config.tls_client.is_none() {
        return Ok(None);
    }
    let read = |path: &str| {
        std::fs::read(path).map_err(|e| Error::InvalidUrl {
            url: config.display.clone(),
            reason: format!("cannot read {path}: {e}"),
        })
    };
    Ok(Some(::redis::TlsCertificates {
        client_tls: match &config.tls_client {
            Some((cert, key)) => Some(::redis::ClientTlsConfig {
                client_cert: read(cert)?,
                client_key: read(key)?,
            }),
            None => None,
        },
        root_cert: config.tls_ca.as_deref().map(read).transpose()?,
    }))
}

/// A `redis::Client` for one server URL, with the URL's TLS settings.
pub(crate) fn client(url: &str, config: &Config) -> Result<::redis::Client> {
    if url.starts_with("rediss://") {
        ensure_crypto_provider();
    }
    match certificates(config)? {
        Some(certificates) => ::redis::Client::build_with_tls(url, certificates),
        None => ::redis::Client::open(url),
    }
    .map_err(|e| Error::InvalidUrl {
        url: config.display.clone(),
        reason: e.to_string(),
    })
}

/// How the command connection of a server reconnects and times out.
fn manager_config(config: &Config, response_timeout: Duration) -> ConnectionManagerConfig {
    ConnectionManagerConfig::new()
        .set_connection_timeout(Some(config.connect_timeout))
        .set_response_timeout(Some(response_timeout))
        .set_number_of_retries(1)
        .set_min_delay(Duration::from_millis(50))
        .set_max_delay(Duration::from_millis(500))
}

/// One server and the self-reconnecting command connection to it.
pub(crate) struct Server {
    /// `host:port`, for messages and traces.
    pub label: String,
    /// For the subscription connection.
    pub client: ::redis::Client,
    /// How long connecting may take (the URL's `connect_timeout`), for the
    /// subscription connection as for the command connection.
    pub connect_timeout: Duration,
    /// The command connection (a node sends its scripts on it).
    pub(super) conn: ConnectionManager,
}

impl Server {
    /// Sets up the connection to `url`; `eager` connects now (and fails if
    /// Redis is not there), otherwise on first use.
    ///
    /// Cancel safety: safe; nothing is left behind.
    pub async fn connect(
        url: &str,
        config: &Config,
        response_timeout: Duration,
        eager: bool,
    ) -> Result<Server> {
        let client = client(url, config)?;
        let label = format!("{}", client.get_connection_info().addr());
        let settings = manager_config(config, response_timeout);
        let conn = if eager {
            ConnectionManager::new_with_config(client.clone(), settings)
                .await
                .map_err(|e| failure(format!("cannot connect to {label}"), e))?
        } else {
            ConnectionManager::new_lazy_with_config(client.clone(), settings)
                .map_err(|e| failure(format!("cannot set up {label}"), e))?
        };
        Ok(Server {
            label,
            client,
            connect_timeout: config.connect_timeout,
            conn,
        })
    }

    /// Runs a plain command on this server.
    ///
    /// Cancel safety: the command may or may not have run.
    pub async fn query<T: FromRedisValue>(
        &self,
        cmd: &::redis::Cmd,
    ) -> std::result::Result<T, RedisError> {
        cmd.query_async(&mut self.conn.clone()).await
    }
}

/// One `SCAN cursor MATCH pattern` request.
pub(crate) fn scan_page(cursor: u64, pattern: &str) -> ::redis::Cmd {
    let mut cmd = ::redis::cmd("SCAN");
    cmd.arg(cursor)
        .arg("MATCH")
        .arg(pattern)
        .arg("COUNT")
        .arg(1000);
    cmd
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_node_demoted_under_a_blocked_wait_is_a_failover_not_a_refusal() {
        let demoted = ::redis::make_extension_error(
            "UNBLOCKED".into(),
            Some("force unblock from blocking operation, instance state changed".into()),
        );
        assert!(is_unreachable(&demoted));
        assert!(is_transient(&failure("acquire", demoted)));
        let refused = ::redis::make_extension_error("NOPERM".into(), None);
        assert!(!is_unreachable(&refused));
    }
}
