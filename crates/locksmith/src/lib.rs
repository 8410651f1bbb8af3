//! # locksmith: distributed locks with fencing tokens
//!
//! One lock API over the stores teams already run (and a lock server of its
//! own), where every grant carries a **fencing token**: a number that strictly
//! increases each time the lock changes hands, so the resource you protect can
//! refuse a writer whose lock has silently expired.
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> locksmith::Result<()> {
//! let client = locksmith::Client::connect("memory://").await?;
//! let lock = client.lock("orders/42");
//!
//! let guard = lock.acquire().await?;                 // waits, FIFO
//! let token = guard.fencing_token();                 // hand it to the resource
//! assert!(lock.try_acquire().await?.is_none());      // held: no wait, no guard
//! tokio::select! {
//!     reason = guard.lost() => panic!("stop writing: {reason}"),
//!     _ = async { /* work, passing `token` along */ } => {}
//! }
//! guard.release().await?;                            // checked release
//!
//! let next = lock.acquire().await?;
//! assert!(next.fencing_token() > token);
//! # Ok(()) }
//! ```
//!
//! ## Pieces
//!
//! - [`Client`]: connect by URL; makes [`Lock`]s (exclusive, [`RwLock`]
//!   sides, semaphores, multi-locks) and [`Election`]s.
//! - [`Lock`]: options (`lease`, `wait`, `owner`, `reentrant`, `lock_delay`) and
//!   `acquire` / `try_acquire` / `acquire_timeout`.
//! - [`Guard`]: the hold: `fencing_token()`, `lost()` (and `lost_cause()`, a
//!   [`LostCause`] to match on), `hold_count()`, `remaining_lease()`,
//!   `release()`; dropping it releases in the background.
//! - [`Election`]: `campaign` waits to lead and gives a [`Leadership`]
//!   (`proclaim`, `resign`, `lost()`); `leader` and `observe` follow the
//!   leader. On etcd and ZooKeeper it shares elections with `etcdctl elect`,
//!   kazoo and Curator.
//! - [`backend::Backend`]: the trait each store implements. The lock rules
//!   live in `locksmith-core` and, for what is the same on every store
//!   (re-entry, refusals from [`Capabilities`], multi-locks taken name by
//!   name), in this crate's model layer between [`Lock`] and the backend.
#![cfg_attr(
    feature = "blocking",
    doc = r#"- [`blocking`]: the same API with blocking calls, for programs without an
  async runtime (cargo feature `blocking`, on by default)."#
)]
//!
//! ## Examples
//!
//! The crate's `examples/` folder: `cron_once` (a job that runs on one
//! machine only), `leader_worker` (work while elected, with
//! [`Election::observe`]) and `fenced_postgres` (storage that refuses a stale
//! holder's writes by its fencing token).
//!
//! ## Liveness
//!
//! A hold without a lease lives as long as its client: the client heartbeats
//! its session (or renews a watchdog lease at a third of its TTL). A hold with a
//! [`Lock::lease`] ends when the lease does, unless [`Guard::extend`]ed.
//! Either way [`Guard::lost`] fires the moment the hold can no longer be trusted.
//!
#![cfg_attr(
    feature = "blocking",
    doc = r#"## Without async: `locksmith::blocking`

For services that are not async, [`blocking::Client`] offers the same
locks, options, guards, elections and errors with blocking calls, as
`reqwest::blocking` does for reqwest: each client runs its own small tokio
runtime and waits on the async API. Dropping a blocking [`blocking::Guard`]
releases the hold before `drop` returns.

```
# fn main() -> locksmith::Result<()> {
use std::time::Duration;

let client = locksmith::blocking::Client::connect("memory://")?;
let guard = client
    .lock("orders/42")
    .acquire_timeout(Duration::from_secs(5))?; // blocks, at most 5 s
let token = guard.fencing_token();
/* work, passing `token` along and checking `guard.is_lost()` */
guard.release()?;
# let _ = token;
# Ok(()) }
```

Inside an async runtime use the async API: the blocking calls panic there
with a message saying so (they work in `tokio::task::spawn_blocking`).
"#
)]
//!
//! ## Backends (cargo features)
//!
//! | URL | feature |
//! |---|---|
//! | `memory://[table]` | `memory` (default) |
//! | `locksmith://host:port[,…]`, `locksmith+tls://host:port[,…]?ca=FILE` | `server` |
//! | `redis://`, `rediss://`, `redis+redlock://h1,h2,h3`, `redis+sentinel://s1,s2/master`, `redis+cluster://h1,h2` (and `rediss+…` for TLS) | `redis` |
//! | `zk://[user:pass@]host:port[,…]/chroot` (or `zookeeper://`), `zks://…?ca=FILE` | `zookeeper` |
//! | `etcd://[user:pass@]host:port[,…]`, `etcds://…?ca=FILE` | `etcd` |
//! | `postgres://user:pass@host:port/db` (or `postgresql://`) | `postgres` |
#![deny(missing_docs)]
#![cfg_attr(docsrs, feature(doc_cfg))]

mod arguments;
pub mod backend;
#[cfg(feature = "blocking")]
pub mod blocking;
mod client;
mod election;
mod error;
#[cfg(feature = "etcd")]
pub mod etcd;
mod fork;
#[cfg(feature = "fuzzing")]
#[doc(hidden)]
pub mod fuzzing;
mod guard;
mod keeper;
#[cfg(any(feature = "memory", feature = "redis", feature = "etcd"))]
mod leaked;
mod lock;
mod lost;
mod lost_signal;
#[cfg(feature = "memory")]
pub mod memory;
pub mod metrics;
mod model;
mod options;
#[cfg(feature = "postgres")]
pub mod postgres;
#[cfg(feature = "redis")]
pub mod redis;
mod release;
#[cfg(any(feature = "etcd", feature = "zookeeper"))]
mod secret;
#[cfg(feature = "server")]
pub mod server;
#[cfg(any(feature = "etcd", feature = "zookeeper", feature = "redis"))]
mod tls;
#[cfg(feature = "zookeeper")]
pub mod zookeeper;

pub use backend::{Capabilities, GrantRecord, HoldEnd, Holder, LockInfo, LostSignal, Waiter};
pub use client::Client;
pub use election::{Election, Leader, Leadership, OBSERVE_POLL};
pub use error::{Error, Loss, Result, Undo, Unreplicated};
pub use fork::forget_process_state_after_fork;
pub use guard::Guard;
pub use lock::{Lock, LockOptions, RwLock};
pub use locksmith_core::{validate_name, Mode, NameError};
pub use lost::LostCause;
pub use options::{redact, ConnectOptions};
