//! The members' Raft traffic: openraft's messages, postcard-encoded, inside
//! the `locksmith.raft.v1` gRPC service (`raft.proto`), on the same port as
//! the clients' API.
//!
//! - [`PeerNetwork`] / [`Peer`]: the sending side openraft drives, one lazily
//!   connected gRPC channel per peer. Replication is a stream per session
//!   (`StreamAppend`), not a call per AppendEntries: HTTP/2 stream set-up and
//!   a wait for each answer were most of a leader's extra cost per commit.
//! - A peer of an earlier version, met during a rolling upgrade, answers
//!   `StreamAppend` or `PreVote` with "unimplemented": it is replicated to a
//!   call at a time, and its PreVote counts as granted, as openraft does for
//!   a network without PreVote (the election then goes as it would without).
//! - [`raft_server`] / [`RaftService`]: the receiving side, which hears
//!   members only (judged on a call's headers, before its message is read)
//!   and hands each message to the local [`openraft::Raft`].
//!
//! Snapshots go as a stream of chunks of [`SNAPSHOT_CHUNK`] bytes, at most
//! `snapshot_rate` bytes per second, so that a member catching up never takes
//! the bandwidth the cluster needs to keep serving (SharkLock's bounded
//! snapshot sending).

use std::collections::HashMap;
use std::future::{ready, Future};
use std::io::Cursor;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::{Stream, StreamExt};
use locksmith_proto::raft as pb;
use locksmith_proto::raft::raft_client::RaftClient;
use locksmith_proto::transport::{self, Connector};
use openraft::base::{BoxFuture, BoxStream};
use openraft::errors::{
    Fatal, NetworkError, RPCError, RaftError, ReplicationClosed, StreamingError, Unreachable,
};
use openraft::network::v2::RaftNetworkV2;
use openraft::network::{stream_append_sequential, RPCOption, RaftNetworkFactory};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, SnapshotResponse, StreamAppendResult,
    TransferLeaderRequest, TransferLeaderResponse, VoteRequest, VoteResponse,
};
use openraft::storage::RaftStateMachine;
use openraft::type_config::alias::{SnapshotMetaOf, SnapshotOf, VoteOf};
use openraft::{BasicNode, OptionalSend};
use serde::de::DeserializeOwned;
use serde::Serialize;
use tonic::service::interceptor::{InterceptedService, Interceptor};
use tonic::transport::{Channel, ClientTlsConfig, Endpoint};
use tonic::{Request, Response, Status, Streaming};

use super::append_stream::{AppendSession, Connections, Route};
use super::commit_notices::CommitNotices;
use super::TypeConfig;
use crate::tls::{MemberCheck, PeerTls};

/// Bytes of snapshot per chunk on the wire.
pub(crate) const SNAPSHOT_CHUNK: usize = 1 << 20;

/// Longest a replication session waits for a follower with requests to
/// answer to answer one, at the least. openraft's TTL for a session is ¾
/// of a heartbeat interval (37.5 ms), but a follower may take longer over
/// a request of big entries (up to `raft::ENTRIES_PER_APPEND` entries of
/// about a MiB, written and synced on a busy disk): ending the session
/// each time, the leader would send the same entries again and again, and
/// the follower would never catch up. Heartbeats have their own timeout.
const REPLICATION_PROGRESS: Duration = Duration::from_secs(2);

/// How often a member pings each peer's connection, and how long it waits
/// for the pong before it drops the connection; the channel then connects
/// afresh. A connection can go silent without closing (the peer's host
/// vanished, a firewall or NAT forgot the flow, segments lost for good):
/// every call on it then times out, and without the ping nothing would
/// ever end it. A leader whose replication connection to its followers
/// had gone silent while its heartbeats (on connections of their own) got
/// through kept leading and committed nothing, for good.
const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(1);
const KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(1);

/// Largest snapshot a member accepts from a peer: a bound on what one
/// (possibly confused) peer can make this member buffer.
const MAX_SNAPSHOT_BYTES: usize = 16 << 30;

/// Creates a [`Peer`] for each member openraft replicates to.
#[derive(Clone)]
pub(crate) struct PeerNetwork {
    /// Bytes per second a snapshot is sent at, at most.
    pub snapshot_rate: u64,
    /// With TLS on: this member's certificate and the CA of its peers'.
    pub tls: Option<PeerTls>,
    /// The largest frame a member takes on the framed replication stream:
    /// its message limit.
    max_frame: usize,
    /// Reaches the members through this instead of TCP (a simulated
    /// network's, see `Environment::connector`).
    pub connector: Option<Connector>,
    /// One [`Link`] per member, shared by every [`Peer`] openraft makes
    /// towards it (a replication session, the heartbeats, an election).
    links: Arc<Mutex<HashMap<u64, Arc<Link>>>>,
}

impl PeerNetwork {
    pub(crate) fn new(snapshot_rate: u64, tls: Option<PeerTls>, max_frame: usize) -> PeerNetwork {
        PeerNetwork {
            snapshot_rate,
            tls,
            max_frame,
            connector: None,
            links: Arc::default(),
        }
    }

    /// The same network, reaching the members through `connector` if given.
    pub(crate) fn connecting_with(mut self, connector: Option<Connector>) -> PeerNetwork {
        self.connector = connector;
        self
    }

    fn link(&self, member: u64, addr: &str) -> Arc<Link> {
        let mut links = self.links.lock().unwrap_or_else(|e| e.into_inner());
        let link = links
            .entry(member)
            .or_insert_with(|| Link::new(member, addr));
        if link.addr != addr {
            *link = Link::new(member, addr);
        }
        link.clone()
    }
}

