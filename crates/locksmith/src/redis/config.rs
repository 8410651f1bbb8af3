//! Parsing `redis://`, `rediss://`, `redis+redlock://`, `redis+sentinel://`
//! and `redis+cluster://` URLs.
//!
//! The query options of locksmith are taken out of the URL; what remains (user,
//! password, database, `protocol=`) goes to the `redis` crate unchanged. An
//! unknown option is an error, so a typo never silently changes behaviour.

use std::time::Duration;

use crate::error::{Error, Result};

/// Which key layout exclusive locks use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Layout {
    /// Redisson's RLock hash (the default): re-entrant, not FIFO.
    RLock,
    /// The RLock hash plus Redisson's RFairLock queue: FIFO.
    Fair,
    /// redis-py's `Lock` / the textbook `SET NX PX` string.
    Simple,
}

/// How the Redis servers of a URL work together.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Topology {
    /// One server (`redis://`, `rediss://`).
    Single,
    /// Independent masters, a majority decides (`redis+redlock://`).
    Redlock,
    /// A primary with replicas that the Sentinels in [`Config::nodes`] know
    /// by this name (`redis+sentinel://`).
    Sentinel {
        /// The name the Sentinels monitor the primary under.
        master: String,
    },
    /// A Redis Cluster; [`Config::nodes`] are the seed nodes
    /// (`redis+cluster://`).
    Cluster,
}

/// A parsed URL.
#[derive(Debug, Clone)]
pub(crate) struct Config {
    /// One `redis://` / `rediss://` URL per server the URL names: the server,
    /// the Redlock masters, the Sentinels, or the Cluster's seed nodes.
    pub nodes: Vec<String>,
    /// How those servers work together.
    pub topology: Topology,
    /// The exclusive-lock layout.
    pub layout: Layout,
    /// Namespace prepended to every lock name (opt-in).
    pub prefix: String,
    /// After each grant, `WAIT` for this many replicas.
    pub wait_replicas: Option<u32>,
    /// How long `WAIT` may take.
    pub wait_timeout: Duration,
    /// How long connecting to one server may take: TCP, TLS and the
    /// connection's setup commands.
    pub connect_timeout: Duration,
    /// Redlock: how long one node may take to answer one request.
    pub node_timeout: Option<Duration>,
    /// Redlock: the upper bound of the random delay between attempts.
    pub retry_delay: Duration,
    /// TLS: a PEM file of the CA(s) to trust instead of the system's.
    pub tls_ca: Option<String>,
    /// TLS: PEM files of a client certificate and key (mutual TLS).
    pub tls_client: Option<(String, String)>,
    /// Sentinel: how a data node's URL is made from its `host:port`.
    data_node: NodeUrl,
    /// The URL without its password, for messages.
    pub display: String,
}

const OPTIONS: &str =
    "mode, prefix, wait_replicas, wait_timeout, connect_timeout, node_timeout, retry_delay, tls, tls_ca, tls_cert, tls_key, protocol";

/// How long connecting to one server may take unless the URL says
/// (`connect_timeout`): long enough for a TLS handshake on a busy machine,
/// short enough that a server which accepts connections but answers
/// nothing (paused, overloaded) is given up within a lease's time.
const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(2);

/// The replicas a grant waits for by default where the URL says there are
/// replicas (Sentinel, Cluster): one, so that the replica a failover promotes
/// (the most up-to-date one, in both) has every grant it acknowledged.
const DEFAULT_WAIT_REPLICAS: u32 = 1;

/// The parts of a server URL other than its `host:port`.
#[derive(Debug, Clone, Default)]
struct NodeUrl {
    scheme: &'static str,
    userinfo: String,
    path: String,
    query: String,
}

impl NodeUrl {
    fn at(&self, host: &str) -> String {
        format!(
            "{}://{}{host}{}{}",
            self.scheme, self.userinfo, self.path, self.query
        )
    }
}

