//! # locksmith-sim: the cluster under a deterministic simulator
//!
//! The real lock server (`locksmith-server`: its gRPC service, openraft,
//! the core, the Raft log on disk) and the real client library
//! (`locksmith`'s `locksmith://` backend) run on simulated hosts: three
//! members and a few clients, over a simulated TCP network, in simulated
//! time, all on one thread. One seed decides everything (latencies, which
//! faults strike when, the clients' choices, every random number the code
//! draws), so one seed replays a run exactly, and a failing seed is a bug
//! report that reproduces.
//!
//! ```text
//! cargo run --profile simulate -p locksmith-sim -- --seed 7              # one run, its figures
//! cargo run --profile simulate -p locksmith-sim -- --seeds 1..1000       # a campaign
//! RUST_LOG=locksmith_sim=debug cargo run --profile simulate -p locksmith-sim -- --seed 7   # with its trace
//! ```
//!
//! ## The simulator: turmoil
//!
//! [turmoil](https://docs.rs/turmoil) (tokio-rs) runs each host on a tokio
//! runtime of its own with a paused clock, steps them in turn on one
//! thread, and carries their TCP over a simulated network it can
//! partition (either way, or one way), hold (delay), break and heal; a
//! host can be crashed and restarted. The code under test stays the code
//! that ships: the same tokio, tonic and hyper, with a listener and a
//! connector (`locksmith_server::Environment`,
//! `locksmith::ConnectOptions::connector`) on turmoil's sockets. madsim,
//! the other candidate, swaps tokio and tonic for simulated look-alikes
//! under a `--cfg madsim` build of the whole dependency tree: its tonic is
//! not the HTTP/2 stack the server runs (nor is its server builder the
//! one with our accept loop), and every crate would be built twice. openraft
//! itself chose turmoil for its own fuzzer.
//!
//! What the server needs to run there is part of its design, not a fork:
//! `ServerConfig::execution` = `Execution::Tasks` runs its core and its
//! Raft log's writer as tasks (in production they have threads of their
//! own), and its clock follows the wall clock and tokio's clock it is
//! given. The randomness the code draws comes from the seed too (module
//! `entropy`).
//!
//! ## Faults
//!
//! While the clients work, a fault strikes every few simulated seconds
//! (module `faults`): a member cut off from the others (both ways, or one
//! way only), a client host cut off from the cluster, messages between two
//! members held back (delay) or their connections broken (loss), a member
//! crashed and restarted from its data directory, a member's links to the
//! others slowed (not in calm runs). Links are slow and uneven all along
//! (1–20 ms), and each member's wall clock is off by its own skew (module
//! `cluster`). A crash lands between two steps of the simulation. Without
//! simulated disks it falls after any write of the log and its `fdatasync`
//! (one blocking call), so it loses what the log's writer had not written
//! yet and nothing it wrote. With them (`--power-loss`, module `disk`) each
//! member's Raft log is written through a write-back cache of the
//! simulation's: a sync takes the member's disk latency, and a crash in
//! between is a power loss that drops or tears what was written and not
//! synced; `--slow-disks` also slows a member's syncs, or every member's
//! at once, for a while. `--slow-apply` may make a member busy for a
//! while: applying what Raft committed then takes it simulated time
//! (`locksmith_server::ApplyPace`).
//! `--membership` adds membership changes (module `membership`): members
//! added (joining as learners, then promoted), voters removed and stopped,
//! or replaced, through the cluster's own admin service.
//!
//! ## Speed
//!
//! turmoil's own work per step grows with the square of the hosts, so the
//! clients share hosts (four to a host, or two hosts for more than eight
//! clients: [`Settings::clients_per_host_for`]) and a step is 5 ms
//! ([`Settings::tick`]); docs/RELIABILITY.md has the figures.
//!
//! ## Checks
//!
//! Every run's history (module `history`) is checked per lock (module
//! `check`): linearizable against a sequential lock (stateright's
//! `LinearizabilityTester`), tokens strictly rising, never two holders at
//! once, so never a hold taken away without its holder told, and every
//! lease the server granted or extended kept for its whole term (counted
//! from the request), even where its answer came too late for the client
//! to count on it. With `--lease-edge` (and `--mixed`), holders extend
//! their leases close to their end, racing the expiry. The clients
//! must also finish: a cluster that stops granting for good fails the run.
//! Once they stop, a fresh client (the prober) must get every lock whole
//! within 15 s (all at once): a session that never ends keeps its locks for good. In calm
//! runs (`--calm`: one member fault at a time, each healed and settled
//! before the next) and runs without faults, no client may lose a hold
//! taken with its session: the cluster must keep healthy sessions through
//! any single member's failure.
//!
//! ## Teeth
//!
//! `--plant NAME` puts a past defect back (`locksmith_core::planted`, a
//! cargo feature only this crate turns on), as the code was when it
//! shipped, to show that some seed finds it: docs/RELIABILITY.md lists the
//! first such seed of each, and CI runs each of them with and without its
//! defect.
#![deny(missing_docs)]

