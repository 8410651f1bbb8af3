//! Idle sessions on the locksmith server: raw session streams to the member
//! that leads, many to an HTTP/2 connection, each sending a heartbeat and
//! waiting for its answer.

use std::net::{IpAddr, Ipv4Addr};
use std::time::Duration;

use locksmith_proto::v1 as pb;
use pb::locksmith_client::LocksmithClient;
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
            futures::future::try_join_all(
                (first..last).map(|_| Session::open(channel.clone(), plan.ttl)),
            )
            .await
        }
    })
    .await?;
    Ok(("session stream", plan.per_connection.max(1)))
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
                session.close().await;
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

impl Renew for Session {
    async fn renew(&mut self) -> Result<(), String> {
        self.send(pb::client_message::Kind::Heartbeat(pb::Heartbeat {}));
        loop {
            if let pb::server_message::Kind::Heartbeat(_) = self.next().await? {
                return Ok(());
            }
        }
    }

    async fn close(self) {
        self.send(pb::client_message::Kind::Close(pb::Close {}));
    }
}
