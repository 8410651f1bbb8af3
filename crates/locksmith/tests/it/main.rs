//! The client library's integration tests: one test binary, `it`, with a
//! module per backend or concern, so the whole set links once. A module
//! compiles only with the features its backend needs; `--all-features` runs
//! them all. One module alone:
//! `cargo nextest run -p locksmith --all-features -E 'test(/^redis_sentinel::/)'`.

#[cfg(all(feature = "blocking", feature = "memory", feature = "server"))]
mod blocking;
#[cfg(feature = "etcd")]
mod etcd;
#[cfg(feature = "memory")]
mod memory;
#[cfg(feature = "memory")]
mod metrics;
#[cfg(feature = "postgres")]
mod postgres;
#[cfg(feature = "redis")]
mod redis;
#[cfg(feature = "redis")]
mod redis_cluster;
#[cfg(feature = "redis")]
mod redis_sentinel;
#[cfg(feature = "redis")]
mod redis_support;
#[cfg(feature = "zookeeper")]
mod zookeeper;
