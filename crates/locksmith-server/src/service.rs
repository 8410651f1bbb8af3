//! The gRPC service: turns calls and stream messages into [`Op`]s for the core.
//!
//! Each session stream's client batches are read by a task of its own
//! ([`SessionReader`]; a `Sessions` stream's, for all its channels, by a
//! [`ChannelsReader`]), checked for what can be checked without the lock
//! table (module `requests`, which also checks the unary calls) and
//! forwarded as one `Op::Stream` each; the replies come back from the
//! core through the stream's queue, one [`pb::ServerBatch`] per engine
//! batch, after their log records are durable. A malformed connection
//! (garbage on the port) is closed by the accept loop or the HTTP/2 layer
//! before it reaches this code. A framed session stream (module
//! `framed_session`) opens through [`Service::open_session`] as the call
//! does, so both share every check.
//!
//! With authentication on, every call first identifies its caller and every
//! request is checked against the caller's grants (module `auth`, which
//! decides): a denied request is answered `PERMISSION_DENIED` before it
//! reaches the core, and listings leave out what the caller may not inspect.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use locksmith_core::{Millis, SessionId};
use locksmith_proto::v1 as pb;
use pb::locksmith_server::Locksmith;
use tokio::sync::oneshot;
use tonic::{Request, Response, Status, Streaming};

use crate::auth::{Auth, Caller, Permission};
use crate::config::ServerConfig;
use crate::inbox::CoreSender;
use crate::op::{HoldArgs, Op, UnaryReply};
use crate::raft::propose::HeartbeatLease;
use crate::requests::{acquire_args, check_name, hold_args, secret_of, status_of, StreamReader};
use crate::session_channels::{ChannelSlots, ChannelsReader};
use crate::session_stream::{ClientBatches, ConnectionCounts, ConnectionSlot, SessionReader};
use crate::stream_queue::{ChannelsRx, StreamRx};

/// The `locksmith.v1.Locksmith` service. A clone serves the framed session
/// streams (module `framed_session`).
#[derive(Clone)]
pub(crate) struct Service {
    core: CoreSender,
    /// The id of the next session stream (or channel).
    next_stream: Arc<AtomicU64>,
    unary_ids: Arc<AtomicU64>,
    max_label: usize,
    open_timeout: Duration,
    /// Most unread bytes a session stream may queue for its client.
    max_stream_backlog: usize,
    /// Most locks in one page of `List`.
    max_list_page: usize,
    /// TTL bounds of a session: the engine's minimum, the server's cap.
    min_session_ttl: Millis,
    max_session_ttl: Millis,
    /// Session streams per client connection (by peer address).
    per_connection: ConnectionCounts,
    max_per_connection: usize,
    /// The auth file in force; `None`: authentication is off.
    auth: Option<Arc<Auth>>,
    /// Whether this member leads under its lease, for the streams' readers.
    lease: HeartbeatLease,
}

impl Service {
    pub(crate) fn new(
        core: CoreSender,
        unary_ids: Arc<AtomicU64>,
        config: &ServerConfig,
        auth: Option<Arc<Auth>>,
        lease: HeartbeatLease,
    ) -> Service {
        Service {
            core,
            next_stream: Arc::new(AtomicU64::new(1)),
            unary_ids,
            max_label: config.max_label_bytes,
            open_timeout: config.open_timeout,
            max_stream_backlog: config.max_stream_backlog_bytes,
            max_list_page: config.max_list_page.max(1),
            min_session_ttl: config.limits.min_ttl,
            max_session_ttl: (config.max_session_ttl.as_millis() as Millis)
                .min(config.limits.max_ttl),
            per_connection: Arc::default(),
            max_per_connection: config.max_sessions_per_connection,
            auth,
            lease,
        }
    }

    /// What a session stream's reader (or a `Sessions` stream's) checks its
    /// messages against.
    fn stream_reader(&self, caller: Caller, peer: Option<SocketAddr>) -> StreamReader {
        StreamReader {
            core: self.core.clone(),
            peer,
            ttl: (self.min_session_ttl, self.max_session_ttl),
            max_label: self.max_label,
            caller,
            lease: Some(self.lease.clone()),
        }
    }

    /// Opens a session stream for the caller of `request` (its headers and
    /// connection; the gRPC call's, or a framed stream's hello), reading
    /// the client's batches from `inbound`: the stream's outbound side.
    pub(crate) fn open_session<T>(
        &self,
        request: &Request<T>,
        inbound: ClientBatches,
    ) -> Result<StreamRx, Status> {
        let caller = self.caller(request)?;
        let peer = request.remote_addr();
        let slot = ConnectionSlot::take(&self.per_connection, peer, self.max_per_connection)?;
        let reader = self.stream_reader(caller, peer);
        let stream = self.next_stream.fetch_add(1, Ordering::Relaxed);
        Ok(SessionReader::spawn(
            reader,
            stream,
            inbound,
            self.max_stream_backlog,
            self.open_timeout,
            slot,
        ))
    }

