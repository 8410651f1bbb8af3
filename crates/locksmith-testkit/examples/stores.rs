//! Starts real stores on loopback for test suites that are not written in
//! Rust (the Python package's pytest suite), the way the Rust tests start
//! them: the same binaries, found the same way, with the same settings.
//!
//! ```sh
//! cargo run -p locksmith-testkit --example stores -- redis zookeeper etcd postgres
//! ```
//!
//! prints `NAME URL` on a line of its own for each store once it serves
//! (`redis redis://127.0.0.1:41234`), then `ready`, and keeps them running
//! until its standard input closes (or it dies: the stores die with it).
//! A store that cannot start (a binary not installed) prints the reason on
//! standard error and exits with status 1.

use std::any::Any;
use std::io::{Read, Write};

use locksmith_testkit::{Etcd, Postgres, Redis, ZooKeeper};

/// Starts one store by name: its handle (the store runs while it lives)
/// and its URL.
fn start(name: &str) -> Result<(Box<dyn Any + Send>, String), String> {
    fn started<S: Any + Send>(
        store: locksmith_testkit::Result<S>,
        url: impl Fn(&S) -> String,
    ) -> Result<(Box<dyn Any + Send>, String), String> {
        let store = store.map_err(|error| error.to_string())?;
        let url = url(&store);
        Ok((Box::new(store), url))
    }
    match name {
        "redis" => started(Redis::try_start(), Redis::url),
        "zookeeper" => started(ZooKeeper::try_start(), ZooKeeper::url),
        "etcd" => started(Etcd::try_start(), Etcd::url),
        "postgres" => started(Postgres::try_start(), Postgres::url),
        other => Err(format!(
            "unknown store {other:?}: redis, zookeeper, etcd or postgres"
        )),
    }
}

fn main() {
    let names: Vec<String> = std::env::args().skip(1).collect();
    // Side by side: a JVM and an initdb take seconds each.
    let started: Vec<_> = std::thread::scope(|scope| {
        let starting: Vec<_> = names
            .iter()
            .map(|name| scope.spawn(move || start(name)))
            .collect();
        starting
            .into_iter()
            .map(|thread| thread.join().expect("a store's start panicked"))
            .collect()
    });
    let mut stores = Vec::new();
    let mut stdout = std::io::stdout().lock();
    for (name, result) in names.iter().zip(started) {
        match result {
            Ok((store, url)) => {
                writeln!(stdout, "{name} {url}").expect("stdout");
                stores.push(store);
            }
            Err(error) => {
                eprintln!("cannot start {name}: {error}");
                std::process::exit(1);
            }
        }
    }
    writeln!(stdout, "ready").expect("stdout");
    stdout.flush().expect("stdout");
    drop(stdout);
    // Until whoever started us is done with the stores.
    let _ = std::io::stdin().read_to_end(&mut Vec::new());
    drop(stores);
}
