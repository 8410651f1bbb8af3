//! The key layout: where contenders live, what their values say, and who holds.
//!
//! Pure functions, no I/O: the backend reads keys, this module decides.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use super::rpc::mvccpb::KeyValue;

use crate::backend::Mode;

/// First line of every value locksmith writes; anything else is a foreign key.
pub(crate) const MAGIC: &str = "locksmith/1";

/// The segment under a lock's prefix that holds readers (etcd's
/// `contrib/recipes/rwmutex.go`: `newUniqueEphemeralKey(s, pfx+"/read")`).
pub(crate) const READ: &str = "read";

/// The segment under which etcd's recipe RWMutex queues its writers
/// (`newUniqueEphemeralKey(s, pfx+"/write")`). locksmith never writes there (its
/// writers are Mutex keys), but treats such keys as exclusive contenders.
pub(crate) const WRITE: &str = "write";

/// `<namespace><name>/`: every contender of the lock `name` lives under it.
///
/// Same as Go's `concurrency.NewMutex(s, name)`, whose `pfx` is `name + "/"`.
pub(crate) fn lock_prefix(namespace: &str, name: &str) -> String {
    format!("{namespace}{name}/")
}

/// The key a hold of `mode` takes on `lease` (before any per-owner suffix).
///
/// Exclusive and semaphore holds: `<prefix><lease hex>`, exactly Go's
/// `fmt.Sprintf("%s%x", m.pfx, s.Lease())` in `concurrency/mutex.go`.
/// Shared holds: `<prefix>read/<lease hex>`, the recipe RWMutex reader prefix.
pub(crate) fn hold_key(prefix: &str, mode: Mode, lease: i64) -> String {
    match mode {
        Mode::Shared => format!("{prefix}{READ}/{lease:x}"),
        Mode::Exclusive | Mode::Semaphore { .. } => format!("{prefix}{lease:x}"),
    }
}

/// What locksmith stores in the value of each of its keys, for inspection and
/// for the semaphore permit check. Other clients ignore values (Go's Mutex puts
/// `""`), so this changes nothing about ordering.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Meta {
    /// The lock name (tells nested names apart, see [`classify`]).
    pub name: String,
    /// Owner id within the client.
    pub owner: String,
    /// How the key holds.
    pub mode: Mode,
    /// `client_name@host`.
    pub lock_by: String,
    /// When the acquire started, in milliseconds since the Unix epoch.
    pub since_ms: u64,
    /// Re-entry depth.
    pub count: u32,
}

impl Meta {
    /// The value bytes: `locksmith/1` then `field=value` lines, values escaped
    /// (`\\`, `\n`, `\r`).
    pub fn encode(&self) -> Vec<u8> {
        let mode = match self.mode {
            Mode::Exclusive => "exclusive".to_owned(),
            Mode::Shared => "shared".to_owned(),
            Mode::Semaphore { permits } => format!("semaphore/{permits}"),
        };
        format!(
            "{MAGIC}\nname={}\nowner={}\nmode={mode}\nby={}\nsince={}\ncount={}\n",
            escape(&self.name),
            escape(&self.owner),
            escape(&self.lock_by),
            self.since_ms,
            self.count
        )
        .into_bytes()
    }

    /// Parses a value written by [`Meta::encode`]; `None` for anything else.
    pub fn decode(value: &[u8]) -> Option<Meta> {
        let text = std::str::from_utf8(value).ok()?;
        let mut lines = text.lines();
        if lines.next()? != MAGIC {
            return None;
        }
        let (mut name, mut owner, mut mode, mut lock_by) = (None, None, None, None);
        let (mut since_ms, mut count) = (0, 1);
        for line in lines {
            let Some((field, raw)) = line.split_once('=') else {
                continue;
            };
            match field {
                "name" => name = Some(unescape(raw)),
                "owner" => owner = Some(unescape(raw)),
                "by" => lock_by = Some(unescape(raw)),
                "since" => since_ms = raw.parse().ok()?,
                "count" => count = raw.parse().ok()?,
                "mode" => {
                    mode = Some(match raw {
                        "exclusive" => Mode::Exclusive,
                        "shared" => Mode::Shared,
                        other => Mode::Semaphore {
                            permits: other.strip_prefix("semaphore/")?.parse().ok()?,
                        },
                    })
                }
                // Fields of later versions are skipped.
                _ => {}
            }
        }
        Some(Meta {
            name: name?,
            owner: owner?,
            mode: mode?,
            lock_by: lock_by.unwrap_or_default(),
            since_ms,
            count,
        })
    }

    /// `since_ms` as a wall-clock time.
    pub fn since(&self) -> SystemTime {
        UNIX_EPOCH + Duration::from_millis(self.since_ms)
    }
}

/// What a key holds: an election's value as it is, where Go's
/// `concurrency.Election` (and `etcdctl elect`) read a candidate's proposal;
/// locksmith's metadata for every other hold.
pub(crate) fn key_value(meta: &Meta, published: Option<&str>) -> Vec<u8> {
    match published {
        Some(value) => value.as_bytes().to_vec(),
        None => meta.encode(),
    }
}