    /// Who is calling: `UNAUTHENTICATED` with authentication on and no valid
    /// credentials.
    fn caller<T>(&self, request: &Request<T>) -> Result<Caller, Status> {
        Caller::of(self.auth.as_ref(), request)
    }

    /// Sends an op carrying a reply slot and waits for the reply.
    ///
    /// Cancel safety: the op runs whether or not the reply is awaited.
    async fn call<T>(&self, op: impl FnOnce(UnaryReply<T>) -> Op) -> Result<Response<T>, Status> {
        let (reply, receiver) = oneshot::channel();
        self.core.send(op(reply)).map_err(|_| stopped())?;
        receiver.await.map_err(|_| stopped())?.map(Response::new)
    }
}

fn stopped() -> Status {
    Status::unavailable("lock server is shutting down")
}

/// Cancels a sessionless acquire whose caller went away, or releases the grant
/// that raced the caller's departure.
struct LeaseGuard {
    core: CoreSender,
    request: u64,
    names: Vec<String>,
    owner: String,
    receiver: Option<oneshot::Receiver<Result<pb::AcquireLeaseResponse, Status>>>,
}

impl Drop for LeaseGuard {
    fn drop(&mut self) {
        let Some(mut receiver) = self.receiver.take() else {
            return;
        };
        match receiver.try_recv() {
            Ok(Ok(response)) if response.granted => {
                for (name, token) in self.names.iter().zip(response.tokens) {
                    let (reply, _) = oneshot::channel();
                    let hold = HoldArgs {
                        name: name.clone(),
                        owner: self.owner.clone(),
                        token: Some(token),
                    };
                    let _ = self.core.send(Op::Release { hold, reply });
                }
            }
            Err(oneshot::error::TryRecvError::Empty) => {
                let _ = self.core.send(Op::CancelLease {
                    request: self.request,
                });
            }
            _ => {}
        }
    }
}

/// The gRPC handlers.
///
/// Cancel safety (tonic drops a handler's future when its client goes away):
/// every handler hands its op to the core and awaits the reply, so a dropped
/// handler leaves the op to run to its end, except a waiting `acquire_lease`,
/// whose [`LeaseGuard`] cancels the wait or releases a grant that raced the
/// drop; a session stream is read by a task of its own ([`SessionReader`]).
#[tonic::async_trait]
impl Locksmith for Service {
    type SessionStream = StreamRx;
    type SessionsStream = ChannelsRx;

    async fn session(
        &self,
        request: Request<Streaming<pb::ClientBatch>>,
    ) -> Result<Response<Self::SessionStream>, Status> {
        let (metadata, extensions, inbound) = request.into_parts();
        let head = Request::from_parts(metadata, extensions, ());
        Ok(Response::new(self.open_session(&head, Box::pin(inbound))?))
    }

    async fn sessions(
        &self,
        request: Request<Streaming<pb::ClientChannelBatches>>,
    ) -> Result<Response<Self::SessionsStream>, Status> {
        let caller = self.caller(&request)?;
        let peer = request.remote_addr();
        let slots = ChannelSlots {
            counts: self.per_connection.clone(),
            peer,
            max: self.max_per_connection,
        };
        Ok(Response::new(ChannelsReader::spawn(
            self.stream_reader(caller, peer),
            self.next_stream.clone(),
            request.into_inner(),
            self.max_stream_backlog,
            self.open_timeout,
            slots,
        )))
    }

    async fn acquire_lease(
        &self,
        request: Request<pb::AcquireLeaseRequest>,
    ) -> Result<Response<pb::AcquireLeaseResponse>, Status> {
        let caller = self.caller(&request)?;
        let acquire = request
            .into_inner()
            .acquire
            .ok_or_else(|| Status::invalid_argument("acquire is required"))?;
        caller.check(Permission::Lock, acquire.names.iter().map(String::as_str))?;
        if acquire.lease_ms.is_none() {
            return Err(Status::invalid_argument(
                "lease_ms is required: a hold without a session lives by its lease",
            ));
        }
        let args = acquire_args(acquire, self.max_label).map_err(status_of)?;
        let request = self.unary_ids.fetch_add(1, Ordering::Relaxed);
        let (reply, receiver) = oneshot::channel();
        let mut guard = LeaseGuard {
            core: self.core.clone(),
            request,
            names: args.names.clone(),
            owner: args.owner.clone(),
            receiver: Some(receiver),
        };
        self.core
            .send(Op::AcquireLease {
                request,
                args,
                reply,
            })
            .map_err(|_| stopped())?;
        let outcome = guard.receiver.as_mut().expect("set above").await;
        guard.receiver = None;
        outcome.map_err(|_| stopped())?.map(Response::new)
    }