/// The URL with the password of its user info replaced by `***`; works for
/// the multi-host URLs that a URL parser refuses.
pub(crate) fn redact(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_owned();
    };
    let end = rest.find(['/', '?']).unwrap_or(rest.len());
    match rest[..end].rsplit_once('@') {
        Some((userinfo, _)) if userinfo.contains(':') => {
            let user = userinfo.split_once(':').map_or("", |(u, _)| u);
            format!("{scheme}://{user}:***@{}", &rest[userinfo.len() + 1..])
        }
        _ => url.to_owned(),
    }
}

fn invalid(url: &str, reason: impl Into<String>) -> Error {
    Error::InvalidUrl {
        url: redact(url),
        reason: reason.into(),
    }
}

/// A duration option: `250` (milliseconds), `250ms`, `2s`.
fn duration(url: &str, key: &str, value: &str) -> Result<Duration> {
    let parsed = if let Some(ms) = value.strip_suffix("ms") {
        ms.parse::<u64>().ok().map(Duration::from_millis)
    } else if let Some(s) = value.strip_suffix('s') {
        s.parse::<u64>().ok().map(Duration::from_secs)
    } else {
        value.parse::<u64>().ok().map(Duration::from_millis)
    };
    match parsed {
        Some(d) if !d.is_zero() && d <= Duration::from_secs(3600) => Ok(d),
        _ => Err(invalid(
            url,
            format!("{key}={value:?} is not a duration between 1ms and 1h (like 500, 500ms, 2s)"),
        )),
    }
}

/// `host:port` with `default` filled in where the port is missing.
fn with_port(host: &str, default: u16) -> String {
    let has_port = if host.starts_with('[') {
        host.contains("]:")
    } else {
        host.contains(':')
    };
    if has_port {
        host.to_owned()
    } else {
        format!("{host}:{default}")
    }
}

