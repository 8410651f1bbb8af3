//! Applying a logged record: the request-id check of a session's request,
//! the engine call, and routing its effects (grants, queue positions,
//! timeouts, lost holds) and its result to the batch's output, plus what the
//! server keeps beside the engine (kept replies, lost notices, the session
//! table). Everything here depends only on the records applied before, so
//! replay decides exactly what the first run decided.

use std::collections::{BTreeMap, HashMap};

use locksmith_core::{Command, Effect, EngineError, Millis, RequestId, SessionId};
use locksmith_proto::v1 as pb;
use tonic::Status;

use super::request_ids::Known;
use super::session::{unknown_session, SessionEntry};
use super::{Core, Proposal, Route};
use crate::convert::{self, engine_error_to_status};
use crate::entry::{LogRecord, Record};
use crate::metrics::Applied;
use crate::op::UnaryReply;
use crate::storage::{LostNotice, Outcome};

/// What the core does after a command succeeded, besides routing its effects.
enum After {
    Nothing,
    Open {
        session: SessionId,
        secret: u128,
        ttl: Millis,
    },
    End {
        session: SessionId,
        reason: &'static str,
    },
    Reply {
        session: SessionId,
        request: u64,
        outcome: Outcome,
    },
    CancelLease {
        request: u64,
    },
}

impl After {
    fn of(command: &Command, secret: Option<u128>, request: Option<u64>) -> After {
        match command {
            Command::OpenSession { session, ttl, .. } => After::Open {
                session: *session,
                secret: secret.unwrap_or_default(),
                ttl: *ttl,
            },
            Command::CloseSession { session } => After::End {
                session: *session,
                reason: "closed",
            },
            Command::ExpireSession { session, .. } => After::End {
                session: *session,
                reason: "expired",
            },
            Command::Cancel { session, request } if *session == SessionId::NONE => {
                After::CancelLease { request: request.0 }
            }
            Command::Cancel { session, request } => After::Reply {
                session: *session,
                request: request.0,
                outcome: Outcome::Cancelled,
            },
            Command::Release { session, .. } | Command::Renew { session, .. } => match request {
                Some(request) => After::Reply {
                    session: *session,
                    request,
                    outcome: Outcome::Done,
                },
                None => After::Nothing,
            },
            _ => After::Nothing,
        }
    }
}

impl Core {
    /// Applies one logged record and sends its results where `route` says:
    /// the one path of every record, live and on replay (with
    /// [`Route::Nobody`]).
    pub(super) fn apply(&mut self, record: Record, route: Route) {
        let record = match record {
            Record::Acks {
                session,
                replies,
                lost,
            } => return self.acknowledge(session, replies, lost),
            Record::Command(record) => record,
        };
        // Time never goes backwards, whoever stamped the record.
        let now = record.now.max(self.last_now);
        self.last_now = now;
        let LogRecord {
            command,
            secret,
            request,
            ..
        } = record;
        match (&command, request) {
            (Command::Acquire(a), _) if a.session != SessionId::NONE => {
                let (session, id) = (a.session, a.request.0);
                self.apply_request(now, session, id, command, None, route)
            }
            (Command::Release { session, .. } | Command::Renew { session, .. }, Some(id))
                if *session != SessionId::NONE =>
            {
                let session = *session;
                self.apply_request(now, session, id, command, Some(id), route)
            }
            (Command::Cancel { session, request }, Some(_)) if *session != SessionId::NONE => {
                let (session, id) = (*session, request.0);
                self.apply_cancel(now, session, id)
            }
            _ => self.apply_command(now, command, secret, request, route),
        }
    }

