//! Idle sessions on Redis, which has none: a hold kept alive by a watchdog
//! instead, as Redisson and the `locksmith` Redis backend keep one. Each is
//! a key set with a TTL and renewed by a script that extends it only while
//! it still names its owner, many to a (multiplexed) connection.

use redis::aio::MultiplexedConnection;
use redis::Script;
use tokio::task::JoinSet;

use super::{keep, Plan, Renew, Shared};

/// Extends the key's TTL if it still holds the owner's value.
const RENEW: &str = r"
if redis.call('GET', KEYS[1]) == ARGV[1] then
    return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
";

/// Takes the plan's holds on the Redis at `url` and spawns their keepers.
///
/// Cancel safety: dropped, the holds taken so far live until their TTL.
pub(super) async fn open(
    url: &str,
    plan: &Plan,
    shared: &Shared,
    keepers: &mut JoinSet<Result<(), String>>,
) -> Result<(&'static str, usize), String> {
    let client = redis::Client::open(url).map_err(|e| e.to_string())?;
    let ttl_ms = plan.ttl.as_millis() as u64;
    let owner = uuid::Uuid::new_v4().to_string();
    let per_connection = plan.per_connection.max(1);
    let script = Script::new(RENEW);
    let mut opened = 0;
    while opened < plan.sessions {
        let connection = client
            .get_multiplexed_async_connection()
            .await
            .map_err(|e| format!("connect to {url}: {e}"))?;
        let here = per_connection.min(plan.sessions - opened);
        for index in opened..opened + here {
            let mut hold = Hold {
                key: format!("locksmith-lab:idle:{owner}:{index}"),
                owner: owner.clone(),
                ttl_ms,
                connection: connection.clone(),
                script: script.clone(),
            };
            let taken: Option<String> = redis::cmd("SET")
                .arg(&hold.key)
                .arg(&hold.owner)
                .arg("NX")
                .arg("PX")
                .arg(ttl_ms)
                .query_async(&mut hold.connection)
                .await
                .map_err(|e| format!("SET: {e}"))?;
            if taken.is_none() {
                return Err(format!("{} is taken", hold.key));
            }
            keepers.spawn(keep(hold, plan.ttl, plan.phase(index), shared.clone()));
        }
        opened += here;
    }
    Ok(("hold renewed by a watchdog script", per_connection))
}

/// One key held and renewed.
struct Hold {
    key: String,
    owner: String,
    ttl_ms: u64,
    connection: MultiplexedConnection,
    script: Script,
}

impl Renew for Hold {
    async fn renew(&mut self) -> Result<(), String> {
        let renewed: i64 = self
            .script
            .key(&self.key)
            .arg(&self.owner)
            .arg(self.ttl_ms)
            .invoke_async(&mut self.connection)
            .await
            .map_err(|e| format!("renew: {e}"))?;
        match renewed {
            1 => Ok(()),
            _ => Err(format!("{} was lost", self.key)),
        }
    }

    async fn close(mut self) {
        let _: Result<i64, _> = redis::cmd("DEL")
            .arg(&self.key)
            .query_async(&mut self.connection)
            .await;
    }
}
