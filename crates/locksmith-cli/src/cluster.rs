//! `locksmith cluster`: the membership of a replicated lock server.
//!
//! `status` asks each member for its view and prints one row per member as
//! the leader sees it (role, term, last log index, applied index, lag);
//! `add-learner`, `promote`, `remove` and `transfer-leader` go to the leader
//! (a member that does not lead names it, and the command follows).

use std::process::ExitCode;

use clap::{Args, Subcommand};
use locksmith::server::{Credentials, ServerUrl};
use locksmith_proto::raft as pb;
use locksmith_proto::raft::cluster_client::ClusterClient;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::{Channel, Endpoint};

/// Options of `locksmith cluster`.
#[derive(Debug, Args)]
pub struct ClusterArgs {
    #[command(flatten)]
    members: MembersArgs,
    #[command(subcommand)]
    command: ClusterCommand,
}

/// How to reach a cluster's members: the option `locksmith cluster` and
/// `locksmith snapshot save` share.
#[derive(Debug, Args)]
pub(crate) struct MembersArgs {
    /// The cluster's members: `locksmith://host:port[,host:port...]` (any
    /// one that answers will do), or `locksmith+tls://…?ca=FILE`; the token
    /// comes from `LOCKSMITH_TOKEN` or `?token_file=FILE`. `--server` is an
    /// older spelling of it.
    #[arg(
        long,
        alias = "server",
        env = "LOCKSMITH_BACKEND",
        default_value = "locksmith://127.0.0.1:7420"
    )]
    backend: String,
}

impl MembersArgs {
    /// The members' URL, with the files it names read (CA, token).
    pub(crate) fn url(&self) -> Result<ServerUrl, String> {
        ServerUrl::parse(&self.backend).map_err(|e| e.to_string())
    }
}

#[derive(Debug, Subcommand)]
enum ClusterCommand {
    /// Every member: id, address, role, term, last log and applied index,
    /// lag, version.
    Status {
        /// One JSON object: `{"leader_id", "term", "changing",
        /// "cluster_version", "members": [{"id", "address", "voter",
        /// "leader", "last_log_index", "applied_index", "lag", "version",
        /// "record_version"}]}` (what the answering member does not know is
        /// null; `changing`: a change of voters is under way, and the old
        /// and the new voters both vote until it ends; `version` and
        /// `record_version`: a member's build and the newest log record
        /// version it reads, as it told the leader; `cluster_version`: the
        /// newest every member reads, agreed in the log).
        #[arg(long)]
        json: bool,
    },
    /// Add a member that receives the log but does not vote yet; returns once
    /// it has caught up.
    AddLearner {
        /// Its id (unique in the cluster, never reused).
        id: u64,
        /// HOST:PORT where the members and clients reach it.
        address: String,
    },
    /// Make a learner a voter.
    Promote { id: u64 },
    /// Take a member out of the cluster.
    Remove { id: u64 },
    /// Hand leadership to a voter.
    TransferLeader { id: u64 },
}

/// A client of the member at `address`, over the URL's transport and with
/// its credentials.
///
/// Cancel safety: safe (a dropped connect leaves nothing behind).
pub(crate) async fn connect(url: &ServerUrl, address: &str) -> Result<Admin, String> {
    connect_with(url, address, |endpoint| endpoint).await
}

/// [`connect`], with the endpoint's settings changed by `configure` (the
/// transport's windows for a backup, say).
///
/// Cancel safety: safe (a dropped connect leaves nothing behind).
pub(crate) async fn connect_with(
    url: &ServerUrl,
    address: &str,
    configure: impl FnOnce(Endpoint) -> Endpoint,
) -> Result<Admin, String> {
    let endpoint = url.endpoint(address).map_err(|e| e.to_string())?;
    let channel = configure(endpoint)
        .connect()
        .await
        .map_err(|e| format!("cannot reach {address}: {e}"))?;
    Ok(ClusterClient::with_interceptor(channel, url.credentials()))
}

pub(crate) type Admin = ClusterClient<InterceptedService<Channel, Credentials>>;

/// Runs `locksmith cluster`.
///
/// Cancel safety: `status` only reads; a dropped change may or may not have
/// been made, as for `change`.
pub async fn cluster(args: ClusterArgs) -> ExitCode {
    let result = match args.members.url() {
        Ok(url) => match args.command {
            ClusterCommand::Status { json } => status(&url, json).await,
            command => change(&url, command).await.map(|index| {
                if index > 0 {
                    println!("done (log entry {index})");
                } else {
                    println!("done");
                }
            }),
        },
        Err(error) => Err(error),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("locksmith cluster: {error}");
            ExitCode::FAILURE
        }
    }
}

