//! Idle sessions on the locksmith server, on the member that leads, many to
//! an HTTP/2 connection, each sending a heartbeat and waiting for its
//! answer: by default on channels of one `Sessions` stream per connection
//! ([`Channels`]: what a client with many sessions uses, their heartbeats
//! sent and answered together), or a session stream each
//! (`--stream-per-session`).

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use locksmith_proto::v1 as pb;
use pb::locksmith_client::LocksmithClient;
use tokio::sync::mpsc;
use tokio::task::JoinSet;
use tokio::time::Instant;
use tonic::transport::{Channel, Endpoint};

use super::{open_by_connection, Plan, Renew, Shared};

/// Sessions one client address opens, below the server's default limit of
/// 10 000 per address (`--max-sessions-per-peer`): past it, the connections
/// come from further loopback addresses (127.0.0.2, 127.0.0.3, …), as from
/// more client hosts.
const SESSIONS_PER_ADDRESS: usize = 5_000;

/// Opens the plan's sessions on the leader among `hosts` and spawns their
/// keepers.
///
/// Cancel safety: dropped, the sessions opened so far live until their TTL.
pub(super) async fn open(
    hosts: &[String],
    plan: &Plan,
    shared: &Shared,
    keepers: &mut JoinSet<Result<(), String>>,
) -> Result<(&'static str, usize), String> {
    let leader = leader_address(hosts, plan.ttl).await?;
    let loopback = leader.starts_with("127.");
    open_by_connection(plan, shared, keepers, |first, last| {
        let leader = leader.clone();
        async move {
            let mut endpoint =
                Endpoint::from_shared(format!("http://{leader}")).map_err(|e| e.to_string())?;
            if loopback {
                endpoint = endpoint.local_address(Some(client_address(first)));
            }
            let channel = endpoint
                .connect()
                .await
                .map_err(|e| format!("connect to {leader}: {e}"))?;
            let sessions: Vec<Box<dyn IdleSession>> = if plan.stream_per_session {
                futures::future::try_join_all(
                    (first..last).map(|_| Session::open(channel.clone(), plan.ttl)),
                )
                .await?
                .into_iter()
                .map(|session| Box::new(session) as Box<dyn IdleSession>)
                .collect()
            } else {
                Channels::open(channel, last - first, plan.ttl)
                    .await?
                    .into_iter()
                    .map(|session| Box::new(session) as Box<dyn IdleSession>)
                    .collect()
            };
            Ok(sessions)
        }
    })
    .await?;
    let kind = if plan.stream_per_session {
        "session stream"
    } else {
        "channel of a Sessions stream"
    };
    Ok((kind, plan.per_connection.max(1)))
}

/// Either kind of idle session, renewed alike.
trait IdleSession: Send {
    /// Sends one message of the session's.
    fn send(&self, kind: pb::client_message::Kind);

    /// The next message for the session.
    ///
    /// Cancel safety: safe; a message not yet taken stays queued.
    fn next(&mut self) -> futures::future::BoxFuture<'_, Result<pb::server_message::Kind, String>>;

    /// Sends a heartbeat.
    fn heartbeat(&self) {
        self.send(pb::client_message::Kind::Heartbeat(pb::Heartbeat {}));
    }

    /// Sends the session's close.
    fn close(&self) {
        self.send(pb::client_message::Kind::Close(pb::Close {}));
    }
}

impl Renew for Box<dyn IdleSession> {
    async fn renew(&mut self) -> Result<(), String> {
        self.heartbeat();
        loop {
            if let pb::server_message::Kind::Heartbeat(_) = self.next().await? {
                return Ok(());
            }
        }
    }

    async fn close(self) {
        IdleSession::close(&*self);
    }
}

/// Where a connection's `Sessions` stream sends each channel's messages.
type Routes = Arc<Mutex<HashMap<u64, mpsc::UnboundedSender<Result<pb::ServerMessage, String>>>>>;

/// One session on a channel of its connection's `Sessions` stream.
struct ChannelSession {
    channel: u64,
    /// The stream's outbound side, shared by its channels.
    tx: mpsc::UnboundedSender<pb::ClientChannelBatch>,
    /// What the stream's reader routes to this channel.
    rx: mpsc::UnboundedReceiver<Result<pb::ServerMessage, String>>,
}

/// Opening the sessions of one connection on channels of one stream.
struct Channels;

