//! A small etcd v3 client over the gRPC code that `locksmith-proto` generates
//! (its `etcd` feature): the connection, request helpers for keys and
//! transactions, a lease's keep-alive stream and the watch stream.
//!
//! Written here instead of taken from the `etcd-client` crate, whose build
//! script needs a system `protoc` with its `google/protobuf` include files:
//! with it, neither `cargo install locksmith-cli` nor a build of this crate
//! worked on a machine with only the Rust toolchain. What the backend needs
//! of a client is this module.
//!
//! The generated types are re-exported ([`etcdserverpb`], [`mvccpb`],
//! [`v3lockpb`]): requests are plain structs, for example a transaction that
//! writes only while a lock is still held:
//!
//! ```no_run
//! # async fn demo(client: locksmith::etcd::rpc::EtcdClient, key: &str, token: u64)
//! #     -> Result<(), tonic::Status> {
//! use locksmith::etcd::rpc::{self, etcdserverpb::TxnRequest};
//!
//! let txn = TxnRequest {
//!     compare: vec![locksmith::etcd::fence(key, token)],
//!     success: vec![rpc::put("orders/42/state", "paid", 0).into()],
//!     failure: vec![],
//! };
//! let applied = client.txn(txn).await?.succeeded;
//! # Ok(()) }
//! ```

use std::sync::{Arc, RwLock};
use std::time::Duration;

use futures::channel::mpsc;
use tonic::metadata::AsciiMetadataValue;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::channel::Change;
use tonic::transport::{Channel, ClientTlsConfig, Endpoint};
use tonic::{Request, Status, Streaming};

pub use locksmith_proto::etcd::{etcdserverpb, mvccpb, v3lockpb};

use self::etcdserverpb::range_request::{SortOrder, SortTarget};
use self::etcdserverpb::{
    compare, AuthenticateRequest, Compare, DeleteRangeRequest, DeleteRangeResponse,
    LeaseGrantRequest, LeaseGrantResponse, LeaseKeepAliveRequest, LeaseKeepAliveResponse,
    LeaseRevokeRequest, LeaseTimeToLiveRequest, LeaseTimeToLiveResponse, PutRequest, RangeRequest,
    RangeResponse, ResponseHeader, TxnRequest, TxnResponse, WatchCancelRequest, WatchCreateRequest,
    WatchRequest, WatchResponse,
};
use self::mvccpb::KeyValue;
use crate::secret::Secret;

/// How long connecting to an endpoint may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// HTTP/2 pings, as `etcdctl` sets them (`--keepalive-time=2s`,
/// `--keepalive-timeout=6s`), so a dead connection is noticed and replaced.
const HTTP2_KEEPALIVE: (Duration, Duration) = (Duration::from_secs(2), Duration::from_secs(6));

/// How long one attempt of a unary call may take before it is tried again
/// (repeatable calls only). etcd answers a proposal that a dead leader
/// swallowed only after its request timeout (7 s with the default election
/// timeout), long after a new leader serves; Go's clientv3 retries
/// repeatable calls in the same way.
const ATTEMPT_TIMEOUT: Duration = Duration::from_secs(2);

/// Attempts of one unary call, and the pause between two.
const ATTEMPTS: u32 = 5;
const ATTEMPT_PAUSE: Duration = Duration::from_millis(50);

/// Whether a call may be sent again.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Retry {
    /// Reading, or creating something that is harmless if made twice (a
    /// second lease expires unused): again after a timeout or an
    /// unavailable member.
    Repeatable,
    /// Writing: again only when the request never left this process (no
    /// connection to the member could be made).
    NotSent,
    /// Opening a stream: once; its owner opens it again.
    Once,
}

