//! The Lua scripts: every read-modify-write of a lock is one script, so it is
//! atomic on the Redis server.
//!
//! The texts are public so that other tools (and the benchmark) can run the
//! very same scripts. Each is wrapped in a [`::redis::Script`]: its SHA1 is computed once, calls go out
//! as `EVALSHA`, and a `NOSCRIPT` reply (a restarted or flushed server) loads the
//! text and retries. The layouts they maintain are described in the module docs
//! of [`super`]; the comments here say where each Redisson rule comes from.
//!
//! Conventions shared by all scripts:
//!
//! * Time is Redis's own (`TIME`), never the client's, so clock skew between
//!   clients cannot expire or reorder anything.
//! * Re-entry is decided by the client's model layer, never here: an acquire
//!   always asks for a new hold, and a holder's entry found under the
//!   acquiring holder id is a leftover of a hold this client no longer has
//!   (a release that never reached this node, a hold it gave up as lost),
//!   which the acquire clears first, as a release would. The re-entry depth
//!   is written by the client ([`SET_COUNT`]) where the layouts keep one, so
//!   inspection, and Redisson, read what the client counts.
//! * Acquire scripts answer `{status, value, extra}`:
//!   `1` granted (value = fencing token, or with deferred fencing extra = the
//!   current token counter), `0` busy (value = how long the current hold
//!   still lasts in ms, negative if unknown), `-3` semaphore permit mismatch
//!   (value = the permits the holders agreed on).
//! * Release scripts release the whole hold and answer `1` released, `-1` not
//!   held by anyone, `-2` held by someone else (or by a newer hold of the
//!   same holder id: a release names its hold's token, when it knows it).
//! * Holder metadata lives in the side hash `locksmith_meta:{name}`, field = the
//!   holder id, value = `"<token> <lock time ms> <count> <lock_by>"` (the count is
//!   authoritative only where the lock key itself cannot carry one: semaphores
//!   and simple mode).

use ::redis::Script;

use crate::leaked::Leaked;

