//! ZooKeeper sessions: connecting, watching the connection state, and deciding
//! when holds can no longer be trusted.
//!
//! Every hold is an ephemeral node, so it lives exactly as long as the session
//! that created it. The session's state is watched by one task per session:
//!
//! * `Expired`, `Closed`, `AuthFailed`: the session is over, and with it every
//!   hold of it. Holds are lost at once (Curator's `LOST`).
//! * `Disconnected` (Curator's `SUSPENDED`): the server may still keep the
//!   session, or may be about to expire it; nobody can tell from here. Curator's
//!   tech notes 10, 12 and 14 say not to trust a lock while suspended. Holds are
//!   reported lost when the connection stays suspended longer than
//!   `lost_after_suspended` × the negotiated session timeout (a third by
//!   default), which leaves the holder time to stop before the server can
//!   expire the session and grant the lock to someone else. Set it to `0` to
//!   give up at the first disconnection, or `never` to wait for the server's
//!   verdict.
//! * `SyncConnected`: the connection is back. Holds that were not yet reported
//!   lost carry on; the lock paths' waiters re-check their own nodes
//!   (CURATOR-604).
//!
//! A session that ended is replaced by a new one on the next operation, like
//! Curator's `ConnectionStateManager` does after `LOST`.

use std::future::Future;
use std::sync::Mutex;
use std::time::Duration;

use tokio::time::{sleep, sleep_until, Instant};
use tokio_util::sync::CancellationToken;
use zookeeper_client as zk;

use super::config::{Auth, Config};
use super::BACKEND;
use crate::backend::LostSignal;
use crate::error::{Error, Result};
use crate::lost::LostCause;

/// Longest pause between retries of an operation that met a connection loss.
const MAX_BACKOFF: Duration = Duration::from_millis(500);

/// One ZooKeeper session, chrooted.
pub(crate) struct Session {
    /// The client, rooted at the URL's chroot.
    pub client: zk::Client,
    /// The session id (the `ephemeralOwner` of its nodes).
    pub id: i64,
    /// The negotiated session timeout.
    pub timeout: Duration,
    /// The ACL of every node this session creates (the URL's `acl`).
    pub acls: zk::Acls<'static>,
    trust: Mutex<LostSignal>,
    stop: CancellationToken,
}

