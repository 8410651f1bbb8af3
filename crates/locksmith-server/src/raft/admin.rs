//! The cluster's membership, administered over gRPC (`locksmith.raft.v1.Cluster`,
//! served on every member's port; `locksmith cluster` is its client).
//!
//! A new member joins as a **learner**: it receives the log (or a snapshot,
//! when the log it needs was purged) but does not vote, so a cluster never
//! waits for a member that is still catching up. Once it has caught up, it is
//! **promoted** to voter. `add-learner` returns once the learner has caught
//! up. Changes are made by the leader; another member refuses them with
//! FAILED_PRECONDITION and names the leader in the `locksmith-leader`
//! metadata, like the lock service does.
//!
//! A change of voters goes through **joint consensus**: openraft first
//! commits a membership in which the old and the new voters both vote, then
//! the new one alone, and it drives the second step from the future that
//! asked for the change. So each change runs on a task of its own
//! ([`change_membership`]), which a caller that goes away does not stop, and
//! the leader finishes a joint membership that nobody finishes (its leader
//! died between the two steps, or openraft refused the second step) with
//! [`spawn_joint_finisher`], which leaves alone a joint membership while a
//! change of this member's is under way ([`ChangesUnderWay`]).
//!
//! Changes need `admin` when authentication is on; adding a learner is also
//! open to a caller with a member's certificate (the peer CA's), which is how
//! a member started with `--join` adds itself without an identity in the
//! auth file.

use std::collections::{BTreeSet, VecDeque};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use locksmith_core::planted::{self, Defect};
use locksmith_proto::raft as pb;
use locksmith_proto::transport::{self, Connector};
use openraft::async_runtime::WatchReceiver;
use openraft::errors::{ClientWriteError, RaftError};
use openraft::{BasicNode, ChangeMembers, Precondition, ServerState};
use tonic::{Request, Response, Status};

use openraft::raft::ClientWriteResponse;

use super::versions::{MemberVersion, Versions};
use super::{Raft, TypeConfig};
use crate::auth::{Auth, Caller, Permission};
use crate::inbox::{CoreSender, RaftEvent};
use crate::storage::background::{in_background, Background};
use crate::storage::backup;
use crate::tls::MemberCheck;
use std::sync::Arc;

/// The `Cluster` service of one member.
pub(crate) struct ClusterService {
    raft: Raft,
    /// The core, which freezes its state for a backup.
    core: CoreSender,
    /// The members' versions (module `versions`).
    versions: Arc<Versions>,
    auth: Option<Arc<Auth>>,
    /// Who counts as a member, for a joiner adding itself.
    members: MemberCheck,
    /// This member's changes under way, which the finisher leaves alone.
    changes: ChangesUnderWay,
}

/// How many membership changes this member's own tasks are making. A change
/// of voters takes its second step once its joint membership is committed
/// and applied here, which a leader slow to apply may take longer to do than
/// the finisher's patience: the finisher then ends the joint membership
/// first, and the change's own step is refused (its precondition names the
/// joint membership), so the operator would be told that a change that was
/// made failed. The finisher therefore waits while any change is under way.
#[derive(Clone, Default)]
pub(crate) struct ChangesUnderWay(Arc<AtomicUsize>);

impl ChangesUnderWay {
    /// Counts a change as under way until the returned value is dropped.
    fn begin(&self) -> ChangeUnderWay {
        self.0.fetch_add(1, Ordering::SeqCst);
        ChangeUnderWay(self.0.clone())
    }

    fn any(&self) -> bool {
        self.0.load(Ordering::SeqCst) > 0
    }
}

/// One change under way (see [`ChangesUnderWay::begin`]).
struct ChangeUnderWay(Arc<AtomicUsize>);

