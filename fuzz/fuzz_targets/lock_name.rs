//! Lock name validation: never panics, accepts exactly the names that follow
//! the documented rules (1 to 512 bytes of UTF-8, no NUL, no empty `/`
//! segment), and the PostgreSQL keys of an accepted name can be made
//! (`locksmith::fuzzing::lock_name`, whose tests replay the seeds).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|bytes: &[u8]| {
    locksmith::fuzzing::lock_name(bytes);
});