/// Helpers prepended to every script that needs them.
macro_rules! prelude {
    () => {
        r#"
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
local function fmt(n)
  return string.format('%.0f', n)
end
-- PUBLISH; SPUBLISH in the scripts for a Redis Cluster (every channel of a
-- lock shares its slot, so it lives on the lock's own shard).
local function publish(chan, msg)
  return redis.call('PUBLISH', chan, msg)
end
local function key_type(key)
  return redis.call('TYPE', key)['ok']
end
-- Raises a key's TTL to at least `ms` (never shortens it).
local function extend_to(key, ms)
  if redis.call('PTTL', key) < ms then
    redis.call('PEXPIRE', key, ms)
  end
end
local function meta_get(meta, field)
  local v = redis.call('HGET', meta, field)
  if not v then return nil end
  local tok, at, count, by = string.match(v, '^(%d+) (%d+) (%d+) (.*)$')
  if not tok then return nil end
  return {tok, at, tonumber(count), by}
end
local function meta_put(meta, field, m, lease, sole)
  redis.call('HSET', meta, field, m[1] .. ' ' .. m[2] .. ' ' .. fmt(m[3]) .. ' ' .. m[4])
  if sole then
    -- An exclusive holder is the only live entry: its lease is the hash's.
    redis.call('PEXPIRE', meta, lease)
  else
    extend_to(meta, lease)
  end
end
local function meta_drop(meta, field)
  redis.call('HDEL', meta, field)
  if redis.call('HLEN', meta) == 0 then
    redis.call('DEL', meta)
  end
end
-- Whether the holder's entry is the hold with `token` ('': not checked; a
-- token of '0' is a Redlock grant this node never saw fenced).
local function meta_owns(meta, field, token)
  if token == '' then return true end
  local m = meta_get(meta, field)
  return (not m) or m[1] == '0' or m[1] == token
end
-- A free->held transition: the next fencing token (Redisson RFencedLock: INCR of
-- redisson_lock_token:{name}) and the holder's metadata. With `defer` (Redlock),
-- the token is decided by a quorum afterwards; the current counter is returned.
local function grant_new(token_key, meta, field, now, lock_by, lease, defer, sole)
  if defer then
    local cur = tonumber(redis.call('GET', token_key) or '0') or 0
    meta_put(meta, field, {'0', fmt(now), 1, lock_by}, lease, sole)
    return {1, 0, cur}
  end
  local tok = redis.call('INCR', token_key)
  meta_put(meta, field, {fmt(tok), fmt(now), 1, lock_by}, lease, sole)
  return {1, tok, 0}
end
-- Fair queue (Redisson RFairLock layout): list redisson_lock_queue:{name} in
-- arrival order and zset redisson_lock_timeout:{name} of deadlines. Deadlines
-- come from Redis TIME and are refreshed by each live waiter, so a crashed
-- waiter drops out once its deadline passes.
local function purge_queue(q, qt, now)
  local stale = redis.call('ZRANGEBYSCORE', qt, '-inf', now)
  for _, id in ipairs(stale) do
    redis.call('ZREM', qt, id)
    redis.call('LREM', q, 0, id)
  end
end
local function queue_head(q, qt)
  while true do
    local head = redis.call('LINDEX', q, 0)
    if not head then return false end
    if redis.call('ZSCORE', qt, head) then return head end
    redis.call('LPOP', q)
  end
end
local function queue_allows(q, qt, id)
  local head = queue_head(q, qt)
  return (not head) or head == id
end
local function leave_queue(q, qt, id)
  redis.call('ZREM', qt, id)
  redis.call('LREM', q, 0, id)
end
local function join_queue(q, qt, id, deadline, ttl)
  if redis.call('ZADD', qt, deadline, id) == 1 or not redis.call('LPOS', q, id) then
    redis.call('RPUSH', q, id)
  end
  extend_to(q, ttl)
  extend_to(qt, ttl)
end
-- How long until the first waiter's deadline (when the lock is free but it is
-- somebody else's turn), -1 without a queue.
local function queue_hint(q, qt, now)
  local head = queue_head(q, qt)
  if not head then return -1 end
  return math.max(tonumber(redis.call('ZSCORE', qt, head)) - now, 0)
end
-- Wakes the first waiter in the queue on its own channel (Redisson RFairLock:
-- publish on redisson_lock__channel:{name}:<id>); false when nobody queues.
local function wake_head(q, qt, chan)
  local head = queue_head(q, qt)
  if head then
    publish(chan .. ':' .. head, '0')
    return true
  end
  return false
end
"#
    };
}

/// Exclusive (Redisson RLock layout plus a `mode` = `write` marker) and shared
/// (Redisson RReadWriteLock read side) acquire, plain or fair.
///
/// KEYS: lock, token, meta, queue, queue deadlines, lock channel.
/// ARGV: field, lease ms, lock_by, fair, wait, waiter ttl ms, defer token,
/// mode (`x` | `s`), read-hold timeout prefix.
pub const ACQUIRE_HASH: &str = concat!(
    prelude!(),
    r#"
local lock, token_key, meta, q, qt, chan = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6]
local field, lease, lock_by = ARGV[1], tonumber(ARGV[2]), ARGV[3]
local fair, wait, waiter_ttl, defer = ARGV[4] == '1', ARGV[5] == '1', tonumber(ARGV[6]), ARGV[7] == '1'
local shared, rw_prefix = ARGV[8] == 's', ARGV[9]
local now = now_ms()
local kind = key_type(lock)
local admit = false
if kind == 'hash' then
  local levels = tonumber(redis.call('HGET', lock, field))
  if levels then
    -- A leftover of this holder id (see the module docs): cleared first.
    for i = 1, levels do redis.call('DEL', rw_prefix .. ':' .. i) end
    redis.call('HDEL', lock, field)
    meta_drop(meta, field)
    if redis.call('HLEN', lock) <= 1 then
      redis.call('DEL', lock)
      kind = 'none'
    end
  end
end
if kind == 'hash' then
  admit = shared and redis.call('HGET', lock, 'mode') == 'read'
elseif kind == 'none' then
  admit = true
end
if admit and fair then
  purge_queue(q, qt, now)
  admit = queue_allows(q, qt, field)
