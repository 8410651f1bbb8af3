//! A stand-in for a Java service using Redisson: Redisson's own lock scripts,
//! run verbatim against Redis, so interoperability is tested without a JVM.
//!
//! Sources (github.com/redisson/redisson, `redisson/src/main/java/org/redisson/`):
//! `RedissonLock.tryLockInnerAsync` / `unlockInnerAsync` (the 3.x scripts) and
//! `RedissonReadLock.tryLockInnerAsync` / `unlockInnerAsync`.

use redis::aio::{ConnectionLike, MultiplexedConnection};
use redis::Script;

/// RedissonLock.tryLockInnerAsync: KEYS[1] lock; ARGV lease ms, lock name.
/// Answers nil when acquired, else the holder's PTTL.
const LOCK: &str = "if (redis.call('exists', KEYS[1]) == 0) then \
    redis.call('hset', KEYS[1], ARGV[2], 1); \
    redis.call('pexpire', KEYS[1], ARGV[1]); \
    return nil; \
end; \
if (redis.call('hexists', KEYS[1], ARGV[2]) == 1) then \
    redis.call('hincrby', KEYS[1], ARGV[2], 1); \
    redis.call('pexpire', KEYS[1], ARGV[1]); \
    return nil; \
end; \
return redis.call('pttl', KEYS[1]);";

/// RedissonLock.unlockInnerAsync: KEYS lock, channel; ARGV UNLOCK_MESSAGE,
/// lease ms, lock name, publish command (`getPublishCommand()`: SPUBLISH on a
/// cluster with sharded pub/sub).
const UNLOCK: &str = "if (redis.call('hexists', KEYS[1], ARGV[3]) == 0) then \
    return nil;\
end; \
local counter = redis.call('hincrby', KEYS[1], ARGV[3], -1); \
if (counter > 0) then \
    redis.call('pexpire', KEYS[1], ARGV[2]); \
    return 0; \
else \
    redis.call('del', KEYS[1]); \
    redis.call(ARGV[4], KEYS[2], ARGV[1]); \
    return 1; \
end; \
return nil;";

/// RedissonReadLock.tryLockInnerAsync: KEYS lock, timeout prefix; ARGV lease
/// ms, lock name, write lock name.
const READ_LOCK: &str = "local mode = redis.call('hget', KEYS[1], 'mode'); \
if (mode == false) then \
  redis.call('hset', KEYS[1], 'mode', 'read'); \
  redis.call('hset', KEYS[1], ARGV[2], 1); \
  redis.call('set', KEYS[2] .. ':1', 1); \
  redis.call('pexpire', KEYS[2] .. ':1', ARGV[1]); \
  redis.call('pexpire', KEYS[1], ARGV[1]); \
  return nil; \
end; \
if (mode == 'read') or (mode == 'write' and redis.call('hexists', KEYS[1], ARGV[3]) == 1) then \
  local ind = redis.call('hincrby', KEYS[1], ARGV[2], 1); \
  local key = KEYS[2] .. ':' .. ind;\
  redis.call('set', key, 1); \
  redis.call('pexpire', key, ARGV[1]); \
  local remainTime = redis.call('pttl', KEYS[1]); \
  redis.call('pexpire', KEYS[1], math.max(remainTime, ARGV[1])); \
  return nil; \
end;\
return redis.call('pttl', KEYS[1]);";