/// The leader's view (or, when no member leads, the first that answers).
///
/// Cancel safety: safe, read-only.
async fn status(url: &ServerUrl, json: bool) -> Result<(), String> {
    let mut views = Vec::new();
    let mut errors = Vec::new();
    for address in url.addresses() {
        match connect(url, address).await {
            Ok(mut client) => match client.status(pb::StatusRequest {}).await {
                Ok(reply) => views.push(reply.into_inner()),
                Err(status) => errors.push(format!("{address}: {}", status.message())),
            },
            Err(error) => errors.push(error),
        }
    }
    let Some(view) = views
        .iter()
        .find(|v| v.leader_id != 0 && v.leader_id == v.node_id)
        .or(views.first())
        .cloned()
    else {
        return Err(format!("no member answered: {}", errors.join("; ")));
    };
    if json {
        println!("{}", status_json(&view));
        return Ok(());
    }
    println!(
        "{:>4}  {:<22}  {:<9}  {:>6}  {:>9}  {:>9}  {:>6}  {:<16}",
        "ID", "ADDRESS", "ROLE", "TERM", "LAST LOG", "APPLIED", "LAG", "VERSION (RECORDS)"
    );
    let show = |n: Option<u64>| n.map_or("-".to_string(), |n| n.to_string());
    for member in &view.members {
        let role = match (member.leader, member.voter) {
            (true, _) => "leader",
            (false, true) => "follower",
            (false, false) => "learner",
        };
        let version = match (&member.version, member.record_version) {
            (Some(build), Some(records)) => format!("{build} ({records})"),
            _ => "-".into(),
        };
        println!(
            "{:>4}  {:<22}  {:<9}  {:>6}  {:>9}  {:>9}  {:>6}  {:<16}",
            member.id,
            member.address,
            role,
            view.term,
            show(member.last_log_index),
            show(member.applied_index),
            show(member.lag),
            version
        );
    }
    if view.cluster_version > 0 {
        println!(
            "log record version in use: {} (the newest every member reads)",
            view.cluster_version
        );
    }
    if view.changing {
        println!(
            "a change of voters is under way: the old and the new voters both vote until it ends"
        );
    }
    for error in errors {
        eprintln!("unreachable: {error}");
    }
    Ok(())
}

pub fn status_json(view: &pb::ClusterStatus) -> serde_json::Value {
    serde_json::json!({
        "leader_id": (view.leader_id != 0).then_some(view.leader_id),
        "term": view.term,
        "changing": view.changing,
        "cluster_version": (view.cluster_version > 0).then_some(view.cluster_version),
        "members": view.members.iter().map(|m| serde_json::json!({
            "id": m.id,
            "address": m.address,
            "voter": m.voter,
            "leader": m.leader,
            "last_log_index": m.last_log_index,
            "applied_index": m.applied_index,
            "lag": m.lag,
            "version": m.version,
            "record_version": m.record_version,
        })).collect::<Vec<_>>(),
    })
}

/// Sends a membership change to the leader among `members` (following its
/// address when another member answers); returns the log index it was
/// committed at (0 when the answer has none).
///
/// Cancel safety: a dropped change may or may not have been made; `status`
/// tells.
async fn change(url: &ServerUrl, command: ClusterCommand) -> Result<u64, String> {
    let mut queue: Vec<String> = url.addresses().to_vec();
    let mut last = String::from("no member tried");
    let mut tries = 0;
    while let Some(address) = queue.first().cloned() {
        tries += 1;
        if tries > 10 {
            break;
        }
        queue.remove(0);
        let mut client = match connect(url, &address).await {
            Ok(client) => client,
            Err(error) => {
                last = error;
                continue;
            }
        };
        let sent = match &command {
            ClusterCommand::AddLearner { id, address } => {
                let request = pb::AddLearnerRequest {
                    id: *id,
                    address: address.clone(),
                };
                client.add_learner(request).await
            }
            ClusterCommand::Promote { id } => client.promote(pb::MemberRequest { id: *id }).await,
            ClusterCommand::Remove { id } => client.remove(pb::MemberRequest { id: *id }).await,
            ClusterCommand::TransferLeader { id } => {
                client.transfer_leader(pb::MemberRequest { id: *id }).await
            }
            ClusterCommand::Status { .. } => unreachable!("not a change"),
        };
        match sent {
            Ok(reply) => return Ok(reply.into_inner().log_index),
            Err(status) => {
                let leader = status
                    .metadata()
                    .get(locksmith_proto::LEADER_METADATA)
                    .and_then(|v| v.to_str().ok())
                    .map(str::to_owned);
                match leader {
                    Some(leader) => queue.insert(0, leader),
                    None if status.code() == tonic::Code::FailedPrecondition
                        || status.code() == tonic::Code::Unavailable =>
                    {
                        last = format!("{address}: {}", status.message());
                    }
                    None => return Err(format!("{address}: {}", status.message())),
                }
            }
        }
    }
    Err(last)
}
