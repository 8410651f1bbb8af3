//! What a backend is connected with: the client's [`ConnectOptions`], and
//! the URL helpers every backend's URL parser shares. It sits below the
//! backends and the client, and imports neither, so that a backend never
//! reaches up into the client to connect.

use std::time::Duration;

/// How a client presents itself and keeps its holds alive.
///
/// Start from the defaults and change what you need; new options can be
/// added without breaking callers:
///
/// ```
/// # use std::time::Duration;
/// let options = locksmith::ConnectOptions::default()
///     .session_ttl(Duration::from_secs(10))
///     .client_name("nightly-report");
/// assert_eq!(options.session_ttl, Duration::from_secs(10));
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ConnectOptions {
    /// Liveness of holds without a fixed lease: the session TTL (or the lease the
    /// watchdog renews at a third of it). Default 30 s, Redisson's watchdog.
    pub session_ttl: Duration,
    /// Shown as `lock_by` in inspection. Default: the program name and pid.
    pub client_name: String,
    /// Host shown in inspection. Default: this machine's hostname.
    pub host: String,
    /// How the `locksmith://` backend reaches the server's members: `None`
    /// (the default) over TCP, or through this (a simulated network's).
    #[cfg(feature = "server")]
    pub connector: Option<locksmith_proto::transport::Connector>,
}

impl Default for ConnectOptions {
    fn default() -> Self {
        let program = std::env::args()
            .next()
            .and_then(|p| {
                std::path::Path::new(&p)
                    .file_name()
                    .map(|n| n.to_string_lossy().into_owned())
            })
            .unwrap_or_else(|| "locksmith".into());
        ConnectOptions {
            session_ttl: Duration::from_secs(30),
            client_name: format!("{program}[{}]", std::process::id()),
            host: hostname(),
            #[cfg(feature = "server")]
            connector: None,
        }
    }
}

impl ConnectOptions {
    /// Sets [`ConnectOptions::session_ttl`].
    pub fn session_ttl(mut self, ttl: Duration) -> Self {
        self.session_ttl = ttl;
        self
    }

    /// Sets [`ConnectOptions::client_name`].
    pub fn client_name(mut self, name: impl Into<String>) -> Self {
        self.client_name = name.into();
        self
    }

    /// Sets [`ConnectOptions::host`].
    pub fn host(mut self, host: impl Into<String>) -> Self {
        self.host = host.into();
        self
    }

    /// Sets [`ConnectOptions::connector`].
    #[cfg(feature = "server")]
    pub fn connector(mut self, connector: locksmith_proto::transport::Connector) -> Self {
        self.connector = Some(connector);
        self
    }
}

fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_owned())
        .ok()
        .filter(|h| !h.is_empty())
        .or_else(|| std::env::var("HOSTNAME").ok())
        .unwrap_or_else(|| "localhost".into())
}

/// The URL with every password replaced by `***`, for messages and reports:
/// each member of a multi-host URL is redacted too.
pub fn redact(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_owned();
    };
    let authority_end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(authority_end);
    // Each member of a multi-host URL (`redis+sentinel://`, `redis+redlock://`,
    // `locksmith://a,b,c`) may carry its own user and password.
    let members: Vec<String> = authority
        .split(',')
        .map(|member| match member.rsplit_once('@') {
            Some((userinfo, host)) => match userinfo.split_once(':') {
                Some((user, _)) => format!("{user}:***@{host}"),
                None => member.to_owned(),
            },
            None => member.to_owned(),
        })
        .collect();
    format!("{scheme}://{}{tail}", members.join(","))
}

/// `%XX` escapes of a URL part decoded; `None` for a bad escape or text that
/// is not UTF-8.
#[cfg(any(feature = "etcd", feature = "zookeeper"))]
pub(crate) fn percent_decode(text: &str) -> Option<String> {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = std::str::from_utf8(bytes.get(i + 1..i + 3)?).ok()?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

#[cfg(test)]
mod redact_tests {
    use super::redact;

    #[test]
    fn every_password_is_redacted_in_single_and_multi_host_urls() {
        assert_eq!(
            redact("postgres://u:secret@h:5432/db"),
            "postgres://u:***@h:5432/db"
        );
        assert_eq!(redact("postgres://u@h/db"), "postgres://u@h/db");
        assert_eq!(redact("redis://127.0.0.1:6379"), "redis://127.0.0.1:6379");
        assert_eq!(
            redact("redis+sentinel://:pw@s1:26379,s2:26379/mymaster"),
            "redis+sentinel://:***@s1:26379,s2:26379/mymaster"
        );
        assert_eq!(
            redact("redis+redlock://a:one@h1:1,b:two@h2:2,h3:3?x=y"),
            "redis+redlock://a:***@h1:1,b:***@h2:2,h3:3?x=y"
        );
        assert_eq!(redact("no url"), "no url");
    }
}