/// RedissonReadLock.unlockInnerAsync: KEYS lock, channel, timeout prefix, key
/// prefix, unlock latch; ARGV UNLOCK_MESSAGE, lock name, publish command,
/// latch timeout.
const READ_UNLOCK: &str = "local val = redis.call('get', KEYS[5]); \
if val ~= false then \
    return tonumber(val);\
end; \
local mode = redis.call('hget', KEYS[1], 'mode'); \
if (mode == false) then \
    redis.call(ARGV[3], KEYS[2], ARGV[1]); \
    redis.call('set', KEYS[5], 1, 'px', ARGV[4]); \
    return 1; \
end; \
local lockExists = redis.call('hexists', KEYS[1], ARGV[2]); \
if (lockExists == 0) then \
    return nil;\
end; \
local counter = redis.call('hincrby', KEYS[1], ARGV[2], -1); \
if (counter == 0) then \
    redis.call('hdel', KEYS[1], ARGV[2]); \
end;\
redis.call('del', KEYS[3] .. ':' .. (counter+1)); \
if (redis.call('hlen', KEYS[1]) > 1) then \
    local maxRemainTime = -3; \
    local keys = redis.call('hkeys', KEYS[1]); \
    for n, key in ipairs(keys) do \
        counter = tonumber(redis.call('hget', KEYS[1], key)); \
        if type(counter) == 'number' then \
            for i=counter, 1, -1 do \
                local remainTime = redis.call('pttl', KEYS[4] .. ':' .. key .. ':rwlock_timeout:' .. i); \
                maxRemainTime = math.max(remainTime, maxRemainTime);\
            end; \
        end; \
    end; \
    if maxRemainTime > 0 then \
        redis.call('pexpire', KEYS[1], maxRemainTime); \
        redis.call('set', KEYS[5], 0, 'px', ARGV[4]); \
        return 0; \
    end;\
    if mode == 'write' then \
        redis.call('set', KEYS[5], 0, 'px', ARGV[4]); \
        return 0;\
    end; \
end; \
redis.call('del', KEYS[1]); \
redis.call(ARGV[3], KEYS[2], ARGV[1]); \
redis.call('set', KEYS[5], 1, 'px', ARGV[4]); \
return 1; ";

/// A Redisson client: its connection manager id and one thread.
pub struct Redisson<C = MultiplexedConnection> {
    pub id: String,
    pub thread: u64,
    conn: C,
    /// `PUBLISH`, or `SPUBLISH` as Redisson publishes on a cluster with sharded
    /// pub/sub.
    publish: &'static str,
}

fn braced(name: &str) -> String {
    format!("{{{name}}}")
}

impl Redisson {
    pub fn new(conn: MultiplexedConnection) -> Redisson {
        Redisson::on(conn, "publish")
    }
}

impl<C: ConnectionLike + Send> Redisson<C> {
    /// A Redisson client on `conn` that publishes with `publish`.
    pub fn on(conn: C, publish: &'static str) -> Redisson<C> {
        Redisson {
            id: uuid::Uuid::new_v4().to_string(),
            thread: 1,
            conn,
            publish,
        }
    }

    /// `getLockName(threadId)`.
    pub fn lock_name(&self) -> String {
        format!("{}:{}", self.id, self.thread)
    }

    /// `RLock.tryLock(0, lease)`: None when acquired, else the holder's PTTL.
    pub async fn try_lock(&mut self, name: &str, lease_ms: u64) -> Option<i64> {
        Script::new(LOCK)
            .key(name)
            .arg(lease_ms)
            .arg(self.lock_name())
            .invoke_async(&mut self.conn)
            .await
            .unwrap()
    }

    /// `RLock.unlock()`: Some(1) released, Some(0) one level, None not held.
    pub async fn unlock(&mut self, name: &str) -> Option<i64> {
        Script::new(UNLOCK)
            .key(name)
            .key(format!("redisson_lock__channel:{}", braced(name)))
            .arg(0)
            .arg(30_000)
            .arg(self.lock_name())
            .arg(self.publish)
            .invoke_async(&mut self.conn)
            .await
            .unwrap()
    }

    fn timeout_prefix(&self, name: &str) -> String {
        format!("{}:{}:rwlock_timeout", braced(name), self.lock_name())
    }

    /// `RReadWriteLock.readLock().tryLock(0, lease)`.
    pub async fn try_read_lock(&mut self, name: &str, lease_ms: u64) -> Option<i64> {
        Script::new(READ_LOCK)
            .key(name)
            .key(self.timeout_prefix(name))
            .arg(lease_ms)
            .arg(self.lock_name())
            .arg(format!("{}:write", self.lock_name()))
            .invoke_async(&mut self.conn)
            .await
            .unwrap()
    }

    /// `RReadWriteLock.readLock().unlock()`.
    pub async fn read_unlock(&mut self, name: &str) -> Option<i64> {
        Script::new(READ_UNLOCK)
            .key(name)
            .key(format!("redisson_rwlock:{}", braced(name)))
            .key(self.timeout_prefix(name))
            .key(braced(name))
            .key(format!(
                "redisson_unlock_latch:{}:{}",
                braced(name),
                uuid::Uuid::new_v4().simple()
            ))
            .arg(0)
            .arg(self.lock_name())
            .arg(self.publish)
            .arg(10_000)
            .invoke_async(&mut self.conn)
            .await
            .unwrap()
    }
}
