//! The clients: the real client library (`locksmith`, its `locksmith://`
//! backend) on simulated hosts, acquiring, holding, releasing and timing
//! out on a few hot locks, recording what they see (module `history`).

use std::time::Duration;

use locksmith::{Client, ConnectOptions, Error};
use rand::rngs::SmallRng;
use rand::Rng;

use crate::history::{Event, History, Kind, Op, Ret};

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
        recorder.record(lock, Kind::Invoke(Op::Acquire));
        let guard = match client.lock(&setup.locks[lock]).acquire_timeout(wait).await {
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
        let hold = Duration::from_millis(rng.gen_range(0..400));
        tokio::select! {
            _ = guard.lost() => {
                recorder.record(lock, Kind::Invoke(Op::Lost { token }));
                recorder.record(lock, Kind::Return(Ret::Noted));
                drop(guard);
                continue;
            }
            () = tokio::time::sleep(hold) => {}
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
