//! The harness of the locksmith lock server (cargo feature
//! `conformance-server`): clients of a server (or cluster) URL, whose
//! sessions it ends through the server's admin API.

use std::sync::Arc;
use std::time::Duration;

use locksmith::server::ServerUrl;
use locksmith::{Client, ConnectOptions, LostCause};
use locksmith_proto::raft::cluster_client::ClusterClient;
use locksmith_proto::raft::StatusRequest;
use locksmith_proto::v1::locksmith_client::LocksmithClient;
use locksmith_proto::v1::{EndSessionRequest, ListSessionsRequest};
use tokio::sync::OnceCell;

use super::{Clients, Fault, Harness, DISK_SHORT_TTL};
use crate::proxy::{Mode, Route};

/// Clients of a lock server at `url` (one member or a cluster's list), each
/// with a client name of its own, by which [`Harness::expire_session`] finds
/// its session to end, and through fault proxies of its own, which
/// [`Harness::cut_connection`] blackholes. The URL's credentials must allow
/// `admin`.
pub struct ServerHarness {
    url: String,
    clients: Clients<(String, Arc<Route>)>,
    /// Set once the cluster agreed on the record version its members read.
    settled: OnceCell<()>,
}

impl ServerHarness {
    /// A harness for the server at `url`.
    pub fn new(url: impl Into<String>) -> ServerHarness {
        ServerHarness {
            url: url.into(),
            clients: Clients::default(),
            settled: OnceCell::new(),
        }
    }

    /// Waits until the leader logged the record version every member reads:
    /// a cluster just formed learns its members' versions first, and what
    /// the newest version brings (hold counts that inspection shows) is off
    /// until then.
    ///
    /// Cancel safety: safe, read-only.
    async fn until_versions_settle(&self) {
        let url = ServerUrl::parse(&self.url).expect("a lock server URL");
        let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
        let mut last = None;
        loop {
            for address in url.addresses() {
                let endpoint = url.endpoint(address).expect("an endpoint");
                let Ok(channel) = endpoint.connect().await else {
                    continue;
                };
                let mut cluster = ClusterClient::with_interceptor(channel, url.credentials());
                let Ok(status) = cluster.status(StatusRequest {}).await else {
                    continue;
                };
                let status = status.into_inner();
                // Only the leader heard every member's versions.
                if status.leader_id == status.node_id {
                    let reads: Option<Vec<u32>> =
                        status.members.iter().map(|m| m.record_version).collect();
                    if reads.and_then(|r| r.into_iter().min()) == Some(status.cluster_version) {
                        return;
                    }
                    last = Some(status);
                }
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "the cluster's record version did not settle: {last:?}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Ends the session of the client named `name` on whichever member takes
    /// admin calls (a cluster's leader). Answers whether one was found.
    ///
    /// Cancel safety: safe; dropped before `EndSession` is sent, it ends
    /// nothing, and after, the session ends anyway.
    async fn end_session_of(&self, name: &str) -> bool {
        let url = ServerUrl::parse(&self.url).expect("a lock server URL");
        for address in url.addresses() {
            let endpoint = url.endpoint(address).expect("an endpoint");
            let Ok(channel) = endpoint.connect().await else {
                continue;
            };
            let mut admin = LocksmithClient::with_interceptor(channel, url.credentials());
            let Ok(sessions) = admin.list_sessions(ListSessionsRequest {}).await else {
                continue;
            };
            let sessions = sessions.into_inner().sessions;
            let Some(session) = sessions.iter().find(|s| s.client_name == name) else {
                continue;
            };
            let request = EndSessionRequest {
                session_id: session.session_id,
            };
            if admin.end_session(request).await.is_ok() {
                return true;
            }
        }
        false
    }
}

impl Harness for ServerHarness {
    /// A client named uniquely, through fault proxies of its own.
    ///
    /// Cancel safety: safe; the proxies started so far stop when dropped,
    /// and a dropped `Client::connect_with` leaves nothing behind.
    async fn connect(&self, session_ttl: Duration) -> Client {
        self.settled
            .get_or_init(|| self.until_versions_settle())
            .await;
        let name = format!("conformance-{}", uuid::Uuid::new_v4().simple());
        let options = ConnectOptions::default()
            .session_ttl(session_ttl)
            .client_name(name.clone());
        let route = Route::start(&self.url).await.expect("fault proxies");
        let client = Client::connect_with(route.url(), options)
            .await
            .unwrap_or_else(|e| panic!("connect to {}: {e}", self.url));
        self.clients.remember(&client, (name, Arc::new(route)));
        client
    }

    /// The server syncs every batch, and a cluster's every heartbeat is a
    /// commit on two members sharing one disk: a 1 s session lost its hold
    /// in a whole run (`watchdog_keeps_hold_alive` on the cluster).
    fn short_ttl(&self) -> Duration {
        DISK_SHORT_TTL
    }

    /// Ends the client's session through the admin API (`EndSession`, what
    /// `locksmith session end` sends), as its expiry would.
    ///
    /// Cancel safety: safe; the session may or may not have been ended, as
    /// for `end_session_of`.
    async fn expire_session(&self, client: &Client) -> Fault {
        let (name, _) = self.clients.of(client);
        // A cluster's members learn of a new session through the log.
        for _ in 0..100 {
            if self.end_session_of(&name).await {
                return Fault::Injected(&[LostCause::SessionExpired]);
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!("no member ended the session of {name}");
    }

    /// Blackholes the client's proxies: its heartbeats go unanswered, and it
    /// gives its holds up before the server can expire the session.
    ///
    /// Not for a cluster: its client follows the members' leader hints to
    /// addresses past the proxies.
    ///
    /// Cancel safety: safe; it completes at its first poll, and
    /// `restore_connection` undoes the cut.
    async fn cut_connection(&self, client: &Client) -> Fault {
        let (_, route) = self.clients.of(client);
        if route.proxies().len() > 1 {
            return Fault::Unsupported;
        }
        route.set(Mode::Blackhole);
        Fault::Injected(&[LostCause::ConnectionLost])
    }

    /// Lets the client's proxies pass again.
    ///
    /// Cancel safety: safe; it completes at its first poll.
    async fn restore_connection(&self, client: &Client) {
        self.clients.of(client).1.set(Mode::Pass);
    }
}
