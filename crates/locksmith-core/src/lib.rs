//! # locksmith-core: the lock engine
//!
//! The lock table of locksmith as a deterministic state machine. It knows every
//! rule of the shared lock model (modes, FIFO queues with writer fairness,
//! sessions and leases, fencing tokens, lock-delay, atomic multi-acquire) and
//! nothing about sockets, clocks or threads.
//!
//! Re-entry, for users of the client library, is decided by the library's
//! model layer: it sends one acquire per hold and records the depth it
//! counts with [`Command::SetHoldCount`], for inspection. The engine's own
//! re-entry (a second [`Command::Acquire`] of the same owner raises the hold
//! count and keeps the token) is the server protocol's, for callers that
//! count nothing themselves; it is unchanged, so a log written before
//! `SetHoldCount` existed replays exactly as it did.
//!
//! The caller feeds [`Command`]s, each with the time it happens at, into
//! [`Engine::apply`], and acts on the [`Effect`]s that come out (deliver a grant,
//! tell a holder its lock is lost). Time-driven changes are commands too: ask
//! [`Engine::next_deadline`] when to wake up and [`Engine::due`] which commands to
//! apply then. Because nothing inside reads a clock, the same commands with the
//! same times always give the same state: the server logs commands and replays
//! them on recovery, and tests run without sleeping.
//!
//! ```
//! use locksmith_core::{Acquire, ClientInfo, Command, Effect, Engine, Mode, RequestId, SessionId, Wait};
//!
//! let mut engine = Engine::default();
//! let mut effects = Vec::new();
//! let alice = SessionId(1);
//! engine.apply(0, Command::OpenSession { session: alice, ttl: 10_000, info: ClientInfo::default() }, &mut effects)?;
//! engine.apply(5, Command::Acquire(Acquire {
//!     session: alice,
//!     request: RequestId(1),
//!     owner: "worker".into(),
//!     names: vec!["orders/42".into()],
//!     mode: Mode::Exclusive,
//!     wait: Wait::Forever,
//!     lease: None,
//!     reentrant: true,
//!     lock_delay: 0,
//! }), &mut effects)?;
//! assert_eq!(effects, [Effect::Granted { session: alice, request: RequestId(1), tokens: vec![1] }]);
//! # Ok::<(), locksmith_core::EngineError>(())
//! ```
#![deny(missing_docs)]

mod command;
mod engine;
mod error;
mod inspect;
mod name;
pub mod pace;
pub mod planted;
mod snapshot;
mod types;

pub use command::{Acquire, Command, Effect};
pub use engine::{Engine, FrozenEngine};
pub use error::{EngineError, NameError, SnapshotError};
pub use inspect::{HolderInfo, ListPage, LockInfo, SessionInfo, WaiterInfo};
pub use name::{validate_name, MAX_NAME_LEN};
#[cfg(feature = "serde")]
pub use snapshot::CheckedSnapshot;
pub use snapshot::{
    EndingSnapshot, HoldSnapshot, LockSnapshot, SessionSnapshot, Snapshot, SnapshotCensus,
    WaiterSnapshot,
};
pub use types::{ClientInfo, Limits, LostReason, Millis, Mode, RequestId, SessionId, Wait};
