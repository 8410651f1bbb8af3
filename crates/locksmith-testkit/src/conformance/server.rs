//! The harness of the locksmith lock server (cargo feature
//! `conformance-server`): clients of a server (or cluster) URL, whose
//! sessions it ends through the server's admin API.

use std::time::Duration;

use locksmith::server::ServerUrl;
use locksmith::{Client, ConnectOptions, LostCause};
use locksmith_proto::v1::locksmith_client::LocksmithClient;
use locksmith_proto::v1::{EndSessionRequest, ListSessionsRequest};

use super::{Clients, Fault, Harness};

/// Clients of a lock server at `url` (one member or a cluster's list), each
/// with a client name of its own, by which [`Harness::expire_session`] finds
/// its session to end. The URL's credentials must allow `admin`.
pub struct ServerHarness {
    url: String,
    names: Clients<String>,
}

impl ServerHarness {
    /// A harness for the server at `url`.
    pub fn new(url: impl Into<String>) -> ServerHarness {
        ServerHarness {
            url: url.into(),
            names: Clients::default(),
        }
    }

    /// Ends the session of the client named `name` on whichever member takes
    /// admin calls (a cluster's leader). Answers whether one was found.
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
    async fn connect(&self, session_ttl: Duration) -> Client {
        let name = format!("conformance-{}", uuid::Uuid::new_v4().simple());
        let options = ConnectOptions::default()
            .session_ttl(session_ttl)
            .client_name(name.clone());
        let client = Client::connect_with(&self.url, options)
            .await
            .unwrap_or_else(|e| panic!("connect to {}: {e}", self.url));
        self.names.remember(&client, name);
        client
    }

    /// As the other server harnesses: a session of 500 ms lost its holds
    /// when the test process stalled for half a second, which a busy 2-core
    /// machine does.
    fn short_ttl(&self) -> Duration {
        Duration::from_secs(1)
    }

    /// Ends the client's session through the admin API (`EndSession`, what
    /// `locksmith session end` sends), as its expiry would.
    async fn expire_session(&self, client: &Client) -> Fault {
        let name = self.names.of(client);
        // A cluster's members learn of a new session through the log.
        for _ in 0..100 {
            if self.end_session_of(&name).await {
                return Fault::Injected(&[LostCause::SessionExpired]);
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!("no member ended the session of {name}");
    }
}
