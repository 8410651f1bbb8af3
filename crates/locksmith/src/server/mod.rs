//! `locksmith://host[:port][,host[:port]...]`: the locksmith lock server
//! (default port 7420), one server or the members of a cluster;
//! `locksmith+tls://…?ca=FILE[&cert=FILE&key=FILE]` over TLS. A bearer token
//! for a server with authentication on comes from `LOCKSMITH_TOKEN` or
//! `?token_file=FILE`; `?session_transport=grpc` puts the session stream on
//! the gRPC call instead of its framed default ([`ServerUrl`]).
//!
//! The server (crate `locksmith-server`, started with `locksmith serve`) runs
//! the same lock engine as `memory://`, durably, behind gRPC (package
//! `locksmith.v1` of `locksmith-proto`). Every model feature maps one to one:
//! exclusive, shared and semaphore modes, atomic multi-locks, FIFO queues with
//! a push on every grant (no polling, no herd), lock-delay, fencing tokens
//! from the server's durable counter, and inspection with waiters. Re-entry
//! is the model layer's (module `model`), as on every store: the server gets
//! one acquire per hold, and the depth the client counts through the
//! protocol's `SetHoldCount` (ignored, with inspection showing 1, by a
//! cluster that is still being upgraded to a version that records it).
//!
//! # Several members
//!
//! With several addresses the client talks to one member at a time
//! (module `members`): the first that serves, the next one when it goes
//! away, and the leader at once when a member answers that it is not the
//! leader and names it. The session stream then resumes there, as after a
//! restart.
//!
//! # One session per client
//!
//! A [`ServerBackend`] (one per [`crate::Client`]) opens one bidirectional
//! session stream (the `Session` call's messages, framed or on the call
//! itself; section "Unary calls") and keeps it:
//!
//! - **Heartbeats** every third of [`ConnectOptions::session_ttl`]: holds
//!   without a lease live as long as the session (like ZooKeeper ephemeral
//!   nodes); a hold with a lease also ends when its lease does.
//! - **Requests with ids**: acquire, release, renew (and cancel) go on the
//!   stream and are answered by id; grants of queued acquires are pushed the
//!   moment the engine grants them, as are lost holds.
//! - **Reconnect and resume**: when the connection drops or the server restarts,
//!   a background task reconnects with backoff, resumes the session with its id
//!   and secret (the server gives sessions a grace period after a restart) and
//!   sends every unanswered request again under the same id. The server answers
//!   each id once, so pending acquires simply keep waiting (a queued acquire
//!   even keeps its place in the queue) and nothing is granted twice or left
//!   behind.
//! - **Lost**: when the session cannot be resumed in time (the server does not
//!   know it any more, or no heartbeat was answered for a whole TTL), every
//!   hold's `lost()` fires, releases and renews of those holds fail with
//!   [`Error::Lost`], and pending acquires continue on a new session.
//!
//! # Cancel safety
//!
//! Dropping an acquire future sends a cancel for its request; if the grant won
//! the race, the grant is released at once. Either way nothing stays queued or
//! held.
//!
//! # Unary calls
//!
//! `describe`, `list` and `force_release` use the server's unary calls, over
//! a channel to each member that connects on first use. The session stream
//! has a connection of its own, read and written in the session's task: by
//! default its batches framed with no HTTP/2 under them (module
//! `framed_connection`), or, with `session_transport=grpc` in the URL, the
//! gRPC `Session` call whose HTTP/2 work runs in that task (module
//! `stream_connection`). Either way a reply wakes that task and the caller,
//! never another thread of the runtime. `describe` and `list` first wait (at most a second) until
//! the cancels and releases this process sent on nobody's behalf (for dropped
//! acquire futures) are answered, so inspection never shows a waiter this
//! process already gave up.
//!
//! [`ConnectOptions::session_ttl`]: crate::ConnectOptions::session_ttl

mod convert;
mod framed_connection;
mod heartbeats;
mod members;
mod session;
mod session_transport;
mod stream_connection;
mod url;

pub use url::{Credentials, ServerUrl, Stub, TOKEN_ENV};

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use locksmith_proto::v1 as pb;
use tokio::sync::oneshot;
use tokio::time::Instant;

use crate::backend::{
    AcquireRequest, Backend, Capabilities, Grant, GrantRecord, Hold, LockInfo, Wait,
};
use crate::error::{Error, Result};
use crate::options::ConnectOptions;

use members::{member_down, Members, Redirect, Rounds};

/// How long a unary call waits out members that are down or in an election.
const UNARY_PATIENCE: Duration = Duration::from_secs(5);
/// How long one attempt of a unary call waits for its member's answer: a
/// linearizable read or a force-release is one log commit on a healthy
/// leader; a member that takes this long is taken for down.
const ATTEMPT_TIMEOUT: Duration = Duration::from_secs(2);
use session::{AcquireOutcome, Shared};

