//! [`RedisSentinel`]: a Redis primary with replicas, watched by Sentinels.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use crate::netns::{self, Network};
use crate::redis::{Launch, RedisTls, Role};
use crate::settle::{address_list, until};
use crate::{retry_on_port_clash, Certificates, Process, Redis, RespValue, Result};

/// The name the Sentinels know the primary by (`sentinel monitor <name> …`).
pub const MASTER_NAME: &str = "locksmith";

/// How long a fresh setup gets to settle: Sentinels find each other through
/// hello messages sent every 2 s.
const SETTLE_TIMEOUT: Duration = Duration::from_secs(60);
/// How long the Sentinels wait for the primary before they call it down.
const DOWN_AFTER: Duration = Duration::from_secs(1);
/// The same for setups whose tests fail no primary over.
const STEADY_DOWN_AFTER: Duration = Duration::from_secs(5);
/// How long a failover may take: 1 s to notice, an election, a promotion.
const FAILOVER_TIMEOUT: Duration = Duration::from_secs(60);
/// How long [`RedisSentinel::primary`] waits for a Sentinel to answer.
const PRIMARY_TIMEOUT: Duration = Duration::from_secs(10);
/// The timeout of each probe.
const PROBE: Duration = Duration::from_millis(500);

/// A Redis primary, its replicas and the Sentinels watching them, all on
/// `127.0.0.1`, each in its own directory; everything is killed on drop.
///
/// Sentinels declare the primary down after 1 s without an answer
/// (`down-after-milliseconds 1000`), two of them must agree (quorum 2 of 3),
/// and a failover that stalls is retried after 10 s.
/// [`RedisSentinel::start_steady`] and [`RedisSentinel::start_tls`] wait 5 s
/// instead, for tests that never fail the primary over, so that a primary
/// slowed down by a loaded machine is not failed over under them. Every data node runs from
/// a `redis.conf` that the Sentinels rewrite on a failover, so a restarted
/// node keeps its new role.
///
/// ```no_run
/// use locksmith_testkit::RedisSentinel;
///
/// let setup = RedisSentinel::start(); // primary + 2 replicas + 3 Sentinels
/// let url = setup.url(); // redis+sentinel://127.0.0.1:…,…/locksmith
/// let old = setup.primary();
/// old.kill(); // kill -9
/// let new = setup.wait_for_failover(old).unwrap();
/// assert_ne!(new.port(), old.port());
/// old.restart(); // comes back, the Sentinels make it a replica
/// setup.wait_healthy().unwrap();
/// ```
///
/// [`RedisSentinel::start_tls`] starts one whose every port, the Sentinels'
/// too, speaks only TLS and requires a client certificate; the nodes and
/// Sentinels reach each other over TLS as well.
/// [`RedisSentinel::try_start_on_hosts`] puts every node and every Sentinel
/// on a host of its own ([`Network`]), so that the primary can be cut off
/// from the replicas and the Sentinels while clients still reach it.
#[derive(Debug)]
pub struct RedisSentinel {
    nodes: Vec<Redis>,
    sentinels: Vec<Redis>,
    tls: Option<Arc<RedisTls>>,
    // Declared after the servers: the hosts go once nothing runs on them.
    network: Option<Network>,
}

impl RedisSentinel {
    /// Starts a primary, 2 replicas and 3 Sentinels and waits until they are
    /// [healthy](Self::wait_healthy); panics on failure.
    #[track_caller]
    pub fn start() -> RedisSentinel {
        crate::or_panic(Self::try_start())
    }

    /// Like [`RedisSentinel::start`], returning the error instead of panicking.
    pub fn try_start() -> Result<RedisSentinel> {
        Self::try_start_with(2, 3)
    }

    /// Like [`RedisSentinel::start`], with Sentinels that wait 5 s before
    /// they call the primary down: for tests that kill no primary.
    #[track_caller]
    pub fn start_steady() -> RedisSentinel {
        crate::or_panic(Self::launch(2, 3, None, None, STEADY_DOWN_AFTER))
    }

