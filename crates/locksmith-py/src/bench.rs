//! The Rust side of the Python client's benchmark
//! (`crates/locksmith-py/bench/acquire_release.py`): the same acquire +
//! release pairs with the Rust client alone, in the same process, for the
//! side-by-side figures of docs/BENCHMARKS.md; and the floors under the
//! asyncio API's cost (an awaitable that is ready at once, one woken from a
//! runtime thread), and Rust's side of the socket round trip the script
//! compares asyncio's own loop with. Not part of the API.

use std::os::fd::{BorrowedFd, RawFd};
use std::time::Instant;

use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;

use crate::awaitable::{awaitable, Awaitable};
use crate::errors::IntoPyResult;
use crate::runtime;

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
            benchmark_runtime().block_on(async {
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

/// An awaitable of the asyncio API's kind that is ready at once: what every
/// call costs beyond the client's own work.
#[pyfunction]
pub fn _bench_ready() -> Awaitable {
    awaitable(async { Ok(()) })
}

/// An awaitable that waits once, for a no-op task on the runtime: its
/// waker fires on a runtime thread, as when a store answers.
#[pyfunction]
pub fn _bench_woken() -> Awaitable {
    awaitable(async {
        runtime::spawn(async {})
            .await
            .map_err(|error| PyRuntimeError::new_err(error.to_string()))
    })
}

/// Seconds taken by `waits` awaits of a no-op task spawned on a runtime, from
/// Rust on a thread outside it (as the async pairs of [`_bench_rust`] run):
/// `_bench_woken`'s wait without Python.
#[pyfunction]
pub fn _bench_rust_woken(py: Python<'_>, waits: u32) -> PyResult<f64> {
    py.detach(|| {
        benchmark_runtime().block_on(async {
            let started = Instant::now();
            for _ in 0..waits {
                tokio::spawn(async {})
                    .await
                    .map_err(|error| PyRuntimeError::new_err(error.to_string()))?;
            }
            Ok(started.elapsed().as_secs_f64())
        })
    })
}

/// Seconds taken by `count` one-byte round trips over the connected Unix
/// socket `fd` (to an echo process; the caller keeps the descriptor, this
/// works on a copy), awaited on a runtime from a thread outside it, as
/// the async pairs of [`_bench_rust`] run against a server: the same
/// round trip as the script's asyncio one, without Python. One round trip
/// warms up first.
#[pyfunction]
pub fn _bench_rust_round_trips(py: Python<'_>, fd: RawFd, count: u32) -> PyResult<f64> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    // SAFETY: the caller's descriptor stays open for this call, which
    // borrows it only to duplicate it.
    let copy = unsafe { BorrowedFd::borrow_raw(fd) }.try_clone_to_owned()?;
    let socket = std::os::unix::net::UnixStream::from(copy);
    socket.set_nonblocking(true)?;
    let elapsed = py.detach(|| {
        benchmark_runtime().block_on(async {
            let mut socket = tokio::net::UnixStream::from_std(socket)?;
            let mut byte = [0];
            socket.write_all(b"x").await?;
            socket.read_exact(&mut byte).await?;
            let started = Instant::now();
            for _ in 0..count {
                socket.write_all(b"x").await?;
                socket.read_exact(&mut byte).await?;
            }
            Ok::<_, std::io::Error>(started.elapsed().as_secs_f64())
        })
    })?;
    Ok(elapsed)
}

/// A runtime of the benchmark's own, shaped as the module's (two workers),
/// for Rust's side of a comparison.
fn benchmark_runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a runtime for the benchmark")
}
