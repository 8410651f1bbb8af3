//! `locksmith-lab` end to end: one test binary, `it`, with a module per
//! command, so the whole set links once. Each test runs the `locksmith-lab`
//! binary Cargo built beside it, which runs `locksmith` from the same target
//! directory: build both first (`--workspace`). One module alone:
//! `cargo nextest run --workspace -E 'package(locksmith-lab) & test(/^torture::/)'`.

mod bench;
mod torture;
