//! Handling each request of a batch: the match over [`Op`] and over the
//! messages of a session stream, turned into engine commands.

use std::collections::HashMap;

use locksmith_core::{Command, EngineError, Millis, RequestId, SessionId};
use locksmith_proto::v1 as pb;
use tonic::Status;

use super::request_ids::Known;
use super::session::unknown_session;
use super::Core;
use crate::convert::{self, engine_error_to_status};
use crate::op::{Op, StreamOp};
use crate::outbox::LeaseWaiter;
use crate::storage::Outcome;

impl Core {
    pub(super) fn handle(&mut self, now: Millis, op: Op) {
        match op {
            Op::Open { stream, info, ttl } => self.open(now, stream, info, ttl),
            Op::Resume {
                stream,
                session,
                secret,
            } => self.resume(now, stream, session, secret),
            Op::Stream { stream, acks, ops } => {
                let Some(&session) = self.streams.get(&stream) else {
                    return; // a stream that was detached or resumed elsewhere
                };
                if let Some(entry) = self.sessions.get_mut(&session) {
                    for id in acks.replies {
                        entry.replies.remove(&id);
                        entry.fingerprints.remove(&id);
                    }
                    for token in acks.lost {
                        entry.lost.remove(&token);
                    }
                }
                for op in ops {
                    // A close (or an expiry) ends the session midway: the rest
                    // of the batch has no session to run in.
                    if self.streams.get(&stream) != Some(&session) {
                        break;
                    }
                    self.stream_op(now, session, op);
                }
            }
            Op::Detach { stream, error } => {
                let Some(session) = self.streams.remove(&stream) else {
                    return;
                };
                let Some(entry) = self.sessions.get_mut(&session) else {
                    return;
                };
                if entry.attached.as_ref().is_some_and(|a| a.stream == stream) {
                    let a = entry.attached.take().expect("checked");
                    if let Some(status) = error {
                        self.output.streams.end(a.stream, &a.tx, status);
                    }
                    a.ended.cancel();
                    tracing::debug!(%session, "session detached; it lives until its TTL");
                }
            }
            Op::AcquireLease {
                request,
                args,
                reply,
            } => {
                if self.shutting_down {
                    return self.defer(reply, Err(Status::unavailable("shutting down")));
                }
                self.leases.insert(
                    request,
                    LeaseWaiter {
                        reply,
                        names: args.names.clone(),
                        owner: args.owner.clone(),
                    },
                );
                let command = args.into_command(SessionId::NONE, request, now);
                if let Err(error) = self.execute(now, command, None, None) {
                    if let Some(waiter) = self.leases.remove(&request) {
                        self.defer(waiter.reply, Err(engine_error_to_status(&error)));
                    }
                }
            }
            Op::CancelLease { request } => {
                if self.leases.remove(&request).is_some() {
                    let cancel = Command::Cancel {
                        session: SessionId::NONE,
                        request: RequestId(request),
                    };
                    let _ = self.execute(now, cancel, None, None);
                }
            }
            Op::Release { hold, reply } => {
                let command = Command::Release {
                    session: SessionId::NONE,
                    owner: hold.owner,
                    name: hold.name,
                    token: hold.token,
                };
                let result = self
                    .execute(now, command, None, None)
                    .map(|()| pb::ReleaseResponse {})
                    .map_err(|e| engine_error_to_status(&e));
                self.defer(reply, result);
            }
            Op::Renew { hold, lease, reply } => {
                let command = Command::Renew {
                    session: SessionId::NONE,
                    owner: hold.owner,
                    name: hold.name,
                    token: hold.token,
                    lease,
                };
                let result = self
                    .execute(now, command, None, None)
                    .map(|()| pb::RenewResponse {})
                    .map_err(|e| engine_error_to_status(&e));
                self.defer(reply, result);
            }
            Op::Describe { name, reply } => {
                let lock = self.engine.describe(&name).map(|info| {
                    let expiry = self.session_expiry(&[&info]);
                    convert::lock_info_to_proto(info, &expiry)
                });
                self.defer(reply, Ok(pb::DescribeResponse { lock, now_ms: now }));
            }
            Op::List { prefix, reply } => {
                let infos = self.engine.list(&prefix);
                let expiry = self.session_expiry(&infos.iter().collect::<Vec<_>>());
                let locks = infos
                    .into_iter()
                    .map(|info| convert::lock_info_to_proto(info, &expiry))
                    .collect();
                self.defer(reply, Ok(pb::ListResponse { locks, now_ms: now }));
            }
            Op::ListSessions { reply } => {
                let sessions = self
                    .engine
                    .sessions()
                    .into_iter()
                    .map(|s| pb::SessionInfo {
                        session_id: s.session.0,
                        client_name: s.info.name,
                        host: s.info.host,
                        ttl_ms: s.ttl,
                        expires_at_ms: s.expires_at,
                        holds: s.holds as u64,
                        connected: self
                            .sessions
                            .get(&s.session)
                            .is_some_and(|e| e.attached.is_some()),
                        peer: self
                            .sessions
                            .get(&s.session)
                            .and_then(|e| e.peer)
                            .map(|p| p.to_string())
                            .unwrap_or_default(),
                    })
                    .collect();
                self.defer(
                    reply,
                    Ok(pb::ListSessionsResponse {
                        sessions,
                        now_ms: now,
                    }),
                );
            }
            Op::History { prefix, reply } => {
                let grants = self.history.query(now, &prefix);
                self.defer(
                    reply,
                    Ok(pb::HistoryResponse {
                        grants,
                        now_ms: now,
                    }),
                );
            }
            Op::ForceRelease { name, reply } => {
                let result = self
                    .execute(now, Command::ForceRelease { name }, None, None)
                    .map(|()| pb::ForceReleaseResponse {})
                    .map_err(|e| engine_error_to_status(&e));
                self.defer(reply, result);
            }
            Op::CloseSession {
                session,
                secret,
                reply,
            } => {
                let result = if self
                    .sessions
                    .get(&session)
                    .is_some_and(|e| e.secret == secret)
                {
                    self.execute(now, Command::CloseSession { session }, None, None)
                        .map(|()| pb::CloseSessionResponse {})
                        .map_err(|e| engine_error_to_status(&e))
                } else {
                    Err(unknown_session(session))
                };
                self.defer(reply, result);
            }
            Op::EndSession { session, reply } => {
                let result = match self.sessions.get_mut(&session) {
                    Some(entry) => {
                        // Told first, so that the stream learns why rather
                        // than the generic "closed".
                        if let Some(a) = entry.attached.take() {
                            self.streams.remove(&a.stream);
                            let ended = pb::ServerMessage {
                                kind: Some(pb::server_message::Kind::Ended(pb::SessionEnded {
                                    reason: "ended by an administrator".into(),
                                })),
                            };
                            self.output.streams.push(a.stream, &a.tx, ended);
                            a.ended.cancel();
                        }
                        tracing::info!(%session, "session ended by an administrator");
                        self.execute(now, Command::CloseSession { session }, None, None)
                            .map(|()| pb::EndSessionResponse {})
                            .map_err(|e| engine_error_to_status(&e))
                    }
                    None => Err(unknown_session(session)),
                };
                self.defer(reply, result);
            }
            Op::Shutdown { done } => {
                let _ = done.send(Ok(()));
            }
        }
    }