end
if admit then
  if fair then leave_queue(q, qt, field) end
  if shared then
    redis.call('HSET', lock, 'mode', 'read', field, 1)
    redis.call('SET', rw_prefix .. ':1', 1, 'PX', lease)
  else
    redis.call('HSET', lock, field, 1, 'mode', 'write')
  end
  if kind == 'none' then
    redis.call('PEXPIRE', lock, lease)
  else
    extend_to(lock, lease)
  end
  local granted = grant_new(token_key, meta, field, now, lock_by, lease, defer, not shared)
  if fair and shared then wake_head(q, qt, chan) end
  return granted
end
if fair and wait then
  purge_queue(q, qt, now)
  join_queue(q, qt, field, now + waiter_ttl, waiter_ttl)
end
local hint = redis.call('PTTL', lock)
if hint < 0 and fair then hint = queue_hint(q, qt, now) end
return {0, hint, 0}
"#
);

/// Release of an exclusive or shared hold (Redisson RLock / RReadLock unlock).
///
/// KEYS: lock, meta, queue, queue deadlines, lock channel, rw channel.
/// ARGV: field, fair, mode (`x` | `s`), read-hold timeout prefix, read-hold key
/// prefix, the hold's token (`''`: not checked).
pub const RELEASE_HASH: &str = concat!(
    prelude!(),
    r#"
local lock, meta, q, qt, chan, rw_chan = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6]
local field, fair, shared = ARGV[1], ARGV[2] == '1', ARGV[3] == 's'
local rw_prefix, key_prefix, token = ARGV[4], ARGV[5], ARGV[6]
local kind = key_type(lock)
if kind == 'none' then return -1 end
if kind ~= 'hash' then return -2 end
local count = tonumber(redis.call('HGET', lock, field))
if not count then return -2 end
if not meta_owns(meta, field, token) then return -2 end
local mode = false
if shared then
  mode = redis.call('HGET', lock, 'mode')
  if mode ~= 'read' then return -2 end
  for i = 1, count do redis.call('DEL', rw_prefix .. ':' .. i) end
end
if shared then
  redis.call('HDEL', lock, field)
  meta_drop(meta, field)
else
  -- The exclusive holder was the only one: its metadata goes with it.
  redis.call('DEL', meta)
end
if shared and redis.call('HLEN', lock) > 1 then
  -- Other readers remain: Redisson's read unlock keeps the hash alive as long as
  -- the longest remaining read-hold timeout key.
  local longest = -3
  for _, f in ipairs(redis.call('HKEYS', lock)) do
    local c = tonumber(redis.call('HGET', lock, f))
    if c then
      for i = c, 1, -1 do
        longest = math.max(longest, redis.call('PTTL', key_prefix .. ':' .. f .. ':rwlock_timeout:' .. i))
      end
    end
  end
  if longest > 0 then
    redis.call('PEXPIRE', lock, longest)
    return 1
  end
  if mode == 'write' then return 1 end
end
-- Nobody holds it any more: stale metadata of expired holders goes too.
redis.call('DEL', lock, meta)
local woke = false
if fair then
  purge_queue(q, qt, now_ms())
  woke = wake_head(q, qt, chan)
end
-- Redisson LockPubSub: UNLOCK_MESSAGE = 0, READ_UNLOCK_MESSAGE = 1. RLock
-- waiters listen on redisson_lock__channel:{name}; RReadWriteLock waiters on
-- redisson_rwlock:{name}, where a write unlock sends 1 and a read unlock 0.
if not woke then publish(chan, '0') end
if shared then
  publish(rw_chan, '0')
else
  publish(rw_chan, '1')
end
return 1
"#
);