    /// Starts a primary with `replicas` replicas and `sentinels` Sentinels
    /// (quorum: a majority of them) and waits until they are healthy.
    pub fn try_start_with(replicas: usize, sentinels: usize) -> Result<RedisSentinel> {
        Self::launch(replicas, sentinels, None, None, DOWN_AFTER)
    }

    /// Like [`RedisSentinel::start`], every node and every Sentinel on a host
    /// of its own (needs root and `iproute2`): the nodes on hosts 0 to 2 of
    /// [`RedisSentinel::network`] (the first one the primary), the Sentinels
    /// on hosts 3 to 5, in the order of [`RedisSentinel::nodes`] and
    /// [`RedisSentinel::sentinels`].
    pub fn try_start_on_hosts() -> Result<RedisSentinel> {
        Self::launch(2, 3, None, Some(Network::create(6)?), DOWN_AFTER)
    }

    /// The hosts of a setup started with
    /// [`RedisSentinel::try_start_on_hosts`].
    pub fn network(&self) -> Option<&Network> {
        self.network.as_ref()
    }

    /// Like [`RedisSentinel::start`], every port speaking only TLS with a
    /// certificate for `127.0.0.1` signed by a CA made for the setup
    /// ([`RedisSentinel::certificates`]), and letting in only clients with a
    /// certificate of that CA. Needs `openssl`.
    #[track_caller]
    pub fn start_tls() -> RedisSentinel {
        crate::or_panic(Self::try_start_tls())
    }

    /// Like [`RedisSentinel::start_tls`], returning the error instead of
    /// panicking.
    pub fn try_start_tls() -> Result<RedisSentinel> {
        Self::launch(2, 3, Some(RedisTls::make()?), None, STEADY_DOWN_AFTER)
    }

    fn launch(
        replicas: usize,
        sentinels: usize,
        tls: Option<Arc<RedisTls>>,
        network: Option<Network>,
        down_after: Duration,
    ) -> Result<RedisSentinel> {
        let hosts = netns::hosts(network.as_ref(), 1 + replicas + sentinels);
        let mut nodes: Vec<Redis> = Vec::with_capacity(1 + replicas);
        for host in &hosts[..1 + replicas] {
            let launch = Launch {
                primary: nodes.first().map(Redis::address),
                tls: tls.as_ref(),
                host: *host,
                ..Launch::new(Role::Member)
            };
            nodes.push(retry_on_port_clash(|| Redis::launch_as(launch))?);
        }
        let primary = nodes[0].address();
        let monitor = [
            format!(
                "sentinel monitor {MASTER_NAME} {} {} {}",
                primary.ip(),
                primary.port(),
                sentinels / 2 + 1
            ),
            format!(
                "sentinel down-after-milliseconds {MASTER_NAME} {}",
                down_after.as_millis()
            ),
            format!("sentinel failover-timeout {MASTER_NAME} 10000"),
            format!("sentinel parallel-syncs {MASTER_NAME} {}", replicas.max(1)),
        ];
        let sentinels = hosts[1 + replicas..]
            .iter()
            .map(|host| {
                let launch = Launch {
                    extra: &monitor,
                    tls: tls.as_ref(),
                    host: *host,
                    ..Launch::new(Role::Sentinel)
                };
                retry_on_port_clash(|| Redis::launch_as(launch))
            })
            .collect::<Result<Vec<_>>>()?;
        let setup = RedisSentinel {
            nodes,
            sentinels,
            tls,
            network,
        };
        setup.settle("healthy", SETTLE_TIMEOUT, || setup.check_healthy())?;
        Ok(setup)
    }

    /// The name the Sentinels know the primary by (`sentinel monitor <name> …`: "locksmith").
    pub fn master_name(&self) -> &str {
        MASTER_NAME
    }

    /// `redis+sentinel://127.0.0.1:<s1>,127.0.0.1:<s2>,…/locksmith`: every
    /// Sentinel, and the master name. For [`RedisSentinel::start_tls`]
    /// `rediss+sentinel://…/locksmith?tls_ca=<CA file>`, without a client
    /// certificate ([`RedisSentinel::certificates`] makes one).
    pub fn url(&self) -> String {
        let hosts = address_list(self.sentinels.iter().map(Redis::address));
        match &self.tls {
            None => format!("redis+sentinel://{hosts}/{MASTER_NAME}"),
            Some(tls) => format!("rediss+sentinel://{hosts}/{MASTER_NAME}{}", tls.url_query()),
        }
    }