impl Channels {
    /// Opens `count` sessions of `ttl` on channels 1..=count of one new
    /// `Sessions` stream on `channel`. A task of the stream's own routes
    /// what comes back to each channel; whatever the channels have to send
    /// when the stream polls goes out as one message.
    ///
    /// Cancel safety: dropped, the stream closes; the sessions opened by
    /// then live until their TTL.
    async fn open(
        channel: Channel,
        count: usize,
        ttl: Duration,
    ) -> Result<Vec<ChannelSession>, String> {
        let (tx, rx) = mpsc::unbounded_channel::<pb::ClientChannelBatch>();
        let outbound = futures::stream::unfold(rx, |mut rx| async move {
            let mut batches = Vec::new();
            (rx.recv_many(&mut batches, 4096).await > 0)
                .then_some((pb::ClientChannelBatches { batches }, rx))
        });
        let mut inbound = LocksmithClient::new(channel)
            .sessions(outbound)
            .await
            .map_err(|e| e.to_string())?
            .into_inner();
        let routes = Routes::default();
        let mut sessions = Vec::with_capacity(count);
        for number in 1..=count as u64 {
            let (route, rx) = mpsc::unbounded_channel();
            routes.lock().unwrap().insert(number, route);
            sessions.push(ChannelSession {
                channel: number,
                tx: tx.clone(),
                rx,
            });
        }
        let routing = routes.clone();
        tokio::spawn(async move {
            let ended = loop {
                let message = match inbound.message().await {
                    Ok(Some(message)) => message,
                    Ok(None) => break "the stream ended".to_owned(),
                    Err(status) => break status.message().to_owned(),
                };
                let routes = routing.lock().unwrap();
                for tagged in message.batches {
                    let Some(route) = routes.get(&tagged.channel) else {
                        continue;
                    };
                    for message in tagged.batch.into_iter().flat_map(|b| b.messages) {
                        let _ = route.send(Ok(message));
                    }
                    if let Some(end) = tagged.end {
                        let _ = route.send(Err(end.message));
                    }
                }
            };
            for route in routing.lock().unwrap().values() {
                let _ = route.send(Err(ended.clone()));
            }
        });
        let open = pb::client_message::Kind::Open(pb::OpenSession {
            client_name: "locksmith-lab idle".into(),
            host: "bench".into(),
            ttl_ms: ttl.as_millis() as u64,
        });
        for session in &sessions {
            session.send(open.clone());
        }
        for session in &mut sessions {
            match IdleSession::next(session).await? {
                pb::server_message::Kind::Opened(_) => {}
                other => return Err(format!("expected the session to open, got {other:?}")),
            }
        }
        Ok(sessions)
    }
}

impl IdleSession for ChannelSession {
    fn send(&self, kind: pb::client_message::Kind) {
        let _ = self.tx.send(pb::ClientChannelBatch {
            channel: self.channel,
            batch: Some(pb::ClientBatch {
                messages: vec![pb::ClientMessage { kind: Some(kind) }],
                ..Default::default()
            }),
            done: false,
        });
    }

    fn next(&mut self) -> futures::future::BoxFuture<'_, Result<pb::server_message::Kind, String>> {
        Box::pin(async move {
            let message = self.rx.recv().await.ok_or("the stream ended")??;
            message
                .kind
                .ok_or_else(|| "a message without a kind".into())
        })
    }
}

/// The loopback address session `index` connects from.
fn client_address(index: usize) -> IpAddr {
    let host = index / SESSIONS_PER_ADDRESS;
    // 127.0.0.1 is the server's own; 127.0.x.y, y in 2..=251, after it.
    let [_, _, x, y] = ((host / 250) as u32 * 256 + (host % 250) as u32 + 2).to_be_bytes();
    IpAddr::V4(Ipv4Addr::new(127, 0, x, y))
}

/// The address of the member that opens sessions (the leader).
///
/// Cancel safety: safe; the probe's session is closed when found, and a
/// dropped probe's ends with its stream.
async fn leader_address(hosts: &[String], ttl: Duration) -> Result<String, String> {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        for host in hosts {
            let Ok(channel) = Channel::from_shared(format!("http://{host}"))
                .map_err(|e| e.to_string())?
                .connect()
                .await
            else {
                continue;
            };
            if let Ok(session) = Session::open(channel, ttl).await {
                IdleSession::close(&session);
                return Ok(host.clone());
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
    ///
    /// Cancel safety: dropped, the stream closes; a session opened by then
    /// lives until its TTL.
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
        let mut session = Session {
            inbound: LocksmithClient::new(channel)
                .session(outbound)
                .await
                .map_err(|e| e.to_string())?
                .into_inner(),
            tx,
        };
        session.send(open);
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
    ///
    /// Cancel safety: safe; a message not yet taken stays on the stream.
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
}

impl IdleSession for Session {
    fn send(&self, kind: pb::client_message::Kind) {
        Session::send(self, kind);
    }

    fn next(&mut self) -> futures::future::BoxFuture<'_, Result<pb::server_message::Kind, String>> {
        Box::pin(Session::next(self))
    }
}
