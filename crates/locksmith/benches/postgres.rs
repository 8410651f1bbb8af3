//! Benchmark of the postgres backend (being written).
fn main() {}
