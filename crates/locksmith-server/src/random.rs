//! The random values the server draws: session secrets, leadership stint
//! numbers and log segment seeds, from the operating system through the
//! `getrandom` crate. A deterministic simulation replaces libc's
//! `getrandom` with its seed (`locksmith-sim`, module `entropy`), and this
//! crate reaches it there; rand 0.8's generator reads the kernel with a raw
//! system call, so a run drew other values each time, and their encoded
//! sizes (varints in the log) parted the runs of one seed.

/// A random `u32`.
pub(crate) fn u32() -> u32 {
    let mut bytes = [0; 4];
    fill(&mut bytes);
    u32::from_le_bytes(bytes)
}

/// A random `u64`.
pub(crate) fn u64() -> u64 {
    let mut bytes = [0; 8];
    fill(&mut bytes);
    u64::from_le_bytes(bytes)
}

/// A random `u128`.
pub(crate) fn u128() -> u128 {
    let mut bytes = [0; 16];
    fill(&mut bytes);
    u128::from_le_bytes(bytes)
}

/// Fills `bytes` from the operating system's random source. Without one the
/// server cannot make secrets at all: it stops, as rand's generator did.
fn fill(bytes: &mut [u8]) {
    getrandom::fill(bytes).expect("the operating system gives no random bytes");
}