/// Whether `status` says the request never reached a member:
///
/// - the balanced channel picked an endpoint it could not connect to (a
///   member that is down), so the call failed before anything was sent;
/// - or the request was still queued for a connection that closed (the
///   member went down meanwhile): hyper hands such a request back unsent,
///   as "operation was canceled" caused by "connection closed", and uses
///   that pair for nothing else.
fn never_sent(status: &Status) -> bool {
    match status.code() {
        tonic::Code::Unavailable => {
            let message = status.message().to_ascii_lowercase();
            [
                "connect error",
                "error trying to connect",
                "connection refused",
            ]
            .iter()
            .any(|m| message.contains(m))
        }
        tonic::Code::Cancelled => {
            let mut error = std::error::Error::source(status);
            while let Some(e) = error {
                let cause = e.source();
                if e.to_string() == "operation was canceled"
                    && cause.is_some_and(|c| c.to_string() == "connection closed")
                {
                    return true;
                }
                error = cause;
            }
            false
        }
        _ => false,
    }
}

/// Whether the connection failed under the call (a member went down while
/// the request was on its way: tonic's "transport error" over an I/O error
/// such as a broken pipe). The request may or may not have reached etcd:
/// only a repeatable call is sent again, as gRPC's own "unavailable" would
/// be.
fn connection_failed(status: &Status) -> bool {
    let mut error = std::error::Error::source(status);
    while let Some(e) = error {
        if e.downcast_ref::<std::io::Error>().is_some() {
            return true;
        }
        error = e.source();
    }
    false
}

/// Runs `call` up to [`ATTEMPTS`] times as `retry` allows, each attempt of a
/// repeatable call bounded by [`ATTEMPT_TIMEOUT`]; the last error is
/// returned.
///
/// Cancel safety: as the call's own.
async fn attempts<T, F, Fut>(retry: Retry, mut call: F) -> Result<T, Status>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, Status>>,
{
    let mut attempt = 1;
    loop {
        let outcome = match retry {
            Retry::Repeatable => tokio::time::timeout(ATTEMPT_TIMEOUT, call())
                .await
                .unwrap_or_else(|_| {
                    Err(Status::deadline_exceeded(format!(
                        "etcd did not answer within {ATTEMPT_TIMEOUT:?}"
                    )))
                }),
            Retry::NotSent | Retry::Once => call().await,
        };
        let again = match (&outcome, retry) {
            (Ok(_), _) => false,
            // What may go again after it was sent may go again when it was not.
            (Err(status), Retry::Repeatable) => {
                matches!(
                    status.code(),
                    tonic::Code::Unavailable | tonic::Code::DeadlineExceeded
                ) || connection_failed(status)
                    || never_sent(status)
            }
            (Err(status), Retry::NotSent) => never_sent(status),
            (Err(_), Retry::Once) => false,
        };
        if !again || attempt >= ATTEMPTS {
            return outcome;
        }
        attempt += 1;
        tokio::time::sleep(ATTEMPT_PAUSE).await;
    }
}

/// Requests that may queue in the channel before a connection takes them
/// (the size `etcd-client` used, with which this backend was measured).
const CHANNEL_BUFFER: usize = 64;

/// The channel every call goes through: balanced over the members, with the
/// auth token (if any) attached.
pub type EtcdChannel = InterceptedService<Channel, AuthToken>;
/// The generated `KV` client.
pub type KvClient = etcdserverpb::kv_client::KvClient<EtcdChannel>;
/// The generated `Lease` client.
pub type LeaseClient = etcdserverpb::lease_client::LeaseClient<EtcdChannel>;
/// The generated `Watch` client.
pub type WatchClient = etcdserverpb::watch_client::WatchClient<EtcdChannel>;
/// The generated client of etcd's lock service (`v3lockpb.Lock`).
pub type LockClient = v3lockpb::lock_client::LockClient<EtcdChannel>;

/// Puts the token from `Authenticate` on every call, as etcd's `token`
/// metadata (what Go's clientv3 sends). Shared by every clone of the client,
/// so a token renewed by one call serves all.
#[derive(Clone, Default)]
pub struct AuthToken(Arc<RwLock<Option<AsciiMetadataValue>>>);