/// Milliseconds since the Unix epoch, now.
pub(crate) fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

fn escape(value: &str) -> String {
    let mut out = String::with_capacity(value.len());
    for c in value.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            c => out.push(c),
        }
    }
    out
}

fn unescape(value: &str) -> String {
    let mut out = String::with_capacity(value.len());
    let mut chars = value.chars();
    while let Some(c) = chars.next() {
        if c != '\\' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('n') => out.push('\n'),
            Some('r') => out.push('\r'),
            Some(other) => out.push(other),
            None => out.push('\\'),
        }
    }
    out
}

/// One key that competes for a lock.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Contender {
    /// The full key.
    pub key: String,
    /// Its create revision: queue position and fencing token.
    pub create_revision: i64,
    /// The lease it is attached to (0: none).
    pub lease: i64,
    /// How it competes.
    pub mode: Mode,
    /// locksmith's metadata, `None` for keys of other clients.
    pub meta: Option<Meta>,
    /// The raw value (a Go election's proposal, for instance).
    pub value: Vec<u8>,
}

impl Contender {
    /// The owner as inspection shows it: locksmith's owner id, else the value
    /// a foreign client stored (a Go election's proposal), else the last key
    /// segment (the lease id in hex for Go's Mutex and `etcdctl lock`).
    pub fn owner(&self) -> String {
        if let Some(meta) = &self.meta {
            return meta.owner.clone();
        }
        match std::str::from_utf8(&self.value) {
            Ok(value) if !value.is_empty() => value.to_owned(),
            _ => self.key.rsplit('/').next().unwrap_or_default().to_owned(),
        }
    }
}

/// Decides whether `kv` (a key under `prefix`) competes for the lock `name`,
/// and how.
///
/// - A locksmith key (its value parses as [`Meta`]) competes iff its recorded
///   name is `name`, in its recorded mode. This keeps nested names apart: the
///   keys of lock `a/b` live under `a/` too, but are not contenders of `a`.
/// - A foreign key directly under the prefix (`<name>/<x>`) is an exclusive
///   contender: Go's `concurrency.Mutex`, `etcdctl lock` and Go's
///   `concurrency.Election` all put `<name>/<lease hex>` there.
/// - `<name>/read/<x>` is a reader and `<name>/write/<x>` a writer of etcd's
///   recipe RWMutex (`contrib/recipes/rwmutex.go`).
/// - Anything deeper belongs to a nested lock and is ignored.
pub(crate) fn classify(prefix: &str, name: &str, kv: &KeyValue) -> Option<Contender> {
    let key = std::str::from_utf8(&kv.key).ok()?;
    let rest = key.strip_prefix(prefix)?;
    let meta = Meta::decode(&kv.value);
    let mode = match &meta {
        Some(meta) if meta.name == name => meta.mode,
        Some(_) => return None,
        None => match rest.split_once('/') {
            None if !rest.is_empty() => Mode::Exclusive,
            Some((READ, tail)) if !tail.is_empty() && !tail.contains('/') => Mode::Shared,
            Some((WRITE, tail)) if !tail.is_empty() && !tail.contains('/') => Mode::Exclusive,
            _ => return None,
        },
    };
    Some(Contender {
        key: key.to_owned(),
        create_revision: kv.create_revision,
        lease: kv.lease,
        mode,
        meta,
        value: kv.value.clone(),
    })
}

/// The contenders of lock `name` among `kvs`, in queue (create revision) order.
pub(crate) fn contenders(prefix: &str, name: &str, kvs: &[KeyValue]) -> Vec<Contender> {
    let mut found: Vec<Contender> = kvs
        .iter()
        .filter_map(|kv| classify(prefix, name, kv))
        .collect();
    found.sort_by_key(|c| c.create_revision);
    found
}

/// The lock a key found while listing belongs to, if it looks like a lock key:
/// locksmith keys say so in their value; a foreign key counts when its last
/// segment is the hex id of the lease it is attached to (Go's Mutex, Election
/// and `etcdctl lock`). `namespace` is stripped.
pub(crate) fn listed_lock_name(namespace: &str, kv: &KeyValue) -> Option<String> {
    if let Some(meta) = Meta::decode(&kv.value) {
        return Some(meta.name);
    }
    let key = std::str::from_utf8(&kv.key).ok()?.strip_prefix(namespace)?;
    let (parent, last) = key.rsplit_once('/')?;
    (kv.lease != 0 && last == format!("{:x}", kv.lease) && !parent.is_empty())
        .then(|| parent.to_owned())
}

/// Where a contender stands in the queue.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Standing {
    /// It holds the lock.
    Holds,
    /// It waits for this key (the latest earlier contender it conflicts with,
    /// created at `revision`) to be deleted; etcd's `waitDeletes` picks the
    /// same key.
    WaitFor {
        /// The key.
        key: String,
        /// Its create revision.
        revision: i64,
    },
    /// It waits for any earlier contender to go (a full semaphore).
    WaitForAny,
}

