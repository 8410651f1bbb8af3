//! The clients: the real client library (`locksmith`, its `locksmith://`
//! backend) on simulated hosts, acquiring, holding, releasing and timing
//! out on a few hot locks, recording what they see (module `history`).
//!
//! With the mixed workload ([`ClientSetup::mixed`]) the hot locks are of
//! three kinds, by their number: plain locks, taken with the session or
//! with a fixed lease that the holder may extend or let run out; read-write
//! locks, read or written; and semaphores of [`PERMITS`] permits.

use std::time::Duration;

use locksmith::{Client, ConnectOptions, Error, Lock};
use rand::rngs::SmallRng;
use rand::Rng;

use crate::history::{Event, History, Kind, Op, Ret, Want};

/// What one client does.
#[derive(Debug, Clone)]
pub struct ClientSetup {
    /// Its number.
    pub id: u32,
    /// `locksmith://member1:7420,...`
    pub url: String,
    /// The names of the hot locks.
    pub locks: Vec<String>,
    /// Its session's TTL.
    pub session_ttl: Duration,
    /// It starts no new operation after this much simulated time.
    pub until: Duration,
    /// Read-write locks, semaphores and leases too, not plain locks only.
    pub mixed: bool,
}

/// The permits of each semaphore of the mixed workload.
pub const PERMITS: u32 = 2;

/// What one acquire asks for: the lock to call it on, what the checks
/// know it wants, and the lease it has if any.
fn choose(
    client: &Client,
    setup: &ClientSetup,
    lock: usize,
    rng: &mut SmallRng,
) -> (Lock, Want, Option<Duration>) {
    let name = setup.locks[lock].as_str();
    if !setup.mixed {
        return (client.lock(name), Want::Exclusive, None);
    }
    match lock % 3 {
        0 if rng.gen_bool(0.5) => {
            let lease = Duration::from_millis(rng.gen_range(200..1200));
            (client.lock(name).lease(lease), Want::Exclusive, Some(lease))
        }
        0 => (client.lock(name), Want::Exclusive, None),
        1 if rng.gen_bool(0.6) => (client.rw_lock(name).read(), Want::Shared, None),
        1 => (client.rw_lock(name).write(), Want::Exclusive, None),
        _ => (
            client.semaphore(name, PERMITS),
            Want::Permit { of: PERMITS },
            None,
        ),
    }
}

/// One client's thread of operations (see [`Event::thread`]).
struct Recorder {
    client: u32,
    thread: u64,
    history: History,
}

impl Recorder {
    fn record(&self, lock: usize, kind: Kind) {
        self.history.record(Event {
            at: turmoil::sim_elapsed().unwrap_or_default(),
            client: self.client,
            thread: self.thread,
            lock,
            kind,
        });
    }

    /// The last operation's outcome is unknown: it stays pending, and the
    /// client goes on as a new thread.
    fn unknown(&mut self) {
        self.thread += 1;
    }
}

/// Runs the client until `setup.until`; every hold it has is released or
/// lost by then.
pub(crate) async fn run_client(
    setup: ClientSetup,
    mut rng: SmallRng,
    history: History,
) -> turmoil::Result {
    let options = ConnectOptions::default()
        .session_ttl(setup.session_ttl)
        .client_name(format!("client{}", setup.id))
        .host(format!("client{}", setup.id))
        .connector(crate::cluster::connector());
    let mut recorder = Recorder {
        client: setup.id,
        thread: u64::from(setup.id) << 32,
        history,
    };
    let client = loop {
        match Client::connect_with(&setup.url, options.clone()).await {
            Ok(client) => break client,
            Err(error) => {
                tracing::debug!(client = setup.id, %error, "connect failed; again");
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    };
    while turmoil::sim_elapsed().unwrap_or_default() < setup.until {
        let lock = rng.gen_range(0..setup.locks.len());
        let wait = match rng.gen_range(0..10) {
            0 => Duration::ZERO,
            _ => Duration::from_millis(rng.gen_range(10..1500)),
        };
        let (chosen, want, lease) = choose(&client, &setup, lock, &mut rng);
        if let Some(lease) = lease {
            tracing::debug!(
                client = setup.id,
                lock,
                ?lease,
                "the next acquire has a lease"
            );
        }
        recorder.record(lock, Kind::Invoke(Op::Acquire { want }));
        let guard = match chosen.acquire_timeout(wait).await {
            Ok(guard) => guard,
            Err(Error::Timeout(_)) => {
                recorder.record(lock, Kind::Return(Ret::TimedOut));
                continue;
            }
            Err(error) => {
                tracing::debug!(client = setup.id, %error, "acquire failed");
                recorder.unknown();
                tokio::time::sleep(Duration::from_millis(rng.gen_range(10..300))).await;
                continue;
            }
        };
        let token = guard.fencing_token();
        recorder.record(lock, Kind::Return(Ret::Granted { token }));
        // A leased hold may outlive its lease (then it must be told it is
        // lost), or be extended half way through.
        let hold = match lease {
            Some(lease) => {
                Duration::from_millis(rng.gen_range(0..lease.as_millis() as u64 * 3 / 2))
            }
            None => Duration::from_millis(rng.gen_range(0..400)),
        };
        let extend_at = lease
            .filter(|_| rng.gen_bool(0.5))
            .map(|lease| (hold / 2, lease));
        let mut lost = false;
        for (part, extension) in match extend_at {
            Some((half, lease)) => vec![(half, Some(lease)), (hold - half, None)],
            None => vec![(hold, None)],
        } {
            tokio::select! {
                _ = guard.lost() => {
                    recorder.record(lock, Kind::Invoke(Op::Lost { token }));
                    recorder.record(lock, Kind::Return(Ret::Noted));
                    lost = true;
                }
                () = tokio::time::sleep(part) => {}
            }
            if lost {
                break;
            }
            let Some(lease) = extension else { continue };
            recorder.record(lock, Kind::Invoke(Op::Extend { token }));
            // Told of a loss while the extension is in flight, the client
            // knows its hold is gone whatever the answer: the extension's
            // outcome stays unknown.
            tokio::select! {
                _ = guard.lost() => {
                    recorder.unknown();
                    recorder.record(lock, Kind::Invoke(Op::Lost { token }));
                    recorder.record(lock, Kind::Return(Ret::Noted));
                    lost = true;
                }
                extended = guard.extend(lease) => match extended {
                    Ok(()) => recorder.record(lock, Kind::Return(Ret::Extended)),
                    Err(Error::NotOwner { .. } | Error::NotHeld { .. } | Error::Lost(_)) => {
                        recorder.record(lock, Kind::Return(Ret::NotHeld))
                    }
                    Err(error) => {
                        tracing::debug!(client = setup.id, %error, "extend failed");
                        recorder.unknown();
                    }
                },
            }
            if lost {
                break;
            }
        }
        if lost {
            drop(guard);
            continue;
        }
        recorder.record(lock, Kind::Invoke(Op::Release { token }));
        match guard.release().await {
            Ok(()) => recorder.record(lock, Kind::Return(Ret::Released)),
            Err(Error::NotOwner { .. } | Error::NotHeld { .. } | Error::Lost(_)) => {
                recorder.record(lock, Kind::Return(Ret::NotHeld))
            }
            Err(error) => {
                tracing::debug!(client = setup.id, %error, "release failed");
                recorder.unknown();
            }
        }
    }
    let _ = client.close().await;
    Ok(())
}