/// Whether a member answered this one's last call, so that a member that
/// stops answering is logged once, and its return once. openraft logs every
/// failed call at warn, about twenty lines a second for a member that is
/// down (its heartbeats); the server's default filter keeps only openraft's
/// errors.
pub(crate) struct Link {
    member: u64,
    addr: String,
    silent: AtomicBool,
    /// Told when the member answers again after a silence.
    revived: tokio::sync::Notify,
    /// The framed replication stream's connections towards the member.
    connections: Arc<Connections>,
}

impl Link {
    fn new(member: u64, addr: &str) -> Arc<Link> {
        Arc::new(Link {
            member,
            addr: addr.to_owned(),
            silent: AtomicBool::new(false),
            revived: tokio::sync::Notify::new(),
            connections: Arc::default(),
        })
    }

    /// The member answered, with anything (an error of its own is an answer).
    /// Called for every answer: a read only, unless the member was silent.
    fn answered(&self) {
        if self.silent.load(Ordering::Relaxed) && self.silent.swap(false, Ordering::Relaxed) {
            tracing::info!(member = self.member, addr = %self.addr, "member answers again");
            self.revived.notify_waiters();
        }
    }

    /// The member did not answer: `why`.
    fn silent(&self, why: &dyn std::fmt::Display) {
        if !self.silent.swap(true, Ordering::Relaxed) {
            tracing::warn!(member = self.member, addr = %self.addr, %why, "member does not answer");
        }
    }

    /// A call ended in `status`. tonic gives a status made from a transport
    /// error (no connection, a connection reset under a stream) that error
    /// as its source, or says "unavailable"; a status the member sent has
    /// neither.
    fn ended(&self, status: &Status) {
        let transport = std::error::Error::source(status).is_some();
        if transport || status.code() == tonic::Code::Unavailable {
            self.silent(&status.message());
        } else {
            self.answered();
        }
    }
}

impl RaftNetworkFactory<TypeConfig> for PeerNetwork {
    type Network = Peer;

    /// Does not connect: the channel connects on first use and reconnects by
    /// itself, as openraft expects of a factory.
    ///
    /// Cancel safety: safe, no await.
    async fn new_client(&mut self, target: u64, node: &BasicNode) -> Peer {
        let grpc_tls = self.tls.as_ref().map(|tls| tls.grpc.clone());
        let channel = match peer_endpoint(&node.addr, grpc_tls) {
            Ok(endpoint) => {
                let endpoint = endpoint
                    .connect_timeout(Duration::from_secs(1))
                    .http2_keep_alive_interval(KEEPALIVE_INTERVAL)
                    .keep_alive_timeout(KEEPALIVE_TIMEOUT)
                    .keep_alive_while_idle(true)
                    .tcp_nodelay(true);
                Some(transport::channel(endpoint, self.connector.as_ref()))
            }
            Err(error) => {
                let addr = &node.addr;
                tracing::error!(%addr, %error, "a member's address is not a valid URI");
                None
            }
        };
        Peer {
            addr: node.addr.clone(),
            client: channel.map(RaftClient::new),
            snapshot_rate: self.snapshot_rate,
            unary_append: false,
            link: self.link(target, &node.addr),
            framed_tls: self.tls.as_ref().map(|tls| tls.framed.clone()),
            connector: self.connector.clone(),
            max_frame: self.max_frame,
        }
    }
}

/// The endpoint of the member at `addr` (`host:port`): over TLS with
/// `tls`, presenting this member's certificate.
pub(crate) fn peer_endpoint(
    addr: &str,
    tls: Option<ClientTlsConfig>,
) -> Result<Endpoint, tonic::transport::Error> {
    match tls {
        Some(tls) => Endpoint::from_shared(format!("https://{addr}"))?.tls_config(tls),
        None => Endpoint::from_shared(format!("http://{addr}")),
    }
}

/// The sending side towards one member.
pub(crate) struct Peer {
    addr: String,
    /// `None` when the member's address does not parse (every call fails).
    client: Option<RaftClient<Channel>>,
    snapshot_rate: u64,
    /// The peer answered `StreamAppend` with "unimplemented": it is of an
    /// earlier version, and is sent a call per AppendEntries from then on.
    unary_append: bool,
    link: Arc<Link>,
    /// How the framed replication stream reaches the member.
    framed_tls: Option<Arc<rustls::ClientConfig>>,
    connector: Option<Connector>,
    max_frame: usize,
}

impl Peer {
    fn client(&self) -> Result<RaftClient<Channel>, Unreachable<TypeConfig>> {
        self.client.clone().ok_or_else(|| {
            Unreachable::from_string(format!("invalid member address {:?}", self.addr))
        })
    }

    /// One unary call: encode, send within `ttl`, decode the remote
    /// `Result`.
    ///
    /// Cancel safety: a dropped call (or one timed out) may or may not have
    /// reached the peer, which may act on it; its answer is lost. Nothing
    /// changes here.
    async fn call<Req, Resp, E, F, Fut>(
        &self,
        request: &Req,
        ttl: Duration,
        send: F,
    ) -> Result<Resp, RPCError<TypeConfig, E>>
    where
        Req: Serialize,
        Resp: DeserializeOwned,
        E: std::error::Error + DeserializeOwned,
        F: FnOnce(RaftClient<Channel>, pb::Payload) -> Fut,
        Fut: Future<Output = Result<Response<pb::Payload>, Status>>,
    {
        let payload = pb::Payload {
            postcard: encode(request).map_err(|e| RPCError::Network(NetworkError::new(&e)))?,
        };
        let client = self.client()?;
        let reply = tokio::time::timeout(ttl, send(client, payload))
            .await
            .map_err(|_| {
                let why = format!("no answer from {} within {ttl:?}", self.addr);
                self.link.silent(&why);
                RPCError::Network(NetworkError::from_string(why))
            })?
            .map_err(|status| {
                self.link.ended(&status);
                status_to_rpc_error(&self.addr, status)
            })?;
        self.link.answered();
        let result: Result<Resp, E> = decode(&reply.into_inner().postcard)
            .map_err(|e| RPCError::Network(NetworkError::new(&e)))?;
        result.map_err(|e| RPCError::RemoteError(openraft::errors::RemoteError::new(0, e)))
    }
}

