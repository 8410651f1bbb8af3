//! The data of a snapshot: what the server needs to start again without the
//! log before it, as openraft keeps it and sends it to other members.
//!
//! It is `postcard` with a format number first. Format 0 is the layout from
//! before a session's end could span several log entries: its engine has no
//! ending sessions. A snapshot of format 0 is still read (as an engine with
//! none); anything newer than this server knows is refused, never guessed.
//! Format 2 adds the cluster's record version at the end; it is written only
//! once the cluster agreed on record version 2 (module
//! `core::replicated::versions`), since a leader sends its snapshots to
//! members of the older build during a rolling upgrade: until then the
//! snapshot is written in format 1, which reads as record version 1.

use std::io::Cursor;

use locksmith_core::{
    CheckedSnapshot, FrozenEngine, LockSnapshot, Millis, SessionSnapshot, Snapshot, SnapshotCensus,
    SnapshotError, WaiterSnapshot,
};
use openraft::type_config::alias::{SnapshotMetaOf, SnapshotOf};
use serde::{Deserialize, Serialize};

use super::SessionRecord;
use crate::entry::TypeConfig;

/// The applied state as of one log entry, frozen in the core (the
/// engine's locks shared copy-on-write, the server's session table copied) so
/// that copying, encoding and writing it, the slow part with a big table,
/// happen elsewhere while the core goes on.
pub(crate) struct FrozenState {
    pub meta: SnapshotMetaOf<TypeConfig>,
    pub last_now: Millis,
    pub cluster_version: u32,
    pub next_session: u64,
    pub next_unary: u64,
    pub engine: FrozenEngine,
    /// In no order: sorted where encoded (below).
    pub sessions: Vec<SessionRecord>,
    /// No token above it had been made visible as of this state: the
    /// member's durable token ceiling, or the engine's last token where it
    /// keeps none. A backup carries it (`storage::backup`).
    pub token_ceiling: u64,
}

impl FrozenState {
    /// The snapshot openraft keeps and sends (`ServerSnapshot`, postcard).
    pub(crate) fn encode(self) -> SnapshotOf<TypeConfig, Cursor<Vec<u8>>> {
        let data = encode_frozen(&self);
        SnapshotOf::<TypeConfig, Cursor<Vec<u8>>> {
            meta: self.meta,
            snapshot: Cursor::new(data),
        }
    }
}

/// The newest format this server writes: 1 since sessions can be ending
/// ([`locksmith_core::Snapshot::ending`]), 2 with the cluster's record
/// version.
const SNAPSHOT_FORMAT: u64 = 2;

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
    /// The newest record version every member reads (format 2; 1 before).
    pub cluster_version: u32,
}

/// [`ServerSnapshot`] as format 2 lays it out, borrowed to write it; the
/// engine is anything that serializes as a [`Snapshot`] (a frozen engine
/// does, without building one), the sessions [`SessionRecord`]s or
/// references to them, sorted by id.
#[derive(Serialize)]
struct FormatTwoRef<'a, E, R> {
    format: u64,
    last_now: Millis,
    next_session: u64,
    next_unary: u64,
    engine: &'a E,
    sessions: &'a [R],
    cluster_version: u32,
}

/// [`ServerSnapshot`] as format 1 lays it out (no record version), borrowed
/// to write it.
#[derive(Serialize)]
struct FormatOneRef<'a, E, R> {
    format: u64,
    last_now: Millis,
    next_session: u64,
    next_unary: u64,
    engine: &'a E,
    sessions: &'a [R],
}

/// The bytes of a snapshot of these parts, appended to `bytes`: format 1's
/// layout until the cluster agreed on record version 2, then `format`
/// (format 2's layout).
#[allow(clippy::too_many_arguments)]
fn encode_parts<E: Serialize, R: Serialize>(
    format: u64,
    cluster_version: u32,
    last_now: Millis,
    next_session: u64,
    next_unary: u64,
    engine: &E,
    sessions: &[R],
    bytes: Vec<u8>,
) -> Vec<u8> {
    let encoded = if cluster_version >= 2 {
        postcard::to_extend(
            &FormatTwoRef {
                format,
                last_now,
                next_session,
                next_unary,
                engine,
                sessions,
                cluster_version,
            },
            bytes,
        )
    } else {
        postcard::to_extend(
            &FormatOneRef {
                format: 1,
                last_now,
                next_session,
                next_unary,
                engine,
                sessions,
            },
            bytes,
        )
    };
    encoded.expect("the state always encodes")
}