/// Simple mode acquire: `SET name <holder id> NX PX <lease>`, the key layout of
/// redis-py's `Lock` and the textbook recipe, plus the fencing token.
///
/// KEYS: lock, token, meta. ARGV: field, lease ms, lock_by, defer.
pub const ACQUIRE_SIMPLE: &str = concat!(
    prelude!(),
    r#"
local lock, token_key, meta = KEYS[1], KEYS[2], KEYS[3]
local field, lease, lock_by, defer = ARGV[1], tonumber(ARGV[2]), ARGV[3], ARGV[4] == '1'
local kind = key_type(lock)
if kind == 'string' and redis.call('GET', lock) == field then
  -- A leftover of this holder id (see the module docs): cleared first.
  redis.call('DEL', lock)
  meta_drop(meta, field)
  kind = 'none'
end
if kind ~= 'none' then
  return {0, redis.call('PTTL', lock), 0}
end
redis.call('SET', lock, field, 'PX', lease)
return grant_new(token_key, meta, field, now_ms(), lock_by, lease, defer, true)
"#
);

/// Simple mode release: compare-and-delete (redis-py's `LUA_RELEASE_SCRIPT`).
///
/// KEYS: lock, meta, lock channel. ARGV: field, the hold's token (`''`: not
/// checked).
pub const RELEASE_SIMPLE: &str = concat!(
    prelude!(),
    r#"
local lock, meta, chan = KEYS[1], KEYS[2], KEYS[3]
local field, token = ARGV[1], ARGV[2]
local kind = key_type(lock)
if kind == 'none' then return -1 end
if kind ~= 'string' or redis.call('GET', lock) ~= field then return -2 end
if not meta_owns(meta, field, token) then return -2 end
redis.call('DEL', lock)
meta_drop(meta, field)
publish(chan, '0')
return 1
"#
);

/// Semaphore acquire on Redisson's RPermitExpirableSemaphore layout: the lock
/// key holds the number of available permits, zset `{name}:timeout` the
/// holders scored by expiry (Redis TIME based), purged here, so a crashed
/// holder's permit comes back when its lease ends.
///
/// KEYS: available, permits zset, token, meta, queue, queue deadlines, lock
/// channel, semaphore channel.
/// ARGV: field, lease ms, lock_by, fair, wait, waiter ttl ms, defer token,
/// permits.
pub const ACQUIRE_SEMAPHORE: &str = concat!(
    prelude!(),
    r#"
local avail_key, zs, token_key, meta = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local q, qt, chan, sem_chan = KEYS[5], KEYS[6], KEYS[7], KEYS[8]
local field, lease, lock_by = ARGV[1], tonumber(ARGV[2]), ARGV[3]
local fair, wait, waiter_ttl, defer = ARGV[4] == '1', ARGV[5] == '1', tonumber(ARGV[6]), ARGV[7] == '1'
local permits = tonumber(ARGV[8])
local now = now_ms()
local kind = key_type(avail_key)
local zkind = key_type(zs)
local avail = nil
if kind == 'string' then avail = tonumber(redis.call('GET', avail_key)) end
if (kind ~= 'none' and avail == nil) or (zkind ~= 'none' and zkind ~= 'zset') then
  -- Another kind of lock lives under this name.
  return {0, redis.call('PTTL', avail_key), 0}
end
-- Expired permits come back (Redisson: zrangebyscore 0 now, zrem, incrby),
-- and so does a leftover of this holder id (see the module docs).
local expired = redis.call('ZRANGEBYSCORE', zs, '-inf', now)
local mine = redis.call('ZSCORE', zs, field)
if mine and tonumber(mine) > now then table.insert(expired, field) end
if #expired > 0 then
  for _, id in ipairs(expired) do
    redis.call('ZREM', zs, id)
    redis.call('HDEL', meta, id)
  end
  if avail then
    avail = redis.call('INCRBY', avail_key, #expired)
    publish(sem_chan, avail)
  end
end
local held = redis.call('ZCARD', zs)
if avail == nil or held == 0 then
  -- First use, or nobody holds: the permits named now define the semaphore.
  avail = math.max(permits - held, 0)
  redis.call('SET', avail_key, avail)
end
if avail + held ~= permits then
  return {-3, avail + held, 0}
end
local admit = avail >= 1
if admit and fair then
  purge_queue(q, qt, now)
  admit = queue_allows(q, qt, field)
end
if admit then
  if fair then leave_queue(q, qt, field) end
  redis.call('DECRBY', avail_key, 1)
  redis.call('ZADD', zs, now + lease, field)
  local granted = grant_new(token_key, meta, field, now, lock_by, lease, defer, false)
  if fair then wake_head(q, qt, chan) end
  return granted
end
if fair and wait then
  purge_queue(q, qt, now)
  join_queue(q, qt, field, now + waiter_ttl, waiter_ttl)
end
local hint = -1
if avail >= 1 and fair then
  hint = queue_hint(q, qt, now)
else
  local first = redis.call('ZRANGE', zs, 0, 0, 'WITHSCORES')
  if first[2] then hint = tonumber(first[2]) - now end
end
return {0, hint, 0}
"#
);

/// Semaphore release (Redisson's tryRelease: zrem, incrby, publish the count).
///
/// KEYS: available, permits zset, meta, queue, queue deadlines, lock channel,
/// semaphore channel. ARGV: field, fair, permits, the hold's token (`''`: not
/// checked).
pub const RELEASE_SEMAPHORE: &str = concat!(
    prelude!(),
    r#"
local avail_key, zs, meta, q, qt, chan, sem_chan = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6], KEYS[7]
local field, fair, permits, token = ARGV[1], ARGV[2] == '1', tonumber(ARGV[3]), ARGV[4]
local now = now_ms()
local score = redis.call('ZSCORE', zs, field)
if (not score) or tonumber(score) <= now then
  if score then
    redis.call('ZREM', zs, field)
    meta_drop(meta, field)
    redis.call('INCRBY', avail_key, 1)
  end
  if redis.call('ZCARD', zs) > 0 then return -2 end
  return -1
end
if not meta_owns(meta, field, token) then return -2 end
redis.call('ZREM', zs, field)
meta_drop(meta, field)
local avail
if key_type(avail_key) == 'string' then
  avail = redis.call('INCRBY', avail_key, 1)
else
  avail = math.max(permits - redis.call('ZCARD', zs), 0)
  redis.call('SET', avail_key, avail)
end
local woke = false
if fair then
  purge_queue(q, qt, now)
  woke = wake_head(q, qt, chan)
end
if not woke then publish(sem_chan, avail) end
return 1
"#
);