    /// A record that is not a session's request: runs it, answers its route.
    fn apply_command(
        &mut self,
        now: Millis,
        command: Command,
        secret: Option<u128>,
        request: Option<u64>,
        route: Route,
    ) {
        let refused = match (&command, secret, &route) {
            // Closing with a secret is a client's own close (a unary call):
            // only with the session's secret.
            (Command::CloseSession { session }, Some(secret), _)
                if self
                    .sessions
                    .get(session)
                    .is_none_or(|e| e.secret != secret) =>
            {
                Some(unknown_session(*session))
            }
            (Command::CloseSession { session }, None, Route::EndSession(_))
                if !self.sessions.contains_key(session) =>
            {
                Some(unknown_session(*session))
            }
            _ => None,
        };
        if let Some(status) = refused {
            if let Route::Unary(answer) | Route::EndSession(answer) = route {
                self.output
                    .unary
                    .push(Box::new(move || answer(Err(status))));
            }
            return;
        }
        let opening = match &command {
            Command::OpenSession { session, .. } => *session,
            _ => SessionId::NONE,
        };
        let lease = match &command {
            Command::Acquire(a) => a.request.0,
            _ => 0,
        };
        let heartbeat_of = match &command {
            Command::Heartbeat { session } => *session,
            _ => SessionId::NONE,
        };
        if let (Route::EndSession(_), Command::CloseSession { session }) = (&route, &command) {
            self.tell_ended_by_administrator(*session);
        }
        let result = self.execute(now, command, secret, request);
        match route {
            Route::Nobody | Route::Stream { .. } => {
                if let Err(error) = result {
                    tracing::debug!(%error, "a logged command does not apply");
                }
            }
            Route::Heartbeat => {
                if result.is_ok() {
                    let ack = pb::ServerMessage {
                        kind: Some(pb::server_message::Kind::Heartbeat(pb::HeartbeatAck {
                            now_ms: now,
                        })),
                    };
                    self.send_to(heartbeat_of, ack);
                }
            }
            Route::Open(new) => self.opened(new, opening, result),
            Route::Lease => {
                if let Err(error) = result {
                    if let Some(waiter) = self.leases.remove(&lease) {
                        self.defer(waiter.reply, Err(engine_error_to_status(&error)));
                    }
                }
            }
            Route::Unary(answer) | Route::EndSession(answer) => {
                let result = result.map_err(|e| engine_error_to_status(&e));
                self.output.unary.push(Box::new(move || answer(result)));
            }
        }
    }

