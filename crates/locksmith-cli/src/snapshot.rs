//! `locksmith snapshot`: backups of a replicated lock server, and new
//! clusters made from them.
//!
//! - `save FILE` takes a backup, consistent at one log index, while the
//!   cluster serves: from a follower the leader reports caught up, so that
//!   the encoding and sending of the whole state do not fall on the member
//!   that serves the clients; from the leader when there is none (a group
//!   of one) or the follower fails to give it, or with `--leader` (the
//!   newest applied state); `--member` names one. The file is checked
//!   before it replaces `FILE`.
//! - `status FILE` prints what a backup holds.
//! - `restore FILE --data-dir DIR --node-id ID --cluster ...` makes one new
//!   member's data directory (run it once per member, with the same
//!   `--cluster`), then start each with `locksmith serve --data-dir DIR
//!   --node-id ID --cluster ...` (the line it prints).
//! - `restore --from-member-data OLD --force-new-cluster ...` does the same
//!   from a stopped member's data directory, after a cluster lost its quorum
//!   for good.
//!
//! Tokens and sessions after a restore: `locksmith_server::backup`.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, Subcommand};
use locksmith::server::ServerUrl;
use locksmith_proto::raft as pb;
use locksmith_server::backup::{self, Backup, RestoreOptions};

use crate::cluster::{connect, connect_with, MembersArgs};
use crate::serve::{parse_members, Members};

/// Options of `locksmith snapshot`.
#[derive(Debug, Args)]
pub struct SnapshotArgs {
    #[command(subcommand)]
    command: SnapshotCommand,
}

impl SnapshotArgs {
    /// Whether the command is background work that should run at a lower
    /// priority (`snapshot save` without `--full-priority`): lowered before
    /// the runtime starts, so that every thread it starts inherits it.
    pub fn runs_in_background(&self) -> bool {
        matches!(
            self.command,
            SnapshotCommand::Save {
                full_priority: false,
                ..
            }
        )
    }
}

#[derive(Debug, Subcommand)]
enum SnapshotCommand {
    /// Save a backup of a running cluster's state into FILE, from a caught-up
    /// follower unless told otherwise (needs `admin`).
    Save {
        /// Where the backup goes (replaced atomically; owner-only: it holds
        /// the secrets that resume sessions).
        file: PathBuf,
        #[command(flatten)]
        members: MembersArgs,
        /// Take it from this member (HOST:PORT).
        #[arg(long, value_name = "HOST:PORT", conflicts_with = "leader")]
        member: Option<String>,
        /// Take it from the leader (the newest applied state), not from a
        /// caught-up follower.
        #[arg(long)]
        leader: bool,
        /// How long the follower chosen for it may take to start sending
        /// it (encoding a big table on a busy member takes seconds) before
        /// it is taken from the leader instead: a member that accepts
        /// connections but does not answer (stopped, overloaded) does not
        /// hold the backup up for good.
        #[arg(
            long,
            value_name = "DURATION",
            value_parser = crate::common::parse_duration,
            default_value = "30s"
        )]
        follower_wait: std::time::Duration,
        /// Run at the priority it was started with. By default it lowers
        /// its own (nice +10, as a member encodes a backup, and, when it
        /// leads its session, e.g. under `setsid`, that session's
        /// scheduling group): run on a member's machine, its checking and
        /// writing take only the CPU the member leaves, instead of slowing
        /// the member's answers.
        #[arg(long)]
        full_priority: bool,
    },
    /// Print what a backup holds: log index, locks, sessions, tokens, format.
    Status {
        file: PathBuf,
        /// One JSON object.
        #[arg(long)]
        json: bool,
    },
    /// Make the data directory of one member of a new cluster from a backup
    /// (or, with --force-new-cluster, from a stopped member's data).
    Restore {
        /// The backup (not with --from-member-data).
        #[arg(required_unless_present = "from_member_data")]
        file: Option<PathBuf>,
        /// Take the state from this stopped member's data directory instead:
        /// its snapshot and every entry of its log. Needs
        /// --force-new-cluster.
        #[arg(long, value_name = "DIR", conflicts_with = "file")]
        from_member_data: Option<PathBuf>,
        /// Say that the old cluster's quorum is lost for good: entries its
        /// other members committed without this one are lost.
        #[arg(long)]
        force_new_cluster: bool,
        /// The new member's data directory (absent or empty).
        #[arg(long, value_name = "DIR")]
        data_dir: PathBuf,
        /// The new member's id.
        #[arg(long, default_value_t = 1)]
        node_id: u64,
        /// The new cluster's members, ID=HOST:PORT,... (the same for every
        /// member restored); without it, a cluster of this one member at
        /// --listen.
        #[arg(long, value_name = "ID=HOST:PORT,...", value_parser = parse_members)]
        cluster: Option<Members>,
        /// With no --cluster: where the one member serves.
        #[arg(long, default_value = locksmith_server::DEFAULT_LISTEN)]
        listen: String,
        /// Start tokens above this, if it is higher than the backup's own
        /// floor (its last token plus 2^44).
        #[arg(long, value_name = "TOKEN")]
        token_floor: Option<u64>,
    },
}