const BACKEND: &str = "server";
/// The port `locksmith serve` listens on by default.
pub const DEFAULT_PORT: u16 = 7420;
/// Largest message the client accepts (a `list` of a big lock table).
const MAX_RESPONSE_BYTES: usize = 256 << 20;

/// A client of the locksmith lock server: one session stream.
pub struct ServerBackend {
    shared: Arc<Shared>,
}

impl ServerBackend {
    /// Connects to `locksmith://host[:port][,host[:port]...]` (the members
    /// of a cluster, or one server) and opens a session on the first member
    /// that serves, following its redirect to the leader.
    ///
    /// Cancel safety: safe; a dropped connect leaves at most a session that
    /// expires after its TTL.
    pub async fn connect(url: &str, options: &ConnectOptions) -> Result<Self> {
        let members = Arc::new(Members::parse_with(
            url,
            session::reconnect_timeout(options.session_ttl),
            options.connector.clone(),
        )?);
        let shared = session::connect(members, options.clone()).await?;
        Ok(ServerBackend { shared })
    }

    /// A unary call on the current member; on the leader instead when the
    /// member names it, on the next member when it is down or gives no
    /// answer within [`ATTEMPT_TIMEOUT`] (a stopped process whose socket
    /// still accepts), for at most [`UNARY_PATIENCE`] in all.
    ///
    /// `repeatable`: whether sending the call again is harmless when an
    /// attempt's outcome is unknown (it timed out, or its connection broke).
    /// A call that is not (a force-release, which could hit the next holder)
    /// returns that error instead of trying again.
    ///
    /// Cancel safety: safe; the call may or may not have reached a member.
    async fn unary<T, F, Fut>(
        &self,
        repeatable: bool,
        call: F,
    ) -> std::result::Result<T, tonic::Status>
    where
        F: Fn(Stub) -> Fut,
        Fut: std::future::Future<Output = std::result::Result<tonic::Response<T>, tonic::Status>>,
    {
        let members = &self.shared.members;
        let mut rounds = Rounds::new(members, UNARY_PATIENCE);
        loop {
            let (at, addr, client) = members.current();
            let status = match tokio::time::timeout(ATTEMPT_TIMEOUT, call(client)).await {
                Ok(Ok(response)) => return Ok(response.into_inner()),
                Ok(Err(status)) => status,
                Err(_) => {
                    members.unresponsive(at);
                    let status = tonic::Status::deadline_exceeded(format!(
                        "{addr} gave no answer within {ATTEMPT_TIMEOUT:?}"
                    ));
                    if !(repeatable && rounds.again(members, false).await) {
                        return Err(status);
                    }
                    continue;
                }
            };
            match members.follow(&status) {
                Redirect::Leader if rounds.again(members, false).await => {}
                Redirect::Stale if rounds.again(members, true).await => {}
                Redirect::Leader | Redirect::Stale => return Err(status),
                Redirect::None if member_down(&status) => {
                    members.could_not_serve(at, &status);
                    let again = repeatable || refused_whole(&status);
                    if !(again && rounds.again(members, false).await) {
                        return Err(status);
                    }
                }
                Redirect::None => return Err(status),
            }
        }
    }
}

/// Whether a failed call surely never ran: a member answered that it cannot
/// serve it at all (no leader, stopping), rather than the transport failing,
/// the connection breaking midway or the member going silent.
fn refused_whole(status: &tonic::Status) -> bool {
    status.code() == tonic::Code::Unavailable && std::error::Error::source(status).is_none()
}

fn invalid_url(url: &str, reason: String) -> Error {
    Error::InvalidUrl {
        url: crate::options::redact(url),
        reason,
    }
}

impl Drop for ServerBackend {
    fn drop(&mut self) {
        // The driver closes the session in the background.
        self.shared.closing.cancel();
    }
}

/// Cancels a pending acquire when its future is dropped, or releases the grant
/// that raced the drop (decided under the session lock, so exactly one happens).
struct PendingAcquire<'a> {
    shared: &'a Shared,
    id: u64,
    request: &'a AcquireRequest,
    receiver: Option<oneshot::Receiver<AcquireOutcome>>,
}

impl Drop for PendingAcquire<'_> {
    fn drop(&mut self) {
        if let Some(mut receiver) = self.receiver.take() {
            self.shared.state().abandon(
                self.id,
                &mut receiver,
                &self.request.names,
                &self.request.owner,
            );
        }
    }
}

