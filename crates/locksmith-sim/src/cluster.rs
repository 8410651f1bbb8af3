//! The cluster: members running the real server (`locksmith-server`) on
//! simulated hosts, with the simulator's network, time and wall clock.

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use locksmith_proto::transport::Connector;
use locksmith_server::{Accepting, Environment, Execution, Listener, Server, ServerConfig};

/// The port every member serves clients and members on.
pub const PORT: u16 = 7420;

/// The host name of member `id` (1-based).
pub fn member_host(id: u64) -> String {
    format!("member{id}")
}

/// The name of client host `n` (1-based), where some of the clients run.
pub fn client_host(n: u32) -> String {
    format!("client{n}")
}

/// The simulation's wall clock: its epoch plus the simulated time.
pub(crate) fn wall_clock() -> SystemTime {
    UNIX_EPOCH + turmoil::since_epoch().unwrap_or_default()
}

/// Dials the simulated network.
pub(crate) fn connector() -> Connector {
    Connector::new(|addr: String| turmoil::net::TcpStream::connect(addr))
}

/// A member's listener on the simulated network.
struct SimListener(turmoil::net::TcpListener);

impl Listener for SimListener {
    fn accept(&mut self) -> Accepting<'_> {
        Box::pin(async move {
            let (stream, peer) = self.0.accept().await?;
            Ok((Box::new(stream) as _, peer))
        })
    }
}

/// How each member is configured.
#[derive(Debug, Clone)]
pub struct MemberSetup {
    /// Its id in the cluster (1-based).
    pub id: u64,
    /// Every member: id and address.
    pub cluster: Vec<(u64, String)>,
    /// Its data directory (kept across crashes: what was written survives).
    pub data_dir: PathBuf,
}

impl MemberSetup {
    /// Its config; called on its host (its address is looked up there).
    fn config(&self) -> ServerConfig {
        let ip: IpAddr = turmoil::lookup(member_host(self.id));
        let mut config = ServerConfig::durable(&self.data_dir).listen(SocketAddr::new(ip, PORT));
        config.node_id = self.id;
        config.cluster = self.cluster.clone();
        config.execution = Execution::Tasks;
        // Snapshots are built on blocking threads, outside the simulation:
        // none in a run's length.
        config.snapshot_every = 1 << 40;
        config.grace = Duration::from_secs(2);
        config
    }
}

/// Runs member `setup` until its host is crashed: the host's software,
/// started again by a restart.
pub(crate) async fn run_member(setup: MemberSetup) -> turmoil::Result {
    let listener = turmoil::net::TcpListener::bind(("0.0.0.0", PORT)).await?;
    let environment = Environment::machine()
        .wall_clock(wall_clock)
        .listener(SimListener(listener))
        .connector(connector());
    let mut server = Server::start_in(setup.config(), environment).await?;
    server.stopped().await?;
    Ok(())
}
