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
    /// A calm run: the client also keeps a lock of its own all run long,
    /// which it loses only with its session.
    pub calm: bool,
    /// A leased holder that extends sends the extension in the last 15 %
    /// of the lease it trusts, racing the lease's expiry on the leader.
    pub lease_edge: bool,
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

/// Holds taken with the session (no lease of their own) that their
/// clients were told are lost: when, by which client, which hold. A client
/// loses such a hold only with its session.
pub(crate) type SessionsLost = std::rc::Rc<std::cell::RefCell<Vec<(Duration, u32, String)>>>;

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

    /// Records `kind` on the client's earlier thread `thread`.
    fn record_on(&self, thread: u64, lock: usize, kind: Kind) {
        Recorder {
            thread,
            history: self.history.clone(),
            ..*self
        }
        .record(lock, kind);
    }

    /// The last operation's outcome is unknown: it stays pending, and the
    /// client goes on as a new thread.
    fn unknown(&mut self) {
        self.thread += 1;
    }

    /// The client dropped the guard of its lost hold `token`: a release in
    /// the background, on a thread of its own that it never returns on.
    fn dropped(&mut self, lock: usize, token: u64) {
        self.unknown();
        self.record(lock, Kind::Invoke(Op::Drop { token }));
        self.unknown();
    }

    /// The client was just told its hold `token` is lost.
    fn lost(&self, lock: usize, token: u64, guard: &locksmith::Guard) {
        let with_session = guard.lost_cause() != Some(locksmith::LostCause::LeaseExpired);
        self.record(
            lock,
            Kind::Invoke(Op::Lost {
                token,
                with_session,
            }),
        );
        self.record(lock, Kind::Return(Ret::Noted));
    }
}

/// What an extension's answer tells the checks: `None` if its outcome is
/// unknown.
fn extension_outcome(extended: locksmith::Result<()>) -> Option<Ret> {
    match extended {
        Ok(()) => Some(Ret::Extended),
        Err(Error::NotOwner { .. } | Error::NotHeld { .. } | Error::Lost(_)) => Some(Ret::NotHeld),
        Err(error) => {
            tracing::debug!(%error, "extend failed");
            None
        }
    }
}

/// Keeps the guard of a hold the client was told is lost until `until`,
/// when the lease the server last answered for ends: dropped earlier, it
/// would be released, and the server would rightly hand it on. Its
/// session is watched meanwhile (through a lock of the client's own, held
/// with the session): a session that ends takes the hold with it, which
/// the checks are told.
///
/// Cancel safety: dropped, it records nothing more; the watching lock is
/// released in the background as its guard drops.
async fn keep_until(
    client: &Client,
    setup: &ClientSetup,
    recorder: &mut Recorder,
    lock: usize,
    token: u64,
    until: tokio::time::Instant,
) {
    let session_lost = |recorder: &mut Recorder| {
        recorder.record(
            lock,
            Kind::Invoke(Op::Lost {
                token,
                with_session: true,
            }),
        );
        recorder.record(lock, Kind::Return(Ret::Noted));
    };
    let watch = client.lock(format!("watch/{}", setup.id));
    let wait = until.saturating_duration_since(tokio::time::Instant::now());
    match watch.acquire_timeout(wait).await {
        Ok(watching) => {
            tokio::select! {
                _ = watching.lost() => session_lost(recorder),
                () = tokio::time::sleep_until(until) => {}
            }
            drop(watching);
        }
        Err(Error::Timeout(_)) => {}
        // Refused: perhaps the session ended (the client learns that no
        // later than the server ends it).
        Err(_) => session_lost(recorder),
    }
}

