//! The HTTP listener (`--metrics-listen`): Prometheus metrics, health and
//! readiness, and a live web page of the lock table with its JSON API.
//!
//! | path | what |
//! |---|---|
//! | `/metrics` | every metric (module `metrics`), OpenMetrics text |
//! | `/healthz` | 200 while the process runs |
//! | `/readyz` | 200 while the core serves, 503 during recovery, after a storage failure and while stopping |
//! | `/` | the web page (plain HTML and JavaScript from the binary, no network) |
//! | `/api/locks?prefix=P&limit=N` | locks under a prefix: holders, waiters in order |
//! | `/api/sessions` | open sessions |
//! | `/api/history?prefix=P` | recent grants (module `history`) |
//! | `/api/cluster` | the Raft group's members as this member sees them (what `locksmith cluster status` shows); 503 before the member has started |
//! | `/debug/raft` | openraft's runtime statistics (entry stage latencies, batch sizes), text; 503 before the member has started |
//!
//! With authentication on (`--auth-file`), only `/metrics`, `/healthz` and
//! `/readyz` are served: they name no lock, owner or session. The page and
//! its API answer 403: the gRPC API, which checks each caller's grants, is
//! the way to inspect locks then.
//!
//! The listener starts before recovery, so health and metrics answer while a
//! large log replays. The API asks the core with the same ops as the gRPC
//! inspection calls (`List`, `ListSessions`, `History`), at most
//! [`MAX_INSPECTIONS`] at a time, so a page left open anywhere never competes
//! with lock traffic for more than that; nothing here runs in the core
//! or makes it wait.
//!
//! Readiness is one flag today (the core runs and takes requests). A
//! replicated member will also need a known leader and its apply index caught
//! up with the commit index; that check belongs in [`Readiness::check`].

mod api;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};

use axum::extract::{Query, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use serde::Deserialize;
use tokio::sync::{oneshot, Semaphore};
use tokio_util::sync::CancellationToken;

use crate::error::ServerError;
use crate::inbox::CoreSender;
use crate::metrics::Metrics;
use crate::op::{Op, UnaryReply};
use crate::raft::admin::cluster_status;
use crate::raft::Raft;

/// Most inspection ops the HTTP API has in flight at the core at once.
pub(crate) const MAX_INSPECTIONS: usize = 4;
/// Most locks `/api/locks` returns (the page shows how many it left out).
const MAX_LOCKS: usize = 10_000;
/// Locks `/api/locks` returns when the request names no limit.
const DEFAULT_LOCKS: usize = 1_000;

const PAGE_HTML: &str = include_str!("page.html");
const PAGE_JS: &str = include_str!("page.js");
const PAGE_CSS: &str = include_str!("page.css");

/// Whether the node can serve lock requests, for `/readyz`.
#[derive(Debug, Default)]
pub(crate) struct Readiness {
    serving: AtomicBool,
}

impl Readiness {
    /// The core runs (`true`) or stopped (`false`).
    pub(crate) fn set_serving(&self, serving: bool) {
        self.serving.store(serving, Ordering::Release);
    }

    /// `Ok` when ready, else why not.
    pub(crate) fn check(&self) -> Result<(), &'static str> {
        if self.serving.load(Ordering::Acquire) {
            Ok(())
        } else {
            Err("the lock engine is not serving (recovering, stopping or stopped)")
        }
    }
}

/// What the handlers share.
#[derive(Clone)]
struct Http {
    core: CoreSender,
    metrics: Arc<Metrics>,
    readiness: Arc<Readiness>,
    inspections: Arc<Semaphore>,
    /// This member's Raft handle, once it has started (after recovery).
    member: Arc<OnceLock<Raft>>,
}

