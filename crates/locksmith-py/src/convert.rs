//! Values between Python and the client: durations in, lock options in,
//! inspection records out (as the dataclasses of `locksmith._model`).

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyTuple, PyType};

use locksmith::backend::{GrantRecord, HoldEnd, Holder, LockInfo, Waiter};
use locksmith::{Leader, Mode};

use crate::errors;

/// Seconds as a float or an int, or a `datetime.timedelta`, as a duration.
pub fn duration(value: &Bound<'_, PyAny>, what: &str) -> PyResult<Duration> {
    let seconds = match value.extract::<f64>() {
        Ok(seconds) => seconds,
        Err(_) => value
            .call_method0("total_seconds")
            .and_then(|seconds| seconds.extract::<f64>())
            .map_err(|_| {
                errors::invalid_argument(format!(
                    "{what} must be seconds (a float or an int) or a datetime.timedelta"
                ))
            })?,
    };
    Duration::try_from_secs_f64(seconds).map_err(|_| {
        errors::invalid_argument(format!(
            "{what} must be a finite number of seconds, not negative: {seconds}"
        ))
    })
}

/// [`duration`] of an optional argument.
pub fn optional_duration(
    value: Option<&Bound<'_, PyAny>>,
    what: &str,
) -> PyResult<Option<Duration>> {
    value
        .filter(|value| !value.is_none())
        .map(|value| duration(value, what))
        .transpose()
}

/// The keyword options every kind of lock takes (`wait`, `lease`, `owner`,
/// `reentrant`, `lock_delay`), applied to a lock.
pub fn configure(
    mut lock: locksmith::Lock,
    wait: Option<&Bound<'_, PyAny>>,
    lease: Option<&Bound<'_, PyAny>>,
    owner: Option<String>,
    reentrant: bool,
    lock_delay: Option<&Bound<'_, PyAny>>,
) -> PyResult<locksmith::Lock> {
    if let Some(wait) = optional_duration(wait, "wait")? {
        lock = lock.wait(wait);
    }
    if let Some(lease) = optional_duration(lease, "lease")? {
        lock = lock.lease(lease);
    }
    if let Some(owner) = owner {
        lock = lock.owner(owner);
    }
    if let Some(delay) = optional_duration(lock_delay, "lock_delay")? {
        lock = lock.lock_delay(delay);
    }
    Ok(lock.reentrant(reentrant))
}

/// A mode as Python sees it: its kind and, for a semaphore, its permits.
pub fn mode_parts(mode: Mode) -> (&'static str, Option<u32>) {
    match mode {
        Mode::Exclusive => ("exclusive", None),
        Mode::Shared => ("shared", None),
        Mode::Semaphore { permits } => ("semaphore", Some(permits)),
    }
}

/// The mode's name as errors and `repr` print it (`semaphore(4)`).
pub fn mode_text(mode: Mode) -> String {
    mode.to_string()
}

fn model_class<'py>(
    py: Python<'py>,
    cell: &'static PyOnceLock<Py<PyType>>,
    name: &str,
) -> PyResult<&'py Bound<'py, PyType>> {
    cell.import(py, "locksmith._model", name)
}

/// An aware UTC `datetime.datetime`.
fn datetime(py: Python<'_>, time: SystemTime) -> PyResult<Bound<'_, PyAny>> {
    static FROM_TIMESTAMP: PyOnceLock<Py<PyAny>> = PyOnceLock::new();
    static UTC: PyOnceLock<Py<PyAny>> = PyOnceLock::new();
    let from_timestamp = FROM_TIMESTAMP.get_or_try_init(py, || {
        py.import("datetime")?
            .getattr("datetime")?
            .getattr("fromtimestamp")
            .map(Bound::unbind)
    })?;
    let utc = UTC.get_or_try_init(py, || {
        py.import("datetime")?
            .getattr("timezone")?
            .getattr("utc")
            .map(Bound::unbind)
    })?;
    let seconds = match time.duration_since(UNIX_EPOCH) {
        Ok(after) => after.as_secs_f64(),
        Err(before) => -before.duration().as_secs_f64(),
    };
    from_timestamp.bind(py).call1((seconds, utc.bind(py)))
}

fn optional_datetime(
    py: Python<'_>,
    time: Option<SystemTime>,
) -> PyResult<Option<Bound<'_, PyAny>>> {
    time.map(|time| datetime(py, time)).transpose()
}

