//! Between the wire types of `locksmith-proto` and the client library's types.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use locksmith_core::{Mode, NameError, MAX_NAME_LEN};
use locksmith_proto::v1 as pb;
use tonic::{Code, Status};

use crate::backend::{AcquireRequest, GrantRecord, HoldEnd, Holder, LockInfo, Wait, Waiter};
use crate::error::Error;

use super::BACKEND;

/// The wire form of an acquire request.
pub(super) fn acquire(request: &AcquireRequest) -> pb::Acquire {
    let (mode, permits) = mode_to_proto(request.mode);
    let (wait, wait_ms) = match request.wait {
        Wait::No => (pb::WaitKind::No, 0),
        // One millisecond more than asked: the server counts whole
        // milliseconds, and must never give up before the caller's own timer.
        Wait::For(limit) => (pb::WaitKind::For, ceil_ms(limit) + 1),
        Wait::Forever => (pb::WaitKind::Forever, 0),
    };
    pb::Acquire {
        names: request.names.clone(),
        mode,
        permits,
        owner: request.owner.clone(),
        wait: wait as i32,
        wait_ms,
        lease_ms: request.lease.map(ceil_ms),
        reentrant: request.reentrant,
        lock_delay_ms: ceil_ms(request.lock_delay),
        // Only the final outcome matters to the caller.
        notify_queued: false,
    }
}

/// A duration in whole milliseconds, rounded up.
pub(super) fn ceil_ms(duration: Duration) -> u64 {
    let ms = duration.as_millis() as u64;
    if Duration::from_millis(ms) < duration {
        ms + 1
    } else {
        ms
    }
}

fn mode_to_proto(mode: Mode) -> (i32, u32) {
    match mode {
        Mode::Exclusive => (pb::LockMode::Exclusive as i32, 0),
        Mode::Shared => (pb::LockMode::Shared as i32, 0),
        Mode::Semaphore { permits } => (pb::LockMode::Semaphore as i32, permits),
    }
}

fn mode_from_proto(mode: i32, permits: u32) -> Mode {
    match pb::LockMode::try_from(mode) {
        Ok(pb::LockMode::Shared) => Mode::Shared,
        Ok(pb::LockMode::Semaphore) => Mode::Semaphore { permits },
        _ => Mode::Exclusive,
    }
}

/// The library error of a request-level server error.
pub(super) fn error(error: pb::Error) -> Error {
    use pb::ErrorCode as C;
    match C::try_from(error.code).unwrap_or(C::Internal) {
        C::InvalidName => Error::InvalidName {
            name: error.name,
            source: match pb::NameErrorKind::try_from(error.name_error) {
                Ok(pb::NameErrorKind::Empty) => NameError::Empty,
                Ok(pb::NameErrorKind::TooLong) => NameError::TooLong {
                    len: error.name_len as usize,
                    max: MAX_NAME_LEN,
                },
                Ok(pb::NameErrorKind::Nul) => NameError::Nul,
                _ => NameError::EmptySegment,
            },
        },
        C::InvalidArgument => Error::InvalidArgument(error.message),
        C::NotOwner => Error::NotOwner { name: error.name },
        C::NotHeld => Error::NotHeld { name: error.name },
        C::AlreadyHeld => Error::AlreadyHeld { name: error.name },
        C::Conflict => Error::Conflict {
            name: error.name,
            mode: mode_from_proto(error.mode, error.permits),
            detail: error.message,
        },
        C::LimitReached => Error::LimitReached(error.message),
        C::UnknownSession => Error::Lost(error.message.into()),
        C::PermissionDenied => Error::PermissionDenied(error.message),
        C::Unsupported => Error::Unsupported {
            backend: BACKEND,
            what: error.message,
        },
        C::Internal | C::Unavailable => Error::backend(BACKEND, error.message),
    }
}

/// The library error of a failed unary call.
pub(super) fn status(status: Status) -> Error {
    match status.code() {
        Code::InvalidArgument => Error::InvalidArgument(status.message().to_owned()),
        Code::ResourceExhausted => Error::LimitReached(status.message().to_owned()),
        Code::PermissionDenied => Error::PermissionDenied(status.message().to_owned()),
        Code::Unauthenticated => Error::Unauthenticated(status.message().to_owned()),
        _ => Error::backend(BACKEND, status),
    }
}

