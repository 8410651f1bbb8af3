//! [`ZooKeeperEnsemble`]: a ZooKeeper ensemble of several servers.

use std::time::Duration;

use crate::netns::{self, Network};
use crate::settle::{address_list, until};
use crate::{free_port, retry_on_port_clash, Process, Result, ZooKeeper};

/// How long a new ensemble gets to elect a leader: every JVM must start first.
const SETTLE_TIMEOUT: Duration = Duration::from_secs(120);
/// The timeout of each probe.
const PROBE: Duration = Duration::from_millis(500);

/// A ZooKeeper ensemble on `127.0.0.1` (`QuorumPeerMain`, each server with its
/// client, quorum and election port, its own `myid` and data directory);
/// everything is killed on drop.
///
/// Servers run with the settings of [`ZooKeeper`] (`tickTime=500`,
/// transactions fsynced, 1 s minimum session timeout), so a follower that
/// loses the leader gives up after `syncLimit × tickTime` = 2.5 s and a new
/// leader is elected within seconds. Each server is an ordinary [`ZooKeeper`]
/// handle: [`ZooKeeper::kill`], [`ZooKeeper::restart`] (which waits until the
/// server serves again, which needs a majority running), [`ZooKeeper::pause`],
/// [`ZooKeeper::four_letter`].
///
/// ```no_run
/// use locksmith_testkit::ZooKeeperEnsemble;
///
/// let ensemble = ZooKeeperEnsemble::start(); // 3 servers
/// let url = ensemble.url(); // zk://127.0.0.1:…,…
/// let leader = ensemble.leader().unwrap();
/// leader.kill();
/// let next = ensemble.leader().unwrap(); // waits for the election
/// assert_ne!(next.port(), leader.port());
/// leader.restart();
/// ensemble.wait_healthy().unwrap();
/// ```
///
/// [`ZooKeeperEnsemble::try_start_on_hosts`] puts each server on a host of
/// its own ([`Network`]), so that one can be cut off from the others while
/// clients still reach every server.
#[derive(Debug)]
pub struct ZooKeeperEnsemble {
    servers: Vec<ZooKeeper>,
    // Declared after the servers: the hosts go once nothing runs on them.
    network: Option<Network>,
}

impl ZooKeeperEnsemble {
    /// Starts an ensemble of 3 servers and waits until one leads and the
    /// others follow; panics on failure.
    #[track_caller]
    pub fn start() -> ZooKeeperEnsemble {
        crate::or_panic(Self::try_start())
    }

    /// Like [`ZooKeeperEnsemble::start`], returning the error instead of
    /// panicking.
    pub fn try_start() -> Result<ZooKeeperEnsemble> {
        Self::try_start_with(3)
    }

    /// Starts an ensemble of `servers` servers and waits until it is healthy.
    pub fn try_start_with(servers: usize) -> Result<ZooKeeperEnsemble> {
        Self::launch(servers, None)
    }

    /// Starts 3 servers, each on a host of its own (needs root and
    /// `iproute2`), and waits until the ensemble is healthy. Server `i` runs
    /// on host `i` of [`ZooKeeperEnsemble::network`].
    pub fn try_start_on_hosts() -> Result<ZooKeeperEnsemble> {
        Self::launch(3, Some(Network::create(3)?))
    }

    /// The hosts the servers run on, one each, for an ensemble started with
    /// [`ZooKeeperEnsemble::try_start_on_hosts`].
    pub fn network(&self) -> Option<&Network> {
        self.network.as_ref()
    }

    fn launch(servers: usize, network: Option<Network>) -> Result<ZooKeeperEnsemble> {
        let hosts = netns::hosts(network.as_ref(), servers);
        let servers = retry_on_port_clash(|| {
            let ports: Vec<[u16; 3]> = (0..servers)
                .map(|_| [free_port(), free_port(), free_port()])
                .collect();
            let lines: String = ports
                .iter()
                .zip(&hosts)
                .enumerate()
                .map(|(i, ([_, quorum, election], host))| {
                    let ip = netns::address(*host);
                    format!("server.{}={ip}:{quorum}:{election}\n", i + 1)
                })
                .collect();
            let servers = ports
                .iter()
                .zip(&hosts)
                .enumerate()
                .map(|(i, ([port, ..], host))| ZooKeeper::spawn_member(i + 1, *host, *port, &lines))
                .collect::<Result<Vec<_>>>()?;
            for server in &servers {
                server.wait_ready()?;
            }
            Ok(servers)
        })?;
        let ensemble = ZooKeeperEnsemble { servers, network };
        ensemble.wait_healthy()?;
        Ok(ensemble)
    }

    /// `zk://127.0.0.1:<p1>,127.0.0.1:<p2>,…`: every server's client port.
    pub fn url(&self) -> String {
        format!("zk://{}", self.connect_string())
    }

    /// `127.0.0.1:<p1>,127.0.0.1:<p2>,…`, the connect string ZooKeeper
    /// clients take.
    pub fn connect_string(&self) -> String {
        address_list(self.servers.iter().map(ZooKeeper::address))
    }

    /// The servers, in the order of their ids (`myid` 1, 2, …).
    pub fn servers(&self) -> &[ZooKeeper] {
        &self.servers
    }

    /// The current leader, waiting (up to 120 s) until a running server
    /// leads and every other running server follows.
    pub fn leader(&self) -> Result<&ZooKeeper> {
        self.settle("led", || {
            let mut leader = None;
            for server in self.servers.iter().filter(|s| s.is_running()) {
                match mode(server)?.as_str() {
                    "leader" => leader = Some(server),
                    "follower" => {}
                    other => return Err(format!("server on {} is {other}", server.port())),
                }
            }
            leader.ok_or_else(|| "no running server leads".into())
        })
    }

    /// Waits until a running server leads and every other running server
    /// follows.
    pub fn wait_healthy(&self) -> Result<()> {
        self.leader().map(drop)
    }

    fn settle<T>(
        &self,
        state: &str,
        check: impl FnMut() -> std::result::Result<T, String>,
    ) -> Result<T> {
        let members: Vec<&Process> = self.servers.iter().map(ZooKeeper::process).collect();
        let name = format!("ZooKeeper ensemble on {}", self.connect_string());
        until(&name, state, SETTLE_TIMEOUT, &members, check)
    }
}

/// The `Mode:` a server reports in `srvr` (`leader`, `follower`, `standalone`).
fn mode(server: &ZooKeeper) -> std::result::Result<String, String> {
    let answer = crate::zookeeper::four_letter(server.address(), "srvr", PROBE)
        .map_err(|e| format!("server on {}: srvr: {e}", server.port()))?;
    answer
        .lines()
        .find_map(|l| l.strip_prefix("Mode: "))
        .map(|m| m.trim().to_owned())
        .ok_or_else(|| {
            format!(
                "server on {} is not serving: {:?}",
                server.port(),
                answer.trim()
            )
        })
}