/// Runs `locksmith snapshot`.
///
/// Cancel safety: `save` writes FILE only once the whole backup is in and
/// checks out; `restore` dropped midway may leave a half-made directory,
/// which a second restore and a start both refuse.
pub async fn snapshot(args: SnapshotArgs) -> ExitCode {
    let result = match args.command {
        SnapshotCommand::Save {
            file,
            members,
            member,
            leader,
            follower_wait,
            full_priority: _,
        } => {
            let source = match (member, leader) {
                (Some(member), _) => Choice::Member(member),
                (None, true) => Choice::Leader,
                (None, false) => Choice::Follower {
                    wait: follower_wait,
                },
            };
            save(&file, &members, source).await
        }
        SnapshotCommand::Status { file, json } => status(&file, json),
        SnapshotCommand::Restore {
            file,
            from_member_data,
            force_new_cluster,
            data_dir,
            node_id,
            cluster,
            listen,
            token_floor,
        } => {
            let members = match cluster {
                Some(Members(members)) => members,
                None => vec![(node_id, listen)],
            };
            let options = RestoreOptions {
                data_dir,
                node_id,
                members,
                token_floor,
            };
            restore(file, from_member_data, force_new_cluster, &options).await
        }
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("locksmith snapshot: {error}");
            ExitCode::FAILURE
        }
    }
}

/// Which member `snapshot save` asks for the backup.
enum Choice {
    /// The one named (`--member`).
    Member(String),
    /// The leader (`--leader`).
    Leader,
    /// A caught-up follower, else the leader ([`source_address`]); the
    /// follower must start sending within `wait`.
    Follower { wait: std::time::Duration },
}

/// Takes the backup from the member `choice` names, checks it and writes
/// it. A follower that fails to give it (gone since the leader named it,
/// not reachable at the address the cluster knows it by, or silent for
/// its `wait`) is passed over for the leader, with a warning.
///
/// Cancel safety: safe; FILE is replaced only at the end, atomically.
async fn save(file: &std::path::Path, members: &MembersArgs, choice: Choice) -> Result<(), String> {
    let url = members.url()?;
    let started = std::time::Instant::now();
    let (address, role, incoming) = match choice {
        Choice::Member(member) => {
            let incoming = fetch(&url, &member, None, file, false).await?;
            (member, "the member named", incoming)
        }
        Choice::Leader => {
            let source = source_address(&url, true).await?;
            let incoming = fetch(&url, &source.address, None, file, false).await?;
            (source.address, source.role, incoming)
        }
        Choice::Follower { wait } => {
            let source = source_address(&url, false).await?;
            // A follower has `wait` to start; the leader, as ever, its time.
            let from_follower = source.leader.is_some();
            let first_part_within = from_follower.then_some(wait);
            match (
                fetch(
                    &url,
                    &source.address,
                    first_part_within,
                    file,
                    from_follower,
                )
                .await,
                source.leader,
            ) {
                (Ok(incoming), _) => (source.address, source.role, incoming),
                (Err(error), Some(leader)) => {
                    eprintln!(
                        "locksmith snapshot: {error}; taking the backup from the leader instead"
                    );
                    let incoming = fetch(&url, &leader, None, file, false).await?;
                    (leader, LEADER, incoming)
                }
                (Err(error), None) => return Err(error),
            }
        }
    };
    let received = incoming.received();
    let summary = incoming.finish().map_err(|e| e.to_string())?;
    println!(
        "saved {} ({} bytes) from {address} ({role}) in {:.2?}: log index {}, {} locks held, \
         {} sessions",
        file.display(),
        received,
        started.elapsed(),
        show(summary.index),
        summary.locks,
        summary.sessions
    );
    Ok(())
}

