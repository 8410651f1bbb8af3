//! Sessions on the server's side: opening, resuming and attaching streams.
//!
//! The engine knows a session's TTL, holds and waiters; the core keeps its
//! resume secret, the stream it is attached to, and the replies and lost
//! notices its client has not acknowledged yet.

use std::collections::BTreeMap;

use locksmith_core::{ClientInfo, Command, Millis, SessionId};
use locksmith_proto::v1 as pb;
use tokio_util::sync::CancellationToken;
use tonic::Status;

use super::Core;
use crate::convert::{self, engine_error_to_status};
use crate::op::{StreamId, StreamTx};
use crate::storage::{LostNotice, Outcome};

/// The server's part of one session.
pub(super) struct SessionEntry {
    pub(super) secret: u128,
    pub(super) ttl: Millis,
    pub(super) attached: Option<Attached>,
    pub(super) replies: BTreeMap<u64, Outcome>,
    pub(super) lost: BTreeMap<u64, LostNotice>,
}

pub(super) struct Attached {
    pub(super) stream: StreamId,
    pub(super) tx: StreamTx,
    pub(super) ended: CancellationToken,
}

impl Core {
    pub(super) fn open(
        &mut self,
        now: Millis,
        stream: StreamId,
        tx: StreamTx,
        ended: CancellationToken,
        info: ClientInfo,
        ttl: Millis,
    ) {
        if self.shutting_down {
            let status = Status::unavailable("lock server is shutting down");
            self.output.streams.end(stream, &tx, status);
            return ended.cancel();
        }
        if self.sessions.len() >= self.max_sessions {
            let status = Status::resource_exhausted(format!(
                "limit reached: sessions (at most {})",
                self.max_sessions
            ));
            self.output.streams.end(stream, &tx, status);
            return ended.cancel();
        }
        let session = SessionId(self.next_session);
        let secret: u128 = rand::random();
        let command = Command::OpenSession {
            session,
            ttl,
            info: info.clone(),
        };
        if let Err(error) = self.execute(now, command, Some(secret), None) {
            self.output
                .streams
                .end(stream, &tx, engine_error_to_status(&error));
            return ended.cancel();
        }
        let opened = pb::ServerMessage {
            kind: Some(pb::server_message::Kind::Opened(pb::SessionOpened {
                session_id: session.0,
                secret: secret.to_be_bytes().to_vec(),
                ttl_ms: ttl,
            })),
        };
        self.output.streams.push(stream, &tx, opened);
        self.attach(session, stream, tx, ended);
        tracing::debug!(%session, client = %info.name, host = %info.host, ttl, "session opened");
    }

    pub(super) fn resume(
        &mut self,
        now: Millis,
        stream: StreamId,
        tx: StreamTx,
        ended: CancellationToken,
        session: SessionId,
        secret: u128,
    ) {
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
            })),
        };
        self.output.streams.push(stream, &tx, resumed);
        for notice in entry.lost.values() {
            self.output
                .streams
                .push(stream, &tx, convert::lost_to_proto(notice));
        }
        let mut effects = Vec::new();
        let _ = self
            .engine
            .apply(now, Command::Heartbeat { session }, &mut effects);
        self.attach(session, stream, tx, ended);
        tracing::debug!(%session, "session resumed");
    }

    pub(super) fn attach(
        &mut self,
        session: SessionId,
        stream: StreamId,
        tx: StreamTx,
        ended: CancellationToken,
    ) {
        if let Some(entry) = self.sessions.get_mut(&session) {
            entry.attached = Some(Attached { stream, tx, ended });
            self.streams.insert(stream, session);
        }
    }
}

pub(super) fn unknown_session(session: SessionId) -> Status {
    Status::not_found(format!(
        "unknown session {}: it expired, was closed, or never existed",
        session.0
    ))
}
