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
use locksmith_server::{Accepting, Environment, Execution, Listener, Server, ServerConfig};
use tokio::net::{TcpListener, TcpStream};

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
