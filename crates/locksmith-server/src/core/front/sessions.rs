//! Session streams on the leader: opening, resuming, attaching, detaching
//! and ending them.
//!
//! The replicated state knows a session's secret, TTL, kept replies and
//! lost notices; the front end knows only what ties a session to a client
//! here: the stream it is attached to and the address it was last seen
//! from ([`Link`]), which no other member has and no log records.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use locksmith_core::{ClientInfo, Command, Millis, SessionId};
use locksmith_proto::v1 as pb;
use tonic::Status;

use super::{FrontEnd, Proposal, Route};
use crate::convert;
use crate::core::replicated::Replicated;
use crate::op::{NewStream, StreamId, StreamTx};
use crate::pulse::Pulse;

/// What ties a session to a client on this member.
#[derive(Default)]
pub(super) struct Link {
    /// The stream the session is attached to, if any.
    pub(super) attached: Option<Attached>,
    /// The client connection that opened or last resumed it; unknown for a
    /// session recovered after a restart until it resumes.
    pub(super) peer: Option<SocketAddr>,
}

pub(super) struct Attached {
    pub(super) stream: StreamId,
    pub(super) tx: StreamTx,
    /// Shared with the stream's reader; ended when the core is done with
    /// the stream.
    pub(super) pulse: Arc<Pulse>,
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

