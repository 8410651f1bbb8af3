//! Sending what an applied record produced: its [`Notice`]s to the streams
//! of the sessions they name and to the sessionless acquires waiting here,
//! and its result where its [`Route`] says. A member that proposed nothing
//! of it (a follower, or a replay) has no streams or waiters for it, so
//! the same code sends nothing there.

use locksmith_core::{Command, Millis, SessionId};
use locksmith_proto::v1 as pb;
use tonic::Status;

use super::sessions::unknown_session;
use super::{FrontEnd, Proposal, Route};
use crate::convert::{self, engine_error_to_status};
use crate::core::replicated::{Notice, Refusal, Replicated};
use crate::op::UnaryReply;
use crate::storage::Outcome;

impl FrontEnd {
    /// Before a record of `route` is applied: an administrator's end of a
    /// session tells its stream why first, rather than the generic "closed"
    /// its end would send.
    pub(in crate::core) fn before_apply(&mut self, state: &Replicated, route: &Route) {
        if let Route::EndSession { session, .. } = route {
            if state.session(*session).is_some() {
                self.tell_ended_by_administrator(*session);
            }
        }
    }

    /// Sends the `notices` of a record just applied (emptying them) and its
    /// `result` where `route` says.
    pub(in crate::core) fn deliver(
        &mut self,
        state: &Replicated,
        route: Route,
        result: Result<(), Refusal>,
        notices: &mut Vec<Notice>,
    ) {
        let notify_queued = matches!(
            route,
            Route::Stream {
                notify_queued: true
            }
        );
        for notice in notices.drain(..) {
            self.send_notice(notice, notify_queued);
        }
        let status = |refusal: Refusal| match refusal {
            Refusal::Engine(error) => engine_error_to_status(&error),
            Refusal::UnknownSession(session) => unknown_session(session),
            Refusal::NotAgreed(version) => Status::failed_precondition(format!(
                "records of version {version} are not agreed by every member yet"
            )),
        };
        match route {
            Route::Nobody | Route::Stream { .. } => {
                if let Err(refusal) = result {
                    tracing::debug!(?refusal, "a logged command does not apply");
                }
            }
            Route::Heartbeat { session } => {
                if result.is_ok() {
                    self.send_to(session, crate::convert::heartbeat_ack(state.last_now()));
                }
            }
            Route::Open { stream, session } => {
                self.opened(state, stream, session, result.map_err(status))
            }
            Route::Lease { request } => {
                if let Err(refusal) = result {
                    if let Some(waiter) = self.leases.remove(&request) {
                        self.defer(waiter.reply, Err(status(refusal)));
                    }
                }
            }
            Route::Unary(answer) | Route::EndSession { answer, .. } => {
                let result = result.map_err(status);
                self.output.unary.push(Box::new(move || answer(result)));
            }
        }
    }

    /// Sends one notice where it goes; `notify_queued`: the record applied
    /// is a request that asked to hear that it waits.
    fn send_notice(&mut self, notice: Notice, notify_queued: bool) {
        match notice {
            Notice::Reply {
                session,
                request,
                outcome,
            } => {
                let message = convert::reply(request, convert::outcome_to_proto(&outcome));
                self.send_to(session, message);
            }
            Notice::Refused {
                session,
                request,
                error,
            } => self.send_error(session, request, error),
            Notice::Queued {
                session,
                request,
                position,
            } => {
                if notify_queued {
                    let queued = pb::reply::Result::Queued(pb::Queued { position });
                    self.send_to(session, convert::reply(request, queued));
                }
            }
            Notice::Lost { session, notice } => {
                self.send_to(session, convert::lost_to_proto(&notice))
            }
            Notice::Ended { session, reason } => self.end_link(session, reason),
            Notice::Lease { request, outcome } => {
                let Some(waiter) = self.leases.remove(&request) else {
                    return;
                };
                match outcome {
                    Outcome::Granted(tokens) => self.output.lease_grants.push((waiter, tokens)),
                    outcome => {
                        let response = pb::AcquireLeaseResponse {
                            granted: false,
                            tokens: Vec::new(),
                            timed_out: outcome == Outcome::TimedOut,
                        };
                        self.defer(waiter.reply, Ok(response));
                    }
                }
            }
        }
    }

    /// Queues `message` for the stream `session` is attached to, if any.
    pub(super) fn send_to(&mut self, session: SessionId, message: pb::ServerMessage) {
        if let Some(a) = self.links.get(&session).and_then(|l| l.attached.as_ref()) {
            self.output.streams.push(a.stream, &a.tx, message);
        }
    }

    /// Answers request `request` of `session` with `error`.
    pub(in crate::core) fn send_error(
        &mut self,
        session: SessionId,
        request: u64,
        error: pb::Error,
    ) {
        self.send_to(
            session,
            convert::reply(request, pb::reply::Result::Error(error)),
        );
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

    /// Queues a unary call's answer.
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
