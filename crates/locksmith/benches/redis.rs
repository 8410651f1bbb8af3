//! Benchmark of the redis backend (being written).
fn main() {}
