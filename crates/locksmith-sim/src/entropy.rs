//! Randomness drawn from the run's seed, on the thread the run owns.
//!
//! The simulator's own choices (latencies, which messages fail) come from
//! its seeded generator, but the code under test draws randomness too:
//! std's `HashMap` keys, tokio's choice among `select!` branches, openraft's
//! election timeouts (rand's thread RNG), session secrets. All of them end
//! in libc's `getrandom`, which this module replaces in the binaries of this
//! crate (build.rs exports it for the `getrandom` crate's `dlsym`): on a
//! thread whose run seeded it, the bytes come from that seed; on any other
//! thread, from the kernel as usual. Hand-written because no crate offers
//! this without recompiling the world under a cfg (madsim's way).
//!
//! rand 0.8's generator reads the kernel with a raw system call and so stays
//! random: the server draws its own values (session secrets, stint numbers,
//! segment seeds) through the `getrandom` crate instead. Drawn by rand, they
//! parted the runs of one seed (`--mixed --lease-edge` seed 34 gave one of
//! two histories, at any speed): secrets and stints are varints in the
//! log, so the entries' sizes differed.

use std::cell::Cell;

use rand::rngs::SmallRng;
use rand::{RngCore, SeedableRng};

thread_local! {
    static SEEDED: Cell<Option<SmallRng>> = const { Cell::new(None) };
}

/// Draws this thread's randomness from `seed` from now on. Call first thing
/// on a fresh thread: what std and tokio seeded themselves from before
/// stays as it was.
pub(crate) fn seed_this_thread(seed: u64) {
    SEEDED.with(|seeded| seeded.set(Some(SmallRng::seed_from_u64(seed ^ 0x6c6f_636b_736d_6974))));
}

/// Fills `buf` from this thread's seeded generator; `false` if it has none.
fn fill_seeded(buf: &mut [u8]) -> bool {
    SEEDED.with(|seeded| match seeded.take() {
        Some(mut rng) => {
            rng.fill_bytes(buf);
            seeded.set(Some(rng));
            true
        }
        None => false,
    })
}

/// libc's `getrandom(2)` wrapper, replaced (see the module docs).
///
/// # Safety
///
/// As libc's: `buf` must be valid for writes of `len` bytes.
#[no_mangle]
pub unsafe extern "C" fn getrandom(
    buf: *mut libc::c_void,
    len: libc::size_t,
    flags: libc::c_uint,
) -> libc::ssize_t {
    if len > 0 {
        // SAFETY: the caller hands a buffer valid for `len` bytes.
        let bytes = unsafe { std::slice::from_raw_parts_mut(buf.cast::<u8>(), len) };
        if fill_seeded(bytes) {
            return len as libc::ssize_t;
        }
    }
    // SAFETY: the same arguments, to the kernel's call.
    unsafe { libc::syscall(libc::SYS_getrandom, buf, len, flags) as libc::ssize_t }
}
