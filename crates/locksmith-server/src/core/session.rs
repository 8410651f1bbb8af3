//! Sessions on the server's side: opening, resuming and attaching streams.
//!
//! The engine knows a session's TTL, holds and waiters; the core keeps its
//! resume secret, the stream it is attached to, and the replies and lost
//! notices its client has not acknowledged yet.

use std::collections::{BTreeMap, HashMap};
use std::net::{IpAddr, SocketAddr};

use locksmith_core::{ClientInfo, Command, EngineError, Millis, SessionId};
use locksmith_proto::v1 as pb;
use tokio_util::sync::CancellationToken;
use tonic::Status;

use super::{Core, Proposal, Route};
use crate::convert::{self, engine_error_to_status};
use crate::op::{NewStream, StreamId, StreamTx};
use crate::storage::{LostNotice, Outcome};

/// The server's part of one session.
pub(super) struct SessionEntry {
    pub(super) secret: u128,
    pub(super) ttl: Millis,
    pub(super) attached: Option<Attached>,
    pub(super) replies: BTreeMap<u64, Outcome>,
    /// Fingerprints of the requests whose ids are in use (waiting, or with a
    /// kept reply): module `request_ids`.
    pub(super) fingerprints: HashMap<u64, u64>,
    pub(super) lost: BTreeMap<u64, LostNotice>,
    /// The client connection that opened or last resumed it; unknown for a
    /// session recovered after a restart until it resumes.
    pub(super) peer: Option<SocketAddr>,
}

/// Open sessions per client address, for
/// [`ServerConfig::max_sessions_per_peer`](crate::ServerConfig::max_sessions_per_peer):
/// a session counts against the address it was last seen from, attached or
/// not, until it ends.
#[derive(Debug, Default)]
pub(super) struct PeerCounts(HashMap<IpAddr, usize>);

impl PeerCounts {
    fn of(&self, peer: Option<SocketAddr>) -> usize {
        peer.and_then(|p| self.0.get(&p.ip()).copied()).unwrap_or(0)
    }

    fn add(&mut self, peer: Option<SocketAddr>) {
        if let Some(peer) = peer {
            *self.0.entry(peer.ip()).or_insert(0) += 1;
        }
    }

    pub(super) fn remove(&mut self, peer: Option<SocketAddr>) {
        let Some(ip) = peer.map(|p| p.ip()) else {
            return;
        };
        if let Some(count) = self.0.get_mut(&ip) {
            *count -= 1;
            if *count == 0 {
                self.0.remove(&ip);
            }
        }
    }
}

pub(super) struct Attached {
    pub(super) stream: StreamId,
    pub(super) tx: StreamTx,
    pub(super) ended: CancellationToken,
}

impl Core {
    /// Checks the limits and proposes the session's `OpenSession` record; the
    /// stream gets its answer when the record is applied ([`Core::opened`]).
    pub(super) fn propose_open(
        &mut self,
        now: Millis,
        new: NewStream,
        info: ClientInfo,
        ttl: Millis,
        proposal: &mut Proposal,
    ) {
        let refusal = if self.shutting_down {
            Some(Status::unavailable("lock server is shutting down"))
        } else if self.sessions.len() + self.replica.opening() + proposal.opens >= self.max_sessions
        {
            Some(Status::resource_exhausted(format!(
                "limit reached: sessions (at most {})",
                self.max_sessions
            )))
        } else if self.peers.of(new.peer) >= self.max_sessions_per_peer {
            Some(Status::resource_exhausted(format!(
                "limit reached: sessions from one client address (at most {})",
                self.max_sessions_per_peer
            )))
        } else {
            None
        };
        if let Some(status) = refusal {
            self.output.streams.end(new.id, &new.tx, status);
            return new.ended.cancel();
        }
        let session = SessionId(self.next_session);
        self.next_session += 1;
        proposal.opens += 1;
        // Known to the stream at once: what the client sends right after its
        // open (in the same batch, say) runs in the session, after the open.
        self.streams.insert(new.id, session);
        let secret: u128 = rand::random();
        let command = Command::OpenSession { session, ttl, info };
        proposal.command(now, command, Some(secret), None, Route::Open(new));
    }

    /// The `OpenSession` record of `new`'s stream was applied with `result`:
    /// tells the stream and attaches it.
    pub(super) fn opened(
        &mut self,
        new: NewStream,
        session: SessionId,
        result: Result<(), EngineError>,
    ) {
        let NewStream {
            id: stream,
            tx,
            ended,
            peer,
        } = new;
        let entry = match result {
            Ok(()) => self.sessions.get(&session),
            Err(error) => {
                self.output
                    .streams
                    .end(stream, &tx, engine_error_to_status(&error));
                None
            }
        };
        let Some(entry) = entry else {
            self.streams.remove(&stream);
            return ended.cancel();
        };
        let opened = pb::ServerMessage {
            kind: Some(pb::server_message::Kind::Opened(pb::SessionOpened {
                session_id: session.0,
                secret: entry.secret.to_be_bytes().to_vec(),
                ttl_ms: entry.ttl,
                member: self.replica.address.clone().unwrap_or_default(),
            })),
        };
        self.output.streams.push(stream, &tx, opened);
        self.attach(session, stream, tx, ended, peer);
        tracing::debug!(%session, ?peer, "session opened");
    }

    /// Attaches `new`'s stream to `session` if the secret is right, and
    /// proposes the heartbeat a resume is.
    pub(super) fn resume(
        &mut self,
        now: Millis,
        new: NewStream,
        session: SessionId,
        secret: u128,
        proposal: &mut Proposal,
    ) {
        let NewStream {
            id: stream,
            tx,
            ended,
            peer,
        } = new;
        let valid = !self.shutting_down
            && self
                .sessions
                .get(&session)
                .is_some_and(|e| e.secret == secret);
        if !valid {
            self.output
                .streams
                .end(stream, &tx, unknown_session(session));
            return ended.cancel();
        }
        let entry = self.sessions.get_mut(&session).expect("checked");
        if let Some(old) = entry.attached.take() {
            self.streams.remove(&old.stream);
            let status = Status::aborted("session resumed on another stream");
            self.output.streams.end(old.stream, &old.tx, status);
            old.ended.cancel();
        }
        let resumed = pb::ServerMessage {
            kind: Some(pb::server_message::Kind::Resumed(pb::SessionResumed {
                session_id: session.0,
                ttl_ms: entry.ttl,
                member: self.replica.address.clone().unwrap_or_default(),
            })),
        };
        self.output.streams.push(stream, &tx, resumed);
        for notice in entry.lost.values() {
            self.output
                .streams
                .push(stream, &tx, convert::lost_to_proto(notice));
        }
        let heartbeat = Command::Heartbeat { session };
        proposal.command(now, heartbeat, None, None, Route::Nobody);
        self.attach(session, stream, tx, ended, peer);
        tracing::debug!(%session, ?peer, "session resumed");
    }

    pub(super) fn attach(
        &mut self,
        session: SessionId,
        stream: StreamId,
        tx: StreamTx,
        ended: CancellationToken,
        peer: Option<SocketAddr>,
    ) {
        if let Some(entry) = self.sessions.get_mut(&session) {
            entry.attached = Some(Attached { stream, tx, ended });
            self.streams.insert(stream, session);
            if peer.is_some() {
                self.peers.remove(entry.peer);
                self.peers.add(peer);
                entry.peer = peer;
            }
        }
    }
}

pub(super) fn unknown_session(session: SessionId) -> Status {
    Status::not_found(format!(
        "unknown session {}: it expired, was closed, or never existed",
        session.0
    ))
}
