//! The Rust side of the Python client's benchmark
//! (`crates/locksmith-py/bench/acquire_release.py`): the same acquire +
//! release pairs with the Rust client alone, in the same process, for the
//! side-by-side figures of docs/BENCHMARKS.md. Not part of the API.

use std::time::Instant;

use pyo3::prelude::*;

use crate::errors::IntoPyResult;

/// Seconds taken by `pairs` acquire + release pairs of the lock `name` on
/// `url`, from Rust: with the blocking client (`api="blocking"`, as
/// `locksmith::blocking` users write them) or with the async client awaited
/// in a loop on a runtime of its own (`api="async"`). Connecting is not
/// timed.
#[pyfunction]
pub fn _bench_rust(
    py: Python<'_>,
    url: String,
    name: String,
    pairs: u32,
    api: &str,
) -> PyResult<f64> {
    match api {
        "blocking" => py.detach(|| {
            let client = locksmith::blocking::Client::connect(&url)?;
            let lock = client.lock(name);
            let started = Instant::now();
            for _ in 0..pairs {
                lock.acquire()?.release()?;
            }
            let elapsed = started.elapsed().as_secs_f64();
            client.close()?;
            Ok(elapsed)
        }),
        "async" => py.detach(|| {
            let runtime = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
                .expect("a runtime for the benchmark");
            runtime.block_on(async {
                let client = locksmith::Client::connect(&url).await?;
                let lock = client.lock(name);
                let started = Instant::now();
                for _ in 0..pairs {
                    lock.acquire().await?.release().await?;
                }
                let elapsed = started.elapsed().as_secs_f64();
                client.close().await?;
                Ok(elapsed)
            })
        }),
        other => Err(locksmith::Error::InvalidArgument(format!(
            "api must be \"blocking\" or \"async\", not {other:?}"
        ))),
    }
    .py()
}