impl Drop for ChangeUnderWay {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Bytes of a backup per message of `SaveSnapshot`.
const BACKUP_CHUNK: usize = 1 << 20;

impl ClusterService {
    pub(crate) fn new(
        raft: Raft,
        core: CoreSender,
        versions: Arc<Versions>,
        auth: Option<Arc<Auth>>,
        members: MemberCheck,
        changes: ChangesUnderWay,
    ) -> ClusterService {
        ClusterService {
            raft,
            core,
            versions,
            auth,
            members,
            changes,
        }
    }

    /// Membership changes need `admin` on every name (module `auth`).
    fn admin<T>(&self, request: &Request<T>) -> Result<(), Status> {
        Caller::of(self.auth.as_ref(), request)?.check_all(Permission::Admin)
    }

    /// A new learner: added by an administrator, or by a member itself.
    fn admin_or_member<T>(&self, request: &Request<T>) -> Result<(), Status> {
        if self.members.certifies(request) {
            return Ok(());
        }
        self.admin(request)
    }

    /// Refuses a change on a member that does not lead, naming the leader.
    fn leading(&self) -> Result<(), Status> {
        if self.raft.is_leader() {
            return Ok(());
        }
        let metrics = self.raft.metrics().borrow_watched().clone();
        let leader = metrics.current_leader.and_then(|id| {
            metrics
                .membership_config
                .membership()
                .get_node(&id)
                .map(|node| node.addr.clone())
        });
        let mut status = Status::failed_precondition(match &leader {
            Some(addr) => format!("not the leader: membership changes go to {addr}"),
            None => "no leader yet: try again once one is elected".into(),
        });
        if let Some(value) = leader.and_then(|addr| addr.parse().ok()) {
            status
                .metadata_mut()
                .insert(locksmith_proto::LEADER_METADATA, value);
        }
        Err(status)
    }

    fn voters(&self) -> BTreeSet<u64> {
        let metrics = self.raft.metrics().borrow_watched().clone();
        metrics.membership_config.membership().voter_ids().collect()
    }

    fn is_member(&self, id: u64) -> bool {
        let metrics = self.raft.metrics().borrow_watched().clone();
        metrics
            .membership_config
            .membership()
            .get_node(&id)
            .is_some()
    }
}

/// The outcome of a membership change.
type ChangeResult =
    Result<ClientWriteResponse<TypeConfig>, RaftError<TypeConfig, ClientWriteError<TypeConfig>>>;

/// Makes a membership change on a task of its own and waits for it.
/// openraft drives a change of voters in two steps (the joint membership,
/// then the new one) from the future that asked for it: dropped between the
/// two, the group would stay in joint consensus. A task runs to the end
/// whoever waits, counted in `changes` meanwhile.
///
/// Cancel safety: safe; a dropped call leaves the change running.
async fn change_membership(
    raft: &Raft,
    changes: &ChangesUnderWay,
    change: ChangeMembers<u64, BasicNode>,
) -> ChangeResult {
    let raft = raft.clone();
    let under_way = changes.begin();
    let task = tokio::spawn(async move {
        let result = raft.change_membership(change, false).await;
        drop(under_way);
        result
    });
    match task.await {
        Ok(result) => result,
        Err(ended) if ended.is_panic() => std::panic::resume_unwind(ended.into_panic()),
        Err(_) => Err(RaftError::Fatal(openraft::errors::Fatal::Stopped)),
    }
}

/// A change's outcome as the reply says it.
fn changed(result: ChangeResult) -> Result<Response<pb::ChangeResponse>, Status> {
    match result {
        Ok(written) => Ok(Response::new(pb::ChangeResponse {
            log_index: written.log_id.index,
        })),
        Err(RaftError::APIError(ClientWriteError::ForwardToLeader(_))) => Err(
            Status::failed_precondition("no longer the leader: try the change again"),
        ),
        Err(RaftError::APIError(ClientWriteError::ChangeMembershipError(error))) => {
            Err(Status::failed_precondition(error.to_string()))
        }
        Err(error) => Err(Status::unavailable(error.to_string())),
    }
}

#[tonic::async_trait]
impl pb::cluster_server::Cluster for ClusterService {
    /// The members, their roles and logs, as this member knows them.
    ///
    /// Cancel safety: safe, read-only, no await.
    async fn status(
        &self,
        request: Request<pb::StatusRequest>,
    ) -> Result<Response<pb::ClusterStatus>, Status> {
        Caller::of(self.auth.as_ref(), &request)?;
        let mut status = cluster_status(&self.raft);
        status.cluster_version = self.versions.cluster();
        for member in &mut status.members {
            if let Some(version) = self.versions.of(member.id) {
                member.version = Some(version.build);
                member.record_version = Some(version.records);
            }
        }
        Ok(Response::new(status))
    }