    /// The CA of a setup started with [`RedisSentinel::start_tls`], which
    /// makes client certificates ([`Certificates::client`]); `None` without
    /// TLS.
    pub fn certificates(&self) -> Option<&Certificates> {
        self.tls.as_deref().map(RedisTls::certificates)
    }

    /// The data nodes; the first one started as the primary.
    pub fn nodes(&self) -> &[Redis] {
        &self.nodes
    }

    /// The Sentinels (they answer `PING` and `SENTINEL …` like a Redis).
    pub fn sentinels(&self) -> &[Redis] {
        &self.sentinels
    }

    /// The node the Sentinels name as the primary now; panics if no Sentinel
    /// answers within 10 s.
    #[track_caller]
    pub fn primary(&self) -> &Redis {
        crate::or_panic(self.try_primary())
    }

    /// Like [`RedisSentinel::primary`], returning the error instead of panicking.
    pub fn try_primary(&self) -> Result<&Redis> {
        self.settle("naming a primary", PRIMARY_TIMEOUT, || self.named_primary())
    }

    /// Waits until the Sentinels have promoted another node than `old`, and
    /// that node reports itself primary; answers it.
    pub fn wait_for_failover(&self, old: &Redis) -> Result<&Redis> {
        self.settle("failed over", FAILOVER_TIMEOUT, || {
            let primary = self.named_primary()?;
            if primary.port() == old.port() {
                return Err(format!("the Sentinels still name {}", old.port()));
            }
            match role(primary)? {
                r if r == "master" => Ok(primary),
                other => Err(format!("{} is still a {other}", primary.port())),
            }
        })
    }

    /// Waits until every running Sentinel names the same primary, knows the
    /// other running Sentinels and sees every other running node as a healthy
    /// replica, and every replica is in sync with the primary.
    pub fn wait_healthy(&self) -> Result<()> {
        self.settle("healthy", SETTLE_TIMEOUT, || self.check_healthy())
    }

    fn check_healthy(&self) -> std::result::Result<(), String> {
        let running_nodes = self.nodes.iter().filter(|n| n.is_running()).count();
        let running_sentinels: Vec<&Redis> =
            self.sentinels.iter().filter(|s| s.is_running()).collect();
        let primary = self.named_primary()?;
        for sentinel in &running_sentinels {
            let named = sentinel_query(sentinel, &["get-master-addr-by-name", MASTER_NAME])?;
            let port = named
                .get(1)
                .and_then(|p| p.parse::<u16>().ok())
                .ok_or_else(|| format!("Sentinel {} names no primary", sentinel.port()))?;
            if port != primary.port() {
                return Err(format!(
                    "Sentinel {} names {port}, another names {}",
                    sentinel.port(),
                    primary.port()
                ));
            }
            let master = fields(&sentinel_value(sentinel, &["master", MASTER_NAME])?);
            let flags = master.get("flags").map(String::as_str).unwrap_or_default();
            if flags != "master" {
                return Err(format!(
                    "Sentinel {} flags the primary {flags:?}",
                    sentinel.port()
                ));
            }
            let healthy = |what: &str| -> std::result::Result<usize, String> {
                let RespValue::Array(Some(items)) = sentinel_value(sentinel, &[what, MASTER_NAME])?
                else {
                    return Err(format!("SENTINEL {what} answered no list"));
                };
                Ok(items
                    .iter()
                    .map(fields)
                    .filter(|f| f.get("flags").is_some_and(|f| !f.contains("down")))
                    .count())
            };
            let (replicas, others) = (healthy("replicas")?, healthy("sentinels")?);
            if replicas != running_nodes - 1 || others != running_sentinels.len() - 1 {
                return Err(format!(
                    "Sentinel {} sees {replicas} healthy replicas and {others} other Sentinels \
                     (expected {} and {})",
                    sentinel.port(),
                    running_nodes - 1,
                    running_sentinels.len() - 1
                ));
            }
        }
        for node in self.nodes.iter().filter(|n| n.is_running()) {
            let info = info_replication(node)?;
            let expected = if node.port() == primary.port() {
                "role:master"
            } else {
                "master_link_status:up"
            };
            if !info.contains(expected) {
                return Err(format!("node {} lacks {expected}", node.port()));
            }
            if node.port() != primary.port()
                && !info.contains(&format!("master_port:{}", primary.port()))
            {
                return Err(format!(
                    "node {} does not replicate {}",
                    node.port(),
                    primary.port()
                ));
            }
        }
        Ok(())
    }