impl Drop for Session {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

/// How many times a session's connect tries every host before it fails.
const CONNECT_ATTEMPTS: u32 = 3;
/// The pause between two of them.
const CONNECT_PAUSE: std::time::Duration = std::time::Duration::from_millis(100);

impl Session {
    /// Opens a session on the ensemble of `config`, creating the chroot when it
    /// is missing, and starts watching its state.
    ///
    /// Cancel safety: safe; a dropped connect closes the half-made session.
    #[tracing::instrument(name = "zookeeper.connect", skip_all, fields(hosts = %config.hosts, chroot = %config.chroot))]
    pub async fn open(config: &Config) -> Result<std::sync::Arc<Session>> {
        let mut connector = zk::Client::connector()
            .with_session_timeout(config.session_timeout)
            .with_connection_timeout(config.connection_timeout_for(config.session_timeout))
            .with_fail_eagerly();
        // Sent with the session handshake and again on every reconnect.
        connector = match (&config.credentials, config.auth) {
            (None, _) => connector,
            (Some((user, password)), Auth::Digest) => {
                connector.with_auth("digest", format!("{user}:{}", password.expose()).as_bytes())
            }
            (Some((user, password)), Auth::Sasl) => connector.with_sasl(
                zk::SaslOptions::digest_md5(user.clone(), password.expose().to_owned()),
            ),
        };
        if let Some(files) = &config.tls {
            let invalid = |reason: String| Error::InvalidUrl {
                url: format!("zks://{}{}", config.hosts, config.chroot),
                reason,
            };
            let pem = files.read().map_err(invalid)?;
            let mut tls = zk::TlsOptions::new()
                .with_pem_ca(&pem.ca)
                .map_err(|e| invalid(format!("ca={}: {e}", files.ca.display())))?;
            if let Some((cert, key)) = &pem.identity {
                tls = tls
                    .with_pem_identity(cert, key)
                    .map_err(|e| invalid(format!("cert=, key=: {e}")))?;
            }
            // The client crate builds its rustls configuration with the
            // process-wide provider.
            crate::tls::ensure_crypto_provider();
            connector = connector.with_tls(tls);
        }
        // Each attempt gives up after the connection timeout (a third of the
        // session timeout) once every host was tried. A server slow to answer
        // a handshake (a loaded machine, a long pause of its JVM) gets up to
        // three attempts, one session timeout in all; a refusal (a TLS
        // handshake turned down) fails them quickly.
        let give_up = tokio::time::Instant::now() + config.session_timeout;
        let mut attempts = 0;
        let connected = loop {
            attempts += 1;
            let attempt = match &config.tls {
                None => connector.clone().connect(&config.hosts).await,
                Some(_) => connector.clone().secure_connect(&config.hosts).await,
            };
            match attempt {
                Err(zk::Error::NoHosts)
                    if attempts < CONNECT_ATTEMPTS && tokio::time::Instant::now() < give_up =>
                {
                    tracing::debug!(hosts = %config.hosts, attempts, "no ZooKeeper host answered; trying again");
                    tokio::time::sleep(CONNECT_PAUSE).await;
                }
                other => break other,
            }
        };
        let root = connected.map_err(|e| {
            let hint = match e {
                zk::Error::AuthFailed => match config.auth {
                    Auth::Digest => " (the digest credentials were refused)",
                    Auth::Sasl => " (the SASL credentials were refused)",
                },
                _ => "",
            };
            Error::backend(
                BACKEND,
                format!("cannot connect to {}: {e}{hint}", config.hosts),
            )
        })?;
        let acls = config.acl.acls();
        let client = if config.chroot == "/" {
            root
        } else {
            let options = zk::CreateMode::Persistent.with_acls(acls);
            root.mkdir(&config.chroot, &options).await.map_err(|e| {
                Error::backend(
                    BACKEND,
                    format!("cannot create chroot {}: {e}", config.chroot),
                )
            })?;
            root.chroot(config.chroot.clone())
                .map_err(|_| Error::InvalidArgument(format!("bad chroot {:?}", config.chroot)))?
        };
        let timeout = client.session_timeout();
        let session = std::sync::Arc::new(Session {
            id: client.session_id().0,
            timeout,
            acls,
            trust: Mutex::new(LostSignal::new()),
            stop: CancellationToken::new(),
            client,
        });
        tracing::debug!(session = %format_args!("{:#x}", session.id), ?timeout, "session open");
        let grace = config.suspended_grace_for(timeout);
        tokio::spawn(watch_state(
            std::sync::Arc::downgrade(&session),
            session.client.state_watcher(),
            grace,
        ));
        Ok(session)
    }

    /// Whether the session is over (expired, closed, failed).
    pub fn is_over(&self) -> bool {
        self.client.state().is_terminated()
    }

    /// The trust signal of the current connection epoch: it fires when the
    /// session ends or the connection stays suspended too long. A hold takes
    /// it when its node is created.
    pub fn trust(&self) -> LostSignal {
        self.trust.lock().expect("trust lock").clone()
    }

    fn distrust(&self, cause: LostCause, reason: String) {
        self.trust
            .lock()
            .expect("trust lock")
            .fire_because(cause, reason);
    }

    /// After a reconnection, new holds get a fresh epoch (unless the session
    /// is over).
    fn renew_trust(&self) {
        let mut trust = self.trust.lock().expect("trust lock");
        if trust.is_fired() && !self.is_over() {
            *trust = LostSignal::new();
        }
    }

    /// Runs `op` again while it fails for a passing reason and the session
    /// lives (ZooKeeper does not retry across reconnections, ZOOKEEPER-22).
    ///
    /// Cancel safety: as `op`.
    pub async fn retry<T, F, Fut>(&self, mut op: F) -> Result<T, zk::Error>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<T, zk::Error>>,
    {
        let mut backoff = Duration::from_millis(5);
        loop {
            match op().await {
                Err(error) if passing(&error) && !self.is_over() => {
                    sleep(backoff).await;
                    backoff = (backoff * 2).min(MAX_BACKOFF);
                }
                other => return other,
            }
        }
    }

