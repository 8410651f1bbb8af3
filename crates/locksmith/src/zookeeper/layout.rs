//! Node names and queue rules: the Curator layouts as pure functions.
//!
//! Everything here is deterministic and free of I/O, so the rules that decide
//! who holds a lock are unit tested without a server. The sources of every name
//! are given next to it.

use locksmith_core::Mode;

/// Prefix of a *protected* node name: `_c_<uuid>-`. Curator's
/// `ProtectedUtils.PROTECTED_PREFIX` (`"_c_"`) followed by the canonical 36
/// character UUID and `PROTECTED_SEPARATOR` (`'-'`)
/// (curator-framework `org/apache/curator/framework/imps/ProtectedUtils.java`).
/// The UUID lets a client find its own node after a connection loss during the
/// create, instead of creating a second one.
pub(crate) const PROTECTED_PREFIX: &str = "_c_";

/// Node name of an exclusive lock contender: `InterProcessMutex.LOCK_NAME`
/// (curator-recipes `locks/InterProcessMutex.java`).
pub(crate) const MUTEX_NAME: &str = "lock-";
/// Node name of a reader: `InterProcessReadWriteLock.READ_LOCK_NAME`
/// (curator-recipes `locks/InterProcessReadWriteLock.java`).
pub(crate) const READ_NAME: &str = "__READ__";
/// Node name of a writer: `InterProcessReadWriteLock.WRITE_LOCK_NAME`.
pub(crate) const WRITE_NAME: &str = "__WRIT__";
/// Node name of a kazoo reader: `kazoo.recipe.lock.ReadLock._NODE_NAME`. kazoo's
/// `Lock` and `WriteLock` use `__lock__` (`Lock._NODE_NAME`), which this module
/// treats like any other exclusive contender.
pub(crate) const KAZOO_READ_NAME: &str = "__rlock__";

/// Node name of a kazoo `Lock` contender, which kazoo's `Election` is:
/// `kazoo.recipe.lock.Lock._NODE_NAME`, after a prefix of `uuid4().hex`.
pub(crate) const KAZOO_LOCK_NAME: &str = "__lock__";

/// Child of a semaphore path holding the entry mutex:
/// `InterProcessSemaphoreV2.LOCK_PARENT` (curator-recipes
/// `locks/InterProcessSemaphoreV2.java`).
pub(crate) const SEMAPHORE_LOCKS: &str = "locks";
/// Child of a semaphore path holding one node per lease:
/// `InterProcessSemaphoreV2.LEASE_PARENT`.
pub(crate) const SEMAPHORE_LEASES: &str = "leases";
/// Node name of a lease: `InterProcessSemaphoreV2.LEASE_BASE_NAME`.
pub(crate) const LEASE_NAME: &str = "lease-";

/// Digits ZooKeeper appends to a sequential node: `%010d` of the parent's
/// child version (ZooKeeper `PrepRequestProcessor`), one counter per parent, so
/// every contender under a lock path, whichever client made it, is ordered by
/// these digits.
const SEQUENCE_DIGITS: usize = 10;

/// The ZooKeeper path of a lock name: `/` + name (under the URL's chroot).
pub(crate) fn lock_path(name: &str) -> String {
    format!("/{name}")
}

/// `parent/child`, for a parent that may be the root.
pub(crate) fn child_path(parent: &str, child: &str) -> String {
    if parent == "/" {
        format!("/{child}")
    } else {
        format!("{parent}/{child}")
    }
}

/// A fresh protected prefix `_c_<uuid>-` followed by the node name (the path
/// given to the sequential create, which appends the sequence number). A
/// kazoo contender is `<uuid hex>__lock__` instead, kazoo's own unique
/// prefix (`uuid.uuid4().hex + _NODE_NAME`), which finds the node after a
/// connection loss just as well.
pub(crate) fn protected_name(node_name: &str) -> String {
    let uuid = uuid::Uuid::new_v4();
    if node_name == KAZOO_LOCK_NAME {
        format!("{}{node_name}", uuid.simple())
    } else {
        format!("{PROTECTED_PREFIX}{uuid}-{node_name}")
    }
}

/// The sequence number of a contender: its last ten characters when they are
/// all digits and follow a recipe's node name (Curator's
/// `_c_<uuid>-lock-0000000007`, kazoo's `<hex>__lock__0000000007`, ZooKeeper's
/// own recipe `x-<session>-0000000007`). `None` for anything else (`locks`,
/// `leases`, stray nodes, and the path of a lock named below this one, such as
/// `reports/1732780800`), which then takes no part in the queue. kazoo reads
/// its contenders the same way: its node names followed by the digits.
pub(crate) fn sequence(node: &str) -> Option<u32> {
    let split = node.len().checked_sub(SEQUENCE_DIGITS)?;
    let (stem, digits) = (node.get(..split)?, node.get(split..)?);
    let recipe = CONTENDER_NAMES.iter().any(|name| stem.ends_with(name))
        || (stem.starts_with("x-") && stem.ends_with('-'));
    if recipe && digits.bytes().all(|b| b.is_ascii_digit()) {
        digits.parse().ok()
    } else {
        None
    }
}

