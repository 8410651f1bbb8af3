//! Lock name validation: never panics, accepts exactly the names that follow
//! the documented rules (1 to 512 bytes of UTF-8, no NUL, no empty `/`
//! segment), and the PostgreSQL keys of an accepted name can be made.
#![no_main]

use libfuzzer_sys::fuzz_target;
use locksmith_core::{validate_name, NameError, MAX_NAME_LEN};

fuzz_target!(|bytes: &[u8]| {
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
            let _ = locksmith::postgres::advisory_key(name);
            let _ = locksmith::postgres::semaphore_slot_key(name, u32::MAX);
        }
        Err(NameError::TooLong { len, max }) => {
            assert_eq!((len, max), (name.len(), MAX_NAME_LEN));
            assert!(!follows_rules);
        }
        Err(error) => assert!(!follows_rules, "refused {name:?}: {error}"),
    }
});
