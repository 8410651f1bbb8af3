//! One Redis endpoint the backend sends commands to: a server, the primary
//! that Sentinel names, or a Redis Cluster; each with its subscription hub.

use std::sync::Arc;
use std::time::Duration;

use ::redis::aio::{ConnectionLike, ConnectionManager};
use ::redis::cluster_async::ClusterConnection;
use ::redis::cluster_routing::{Route, RoutingInfo, SingleNodeRoutingInfo, SlotAddr};
use ::redis::{ErrorKind, FromRedisValue, RedisError, Script, ServerErrorKind};
use tokio::sync::{watch, Notify};

use super::config::Config;
use super::keys::Keys;
use super::ops::Call;
use super::pubsub::{Hub, Source};
use super::server::{is_unreachable, scan_page, Server};
use super::{cluster, sentinel};
use crate::error::Result;

/// Where a node's commands go.
enum Conn {
    /// One server (`redis://`, a Redlock master). The sender never changes
    /// its value; it is a watch so that the hub treats every kind alike.
    Server(watch::Sender<Arc<Server>>),
    /// The primary the Sentinels name now, replaced on a failover.
    Sentinel(Arc<sentinel::Primary>),
    /// A Redis Cluster: each command goes to the primary of its first key's
    /// slot; `MOVED`, `ASK` and failovers are the `redis` crate's business.
    Cluster(ClusterConnection),
}

/// One Redis endpoint: what a lock's commands are sent to.
pub(crate) struct Node {
    conn: Conn,
    /// Its subscription connection.
    pub hub: Arc<Hub>,
}

impl Node {
    /// One server; `eager` connects now (and fails if Redis is not there),
    /// otherwise on first use.
    ///
    /// Cancel safety: safe; nothing is left behind.
    pub async fn server(
        url: &str,
        config: &Config,
        response_timeout: Duration,
        eager: bool,
        reconnected: Arc<Notify>,
    ) -> Result<Node> {
        let server = Server::connect(url, config, response_timeout, eager).await?;
        let (current, watched) = watch::channel(Arc::new(server));
        let hub = Hub::new(Source::Server(watched), reconnected);
        Ok(Node {
            conn: Conn::Server(current),
            hub,
        })
    }

    /// The primary of a Sentinel setup, found now and followed from then on.
    ///
    /// Cancel safety: safe; nothing is left behind.
    pub async fn sentinel(
        config: &Config,
        master: &str,
        response_timeout: Duration,
        reconnected: Arc<Notify>,
    ) -> Result<Node> {
        let primary =
            sentinel::Primary::connect(config, master, response_timeout, reconnected.clone())
                .await?;
        let hub = Hub::new(Source::Server(primary.watch()), reconnected);
        Ok(Node {
            conn: Conn::Sentinel(primary),
            hub,
        })
    }

    /// A Redis Cluster, reached through its seed nodes.
    ///
    /// Cancel safety: safe; nothing is left behind.
    pub async fn cluster(
        config: &Config,
        response_timeout: Duration,
        reconnected: Arc<Notify>,
    ) -> Result<Node> {
        let (conn, sharded) = cluster::connect(config, response_timeout).await?;
        let source = Source::Cluster {
            config: Box::new(config.clone()),
            sharded,
        };
        let hub = Hub::new(source, reconnected);
        Ok(Node {
            conn: Conn::Cluster(conn),
            hub,
        })
    }

    /// What the node is, for messages: `host:port`, the current primary, or
    /// the cluster.
    pub fn label(&self) -> String {
        match &self.conn {
            Conn::Server(server) => server.borrow().label.clone(),
            Conn::Sentinel(primary) => primary.label(),
            Conn::Cluster(_) => "the Redis Cluster".to_owned(),
        }
    }

    /// The command connection to use now.
    fn link(&self) -> Link {
        match &self.conn {
            Conn::Server(server) => Link::Server(server.borrow().conn.clone()),
            Conn::Sentinel(primary) => Link::Server(primary.current().conn.clone()),
            Conn::Cluster(cluster) => Link::Cluster(cluster.clone()),
        }
    }

    /// Passes `result` through, telling the Sentinel follower when an error
    /// hints that the primary moved.
    fn notice<T>(
        &self,
        result: std::result::Result<T, RedisError>,
    ) -> std::result::Result<T, RedisError> {
        if let (Conn::Sentinel(primary), Err(e)) = (&self.conn, &result) {
            if is_unreachable(e) {
                primary.suspect();
            }
        }
        result
    }

    /// Runs a script call (EVALSHA, loading the script on NOSCRIPT).
    ///
    /// Cancel safety: the script may or may not have run.
    pub async fn eval<T: FromRedisValue>(&self, call: &Call) -> std::result::Result<T, RedisError> {
        let mut link = self.link();
        let result = match call.cmd.query_async(&mut link).await {
            Err(e) if e.kind() == ErrorKind::Server(ServerErrorKind::NoScript) => {
                match load(&mut link, call.script).await {
                    Ok(()) => call.cmd.query_async(&mut link).await,
                    Err(e) => Err(e),
                }
            }
            other => other,
        };
        self.notice(result)
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
        let mut link = self.link();
        let result = match pipe.query_async(&mut link).await {
            Err(e) if e.kind() == ErrorKind::Server(ServerErrorKind::NoScript) => {
                match load(&mut link, call.script).await {
                    Ok(()) => pipe.query_async(&mut link).await,
                    Err(e) => Err(e),
                }
            }
            other => other,
        };
        self.notice(result)
    }

