//! Parsing `redis://`, `rediss://` and `redis+redlock://` URLs.
//!
//! The query options of locksmith are taken out of the URL; what remains (user,
//! password, database, `protocol=`) goes to the `redis` crate unchanged. An
//! unknown option is an error, so a typo never silently changes behaviour.

use std::time::Duration;

use crate::client::redact;
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

/// A parsed URL.
#[derive(Debug, Clone)]
pub(crate) struct Config {
    /// One `redis://` / `rediss://` URL per node, for the `redis` crate.
    pub nodes: Vec<String>,
    /// Whether this is Redlock over independent masters.
    pub redlock: bool,
    /// The exclusive-lock layout.
    pub layout: Layout,
    /// Namespace prepended to every lock name (opt-in).
    pub prefix: String,
    /// After each grant, `WAIT` for this many replicas.
    pub wait_replicas: Option<u32>,
    /// How long `WAIT` may take.
    pub wait_timeout: Duration,
    /// Redlock: how long one node may take to answer one request.
    pub node_timeout: Option<Duration>,
    /// Redlock: the upper bound of the random delay between attempts.
    pub retry_delay: Duration,
    /// TLS: a PEM file of the CA(s) to trust instead of the system's.
    pub tls_ca: Option<String>,
    /// TLS: PEM files of a client certificate and key (mutual TLS).
    pub tls_client: Option<(String, String)>,
    /// The URL without its password, for messages.
    pub display: String,
}

const OPTIONS: &str =
    "mode, prefix, wait_replicas, wait_timeout, node_timeout, retry_delay, tls, protocol";

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
        let redlock = match scheme {
            "redis" | "rediss" => false,
            "redis+redlock" => true,
            other => return Err(invalid(url, format!("not a Redis scheme: {other:?}"))),
        };
        let mut config = Config {
            nodes: Vec::new(),
            redlock,
            layout: Layout::RLock,
            prefix: String::new(),
            wait_replicas: None,
            wait_timeout: Duration::from_secs(1),
            node_timeout: None,
            retry_delay: Duration::from_millis(100),
            tls_ca: None,
            tls_client: None,
            display: redact(url),
        };
        let (mut tls_cert, mut tls_key) = (None, None);
        let mut tls = scheme == "rediss";
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
                "node_timeout" => config.node_timeout = Some(duration(url, &key, &value)?),
                "retry_delay" => config.retry_delay = duration(url, &key, &value)?,
                "tls" if redlock => {
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
        if redlock {
            if config.layout == Layout::Fair {
                return Err(invalid(
                    url,
                    "mode=fair needs one Redis: a FIFO queue cannot be kept consistent across Redlock's independent masters",
                ));
            }
            if config.wait_replicas.is_some() {
                return Err(invalid(
                    url,
                    "wait_replicas applies to one Redis with replicas, not to Redlock's independent masters",
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
                "tls_ca, tls_cert and tls_key need rediss:// (or tls=true)",
            ));
        }
        let query = if passthrough.is_empty() {
            String::new()
        } else {
            format!("?{}", passthrough.join("&"))
        };
        let node_scheme = if tls { "rediss" } else { "redis" };
        if redlock {
            // userinfo@h1:p1,h2:p2/db
            let (userinfo, hosts_path) = match before_query.rsplit_once('@') {
                Some((u, h)) => (format!("{u}@"), h),
                None => (String::new(), before_query),
            };
            let (hosts, path) = match hosts_path.split_once('/') {
                Some((h, p)) => (h, format!("/{p}")),
                None => (hosts_path, String::new()),
            };
            for host in hosts.split(',') {
                if host.is_empty() {
                    return Err(invalid(url, "empty host in the Redlock host list"));
                }
                let has_port = if host.starts_with('[') {
                    host.contains("]:")
                } else {
                    host.contains(':')
                };
                let host = if has_port {
                    host.to_owned()
                } else {
                    format!("{host}:6379")
                };
                let node = format!("{node_scheme}://{userinfo}{host}{path}{query}");
                url::Url::parse(&node).map_err(|e| invalid(url, format!("host {host:?}: {e}")))?;
                config.nodes.push(node);
            }
        } else {
            let node = format!("{scheme}://{before_query}{query}");
            url::Url::parse(&node).map_err(|e| invalid(url, e.to_string()))?;
            config.nodes.push(node);
        }
        Ok(config)
    }

    /// How many nodes must agree.
    pub fn quorum(&self) -> usize {
        self.nodes.len() / 2 + 1
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
        assert!(!c.redlock);
        assert!(!c.display.contains("pw"));
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
    fn bad_options_are_errors() {
        for bad in [
            "redis://h?mode=quick",
            "redis://h?mod=fair",
            "redis://h?wait_replicas=x",
            "redis://h?wait_timeout=0",
            "redis+redlock://a,b,c?mode=fair",
            "redis+redlock://a,b,c?wait_replicas=1",
            "redis://h?node_timeout=5",
            "redis+redlock://a,,c",
            "redis://h?tls_ca=/ca.pem",
            "rediss://h?tls_cert=/c.pem",
        ] {
            assert!(
                matches!(Config::parse(bad), Err(Error::InvalidUrl { .. })),
                "{bad} accepted"
            );
        }
    }
}
