//! One shared pub/sub connection per Redis node, with per-channel listeners.
//!
//! Waiters do not poll: they subscribe to the channel their lock's releases are
//! published on and sleep until a message arrives or their bounded re-check is
//! due. All waiters of a client share one subscription connection (opened on the
//! first wait); a channel is subscribed while at least one waiter listens and
//! unsubscribed when the last one leaves.
//!
//! Message semantics follow Redisson's `LockPubSub`: `0` (UNLOCK_MESSAGE) wakes
//! one local waiter of the channel, anything else (READ_UNLOCK_MESSAGE `1`, a
//! semaphore's permit count) wakes all of them. A waiter that is between two
//! attempts when a message arrives does not miss it: a wake-one is stored as a
//! permit, a wake-all as an epoch the waiter compares against.
//!
//! When the connection drops (Redis restarted, network cut) or the primary
//! moves (a Sentinel failover), the hub reconnects with backoff, subscribes
//! every channel again, wakes every waiter so it re-checks (a release may have
//! happened while nobody listened), and tells the watchdog to re-check the
//! held locks.
//!
//! On a Redis Cluster the hub subscribes through a cluster connection
//! (RESP3), with `SSUBSCRIBE` on Redis 7+ (each lock's channels live on the
//! shard of its slot, where its scripts `SPUBLISH`) and `SUBSCRIBE` before.
//! The cluster client re-subscribes by itself after a reconnect or a slot
//! move; the hub wakes every waiter and the watchdog whenever a node's
//! connection drops.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use futures::StreamExt;
use tokio::sync::{mpsc, oneshot, watch, Notify};
use tokio_util::sync::CancellationToken;

use super::config::Config;
use super::server::Server;

/// How long a waiter waits for its SUBSCRIBE to be confirmed before it relies on
/// its bounded re-check alone.
const SUBSCRIBE_WAIT: Duration = Duration::from_secs(2);
/// Command timeout of the subscription connection (connecting takes the
/// URL's `connect_timeout`).
const IO_TIMEOUT: Duration = Duration::from_secs(2);
/// How often an idle subscription connection is pinged, to notice a dead peer.
const KEEPALIVE: Duration = Duration::from_secs(5);

/// Wake-ups of one channel.
pub(crate) struct Signal {
    one: Notify,
    all: watch::Sender<u64>,
}

impl Signal {
    fn new() -> Arc<Signal> {
        Arc::new(Signal {
            one: Notify::new(),
            all: watch::channel(0).0,
        })
    }

    fn wake_all(&self) {
        self.all.send_modify(|epoch| *epoch += 1);
    }
}

struct Entry {
    refs: usize,
    signal: Arc<Signal>,
}

type Channels = Arc<Mutex<HashMap<String, Entry>>>;

enum Command {
    Subscribe(String, oneshot::Sender<()>),
    Unsubscribe(String),
}

/// Where a hub subscribes.
#[derive(Clone)]
pub(crate) enum Source {
    /// The server a watch names: one server, or the primary Sentinel names
    /// now (the hub moves with it).
    Server(watch::Receiver<Arc<Server>>),
    /// Every shard of a Redis Cluster; `sharded`: with `SSUBSCRIBE`.
    Cluster {
        /// The cluster's URL, parsed.
        config: Box<Config>,
        /// Whether the cluster has sharded pub/sub (Redis 7+).
        sharded: bool,
    },
}

/// The subscription connection of one node, started on first use.
pub(crate) struct Hub {
    source: Source,
    channels: Channels,
    commands: OnceLock<mpsc::UnboundedSender<Command>>,
    /// Notified after every reconnect, so held locks get re-checked.
    reconnected: Arc<Notify>,
    /// Cancelled when the client closes: the hub task ends at once, so that
    /// no (un)subscription is still in flight when a process exits after
    /// `close` and its runtime drops the connection under it (which the
    /// task would report as a lost connection).
    closing: CancellationToken,
}

