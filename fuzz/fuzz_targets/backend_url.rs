//! Backend URLs, as `Client::connect` parses them (by the parser of their
//! scheme), without connecting: an error or a config, never a panic.
#![no_main]

use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use tokio::runtime::Runtime;

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

/// Whether an option may name a file outside the working directory.
/// Options such as `ca=`, `token_file=` or `sslrootcert=` make the parsers
/// read the file they name, by design: the fuzzer must not name /dev/zero.
/// Everything after the first `?` counts, decoded, whatever the scheme.
fn may_name_a_file_elsewhere(url: &str) -> bool {
    url.split_once('?').is_some_and(|(_, query)| {
        url::form_urlencoded::parse(query.as_bytes()).any(|(_, value)| value.contains('/'))
    })
}

fuzz_target!(|bytes: &[u8]| {
    let Ok(url) = std::str::from_utf8(bytes) else {
        return;
    };
    if !may_name_a_file_elsewhere(url) {
        let _runtime = runtime().enter();
        let _ = locksmith::fuzzing::parse_url(url);
    }
});
