//! Applying a logged record: the request-id check of a session's request,
//! the engine call, and what the server keeps beside the engine (kept
//! replies, lost notices, the session table). Everything here depends only
//! on the records applied before, so replay decides exactly what the first
//! run decided. What clients are to hear of it comes out as [`Notice`]s.

use locksmith_core::{Command, Effect, EngineError, Millis, RequestId, SessionId};
use locksmith_proto::v1 as pb;

use super::request_ids::Known;
use super::{Kept, Replicated, SessionState};
use crate::convert;
use crate::entry::{LogRecord, Record};
use crate::metrics::Applied;
use crate::storage::{LostNotice, Outcome};

/// What applying a record has to tell a client, in the order it happened.
/// The leader's front end sends each where it goes; other members and
/// replay drop them (the state already keeps what a client that resumes
/// must get again).
#[derive(Debug, PartialEq)]
pub(crate) enum Notice {
    /// Request `request` of `session` has its final outcome (kept until the
    /// client acknowledges it; a retry gets it again).
    Reply {
        session: SessionId,
        request: u64,
        outcome: Outcome,
    },
    /// Request `request` of `session` is refused; nothing is kept.
    Refused {
        session: SessionId,
        request: u64,
        error: pb::Error,
    },
    /// An acquire of `session` waits, `position` waiters ahead of it.
    Queued {
        session: SessionId,
        request: u64,
        position: u32,
    },
    /// A hold of `session` is lost (kept until acknowledged).
    Lost {
        session: SessionId,
        notice: LostNotice,
    },
    /// `session` ended.
    Ended {
        session: SessionId,
        reason: &'static str,
    },
    /// The outcome of the sessionless acquire `request`.
    Lease { request: u64, outcome: Outcome },
}

/// Why a record that is not a session's request changed nothing.
#[derive(Debug)]
pub(crate) enum Refusal {
    /// The engine refused its command.
    Engine(EngineError),
    /// A close named a session that is not open, or not with that secret.
    UnknownSession(SessionId),
    /// A record of this version, which the cluster has not agreed on.
    NotAgreed(u32),
}

