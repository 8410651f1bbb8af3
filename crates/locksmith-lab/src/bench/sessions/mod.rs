//! (e) Idle sessions: what sessions that do nothing but stay alive cost a
//! locksmith server, and what they do to the clients that work beside them.
//!
//! N sessions are opened on raw session streams (`locksmith-proto`), many
//! to an HTTP/2 connection (`--sessions-per-connection`, within the
//! server's limit), on the member that leads; each sends a heartbeat every
//! third of its TTL, at its own phase, and times the answer. Before they
//! open, with them idle, the foreground handoff (scenario (b)'s loop) runs
//! once without them and once beside them. Reported: each member's CPU
//! (user + system time over the window beside them, from /proc) and memory
//! (PSS) with and without them, and per session; the heartbeat answer p50 /
//! p99 over that window; and the handoff p50 both ways.
//!
//! Raw streams because the client library keeps one session per client
//! and does not time its heartbeats; the server sees the same messages.
//! Only the locksmith server and cluster are measured here: etcd leases,
//! ZooKeeper sessions and Redis watchdog holds would need a load generator
//! of their own each.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use locksmith_proto::v1 as pb;
use pb::locksmith_client::LocksmithClient;
use serde::Serialize;
use tokio::time::Instant;
use tonic::transport::Channel;

use super::scenario::{contended, Settings};
use super::stats::{Samples, Summary};
use super::target::Target;

/// What (e) measured on one backend.
#[derive(Debug, Clone, Serialize)]
pub struct IdleSessions {
    /// Sessions kept open.
    pub sessions: usize,
    /// Sessions per HTTP/2 connection.
    pub per_connection: usize,
    /// Their TTL (ms); each heartbeats every third of it.
    pub ttl_ms: u64,
    /// Heartbeats answered per second over the window.
    pub heartbeats_per_sec: f64,
    /// Time from sending a heartbeat to its answer.
    pub heartbeat: Summary,
    /// Each member's CPU over the window, in % of one core.
    pub member_cpu_percent: Vec<f64>,
    /// Each member's memory (PSS) before the sessions opened, in bytes.
    pub member_memory_before: Vec<u64>,
    /// Each member's memory with the sessions open, in bytes.
    pub member_memory_with: Vec<u64>,
    /// Growth of the most grown member's memory per session, in bytes.
    pub bytes_per_session: f64,
    /// Foreground handoff p50 without idle sessions (µs).
    pub handoff_p50_alone_us: f64,
    /// Foreground handoff p50 beside the idle sessions (µs).
    pub handoff_p50_beside_us: f64,
}

/// (e) against `target`: `sessions` idle sessions of `ttl`,
/// `per_connection` to a connection, beside a handoff loop of `waiters`.
///
/// Cancel safety: dropping it drops the streams; the sessions live on
/// until their TTL runs out on the server.
pub async fn idle_sessions(
    target: &Target,
    sessions: usize,
    per_connection: usize,
    ttl: Duration,
    waiters: usize,
    settings: &Settings,
) -> Result<IdleSessions, String> {
    let members = target
        .spawned
        .as_ref()
        .ok_or("only a server this run started can be measured")?
        .processes()
        .iter()
        .map(|p| p.pid().ok_or("a member is not running"))
        .collect::<Result<Vec<u32>, _>>()?;
    let addresses: Vec<String> = target
        .url
        .split_once("://")
        .ok_or("no scheme in the URL")?
        .1
        .split(',')
        .map(|a| format!("http://{a}"))
        .collect();
    let memory_before: Vec<u64> = members.iter().map(|&p| memory(p)).collect();
    let (alone, _, _) = contended(target, waiters, Duration::ZERO, "idle-alone", settings).await?;

    let leader = leader_address(&addresses, ttl).await?;
    let per_connection = per_connection.max(1);
    let stop = Arc::new(AtomicBool::new(false));
    let window = Arc::new(Mutex::new(None::<Instant>));
    let samples = Arc::new(Mutex::new(Samples::new()));
    let mut keepers = tokio::task::JoinSet::new();
    let mut opened = 0;
    while opened < sessions {
        let channel = Channel::from_shared(leader.clone())
            .map_err(|e| e.to_string())?
            .connect()
            .await
            .map_err(|e| format!("connect to {leader}: {e}"))?;
        let here = per_connection.min(sessions - opened);
        for i in 0..here {
            let stream = Session::open(channel.clone(), ttl).await?;
            let phase = ttl / 3 * (opened + i) as u32 / sessions as u32;
            let (stop, window, samples) = (stop.clone(), window.clone(), samples.clone());
            keepers.spawn(stream.keep(ttl / 3, phase, stop, window, samples));
        }
        opened += here;
    }
    // A whole round of heartbeats before the window opens.
    tokio::time::sleep(ttl / 3 + Duration::from_millis(200)).await;
    let memory_with: Vec<u64> = members.iter().map(|&p| memory(p)).collect();
    let cpu_before: Vec<u64> = members.iter().map(|&p| cpu_ticks(p)).collect();
    let started = Instant::now();
    *window.lock().expect("window") = Some(started);
    let (beside, _, _) =
        contended(target, waiters, Duration::ZERO, "idle-beside", settings).await?;
    let elapsed = started.elapsed();
    *window.lock().expect("window") = None;
    let cpu_after: Vec<u64> = members.iter().map(|&p| cpu_ticks(p)).collect();
    stop.store(true, Ordering::Relaxed);
    let mut failures = Vec::new();
    while let Some(kept) = keepers.join_next().await {
        if let Ok(Err(error)) = kept {
            failures.push(error);
        }
    }
    if let Some(first) = failures.first() {
        return Err(format!(
            "{} sessions failed, first: {first}",
            failures.len()
        ));
    }
    let ticks = clock_ticks_per_sec();
    let member_cpu_percent = cpu_before
        .iter()
        .zip(&cpu_after)
        .map(|(b, a)| (a - b) as f64 / ticks / elapsed.as_secs_f64() * 100.0)
        .collect();
    let grown = memory_before
        .iter()
        .zip(&memory_with)
        .map(|(b, w)| w.saturating_sub(*b))
        .max()
        .unwrap_or(0);
    let mut samples = std::mem::take(&mut *samples.lock().expect("samples"));
    Ok(IdleSessions {
        sessions,
        per_connection,
        ttl_ms: ttl.as_millis() as u64,
        heartbeats_per_sec: samples.len() as f64 / elapsed.as_secs_f64(),
        heartbeat: samples.summary(),
        member_cpu_percent,
        member_memory_before: memory_before,
        member_memory_with: memory_with,
        bytes_per_session: grown as f64 / sessions as f64,
        handoff_p50_alone_us: alone.handoff.p50_us,
        handoff_p50_beside_us: beside.handoff.p50_us,
    })
}

