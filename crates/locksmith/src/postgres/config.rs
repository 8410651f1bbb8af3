//! The `postgres://` URL: libpq parameters for tokio-postgres, and the
//! `locksmith_*` query parameters this backend takes out of it first.

use std::time::Duration;

use super::tls::{SslMode, Tls};
use crate::error::{Error, Result};
use crate::options::{redact, ConnectOptions};

/// How holds without an explicit lease are kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum HoldMode {
    /// `locksmith_mode=session` (default): a session-level advisory lock on a
    /// connection that stays open while the hold lasts.
    Session,
    /// `locksmith_mode=ttl`: a row in `lease_holds` whose lease (the client's
    /// session TTL) the watchdog renews at a third; no connection is held.
    Ttl,
}

/// What sits between the client and PostgreSQL (`locksmith_pooler`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Pooler {
    /// `none` (default): PostgreSQL, or a pooler that gives each client
    /// connection a server session of its own (PgBouncer's session mode).
    None,
    /// `transaction`: a transaction pooler (PgBouncer's `pool_mode =
    /// transaction`), which may run each transaction of a client connection on
    /// another server session. Only what lives within one transaction works:
    /// lease holds (the mode is `ttl`), waits inside a transaction, unnamed
    /// statements.
    Transaction,
}

/// Everything `connect` learned from the URL and the connect options.
#[derive(Debug, Clone)]
pub(crate) struct Settings {
    /// What tokio-postgres connects with (the URL minus `locksmith_*`).
    pub pg: tokio_postgres::Config,
    /// The URL without its password, for messages.
    pub url: String,
    pub mode: HoldMode,
    pub pooler: Pooler,
    /// Schema of the layout, a plain lower-case identifier.
    pub schema: String,
    /// Connections for short statements (the deadpool pool).
    pub pool_size: usize,
    /// Create the layout on first use.
    pub migrate: bool,
    /// Keepalive query interval on connections that hold locks.
    pub keepalive: Duration,
    /// The client's session TTL: the watchdog lease of TTL-mode holds, and how
    /// long a holding connection may stay silent before its holds count as lost.
    pub session_ttl: Duration,
    /// `lock_by` recorded with every hold: "client_name@host".
    pub lock_by: String,
    /// The TLS connector (`sslmode`, `sslrootcert`).
    pub tls: Tls,
}

/// Query parameters of ours; everything else goes to tokio-postgres.
const PREFIX: &str = "locksmith_";

