//! Entry points of the fuzz targets in `fuzz/` (feature `fuzzing`; not part
//! of the API): the parsing of backend URLs, without connecting, and the
//! validation of lock names. Each target calls one function here, and the
//! tests below replay each target's seeds (`fuzz/seeds/<target>`) through
//! the same function, so the normal test suite catches a regression on any
//! input a campaign ever started from or failed on.

use std::sync::OnceLock;

use locksmith_core::{validate_name, NameError, MAX_NAME_LEN};
use tokio::runtime::Runtime;

use crate::client::Store;
use crate::error::Result;
use crate::options::{redact, ConnectOptions};

/// Parses `url` with the parser of its scheme, as [`crate::Client::connect`]
/// would, contacting nothing; also redacts it, as every error message does.
/// A scheme without a parser (`memory`, unknown ones) is `Ok`.
pub fn parse_url(url: &str) -> Result<()> {
    let _ = redact(url);
    let options = ConnectOptions::default();
    let scheme = url.split_once("://").map_or("", |(scheme, _)| scheme);
    match Store::of_scheme(scheme) {
        Some(Store::Server) => crate::server::parse_url_only(url, &options),
        Some(Store::Redis) => crate::redis::parse_url_only(url, &options),
        Some(Store::ZooKeeper) => crate::zookeeper::parse_url_only(url, &options),
        Some(Store::Etcd) => crate::etcd::parse_url_only(url, &options),
        Some(Store::Postgres) => crate::postgres::parse_url_only(url, &options),
        Some(Store::Memory) | None => Ok(()),
    }
}

/// The `backend_url` target: `bytes`, when UTF-8, parsed as a backend URL
/// ([`parse_url`]): an error or a config, never a panic.
///
/// A URL whose options name a file outside the working directory is
/// skipped: options such as `ca=`, `token_file=` or `sslrootcert=` make the
/// parsers read the file they name, by design, and a fuzzer must not name
/// `/dev/zero`. Everything after the first `?` counts, decoded, whatever the
/// scheme.
pub fn backend_url(bytes: &[u8]) {
    let Ok(url) = std::str::from_utf8(bytes) else {
        return;
    };
    let names_a_file_elsewhere = url.split_once('?').is_some_and(|(_, query)| {
        url::form_urlencoded::parse(query.as_bytes()).any(|(_, value)| value.contains('/'))
    });
    if !names_a_file_elsewhere {
        let _runtime = runtime().enter();
        let _ = parse_url(url);
    }
}

/// Some parsers build store clients (connected lazily), which want a
/// runtime; one worker polls their tasks to their end.
fn runtime() -> &'static Runtime {
    static RUNTIME: OnceLock<Runtime> = OnceLock::new();
    RUNTIME.get_or_init(|| {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .expect("tokio runtime")
    })
}

/// The `lock_name` target: `bytes`, when UTF-8, through [`validate_name`],
/// which must accept exactly the names that follow the documented rules (1
/// to 512 bytes, no NUL, no empty `/` segment); the PostgreSQL keys of an
/// accepted name can be made. Panics when a rule is broken.
pub fn lock_name(bytes: &[u8]) {
    let Ok(name) = std::str::from_utf8(bytes) else {
        return;
    };
    let follows_rules = !name.is_empty()
        && name.len() <= MAX_NAME_LEN
        && !name.contains('\0')
        && !name.split('/').any(str::is_empty);
    match validate_name(name) {
        Ok(()) => {
            assert!(follows_rules, "accepted {name:?}");
            let _ = crate::postgres::advisory_key(name);
            let _ = crate::postgres::semaphore_slot_key(name, u32::MAX);
        }
        Err(NameError::TooLong { len, max }) => {
            assert_eq!((len, max), (name.len(), MAX_NAME_LEN));
            assert!(!follows_rules);
        }
        Err(error) => assert!(!follows_rules, "refused {name:?}: {error}"),
    }
}

/// The seeds of each target, replayed: a panic on any of them fails the
/// test, naming the file.
#[cfg(test)]
mod tests {
    use locksmith_testkit::fuzz_seeds;

    #[test]
    fn backend_url_seeds_replay() {
        for (path, bytes) in fuzz_seeds("backend_url") {
            eprintln!("replaying {}", path.display());
            super::backend_url(&bytes);
        }
    }

    #[test]
    fn lock_name_seeds_replay() {
        for (path, bytes) in fuzz_seeds("lock_name") {
            eprintln!("replaying {}", path.display());
            super::lock_name(&bytes);
        }
    }
}