impl tonic::service::Interceptor for AuthToken {
    fn call(&mut self, mut request: Request<()>) -> Result<Request<()>, Status> {
        if let Some(token) = &*self.0.read().expect("auth token") {
            request.metadata_mut().insert("token", token.clone());
        }
        Ok(request)
    }
}

/// The user a client logs in as, to log in again when etcd forgets the token
/// (a restarted member, an expired simple or JWT token), as Go's clientv3
/// does.
struct Login {
    name: String,
    password: Secret,
    /// The channel without the token interceptor.
    channel: Channel,
    token: AuthToken,
}

impl Login {
    /// `Auth.Authenticate`; the token is kept for every later call.
    ///
    /// Cancel safety: safe; at worst a token is issued and not used.
    async fn authenticate(&self) -> Result<(), Status> {
        let mut auth = etcdserverpb::auth_client::AuthClient::new(self.channel.clone());
        let request = AuthenticateRequest {
            name: self.name.clone(),
            password: self.password.expose().to_owned(),
        };
        let token = auth.authenticate(request).await?.into_inner().token;
        let token = token
            .parse()
            .map_err(|_| Status::unauthenticated("etcd answered with a token that is not ASCII"))?;
        *self.token.0.write().expect("auth token") = Some(token);
        Ok(())
    }
}

/// Whether etcd refused a call's token (not the user's rights): logging in
/// again fixes it.
fn token_refused(status: &Status) -> bool {
    status.code() == tonic::Code::Unauthenticated && status.message().contains("invalid auth token")
}

/// A connection to an etcd cluster; cheap to clone, and every clone shares
/// the connections.
#[derive(Clone)]
pub struct EtcdClient {
    channel: EtcdChannel,
    login: Option<Arc<Login>>,
    /// Keeps the balancer's set of endpoints open for the channel's lifetime.
    _endpoints: tokio::sync::mpsc::Sender<Change<String, Endpoint>>,
}

impl EtcdClient {
    /// A client balanced over `endpoints` (`http://host:port` each, or
    /// `https://` with `tls`), logged in as `user` (name, password) when
    /// given. Connections are made when
    /// the first call needs one, so an unreachable cluster shows at the
    /// first call (or here, when logging in).
    ///
    /// Cancel safety: safe; nothing is left behind.
    pub async fn connect(
        endpoints: &[String],
        user: Option<(String, String)>,
        tls: Option<ClientTlsConfig>,
    ) -> Result<EtcdClient, Status> {
        let (channel, changes) = Channel::balance_channel(CHANNEL_BUFFER);
        for url in endpoints {
            let mut endpoint = Endpoint::from_shared(url.clone())
                .map_err(|e| Status::invalid_argument(format!("endpoint {url}: {e}")))?;
            if let Some(tls) = &tls {
                endpoint = endpoint
                    .tls_config(tls.clone())
                    .map_err(|e| Status::invalid_argument(format!("TLS for {url}: {e:?}")))?;
            }
            let endpoint = endpoint
                .connect_timeout(CONNECT_TIMEOUT)
                .http2_keep_alive_interval(HTTP2_KEEPALIVE.0)
                .keep_alive_timeout(HTTP2_KEEPALIVE.1)
                .keep_alive_while_idle(true);
            changes
                .send(Change::Insert(url.clone(), endpoint))
                .await
                .map_err(|_| Status::internal("the channel's balancer stopped"))?;
        }
        let token = AuthToken::default();
        let login = match user {
            None => None,
            Some((name, password)) => {
                let login = Login {
                    name,
                    password: Secret::new(password),
                    channel: channel.clone(),
                    token: token.clone(),
                };
                login.authenticate().await?;
                Some(Arc::new(login))
            }
        };
        Ok(EtcdClient {
            channel: InterceptedService::new(channel, token),
            login,
            _endpoints: changes,
        })
    }