/// Renews (or only checks) up to 100 holds in one call: the watchdog's batch
/// (Redisson renews up to 100 locks per EVAL). Answers 1 (held) or 0 (gone) per
/// entry.
///
/// KEYS: per entry lock, meta, permits zset.
/// ARGV: count, then per entry kind (`x`, `s`, `m`, `p`), field, lease ms (0:
/// check only), exact (`1`: set the TTL to the lease, `0`: only raise it),
/// read-hold timeout prefix.
pub const RENEW: &str = concat!(
    prelude!(),
    r#"
local now = now_ms()
local out = {}
local function set_ttl(key, ms, exact)
  if exact then redis.call('PEXPIRE', key, ms) else extend_to(key, ms) end
end
for i = 1, tonumber(ARGV[1]) do
  local lock, meta, zs = KEYS[3 * i - 2], KEYS[3 * i - 1], KEYS[3 * i]
  local b = 5 * (i - 1) + 1
  local kind, field, lease, exact, rw_prefix = ARGV[b + 1], ARGV[b + 2], tonumber(ARGV[b + 3]), ARGV[b + 4] == '1', ARGV[b + 5]
  local held = 0
  if kind == 'x' or kind == 's' then
    if key_type(lock) == 'hash' then
      local count = tonumber(redis.call('HGET', lock, field))
      local reading = redis.call('HGET', lock, 'mode') == 'read'
      if count and reading == (kind == 's') then
        held = 1
        if lease > 0 then
          set_ttl(lock, lease, exact and kind == 'x')
          if kind == 's' then
            for n = 1, count do redis.call('PEXPIRE', rw_prefix .. ':' .. n, lease) end
          end
        end
      end
    end
  elseif kind == 'p' then
    if key_type(lock) == 'string' and redis.call('GET', lock) == field then
      held = 1
      if lease > 0 then set_ttl(lock, lease, exact) end
    end
  elseif kind == 'm' then
    local score = redis.call('ZSCORE', zs, field)
    if score and tonumber(score) > now then
      held = 1
      if lease > 0 and (exact or tonumber(score) < now + lease) then
        redis.call('ZADD', zs, now + lease, field)
      end
    end
  end
  if held == 1 and lease > 0 then set_ttl(meta, lease, false) end
  out[i] = held
end
return out
"#
);