/// Runs the client until `setup.until`; every hold it has is released or
/// lost by then.
///
/// Cancel safety: dropped (its host crashed or the run ended), its guards
/// release in the background and its last operation stays pending in the
/// history.
pub(crate) async fn run_client(
    setup: ClientSetup,
    mut rng: SmallRng,
    history: History,
    sessions_lost: SessionsLost,
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
    let kept = match setup.calm {
        true => Some(loop {
            let own = client.lock(format!("own/{}", setup.id));
            match own.acquire_timeout(Duration::from_secs(5)).await {
                Ok(guard) => break guard,
                Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
            }
        }),
        false => None,
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
        let lease_ms = lease.map(|lease| lease.as_millis() as u64);
        recorder.record(lock, Kind::Invoke(Op::Acquire { want, lease_ms }));
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
            .map(|lease| match setup.lease_edge {
                false => (hold / 2, lease),
                true => {
                    let trusted = guard.remaining_lease().unwrap_or_default();
                    let before_end = lease.mul_f64(rng.gen_range(0.0..0.15));
                    (trusted.saturating_sub(before_end), lease)
                }
            });
        let mut lost = false;
        // Until when the server said the hold stands, by its latest answered
        // extension (sent + lease).
        let mut extended_until = None;
        for (part, extension) in match extend_at {
            Some((half, lease)) => vec![(half, Some(lease)), (hold.saturating_sub(half), None)],
            None => vec![(hold, None)],
        } {
            tokio::select! {
                _ = guard.lost() => {
                    recorder.lost(lock, token, &guard);
                    lost = true;
                }
                () = tokio::time::sleep(part) => {}
            }
            if lost {
                if lease.is_none() {
                    let at = turmoil::sim_elapsed().unwrap_or_default();
                    let hold = format!("its hold of {} (token {token})", setup.locks[lock]);
                    sessions_lost.borrow_mut().push((at, setup.id, hold));
                }
                break;
            }
            let Some(lease) = extension else { continue };
            let sent = tokio::time::Instant::now();
            let lease_ms = lease.as_millis() as u64;
            recorder.record(lock, Kind::Invoke(Op::Extend { token, lease_ms }));
            let extension = guard.extend(lease);
            tokio::pin!(extension);
            let ret = tokio::select! {
                _ = guard.lost() => {
                    // Told of a loss while the extension is in flight, the
                    // client knows its hold is gone whatever the answer; it
                    // notes the loss beside the extension and still hears
                    // the answer out, which the server must then keep
                    // (`check`, "leases are kept").
                    let extending = recorder.thread;
                    recorder.unknown();
                    recorder.lost(lock, token, &guard);
                    lost = true;
                    let answer = tokio::time::timeout_at(sent + lease, &mut extension).await;
                    let ret = answer.ok().and_then(extension_outcome);
                    if let Some(ret) = ret {
                        recorder.record_on(extending, lock, Kind::Return(ret));
                    }
                    ret
                }
                extended = &mut extension => {
                    let ret = extension_outcome(extended);
                    match ret {
                        Some(ret) => recorder.record(lock, Kind::Return(ret)),
                        None => recorder.unknown(),
                    }
                    ret
                }
            };
            if ret == Some(Ret::Extended) {
                extended_until = Some(sent + lease);
            }
            if lost {
                break;
            }
        }
        if lost {
            // Told of the loss before the lease the server last answered
            // for ran out (its answer came late, or the loss came from the
            // server): the guard is kept until then, so that its release
            // cannot be why the lock moves on earlier.
            if let Some(until) = extended_until.filter(|&until| until > tokio::time::Instant::now())
            {
                keep_until(&client, &setup, &mut recorder, lock, token, until).await;
            }
            drop(guard);
            recorder.dropped(lock, token);
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
    if let Some(kept) = kept {
        if let Some(cause) = kept.lost_cause() {
            let at = turmoil::sim_elapsed().unwrap_or_default();
            let hold = format!("the lock it kept all run ({cause:?})");
            sessions_lost.borrow_mut().push((at, setup.id, hold));
        }
        let _ = kept.release().await;
    }
    let _ = client.close().await;
    Ok(())
}

/// How long the prober waits for the locks (all at once): past the longest
/// a client's last hold runs (a wait of 1.5 s, a hold of 1.8 s), a session
/// whose close did not arrive (its TTL), and a new leader's grace.
const PROBE_WAIT: Duration = Duration::from_secs(15);

/// The prober: once the clients stop starting operations (`setup.until`),
/// a fresh client takes every hot lock whole (a semaphore's every permit,
/// a read-write lock's write side), every lock at once, and lets it go.
/// Every hold the clients had ends by then, released, closed or expired,
/// so a lock still not free after [`PROBE_WAIT`] is held by a session that
/// never ends: each such lock is a violation in `stuck`. Its operations join the history as
/// client 0's.
///
/// Cancel safety: dropped, its guards release in the background and its
/// last operations stay pending in the history.
pub(crate) async fn run_prober(
    setup: ClientSetup,
    history: History,
    stuck: std::rc::Rc<std::cell::RefCell<Vec<crate::check::Violation>>>,
) -> turmoil::Result {
    tokio::time::sleep(setup.until).await;
    let options = ConnectOptions::default()
        .session_ttl(setup.session_ttl)
        .client_name("prober")
        .host("prober")
        .connector(crate::cluster::connector());
    // One client per permit: a semaphore's permits are taken side by side.
    let mut clients = Vec::new();
    for _ in 0..PERMITS {
        loop {
            match Client::connect_with(&setup.url, options.clone()).await {
                Ok(client) => break clients.push(client),
                Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
            }
        }
    }
    // Every lock at once: each gets its PROBE_WAIT from the moment the
    // clients stopped, and a run that leaves them all stuck ends one wait
    // later, not one per lock.
    let probes = (0..setup.locks.len()).map(|lock| {
        let (clients, history, stuck, setup) = (&clients, &history, &stuck, &setup);
        async move {
            let name = setup.locks[lock].as_str();
            let wanted: Vec<(Lock, Want)> = match (setup.mixed, lock % 3) {
                (true, 1) => vec![(clients[0].rw_lock(name).write(), Want::Exclusive)],
                (true, 2) => clients
                    .iter()
                    .map(|client| {
                        (
                            client.semaphore(name, PERMITS),
                            Want::Permit { of: PERMITS },
                        )
                    })
                    .collect(),
                _ => vec![(clients[0].lock(name), Want::Exclusive)],
            };
            let takes = wanted
                .into_iter()
                .enumerate()
                .map(|(thread, (chosen, want))| {
                    let recorder = Recorder {
                        client: 0,
                        thread: thread as u64 + (lock as u64) * u64::from(PERMITS),
                        history: history.clone(),
                    };
                    async move {
                        recorder.record(
                            lock,
                            Kind::Invoke(Op::Acquire {
                                want,
                                lease_ms: None,
                            }),
                        );
                        match chosen.acquire_timeout(PROBE_WAIT).await {
                            Ok(guard) => {
                                let token = guard.fencing_token();
                                recorder.record(lock, Kind::Return(Ret::Granted { token }));
                                Ok((guard, recorder, token))
                            }
                            Err(error) => {
                                if matches!(error, Error::Timeout(_)) {
                                    recorder.record(lock, Kind::Return(Ret::TimedOut));
                                }
                                Err(error)
                            }
                        }
                    }
                });
            let mut taken = Vec::new();
            for result in futures::future::join_all(takes).await {
                match result {
                    Ok(held) => taken.push(held),
                    Err(error) => stuck.borrow_mut().push(crate::check::Violation {
                        rule: "locks are free once the clients leave",
                        lock,
                        detail: format!(
                            "{name} not granted to a fresh client within {PROBE_WAIT:?} after the \
                         clients stopped: {error}"
                        ),
                    }),
                }
            }
            for (guard, recorder, token) in taken {
                recorder.record(lock, Kind::Invoke(Op::Release { token }));
                match guard.release().await {
                    Ok(()) => recorder.record(lock, Kind::Return(Ret::Released)),
                    Err(Error::NotOwner { .. } | Error::NotHeld { .. } | Error::Lost(_)) => {
                        recorder.record(lock, Kind::Return(Ret::NotHeld))
                    }
                    Err(_) => {}
                }
            }
        }
    });
    futures::future::join_all(probes).await;
    for client in clients {
        let _ = client.close().await;
    }
    Ok(())
}