    fn remove(&mut self, peer: Option<SocketAddr>) {
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

impl FrontEnd {
    /// Checks the limits and proposes the session's `OpenSession` record; the
    /// stream gets its answer when the record is applied
    /// ([`FrontEnd::opened`]).
    pub(super) fn propose_open(
        &mut self,
        state: &Replicated,
        now: Millis,
        new: NewStream,
        info: ClientInfo,
        ttl: Millis,
        proposal: &mut Proposal,
    ) {
        let open = state.session_count() + self.replica.opening() + proposal.opens;
        let refusal = if self.shutting_down {
            Some(Status::unavailable("lock server is shutting down"))
        } else if open >= self.max_sessions {
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
            return new.pulse.end();
        }
        // Above every id applied, and every id this member handed out.
        let session = SessionId(self.next_session.max(state.next_session()));
        self.next_session = session.0 + 1;
        proposal.opens += 1;
        // Known to the stream at once: what the client sends right after its
        // open (in the same batch, say) runs in the session, after the open.
        self.streams.insert(new.id, session);
        let secret: u128 = crate::random::u128();
        let command = Command::OpenSession { session, ttl, info };
        let route = Route::Open {
            stream: new,
            session,
        };
        proposal.command(now, command, Some(secret), None, route);
    }

    /// The `OpenSession` record of `new`'s stream was applied with `result`:
    /// tells the stream and attaches it.
    pub(super) fn opened(
        &mut self,
        state: &Replicated,
        new: NewStream,
        session: SessionId,
        result: Result<(), Status>,
    ) {
        let NewStream {
            id: stream,
            tx,
            peer,
            pulse,
        } = new;
        let opened = match result {
            Ok(()) => state.session(session),
            Err(status) => {
                self.output.streams.end(stream, &tx, status);
                None
            }
        };
        let Some(opened) = opened else {
            self.streams.remove(&stream);
            return pulse.end();
        };
        let message = pb::ServerMessage {
            kind: Some(pb::server_message::Kind::Opened(pb::SessionOpened {
                session_id: session.0,
                secret: opened.secret.to_be_bytes().to_vec(),
                ttl_ms: opened.ttl,
                member: self.replica.address.clone().unwrap_or_default(),
            })),
        };
        self.output.streams.push(stream, &tx, message);
        self.attach(session, stream, tx, peer, pulse);
        self.liveness.time(state, session);
        tracing::debug!(%session, ?peer, "session opened");
    }

    /// Attaches `new`'s stream to `session` if the secret is right, and
    /// proposes the heartbeat a resume is.
    pub(super) fn resume(
        &mut self,
        state: &Replicated,
        now: Millis,
        new: NewStream,
        session: SessionId,
        secret: u128,
        proposal: &mut Proposal,
    ) {
        let NewStream {
            id: stream,
            tx,
            peer,
            pulse,
        } = new;
        let resumed = state
            .session(session)
            .filter(|s| !self.shutting_down && s.secret == secret);
        let Some(resumed) = resumed else {
            self.output
                .streams
                .end(stream, &tx, unknown_session(session));
            return pulse.end();
        };
        if self.cut_off && !self.replica.lease_holds(self.lease) {
            // A leader whose batches openraft refuses, and which has heard
            // no quorum since, may be cut off (another may lead already):
            // resumed here, the session's heartbeats would go through a log
            // that refuses them. Sent to another member instead, as the
            // streams it ended were. (A new leader's lease may show late
            // in openraft's metrics: it is not turned away for that.)
            let status = self.cut_off_status("no quorum heard within the leader's lease");
            self.output.streams.end(stream, &tx, status);
            return pulse.end();
        }
        if let Some(old) = self.links.get_mut(&session).and_then(|l| l.attached.take()) {
            self.streams.remove(&old.stream);
            let status = Status::aborted("session resumed on another stream");
            self.output.streams.end(old.stream, &old.tx, status);
            old.pulse.end();
        }
        let message = pb::ServerMessage {
            kind: Some(pb::server_message::Kind::Resumed(pb::SessionResumed {
                session_id: session.0,
                ttl_ms: resumed.ttl,
                member: self.replica.address.clone().unwrap_or_default(),
            })),
        };
        self.output.streams.push(stream, &tx, message);
        for notice in resumed
            .kept()
            .into_iter()
            .flat_map(|kept| kept.lost.values())
        {
            self.output
                .streams
                .push(stream, &tx, convert::lost_to_proto(notice));
        }
        let heartbeat = Command::Heartbeat { session };
        proposal.command(now, heartbeat, None, None, Route::Nobody);
        self.attach(session, stream, tx, peer, pulse);
        tracing::debug!(%session, ?peer, "session resumed");
    }

    /// Attaches `stream` to `session` (open in the replicated state), and
    /// counts the session against `peer`, its client's address; the
    /// stream's reader answers heartbeats with `pulse` once the core has.
    fn attach(
        &mut self,
        session: SessionId,
        stream: StreamId,
        tx: StreamTx,
        peer: Option<SocketAddr>,
        pulse: Arc<Pulse>,
    ) {
        self.liveness.attach(session, pulse.clone());
        let link = self.links.entry(session).or_default();
        link.attached = Some(Attached { stream, tx, pulse });
        self.streams.insert(stream, session);
        if peer.is_some() {
            self.peers.remove(link.peer);
            self.peers.add(peer);
            link.peer = peer;
        }
    }

    /// A stream ended (its session lives on until its TTL); `error` is sent
    /// to it first if it is still attached.
    pub(super) fn detach(&mut self, stream: StreamId, error: Option<Status>) {
        let Some(session) = self.streams.remove(&stream) else {
            return;
        };
        let Some(link) = self.links.get_mut(&session) else {
            return;
        };
        if link.attached.as_ref().is_some_and(|a| a.stream == stream) {
            let a = link.attached.take().expect("checked");
            if let Some(status) = error {
                self.output.streams.end(a.stream, &a.tx, status);
            }
            a.pulse.end();
            tracing::debug!(%session, "session detached; it lives until its TTL");
        }
    }

    /// `session` ended (applied): its stream is told why and ends, and it no
    /// longer counts against its client's address.
    pub(super) fn end_link(&mut self, session: SessionId, reason: &'static str) {
        self.liveness.forget(session);
        let Some(link) = self.links.remove(&session) else {
            return;
        };
        self.peers.remove(link.peer);
        if let Some(a) = link.attached {
            self.streams.remove(&a.stream);
            let ended = pb::ServerMessage {
                kind: Some(pb::server_message::Kind::Ended(pb::SessionEnded {
                    reason: reason.into(),
                })),
            };
            self.output.streams.push(a.stream, &a.tx, ended);
            a.pulse.end();
        }
        tracing::debug!(%session, reason, "session ended");
    }

    /// An administrator ends `session`: its stream learns why first, rather
    /// than the generic "closed".
    pub(super) fn tell_ended_by_administrator(&mut self, session: SessionId) {
        if let Some(a) = self.links.get_mut(&session).and_then(|l| l.attached.take()) {
            self.streams.remove(&a.stream);
            let ended = pb::ServerMessage {
                kind: Some(pb::server_message::Kind::Ended(pb::SessionEnded {
                    reason: "ended by an administrator".into(),
                })),
            };
            self.output.streams.push(a.stream, &a.tx, ended);
            a.pulse.end();
        }
        tracing::info!(%session, "session ended by an administrator");
    }

    /// Ends every stream with `status`; the sessions live on (their clients
    /// resume them, here or elsewhere).
    pub(super) fn end_streams(&mut self, status: &Status) {
        for link in self.links.values_mut() {
            if let Some(a) = link.attached.take() {
                self.output.streams.end(a.stream, &a.tx, status.clone());
                a.pulse.end();
            }
        }
        self.streams.clear();
    }

    /// The session `stream` speaks for.
    #[cfg(test)]
    pub(in crate::core) fn session_of(&self, stream: StreamId) -> Option<SessionId> {
        self.streams.get(&stream).copied()
    }

    /// Whether `session` has a stream attached here, and its client's
    /// address as last seen here.
    pub(super) fn link_of(&self, session: SessionId) -> (bool, Option<SocketAddr>) {
        self.links
            .get(&session)
            .map_or((false, None), |l| (l.attached.is_some(), l.peer))
    }
}

pub(super) fn unknown_session(session: SessionId) -> Status {
    Status::not_found(format!(
        "unknown session {}: it expired, was closed, or never existed",
        session.0
    ))
}