/// The node names a contender's sequence digits follow, in every layout read
/// here.
const CONTENDER_NAMES: [&str; 6] = [
    MUTEX_NAME,
    READ_NAME,
    WRITE_NAME,
    KAZOO_LOCK_NAME,
    KAZOO_READ_NAME,
    LEASE_NAME,
];

/// Whether a contender only reads: Curator's `__READ__` and kazoo's `__rlock__`.
/// Every other contender (Curator's `lock-` and `__WRIT__`, kazoo's `__lock__`,
/// ZooKeeper's `x-<session>-`) is exclusive.
pub(crate) fn is_reader(node: &str) -> bool {
    node.contains(READ_NAME) || node.contains(KAZOO_READ_NAME)
}

/// Whether the node is part of Curator's read-write layout.
pub(crate) fn is_read_write(node: &str) -> bool {
    node.contains(READ_NAME) || node.contains(WRITE_NAME) || node.contains(KAZOO_READ_NAME)
}

/// The node name an acquire creates, given the current children of the lock
/// path.
///
/// A reader is `__READ__`. A writer cannot be told apart from a plain exclusive
/// lock (both are [`Mode::Exclusive`]), so it follows the lock path: `__WRIT__`
/// when read-write nodes are present (a Curator `InterProcessReadWriteLock` is
/// in use there, whose readers only see `__WRIT__` nodes), `lock-`
/// (`InterProcessMutex`) otherwise.
pub(crate) fn node_name_for(mode: Mode, children: &[String]) -> &'static str {
    match mode {
        Mode::Shared => READ_NAME,
        _ if children.iter().any(|c| is_read_write(c)) => WRITE_NAME,
        _ => MUTEX_NAME,
    }
}

/// The contenders among a lock path's children, in queue (sequence) order.
pub(crate) fn contenders(children: &[String]) -> Vec<&str> {
    let mut queue: Vec<(u32, &str)> = children
        .iter()
        .filter_map(|c| sequence(c).map(|s| (s, c.as_str())))
        .collect();
    queue.sort_unstable();
    queue.into_iter().map(|(_, c)| c).collect()
}

/// Where a contender stands in the queue.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Standing<'a> {
    /// It holds the lock.
    Holds,
    /// It waits; the named node is the one to watch (its deletion is the next
    /// event that can change the answer).
    Waits(&'a str),
    /// It is not among the contenders (its node is gone).
    Missing,
}

/// Whether `ours` holds, per the rules of Curator's `StandardLockInternalsDriver`
/// (a writer holds when it is first; it watches the node just before it) and
/// `InterProcessReadWriteLock`'s read predicate (a reader holds when no writer
/// is ahead of it; it watches the nearest writer ahead of it, so a release
/// wakes only the next contender, never the herd). `queue` is in sequence order.
pub(crate) fn standing<'a>(queue: &[&'a str], ours: &str) -> Standing<'a> {
    let Some(index) = queue.iter().position(|c| *c == ours) else {
        return Standing::Missing;
    };
    if is_reader(ours) {
        match queue[..index].iter().rev().find(|c| !is_reader(c)) {
            Some(writer) => Standing::Waits(writer),
            None => Standing::Holds,
        }
    } else if index == 0 {
        Standing::Holds
    } else {
        Standing::Waits(queue[index - 1])
    }
}

/// Whether a contender of `mode` arriving now would hold at once (used to
/// answer a try-acquire on a busy lock without writing anything).
pub(crate) fn would_hold_now(queue: &[&str], mode: Mode) -> bool {
    match mode {
        Mode::Shared => queue.iter().all(|c| is_reader(c)),
        _ => queue.is_empty(),
    }
}

/// How many of the queue hold right now: the first writer alone, or every
/// reader ahead of the first writer.
pub(crate) fn holders_in(queue: &[&str]) -> usize {
    match queue.first() {
        None => 0,
        Some(first) if !is_reader(first) => 1,
        Some(_) => queue.iter().take_while(|c| is_reader(c)).count(),
    }
}

