//! One acquire attempt: a call of `acquire_session` or `acquire_lease` and its
//! answer.

use std::time::{Duration, SystemTime};

use tokio_postgres::Row;

use super::key::{advisory_key, semaphore_slot_key};
use super::pg_error;
use crate::backend::{AcquireRequest, Mode};
use crate::error::{Error, Result};

/// What one request asks of one name, in the layout's terms.
#[derive(Debug, Clone)]
pub(crate) struct Target {
    pub name: String,
    /// The name's advisory key (the lock itself, or a semaphore's turnstile).
    pub key: i64,
    /// Keys of the semaphore's slots (empty for locks).
    pub slot_keys: Vec<i64>,
    pub mode: Mode,
    pub owner: String,
    /// Lease of a lease hold; `None` for a session hold.
    pub lease: Option<Duration>,
    /// `mode` as the layout spells it.
    pub mode_name: &'static str,
    /// The permit count of a semaphore.
    pub permits: Option<i32>,
    /// The lease in milliseconds (0 for a session hold).
    pub lease_ms: i64,
}

impl Target {
    pub fn new(request: &AcquireRequest, name: &str, lease: Option<Duration>) -> Target {
        let slot_keys = match request.mode {
            Mode::Semaphore { permits } => {
                (0..permits).map(|i| semaphore_slot_key(name, i)).collect()
            }
            _ => Vec::new(),
        };
        Target {
            name: name.to_owned(),
            key: advisory_key(name),
            slot_keys,
            mode: request.mode,
            owner: request.owner.clone(),
            lease,
            mode_name: mode_name(request.mode),
            permits: match request.mode {
                Mode::Semaphore { permits } => Some(permits as i32),
                _ => None,
            },
            lease_ms: lease.map_or(0, |d| d.as_millis() as i64),
        }
    }

    /// Whether the name's key is held (or waited for) in shared mode.
    pub fn shared_key(&self) -> bool {
        self.mode == Mode::Shared
    }
}

/// A mode as the layout spells it.
pub(crate) fn mode_name(mode: Mode) -> &'static str {
    match mode {
        Mode::Exclusive => "exclusive",
        Mode::Shared => "shared",
        Mode::Semaphore { .. } => "semaphore",
    }
}

/// A mode from the layout's spelling.
pub(crate) fn parse_mode(mode: &str, permits: Option<i32>) -> Mode {
    match mode {
        "shared" => Mode::Shared,
        "semaphore" => Mode::Semaphore {
            permits: permits.unwrap_or(0).max(0) as u32,
        },
        _ => Mode::Exclusive,
    }
}

/// The answer of one attempt.
#[derive(Debug)]
pub(crate) enum Claim<G = Granted> {
    Granted(G),
    /// Held by others; retry after this long (when a lease is what blocks).
    Busy(Option<Duration>),
    /// The name is in use in a way this request can never share.
    Conflict(String),
}

/// A grant as the database recorded it.
#[derive(Debug, Clone)]
pub(crate) struct Granted {
    pub token: u64,
    /// The advisory key now held by the session (the slot's, for semaphores).
    pub held_key: i64,
}

impl Claim {
    /// Parses a row of `acquire_session` (`lease` false) or `acquire_lease`.
    pub fn from_row(row: &Row, target: &Target, lease: bool) -> Result<Claim> {
        let status: String = row.try_get("status").map_err(pg_error)?;
        match status.as_str() {
            "granted" => {
                let token: i64 = row.try_get("token").map_err(pg_error)?;
                let slot: Option<i32> = row.try_get("slot").map_err(pg_error)?;
                if lease {
                    let _: Option<SystemTime> = row.try_get("lease_expires").map_err(pg_error)?;
                }
                let held_key = match slot {
                    Some(slot) => target.slot_keys[slot as usize],
                    None => target.key,
                };
                Ok(Claim::Granted(Granted {
                    token: token as u64,
                    held_key,
                }))
            }
            "busy" => {
                let retry: Option<i64> = row.try_get("retry_ms").map_err(pg_error)?;
                Ok(Claim::Busy(
                    retry.map(|ms| Duration::from_millis(ms.max(1) as u64)),
                ))
            }
            "conflict" => {
                let detail: Option<String> = row.try_get("detail").map_err(pg_error)?;
                Ok(Claim::Conflict(
                    detail.unwrap_or_else(|| "mode conflict".into()),
                ))
            }
            other => Err(Error::backend(
                "postgres",
                format!("unexpected acquire status {other:?}"),
            )),
        }
    }
}

/// The error for a [`Claim::Conflict`].
pub(crate) fn conflict(target: &Target, detail: String) -> Error {
    Error::Conflict {
        name: target.name.clone(),
        mode: target.mode,
        detail,
    }
}
