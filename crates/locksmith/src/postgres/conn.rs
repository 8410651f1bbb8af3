//! Connections that hold advisory locks.
//!
//! Session-level advisory locks belong to a connection, so a connection that
//! holds one must be watched (its end is the end of its holds) and must never
//! go back to a pool while it still holds anything. [`PgConn`] is such a
//! connection: its driver task fires the lost signals of every hold pinned to
//! it the moment the socket closes, a keepalive query finds dead peers that
//! never close, and [`PgConn::kill`] closes the socket so PostgreSQL drops the
//! locks when this side stops trusting them. [`ConnPool`] keeps a few idle
//! ones (holding nothing) for the next wait.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use tokio::task::JoinHandle;
use tokio_postgres::{Row, Statement};
use tokio_util::sync::CancellationToken;

use super::config::Settings;
use super::tls::Tls;
use super::{pg_error, run, Params};
use crate::backend::LostSignal;
use crate::error::{Error, Result};
use crate::lost::LostCause;

/// One PostgreSQL connection of our own (not deadpool's), see the module docs.
pub(crate) struct PgConn {
    client: tokio_postgres::Client,
    /// Fired when the connection's driver task ends.
    closed: CancellationToken,
    /// Why it ended, once it has.
    closed_reason: Arc<Mutex<Option<String>>>,
    driver: JoinHandle<()>,
    /// Prepared statements by SQL text: a handful per connection, so a list
    /// (hashing the long texts on every call cost more than comparing them).
    statements: Mutex<Vec<(String, Statement)>>,
    /// Lost signals of the holds pinned to this connection, by hold id.
    holds: Mutex<HashMap<u64, LostSignal>>,
    /// Names with a hold on this connection (a connection holds a name at
    /// most once: PostgreSQL would grant the same session the key again).
    names: Mutex<HashMap<String, u32>>,
    /// No new holds: it failed a keepalive or was killed.
    dead: AtomicBool,
    /// How to cancel the statement running on this connection.
    cancel: CancelHandle,
    /// A duplicate of the connection's socket (when we opened it ourselves),
    /// to close it from synchronous code and watch the server close its end.
    socket: Option<std::net::TcpStream>,
    /// Behind a transaction pooler: no named statements.
    unnamed: bool,
    /// A statement was sent and its answer has not been read (set while one
    /// runs, and left set by a call dropped before the answer): how a dropped
    /// wait knows that the server still owes it an answer.
    in_flight: AtomicBool,
}

/// The capability to cancel the statement running on one connection.
#[derive(Clone)]
pub(crate) struct CancelHandle {
    token: tokio_postgres::CancelToken,
    /// The server's address and the name its certificate is checked against,
    /// when the connection went to a single TCP address (the token then
    /// carries neither: the connection was opened raw).
    addr: Option<(SocketAddr, String)>,
    tls: Tls,
}

impl CancelHandle {
    /// Sends a cancel request (the statement may finish first).
    ///
    /// Cancel safety: safe; the request went out or it did not.
    pub async fn cancel(&self) {
        let result = match &self.addr {
            Some((addr, host)) => match tokio::net::TcpStream::connect(addr).await {
                Ok(stream) => {
                    let tls = self.tls.connect_to::<tokio::net::TcpStream>(host);
                    self.token.cancel_query_raw(stream, tls).await
                }
                Err(_) => return,
            },
            None => self.token.cancel_query(self.tls.0.clone()).await,
        };
        if let Err(error) = result {
            tracing::debug!(%error, "postgres: cancel request failed");
        }
    }
}

static NEXT_HOLD: AtomicU64 = AtomicU64::new(1);

/// A fresh id for [`PgConn::pin`].
pub(crate) fn hold_id() -> u64 {
    NEXT_HOLD.fetch_add(1, Ordering::Relaxed)
}

