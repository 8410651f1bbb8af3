//! The testkit's own tests, against every store it starts for real: one test
//! binary, `it`, with a module per concern, so the whole set links once.
//! One module alone: `cargo nextest run -p locksmith-testkit -E 'test(/^replicated::/)'`.

mod replicated;
mod servers;
