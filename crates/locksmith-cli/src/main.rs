//! The `locksmith` executable: the command is the library crate
//! `locksmith_cli` (src/lib.rs), so that its tests (tests/it) build on the
//! one compilation of it the executable links.

use std::process::ExitCode;

/// The allocator: a session's end frees a hold's worth of small allocations
/// for every lock it held, and the server allocates per request;
/// mimalloc's thread-local free lists do both faster than the system's
/// (docs/BENCHMARKS.md).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// `mi_option_purge_delay` in mimalloc's `mimalloc.h` (the enum's values
/// stay put across versions; libmimalloc-sys names only some of them).
const MI_OPTION_PURGE_DELAY: libmimalloc_sys::mi_option_t = 15;

/// How long memory mimalloc no longer uses stays mapped before it goes back
/// to the kernel (its default: 1 s). A member keeps its Raft log's entries
/// in memory and frees them in bulk at each snapshot; new entries fill the
/// same memory over the next seconds. Given back in between, every page is
/// faulted in and zeroed again: 5 % of a cluster's CPU at 64 clients
/// (docs/BENCHMARKS.md, "Memory given back to the kernel, and faulted in
/// again"). Freed memory still goes back once it has lain unused this long.
const PURGE_DELAY_MS: std::ffi::c_long = 10_000;

fn main() -> ExitCode {
    // SAFETY: sets one of mimalloc's options, which it reads whenever it
    // purges; any value is valid (0: at once, -1: never).
    unsafe { libmimalloc_sys::mi_option_set(MI_OPTION_PURGE_DELAY, PURGE_DELAY_MS) };
    locksmith_cli::main()
}