pub mod check;
pub mod cluster;
pub mod disk;
mod entropy;
pub mod faults;
pub mod history;
pub mod membership;
pub mod workload;

use std::collections::hash_map::DefaultHasher;
use std::hash::{Hash, Hasher};
use std::time::{Duration, Instant, UNIX_EPOCH};

use locksmith_core::planted::{self, Defect};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

use crate::check::Violation;
use crate::cluster::{client_host, member_host, MemberSetup, PORT};
use crate::faults::Faults;
use crate::history::{Event, History};
use crate::membership::Membership;
use crate::workload::ClientSetup;

/// What a run simulates.
#[derive(Debug, Clone)]
pub struct Settings {
    /// Members of the cluster.
    pub members: u64,
    /// Clients.
    pub clients: u32,
    /// Hot locks the clients share.
    pub locks: usize,
    /// How long the clients work, in simulated time.
    pub duration: Duration,
    /// Whether faults strike.
    pub faults: bool,
    /// Calm faults: one member at a time, each healed and settled before
    /// the next (module `faults`), and then no client may lose a session.
    pub calm: bool,
    /// The clients' session TTL.
    pub session_ttl: Duration,
    /// The mixed workload: read-write locks, semaphores and leases beside
    /// plain locks (module `workload`).
    pub mixed: bool,
    /// A past defect put back (`locksmith_core::planted`), to show the
    /// simulator finds it.
    pub plant: Option<Defect>,
    /// Clients that share a simulated host (each with its own session and
    /// connections), as on an application's servers: fewer hosts for the
    /// simulator to step.
    pub clients_per_host: u32,
    /// Whether a member's links to the others may turn slow (50–350 ms one
    /// way) for a while, in runs that are not calm (`faults`).
    pub slow_links: bool,
    /// Each member's wall clock is off the simulated one by up to this
    /// much, either way (its own offset, drawn from the seed; module
    /// `cluster`).
    pub clock_skew: Duration,
    /// The simulator's step: messages are delivered and hosts run in steps
    /// of this much simulated time.
    pub tick: Duration,
    /// Membership changes among the faults: members added, removed and
    /// replaced through the cluster's admin service (module `membership`).
    pub membership: bool,
    /// A crash is a power loss: what a member's Raft log wrote and did not
    /// sync yet is lost or torn; each member's syncs take 1–10 ms (module
    /// `disk`).
    pub power_loss: bool,
    /// As `power_loss`, and a member's disk, or every member's at once,
    /// may turn slow (its syncs taking 20–200 ms) for a while, among the
    /// faults.
    pub slow_disks: bool,
    /// A member may turn busy for a while, among the faults: applying each
    /// run of committed entries takes it 0.2–1.5 s (a CPU taken by other
    /// work, a long pause of the process's work but not of its network).
    pub slow_apply: bool,
    /// With `mixed`: a leased holder that extends its lease sends the
    /// extension in the last 15 % of the lease it trusts, so that it races
    /// the lease's expiry on the leader (module `workload`).
    pub lease_edge: bool,
    /// With `calm`: a member's links may also turn slow (50–350 ms one
    /// way) for a while, one fault at a time as the others, and still no
    /// session may be lost.
    pub calm_slow_links: bool,
}

impl Default for Settings {
    fn default() -> Settings {
        Settings {
            members: 3,
            clients: 6,
            locks: 3,
            duration: Duration::from_secs(20),
            faults: true,
            calm: false,
            session_ttl: Duration::from_secs(2),
            mixed: false,
            plant: None,
            tick: Duration::from_millis(5),
            clients_per_host: 4,
            slow_links: true,
            clock_skew: Duration::from_millis(1),
            membership: false,
            power_loss: false,
            slow_disks: false,
            slow_apply: false,
            lease_edge: false,
            calm_slow_links: false,
        }
    }
}

impl Settings {
    /// Every link's latency, from least to most (while no fault slows it).
    pub fn latency(&self) -> std::ops::Range<Duration> {
        Duration::from_millis(1)..Duration::from_millis(if self.faults { 20 } else { 5 })
    }

    /// How many clients share a host by default: four, or half of them when
    /// there are more than eight, so that they take two hosts. turmoil's own
    /// work grows with the square of the hosts; 16 clients on four hosts
    /// ran at 48× real time, on two at 56× (docs/RELIABILITY.md, "Speed").
    pub fn clients_per_host_for(clients: u32) -> u32 {
        if clients > 8 {
            clients.div_ceil(2)
        } else {
            4
        }
    }

