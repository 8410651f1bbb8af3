//! The `zk://` URL and its options.

use std::time::Duration;

use crate::error::{Error, Result};
use crate::options::{percent_decode, redact, ConnectOptions};
use crate::secret::Secret;
use crate::tls::TlsFiles;
use zookeeper_client as zk;

/// Default ZooKeeper client port.
const DEFAULT_PORT: u16 = 2181;

/// Everything a ZooKeeper connection is made from.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Config {
    /// `host:port,host:port`, the ensemble as the ZooKeeper client takes it.
    pub hosts: String,
    /// The chroot (`/` for none); created on connect when missing.
    pub chroot: String,
    /// Requested session timeout; the server clamps it into its
    /// `minSessionTimeout..=maxSessionTimeout`.
    pub session_timeout: Duration,
    /// Idle time after which the client declares the connection lost; `None`:
    /// a third of the negotiated session timeout.
    pub connection_timeout: Option<Duration>,
    /// How long (as a part of the negotiated session timeout) the connection
    /// may stay suspended before holds are reported lost; `None`: only when
    /// the session expires.
    pub lost_after_suspended: Option<f64>,
    /// `lock_by` of this client's own holds.
    pub lock_by: String,
    /// Whose election nodes this client's candidates create.
    pub elections: Elections,
    /// Credentials (user, password), sent when the session opens.
    pub credentials: Option<(String, Secret)>,
    /// How the credentials authenticate the session (`?auth=`).
    pub auth: Auth,
    /// Who may do what with the nodes this client creates.
    pub acl: Acl,
    /// `zks://`: TLS to every server, with these files.
    pub tls: Option<TlsFiles>,
}

/// The election recipe whose node names a candidate uses. Curator's
/// `LeaderSelector` and kazoo's `Election` each see only nodes named their
/// way (no name satisfies both: Curator sorts by what follows the last
/// `lock-`, kazoo only counts `__lock__<seq>`), so a path is shared with one
/// of them, chosen by the URL option `elections`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Elections {
    /// `_c_<uuid>-lock-<seq>`, Curator's `LeaderSelector` (its
    /// `InterProcessMutex`), the layout of every locksmith lock.
    Curator,
    /// `<uuid hex>__lock__<seq>`, kazoo's `Election` (its `Lock`).
    Kazoo,
}

/// How the URL's `user:password` authenticates a session (`?auth=`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Auth {
    /// ZooKeeper's `digest` scheme (an `addauth`): any password is accepted
    /// and is an identity of its own; the ACLs decide.
    Digest,
    /// SASL DIGEST-MD5 against the server's JAAS users: a wrong password
    /// fails the session, and the identity is `sasl:user`.
    Sasl,
}

/// The ACL of the nodes locksmith creates (`?acl=`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Acl {
    /// `world:anyone` may do everything: the default without credentials.
    Anyone,
    /// Only clients with the creator's credentials (ZooKeeper's `auth`
    /// scheme): the default with credentials.
    Creator,
    /// The creator's credentials may do everything, anyone may read (list a
    /// queue, describe a holder).
    CreatorAnyoneRead,
}

impl Acl {
    /// The ZooKeeper ACL list.
    pub fn acls(self) -> zk::Acls<'static> {
        static CREATOR_ALL_ANYONE_READ: [zk::Acl; 2] = [
            zk::Acl::new_const(zk::Permission::ALL, "auth", ""),
            zk::Acl::new_const(zk::Permission::READ, "world", "anyone"),
        ];
        match self {
            Acl::Anyone => zk::Acls::anyone_all(),
            Acl::Creator => zk::Acls::creator_all(),
            Acl::CreatorAnyoneRead => zk::Acls::new(&CREATOR_ALL_ANYONE_READ),
        }
    }
}

impl Config {
    /// The idle time before the connection counts as lost, for a negotiated
    /// session timeout.
    pub fn connection_timeout_for(&self, session_timeout: Duration) -> Duration {
        self.connection_timeout.unwrap_or(session_timeout / 3)
    }

    /// How long the connection may stay suspended before holds are lost, for a
    /// negotiated session timeout.
    pub fn suspended_grace_for(&self, session_timeout: Duration) -> Option<Duration> {
        self.lost_after_suspended
            .map(|part| session_timeout.mul_f64(part))
    }
}