/// Records a hold's re-entry depth, as the client's model layer counts it,
/// where the layouts keep one: the hash field of Redisson's RLock and read
/// lock (for a read lock also one timeout key per level, as Redisson keeps
/// them, with the first level's TTL) and the metadata's count. Answers 1
/// when recorded, 0 when the hold is gone, -2 when the holder id has a newer
/// hold.
///
/// KEYS: lock, meta, permits zset.
/// ARGV: kind (`x`, `s`, `p`, `m`), field, count, the hold's token (`''`:
/// not checked), read-hold timeout prefix.
pub const SET_COUNT: &str = concat!(
    prelude!(),
    r#"
local lock, meta, zs = KEYS[1], KEYS[2], KEYS[3]
local kind, field, count, token, rw_prefix = ARGV[1], ARGV[2], tonumber(ARGV[3]), ARGV[4], ARGV[5]
local held = false
if kind == 'x' or kind == 's' then
  held = key_type(lock) == 'hash' and tonumber(redis.call('HGET', lock, field))
elseif kind == 'p' then
  held = key_type(lock) == 'string' and redis.call('GET', lock) == field
elseif kind == 'm' then
  held = redis.call('ZSCORE', zs, field)
end
if not held then return 0 end
if not meta_owns(meta, field, token) then return -2 end
if kind == 'x' or kind == 's' then
  redis.call('HSET', lock, field, count)
  if kind == 's' then
    local ttl = redis.call('PTTL', rw_prefix .. ':1')
    if ttl <= 0 then ttl = redis.call('PTTL', lock) end
    for i = held + 1, count do
      if ttl > 0 then
        redis.call('SET', rw_prefix .. ':' .. i, 1, 'PX', ttl)
      else
        redis.call('SET', rw_prefix .. ':' .. i, 1)
      end
    end
    for i = count + 1, held do redis.call('DEL', rw_prefix .. ':' .. i) end
  end
end
local m = meta_get(meta, field)
if m then
  redis.call('HSET', meta, field, m[1] .. ' ' .. m[2] .. ' ' .. fmt(count) .. ' ' .. m[4])
end
return 1
"#
);

/// Leaves the fair queue (a cancelled waiter) and wakes the new head if the
/// leaver was first.
///
/// KEYS: queue, queue deadlines, lock channel. ARGV: field.
pub const LEAVE_QUEUE: &str = concat!(
    prelude!(),
    r#"
local q, qt, chan, field = KEYS[1], KEYS[2], KEYS[3], ARGV[1]
local was_head = redis.call('LINDEX', q, 0) == field
leave_queue(q, qt, field)
if was_head then wake_head(q, qt, chan) end
return 1
"#
);

/// Redlock fencing, second phase: stores `v` as the token counter and the
/// holder's token if the counter is below `v`; answers -1 when stored,
/// otherwise the (higher) counter found.
///
/// KEYS: token, meta. ARGV: v, field, lease ms.
pub const FENCE: &str = concat!(
    prelude!(),
    r#"
local token_key, meta = KEYS[1], KEYS[2]
local v, field, lease = tonumber(ARGV[1]), ARGV[2], tonumber(ARGV[3])
local cur = tonumber(redis.call('GET', token_key) or '0') or 0
if cur >= v then return cur end
redis.call('SET', token_key, fmt(v))
local m = meta_get(meta, field)
if m then
  m[1] = fmt(v)
  meta_put(meta, field, m, lease)
end
return -1
"#
);

