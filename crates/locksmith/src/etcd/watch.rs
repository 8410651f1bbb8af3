//! One multiplexed watch stream per client, for delete events only.
//!
//! Waiters watch the key they queue behind (etcd's `waitDelete`) from the
//! current revision, so that etcd puts the watcher straight into its *synced*
//! group (a watcher that starts at an older revision waits for etcd's
//! 100 ms catch-up loop, which would stall a handoff), and close the gap
//! since their read with one check when etcd reports the watch created at a
//! later revision. Holders watch
//! their own key so that `lost()` fires the moment it is deleted (lease revoked
//! or expired, `etcdctl del`, a forced release). All of them share one gRPC
//! watch stream, told apart by client-chosen watch ids (etcd 3.4+), the way
//! Go's clientv3 watcher multiplexes. When the stream breaks it is reopened and
//! every watch resumes from the revision after the last event it saw, so no
//! delete is missed; a watch whose start revision was compacted away is
//! re-checked by reading the key.
//!
//! A hold's watch is *deferred*: it reaches etcd only if the hold is still
//! alive about [`DEFER`] after its grant (promotions are batched), starting
//! from the revision after the grant, so a delete in between is still
//! reported, just later. Short holds (acquire, a few writes, release) thus
//! cost etcd no watcher at all; waiters' watches are created at once.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use tokio::sync::{mpsc, Notify};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::rpc::etcdserverpb::watch_create_request::FilterType;
use super::rpc::etcdserverpb::{WatchCreateRequest, WatchResponse};
use super::rpc::mvccpb::event::EventType;
use super::rpc::{self, EtcdClient, WatchStream};
use super::BACKEND;
use crate::backend::LostSignal;
use crate::lost::LostCause;

/// Pause before reopening a broken watch stream.
const RETRY: Duration = Duration::from_millis(200);

/// How long a hold's watch waits before it is registered with etcd.
pub(crate) const DEFER: Duration = Duration::from_millis(100);

/// What a delete event does.
#[derive(Clone)]
pub(crate) enum Sink {
    /// Tells a waiter what happened: the watch exists (and since which
    /// revision), a delete, or a reset (a watch that cannot fire any more).
    Wake(mpsc::UnboundedSender<Wake>),
    /// Fires a hold's lost signal while `armed` (a release disarms it first).
    /// On a reset the hub reads the key: still there with `token` as create
    /// revision means still held.
    Lost {
        /// The hold's signal.
        signal: LostSignal,
        /// Cleared by release, so our own delete is not a loss.
        armed: Arc<AtomicBool>,
        /// The fencing token (create revision) of the key.
        token: i64,
    },
}

/// What a waiter hears from its watch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Wake {
    /// etcd created the watch when the store was at this revision; deletes
    /// after it will be reported.
    Created(i64),
    /// A watched key was deleted, at this revision.
    Deleted(i64),
    /// The watch was cancelled by etcd: re-read instead of waiting.
    Reset,
}

struct Spec {
    key: Vec<u8>,
    range_end: Option<Vec<u8>>,
    /// Next revision to watch from.
    start: i64,
    sink: Sink,
}

enum Command {
    Add(i64, Spec),
    Cancel(i64),
}

/// The handle of the hub; cheap to share.
pub(crate) struct WatchHub {
    commands: mpsc::UnboundedSender<Command>,
    next_id: Arc<AtomicI64>,
    deferred: Arc<Deferred>,
}

/// Something that may want a watch later (a hold), asked when its time comes.
pub(crate) trait Deferrable: Send + Sync {
    /// What to watch now, if still wanted: key, start revision, sink.
    fn watch_now(&self) -> Option<(Vec<u8>, i64, Sink)>;
    /// Keeps the guard of the watch it asked for (dropping it cancels).
    fn keep(&self, guard: WatchGuard);
}

/// Holds waiting for their watch, in deadline order (all wait [`DEFER`]).
/// Only a weak reference and a time per hold: a hold released before its
/// time costs nothing else.
#[derive(Default)]
struct Deferred {
    queue: Mutex<VecDeque<(Instant, Weak<dyn Deferrable>)>>,
    /// Wakes the hub when the queue stops being empty.
    filled: Notify,
}

/// A watch; dropping it cancels it.
pub(crate) struct WatchGuard {
    id: i64,
    commands: mpsc::UnboundedSender<Command>,
}

impl Drop for WatchGuard {
    fn drop(&mut self) {
        let _ = self.commands.send(Command::Cancel(self.id));
    }
}

impl WatchHub {
    /// Starts the hub's task; it stops on `shutdown`.
    pub fn start(client: EtcdClient, shutdown: CancellationToken) -> WatchHub {
        let (commands, receiver) = mpsc::unbounded_channel();
        let deferred = Arc::new(Deferred::default());
        let next_id = Arc::new(AtomicI64::new(1));
        let hub = Hub {
            next_id: next_id.clone(),
            client,
            commands: receiver,
            loopback: commands.clone(),
            deferred: deferred.clone(),
            active: HashMap::new(),
            stream: None,
            retry_at: None,
            promoted_at: Instant::now(),
        };
        tokio::spawn(hub.run(shutdown));
        WatchHub {
            commands,
            next_id,
            deferred,
        }
    }

