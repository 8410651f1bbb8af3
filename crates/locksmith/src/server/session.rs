//! One client's session: its stream, heartbeats, reconnects, and the routing
//! of replies and pushes to the futures and guards waiting for them.
//!
//! Requests are kept in [`State::outstanding`] until their final reply. While
//! connected they are also sent at once; after a reconnect the driver resumes
//! the session and sends every outstanding request again, with the same id.
//! The server answers each id once: a request that already ran is answered
//! from the reply it kept, a request that is still queued stays queued (with
//! its place in the FIFO), and a request that never arrived runs now. So a
//! dropped connection or a server restart is invisible to callers, except for
//! the time it takes.
//!
//! The session is **lost** (every hold's [`LostSignal`] fires) when the server
//! says it no longer exists, or when no heartbeat (or resume) was answered
//! for nearly a session TTL: the server expires a session one TTL after the
//! last heartbeat it *received*, which is never earlier than one TTL after
//! the last heartbeat the client *sent and saw answered*, so the client gives
//! up first. When to send a heartbeat, until when the session is trusted and
//! why it was lost are the keeper's rules (module `heartbeats`). Pending
//! acquires then continue on a fresh session; releases and renews of the lost
//! holds fail with [`Error::Lost`].
//!
//! A member that stops answering heartbeats for half a TTL is **suspect**
//! when the client knows other members (and one heartbeat has waited a sixth
//! of the TTL: after a pause of this process, none was sent): a frozen
//! leader keeps its TCP connections open, so waiting for the stream to break
//! would spend the whole TTL. The client passes it over (module `members`),
//! moves to the next member, which names the new leader once one is elected,
//! and resumes there while the session still lives; each reconnect attempt
//! is bounded by a third of the TTL for the same reason. A member whose
//! stream broke (a crash: its followers name it until they notice) gets
//! only a tenth of the TTL to answer the next attempt on it, and whole
//! attempts again once it answered or let that short one pass
//! (`Members::broken`).

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use locksmith_proto::v1 as pb;
use pb::client_message::Kind as Out;
use pb::server_message::Kind as In;
use tokio::sync::{mpsc, oneshot, Notify};
use tokio::time::{sleep_until, Instant};
use tokio_util::sync::CancellationToken;
use tonic::Code;

use crate::keeper::Loss;
use crate::lost::LostCause;

use crate::backend::LostSignal;
use crate::error::{Error, Result};
use crate::options::ConnectOptions;

use super::convert;
use super::heartbeats::{Due, Heartbeats};
use super::members::{member_down, Members, Redirect, Rounds};
use super::session_transport::{self, Inbound};

/// How long a graceful close waits for the server to confirm.
const CLOSE_WAIT: Duration = Duration::from_secs(2);

/// The outcome of an acquire, as delivered to its future.
#[derive(Debug)]
pub(super) enum AcquireOutcome {
    /// Tokens, the shared lost signal, and the session generation granted in.
    Granted(Vec<u64>, LostSignal, u64),
    WouldBlock,
    TimedOut,
    Failed(Error),
}

/// Who waits for an outstanding request's final reply.
enum Waiter {
    Acquire {
        /// `None` once the caller dropped the acquire future (abandoned).
        reply: Option<oneshot::Sender<AcquireOutcome>>,
        /// The caller's deadline, to shorten the wait when the request is sent again.
        deadline: Option<Instant>,
    },
    Done(Option<oneshot::Sender<Result<()>>>),
}

struct Outstanding {
    /// The request as sent: sent again after a reconnect, and for an acquire
    /// the names and owner to release a grant nobody wants any more.
    op: pb::request::Op,
    /// The caller gave up on this acquire: after a reconnect, cancel it.
    cancelled: bool,
    waiter: Waiter,
    /// For requests sent on nobody's behalf (cancels, releases of unwanted
    /// grants): the [`Settling`] ticket to close when the request is answered.
    ticket: Option<u64>,
}

/// Requests of one client that no caller waits for (the cancel of a dropped
/// acquire, the release of a grant that raced the drop), until the server
/// has answered them.
///
/// The client's `describe` and `list` first wait (briefly) for those sent
/// before them, so that its inspection reflects what it already gave up:
/// after an acquire future is dropped, the same client's `describe` no
/// longer shows it queued.
#[derive(Default)]
struct Settling {
    state: Mutex<(u64, BTreeMap<u64, usize>)>,
    settled: Notify,
}

impl Settling {
    fn lock(&self) -> MutexGuard<'_, (u64, BTreeMap<u64, usize>)> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A new ticket, open once.
    fn open(&self) -> u64 {
        let mut state = self.lock();
        state.0 += 1;
        let ticket = state.0;
        state.1.insert(ticket, 1);
        ticket
    }

    /// Opens `ticket` once more.
    fn join(&self, ticket: u64) {
        *self.lock().1.entry(ticket).or_insert(0) += 1;
    }

    /// Closes `ticket` once.
    fn close(&self, ticket: u64) {
        let mut state = self.lock();
        if let Some(count) = state.1.get_mut(&ticket) {
            *count -= 1;
            if *count == 0 {
                state.1.remove(&ticket);
                self.settled.notify_waiters();
            }
        }
    }