impl Hub {
    /// A hub for the node `source` names; nothing connects yet.
    pub fn new(source: Source, reconnected: Arc<Notify>) -> Arc<Hub> {
        Arc::new(Hub {
            source,
            channels: Arc::default(),
            commands: OnceLock::new(),
            reconnected,
            closing: CancellationToken::new(),
        })
    }

    /// Ends the subscription connection for good (the client is closing).
    pub fn close(&self) {
        self.closing.cancel();
    }

    fn commands(&self) -> &mpsc::UnboundedSender<Command> {
        self.commands.get_or_init(|| {
            let (sender, receiver) = mpsc::unbounded_channel();
            let (channels, reconnected) = (self.channels.clone(), self.reconnected.clone());
            let run: futures::future::BoxFuture<'static, ()> = match self.source.clone() {
                Source::Server(server) => {
                    Box::pin(run_server(server, channels, receiver, reconnected))
                }
                Source::Cluster { config, sharded } => Box::pin(run_cluster(
                    config,
                    sharded,
                    channels,
                    receiver,
                    reconnected,
                )),
            };
            let closing = self.closing.clone();
            tokio::spawn(async move {
                tokio::select! {
                    _ = closing.cancelled() => {}
                    _ = run => {}
                }
            });
            sender
        })
    }

    /// Listens on `channel` from now on, and asks Redis to subscribe it; the
    /// receiver completes once Redis confirmed (an error if the hub is gone).
    /// A waiter awaits the confirmations it needs ([`confirm_in_time`]) before
    /// its next attempt, so that no release published after it is missed.
    pub fn listen(self: &Arc<Self>, channel: &str) -> (Subscription, oneshot::Receiver<()>) {
        let signal = {
            let mut channels = self.channels.lock().expect("hub channels");
            let entry = channels.entry(channel.to_owned()).or_insert_with(|| Entry {
                refs: 0,
                signal: Signal::new(),
            });
            entry.refs += 1;
            entry.signal.clone()
        };
        let mut epoch = signal.all.subscribe();
        epoch.borrow_and_update();
        let subscription = Subscription {
            hub: self.clone(),
            channel: channel.to_owned(),
            signal,
            epoch,
        };
        let (ack, confirmed) = oneshot::channel();
        // A hub that is gone drops the sender, and the receiver says so.
        let _ = self
            .commands()
            .send(Command::Subscribe(channel.to_owned(), ack));
        (subscription, confirmed)
    }

    /// Whether releases must be published with `SPUBLISH` to be heard here
    /// (a Redis Cluster with sharded pub/sub).
    pub fn sharded(&self) -> bool {
        matches!(self.source, Source::Cluster { sharded: true, .. })
    }

    /// How many channels this client listens on right now.
    pub fn listening(&self) -> usize {
        self.channels.lock().expect("hub channels").len()
    }
}

/// One waiter's listener on one channel; unsubscribes when the last one drops.
pub(crate) struct Subscription {
    hub: Arc<Hub>,
    channel: String,
    signal: Arc<Signal>,
    epoch: watch::Receiver<u64>,
}

impl Subscription {
    /// Forgets wake-all messages seen so far; call before each attempt.
    pub fn mark(&mut self) {
        self.epoch.borrow_and_update();
    }

    /// Completes at the next wake-up meant for this waiter (or at once if one
    /// arrived since [`Subscription::mark`]).
    ///
    /// Cancel safety: safe; a consumed wake-one is passed on by `Notify`.
    pub async fn woken(&mut self) {
        tokio::select! {
            _ = self.signal.one.notified() => {}
            _ = self.epoch.changed() => {}
        }
    }

    /// Passes a wake-up on to another local waiter of the channel (after a
    /// shared grant, the next reader may be admitted too).
    pub fn pass_on(&self) {
        self.signal.one.notify_one();
    }
}