impl PgConn {
    /// Opens a connection and starts its driver and keepalive tasks.
    ///
    /// Cancel safety: safe; a dropped connect closes the half-open connection.
    pub async fn connect(settings: &Settings) -> Result<Arc<PgConn>> {
        let closed = CancellationToken::new();
        let closed_reason = Arc::new(Mutex::new(None));
        let (client, driver, socket, addr) = match single_host(settings) {
            // Open the socket ourselves, to keep a duplicate of it.
            Some((host, tls_name, port)) => {
                let timeout = settings
                    .pg
                    .get_connect_timeout()
                    .copied()
                    .unwrap_or(Duration::from_secs(10));
                let (stream, addr) = connect_tcp(&host, port, timeout).await?;
                let _ = stream.set_nodelay(true);
                let socket = stream
                    .into_std()
                    .and_then(|std| std.try_clone().map(|dup| (std, dup)))
                    .map_err(|e| Error::backend("postgres", e))?;
                let stream = tokio::net::TcpStream::from_std(socket.0)
                    .map_err(|e| Error::backend("postgres", e))?;
                let tls = settings.tls.connect_to::<tokio::net::TcpStream>(&tls_name);
                let (client, connection) = settings
                    .pg
                    .connect_raw(stream, tls)
                    .await
                    .map_err(pg_error)?;
                let driver = spawn_driver(connection, closed.clone(), closed_reason.clone());
                (client, driver, Some(socket.1), Some((addr, tls_name)))
            }
            None => {
                let (client, connection) = settings
                    .pg
                    .connect(settings.tls.0.clone())
                    .await
                    .map_err(pg_error)?;
                let driver = spawn_driver(connection, closed.clone(), closed_reason.clone());
                (client, driver, None, None)
            }
        };
        let conn = Arc::new(PgConn {
            cancel: CancelHandle {
                token: client.cancel_token(),
                addr,
                tls: settings.tls.clone(),
            },
            client,
            closed: closed.clone(),
            closed_reason,
            driver,
            statements: Mutex::default(),
            holds: Mutex::default(),
            names: Mutex::default(),
            dead: AtomicBool::new(false),
            socket,
            unnamed: settings.pooler == super::config::Pooler::Transaction,
            in_flight: AtomicBool::new(false),
        });
        tokio::spawn(watch(
            Arc::downgrade(&conn),
            closed,
            settings.keepalive,
            settings.session_ttl,
        ));
        Ok(conn)
    }

    /// How to cancel this connection's running statement.
    pub fn cancel_handle(&self) -> CancelHandle {
        self.cancel.clone()
    }

    /// The tokio-postgres client.
    pub fn client(&self) -> &tokio_postgres::Client {
        &self.client
    }

    /// A prepared statement, prepared once per connection.
    ///
    /// Cancel safety: safe; a dropped prepare only costs a later one.
    pub async fn prepare(&self, sql: &str) -> Result<Statement> {
        let known = self
            .statements
            .lock()
            .expect("statements")
            .iter()
            .find(|(text, _)| text == sql)
            .map(|(_, statement)| statement.clone());
        if let Some(statement) = known {
            return Ok(statement);
        }
        let statement = self.client.prepare(sql).await.map_err(pg_error)?;
        let mut statements = self.statements.lock().expect("statements");
        if !statements.iter().any(|(text, _)| text == sql) {
            statements.push((sql.to_owned(), statement.clone()));
        }
        Ok(statement)
    }

    /// Runs `sql`, prepared once per connection, or unnamed behind a
    /// transaction pooler (see [`super::run`]).
    ///
    /// Cancel safety: safe if the statement is (a dropped call may or may not
    /// have run it).
    pub async fn query(&self, sql: &str, params: Params<'_>) -> Result<Vec<Row>> {
        if self.unnamed {
            return self.tracked(run(&self.client, None, sql, params)).await;
        }
        let statement = self.prepare(sql).await?;
        self.tracked(run(&self.client, Some(&statement), sql, params))
            .await
    }

    /// Runs `sql` with the simple protocol (it may hold several statements).
    ///
    /// Cancel safety: as the statements'.
    pub async fn simple(
        &self,
        sql: &str,
    ) -> std::result::Result<Vec<tokio_postgres::SimpleQueryMessage>, tokio_postgres::Error> {
        self.tracked(self.client.simple_query(sql)).await
    }

    /// Runs `statement`, keeping `in_flight` (for connections one task uses).
    ///
    /// Cancel safety: as the statement's; a dropped call leaves `in_flight`
    /// set, on purpose: the server still owes that statement's answer (see
    /// `cancel_blocking`).
    async fn tracked<T>(&self, statement: impl std::future::Future<Output = T>) -> T {
        self.in_flight.store(true, Ordering::Release);
        let answer = statement.await;
        self.in_flight.store(false, Ordering::Release);
        answer
    }