    async fn release(
        &self,
        request: Request<pb::ReleaseRequest>,
    ) -> Result<Response<pb::ReleaseResponse>, Status> {
        let caller = self.caller(&request)?;
        let release = request
            .into_inner()
            .release
            .ok_or_else(|| Status::invalid_argument("release is required"))?;
        caller.check(Permission::Lock, [release.name.as_str()])?;
        let hold = hold_args(release.name, release.owner, release.token, self.max_label)
            .map_err(status_of)?;
        self.call(|reply| Op::Release { hold, reply }).await
    }

    async fn renew(
        &self,
        request: Request<pb::RenewRequest>,
    ) -> Result<Response<pb::RenewResponse>, Status> {
        let caller = self.caller(&request)?;
        let renew = request
            .into_inner()
            .renew
            .ok_or_else(|| Status::invalid_argument("renew is required"))?;
        caller.check(Permission::Lock, [renew.name.as_str()])?;
        let hold =
            hold_args(renew.name, renew.owner, renew.token, self.max_label).map_err(status_of)?;
        let lease: Millis = renew.lease_ms;
        self.call(|reply| Op::Renew { hold, lease, reply }).await
    }

    async fn describe(
        &self,
        request: Request<pb::DescribeRequest>,
    ) -> Result<Response<pb::DescribeResponse>, Status> {
        let caller = self.caller(&request)?;
        let name = request.into_inner().name;
        check_name(&name)?;
        caller.check(Permission::Inspect, [name.as_str()])?;
        self.call(|reply| Op::Describe { name, reply }).await
    }

    async fn list(
        &self,
        request: Request<pb::ListRequest>,
    ) -> Result<Response<pb::ListResponse>, Status> {
        let caller = self.caller(&request)?;
        let request = request.into_inner();
        let limit = match request.limit as usize {
            0 => self.max_list_page,
            limit => limit.min(self.max_list_page),
        };
        let mut page = self
            .call(|reply| Op::List {
                prefix: request.prefix,
                after: request.after,
                limit,
                reply,
            })
            .await?;
        // The paging cursor stays: a page may come back thinner, not shorter.
        let visible = caller.allowed(Permission::Inspect);
        page.get_mut().locks.retain(|lock| visible(&lock.name));
        Ok(page)
    }

    async fn list_sessions(
        &self,
        request: Request<pb::ListSessionsRequest>,
    ) -> Result<Response<pb::ListSessionsResponse>, Status> {
        // Sessions span names: inspecting them takes inspect on every name.
        self.caller(&request)?.check_all(Permission::Inspect)?;
        self.call(|reply| Op::ListSessions { reply }).await
    }

    async fn history(
        &self,
        request: Request<pb::HistoryRequest>,
    ) -> Result<Response<pb::HistoryResponse>, Status> {
        let caller = self.caller(&request)?;
        let prefix = request.into_inner().prefix;
        let mut history = self.call(|reply| Op::History { prefix, reply }).await?;
        let visible = caller.allowed(Permission::Inspect);
        history
            .get_mut()
            .grants
            .retain(|grant| visible(&grant.name));
        Ok(history)
    }

    async fn force_release(
        &self,
        request: Request<pb::ForceReleaseRequest>,
    ) -> Result<Response<pb::ForceReleaseResponse>, Status> {
        let caller = self.caller(&request)?;
        let name = request.into_inner().name;
        check_name(&name)?;
        caller.check(Permission::Admin, [name.as_str()])?;
        tracing::info!(lock = %name, "force release");
        self.call(|reply| Op::ForceRelease { name, reply }).await
    }

    async fn end_session(
        &self,
        request: Request<pb::EndSessionRequest>,
    ) -> Result<Response<pb::EndSessionResponse>, Status> {
        // A session spans names: ending it takes admin on every name.
        self.caller(&request)?.check_all(Permission::Admin)?;
        let session = SessionId(request.into_inner().session_id);
        self.call(|reply| Op::EndSession { session, reply }).await
    }

    async fn close_session(
        &self,
        request: Request<pb::CloseSessionRequest>,
    ) -> Result<Response<pb::CloseSessionResponse>, Status> {
        // The session's secret shows it is the caller's own.
        self.caller(&request)?;
        let request = request.into_inner();
        let secret = secret_of(&request.secret)
            .ok_or_else(|| Status::invalid_argument("a session secret is 16 bytes"))?;
        let session = SessionId(request.session_id);
        self.call(|reply| Op::CloseSession {
            session,
            secret,
            reply,
        })
        .await
    }
}