    /// Watches deletes of `key` (or of the range `[key, range_end)`) from
    /// revision `start` on.
    pub fn watch(
        &self,
        key: impl Into<Vec<u8>>,
        range_end: Option<Vec<u8>>,
        start: i64,
        sink: Sink,
    ) -> WatchGuard {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let spec = Spec {
            key: key.into(),
            range_end,
            start,
            sink,
        };
        let _ = self.commands.send(Command::Add(id, spec));
        WatchGuard {
            id,
            commands: self.commands.clone(),
        }
    }

    /// Asks `holder` [`DEFER`] from now what to watch, if it still lives then,
    /// and hands it the guard.
    pub fn watch_later(&self, holder: Weak<dyn Deferrable>) {
        let was_empty = {
            let mut queue = self.deferred.queue.lock().expect("deferred watches");
            queue.push_back((Instant::now() + DEFER, holder));
            queue.len() == 1
        };
        if was_empty {
            self.deferred.filled.notify_one();
        }
    }
}

/// The create request of watch `id`: deletes only.
fn create(id: i64, spec: &Spec) -> WatchCreateRequest {
    WatchCreateRequest {
        key: spec.key.clone(),
        range_end: spec.range_end.clone().unwrap_or_default(),
        start_revision: spec.start,
        filters: vec![FilterType::Noput as i32],
        watch_id: id,
        ..WatchCreateRequest::default()
    }
}

/// Cancel safety: a dropped open leaves no stream behind.
async fn open(client: &EtcdClient, active: &HashMap<i64, Spec>) -> Option<WatchStream> {
    let mut specs = active.iter();
    let (&first_id, first) = specs.next()?;
    let stream = match client.watch_stream(create(first_id, first)).await {
        Ok(stream) => stream,
        Err(error) => {
            tracing::debug!(backend = BACKEND, %error, "cannot open the watch stream");
            return None;
        }
    };
    for (&id, spec) in specs {
        stream.create(create(id, spec)).ok()?;
    }
    Some(stream)
}

type Message = Option<std::result::Result<Option<WatchResponse>, tonic::Status>>;

/// Cancel safety: safe (`WatchStream::message` is cancel safe).
async fn next(stream: &mut Option<WatchStream>) -> Message {
    match stream {
        Some(stream) => Some(stream.message().await),
        None => std::future::pending().await,
    }
}

/// The hub's task state.
struct Hub {
    next_id: Arc<AtomicI64>,
    client: EtcdClient,
    commands: mpsc::UnboundedReceiver<Command>,
    loopback: mpsc::UnboundedSender<Command>,
    deferred: Arc<Deferred>,
    active: HashMap<i64, Spec>,
    stream: Option<WatchStream>,
    retry_at: Option<Instant>,
    /// When deferred watches were last promoted; promotions are batched at
    /// most every quarter of [`DEFER`], so short holds cost few wake-ups.
    promoted_at: Instant,
}

impl Hub {
    /// Cancel safety: stopping it ends every watch of the client.
    async fn run(mut self, shutdown: CancellationToken) {
        loop {
            if self.stream.is_none() && !self.active.is_empty() {
                let due = self.retry_at.is_none_or(|at| at <= Instant::now());
                if due {
                    self.stream = open(&self.client, &self.active).await;
                    self.retry_at = self.stream.is_none().then(|| Instant::now() + RETRY);
                }
            }
            let retry_due = self
                .retry_at
                .filter(|_| self.stream.is_none() && !self.active.is_empty());
            let next_deferred = self.next_deferred();
            let deferred = self.deferred.clone();
            let timers = async move {
                let retry = async {
                    match retry_due {
                        Some(at) => tokio::time::sleep_until(at).await,
                        None => std::future::pending().await,
                    }
                };
                let due = async {
                    match next_deferred {
                        Some(at) => tokio::time::sleep_until(at).await,
                        None => deferred.filled.notified().await,
                    }
                };
                tokio::select! {
                    _ = retry => {}
                    _ = due => {}
                }
            };
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = timers => self.promote_due(),
                command = self.commands.recv() => match command {
                    None => return,
                    Some(Command::Add(id, spec)) => self.add(id, spec),
                    Some(Command::Cancel(id)) => self.cancel(id),
                },
                message = next(&mut self.stream) => match message {
                    Some(Ok(Some(response))) => {
                        route(response, &mut self.active, &self.client, &self.loopback)
                    }
                    Some(Ok(None)) | Some(Err(_)) | None => {
                        tracing::debug!(backend = BACKEND, "watch stream broke, reopening");
                        self.stream = None;
                    }
                },
            }
        }
    }

    fn add(&mut self, id: i64, spec: Spec) {
        if let Some(stream) = &self.stream {
            if stream.create(create(id, &spec)).is_err() {
                self.stream = None;
            }
        }
        self.active.insert(id, spec);
    }

    fn cancel(&mut self, id: i64) {
        if self.active.remove(&id).is_some() {
            if let Some(stream) = &self.stream {
                if stream.cancel(id).is_err() {
                    self.stream = None;
                }
            }
        }
    }

    /// When to promote deferred watches next (`None`: nothing deferred).
    fn next_deferred(&self) -> Option<Instant> {
        let queue = self.deferred.queue.lock().expect("deferred watches");
        let batch = self.promoted_at + DEFER / 4;
        queue.front().map(|(at, ..)| (*at).max(batch))
    }

    /// Registers the deferred watches that are due and still wanted.
    ///
    fn promote_due(&mut self) {
        let now = Instant::now();
        self.promoted_at = now;
        let due: Vec<Arc<dyn Deferrable>> = {
            let mut queue = self.deferred.queue.lock().expect("deferred watches");
            let mut due = Vec::new();
            while queue.front().is_some_and(|(at, _)| *at <= now) {
                let (_, holder) = queue.pop_front().expect("front exists");
                due.extend(holder.upgrade());
            }
            due
        };
        for holder in due {
            let Some((key, start, sink)) = holder.watch_now() else {
                continue;
            };
            let id = self.next_id.fetch_add(1, Ordering::Relaxed);
            let spec = Spec {
                key,
                range_end: None,
                start,
                sink,
            };
            self.add(id, spec);
            holder.keep(WatchGuard {
                id,
                commands: self.loopback.clone(),
            });
        }
    }
}

