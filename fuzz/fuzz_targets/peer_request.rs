//! A peer's Raft call payload (append, vote, leader transfer, a snapshot's
//! header), as a member decodes it.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|bytes: &[u8]| {
    locksmith_server::fuzzing::peer_request(bytes);
});