impl RaftNetworkV2<TypeConfig> for Peer {
    type SnapshotData = Cursor<Vec<u8>>;

    /// Used for a peer without replication streams only; given as long as
    /// a stream's request ([`REPLICATION_PROGRESS`]), for the same reason.
    ///
    /// Cancel safety: as `call`'s: the peer may have appended the entries;
    /// openraft sends them again, and appending them twice is harmless.
    async fn append_entries(
        &mut self,
        request: AppendEntriesRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<AppendEntriesResponse<TypeConfig>, RPCError<TypeConfig>> {
        let ttl = option.soft_ttl().max(REPLICATION_PROGRESS);
        let result: Result<_, RPCError<TypeConfig, RaftError<TypeConfig>>> = self
            .call(&request, ttl, |mut c, p| async move { c.append(p).await })
            .await;
        result.map_err(flatten_remote)
    }

    /// One stream for the whole replication session, instead of a call per
    /// request: each request goes out as soon as it is made, without waiting
    /// for the answer to the one before (docs/BENCHMARKS.md, "Where that CPU
    /// goes"). The stream is framed on a connection of its own (module
    /// `append_stream`), or, to a member without it or while that
    /// connection opens, the `StreamAppend` call. A request that only tells
    /// the follower a commit index waits briefly for the next one to carry
    /// it ([`CommitNotices`]).
    ///
    /// The answers come back in order. A session whose peer has requests to
    /// answer but answers none within [`REPLICATION_PROGRESS`] ends with an
    /// error, so a peer cut off is noticed; a session with nothing to answer may stay
    /// idle. A peer without `StreamAppend` ends the session it refused with
    /// an error and gets every later one a call at a time (openraft sends
    /// the refused requests again).
    ///
    /// Cancel safety: dropping either stream ends the session; openraft sends
    /// what was not answered again in its next one.
    fn stream_append<'s, S>(
        &'s mut self,
        input: S,
        option: RPCOption,
    ) -> BoxFuture<
        's,
        Result<
            BoxStream<'s, Result<StreamAppendResult<TypeConfig>, RPCError<TypeConfig>>>,
            RPCError<TypeConfig>,
        >,
    >
    where
        S: Stream<Item = AppendEntriesRequest<TypeConfig>> + OptionalSend + Unpin + 'static,
    {
        if self.unary_append {
            return stream_append_sequential(self, input, option);
        }
        Box::pin(async move {
            // openraft waits out its backoff when the first request is taken:
            // take it before connecting, so that an unreachable peer is tried
            // again at that pace and not in a tight loop.
            let mut input = input;
            let Some(first) = input.next().await else {
                return Ok(futures::stream::empty().boxed());
            };
            let input = futures::stream::once(ready(first)).chain(input);
            let input = CommitNotices::new(input);
            let sent = Arc::new(AtomicU64::new(0));
            let addr = self.addr.clone();
            let ttl = option.soft_ttl();
            let link = self.link.clone();
            let no_answer = |link: &Link| {
                let why = format!("no answer from {addr} within {ttl:?}");
                link.silent(&why);
                RPCError::Network(NetworkError::from_string(why))
            };
            let connections = &link.connections;
            let route = connections.route(
                &addr,
                self.framed_tls.clone(),
                self.connector.as_ref(),
                self.max_frame,
            );
            let route = tokio::time::timeout(ttl, route)
                .await
                .map_err(|_| no_answer(&link))?
                .map_err(|status| {
                    link.ended(&status);
                    status_to_rpc_error(&addr, status)
                })?;
            if let Route::Framed(connection) = route {
                let answers =
                    AppendSession::new(connection, input, sent.clone(), connections.clone());
                return Ok(appended(answers, sent, ttl.max(REPLICATION_PROGRESS), link).boxed());
            }
            let mut client = self.client()?;
            let counted = sent.clone();
            // A request that does not encode ends the session: sending the
            // ones after it would leave a gap.
            let requests = input.scan((), move |_, request| {
                let payload = match encode(&request) {
                    Ok(postcard) => Some(pb::Payload { postcard }),
                    Err(error) => {
                        tracing::warn!(%error, "an AppendEntries request does not encode");
                        None
                    }
                };
                counted.fetch_add(u64::from(payload.is_some()), Ordering::Relaxed);
                ready(payload)
            });
            let answers = tokio::time::timeout(ttl, client.stream_append(requests))
                .await
                .map_err(|_| no_answer(&link))?
                .map_err(|status| {
                    link.ended(&status);
                    if status.code() == tonic::Code::Unimplemented {
                        tracing::warn!(%addr, "a member without replication streams (an earlier version): replicating to it a call at a time");
                        self.unary_append = true;
                    }
                    status_to_rpc_error(&addr, status)
                })?
                .into_inner()
                .map(|answer| answer.map(|payload| payload.postcard));
            Ok(appended(answers, sent, ttl.max(REPLICATION_PROGRESS), link).boxed())
        })
    }

