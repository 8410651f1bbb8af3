//! The engine's integration tests, through its public API only: one test
//! binary, `it`, with a module per concern, so the whole set links once.
//! One module alone: `cargo nextest run -p locksmith-core -E 'test(/^rules::/)'`.

mod model;
mod rules;
mod snapshot;
