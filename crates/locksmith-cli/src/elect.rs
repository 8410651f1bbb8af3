//! `locksmith elect`: campaign in an election and lead while a command runs
//! (or until interrupted), like `etcdctl elect`; `locksmith leader`: print
//! the leader's value, and with `--watch` every change of it.
//!
//! Exit status of `elect`: the command's (128 + signal if a signal ended
//! it); 0 after SIGINT/SIGTERM without a command; 1 when `--wait` ran out;
//! [`LOST_EXIT`] (75) when leadership was lost, in which case the command got
//! SIGTERM, then SIGKILL after `--kill-grace`. `leader` exits with
//! [`NO_LEADER_EXIT`] (3) when nobody leads.

use std::process::ExitCode;
use std::time::Duration;

use futures::StreamExt;

use crate::common::{fail, parse_duration, BackendArgs, Termination};
use crate::run::{conclude, supervise, CONFLICT_EXIT, LOST_EXIT};

/// Exit status of `locksmith leader` when nobody leads.
pub const NO_LEADER_EXIT: u8 = 3;

/// Options of `locksmith elect`.
#[derive(Debug, clap::Args)]
pub struct ElectArgs {
    /// Election name (a lock name), such as `services/billing`.
    name: String,
    /// The value to publish while leading (an address, an id): 1 to 256 bytes.
    value: String,
    #[command(flatten)]
    backend: BackendArgs,
    /// Give up campaigning after this long, e.g. `30s` (exit 1).
    #[arg(long, value_parser = parse_duration)]
    wait: Option<Duration>,
    /// After losing leadership, how long the command has between SIGTERM and SIGKILL.
    #[arg(long, value_parser = parse_duration, default_value = "10s")]
    kill_grace: Duration,
    /// The command to run while leading; without one, print the fencing
    /// token and lead until SIGINT/SIGTERM.
    #[arg(last = true, value_name = "CMD")]
    command: Vec<String>,
}

/// Campaigns, then leads while the command runs (with `LOCKSMITH_ELECTION`,
/// `LOCKSMITH_LEADER_VALUE` and `LOCKSMITH_FENCING_TOKEN` set), resigning
/// when it exits.
///
/// Cancel safety: not cancel safe (it runs the whole command); the process
/// exits when it returns.
pub async fn elect(args: ElectArgs) -> ExitCode {
    let mut termination = Termination::listen();
    let client = match args.backend.connect("elect").await {
        Ok(client) => client,
        Err(code) => return code,
    };
    let election = client.election(args.name.as_str());
    let campaign = async {
        match args.wait {
            Some(wait) => tokio::time::timeout(wait, election.campaign(args.value.as_str()))
                .await
                .ok(),
            None => Some(election.campaign(args.value.as_str()).await),
        }
    };
    // An interrupted campaign leaves no candidacy behind.
    let leadership = tokio::select! {
        campaign = campaign => match campaign {
            Some(Ok(leadership)) => leadership,
            Some(Err(error)) => return fail(&error),
            None => {
                eprintln!("locksmith: {} did not elect us in time", args.name);
                return ExitCode::from(CONFLICT_EXIT);
            }
        },
        signal = termination.recv() => return ExitCode::from(128 + signal as u8),
    };
    if args.command.is_empty() {
        println!("{}", leadership.fencing_token());
        return tokio::select! {
            reason = leadership.lost() => {
                eprintln!("locksmith: lost the leadership of {}: {reason}", args.name);
                ExitCode::from(LOST_EXIT)
            }
            _ = termination.recv() => match leadership.resign().await {
                Ok(()) => ExitCode::SUCCESS,
                Err(error) => fail(&error),
            },
        };
    }
    let env = [
        ("LOCKSMITH_ELECTION", args.name.clone()),
        ("LOCKSMITH_LEADER_VALUE", args.value.clone()),
        (
            "LOCKSMITH_FENCING_TOKEN",
            leadership.fencing_token().to_string(),
        ),
    ];
    let ended = supervise(
        &args.command,
        &env,
        &mut termination,
        leadership.guard(),
        &args.name,
        args.kill_grace,
    )
    .await;
    conclude(ended, leadership.resign(), &args.name).await
}

/// Options of `locksmith leader`.
#[derive(Debug, clap::Args)]
pub struct LeaderArgs {
    /// Election name (a lock name).
    name: String,
    /// Keep printing: one line per change, an empty line while nobody leads,
    /// until SIGINT/SIGTERM.
    #[arg(long)]
    watch: bool,
    #[command(flatten)]
    backend: BackendArgs,
}

/// Prints the leader's value (exit 3 when nobody leads), or with `--watch`
/// the value now and at every change.
///
/// Cancel safety: safe; it only reads.
pub async fn leader(args: LeaderArgs) -> ExitCode {
    let mut termination = Termination::listen();
    let client = match args.backend.connect("leader").await {
        Ok(client) => client,
        Err(code) => return code,
    };
    let election = client.election(args.name.as_str());
    if !args.watch {
        return match election.leader().await {
            Ok(Some(leader)) => {
                println!("{}", leader.value);
                ExitCode::SUCCESS
            }
            Ok(None) => {
                eprintln!("locksmith: nobody leads {}", args.name);
                ExitCode::from(NO_LEADER_EXIT)
            }
            Err(error) => fail(&error),
        };
    }
    let mut changes = Box::pin(election.observe());
    loop {
        tokio::select! {
            change = changes.next() => match change {
                Some(Ok(leader)) => {
                    println!("{}", leader.map(|l| l.value).unwrap_or_default())
                }
                // The stream carries on after a pause.
                Some(Err(error)) => eprintln!("locksmith: watching {}: {error}", args.name),
                None => return ExitCode::SUCCESS,
            },
            _ = termination.recv() => return ExitCode::SUCCESS,
        }
    }
}