/// Parses `zk://[user:password@]host:port[,host:port…][/chroot][?option=value&…]`
/// (also `zookeeper://`).
pub(crate) fn parse(url: &str, options: &ConnectOptions) -> Result<Config> {
    let invalid = |reason: String| Error::InvalidUrl {
        url: redact(url),
        reason,
    };
    let (secure, rest) = match url.split_once("://") {
        Some(("zk" | "zookeeper", rest)) => (false, rest),
        Some(("zks", rest)) => (true, rest),
        _ => {
            return Err(invalid(
                "expected zk://host:port[,host:port…]/chroot or zks://…?ca=<PEM file>".into(),
            ))
        }
    };
    let (rest, query) = rest.split_once('?').unwrap_or((rest, ""));
    let (authority, chroot) = match rest.find('/') {
        Some(at) => (&rest[..at], &rest[at..]),
        None => (rest, "/"),
    };
    let (credentials, hosts) = match authority.rsplit_once('@') {
        Some((user_info, hosts)) => (Some(parse_credentials(user_info).map_err(invalid)?), hosts),
        None => (None, authority),
    };
    let hosts = parse_hosts(hosts).map_err(invalid)?;
    let chroot = parse_chroot(chroot).map_err(invalid)?;
    let mut config = Config {
        hosts,
        chroot,
        session_timeout: options.session_ttl,
        connection_timeout: None,
        lost_after_suspended: Some(1.0 / 3.0),
        lock_by: format!("{}@{}", options.client_name, options.host),
        elections: Elections::Curator,
        acl: if credentials.is_some() {
            Acl::Creator
        } else {
            Acl::Anyone
        },
        credentials,
        auth: Auth::Digest,
        tls: None,
    };
    let (mut ca, mut cert, mut key_file) = (None, None, None);
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        let (key, value) = pair
            .split_once('=')
            .ok_or_else(|| invalid(format!("option {pair:?} has no value")))?;
        match key {
            "session_timeout" => {
                config.session_timeout = parse_duration(value).map_err(invalid)?;
            }
            "connection_timeout" => {
                config.connection_timeout = Some(parse_duration(value).map_err(invalid)?);
            }
            "lost_after_suspended" => {
                config.lost_after_suspended = parse_part(value).map_err(invalid)?;
            }
            "elections" => {
                config.elections = match value {
                    "curator" => Elections::Curator,
                    "kazoo" => Elections::Kazoo,
                    other => {
                        return Err(invalid(format!(
                            "elections={other:?}: expected curator or kazoo"
                        )))
                    }
                };
            }
            "auth" => {
                config.auth = match value {
                    "digest" => Auth::Digest,
                    "sasl" => Auth::Sasl,
                    other => {
                        return Err(invalid(format!("auth={other:?}: expected digest or sasl")))
                    }
                };
            }
            "acl" => {
                config.acl = match value {
                    "anyone" => Acl::Anyone,
                    "creator" => Acl::Creator,
                    "read" => Acl::CreatorAnyoneRead,
                    _ => {
                        return Err(invalid(format!(
                            "acl={value} (known: creator, read, anyone)"
                        )))
                    }
                };
            }
            "ca" | "cert" | "key" if !secure => {
                return Err(invalid(format!(
                    "{key}= is a TLS option: use zks:// for TLS"
                )))
            }
            "ca" | "cert" | "key" => {
                let path = percent_decode(value)
                    .filter(|path| !path.is_empty())
                    .ok_or_else(|| invalid(format!("{key}= needs a PEM file")))?;
                *match key {
                    "ca" => &mut ca,
                    "cert" => &mut cert,
                    _ => &mut key_file,
                } = Some(std::path::PathBuf::from(path));
            }
            other => {
                return Err(invalid(format!(
                    "unknown option {other:?} (known: session_timeout, connection_timeout, \
                     lost_after_suspended, elections, auth, acl, and with zks:// ca, cert, key)"
                )))
            }
        }
    }
    if config.session_timeout < Duration::from_millis(100) {
        return Err(invalid(format!(
            "session_timeout of {:?} is below 100ms",
            config.session_timeout
        )));
    }
    if secure {
        config.tls = Some(TlsFiles::from_options("zks://", ca, cert, key_file).map_err(invalid)?);
    }
    if config.auth == Auth::Sasl && config.credentials.is_none() {
        return Err(invalid(
            "auth=sasl needs credentials: zk://user:password@host/…?auth=sasl".into(),
        ));
    }
    if config.acl != Acl::Anyone && config.credentials.is_none() {
        return Err(invalid(
            "acl=creator and acl=read need credentials: zk://user:password@host/…".into(),
        ));
    }
    if config.connection_timeout.is_some_and(|t| t.is_zero()) {
        return Err(invalid("connection_timeout must not be zero".into()));
    }
    Ok(config)
}