/// The permits recorded on a semaphore path: decimal text, the convention of
/// kazoo's `Semaphore` (`Semaphore._ensure_path` stores `str(max_leases)` as the
/// data of the semaphore path and rejects a different value). `None` when the
/// data is empty or not a number (a path made by Curator, which stores nothing
/// there).
pub(crate) fn parse_permits(data: &[u8]) -> Option<u32> {
    std::str::from_utf8(data).ok()?.trim().parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn sequences_of_every_known_layout() {
        let curator = "_c_0f8d8c0e-31c3-4d38-9e3b-5cc0e2f7d9b1-lock-0000000012";
        assert_eq!(sequence(curator), Some(12));
        assert_eq!(sequence("3f2a9c__lock__0000000003"), Some(3));
        assert_eq!(sequence("_c_x-__READ__0000000100"), Some(100));
        assert_eq!(sequence("locks"), None);
        assert_eq!(sequence("leases"), None);
        assert_eq!(sequence("lock-00001"), None);
        assert_eq!(sequence("abc-000000001x"), None);
        assert_eq!(sequence("x-72057594037927936-0000000007"), Some(7));
        assert_eq!(sequence("_c_a-lease-0000000004"), Some(4));
    }

    #[test]
    fn a_lock_named_with_digits_is_no_contender() {
        for name in [
            "1732780800",
            "3f3063431423",
            "daily-1732780800",
            "x0000000001",
        ] {
            assert_eq!(sequence(name), None, "{name}");
        }
    }

    #[test]
    fn mixed_contenders_queue_by_sequence() {
        let children = names(&[
            "_c_b-lock-0000000005",
            "aa__lock__0000000002",
            "locks",
            "_c_a-lock-0000000009",
        ]);
        assert_eq!(
            contenders(&children),
            [
                "aa__lock__0000000002",
                "_c_b-lock-0000000005",
                "_c_a-lock-0000000009"
            ]
        );
    }

    #[test]
    fn exclusive_waits_on_its_predecessor_only() {
        let queue = [
            "k__lock__0000000001",
            "_c_a-lock-0000000002",
            "_c_b-lock-0000000003",
        ];
        assert_eq!(standing(&queue, queue[0]), Standing::Holds);
        assert_eq!(standing(&queue, queue[2]), Standing::Waits(queue[1]));
        assert_eq!(standing(&queue, "_c_z-lock-0000000004"), Standing::Missing);
    }

    #[test]
    fn readers_share_until_a_writer() {
        let queue = [
            "_c_a-__READ__0000000001",
            "k__rlock__0000000002",
            "_c_b-__WRIT__0000000003",
            "_c_c-__READ__0000000004",
            "_c_d-__WRIT__0000000005",
            "_c_e-__READ__0000000006",
        ];
        assert_eq!(standing(&queue, queue[0]), Standing::Holds);
        assert_eq!(standing(&queue, queue[1]), Standing::Holds);
        assert_eq!(standing(&queue, queue[2]), Standing::Waits(queue[1]));
        assert_eq!(standing(&queue, queue[3]), Standing::Waits(queue[2]));
        assert_eq!(standing(&queue, queue[5]), Standing::Waits(queue[4]));
        assert_eq!(holders_in(&queue), 2);
        assert!(!would_hold_now(&queue, Mode::Shared));
        assert!(would_hold_now(&queue[..2], Mode::Shared));
        assert!(!would_hold_now(&queue[..2], Mode::Exclusive));
        assert!(would_hold_now(&[], Mode::Exclusive));
    }

    #[test]
    fn writer_node_name_follows_the_path() {
        assert_eq!(node_name_for(Mode::Exclusive, &[]), MUTEX_NAME);
        assert_eq!(node_name_for(Mode::Shared, &[]), READ_NAME);
        let rw = names(&["_c_a-__READ__0000000001"]);
        assert_eq!(node_name_for(Mode::Exclusive, &rw), WRITE_NAME);
    }

    #[test]
    fn permits_are_decimal_text() {
        assert_eq!(parse_permits(b"4"), Some(4));
        assert_eq!(parse_permits(b""), None);
        assert_eq!(parse_permits(&[10, 0, 0, 1]), None);
    }

    #[test]
    fn paths() {
        assert_eq!(lock_path("orders/42"), "/orders/42");
        assert_eq!(child_path("/", "a"), "/a");
        assert_eq!(child_path("/a", "b"), "/a/b");
        let name = protected_name(MUTEX_NAME);
        assert!(name.starts_with("_c_") && name.ends_with("-lock-"));
        assert_eq!(name.len(), 3 + 36 + 1 + MUTEX_NAME.len());
        let kazoo = protected_name(KAZOO_LOCK_NAME);
        assert!(kazoo.ends_with("__lock__") && !kazoo.contains('-'));
        assert_eq!(kazoo.len(), 32 + KAZOO_LOCK_NAME.len());
    }
}
