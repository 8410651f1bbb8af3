//! The gRPC service: turns calls and stream messages into [`Op`]s for the core.
//!
//! Each session stream's client batches are read by a task of its own
//! ([`SessionReader`]), checked for what can be checked
//! without the lock table (modes, owners, labels, the order of open/resume)
//! and forwarded as one [`Op::Stream`] each; the replies come back from the
//! core through the stream's queue, one [`pb::ServerBatch`] per engine
//! batch, after their log records are durable.
//! An invalid request is answered with its own error; a message that breaks
//! the stream protocol ends that stream only (before anything of its batch
//! runs); a malformed connection (garbage on the port) is closed by the HTTP/2
//! layer before it reaches this code.
//!
//! With authentication on, every call first identifies its caller and every
//! request is checked against the caller's grants (module `auth`, which
//! decides): a denied request is answered `PERMISSION_DENIED` before it
//! reaches the core, and listings leave out what the caller may not inspect.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use locksmith_core::{ClientInfo, EngineError, Millis, SessionId};
use locksmith_proto::v1 as pb;
use pb::locksmith_server::Locksmith;
use tokio::sync::oneshot;
use tonic::{Request, Response, Status, Streaming};

use crate::auth::{Auth, Caller, Permission};
use crate::config::ServerConfig;
use crate::convert::{self, check_label};
use crate::inbox::CoreSender;
use crate::op::{
    Acks, AcquireArgs, HoldArgs, NewStream, Op, StreamId, StreamOp, UnaryReply, WaitArg,
};
use crate::pulse::{HeartbeatLease, Pulse};
use crate::session_stream::SessionReader;
use crate::stream_queue::{StreamRx, StreamTx};

/// The `locksmith.v1.Locksmith` service.
pub(crate) struct Service {
    core: CoreSender,
    next_stream: AtomicU64,
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
    per_connection: Arc<Mutex<HashMap<SocketAddr, usize>>>,
    max_per_connection: usize,
    /// The auth file in force; `None`: authentication is off.
    auth: Option<Arc<Auth>>,
    /// Whether this member leads under its lease, for the streams' readers.
    lease: HeartbeatLease,
}

/// One session stream's place in the per-connection count, given back on drop.
pub(crate) struct ConnectionSlot {
    counts: Arc<Mutex<HashMap<SocketAddr, usize>>>,
    peer: SocketAddr,
}

impl Drop for ConnectionSlot {
    fn drop(&mut self) {
        let mut counts = self.counts.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(count) = counts.get_mut(&self.peer) {
            *count -= 1;
            if *count == 0 {
                counts.remove(&self.peer);
            }
        }
    }
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
            next_stream: AtomicU64::new(1),
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

    /// Who is calling: `UNAUTHENTICATED` with authentication on and no valid
    /// credentials.
    fn caller<T>(&self, request: &Request<T>) -> Result<Caller, Status> {
        Caller::of(self.auth.as_ref(), request)
    }

