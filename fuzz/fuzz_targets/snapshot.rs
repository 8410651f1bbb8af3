//! A snapshot from a leader or the data directory: decoded, and restored into
//! a lock engine and the grant history when it decodes.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|bytes: &[u8]| {
    locksmith_server::fuzzing::snapshot(bytes);
});