/// Binds `addr` and serves until `stop` is cancelled. Returns the bound
/// address once connections are accepted.
///
/// Cancel safety: safe before it returns (nothing was spawned); after, the
/// listener runs until `stop`.
pub(crate) async fn start(
    addr: SocketAddr,
    core: CoreSender,
    metrics: Arc<Metrics>,
    readiness: Arc<Readiness>,
    member: Arc<OnceLock<Raft>>,
    auth_on: bool,
    stop: CancellationToken,
) -> Result<SocketAddr, ServerError> {
    let bind_error = |source| ServerError::Bind { addr, source };
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(bind_error)?;
    let local = listener.local_addr().map_err(bind_error)?;
    let state = Http {
        core,
        metrics,
        readiness,
        inspections: Arc::new(Semaphore::new(MAX_INSPECTIONS)),
        member,
    };
    let router = Router::new()
        .route("/metrics", get(prometheus))
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(ready));
    let router = if auth_on {
        router.fallback(|| async {
            (
                StatusCode::FORBIDDEN,
                "authentication is on: locks and sessions are inspected through the gRPC API\n",
            )
        })
    } else {
        router
            .route("/", get(page))
            .route("/page.js", get(script))
            .route("/page.css", get(style))
            .route("/api/locks", get(locks))
            .route("/api/sessions", get(sessions))
            .route("/api/history", get(history))
            .route("/api/cluster", get(cluster))
            .route("/debug/raft", get(raft_stats))
    };
    let router = router.with_state(state);
    tokio::spawn(async move {
        let served = axum::serve(listener, router)
            .with_graceful_shutdown(stop.cancelled_owned())
            .await;
        if let Err(error) = served {
            tracing::error!(%error, "the HTTP listener failed");
        }
    });
    tracing::info!(addr = %local, "HTTP listening: /metrics, /healthz, /readyz, web page at /");
    Ok(local)
}

fn with_type(content_type: &'static str, body: impl IntoResponse) -> Response {
    ([(header::CONTENT_TYPE, content_type)], body).into_response()
}

/// The web page, from the binary.
///
/// Cancel safety: safe, no await.
async fn page() -> Response {
    with_type("text/html; charset=utf-8", PAGE_HTML)
}

/// The page's script, from the binary.
///
/// Cancel safety: safe, no await.
async fn script() -> Response {
    with_type("text/javascript; charset=utf-8", PAGE_JS)
}

/// The page's style sheet, from the binary.
///
/// Cancel safety: safe, no await.
async fn style() -> Response {
    with_type("text/css; charset=utf-8", PAGE_CSS)
}

/// openraft's runtime statistics of this member, as text: how long entries
/// spend between proposal, the log write, commit and apply (percentiles in
/// µs), and batch sizes, to tell where a slow commit waits.
///
/// Cancel safety: safe, read-only; a dropped request leaves at most a
/// question to openraft's core whose answer nobody reads.
async fn raft_stats(State(http): State<Http>) -> Response {
    let Some(raft) = http.member.get() else {
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            "the Raft member has not started yet\n",
        )
            .into_response();
    };
    match raft.runtime_stats().await {
        Ok(stats) => with_type(
            "text/plain; charset=utf-8",
            format!("{}\n", stats.display().human_readable()),
        ),
        Err(error) => (StatusCode::SERVICE_UNAVAILABLE, format!("{error}\n")).into_response(),
    }
}

/// Every metric, OpenMetrics text (`/metrics`).
///
/// Cancel safety: safe, no await.
async fn prometheus(State(http): State<Http>) -> Response {
    with_type(
        "application/openmetrics-text; version=1.0.0; charset=utf-8",
        http.metrics.encode(),
    )
}

/// `/readyz`: 200 while the core serves, else 503 and why.
///
/// Cancel safety: safe, no await.
async fn ready(State(http): State<Http>) -> Response {
    match http.readiness.check() {
        Ok(()) => "ready\n".into_response(),
        Err(why) => (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("not ready: {why}\n"),
        )
            .into_response(),
    }
}

impl Http {
    /// Sends an inspection op to the core and waits for its answer. The op
    /// keeps its slot among [`MAX_INSPECTIONS`] until the core has answered
    /// it, even if the request that asked is gone by then: so a client that
    /// asks and disconnects, again and again, still has no more than that
    /// many ops at the core.
    ///
    /// Cancel safety: safe; a dropped call leaves at most an op whose answer
    /// nobody reads, and its slot is given back once the core answers.
    async fn ask<T: Send + 'static>(
        &self,
        op: impl FnOnce(UnaryReply<T>) -> Op,
    ) -> Result<T, Response> {
        let unavailable =
            |why: &str| (StatusCode::SERVICE_UNAVAILABLE, format!("{why}\n")).into_response();
        self.readiness.check().map_err(unavailable)?;
        let slot = self
            .inspections
            .clone()
            .acquire_owned()
            .await
            .map_err(|_| unavailable("stopping"))?;
        let (reply, answer) = oneshot::channel();
        self.core
            .send(op(reply))
            .map_err(|_| unavailable("the lock engine stopped"))?;
        // A task of its own holds the slot until the core is done with the op.
        let answered = tokio::spawn(async move {
            let answer = answer.await;
            drop(slot);
            answer
        });
        match answered.await {
            Ok(Ok(Ok(value))) => Ok(value),
            Ok(Ok(Err(status))) => Err(unavailable(status.message())),
            Ok(Err(_)) | Err(_) => Err(unavailable("the lock engine stopped")),
        }
    }
}

