//! [`RedisCluster`]: a Redis Cluster of primaries with replicas.

use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use crate::netns::{self, Network};
use crate::process::run;
use crate::redis::{Launch, RedisTls, Role};
use crate::redis_sentinel::info_replication;
use crate::settle::{address_list, until};
use crate::{
    free_port, retry_on_port_clash, try_binary, Certificates, Process, Redis, RespValue, Result,
};

/// How long a fresh cluster gets to agree on its configuration.
const SETTLE_TIMEOUT: Duration = Duration::from_secs(60);
/// How long a failover may take: the node timeout, a vote, a promotion.
const FAILOVER_TIMEOUT: Duration = Duration::from_secs(60);
/// The timeout of each probe.
const PROBE: Duration = Duration::from_millis(500);
/// How long a node may go unanswered before the others fail it over.
const NODE_TIMEOUT: Duration = Duration::from_secs(1);
/// The same for clusters whose tests fail no primary over.
const STEADY_NODE_TIMEOUT: Duration = Duration::from_secs(5);
/// Slots of a Redis Cluster.
const SLOTS: u32 = 16_384;

/// A Redis Cluster on `127.0.0.1`: every node a `redis-server
/// --cluster-enabled yes` in its own directory, joined by `redis-cli --cluster
/// create`; everything is killed on drop.
///
/// Nodes time out after 1 s (`cluster-node-timeout 1000`), so a replica takes
/// over a killed primary within a few seconds. [`RedisCluster::start_steady`]
/// and [`RedisCluster::start_tls`] give them 5 s instead, for tests that never
/// fail a primary over: on a loaded machine a node whose cluster bus went
/// unanswered for a second was once failed over in the middle of the
/// conformance suite. While a primary is down and not
/// yet replaced, the cluster refuses every command (`cluster-require-full-coverage
/// yes`, Redis's default). A restarted node rejoins with its `nodes.conf`; a
/// former primary comes back as a replica of the node that replaced it.
///
/// ```no_run
/// use locksmith_testkit::RedisCluster;
///
/// let cluster = RedisCluster::start(); // 3 primaries, 1 replica each
/// let url = cluster.url(); // redis+cluster://127.0.0.1:…,…
/// let old = cluster.primary_of("orders/42").unwrap();
/// old.kill();
/// cluster.wait_for_failover(old).unwrap();
/// assert_ne!(cluster.primary_of("orders/42").unwrap().port(), old.port());
/// old.restart();
/// cluster.wait_healthy().unwrap();
/// ```
///
/// [`RedisCluster::start_tls`] starts one whose ports and cluster bus speak
/// only TLS, with client certificates required.
/// [`RedisCluster::try_start_on_hosts`] puts every node on a host of its own
/// ([`Network`]), so that a primary can be cut off from the other nodes while
/// clients still reach it.
#[derive(Debug)]
pub struct RedisCluster {
    nodes: Vec<Redis>,
    primaries: usize,
    tls: Option<Arc<RedisTls>>,
    // Declared after the nodes: the hosts go once nothing runs on them.
    network: Option<Network>,
}

impl RedisCluster {
    /// Starts 3 primaries with 1 replica each and waits until the cluster is
    /// [healthy](Self::wait_healthy); panics on failure.
    #[track_caller]
    pub fn start() -> RedisCluster {
        crate::or_panic(Self::try_start())
    }

    /// Like [`RedisCluster::start`], returning the error instead of panicking.
    pub fn try_start() -> Result<RedisCluster> {
        Self::try_start_with(3, 1)
    }

    /// Like [`RedisCluster::start`], with nodes that time out after 5 s: for
    /// tests that kill no primary, so that a node slowed down by a loaded
    /// machine is not failed over under them.
    #[track_caller]
    pub fn start_steady() -> RedisCluster {
        crate::or_panic(Self::launch(3, 1, None, None, STEADY_NODE_TIMEOUT))
    }

    /// Starts `primaries` primaries (at least 3, so that a majority survives
    /// one failure) with `replicas` replicas each, and waits until the cluster
    /// is healthy.
    pub fn try_start_with(primaries: usize, replicas: usize) -> Result<RedisCluster> {
        Self::launch(primaries, replicas, None, None, NODE_TIMEOUT)
    }

    /// Like [`RedisCluster::start`], every node on a host of its own (needs
    /// root and `iproute2`): node `i` of [`RedisCluster::nodes`] on host `i`
    /// of [`RedisCluster::network`].
    pub fn try_start_on_hosts() -> Result<RedisCluster> {
        Self::launch(3, 1, None, Some(Network::create(6)?), NODE_TIMEOUT)
    }

