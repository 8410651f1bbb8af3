//! One torture client process: `locksmith-lab torture --client-mode …`, started
//! (and killed, paused, respawned) by the coordinator.
//!
//! It loops: acquire → `Begin` write to the fenced resource → work for the
//! hold time → `End` write carrying (client, token, start, end) → release,
//! reporting every step to the resource. It is a *careful* client: its work
//! stops the moment the guard's lost signal fires, and it checks the signal
//! right before each write, skipping the write (an `Abort`) when the hold is
//! known to be lost. What it cannot see, a pause between that check and the
//! write, is exactly what the fencing token is for.

use std::net::SocketAddr;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use locksmith::{Client, ConnectOptions, Guard};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader, Lines};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::TcpStream;
use tokio::sync::Mutex;

use super::protocol::{now, Phase, Reply, Request};

/// What the coordinator tells a client process.
#[derive(Debug, Clone)]
pub struct ClientConfig {
    /// Slot number.
    pub id: u32,
    /// Respawn count of the slot.
    pub incarnation: u32,
    /// Backend URL (through the slot's fault proxy).
    pub url: String,
    /// The fenced resource.
    pub resource: SocketAddr,
    /// Locks to take turns on.
    pub locks: Vec<String>,
    /// Time inside the critical section.
    pub hold: Duration,
    /// Session TTL.
    pub session_ttl: Duration,
}

/// The connection to the resource: one request, one reply.
struct Resource {
    lines: Lines<BufReader<OwnedReadHalf>>,
    write: OwnedWriteHalf,
}

impl Resource {
    /// Sends `request` and reads its reply.
    ///
    /// Cancel safety: not cancel safe: dropped after (part of) the write, the
    /// request may have been applied with its reply left unread, which the
    /// next call would take for its own.
    async fn call(&mut self, request: &Request) -> std::io::Result<Reply> {
        let mut line = serde_json::to_string(request).expect("requests serialize");
        line.push('\n');
        self.write.write_all(line.as_bytes()).await?;
        let reply = self
            .lines
            .next_line()
            .await?
            .ok_or_else(|| std::io::Error::other("the resource closed the connection"))?;
        serde_json::from_str(&reply).map_err(std::io::Error::other)
    }
}

type Shared = Arc<Mutex<Resource>>;

/// Sends `request` on the shared connection and reads its reply.
///
/// Cancel safety: as `Resource::call` once it has the connection; not cancel
/// safe.
async fn call(resource: &Shared, request: Request) -> std::io::Result<Reply> {
    resource.lock().await.call(&request).await
}

/// Runs the client loop until the resource says stop. Exits 0 then; 1 when
/// the resource (the coordinator) is gone.
///
/// Cancel safety: as `run_loop`; the process exits when it returns.
pub async fn run(config: ClientConfig) -> ExitCode {
    match run_loop(&config).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("torture client {}: {error}", config.id);
            ExitCode::FAILURE
        }
    }
}

/// Reports `Hello`, then takes turns on the locks until the resource says
/// stop.
///
/// Cancel safety: dropped midway, a held guard's drop releases in the
/// background and the client's session ends; the resource sees the
/// connection close (as when the process is killed).
async fn run_loop(config: &ClientConfig) -> std::io::Result<()> {
    let stream = TcpStream::connect(config.resource).await?;
    stream.set_nodelay(true)?;
    let (read, write) = stream.into_split();
    let resource: Shared = Arc::new(Mutex::new(Resource {
        lines: BufReader::new(read).lines(),
        write,
    }));
    call(
        &resource,
        Request::Hello {
            client: config.id,
            incarnation: config.incarnation,
            pid: std::process::id(),
        },
    )
    .await?;
    let options = ConnectOptions::default()
        .session_ttl(config.session_ttl)
        .client_name(format!(
            "torture-client-{}.{}",
            config.id, config.incarnation
        ));
    let mut client: Option<Client> = None;
    let mut errors_in_a_row = 0u32;
    for round in 0u64.. {
        let lock = &config.locks[(config.id as u64 + round) as usize % config.locks.len()];
        let reply = call(
            &resource,
            Request::Waiting {
                lock: lock.clone(),
                at: now(),
            },
        )
        .await?;
        if reply.stop {
            break;
        }
        let connected = match &client {
            Some(client) => Ok(client.clone()),
            None => Client::connect_with(&config.url, options.clone()).await,
        };
        let asked = now();
        let outcome = match connected {
            Ok(connected) => {
                client = Some(connected.clone());
                connected.lock(lock.as_str()).acquire().await
            }
            Err(error) => Err(error),
        };
        match outcome {
            Ok(guard) => {
                errors_in_a_row = 0;
                critical_section(&resource, config, lock, guard, asked).await?;
            }
            Err(error) => {
                call(
                    &resource,
                    Request::Failed {
                        lock: lock.clone(),
                        error: error.to_string(),
                        at: now(),
                    },
                )
                .await?;
                errors_in_a_row += 1;
                // A client that keeps failing starts over with a new connection.
                if errors_in_a_row >= 3 {
                    if let Some(old) = client.take() {
                        let _ = tokio::time::timeout(Duration::from_secs(1), old.close()).await;
                    }
                }
                tokio::time::sleep(Duration::from_millis(
                    50 * u64::from(errors_in_a_row.min(10)),
                ))
                .await;
            }
        }
    }
    if let Some(client) = client {
        let _ = tokio::time::timeout(Duration::from_secs(2), client.close()).await;
    }
    Ok(())
}