    /// Runs `call` as [`attempts`] does; when etcd refuses the token, logs
    /// in again and runs it once more.
    ///
    /// Cancel safety: as the call's own.
    async fn with_login<T, F, Fut>(&self, retry: Retry, mut call: F) -> Result<T, Status>
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = Result<T, Status>>,
    {
        match (attempts(retry, &mut call).await, &self.login) {
            (Err(status), Some(login)) if token_refused(&status) => {
                tracing::debug!(%status, "etcd refused the token; logging in again");
                login.authenticate().await?;
                attempts(retry, call).await
            }
            (outcome, _) => outcome,
        }
    }

    /// The channel, for other generated clients.
    pub fn channel(&self) -> EtcdChannel {
        self.channel.clone()
    }

    /// A `KV` client.
    pub fn kv(&self) -> KvClient {
        KvClient::new(self.channel())
    }

    /// A `Lease` client.
    pub fn lease(&self) -> LeaseClient {
        LeaseClient::new(self.channel())
    }

    /// A `Watch` client.
    pub fn watch(&self) -> WatchClient {
        WatchClient::new(self.channel())
    }

    /// A client of etcd's lock service.
    pub fn lock(&self) -> LockClient {
        LockClient::new(self.channel())
    }

    /// `KV.Range`.
    ///
    /// Cancel safety: safe, read-only.
    pub async fn range(&self, request: RangeRequest) -> Result<RangeResponse, Status> {
        self.with_login(Retry::Repeatable, || async {
            Ok(self.kv().range(request.clone()).await?.into_inner())
        })
        .await
    }

    /// `KV.Txn`.
    ///
    /// Cancel safety: the transaction may or may not have been applied.
    pub async fn txn(&self, request: TxnRequest) -> Result<TxnResponse, Status> {
        self.with_login(Retry::NotSent, || async {
            Ok(self.kv().txn(request.clone()).await?.into_inner())
        })
        .await
    }

    /// `KV.Txn` of a transaction that is harmless if applied twice, such as
    /// mutex.go's "create the key if it is absent, else read it": sent again
    /// like a read when a member goes down under it.
    ///
    /// Cancel safety: the transaction may or may not have been applied.
    pub async fn txn_repeatable(&self, request: TxnRequest) -> Result<TxnResponse, Status> {
        self.with_login(Retry::Repeatable, || async {
            Ok(self.kv().txn(request.clone()).await?.into_inner())
        })
        .await
    }

    /// `KV.DeleteRange`.
    ///
    /// Cancel safety: the delete may or may not have been applied.
    pub async fn delete(&self, request: DeleteRangeRequest) -> Result<DeleteRangeResponse, Status> {
        self.with_login(Retry::NotSent, || async {
            Ok(self.kv().delete_range(request.clone()).await?.into_inner())
        })
        .await
    }

    /// `Lease.LeaseGrant` of `ttl` seconds (etcd raises it to its minimum).
    ///
    /// Cancel safety: a lease may have been granted; it expires unused.
    pub async fn grant_lease(&self, ttl: i64) -> Result<LeaseGrantResponse, Status> {
        let request = LeaseGrantRequest { ttl, id: 0 };
        self.with_login(Retry::Repeatable, || async {
            Ok(self.lease().lease_grant(request).await?.into_inner())
        })
        .await
    }

    /// `Lease.LeaseRevoke`: deletes every key attached to the lease.
    ///
    /// Cancel safety: the lease may or may not have been revoked.
    pub async fn revoke_lease(&self, id: i64) -> Result<(), Status> {
        self.with_login(Retry::NotSent, || async {
            self.lease()
                .lease_revoke(LeaseRevokeRequest { id })
                .await
                .map(drop)
        })
        .await
    }

    /// `Lease.LeaseTimeToLive` (without the keys).
    ///
    /// Cancel safety: safe, read-only.
    pub async fn lease_time_to_live(&self, id: i64) -> Result<LeaseTimeToLiveResponse, Status> {
        let request = LeaseTimeToLiveRequest { id, keys: false };
        self.with_login(Retry::Repeatable, || async {
            Ok(self.lease().lease_time_to_live(request).await?.into_inner())
        })
        .await
    }

