//! A client's messages checked and turned into the core's ops: what can be
//! checked without the lock table (names, labels, modes, owners, TTL bounds,
//! the order of open and resume, the caller's permissions), for the unary
//! calls ([`crate::service`]) and for each session stream's messages
//! ([`StreamReader`], used by the stream's reader task). An invalid request
//! is answered with its own error; a message that breaks the stream protocol
//! ends that stream only, before anything of its batch runs.

use std::net::SocketAddr;
use std::sync::Arc;

use locksmith_core::{ClientInfo, EngineError, Millis, SessionId};
use locksmith_proto::v1 as pb;
use tonic::Status;

use crate::auth::{Caller, Permission};
use crate::convert::{self, check_label};
use crate::inbox::CoreSender;
use crate::op::{Acks, AcquireArgs, HoldArgs, NewStream, Op, StreamId, StreamOp, WaitArg};
use crate::pulse::Pulse;
use crate::raft::propose::HeartbeatLease;
use crate::stream_queue::StreamTx;

/// The error of an invalid request.
pub(crate) fn invalid(message: impl Into<String>) -> pb::Error {
    convert::error(pb::ErrorCode::InvalidArgument, message)
}

pub(crate) fn status_of(error: pb::Error) -> Status {
    convert::error_to_status(&error)
}

pub(crate) fn check_name(name: &str) -> Result<(), Status> {
    convert::check_name(name).map_err(status_of)
}

/// Checks an acquire message and turns it into the core's form.
pub(crate) fn acquire_args(
    acquire: pb::Acquire,
    max_label: usize,
) -> Result<AcquireArgs, pb::Error> {
    let mode = convert::mode_from_proto(acquire.mode, acquire.permits).map_err(invalid)?;
    check_label("owner", &acquire.owner, max_label, true).map_err(invalid)?;
    let wait = match pb::WaitKind::try_from(acquire.wait) {
        Ok(pb::WaitKind::No) => WaitArg::No,
        Ok(pb::WaitKind::For) => WaitArg::For(acquire.wait_ms),
        Ok(pb::WaitKind::Forever) => WaitArg::Forever,
        Err(_) => return Err(invalid(format!("unknown wait kind {}", acquire.wait))),
    };
    Ok(AcquireArgs {
        names: acquire.names,
        mode,
        owner: acquire.owner,
        wait,
        lease: acquire.lease_ms,
        reentrant: acquire.reentrant,
        lock_delay: acquire.lock_delay_ms,
        notify_queued: acquire.notify_queued,
    })
}

pub(crate) fn hold_args(
    name: String,
    owner: String,
    token: Option<u64>,
    max_label: usize,
) -> Result<HoldArgs, pb::Error> {
    convert::check_name(&name)?;
    check_label("owner", &owner, max_label, true).map_err(invalid)?;
    Ok(HoldArgs { name, owner, token })
}

pub(crate) fn secret_of(bytes: &[u8]) -> Option<u128> {
    Some(u128::from_be_bytes(bytes.try_into().ok()?))
}

/// What the reading side of a session stream (or of a `Sessions` stream,
/// for all its channels) knows: where its ops go, and what its messages are
/// checked against on their way there.
pub(crate) struct StreamReader {
    pub(crate) core: CoreSender,
    pub(crate) max_label: usize,
    /// The client's address, if the transport knows it.
    pub(crate) peer: Option<SocketAddr>,
    /// Session TTL bounds, inclusive.
    pub(crate) ttl: (Millis, Millis),
    /// Whose stream it is: each request is checked against its grants.
    pub(crate) caller: Caller,
    /// Whether this member leads under its lease: the reader answers
    /// heartbeats itself only while it does (none: never).
    pub(crate) lease: Option<HeartbeatLease>,
}