/// The bytes of a snapshot of `frozen`, as [`ServerSnapshot::encode`] writes
/// a snapshot of the same state, but written straight from the frozen
/// engine (module `locksmith_core::engine::encode`).
pub(crate) fn encode_frozen(frozen: &FrozenState) -> Vec<u8> {
    encode_frozen_after(frozen, Vec::new())
}

/// [`encode_frozen`]'s bytes appended to `bytes`, which is first given room
/// for all of them: a buffer of tens of megabytes grown as it fills would
/// be copied and its pages touched twice over.
pub(crate) fn encode_frozen_after(frozen: &FrozenState, mut bytes: Vec<u8>) -> Vec<u8> {
    // The session table: each session's kept replies and lost holds, at a
    // generous guess; the engine's part is what the engine says.
    let sessions: usize = frozen
        .sessions
        .iter()
        .map(|s| 64 + 128 * (s.replies.len() + s.lost.len()))
        .sum();
    bytes.reserve(64 + sessions + frozen.engine.encoded_len_hint());
    // Frozen in the table's order; sorted here, off the core's thread.
    let mut sessions: Vec<&SessionRecord> = frozen.sessions.iter().collect();
    sessions.sort_unstable_by_key(|s| s.session);
    encode_parts(
        format_for(frozen.cluster_version),
        frozen.cluster_version,
        frozen.last_now,
        frozen.next_session,
        frozen.next_unary,
        &frozen.engine,
        &sessions,
        bytes,
    )
}

/// [`ServerSnapshot`] as format 1 lays it out, to read it.
#[derive(Deserialize)]
struct FormatOne {
    _format: u64,
    last_now: Millis,
    next_session: u64,
    next_unary: u64,
    engine: Snapshot,
    sessions: Vec<SessionRecord>,
}

/// The newest format a cluster of record version `cluster_version` reads.
fn format_for(cluster_version: u32) -> u64 {
    if cluster_version >= 2 {
        SNAPSHOT_FORMAT
    } else {
        1
    }
}

impl ServerSnapshot {
    /// A snapshot in the newest format the cluster's record version allows.
    pub(crate) fn new(
        last_now: Millis,
        cluster_version: u32,
        next_session: u64,
        next_unary: u64,
        engine: Snapshot,
        sessions: Vec<SessionRecord>,
    ) -> Self {
        ServerSnapshot {
            format: format_for(cluster_version),
            last_now,
            next_session,
            next_unary,
            engine,
            sessions,
            cluster_version,
        }
    }

    /// The format it was written in (a snapshot read from an older one is
    /// upgraded, so this is the current one).
    pub(crate) fn format(&self) -> u64 {
        self.format
    }

    /// The bytes openraft keeps and sends, in the format the cluster's
    /// record version allows.
    pub(crate) fn encode(&self) -> Vec<u8> {
        encode_parts(
            self.format,
            self.cluster_version,
            self.last_now,
            self.next_session,
            self.next_unary,
            &self.engine,
            &self.sessions,
            Vec::new(),
        )
    }