    /// A member's versions, kept by the leader for its gate (module
    /// `versions`) and `status`.
    ///
    /// Cancel safety: safe, no await.
    async fn announce(
        &self,
        request: Request<pb::AnnounceRequest>,
    ) -> Result<Response<pb::AnnounceResponse>, Status> {
        self.admin_or_member(&request)?;
        let pb::AnnounceRequest {
            node_id,
            version,
            record_version,
        } = request.into_inner();
        self.leading()?;
        if !self.is_member(node_id) {
            return Err(Status::not_found(format!("no member {node_id}")));
        }
        let version = MemberVersion {
            build: version,
            records: record_version,
        };
        if self.versions.of(node_id).as_ref() != Some(&version) {
            tracing::info!(
                member = node_id,
                build = %version.build,
                record_version,
                "a member's versions"
            );
        }
        self.versions.announced(node_id, version);
        Ok(Response::new(pb::AnnounceResponse {}))
    }

    /// Adds a learner, and answers once it has caught up with the log.
    ///
    /// Cancel safety (tonic drops this future when the caller goes away):
    /// once the change is in openraft's queue, the learner is added whether
    /// or not anyone waits; only the wait for it to catch up is given up. A
    /// retry then answers ALREADY_EXISTS, which `join` takes as done.
    async fn add_learner(
        &self,
        request: Request<pb::AddLearnerRequest>,
    ) -> Result<Response<pb::ChangeResponse>, Status> {
        self.admin_or_member(&request)?;
        let pb::AddLearnerRequest { id, address } = request.into_inner();
        if id == 0 {
            return Err(Status::invalid_argument("a member id is a number above 0"));
        }
        let port_ok = address
            .rsplit_once(':')
            .is_some_and(|(host, port)| !host.is_empty() && port.parse::<u16>().is_ok());
        if !port_ok {
            return Err(Status::invalid_argument(format!(
                "{address:?} is not HOST:PORT"
            )));
        }
        self.leading()?;
        if self.is_member(id) {
            return Err(Status::already_exists(format!(
                "member {id} is in the cluster already"
            )));
        }
        tracing::info!(id, %address, "adding a learner");
        changed(
            self.raft
                .add_learner(id, BasicNode::new(address), true)
                .await,
        )
    }

    /// Makes a learner a voter: a joint membership, then the new one.
    ///
    /// Cancel safety: safe; the change runs on a task of its own
    /// ([`change_membership`]): a caller that goes away does not learn the
    /// outcome, and a retry answers ALREADY_EXISTS.
    async fn promote(
        &self,
        request: Request<pb::MemberRequest>,
    ) -> Result<Response<pb::ChangeResponse>, Status> {
        self.admin(&request)?;
        let id = request.into_inner().id;
        self.leading()?;
        if !self.is_member(id) {
            return Err(Status::not_found(format!("no member {id}")));
        }
        if self.voters().contains(&id) {
            return Err(Status::already_exists(format!(
                "member {id} is a voter already"
            )));
        }
        tracing::info!(id, "promoting a learner to voter");
        let change = ChangeMembers::AddVoterIds(BTreeSet::from([id]));
        changed(change_membership(&self.raft, &self.changes, change).await)
    }

