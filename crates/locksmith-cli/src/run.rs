//! `locksmith run`: hold a lock while a command runs.
//!
//! Exit status: the child's (128 + signal if a signal ended it);
//! `--conflict-exit-code` (default 1) when the lock stayed busy;
//! [`LOST_EXIT`] (75, EX_TEMPFAIL) when the lock was lost while the child ran, in
//! which case the child got SIGTERM, then SIGKILL after `--kill-grace`.

use std::process::ExitCode;
use std::time::Duration;

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use tokio::process::Command;

use crate::common::{fail, parse_duration, BackendArgs, LockArgs, Termination};

/// Exit status when the lock could not be had (flock's default).
pub const CONFLICT_EXIT: u8 = 1;
/// Exit status when the lock was lost while held.
pub const LOST_EXIT: u8 = 75;

/// Options of `locksmith run`.
#[derive(Debug, clap::Args)]
pub struct RunArgs {
    #[command(flatten)]
    lock: LockArgs,
    #[command(flatten)]
    backend: BackendArgs,
    /// Exit status when the lock is busy (after --wait, or at once with --no-wait).
    #[arg(long, default_value_t = CONFLICT_EXIT, value_name = "N")]
    conflict_exit_code: u8,
    /// After losing the lock, how long the child has between SIGTERM and SIGKILL.
    #[arg(long, value_parser = parse_duration, default_value = "10s")]
    kill_grace: Duration,
    /// The command and its arguments.
    #[arg(last = true, required = true, value_name = "CMD")]
    command: Vec<String>,
}

/// Acquires, runs the child with `LOCKSMITH_LOCK` and `LOCKSMITH_FENCING_TOKEN`
/// set, forwards SIGINT/SIGTERM to it, and releases when it exits.
///
/// Cancel safety: SIGINT/SIGTERM are forwarded to the command, not a drop.
/// Dropped while the command runs, it kills the command (SIGKILL, see
/// [`supervise`]) and the guard's drop releases the lock in the background.
pub async fn run(args: RunArgs) -> ExitCode {
    let mut termination = Termination::listen();
    let client = match args.backend.connect("run").await {
        Ok(client) => client,
        Err(code) => return code,
    };
    let guard = match args.lock.acquire(&client).await {
        Ok(Some(guard)) => guard,
        // Closed before exiting, so that what a cut-off attempt took is
        // given back first (the background undo would die with the process).
        Ok(None) => {
            let _ = client.close().await;
            eprintln!("locksmith: {} is held by someone else", args.lock.name);
            return ExitCode::from(args.conflict_exit_code);
        }
        Err(error) => {
            let _ = client.close().await;
            return fail(&error);
        }
    };
    let env = [
        ("LOCKSMITH_LOCK", args.lock.name.clone()),
        ("LOCKSMITH_FENCING_TOKEN", guard.fencing_token().to_string()),
    ];
    let ended = supervise(
        &args.command,
        &env,
        &mut termination,
        &guard,
        &args.lock.name,
        args.kill_grace,
    )
    .await;
    conclude(ended, guard.release(), &args.lock.name).await
}

/// How a command run under a hold ended.
pub enum Ended {
    /// It exited with this status (128 + signal if a signal ended it).
    Exited(u8),
    /// The hold was lost, and the command was stopped.
    Lost,
}

/// Runs `command` with `env` while `guard` holds `name`: SIGINT and SIGTERM
/// are forwarded to it; when the hold is lost it gets SIGTERM, then SIGKILL
/// after `kill_grace`. An error says why it could not be run or waited for.
///
/// Cancel safety: a dropped call kills the command (SIGKILL to the command
/// itself, not to what it started), so that it never runs on once the
/// caller, which holds the lock for it, has gone.
pub async fn supervise(
    command: &[String],
    env: &[(&str, String)],
    termination: &mut Termination,
    guard: &locksmith::Guard,
    name: &str,
    kill_grace: Duration,
) -> Result<Ended, String> {
    let mut child = Command::new(&command[0])
        .args(&command[1..])
        .envs(env.iter().map(|(key, value)| (key, value)))
        // Its own process group: signals reach it once, through us.
        .process_group(0)
        .kill_on_drop(true)
        .spawn()
        .map_err(|error| format!("cannot run {:?}: {error}", command[0]))?;
    let pid = child.id().map(|id| Pid::from_raw(id as i32));
    let signal_child = |signal: Signal| {
        if let Some(pid) = pid {
            let _ = kill(pid, signal);
        }
    };
    let status = loop {
        tokio::select! {
            status = child.wait() => break status,
            signal = termination.recv() => signal_child(signal),
            reason = guard.lost() => {
                eprintln!("locksmith: lost {name}: {reason}; stopping the command");
                signal_child(Signal::SIGTERM);
                let grace = tokio::time::sleep(kill_grace);
                tokio::pin!(grace);
                tokio::select! {
                    _ = child.wait() => {}
                    _ = &mut grace => {
                        signal_child(Signal::SIGKILL);
                        let _ = child.wait().await;
                    }
                }
                return Ok(Ended::Lost);
            }
        }
    };
    status
        .map(|status| Ended::Exited(exit_code(status)))
        .map_err(|error| format!("waiting for the command: {error}"))
}

/// The exit status after a supervised command: ends the hold with `release`
/// (unless it was lost), then gives the command's status, [`LOST_EXIT`] when
/// the hold was lost, or the failure.
///
/// Cancel safety: if dropped, the release may not have happened; the hold
/// then ends with the session.
pub async fn conclude(
    ended: Result<Ended, String>,
    release: impl std::future::Future<Output = locksmith::Result<()>>,
    name: &str,
) -> ExitCode {
    let code = match ended {
        Ok(Ended::Lost) => return ExitCode::from(LOST_EXIT),
        Ok(Ended::Exited(code)) => code,
        Err(message) => {
            let _ = release.await;
            return fail(&message);
        }
    };
    if let Err(error) = release.await {
        eprintln!("locksmith: releasing {name}: {error}");
        if matches!(error, locksmith::Error::Lost(_)) {
            return ExitCode::from(LOST_EXIT);
        }
    }
    ExitCode::from(code)
}

/// The shell's convention: the exit code, or 128 + the signal that ended it.
fn exit_code(status: std::process::ExitStatus) -> u8 {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(code), _) => code as u8,
        (None, Some(signal)) => 128u8.saturating_add(signal as u8),
        _ => 1,
    }
}