    /// The node the first answering Sentinel names as the primary.
    fn named_primary(&self) -> std::result::Result<&Redis, String> {
        let mut complaints = Vec::new();
        for sentinel in self.sentinels.iter().filter(|s| s.is_running()) {
            match sentinel_query(sentinel, &["get-master-addr-by-name", MASTER_NAME]) {
                Ok(addr) => {
                    let port = addr.get(1).and_then(|p| p.parse::<u16>().ok());
                    return self
                        .nodes
                        .iter()
                        .find(|n| Some(n.port()) == port)
                        .ok_or_else(|| format!("the Sentinels name an unknown primary {addr:?}"));
                }
                Err(e) => complaints.push(e),
            }
        }
        Err(format!("no Sentinel answered: {}", complaints.join("; ")))
    }

    fn members(&self) -> Vec<&Process> {
        self.nodes
            .iter()
            .chain(&self.sentinels)
            .map(Redis::process)
            .collect()
    }

    fn name(&self) -> String {
        format!(
            "Redis Sentinel setup (nodes on {}, Sentinels on {})",
            address_list(self.nodes.iter().map(Redis::address)),
            address_list(self.sentinels.iter().map(Redis::address))
        )
    }

    fn settle<T>(
        &self,
        state: &str,
        timeout: Duration,
        check: impl FnMut() -> std::result::Result<T, String>,
    ) -> Result<T> {
        until(&self.name(), state, timeout, &self.members(), check)
    }
}

/// One `SENTINEL …` request.
fn sentinel_value(sentinel: &Redis, args: &[&str]) -> std::result::Result<RespValue, String> {
    let mut command = vec!["SENTINEL"];
    command.extend_from_slice(args);
    match sentinel.probe(&command, PROBE) {
        Ok(RespValue::Error(e)) => Err(format!("Sentinel {}: {e}", sentinel.port())),
        Ok(value) => Ok(value),
        Err(e) => Err(format!("Sentinel {}: {e}", sentinel.port())),
    }
}

/// One `SENTINEL …` request answered with a list of strings.
fn sentinel_query(sentinel: &Redis, args: &[&str]) -> std::result::Result<Vec<String>, String> {
    match sentinel_value(sentinel, args)? {
        RespValue::Array(Some(items)) => Ok(items
            .iter()
            .filter_map(|i| i.as_str().map(str::to_owned))
            .collect()),
        other => Err(format!(
            "Sentinel {} answered {other:?} to {args:?}",
            sentinel.port()
        )),
    }
}

/// A flat `[field, value, field, value, …]` reply as a map.
fn fields(value: &RespValue) -> HashMap<String, String> {
    let RespValue::Array(Some(items)) = value else {
        return HashMap::new();
    };
    items
        .chunks(2)
        .filter_map(|pair| {
            Some((
                pair[0].as_str()?.to_owned(),
                pair.get(1)?.as_str()?.to_owned(),
            ))
        })
        .collect()
}

/// `INFO replication` of a node.
pub(crate) fn info_replication(node: &Redis) -> std::result::Result<String, String> {
    match node.probe(&["INFO", "replication"], PROBE) {
        Ok(info) => info
            .as_str()
            .map(str::to_owned)
            .ok_or_else(|| format!("node {}: INFO answered {info:?}", node.port())),
        Err(e) => Err(format!("node {}: {e}", node.port())),
    }
}

/// The role a node reports (`master`, `slave`).
pub(crate) fn role(node: &Redis) -> std::result::Result<String, String> {
    let info = info_replication(node)?;
    info.lines()
        .find_map(|l| l.strip_prefix("role:"))
        .map(|r| r.trim().to_owned())
        .ok_or_else(|| format!("node {}: no role in INFO", node.port()))
}