    /// Opens a keep-alive stream for lease `id` and renews it once; see
    /// [`KeepAlive::renew`] for the answer.
    ///
    /// Cancel safety: safe; a dropped open closes its stream (the lease may
    /// have been renewed).
    pub async fn keep_alive(&self, id: i64) -> Result<(KeepAlive, Option<i64>), Status> {
        self.with_login(Retry::Once, || self.open_keep_alive(id))
            .await
    }

    /// Cancel safety: as for [`EtcdClient::keep_alive`].
    async fn open_keep_alive(&self, id: i64) -> Result<(KeepAlive, Option<i64>), Status> {
        let (requests, outgoing) = mpsc::unbounded();
        // Queued before the call: etcd answers the call only with the first
        // response, which needs a request.
        let _ = requests.unbounded_send(LeaseKeepAliveRequest { id });
        let responses = self.lease().lease_keep_alive(outgoing).await?.into_inner();
        let mut stream = KeepAlive {
            id,
            requests,
            responses,
        };
        let ttl = stream.answer().await?;
        Ok((stream, ttl))
    }

    /// Renews lease `id` once: `Some(ttl)` in seconds, `None` when the lease
    /// no longer exists.
    ///
    /// Cancel safety: safe; the lease was renewed or not.
    pub async fn keep_alive_once(&self, id: i64) -> Result<Option<i64>, Status> {
        self.keep_alive(id).await.map(|(_, ttl)| ttl)
    }

    /// Opens a watch stream with its first watch; more are added and
    /// cancelled on the [`WatchStream`].
    ///
    /// Cancel safety: safe; a dropped open closes its stream.
    pub async fn watch_stream(&self, first: WatchCreateRequest) -> Result<WatchStream, Status> {
        self.with_login(Retry::Once, || self.open_watch(first.clone()))
            .await
    }

    /// Cancel safety: as for [`EtcdClient::watch_stream`].
    async fn open_watch(&self, first: WatchCreateRequest) -> Result<WatchStream, Status> {
        let (requests, outgoing) = mpsc::unbounded();
        // Queued before the call, as for `keep_alive`.
        let _ = requests.unbounded_send(create_request(first));
        let responses = self.watch().watch(outgoing).await?.into_inner();
        Ok(WatchStream {
            requests,
            responses,
        })
    }
}

/// A keep-alive stream of one lease (`Lease.LeaseKeepAlive`).
pub struct KeepAlive {
    id: i64,
    requests: mpsc::UnboundedSender<LeaseKeepAliveRequest>,
    responses: Streaming<LeaseKeepAliveResponse>,
}

impl KeepAlive {
    /// Renews the lease: `Some(ttl)`, its TTL in seconds from now, or `None`
    /// when the lease no longer exists (expired or revoked).
    ///
    /// Cancel safety: not cancel safe; a dropped renewal may leave its answer
    /// on the stream, so drop the stream with it.
    pub async fn renew(&mut self) -> Result<Option<i64>, Status> {
        self.requests
            .unbounded_send(LeaseKeepAliveRequest { id: self.id })
            .map_err(|_| Status::unavailable("the keep-alive stream is closed"))?;
        self.answer().await
    }

    /// Cancel safety: as for [`KeepAlive::renew`].
    async fn answer(&mut self) -> Result<Option<i64>, Status> {
        match self.responses.message().await? {
            Some(response) => Ok((response.ttl > 0).then_some(response.ttl)),
            None => Err(Status::unavailable("the keep-alive stream ended")),
        }
    }
}

/// A watch stream (`Watch.Watch`): many watches, told apart by the ids the
/// client gives them.
pub struct WatchStream {
    requests: mpsc::UnboundedSender<WatchRequest>,
    responses: Streaming<WatchResponse>,
}

