//! A client's request bytes, as the server decodes and converts them: a
//! session stream's batch (each message through the stream's checks, each
//! acquire on to a lock engine), every unary call's request, and a framed
//! session stream's hello.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|bytes: &[u8]| {
    locksmith_server::fuzzing::client_request(bytes);
});