    /// Reads a snapshot of any format this server knows.
    pub(crate) fn decode(data: &[u8]) -> Result<Self, String> {
        let (format, _) = postcard::take_from_bytes::<u64>(data)
            .map_err(|e| format!("the snapshot has no format number: {e}"))?;
        let decoded = match format {
            SNAPSHOT_FORMAT => postcard::from_bytes(data),
            1 => postcard::from_bytes::<FormatOne>(data).map(|one| {
                ServerSnapshot::new(
                    one.last_now,
                    1,
                    one.next_session,
                    one.next_unary,
                    one.engine,
                    one.sessions,
                )
            }),
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

/// What a snapshot holds, read and checked without building its engine
/// ([`ServerSnapshot::census`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct StateCensus {
    /// The format it reads as ([`ServerSnapshot::format`]).
    pub format: u64,
    /// The server's sessions.
    pub sessions: usize,
    /// The newest record version every member of its cluster read.
    pub cluster_version: u32,
    /// The engine's state, counted, or the rule of
    /// [`Snapshot::check`] it breaks.
    pub engine: Result<SnapshotCensus, SnapshotError>,
}

/// [`ServerSnapshot`] as format 2 lays it out, its engine checked as read.
#[derive(Deserialize)]
struct FormatTwoChecked {
    _format: u64,
    _last_now: Millis,
    _next_session: u64,
    _next_unary: u64,
    engine: CheckedSnapshot,
    sessions: Vec<SessionRecord>,
    cluster_version: u32,
}

/// [`ServerSnapshot`] as format 1 lays it out, its engine checked as read.
#[derive(Deserialize)]
struct FormatOneChecked {
    _format: u64,
    _last_now: Millis,
    _next_session: u64,
    _next_unary: u64,
    engine: CheckedSnapshot,
    sessions: Vec<SessionRecord>,
}

impl ServerSnapshot {
    /// What `data` holds, and whether its engine holds together, as
    /// [`ServerSnapshot::decode`] then [`Snapshot::check`] would tell, but
    /// checked where the bytes lie: a million locks are not first decoded
    /// into owned names and owners (`locksmith_core::CheckedSnapshot`).
    /// Errors are [`ServerSnapshot::decode`]'s.
    pub(crate) fn census(data: &[u8]) -> Result<StateCensus, String> {
        let (format, _) = postcard::take_from_bytes::<u64>(data)
            .map_err(|e| format!("the snapshot has no format number: {e}"))?;
        let checked = match format {
            SNAPSHOT_FORMAT => postcard::from_bytes::<FormatTwoChecked>(data)
                .map(|s| (s.engine, s.sessions, s.cluster_version)),
            1 => postcard::from_bytes::<FormatOneChecked>(data).map(|s| (s.engine, s.sessions, 1)),
            // Format 0 (and a newer one, refused as decoding does).
            _ => {
                let decoded = ServerSnapshot::decode(data)?;
                return Ok(StateCensus {
                    format: decoded.format,
                    sessions: decoded.sessions.len(),
                    cluster_version: decoded.cluster_version,
                    engine: decoded.engine.census(),
                });
            }
        };
        let (engine, sessions, cluster_version) =
            checked.map_err(|e| format!("the snapshot (format {format}) does not decode: {e}"))?;
        Ok(StateCensus {
            format,
            sessions: sessions.len(),
            cluster_version,
            engine: engine.into_result(),
        })
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
            1,
            self.next_session,
            self.next_unary,
            engine,
            self.sessions,
        )
    }
}

#[cfg(test)]
mod tests {
    use locksmith_core::{
        ClientInfo, EndingSnapshot, Engine, HoldSnapshot, Limits, LostReason, Mode, RequestId,
        SessionId,
    };

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