impl StreamReader {
    /// The core's op for the first message of `stream`, which must open or
    /// resume a session, or the status that ends the stream. `tx` and
    /// `pulse` become the stream's in the core.
    pub(crate) fn opening(
        &self,
        stream: StreamId,
        first: Option<pb::client_message::Kind>,
        tx: &StreamTx,
        pulse: &Arc<Pulse>,
    ) -> Result<Op, Status> {
        let stream = NewStream {
            id: stream,
            tx: tx.clone(),
            peer: self.peer,
            pulse: pulse.clone(),
        };
        match first {
            Some(pb::client_message::Kind::Open(open)) => {
                check_label("client_name", &open.client_name, self.max_label, false)
                    .and_then(|()| check_label("host", &open.host, self.max_label, false))
                    .map_err(Status::invalid_argument)?;
                let (min_ms, max_ms) = self.ttl;
                if !(min_ms..=max_ms).contains(&open.ttl_ms) {
                    let error = EngineError::OutOfRange {
                        what: "session TTL",
                        value_ms: open.ttl_ms,
                        min_ms,
                        max_ms,
                    };
                    return Err(convert::engine_error_to_status(&error));
                }
                Ok(Op::Open {
                    stream,
                    info: ClientInfo {
                        name: open.client_name,
                        host: open.host,
                    },
                    ttl: open.ttl_ms,
                })
            }
            Some(pb::client_message::Kind::Resume(resume)) => {
                let secret = secret_of(&resume.secret)
                    .ok_or_else(|| Status::invalid_argument("a session secret is 16 bytes"))?;
                Ok(Op::Resume {
                    stream,
                    session: SessionId(resume.session_id),
                    secret,
                })
            }
            _ => Err(Status::failed_precondition(
                "the first message of a session stream must be open or resume",
            )),
        }
    }

    /// The core's op for a batch on attached `stream`: [`Op::Stream`], or
    /// [`Op::Detach`] with the reason when a message breaks the stream
    /// protocol (nothing of the batch runs then); `None` for an empty batch.
    pub(crate) fn batch(&self, stream: StreamId, batch: pb::ClientBatch) -> Option<Op> {
        let acks = Acks {
            replies: batch.ack_replies,
            lost: batch.ack_lost,
        };
        if batch.messages.is_empty() && acks.replies.is_empty() && acks.lost.is_empty() {
            return None;
        }
        let ops = batch
            .messages
            .into_iter()
            .map(|message| self.stream_op(message.kind))
            .collect::<Result<Vec<_>, Status>>();
        Some(match ops {
            Ok(ops) => Op::Stream { stream, acks, ops },
            Err(status) => Op::Detach {
                stream,
                error: Some(status),
            },
        })
    }

    /// The core's form of one message; `Err` ends the stream.
    fn stream_op(&self, kind: Option<pb::client_message::Kind>) -> Result<StreamOp, Status> {
        use pb::client_message::Kind;
        Ok(match kind {
            None => StreamOp::AckOnly,
            Some(Kind::Heartbeat(_)) => StreamOp::Heartbeat,
            Some(Kind::Cancel(cancel)) => StreamOp::Cancel { id: cancel.id },
            Some(Kind::Close(_)) => StreamOp::Close,
            Some(Kind::Open(_)) | Some(Kind::Resume(_)) => {
                return Err(Status::failed_precondition(
                    "this stream already carries a session (one session per stream)",
                ))
            }
            Some(Kind::Request(request)) => {
                let id = request.id;
                let permitted = match &request.op {
                    Some(pb::request::Op::Acquire(acquire)) => self
                        .caller
                        .check(Permission::Lock, acquire.names.iter().map(String::as_str)),
                    Some(pb::request::Op::Release(r)) => {
                        self.caller.check(Permission::Lock, [r.name.as_str()])
                    }
                    Some(pb::request::Op::Renew(r)) => {
                        self.caller.check(Permission::Lock, [r.name.as_str()])
                    }
                    Some(pb::request::Op::SetHoldCount(r)) => {
                        self.caller.check(Permission::Lock, [r.name.as_str()])
                    }
                    None => Ok(()),
                };
                match permitted {
                    Ok(()) => {}
                    // The identity left the auth file: the stream ends.
                    Err(status) if status.code() == tonic::Code::Unauthenticated => {
                        return Err(status)
                    }
                    Err(status) => {
                        let error =
                            convert::error(pb::ErrorCode::PermissionDenied, status.message());
                        return Ok(StreamOp::Invalid { id, error });
                    }
                }
                let checked = match request.op {
                    None => Err(invalid("request without an operation")),
                    Some(pb::request::Op::Acquire(acquire)) => {
                        acquire_args(acquire, self.max_label)
                            .map(|args| StreamOp::Acquire { id, args })
                    }
                    Some(pb::request::Op::Release(r)) => {
                        hold_args(r.name, r.owner, r.token, self.max_label)
                            .map(|hold| StreamOp::Release { id, hold })
                    }
                    Some(pb::request::Op::Renew(r)) => {
                        hold_args(r.name, r.owner, r.token, self.max_label).map(|hold| {
                            StreamOp::Renew {
                                id,
                                hold,
                                lease: r.lease_ms,
                            }
                        })
                    }
                    Some(pb::request::Op::SetHoldCount(r)) => {
                        hold_args(r.name, r.owner, Some(r.token), self.max_label).map(|hold| {
                            StreamOp::SetHoldCount {
                                id,
                                hold,
                                count: r.count,
                            }
                        })
                    }
                };
                checked.unwrap_or_else(|error| StreamOp::Invalid { id, error })
            }
        })
    }
}