    /// Request `id` of a session (an acquire, release or renew): runs it
    /// unless its id says it already ran or is taken by another request.
    fn apply_request(
        &mut self,
        now: Millis,
        session: SessionId,
        id: u64,
        command: Command,
        logged_id: Option<u64>,
        route: Route,
    ) {
        match self.check_request_id(session, id, &command) {
            Known::Answered(outcome) => return self.resend(session, id, &outcome),
            // Still queued: a retry after a resume keeps its place.
            Known::Waiting => return,
            Known::Conflict(error) => return self.send_error(session, id, error),
            Known::New => {}
        }
        self.notify_queued = matches!(
            route,
            Route::Stream {
                notify_queued: true
            }
        );
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

    /// A session's cancel of its request `id`.
    fn apply_cancel(&mut self, now: Millis, session: SessionId, id: u64) {
        if let Some(outcome) = self
            .sessions
            .get(&session)
            .and_then(|e| e.replies.get(&id))
            .cloned()
        {
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

    /// The client of `session` acknowledged these replies and lost notices.
    fn acknowledge(&mut self, session: SessionId, replies: Vec<u64>, lost: Vec<u64>) {
        if let Some(entry) = self.sessions.get_mut(&session) {
            for id in replies {
                entry.replies.remove(&id);
                entry.fingerprints.remove(&id);
            }
            for token in lost {
                entry.lost.remove(&token);
            }
        }
    }

    /// An administrator ends `session`: its stream learns why first, rather
    /// than the generic "closed".
    fn tell_ended_by_administrator(&mut self, session: SessionId) {
        if let Some(a) = self
            .sessions
            .get_mut(&session)
            .and_then(|e| e.attached.take())
        {
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
    }

    /// Runs one command on the engine, routes its effects and does what the
    /// server keeps beside the engine.
    pub(super) fn execute(
        &mut self,
        now: Millis,
        command: Command,
        secret: Option<u128>,
        request: Option<u64>,
    ) -> Result<(), EngineError> {
        let after = After::of(&command, secret, request);
        let seen = self.history.before(now, &command);
        let applied = Applied::of(&command);
        let last_token = self.engine.last_token();
        let mut effects = std::mem::take(&mut self.effects);
        let result = self.engine.apply(now, command, &mut effects);
        if result.is_ok() {
            let metrics = self.metrics.as_deref();
            self.history.after(now, seen, last_token, &effects, metrics);
            if let Some(metrics) = metrics {
                metrics.applied(applied, &effects);
            }
            if let After::Open {
                session,
                secret,
                ttl,
            } = after
            {
                self.next_session = self.next_session.max(session.0 + 1);
                self.sessions.insert(
                    session,
                    SessionEntry {
                        secret,
                        ttl,
                        attached: None,
                        replies: BTreeMap::new(),
                        fingerprints: HashMap::new(),
                        lost: BTreeMap::new(),
                        peer: None,
                    },
                );
            }
            for effect in effects.drain(..) {
                self.route(effect);
            }
            match after {
                After::End { session, reason } => self.end_session(session, reason),
                After::Reply {
                    session,
                    request,
                    outcome,
                } => self.reply(session, request, outcome),
                After::CancelLease { request } => {
                    self.leases.remove(&request);
                }
                After::Nothing | After::Open { .. } => {}
            }
        }
        effects.clear();
        self.effects = effects;
        result
    }

    /// Sends the kept reply of request `id` again.
    pub(super) fn resend(&mut self, session: SessionId, id: u64, outcome: &Outcome) {
        let message = convert::reply(id, convert::outcome_to_proto(outcome));
        self.send_to(session, message);
    }

    pub(super) fn route(&mut self, effect: Effect) {
        match effect {
            Effect::Granted {
                session,
                request,
                tokens,
            } => {
                if session == SessionId::NONE {
                    if let Some(waiter) = self.leases.remove(&request.0) {
                        self.output.lease_grants.push((waiter, tokens));
                    }
                } else {
                    self.reply(session, request.0, Outcome::Granted(tokens));
                }
            }
            Effect::Queued {
                session,
                request,
                position,
            } => {
                if !self.notify_queued {
                    return;
                }
                let message = convert::reply(
                    request.0,
                    pb::reply::Result::Queued(pb::Queued { position }),
                );
                self.send_to(session, message);
            }
            Effect::WouldBlock { session, request } => {
                self.lease_or_reply(session, request, Outcome::WouldBlock)
            }
            Effect::TimedOut { session, request } => {
                self.lease_or_reply(session, request, Outcome::TimedOut)
            }
            Effect::Lost {
                session,
                owner,
                name,
                token,
                reason,
            } => {
                let Some(entry) = self.sessions.get_mut(&session) else {
                    return;
                };
                let notice = LostNotice {
                    name,
                    owner,
                    token,
                    reason,
                };
                if let Some(a) = &entry.attached {
                    self.output
                        .streams
                        .push(a.stream, &a.tx, convert::lost_to_proto(&notice));
                }
                entry.lost.insert(token, notice);
            }
        }
    }

    pub(super) fn lease_or_reply(
        &mut self,
        session: SessionId,
        request: RequestId,
        outcome: Outcome,
    ) {
        if session != SessionId::NONE {
            return self.reply(session, request.0, outcome);
        }
        if let Some(waiter) = self.leases.remove(&request.0) {
            let response = pb::AcquireLeaseResponse {
                granted: false,
                tokens: Vec::new(),
                timed_out: outcome == Outcome::TimedOut,
            };
            self.output.unary.push(Box::new(move || {
                let _ = waiter.reply.send(Ok(response));
            }));
        }
    }

    /// Keeps a final reply for the session and sends it if a stream is attached.
    pub(super) fn reply(&mut self, session: SessionId, request: u64, outcome: Outcome) {
        let Some(entry) = self.sessions.get_mut(&session) else {
            return;
        };
        if let Some(a) = &entry.attached {
            let message = convert::reply(request, convert::outcome_to_proto(&outcome));
            self.output.streams.push(a.stream, &a.tx, message);
        }
        entry.replies.insert(request, outcome);
        if entry.replies.len() > self.max_unacked {
            if let Some((forgotten, _)) = entry.replies.pop_first() {
                entry.fingerprints.remove(&forgotten);
            }
        }
    }

    pub(super) fn send_to(&mut self, session: SessionId, message: pb::ServerMessage) {
        if let Some(a) = self
            .sessions
            .get(&session)
            .and_then(|e| e.attached.as_ref())
        {
            self.output.streams.push(a.stream, &a.tx, message);
        }
    }

    pub(super) fn send_error(&mut self, session: SessionId, request: u64, error: pb::Error) {
        self.send_to(
            session,
            convert::reply(request, pb::reply::Result::Error(error)),
        );
    }

    pub(super) fn end_session(&mut self, session: SessionId, reason: &'static str) {
        let Some(entry) = self.sessions.remove(&session) else {
            return;
        };
        self.peers.remove(entry.peer);
        if let Some(a) = entry.attached {
            self.streams.remove(&a.stream);
            let ended = pb::ServerMessage {
                kind: Some(pb::server_message::Kind::Ended(pb::SessionEnded {
                    reason: reason.into(),
                })),
            };
            self.output.streams.push(a.stream, &a.tx, ended);
            a.ended.cancel();
        }
        tracing::debug!(%session, reason, "session ended");
    }

    /// Proposes the release of every sessionless grant whose caller went
    /// away before it received it.
    pub(super) fn propose_orphan_releases(&mut self, now: Millis, proposal: &mut Proposal) {
        for orphan in std::mem::take(&mut self.orphans) {
            for (name, token) in orphan.names.into_iter().zip(orphan.tokens) {
                let release = Command::Release {
                    session: SessionId::NONE,
                    owner: orphan.owner.clone(),
                    name,
                    token: Some(token),
                };
                proposal.command(now, release, None, None, Route::Nobody);
            }
        }
    }

    pub(super) fn defer<T: Send + 'static>(
        &mut self,
        reply: UnaryReply<T>,
        value: Result<T, Status>,
    ) {
        self.output.unary.push(Box::new(move || {
            let _ = reply.send(value);
        }));
    }
}