    /// Waits until every ticket opened before now is closed, at most `limit`.
    ///
    /// Cancel safety: safe; it only waits.
    async fn wait_for_earlier(&self, limit: Duration) {
        let horizon = self.lock().0;
        let deadline = Instant::now() + limit;
        loop {
            let notified = self.settled.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if self.lock().1.range(..=horizon).next().is_none() {
                return;
            }
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                return;
            }
        }
    }
}

/// The resume credentials of a session.
#[derive(Clone)]
pub(super) struct Credentials {
    pub id: u64,
    pub secret: Vec<u8>,
}

/// State shared by the backend, its holds and the driver task.
pub(super) struct State {
    next_id: u64,
    outstanding: BTreeMap<u64, Outstanding>,
    ack_replies: Vec<u64>,
    ack_lost: Vec<u64>,
    /// Lost signals of live holds by token (one grant per hold: the model
    /// layer decides re-entry).
    holds: HashMap<u64, LostSignal>,
    /// The current stream, while connected.
    link: Option<mpsc::UnboundedSender<Outgoing>>,
    /// Bumped whenever the session is lost: holds of an older generation are gone.
    pub generation: u64,
    pub closed: bool,
    /// Requests sent on nobody's behalf, until answered.
    settling: Arc<Settling>,
}

impl State {
    fn new() -> State {
        State {
            next_id: 1,
            outstanding: BTreeMap::new(),
            ack_replies: Vec::new(),
            ack_lost: Vec::new(),
            holds: HashMap::new(),
            link: None,
            generation: 0,
            closed: false,
            settling: Arc::default(),
        }
    }

    /// Sends one message on the current stream, with pending acknowledgements.
    /// It leaves in the next batch (see [`batches`]).
    fn send(&mut self, kind: Out) {
        let Some(link) = &self.link else { return };
        let message = Outgoing {
            kind,
            ack_replies: std::mem::take(&mut self.ack_replies),
            ack_lost: std::mem::take(&mut self.ack_lost),
        };
        if link.send(message).is_err() {
            self.link = None;
        }
    }

    /// Registers a request and sends it if connected; returns its id.
    fn request(&mut self, op: pb::request::Op, waiter: Waiter, ticket: Option<u64>) -> u64 {
        let id = self.next_id;
        self.next_id += 1;
        self.send(Out::Request(pb::Request {
            id,
            op: Some(op.clone()),
        }));
        self.outstanding.insert(
            id,
            Outstanding {
                op,
                cancelled: false,
                waiter,
                ticket,
            },
        );
        id
    }

    /// Sends an acquire; its outcome arrives on the returned receiver.
    pub(super) fn acquire(
        &mut self,
        acquire: pb::Acquire,
        deadline: Option<Instant>,
    ) -> Result<(u64, oneshot::Receiver<AcquireOutcome>)> {
        if self.closed {
            return Err(Error::Closed);
        }
        let (reply, receiver) = oneshot::channel();
        let waiter = Waiter::Acquire {
            reply: Some(reply),
            deadline,
        };
        let id = self.request(pb::request::Op::Acquire(acquire), waiter, None);
        Ok((id, receiver))
    }

    /// Sends a release or renew; its result arrives on the returned receiver.
    pub(super) fn simple(&mut self, op: pb::request::Op) -> Result<oneshot::Receiver<Result<()>>> {
        if self.closed {
            return Err(Error::Closed);
        }
        let (reply, receiver) = oneshot::channel();
        self.request(op, Waiter::Done(Some(reply)), None);
        Ok(receiver)
    }

    /// The acquire future `id` was dropped: cancel the request, or release the
    /// grant that raced the drop.
    pub(super) fn abandon(
        &mut self,
        id: u64,
        receiver: &mut oneshot::Receiver<AcquireOutcome>,
        names: &[String],
        owner: &str,
    ) {
        if let Some(entry) = self.outstanding.get_mut(&id) {
            if let Waiter::Acquire { reply, .. } = &mut entry.waiter {
                *reply = None;
            }
            entry.cancelled = true;
            entry.ticket = Some(self.settling.open());
            self.send(Out::Cancel(pb::Cancel { id }));
        } else if let Ok(AcquireOutcome::Granted(tokens, ..)) = receiver.try_recv() {
            // The grant was delivered (under this lock) just before the drop.
            let ticket = self.settling.open();
            self.release_unused(names, owner, &tokens, ticket);
            self.settling.close(ticket);
        }
    }

    /// Forgets the lost signals of a released grant's `tokens`.
    pub(super) fn forget(&mut self, tokens: &[u64]) {
        for token in tokens {
            self.holds.remove(token);
        }
    }

    /// Releases a grant nobody will use, without waiting.
    /// Its requests join `ticket`, so that inspection waits for them.
    fn release_unused(&mut self, names: &[String], owner: &str, tokens: &[u64], ticket: u64) {
        self.forget(tokens);
        for (name, &token) in names.iter().zip(tokens) {
            let release = pb::request::Op::Release(pb::Release {
                name: name.clone(),
                owner: owner.to_owned(),
                token: Some(token),
            });
            self.settling.join(ticket);
            self.request(release, Waiter::Done(None), Some(ticket));
        }
    }