    /// Deletes a node, retrying through connection losses; a missing node is
    /// `Ok(false)`.
    ///
    /// Cancel safety: the delete may or may not have happened.
    pub async fn delete(&self, path: &str) -> Result<bool, zk::Error> {
        match self.retry(|| self.client.delete(path, None)).await {
            Ok(()) => Ok(true),
            Err(zk::Error::NoNode) => Ok(false),
            Err(error) => Err(error),
        }
    }

    /// The children of a node; a missing node has none.
    ///
    /// Cancel safety: safe, read-only.
    pub async fn children(&self, path: &str) -> Result<Vec<String>, zk::Error> {
        match self.retry(|| self.client.list_children(path)).await {
            Err(zk::Error::NoNode) => Ok(Vec::new()),
            other => other,
        }
    }
}

/// Whether a request failed for a reason that passes with the connection
/// (the session may live on): the connection was lost, or the client gave
/// up on it while the request was out (a server cut off from its quorum
/// neither applies nor refuses what it is sent; the client then fails the
/// request with its own message, `Custom`), the request timed out, the
/// server shed load, or the session had moved to another server.
fn passing(error: &zk::Error) -> bool {
    matches!(
        error,
        zk::Error::ConnectionLoss
            | zk::Error::Timeout
            | zk::Error::Throttled
            | zk::Error::SessionMoved
            | zk::Error::Custom(_)
    )
}

/// Follows the session's state and fires the trust signal when holds can no
/// longer be trusted (see the module docs).
///
/// Cancel safety: runs as the session's own task until the session ends or
/// is dropped; aborting it only stops the watching, so holds are no longer
/// reported lost when the connection stays suspended or the session ends.
async fn watch_state(
    session: std::sync::Weak<Session>,
    mut states: zk::StateWatcher,
    grace: Option<Duration>,
) {
    let stop = match session.upgrade() {
        Some(session) => session.stop.clone(),
        None => return,
    };
    let far = || Instant::now() + Duration::from_secs(86_400 * 365);
    let mut deadline: Option<Instant> = None;
    loop {
        let state = tokio::select! {
            state = states.changed() => state,
            _ = sleep_until(deadline.unwrap_or_else(far)), if deadline.is_some() => {
                deadline = None;
                if let Some(session) = session.upgrade() {
                    let grace = grace.unwrap_or_default();
                    tracing::warn!(session = %format_args!("{:#x}", session.id), ?grace, "connection suspended too long: holds lost");
                    session.distrust(
                        LostCause::ConnectionLost,
                        format!("connection to ZooKeeper suspended for more than {grace:?}"),
                    );
                }
                continue;
            }
            _ = stop.cancelled() => return,
        };
        let Some(session) = session.upgrade() else {
            return;
        };
        let id = session.id;
        match state {
            zk::SessionState::Disconnected => {
                tracing::warn!(session = %format_args!("{id:#x}"), "connection to ZooKeeper suspended");
                match grace {
                    Some(grace) if grace.is_zero() => session.distrust(
                        LostCause::ConnectionLost,
                        "connection to ZooKeeper suspended".into(),
                    ),
                    Some(grace) => {
                        deadline.get_or_insert_with(|| Instant::now() + grace);
                    }
                    None => {}
                }
            }
            zk::SessionState::SyncConnected | zk::SessionState::ConnectedReadOnly => {
                tracing::info!(session = %format_args!("{id:#x}"), "connection to ZooKeeper restored");
                deadline = None;
                session.renew_trust();
            }
            ended => {
                tracing::warn!(session = %format_args!("{id:#x}"), state = ?ended, "ZooKeeper session ended");
                let cause = match ended {
                    zk::SessionState::Expired => LostCause::SessionExpired,
                    zk::SessionState::Closed => LostCause::SessionClosed,
                    _ => LostCause::Other,
                };
                session.distrust(
                    cause,
                    format!("ZooKeeper session {id:#x} ended ({ended:?})"),
                );
                return;
            }
        }
    }
}
