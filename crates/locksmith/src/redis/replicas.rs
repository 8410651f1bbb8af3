//! How many replicas a grant waits for (`WAIT n`): the number the URL asks
//! for, but no more than the primary has connected right now.
//!
//! `WAIT n` blocks for its whole timeout when the primary has fewer than `n`
//! replicas, so a primary that lost its replicas (a failover promoted the only
//! one, both replicas are down) would make every grant fail after a second.
//! Like Redisson, which waits for the replicas that are available, a grant
//! then waits for the replicas there are (none: no `WAIT`), and survives only
//! if its primary does. The count comes from `ROLE` on the primary, asked at
//! most once a second per primary (per hash slot on a cluster).

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use ::redis::cluster_routing::Slot;
use ::redis::Value;
use tokio::time::Instant;

use super::node::Node;

/// How long a primary's replica count is trusted.
const FRESH: Duration = Duration::from_secs(1);

/// Replica counts of the primaries a client grants on.
#[derive(Default)]
pub(crate) struct Replicas {
    /// By slot on a cluster, under `None` otherwise: when asked, and the count.
    known: Mutex<HashMap<Option<Slot>, (Instant, u32)>>,
}

impl Replicas {
    /// How many replicas to `WAIT` for after a grant of `key` on `node`:
    /// `wanted`, or fewer when the primary has fewer connected. When the
    /// primary cannot be asked, `wanted` (the `WAIT` then tells).
    ///
    /// Cancel safety: safe; it only reads.
    pub async fn to_wait_for(&self, node: &Node, key: &str, wanted: u32) -> u32 {
        let slot = node.is_cluster().then(|| Slot::for_key(key));
        let now = Instant::now();
        if let Some(&(asked, count)) = self.known.lock().expect("replica counts").get(&slot) {
            if now.duration_since(asked) < FRESH {
                return wanted.min(count);
            }
        }
        let role = node
            .query_for_key::<Vec<Value>>(&::redis::cmd("ROLE"), key)
            .await;
        let count = match role.as_deref() {
            Ok([_, _, Value::Array(replicas), ..]) => replicas.len() as u32,
            Ok(_) | Err(_) => return wanted,
        };
        self.known
            .lock()
            .expect("replica counts")
            .insert(slot, (now, count));
        wanted.min(count)
    }
}