    /// A grant: one lost signal shared by its tokens.
    fn register(&mut self, tokens: &[u64]) -> LostSignal {
        let signal = LostSignal::new();
        for &token in tokens {
            self.holds.insert(token, signal.clone());
        }
        signal
    }

    /// Delivers a final reply.
    fn finish(&mut self, id: u64, result: pb::reply::Result) {
        let Some(entry) = self.outstanding.remove(&id) else {
            return; // answered before (a reply sent again after a resume)
        };
        self.ack_replies.push(id);
        let ticket = entry.ticket;
        self.deliver(entry, result);
        if let Some(ticket) = ticket {
            self.settling.close(ticket);
        }
    }

    /// Hands a final reply to whoever waits for it.
    fn deliver(&mut self, entry: Outstanding, result: pb::reply::Result) {
        use pb::reply::Result as R;
        let ticket = entry.ticket;
        match entry.waiter {
            Waiter::Acquire { reply, .. } => {
                let outcome = match result {
                    R::Granted(granted) => {
                        let tokens = granted.tokens;
                        let signal = self.register(&tokens);
                        let unused = match reply {
                            Some(reply) => {
                                let granted =
                                    AcquireOutcome::Granted(tokens, signal, self.generation);
                                match reply.send(granted) {
                                    Err(AcquireOutcome::Granted(tokens, ..)) => tokens,
                                    _ => return,
                                }
                            }
                            None => tokens,
                        };
                        let pb::request::Op::Acquire(acquire) = &entry.op else {
                            return; // a grant answers an acquire only
                        };
                        let own = ticket.is_none();
                        let ticket = ticket.unwrap_or_else(|| self.settling.open());
                        self.release_unused(&acquire.names, &acquire.owner, &unused, ticket);
                        if own {
                            self.settling.close(ticket);
                        }
                        return;
                    }
                    R::WouldBlock(_) => AcquireOutcome::WouldBlock,
                    R::TimedOut(_) => AcquireOutcome::TimedOut,
                    R::Cancelled(_) => {
                        AcquireOutcome::Failed(Error::backend(super::BACKEND, "acquire cancelled"))
                    }
                    R::Error(error) => AcquireOutcome::Failed(convert::error(error)),
                    R::Done(_) | R::Queued(_) => AcquireOutcome::Failed(Error::backend(
                        super::BACKEND,
                        "unexpected reply to an acquire",
                    )),
                };
                if let Some(reply) = reply {
                    let _ = reply.send(outcome);
                }
            }
            Waiter::Done(reply) => {
                let result = match result {
                    R::Done(_) => Ok(()),
                    R::Error(error) => Err(convert::error(error)),
                    _ => Err(Error::backend(super::BACKEND, "unexpected reply")),
                };
                if let Some(reply) = reply {
                    let _ = reply.send(result);
                }
            }
        }
    }

    /// The messages that re-send every outstanding request, in id order.
    fn resend_all(&mut self) {
        let now = Instant::now();
        let messages: Vec<Out> = self
            .outstanding
            .iter()
            .map(|(&id, entry)| match &entry.op {
                _ if entry.cancelled => Out::Cancel(pb::Cancel { id }),
                op => {
                    let mut op = op.clone();
                    if let (
                        pb::request::Op::Acquire(acquire),
                        Waiter::Acquire {
                            deadline: Some(deadline),
                            ..
                        },
                    ) = (&mut op, &entry.waiter)
                    {
                        acquire.wait_ms =
                            convert::ceil_ms(deadline.saturating_duration_since(now)) + 1;
                    }
                    Out::Request(pb::Request { id, op: Some(op) })
                }
            })
            .collect();
        for message in messages {
            self.send(message);
        }
    }

    /// The session is gone (`cause`: the server said so, or the client lost
    /// contact for longer than the server keeps it): every hold is lost;
    /// acquires go on in a new session, the rest fails.
    fn lose_session(&mut self, loss: Loss) {
        let Loss { cause, reason } = loss;
        tracing::warn!(backend = super::BACKEND, %reason, holds = self.holds.len(), "session lost");
        for (_, signal) in self.holds.drain() {
            signal.fire_because(cause, &reason);
        }
        self.outstanding.retain(|_, entry| {
            let keep = match &mut entry.waiter {
                Waiter::Acquire { reply, .. } => reply.is_some(),
                Waiter::Done(reply) => {
                    if let Some(reply) = reply.take() {
                        let _ = reply.send(Err(Error::Lost(crate::error::Loss::because(
                            cause,
                            reason.clone(),
                        ))));
                    }
                    false
                }
            };
            if !keep {
                if let Some(ticket) = entry.ticket {
                    self.settling.close(ticket);
                }
            }
            keep
        });
        self.generation += 1;
        self.ack_replies.clear();
        self.ack_lost.clear();
        self.link = None;
    }

    /// The client is closed: everything ends.
    fn shut(&mut self, reason: &str) {
        self.closed = true;
        self.link = None;
        for (_, signal) in self.holds.drain() {
            signal.fire_because(LostCause::ClientClosed, reason);
        }
        for (_, entry) in std::mem::take(&mut self.outstanding) {
            if let Some(ticket) = entry.ticket {
                self.settling.close(ticket);
            }
            match entry.waiter {
                Waiter::Acquire {
                    reply: Some(reply), ..
                } => {
                    let _ = reply.send(AcquireOutcome::Failed(Error::Closed));
                }
                Waiter::Done(Some(reply)) => {
                    let _ = reply.send(Err(Error::Closed));
                }
                _ => {}
            }
        }
    }
}