    /// The hosts of a cluster started with
    /// [`RedisCluster::try_start_on_hosts`].
    pub fn network(&self) -> Option<&Network> {
        self.network.as_ref()
    }

    /// Like [`RedisCluster::start`], the nodes' ports and the cluster bus
    /// speaking only TLS with a certificate for `127.0.0.1` signed by a CA
    /// made for the cluster ([`RedisCluster::certificates`]), and letting in
    /// only clients with a certificate of that CA. Needs `openssl`. Its nodes
    /// time out after 5 s, as [`RedisCluster::start_steady`]'s do.
    #[track_caller]
    pub fn start_tls() -> RedisCluster {
        crate::or_panic(Self::try_start_tls())
    }

    /// Like [`RedisCluster::start_tls`], returning the error instead of
    /// panicking.
    pub fn try_start_tls() -> Result<RedisCluster> {
        Self::launch(3, 1, Some(RedisTls::make()?), None, STEADY_NODE_TIMEOUT)
    }

    fn launch(
        primaries: usize,
        replicas: usize,
        tls: Option<Arc<RedisTls>>,
        network: Option<Network>,
        node_timeout: Duration,
    ) -> Result<RedisCluster> {
        assert!(primaries >= 3, "a Redis Cluster needs at least 3 primaries");
        let cli = try_binary("redis-cli", "redis-tools")?;
        let nodes = netns::hosts(network.as_ref(), primaries * (1 + replicas))
            .into_iter()
            .map(|host| {
                retry_on_port_clash(|| {
                    let mut config = vec![
                        "cluster-enabled yes".to_owned(),
                        "cluster-config-file nodes.conf".to_owned(),
                        format!("cluster-node-timeout {}", node_timeout.as_millis()),
                        format!("cluster-port {}", free_port()),
                    ];
                    if tls.is_some() {
                        config.push("tls-cluster yes".to_owned());
                    }
                    Redis::launch_as(Launch {
                        extra: &config,
                        tls: tls.as_ref(),
                        host,
                        ..Launch::new(Role::Member)
                    })
                })
            })
            .collect::<Result<Vec<_>>>()?;
        let mut create = Command::new(cli);
        if let Some(tls) = &tls {
            create.args(tls.cli_args());
        }
        create.args(["--cluster", "create"]);
        create.args(nodes.iter().map(|n| n.address().to_string()));
        create.args(["--cluster-replicas", &replicas.to_string(), "--cluster-yes"]);
        run(&mut create, None)?;
        let cluster = RedisCluster {
            nodes,
            primaries,
            tls,
            network,
        };
        cluster.wait_healthy()?;
        Ok(cluster)
    }

    /// `redis+cluster://127.0.0.1:<p1>,127.0.0.1:<p2>,…`: every node. For
    /// [`RedisCluster::start_tls`] `rediss+cluster://…?tls_ca=<CA file>`,
    /// without a client certificate ([`RedisCluster::certificates`] makes
    /// one).
    pub fn url(&self) -> String {
        let hosts = address_list(self.nodes.iter().map(Redis::address));
        match &self.tls {
            None => format!("redis+cluster://{hosts}"),
            Some(tls) => format!("rediss+cluster://{hosts}{}", tls.url_query()),
        }
    }

    /// The CA of a cluster started with [`RedisCluster::start_tls`], which
    /// makes client certificates ([`Certificates::client`]); `None` without
    /// TLS.
    pub fn certificates(&self) -> Option<&Certificates> {
        self.tls.as_deref().map(RedisTls::certificates)
    }

    /// Every node, primaries and replicas, in the order they were started.
    pub fn nodes(&self) -> &[Redis] {
        &self.nodes
    }

    /// The running nodes that are primaries now.
    pub fn primaries(&self) -> Vec<&Redis> {
        self.running()
            .filter(|n| crate::redis_sentinel::role(n).is_ok_and(|r| r == "master"))
            .collect()
    }

    /// The primary serving the slot of `key` now, as a running node sees it.
    pub fn primary_of(&self, key: &str) -> Result<&Redis> {
        self.settle("naming the primary of a key", PROBE * 20, || {
            let node = self.running().next().ok_or("no node runs")?;
            let slot = query(node, &["CLUSTER", "KEYSLOT", key])?
                .as_int()
                .ok_or("CLUSTER KEYSLOT answered no number")?;
            let port = slot_ranges(node)?
                .into_iter()
                .find(|(from, to, _)| (*from..=*to).contains(&slot))
                .map(|(_, _, port)| port)
                .ok_or_else(|| format!("no node serves slot {slot}"))?;
            self.nodes
                .iter()
                .find(|n| n.port() == port)
                .ok_or_else(|| format!("an unknown node {port} serves slot {slot}"))
        })
    }