    /// How many replicas the primary of `keys` has connected
    /// (`connected_slaves` of `INFO replication`; on a cluster, of the
    /// primary of the lock's slot).
    ///
    /// Cancel safety: safe; it only reads.
    pub async fn replicas_connected(&self, keys: &Keys) -> std::result::Result<u32, RedisError> {
        let info = ::redis::cmd("INFO").arg("replication").clone();
        let result = match &self.conn {
            Conn::Cluster(cluster) => {
                let route = RoutingInfo::SingleNode(SingleNodeRoutingInfo::SpecificNode(
                    Route::with_key(&keys.lock, SlotAddr::Master),
                ));
                match cluster.clone().route_command(info, route).await {
                    Ok(value) => {
                        ::redis::from_redis_value::<String>(value).map_err(RedisError::from)
                    }
                    Err(e) => Err(e),
                }
            }
            _ => info.query_async::<String>(&mut self.link()).await,
        };
        let text = self.notice(result)?;
        text.lines()
            .find_map(|line| line.strip_prefix("connected_slaves:"))
            .and_then(|count| count.trim().parse().ok())
            .ok_or_else(|| {
                RedisError::from((
                    ErrorKind::Parse,
                    "INFO replication without connected_slaves",
                ))
            })
    }

    /// Runs a plain command (on a cluster: where its key says).
    ///
    /// Cancel safety: the command may or may not have run.
    pub async fn query<T: FromRedisValue>(
        &self,
        cmd: &::redis::Cmd,
    ) -> std::result::Result<T, RedisError> {
        let result = cmd.query_async(&mut self.link()).await;
        self.notice(result)
    }

    /// Loads a script (`SCRIPT LOAD`; on every primary of a cluster).
    ///
    /// Cancel safety: safe; loading is idempotent.
    pub async fn load(&self, script: &Script) -> std::result::Result<(), RedisError> {
        let result = load(&mut self.link(), script).await;
        self.notice(result)
    }

    /// Every key matching `pattern` (`SCAN … MATCH`), on every primary of a
    /// cluster. With `page_limit`, a page not answered within it fails the
    /// scan: a silent server costs that, not the response timeout, while a
    /// big keyspace still goes on page by page.
    ///
    /// Cancel safety: safe; it only reads.
    pub async fn scan(
        &self,
        pattern: &str,
        page_limit: Option<Duration>,
    ) -> std::result::Result<Vec<String>, RedisError> {
        let result = match &self.conn {
            Conn::Cluster(cluster) => cluster::scan(cluster, pattern).await,
            _ => scan(&mut self.link(), pattern, page_limit).await,
        };
        self.notice(result)
    }
}

/// The command connection of a node, whichever kind it is.
#[derive(Clone)]
enum Link {
    Server(ConnectionManager),
    Cluster(ClusterConnection),
}

impl ConnectionLike for Link {
    fn req_packed_command<'a>(
        &'a mut self,
        cmd: &'a ::redis::Cmd,
    ) -> ::redis::RedisFuture<'a, ::redis::Value> {
        match self {
            Link::Server(conn) => conn.req_packed_command(cmd),
            Link::Cluster(conn) => conn.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        cmd: &'a ::redis::Pipeline,
        offset: usize,
        count: usize,
    ) -> ::redis::RedisFuture<'a, Vec<::redis::Value>> {
        match self {
            Link::Server(conn) => conn.req_packed_commands(cmd, offset, count),
            Link::Cluster(conn) => conn.req_packed_commands(cmd, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Link::Server(conn) => conn.get_db(),
            Link::Cluster(conn) => conn.get_db(),
        }
    }
}

/// `SCAN 0 MATCH pattern` to the end, on one connection.
///
/// Cancel safety: safe; it only reads.
async fn scan(
    conn: &mut impl ConnectionLike,
    pattern: &str,
    page_limit: Option<Duration>,
) -> std::result::Result<Vec<String>, RedisError> {
    let mut found = Vec::new();
    let mut cursor = 0;
    loop {
        let page = scan_page(cursor, pattern);
        let page = page.query_async::<(u64, Vec<String>)>(&mut *conn);
        let (next, keys) = match page_limit {
            None => page.await?,
            Some(limit) => tokio::time::timeout(limit, page).await.map_err(|_| {
                RedisError::from(std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    format!("no page of SCAN within {limit:?}"),
                ))
            })??,
        };
        found.extend(keys);
        cursor = next;
        if cursor == 0 {
            return Ok(found);
        }
    }
}

/// `SCRIPT LOAD` where the connection leads: one server, or every primary of
/// a cluster.
///
/// Cancel safety: safe; loading is idempotent.
async fn load(
    conn: &mut impl ConnectionLike,
    script: &Script,
) -> std::result::Result<(), RedisError> {
    script.prepare_invoke().load_async(conn).await.map(drop)
}