impl Drop for State {
    fn drop(&mut self) {
        // A client dropped without its driver finishing (its runtime ended):
        // nobody will answer its requests any more.
        for entry in self.outstanding.values() {
            if let Some(ticket) = entry.ticket {
                self.settling.close(ticket);
            }
        }
    }
}

/// Everything the backend, its holds and the driver share.
pub(super) struct Shared {
    state: Mutex<State>,
    pub ttl: Duration,
    options: ConnectOptions,
    pub members: Arc<Members>,
    /// Cancelled to close the session.
    pub closing: CancellationToken,
    /// Cancelled when the driver has finished.
    pub finished: CancellationToken,
}

impl Shared {
    pub(super) fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().expect("server session state poisoned")
    }

    /// Waits (at most a second) until the cancels and releases this client
    /// sent on nobody's behalf before now are answered.
    ///
    /// Cancel safety: safe; it only waits.
    pub(super) async fn settle_earlier(&self) {
        let settling = self.state().settling.clone();
        settling.wait_for_earlier(Duration::from_secs(1)).await;
    }
}

/// Why a stream ended.
enum End {
    Closed,
    SessionLost(Loss),
    Broken(String),
}

/// Why a stream could not be set up.
enum SetupError {
    UnknownSession(String),
    /// The member named the leader, which is now current: try again at once.
    Redirected,
    /// The member named a leader that is passed over; it stays current, to
    /// be asked again after a pause.
    StaleHint,
    Failed(Error),
}

/// A stream carrying an open session.
struct Link {
    inbound: Inbound,
    /// Messages that came in the same batch as `opened`/`resumed` (lost
    /// notices after a resume), for [`run`] to handle first.
    early: Vec<pb::ServerMessage>,
    outbound: mpsc::UnboundedSender<Outgoing>,
    credentials: Credentials,
    /// When the open/resume message was sent: the session lives at least one
    /// TTL from then.
    sent_at: Instant,
    /// The member it is connected to, for [`Members::failed`].
    member: usize,
}

/// One message for the stream, with the acknowledgements gathered before it.
struct Outgoing {
    kind: Out,
    ack_replies: Vec<u64>,
    ack_lost: Vec<u64>,
}

/// Encoded bytes at which a batch stops growing: far below the server's
/// message limit (1 MiB by default), and large enough that a bigger batch
/// would save nothing more.
const MAX_BATCH_BYTES: usize = 64 << 10;

/// The request stream of a session: every message queued since the last poll
/// leaves as one [`pb::ClientBatch`] (up to [`MAX_BATCH_BYTES`]), so many
/// callers' requests share one HTTP/2 message and one wake-up of the
/// connection. Ends when every sender is gone.
///
/// The server forgets a batch's acknowledged replies before it runs the
/// batch's messages, so a message whose acknowledgements name a request (or
/// cancel) already in the batch starts the next batch instead: a request sent
/// again on a resume and answered before it left would otherwise find its
/// kept reply forgotten, and run a second time.
fn batches(
    mut queue: mpsc::UnboundedReceiver<Outgoing>,
) -> impl futures::Stream<Item = pb::ClientBatch> {
    use locksmith_proto::prost::Message as _;
    let mut held_back: Option<Outgoing> = None;
    futures::stream::poll_fn(move |cx| {
        let mut next = match held_back.take() {
            Some(first) => Some(first),
            None => match queue.poll_recv(cx) {
                std::task::Poll::Ready(Some(first)) => Some(first),
                std::task::Poll::Ready(None) => return std::task::Poll::Ready(None),
                std::task::Poll::Pending => return std::task::Poll::Pending,
            },
        };
        let mut batch = pb::ClientBatch::default();
        let mut bytes = 0;
        // The least and greatest request or cancel id in the batch: an
        // acknowledgement outside them (an older request's, as nearly all
        // are) needs no look at the batch.
        let mut ids: Option<(u64, u64)> = None;
        while let Some(outgoing) = next.take() {
            let in_batch = |&ack: &u64| {
                ids.is_some_and(|(least, greatest)| (least..=greatest).contains(&ack))
                    && batch
                        .messages
                        .iter()
                        .any(|m| id_of(m.kind.as_ref()) == Some(ack))
            };
            if outgoing.ack_replies.iter().any(in_batch) {
                held_back = Some(outgoing);
                break;
            }
            if let Some(id) = id_of(Some(&outgoing.kind)) {
                ids = Some(ids.map_or((id, id), |(least, greatest)| {
                    (least.min(id), greatest.max(id))
                }));
            }
            let message = pb::ClientMessage {
                kind: Some(outgoing.kind),
            };
            bytes += message.encoded_len()
                + 4
                + 10 * (outgoing.ack_replies.len() + outgoing.ack_lost.len());
            batch.messages.push(message);
            batch.ack_replies.extend(outgoing.ack_replies);
            batch.ack_lost.extend(outgoing.ack_lost);
            if bytes < MAX_BATCH_BYTES {
                next = queue.try_recv().ok();
            }
        }
        std::task::Poll::Ready(Some(batch))
    })
}

