//! The data of a snapshot: what the server needs to start again without the
//! log before it, as openraft keeps it and sends it to other members.
//!
//! It is `postcard` with a format number first. Format 0 is the layout from
//! before a session's end could span several log entries: its engine has no
//! ending sessions. A snapshot of format 0 is still read (as an engine with
//! none); anything newer than this server knows is refused, never guessed.

use locksmith_core::{LockSnapshot, Millis, SessionSnapshot, Snapshot, WaiterSnapshot};
use serde::{Deserialize, Serialize};

use super::SessionRecord;

/// The format this server writes: 1 since sessions can be ending
/// ([`locksmith_core::Snapshot::ending`]).
const SNAPSHOT_FORMAT: u64 = 1;

/// Everything the server needs to start again without the log before it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct ServerSnapshot {
    /// [`SNAPSHOT_FORMAT`]. Every earlier version wrote 0 here, in the
    /// place of a field it no longer used, which is what tells its layout.
    format: u64,
    /// The latest engine time applied so far.
    pub last_now: Millis,
    /// Next session id to hand out.
    pub next_session: u64,
    /// Next request id for sessionless (unary) acquires.
    pub next_unary: u64,
    /// The engine.
    pub engine: Snapshot,
    /// The server's session table.
    pub sessions: Vec<SessionRecord>,
}

impl ServerSnapshot {
    /// A snapshot of the current format.
    pub(crate) fn new(
        last_now: Millis,
        next_session: u64,
        next_unary: u64,
        engine: Snapshot,
        sessions: Vec<SessionRecord>,
    ) -> Self {
        ServerSnapshot {
            format: SNAPSHOT_FORMAT,
            last_now,
            next_session,
            next_unary,
            engine,
            sessions,
        }
    }

    /// The format it was written in (a snapshot read from an older one is
    /// upgraded, so this is the current one).
    pub(crate) fn format(&self) -> u64 {
        self.format
    }

    /// The bytes openraft keeps and sends.
    pub(crate) fn encode(&self) -> Vec<u8> {
        postcard::to_stdvec(self).expect("the state always encodes")
    }

    /// Reads a snapshot of any format this server knows.
    pub(crate) fn decode(data: &[u8]) -> Result<Self, String> {
        let (format, _) = postcard::take_from_bytes::<u64>(data)
            .map_err(|e| format!("the snapshot has no format number: {e}"))?;
        let decoded = match format {
            SNAPSHOT_FORMAT => postcard::from_bytes(data),
            0 => postcard::from_bytes::<FormatZero>(data).map(FormatZero::upgrade),
            other => {
                return Err(format!(
                    "the snapshot is of format {other}, and this server reads formats 0 to \
                     {SNAPSHOT_FORMAT}: it was written by a newer version"
                ))
            }
        };
        decoded.map_err(|e| format!("the snapshot (format {format}) does not decode: {e}"))
    }
}

/// [`ServerSnapshot`] as format 0 laid it out.
#[derive(Deserialize)]
#[cfg_attr(test, derive(Serialize))]
struct FormatZero {
    /// Always 0: what [`ServerSnapshot::decode`] chose this layout by.
    _format: u64,
    last_now: Millis,
    next_session: u64,
    next_unary: u64,
    engine: EngineZero,
    sessions: Vec<SessionRecord>,
}

/// [`Snapshot`] as format 0 laid it out: no ending sessions.
#[derive(Deserialize)]
#[cfg_attr(test, derive(Serialize))]
struct EngineZero {
    last_token: u64,
    sessions: Vec<SessionSnapshot>,
    locks: Vec<LockSnapshot>,
    waiters: Vec<WaiterSnapshot>,
}

impl FormatZero {
    fn upgrade(self) -> ServerSnapshot {
        let EngineZero {
            last_token,
            sessions,
            locks,
            waiters,
        } = self.engine;
        let engine = Snapshot {
            last_token,
            sessions,
            locks,
            waiters,
            ending: Vec::new(),
        };
        ServerSnapshot::new(
            self.last_now,
            self.next_session,
            self.next_unary,
            engine,
            self.sessions,
        )
    }
}

#[cfg(test)]
mod tests {
    use locksmith_core::{ClientInfo, EndingSnapshot, HoldSnapshot, LostReason, Mode, SessionId};

    use super::*;

    fn engine() -> Snapshot {
        Snapshot {
            last_token: 7,
            sessions: vec![SessionSnapshot {
                session: SessionId(1),
                ttl: 5_000,
                info: ClientInfo::default(),
                expires_at: 9_000,
            }],
            locks: vec![LockSnapshot {
                name: "orders/42".into(),
                holders: vec![HoldSnapshot {
                    session: SessionId(2),
                    owner: "worker".into(),
                    mode: Mode::Exclusive,
                    token: 7,
                    count: 1,
                    lock_time: 100,
                    lease_until: None,
                    lock_delay: 0,
                }],
                queue: Vec::new(),
                delay_until: None,
            }],
            waiters: Vec::new(),
            ending: vec![EndingSnapshot {
                session: SessionId(2),
                reason: LostReason::SessionExpired,
                since: 8_000,
                info: ClientInfo::default(),
            }],
        }
    }

    #[test]
    fn a_snapshot_decodes_as_it_was_encoded() {
        let snapshot = ServerSnapshot::new(8_000, 3, 4, engine(), Vec::new());
        assert_eq!(ServerSnapshot::decode(&snapshot.encode()), Ok(snapshot));
    }

    #[test]
    fn a_snapshot_of_format_zero_is_read_with_no_ending_session() {
        let engine = engine();
        let old = FormatZero {
            _format: 0,
            last_now: 8_000,
            next_session: 3,
            next_unary: 4,
            engine: EngineZero {
                last_token: engine.last_token,
                sessions: engine.sessions.clone(),
                locks: Vec::new(),
                waiters: Vec::new(),
            },
            sessions: Vec::new(),
        };
        let bytes = postcard::to_stdvec(&old).unwrap();
        let read = ServerSnapshot::decode(&bytes).unwrap();
        assert_eq!(read.format, SNAPSHOT_FORMAT);
        assert_eq!(read.engine.sessions, engine.sessions);
        assert_eq!(read.engine.ending, []);
        assert_eq!(
            (read.last_now, read.next_session, read.next_unary),
            (8_000, 3, 4)
        );
    }

    #[test]
    fn a_snapshot_of_a_newer_format_is_refused() {
        let mut snapshot = ServerSnapshot::new(8_000, 3, 4, engine(), Vec::new());
        snapshot.format = SNAPSHOT_FORMAT + 1;
        let error = ServerSnapshot::decode(&snapshot.encode()).unwrap_err();
        assert!(error.contains("written by a newer version"), "{error}");
    }
}
