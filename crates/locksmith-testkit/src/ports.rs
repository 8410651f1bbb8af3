//! Free loopback ports for servers whose address must be known before they
//! start (cluster members list each other's ports on their command lines).
//!
//! A port found free by binding and closing a socket can be taken again
//! before the server binds it (a cluster member once failed to start on
//! "address already in use" that way), in two ways:
//!
//! * **By an outgoing connection.** The kernel gives `bind(port 0)` and every
//!   outgoing connection a port from the same ephemeral range, and a test run
//!   opens thousands of connections. So ports are chosen *below* that range
//!   (`/proc/sys/net/ipv4/ip_local_port_range`), where the kernel never
//!   picks one on its own.
//! * **By another test process** that chose the same port at the same time
//!   (nextest runs each test in a process of its own). So a port is handed out
//!   only with an exclusive `flock` on a file named after it in a directory
//!   shared by every process of the user, held until this process exits.
//!
//! No crate does this reservation across processes; it is a few lines on
//! `flock(2)` (`File::try_lock` needs a newer Rust than the project's
//! minimum).

use std::collections::hash_map::RandomState;
use std::fs::File;
use std::hash::{BuildHasher, Hasher};
use std::net::{Ipv4Addr, TcpListener};
use std::os::fd::AsRawFd;
use std::path::PathBuf;
use std::sync::Mutex;

/// The lowest port handed out: well above the well-known and registered
/// ports the installed servers use by default (5432, 6379, 2181, 2379…).
const LOWEST: u16 = 10_000;

/// The reservations of this process, kept open (and so locked) until it exits.
static HELD: Mutex<Vec<File>> = Mutex::new(Vec::new());

/// Returns a TCP port of `127.0.0.1` that is free right now, that no
/// outgoing connection of this machine will take, and that no other process
/// using this function holds.
///
/// A program outside the tests may still bind it in the meantime; the `start`
/// functions retry with a new port when the server reports the address in use.
pub fn free_port() -> u16 {
    let (low, high) = range();
    let directory = reservations();
    std::fs::create_dir_all(&directory)
        .unwrap_or_else(|e| panic!("cannot create {}: {e}", directory.display()));
    let span = u64::from(high - low) + 1;
    for _ in 0..10_000 {
        let port = low + (random() % span) as u16;
        let Some(reservation) = reserve(directory.join(port.to_string())) else {
            continue;
        };
        if TcpListener::bind((Ipv4Addr::LOCALHOST, port)).is_ok() {
            HELD.lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner())
                .push(reservation);
            return port;
        }
    }
    panic!("no free port between {low} and {high} on 127.0.0.1")
}

/// The ports to choose from: below the kernel's ephemeral range, or above
/// it when too few are below.
fn range() -> (u16, u16) {
    let ephemeral = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|text| {
            let mut bounds = text.split_whitespace().map(str::parse::<u16>);
            Some((bounds.next()?.ok()?, bounds.next()?.ok()?))
        })
        .unwrap_or((32_768, 60_999));
    match ephemeral {
        (first, _) if first >= LOWEST + 1_000 => (LOWEST, first - 1),
        (_, last) if last <= u16::MAX - 1_000 => (last + 1, u16::MAX),
        (first, last) => panic!(
            "the ephemeral port range {first}-{last} leaves no room for test servers; \
             narrow net.ipv4.ip_local_port_range"
        ),
    }
}

/// The directory of the reservation files: one per user, so that a run as
/// another user on the same machine finds no files it may not open.
fn reservations() -> PathBuf {
    // SAFETY: getuid cannot fail and touches no memory.
    let user = unsafe { libc::getuid() };
    std::env::temp_dir().join(format!("locksmith-test-ports-{user}"))
}

/// The file at `path`, opened and exclusively locked, or `None` when another
/// process (or this one) holds it.
fn reserve(path: PathBuf) -> Option<File> {
    let file = File::options()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .unwrap_or_else(|e| panic!("cannot open {}: {e}", path.display()));
    // SAFETY: flock on a descriptor this function owns; no memory is passed.
    let locked = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0;
    locked.then_some(file)
}

/// A random number: each `RandomState` is seeded afresh by the standard
/// library, which is all the spread needed here.
fn random() -> u64 {
    RandomState::new().build_hasher().finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_port_is_outside_the_ephemeral_range_and_never_given_twice() {
        // The kernel's range, read here on its own rather than through `range`.
        let text = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range").unwrap();
        let bounds: Vec<u16> = text
            .split_whitespace()
            .map(|b| b.parse().unwrap())
            .collect();
        let ephemeral = bounds[0]..=bounds[1];
        let ports: Vec<u16> = (0..50).map(|_| free_port()).collect();
        let mut distinct = ports.clone();
        distinct.sort_unstable();
        distinct.dedup();
        assert_eq!(distinct.len(), ports.len(), "{ports:?}");
        assert!(
            ports.iter().all(|p| !ephemeral.contains(p) && *p >= LOWEST),
            "{ports:?} against the ephemeral range {ephemeral:?}"
        );
    }

    #[test]
    fn a_port_given_out_stays_reserved_until_the_process_exits() {
        // A second open file description conflicts with the first exactly as
        // another process's would.
        let port = free_port();
        let directory = reservations();
        assert!(reserve(directory.join(port.to_string())).is_none());
    }
}