impl Settings {
    /// Parses `url` (scheme `postgres` or `postgresql`).
    pub fn parse(url: &str, options: &ConnectOptions) -> Result<Settings> {
        let invalid = |reason: String| Error::InvalidUrl {
            url: redact(url),
            reason,
        };
        let mut parsed = url::Url::parse(url).map_err(|e| invalid(e.to_string()))?;
        if !matches!(parsed.scheme(), "postgres" | "postgresql") {
            return Err(invalid("expected postgres:// or postgresql://".into()));
        }
        let mut settings = Settings {
            pg: tokio_postgres::Config::new(),
            url: redact(url),
            mode: HoldMode::Session,
            pooler: Pooler::None,
            schema: "locksmith".into(),
            pool_size: 8,
            migrate: true,
            keepalive: (options.session_ttl / 3).min(Duration::from_secs(5)),
            session_ttl: options.session_ttl,
            lock_by: format!("{}@{}", options.client_name, options.host),
            tls: Tls::new(SslMode::Disable, None, None).map_err(invalid)?,
        };
        let mut passed = Vec::new();
        // libpq's default; tokio-postgres knows neither verify-* nor sslrootcert.
        let mut ssl_mode = SslMode::Prefer;
        let mut ssl_root = None;
        let (mut ssl_cert, mut ssl_key) = (None, None);
        let mut mode = None;
        for (key, value) in parsed.query_pairs() {
            match &*key {
                "sslmode" => {
                    ssl_mode = SslMode::parse(&value).ok_or_else(|| {
                        invalid(format!(
                            "sslmode={value:?}: expected disable, prefer, require, verify-ca \
                             or verify-full"
                        ))
                    })?;
                    continue;
                }
                "sslrootcert" => {
                    if value == "system" {
                        return Err(invalid(
                            "sslrootcert=system is not supported: name a PEM file".into(),
                        ));
                    }
                    ssl_root = Some(std::path::PathBuf::from(&*value));
                    continue;
                }
                "sslcert" => {
                    ssl_cert = Some(std::path::PathBuf::from(&*value));
                    continue;
                }
                "sslkey" => {
                    ssl_key = Some(std::path::PathBuf::from(&*value));
                    continue;
                }
                "sslpassword" | "sslcrl" | "sslcrldir" => {
                    return Err(invalid(format!(
                        "{key}: encrypted client keys and CRLs are not supported"
                    )));
                }
                _ => {}
            }
            let Some(option) = key.strip_prefix(PREFIX) else {
                passed.push((key.into_owned(), value.into_owned()));
                continue;
            };
            let bad = |expected: &str| invalid(format!("{key}={value:?}: expected {expected}"));
            match option {
                "mode" => {
                    mode = Some(match &*value {
                        "session" => HoldMode::Session,
                        "ttl" => HoldMode::Ttl,
                        _ => return Err(bad("session or ttl")),
                    })
                }
                "pooler" => {
                    settings.pooler = match &*value {
                        "none" => Pooler::None,
                        "transaction" => Pooler::Transaction,
                        _ => return Err(bad("none or transaction")),
                    }
                }
                "schema" => {
                    if !is_identifier(&value) {
                        return Err(bad(
                            "a lower-case identifier ([a-z_][a-z0-9_]*, at most 63 bytes)",
                        ));
                    }
                    settings.schema = value.into_owned();
                }
                "pool_size" => {
                    settings.pool_size = value
                        .parse()
                        .ok()
                        .filter(|n| (1..=1000).contains(n))
                        .ok_or_else(|| bad("a number in 1..=1000"))?;
                }
                "migrate" => {
                    settings.migrate = match &*value {
                        "true" | "on" | "1" => true,
                        "false" | "off" | "0" => false,
                        _ => return Err(bad("true or false")),
                    }
                }
                "keepalive_ms" => {
                    let ms: u64 = value
                        .parse()
                        .ok()
                        .filter(|ms| (10..=3_600_000).contains(ms))
                        .ok_or_else(|| bad("milliseconds in 10..=3600000"))?;
                    settings.keepalive = Duration::from_millis(ms);
                }
                _ => {
                    return Err(invalid(format!(
                        "unknown option {key} (known: locksmith_mode, locksmith_pooler, \
                         locksmith_schema, locksmith_pool_size, locksmith_migrate, \
                         locksmith_keepalive_ms)"
                    )))
                }
            }
        }
        settings.mode = match (settings.pooler, mode) {
            (Pooler::None, mode) => mode.unwrap_or(HoldMode::Session),
            (Pooler::Transaction, None | Some(HoldMode::Ttl)) => HoldMode::Ttl,
            (Pooler::Transaction, Some(HoldMode::Session)) => {
                return Err(invalid(
                    "locksmith_mode=session cannot work behind a transaction pooler: a \
                     session hold needs a server session that stays with its connection; \
                     use locksmith_mode=ttl (the default with locksmith_pooler=transaction) \
                     or lock_in_transaction"
                        .into(),
                ))
            }
        };
        if passed.is_empty() {
            parsed.set_query(None);
        } else {
            parsed.query_pairs_mut().clear().extend_pairs(passed);
        }
        settings.pg = parsed
            .as_str()
            .parse()
            .map_err(|e: tokio_postgres::Error| invalid(e.to_string()))?;
        settings.pg.ssl_mode(ssl_mode.negotiation());
        let identity = match (&ssl_cert, &ssl_key) {
            (Some(cert), Some(key)) => Some((cert.as_path(), key.as_path())),
            (None, None) => None,
            _ => {
                return Err(invalid(
                    "sslcert and sslkey go together (the client certificate and its key)".into(),
                ))
            }
        };
        if identity.is_some() && ssl_mode == SslMode::Disable {
            return Err(invalid("sslcert needs TLS, not sslmode=disable".into()));
        }
        settings.tls = Tls::new(ssl_mode, ssl_root.as_deref(), identity).map_err(invalid)?;
        if settings.pg.get_application_name().is_none() {
            settings.pg.application_name("locksmith");
        }
        if settings.pg.get_connect_timeout().is_none() {
            settings.pg.connect_timeout(Duration::from_secs(10));
        }
        Ok(settings)
    }

    /// The schema as an SQL identifier (it is validated, so quoting is plain).
    pub fn schema_ident(&self) -> String {
        format!("\"{}\"", self.schema)
    }
}

