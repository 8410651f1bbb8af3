//! locksmith's errors as the Python exceptions of `locksmith._model`, one
//! class per variant of [`locksmith::Error`], with the variant's fields as
//! attributes.

use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyString, PyType};
use pyo3::IntoPyObjectExt;

use locksmith::{Error, LostCause, Undo, Unreplicated};

const MODEL: &str = "locksmith._model";

/// How an exception class of `locksmith._model` is found.
type Class = for<'py> fn(Python<'py>) -> PyResult<&'py Bound<'py, PyType>>;

/// A class of `locksmith._model`, looked up once.
fn model_class<'py>(
    py: Python<'py>,
    cell: &'static PyOnceLock<Py<PyType>>,
    name: &str,
) -> PyResult<&'py Bound<'py, PyType>> {
    cell.import(py, MODEL, name)
}

macro_rules! classes {
    ($($fn_name:ident => $class:literal),* $(,)?) => {
        $(
            fn $fn_name(py: Python<'_>) -> PyResult<&Bound<'_, PyType>> {
                static CLASS: PyOnceLock<Py<PyType>> = PyOnceLock::new();
                model_class(py, &CLASS, $class)
            }
        )*
    };
}

classes! {
    base_class => "Error",
    invalid_name_class => "InvalidName",
    invalid_argument_class => "InvalidArgument",
    invalid_url_class => "InvalidUrl",
    backend_not_enabled_class => "BackendNotEnabled",
    timeout_class => "Timeout",
    not_owner_class => "NotOwner",
    not_held_class => "NotHeld",
    already_held_class => "AlreadyHeld",
    conflict_class => "Conflict",
    lost_class => "Lost",
    limit_reached_class => "LimitReached",
    unauthenticated_class => "Unauthenticated",
    permission_denied_class => "PermissionDenied",
    unsupported_class => "Unsupported",
    unreplicated_class => "Unreplicated",
    closed_class => "Closed",
    backend_error_class => "BackendError",
    lost_cause_class => "LostCause",
}

/// An exception of `class` with `message` and the given attributes.
fn exception(
    py: Python<'_>,
    class: Class,
    message: String,
    attributes: &[(&str, Bound<'_, PyAny>)],
) -> PyErr {
    let made = class(py).and_then(|class| {
        let error = class.call1((message,))?;
        for (name, value) in attributes {
            error.setattr(*name, value)?;
        }
        Ok(PyErr::from_value(error))
    });
    made.unwrap_or_else(|failure| failure)
}

/// The Python exception for a locksmith error.
pub fn to_py(error: Error) -> PyErr {
    Python::attach(|py| to_py_with(py, error))
}

fn to_py_with(py: Python<'_>, error: Error) -> PyErr {
    let message = error.to_string();
    let text = |value: &str| value.into_pyobject(py).map(|v| v.into_any()).ok();
    let with_name = |class: Class, name: &str| {
        let attributes: Vec<_> = text(name).map(|n| ("name", n)).into_iter().collect();
        exception(py, class, message.clone(), &attributes)
    };
    match &error {
        Error::InvalidName { name, .. } => with_name(invalid_name_class, name),
        Error::InvalidArgument(_) => exception(py, invalid_argument_class, message, &[]),
        Error::InvalidUrl { .. } => exception(py, invalid_url_class, message, &[]),
        Error::BackendNotEnabled { .. } => exception(py, backend_not_enabled_class, message, &[]),
        Error::Timeout(wait) => {
            let wait = wait.as_secs_f64().into_pyobject(py).map(|w| w.into_any());
            let attributes: Vec<_> = wait.ok().map(|w| ("wait", w)).into_iter().collect();
            exception(py, timeout_class, message, &attributes)
        }
        Error::NotOwner { name } => with_name(not_owner_class, name),
        Error::NotHeld { name } => with_name(not_held_class, name),
        Error::AlreadyHeld { name } => with_name(already_held_class, name),
        Error::Conflict { name, mode, .. } => {
            let attributes: Vec<_> = [("name", text(name)), ("mode", text(&mode.to_string()))]
                .into_iter()
                .filter_map(|(key, value)| value.map(|value| (key, value)))
                .collect();
            exception(py, conflict_class, message, &attributes)
        }
        Error::Lost(loss) => lost_with(py, message, loss.cause, &loss.reason),
        Error::LimitReached(_) => exception(py, limit_reached_class, message, &[]),
        Error::Unauthenticated(_) => exception(py, unauthenticated_class, message, &[]),
        Error::PermissionDenied(_) => exception(py, permission_denied_class, message, &[]),
        Error::Unsupported { backend, .. } => {
            let attributes: Vec<_> = text(backend).map(|b| ("backend", b)).into_iter().collect();
            exception(py, unsupported_class, message, &attributes)
        }
        Error::Unreplicated(unreplicated) => {
            let attributes = unreplicated_attributes(py, unreplicated);
            exception(py, unreplicated_class, message, &attributes)
        }
        Error::Closed => exception(py, closed_class, message, &[]),
        Error::Backend { backend, .. } => {
            let attributes: Vec<_> = text(backend).map(|b| ("backend", b)).into_iter().collect();
            exception(py, backend_error_class, message, &attributes)
        }
        _ => exception(py, base_class, message, &[]),
    }
}

/// The attributes of `locksmith.Unreplicated`: the Rust error's fields,
/// its `undo` as `given_back` (and `lease`, `undo_failure` when not).
fn unreplicated_attributes<'py>(
    py: Python<'py>,
    unreplicated: &Unreplicated,
) -> Vec<(&'static str, Bound<'py, PyAny>)> {
    let (given_back, lease, undo_failure) = match &unreplicated.undo {
        Undo::Unconfirmed { lease, reason } => {
            (false, Some(lease.as_secs_f64()), Some(reason.as_str()))
        }
        // `GivenBack`, and whatever a later client adds.
        _ => (true, None, None),
    };
    let values = [
        ("name", unreplicated.name.as_str().into_bound_py_any(py)),
        (
            "primary",
            unreplicated.primary.as_str().into_bound_py_any(py),
        ),
        (
            "acknowledged",
            unreplicated.acknowledged.into_bound_py_any(py),
        ),
        ("asked", unreplicated.asked.into_bound_py_any(py)),
        (
            "within",
            unreplicated.within.as_secs_f64().into_bound_py_any(py),
        ),
        ("connected", unreplicated.connected.into_bound_py_any(py)),
        ("given_back", given_back.into_bound_py_any(py)),
        ("lease", lease.into_bound_py_any(py)),
        ("undo_failure", undo_failure.into_bound_py_any(py)),
    ];
    values
        .into_iter()
        .filter_map(|(key, value)| value.ok().map(|value| (key, value)))
        .collect()
}

/// `locksmith.Lost` with its cause (where known) and reason.
pub fn lost(py: Python<'_>, cause: Option<LostCause>, reason: &str) -> PyErr {
    lost_with(py, format!("lock was lost: {reason}"), cause, reason)
}

fn lost_with(py: Python<'_>, message: String, cause: Option<LostCause>, reason: &str) -> PyErr {
    let mut attributes = vec![("reason", PyString::new(py, reason).into_any())];
    if let Some(Ok(cause)) = cause.map(|cause| lost_cause(py, cause)) {
        attributes.push(("cause", cause));
    }
    exception(py, lost_class, message, &attributes)
}

/// `locksmith.Closed` with `message`.
pub fn closed(message: &str) -> PyErr {
    Python::attach(|py| exception(py, closed_class, message.to_owned(), &[]))
}

/// `locksmith.InvalidArgument` with `message`.
pub fn invalid_argument(message: String) -> PyErr {
    Python::attach(|py| exception(py, invalid_argument_class, message, &[]))
}

/// The `locksmith.LostCause` member for `cause`.
pub fn lost_cause(py: Python<'_>, cause: LostCause) -> PyResult<Bound<'_, PyAny>> {
    let value = match cause {
        LostCause::SessionExpired => "session_expired",
        LostCause::SessionClosed => "session_closed",
        LostCause::LeaseExpired => "lease_expired",
        LostCause::ForceReleased => "force_released",
        LostCause::ClientClosed => "client_closed",
        LostCause::ConnectionLost => "connection_lost",
        LostCause::Gone => "gone",
        _ => "other",
    };
    lost_cause_class(py)?.call1((value,))
}

/// Converts a locksmith result, for `?` in Python-facing code.
pub trait IntoPyResult<T> {
    /// The result with a locksmith error as its Python exception.
    fn py(self) -> PyResult<T>;
}

impl<T> IntoPyResult<T> for locksmith::Result<T> {
    fn py(self) -> PyResult<T> {
        self.map_err(to_py)
    }
}