impl Drop for Subscription {
    fn drop(&mut self) {
        let mut channels = self.hub.channels.lock().expect("hub channels");
        let last = match channels.get_mut(&self.channel) {
            Some(entry) if Arc::ptr_eq(&entry.signal, &self.signal) => {
                entry.refs -= 1;
                entry.refs == 0
            }
            _ => false,
        };
        if last {
            channels.remove(&self.channel);
            if let Some(commands) = self.hub.commands.get() {
                let _ = commands.send(Command::Unsubscribe(self.channel.clone()));
            }
        }
    }
}

/// Waits until `needed` of the `confirmations` of one channel's
/// subscriptions arrived, or [`SUBSCRIBE_WAIT`] passed: a node whose
/// subscription connection is down confirms only once it is back, and the
/// waiter relies on its bounded re-check meanwhile.
///
/// Cancel safety: safe; the subscriptions stand whether or not confirmed.
pub(crate) async fn confirm_in_time(
    channel: &str,
    confirmations: impl IntoIterator<Item = oneshot::Receiver<()>>,
    needed: usize,
) {
    let mut pending: futures::stream::FuturesUnordered<_> = confirmations.into_iter().collect();
    let confirmed = async {
        let mut confirmed = 0;
        while confirmed < needed {
            match pending.next().await {
                Some(Ok(())) => confirmed += 1,
                Some(Err(_)) => {}
                None => return false,
            }
        }
        true
    };
    if !matches!(
        tokio::time::timeout(SUBSCRIBE_WAIT, confirmed).await,
        Ok(true)
    ) {
        tracing::debug!(
            channel,
            needed,
            "subscriptions not confirmed in time; re-checks only"
        );
    }
}

/// Wakes the listeners of `channel` as a message `payload` says.
fn dispatch(channels: &Channels, channel: &str, payload: &[u8]) {
    let channels = channels.lock().expect("hub channels");
    if let Some(entry) = channels.get(channel) {
        if payload == b"0" {
            entry.signal.one.notify_one();
        } else {
            entry.signal.wake_all();
        }
    }
}

/// Wakes every listener (after a reconnect: a release may have gone unheard)
/// and tells the watchdog to re-check the held locks.
fn wake_everyone(channels: &Channels, reconnected: &Notify) {
    for entry in channels.lock().expect("hub channels").values() {
        entry.signal.wake_all();
    }
    reconnected.notify_one();
}