    /// Expiry of every session holding one of `locks` without a lease.
    pub(super) fn session_expiry(
        &self,
        locks: &[&locksmith_core::LockInfo],
    ) -> HashMap<SessionId, Millis> {
        let needed = locks
            .iter()
            .flat_map(|l| &l.holders)
            .any(|h| h.session != SessionId::NONE);
        if !needed {
            return HashMap::new();
        }
        self.engine
            .sessions()
            .into_iter()
            .map(|s| (s.session, s.expires_at))
            .collect()
    }

    pub(super) fn stream_op(&mut self, now: Millis, session: SessionId, op: StreamOp) {
        let cached = |core: &Core, id: u64| {
            core.sessions
                .get(&session)
                .and_then(|e| e.replies.get(&id))
                .cloned()
        };
        match op {
            StreamOp::AckOnly => {}
            StreamOp::Heartbeat => {
                let mut effects = Vec::new();
                match self
                    .engine
                    .apply(now, Command::Heartbeat { session }, &mut effects)
                {
                    Ok(()) => self.send_to(
                        session,
                        pb::ServerMessage {
                            kind: Some(pb::server_message::Kind::Heartbeat(pb::HeartbeatAck {
                                now_ms: now,
                            })),
                        },
                    ),
                    Err(_) => self.end_session(session, "expired"),
                }
            }
            StreamOp::Acquire { id, args } => {
                let notify_queued = args.notify_queued;
                let command = args.into_command(session, id, now);
                self.request(now, session, id, command, notify_queued);
            }
            StreamOp::Release { id, hold } => {
                let command = Command::Release {
                    session,
                    owner: hold.owner,
                    name: hold.name,
                    token: hold.token,
                };
                self.request(now, session, id, command, false);
            }
            StreamOp::Renew { id, hold, lease } => {
                let command = Command::Renew {
                    session,
                    owner: hold.owner,
                    name: hold.name,
                    token: hold.token,
                    lease,
                };
                self.request(now, session, id, command, false);
            }
            StreamOp::Cancel { id } => {
                if let Some(outcome) = cached(self, id) {
                    return self.resend(session, id, &outcome);
                }
                let cancel = Command::Cancel {
                    session,
                    request: RequestId(id),
                };
                if self.execute(now, cancel, None, Some(id)).is_err() {
                    // Nothing waits under that id (the acquire never arrived):
                    // cancelled all the same.
                    self.reply(session, id, Outcome::Cancelled);
                }
            }
            StreamOp::Close => {
                let _ = self.execute(now, Command::CloseSession { session }, None, None);
            }
            StreamOp::Invalid { id, error } => self.send_error(session, id, error),
        }
    }

    /// Runs request `id` (an acquire, release or renew) unless its id says
    /// it already ran or is taken by another request.
    fn request(
        &mut self,
        now: Millis,
        session: SessionId,
        id: u64,
        command: Command,
        notify_queued: bool,
    ) {
        match self.check_request_id(session, id, &command) {
            Known::Answered(outcome) => return self.resend(session, id, &outcome),
            // Still queued: a retry after a resume keeps its place.
            Known::Waiting => return,
            Known::Conflict(error) => return self.send_error(session, id, error),
            Known::New => {}
        }
        // Acquires log their id inside the command, releases and renews
        // beside it.
        let logged_id = (!matches!(command, Command::Acquire(_))).then_some(id);
        self.notify_queued = notify_queued;
        let result = self.execute(now, command, None, logged_id);
        self.notify_queued = false;
        match result {
            Ok(()) => {}
            // Queued before a restart, recovered from a snapshot (so without
            // a fingerprint): the retry after the resume keeps its place.
            Err(EngineError::DuplicateRequest(_)) => {}
            Err(error) => {
                self.forget_request_id(session, id);
                self.send_error(session, id, convert::engine_error_to_proto(&error));
            }
        }
    }

    pub(super) fn resend(&mut self, session: SessionId, id: u64, outcome: &Outcome) {
        let message = convert::reply(id, convert::outcome_to_proto(outcome));
        self.send_to(session, message);
    }
}