/// The id of a request or cancel message.
fn id_of(kind: Option<&Out>) -> Option<u64> {
    match kind {
        Some(Out::Request(pb::Request { id, .. }) | Out::Cancel(pb::Cancel { id })) => Some(*id),
        _ => None,
    }
}

/// Opens (or resumes, with `resume`) a session on a new stream.
///
/// Cancel safety: safe; a dropped attempt leaves at most a session that
/// expires after its TTL (or, for a resume, one still waiting to be resumed).
async fn establish(
    members: &Members,
    options: &ConnectOptions,
    ttl: Duration,
    resume: Option<&Credentials>,
) -> Result<Link, SetupError> {
    let (outbound, queue) = mpsc::unbounded_channel();
    let first = match resume {
        Some(c) => Out::Resume(pb::ResumeSession {
            session_id: c.id,
            secret: c.secret.clone(),
        }),
        None => Out::Open(pb::OpenSession {
            client_name: options.client_name.clone(),
            host: options.host.clone(),
            ttl_ms: convert::ceil_ms(ttl),
        }),
    };
    let _ = outbound.send(Outgoing {
        kind: first,
        ack_replies: Vec::new(),
        ack_lost: Vec::new(),
    });
    let sent_at = Instant::now();
    let (at, addr, _) = members.current();
    let failed = |status: tonic::Status| {
        let transport = transport_error(&status);
        if !transport {
            members.answered(at);
        }
        if status.code() == Code::NotFound {
            return SetupError::UnknownSession(status.message().to_owned());
        }
        match members.follow(&status) {
            Redirect::Leader => return SetupError::Redirected,
            Redirect::Stale => return SetupError::StaleHint,
            Redirect::None => {}
        }
        if member_down(&status) {
            if transport {
                members.broke(at);
            } else {
                members.could_not_serve(at, &status);
            }
        }
        // Which member failed matters for a connection problem; an answer
        // about the request (a limit, a bad argument) keeps its own error.
        SetupError::Failed(match convert::status(status) {
            Error::Backend { source, .. } => {
                Error::backend(super::BACKEND, format!("{addr}: {source}"))
            }
            error => error,
        })
    };
    // A member whose connection broke gets a few round trips to answer (a
    // connection, then the stream's headers, which the server sends at
    // once): a crashed machine answers nothing, and its followers may
    // still name it.
    let opening =
        session_transport::open(&addr, members.url(), members.connector(), batches(queue));
    let opened = if members.broken(at) {
        let within = broken_member_patience(ttl);
        match tokio::time::timeout(within, opening).await {
            Ok(opened) => opened,
            Err(_) => {
                members.out_of_patience(at);
                return Err(SetupError::Failed(Error::backend(
                    super::BACKEND,
                    format!("{addr}: no answer within {within:?} after its connection broke"),
                )));
            }
        }
    } else {
        opening.await
    };
    let mut inbound = opened.map_err(failed)?;
    members.answered(at);
    let mut early = inbound
        .message()
        .await
        .map_err(failed)?
        .map(|batch| batch.messages)
        .unwrap_or_default();
    let first = (!early.is_empty()).then(|| early.remove(0).kind);
    let credentials = match first {
        Some(Some(In::Opened(opened))) => {
            members.known_as(at, &opened.member);
            Credentials {
                id: opened.session_id,
                secret: opened.secret,
            }
        }
        Some(Some(In::Resumed(resumed))) => {
            members.known_as(at, &resumed.member);
            resume
                .cloned()
                .expect("resumed only what we asked to resume")
        }
        other => {
            return Err(SetupError::Failed(Error::backend(
                super::BACKEND,
                format!("unexpected first message on a session stream: {other:?}"),
            )))
        }
    };
    Ok(Link {
        inbound,
        early,
        outbound,
        credentials,
        sent_at,
        member: at,
    })
}

/// Opens the first session, on the first member that serves (following
/// redirects to the leader), and starts the driver that keeps it.
///
/// Cancel safety: as [`establish`].
pub(super) async fn connect(members: Arc<Members>, options: ConnectOptions) -> Result<Arc<Shared>> {
    let ttl = options.session_ttl;
    // Members that are down, or in an election, are waited out for as long
    // as one attempt at a lone member may take.
    let mut rounds = Rounds::new(&members, setup_timeout(ttl));
    // A member that accepts connections but answers nothing (frozen,
    // overloaded) gets its share of that, not all of it: the others are
    // tried in time.
    let attempt = setup_timeout(ttl) / members.len().max(1) as u32;
    let link = loop {
        let setup = establish(&members, &options, ttl, None);
        let error = match tokio::time::timeout(attempt, setup).await {
            Ok(Ok(link)) => break link,
            Ok(Err(SetupError::Redirected)) => {
                Error::backend(super::BACKEND, "redirected without reaching the leader")
            }
            Ok(Err(SetupError::StaleHint)) => {
                let (_, addr, _) = members.current();
                if rounds.again(&members, true).await {
                    continue;
                }
                Error::backend(
                    super::BACKEND,
                    format!("{addr} named a leader that answered nothing"),
                )
            }
            // An answer about the request (a limit, a bad argument) is final;
            // only a member that cannot serve is worth another round.
            Ok(Err(SetupError::Failed(error))) if !matches!(error, Error::Backend { .. }) => {
                return Err(error)
            }
            Ok(Err(SetupError::Failed(error))) => error,
            Ok(Err(SetupError::UnknownSession(message))) => {
                return Err(Error::backend(super::BACKEND, message))
            }
            Err(_) => {
                let (at, addr, _) = members.current();
                members.unresponsive(at);
                Error::backend(
                    super::BACKEND,
                    format!("{addr}: the server did not open a session in time"),
                )
            }
        };
        if !rounds.again(&members, false).await {
            if members.len() == 1 {
                return Err(error);
            }
            let tried = members.addresses().join(", ");
            return Err(Error::backend(
                super::BACKEND,
                format!("no member serves (tried {tried}); the last said: {error}"),
            ));
        }
        tracing::debug!(backend = super::BACKEND, %error, "trying again");
    };
    let mut state = State::new();
    state.link = Some(link.outbound.clone());
    let shared = Arc::new(Shared {
        state: Mutex::new(state),
        ttl,
        options,
        members,
        closing: CancellationToken::new(),
        finished: CancellationToken::new(),
    });
    tracing::debug!(
        backend = super::BACKEND,
        session = link.credentials.id,
        "session opened"
    );
    tokio::spawn(drive(shared.clone(), link));
    Ok(shared)
}

