//! Which versions the members run, as each tells the leader, and the
//! leader's gate that logs a newer cluster record version once every member
//! reads it (the rule is in module `core::replicated::versions`).
//!
//! Every member tells each new leader its build and the record version it
//! reads (`Cluster.Announce`, as a joiner adds itself: with a member's
//! certificate, or open without authentication); the leader keeps what it
//! heard in [`Versions`], which `cluster status` also shows. On every
//! announcement, and once a second, the leader compares: if every member of the membership, voters and
//! learners, announced a record version above the cluster's, it asks the
//! core to log the lowest of them (`Op::RaiseClusterVersion`). A member of a
//! build from before record versions never announces, so the cluster
//! version stays where every build reads it.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use locksmith_proto::raft as pb;
use locksmith_proto::transport::{self, Connector};
use openraft::async_runtime::WatchReceiver;

use super::Raft;
use crate::inbox::CoreSender;
use crate::op::Op;

/// A member's build and the newest record version it reads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct MemberVersion {
    pub build: String,
    pub records: u32,
}

/// What this member knows of the versions: its own, the cluster's as last
/// applied here, and (on the leader) what each member announced.
pub(crate) struct Versions {
    pub own: MemberVersion,
    cluster: AtomicU32,
    announced: Mutex<BTreeMap<u64, MemberVersion>>,
    /// A member announced itself: the leader compares at once, so that a
    /// cluster just formed agrees on its version within a round trip.
    heard: tokio::sync::Notify,
}

impl Versions {
    pub(crate) fn new(records: u32) -> Arc<Versions> {
        Arc::new(Versions {
            own: MemberVersion {
                build: env!("CARGO_PKG_VERSION").to_owned(),
                records,
            },
            cluster: AtomicU32::new(1),
            announced: Mutex::new(BTreeMap::new()),
            heard: tokio::sync::Notify::new(),
        })
    }

    /// The cluster's record version as last applied here (the core sets it).
    pub(crate) fn cluster(&self) -> u32 {
        self.cluster.load(Ordering::Relaxed)
    }

    pub(crate) fn set_cluster(&self, version: u32) {
        self.cluster.store(version, Ordering::Relaxed);
    }

    /// Member `id` announced `version`.
    pub(crate) fn announced(&self, id: u64, version: MemberVersion) {
        let before = self.lock().insert(id, version.clone());
        if before != Some(version) {
            self.heard.notify_one();
        }
    }

    /// What member `id` announced, if it did.
    pub(crate) fn of(&self, id: u64) -> Option<MemberVersion> {
        self.lock().get(&id).cloned()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<u64, MemberVersion>> {
        self.announced.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Tells every new leader this member's versions, and on the leader raises
/// the cluster's record version once every member reads a newer one.
///
/// Cancel safety: runs as its own task until openraft stops; aborted, it
/// changes nothing (a raise asked for is logged or refused by the core).
pub(crate) async fn run(
    raft: Raft,
    versions: Arc<Versions>,
    core: CoreSender,
    tls: Option<tonic::transport::ClientTlsConfig>,
    connector: Option<Connector>,
) {
    let me = raft.metrics().borrow_watched().id;
    versions.announced(me, versions.own.clone());
    let mut told: Option<(u64, u64)> = None;
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut metrics = raft.server_metrics();
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = versions.heard.notified() => {}
            changed = metrics.changed() => if changed.is_err() { return },
        }
        let (leader, address, members, term) = {
            let m = metrics.borrow_watched();
            let membership = m.membership_config.membership();
            let leader = m.current_leader;
            let address = leader
                .and_then(|id| membership.get_node(&id))
                .map(|n| n.addr.clone());
            let members: Vec<u64> = membership.nodes().map(|(id, _)| *id).collect();
            (leader, address, members, m.vote.leader_id().term)
        };
        if leader == Some(me) {
            versions.announced(me, versions.own.clone());
            raise_if_all_read(&versions, &members, &core);
        } else if let (Some(leader), Some(address)) = (leader, address) {
            // Each leadership stint is told once (a leader re-elected after
            // a restart has forgotten).
            let stint = (leader, term);
            if told != Some(stint)
                && announce(&address, me, &versions.own, tls.clone(), connector.clone()).await
            {
                told = Some(stint);
            }
        }
    }
}

/// On the leader: asks the core to log the lowest record version every
/// member announced, if it is above the cluster's.
fn raise_if_all_read(versions: &Versions, members: &[u64], core: &CoreSender) {
    let lowest = members
        .iter()
        .map(|id| versions.of(*id).map(|v| v.records))
        .collect::<Option<Vec<u32>>>()
        .and_then(|all| all.into_iter().min());
    if let Some(version) = lowest.filter(|v| *v > versions.cluster()) {
        tracing::info!(
            version,
            "every member reads this log record version: making it the cluster's"
        );
        let _ = core.send(Op::RaiseClusterVersion { version });
    }
}

/// Tells the leader at `address` this member's versions, over the peers'
/// transport (`connector`, as Raft's own messages); whether it heard.
///
/// Cancel safety: safe; a dropped announcement is made again.
async fn announce(
    address: &str,
    me: u64,
    own: &MemberVersion,
    tls: Option<tonic::transport::ClientTlsConfig>,
    connector: Option<Connector>,
) -> bool {
    let Ok(endpoint) = super::network::peer_endpoint(address, tls) else {
        return false;
    };
    let endpoint = endpoint.connect_timeout(Duration::from_secs(1));
    let channel = transport::channel(endpoint, connector.as_ref());
    let request = pb::AnnounceRequest {
        node_id: me,
        version: own.build.clone(),
        record_version: own.records,
    };
    match pb::cluster_client::ClusterClient::new(channel)
        .announce(request)
        .await
    {
        Ok(_) => true,
        Err(status) => {
            tracing::debug!(%status, leader = address, "announcing this member's versions");
            false
        }
    }
}