/// The checks and conversions of this module, run on decoded messages without a core
/// (the `fuzzing` feature's entry points).
#[cfg(feature = "fuzzing")]
pub(crate) mod fuzzing {
    use locksmith_core::{Engine, SessionId};
    use locksmith_proto::prost::Message;
    use locksmith_proto::v1 as pb;

    use super::{acquire_args, check_label, check_name, hold_args, secret_of, StreamReader};
    use crate::config::ServerConfig;
    use crate::op::StreamOp;

    /// What a session stream makes of one message: the opening checks, then
    /// the conversion; each acquire is applied to `engine` as session 1.
    pub(crate) fn stream_message(
        config: &ServerConfig,
        kind: Option<pb::client_message::Kind>,
        engine: &mut Engine,
    ) {
        let max_label = config.max_label_bytes;
        match &kind {
            Some(pb::client_message::Kind::Open(open)) => {
                let _ = check_label("client_name", &open.client_name, max_label, false);
                let _ = check_label("host", &open.host, max_label, false);
            }
            Some(pb::client_message::Kind::Resume(resume)) => {
                let _ = secret_of(&resume.secret);
            }
            _ => {}
        }
        let reader = StreamReader {
            core: crate::inbox::CoreSender::channel().0,
            max_label,
            peer: None,
            ttl: (config.limits.min_ttl, config.limits.max_ttl),
            // Authentication off: the checks that follow it are the same.
            caller: crate::auth::Caller::of(None, &tonic::Request::new(()))
                .expect("with authentication off anyone may call"),
            lease: None,
        };
        if let Ok(StreamOp::Acquire { id, args }) = reader.stream_op(kind) {
            let command = args.into_command(SessionId(1), id, 0);
            let _ = engine.apply(0, command, &mut Vec::new());
        }
    }

    /// What the unary calls check of their requests.
    pub(crate) fn unary_requests(config: &ServerConfig, bytes: &[u8]) {
        let max_label = config.max_label_bytes;
        if let Ok(request) = pb::AcquireLeaseRequest::decode(bytes) {
            if let Some(acquire) = request.acquire {
                let _ = acquire_args(acquire, max_label);
            }
        }
        if let Ok(request) = pb::ReleaseRequest::decode(bytes) {
            if let Some(r) = request.release {
                let _ = hold_args(r.name, r.owner, r.token, max_label);
            }
        }
        if let Ok(request) = pb::RenewRequest::decode(bytes) {
            if let Some(r) = request.renew {
                let _ = hold_args(r.name, r.owner, r.token, max_label);
            }
        }
        if let Ok(request) = pb::DescribeRequest::decode(bytes) {
            let _ = check_name(&request.name);
        }
        if let Ok(request) = pb::ForceReleaseRequest::decode(bytes) {
            let _ = check_name(&request.name);
        }
        if let Ok(request) = pb::CloseSessionRequest::decode(bytes) {
            let _ = secret_of(&request.secret);
        }
        let _ = pb::ListRequest::decode(bytes);
        let _ = pb::HistoryRequest::decode(bytes);
        let _ = pb::EndSessionRequest::decode(bytes);
    }
}