/// `user:password` (percent-encoded), for `digest` or SASL.
fn parse_credentials(user_info: &str) -> Result<(String, Secret), String> {
    let (user, password) = user_info
        .split_once(':')
        .ok_or("credentials need a password: zk://user:password@host/…")?;
    let decode =
        |text: &str, what: &str| percent_decode(text).ok_or(format!("bad %-escape in the {what}"));
    let user = decode(user, "user")?;
    let password = decode(password, "password")?;
    if user.is_empty() || user.contains(':') {
        return Err("the user name must be non-empty and without ':'".into());
    }
    Ok((user, Secret::new(password)))
}

fn parse_hosts(hosts: &str) -> Result<String, String> {
    if hosts.is_empty() {
        return Err("no host given".into());
    }
    let mut out = Vec::new();
    for host in hosts.split(',') {
        let (name, port) = match host.rsplit_once(':') {
            Some((name, port)) => {
                let port: u16 = port.parse().map_err(|_| format!("bad port in {host:?}"))?;
                (name, port)
            }
            None => (host, DEFAULT_PORT),
        };
        if name.is_empty() || name.contains(['/', '@', ' ']) {
            return Err(format!("bad host {host:?}"));
        }
        out.push(format!("{name}:{port}"));
    }
    Ok(out.join(","))
}

fn parse_chroot(chroot: &str) -> Result<String, String> {
    let trimmed = chroot.trim_end_matches('/');
    if trimmed.is_empty() {
        return Ok("/".into());
    }
    for segment in trimmed[1..].split('/') {
        if segment.is_empty() || segment == "." || segment == ".." || segment.contains('\0') {
            return Err(format!("bad chroot {chroot:?}"));
        }
    }
    Ok(trimmed.to_owned())
}

/// `250ms`, `2s`, `1m`, or a bare number of milliseconds.
fn parse_duration(value: &str) -> Result<Duration, String> {
    let bad = || format!("bad duration {value:?} (examples: 500ms, 10s, 1m)");
    let (number, unit) = match value.find(|c: char| !c.is_ascii_digit() && c != '.') {
        Some(at) => value.split_at(at),
        None => (value, "ms"),
    };
    let number: f64 = number.parse().map_err(|_| bad())?;
    let seconds = match unit {
        "ms" => number / 1000.0,
        "s" => number,
        "m" => number * 60.0,
        _ => return Err(bad()),
    };
    Duration::try_from_secs_f64(seconds).map_err(|_| bad())
}

