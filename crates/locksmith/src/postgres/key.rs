//! Advisory lock keys: the stable 64-bit hash of a lock name.
//!
//! The key of a name is the first 8 bytes of SHA-256 of its UTF-8 bytes, read
//! as a big-endian signed 64-bit integer. Any language computes it:
//!
//! ```sql
//! SELECT ('x' || left(encode(sha256(convert_to('orders/42', 'UTF8')), 'hex'), 16))::bit(64)::bigint;
//! ```
//!
//! ```python
//! int.from_bytes(hashlib.sha256("orders/42".encode()).digest()[:8], "big", signed=True)
//! ```
//!
//! Slot `i` of a semaphore hashes the name, a NUL byte and `i` in decimal
//! (`name || '\x00' || i`); a name cannot contain NUL, so slot keys never equal
//! a lock's key.

use sha2::{Digest, Sha256};

/// The advisory lock key of a lock name (see the module docs for the formula).
///
/// ```
/// assert_eq!(locksmith::postgres::advisory_key("orders/42"), -4261225075031449721);
/// ```
pub fn advisory_key(name: &str) -> i64 {
    key_of(&[name.as_bytes()])
}

/// The advisory lock key of slot `slot` (0-based) of the semaphore `name`.
pub fn semaphore_slot_key(name: &str, slot: u32) -> i64 {
    key_of(&[name.as_bytes(), b"\0", slot.to_string().as_bytes()])
}

fn key_of(parts: &[&[u8]]) -> i64 {
    let mut hasher = Sha256::new();
    for part in parts {
        hasher.update(part);
    }
    let digest = hasher.finalize();
    let mut first = [0u8; 8];
    first.copy_from_slice(&digest[..8]);
    i64::from_be_bytes(first)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_values() {
        // Computed with the SQL and Python one-liners of the module docs.
        assert_eq!(advisory_key("orders/42"), -4261225075031449721);
        assert_ne!(
            semaphore_slot_key("orders/42", 0),
            advisory_key("orders/42")
        );
        assert_ne!(
            semaphore_slot_key("orders/42", 0),
            semaphore_slot_key("orders/42", 1)
        );
    }
}