/// The hub task of one server: owns the subscription connection, applies
/// (un)subscribe commands in order, dispatches messages, reconnects, and
/// moves to the new server when the watch names another one.
///
/// Cancel safety: the task ends when the hub is dropped; dropping it loses
/// nothing but the subscriptions.
async fn run_server(
    mut server: watch::Receiver<Arc<Server>>,
    channels: Channels,
    mut commands: mpsc::UnboundedReceiver<Command>,
    reconnected: Arc<Notify>,
) {
    let mut pending_acks: Vec<oneshot::Sender<()>> = Vec::new();
    let mut connected_before = false;
    let mut backoff = Duration::from_millis(50);
    let mut following = true;
    loop {
        // Connect (to whichever server the watch names by then), serving
        // commands meanwhile (acks wait for the connection).
        let (pubsub, label) = loop {
            let (client, label, connect_timeout) = {
                let current = server.borrow_and_update();
                (
                    current.client.clone(),
                    current.label.clone(),
                    current.connect_timeout,
                )
            };
            let attempt = tokio::time::timeout(connect_timeout, client.get_async_pubsub());
            tokio::pin!(attempt);
            let connected = loop {
                tokio::select! {
                    result = &mut attempt => break result,
                    command = commands.recv() => match command {
                        None => return,
                        Some(Command::Subscribe(_, ack)) => pending_acks.push(ack),
                        Some(Command::Unsubscribe(_)) => {}
                    },
                }
            };
            match connected {
                Ok(Ok(pubsub)) => break (pubsub, label),
                Ok(Err(error)) => {
                    tracing::warn!(node = %label, %error, "redis subscription connection failed")
                }
                Err(_) => tracing::warn!(node = %label, "redis subscription connection timed out"),
            }
            let pause = tokio::time::sleep(backoff);
            tokio::pin!(pause);
            loop {
                tokio::select! {
                    _ = &mut pause => break,
                    command = commands.recv() => match command {
                        None => return,
                        Some(Command::Subscribe(_, ack)) => pending_acks.push(ack),
                        Some(Command::Unsubscribe(_)) => {}
                    },
                }
            }
            backoff = (backoff * 2).min(Duration::from_secs(1));
        };
        let (mut sink, mut stream) = pubsub.split();
        let wanted: Vec<String> = channels
            .lock()
            .expect("hub channels")
            .keys()
            .cloned()
            .collect();
        let mut wire: HashSet<String> = HashSet::new();
        if !wanted.is_empty() {
            match tokio::time::timeout(IO_TIMEOUT, sink.subscribe(&wanted)).await {
                Ok(Ok(())) => wire.extend(wanted),
                _ => {
                    tracing::warn!(node = %label, "re-subscribing failed; reconnecting");
                    continue;
                }
            }
        }
        backoff = Duration::from_millis(50);
        for ack in pending_acks.drain(..) {
            let _ = ack.send(());
        }
        if connected_before {
            tracing::info!(node = %label, channels = wire.len(), "redis subscription connection restored");
            wake_everyone(&channels, &reconnected);
        }
        connected_before = true;
        let mut keepalive = tokio::time::interval(KEEPALIVE);
        keepalive.tick().await;
        // Serve until the connection breaks.
        let broken: Option<String> = loop {
            tokio::select! {
                command = commands.recv() => match command {
                    None => return,
                    Some(Command::Subscribe(channel, ack)) => {
                        let wanted = channels.lock().expect("hub channels").contains_key(&channel);
                        if wanted && !wire.contains(&channel) {
                            match tokio::time::timeout(IO_TIMEOUT, sink.subscribe(&channel)).await {
                                Ok(Ok(())) => {
                                    wire.insert(channel);
                                }
                                _ => {
                                    pending_acks.push(ack);
                                    break Some("SUBSCRIBE failed".into());
                                }
                            }
                        }
                        let _ = ack.send(());
                    }
                    Some(Command::Unsubscribe(channel)) => {
                        let wanted = channels.lock().expect("hub channels").contains_key(&channel);
                        if !wanted && wire.remove(&channel)
                            && !matches!(tokio::time::timeout(IO_TIMEOUT, sink.unsubscribe(&channel)).await, Ok(Ok(())))
                        {
                            break Some("UNSUBSCRIBE failed".into());
                        }
                    }
                },
                message = stream.next() => match message {
                    Some(message) => dispatch(&channels, message.get_channel_name(), message.get_payload_bytes()),
                    None => break Some("connection closed".into()),
                },
                moved = server.changed(), if following => match moved {
                    Ok(()) => break Some("the primary moved".into()),
                    Err(_) => following = false,
                },
                _ = keepalive.tick() => {
                    let ping = tokio::time::timeout(IO_TIMEOUT, sink.ping::<::redis::Value>()).await;
                    if !matches!(ping, Ok(Ok(_))) {
                        break Some("keep-alive PING unanswered".into());
                    }
                }
            }
        };
        if let Some(reason) = broken {
            tracing::warn!(node = %label, reason, "redis subscription connection lost; reconnecting");
        }
    }
}

