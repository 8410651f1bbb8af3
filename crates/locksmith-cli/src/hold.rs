//! `locksmith hold`: take a lock and keep it until interrupted.

use std::process::ExitCode;

use crate::common::{fail, BackendArgs, LockArgs, Termination};
use crate::run::{CONFLICT_EXIT, LOST_EXIT};

/// Options of `locksmith hold`.
#[derive(Debug, clap::Args)]
pub struct HoldArgs {
    #[command(flatten)]
    lock: LockArgs,
    #[command(flatten)]
    backend: BackendArgs,
}

/// Acquires, prints the fencing token on stdout, holds until SIGINT/SIGTERM
/// (then releases, exit 0) or until the hold is lost (exit 75).
///
/// Cancel safety: SIGINT/SIGTERM do not drop it (they are the checked
/// release). Dropped before the grant, it leaves nothing; after, the guard's
/// drop releases in the background, and a release cut short ends with the
/// session.
pub async fn hold(args: HoldArgs) -> ExitCode {
    let mut termination = Termination::listen();
    let client = match args.backend.connect("hold").await {
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
            return ExitCode::from(CONFLICT_EXIT);
        }
        Err(error) => {
            let _ = client.close().await;
            return fail(&error);
        }
    };
    println!("{}", guard.fencing_token());
    tokio::select! {
        reason = guard.lost() => {
            eprintln!("locksmith: lost {}: {reason}", args.lock.name);
            ExitCode::from(LOST_EXIT)
        }
        _ = termination.recv() => match guard.release().await {
            Ok(()) => ExitCode::SUCCESS,
            Err(error) => fail(&error),
        },
    }
}