/// Reports the grant, writes `Begin`, works, writes `End`, releases.
///
/// Cancel safety: not cancel safe: dropped midway, the guard's drop releases
/// in the background without `End` or `Released` being reported, and a call
/// cut short leaves the resource connection out of step (`Resource::call`).
async fn critical_section(
    resource: &Shared,
    config: &ClientConfig,
    lock: &str,
    guard: Guard,
    asked: u64,
) -> std::io::Result<()> {
    let token = guard.fencing_token();
    call(
        resource,
        Request::Granted {
            lock: lock.to_owned(),
            token,
            asked,
            at: now(),
        },
    )
    .await?;
    // Note when the lost signal fires (until the release, which fires it too);
    // reported after the critical section, with the time it fired.
    let lost = guard.lost_signal();
    let fired: Arc<std::sync::Mutex<Option<(u64, String)>>> = Arc::default();
    let watcher = {
        let fired = fired.clone();
        tokio::spawn(async move {
            let reason = lost.fired().await;
            *fired.lock().unwrap_or_else(|p| p.into_inner()) = Some((now(), reason));
        })
    };
    let start = now();
    let lost_reason = || guard.lost_signal().reason();
    let entered = match lost_reason() {
        Some(reason) => {
            abort(resource, lock, token, reason).await?;
            None
        }
        None => {
            let reply = call(
                resource,
                Request::Write {
                    lock: lock.to_owned(),
                    token,
                    phase: Phase::Begin,
                    start,
                    end: start,
                },
            )
            .await?;
            reply
                .accepted
                .then_some(Duration::from_millis(reply.linger_ms))
        }
    };
    if let Some(linger) = entered {
        // The work: it stops the moment the hold is lost, as code that must
        // not write without the lock selects on `Guard::lost`. A pause between
        // the check below and the write is what fencing is for.
        tokio::select! {
            _ = tokio::time::sleep(config.hold + linger) => {}
            _ = guard.lost() => {}
        }
        match lost_reason() {
            Some(reason) => abort(resource, lock, token, reason).await?,
            None => {
                call(
                    resource,
                    Request::Write {
                        lock: lock.to_owned(),
                        token,
                        phase: Phase::End,
                        start,
                        end: now(),
                    },
                )
                .await?;
            }
        }
    }
    watcher.abort();
    let lost = fired
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .take()
        .or_else(|| lost_reason().map(|reason| (now(), reason)));
    if let Some((at, reason)) = lost {
        call(
            resource,
            Request::Lost {
                lock: lock.to_owned(),
                token,
                reason,
                at,
            },
        )
        .await?;
    }
    let released = guard.release().await;
    call(
        resource,
        Request::Released {
            lock: lock.to_owned(),
            token,
            error: released.err().map(|e| e.to_string()),
            at: now(),
        },
    )
    .await?;
    Ok(())
}

/// Reports that the write under `token` is skipped because the hold was lost.
///
/// Cancel safety: as `Resource::call`; not cancel safe.
async fn abort(resource: &Shared, lock: &str, token: u64, reason: String) -> std::io::Result<()> {
    call(
        resource,
        Request::Abort {
            lock: lock.to_owned(),
            token,
            reason,
        },
    )
    .await
    .map(drop)
}