    /// Counts a new session stream on the peer's connection, refusing it past
    /// the limit.
    fn take_slot(&self, peer: Option<SocketAddr>) -> Result<Option<ConnectionSlot>, Status> {
        let Some(peer) = peer else { return Ok(None) };
        let mut counts = self
            .per_connection
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        let count = counts.entry(peer).or_insert(0);
        if *count >= self.max_per_connection {
            return Err(Status::resource_exhausted(format!(
                "limit reached: sessions per connection (at most {})",
                self.max_per_connection
            )));
        }
        *count += 1;
        Ok(Some(ConnectionSlot {
            counts: self.per_connection.clone(),
            peer,
        }))
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

fn invalid(message: impl Into<String>) -> pb::Error {
    convert::error(pb::ErrorCode::InvalidArgument, message)
}

fn status_of(error: pb::Error) -> Status {
    convert::error_to_status(&error)
}

fn check_name(name: &str) -> Result<(), Status> {
    convert::check_name(name).map_err(status_of)
}

/// Checks an acquire message and turns it into the core's form.
fn acquire_args(acquire: pb::Acquire, max_label: usize) -> Result<AcquireArgs, pb::Error> {
    let mode = convert::mode_from_proto(acquire.mode, acquire.permits).map_err(invalid)?;
    check_label("owner", &acquire.owner, max_label, true).map_err(invalid)?;
    let wait = match pb::WaitKind::try_from(acquire.wait) {
        Ok(pb::WaitKind::No) => WaitArg::No,
        Ok(pb::WaitKind::For) => WaitArg::For(acquire.wait_ms),
        Ok(pb::WaitKind::Forever) => WaitArg::Forever,
        Err(_) => return Err(invalid(format!("unknown wait kind {}", acquire.wait))),
    };
    Ok(AcquireArgs {
        names: acquire.names,
        mode,
        owner: acquire.owner,
        wait,
        lease: acquire.lease_ms,
        reentrant: acquire.reentrant,
        lock_delay: acquire.lock_delay_ms,
        notify_queued: acquire.notify_queued,
    })
}

fn hold_args(
    name: String,
    owner: String,
    token: Option<u64>,
    max_label: usize,
) -> Result<HoldArgs, pb::Error> {
    convert::check_name(&name)?;
    check_label("owner", &owner, max_label, true).map_err(invalid)?;
    Ok(HoldArgs { name, owner, token })
}

fn secret_of(bytes: &[u8]) -> Option<u128> {
    Some(u128::from_be_bytes(bytes.try_into().ok()?))
}

/// What the reading side of one session stream knows: where its ops go,
/// and what its messages are checked against on their way there.
pub(crate) struct StreamReader {
    pub(crate) core: CoreSender,
    pub(crate) stream: StreamId,
    max_label: usize,
    /// The client's address, if the transport knows it.
    peer: Option<SocketAddr>,
    /// Session TTL bounds, inclusive.
    ttl: (Millis, Millis),
    /// Whose stream it is: each request is checked against its grants.
    caller: Caller,
    /// Whether this member leads under its lease: the reader answers
    /// heartbeats itself only while it does (none: never).
    pub(crate) lease: Option<HeartbeatLease>,
}

impl StreamReader {
    /// The core's op for the first message of a stream, which must open or
    /// resume a session, or the status that ends the stream. `tx` and
    /// `pulse` become the stream's in the core.
    pub(crate) fn opening(
        &self,
        first: Option<pb::client_message::Kind>,
        tx: &StreamTx,
        pulse: &Arc<Pulse>,
    ) -> Result<Op, Status> {
        let stream = NewStream {
            id: self.stream,
            tx: tx.clone(),
            peer: self.peer,
            pulse: pulse.clone(),
        };
        match first {
            Some(pb::client_message::Kind::Open(open)) => {
                check_label("client_name", &open.client_name, self.max_label, false)
                    .and_then(|()| check_label("host", &open.host, self.max_label, false))
                    .map_err(Status::invalid_argument)?;
                let (min_ms, max_ms) = self.ttl;
                if !(min_ms..=max_ms).contains(&open.ttl_ms) {
                    let error = EngineError::OutOfRange {
                        what: "session TTL",
                        value_ms: open.ttl_ms,
                        min_ms,
                        max_ms,
                    };
                    return Err(convert::engine_error_to_status(&error));
                }
                Ok(Op::Open {
                    stream,
                    info: ClientInfo {
                        name: open.client_name,
                        host: open.host,
                    },
                    ttl: open.ttl_ms,
                })
            }
            Some(pb::client_message::Kind::Resume(resume)) => {
                let secret = secret_of(&resume.secret)
                    .ok_or_else(|| Status::invalid_argument("a session secret is 16 bytes"))?;
                Ok(Op::Resume {
                    stream,
                    session: SessionId(resume.session_id),
                    secret,
                })
            }
            _ => Err(Status::failed_precondition(
                "the first message of a session stream must be open or resume",
            )),
        }
    }

    /// The core's op for a batch on an attached stream: [`Op::Stream`], or
    /// [`Op::Detach`] with the reason when a message breaks the stream
    /// protocol (nothing of the batch runs then); `None` for an empty batch.
    pub(crate) fn batch(&self, batch: pb::ClientBatch) -> Option<Op> {
        let acks = Acks {
            replies: batch.ack_replies,
            lost: batch.ack_lost,
        };
        if batch.messages.is_empty() && acks.replies.is_empty() && acks.lost.is_empty() {
            return None;
        }
        let ops = batch
            .messages
            .into_iter()
            .map(|message| self.stream_op(message.kind))
            .collect::<Result<Vec<_>, Status>>();
        Some(match ops {
            Ok(ops) => Op::Stream {
                stream: self.stream,
                acks,
                ops,
            },
            Err(status) => Op::Detach {
                stream: self.stream,
                error: Some(status),
            },
        })
    }

    /// The core's form of one message; `Err` ends the stream.
    fn stream_op(&self, kind: Option<pb::client_message::Kind>) -> Result<StreamOp, Status> {
        use pb::client_message::Kind;
        Ok(match kind {
            None => StreamOp::AckOnly,
            Some(Kind::Heartbeat(_)) => StreamOp::Heartbeat,
            Some(Kind::Cancel(cancel)) => StreamOp::Cancel { id: cancel.id },
            Some(Kind::Close(_)) => StreamOp::Close,
            Some(Kind::Open(_)) | Some(Kind::Resume(_)) => {
                return Err(Status::failed_precondition(
                    "this stream already carries a session (one session per stream)",
                ))
            }
            Some(Kind::Request(request)) => {
                let id = request.id;
                let permitted = match &request.op {
                    Some(pb::request::Op::Acquire(acquire)) => self
                        .caller
                        .check(Permission::Lock, acquire.names.iter().map(String::as_str)),
                    Some(pb::request::Op::Release(r)) => {
                        self.caller.check(Permission::Lock, [r.name.as_str()])
                    }
                    Some(pb::request::Op::Renew(r)) => {
                        self.caller.check(Permission::Lock, [r.name.as_str()])
                    }
                    Some(pb::request::Op::SetHoldCount(r)) => {
                        self.caller.check(Permission::Lock, [r.name.as_str()])
                    }
                    None => Ok(()),
                };
                match permitted {
                    Ok(()) => {}
                    // The identity left the auth file: the stream ends.
                    Err(status) if status.code() == tonic::Code::Unauthenticated => {
                        return Err(status)
                    }
                    Err(status) => {
                        let error =
                            convert::error(pb::ErrorCode::PermissionDenied, status.message());
                        return Ok(StreamOp::Invalid { id, error });
                    }
                }
                let checked = match request.op {
                    None => Err(invalid("request without an operation")),
                    Some(pb::request::Op::Acquire(acquire)) => {
                        acquire_args(acquire, self.max_label)
                            .map(|args| StreamOp::Acquire { id, args })
                    }
                    Some(pb::request::Op::Release(r)) => {
                        hold_args(r.name, r.owner, r.token, self.max_label)
                            .map(|hold| StreamOp::Release { id, hold })
                    }
                    Some(pb::request::Op::Renew(r)) => {
                        hold_args(r.name, r.owner, r.token, self.max_label).map(|hold| {
                            StreamOp::Renew {
                                id,
                                hold,
                                lease: r.lease_ms,
                            }
                        })
                    }
                    Some(pb::request::Op::SetHoldCount(r)) => {
                        hold_args(r.name, r.owner, Some(r.token), self.max_label).map(|hold| {
                            StreamOp::SetHoldCount {
                                id,
                                hold,
                                count: r.count,
                            }
                        })
                    }
                };
                checked.unwrap_or_else(|error| StreamOp::Invalid { id, error })
            }
        })
    }
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

    async fn session(
        &self,
        request: Request<Streaming<pb::ClientBatch>>,
    ) -> Result<Response<Self::SessionStream>, Status> {
        let caller = self.caller(&request)?;
        let peer = request.remote_addr();
        let slot = self.take_slot(peer)?;
        let reader = StreamReader {
            core: self.core.clone(),
            peer,
            ttl: (self.min_session_ttl, self.max_session_ttl),
            stream: self.next_stream.fetch_add(1, Ordering::Relaxed),
            max_label: self.max_label,
            caller,
            lease: Some(self.lease.clone()),
        };
        Ok(Response::new(SessionReader::spawn(
            reader,
            request.into_inner(),
            self.max_stream_backlog,
            self.open_timeout,
            slot,
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

/// The checks and conversions above, run on decoded messages without a core
/// (the `fuzzing` feature's entry points).
#[cfg(feature = "fuzzing")]
pub(crate) mod fuzzing {
    use locksmith_core::{Engine, SessionId};
    use locksmith_proto::prost::Message;
    use locksmith_proto::v1 as pb;

    use super::{acquire_args, check_label, check_name, hold_args, secret_of, StreamReader};
    use crate::config::ServerConfig;
    use crate::op::StreamOp;

    /// What a session stream makes of one message: the opening checks, then
    /// the conversion; each acquire is applied to `engine` as session 1.
    pub(crate) fn stream_message(
        config: &ServerConfig,
        kind: Option<pb::client_message::Kind>,
        engine: &mut Engine,
    ) {
        let max_label = config.max_label_bytes;
        match &kind {
            Some(pb::client_message::Kind::Open(open)) => {
                let _ = check_label("client_name", &open.client_name, max_label, false);
                let _ = check_label("host", &open.host, max_label, false);
            }
            Some(pb::client_message::Kind::Resume(resume)) => {
                let _ = secret_of(&resume.secret);
            }
            _ => {}
        }
        let reader = StreamReader {
            core: crate::inbox::CoreSender::channel().0,
            stream: 1,
            max_label,
            peer: None,
            ttl: (config.limits.min_ttl, config.limits.max_ttl),
            // Authentication off: the checks that follow it are the same.
            caller: crate::auth::Caller::of(None, &tonic::Request::new(()))
                .expect("with authentication off anyone may call"),
            lease: None,
        };
        if let Ok(StreamOp::Acquire { id, args }) = reader.stream_op(kind) {
            let command = args.into_command(SessionId(1), id, 0);
            let _ = engine.apply(0, command, &mut Vec::new());
        }
    }

    /// What the unary calls check of their requests.
    pub(crate) fn unary_requests(config: &ServerConfig, bytes: &[u8]) {
        let max_label = config.max_label_bytes;
        if let Ok(request) = pb::AcquireLeaseRequest::decode(bytes) {
            if let Some(acquire) = request.acquire {
                let _ = acquire_args(acquire, max_label);
            }
        }
        if let Ok(request) = pb::ReleaseRequest::decode(bytes) {
            if let Some(r) = request.release {
                let _ = hold_args(r.name, r.owner, r.token, max_label);
            }
        }
        if let Ok(request) = pb::RenewRequest::decode(bytes) {
            if let Some(r) = request.renew {
                let _ = hold_args(r.name, r.owner, r.token, max_label);
            }
        }
        if let Ok(request) = pb::DescribeRequest::decode(bytes) {
            let _ = check_name(&request.name);
        }
        if let Ok(request) = pb::ForceReleaseRequest::decode(bytes) {
            let _ = check_name(&request.name);
        }
        if let Ok(request) = pb::CloseSessionRequest::decode(bytes) {
            let _ = secret_of(&request.secret);
        }
        let _ = pb::ListRequest::decode(bytes);
        let _ = pb::HistoryRequest::decode(bytes);
        let _ = pb::EndSessionRequest::decode(bytes);
    }
}