/// The address of the member that opens sessions (the leader).
async fn leader_address(addresses: &[String], ttl: Duration) -> Result<String, String> {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        for address in addresses {
            let Ok(channel) = Channel::from_shared(address.clone())
                .map_err(|e| e.to_string())?
                .connect()
                .await
            else {
                continue;
            };
            if let Ok(session) = Session::open(channel, ttl).await {
                session.close();
                return Ok(address.clone());
            }
        }
        if Instant::now() > deadline {
            return Err("no member opens sessions".into());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// One raw session stream.
struct Session {
    tx: tokio::sync::mpsc::UnboundedSender<pb::ClientBatch>,
    inbound: tonic::Streaming<pb::ServerBatch>,
}

impl Session {
    /// Opens a session of `ttl` on `channel`.
    async fn open(channel: Channel, ttl: Duration) -> Result<Session, String> {
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        let outbound = futures::stream::unfold(rx, |mut rx| async move {
            rx.recv().await.map(|batch| (batch, rx))
        });
        let open = pb::client_message::Kind::Open(pb::OpenSession {
            client_name: "locksmith-lab idle".into(),
            host: "bench".into(),
            ttl_ms: ttl.as_millis() as u64,
        });
        let session = Session {
            inbound: LocksmithClient::new(channel)
                .session(outbound)
                .await
                .map_err(|e| e.to_string())?
                .into_inner(),
            tx,
        };
        session.send(open);
        let mut session = session;
        match session.next().await? {
            pb::server_message::Kind::Opened(_) => Ok(session),
            other => Err(format!("expected the session to open, got {other:?}")),
        }
    }

    fn send(&self, kind: pb::client_message::Kind) {
        let batch = pb::ClientBatch {
            messages: vec![pb::ClientMessage { kind: Some(kind) }],
            ..Default::default()
        };
        let _ = self.tx.send(batch);
    }

    /// The next message (the stream's answers come one to a batch here:
    /// an idle session gets nothing but heartbeat answers).
    async fn next(&mut self) -> Result<pb::server_message::Kind, String> {
        let batch = self
            .inbound
            .message()
            .await
            .map_err(|status| status.message().to_owned())?
            .ok_or("the stream ended")?;
        batch
            .messages
            .into_iter()
            .next()
            .and_then(|m| m.kind)
            .ok_or_else(|| "an empty batch".into())
    }

    /// Closes the session.
    fn close(self) {
        self.send(pb::client_message::Kind::Close(pb::Close {}));
    }

    /// Heartbeats every `every`, first after `phase`, until `stop`; the
    /// answer times fall in `samples` while `window` is open. Closes the
    /// session at the end.
    async fn keep(
        mut self,
        every: Duration,
        phase: Duration,
        stop: Arc<AtomicBool>,
        window: Arc<Mutex<Option<Instant>>>,
        samples: Arc<Mutex<Samples>>,
    ) -> Result<(), String> {
        let mut tick = tokio::time::interval_at(Instant::now() + phase, every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        while !stop.load(Ordering::Relaxed) {
            tick.tick().await;
            let sent = Instant::now();
            self.send(pb::client_message::Kind::Heartbeat(pb::Heartbeat {}));
            loop {
                if let pb::server_message::Kind::Heartbeat(_) = self.next().await? {
                    break;
                }
            }
            let answered = Instant::now();
            let open = *window.lock().expect("window");
            if open.is_some_and(|opened| sent >= opened) {
                samples.lock().expect("samples").push(answered - sent);
            }
        }
        self.close();
        Ok(())
    }
}

/// User + system time of `pid` so far, in clock ticks (/proc/PID/stat).
fn cpu_ticks(pid: u32) -> u64 {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return 0;
    };
    // Fields after the command name (in parentheses): utime and stime are
    // the 12th and 13th.
    let after = stat.rfind(')').map_or("", |at| &stat[at + 2..]);
    let fields: Vec<&str> = after.split_whitespace().collect();
    let field = |i: usize| {
        fields
            .get(i)
            .and_then(|f| f.parse::<u64>().ok())
            .unwrap_or(0)
    };
    field(11) + field(12)
}

/// Clock ticks per second of /proc's CPU times: `USER_HZ`, which Linux
/// fixes at 100 for user space on every architecture it reports it.
fn clock_ticks_per_sec() -> f64 {
    100.0
}

/// The memory (PSS) of the process tree of `pid`, in bytes.
fn memory(pid: u32) -> u64 {
    super::target::tree_memory(pid).unwrap_or(0)
}
