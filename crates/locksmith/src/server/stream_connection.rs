//! The session stream's own HTTP/2 connection, run inside the session
//! driver's task.
//!
//! On a tonic `Channel` a reply reaches its caller through four tasks: the
//! connection's, the session driver's, the caller's (which sends its next
//! request) and hyper's body task, which wakes the connection's again to
//! write it. tokio runs a task woken by the running one next, on the same
//! worker, only three times in a row; the fourth goes to the run queue,
//! and the queue wakes the runtime's sleeping worker. That cost a client at
//! one lock at a time 1.7 wake-ups of another thread a request and half its
//! CPU (docs/BENCHMARKS.md, "Which wake-ups cross the client's workers").
//!
//! So the session stream gets a connection of its own (hyper's
//! `client::conn::http2`, tonic's generated client over it), and hyper runs
//! that connection's tasks on the executor it is given: [`Tasks`], which the
//! driver polls in its own task whenever it waits for the stream. A
//! request's way through the client is then two tasks, the caller's and
//! the driver's, as with Redis's client.
//!
//! While the driver polls its stream and those tasks its waker is muted
//! ([`WakeState`]): one of them waking another, or the stream's reader,
//! makes it poll again rather than wake its own running task, which tokio
//! would count as a yield and queue, waking the other worker all the same.
//! Written by hand for that reason: `FuturesUnordered`, the crate made for
//! a set of futures, wakes its own task once it has polled each of them in
//! one go, and an executor such as `LocalSet` is polled from outside.
//!
//! The unary calls keep the member's channel (module `members`), which
//! connects on first use: a client that only takes locks on its session
//! holds one connection. No HTTP/2 keep-alive here: the session's heartbeats
//! find a member that went silent (module `heartbeats`).

use std::future::Future;
use std::io;
use std::pin::Pin;
// `AtomicU8` for module `wake`, whose loom model gives it loom's.
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Wake, Waker};

use futures::task::AtomicWaker;
use std::time::Duration;

use locksmith_proto::transport::{dial, Connector};
use locksmith_proto::v1 as pb;
use locksmith_proto::v1::locksmith_client::LocksmithClient;
use tonic::service::interceptor::InterceptedService;
use tonic::Streaming;

use super::url::ServerUrl;
use super::MAX_RESPONSE_BYTES;

mod wake;
use wake::WakeState;

/// How long opening the connection may take (TCP, then TLS): as the unary
/// calls' channel's `connect_timeout`.
pub(super) const CONNECT_WITHIN: Duration = Duration::from_secs(5);

/// How many times one poll goes round while the stream or its tasks keep
/// waking each other, before it lets the runtime run other tasks.
const ROUNDS_PER_POLL: usize = 32;

/// A task hyper spawned.
type Task = Pin<Box<dyn Future<Output = ()> + Send>>;

/// The driver as its connection's tasks see it: the waker they wake and the
/// executor they are spawned on.
struct Driver {
    state: WakeState,
    /// The driver task's own waker, as of its last poll.
    task: AtomicWaker,
    /// Tasks hyper spawned, not yet polled.
    spawned: Mutex<Vec<Task>>,
}

impl Wake for Driver {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        if self.state.wake() {
            self.task.wake();
        }
    }
}

/// The executor hyper is given: a task goes to the driver, which polls it.
#[derive(Clone)]
struct Spawner(Arc<Driver>);

impl<F: Future<Output = ()> + Send + 'static> hyper::rt::Executor<F> for Spawner {
    fn execute(&self, task: F) {
        self.0.spawned.lock().unwrap().push(Box::pin(task));
        self.0.wake_by_ref();
    }
}

/// One task's waker: marks it ready and wakes the driver.
struct Slot {
    ready: AtomicBool,
    driver: Arc<Driver>,
}

impl Wake for Slot {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        if !self.ready.swap(true, Ordering::AcqRel) {
            self.driver.wake_by_ref();
        }
    }
}

/// A connection's tasks (hyper's connection task, and a task per request
/// body), polled by the session driver. Dropping it drops them, which
/// closes the connection.
pub(super) struct Tasks {
    driver: Arc<Driver>,
    /// The muted waker: `driver` as a `Waker`, made once.
    muted: Waker,
    /// Each task with its slot and the slot as a `Waker`, made once.
    running: Vec<(Task, Arc<Slot>, Waker)>,
}

impl Tasks {
    fn new() -> Tasks {
        let driver = Arc::new(Driver {
            state: WakeState::default(),
            task: AtomicWaker::new(),
            spawned: Mutex::new(Vec::new()),
        });
        Tasks {
            muted: Waker::from(driver.clone()),
            driver,
            running: Vec::new(),
        }
    }

