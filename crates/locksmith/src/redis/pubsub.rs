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
//! When the connection drops (Redis restarted, network cut), the hub reconnects
//! with backoff, subscribes every channel again, wakes every waiter so it
//! re-checks (a release may have happened while nobody listened), and tells the
//! watchdog to re-check the held locks.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use futures::StreamExt;
use tokio::sync::{mpsc, oneshot, watch, Notify};

/// How long a waiter waits for its SUBSCRIBE to be confirmed before it relies on
/// its bounded re-check alone.
const SUBSCRIBE_WAIT: Duration = Duration::from_secs(2);
/// Connect and command timeout of the subscription connection.
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

/// The subscription connection of one node, started on first use.
pub(crate) struct Hub {
    client: ::redis::Client,
    label: String,
    channels: Channels,
    commands: OnceLock<mpsc::UnboundedSender<Command>>,
    /// Notified after every reconnect, so held locks get re-checked.
    reconnected: Arc<Notify>,
}

impl Hub {
    /// A hub for the node reached through `client`; nothing connects yet.
    pub fn new(client: ::redis::Client, label: String, reconnected: Arc<Notify>) -> Arc<Hub> {
        Arc::new(Hub {
            client,
            label,
            channels: Arc::default(),
            commands: OnceLock::new(),
            reconnected,
        })
    }

    fn commands(&self) -> &mpsc::UnboundedSender<Command> {
        self.commands.get_or_init(|| {
            let (sender, receiver) = mpsc::unbounded_channel();
            tokio::spawn(run(
                self.client.clone(),
                self.label.clone(),
                self.channels.clone(),
                receiver,
                self.reconnected.clone(),
            ));
            sender
        })
    }

    /// Listens on `channel`, waiting (boundedly) until Redis confirms the
    /// subscription, so that no release published after this returns is missed.
    ///
    /// Cancel safety: safe; dropping the future drops the listener.
    pub async fn subscribe(self: &Arc<Self>, channel: &str) -> Subscription {
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
        if self
            .commands()
            .send(Command::Subscribe(channel.to_owned(), ack))
            .is_ok()
            && tokio::time::timeout(SUBSCRIBE_WAIT, confirmed)
                .await
                .is_err()
        {
            tracing::debug!(node = %self.label, channel, "subscription not confirmed in time; re-checks only");
        }
        subscription
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

fn dispatch(channels: &Channels, msg: ::redis::Msg) {
    let channels = channels.lock().expect("hub channels");
    if let Some(entry) = channels.get(msg.get_channel_name()) {
        if msg.get_payload_bytes() == b"0" {
            entry.signal.one.notify_one();
        } else {
            entry.signal.wake_all();
        }
    }
}

/// The hub task: owns the subscription connection, applies (un)subscribe
/// commands in order, dispatches messages and reconnects.
///
/// Cancel safety: the task ends when the hub is dropped; dropping it loses
/// nothing but the subscriptions.
async fn run(
    client: ::redis::Client,
    label: String,
    channels: Channels,
    mut commands: mpsc::UnboundedReceiver<Command>,
    reconnected: Arc<Notify>,
) {
    let mut pending_acks: Vec<oneshot::Sender<()>> = Vec::new();
    let mut connected_before = false;
    let mut backoff = Duration::from_millis(50);
    loop {
        // Connect, serving commands meanwhile (acks wait for the connection).
        let pubsub = loop {
            let attempt = tokio::time::timeout(IO_TIMEOUT, client.get_async_pubsub());
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
                Ok(Ok(pubsub)) => break pubsub,
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
            for entry in channels.lock().expect("hub channels").values() {
                entry.signal.wake_all();
            }
            reconnected.notify_one();
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
                    Some(message) => dispatch(&channels, message),
                    None => break Some("connection closed".into()),
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
