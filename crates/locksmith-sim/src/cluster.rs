//! The cluster: members running the real server (`locksmith-server`) on
//! simulated hosts, with the simulator's network, time and wall clock.
//!
//! Each member's wall clock is off the simulated time by its own skew
//! ([`crate::Settings::clock_skew`]): a member that becomes leader starts
//! its clock there (or past the last time its log stamped), so a new
//! leader's clock may be ahead of or behind its predecessor's. The default
//! of 1 ms either way keeps any two members within 2 ms of each other,
//! inside the drift the design allows for (1 % of a TTL or lease, plus
//! 2 ms: a client stops trusting its hold that much before its store
//! would end it).

use std::cell::Cell;
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use locksmith_proto::transport::Connector;
use locksmith_server::{
    Accepting, ApplyPace, Environment, Execution, Listener, Server, ServerConfig, Syncing,
    WallClock,
};

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

/// The most members a run may have: one wall clock each.
pub const MAX_MEMBERS: usize = 7;

thread_local! {
    /// How far each member's wall clock is off the simulated one, in
    /// nanoseconds (by id − 1), in the run on this thread.
    static SKEWS: Cell<[i64; MAX_MEMBERS]> = const { Cell::new([0; MAX_MEMBERS]) };
}

/// Sets how far each member's wall clock is off, in nanoseconds (by
/// id − 1), for the run on this thread.
pub(crate) fn skew_clocks(skews: [i64; MAX_MEMBERS]) {
    SKEWS.with(|cell| cell.set(skews));
}

/// Member `ID + 1`'s wall clock: the simulation's epoch plus the simulated
/// time, off by the member's skew. A function per member, because the
/// server takes a plain function (`WallClock`).
fn member_wall_clock<const ID: usize>() -> SystemTime {
    let now = UNIX_EPOCH + turmoil::since_epoch().unwrap_or_default();
    let skew = SKEWS.with(|cell| cell.get()[ID]);
    let by = Duration::from_nanos(skew.unsigned_abs());
    if skew >= 0 {
        now + by
    } else {
        now - by
    }
}

/// The wall clock of member `id` (1-based).
fn wall_clock(id: u64) -> WallClock {
    const CLOCKS: [WallClock; MAX_MEMBERS] = [
        member_wall_clock::<0>,
        member_wall_clock::<1>,
        member_wall_clock::<2>,
        member_wall_clock::<3>,
        member_wall_clock::<4>,
        member_wall_clock::<5>,
        member_wall_clock::<6>,
    ];
    CLOCKS[id as usize - 1]
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
    /// A new member joins the cluster whose members listen here, as a
    /// learner (`locksmith serve --join`), instead of founding one.
    pub join: Option<String>,
    /// Its disk, through which its Raft log is written (`--power-loss`,
    /// `--slow-disks`); none: the log is written and synced in one step.
    pub disk: Option<crate::disk::Disk>,
    /// How long it takes to apply what Raft committed (`--slow-apply`);
    /// none: no simulated time.
    pub pace: Option<Pace>,
}

/// How long a member takes to apply each run of committed entries: none
/// while it is not busy, longer while a busy-member fault lasts
/// (`--slow-apply`). It outlives the member's restarts.
#[derive(Clone, Default)]
pub struct Pace(std::sync::Arc<std::sync::Mutex<Duration>>);

impl std::fmt::Debug for Pace {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("Pace").field(&self.get()).finish()
    }
}

impl Pace {
    /// How long applying takes now.
    pub fn get(&self) -> Duration {
        *self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Makes applying take `per_run` from now on.
    pub fn set(&self, per_run: Duration) {
        *self.0.lock().unwrap_or_else(|e| e.into_inner()) = per_run;
    }
}

impl ApplyPace for Pace {
    fn applying(&self) -> Syncing {
        match self.get() {
            Duration::ZERO => Box::pin(std::future::ready(())),
            busy => Box::pin(tokio::time::sleep(busy)),
        }
    }
}

impl MemberSetup {
    /// Its config; called on its host (its address is looked up there).
    fn config(&self) -> ServerConfig {
        let ip: IpAddr = turmoil::lookup(member_host(self.id));
        let mut config = ServerConfig::durable(&self.data_dir).listen(SocketAddr::new(ip, PORT));
        config.node_id = self.id;
        config.cluster = self.cluster.clone();
        config.join = self.join.clone();
        config.execution = Execution::Tasks;
        // Snapshots are built on blocking threads, outside the simulation:
        // none in a run's length.
        config.snapshot_every = 1 << 40;
        config.snapshot_log_percent = 0;
        config.grace = Duration::from_secs(2);
        config
    }
}

/// Runs member `setup` until its host is crashed: the host's software,
/// started again by a restart.
pub(crate) async fn run_member(setup: MemberSetup) -> turmoil::Result {
    let listener = turmoil::net::TcpListener::bind(("0.0.0.0", PORT)).await?;
    let mut environment = Environment::machine()
        .wall_clock(wall_clock(setup.id))
        .listener(SimListener(listener))
        .connector(connector());
    if let Some(disk) = &setup.disk {
        environment = environment.write_cache(std::sync::Arc::new(disk.clone()));
    }
    if let Some(pace) = &setup.pace {
        environment = environment.apply_pace(std::sync::Arc::new(pace.clone()));
    }
    let mut server = Server::start_in(setup.config(), environment).await?;
    server.stopped().await?;
    Ok(())
}