impl Config {
    /// Parses a URL; nothing is contacted.
    pub fn parse(url: &str) -> Result<Config> {
        let (scheme, rest) = url
            .split_once("://")
            .ok_or_else(|| invalid(url, "expected scheme://…"))?;
        let (before_query, query) = match rest.split_once('?') {
            Some((b, q)) => (b, q),
            None => (rest, ""),
        };
        let (kind, mut tls) = match scheme {
            "redis" => ("single", false),
            "rediss" => ("single", true),
            "redis+redlock" => ("redlock", false),
            "redis+sentinel" => ("sentinel", false),
            "rediss+sentinel" => ("sentinel", true),
            "redis+cluster" => ("cluster", false),
            "rediss+cluster" => ("cluster", true),
            other => return Err(invalid(url, format!("not a Redis scheme: {other:?}"))),
        };
        let mut config = Config {
            nodes: Vec::new(),
            topology: Topology::Single,
            layout: Layout::RLock,
            prefix: String::new(),
            wait_replicas: None,
            wait_timeout: Duration::from_secs(1),
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
            node_timeout: None,
            retry_delay: Duration::from_millis(100),
            tls_ca: None,
            tls_client: None,
            data_node: NodeUrl::default(),
            display: redact(url),
        };
        let multi_host = kind != "single";
        let (mut tls_cert, mut tls_key) = (None, None);
        let mut passthrough = Vec::new();
        for (key, value) in url::form_urlencoded::parse(query.as_bytes()) {
            match key.as_ref() {
                "mode" => {
                    config.layout = match value.as_ref() {
                        "rlock" | "default" => Layout::RLock,
                        "fair" => Layout::Fair,
                        "simple" => Layout::Simple,
                        other => {
                            return Err(invalid(
                                url,
                                format!("mode={other:?}: expected rlock, fair or simple"),
                            ))
                        }
                    }
                }
                "prefix" => config.prefix = value.into_owned(),
                "wait_replicas" => {
                    config.wait_replicas = Some(value.parse().map_err(|_| {
                        invalid(url, format!("wait_replicas={value:?} is not a count"))
                    })?)
                }
                "wait_timeout" => config.wait_timeout = duration(url, &key, &value)?,
                "connect_timeout" => config.connect_timeout = duration(url, &key, &value)?,
                "node_timeout" => config.node_timeout = Some(duration(url, &key, &value)?),
                "retry_delay" => config.retry_delay = duration(url, &key, &value)?,
                "tls" if multi_host => {
                    tls = match value.as_ref() {
                        "true" | "1" | "yes" => true,
                        "false" | "0" | "no" => false,
                        other => {
                            return Err(invalid(
                                url,
                                format!("tls={other:?}: expected true or false"),
                            ))
                        }
                    }
                }
                "tls_ca" => config.tls_ca = Some(value.into_owned()),
                "tls_cert" => tls_cert = Some(value.into_owned()),
                "tls_key" => tls_key = Some(value.into_owned()),
                "protocol" => passthrough.push(format!("{key}={value}")),
                other => {
                    return Err(invalid(
                        url,
                        format!("unknown option {other:?} (known: {OPTIONS})"),
                    ))
                }
            }
        }
        if kind == "redlock" {
            if config.layout == Layout::Fair {
                return Err(invalid(
                    url,
                    "mode=fair needs one Redis: a FIFO queue cannot be kept consistent across Redlock's independent masters",
                ));
            }
            if config.wait_replicas.is_some() {
                return Err(invalid(
                    url,
                    "wait_replicas applies to a Redis with replicas, not to Redlock's independent masters",
                ));
            }
        } else if config.node_timeout.is_some() || query.contains("retry_delay=") {
            return Err(invalid(
                url,
                "node_timeout and retry_delay apply to redis+redlock:// only",
            ));
        }
        match (tls_cert, tls_key) {
            (Some(cert), Some(key)) => config.tls_client = Some((cert, key)),
            (None, None) => {}
            _ => return Err(invalid(url, "tls_cert and tls_key go together")),
        }
        if (config.tls_ca.is_some() || config.tls_client.is_some()) && !tls {
            return Err(invalid(
                url,
                "tls_ca, tls_cert and tls_key need TLS (rediss://, rediss+sentinel://, rediss+cluster:// or tls=true)",
            ));
        }
        let query = if passthrough.is_empty() {
            String::new()
        } else {
            format!("?{}", passthrough.join("&"))
        };
        let node_scheme = if tls { "rediss" } else { "redis" };
        if kind == "single" {
            let node = format!("{scheme}://{before_query}{query}");
            url::Url::parse(&node).map_err(|e| invalid(url, e.to_string()))?;
            config.nodes.push(node);
            return Ok(config);
        }
        // userinfo@h1:p1,h2:p2/path
        let (userinfo, hosts_path) = match before_query.rsplit_once('@') {
            Some((u, h)) => (format!("{u}@"), h),
            None => (String::new(), before_query),
        };
        let (hosts, path) = match hosts_path.split_once('/') {
            Some((h, p)) => (h, p),
            None => (hosts_path, ""),
        };
        let mut node = NodeUrl {
            scheme: node_scheme,
            userinfo,
            path: String::new(),
            query,
        };
        let default_port = match kind {
            "sentinel" => {
                let (master, db) = match path.split_once('/') {
                    Some((m, db)) => (m, db),
                    None => (path, ""),
                };
                if master.is_empty() {
                    return Err(invalid(
                        url,
                        "name the primary's master name as the path, like redis+sentinel://h1:26379,h2:26379/mymaster",
                    ));
                }
                config.topology = Topology::Sentinel {
                    master: master.to_owned(),
                };
                config.data_node = NodeUrl {
                    path: if db.is_empty() {
                        String::new()
                    } else {
                        format!("/{db}")
                    },
                    ..node.clone()
                };
                // Sentinels have no databases and speak RESP2.
                node.query = String::new();
                26379
            }
            "cluster" => {
                if !path.is_empty() && path != "0" {
                    return Err(invalid(url, "a Redis Cluster has only database 0"));
                }
                config.topology = Topology::Cluster;
                6379
            }
            _ => {
                config.topology = Topology::Redlock;
                node.path = if path.is_empty() {
                    String::new()
                } else {
                    format!("/{path}")
                };
                6379
            }
        };
        for host in hosts.split(',') {
            if host.is_empty() {
                return Err(invalid(url, "empty host in the host list"));
            }
            let host = with_port(host, default_port);
            let node_url = node.at(&host);
            url::Url::parse(&node_url).map_err(|e| invalid(url, format!("host {host:?}: {e}")))?;
            config.nodes.push(node_url);
        }
        if matches!(
            config.topology,
            Topology::Sentinel { .. } | Topology::Cluster
        ) {
            config.wait_replicas = match config.wait_replicas {
                None => Some(DEFAULT_WAIT_REPLICAS),
                Some(0) => None,
                some => some,
            };
        } else if config.wait_replicas == Some(0) {
            config.wait_replicas = None;
        }
        Ok(config)
    }

