//! Backend URLs, as `Client::connect` parses them (by the parser of their
//! scheme), without connecting: an error or a config, never a panic.
#![no_main]

use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use tokio::runtime::Runtime;

/// `locksmith://` makes its channels (connected lazily) on the runtime, as
/// `Client::connect` does; one worker polls their tasks to their end.
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

fuzz_target!(|bytes: &[u8]| {
    let Ok(url) = std::str::from_utf8(bytes) else {
        return;
    };
    // `sslrootcert=<file>` makes the PostgreSQL parser read that file, by
    // design: the fuzzer must not name /dev/zero.
    let names_a_file = url::Url::parse(url)
        .is_ok_and(|url| url.query_pairs().any(|(key, _)| key == "sslrootcert"));
    if !names_a_file {
        let _runtime = runtime().enter();
        let _ = locksmith::fuzzing::parse_url(url);
    }
});