/// How many bytes of a backup from a member that answers clients may be
/// on their way to this end: HTTP/2's receive window, for the backup's
/// stream and its connection (HTTP/2's own default; the transport's is 2
/// and 5 MiB).
///
/// Why small: the member writes what the window allows on the runtime
/// worker that answers its clients, in one go. A group of one wrote 2 MiB
/// at a time (128 frames, over a millisecond of the worker's time) and its
/// clients' answers waited behind them: the handoff p99 during a save was
/// about 3x that without on tmpfs, about 2x with this window. A follower
/// answers no client, and there the smaller window made no difference but
/// more round trips, so a backup from a follower keeps the transport's
/// (docs/BENCHMARKS.md, "The backup's receive window").
const BACKUP_WINDOW: u32 = 65_535;

/// The backup as the member at `address` sends it, written to `file`'s
/// staged copy as it comes (`backup::Incoming`); with `first_part_within`,
/// an error if the first part has not come by then. Unless the member is
/// known to be a follower (`from_follower`), it sends through a receive
/// window of [`BACKUP_WINDOW`].
///
/// Cancel safety: safe; dropped, the member's stream closes and the staged
/// copy is removed.
async fn fetch(
    url: &ServerUrl,
    address: &str,
    first_part_within: Option<std::time::Duration>,
    file: &std::path::Path,
    from_follower: bool,
) -> Result<backup::Incoming, String> {
    let failed = |s: tonic::Status| format!("{address}: {}", s.message());
    let start = async {
        let mut client = connect_with(url, address, |endpoint| {
            if from_follower {
                endpoint
            } else {
                endpoint
                    .initial_stream_window_size(BACKUP_WINDOW)
                    .initial_connection_window_size(BACKUP_WINDOW)
            }
        })
        .await?;
        let mut stream = client
            .save_snapshot(pb::SaveSnapshotRequest {})
            .await
            .map_err(failed)?
            .into_inner();
        let first = stream.message().await.map_err(failed)?;
        Ok::<_, String>((stream, first))
    };
    let (mut stream, mut part) = match first_part_within {
        Some(limit) => tokio::time::timeout(limit, start).await.map_err(|_| {
            format!(
                "{address}: no part of the backup within {}",
                humantime::format_duration(limit)
            )
        })??,
        None => start.await?,
    };
    let mut incoming = backup::Incoming::start(file).map_err(|e| e.to_string())?;
    while let Some(received) = part {
        incoming
            .push(received.data)
            .await
            .map_err(|e| e.to_string())?;
        part = stream.message().await.map_err(failed)?;
    }
    Ok(incoming)
}

/// Where a backup is taken from ([`source_address`]).
struct Source {
    address: String,
    /// What it is, for the operator.
    role: &'static str,
    /// The leader's address when the source is a follower: where to turn
    /// if the follower fails to give it.
    leader: Option<String>,
}

/// What the leader is called in `snapshot save`'s output.
const LEADER: &str = "the leader";

/// Entries a follower may be behind the leader's log and still be where a
/// backup is taken from: a few milliseconds of a busy cluster's writes.
const CAUGHT_UP: u64 = 1_000;

/// The member a backup is taken from: the follower (voter or learner) the
/// leader reports least behind, if within [`CAUGHT_UP`] entries; else, or
/// with `from_leader`, the leader. The first member that answers names the
/// leader (its own address when it knows none), and only the leader knows
/// how far the others are.
///
/// Why a follower: encoding a big table and sending it take a member's CPU
/// and its runtime's thread for a second or so, which on the leader show in
/// every client's answers (docs/BENCHMARKS.md, "A backup from a
/// follower"). A follower's state is as consistent, at its own applied
/// index, and restores as safely: every token granted after it is below
/// the restore floor (`locksmith_server::backup`).
///
/// Cancel safety: safe, read-only.
async fn source_address(url: &ServerUrl, from_leader: bool) -> Result<Source, String> {
    let source = |address: String, role, leader| Source {
        address,
        role,
        leader,
    };
    let mut errors = Vec::new();
    for address in url.addresses() {
        let view = match connect(url, address).await {
            Ok(mut client) => client.status(pb::StatusRequest {}).await,
            Err(error) => {
                errors.push(error);
                continue;
            }
        };
        let view = match view {
            Ok(view) => view.into_inner(),
            Err(status) => {
                errors.push(format!("{address}: {}", status.message()));
                continue;
            }
        };
        let Some(leader) = view
            .members
            .iter()
            .find(|m| m.id == view.leader_id)
            .map(|m| m.address.clone())
        else {
            return Ok(source(
                address.clone(),
                "the member that answered; it knows no leader",
                None,
            ));
        };
        if from_leader {
            return Ok(source(leader, LEADER, None));
        }
        let view = if view.node_id == view.leader_id {
            view
        } else {
            match connect(url, &leader).await {
                Ok(mut client) => match client.status(pb::StatusRequest {}).await {
                    Ok(view) => view.into_inner(),
                    Err(_) => return Ok(source(leader, LEADER, None)),
                },
                Err(_) => return Ok(source(leader, LEADER, None)),
            }
        };
        return Ok(match caught_up_follower(&view) {
            Some(follower) => source(follower.address.clone(), "a follower", Some(leader)),
            None => source(leader, LEADER, None),
        });
    }
    Err(format!("no member answered: {}", errors.join("; ")))
}

