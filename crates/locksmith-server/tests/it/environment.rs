//! A server in an environment of its own (`Server::start_in`): its core and
//! Raft log writer run as tasks on the test's one thread, connections come
//! from a listener it was given, and the client reaches it through a
//! connector, as under the simulator (crate `locksmith-sim`).

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use locksmith::{Client, ConnectOptions};
use locksmith_proto::transport::Connector;
use locksmith_server::{
    Accepting, ApplyPace, Environment, Execution, Listener, Server, ServerConfig, Syncing,
};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{watch, Notify};

/// A listener over a TCP one, counting what it accepts.
struct Counted {
    listener: TcpListener,
    accepted: Arc<AtomicUsize>,
}

impl Listener for Counted {
    fn accept(&mut self) -> Accepting<'_> {
        Box::pin(async move {
            let (stream, peer) = self.listener.accept().await?;
            self.accepted.fetch_add(1, Ordering::Relaxed);
            Ok((Box::new(stream) as _, peer))
        })
    }
}

fn in_2030() -> SystemTime {
    UNIX_EPOCH + Duration::from_secs(1_893_456_000)
}

#[tokio::test(flavor = "current_thread")]
async fn a_server_on_tasks_with_a_given_listener_clock_and_connector_serves_the_client() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr: SocketAddr = listener.local_addr().unwrap();
    let accepted = Arc::new(AtomicUsize::new(0));
    let dir = tempfile::tempdir().unwrap();
    let mut config = ServerConfig::durable(dir.path()).listen(addr);
    config.execution = Execution::Tasks;
    let environment = Environment::machine()
        .wall_clock(in_2030)
        .listener(Counted {
            listener,
            accepted: accepted.clone(),
        });
    let server = Server::start_in(config, environment).await.expect("start");
    assert_eq!(server.local_addr(), addr);

    let dialed = Arc::new(AtomicUsize::new(0));
    let connector = Connector::new({
        let dialed = dialed.clone();
        move |to: String| {
            dialed.fetch_add(1, Ordering::Relaxed);
            TcpStream::connect(to)
        }
    });
    let options = ConnectOptions::default().connector(connector);
    let client = Client::connect_with(&server.url(), options).await.unwrap();
    let guard = client.lock("orders/42").acquire().await.unwrap();
    let first = guard.fencing_token();
    guard.release().await.unwrap();
    let guard = client.lock("orders/42").acquire().await.unwrap();
    assert!(guard.fencing_token() > first);
    let info = client.describe("orders/42").await.unwrap().expect("held");
    let lock_time = info.holders[0].lock_time.expect("a lock time");
    assert!(
        lock_time >= in_2030(),
        "the engine's time starts at the given wall clock: {lock_time:?}"
    );
    guard.release().await.unwrap();
    assert!(dialed.load(Ordering::Relaxed) >= 1);
    assert!(accepted.load(Ordering::Relaxed) >= 1);
    client.close().await.unwrap();
    server.shutdown().await.unwrap();
}

/// Applying held until the test opens the gate; the first wait is told.
struct Gate {
    asked: Arc<Notify>,
    open: watch::Receiver<bool>,
}

impl ApplyPace for Gate {
    fn applying(&self) -> Syncing {
        self.asked.notify_one();
        let mut open = self.open.clone();
        Box::pin(async move {
            let _ = open.wait_for(|open| *open).await;
        })
    }
}

/// A server still recovering (here: a group of one whose first entries are
/// not applied yet, so it does not serve) refuses connections on its port
/// rather than letting the kernel accept ones nobody reads: a client goes on
/// to another member at once instead of waiting out its timeout.
#[tokio::test(flavor = "current_thread")]
async fn a_server_refuses_connections_until_it_has_recovered() {
    let addr = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let mut config = ServerConfig::durable(dir.path()).listen(addr);
    config.execution = Execution::Tasks;
    let (open, gate) = watch::channel(false);
    let asked = Arc::new(Notify::new());
    let pace = Gate {
        asked: asked.clone(),
        open: gate,
    };
    let environment = Environment::machine().apply_pace(Arc::new(pace));
    let starting = tokio::spawn(Server::start_in(config, environment));
    asked.notified().await;
    let refused = TcpStream::connect(addr)
        .await
        .expect_err("a server that has not recovered takes no connection");
    assert_eq!(refused.kind(), std::io::ErrorKind::ConnectionRefused);
    open.send_replace(true);
    let server = starting.await.unwrap().expect("start");
    TcpStream::connect(addr)
        .await
        .expect("listening once started");
    server.shutdown().await.unwrap();
}
