//! Client metrics, through the [`metrics`](https://docs.rs/metrics) facade:
//! install the exporter your program already uses (Prometheus, StatsD,
//! OpenTelemetry, ...) and these appear beside your own; without one they
//! cost next to nothing. Every metric has a `backend` label (`server`,
//! `redis`, `zookeeper`, `etcd`, `postgres`, `memory`).
//!
//! | name | type | other labels | what |
//! |---|---|---|---|
//! | `locksmith_client_acquires_total` | counter | `outcome` | acquires by outcome: `granted`, `busy` (a no-wait acquire found the lock held), `timeout`, `error` |
//! | `locksmith_client_acquire_duration_seconds` | histogram | `outcome` | from the call to its outcome |
//! | `locksmith_client_wait_duration_seconds` | histogram | | from the call to the grant, for acquires that were allowed to wait |
//! | `locksmith_client_hold_duration_seconds` | histogram | | from the grant to the release (or the drop of the guard) |
//! | `locksmith_client_lost_total` | counter | `reason` | holds lost: `session_expired`, `session_closed`, `lease_expired`, `force_released`, `client_closed`, `connection_lost`, `gone`, or `other` where the store does not say |
//! | `locksmith_client_renewal_failures_total` | counter | | `Guard::extend` calls that failed (the hold was lost or the store refused; not an out-of-range lease) |
//! | `locksmith_client_reconnects_total` | counter | | the lock server's session streams re-established after one broke (the session resumed, or a new one opened after the old was lost); not counted for the other stores, whose drivers reconnect inside themselves |
//!
//! Call [`describe`] once after installing a recorder to give exporters the
//! help text and units.

use std::time::Duration;

use metrics::{counter, describe_counter, describe_histogram, histogram, Unit};

use crate::lost::LostCause;

/// How an acquire ended, for the `outcome` label.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Outcome {
    Granted,
    Busy,
    Timeout,
    Error,
}

impl Outcome {
    fn label(self) -> &'static str {
        match self {
            Outcome::Granted => "granted",
            Outcome::Busy => "busy",
            Outcome::Timeout => "timeout",
            Outcome::Error => "error",
        }
    }
}

/// Gives the installed recorder the help text and units of every metric.
pub fn describe() {
    describe_counter!(
        "locksmith_client_acquires_total",
        "Acquires by outcome (granted, busy, timeout, error)"
    );
    describe_histogram!(
        "locksmith_client_acquire_duration_seconds",
        Unit::Seconds,
        "Time from an acquire call to its outcome"
    );
    describe_histogram!(
        "locksmith_client_wait_duration_seconds",
        Unit::Seconds,
        "Time from the call to the grant, for acquires allowed to wait"
    );
    describe_histogram!(
        "locksmith_client_hold_duration_seconds",
        Unit::Seconds,
        "Time from a grant to its release"
    );
    describe_counter!("locksmith_client_lost_total", "Holds lost, by reason");
    describe_counter!(
        "locksmith_client_renewal_failures_total",
        "Explicit lease extensions that failed"
    );
    describe_counter!(
        "locksmith_client_reconnects_total",
        "Connections re-established after one broke"
    );
}

/// An acquire on `backend` ended with `outcome` after `elapsed`; `waited`
/// says whether it was allowed to wait.
pub(crate) fn acquired(backend: &'static str, outcome: Outcome, waited: bool, elapsed: Duration) {
    let outcome_label = outcome.label();
    counter!("locksmith_client_acquires_total", "backend" => backend, "outcome" => outcome_label)
        .increment(1);
    histogram!(
        "locksmith_client_acquire_duration_seconds",
        "backend" => backend,
        "outcome" => outcome_label
    )
    .record(elapsed);
    if waited && outcome == Outcome::Granted {
        histogram!("locksmith_client_wait_duration_seconds", "backend" => backend).record(elapsed);
    }
}

/// A hold on `backend` ended by release after `held`.
pub(crate) fn released(backend: &'static str, held: Duration) {
    histogram!("locksmith_client_hold_duration_seconds", "backend" => backend).record(held);
}

/// A hold on `backend` was lost.
pub(crate) fn lost(backend: &'static str, cause: LostCause) {
    counter!("locksmith_client_lost_total", "backend" => backend, "reason" => cause.label())
        .increment(1);
}

/// An explicit extension on `backend` failed.
pub(crate) fn renewal_failed(backend: &'static str) {
    counter!("locksmith_client_renewal_failures_total", "backend" => backend).increment(1);
}

/// A connection to `backend` was re-established after one broke.
#[cfg_attr(not(feature = "server"), allow(dead_code))]
pub(crate) fn reconnected(backend: &'static str) {
    counter!("locksmith_client_reconnects_total", "backend" => backend).increment(1);
}