fn setup_timeout(ttl: Duration) -> Duration {
    ttl.clamp(Duration::from_secs(1), Duration::from_secs(10))
}

/// How long one reconnect attempt of a live session may take: short enough
/// that a member which hangs leaves time to try the others within the TTL.
pub(super) fn reconnect_timeout(ttl: Duration) -> Duration {
    (ttl / 3).clamp(Duration::from_millis(300), Duration::from_secs(10))
}

/// How long a member whose connection broke ([`Members::broken`]) has to
/// answer a new stream: many round trips on any network a session of `ttl`
/// suits, a moment beside the TTL.
fn broken_member_patience(ttl: Duration) -> Duration {
    (ttl / 10).clamp(Duration::from_millis(100), Duration::from_secs(1))
}

/// Whether `status` carries a transport error (tonic makes such a status
/// from an error of the connection, and gives it that error as its source),
/// rather than an answer the member sent.
fn transport_error(status: &tonic::Status) -> bool {
    std::error::Error::source(status).is_some()
}

/// Keeps the session: runs the stream, and after it breaks, reconnects and
/// resumes (or opens a new session once the old one is lost).
///
/// Cancel safety: runs as its own task until the client closes; if the
/// runtime drops it, the session expires on the server after its TTL.
async fn drive(shared: Arc<Shared>, first: Link) {
    let mut link = first;
    let mut session = Some(link.credentials.clone());
    let mut heartbeats = Heartbeats::opened(link.sent_at, shared.ttl);
    let mut rounds = Rounds::for_session(&shared.members, shared.ttl);
    loop {
        let early = std::mem::take(&mut link.early);
        let end = run(&shared, &mut link, early, &mut heartbeats).await;
        // A link on which no heartbeat was answered (a member that took the
        // resume, then could not commit it) counts as a failed attempt, so
        // that such a member is not asked again and again without a pause.
        let mut pause = Duration::ZERO;
        if heartbeats.answered_since(link.sent_at) {
            rounds = Rounds::for_session(&shared.members, shared.ttl);
        } else if matches!(end, End::Broken(_)) {
            pause = rounds.after_failure(&shared.members);
        }
        let mut stale = None;
        match end {
            End::Closed => {
                shared.state().shut("client closed");
                shared.finished.cancel();
                return;
            }
            End::SessionLost(loss) => {
                shared.state().lose_session(loss);
                stale = session.take();
            }
            End::Broken(reason) => {
                tracing::info!(backend = super::BACKEND, %reason, "connection to the lock server lost; resuming");
                shared.state().link = None;
                heartbeats.broken(Instant::now(), reason);
            }
        }
        // The old stream's connection goes with it: its tasks run only while
        // the link is polled, and a server stopping gracefully waits for it.
        drop(link);
        link = loop {
            if !pause.is_zero() {
                let mut until = Instant::now() + pause;
                if session.is_some() {
                    until = until.min(heartbeats.trusted_until());
                }
                tokio::select! {
                    _ = sleep_until(until) => {}
                    _ = shared.closing.cancelled() => {}
                }
            }
            if shared.closing.is_cancelled() {
                if let Some(credentials) = session.take().or(stale.take()) {
                    close_remotely(&shared, credentials).await;
                }
                shared.state().shut("client closed");
                shared.finished.cancel();
                return;
            }
            if let Some(loss) = session
                .as_ref()
                .and_then(|_| heartbeats.ran_out(Instant::now()))
            {
                shared.state().lose_session(loss);
                stale = session.take();
            }
            if session.is_none() {
                if let Some(credentials) = stale.take() {
                    // Free whatever the old session may still hold on the server.
                    close_remotely(&shared, credentials).await;
                }
            }
            let setup = establish(
                &shared.members,
                &shared.options,
                shared.ttl,
                session.as_ref(),
            );
            // A resume is given up, as the keeper gives up every renewal,
            // when the session's trust runs out.
            let mut attempt_until = Instant::now() + reconnect_timeout(shared.ttl);
            if session.is_some() {
                attempt_until = attempt_until.min(heartbeats.trusted_until());
            }
            pause = match tokio::time::timeout_at(attempt_until, setup).await {
                Ok(Ok(new)) => {
                    let trusted = session.is_none() || heartbeats.resumed(Instant::now());
                    if trusted {
                        let mut state = shared.state();
                        state.link = Some(new.outbound.clone());
                        state.resend_all();
                        break new;
                    }
                    // Resumed too late to count: the session is lost (above,
                    // next round), and closed, and a new one opened.
                    Duration::ZERO
                }
                Ok(Err(SetupError::UnknownSession(message))) => {
                    let said = format!("the lock server no longer knows it: {message}");
                    shared
                        .state()
                        .lose_session(heartbeats.gone(Instant::now(), &said));
                    session = None;
                    Duration::ZERO
                }
                Ok(Err(SetupError::Redirected)) => rounds.after_failure(&shared.members),
                Ok(Err(SetupError::StaleHint)) => rounds.before_asking_again(),
                Ok(Err(SetupError::Failed(error))) => {
                    tracing::debug!(backend = super::BACKEND, %error, "reconnect failed");
                    // A member that could not serve is behind us; one that
                    // refused the request itself is asked again.
                    if matches!(error, Error::Backend { .. }) {
                        rounds.after_failure(&shared.members)
                    } else {
                        rounds.before_asking_again()
                    }
                }
                // The session's trust ran out: lost above, next round.
                Err(_) if session.is_some() && Instant::now() >= heartbeats.trusted_until() => {
                    Duration::ZERO
                }
                Err(_) => {
                    // A member that does not answer in time is passed over,
                    // as a frozen leader would hold the client until the
                    // session is lost.
                    let (at, addr, _) = shared.members.current();
                    shared.members.unresponsive(at);
                    tracing::debug!(backend = super::BACKEND, %addr, "reconnect timed out");
                    rounds.after_failure(&shared.members)
                }
            };
        };
        if session.is_none() {
            heartbeats = Heartbeats::opened(link.sent_at, shared.ttl);
            tracing::info!(
                backend = super::BACKEND,
                session = link.credentials.id,
                "new session opened"
            );
        } else {
            tracing::info!(
                backend = super::BACKEND,
                session = link.credentials.id,
                "session resumed"
            );
        }
        crate::metrics::reconnected(super::BACKEND);
        session = Some(link.credentials.clone());
    }
}