#[derive(Debug, Deserialize)]
struct LocksQuery {
    #[serde(default)]
    prefix: String,
    limit: Option<usize>,
}

/// `/api/locks`: the locks under a prefix, with holders and waiters.
///
/// Cancel safety: as `Http::ask`'s: safe, read-only; a dropped request
/// leaves at most a `List` op whose answer nobody reads.
async fn locks(
    State(http): State<Http>,
    Query(query): Query<LocksQuery>,
) -> Result<Json<api::Locks>, Response> {
    let limit = query.limit.unwrap_or(DEFAULT_LOCKS).clamp(1, MAX_LOCKS);
    let prefix = query.prefix;
    let list = http
        .ask(|reply| Op::List {
            prefix,
            after: String::new(),
            limit,
            reply,
        })
        .await?;
    Ok(Json(api::Locks::new(list)))
}

/// `/api/sessions`: the open sessions.
///
/// Cancel safety: as `Http::ask`'s: safe, read-only; a dropped request
/// leaves at most a `ListSessions` op whose answer nobody reads.
async fn sessions(State(http): State<Http>) -> Result<Json<api::Sessions>, Response> {
    let list = http.ask(|reply| Op::ListSessions { reply }).await?;
    Ok(Json(api::Sessions::new(list)))
}

#[derive(Debug, Deserialize)]
struct HistoryQuery {
    #[serde(default)]
    prefix: String,
}

/// `/api/history`: recent grants under a prefix.
///
/// Cancel safety: as `Http::ask`'s: safe, read-only; a dropped request
/// leaves at most a `History` op whose answer nobody reads.
async fn history(
    State(http): State<Http>,
    Query(query): Query<HistoryQuery>,
) -> Result<Json<api::History>, Response> {
    let prefix = query.prefix;
    let grants = http.ask(|reply| Op::History { prefix, reply }).await?;
    Ok(Json(api::History::new(grants)))
}

/// The members as this member's Raft metrics know them; no call to the core.
///
/// Cancel safety: safe, no await.
async fn cluster(State(http): State<Http>) -> Result<Json<api::Cluster>, Response> {
    let Some(raft) = http.member.get() else {
        let starting = "the member has not started yet (recovering its data)\n";
        return Err((StatusCode::SERVICE_UNAVAILABLE, starting).into_response());
    };
    Ok(Json(api::Cluster::new(cluster_status(raft))))
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use futures::FutureExt;

    use super::*;
    use crate::inbox::Input;

    /// An `Http` whose core is `receiver`'s end, serving.
    fn http() -> (Http, std::sync::mpsc::Receiver<Input>) {
        let (core, receiver) = CoreSender::channel();
        let readiness = Arc::new(Readiness::default());
        readiness.set_serving(true);
        let http = Http {
            core,
            metrics: Arc::new(Metrics::new()),
            readiness,
            inspections: Arc::new(Semaphore::new(MAX_INSPECTIONS)),
            member: Arc::default(),
        };
        (http, receiver)
    }

    #[tokio::test]
    async fn a_request_that_goes_away_keeps_its_slot_until_the_core_answers() {
        let (http, core) = http();
        // Requests that send their op and go away before the answer.
        for _ in 0..MAX_INSPECTIONS {
            // Polled once (the op goes out), then dropped.
            let asked = http.ask(|reply| Op::ListSessions { reply });
            assert!(asked.now_or_never().is_none(), "nobody answers yet");
        }
        let pending: Vec<Input> = core.try_iter().collect();
        assert_eq!(pending.len(), MAX_INSPECTIONS);

        // Every slot is still taken: the next request waits, and sends nothing.
        let next = tokio::spawn({
            let http = http.clone();
            async move { http.ask(|reply| Op::ListSessions { reply }).await.is_ok() }
        });
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
        assert!(core.try_recv().is_err(), "a fifth op reached the core");

        // The core answers one: its slot goes to the waiting request.
        let mut pending = pending.into_iter();
        match pending.next() {
            Some(Input::Client(Op::ListSessions { reply })) => {
                let _ = reply.send(Ok(Default::default()));
            }
            _ => unreachable!("sent above"),
        }
        let fifth = tokio::task::spawn_blocking(move || core.recv_timeout(Duration::from_secs(10)))
            .await
            .unwrap();
        match fifth {
            Ok(Input::Client(Op::ListSessions { reply })) => {
                let _ = reply.send(Ok(Default::default()));
            }
            _ => panic!("the waiting request's op did not arrive"),
        }
        assert!(next.await.unwrap(), "answered");
    }
}