    /// Removes a member: a learner at once, a voter through a joint
    /// membership.
    ///
    /// Cancel safety: safe; the change runs on a task of its own
    /// ([`change_membership`]): a caller that goes away does not learn the
    /// outcome, and a retry answers NOT_FOUND once it is made.
    async fn remove(
        &self,
        request: Request<pb::MemberRequest>,
    ) -> Result<Response<pb::ChangeResponse>, Status> {
        self.admin(&request)?;
        let id = request.into_inner().id;
        self.leading()?;
        if !self.is_member(id) {
            return Err(Status::not_found(format!("no member {id}")));
        }
        let voters = self.voters();
        if voters.contains(&id) {
            if voters.len() == 1 {
                return Err(Status::failed_precondition(format!(
                    "member {id} is the last voter: a cluster needs one"
                )));
            }
            tracing::info!(id, "removing a voter");
            let change = ChangeMembers::RemoveVoters(BTreeSet::from([id]));
            changed(change_membership(&self.raft, &self.changes, change).await)
        } else {
            tracing::info!(id, "removing a learner");
            let change = ChangeMembers::RemoveNodes(BTreeSet::from([id]));
            changed(change_membership(&self.raft, &self.changes, change).await)
        }
    }

    /// Asks openraft to hand leadership to a voter; answers without waiting
    /// for the handover.
    ///
    /// Cancel safety: safe; once the command is in openraft's queue the
    /// handover goes ahead whether or not the caller is still there.
    async fn transfer_leader(
        &self,
        request: Request<pb::MemberRequest>,
    ) -> Result<Response<pb::ChangeResponse>, Status> {
        self.admin(&request)?;
        let id = request.into_inner().id;
        self.leading()?;
        if !self.voters().contains(&id) {
            return Err(Status::not_found(format!("no voter {id}")));
        }
        tracing::info!(to = id, "handing leadership over");
        self.raft
            .trigger()
            .transfer_leader(id)
            .await
            .map_err(|e| Status::unavailable(e.to_string()))?;
        Ok(Response::new(pb::ChangeResponse { log_index: 0 }))
    }

    type SaveSnapshotStream =
        std::pin::Pin<Box<dyn futures::Stream<Item = Result<pb::SnapshotBytes, Status>> + Send>>;