/// Closes a session through the unary call (best effort, bounded).
///
/// Cancel safety: safe; the close may or may not have happened.
async fn close_remotely(shared: &Shared, credentials: Credentials) {
    let request = pb::CloseSessionRequest {
        session_id: credentials.id,
        secret: credentials.secret,
    };
    let (_, _, mut client) = shared.members.current();
    let _ = tokio::time::timeout(CLOSE_WAIT, client.close_session(request)).await;
}

/// Runs one stream until it ends: routes replies and pushes (`early` first),
/// and sends heartbeats, leaves a member that answered none for half a TTL
/// (when there are others) and gives the session up, as `heartbeats` says.
///
/// Cancel safety: safe between batches; every routing step is synchronous.
async fn run(
    shared: &Shared,
    link: &mut Link,
    early: Vec<pb::ServerMessage>,
    heartbeats: &mut Heartbeats,
) -> End {
    let inbound = &mut link.inbound;
    let others = shared.members.len() > 1;
    let wake = sleep_until(heartbeats.wake_at(others));
    tokio::pin!(wake);
    let mut batch = early;
    loop {
        if !batch.is_empty() {
            let batch = std::mem::take(&mut batch);
            if let Some(end) = route(shared, batch, heartbeats) {
                return end;
            }
        }
        let wake_at = heartbeats.wake_at(others);
        if wake.deadline() != wake_at {
            wake.as_mut().reset(wake_at);
        }
        tokio::select! {
            biased;
            _ = shared.closing.cancelled() => return close(shared, inbound).await,
            message = inbound.message() => {
                batch = match message {
                    Ok(Some(batch)) => batch.messages,
                    Ok(None) => return End::Broken("the server ended the stream".into()),
                    Err(status) if status.code() == Code::NotFound => {
                        return End::SessionLost(heartbeats.gone(Instant::now(), status.message()))
                    }
                    Err(status) => {
                        // A member that ends the stream because it cannot
                        // serve says where to go: the leader it names, or
                        // any other member.
                        if shared.members.follow(&status) == Redirect::None && member_down(&status) {
                            if transport_error(&status) {
                                shared.members.broke(link.member);
                            } else {
                                shared.members.could_not_serve(link.member, &status);
                            }
                        }
                        return End::Broken(status.to_string());
                    }
                };
            }
            _ = &mut wake => match heartbeats.poll(Instant::now(), others) {
                Due::Lost(loss) => return End::SessionLost(loss),
                Due::Suspect => {
                    shared.members.unresponsive(link.member);
                    return End::Broken(
                        "no heartbeat answered for half a session TTL; trying another member".into(),
                    );
                }
                Due::Send => shared.state().send(Out::Heartbeat(pb::Heartbeat {})),
                Due::Nothing => {}
            },
        }
    }
}