    /// Asks the peer for its vote.
    ///
    /// Cancel safety: as `call`'s: the peer may have granted and saved the
    /// vote, unheard; asked again for the same vote, it grants it again.
    async fn vote(
        &mut self,
        request: VoteRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<VoteResponse<TypeConfig>, RPCError<TypeConfig>> {
        let result: Result<_, RPCError<TypeConfig, RaftError<TypeConfig>>> = self
            .call(&request, option.soft_ttl(), |mut c, p| async move {
                c.vote(p).await
            })
            .await;
        result.map_err(flatten_remote)
    }

    /// A peer that answers "unimplemented" (an earlier version, during a
    /// rolling upgrade) grants: openraft's own answer for a network without
    /// PreVote, so that the election goes on as it would without PreVote.
    /// An unreachable peer grants nothing.
    ///
    /// Cancel safety: a dropped call changes nothing on either side (a
    /// PreVote changes no term or vote).
    async fn pre_vote(
        &mut self,
        request: VoteRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<VoteResponse<TypeConfig>, RPCError<TypeConfig>> {
        let granted: Result<_, RaftError<TypeConfig>> =
            Ok(VoteResponse::<TypeConfig>::new(request.vote, None, true));
        let granted = pb::Payload {
            postcard: encode(&granted).map_err(|e| RPCError::Network(NetworkError::new(&e)))?,
        };
        let result: Result<_, RPCError<TypeConfig, RaftError<TypeConfig>>> = self
            .call(&request, option.soft_ttl(), |mut c, p| async move {
                match c.pre_vote(p).await {
                    Err(status) if status.code() == tonic::Code::Unimplemented => {
                        Ok(Response::new(granted))
                    }
                    answer => answer,
                }
            })
            .await;
        result.map_err(flatten_remote)
    }

    /// Tells the peer that this leader hands leadership over.
    ///
    /// Cancel safety: as `call`'s: the peer may have acted on it (given up
    /// this leader's lease, or, as the one chosen, started an election).
    async fn transfer_leader(
        &mut self,
        request: TransferLeaderRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<TransferLeaderResponse<TypeConfig>, RPCError<TypeConfig>> {
        let result: Result<_, RPCError<TypeConfig, Fatal<TypeConfig>>> = self
            .call(&request, option.soft_ttl(), |mut c, p| async move {
                c.transfer_leader(p).await
            })
            .await;
        result.map_err(flatten_remote)
    }

    /// The whole transfer may take as long as [`snapshot_time`] allows for
    /// its size: openraft's TTL here (its `install_snapshot_timeout`, 200 ms)
    /// is meant for a call, and a snapshot of a big table paced at the
    /// bounded rate takes seconds, then the peer decodes and writes it.
    ///
    /// Cancel safety: dropping the future (or `cancel` firing) ends the
    /// stream; the receiver discards an incomplete snapshot.
    async fn full_snapshot(
        &mut self,
        vote: VoteOf<TypeConfig>,
        snapshot: SnapshotOf<TypeConfig, Cursor<Vec<u8>>>,
        cancel: impl Future<Output = ReplicationClosed> + Send + 'static,
        option: RPCOption,
    ) -> Result<SnapshotResponse<TypeConfig>, StreamingError<TypeConfig>> {
        let header = encode(&(vote, snapshot.meta))
            .map_err(|e| StreamingError::Network(NetworkError::new(&e)))?;
        let data = snapshot.snapshot.into_inner();
        let limit = option.hard_ttl() + snapshot_time(data.len(), self.snapshot_rate);
        let chunks = chunks(header, data, self.snapshot_rate);
        let mut client = self.client()?;
        let link = self.link.clone();
        let send = async move {
            client
                .install_snapshot(chunks)
                .await
                .inspect(|_| link.answered())
                .map_err(|status| {
                    link.ended(&status);
                    status_to_streaming_error(&self.addr, status)
                })
        };
        let reply = tokio::select! {
            closed = cancel => return Err(StreamingError::Closed(closed)),
            reply = tokio::time::timeout(limit, send) => reply
                .map_err(|_| StreamingError::Network(NetworkError::from_string(
                    format!("snapshot not installed within {limit:?}"))))??,
        };
        let result: Result<SnapshotResponse<TypeConfig>, Fatal<TypeConfig>> =
            decode(&reply.into_inner().postcard)
                .map_err(|e| StreamingError::Network(NetworkError::new(&e)))?;
        result.map_err(|fatal| StreamingError::Network(NetworkError::new(&fatal)))
    }
}

/// How long a peer may take over a snapshot of `bytes`: twice its sending
/// time at `rate`, and for decoding and writing it on the peer 10 s plus a
/// second per 4 MiB (a slow disk, a debug build). A peer that stops
/// answering is given up on after that; one that goes away, at once.
fn snapshot_time(bytes: usize, rate: u64) -> Duration {
    const INSTALL_RATE: f64 = (4 << 20) as f64;
    let bytes = bytes as f64;
    Duration::from_secs_f64(2.0 * bytes / rate.max(1) as f64 + bytes / INSTALL_RATE + 10.0)
}

/// The answers of a replication stream (each postcard-encoded), in order:
/// ends at the first error, or with an error when `sent` requests wait for
/// an answer and none came within `ttl`, or when the member answers again
/// after a silence (on another session) while requests wait here: those
/// were sent into the silence, and a new session sends them again at once
/// instead of waiting out `ttl` (after a partition, a connection that lost
/// them, or TCP's backed-off retransmission, can take seconds).
fn appended(
    answers: impl Stream<Item = Result<Vec<u8>, Status>> + Unpin + Send,
    sent: Arc<AtomicU64>,
    ttl: Duration,
    link: Arc<Link>,
) -> impl Stream<Item = Result<StreamAppendResult<TypeConfig>, RPCError<TypeConfig>>> {
    futures::stream::unfold(Some((answers, 0u64)), move |state| {
        let (sent, link) = (sent.clone(), link.clone());
        async move {
            let addr = &link.addr;
            let (mut answers, mut answered) = state?;
            let item = loop {
                let revived = link.revived.notified();
                // `next` keeps its progress in the stream: cancel safe.
                let answer = tokio::select! {
                    answer = tokio::time::timeout(ttl, answers.next()) => answer,
                    () = revived => {
                        if sent.load(Ordering::Relaxed) == answered {
                            continue;
                        }
                        let why = format!(
                            "{addr} answers again, and this replication stream still waits \
                             for answers to requests sent while it did not"
                        );
                        break Err(RPCError::Network(NetworkError::from_string(why)));
                    }
                };
                match answer {
                    Err(_) if sent.load(Ordering::Relaxed) == answered => continue,
                    Err(_) => {
                        let why = format!("{addr} answered no AppendEntries within {ttl:?}");
                        link.silent(&why);
                        break Err(RPCError::Network(NetworkError::from_string(why)));
                    }
                    Ok(Some(Err(status))) => {
                        link.ended(&status);
                        break Err(status_to_rpc_error(addr, status));
                    }
                    Ok(None) => return None,
                    Ok(Some(Ok(answer))) => {
                        link.answered();
                        answered += 1;
                        break decode::<Result<StreamAppendResult<TypeConfig>, Fatal<TypeConfig>>>(
                            &answer,
                        )
                        .map_err(|e| RPCError::Network(NetworkError::new(&e)))
                        .and_then(|result| {
                            result.map_err(|fatal| {
                                RPCError::Network(NetworkError::from_string(format!(
                                    "{addr} stopped: {fatal}"
                                )))
                            })
                        });
                    }
                }
            };
            let next = item.is_ok().then_some((answers, answered));
            Some((item, next))
        }
    })
}

/// The snapshot as a stream of chunks, the header on the first one, paced to
/// `rate` bytes per second.
fn chunks(header: Vec<u8>, data: Vec<u8>, rate: u64) -> impl Stream<Item = pb::SnapshotChunk> {
    let pause = Duration::from_secs_f64(SNAPSHOT_CHUNK as f64 / rate.max(1) as f64);
    let count = data.len().div_ceil(SNAPSHOT_CHUNK).max(1);
    futures::stream::iter(0..count).then(move |i| {
        let header = if i == 0 { header.clone() } else { Vec::new() };
        let end = ((i + 1) * SNAPSHOT_CHUNK).min(data.len());
        let data = data[i * SNAPSHOT_CHUNK..end].to_vec();
        async move {
            if i > 0 {
                tokio::time::sleep(pause).await;
            }
            pb::SnapshotChunk { header, data }
        }
    })
}

/// The receiving side: hands each message to the local Raft.
pub(crate) struct RaftService<SM>
where
    SM: RaftStateMachine<TypeConfig, SnapshotData = Cursor<Vec<u8>>>,
{
    raft: openraft::Raft<TypeConfig, SM>,
}

/// The Raft service as a member serves it: messages of up to
/// `max_message_bytes`, from members only. `members` judges a call on its
/// connection's certificate before any of its message is read, so that a
/// caller who is not a member cannot make this member read (and buffer) a
/// message that big.
pub(crate) fn raft_server<SM>(
    raft: openraft::Raft<TypeConfig, SM>,
    members: MemberCheck,
    max_message_bytes: usize,
) -> InterceptedService<
    pb::raft_server::RaftServer<RaftService<SM>>,
    impl Interceptor + Clone + Send + Sync + 'static,
>
where
    SM: RaftStateMachine<TypeConfig, SnapshotData = Cursor<Vec<u8>>>,
{
    let service = pb::raft_server::RaftServer::new(RaftService { raft })
        .max_decoding_message_size(max_message_bytes);
    InterceptedService::new(service, move |request: Request<()>| {
        members.check(&request).map(|()| request)
    })
}

#[tonic::async_trait]
impl<SM> pb::raft_server::Raft for RaftService<SM>
where
    SM: RaftStateMachine<TypeConfig, SnapshotData = Cursor<Vec<u8>>>,
{
    /// One AppendEntries from a leader of an earlier version (no streams).
    ///
    /// Cancel safety (tonic drops it when the leader goes away): once in
    /// openraft's queue, the entries are appended anyway and the answer is
    /// dropped; the leader sends again what it heard no answer for.
    async fn append(&self, request: Request<pb::Payload>) -> Result<Response<pb::Payload>, Status> {
        let request: AppendEntriesRequest<TypeConfig> = decode_request(request)?;
        reply(&self.raft.append_entries(request).await)
    }

    type StreamAppendStream = BoxStream<'static, Result<pb::Payload, Status>>;

    /// Feeds the leader's requests to openraft, which works on several at
    /// once, and sends the answers back in order. A request that does not
    /// decode ends the stream (the leader starts another).
    ///
    /// Cancel safety: a stream that ends early leaves what was appended.
    async fn stream_append(
        &self,
        request: Request<Streaming<pb::Payload>>,
    ) -> Result<Response<Self::StreamAppendStream>, Status> {
        let requests = request.into_inner().scan((), |_, payload| {
            let request = payload
                .map_err(|status| status.to_string())
                .and_then(|p| decode(&p.postcard).map_err(|e| e.to_string()));
            ready(match request {
                Ok(request) => Some(request),
                Err(error) => {
                    tracing::warn!(%error, "a replication stream from the leader ended");
                    None
                }
            })
        });
        let answers = self
            .raft
            .stream_append(requests)
            .map(|answer| encode(&answer).map(|postcard| pb::Payload { postcard }))
            .map(|encoded| encoded.map_err(|e| Status::internal(e.to_string())));
        Ok(Response::new(answers.boxed()))
    }

    /// A candidate's request for this member's vote.
    ///
    /// Cancel safety: once in openraft's queue, the vote is decided (and
    /// saved if granted) whether or not the candidate hears the answer.
    async fn vote(&self, request: Request<pb::Payload>) -> Result<Response<pb::Payload>, Status> {
        let request: VoteRequest<TypeConfig> = decode_request(request)?;
        reply(&self.raft.vote(request).await)
    }

    /// Changes no term or vote here: it only says whether this member would
    /// vote for the sender.
    ///
    /// Cancel safety: safe, it changes nothing.
    async fn pre_vote(
        &self,
        request: Request<pb::Payload>,
    ) -> Result<Response<pb::Payload>, Status> {
        let request: VoteRequest<TypeConfig> = decode_request(request)?;
        reply(&self.raft.pre_vote(request).await)
    }

    /// The leader hands leadership over (to this member, or to another).
    ///
    /// Cancel safety: dropped before it reaches openraft's queue (the chosen
    /// member first waits until its log holds the leader's last entry), it
    /// does nothing; after, openraft acts on it, answer heard or not.
    async fn transfer_leader(
        &self,
        request: Request<pb::Payload>,
    ) -> Result<Response<pb::Payload>, Status> {
        let request: TransferLeaderRequest<TypeConfig> = decode_request(request)?;
        reply(&self.raft.handle_transfer_leader(request).await)
    }

    /// Cancel safety: a stream that ends early installs nothing.
    async fn install_snapshot(
        &self,
        request: Request<Streaming<pb::SnapshotChunk>>,
    ) -> Result<Response<pb::Payload>, Status> {
        let mut chunks = request.into_inner();
        let first = chunks
            .message()
            .await?
            .ok_or_else(|| Status::invalid_argument("empty snapshot stream"))?;
        let (vote, meta): (VoteOf<TypeConfig>, SnapshotMetaOf<TypeConfig>) =
            decode(&first.header).map_err(|e| Status::invalid_argument(e.to_string()))?;
        let mut data = first.data;
        while let Some(chunk) = chunks.message().await? {
            if data.len() + chunk.data.len() > MAX_SNAPSHOT_BYTES {
                return Err(Status::resource_exhausted(format!(
                    "snapshot larger than {MAX_SNAPSHOT_BYTES} bytes"
                )));
            }
            data.extend_from_slice(&chunk.data);
        }
        let snapshot = SnapshotOf::<TypeConfig, Cursor<Vec<u8>>> {
            meta,
            snapshot: Cursor::new(data),
        };
        reply(&self.raft.install_full_snapshot(vote, snapshot).await)
    }
}

fn encode<T: Serialize>(value: &T) -> Result<Vec<u8>, postcard::Error> {
    postcard::to_allocvec(value)
}

fn decode<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, postcard::Error> {
    postcard::from_bytes(bytes)
}

fn decode_request<T: DeserializeOwned>(request: Request<pb::Payload>) -> Result<T, Status> {
    decode(&request.into_inner().postcard)
        .map_err(|e| Status::invalid_argument(format!("undecodable Raft message: {e}")))
}

fn reply<T: Serialize>(result: &T) -> Result<Response<pb::Payload>, Status> {
    let postcard = encode(result).map_err(|e| Status::internal(e.to_string()))?;
    Ok(Response::new(pb::Payload { postcard }))
}

/// A member that cannot be reached is backed off from; other failures are
/// retried at once.
fn status_to_rpc_error<E: std::error::Error>(
    addr: &str,
    status: Status,
) -> RPCError<TypeConfig, E> {
    let message = format!("{addr}: {}", status.message());
    match status.code() {
        tonic::Code::Unavailable => RPCError::Unreachable(Unreachable::from_string(message)),
        _ => RPCError::Network(NetworkError::from_string(message)),
    }
}

fn status_to_streaming_error(addr: &str, status: Status) -> StreamingError<TypeConfig> {
    let message = format!("{addr}: {}", status.message());
    match status.code() {
        tonic::Code::Unavailable => StreamingError::Unreachable(Unreachable::from_string(message)),
        _ => StreamingError::Network(NetworkError::from_string(message)),
    }
}

/// openraft's network API has no remote error for these calls: a remote
/// `RaftError` or `Fatal` means the peer could not serve, i.e. a network
/// failure from the sender's point of view.
fn flatten_remote<E: std::error::Error>(error: RPCError<TypeConfig, E>) -> RPCError<TypeConfig> {
    match error {
        RPCError::Timeout(t) => RPCError::Timeout(t),
        RPCError::Unreachable(u) => RPCError::Unreachable(u),
        RPCError::Network(n) => RPCError::Network(n),
        RPCError::RemoteError(remote) => {
            RPCError::Network(NetworkError::from_string(remote.to_string()))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use openraft::type_config::alias::VoteOf;

    /// The far side of the tests' peers.
    enum Fake {
        /// Takes replication streams and never answers, as a member cut off
        /// behind a network that drops its packets would.
        Silent,
        /// A member of the version before replication streams and PreVote:
        /// it answers AppendEntries calls.
        Earlier,
        /// A member of the version before the framed replication stream:
        /// it answers every request of a `StreamAppend` call.
        GrpcStreams,
    }

    fn unimplemented<T>() -> Result<T, Status> {
        Err(Status::unimplemented("not here"))
    }

    #[tonic::async_trait]
    impl pb::raft_server::Raft for Fake {
        type StreamAppendStream = BoxStream<'static, Result<pb::Payload, Status>>;

        async fn append(
            &self,
            request: Request<pb::Payload>,
        ) -> Result<Response<pb::Payload>, Status> {
            let Fake::Earlier = self else {
                return unimplemented();
            };
            let _: AppendEntriesRequest<TypeConfig> = decode_request(request)?;
            let answer: Result<_, RaftError<TypeConfig>> =
                Ok(AppendEntriesResponse::<TypeConfig>::Success);
            reply(&answer)
        }

        async fn stream_append(
            &self,
            requests: Request<Streaming<pb::Payload>>,
        ) -> Result<Response<Self::StreamAppendStream>, Status> {
            match self {
                Fake::Silent => Ok(Response::new(futures::stream::pending().boxed())),
                Fake::Earlier => unimplemented(),
                Fake::GrpcStreams => {
                    let answers = requests.into_inner().map(|request| {
                        let _: AppendEntriesRequest<TypeConfig> = decode(&request?.postcard)
                            .map_err(|e| Status::invalid_argument(e.to_string()))?;
                        let answer: Result<StreamAppendResult<TypeConfig>, Fatal<TypeConfig>> =
                            Ok(Ok(None));
                        Ok(pb::Payload {
                            postcard: encode(&answer).unwrap(),
                        })
                    });
                    Ok(Response::new(answers.boxed()))
                }
            }
        }

        async fn vote(&self, _: Request<pb::Payload>) -> Result<Response<pb::Payload>, Status> {
            unimplemented()
        }

        async fn pre_vote(&self, _: Request<pb::Payload>) -> Result<Response<pb::Payload>, Status> {
            unimplemented()
        }

        async fn transfer_leader(
            &self,
            _: Request<pb::Payload>,
        ) -> Result<Response<pb::Payload>, Status> {
            unimplemented()
        }

        async fn install_snapshot(
            &self,
            _: Request<Streaming<pb::SnapshotChunk>>,
        ) -> Result<Response<pb::Payload>, Status> {
            unimplemented()
        }
    }

    /// A [`Peer`] towards `service`, served on a port of its own.
    async fn peer_towards(service: Fake) -> Peer {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(pb::raft_server::RaftServer::new(service))
                .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener)),
        );
        let mut network = PeerNetwork::new(1 << 20, None, 1 << 20);
        network
            .new_client(2, &BasicNode::new(addr.to_string()))
            .await
    }

    /// A TCP stream that goes silent on demand without closing: what it
    /// reads never comes, what it writes is swallowed (a peer whose host
    /// vanished, a flow a firewall forgot, segments lost for good).
    struct Silenceable {
        stream: tokio::net::TcpStream,
        silent: Arc<AtomicBool>,
    }

    impl tokio::io::AsyncRead for Silenceable {
        fn poll_read(
            mut self: std::pin::Pin<&mut Self>,
            cx: &mut std::task::Context<'_>,
            buf: &mut tokio::io::ReadBuf<'_>,
        ) -> std::task::Poll<std::io::Result<()>> {
            if self.silent.load(Ordering::Relaxed) {
                return std::task::Poll::Pending;
            }
            std::pin::Pin::new(&mut self.stream).poll_read(cx, buf)
        }
    }

    impl tokio::io::AsyncWrite for Silenceable {
        fn poll_write(
            mut self: std::pin::Pin<&mut Self>,
            cx: &mut std::task::Context<'_>,
            buf: &[u8],
        ) -> std::task::Poll<std::io::Result<usize>> {
            if self.silent.load(Ordering::Relaxed) {
                return std::task::Poll::Ready(Ok(buf.len()));
            }
            std::pin::Pin::new(&mut self.stream).poll_write(cx, buf)
        }

        fn poll_flush(
            mut self: std::pin::Pin<&mut Self>,
            cx: &mut std::task::Context<'_>,
        ) -> std::task::Poll<std::io::Result<()>> {
            std::pin::Pin::new(&mut self.stream).poll_flush(cx)
        }

        fn poll_shutdown(
            mut self: std::pin::Pin<&mut Self>,
            cx: &mut std::task::Context<'_>,
        ) -> std::task::Poll<std::io::Result<()>> {
            std::pin::Pin::new(&mut self.stream).poll_shutdown(cx)
        }
    }

    /// A connection to a peer that goes silent without closing is dropped
    /// and replaced: later calls reach the peer again. Without it a leader
    /// whose replication connection went silent (while its heartbeats got
    /// through on another) kept leading and committed nothing, for good
    /// (the simulator's seed 10 of the mixed workload).
    #[tokio::test]
    async fn a_connection_gone_silent_is_replaced() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(pb::raft_server::RaftServer::new(Fake::Earlier))
                .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener)),
        );
        let silent = Arc::new(AtomicBool::new(false));
        let first = Arc::new(AtomicBool::new(true));
        let (silence, dialed) = (silent.clone(), first.clone());
        let connector = Connector::new(move |addr: String| {
            // Only the first connection can be silenced; later ones work.
            let silent = if dialed.swap(false, Ordering::Relaxed) {
                silence.clone()
            } else {
                Arc::default()
            };
            async move {
                let stream = tokio::net::TcpStream::connect(addr).await?;
                Ok(Silenceable { stream, silent })
            }
        });
        let mut network = PeerNetwork::new(1 << 20, None, 1 << 20).connecting_with(Some(connector));
        let mut peer = network
            .new_client(2, &BasicNode::new(addr.to_string()))
            .await;
        let pre_vote = || VoteRequest::<TypeConfig>::new(VoteOf::<TypeConfig>::new(2, 1), None);
        let option = RPCOption::new(Duration::from_millis(200));
        peer.pre_vote(pre_vote(), option.clone())
            .await
            .expect("the peer answers");
        silent.store(true, Ordering::Relaxed);
        assert!(
            peer.pre_vote(pre_vote(), option.clone()).await.is_err(),
            "the silent connection answers nothing"
        );
        let again = tokio::time::timeout(Duration::from_secs(10), async {
            while peer.pre_vote(pre_vote(), option.clone()).await.is_err() {}
        })
        .await;
        assert!(
            again.is_ok(),
            "no call reached the peer in 10 s after its connection went silent"
        );
    }

    /// A member is silent after a transport failure and answers again with
    /// any status it sent itself.
    #[test]
    fn a_link_tells_silence_from_an_answer() {
        let link = Link::new(2, "127.0.0.1:1");
        let is_silent = || link.silent.load(Ordering::Relaxed);
        link.ended(&Status::unavailable("tcp connect error"));
        assert!(is_silent());
        link.ended(&Status::internal("the member's own error"));
        assert!(!is_silent());
        let mut reset = Status::unknown("h2 protocol error");
        reset.set_source(Arc::new(std::io::Error::from(
            std::io::ErrorKind::ConnectionReset,
        )));
        link.ended(&reset);
        assert!(is_silent());
        link.answered();
        assert!(!is_silent());
    }

    fn heartbeat() -> AppendEntriesRequest<TypeConfig> {
        AppendEntriesRequest::<TypeConfig> {
            vote: VoteOf::<TypeConfig>::new_committed(1, 1),
            prev_log_id: None,
            leader_commit: None,
            entries: Vec::new(),
        }
    }

    /// A session whose peer leaves a request unanswered past
    /// [`REPLICATION_PROGRESS`] ends with an error, so that openraft notices
    /// and starts another.
    #[tokio::test]
    async fn a_replication_stream_left_unanswered_ends_on_its_own() {
        let mut peer = peer_towards(Fake::Silent).await;
        let ttl = Duration::from_millis(200);
        let mut answers = peer
            .stream_append(futures::stream::iter([heartbeat()]), RPCOption::new(ttl))
            .await
            .expect("the stream opens");
        let answer = tokio::time::timeout(Duration::from_secs(10), answers.next())
            .await
            .expect("the session ends on its own");
        match answer {
            Some(Err(RPCError::Network(error))) => {
                assert!(
                    error.to_string().contains("answered no AppendEntries"),
                    "{error}"
                )
            }
            other => panic!("expected the unanswered request to end the session: {other:?}"),
        }
    }

    /// During a rolling upgrade the leader may be newer than a follower:
    /// the session the follower refuses ends, and the next ones go a call
    /// at a time.
    #[tokio::test]
    async fn a_peer_without_replication_streams_is_replicated_to_a_call_at_a_time() {
        let mut peer = peer_towards(Fake::Earlier).await;
        let option = RPCOption::new(Duration::from_secs(5));
        let refused = peer
            .stream_append(futures::stream::iter([heartbeat()]), option.clone())
            .await
            .is_err();
        assert!(refused, "the refused session ends with an error");
        let mut answers = peer
            .stream_append(futures::stream::iter([heartbeat(), heartbeat()]), option)
            .await
            .expect("the next session starts");
        for _ in 0..2 {
            match answers.next().await {
                Some(Ok(Ok(_))) => {}
                other => panic!("expected the peer to take the request: {other:?}"),
            }
        }
        assert!(answers.next().await.is_none(), "two requests, two answers");
    }

    /// A session with requests unanswered ends as soon as the member
    /// answers again after a silence (on another session, a heartbeat): its
    /// requests went into the silence, and waiting out the replication
    /// timeout for them would hold every commit that long.
    #[tokio::test]
    async fn a_stream_waiting_through_a_silence_ends_when_the_member_answers_again() {
        let mut peer = peer_towards(Fake::Silent).await;
        let link = peer.link.clone();
        let option = RPCOption::new(Duration::from_millis(200));
        let mut answers = peer
            .stream_append(futures::stream::iter([heartbeat()]), option)
            .await
            .expect("the stream opens");
        let revive = async {
            // Once the request is out (the call's connection task sends it).
            tokio::time::sleep(Duration::from_millis(50)).await;
            link.silent(&"cut off");
            link.answered();
        };
        // Ended by the member's return, not by the replication timeout:
        // that one's error says "answered no AppendEntries".
        let (answer, ()) = tokio::join!(answers.next(), revive);
        match answer {
            Some(Err(RPCError::Network(error))) => {
                assert!(error.to_string().contains("answers again"), "{error}")
            }
            other => panic!("expected the session to end: {other:?}"),
        }
    }

    /// During a rolling upgrade the leader may be newer than a follower
    /// that replicates on `StreamAppend` but not on the framed stream: the
    /// follower closes the framed connection at its magic, and the same
    /// session goes on over the call, every request answered; so do the
    /// sessions after it.
    #[tokio::test]
    async fn a_peer_without_the_framed_stream_is_replicated_to_over_the_call() {
        let mut peer = peer_towards(Fake::GrpcStreams).await;
        let option = RPCOption::new(Duration::from_secs(5));
        for _ in 0..2 {
            let mut answers = peer
                .stream_append(futures::stream::iter([heartbeat()]), option.clone())
                .await
                .expect("the session starts");
            match answers.next().await {
                Some(Ok(Ok(None))) => {}
                other => panic!("expected the peer to take the request: {other:?}"),
            }
            assert!(answers.next().await.is_none(), "one request, one answer");
        }
    }

    /// A peer that knows no PreVote grants it, so an election during a
    /// rolling upgrade goes on as it would without PreVote.
    #[tokio::test]
    async fn a_peer_without_pre_vote_grants_it() {
        let mut peer = peer_towards(Fake::Earlier).await;
        let request = VoteRequest::<TypeConfig>::new(VoteOf::<TypeConfig>::new(2, 1), None);
        let answer = peer
            .pre_vote(request, RPCOption::new(Duration::from_secs(5)))
            .await
            .expect("an answer");
        assert!(
            answer.is_granted_to(&VoteOf::<TypeConfig>::new(2, 1)),
            "{answer:?}"
        );
    }
}
