//! Between the wire types of `locksmith-proto` and the engine's types.

use std::collections::HashMap;

use locksmith_core::{
    validate_name, EngineError, LockInfo, LostReason, Millis, Mode, NameError, SessionId,
};
use locksmith_proto::v1 as pb;
use tonic::{Code, Status};

use crate::storage::{LostNotice, Outcome};

/// The engine mode of a wire mode.
pub(crate) fn mode_from_proto(mode: i32, permits: u32) -> Result<Mode, String> {
    match pb::LockMode::try_from(mode) {
        Ok(pb::LockMode::Exclusive) => Ok(Mode::Exclusive),
        Ok(pb::LockMode::Shared) => Ok(Mode::Shared),
        Ok(pb::LockMode::Semaphore) => Ok(Mode::Semaphore { permits }),
        Err(_) => Err(format!("unknown lock mode {mode}")),
    }
}

/// The wire mode and permits of an engine mode.
pub(crate) fn mode_to_proto(mode: Mode) -> (i32, u32) {
    match mode {
        Mode::Exclusive => (pb::LockMode::Exclusive as i32, 0),
        Mode::Shared => (pb::LockMode::Shared as i32, 0),
        Mode::Semaphore { permits } => (pb::LockMode::Semaphore as i32, permits),
    }
}

/// The wire reason of a loss.
pub(crate) fn lost_reason_to_proto(reason: LostReason) -> i32 {
    (match reason {
        LostReason::SessionExpired => pb::LostReason::SessionExpired,
        LostReason::SessionClosed => pb::LostReason::SessionClosed,
        LostReason::LeaseExpired => pb::LostReason::LeaseExpired,
        LostReason::ForceReleased => pb::LostReason::ForceReleased,
    }) as i32
}

/// A lost notice as a server push.
pub(crate) fn lost_to_proto(notice: &LostNotice) -> pb::ServerMessage {
    pb::ServerMessage {
        kind: Some(pb::server_message::Kind::Lost(pb::Lost {
            name: notice.name.clone(),
            owner: notice.owner.clone(),
            token: notice.token,
            reason: lost_reason_to_proto(notice.reason),
        })),
    }
}

/// A reply message for request `id`.
pub(crate) fn reply(id: u64, result: pb::reply::Result) -> pb::ServerMessage {
    pb::ServerMessage {
        kind: Some(pb::server_message::Kind::Reply(pb::Reply {
            id,
            result: Some(result),
        })),
    }
}

/// The wire form of a kept final reply.
pub(crate) fn outcome_to_proto(outcome: &Outcome) -> pb::reply::Result {
    use pb::reply::Result as R;
    match outcome {
        Outcome::Granted(tokens) => R::Granted(pb::Granted {
            tokens: tokens.clone(),
        }),
        Outcome::WouldBlock => R::WouldBlock(pb::Empty {}),
        Outcome::TimedOut => R::TimedOut(pb::Empty {}),
        Outcome::Done => R::Done(pb::Empty {}),
        Outcome::Cancelled => R::Cancelled(pb::Empty {}),
    }
}

/// A request-level error with a code the client maps to its error enum.
pub(crate) fn error(code: pb::ErrorCode, message: impl Into<String>) -> pb::Error {
    pb::Error {
        code: code as i32,
        message: message.into(),
        ..pb::Error::default()
    }
}

/// The wire form of an engine error.
pub(crate) fn engine_error_to_proto(error: &EngineError) -> pb::Error {
    use pb::ErrorCode as C;
    let message = error.to_string();
    let mut out = pb::Error {
        message,
        ..pb::Error::default()
    };
    let code = match error {
        EngineError::InvalidName { name, error } => {
            out.name = name.clone();
            out.name_error = name_error_to_proto(error) as i32;
            if let NameError::TooLong { len, .. } = error {
                out.name_len = *len as u64;
            }
            C::InvalidName
        }
        EngineError::NotOwner { name } => {
            out.name = name.clone();
            C::NotOwner
        }
        EngineError::NotHeld { name } => {
            out.name = name.clone();
            C::NotHeld
        }
        EngineError::AlreadyHeld { name } => {
            out.name = name.clone();
            C::AlreadyHeld
        }
        EngineError::ModeMismatch {
            name, requested, ..
        } => {
            out.name = name.clone();
            (out.mode, out.permits) = mode_to_proto(*requested);
            C::Conflict
        }
        EngineError::PermitMismatch {
            name, requested, ..
        } => {
            out.name = name.clone();
            (out.mode, out.permits) = mode_to_proto(Mode::Semaphore {
                permits: *requested,
            });
            C::Conflict
        }
        EngineError::LimitReached { .. } => C::LimitReached,
        EngineError::UnknownSession(_) => C::UnknownSession,
        EngineError::NoNames
        | EngineError::DuplicateName { .. }
        | EngineError::ZeroPermits
        | EngineError::ZeroHoldCount
        | EngineError::OutOfRange { .. }
        | EngineError::LeaseRequired
        | EngineError::SessionExists(_)
        | EngineError::DuplicateRequest(_)
        | EngineError::UnknownRequest(_)
        | EngineError::NotDue => C::InvalidArgument,
    };
    out.code = code as i32;
    out
}