    /// Runs `sql` as an unnamed statement (for statements whose text varies).
    ///
    /// Cancel safety: as [`PgConn::query`].
    pub async fn query_unnamed(&self, sql: &str, params: Params<'_>) -> Result<Vec<Row>> {
        self.tracked(run(&self.client, None, sql, params)).await
    }

    /// Whether new holds may go on this connection.
    pub fn usable(&self) -> bool {
        !self.dead.load(Ordering::Acquire) && !self.closed.is_cancelled()
    }

    /// Why the connection can no longer be trusted, if it cannot.
    pub fn broken(&self) -> Option<String> {
        if self.closed.is_cancelled() || self.dead.load(Ordering::Acquire) {
            Some(
                self.closed_reason
                    .lock()
                    .expect("reason lock")
                    .clone()
                    .unwrap_or_else(|| "connection to PostgreSQL closed".into()),
            )
        } else {
            None
        }
    }

    /// Pins a hold: `lost` fires when the connection dies. Returns false (and
    /// fires `lost`) when it already has.
    pub fn pin(&self, id: u64, lost: &LostSignal) -> bool {
        self.holds
            .lock()
            .expect("holds lock")
            .insert(id, lost.clone());
        if let Some(reason) = self.broken() {
            lost.fire_because(LostCause::ConnectionLost, reason);
            return false;
        }
        true
    }

    /// Unpins a hold (released or given up).
    pub fn unpin(&self, id: u64) {
        self.holds.lock().expect("holds lock").remove(&id);
    }

    /// Whether any hold is pinned here.
    pub fn holds_anything(&self) -> bool {
        !self.holds.lock().expect("holds lock").is_empty()
    }

    /// Claims `name` for a hold on this connection; false when the connection
    /// already holds it (the hold must then go elsewhere).
    pub fn claim_name(&self, name: &str) -> bool {
        let mut names = self.names.lock().expect("names lock");
        if names.contains_key(name) {
            return false;
        }
        names.insert(name.to_owned(), 1);
        true
    }

    /// Gives `name` back.
    pub fn release_name(&self, name: &str) {
        self.names.lock().expect("names lock").remove(name);
    }

    /// Stops trusting the connection: fires every pinned hold's lost signal
    /// with `reason` and closes the socket, so PostgreSQL ends the session and
    /// drops its advisory locks instead of keeping them for a client that
    /// has given them up.
    pub fn kill(&self, reason: &str) {
        self.dead.store(true, Ordering::Release);
        self.closed_reason
            .lock()
            .expect("reason lock")
            .get_or_insert_with(|| reason.to_owned());
        if let Some(socket) = &self.socket {
            // Write side only: the server sees end-of-file and ends the
            // session; our read side stays open to see it go (cancel_blocking).
            let _ = socket.shutdown(std::net::Shutdown::Write);
        }
        self.driver.abort();
        self.fire_all();
    }

    fn fire_all(&self) {
        let reason = self
            .broken()
            .unwrap_or_else(|| "connection to PostgreSQL closed".into());
        let holds: Vec<LostSignal> = self
            .holds
            .lock()
            .expect("holds lock")
            .drain()
            .map(|(_, lost)| lost)
            .collect();
        for lost in holds {
            lost.fire_because(LostCause::ConnectionLost, reason.clone());
        }
    }

