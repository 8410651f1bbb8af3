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

use crate::common::{fail, parse_duration, termination, BackendArgs, LockArgs};

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
pub async fn run(args: RunArgs) -> ExitCode {
    let client = match args.backend.connect("run").await {
        Ok(client) => client,
        Err(code) => return code,
    };
    let guard = match args.lock.acquire(&client).await {
        Ok(Some(guard)) => guard,
        Ok(None) => {
            eprintln!("locksmith: {} is held by someone else", args.lock.name);
            return ExitCode::from(args.conflict_exit_code);
        }
        Err(error) => return fail(&error),
    };
    let mut child = match Command::new(&args.command[0])
        .args(&args.command[1..])
        .env("LOCKSMITH_LOCK", &args.lock.name)
        .env("LOCKSMITH_FENCING_TOKEN", guard.fencing_token().to_string())
        // Its own process group: signals reach it once, through us.
        .process_group(0)
        .spawn()
    {
        Ok(child) => child,
        Err(error) => {
            let _ = guard.release().await;
            return fail(&format!("cannot run {:?}: {error}", args.command[0]));
        }
    };
    let pid = child.id().map(|id| Pid::from_raw(id as i32));
    let signal_child = |signal: Signal| {
        if let Some(pid) = pid {
            let _ = kill(pid, signal);
        }
    };

    let mut lost = None;
    let status = loop {
        tokio::select! {
            status = child.wait() => break status,
            signal = termination() => signal_child(signal),
            reason = guard.lost(), if lost.is_none() => {
                eprintln!("locksmith: lost {}: {reason}; stopping the command", args.lock.name);
                lost = Some(reason);
                signal_child(Signal::SIGTERM);
                let grace = tokio::time::sleep(args.kill_grace);
                tokio::pin!(grace);
                tokio::select! {
                    status = child.wait() => break status,
                    _ = &mut grace => {
                        signal_child(Signal::SIGKILL);
                        break child.wait().await;
                    }
                }
            }
        }
    };
    if lost.is_some() {
        return ExitCode::from(LOST_EXIT);
    }
    let code = match status {
        Ok(status) => exit_code(status),
        Err(error) => {
            let _ = guard.release().await;
            return fail(&format!("waiting for the command: {error}"));
        }
    };
    if let Err(error) = guard.release().await {
        eprintln!("locksmith: releasing {}: {error}", args.lock.name);
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