    /// An engine with every part a snapshot has: several sessions, an
    /// ending one, a shared lock of two holders (one leased, with a
    /// lock-delay), an exclusive one in lock-delay, and a waiter queued on
    /// both, listed out of the snapshot's order.
    fn busy_engine() -> Snapshot {
        let session = |id: u64| SessionSnapshot {
            session: SessionId(id),
            ttl: 5_000,
            info: ClientInfo {
                name: format!("client-{id}"),
                host: "host-a".into(),
            },
            expires_at: 9_000 + id,
        };
        let hold = |session: u64, owner: &str, mode: Mode, token: u64| HoldSnapshot {
            session: SessionId(session),
            owner: owner.into(),
            mode,
            token,
            count: 1,
            lock_time: 100 + token,
            lease_until: None,
            lock_delay: 0,
        };
        let waiter = (SessionId(3), RequestId(9));
        Snapshot {
            last_token: 12,
            sessions: vec![session(3), session(1), session(2)],
            locks: vec![
                LockSnapshot {
                    name: "b/exclusive".into(),
                    holders: vec![hold(4, "writer", Mode::Exclusive, 11)],
                    queue: vec![waiter],
                    delay_until: Some(9_500),
                },
                LockSnapshot {
                    name: "a/shared".into(),
                    holders: vec![
                        hold(1, "reader", Mode::Shared, 3),
                        HoldSnapshot {
                            count: 2,
                            lease_until: Some(50_000),
                            lock_delay: 1_000,
                            ..hold(2, "other reader", Mode::Shared, 4)
                        },
                    ],
                    queue: vec![waiter],
                    delay_until: None,
                },
            ],
            waiters: vec![WaiterSnapshot {
                session: waiter.0,
                request: waiter.1,
                names: vec!["b/exclusive".into(), "a/shared".into()],
                owner: "waiting writer".into(),
                mode: Mode::Exclusive,
                reentrant: false,
                lease: Some(2_000),
                lock_delay: 500,
                since: 8_000,
                deadline: Some(20_000),
            }],
            ending: vec![EndingSnapshot {
                session: SessionId(4),
                reason: LostReason::SessionExpired,
                since: 8_000,
                info: ClientInfo::default(),
            }],
        }
    }

    #[test]
    fn a_frozen_engine_encodes_as_the_snapshot_it_would_build() {
        let engine = Engine::restore(Limits::default(), busy_engine()).unwrap();
        let built = engine.freeze().into_snapshot();
        assert_eq!(built.locks.len(), 2, "{built:?}");
        assert_eq!(
            postcard::to_stdvec(&engine.freeze()).unwrap(),
            postcard::to_stdvec(&built).unwrap()
        );
        for cluster_version in [1, 2] {
            let sessions = vec![SessionRecord {
                session: 1,
                secret: 77,
                ttl: 5_000,
                replies: Vec::new(),
                lost: Vec::new(),
            }];
            let frozen = engine.freeze();
            let written = encode_parts(
                format_for(cluster_version),
                cluster_version,
                8_000,
                3,
                4,
                &frozen,
                &sessions,
                Vec::new(),
            );
            let snapshot =
                ServerSnapshot::new(8_000, cluster_version, 3, 4, built.clone(), sessions);
            assert_eq!(written, snapshot.encode());
            assert_eq!(ServerSnapshot::decode(&written), Ok(snapshot));
        }
    }

    #[test]
    fn a_snapshot_decodes_as_it_was_encoded() {
        let snapshot = ServerSnapshot::new(8_000, 2, 3, 4, engine(), Vec::new());
        assert_eq!(ServerSnapshot::decode(&snapshot.encode()), Ok(snapshot));
    }

    #[test]
    fn until_the_cluster_agrees_on_record_version_2_a_snapshot_is_written_in_format_1() {
        let snapshot = ServerSnapshot::new(8_000, 1, 3, 4, engine(), Vec::new());
        let bytes = snapshot.encode();
        assert_eq!(postcard::take_from_bytes::<u64>(&bytes).unwrap().0, 1);
        let read = ServerSnapshot::decode(&bytes).unwrap();
        assert_eq!(read, snapshot);
        assert_eq!(read.cluster_version, 1);
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
        assert_eq!(read.format, 1);
        assert_eq!(read.engine.sessions, engine.sessions);
        assert_eq!(read.engine.ending, []);
        assert_eq!(
            (read.last_now, read.next_session, read.next_unary),
            (8_000, 3, 4)
        );
    }

    #[test]
    fn a_snapshot_of_a_newer_format_is_refused() {
        let mut snapshot = ServerSnapshot::new(8_000, 2, 3, 4, engine(), Vec::new());
        snapshot.format = SNAPSHOT_FORMAT + 1;
        let error = ServerSnapshot::decode(&snapshot.encode()).unwrap_err();
        assert!(error.contains("written by a newer version"), "{error}");
    }
}