/// Routes one batch of server messages under one lock of the state; the
/// heartbeats' answers go to `heartbeats`.
fn route(
    shared: &Shared,
    messages: Vec<pb::ServerMessage>,
    heartbeats: &mut Heartbeats,
) -> Option<End> {
    let now = Instant::now();
    let mut state = shared.state();
    for message in messages {
        match message.kind {
            Some(In::Heartbeat(_)) => heartbeats.answered(now),
            Some(In::Reply(reply)) => {
                if let Some(result) = reply.result {
                    if !matches!(result, pb::reply::Result::Queued(_)) {
                        state.finish(reply.id, result);
                    }
                }
            }
            Some(In::Lost(lost)) => lost_push(&mut state, lost),
            Some(In::Ended(ended)) => {
                let said = format!("session {}", ended.reason);
                return Some(End::SessionLost(heartbeats.gone(now, &said)));
            }
            Some(In::Opened(_)) | Some(In::Resumed(_)) | None => {}
        }
    }
    None
}

fn lost_push(state: &mut State, lost: pb::Lost) {
    state.ack_lost.push(lost.token);
    if let Some(signal) = state.holds.remove(&lost.token) {
        let cause = match pb::LostReason::try_from(lost.reason) {
            Ok(pb::LostReason::SessionExpired) => LostCause::SessionExpired,
            // Only the session's own client can close it (the secret
            // shows it): this is the client's close, answered ahead of it.
            Ok(pb::LostReason::SessionClosed) => LostCause::ClientClosed,
            Ok(pb::LostReason::LeaseExpired) => LostCause::LeaseExpired,
            Ok(pb::LostReason::ForceReleased) => LostCause::ForceReleased,
            Err(_) => LostCause::Other,
        };
        let reason = super::convert::lost_reason(lost.reason);
        signal.fire_because(cause, format!("{}: {reason}", lost.name));
    }
}

/// Closes the session on its stream and waits (bounded) for the server's word.
///
/// Cancel safety: the close message is sent first; dropping only stops the wait.
async fn close(shared: &Shared, inbound: &mut Inbound) -> End {
    shared.state().send(Out::Close(pb::Close {}));
    let _ = tokio::time::timeout(CLOSE_WAIT, async {
        while let Ok(Some(batch)) = inbound.message().await {
            for message in batch.messages {
                match message.kind {
                    Some(In::Lost(lost)) => lost_push(&mut shared.state(), lost),
                    Some(In::Ended(_)) => return,
                    _ => {}
                }
            }
        }
    })
    .await;
    End::Closed
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::StreamExt;

    fn outgoing(kind: Out, ack_replies: &[u64]) -> Outgoing {
        Outgoing {
            kind,
            ack_replies: ack_replies.to_vec(),
            ack_lost: Vec::new(),
        }
    }

    fn release(id: u64) -> Out {
        Out::Request(pb::Request {
            id,
            op: Some(pb::request::Op::Release(pb::Release {
                name: "a".into(),
                owner: "o".into(),
                token: Some(1),
            })),
        })
    }

    /// Each batch's request and cancel ids, and its acknowledged replies.
    fn sent(batches: &[pb::ClientBatch]) -> Vec<(Vec<u64>, Vec<u64>)> {
        batches
            .iter()
            .map(|batch| {
                let ids = batch
                    .messages
                    .iter()
                    .filter_map(|m| id_of(m.kind.as_ref()))
                    .collect();
                (ids, batch.ack_replies.clone())
            })
            .collect()
    }

    #[tokio::test]
    async fn an_acknowledgement_never_leaves_with_the_request_it_answers() {
        let (queue, receiver) = mpsc::unbounded_channel();
        // Request 5 sent again on a resume, then its kept reply arrived and
        // the next message carries its acknowledgement.
        queue.send(outgoing(release(5), &[])).unwrap();
        queue.send(outgoing(release(6), &[5])).unwrap();
        // Cancel 7, answered before the cancel left.
        queue
            .send(outgoing(Out::Cancel(pb::Cancel { id: 7 }), &[2]))
            .unwrap();
        queue
            .send(outgoing(Out::Heartbeat(pb::Heartbeat {}), &[7]))
            .unwrap();
        drop(queue);
        let batches: Vec<_> = batches(receiver).collect().await;
        assert_eq!(
            sent(&batches),
            vec![
                (vec![5], vec![]),
                (vec![6, 7], vec![5, 2]),
                (vec![], vec![7]),
            ],
            "a batch forgets its acknowledged replies before it runs its requests"
        );
        assert_eq!(batches[2].messages.len(), 1, "the heartbeat leaves last");
    }

    #[tokio::test]
    async fn an_acknowledgement_of_another_request_leaves_in_the_same_batch() {
        let (queue, receiver) = mpsc::unbounded_channel();
        // Requests 5 and 9 sent again on a resume; 7's reply came meanwhile.
        queue.send(outgoing(release(5), &[])).unwrap();
        queue.send(outgoing(release(9), &[])).unwrap();
        queue.send(outgoing(release(10), &[7, 3])).unwrap();
        drop(queue);
        let batches: Vec<_> = batches(receiver).collect().await;
        assert_eq!(sent(&batches), vec![(vec![5, 9, 10], vec![7, 3])]);
    }
}