    /// Cancels the statement running on this connection and closes it, from
    /// synchronous code (a drop guard), and returns once the server's backend
    /// is gone: a cancel request over a blocking socket (the postmaster has
    /// signalled the backend when it closes that socket), then our end of
    /// the connection shut down, then a blocking read until the server closes
    /// its end, which a backend does only on exit, after it has left the lock
    /// queue, dropped its locks and left `pg_stat_activity`. So a dropped wait
    /// leaves no trace by the time the drop returns (bounded by a few
    /// seconds). Without a duplicate socket (Unix sockets, several hosts) the
    /// cancel and the close happen in the background instead.
    pub fn cancel_blocking(&self) {
        let Some((addr, host)) = &self.cancel.addr else {
            let cancel = self.cancel.clone();
            if let Ok(runtime) = tokio::runtime::Handle::try_current() {
                runtime.spawn(async move { cancel.cancel().await });
            }
            self.kill("acquire cancelled");
            return;
        };
        let limit = Duration::from_secs(2);
        let mut cancelled = false;
        if let Ok(stream) = std::net::TcpStream::connect_timeout(addr, limit) {
            let _ = stream.set_read_timeout(Some(limit));
            let _ = stream.set_write_timeout(Some(limit));
            if let Ok(reader) = stream.try_clone() {
                let tls = self.cancel.tls.connect_to::<BlockingStream>(host);
                let request = self
                    .cancel
                    .token
                    .cancel_query_raw(BlockingStream(stream), tls);
                if futures::executor::block_on(request).is_ok() {
                    drain(&reader, limit);
                    cancelled = true;
                }
            }
        }
        if self.unnamed && cancelled && self.in_flight.load(Ordering::Acquire) {
            // Behind a pooler, the pooler closing our connection says nothing
            // about the backend. Wait instead for the answer to the cancelled
            // statement: it comes once the backend has left the lock queue and
            // its transaction, with the locks in it, has ended. The driver
            // stops first, so that the answer is left for us to see.
            self.driver.abort();
            if let Some(socket) = &self.socket {
                until_readable(socket, limit);
            }
        }
        self.kill("acquire cancelled");
        if let Some(socket) = &self.socket {
            drain(socket, limit);
        }
    }
}

/// Waits until `socket` has something to read (or is closed), for at most
/// `limit`, and reads (drops) what is there. Non-blocking sockets as for
/// [`drain`].
fn until_readable(socket: &std::net::TcpStream, limit: Duration) {
    let deadline = std::time::Instant::now() + limit;
    let mut sink = [0u8; 512];
    let mut reader = socket;
    loop {
        match std::io::Read::read(&mut reader, &mut sink) {
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::Interrupted
                ) && std::time::Instant::now() < deadline =>
            {
                std::thread::sleep(Duration::from_micros(200));
            }
            _ => return,
        }
    }
}

/// Reads (and drops) until the peer closes the connection, for at most
/// `limit`. The socket may be in non-blocking mode (a duplicate of one tokio
/// drives), so "nothing yet" is waited out in short sleeps.
fn drain(socket: &std::net::TcpStream, limit: Duration) {
    let deadline = std::time::Instant::now() + limit;
    let mut sink = [0u8; 512];
    let mut reader = socket;
    loop {
        match std::io::Read::read(&mut reader, &mut sink) {
            Ok(0) => return,
            Ok(_) => {}
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::Interrupted
                ) =>
            {
                if std::time::Instant::now() >= deadline {
                    return;
                }
                std::thread::sleep(Duration::from_micros(200));
            }
            Err(_) => return,
        }
    }
}

/// Spawns the task that drives a connection and records why it ended.
fn spawn_driver<S, T>(
    connection: tokio_postgres::Connection<S, T>,
    closed: CancellationToken,
    reason: Arc<Mutex<Option<String>>>,
) -> JoinHandle<()>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
    T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    tokio::spawn(async move {
        let why = match connection.await {
            Ok(()) => "connection to PostgreSQL closed".to_owned(),
            Err(error) => format!("connection to PostgreSQL lost: {error}"),
        };
        reason.lock().expect("reason lock").get_or_insert(why);
        closed.cancel();
    })
}

impl Drop for PgConn {
    fn drop(&mut self) {
        self.driver.abort();
    }
}

/// The one TCP host of the config, when it names exactly one: where to
/// connect (with `hostaddr`, that address), the name the server's certificate
/// must carry (the host), and the port.
fn single_host(settings: &Settings) -> Option<(String, String, u16)> {
    let port = match settings.pg.get_ports() {
        [] => 5432,
        [port] => *port,
        _ => return None,
    };
    let host = match settings.pg.get_hosts() {
        [tokio_postgres::config::Host::Tcp(host)] => Some(host.clone()),
        [] => None,
        _ => return None,
    };
    match (settings.pg.get_hostaddrs(), host) {
        ([addr], host) => Some((
            addr.to_string(),
            host.unwrap_or_else(|| addr.to_string()),
            port,
        )),
        ([], Some(host)) => Some((host.clone(), host, port)),
        _ => None,
    }
}