impl WatchStream {
    /// Adds a watch; etcd confirms it with a `created` response.
    pub fn create(&self, request: WatchCreateRequest) -> Result<(), Status> {
        self.send(create_request(request))
    }

    /// Cancels the watch `watch_id`; etcd confirms with a `canceled` response.
    pub fn cancel(&self, watch_id: i64) -> Result<(), Status> {
        self.send(WatchRequest {
            request_union: Some(etcdserverpb::watch_request::RequestUnion::CancelRequest(
                WatchCancelRequest { watch_id },
            )),
        })
    }

    fn send(&self, request: WatchRequest) -> Result<(), Status> {
        self.requests
            .unbounded_send(request)
            .map_err(|_| Status::unavailable("the watch stream is closed"))
    }

    /// The next response; `None` when etcd ended the stream.
    ///
    /// Cancel safety: safe (`Streaming::message` is).
    pub async fn message(&mut self) -> Result<Option<WatchResponse>, Status> {
        self.responses.message().await
    }
}

fn create_request(request: WatchCreateRequest) -> WatchRequest {
    WatchRequest {
        request_union: Some(etcdserverpb::watch_request::RequestUnion::CreateRequest(
            request,
        )),
    }
}

/// The key range of every key starting with `prefix` (every key at all for
/// an empty prefix): `(key, range_end)`, as Go's `clientv3.WithPrefix`.
pub fn prefix_range(prefix: &[u8]) -> (Vec<u8>, Vec<u8>) {
    if prefix.is_empty() {
        // etcd refuses an empty key; "\0" to "\0" means every key.
        return (vec![0], vec![0]);
    }
    let mut end = prefix.to_vec();
    while let Some(&last) = end.last() {
        if last < 0xff {
            *end.last_mut().expect("not empty") += 1;
            return (prefix.to_vec(), end);
        }
        end.pop();
    }
    // Every byte was 0xff: the range runs to the end.
    (prefix.to_vec(), vec![0])
}

/// A read of every key under `prefix` (every key at all for `""`).
pub fn prefix(prefix: &str) -> RangeRequest {
    let (key, range_end) = prefix_range(prefix.as_bytes());
    RangeRequest {
        key,
        range_end,
        ..RangeRequest::default()
    }
}

/// A read of every key under `prefix`, sorted by create revision in `order`.
pub fn by_create(under: &str, order: SortOrder) -> RangeRequest {
    RangeRequest {
        sort_order: order as i32,
        sort_target: SortTarget::Create as i32,
        ..prefix(under)
    }
}

/// A read of one key (`.into()` makes it an operation of a transaction).
pub fn get(key: impl Into<Vec<u8>>) -> RangeRequest {
    RangeRequest {
        key: key.into(),
        ..RangeRequest::default()
    }
}

/// A write of one key, attached to `lease` (0: none).
pub fn put(key: impl Into<Vec<u8>>, value: impl Into<Vec<u8>>, lease: i64) -> PutRequest {
    PutRequest {
        key: key.into(),
        value: value.into(),
        lease,
        ..PutRequest::default()
    }
}

/// A delete of one key.
pub fn delete(key: impl Into<Vec<u8>>) -> DeleteRangeRequest {
    DeleteRangeRequest {
        key: key.into(),
        ..DeleteRangeRequest::default()
    }
}

/// `If(create_revision(key) == revision)`; revision 0 means "the key does
/// not exist".
pub fn create_revision_is(key: impl Into<Vec<u8>>, revision: i64) -> Compare {
    Compare {
        result: compare::CompareResult::Equal as i32,
        target: compare::CompareTarget::Create as i32,
        key: key.into(),
        target_union: Some(compare::TargetUnion::CreateRevision(revision)),
        range_end: Vec::new(),
    }
}

/// The store revision a response was served at (0 without a header).
pub fn revision(header: Option<&ResponseHeader>) -> i64 {
    header.map_or(0, |h| h.revision)
}