/// A `locksmith.LockInfo`.
pub fn lock_info(py: Python<'_>, info: LockInfo) -> PyResult<Bound<'_, PyAny>> {
    static CLASS: PyOnceLock<Py<PyType>> = PyOnceLock::new();
    let holders = info
        .holders
        .into_iter()
        .map(|holder| self::holder(py, holder))
        .collect::<PyResult<Vec<_>>>()?;
    let waiters = info
        .waiters
        .into_iter()
        .map(|waiter| self::waiter(py, waiter))
        .collect::<PyResult<Vec<_>>>()?;
    model_class(py, &CLASS, "LockInfo")?.call1((
        info.name,
        PyTuple::new(py, holders)?,
        PyTuple::new(py, waiters)?,
    ))
}

fn holder(py: Python<'_>, holder: Holder) -> PyResult<Bound<'_, PyAny>> {
    static CLASS: PyOnceLock<Py<PyType>> = PyOnceLock::new();
    let (mode, permits) = mode_parts(holder.mode);
    model_class(py, &CLASS, "Holder")?.call1((
        holder.owner,
        mode,
        permits,
        holder.hold_count,
        holder.fencing_token,
        holder.lock_by,
        optional_datetime(py, holder.lock_time)?,
        optional_datetime(py, holder.lease_expires)?,
    ))
}

fn waiter(py: Python<'_>, waiter: Waiter) -> PyResult<Bound<'_, PyAny>> {
    static CLASS: PyOnceLock<Py<PyType>> = PyOnceLock::new();
    let (mode, permits) = mode_parts(waiter.mode);
    model_class(py, &CLASS, "Waiter")?.call1((
        waiter.owner,
        mode,
        permits,
        optional_datetime(py, waiter.since)?,
    ))
}

/// A `locksmith.Grant`.
pub fn grant(py: Python<'_>, grant: GrantRecord) -> PyResult<Bound<'_, PyAny>> {
    static CLASS: PyOnceLock<Py<PyType>> = PyOnceLock::new();
    let (mode, permits) = mode_parts(grant.mode);
    let (state, ended_at, lost_reason) = match grant.end {
        HoldEnd::Held => ("held", None, None),
        HoldEnd::Released { at } => ("released", Some(at), None),
        HoldEnd::Lost { at, reason } => ("lost", Some(at), Some(reason)),
        // A later kind of end: the record without it.
        #[allow(unreachable_patterns)]
        _ => ("ended", None, None),
    };
    let args = (
        grant.name,
        grant.owner,
        mode,
        permits,
        grant.fencing_token,
        grant.lock_by,
        datetime(py, grant.granted_at)?,
        grant.waited.as_secs_f64(),
        state,
        optional_datetime(py, ended_at)?,
        lost_reason,
    );
    model_class(py, &CLASS, "Grant")?.call1(args)
}

/// A `locksmith.Leader`, or `None`.
pub fn leader(py: Python<'_>, leader: Option<Leader>) -> PyResult<Bound<'_, PyAny>> {
    static CLASS: PyOnceLock<Py<PyType>> = PyOnceLock::new();
    match leader {
        Some(leader) => {
            model_class(py, &CLASS, "Leader")?.call1((leader.value, leader.fencing_token))
        }
        None => Ok(py.None().into_bound(py)),
    }
}

/// A list of `locksmith.LockInfo`.
pub fn lock_infos(py: Python<'_>, infos: Vec<LockInfo>) -> PyResult<Vec<Bound<'_, PyAny>>> {
    infos.into_iter().map(|info| lock_info(py, info)).collect()
}

/// A list of `locksmith.Grant`.
pub fn grants(py: Python<'_>, grants: Vec<GrantRecord>) -> PyResult<Vec<Bound<'_, PyAny>>> {
    grants.into_iter().map(|record| grant(py, record)).collect()
}
