//! Benchmark of the server backend (being written).
fn main() {}