/// Everything inspection needs about one name, read atomically.
///
/// KEYS: lock, meta, queue, queue deadlines, permits zset.
/// Answers {type, pttl, now, body, meta, queue, deadlines, permits}.
pub const DESCRIBE: &str = concat!(
    prelude!(),
    r#"
local lock, meta, q, qt, zs = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local now = now_ms()
local kind = key_type(lock)
local body = {}
if kind == 'hash' then
  body = redis.call('HGETALL', lock)
elseif kind == 'string' then
  body = {redis.call('GET', lock)}
end
local m = {}
if key_type(meta) == 'hash' then m = redis.call('HGETALL', meta) end
local queue, deadlines, permits = {}, {}, {}
if key_type(q) == 'list' then queue = redis.call('LRANGE', q, 0, -1) end
if key_type(qt) == 'zset' then deadlines = redis.call('ZRANGEBYSCORE', qt, now + 1, '+inf', 'WITHSCORES') end
if key_type(zs) == 'zset' then permits = redis.call('ZRANGEBYSCORE', zs, now + 1, '+inf', 'WITHSCORES') end
return {kind, redis.call('PTTL', lock), now, body, m, queue, deadlines, permits}
"#
);

/// Administrator release: drops every hold of a name, whatever its layout, and
/// wakes every kind of waiter. Fencing counters and the fair queue stay.
///
/// KEYS: lock, meta, permits zset, lock channel, rw channel, semaphore channel,
/// queue, queue deadlines.
pub const FORCE_RELEASE: &str = concat!(
    prelude!(),
    r#"
local lock, meta, zs, chan, rw_chan, sem_chan, q, qt = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6], KEYS[7], KEYS[8]
local existed = redis.call('DEL', lock, meta, zs)
wake_head(q, qt, chan)
publish(chan, '1')
publish(rw_chan, '1')
publish(sem_chan, '1')
return existed
"#
);

/// The scripts, compiled (their SHA1 computed once).
pub(crate) struct Scripts {
    pub acquire_hash: Script,
    pub release_hash: Script,
    pub acquire_simple: Script,
    pub release_simple: Script,
    pub acquire_semaphore: Script,
    pub release_semaphore: Script,
    pub renew: Script,
    pub set_count: Script,
    pub leave_queue: Script,
    pub fence: Script,
    pub describe: Script,
    pub force_release: Script,
}

/// The publish call of the prelude, and its sharded form.
const PUBLISH: &str = "redis.call('PUBLISH', chan, msg)";
const SPUBLISH: &str = "redis.call('SPUBLISH', chan, msg)";

/// The scripts with `PUBLISH`, hashed once per process. Made without a lock
/// (a `LazyLock` is one while it is made): a forked child must not wait for
/// a thread of its parent that was making them at the fork.
static PLAIN: Leaked<Scripts> = Leaked::new();
/// The scripts with `SPUBLISH` (Redis Cluster 7+), as [`PLAIN`].
static SHARDED: Leaked<Scripts> = Leaked::new();

/// The scripts that publish with `SPUBLISH` when `sharded`, else `PUBLISH`.
pub(crate) fn scripts(sharded: bool) -> &'static Scripts {
    if sharded {
        SHARDED.get_or_make(|| Scripts::new(true))
    } else {
        PLAIN.get_or_make(|| Scripts::new(false))
    }
}

impl Scripts {
    fn new(sharded: bool) -> Scripts {
        let script = |text: &str| {
            if sharded {
                Script::new(&text.replace(PUBLISH, SPUBLISH))
            } else {
                Script::new(text)
            }
        };
        Scripts {
            acquire_hash: script(ACQUIRE_HASH),
            release_hash: script(RELEASE_HASH),
            acquire_simple: script(ACQUIRE_SIMPLE),
            release_simple: script(RELEASE_SIMPLE),
            acquire_semaphore: script(ACQUIRE_SEMAPHORE),
            release_semaphore: script(RELEASE_SEMAPHORE),
            renew: script(RENEW),
            set_count: script(SET_COUNT),
            leave_queue: script(LEAVE_QUEUE),
            fence: script(FENCE),
            describe: script(DESCRIBE),
            force_release: script(FORCE_RELEASE),
        }
    }

    /// Every script, for loading them up front.
    pub fn all(&self) -> [&Script; 12] {
        [
            &self.acquire_hash,
            &self.release_hash,
            &self.acquire_simple,
            &self.release_simple,
            &self.acquire_semaphore,
            &self.release_semaphore,
            &self.renew,
            &self.set_count,
            &self.leave_queue,
            &self.fence,
            &self.describe,
            &self.force_release,
        ]
    }
}
