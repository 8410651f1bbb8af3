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

fn main() -> ExitCode {
    locksmith_cli::main()
}
