//! What each op of a batch asks for: the records to log, and where their
//! results go once applied (module `deliver`).
//!
//! Nothing here changes the lock state. An op becomes records (what the
//! client asked, with the time it was decided at) and a [`Route`] for each,
//! local to this server: which stream waits for an opened session, which
//! unary call waits for its answer. What only this server knows (which
//! stream a session is attached to, reply slots) is decided here at once;
//! whatever depends on the lock state (is the lock free, is this request id
//! a retry, is the secret right) is decided when the record is applied, so
//! that replaying the log decides it the same way.

use std::collections::HashMap;

use locksmith_core::{Command, Millis, RequestId, SessionId};
use locksmith_proto::v1 as pb;
use tonic::Status;

use super::{FrontEnd, Proposal, Route};
use crate::convert;
use crate::core::replicated::Replicated;
use crate::entry::Record;
use crate::op::{Op, StreamOp};
use crate::outbox::LeaseWaiter;

impl FrontEnd {
    /// Turns `op` into records of `proposal`, or handles it at once when it
    /// changes nothing replicated.
    pub(in crate::core) fn propose(
        &mut self,
        state: &Replicated,
        now: Millis,
        op: Op,
        proposal: &mut Proposal,
    ) {
        match op {
            Op::Open { stream, info, ttl } => {
                self.propose_open(state, now, stream, info, ttl, proposal)
            }
            Op::Resume {
                stream,
                session,
                secret,
            } => self.resume(state, now, stream, session, secret, proposal),
            Op::Stream { stream, acks, ops } => {
                let Some(&session) = self.streams.get(&stream) else {
                    return; // a stream that was detached or resumed elsewhere
                };
                if !acks.replies.is_empty() || !acks.lost.is_empty() {
                    proposal.records.push(Record::Acks {
                        session,
                        replies: acks.replies,
                        lost: acks.lost,
                    });
                    proposal.routes.push(Route::Nobody);
                }
                for op in ops {
                    self.propose_stream_op(state, now, session, op, proposal);
                }
            }
            Op::Detach { stream, error } => self.detach(stream, error),
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
                proposal.command(now, command, None, None, Route::Lease { request });
            }
            Op::CancelLease { request } => {
                if self.leases.remove(&request).is_some() {
                    let cancel = Command::Cancel {
                        session: SessionId::NONE,
                        request: RequestId(request),
                    };
                    proposal.command(now, cancel, None, None, Route::Nobody);
                }
            }
            Op::Release { hold, reply } => {
                let command = Command::Release {
                    session: SessionId::NONE,
                    owner: hold.owner,
                    name: hold.name,
                    token: hold.token,
                };
                proposal.command(now, command, None, None, Route::unary(reply));
            }
            Op::Renew { hold, lease, reply } => {
                let command = Command::Renew {
                    session: SessionId::NONE,
                    owner: hold.owner,
                    name: hold.name,
                    token: hold.token,
                    lease,
                };
                proposal.command(now, command, None, None, Route::unary(reply));
            }
            Op::ForceRelease { name, reply } => {
                let command = Command::ForceRelease { name };
                proposal.command(now, command, None, None, Route::unary(reply));
            }
            Op::RaiseClusterVersion { version } => {
                proposal.records.push(Record::ClusterVersion(version));
                proposal.routes.push(Route::Nobody);
            }
            Op::CloseSession {
                session,
                secret,
                reply,
            } => {
                // The secret is checked when the record is applied.
                let command = Command::CloseSession { session };
                proposal.command(now, command, Some(secret), None, Route::unary(reply));
            }
            Op::EndSession { session, reply } => {
                let command = Command::CloseSession { session };
                let answer = super::answer(reply);
                proposal.command(
                    now,
                    command,
                    None,
                    None,
                    Route::EndSession { session, answer },
                );
            }
            read @ (Op::Describe { .. }
            | Op::List { .. }
            | Op::ListSessions { .. }
            | Op::History { .. }) => proposal.reads.push(read),
        }
    }

    fn propose_stream_op(
        &mut self,
        state: &Replicated,
        now: Millis,
        session: SessionId,
        op: StreamOp,
        proposal: &mut Proposal,
    ) {
        match op {
            StreamOp::AckOnly => {}
            StreamOp::Heartbeat => {
                let heartbeat = Command::Heartbeat { session };
                proposal.command(now, heartbeat, None, None, Route::Heartbeat { session });
            }
            StreamOp::Acquire { id, args } => {
                let notify_queued = args.notify_queued;
                let command = args.into_command(session, id, now);
                // An acquire carries its id inside the command.
                proposal.command(now, command, None, None, Route::Stream { notify_queued });
            }
            StreamOp::Release { id, hold } => {
                let command = Command::Release {
                    session,
                    owner: hold.owner,
                    name: hold.name,
                    token: hold.token,
                };
                proposal.command(now, command, None, Some(id), Route::ON_STREAM);
            }
            StreamOp::Renew { id, hold, lease } => {
                let command = Command::Renew {
                    session,
                    owner: hold.owner,
                    name: hold.name,
                    token: hold.token,
                    lease,
                };
                proposal.command(now, command, None, Some(id), Route::ON_STREAM);
            }
            StreamOp::SetHoldCount { id, hold, count } => {
                let command = Command::SetHoldCount {
                    session,
                    owner: hold.owner,
                    name: hold.name,
                    token: hold.token.unwrap_or_default(),
                    count,
                };
                if !state.allows(Record::version_of(&command)) {
                    // A member could not decode it: answered at once, in
                    // its place among the batch's answers.
                    let error = convert::error(
                        pb::ErrorCode::Unsupported,
                        "a member of this cluster runs a version that cannot record hold \
                         counts yet (finish the rolling upgrade); nothing changed",
                    );
                    let at = proposal.records.len();
                    proposal.refused.push((at, session, id, error));
                    return;
                }
                proposal.command(now, command, None, Some(id), Route::ON_STREAM);
            }
            StreamOp::Cancel { id } => {
                let cancel = Command::Cancel {
                    session,
                    request: RequestId(id),
                };
                proposal.command(now, cancel, None, Some(id), Route::ON_STREAM);
            }
            StreamOp::Close => {
                let close = Command::CloseSession { session };
                proposal.command(now, close, None, None, Route::Nobody);
            }
            StreamOp::Invalid { id, error } => {
                let at = proposal.records.len();
                proposal.refused.push((at, session, id, error));
            }
        }
    }

    /// Answers an inspection op from the state as applied so far.
    pub(in crate::core) fn read(&mut self, state: &Replicated, now: Millis, op: Op) {
        let engine = state.engine();
        match op {
            Op::Describe { name, reply } => {
                let lock = engine.describe(&name).map(|info| {
                    let expiry = self.session_expiry(state, &[&info]);
                    convert::lock_info_to_proto(info, &expiry)
                });
                self.defer(reply, Ok(pb::DescribeResponse { lock, now_ms: now }));
            }
            Op::List {
                prefix,
                after,
                limit,
                reply,
            } => {
                let page = engine.list_page(&prefix, &after, limit);
                let next_after = match (page.more, page.locks.last()) {
                    (true, Some(last)) => last.name.clone(),
                    _ => String::new(),
                };
                let expiry = self.session_expiry(state, &page.locks.iter().collect::<Vec<_>>());
                let locks = page
                    .locks
                    .into_iter()
                    .map(|info| convert::lock_info_to_proto(info, &expiry))
                    .collect();
                let response = pb::ListResponse {
                    locks,
                    now_ms: now,
                    next_after,
                };
                self.defer(reply, Ok(response));
            }
            Op::ListSessions { reply } => {
                let sessions = engine
                    .sessions()
                    .into_iter()
                    .map(|s| {
                        let (connected, peer) = self.link_of(s.session);
                        pb::SessionInfo {
                            session_id: s.session.0,
                            client_name: s.info.name,
                            host: s.info.host,
                            ttl_ms: s.ttl,
                            expires_at_ms: self
                                .liveness
                                .deadline(state, s.session)
                                .unwrap_or(s.expires_at),
                            holds: s.holds as u64,
                            connected,
                            peer: peer.map(|p| p.to_string()).unwrap_or_default(),
                        }
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
                let grants = state.history().query(now, &prefix);
                self.defer(
                    reply,
                    Ok(pb::HistoryResponse {
                        grants,
                        now_ms: now,
                    }),
                );
            }
            other => unreachable!("not an inspection op: {:?}", std::mem::discriminant(&other)),
        }
    }
}

impl FrontEnd {
    /// When each session holding one of `locks` expires unless heard from,
    /// as this member decides it (module `liveness`).
    fn session_expiry(
        &self,
        state: &Replicated,
        locks: &[&locksmith_core::LockInfo],
    ) -> HashMap<SessionId, Millis> {
        // Only the sessions these locks name: a look-up each, never a walk
        // of every session.
        locks
            .iter()
            .flat_map(|l| &l.holders)
            .filter(|h| h.session != SessionId::NONE)
            .filter_map(|h| Some((h.session, self.liveness.deadline(state, h.session)?)))
            .collect()
    }
}