    /// A backup of this member's applied state: the core freezes it between
    /// two entries and goes on; it is encoded and checksummed on a thread
    /// of lower priority (`storage::background`), then sent in 1 MiB messages (slices of the one buffer).
    ///
    /// Cancel safety: safe; dropped, the frozen copy or the encoded bytes
    /// are thrown away (an encoding already started finishes unused).
    async fn save_snapshot(
        &self,
        request: Request<pb::SaveSnapshotRequest>,
    ) -> Result<Response<Self::SaveSnapshotStream>, Status> {
        self.admin(&request)?;
        let (reply, frozen) = tokio::sync::oneshot::channel();
        let stopped = || Status::unavailable("the lock engine stopped");
        self.core
            .send(RaftEvent::Snapshot { reply })
            .map_err(|_| stopped())?;
        let frozen = frozen.await.map_err(|_| stopped())?;
        let index = frozen.meta.last_log_id.map(|id| id.index);
        let node_id = self.raft.metrics().borrow_watched().id;
        let started = std::time::Instant::now();
        let bytes = in_background(Background::Backup, move || backup::live(frozen, node_id))
            .await
            .map_err(|e| Status::internal(format!("encoding the backup failed: {e}")))?;
        tracing::info!(
            ?index,
            bytes = bytes.len(),
            encoded_in = ?started.elapsed(),
            "backup taken"
        );
        let chunks: Vec<Result<pb::SnapshotBytes, Status>> = (0..bytes.len())
            .step_by(BACKUP_CHUNK)
            .map(|start| {
                let end = bytes.len().min(start + BACKUP_CHUNK);
                Ok(pb::SnapshotBytes {
                    data: bytes.slice(start..end),
                })
            })
            .collect();
        Ok(Response::new(Box::pin(futures::stream::iter(chunks))))
    }
}

/// How long a joiner waits for an answer to one ask, and to connect.
const JOIN_ASK: Duration = Duration::from_secs(10);
const JOIN_CONNECT: Duration = Duration::from_secs(2);

/// How long a joiner that was told it is added waits to see it in a
/// membership it has applied, before it asks again.
const JOIN_SEEN: Duration = Duration::from_secs(5);

/// Joins this member (not initialized: a new data directory) to the cluster
/// whose members listen at `through` (`host:port[,host:port...]`): asks the
/// leader (following the `locksmith-leader` hint) to add it as a learner,
/// passing over members that cannot be reached, so that a joiner does not
/// depend on any one member being up. Returns once it is added, or with the
/// error of a member that refuses it. Until then it keeps asking, a second
/// apart at most: members started together (a joiner may come up before
/// the others have elected a leader) need no order. It reaches the
/// members through `connector` when given (as Raft's own messages do). A
/// leader hint is followed after 10 ms, the next one after twice as long
/// and so on: two members naming each other (an election under way) are not
/// asked in a tight loop.
///
/// Added means `joined` says so: this member has applied a membership that
/// names it (so a leader committed it). An answer that it was added (or is
/// already) is not enough: a leader cut off from the others adds it to its
/// own log only, and the entry is dropped once another leader is elected;
/// so after such an answer it waits up to [`JOIN_SEEN`] for `joined`, then
/// asks again. An ask that breaks (a transport error: no answer of the
/// member's) or takes longer than [`JOIN_ASK`] is asked again, like one to
/// a member without a leader; one whose TLS session the member refused
/// (this member's certificate is not of the cluster's CA) is a refusal.
///
/// Cancel safety: safe; a dropped join may have added the member already,
/// and a second one finds it added.
pub(crate) async fn join(
    through: &str,
    id: u64,
    address: &str,
    tls: Option<tonic::transport::ClientTlsConfig>,
    connector: Option<Connector>,
    joined: impl Fn() -> bool,
) -> Result<(), String> {
    let mut queue: VecDeque<String> = through
        .split(',')
        .map(str::trim)
        .filter(|a| !a.is_empty() && *a != address)
        .map(str::to_owned)
        .collect();
    if queue.is_empty() {
        return Err(format!("no member to join through in {through:?}"));
    }
    let mut pause = Duration::from_millis(100);
    let mut hint_pause = Duration::from_millis(10);
    let mut attempts = 0u64;
    loop {
        if joined() {
            return Ok(());
        }
        attempts += 1;
        let Some(target) = queue.pop_front() else {
            return Err(format!("no member to join through in {through:?}"));
        };
        let endpoint = super::network::peer_endpoint(&target, tls.clone())
            .map_err(|e| format!("member address {target:?}: {e}"))?
            .connect_timeout(JOIN_CONNECT);
        let connected = transport::connect(endpoint, connector.as_ref()).await;
        let outcome = match connected {
            Err(e) => format!("cannot reach {target}: {e}"),
            Ok(channel) => {
                let request = pb::AddLearnerRequest {
                    id,
                    address: address.to_owned(),
                };
                let mut client = pb::cluster_client::ClusterClient::new(channel);
                let answer = tokio::time::timeout(JOIN_ASK, client.add_learner(request)).await;
                match answer {
                    Err(_) => format!("{target}: no answer within {JOIN_ASK:?}"),
                    Ok(Ok(_)) => {
                        if seen(&joined).await {
                            return Ok(());
                        }
                        format!("{target} added this member, which has not seen it applied")
                    }
                    Ok(Err(status)) if status.code() == tonic::Code::AlreadyExists => {
                        if seen(&joined).await {
                            return Ok(());
                        }
                        format!("{target} has this member, which has not seen it applied")
                    }
                    // TLS refused this member's certificate: a refusal.
                    Ok(Err(status)) if refused_by_tls(&status) => {
                        return Err(format!(
                            "{target} refused this member's certificate: {status}"
                        ))
                    }
                    // Not an answer of the member's: the connection broke.
                    Ok(Err(status)) if std::error::Error::source(&status).is_some() => {
                        format!("{target}: {status}")
                    }
                    Ok(Err(status)) => match status
                        .metadata()
                        .get(locksmith_proto::LEADER_METADATA)
                        .and_then(|v| v.to_str().ok())
                    {
                        Some(leader) => {
                            // Next, the leader it names (each address once).
                            queue.push_back(target);
                            queue.retain(|a| a != leader);
                            queue.push_front(leader.to_owned());
                            tokio::time::sleep(hint_pause).await;
                            hint_pause = (hint_pause * 2).min(Duration::from_secs(1));
                            continue;
                        }
                        None if status.code() == tonic::Code::FailedPrecondition
                            || status.code() == tonic::Code::Unavailable =>
                        {
                            format!("{target}: {}", status.message())
                        }
                        None => {
                            return Err(format!("{target} refused to add this member: {status}"))
                        }
                    },
                }
            }
        };
        queue.push_back(target);
        if attempts % 20 == 0 {
            tracing::warn!(%through, last = %outcome, "still trying to join the cluster");
        }
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(Duration::from_secs(1));
    }
}

/// Whether `status` failed in TLS: a rustls error somewhere in its
/// sources, or the I/O error of kind `InvalidData` that the TLS stream
/// makes of one ("received fatal alert: UnknownCA" when the member refuses
/// this one's certificate). Asking again changes nothing then.
fn refused_by_tls(status: &Status) -> bool {
    let mut source = std::error::Error::source(status);
    while let Some(error) = source {
        if error.is::<rustls::Error>() {
            return true;
        }
        if let Some(io) = error.downcast_ref::<std::io::Error>() {
            if io.kind() == std::io::ErrorKind::InvalidData {
                return true;
            }
        }
        source = error.source();
    }
    false
}

/// Waits up to [`JOIN_SEEN`] for `joined`; whether it came.
///
/// Cancel safety: safe, it only looks.
async fn seen(joined: &impl Fn() -> bool) -> bool {
    let deadline = tokio::time::Instant::now() + JOIN_SEEN;
    while !joined() {
        if tokio::time::Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    true
}

/// Whether `raft`'s member `id` has applied a membership that names it: it
/// was added, and a leader committed it.
pub(crate) fn applied_member(raft: &Raft, id: u64) -> bool {
    let m = raft.metrics().borrow_watched().clone();
    let membership = &m.membership_config;
    let applied = match (membership.log_id(), &m.last_applied) {
        (Some(at), Some(applied)) => applied.index >= at.index,
        _ => false,
    };
    applied && membership.membership().get_node(&id).is_some()
}

/// While this member leads, promotes every learner whose log is within `lag`
/// entries of the leader's (`--auto-promote-lag`): a member that joins
/// becomes a voter once it has caught up, without an operator.
pub(crate) fn spawn_auto_promote(raft: Raft, changes: ChangesUnderWay, lag: u64) {
    tokio::spawn(async move {
        let mut metrics = raft.metrics();
        loop {
            let ready: Vec<u64> = {
                let m = metrics.borrow_watched();
                let membership = m.membership_config.membership();
                let last = m.last_log_index.unwrap_or(0);
                match (&m.replication, m.state == ServerState::Leader) {
                    (Some(replication), true) => membership
                        .learner_ids()
                        .filter(|id| {
                            let matched = replication
                                .get(id)
                                .cloned()
                                .flatten()
                                .map_or(0, |log_id| log_id.index);
                            last.saturating_sub(matched) <= lag
                        })
                        .collect(),
                    _ => Vec::new(),
                }
            };
            if !ready.is_empty() {
                tracing::info!(?ready, lag, "promoting learners that caught up");
                let change = ChangeMembers::AddVoterIds(ready.into_iter().collect());
                let _under_way = changes.begin();
                if let Err(error) = raft.change_membership(change, false).await {
                    tracing::warn!(%error, "could not promote");
                }
            }
            if metrics.changed().await.is_err() {
                return;
            }
        }
    });
}

/// While this member leads, ends a joint membership that nobody ends: one
/// whose change was cut short between its two steps, by the death or the
/// deposition of the leader that made it (the new leader inherits the joint
/// membership, and openraft does not finish it). Every `patience` it looks;
/// a committed joint membership that is still the same one a look later
/// gets its second step, guarded so that it lands only on that membership.
/// While one of this member's changes is under way (`changes`), it takes its
/// own second step and the finisher waits.
pub(crate) fn spawn_joint_finisher(raft: Raft, changes: ChangesUnderWay, patience: Duration) {
    tokio::spawn(async move {
        let mut seen = None;
        let mut looks = tokio::time::interval(patience);
        // Changes with the role or the membership only; ends with openraft.
        let mut server = raft.server_metrics();
        loop {
            tokio::select! {
                _ = looks.tick() => {}
                changed = server.changed() => match changed {
                    Ok(()) => continue,
                    Err(_) => return,
                },
            }
            // A joint membership already applied here, so committed, that
            // no change of this member's is still ending.
            let joint = {
                let m = raft.metrics().borrow_watched().clone();
                let membership = &m.membership_config;
                let applied = match (membership.log_id(), &m.last_applied) {
                    (Some(joint), Some(applied)) => applied.index >= joint.index,
                    _ => false,
                };
                let left =
                    (applied && !changes.any()) || planted::active(Defect::JointFinisherRace);
                let joint = membership.get_joint_config().len() > 1;
                (m.state == ServerState::Leader && joint && left).then(|| *membership.log_id())
            };
            match joint {
                Some(log_id) if seen.as_ref() == Some(&log_id) => {
                    tracing::info!(?log_id, "ending a membership change left halfway");
                    let flatten = ChangeMembers::AddVoterIds(BTreeSet::new());
                    let only_that = Precondition::LastMembershipLogId {
                        last_membership_log_id: log_id,
                    };
                    if let Err(error) = raft.change_membership_if(flatten, false, [only_that]).await
                    {
                        tracing::info!(%error, "the membership change is not ended yet");
                    }
                }
                Some(log_id) => seen = Some(log_id),
                None => seen = None,
            }
        }
    });
}

/// What `locksmith cluster status` and the web page show: every member,
/// its role and how far its log is, as this member's openraft metrics know
/// them (a leader knows every member's match index; others only their own).
pub(crate) fn cluster_status(raft: &Raft) -> pb::ClusterStatus {
    let m = raft.metrics().borrow_watched().clone();
    let membership = m.membership_config.membership();
    let voters: BTreeSet<u64> = membership.voter_ids().collect();
    let leading = m.state == ServerState::Leader;
    let last_log = m.last_log_index;
    let members = membership
        .nodes()
        .map(|(&id, node)| {
            let (matched, lag) = if id == m.id {
                (last_log, leading.then_some(0))
            } else {
                let matched = m
                    .replication
                    .as_ref()
                    .and_then(|r| r.get(&id).cloned().flatten())
                    .map(|log_id| log_id.index);
                let lag = m
                    .replication
                    .as_ref()
                    .map(|_| last_log.unwrap_or(0).saturating_sub(matched.unwrap_or(0)));
                (matched, lag)
            };
            pb::MemberStatus {
                id,
                address: node.addr.clone(),
                voter: voters.contains(&id),
                leader: m.current_leader == Some(id),
                last_log_index: matched,
                applied_index: (id == m.id)
                    .then(|| m.last_applied.map(|l| l.index))
                    .flatten(),
                lag,
                // Known from announcements: `ClusterService::status`.
                version: None,
                record_version: None,
            }
        })
        .collect();
    pb::ClusterStatus {
        changing: membership.get_joint_config().len() > 1,
        node_id: m.id,
        leader_id: m.current_leader.unwrap_or(0),
        term: m.current_term,
        members,
        cluster_version: 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// A member that refuses every change and names `leader` as the leader,
    /// counting the joins it was asked for.
    struct Redirecting {
        leader: String,
        asked: Arc<AtomicUsize>,
    }

    fn unimplemented<T>() -> Result<Response<T>, Status> {
        Err(Status::unimplemented("not here"))
    }

    #[tonic::async_trait]
    impl pb::cluster_server::Cluster for Redirecting {
        async fn status(
            &self,
            _: Request<pb::StatusRequest>,
        ) -> Result<Response<pb::ClusterStatus>, Status> {
            unimplemented()
        }

        async fn add_learner(
            &self,
            _: Request<pb::AddLearnerRequest>,
        ) -> Result<Response<pb::ChangeResponse>, Status> {
            self.asked.fetch_add(1, Ordering::Relaxed);
            let mut status = Status::failed_precondition("not the leader");
            status.metadata_mut().insert(
                locksmith_proto::LEADER_METADATA,
                self.leader.parse().unwrap(),
            );
            Err(status)
        }

        async fn promote(
            &self,
            _: Request<pb::MemberRequest>,
        ) -> Result<Response<pb::ChangeResponse>, Status> {
            unimplemented()
        }

        async fn remove(
            &self,
            _: Request<pb::MemberRequest>,
        ) -> Result<Response<pb::ChangeResponse>, Status> {
            unimplemented()
        }

        async fn transfer_leader(
            &self,
            _: Request<pb::MemberRequest>,
        ) -> Result<Response<pb::ChangeResponse>, Status> {
            unimplemented()
        }

        async fn announce(
            &self,
            _: Request<pb::AnnounceRequest>,
        ) -> Result<Response<pb::AnnounceResponse>, Status> {
            unimplemented()
        }

        type SaveSnapshotStream = tokio_stream::Empty<Result<pb::SnapshotBytes, Status>>;

        async fn save_snapshot(
            &self,
            _: Request<pb::SaveSnapshotRequest>,
        ) -> Result<Response<Self::SaveSnapshotStream>, Status> {
            unimplemented()
        }
    }

    /// Two members that name each other as the leader (as during an
    /// election) are asked a few times in a second, not in a tight loop.
    #[tokio::test]
    async fn a_joiner_backs_off_between_members_naming_each_other() {
        let listeners = [
            tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap(),
            tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap(),
        ];
        let addresses: Vec<String> = listeners
            .iter()
            .map(|l| l.local_addr().unwrap().to_string())
            .collect();
        let asked = Arc::new(AtomicUsize::new(0));
        for (i, listener) in listeners.into_iter().enumerate() {
            let member = Redirecting {
                leader: addresses[1 - i].clone(),
                asked: asked.clone(),
            };
            tokio::spawn(
                tonic::transport::Server::builder()
                    .add_service(pb::cluster_server::ClusterServer::new(member))
                    .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener)),
            );
        }
        let joining = join(&addresses[0], 4, "127.0.0.1:1", None, None, || false);
        let outcome = tokio::time::timeout(Duration::from_secs(2), joining).await;
        assert!(outcome.is_err(), "no leader to add it: {outcome:?}");
        // Hint pauses of 10, 20, 40 ... ms: 8 asks fit in two seconds,
        // however fast the machine (the first at once); two seconds leave a
        // loaded machine room for the second.
        let asked = asked.load(Ordering::Relaxed);
        assert!((2..=8).contains(&asked), "asked {asked} times in 2 s");
    }
}
