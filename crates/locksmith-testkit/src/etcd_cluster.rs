//! [`EtcdCluster`]: an etcd cluster of several members.

use std::time::Duration;

use crate::etcd::http;
use crate::netns::{self, Network};
use crate::settle::{address_list, until};
use crate::{free_port, retry_on_port_clash, Etcd, Process, Result};

/// How long a new cluster gets to elect a leader and report every member
/// healthy.
const SETTLE_TIMEOUT: Duration = Duration::from_secs(60);
/// The timeout of each probe.
const PROBE: Duration = Duration::from_millis(500);

/// An etcd cluster on `127.0.0.1`: every member an [`Etcd`] with its own client
/// and peer port and data directory; everything is killed on drop.
///
/// Members keep etcd's default timing (heartbeat 100 ms, election timeout
/// 1 s), so a new leader is elected within a second or two of killing the old
/// one. Each member is an ordinary [`Etcd`] handle: [`Etcd::kill`],
/// [`Etcd::restart`] (which waits until the member is healthy again, which
/// needs a majority running), [`Etcd::pause`].
///
/// ```no_run
/// use locksmith_testkit::EtcdCluster;
///
/// let cluster = EtcdCluster::start(); // 3 members
/// let url = cluster.url(); // etcd://127.0.0.1:…,…
/// let leader = cluster.leader().unwrap();
/// leader.kill();
/// let next = cluster.leader().unwrap(); // waits for the election
/// assert_ne!(next.port(), leader.port());
/// leader.restart();
/// cluster.wait_healthy().unwrap();
/// ```
///
/// [`EtcdCluster::try_start_on_hosts`] puts each member on a host of its own
/// ([`Network`]), so that one can be cut off from the others while clients
/// still reach every member.
#[derive(Debug)]
pub struct EtcdCluster {
    members: Vec<Etcd>,
    // Declared after the members: the hosts go once nothing runs on them.
    network: Option<Network>,
}

impl EtcdCluster {
    /// Starts a cluster of 3 members and waits until every one is healthy;
    /// panics on failure.
    #[track_caller]
    pub fn start() -> EtcdCluster {
        crate::or_panic(Self::try_start())
    }

    /// Like [`EtcdCluster::start`], returning the error instead of panicking.
    pub fn try_start() -> Result<EtcdCluster> {
        Self::try_start_with(3)
    }

    /// Starts a cluster of `members` members and waits until every one is
    /// healthy.
    pub fn try_start_with(members: usize) -> Result<EtcdCluster> {
        Self::launch(members, None)
    }

    /// Starts 3 members, each on a host of its own (needs root and
    /// `iproute2`), and waits until every one is healthy. Member `i` runs on
    /// host `i` of [`EtcdCluster::network`].
    pub fn try_start_on_hosts() -> Result<EtcdCluster> {
        Self::launch(3, Some(Network::create(3)?))
    }

    fn launch(members: usize, network: Option<Network>) -> Result<EtcdCluster> {
        let hosts = netns::hosts(network.as_ref(), members);
        let members = retry_on_port_clash(|| {
            let ports: Vec<(u16, u16)> = (0..members).map(|_| (free_port(), free_port())).collect();
            let initial = ports
                .iter()
                .zip(&hosts)
                .enumerate()
                .map(|(i, ((_, peer), host))| {
                    format!("m{i}=http://{}:{peer}", netns::address(*host))
                })
                .collect::<Vec<_>>()
                .join(",");
            let members = ports
                .iter()
                .zip(&hosts)
                .enumerate()
                .map(|(i, (&(port, peer), host))| {
                    Etcd::spawn_member(&format!("m{i}"), *host, port, peer, &initial)
                })
                .collect::<Result<Vec<_>>>()?;
            for member in &members {
                member.wait_ready()?;
            }
            Ok(members)
        })?;
        let cluster = EtcdCluster { members, network };
        cluster.wait_healthy()?;
        Ok(cluster)
    }

    /// `etcd://127.0.0.1:<p1>,127.0.0.1:<p2>,…`: every member's client
    /// address.
    pub fn url(&self) -> String {
        format!("etcd://{}", self.addresses())
    }

    fn addresses(&self) -> String {
        address_list(self.members.iter().map(Etcd::address))
    }

    /// The hosts the members run on, one each, for a cluster started with
    /// [`EtcdCluster::try_start_on_hosts`].
    pub fn network(&self) -> Option<&Network> {
        self.network.as_ref()
    }

    /// `http://127.0.0.1:<port>` of every member, the endpoints etcd clients take.
    pub fn endpoints(&self) -> Vec<String> {
        self.members.iter().map(Etcd::endpoint).collect()
    }

    /// The members, in the order they were started.
    pub fn members(&self) -> &[Etcd] {
        &self.members
    }

    /// The current leader, waiting (up to 60 s) until the running members
    /// agree on one that runs.
    pub fn leader(&self) -> Result<&Etcd> {
        self.settle("agreeing on a leader", || {
            let statuses = self
                .running()
                .map(|m| status(m).map(|(id, leader)| (m, id, leader)))
                .collect::<std::result::Result<Vec<_>, String>>()?;
            let leader = statuses.first().ok_or("no member runs")?.2;
            if statuses.iter().any(|s| s.2 != leader) {
                return Err("the members name different leaders".into());
            }
            statuses
                .iter()
                .find(|s| s.1 == leader)
                .map(|s| s.0)
                .ok_or_else(|| "no running member is the leader".into())
        })
    }

    /// Waits until every running member reports itself healthy (which needs a
    /// leader) and they agree on the leader.
    pub fn wait_healthy(&self) -> Result<()> {
        self.settle("healthy", || {
            for member in self.running() {
                if !member.is_healthy() {
                    return Err(format!("member on {} is not healthy", member.port()));
                }
            }
            Ok(())
        })?;
        self.leader().map(drop)
    }

    fn running(&self) -> impl Iterator<Item = &Etcd> {
        self.members.iter().filter(|m| m.is_running())
    }

    fn settle<T>(
        &self,
        state: &str,
        check: impl FnMut() -> std::result::Result<T, String>,
    ) -> Result<T> {
        let members: Vec<&Process> = self.members.iter().map(Etcd::process).collect();
        let name = format!("etcd cluster on {}", self.addresses());
        until(&name, state, SETTLE_TIMEOUT, &members, check)
    }
}

/// `(member id, leader id)` from the member's `Maintenance.Status`, through
/// etcd's JSON gateway (64-bit ids are strings there).
fn status(member: &Etcd) -> std::result::Result<(u64, u64), String> {
    let answer = http(
        member.address(),
        "POST",
        "/v3/maintenance/status",
        "{}",
        PROBE,
    )
    .map_err(|e| format!("member on {}: status: {e}", member.port()))?;
    let field = |name: &str| {
        let start = answer.find(&format!("\"{name}\":\""))? + name.len() + 4;
        let len = answer[start..].find('"')?;
        answer[start..start + len].parse::<u64>().ok()
    };
    match (field("member_id"), field("leader")) {
        (Some(id), Some(leader)) if leader != 0 => Ok((id, leader)),
        _ => Err(format!(
            "member on {} knows no leader: {:?}",
            member.port(),
            answer.lines().last().unwrap_or_default()
        )),
    }
}