    /// Waits until no running node sees `old` serving a slot any more (a replica
    /// took over) and every running node reports the cluster ok.
    pub fn wait_for_failover(&self, old: &Redis) -> Result<()> {
        self.settle("failed over", FAILOVER_TIMEOUT, || {
            for node in self.running() {
                if slot_ranges(node)?.iter().any(|r| r.2 == old.port()) {
                    return Err(format!(
                        "node {} still sees {} serving slots",
                        node.port(),
                        old.port()
                    ));
                }
                check_cluster_ok(node)?;
            }
            Ok(())
        })
    }

    /// Waits until every running node reports the cluster ok with every slot
    /// served, sees no running node as failing, there are as many primaries as
    /// the cluster was created with, and every replica is in sync.
    pub fn wait_healthy(&self) -> Result<()> {
        self.settle("healthy", SETTLE_TIMEOUT, || {
            let running: Vec<u16> = self.running().map(Redis::port).collect();
            for node in self.running() {
                check_cluster_ok(node)?;
                let nodes = query(node, &["CLUSTER", "NODES"])?;
                for line in nodes.as_str().unwrap_or_default().lines() {
                    let fields: Vec<&str> = line.split_whitespace().collect();
                    let port = fields
                        .get(1)
                        .and_then(|a| a.split(['@', ',']).next())
                        .and_then(|a| a.rsplit(':').next())
                        .and_then(|p| p.parse::<u16>().ok());
                    let flags = fields.get(2).copied().unwrap_or_default();
                    if port.is_some_and(|p| running.contains(&p)) && flags.contains("fail") {
                        return Err(format!("node {} flags {line:?}", node.port()));
                    }
                }
                let info = info_replication(node)?;
                if info.contains("role:slave") && !info.contains("master_link_status:up") {
                    return Err(format!("replica {} is not in sync", node.port()));
                }
            }
            let primaries = self.primaries().len();
            if primaries != self.primaries {
                return Err(format!(
                    "{primaries} primaries run, expected {}",
                    self.primaries
                ));
            }
            Ok(())
        })
    }

    fn running(&self) -> impl Iterator<Item = &Redis> {
        self.nodes.iter().filter(|n| n.is_running())
    }

    fn settle<T>(
        &self,
        state: &str,
        timeout: Duration,
        check: impl FnMut() -> std::result::Result<T, String>,
    ) -> Result<T> {
        let members: Vec<&Process> = self.nodes.iter().map(Redis::process).collect();
        let name = format!(
            "Redis Cluster on {}",
            address_list(self.nodes.iter().map(Redis::address))
        );
        until(&name, state, timeout, &members, check)
    }
}

fn query(node: &Redis, args: &[&str]) -> std::result::Result<RespValue, String> {
    match node.probe(args, PROBE) {
        Ok(RespValue::Error(e)) => Err(format!("node {}: {args:?}: {e}", node.port())),
        Ok(value) => Ok(value),
        Err(e) => Err(format!("node {}: {args:?}: {e}", node.port())),
    }
}

/// `cluster_state:ok` with every slot served.
fn check_cluster_ok(node: &Redis) -> std::result::Result<(), String> {
    let info = query(node, &["CLUSTER", "INFO"])?;
    let info = info.as_str().unwrap_or_default();
    if info.contains("cluster_state:ok") && info.contains(&format!("cluster_slots_ok:{SLOTS}")) {
        Ok(())
    } else {
        Err(format!(
            "node {} reports {:?}",
            node.port(),
            info.lines()
                .filter(|l| l.starts_with("cluster_state") || l.starts_with("cluster_slots"))
                .collect::<Vec<_>>()
        ))
    }
}

/// `(first slot, last slot, primary port)` of every range, as `CLUSTER SLOTS`
/// on `node` answers.
fn slot_ranges(node: &Redis) -> std::result::Result<Vec<(i64, i64, u16)>, String> {
    let RespValue::Array(Some(ranges)) = query(node, &["CLUSTER", "SLOTS"])? else {
        return Err(format!(
            "node {}: CLUSTER SLOTS answered no list",
            node.port()
        ));
    };
    Ok(ranges
        .iter()
        .filter_map(|range| {
            let RespValue::Array(Some(fields)) = range else {
                return None;
            };
            let RespValue::Array(Some(primary)) = fields.get(2)? else {
                return None;
            };
            Some((
                fields.first()?.as_int()?,
                fields.get(1)?.as_int()?,
                u16::try_from(primary.get(1)?.as_int()?).ok()?,
            ))
        })
        .collect())
}
