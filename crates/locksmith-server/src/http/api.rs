//! The JSON the web page reads: the gRPC inspection answers with their field
//! names, modes as text (`exclusive`, `shared`, `semaphore(4)`), times in
//! milliseconds on the server's clock (`now_ms` says what "now" was).

use locksmith_proto::v1 as pb;
use serde::Serialize;

use crate::convert;

fn mode(mode: i32, permits: u32) -> String {
    convert::mode_from_proto(mode, permits)
        .map(|m| m.to_string())
        .unwrap_or_else(|unknown| unknown)
}

/// `/api/locks`.
#[derive(Debug, Serialize)]
pub(super) struct Locks {
    now_ms: u64,
    /// Whether more locks match than `locks` shows.
    more: bool,
    /// The first `limit` of them, by name.
    locks: Vec<Lock>,
}

#[derive(Debug, Serialize)]
struct Lock {
    name: String,
    holders: Vec<Holder>,
    /// In queue order: the first is granted next.
    waiters: Vec<Waiter>,
    lock_delay_until_ms: Option<u64>,
}

#[derive(Debug, Serialize)]
struct Holder {
    session_id: u64,
    owner: String,
    client_name: String,
    host: String,
    mode: String,
    hold_count: u32,
    fencing_token: u64,
    lock_time_ms: u64,
    lease_until_ms: Option<u64>,
    session_expires_at_ms: Option<u64>,
}

#[derive(Debug, Serialize)]
struct Waiter {
    session_id: u64,
    owner: String,
    mode: String,
    since_ms: u64,
    deadline_ms: Option<u64>,
}

impl Locks {
    pub(super) fn new(list: pb::ListResponse) -> Locks {
        let more = !list.next_after.is_empty();
        let locks = list
            .locks
            .into_iter()
            .map(|lock| Lock {
                name: lock.name,
                holders: lock
                    .holders
                    .into_iter()
                    .map(|h| Holder {
                        session_id: h.session_id,
                        owner: h.owner,
                        client_name: h.client_name,
                        host: h.host,
                        mode: mode(h.mode, h.permits),
                        hold_count: h.hold_count,
                        fencing_token: h.fencing_token,
                        lock_time_ms: h.lock_time_ms,
                        lease_until_ms: h.lease_until_ms,
                        session_expires_at_ms: h.session_expires_at_ms,
                    })
                    .collect(),
                waiters: lock
                    .waiters
                    .into_iter()
                    .map(|w| Waiter {
                        session_id: w.session_id,
                        owner: w.owner,
                        mode: mode(w.mode, w.permits),
                        since_ms: w.since_ms,
                        deadline_ms: w.deadline_ms,
                    })
                    .collect(),
                lock_delay_until_ms: lock.lock_delay_until_ms,
            })
            .collect();
        Locks {
            now_ms: list.now_ms,
            more,
            locks,
        }
    }
}

/// `/api/sessions`.
#[derive(Debug, Serialize)]
pub(super) struct Sessions {
    now_ms: u64,
    sessions: Vec<Session>,
}

#[derive(Debug, Serialize)]
struct Session {
    session_id: u64,
    client_name: String,
    host: String,
    ttl_ms: u64,
    expires_at_ms: u64,
    holds: u64,
    connected: bool,
}

impl Sessions {
    pub(super) fn new(list: pb::ListSessionsResponse) -> Sessions {
        Sessions {
            now_ms: list.now_ms,
            sessions: list
                .sessions
                .into_iter()
                .map(|s| Session {
                    session_id: s.session_id,
                    client_name: s.client_name,
                    host: s.host,
                    ttl_ms: s.ttl_ms,
                    expires_at_ms: s.expires_at_ms,
                    holds: s.holds,
                    connected: s.connected,
                })
                .collect(),
        }
    }
}

/// `/api/history`.
#[derive(Debug, Serialize)]
pub(super) struct History {
    now_ms: u64,
    /// By lock name, oldest first within a lock.
    grants: Vec<Grant>,
}

#[derive(Debug, Serialize)]
struct Grant {
    name: String,
    fencing_token: u64,
    session_id: u64,
    owner: String,
    client_name: String,
    host: String,
    mode: String,
    granted_at_ms: u64,
    waited_ms: u64,
    /// `held`, `released` or `lost`.
    end: &'static str,
    ended_at_ms: Option<u64>,
    /// Why it was lost: `session expired`, `session closed`, `lease expired`,
    /// `force-released`.
    lost_reason: Option<&'static str>,
}

impl History {
    pub(super) fn new(history: pb::HistoryResponse) -> History {
        History {
            now_ms: history.now_ms,
            grants: history
                .grants
                .into_iter()
                .map(|g| {
                    let end = pb::HoldEnd::try_from(g.end).unwrap_or(pb::HoldEnd::Held);
                    let lost_reason = (end == pb::HoldEnd::Lost).then(|| {
                        match pb::LostReason::try_from(g.lost_reason) {
                            Ok(pb::LostReason::SessionExpired) => "session expired",
                            Ok(pb::LostReason::SessionClosed) => "session closed",
                            Ok(pb::LostReason::LeaseExpired) => "lease expired",
                            Ok(pb::LostReason::ForceReleased) => "force-released",
                            Err(_) => "lost",
                        }
                    });
                    Grant {
                        mode: mode(g.mode, g.permits),
                        name: g.name,
                        fencing_token: g.fencing_token,
                        session_id: g.session_id,
                        owner: g.owner,
                        client_name: g.client_name,
                        host: g.host,
                        granted_at_ms: g.granted_at_ms,
                        waited_ms: g.waited_ms,
                        end: match end {
                            pb::HoldEnd::Held => "held",
                            pb::HoldEnd::Released => "released",
                            pb::HoldEnd::Lost => "lost",
                        },
                        ended_at_ms: g.ended_at_ms,
                        lost_reason,
                    }
                })
                .collect(),
        }
    }
}

/// `/api/cluster`.
#[derive(Debug, Serialize)]
pub(super) struct Cluster {
    /// This member's id.
    node_id: u64,
    /// The leader's id, when one is known.
    leader_id: Option<u64>,
    term: u64,
    /// A change of voters is under way (joint consensus).
    changing: bool,
    members: Vec<Member>,
}

#[derive(Debug, Serialize)]
struct Member {
    id: u64,
    address: String,
    /// `leader`, `voter` or `learner`.
    role: &'static str,
    /// The last log index known for it (every member's on the leader).
    last_log_index: Option<u64>,
    /// Its applied index (known for this member only).
    applied_index: Option<u64>,
    /// Entries it is behind the leader (known on the leader).
    lag: Option<u64>,
}

impl Cluster {
    pub(super) fn new(status: locksmith_proto::raft::ClusterStatus) -> Cluster {
        let members = status
            .members
            .into_iter()
            .map(|m| Member {
                role: match (m.leader, m.voter) {
                    (true, _) => "leader",
                    (false, true) => "voter",
                    (false, false) => "learner",
                },
                id: m.id,
                address: m.address,
                last_log_index: m.last_log_index,
                applied_index: m.applied_index,
                lag: m.lag,
            })
            .collect();
        Cluster {
            node_id: status.node_id,
            leader_id: (status.leader_id != 0).then_some(status.leader_id),
            term: status.term,
            changing: status.changing,
            members,
        }
    }
}