/// What the state does after a command succeeded, besides its effects.
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
            Command::Cancel { session, .. } if *session == SessionId::NONE => After::Nothing,
            Command::Cancel { session, request } => After::Reply {
                session: *session,
                request: request.0,
                outcome: Outcome::Cancelled,
            },
            Command::Release { session, .. }
            | Command::Renew { session, .. }
            | Command::SetHoldCount { session, .. } => match request {
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

impl Replicated {
    /// Applies one committed record, in log order: the one path of every
    /// record on every member, live and on replay. What clients are to hear
    /// of it is added to `notices`. The result is the record's own: a
    /// session's request answers in `notices` whatever happens, so it is
    /// `Ok` for those.
    pub(crate) fn apply(
        &mut self,
        record: &Record,
        notices: &mut Vec<Notice>,
    ) -> Result<(), Refusal> {
        if !self.allows(record.version()) && !matches!(record, Record::ClusterVersion(_)) {
            // A kind not every member reads (a leader that ignored the
            // gate): refused alike on every member that reads it.
            return Err(Refusal::NotAgreed(record.version()));
        }
        let record = match record {
            &Record::ClusterVersion(version) => {
                self.raise_cluster_version(version);
                return Ok(());
            }
            Record::Acks {
                session,
                replies,
                lost,
            } => {
                self.acknowledge(*session, replies, lost);
                return Ok(());
            }
            Record::Command(record) => record,
        };
        // Time never goes backwards, whoever stamped the record.
        let now = record.now.max(self.last_now);
        self.last_now = now;
        let &LogRecord {
            ref command,
            secret,
            request,
            ..
        } = record;
        match (command, request) {
            (Command::Acquire(a), _) if a.session != SessionId::NONE => {
                let (session, id) = (a.session, a.request.0);
                self.apply_request(now, session, id, command, None, notices);
                Ok(())
            }
            (
                Command::Release { session, .. }
                | Command::Renew { session, .. }
                | Command::SetHoldCount { session, .. },
                Some(id),
            ) if *session != SessionId::NONE => {
                let session = *session;
                self.apply_request(now, session, id, command, Some(id), notices);
                Ok(())
            }
            (Command::Cancel { session, request }, Some(_)) if *session != SessionId::NONE => {
                let (session, id) = (*session, request.0);
                self.apply_cancel(now, session, id, notices);
                Ok(())
            }
            (Command::CloseSession { session }, _)
                if self
                    .sessions
                    .get(session)
                    .is_none_or(|s| secret.is_some_and(|secret| s.secret != secret)) =>
            {
                // A client's own close (a unary call) carries the session's
                // secret, and only that secret closes it.
                Err(Refusal::UnknownSession(*session))
            }
            _ => self
                .execute(now, command, secret, request, notices)
                .map_err(Refusal::Engine),
        }
    }

    /// Request `id` of a session (an acquire, release or renew): runs it
    /// unless its id says it already ran or is taken by another request.
    fn apply_request(
        &mut self,
        now: Millis,
        session: SessionId,
        id: u64,
        command: &Command,
        logged_id: Option<u64>,
        notices: &mut Vec<Notice>,
    ) {
        let error = match self.check_request_id(session, id, command) {
            Known::Answered(outcome) => {
                return notices.push(Notice::Reply {
                    session,
                    request: id,
                    outcome,
                })
            }
            // Still queued: a retry after a resume keeps its place.
            Known::Waiting => return,
            Known::Conflict(error) => error,
            Known::New => match self.execute(now, command, None, logged_id, notices) {
                Ok(()) => return,
                // Queued before a restart, recovered from a snapshot (so
                // without a fingerprint): the retry after the resume keeps
                // its place.
                Err(EngineError::DuplicateRequest(_)) => return,
                Err(error) => {
                    self.forget_request_id(session, id);
                    convert::engine_error_to_proto(&error)
                }
            },
        };
        notices.push(Notice::Refused {
            session,
            request: id,
            error,
        });
    }

    /// A session's cancel of its request `id`.
    fn apply_cancel(
        &mut self,
        now: Millis,
        session: SessionId,
        id: u64,
        notices: &mut Vec<Notice>,
    ) {
        if let Some(outcome) = self
            .sessions
            .get(&session)
            .and_then(|s| s.kept()?.replies.get(&id))
            .cloned()
        {
            return notices.push(Notice::Reply {
                session,
                request: id,
                outcome,
            });
        }
        let cancel = Command::Cancel {
            session,
            request: RequestId(id),
        };
        if self.execute(now, &cancel, None, Some(id), notices).is_err() {
            // Nothing waits under that id (the acquire never arrived):
            // cancelled all the same.
            self.reply(session, id, Outcome::Cancelled, notices);
        }
    }

    /// The client of `session` acknowledged these replies and lost notices.
    fn acknowledge(&mut self, session: SessionId, replies: &[u64], lost: &[u64]) {
        if let Some(state) = self.sessions.get_mut(&session) {
            let kept = state.kept_mut();
            for &id in replies {
                kept.replies.remove(&id);
                kept.fingerprints.remove(&id);
            }
            for &token in lost {
                kept.lost.remove(&token);
            }
            state.tidy();
        }
    }

    /// Runs one command on the engine, turns its effects into notices and
    /// does what the server keeps beside the engine.
    fn execute(
        &mut self,
        now: Millis,
        command: &Command,
        secret: Option<u128>,
        request: Option<u64>,
        notices: &mut Vec<Notice>,
    ) -> Result<(), EngineError> {
        let after = After::of(command, secret, request);
        if let Command::Acquire(a) = command {
            if a.session == SessionId::NONE {
                self.next_unary = self.next_unary.max(a.request.0.saturating_add(1));
            }
        }
        let seen = self.history.before(now, command);
        let applied = Applied::of(command);
        let last_token = self.engine.last_token();
        let mut effects = std::mem::take(&mut self.effects);
        let result = self.engine.apply_borrowed(now, command, &mut effects);
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
                self.sessions
                    .insert(session, SessionState::new(secret, ttl, Kept::default()));
            }
            for effect in effects.drain(..) {
                self.note(effect, notices);
            }
            match after {
                After::End { session, reason } => {
                    if self.sessions.remove(&session).is_some() {
                        notices.push(Notice::Ended { session, reason });
                    }
                }
                After::Reply {
                    session,
                    request,
                    outcome,
                } => self.reply(session, request, outcome, notices),
                After::Nothing | After::Open { .. } => {}
            }
        }
        effects.clear();
        self.effects = effects;
        result
    }

    /// Keeps what an engine effect leaves for a session, and says it.
    fn note(&mut self, effect: Effect, notices: &mut Vec<Notice>) {
        match effect {
            Effect::Granted {
                session,
                request,
                tokens,
            } => self.outcome(session, request, Outcome::Granted(tokens), notices),
            Effect::Queued {
                session,
                request,
                position,
            } => notices.push(Notice::Queued {
                session,
                request: request.0,
                position,
            }),
            Effect::WouldBlock { session, request } => {
                self.outcome(session, request, Outcome::WouldBlock, notices)
            }
            Effect::TimedOut { session, request } => {
                self.outcome(session, request, Outcome::TimedOut, notices)
            }
            Effect::Lost {
                session,
                owner,
                name,
                token,
                reason,
            } => {
                let Some(state) = self.sessions.get_mut(&session) else {
                    return;
                };
                let notice = LostNotice {
                    name,
                    owner,
                    token,
                    reason,
                };
                state.kept_mut().lost.insert(token, notice.clone());
                notices.push(Notice::Lost { session, notice });
            }
        }
    }

    /// The final outcome of an acquire: a session's, kept; a sessionless
    /// one's, only said.
    fn outcome(
        &mut self,
        session: SessionId,
        request: RequestId,
        outcome: Outcome,
        notices: &mut Vec<Notice>,
    ) {
        if session == SessionId::NONE {
            return notices.push(Notice::Lease {
                request: request.0,
                outcome,
            });
        }
        self.reply(session, request.0, outcome, notices);
    }

    /// Keeps a final reply for the session (the oldest is forgotten past
    /// `max_unacked`) and says it.
    fn reply(
        &mut self,
        session: SessionId,
        request: u64,
        outcome: Outcome,
        notices: &mut Vec<Notice>,
    ) {
        let Some(state) = self.sessions.get_mut(&session) else {
            return;
        };
        notices.push(Notice::Reply {
            session,
            request,
            outcome: outcome.clone(),
        });
        let kept = state.kept_mut();
        kept.replies.insert(request, outcome);
        if kept.replies.len() > self.max_unacked {
            if let Some((forgotten, _)) = kept.replies.pop_first() {
                kept.fingerprints.remove(&forgotten);
            }
        }
    }
}
