//! Applying a command: the engine call, its log record, and routing its
//! effects (grants, queue positions, timeouts, lost holds) to the batch's
//! output, plus what the server keeps beside the engine (kept replies, lost
//! notices, the session table).

use std::collections::{BTreeMap, HashMap};

use locksmith_core::{Command, Effect, EngineError, Millis, RequestId, SessionId};
use locksmith_proto::v1 as pb;
use tonic::Status;

use super::session::SessionEntry;
use super::Core;
use crate::convert;
use crate::metrics::Applied;
use crate::op::UnaryReply;
use crate::storage::{LogRecordRef, LostNotice, Outcome};

/// What the core does after a command succeeded, besides routing its effects.
enum After {
    Nothing,
    Acquire,
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
            Command::Acquire(_) => After::Acquire,
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
    /// Applies one command: logs it if it changes state, routes its effects and
    /// does what the server keeps beside the engine.
    pub(super) fn execute(
        &mut self,
        now: Millis,
        command: Command,
        secret: Option<u128>,
        request: Option<u64>,
    ) -> Result<(), EngineError> {
        let after = After::of(&command, secret, request);
        let mark = self.log.as_mut().map(|log| {
            log.buffer.begin(&LogRecordRef {
                now,
                command: &command,
                secret,
                request,
            })
        });
        let seen = self.history.before(now, &command);
        let applied = Applied::of(&command);
        let last_token = self.engine.last_token();
        let mut effects = std::mem::take(&mut self.effects);
        let result = self.engine.apply(now, command, &mut effects);
        if let (Some(mark), Some(log)) = (mark, self.log.as_mut()) {
            let no_op = matches!(after, After::Acquire)
                && matches!(
                    effects.as_slice(),
                    [Effect::WouldBlock { .. }] | [Effect::TimedOut { .. }]
                );
            if result.is_ok() && !no_op {
                log.buffer.finish(mark);
                log.since_snapshot += 1;
            } else {
                log.buffer.rollback(mark);
            }
        }
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
                After::Nothing | After::Acquire | After::Open { .. } => {}
            }
        }
        effects.clear();
        self.effects = effects;
        result
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

    pub(super) fn release_orphans(&mut self, now: Millis) {
        for orphan in std::mem::take(&mut self.orphans) {
            for (name, token) in orphan.names.into_iter().zip(orphan.tokens) {
                let release = Command::Release {
                    session: SessionId::NONE,
                    owner: orphan.owner.clone(),
                    name,
                    token: Some(token),
                };
                let _ = self.execute(now, release, None, None);
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
