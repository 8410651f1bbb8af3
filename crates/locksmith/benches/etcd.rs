//! Benchmark of the etcd backend (being written).
fn main() {}