/// In a leader's `view`, the member other than itself that is least behind
/// it, if it has matched the leader's log to within [`CAUGHT_UP`] entries.
pub fn caught_up_follower(view: &pb::ClusterStatus) -> Option<&pb::MemberStatus> {
    view.members
        .iter()
        .filter(|m| m.id != view.node_id && m.last_log_index.is_some())
        .filter_map(|m| Some((m.lag?, m)))
        .filter(|(lag, _)| *lag <= CAUGHT_UP)
        .min_by_key(|(lag, m)| (*lag, m.id))
        .map(|(_, m)| m)
}

fn show(n: Option<u64>) -> String {
    n.map_or("-".to_string(), |n| n.to_string())
}

/// Prints what the backup at `file` holds (checked as a restore checks it).
fn status(file: &std::path::Path, json: bool) -> Result<(), String> {
    let s = backup::inspect(file).map_err(|e| e.to_string())?;
    if json {
        println!(
            "{}",
            serde_json::to_string(&s).expect("a summary always encodes")
        );
        return Ok(());
    }
    let members: Vec<String> = s
        .members
        .iter()
        .map(|(id, addr, voter)| {
            let role = if *voter { "" } else { " (learner)" };
            format!("{id}={addr}{role}")
        })
        .collect();
    println!(
        "format:        {} (state format {}, log records of version {})",
        s.format, s.state_format, s.record_version
    );
    println!("origin:        {} (member {})", s.origin, s.node_id);
    let saved_at = std::time::UNIX_EPOCH + std::time::Duration::from_millis(s.saved_at_ms);
    println!(
        "saved at:      {}",
        humantime::format_rfc3339_millis(saved_at)
    );
    println!("log index:     {} (term {})", show(s.index), show(s.term));
    println!("members:       {}", members.join(","));
    println!("locks held:    {} ({} holds)", s.locks, s.holds);
    println!("waiters:       {}", s.waiters);
    println!("sessions:      {}", s.sessions);
    println!("last token:    {}", s.last_token);
    println!("token ceiling: {}", s.token_ceiling.max(s.last_token));
    println!(
        "restore floor: {} (tokens after a restore start above it)",
        s.restore_floor
    );
    Ok(())
}

/// Makes one new member's data directory from a backup or a member's data.
///
/// Cancel safety: see [`snapshot`].
async fn restore(
    file: Option<PathBuf>,
    from_member_data: Option<PathBuf>,
    force_new_cluster: bool,
    options: &RestoreOptions,
) -> Result<(), String> {
    let backup = match (&file, &from_member_data) {
        (Some(file), None) => Backup::read(file),
        (None, Some(dir)) => Backup::from_member_data(dir, force_new_cluster).await,
        _ => return Err("give a backup FILE or --from-member-data DIR".into()),
    }
    .map_err(|e| e.to_string())?;
    let restored = backup.restore(options).await.map_err(|e| e.to_string())?;
    let cluster: Vec<String> = options
        .members
        .iter()
        .map(|(id, addr)| format!("{id}={addr}"))
        .collect();
    let listen = options
        .members
        .iter()
        .find(|(id, _)| *id == options.node_id)
        .map_or("", |(_, addr)| addr.as_str());
    println!(
        "restored member {} into {} at log index {}; every token from now on is above {}; \
         start it with: locksmith serve --data-dir {} --node-id {} --listen {listen} --cluster {}",
        options.node_id,
        options.data_dir.display(),
        show(restored.index),
        restored.token_floor,
        options.data_dir.display(),
        options.node_id,
        cluster.join(",")
    );
    Ok(())
}