/// The standing of a contender in `mode` with create revision `revision`,
/// given all contenders in queue order (`revision` itself need not be among
/// them). The rules match the lock model's: a contender holds when every
/// earlier one is compatible with it; shared holds share with earlier shared
/// ones, a semaphore of `n` admits the first `n` semaphore contenders, and
/// anything else waits for everyone before it (FIFO, writers not starved).
pub(crate) fn standing(contenders: &[Contender], revision: i64, mode: Mode) -> Standing {
    let earlier = contenders
        .iter()
        .take_while(|c| c.create_revision < revision);
    let earlier: Vec<&Contender> = earlier.collect();
    let last_conflicting = |ok: &dyn Fn(Mode) -> bool| {
        earlier
            .iter()
            .rev()
            .find(|c| !ok(c.mode))
            .map(|c| Standing::WaitFor {
                key: c.key.clone(),
                revision: c.create_revision,
            })
    };
    match mode {
        Mode::Exclusive => last_conflicting(&|_| false).unwrap_or(Standing::Holds),
        Mode::Shared => last_conflicting(&|m| m == Mode::Shared).unwrap_or(Standing::Holds),
        Mode::Semaphore { permits } => last_conflicting(&|m| matches!(m, Mode::Semaphore { .. }))
            .unwrap_or(if earlier.len() < permits as usize {
                Standing::Holds
            } else {
                Standing::WaitForAny
            }),
    }
}

/// The permit count another semaphore contender declared, if it differs from
/// `permits` (the model's permit mismatch, as kazoo checks it).
pub(crate) fn permit_mismatch(contenders: &[Contender], permits: u32) -> Option<u32> {
    contenders.iter().find_map(|c| match c.mode {
        Mode::Semaphore { permits: p } if p != permits => Some(p),
        _ => None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn wait_for(rev: i64) -> Standing {
        Standing::WaitFor {
            key: format!("l/{rev:x}"),
            revision: rev,
        }
    }

    fn contender(rev: i64, mode: Mode) -> Contender {
        Contender {
            key: format!("l/{rev:x}"),
            create_revision: rev,
            lease: rev,
            mode,
            meta: None,
            value: Vec::new(),
        }
    }

    #[test]
    fn meta_round_trips_with_awkward_text() {
        let meta = Meta {
            name: "orders/42".into(),
            owner: "line\nbreak\\slash\r=eq".into(),
            mode: Mode::Semaphore { permits: 7 },
            lock_by: "app[1]@host".into(),
            since_ms: 1_700_000_000_000,
            count: 3,
        };
        assert_eq!(Meta::decode(&meta.encode()), Some(meta));
        assert_eq!(Meta::decode(b""), None);
        assert_eq!(Meta::decode(b"leader-value"), None);
    }

    #[test]
    fn mutex_key_is_go_layout() {
        let prefix = lock_prefix("", "orders/42");
        assert_eq!(
            hold_key(&prefix, Mode::Exclusive, 0x694d_7a8b_1c2e_3f40),
            "orders/42/694d7a8b1c2e3f40"
        );
        assert_eq!(hold_key(&prefix, Mode::Shared, 0xabc), "orders/42/read/abc");
        assert_eq!(lock_prefix("ns/", "a"), "ns/a/");
    }

    #[test]
    fn exclusive_waits_for_latest_earlier() {
        let all = [
            contender(5, Mode::Shared),
            contender(7, Mode::Exclusive),
            contender(9, Mode::Exclusive),
        ];
        assert_eq!(standing(&all, 5, Mode::Shared), Standing::Holds);
        assert_eq!(standing(&all, 9, Mode::Exclusive), wait_for(7));
        assert_eq!(standing(&all[..0], 3, Mode::Exclusive), Standing::Holds);
    }

    #[test]
    fn readers_share_until_a_writer_queues() {
        let all = [
            contender(1, Mode::Shared),
            contender(2, Mode::Shared),
            contender(3, Mode::Exclusive),
            contender(4, Mode::Shared),
        ];
        assert_eq!(standing(&all, 2, Mode::Shared), Standing::Holds);
        assert_eq!(standing(&all, 3, Mode::Exclusive), wait_for(2));
        assert_eq!(standing(&all, 4, Mode::Shared), wait_for(3));
    }

    #[test]
    fn semaphore_admits_first_n() {
        let sem = Mode::Semaphore { permits: 2 };
        let all = [contender(1, sem), contender(2, sem), contender(3, sem)];
        assert_eq!(standing(&all, 2, sem), Standing::Holds);
        assert_eq!(standing(&all, 3, sem), Standing::WaitForAny);
        let mixed = [contender(1, Mode::Exclusive), contender(2, sem)];
        assert_eq!(standing(&mixed, 2, sem), wait_for(1));
        assert_eq!(permit_mismatch(&all, 2), None);
        assert_eq!(permit_mismatch(&all, 3), Some(2));
    }
}