    /// Polls the ready tasks and then `poll`, under the muted waker, again
    /// while one of them woke meanwhile; `poll`'s answer.
    ///
    /// When `poll` is ready, a task woken during that last round is left
    /// marked ready, without waking the driver's task (a self-wake, which
    /// costs the other worker's wake-up this module avoids): every caller
    /// polls again soon after a ready answer (the driver loops on
    /// [`Inbound::message`]), and the task runs then.
    fn poll_with<T>(
        &mut self,
        cx: &mut Context<'_>,
        mut poll: impl FnMut(&mut Context<'_>) -> Poll<T>,
    ) -> Poll<T> {
        self.driver.task.register(cx.waker());
        let muted_waker = self.muted.clone();
        let mut muted = Context::from_waker(&muted_waker);
        for _ in 0..ROUNDS_PER_POLL {
            self.driver.state.start_polling();
            self.poll_ready_tasks();
            let polled = poll(&mut muted);
            let woken = self.driver.state.stop_polling();
            if polled.is_ready() || !woken {
                return polled;
            }
        }
        cx.waker().wake_by_ref();
        Poll::Pending
    }

    /// Polls once each task that was woken (or is new).
    fn poll_ready_tasks(&mut self) {
        let spawned = std::mem::take(&mut *self.driver.spawned.lock().unwrap());
        self.running.extend(spawned.into_iter().map(|task| {
            let slot = Arc::new(Slot {
                ready: AtomicBool::new(true),
                driver: self.driver.clone(),
            });
            let waker = Waker::from(slot.clone());
            (task, slot, waker)
        }));
        let mut at = 0;
        while at < self.running.len() {
            let (task, slot, waker) = &mut self.running[at];
            let ready = slot.ready.swap(false, Ordering::AcqRel);
            if ready
                && task
                    .as_mut()
                    .poll(&mut Context::from_waker(waker))
                    .is_ready()
            {
                drop(self.running.swap_remove(at));
                continue;
            }
            at += 1;
        }
    }

    /// Runs `future` to its end, polling the tasks meanwhile. The tasks go
    /// on at the next call of this or [`Inbound::message`].
    ///
    /// Cancel safety: as `future`'s; the tasks stay with `self`.
    async fn run_until<F: Future>(&mut self, future: F) -> F::Output {
        let mut future = std::pin::pin!(future);
        std::future::poll_fn(|cx| self.poll_with(cx, |muted| future.as_mut().poll(muted))).await
    }
}

/// The inbound half of a session stream, with the tasks of the connection
/// that carries it.
pub(super) struct Inbound {
    stream: Streaming<pb::ServerBatch>,
    tasks: Tasks,
}

impl Inbound {
    /// The next batch, polling the connection's tasks meanwhile (which
    /// also sends what the driver queued). The connection runs only while
    /// this is polled: the driver calls it again after each batch, and
    /// drops the `Inbound` once it stops reading.
    ///
    /// Cancel safety: safe, as `Streaming::message`.
    pub(super) async fn message(&mut self) -> Result<Option<pb::ServerBatch>, tonic::Status> {
        let Inbound { stream, tasks } = self;
        std::future::poll_fn(|cx| {
            tasks.poll_with(cx, |muted| std::pin::pin!(stream.message()).poll(muted))
        })
        .await
    }
}

/// Opens a session stream on a new connection to `addr` (over `connector`
/// when given, else TCP; over TLS when `url` asks for it), sending what
/// `outbound` yields.
///
/// Errors as the channel's: a connection that could not be opened is an
/// `UNAVAILABLE` status with the I/O error as its source.
///
/// Cancel safety: safe; a dropped open closes what it opened.
pub(super) async fn open(
    addr: &str,
    url: &ServerUrl,
    connector: Option<&Connector>,
    outbound: impl futures::Stream<Item = pb::ClientBatch> + Send + 'static,
) -> Result<Inbound, tonic::Status> {
    let unavailable = |error: io::Error| {
        let mut status = tonic::Status::unavailable(error.to_string());
        status.set_source(Arc::new(error));
        status
    };
    let io = tokio::time::timeout(CONNECT_WITHIN, dial(addr, url.rustls(), connector))
        .await
        .map_err(|_| io::Error::new(io::ErrorKind::TimedOut, "connect timed out"))
        .and_then(|dialed| dialed)
        .map_err(unavailable)?;
    let mut tasks = Tasks::new();
    let spawner = Spawner(tasks.driver.clone());
    let mut builder = hyper::client::conn::http2::Builder::new(spawner.clone());
    if connector.is_some() {
        builder.reset_stream_duration(Connector::RESET_STREAM_MEMORY);
    }
    let (send, connection) = tasks
        .run_until(builder.handshake(hyper_util::rt::TokioIo::new(io)))
        .await
        .map_err(|error| unavailable(io::Error::other(error)))?;
    hyper::rt::Executor::execute(&spawner, async move {
        // Its error reaches the stream, whose end the driver handles.
        let _ = connection.await;
    });
    let scheme = if url.rustls().is_some() {
        "https"
    } else {
        "http"
    };
    let origin: http::Uri = format!("{scheme}://{addr}")
        .parse()
        .map_err(|error| tonic::Status::invalid_argument(format!("{addr}: {error}")))?;
    let mut client = LocksmithClient::with_origin(
        InterceptedService::new(Http2(send), url.credentials()),
        origin,
    )
    .max_decoding_message_size(MAX_RESPONSE_BYTES);
    let stream = tasks
        .run_until(client.session(outbound))
        .await?
        .into_inner();
    Ok(Inbound { stream, tasks })
}

/// hyper's request sender as the service tonic's client calls.
#[derive(Clone)]
struct Http2(hyper::client::conn::http2::SendRequest<tonic::body::Body>);

impl tower_service::Service<http::Request<tonic::body::Body>> for Http2 {
    type Response = http::Response<hyper::body::Incoming>;
    type Error = hyper::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, hyper::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), hyper::Error>> {
        self.0.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<tonic::body::Body>) -> Self::Future {
        Box::pin(self.0.send_request(request))
    }
}

#[cfg(test)]
mod tests;
