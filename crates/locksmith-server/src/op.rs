//! The vocabulary between the gRPC service and the core: what a client
//! asks for, validated and turned into plain values, and where the answers go.
//!
//! The service builds these; the core (module `core`) consumes them; the
//! outbox (module `outbox`) sends to the reply slots and streams named here.

use std::net::SocketAddr;
use std::sync::Arc;

use locksmith_core::{Acquire, ClientInfo, Command, Millis, Mode, RequestId, SessionId, Wait};
use locksmith_proto::v1 as pb;
use tokio::sync::oneshot;
use tonic::Status;

use crate::pulse::Pulse;

pub(crate) use crate::stream_queue::StreamTx;

/// Identifies one session stream (one gRPC call) for the life of the process.
pub(crate) type StreamId = u64;
/// The reply slot of a unary call.
pub(crate) type UnaryReply<T> = oneshot::Sender<Result<T, Status>>;

/// How long an acquire may wait, relative to when the core applies it.
#[derive(Debug, Clone, Copy)]
pub(crate) enum WaitArg {
    /// Never queue.
    No,
    /// Queue at most this long.
    For(Millis),
    /// Queue until granted or cancelled.
    Forever,
}

/// A validated acquire, before it gets a session, request id and time.
#[derive(Debug, Clone)]
pub(crate) struct AcquireArgs {
    pub names: Vec<String>,
    pub mode: Mode,
    pub owner: String,
    pub wait: WaitArg,
    pub lease: Option<Millis>,
    pub reentrant: bool,
    pub lock_delay: Millis,
    /// Reply `queued` when it has to wait (session streams only).
    pub notify_queued: bool,
}

impl AcquireArgs {
    pub(crate) fn into_command(self, session: SessionId, request: u64, now: Millis) -> Command {
        Command::Acquire(Acquire {
            session,
            request: RequestId(request),
            owner: self.owner,
            names: self.names,
            mode: self.mode,
            wait: match self.wait {
                WaitArg::No => Wait::No,
                WaitArg::For(ms) => Wait::Until(now.saturating_add(ms)),
                WaitArg::Forever => Wait::Forever,
            },
            lease: self.lease,
            reentrant: self.reentrant,
            lock_delay: self.lock_delay,
        })
    }
}

/// Release or renew of one hold.
#[derive(Debug, Clone)]
pub(crate) struct HoldArgs {
    pub name: String,
    pub owner: String,
    pub token: Option<u64>,
}

/// What a session stream asks for.
#[derive(Debug)]
pub(crate) enum StreamOp {
    /// Keep the session alive.
    Heartbeat,
    /// Acquire.
    Acquire { id: u64, args: AcquireArgs },
    /// Release a hold.
    Release { id: u64, hold: HoldArgs },
    /// Extend a leased hold.
    Renew {
        id: u64,
        hold: HoldArgs,
        lease: Millis,
    },
    /// Record a hold's re-entry depth, as its client counts it (`hold`
    /// names its token).
    SetHoldCount { id: u64, hold: HoldArgs, count: u32 },
    /// Stop waiting for request `id`.
    Cancel { id: u64 },
    /// Close the session.
    Close,
    /// A request the stream handler refused; answered in order with the error.
    Invalid { id: u64, error: pb::Error },
    /// Only acknowledgements.
    AckOnly,
}

/// Ids the client acknowledges.
#[derive(Debug, Default)]
pub(crate) struct Acks {
    pub replies: Vec<u64>,
    pub lost: Vec<u64>,
}

/// A session stream that opens or resumes a session.
pub(crate) struct NewStream {
    pub id: StreamId,
    /// Where its messages go.
    pub tx: StreamTx,
    /// The client's address, when the transport knows it.
    pub peer: Option<SocketAddr>,
    /// Shared with the stream's reader (module [`crate::pulse`]): the core
    /// ends it when it is done with the stream, which stops the reader, and
    /// opens it to let the reader answer heartbeats.
    pub pulse: Arc<Pulse>,
}

