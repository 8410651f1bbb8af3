//! Key, field and channel names: the exact names Redisson uses, so that Java
//! services with Redisson and Rust services with locksmith find the same locks.
//!
//! Sources (Redisson, `org.redisson`):
//!
//! * `RedissonObject.prefixName(prefix, name)`: `prefix:{name}`, or `prefix:name`
//!   when the name already contains `{` (a cluster hash tag);
//!   `suffixName(name, suffix)`: `{name}:suffix`, or `name:suffix`.
//! * `RedissonLock.getChannelName()`: `prefixName("redisson_lock__channel", name)`.
//! * `RedissonBaseLock.getLockName(threadId)`: `<client uuid>:<threadId>`, the hash
//!   field; locksmith puts the owner where Redisson puts the thread id.
//! * `RedissonFencedLock`: token counter `prefixName("redisson_lock_token", name)`.
//! * `RedissonFairLock`: queue `prefixName("redisson_lock_queue", name)`, deadlines
//!   `prefixName("redisson_lock_timeout", name)`, per-waiter channel
//!   `<lock channel>:<lock name>`.
//! * `RedissonReadLock` / `RedissonWriteLock`: channel `prefixName("redisson_rwlock",
//!   name)`; per read hold level `n` a key `suffixName(name, field) +
//!   ":rwlock_timeout:" + n`.
//! * `RedissonPermitExpirableSemaphore`: permits zset `suffixName(name, "timeout")`,
//!   channel `prefixName("redisson_sc", name)`.
//!
//! locksmith adds one key of its own, `prefixName("locksmith_meta", name)`, a hash
//! of holder metadata (token, lock time, lock_by) that Redisson ignores.

/// Concatenates without the formatting machinery (this runs per acquire).
fn concat(parts: &[&str]) -> String {
    let mut out = String::with_capacity(parts.iter().map(|p| p.len()).sum());
    for part in parts {
        out.push_str(part);
    }
    out
}

/// `prefix:{name}` (Redisson's `prefixName`).
pub(crate) fn prefix_name(prefix: &str, name: &str) -> String {
    if name.contains('{') {
        concat(&[prefix, ":", name])
    } else {
        concat(&[prefix, ":{", name, "}"])
    }
}

/// `{name}:suffix` (Redisson's `suffixName`).
pub(crate) fn suffix_name(name: &str, suffix: &str) -> String {
    if name.contains('{') {
        concat(&[name, ":", suffix])
    } else {
        concat(&["{", name, "}:", suffix])
    }
}

/// `<client id>:<owner>`, the holder id.
pub(crate) fn holder_id(client_id: &str, owner: &str) -> String {
    concat(&[client_id, ":", owner])
}

/// Every key and channel of one lock.
#[derive(Debug, Clone)]
pub(crate) struct Keys {
    /// The lock itself: the name (with the URL's prefix, if any).
    pub lock: String,
    /// The fencing token counter (never expires, so tokens never go back).
    pub token: String,
    /// locksmith's holder metadata hash.
    pub meta: String,
    /// Fair lock queue.
    pub queue: String,
    /// Fair lock queue deadlines.
    pub queue_deadlines: String,
    /// Release notifications of the lock (RLock channel).
    pub channel: String,
    /// Release notifications for Redisson read-write lock waiters.
    pub rw_channel: String,
    /// Semaphore permit holders by expiry.
    pub permits: String,
    /// Release notifications of the semaphore.
    pub sem_channel: String,
}

impl Keys {
    /// The keys of the lock stored under `key`.
    pub fn new(key: String) -> Keys {
        Keys {
            token: prefix_name("redisson_lock_token", &key),
            meta: prefix_name("locksmith_meta", &key),
            queue: prefix_name("redisson_lock_queue", &key),
            queue_deadlines: prefix_name("redisson_lock_timeout", &key),
            channel: prefix_name("redisson_lock__channel", &key),
            rw_channel: prefix_name("redisson_rwlock", &key),
            permits: suffix_name(&key, "timeout"),
            sem_channel: prefix_name("redisson_sc", &key),
            lock: key,
        }
    }

    /// Prefix of the per-level timeout keys of a read hold (Redisson
    /// `RedissonReadLock.getReadWriteTimeoutNamePrefix`).
    pub fn rw_timeout_prefix(&self, field: &str) -> String {
        let mut prefix = suffix_name(&self.lock, field);
        prefix.push_str(":rwlock_timeout");
        prefix
    }

    /// The part of [`Keys::rw_timeout_prefix`] before the field (Redisson
    /// `RedissonReadLock.getKeyPrefix`), used to find other readers' keys.
    pub fn rw_key_prefix(&self) -> String {
        if self.lock.contains('{') {
            self.lock.clone()
        } else {
            format!("{{{}}}", self.lock)
        }
    }

    /// The channel a fair-lock waiter listens on.
    pub fn waiter_channel(&self, field: &str) -> String {
        concat(&[&self.channel, ":", field])
    }
}

/// Whether a key is one of the helper keys above rather than a lock, for
/// listing.
pub(crate) fn is_helper_key(key: &str) -> bool {
    key.starts_with("redisson_")
        || key.starts_with("locksmith_meta:")
        || key.contains(":rwlock_timeout:")
        || (key.starts_with('{') && key.ends_with("}:timeout"))
}

/// The owner part of a holder id `<client uuid>:<owner>`; ids that do not look
/// like that (a redis-py token, another client's layout) are shown whole.
pub(crate) fn owner_of(field: &str) -> &str {
    match field.split_once(':') {
        Some((id, owner))
            if id.len() == 36 && id.bytes().all(|b| b.is_ascii_hexdigit() || b == b'-') =>
        {
            owner
        }
        _ => field,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn redisson_names() {
        let k = Keys::new("orders/42".into());
        assert_eq!(k.channel, "redisson_lock__channel:{orders/42}");
        assert_eq!(k.token, "redisson_lock_token:{orders/42}");
        assert_eq!(k.queue, "redisson_lock_queue:{orders/42}");
        assert_eq!(k.queue_deadlines, "redisson_lock_timeout:{orders/42}");
        assert_eq!(k.rw_channel, "redisson_rwlock:{orders/42}");
        assert_eq!(k.permits, "{orders/42}:timeout");
        assert_eq!(k.sem_channel, "redisson_sc:{orders/42}");
        assert_eq!(k.rw_timeout_prefix("u:1"), "{orders/42}:u:1:rwlock_timeout");
        assert_eq!(k.rw_key_prefix(), "{orders/42}");
        let tagged = Keys::new("a{b}".into());
        assert_eq!(tagged.channel, "redisson_lock__channel:a{b}");
        assert_eq!(tagged.permits, "a{b}:timeout");
    }

    #[test]
    fn owners_and_helper_keys() {
        let id = "0b5c1a4e-1c1f-4f31-9d57-1b2f1e0c7a11";
        assert_eq!(owner_of(&format!("{id}:worker:1")), "worker:1");
        assert_eq!(
            owner_of("9f86d081884c7d659a2feaa0c55ad015"),
            "9f86d081884c7d659a2feaa0c55ad015"
        );
        assert!(is_helper_key("redisson_lock_token:{x}"));
        assert!(is_helper_key("{x}:timeout"));
        assert!(is_helper_key("locksmith_meta:{x}"));
        assert!(!is_helper_key("orders/42"));
    }
}
