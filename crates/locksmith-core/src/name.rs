//! Lock names: the one validation rule every backend shares.

use crate::error::NameError;

/// Longest accepted lock name, in bytes.
pub const MAX_NAME_LEN: usize = 512;

/// Checks a lock name against the shared model: a UTF-8 path of 1..=512 bytes,
/// no NUL byte, no empty segment (so no leading, trailing or doubled `/`).
///
/// Backends call this before any I/O so that a bad name fails the same way
/// everywhere.
pub fn validate_name(name: &str) -> Result<(), NameError> {
    if name.is_empty() {
        return Err(NameError::Empty);
    }
    if name.len() > MAX_NAME_LEN {
        return Err(NameError::TooLong {
            len: name.len(),
            max: MAX_NAME_LEN,
        });
    }
    // One pass over the bytes: a snapshot's check validates a million
    // names, and a search per rule and per segment cost more than the names
    // are long. A NUL anywhere is told before an empty segment.
    let mut empty_segment = false;
    let mut previous = b'/';
    for &byte in name.as_bytes() {
        if byte == 0 {
            return Err(NameError::Nul);
        }
        empty_segment |= byte == b'/' && previous == b'/';
        previous = byte;
    }
    if empty_segment || previous == b'/' {
        return Err(NameError::EmptySegment);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_paths() {
        for ok in ["a", "orders/42", "ünïcode/ключ", &"x".repeat(MAX_NAME_LEN)] {
            assert_eq!(validate_name(ok), Ok(()), "{ok}");
        }
    }

    #[test]
    fn rejects_each_rule_with_its_own_error() {
        assert_eq!(validate_name(""), Err(NameError::Empty));
        assert_eq!(
            validate_name(&"x".repeat(MAX_NAME_LEN + 1)),
            Err(NameError::TooLong {
                len: MAX_NAME_LEN + 1,
                max: MAX_NAME_LEN
            })
        );
        assert_eq!(validate_name("a\0b"), Err(NameError::Nul));
        for bad in ["/a", "a/", "a//b", "/", "//", "a/b//"] {
            assert_eq!(validate_name(bad), Err(NameError::EmptySegment), "{bad}");
        }
        for both in ["/a\0", "a//\0b", "\0/"] {
            assert_eq!(validate_name(both), Err(NameError::Nul), "{both:?}");
        }
    }
}
