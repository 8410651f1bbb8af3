//! Benchmark of the zookeeper backend (being written).
fn main() {}