    /// The hosts the clients run on.
    pub fn client_hosts(&self) -> u32 {
        self.clients.div_ceil(self.clients_per_host.max(1))
    }

    /// The command-line arguments that give these settings, as
    /// `locksmith-sim` reads them (a replay, a seed's own process).
    pub fn args(&self) -> Vec<String> {
        let mut args: Vec<String> = [
            ("--members", self.members.to_string()),
            ("--clients", self.clients.to_string()),
            ("--locks", self.locks.to_string()),
            ("--duration", self.duration.as_secs().to_string()),
            ("--tick-ms", self.tick.as_millis().to_string()),
            ("--clients-per-host", self.clients_per_host.to_string()),
            ("--clock-skew-ms", self.clock_skew.as_millis().to_string()),
        ]
        .into_iter()
        .flat_map(|(flag, value)| [flag.to_string(), value])
        .collect();
        let switches = [
            (!self.slow_links, "--no-slow-links"),
            (!self.faults, "--no-faults"),
            (self.calm, "--calm"),
            (self.mixed, "--mixed"),
            (self.membership, "--membership"),
            (self.power_loss, "--power-loss"),
            (self.slow_disks, "--slow-disks"),
            (self.slow_apply, "--slow-apply"),
            (self.lease_edge, "--lease-edge"),
            (self.calm_slow_links, "--calm-slow-links"),
        ];
        args.extend(
            switches
                .into_iter()
                .filter(|(on, _)| *on)
                .map(|(_, flag)| flag.to_string()),
        );
        if let Some(defect) = self.plant {
            args.extend(["--plant".to_string(), defect.name().to_string()]);
        }
        args
    }

    /// The command that runs `seed` with these settings again.
    pub fn replay_command(&self, seed: u64) -> String {
        format!(
            "RUST_LOG=locksmith_sim=debug cargo run --profile simulate -p locksmith-sim -- --seed {seed} {}",
            self.args().join(" ")
        )
    }
}

/// What a run did and found.
#[derive(Debug)]
pub struct Report {
    /// Its seed.
    pub seed: u64,
    /// Simulated time from start to the last client's end.
    pub simulated: Duration,
    /// Real time the simulation took (the checks not counted).
    pub real: Duration,
    /// CPU time the simulation took: beside `real` on a busy machine.
    pub cpu: Duration,
    /// Real time the checks of the history took.
    pub checking: Duration,
    /// Every invocation and return the clients saw.
    pub history: Vec<Event>,
    /// The faults, as they struck.
    pub faults: Vec<String>,
    /// What the checks found (none is a pass).
    pub violations: Vec<Violation>,
}

impl Report {
    /// Grants the clients saw.
    pub fn grants(&self) -> usize {
        self.history
            .iter()
            .filter(|e| matches!(e.kind, history::Kind::Return(history::Ret::Granted { .. })))
            .count()
    }

    /// A digest of the history (times, clients, outcomes, tokens): equal
    /// for two runs of a seed that replayed exactly.
    pub fn digest(&self) -> u64 {
        let mut hasher = DefaultHasher::new();
        self.history.hash(&mut hasher);
        self.faults.hash(&mut hasher);
        hasher.finish()
    }
}

/// Runs `seed` on a thread of its own (its randomness comes from the seed
/// from its first draw: module `entropy`) and checks its history.
pub fn run(seed: u64, settings: &Settings) -> Report {
    let settings = settings.clone();
    std::thread::Builder::new()
        .name(format!("sim-{seed}"))
        .stack_size(64 << 20)
        .spawn(move || {
            entropy::seed_this_thread(seed);
            if let Some(defect) = settings.plant {
                planted::plant(defect);
            }
            simulate(seed, &settings)
        })
        .expect("a thread for the simulation")
        .join()
        .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
}