fn at(ms: u64) -> SystemTime {
    UNIX_EPOCH + Duration::from_millis(ms)
}

/// Why a hold was lost, as the lost signal says it.
pub(super) fn lost_reason(reason: i32) -> &'static str {
    match pb::LostReason::try_from(reason) {
        Ok(pb::LostReason::SessionExpired) => "session expired",
        Ok(pb::LostReason::SessionClosed) => "session closed",
        Ok(pb::LostReason::LeaseExpired) => "lease expired",
        Ok(pb::LostReason::ForceReleased) => "force-released",
        Err(_) => "lost",
    }
}

/// The library view of one grant of the history.
pub(super) fn grant_record(g: pb::GrantRecord) -> GrantRecord {
    let end = match (pb::HoldEnd::try_from(g.end), g.ended_at_ms) {
        (Ok(pb::HoldEnd::Released), Some(ms)) => HoldEnd::Released { at: at(ms) },
        (Ok(pb::HoldEnd::Lost), Some(ms)) => HoldEnd::Lost {
            at: at(ms),
            reason: lost_reason(g.lost_reason).into(),
        },
        _ => HoldEnd::Held,
    };
    GrantRecord {
        lock_by: (g.session_id != 0).then(|| format!("{}@{}", g.client_name, g.host)),
        name: g.name,
        owner: g.owner,
        fencing_token: g.fencing_token,
        mode: mode_from_proto(g.mode, g.permits),
        granted_at: at(g.granted_at_ms),
        waited: Duration::from_millis(g.waited_ms),
        end,
    }
}

/// The library view of a lock.
pub(super) fn lock_info(info: pb::LockInfo) -> LockInfo {
    LockInfo {
        name: info.name,
        holders: info
            .holders
            .into_iter()
            .map(|h| Holder {
                owner: h.owner,
                lock_by: (h.session_id != 0).then(|| format!("{}@{}", h.client_name, h.host)),
                lock_time: Some(at(h.lock_time_ms)),
                fencing_token: Some(h.fencing_token),
                lease_expires: h.lease_until_ms.or(h.session_expires_at_ms).map(at),
                mode: mode_from_proto(h.mode, h.permits),
                hold_count: h.hold_count,
            })
            .collect(),
        waiters: info
            .waiters
            .into_iter()
            .map(|w| Waiter {
                owner: w.owner,
                mode: mode_from_proto(w.mode, w.permits),
                since: Some(at(w.since_ms)),
            })
            .collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rounds_up_to_whole_milliseconds() {
        assert_eq!(ceil_ms(Duration::ZERO), 0);
        assert_eq!(ceil_ms(Duration::from_micros(1)), 1);
        assert_eq!(ceil_ms(Duration::from_millis(500)), 500);
        assert_eq!(ceil_ms(Duration::from_micros(500_001)), 501);
    }

    #[test]
    fn every_error_code_maps_to_an_actionable_variant() {
        let e = |code: pb::ErrorCode| pb::Error {
            code: code as i32,
            name: "a".into(),
            mode: pb::LockMode::Semaphore as i32,
            permits: 5,
            ..pb::Error::default()
        };
        assert!(matches!(
            error(e(pb::ErrorCode::NotOwner)),
            Error::NotOwner { .. }
        ));
        assert!(matches!(
            error(e(pb::ErrorCode::NotHeld)),
            Error::NotHeld { .. }
        ));
        assert!(matches!(
            error(e(pb::ErrorCode::AlreadyHeld)),
            Error::AlreadyHeld { .. }
        ));
        assert!(matches!(
            error(e(pb::ErrorCode::Conflict)),
            Error::Conflict {
                mode: Mode::Semaphore { permits: 5 },
                ..
            }
        ));
        assert!(matches!(
            error(e(pb::ErrorCode::LimitReached)),
            Error::LimitReached(_)
        ));
        assert!(matches!(
            error(e(pb::ErrorCode::UnknownSession)),
            Error::Lost(_)
        ));
        assert!(matches!(
            error(e(pb::ErrorCode::InvalidArgument)),
            Error::InvalidArgument(_)
        ));
        assert!(matches!(
            error(e(pb::ErrorCode::InvalidName)),
            Error::InvalidName { .. }
        ));
        assert!(matches!(
            error(e(pb::ErrorCode::Internal)),
            Error::Backend { .. }
        ));
    }
}