/// The keys each read of a transaction returned, in order (empty for
/// operations that are not reads).
pub fn read_results(response: TxnResponse) -> Vec<Vec<KeyValue>> {
    use self::etcdserverpb::response_op::Response;
    response
        .responses
        .into_iter()
        .map(|op| match op.response {
            Some(Response::ResponseRange(range)) => range.kvs,
            _ => Vec::new(),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::future::ready;

    /// An error of a given text and cause, as hyper's look from outside.
    #[derive(Debug)]
    struct Texted(&'static str, Option<Box<Texted>>);

    impl std::fmt::Display for Texted {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str(self.0)
        }
    }

    impl std::error::Error for Texted {
        fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
            self.1.as_deref().map(|e| e as _)
        }
    }

    fn cancelled(error: Texted) -> Status {
        let mut status = Status::cancelled("operation was canceled");
        status.set_source(std::sync::Arc::new(Texted(
            "transport error",
            Some(Box::new(error)),
        )));
        status
    }

    #[test]
    fn a_request_handed_back_unsent_is_never_sent() {
        let unsent = Texted(
            "operation was canceled",
            Some(Box::new(Texted("connection closed", None))),
        );
        assert!(never_sent(&cancelled(unsent)));
        assert!(never_sent(&Status::unavailable(
            "tcp connect error: Connection refused (os error 111)"
        )));
        // Cancelled for any other reason may have reached etcd.
        let other = Texted("operation was canceled", None);
        assert!(!never_sent(&cancelled(other)));
        assert!(!never_sent(&Status::cancelled("operation was canceled")));
        assert!(!never_sent(&Status::unavailable("leader changed")));
    }

    /// A member that went down under a repeatable call: the call is sent
    /// again; a write that may have been applied is not.
    #[tokio::test(start_paused = true)]
    async fn a_repeatable_call_is_sent_again_when_its_connection_broke() {
        let broken = || {
            let pipe = std::io::Error::new(std::io::ErrorKind::BrokenPipe, "broken pipe");
            let mut status = Status::unknown("transport error");
            status.set_source(std::sync::Arc::new(Texted(
                "transport error",
                Some(Box::new(Texted("connection error", None))),
            )));
            assert!(!connection_failed(&status), "no I/O error in the chain");
            status.set_source(std::sync::Arc::new(pipe));
            status
        };
        for (retry, answered) in [(Retry::Repeatable, true), (Retry::NotSent, false)] {
            assert_eq!(answered_after_failing_once(retry, broken).await, answered);
        }
    }

    /// Whether a call that fails once with `error`, then succeeds, is
    /// answered under `retry`.
    async fn answered_after_failing_once(retry: Retry, error: impl Fn() -> Status) -> bool {
        let mut calls = 0;
        attempts(retry, || {
            calls += 1;
            let outcome = if calls == 1 { Err(error()) } else { Ok(()) };
            ready(outcome)
        })
        .await
        .is_ok()
    }

    /// A repeatable call handed back unsent ("operation was canceled" by
    /// "connection closed", a member going down with the request queued) is
    /// sent again, as a call that may only go once unsent is.
    #[tokio::test(start_paused = true)]
    async fn a_repeatable_call_handed_back_unsent_is_sent_again() {
        let unsent = || {
            cancelled(Texted(
                "operation was canceled",
                Some(Box::new(Texted("connection closed", None))),
            ))
        };
        for retry in [Retry::Repeatable, Retry::NotSent] {
            assert!(
                answered_after_failing_once(retry, unsent).await,
                "{retry:?}"
            );
        }
    }

    #[test]
    fn prefix_range_increments_the_last_byte() {
        assert_eq!(prefix_range(b"a/"), (b"a/".to_vec(), b"a0".to_vec()));
        assert_eq!(prefix_range(b"a\xff"), (b"a\xff".to_vec(), b"b".to_vec()));
        assert_eq!(prefix_range(b"\xff"), (b"\xff".to_vec(), vec![0]));
        assert_eq!(prefix_range(b""), (vec![0], vec![0]));
    }
}