#[async_trait]
impl Backend for ServerBackend {
    fn name(&self) -> &'static str {
        BACKEND
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            fifo: true,
            lock_delay: true,
            lists_waiters: true,
            shared: true,
            semaphore: true,
            proclaim: false,
            multi_lock: true,
        }
    }

    /// Cancel safety: safe (see the module docs): dropping the future cancels
    /// the request, or releases a grant that raced the drop, under the
    /// session lock (see `PendingAcquire`); the grant is made after the last
    /// await.
    async fn acquire(&self, request: &AcquireRequest) -> Result<Option<Grant>> {
        let deadline = match request.wait {
            Wait::For(limit) => Instant::now().checked_add(limit),
            _ => None,
        };
        let (id, receiver) = self
            .shared
            .state()
            .acquire(convert::acquire(request), deadline)?;
        let mut pending = PendingAcquire {
            shared: &self.shared,
            id,
            request,
            receiver: Some(receiver),
        };
        let outcome = pending.receiver.as_mut().expect("set above").await;
        pending.receiver = None;
        match outcome.map_err(|_| Error::Closed)? {
            AcquireOutcome::Granted(tokens, lost, generation) => Ok(Some(Grant {
                hold: Box::new(ServerHold {
                    shared: self.shared.clone(),
                    names: request.names.clone(),
                    owner: request.owner.clone(),
                    tokens: tokens.clone(),
                    generation,
                    recorded: AtomicU32::new(1),
                }),
                tokens,
                lost,
            })),
            AcquireOutcome::WouldBlock => Ok(None),
            AcquireOutcome::TimedOut => Err(Error::Timeout(match request.wait {
                Wait::For(limit) => limit,
                _ => Duration::ZERO,
            })),
            AcquireOutcome::Failed(error) => Err(error),
        }
    }

    /// Cancel safety: safe, read-only.
    async fn describe(&self, name: &str) -> Result<Option<LockInfo>> {
        self.shared.settle_earlier().await;
        let request = pb::DescribeRequest { name: name.into() };
        let response = self
            .unary(true, |mut client| {
                let request = request.clone();
                async move { client.describe(request).await }
            })
            .await
            .map_err(convert::status)?;
        Ok(response.lock.map(convert::lock_info))
    }

    /// Pages through the server's listing (each page is consistent on its
    /// own; the server bounds a page so that a huge table never stalls it).
    ///
    /// Cancel safety: safe, read-only.
    async fn list(&self, prefix: &str) -> Result<Vec<LockInfo>> {
        self.shared.settle_earlier().await;
        let mut locks = Vec::new();
        let mut request = pb::ListRequest {
            prefix: prefix.into(),
            ..Default::default()
        };
        loop {
            let response = self
                .unary(true, |mut client| {
                    let request = request.clone();
                    async move { client.list(request).await }
                })
                .await
                .map_err(convert::status)?;
            locks.extend(response.locks.into_iter().map(convert::lock_info));
            if response.next_after.is_empty() {
                return Ok(locks);
            }
            request.after = response.next_after;
        }
    }

    /// Cancel safety: safe, read-only.
    async fn history(&self, prefix: &str) -> Result<Vec<GrantRecord>> {
        let request = pb::HistoryRequest {
            prefix: prefix.into(),
        };
        let response = self
            .unary(true, |mut client| {
                let request = request.clone();
                async move { client.history(request).await }
            })
            .await
            .map_err(convert::status)?;
        Ok(response
            .grants
            .into_iter()
            .map(convert::grant_record)
            .collect())
    }

    /// Cancel safety: the release may or may not have happened.
    async fn force_release(&self, name: &str) -> Result<()> {
        let request = pb::ForceReleaseRequest { name: name.into() };
        let result = self
            .unary(false, |mut client| {
                let request = request.clone();
                async move { client.force_release(request).await }
            })
            .await;
        match result {
            Ok(_) => Ok(()),
            Err(status) if status.code() == tonic::Code::NotFound => {
                Err(Error::NotHeld { name: name.into() })
            }
            Err(status) => Err(convert::status(status)),
        }
    }

    /// Cancel safety: safe; the close is requested at the first poll and the
    /// session's driver finishes it in the background: dropping only stops
    /// the wait.
    async fn close(&self) -> Result<()> {
        self.shared.closing.cancel();
        let _ =
            tokio::time::timeout(Duration::from_secs(5), self.shared.finished.cancelled()).await;
        Ok(())
    }
}

/// A grant on the server: released and renewed by request on the session.
struct ServerHold {
    shared: Arc<Shared>,
    names: Vec<String>,
    owner: String,
    tokens: Vec<u64>,
    /// The session generation it was granted in.
    generation: u64,
    /// The re-entry depth the server last recorded (1 at the grant).
    recorded: AtomicU32,
}

