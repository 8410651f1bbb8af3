//! One Redis server: a multiplexed, self-reconnecting command connection and
//! the shared subscription hub.

use std::sync::Arc;
use std::time::Duration;

use ::redis::aio::{ConnectionManager, ConnectionManagerConfig};
use ::redis::{ErrorKind, FromRedisValue, RedisError, Script, ServerErrorKind};
use tokio::sync::Notify;

use super::config::Config;
use super::ops::Call;
use super::pubsub::Hub;
use super::BACKEND;
use crate::error::{Error, Result};

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

/// Whether an error is about reaching Redis (worth retrying) rather than about
/// the request.
pub(crate) fn is_transient(error: &Error) -> bool {
    let Error::Backend { source, .. } = error else {
        return false;
    };
    match source.downcast_ref::<Failure>() {
        Some(Failure {
            source: Some(e), ..
        }) => {
            e.is_io_error()
                || e.is_timeout()
                || e.is_connection_dropped()
                || e.is_connection_refusal()
                || matches!(
                    e.kind(),
                    ErrorKind::Server(ServerErrorKind::BusyLoading | ServerErrorKind::TryAgain)
                )
        }
        Some(Failure { source: None, .. }) => true,
        None => false,
    }
}

/// rustls needs a process-wide crypto provider; install ring's unless the
/// application installed one already.
fn ensure_crypto_provider() {
    if rustls::crypto::CryptoProvider::get_default().is_none() {
        let _ = rustls::crypto::ring::default_provider().install_default();
    }
}

/// One Redis server.
pub(crate) struct Node {
    /// `host:port`, for messages and traces.
    pub label: String,
    conn: ConnectionManager,
    /// Its subscription connection.
    pub hub: Arc<Hub>,
}

impl Node {
    /// Sets up the connection; `eager` connects now (and fails if Redis is not
    /// there), otherwise on first use.
    ///
    /// Cancel safety: safe; nothing is left behind.
    pub async fn connect(
        url: &str,
        config: &Config,
        response_timeout: Duration,
        eager: bool,
        reconnected: Arc<Notify>,
    ) -> Result<Node> {
        let invalid = |reason: String| Error::InvalidUrl {
            url: crate::client::redact(url),
            reason,
        };
        if url.starts_with("rediss://") {
            ensure_crypto_provider();
        }
        let client = if config.tls_ca.is_some() || config.tls_client.is_some() {
            let read = |path: &str| {
                std::fs::read(path).map_err(|e| invalid(format!("cannot read {path}: {e}")))
            };
            let certificates = ::redis::TlsCertificates {
                client_tls: match &config.tls_client {
                    Some((cert, key)) => Some(::redis::ClientTlsConfig {
                        client_cert: read(cert)?,
                        client_key: read(key)?,
                    }),
                    None => None,
                },
                root_cert: config.tls_ca.as_deref().map(read).transpose()?,
            };
            ::redis::Client::build_with_tls(url, certificates)
        } else {
            ::redis::Client::open(url)
        }
        .map_err(|e| invalid(e.to_string()))?;
        let info = client.get_connection_info();
        let label = format!("{}", info.addr());
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(Duration::from_secs(2)))
            .set_response_timeout(Some(response_timeout))
            .set_number_of_retries(1)
            .set_min_delay(Duration::from_millis(50))
            .set_max_delay(Duration::from_millis(500));
        let conn = if eager {
            ConnectionManager::new_with_config(client.clone(), config)
                .await
                .map_err(|e| failure(format!("cannot connect to {label}"), e))?
        } else {
            ConnectionManager::new_lazy_with_config(client.clone(), config)
                .map_err(|e| failure(format!("cannot set up {label}"), e))?
        };
        let hub = Hub::new(client, label.clone(), reconnected);
        Ok(Node { label, conn, hub })
    }

    /// Runs a script call (EVALSHA, loading the script on NOSCRIPT).
    ///
    /// Cancel safety: the script may or may not have run.
    pub async fn eval<T: FromRedisValue>(&self, call: &Call) -> std::result::Result<T, RedisError> {
        let mut conn = self.conn.clone();
        match call.cmd.query_async(&mut conn).await {
            Err(e) if e.kind() == ErrorKind::Server(ServerErrorKind::NoScript) => {
                call.script.prepare_invoke().load_async(&mut conn).await?;
                call.cmd.query_async(&mut conn).await
            }
            other => other,
        }
    }

    /// Runs a script call and then `WAIT replicas timeout` on the same
    /// connection, in one pipeline, so the WAIT covers the script's writes.
    /// Answers the script's reply and how many replicas acknowledged.
    ///
    /// Cancel safety: the script may or may not have run.
    pub async fn eval_and_wait<T: FromRedisValue>(
        &self,
        call: &Call,
        replicas: u32,
        timeout: Duration,
    ) -> std::result::Result<(T, i64), RedisError> {
        let mut pipe = ::redis::pipe();
        pipe.add_command(call.cmd.clone())
            .cmd("WAIT")
            .arg(replicas)
            .arg(timeout.as_millis() as u64);
        let mut conn = self.conn.clone();
        match pipe.query_async(&mut conn).await {
            Err(e) if e.kind() == ErrorKind::Server(ServerErrorKind::NoScript) => {
                call.script.prepare_invoke().load_async(&mut conn).await?;
                pipe.query_async(&mut conn).await
            }
            other => other,
        }
    }

    /// Runs a plain command.
    ///
    /// Cancel safety: the command may or may not have run.
    pub async fn query<T: FromRedisValue>(
        &self,
        cmd: &::redis::Cmd,
    ) -> std::result::Result<T, RedisError> {
        let mut conn = self.conn.clone();
        cmd.query_async(&mut conn).await
    }

    /// Loads a script (`SCRIPT LOAD`).
    ///
    /// Cancel safety: safe; loading is idempotent.
    pub async fn load(&self, script: &Script) -> std::result::Result<String, RedisError> {
        let mut conn = self.conn.clone();
        script.prepare_invoke().load_async(&mut conn).await
    }
}