/// What a client asks of the core (through the gRPC service or the HTTP
/// listener): a message to the core, beside Raft's events
/// ([`crate::inbox::RaftEvent`]).
pub(crate) enum Op {
    /// A new stream opens a session.
    Open {
        stream: NewStream,
        info: ClientInfo,
        ttl: Millis,
    },
    /// A new stream resumes a session.
    Resume {
        stream: NewStream,
        session: SessionId,
        secret: u128,
    },
    /// One client batch on an attached stream: its acknowledgements, then its
    /// messages in order.
    Stream {
        stream: StreamId,
        acks: Acks,
        ops: Vec<StreamOp>,
    },
    /// A stream ended (its session lives on until its TTL); `error` is sent to
    /// it first if it is still attached.
    Detach {
        stream: StreamId,
        error: Option<Status>,
    },
    /// A sessionless acquire (unary).
    AcquireLease {
        request: u64,
        args: AcquireArgs,
        reply: UnaryReply<pb::AcquireLeaseResponse>,
    },
    /// The caller of a sessionless acquire went away.
    CancelLease { request: u64 },
    /// Release a sessionless hold.
    Release {
        hold: HoldArgs,
        reply: UnaryReply<pb::ReleaseResponse>,
    },
    /// Renew a sessionless hold.
    Renew {
        hold: HoldArgs,
        lease: Millis,
        reply: UnaryReply<pb::RenewResponse>,
    },
    /// Describe one lock.
    Describe {
        name: String,
        reply: UnaryReply<pb::DescribeResponse>,
    },
    /// List locks by prefix.
    List {
        prefix: String,
        /// Start after this name ("" from the first).
        after: String,
        /// Most locks in the page (at least 1, at most the server's page limit).
        limit: usize,
        reply: UnaryReply<pb::ListResponse>,
    },
    /// List sessions.
    ListSessions {
        reply: UnaryReply<pb::ListSessionsResponse>,
    },
    /// Recent grants of the locks under a prefix.
    History {
        prefix: String,
        reply: UnaryReply<pb::HistoryResponse>,
    },
    /// Administrator release.
    ForceRelease {
        name: String,
        reply: UnaryReply<pb::ForceReleaseResponse>,
    },
    /// Close a session from outside.
    CloseSession {
        session: SessionId,
        secret: u128,
        reply: UnaryReply<pb::CloseSessionResponse>,
    },
    /// The leader: every member reads records of `version`; log it as the
    /// cluster's (module `core::replicated::versions`).
    RaiseClusterVersion { version: u32 },
    /// Administrator: end a session, no secret needed.
    EndSession {
        session: SessionId,
        reply: UnaryReply<pb::EndSessionResponse>,
    },
}

impl Op {
    /// How many operations it carries (the messages of a client batch, one
    /// for anything else).
    pub(crate) fn count(&self) -> usize {
        match self {
            Op::Stream { ops, .. } => ops.len().max(1),
            _ => 1,
        }
    }

    /// About how many bytes it adds to a log entry: the names and owners it
    /// carries (up to 64 names of 512 bytes in one acquire), and a little
    /// for the rest of each command.
    pub(crate) fn entry_bytes(&self) -> usize {
        const COMMAND: usize = 64;
        let acquire =
            |a: &AcquireArgs| a.names.iter().map(String::len).sum::<usize>() + a.owner.len();
        let hold = |h: &HoldArgs| h.name.len() + h.owner.len();
        let bytes = match self {
            Op::Stream { ops, .. } => ops
                .iter()
                .map(|op| match op {
                    StreamOp::Acquire { args, .. } => acquire(args),
                    StreamOp::Release { hold: h, .. }
                    | StreamOp::Renew { hold: h, .. }
                    | StreamOp::SetHoldCount { hold: h, .. } => hold(h),
                    _ => 0,
                })
                .sum(),
            Op::Open { info, .. } => info.name.len() + info.host.len(),
            Op::AcquireLease { args, .. } => acquire(args),
            Op::Release { hold: h, .. } | Op::Renew { hold: h, .. } => hold(h),
            Op::ForceRelease { name, .. } => name.len(),
            _ => 0,
        };
        bytes + COMMAND * self.count()
    }
}