fn route(
    response: WatchResponse,
    active: &mut HashMap<i64, Spec>,
    client: &EtcdClient,
    loopback: &mpsc::UnboundedSender<Command>,
) {
    let id = response.watch_id;
    let Some(spec) = active.get_mut(&id) else {
        return;
    };
    if response.created {
        if let Sink::Wake(waiter) = &spec.sink {
            let at = rpc::revision(response.header.as_ref());
            let _ = waiter.send(Wake::Created(at));
        }
    }
    for event in &response.events {
        if let Some(kv) = &event.kv {
            spec.start = spec.start.max(kv.mod_revision + 1);
        }
        if event.r#type == EventType::Delete as i32 {
            let at = event.kv.as_ref().map_or(0, |kv| kv.mod_revision);
            deliver(
                &spec.sink,
                at,
                "its key was deleted (lease expired or revoked, or deleted by hand)",
            );
        }
    }
    if response.canceled {
        // Compacted past our start revision, or refused: this watch cannot fire.
        let spec = active.remove(&id).expect("looked up above");
        tracing::debug!(
            backend = BACKEND,
            reason = response.cancel_reason,
            compacted = response.compact_revision,
            "watch cancelled by etcd"
        );
        match spec.sink {
            Sink::Wake(waiter) => {
                let _ = waiter.send(Wake::Reset);
            }
            Sink::Lost {
                signal,
                armed,
                token,
            } => {
                tokio::spawn(recheck(
                    client.clone(),
                    loopback.clone(),
                    id,
                    spec.key,
                    signal,
                    armed,
                    token,
                ));
            }
        }
    }
}

fn deliver(sink: &Sink, at: i64, reason: &str) {
    match sink {
        Sink::Wake(waiter) => {
            let _ = waiter.send(Wake::Deleted(at));
        }
        Sink::Lost { signal, armed, .. } => {
            if armed.load(Ordering::SeqCst) {
                signal.fire_because(LostCause::Gone, reason);
            }
        }
    }
}

/// After a reset of a hold's watch: still held means watch again from now,
/// anything else means lost.
///
/// Cancel safety: runs in its own task.
async fn recheck(
    client: EtcdClient,
    loopback: mpsc::UnboundedSender<Command>,
    id: i64,
    key: Vec<u8>,
    signal: LostSignal,
    armed: Arc<AtomicBool>,
    token: i64,
) {
    match client.range(rpc::get(key.clone())).await {
        Ok(response) => {
            let held = response
                .kvs
                .first()
                .is_some_and(|kv| kv.create_revision == token);
            if held && armed.load(Ordering::SeqCst) {
                let start = rpc::revision(response.header.as_ref()) + 1;
                let sink = Sink::Lost {
                    signal,
                    armed,
                    token,
                };
                let spec = Spec {
                    key,
                    range_end: None,
                    start,
                    sink,
                };
                // Same id: the hold's guard cancels it by this id.
                let _ = loopback.send(Command::Add(id, spec));
            } else if !held && armed.load(Ordering::SeqCst) {
                signal.fire_because(
                    LostCause::Gone,
                    "its key is gone (found on re-checking after a watch reset)",
                );
            }
        }
        Err(error) => {
            if armed.load(Ordering::SeqCst) {
                signal.fire_because(
                    LostCause::ConnectionLost,
                    format!("cannot re-check the key after a watch reset: {error}"),
                );
            }
        }
    }
}