/// Set once this process's simulation has ended and its history is being
/// checked: a run past its real-time limit then names the check, not the
/// cluster, as what did not end.
pub static CHECKING: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Simulated time the clients get past `duration` to finish (a member may
/// be restarting, a session resuming) before the run counts as stuck.
const FINISH_WITHIN: Duration = Duration::from_secs(60);

fn simulate(seed: u64, settings: &Settings) -> Report {
    let started = Instant::now();
    let shm = std::path::Path::new("/dev/shm");
    let data = if shm.is_dir() {
        tempfile::tempdir_in(shm)
    } else {
        tempfile::tempdir()
    }
    .expect("a directory for the members' data");
    let mut sim = turmoil::Builder::new()
        .rng_seed(seed)
        .epoch(UNIX_EPOCH + Duration::from_secs(1_900_000_000))
        .simulation_duration(settings.duration + FINISH_WITHIN * 2)
        .tick_duration(settings.tick)
        .min_message_latency(settings.latency().start)
        .max_message_latency(settings.latency().end)
        .build();
    let mut skews = SmallRng::seed_from_u64(seed ^ 0x0063_6c6f_636b);
    let skew = settings.clock_skew.as_nanos() as i64;
    cluster::skew_clocks(std::array::from_fn(|_| match skew {
        0 => 0,
        _ => skews.gen_range(-skew..=skew),
    }));
    let cluster: Vec<(u64, String)> = (1..=settings.members)
        .map(|id| (id, format!("{}:{PORT}", member_host(id))))
        .collect();
    let mut faults = Faults::new(seed, settings);
    for id in 1..=settings.members {
        let setup = MemberSetup {
            id,
            cluster: cluster.clone(),
            data_dir: data.path().join(member_host(id)),
            join: None,
            disk: faults.disk(id),
            pace: faults.pace(id),
        };
        sim.host(member_host(id), move || cluster::run_member(setup.clone()));
    }
    let url = format!(
        "locksmith://{}",
        cluster
            .iter()
            .map(|(_, addr)| addr.as_str())
            .collect::<Vec<_>>()
            .join(",")
    );
    let history = History::default();
    let sessions_lost = workload::SessionsLost::default();
    let locks: Vec<String> = (0..settings.locks).map(|i| format!("hot/{i}")).collect();
    let hosts = settings.client_hosts();
    for host in 1..=hosts {
        let clients = (1..=settings.clients)
            .filter(|id| (id - 1) % hosts + 1 == host)
            .map(|id| {
                let setup = ClientSetup {
                    id,
                    url: url.clone(),
                    locks: locks.clone(),
                    session_ttl: settings.session_ttl,
                    until: settings.duration,
                    mixed: settings.mixed,
                    calm: settings.calm,
                    lease_edge: settings.lease_edge,
                };
                let rng = SmallRng::seed_from_u64(
                    seed.wrapping_mul(1_000_003).wrapping_add(u64::from(id)),
                );
                workload::run_client(setup, rng, history.clone(), sessions_lost.clone())
            })
            .collect::<Vec<_>>();
        sim.client(client_host(host), async move {
            futures::future::try_join_all(clients).await.map(|_| ())
        });
    }
    let stuck = std::rc::Rc::new(std::cell::RefCell::new(Vec::new()));
    let prober = ClientSetup {
        id: 0,
        url: url.clone(),
        locks: locks.clone(),
        session_ttl: settings.session_ttl,
        until: settings.duration,
        mixed: settings.mixed,
        calm: false,
        lease_edge: false,
    };
    sim.client(
        "prober",
        workload::run_prober(prober, history.clone(), stuck.clone()),
    );
    let mut membership = Membership::new(seed, settings);
    if let Some(operator) = membership.operator(settings.duration) {
        sim.client("operator", operator.run());
    }
    let mut violations = Vec::new();
    loop {
        match sim.step() {
            Ok(true) => break,
            Ok(false) => {}
            Err(error) => {
                violations.push(Violation {
                    rule: "the simulation runs",
                    lock: 0,
                    detail: format!("a host stopped with an error: {error}"),
                });
                break;
            }
        }
        let now = sim.elapsed();
        faults.at(now, &mut sim, membership.busy());
        membership.at(now, &mut sim, &mut faults, data.path());
        if now > settings.duration + FINISH_WITHIN {
            violations.push(Violation {
                rule: "clients finish",
                lock: 0,
                detail: format!(
                    "clients still working {:?} after they stopped starting operations",
                    FINISH_WITHIN
                ),
            });
            break;
        }
    }
    let simulated = sim.elapsed();
    drop(sim);
    let (real, cpu) = (started.elapsed(), thread_cpu_time());
    let history = history.events();
    CHECKING.store(true, std::sync::atomic::Ordering::Relaxed);
    violations.extend(stuck.take());
    violations.extend(membership.violations());
    if settings.calm || !settings.faults {
        violations.extend(
            sessions_lost
                .take()
                .into_iter()
                .map(|(at, client, hold)| Violation {
                    rule: "no healthy session lost",
                    lock: 0,
                    detail: format!(
                        "client {client} had lost {hold} by {at:?}, with at most one member down, \
                 cut off or frozen at a time"
                    ),
                }),
        );
    }
    violations.extend(check::check(&history, settings.clock_skew));
    Report {
        seed,
        simulated,
        real,
        cpu,
        checking: started.elapsed() - real,
        history,
        faults: faults.struck(),
        violations,
    }
}

/// The CPU time this thread has used.
fn thread_cpu_time() -> Duration {
    let mut time = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `time` is a valid timespec to write; the clock id is a
    // constant every Linux knows.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut time) };
    Duration::new(time.tv_sec as u64, time.tv_nsec as u32)
}
