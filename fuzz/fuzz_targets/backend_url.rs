//! Backend URLs, as `Client::connect` parses them (by the parser of their
//! scheme), without connecting: an error or a config, never a panic
//! (`locksmith::fuzzing::backend_url`, whose tests replay the seeds).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|bytes: &[u8]| {
    locksmith::fuzzing::backend_url(bytes);
});