/// A part of the session timeout in `0..=1`, or `never`.
fn parse_part(value: &str) -> Result<Option<f64>, String> {
    if value == "never" {
        return Ok(None);
    }
    match value.parse::<f64>() {
        Ok(part) if (0.0..=1.0).contains(&part) => Ok(Some(part)),
        _ => Err(format!(
            "lost_after_suspended must be a part of the session timeout in 0..=1 or \
             \"never\", not {value:?}"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn options() -> ConnectOptions {
        ConnectOptions::default()
            .session_ttl(Duration::from_secs(6))
            .client_name("app")
            .host("box")
    }

    #[test]
    fn hosts_chroot_and_options() {
        let config = parse(
            "zk://a:2181,b:2182/apps/locks?session_timeout=2s&lost_after_suspended=0.5",
            &options(),
        )
        .unwrap();
        assert_eq!(config.hosts, "a:2181,b:2182");
        assert_eq!(config.chroot, "/apps/locks");
        assert_eq!(config.session_timeout, Duration::from_secs(2));
        assert_eq!(config.lost_after_suspended, Some(0.5));
        assert_eq!(config.lock_by, "app@box");
        assert_eq!(
            config.suspended_grace_for(Duration::from_secs(4)),
            Some(Duration::from_secs(2))
        );
    }

    #[test]
    fn defaults() {
        let config = parse("zookeeper://localhost", &options()).unwrap();
        assert_eq!(config.hosts, "localhost:2181");
        assert_eq!(config.chroot, "/");
        assert_eq!(config.session_timeout, Duration::from_secs(6));
        assert_eq!(
            config.connection_timeout_for(Duration::from_secs(6)),
            Duration::from_secs(2)
        );
        let never = parse("zk://h:1/?lost_after_suspended=never", &options()).unwrap();
        assert_eq!(never.suspended_grace_for(Duration::from_secs(6)), None);
        let ms = parse("zk://h:1?connection_timeout=750", &options()).unwrap();
        assert_eq!(ms.connection_timeout, Some(Duration::from_millis(750)));
        assert_eq!(ms.elections, Elections::Curator);
        let kazoo = parse("zk://h:1?elections=kazoo", &options()).unwrap();
        assert_eq!(kazoo.elections, Elections::Kazoo);
    }

    #[test]
    fn tls_files() {
        let config = parse("zks://h:1/c?ca=/ca.pem&cert=/c.pem&key=/k.pem", &options()).unwrap();
        assert_eq!(
            config.tls,
            Some(TlsFiles {
                ca: "/ca.pem".into(),
                identity: Some(("/c.pem".into(), "/k.pem".into())),
            })
        );
        assert_eq!(parse("zk://h:1", &options()).unwrap().tls, None);
    }

    #[test]
    fn credentials_and_acls() {
        let config = parse("zk://alice:p%40ss@h:1/c", &options()).unwrap();
        assert_eq!(
            config.credentials,
            Some(("alice".into(), Secret::new("p@ss".into())))
        );
        assert_eq!(config.auth, Auth::Digest, "digest by default");
        assert_eq!(config.acl, Acl::Creator, "creator-only with credentials");
        assert_eq!(config.hosts, "h:1");
        assert!(!format!("{config:?}").contains("p@ss"), "{config:?}");
        let anyone = parse("zk://h:1", &options()).unwrap();
        assert_eq!(
            (anyone.credentials, anyone.acl),
            (None, Acl::Anyone),
            "open without credentials"
        );
        for (query, acl) in [
            ("anyone", Acl::Anyone),
            ("creator", Acl::Creator),
            ("read", Acl::CreatorAnyoneRead),
        ] {
            let url = format!("zk://a:b@h:1?acl={query}");
            assert_eq!(parse(&url, &options()).unwrap().acl, acl);
        }
        let error = parse("zk://alice:hunter2@h:1?acl=nobody", &options()).unwrap_err();
        assert!(!error.to_string().contains("hunter2"), "{error}");
        let sasl = parse("zk://alice:hunter2@h:1?auth=sasl", &options()).unwrap();
        assert_eq!((sasl.auth, sasl.acl), (Auth::Sasl, Acl::Creator));
        let error = parse("zk://alice:hunter2@h:1?auth=kerberos", &options()).unwrap_err();
        assert!(!error.to_string().contains("hunter2"), "{error}");
    }

    #[test]
    fn rejects_bad_urls() {
        for bad in [
            "zk://",
            "zk://h:notaport",
            "zk://h:1/a//b",
            "zk://h:1/a/../b",
            "zk://h:1?colour=blue",
            "zk://h:1?session_timeout=soon",
            "zk://h:1?lost_after_suspended=2",
            "zk://h:1?session_timeout=10ms",
            "zk://h:1?elections=etcd",
            "zk://h:1?acl=creator",
            "zk://h:1?acl=read",
            "zk://h:1?auth=sasl",
            "zk://a:b@h:1?acl=all",
            "zk://alice@h:1",
            "zk://:pw@h:1",
            "zk://a:%zz@h:1",
            "zk://h:1?ca=/ca.pem",
            "zks://h:1",
            "zks://h:1?ca=/ca.pem&cert=/c.pem",
            "zks://h:1?ca=",
            "redis://h:1",
        ] {
            assert!(
                matches!(parse(bad, &options()), Err(Error::InvalidUrl { .. })),
                "{bad} accepted"
            );
        }
    }
}
