//! `redis+cluster://`: a Redis Cluster through the `redis` crate's cluster
//! client, which routes each command to the primary of its first key's slot
//! and handles `MOVED`, `ASK` and failovers by refreshing its slot map.
//!
//! Every key of one lock shares a hash slot (Redisson's names put the lock
//! name in braces: `redisson_lock_token:{name}` hashes like `name`), so each
//! script runs on one primary; [`one_slot`] refuses names whose own braces
//! would split them. The watchdog renews per slot. Wake-ups use sharded
//! pub/sub (`SPUBLISH` / `SSUBSCRIBE`, Redis 7+), as Redisson does on a
//! cluster, so a release is heard on the lock's own shard only; before Redis 7
//! plain `PUBLISH` reaches every node.

use std::time::Duration;

use ::redis::cluster::{ClusterClient, ClusterClientBuilder};
use ::redis::cluster_async::ClusterConnection;
use ::redis::cluster_routing::{RoutingInfo, SingleNodeRoutingInfo, Slot};
use ::redis::{RedisError, Value};

use super::config::Config;
use super::keys::Keys;
use super::server::{certificates, failure, scan_page};
use crate::error::{Error, Result};
use crate::tls::ensure_crypto_provider;

/// A builder for a client of the cluster that `config` names.
fn builder(config: &Config, response_timeout: Duration) -> Result<ClusterClientBuilder> {
    let mut builder = ClusterClientBuilder::new(config.nodes.clone())
        .connection_timeout(config.connect_timeout)
        .response_timeout(response_timeout)
        // A failover takes seconds; the callers retry on their own terms
        // (acquires for a session TTL, the watchdog every third of it).
        .retries(4)
        .min_retry_wait(50)
        .max_retry_wait(500);
    if let Some(certificates) = certificates(config)? {
        builder = builder.certs(certificates);
    }
    // `rediss://` nodes build their rustls configuration with the
    // process-wide provider, which must be chosen when several are linked.
    if config
        .nodes
        .iter()
        .any(|node| node.starts_with("rediss://"))
    {
        ensure_crypto_provider();
    }
    Ok(builder)
}

/// Connects to the cluster (failing if no seed node answers), and says
/// whether it has sharded pub/sub (`SSUBSCRIBE`, Redis 7+).
///
/// Cancel safety: safe; nothing is left behind.
pub(crate) async fn connect(
    config: &Config,
    response_timeout: Duration,
) -> Result<(ClusterConnection, bool)> {
    let client = builder(config, response_timeout)?
        .build()
        .map_err(|e| failure(format!("cannot set up {}", config.display), e))?;
    let mut conn = client
        .get_async_connection()
        .await
        .map_err(|e| failure(format!("cannot connect to {}", config.display), e))?;
    let info: String = from_value(
        conn.route_command(
            ::redis::cmd("INFO").arg("server").clone(),
            RoutingInfo::SingleNode(SingleNodeRoutingInfo::Random),
        )
        .await
        .map_err(|e| failure("asking the cluster for its version", e))?,
    )
    .map_err(|e| failure("reading the cluster's version", e))?;
    let major = info
        .lines()
        .find_map(|l| l.strip_prefix("redis_version:"))
        .and_then(|v| v.split('.').next()?.trim().parse::<u32>().ok())
        .unwrap_or(0);
    Ok((conn, major >= 7))
}

/// A client for the subscription connection: RESP3, whose pushes (messages,
/// and a `Disconnection` when a node's connection drops) go to `pushes`. The
/// client re-subscribes by itself after reconnects and slot moves.
pub(crate) fn subscriber(
    config: &Config,
    pushes: tokio::sync::mpsc::UnboundedSender<::redis::PushInfo>,
) -> Result<ClusterClient> {
    builder(config, Duration::from_secs(2))?
        .use_protocol(::redis::ProtocolVersion::RESP3)
        .push_sender(pushes)
        .build()
        .map_err(|e| failure(format!("cannot set up {}", config.display), e))
}

/// Checks that every key and channel of a lock hashes to one slot, so that
/// its scripts can run on one primary.
pub(crate) fn one_slot(name: &str, keys: &Keys) -> Result<()> {
    let slot = Slot::for_key(&keys.lock);
    let split = [
        &keys.token,
        &keys.meta,
        &keys.queue,
        &keys.queue_deadlines,
        &keys.channel,
        &keys.rw_channel,
        &keys.permits,
        &keys.sem_channel,
    ]
    .into_iter()
    .find(|key| Slot::for_key(key) != slot);
    match split {
        None => Ok(()),
        Some(key) => Err(Error::Unsupported {
            backend: super::BACKEND,
            what: format!(
                "the lock name {name:?} on a Redis Cluster: its braces put {key:?} in another \
                 hash slot than {:?} (a name with braces needs a non-empty `{{…}}` part, which \
                 decides the slot)",
                keys.lock
            ),
        }),
    }
}

/// The slot of a lock, for grouping renewals.
pub(crate) fn slot_of(keys: &Keys) -> Slot {
    Slot::for_key(&keys.lock)
}

/// Every key matching `pattern` on every primary.
///
/// Cancel safety: safe; it only reads.
pub(crate) async fn scan(
    cluster: &ClusterConnection,
    pattern: &str,
) -> std::result::Result<Vec<String>, RedisError> {
    let mut conn = cluster.clone();
    let slots = conn
        .route_command(
            ::redis::cmd("CLUSTER").arg("SLOTS").clone(),
            RoutingInfo::SingleNode(SingleNodeRoutingInfo::Random),
        )
        .await?;
    let mut primaries: Vec<(String, u16)> = Vec::new();
    if let Value::Array(ranges) = slots {
        for range in ranges {
            let Value::Array(fields) = range else {
                continue;
            };
            let Some(Value::Array(primary)) = fields.get(2) else {
                continue;
            };
            if let (Some(host), Some(Value::Int(port))) = (primary.first(), primary.get(1)) {
                let host: String = from_value(host.clone())?;
                let address = (host, *port as u16);
                if !primaries.contains(&address) {
                    primaries.push(address);
                }
            }
        }
    }
    let mut found = Vec::new();
    for (host, port) in primaries {
        let route = RoutingInfo::SingleNode(SingleNodeRoutingInfo::ByAddress { host, port });
        let mut cursor = 0;
        loop {
            let page = conn
                .route_command(scan_page(cursor, pattern), route.clone())
                .await?;
            let (next, keys): (u64, Vec<String>) = from_value(page)?;
            found.extend(keys);
            cursor = next;
            if cursor == 0 {
                break;
            }
        }
    }
    Ok(found)
}

fn from_value<T: ::redis::FromRedisValue>(value: Value) -> std::result::Result<T, RedisError> {
    ::redis::from_redis_value(value).map_err(RedisError::from)
}