/// `[a-z_][a-z0-9_]*`, 1..=63 bytes: needs no quoting rules beyond `"…"` and
/// is a valid LISTEN channel.
fn is_identifier(s: &str) -> bool {
    let mut bytes = s.bytes();
    matches!(bytes.next(), Some(b'a'..=b'z' | b'_'))
        && bytes.all(|b| matches!(b, b'a'..=b'z' | b'0'..=b'9' | b'_'))
        && s.len() <= 63
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(url: &str) -> Result<Settings> {
        Settings::parse(url, &ConnectOptions::default())
    }

    #[test]
    fn strips_our_options_and_keeps_libpq_ones() {
        let s = parse(
            "postgresql://u:secret@db.example:6543/app?locksmith_mode=ttl&sslmode=disable\
             &locksmith_schema=locks&application_name=svc&locksmith_pool_size=3",
        )
        .unwrap();
        assert_eq!(s.mode, HoldMode::Ttl);
        assert_eq!(s.schema, "locks");
        assert_eq!(s.pool_size, 3);
        assert_eq!(s.pg.get_user(), Some("u"));
        assert_eq!(s.pg.get_dbname(), Some("app"));
        assert_eq!(s.pg.get_ports(), [6543]);
        assert_eq!(s.pg.get_application_name(), Some("svc"));
        assert!(!s.url.contains("secret"));
    }

    #[test]
    fn defaults() {
        let s = parse("postgres://postgres@127.0.0.1/postgres").unwrap();
        assert_eq!(s.mode, HoldMode::Session);
        assert_eq!(s.schema, "locksmith");
        assert!(s.migrate);
        assert_eq!(s.pg.get_application_name(), Some("locksmith"));
    }

    #[test]
    fn transaction_pooler_means_lease_holds() {
        let s = parse("postgres://u@h/db?locksmith_pooler=transaction").unwrap();
        assert_eq!((s.pooler, s.mode), (Pooler::Transaction, HoldMode::Ttl));
        let s = parse("postgres://u@h/db?locksmith_pooler=transaction&locksmith_mode=ttl").unwrap();
        assert_eq!(s.mode, HoldMode::Ttl);
        for url in [
            "postgres://u@h/db?locksmith_pooler=transaction&locksmith_mode=session",
            "postgres://u@h/db?locksmith_pooler=statement",
        ] {
            assert!(matches!(parse(url), Err(Error::InvalidUrl { .. })), "{url}");
        }
    }

    #[test]
    fn sslmode_goes_to_the_connector() {
        use tokio_postgres::config::SslMode as Negotiation;
        for (mode, negotiation) in [
            ("disable", Negotiation::Disable),
            ("prefer", Negotiation::Prefer),
            ("require", Negotiation::Require),
        ] {
            let s = parse(&format!("postgres://u@h/db?sslmode={mode}")).unwrap();
            assert_eq!(s.pg.get_ssl_mode(), negotiation, "{mode}");
        }
        assert_eq!(
            parse("postgres://u@h/db").unwrap().pg.get_ssl_mode(),
            Negotiation::Prefer
        );
        for url in [
            "postgres://u@h/db?sslmode=allow",
            "postgres://u@h/db?sslmode=verify-ca&sslrootcert=/nonexistent.pem",
            "postgres://u@h/db?sslrootcert=system&sslmode=verify-full",
            "postgres://u@h/db?sslkey=client.key",
            "postgres://u@h/db?sslcert=client.crt",
            "postgres://u@h/db?sslcert=/nonexistent.crt&sslkey=/nonexistent.key",
            "postgres://u@h/db?sslpassword=x",
        ] {
            assert!(matches!(parse(url), Err(Error::InvalidUrl { .. })), "{url}");
        }
    }

    #[test]
    fn rejects_bad_options_with_the_password_removed() {
        for url in [
            "postgres://u:secret@h/db?locksmith_mode=lease",
            "postgres://u:secret@h/db?locksmith_schema=Bad-Name",
            "postgres://u:secret@h/db?locksmith_pool_size=0",
            "postgres://u:secret@h/db?locksmith_nope=1",
            "postgres://u:secret@h/db?not_a_libpq_param=1",
        ] {
            match parse(url) {
                Err(Error::InvalidUrl { url, .. }) => assert!(!url.contains("secret"), "{url}"),
                other => panic!("{url}: {other:?}"),
            }
        }
    }
}