/// Connects to the first address of `host` that accepts, like libpq.
///
/// Cancel safety: safe; a dropped call leaves no socket behind.
async fn connect_tcp(
    host: &str,
    port: u16,
    timeout: Duration,
) -> Result<(tokio::net::TcpStream, SocketAddr)> {
    let addrs = tokio::net::lookup_host((host, port))
        .await
        .map_err(|e| Error::backend("postgres", format!("resolving {host}: {e}")))?;
    let mut last = format!("{host} has no address");
    for addr in addrs {
        match tokio::time::timeout(timeout, tokio::net::TcpStream::connect(addr)).await {
            Ok(Ok(stream)) => return Ok((stream, addr)),
            Ok(Err(e)) => last = format!("connecting to {addr}: {e}"),
            Err(_) => last = format!("connecting to {addr} timed out"),
        }
    }
    Err(Error::backend("postgres", last))
}

/// Watches one connection: fires its holds when it closes, and runs a
/// keepalive query while it holds anything; a keepalive that fails or gets no
/// answer within the session TTL kills the connection.
///
/// Cancel safety: runs as the connection's own task; stopping it stops the
/// keepalive, so the connection's holds are no longer watched.
async fn watch(conn: Weak<PgConn>, closed: CancellationToken, every: Duration, ttl: Duration) {
    loop {
        tokio::select! {
            _ = closed.cancelled() => {
                if let Some(conn) = conn.upgrade() {
                    tracing::debug!(reason = ?conn.broken(), "postgres holding connection closed");
                    conn.fire_all();
                }
                return;
            }
            _ = tokio::time::sleep(every) => {}
        }
        let Some(conn) = conn.upgrade() else { return };
        if !conn.holds_anything() {
            continue;
        }
        match tokio::time::timeout(ttl, conn.client.simple_query("")).await {
            Ok(Ok(_)) => {}
            Ok(Err(error)) => conn.kill(&format!("keepalive failed: {error}")),
            Err(_) => conn.kill(&format!("keepalive got no answer within {ttl:?}")),
        }
    }
}

/// A std TCP stream in blocking mode as a tokio stream that is always ready,
/// for one cancel request from synchronous code.
struct BlockingStream(std::net::TcpStream);

impl tokio::io::AsyncRead for BlockingStream {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        let n = std::io::Read::read(&mut self.0, buf.initialize_unfilled())?;
        buf.advance(n);
        std::task::Poll::Ready(Ok(()))
    }
}

impl tokio::io::AsyncWrite for BlockingStream {
    fn poll_write(
        mut self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        std::task::Poll::Ready(std::io::Write::write(&mut self.0, buf))
    }

    fn poll_flush(
        mut self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::task::Poll::Ready(std::io::Write::flush(&mut self.0))
    }

    /// Does nothing: the caller reads until the server closes the
    /// connection, then drops it. (A half-close right after the request, which
    /// tokio-postgres asks for, crashes PgBouncer 1.18 when it comes before
    /// PgBouncer has passed the request on: its issue 801.)
    fn poll_shutdown(
        self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::task::Poll::Ready(Ok(()))
    }
}

/// Idle holding connections (they hold nothing) for the next wait.
pub(crate) struct ConnPool {
    settings: Arc<Settings>,
    idle: Mutex<Vec<Arc<PgConn>>>,
    max_idle: usize,
}

impl ConnPool {
    pub fn new(settings: Arc<Settings>, max_idle: usize) -> Self {
        ConnPool {
            settings,
            idle: Mutex::default(),
            max_idle,
        }
    }

    /// An idle connection, or a new one.
    ///
    /// Cancel safety: safe.
    pub async fn get(&self) -> Result<Arc<PgConn>> {
        loop {
            let Some(conn) = self.idle.lock().expect("idle lock").pop() else {
                break;
            };
            if conn.usable() {
                return Ok(conn);
            }
        }
        PgConn::connect(&self.settings).await
    }

    /// Takes back a connection that holds nothing (its holds released, its
    /// wait done); others are dropped.
    pub fn put(&self, conn: Arc<PgConn>) {
        if !conn.usable() || conn.holds_anything() {
            return;
        }
        let mut idle = self.idle.lock().expect("idle lock");
        if idle.len() < self.max_idle {
            idle.push(conn);
        }
    }

    /// Drops every idle connection.
    pub fn clear(&self) {
        self.idle.lock().expect("idle lock").clear();
    }
}