impl ServerHold {
    /// The request that records `count` as the depth of the hold of `name`.
    fn set_count(&self, name: String, token: u64, count: u32) -> pb::request::Op {
        pb::request::Op::SetHoldCount(pb::SetHoldCount {
            name,
            owner: self.owner.clone(),
            token,
            count,
        })
    }

    /// Sends one request per name and waits for all of them; the first error
    /// wins. With `release`, the hold stops listening for lost pushes first
    /// (under the same lock of the session state), and if a depth other than
    /// 1 may be recorded, each release is preceded by setting it back to 1
    /// (unwaited: the release's answer says what became of the hold).
    ///
    /// Cancel safety: safe once polled: the requests are registered on the
    /// session at the first poll and go out (again after a reconnect) whether
    /// or not anyone waits for their answers; a dropped call only does not
    /// learn them.
    async fn each(&self, release: bool, op: impl Fn(String, u64) -> pb::request::Op) -> Result<()> {
        let count_first = release && self.recorded.load(Ordering::Acquire) != 1;
        let receivers = {
            let mut state = self.shared.state();
            if release {
                state.forget(&self.tokens);
            }
            if state.generation != self.generation {
                return Err(Error::Lost("the session that held it was lost".into()));
            }
            let mut receivers = Vec::with_capacity(self.names.len());
            for (name, &token) in self.names.iter().zip(&self.tokens) {
                if count_first {
                    state.simple(self.set_count(name.clone(), token, 1))?;
                }
                receivers.push(state.simple(op(name.clone(), token))?);
            }
            receivers
        };
        let mut result = Ok(());
        for receiver in receivers {
            let outcome = receiver.await.unwrap_or(Err(Error::Closed));
            if result.is_ok() {
                result = outcome;
            }
        }
        result
    }
}

#[async_trait]
impl Hold for ServerHold {
    /// Cancel safety: safe once polled: the release requests are registered
    /// at the first poll and go out (again after a reconnect) even if this
    /// future is dropped (see `ServerHold::each`).
    async fn release(self: Box<Self>) -> Result<()> {
        let span = tracing::debug_span!("release", backend = BACKEND, names = ?self.names);
        // The server's release takes off one level: whatever depth was
        // recorded last goes back to 1 first (see `ServerHold::each`), so
        // that this ends the hold.
        let release = self.each(true, |name, token| {
            pb::request::Op::Release(pb::Release {
                name,
                owner: self.owner.clone(),
                token: Some(token),
            })
        });
        tracing::Instrument::instrument(release, span).await
    }

    /// Cancel safety: safe once polled (see `ServerHold::each`); a dropped
    /// call does not learn whether the depth was recorded, and the next
    /// release sets it back to 1 in any case.
    async fn record_count(&self, count: u32) -> Result<()> {
        // Unknown until answered: a release in between sets it back first.
        self.recorded.store(0, Ordering::Release);
        let recorded = self
            .each(false, |name, token| self.set_count(name, token, count))
            .await;
        match recorded {
            Ok(()) => {
                self.recorded.store(count, Ordering::Release);
                Ok(())
            }
            // A server (or a member of its cluster) of an earlier version:
            // it keeps no depth, and inspection shows 1 until it is
            // upgraded. Its count is still 1, so a release ends the hold.
            Err(Error::Unsupported { .. } | Error::InvalidArgument(_)) => {
                tracing::debug!(names = ?self.names, count, "this server does not record hold counts yet");
                self.recorded.store(1, Ordering::Release);
                Ok(())
            }
            Err(error) => Err(error),
        }
    }

    /// Cancel safety: safe; the renewals are registered at the first poll
    /// and each either takes effect or not; a dropped call does not learn
    /// which (see `ServerHold::each`).
    async fn extend(&self, lease: Duration) -> Result<()> {
        let lease_ms = convert::ceil_ms(lease);
        let span = tracing::debug_span!("extend", backend = BACKEND, names = ?self.names, ?lease);
        let renew = self.each(false, |name, token| {
            pb::request::Op::Renew(pb::Renew {
                name,
                owner: self.owner.clone(),
                token: Some(token),
                lease_ms,
            })
        });
        tracing::Instrument::instrument(renew, span).await
    }
}

/// Parses `url` as `connect` does, up to the channels it would build (each
/// needs a runtime and costs milliseconds), contacting nothing: the fuzz
/// targets' entry, through `crate::fuzzing`.
#[cfg(feature = "fuzzing")]
pub(crate) fn parse_url_only(url: &str, _options: &ConnectOptions) -> Result<()> {
    let url = url::ServerUrl::parse(url)?;
    for addr in url.addresses() {
        url.endpoint(addr)?;
    }
    Ok(())
}
