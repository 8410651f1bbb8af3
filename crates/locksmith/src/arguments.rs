//! Checks of what a caller passes (a lease, an owner id, an election's
//! value): one rule and one error text for each, whichever call takes it.

use std::time::Duration;

use crate::error::{Error, Result};

/// Shortest and longest accepted lease.
const LEASE_RANGE: std::ops::RangeInclusive<Duration> =
    Duration::from_millis(10)..=Duration::from_secs(24 * 3600);

/// Checks an owner id (or an election's value, which is its leader's owner
/// id): 1..=256 bytes without NUL, so every store can keep it as it is.
pub(crate) fn check_owner(what: &str, owner: &str) -> Result<()> {
    if owner.is_empty() || owner.len() > 256 || owner.contains('\0') {
        return Err(Error::InvalidArgument(format!(
            "{what} must be 1..=256 bytes without NUL"
        )));
    }
    Ok(())
}

/// Checks a lease against the accepted range.
pub(crate) fn check_lease(lease: Duration) -> Result<()> {
    if LEASE_RANGE.contains(&lease) {
        Ok(())
    } else {
        Err(Error::InvalidArgument(format!(
            "lease of {lease:?} is outside {:?}..={:?}",
            LEASE_RANGE.start(),
            LEASE_RANGE.end()
        )))
    }
}
