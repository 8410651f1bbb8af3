//! Waiting for a replicated setup to reach a state, shared by every setup.

use std::net::SocketAddr;
use std::thread;
use std::time::{Duration, Instant};

use crate::process::Process;
use crate::{Error, Result};

/// How many lines of each member's log a [`Error::NotSettled`] carries.
const LOG_LINES: usize = 15;

/// Calls `check` until it answers `Ok`, or fails with [`Error::NotSettled`]
/// after `timeout`, carrying the last check's complaint and the end of every
/// member's log.
///
/// `check` should look at the real servers (a protocol request) and give up
/// quickly (well under a second) on a member that does not answer.
pub(crate) fn until<T>(
    setup: &str,
    state: &str,
    timeout: Duration,
    members: &[&Process],
    mut check: impl FnMut() -> std::result::Result<T, String>,
) -> Result<T> {
    let start = Instant::now();
    let mut pause = Duration::from_millis(20);
    loop {
        let last_check = match check() {
            Ok(value) => {
                tracing::debug!(setup, state, elapsed = ?start.elapsed(), "settled");
                return Ok(value);
            }
            Err(complaint) => complaint,
        };
        if start.elapsed() >= timeout {
            let logs = members
                .iter()
                .map(|p| {
                    format!(
                        "\nlast lines of {} ({}):\n{}",
                        p.log_path().display(),
                        p.name(),
                        p.log_tail(LOG_LINES)
                    )
                })
                .collect();
            return Err(Error::NotSettled {
                setup: setup.to_owned(),
                state: state.to_owned(),
                timeout,
                last_check,
                logs,
            });
        }
        thread::sleep(pause);
        pause = (pause * 2).min(Duration::from_millis(100));
    }
}

/// `127.0.0.1:p1,127.0.0.1:p2,…`, the host list of a multi-host URL.
pub(crate) fn address_list(addresses: impl IntoIterator<Item = SocketAddr>) -> String {
    addresses
        .into_iter()
        .map(|a| a.to_string())
        .collect::<Vec<_>>()
        .join(",")
}