    /// How many nodes must agree: a majority of Redlock's masters, else one.
    pub fn quorum(&self) -> usize {
        match self.topology {
            Topology::Redlock => self.nodes.len() / 2 + 1,
            _ => 1,
        }
    }

    /// Whether this is Redlock over independent masters.
    pub fn redlock(&self) -> bool {
        self.topology == Topology::Redlock
    }

    /// The URL of a data node of a Sentinel setup at `host:port`.
    pub fn data_node_url(&self, host_port: &str) -> String {
        self.data_node.at(host_port)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn single_node_options_are_taken_out() {
        let c = Config::parse("redis://:pw@127.0.0.1:7000/2?mode=fair&prefix=app/&protocol=resp3")
            .unwrap();
        assert_eq!(c.nodes, ["redis://:pw@127.0.0.1:7000/2?protocol=resp3"]);
        assert_eq!(c.layout, Layout::Fair);
        assert_eq!(c.prefix, "app/");
        assert_eq!(c.topology, Topology::Single);
        assert_eq!(c.wait_replicas, None, "no replicas assumed");
        assert_eq!(c.connect_timeout, DEFAULT_CONNECT_TIMEOUT);
        assert!(!c.display.contains("pw"));
    }

    #[test]
    fn the_connect_timeout_is_taken_out_on_every_topology() {
        for url in [
            "redis://h?connect_timeout=10s",
            "redis+redlock://a,b,c?connect_timeout=10s",
            "redis+sentinel://s1,s2/m?connect_timeout=10s",
            "rediss+cluster://a:1,b:2?connect_timeout=10s",
        ] {
            let c = Config::parse(url).unwrap();
            assert_eq!(c.connect_timeout, Duration::from_secs(10), "{url}");
            assert!(
                c.nodes.iter().all(|n| !n.contains("connect_timeout")),
                "{url}"
            );
        }
    }

    #[test]
    fn redlock_hosts_become_nodes() {
        let c =
            Config::parse("redis+redlock://:pw@a:1,b:2,c?mode=simple&retry_delay=50ms").unwrap();
        assert_eq!(
            c.nodes,
            ["redis://:pw@a:1", "redis://:pw@b:2", "redis://:pw@c:6379"]
        );
        assert_eq!(c.quorum(), 2);
        assert_eq!(c.retry_delay, Duration::from_millis(50));
        let tls = Config::parse("redis+redlock://a:1,b:2?tls=true").unwrap();
        assert_eq!(tls.nodes, ["rediss://a:1", "rediss://b:2"]);
        let ca =
            Config::parse("rediss://h:1?tls_ca=/ca.pem&tls_cert=/c.pem&tls_key=/k.pem").unwrap();
        assert_eq!(ca.tls_ca.as_deref(), Some("/ca.pem"));
        assert_eq!(ca.tls_client, Some(("/c.pem".into(), "/k.pem".into())));
        assert_eq!(ca.nodes, ["rediss://h:1"]);
    }

    #[test]
    fn sentinel_urls_name_sentinels_and_the_master() {
        let c = Config::parse("redis+sentinel://:pw@s1,s2:5000/mymaster/3?protocol=resp3").unwrap();
        assert_eq!(
            c.topology,
            Topology::Sentinel {
                master: "mymaster".into()
            }
        );
        assert_eq!(c.nodes, ["redis://:pw@s1:26379", "redis://:pw@s2:5000"]);
        assert_eq!(
            c.data_node_url("10.0.0.5:6380"),
            "redis://:pw@10.0.0.5:6380/3?protocol=resp3"
        );
        assert_eq!(
            c.wait_replicas,
            Some(1),
            "replicas exist: WAIT 1 by default"
        );
        assert_eq!(c.quorum(), 1);
        assert_eq!(
            c.display,
            "redis+sentinel://:***@s1,s2:5000/mymaster/3?protocol=resp3"
        );
        let tls = Config::parse("rediss+sentinel://s1/m?wait_replicas=0&tls_ca=/ca.pem").unwrap();
        assert_eq!(tls.nodes, ["rediss://s1:26379"]);
        assert_eq!(tls.data_node_url("h:1"), "rediss://h:1");
        assert_eq!(tls.wait_replicas, None, "wait_replicas=0 turns WAIT off");
    }

    #[test]
    fn cluster_urls_name_seed_nodes() {
        let c = Config::parse("redis+cluster://u:pw@a:7000,b?mode=fair&wait_replicas=2").unwrap();
        assert_eq!(c.topology, Topology::Cluster);
        assert_eq!(c.nodes, ["redis://u:pw@a:7000", "redis://u:pw@b:6379"]);
        assert_eq!(c.wait_replicas, Some(2));
        assert_eq!(c.layout, Layout::Fair);
        let tls = Config::parse("redis+cluster://a:1?tls=true").unwrap();
        assert_eq!(tls.nodes, ["rediss://a:1"]);
        assert_eq!(tls.wait_replicas, Some(1));
        assert_eq!(
            Config::parse("rediss+cluster://a:1").unwrap().nodes,
            ["rediss://a:1"]
        );
    }

    #[test]
    fn passwords_never_show() {
        assert_eq!(
            redact("redis+redlock://user:secret@a:1,b:2/0?x=y"),
            "redis+redlock://user:***@a:1,b:2/0?x=y"
        );
        assert_eq!(redact("redis://a:1/0"), "redis://a:1/0");
        let error = Config::parse("redis+cluster://:secret@a,b/3").unwrap_err();
        assert!(!error.to_string().contains("secret"), "{error}");
    }

    #[test]
    fn bad_options_are_errors() {
        for bad in [
            "redis://h?mode=quick",
            "redis://h?mod=fair",
            "redis://h?wait_replicas=x",
            "redis://h?wait_timeout=0",
            "redis://h?connect_timeout=0",
            "redis://h?connect_timeout=soon",
            "redis+redlock://a,b,c?mode=fair",
            "redis+redlock://a,b,c?wait_replicas=1",
            "redis://h?node_timeout=5",
            "redis+redlock://a,,c",
            "redis://h?tls_ca=/ca.pem",
            "rediss://h?tls_cert=/c.pem",
            "redis+sentinel://s1,s2",
            "redis+sentinel://s1,s2/",
            "redis+sentinel://s1/m?node_timeout=5",
            "redis+cluster://a,b/2",
            "redis+cluster://a,,b",
            "redis+cluster://a?tls_ca=/ca.pem",
        ] {
            assert!(
                matches!(Config::parse(bad), Err(Error::InvalidUrl { .. })),
                "{bad} accepted"
            );
        }
    }
}
