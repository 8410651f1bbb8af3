//! The native module of the `locksmith` Python package: locksmith's Rust
//! client (`crates/locksmith`) for Python, through PyO3.
//!
//! Python sees two APIs over the same client, built by maturin from
//! `pyproject.toml` next to this crate: blocking (`locksmith.connect`, in
//! `src/blocking.rs`) and asyncio (`locksmith.aio.connect`, in `src/aio.rs`),
//! thin front ends over the same base classes (`src/shared.rs`, which
//! names neither: each front end gives the bases its classes as a `Flavor`). The
//! lock rules are all the Rust client's; this crate only converts values
//! and waits:
//!
//! - `runtime`: the process's tokio runtime, a blocking wait that
//!   releases the GIL and lets Ctrl-C through, and what a fork does.
//! - `awaitable`: the asyncio API's awaitable, a Rust future polled by the
//!   task that awaits it; its Python type is made by hand on the stable ABI
//!   (PyO3 cannot give a class `am_send`).
//! - `loop_waker`: how a Rust waker wakes an asyncio event loop from any
//!   thread without the GIL.
//! - `shared`: the base classes both APIs extend (`locksmith._base`):
//!   making locks, and everything that neither blocks nor awaits.
//! - `held`: a guard's or leadership's hold, shared by both APIs (lost
//!   signal, callbacks, release on drop).
//! - `errors` and `convert`: errors as the exception classes, and
//!   records as the dataclasses, of `python/locksmith/_model.py`.
//!
//! The Python side (`python/locksmith`) re-exports these classes, adds the
//! exceptions and records, and ships the `.pyi` stubs.

mod aio;
mod awaitable;
mod bench;
mod blocking;
mod convert;
mod errors;
mod held;
mod loop_waker;
mod runtime;
mod shared;
mod spare;

use pyo3::prelude::*;
use pyo3::types::IntoPyDict;

#[pymodule]
#[pyo3(name = "_locksmith")]
fn init(module: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = module.py();
    shared::register(module)?;
    blocking::register(module)?;
    let aio = PyModule::new(py, "aio")?;
    aio::register(&aio)?;
    module.add_submodule(&aio)?;
    module.add_function(wrap_pyfunction!(runtime::_after_fork_in_child, module)?)?;
    module.add_function(wrap_pyfunction!(runtime::_at_exit, module)?)?;
    module.add_function(wrap_pyfunction!(bench::_bench_rust, module)?)?;
    module.add_function(wrap_pyfunction!(bench::_bench_rust_woken, module)?)?;
    module.add_function(wrap_pyfunction!(bench::_bench_rust_round_trips, module)?)?;
    module.add_function(wrap_pyfunction!(bench::_bench_ready, module)?)?;
    module.add_function(wrap_pyfunction!(bench::_bench_woken, module)?)?;
    py.import("atexit")?
        .call_method1("register", (module.getattr("_at_exit")?,))?;
    // A forked child cannot use its parent's runtime, clients or the Rust
    // crate's process-wide state (memory:// tables, cleanup registries): it
    // starts its own (see `runtime`).
    py.import("os")?.call_method(
        "register_at_fork",
        (),
        Some(&[("after_in_child", module.getattr("_after_fork_in_child")?)].into_py_dict(py)?),
    )?;
    Ok(())
}