/// The hub task of a Redis Cluster: subscribes through a RESP3 cluster
/// connection, which re-subscribes by itself after reconnects and slot moves;
/// a dropped node connection wakes every waiter and the watchdog.
///
/// Cancel safety: the task ends when the hub is dropped; dropping it loses
/// nothing but the subscriptions.
async fn run_cluster(
    config: Box<Config>,
    sharded: bool,
    channels: Channels,
    mut commands: mpsc::UnboundedReceiver<Command>,
    reconnected: Arc<Notify>,
) {
    let (pushes_to, mut pushes) = mpsc::unbounded_channel();
    let client = match super::cluster::subscriber(&config, pushes_to) {
        Ok(client) => client,
        Err(error) => {
            tracing::warn!(%error, "no redis cluster subscriptions; waiters re-check on their own");
            return;
        }
    };
    let mut pending_acks: Vec<oneshot::Sender<()>> = Vec::new();
    let mut backoff = Duration::from_millis(50);
    // Connect, serving commands meanwhile (acks wait for the connection).
    let mut conn = loop {
        let attempt = tokio::time::timeout(config.connect_timeout, client.get_async_connection());
        tokio::pin!(attempt);
        let connected = loop {
            tokio::select! {
                result = &mut attempt => break result,
                command = commands.recv() => match command {
                    None => return,
                    Some(Command::Subscribe(_, ack)) => pending_acks.push(ack),
                    Some(Command::Unsubscribe(_)) => {}
                },
            }
        };
        match connected {
            Ok(Ok(conn)) => break conn,
            Ok(Err(error)) => {
                tracing::warn!(%error, "redis cluster subscription connection failed")
            }
            Err(_) => tracing::warn!("redis cluster subscription connection timed out"),
        }
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(Duration::from_secs(1));
    };
    let wanted: Vec<String> = channels
        .lock()
        .expect("hub channels")
        .keys()
        .cloned()
        .collect();
    for channel in wanted {
        if let Err(error) = subscribe(&mut conn, sharded, &channel, true).await {
            tracing::warn!(channel, %error, "redis cluster subscription failed; re-checks only");
        }
    }
    for ack in pending_acks.drain(..) {
        let _ = ack.send(());
    }
    loop {
        tokio::select! {
            command = commands.recv() => match command {
                None => return,
                Some(Command::Subscribe(channel, ack)) => {
                    let wanted = channels.lock().expect("hub channels").contains_key(&channel);
                    if wanted {
                        if let Err(error) = subscribe(&mut conn, sharded, &channel, true).await {
                            tracing::debug!(channel, %error, "redis cluster subscription failed; re-checks only");
                        }
                    }
                    let _ = ack.send(());
                }
                Some(Command::Unsubscribe(channel)) => {
                    let wanted = channels.lock().expect("hub channels").contains_key(&channel);
                    if !wanted {
                        if let Err(error) = subscribe(&mut conn, sharded, &channel, false).await {
                            tracing::debug!(channel, %error, "redis cluster unsubscription failed");
                        }
                    }
                }
            },
            push = pushes.recv() => match push {
                None => return,
                Some(push) => match push.kind {
                    ::redis::PushKind::Message | ::redis::PushKind::SMessage => {
                        if let [::redis::Value::BulkString(channel), ::redis::Value::BulkString(payload), ..] = &push.data[..] {
                            dispatch(&channels, &String::from_utf8_lossy(channel), payload);
                        }
                    }
                    ::redis::PushKind::Disconnection => {
                        tracing::info!("a redis cluster node's subscription connection dropped; waiters re-check");
                        wake_everyone(&channels, &reconnected);
                    }
                    _ => {}
                },
            },
        }
    }
}

/// `SSUBSCRIBE` / `SUBSCRIBE` (or the unsubscribe) of one channel, bounded in
/// time.
///
/// Cancel safety: the (un)subscription may or may not have happened.
async fn subscribe(
    conn: &mut ::redis::cluster_async::ClusterConnection,
    sharded: bool,
    channel: &str,
    on: bool,
) -> Result<(), String> {
    let request = async {
        match (sharded, on) {
            (true, true) => conn.ssubscribe(channel).await,
            (true, false) => conn.sunsubscribe(channel).await,
            (false, true) => conn.subscribe(channel).await,
            (false, false) => conn.unsubscribe(channel).await,
        }
    };
    match tokio::time::timeout(IO_TIMEOUT, request).await {
        Ok(Ok(())) => Ok(()),
        Ok(Err(e)) => Err(e.to_string()),
        Err(_) => Err(format!("no answer within {IO_TIMEOUT:?}")),
    }
}