/// Checks a lock name by the engine's rules, with the error an acquire gets
/// for it: code, broken rule, length, and at most 64 characters of the name
/// (so a huge name is never echoed back).
pub(crate) fn check_name(name: &str) -> Result<(), pb::Error> {
    validate_name(name).map_err(|error| {
        engine_error_to_proto(&EngineError::InvalidName {
            name: name.chars().take(64).collect(),
            error,
        })
    })
}

fn name_error_to_proto(error: &NameError) -> pb::NameErrorKind {
    match error {
        NameError::Empty => pb::NameErrorKind::Empty,
        NameError::TooLong { .. } => pb::NameErrorKind::TooLong,
        NameError::Nul => pb::NameErrorKind::Nul,
        NameError::EmptySegment => pb::NameErrorKind::EmptySegment,
    }
}

/// The gRPC status of an engine error, for unary calls.
pub(crate) fn engine_error_to_status(error: &EngineError) -> Status {
    error_to_status(&engine_error_to_proto(error))
}

/// The gRPC status of a request-level error, for unary calls.
pub(crate) fn error_to_status(error: &pb::Error) -> Status {
    use pb::ErrorCode as C;
    let code = match C::try_from(error.code).unwrap_or(C::Internal) {
        C::Internal => Code::Internal,
        C::InvalidName | C::InvalidArgument => Code::InvalidArgument,
        C::NotOwner => Code::PermissionDenied,
        C::NotHeld | C::UnknownSession => Code::NotFound,
        C::AlreadyHeld => Code::AlreadyExists,
        C::Conflict | C::Unsupported => Code::FailedPrecondition,
        C::LimitReached => Code::ResourceExhausted,
        C::Unavailable => Code::Unavailable,
        C::PermissionDenied => Code::PermissionDenied,
    };
    Status::new(code, error.message.clone())
}

/// The wire form of a lock; `session_expiry` gives the expiry of the sessions
/// that hold it.
pub(crate) fn lock_info_to_proto(
    info: LockInfo,
    session_expiry: &HashMap<SessionId, Millis>,
) -> pb::LockInfo {
    pb::LockInfo {
        name: info.name,
        holders: info
            .holders
            .into_iter()
            .map(|h| {
                let (mode, permits) = mode_to_proto(h.mode);
                pb::HolderInfo {
                    session_id: h.session.0,
                    owner: h.owner,
                    client_name: h.lock_by.name,
                    host: h.lock_by.host,
                    lock_time_ms: h.lock_time,
                    fencing_token: h.fencing_token,
                    lease_until_ms: h.lease_until,
                    session_expires_at_ms: session_expiry.get(&h.session).copied(),
                    mode,
                    permits,
                    hold_count: h.hold_count,
                }
            })
            .collect(),
        waiters: info
            .waiters
            .into_iter()
            .map(|w| {
                let (mode, permits) = mode_to_proto(w.mode);
                pb::WaiterInfo {
                    session_id: w.session.0,
                    request_id: w.request.0,
                    owner: w.owner,
                    mode,
                    permits,
                    since_ms: w.since,
                    deadline_ms: w.deadline,
                }
            })
            .collect(),
        lock_delay_until_ms: info.lock_delay_until,
    }
}

/// Checks an owner id or client label: at most `max` bytes, no NUL; owners
/// must not be empty.
pub(crate) fn check_label(
    what: &str,
    value: &str,
    max: usize,
    required: bool,
) -> Result<(), String> {
    if required && value.is_empty() {
        return Err(format!("{what} must not be empty"));
    }
    if value.len() > max {
        return Err(format!(
            "{what} is {} bytes, the limit is {max}",
            value.len()
        ));
    }
    if value.contains('\0') {
        return Err(format!("{what} contains a NUL byte"));
    }
    Ok(())
}

/// The answer to a heartbeat, with the time on the clock of the member
/// that answered.
pub(crate) fn heartbeat_ack(now: Millis) -> pb::ServerMessage {
    pb::ServerMessage {
        kind: Some(pb::server_message::Kind::Heartbeat(pb::HeartbeatAck {
            now_ms: now,
        })),
    }
}
