//! `locksmith-sim`: runs seeds of the simulation (crate docs) and says
//! how each went; a failing seed prints the command that replays it.
//!
//! Each seed of a range runs in a process of its own (this program again,
//! with `--seed`): some state the code under test keeps per process (tokio
//! counts the runtimes it seeds) would otherwise carry over from one seed to
//! the next, and a seed found failing in a campaign must fail the same way
//! when replayed alone.

use std::process::{Command, ExitCode};
use std::time::Duration;

use clap::Parser;
use locksmith_core::planted::Defect;
use locksmith_sim::{run, Settings};

/// Deterministic simulation of a locksmith cluster.
#[derive(Debug, Parser)]
struct Args {
    /// One seed, run in this process.
    #[arg(long, conflicts_with = "seeds")]
    seed: Option<u64>,
    /// A range of seeds, `FIRST..END` (END excluded), each in a process of
    /// its own.
    #[arg(long)]
    seeds: Option<String>,
    /// Members of the cluster (at most 7).
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u64).range(1..=7))]
    members: u64,
    /// Clients.
    #[arg(long, default_value_t = 6)]
    clients: u32,
    /// Hot locks.
    #[arg(long, default_value_t = 3)]
    locks: usize,
    /// Seconds of simulated time the clients work.
    #[arg(long, default_value_t = 20)]
    duration: u64,
    /// No faults.
    #[arg(long)]
    no_faults: bool,
    /// Calm faults: one member at a time, each healed and settled before
    /// the next; no client may then lose its session.
    #[arg(long)]
    calm: bool,
    /// The mixed workload: read-write locks, semaphores and leases (some
    /// extended, some let run out) beside plain locks.
    #[arg(long)]
    mixed: bool,
    /// Put a past defect back, to show the simulator finds it:
    /// heartbeats-dropped, frozen-leader, stale-hint, deadline-by-equality,
    /// no-grace, no-deadline-check, joint-finisher-race or leader-restore
    /// (`locksmith_core::planted`).
    #[arg(long, value_parser = parse_defect)]
    plant: Option<Defect>,
    /// Membership changes among the faults: a member added (it joins as a
    /// learner and is promoted), a voter removed and stopped, or both.
    #[arg(long)]
    membership: bool,
    /// A crash is a power loss: what a member's Raft log wrote and did not
    /// sync yet is lost or torn (each member's syncs take 1–10 ms).
    #[arg(long)]
    power_loss: bool,
    /// As --power-loss, and a member's disk, or every member's at once,
    /// may turn slow (20–200 ms a sync) for a while, among the faults.
    #[arg(long)]
    slow_disks: bool,
    /// A member may turn busy for a while, among the faults: applying each
    /// run of committed entries takes it 0.2–1.5 s.
    #[arg(long)]
    slow_apply: bool,
    /// With --mixed: a leased holder that extends sends its extension
    /// close to its lease's end, racing the expiry.
    #[arg(long, requires = "mixed")]
    lease_edge: bool,
    /// With --calm: a member's links may also turn slow (50–350 ms one
    /// way) for a while, one fault at a time as the others.
    #[arg(long, requires = "calm")]
    calm_slow_links: bool,
    /// Clients that share a simulated host [default: 4, or half the
    /// clients when there are more than 8: two client hosts]
    #[arg(long)]
    clients_per_host: Option<u32>,
    /// No slow links among the faults (as before they existed).
    #[arg(long)]
    no_slow_links: bool,
    /// How far each member's wall clock may be off the simulated time,
    /// either way, in milliseconds (0: none).
    #[arg(long, default_value_t = 1)]
    clock_skew_ms: u64,
    /// The simulator's step, in simulated milliseconds.
    #[arg(long, default_value_t = 5)]
    tick_ms: u64,
    /// Seeds of a range run at a time, each in a process of its own.
    #[arg(long, default_value_t = 1)]
    jobs: usize,
    /// Print the run's history.
    #[arg(long)]
    history: bool,
    /// Seconds of real (not simulated) time, counted as the CPU time the
    /// process uses, one seed may take before it counts as failed:
    /// simulated time only moves when every host waits, so code that never
    /// waits (a busy loop) stops it, and the run would never end. CPU time,
    /// so that a loaded machine does not fail a slow run.
    #[arg(long, default_value_t = 120)]
    real_limit: u64,
}

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| "error".into()),
        )
        .with_writer(std::io::stderr)
        .with_timer(SimulatedTime)
        .with_ansi(false)
        .init();
    let args = Args::parse();
    let settings = Settings {
        members: args.members,
        clients: args.clients,
        locks: args.locks,
        duration: Duration::from_secs(args.duration),
        faults: !args.no_faults,
        calm: args.calm,
        mixed: args.mixed,
        plant: args.plant,
        tick: Duration::from_millis(args.tick_ms),
        clients_per_host: args
            .clients_per_host
            .unwrap_or_else(|| locksmith_sim::Settings::clients_per_host_for(args.clients)),
        slow_links: !args.no_slow_links,
        clock_skew: Duration::from_millis(args.clock_skew_ms),
        membership: args.membership,
        power_loss: args.power_loss,
        slow_disks: args.slow_disks,
        slow_apply: args.slow_apply,
        lease_edge: args.lease_edge,
        calm_slow_links: args.calm_slow_links,
        ..Settings::default()
    };
    match (args.seed, &args.seeds) {
        (Some(seed), _) => {
            watch_real_time(seed, &settings, Duration::from_secs(args.real_limit));
            run_one(seed, &settings, args.history)
        }
        (None, Some(range)) => match range
            .split_once("..")
            .and_then(|(a, b)| Some(a.parse::<u64>().ok()?..b.parse::<u64>().ok()?))
        {
            Some(seeds) => campaign(seeds, &settings, args.real_limit, args.jobs),
            None => {
                eprintln!("--seeds takes FIRST..END, e.g. 1..1000");
                ExitCode::FAILURE
            }
        },
        (None, None) => run_one(0, &settings, args.history),
    }
}

fn parse_defect(name: &str) -> Result<Defect, String> {
    Defect::named(name).ok_or_else(|| {
        let names: Vec<&str> = Defect::ALL.iter().map(|(_, name)| *name).collect();
        format!("no such defect; one of {}", names.join(", "))
    })
}

/// Stamps each line of the trace with the simulated time (seconds since
/// the run began), so that a trace reads against the history; lines from
/// outside the simulation (its set-up, the check) show `-`.
struct SimulatedTime;

impl tracing_subscriber::fmt::time::FormatTime for SimulatedTime {
    fn format_time(&self, w: &mut tracing_subscriber::fmt::format::Writer<'_>) -> std::fmt::Result {
        match turmoil::sim_elapsed() {
            Some(at) => write!(w, "{:>9.3}s", at.as_secs_f64()),
            None => write!(w, "{:>10}", "-"),
        }
    }
}

/// Ends this process as a failed run if `seed` is still running after
/// using `limit` of CPU time: a busy loop burns it, while a run on a
/// loaded machine only waits longer for it.
fn watch_real_time(seed: u64, settings: &Settings, limit: Duration) {
    let replay = settings.replay_command(seed);
    std::thread::spawn(move || {
        while cpu_time() < limit {
            std::thread::sleep(Duration::from_millis(500));
        }
        if locksmith_sim::CHECKING.load(std::sync::atomic::Ordering::Relaxed) {
            println!(
                "seed {seed}: VIOLATION the check of the history did not end within {limit:?} \
                 of CPU time"
            );
        } else {
            println!(
                "seed {seed}: VIOLATION simulated time stopped: the run did not end within \
                 {limit:?} of CPU time (some task of the cluster never waits, so the clock \
                 never moves)"
            );
        }
        println!("  replay: {replay}");
        println!(
            "result simulated_ms=0 real_ms={0} cpu_ms={0} check_ms=0 ok=false",
            limit.as_millis()
        );
        std::process::exit(1);
    });
}

/// The CPU time this process has used.
fn cpu_time() -> Duration {
    let mut time = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `time` is a valid timespec to write; the clock id is a
    // constant every Linux knows.
    unsafe { libc::clock_gettime(libc::CLOCK_PROCESS_CPUTIME_ID, &mut time) };
    Duration::new(time.tv_sec as u64, time.tv_nsec as u32)
}

/// Runs `seed` here and prints how it went; the last line is the result
/// in a form `campaign` reads.
fn run_one(seed: u64, settings: &Settings, history: bool) -> ExitCode {
    let report = run(seed, settings);
    println!(
        "seed {seed}: {} grants, {} faults, {:.1}s simulated in {:.2}s ({:.0}×; {:.2}s of CPU), \
         checked in {:.2}s, digest {:016x}{}",
        report.grants(),
        report.faults.len(),
        report.simulated.as_secs_f64(),
        report.real.as_secs_f64(),
        report.simulated.as_secs_f64() / report.real.as_secs_f64(),
        report.cpu.as_secs_f64(),
        report.checking.as_secs_f64(),
        report.digest(),
        if report.violations.is_empty() {
            ""
        } else {
            "  VIOLATION"
        },
    );
    if history {
        for event in &report.history {
            println!("  {event}");
        }
    }
    if !report.violations.is_empty() {
        for fault in &report.faults {
            println!("  fault: {fault}");
        }
        for violation in &report.violations {
            println!(
                "  {} (lock {}): {}",
                violation.rule, violation.lock, violation.detail
            );
        }
        println!("  replay: {}", settings.replay_command(seed));
    }
    println!(
        "result simulated_ms={} real_ms={} cpu_ms={} check_ms={} ok={}",
        report.simulated.as_millis(),
        report.real.as_millis(),
        report.cpu.as_millis(),
        report.checking.as_millis(),
        report.violations.is_empty()
    );
    if report.violations.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

/// What a campaign's runs add up to.
#[derive(Default)]
struct Tally {
    runs: u64,
    failed: Vec<u64>,
    simulated: Duration,
    real: Duration,
    cpu: Duration,
    checking: Duration,
}

/// Runs every seed of `seeds` in a process of its own, `jobs` at a time,
/// then sums up. Each seed's lines are printed whole as it ends.
fn campaign(
    seeds: std::ops::Range<u64>,
    settings: &Settings,
    real_limit: u64,
    jobs: usize,
) -> ExitCode {
    let program = std::env::current_exe().expect("the path of this program");
    let next = std::sync::Mutex::new(seeds.clone());
    let tally = std::sync::Mutex::new(Tally::default());
    let started = std::time::Instant::now();
    std::thread::scope(|scope| {
        for _ in 0..jobs.max(1) {
            scope.spawn(|| loop {
                let Some(seed) = next.lock().expect("the seeds").next() else {
                    return;
                };
                let (lines, result) = run_seed(&program, seed, settings, real_limit);
                let mut tally = tally.lock().expect("the tally");
                print!("{lines}");
                tally.runs += 1;
                match result {
                    Some(run) => {
                        tally.simulated += run.simulated;
                        tally.real += run.real;
                        tally.cpu += run.cpu;
                        tally.checking += run.checking;
                        if !run.ok {
                            tally.failed.push(seed);
                        }
                    }
                    None => tally.failed.push(seed),
                }
            });
        }
    });
    let mut tally = tally.into_inner().expect("the tally");
    tally.failed.sort_unstable();
    println!(
        "{} seeds, {} failed {:?}; {:.0}s simulated in {:.0}s of runs ({:.1}×; {:.0}s of CPU, \
         {:.1}× per CPU second), {:.0}s of checks; {:.0}s in all, {jobs} at a time",
        tally.runs,
        tally.failed.len(),
        tally.failed,
        tally.simulated.as_secs_f64(),
        tally.real.as_secs_f64(),
        tally.simulated.as_secs_f64() / tally.real.as_secs_f64().max(1e-9),
        tally.cpu.as_secs_f64(),
        tally.simulated.as_secs_f64() / tally.cpu.as_secs_f64().max(1e-9),
        tally.checking.as_secs_f64(),
        started.elapsed().as_secs_f64(),
    );
    if tally.failed.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

/// How one seed's run went, as its `result` line says.
struct SeedResult {
    simulated: Duration,
    real: Duration,
    cpu: Duration,
    checking: Duration,
    ok: bool,
}

/// Runs `seed` in a process of its own: the lines to print, and its result
/// (none if the process could not run).
fn run_seed(
    program: &std::path::Path,
    seed: u64,
    settings: &Settings,
    real_limit: u64,
) -> (String, Option<SeedResult>) {
    let mut command = Command::new(program);
    command
        .arg("--seed")
        .arg(seed.to_string())
        .args(settings.args())
        .args(["--real-limit", &real_limit.to_string()]);
    let output = match command.output() {
        Ok(output) => output,
        Err(error) => {
            return (format!("cannot run {}: {error}\n", program.display()), None);
        }
    };
    let stdout = String::from_utf8_lossy(&output.stdout);
    let mut lines = String::new();
    let mut result = SeedResult {
        simulated: Duration::ZERO,
        real: Duration::ZERO,
        cpu: Duration::ZERO,
        checking: Duration::ZERO,
        ok: output.status.success(),
    };
    let millis = |ms: &str| Duration::from_millis(ms.parse().unwrap_or(0));
    for line in stdout.lines() {
        let Some(fields) = line.strip_prefix("result ") else {
            lines.push_str(line);
            lines.push('\n');
            continue;
        };
        for field in fields.split(' ') {
            match field.split_once('=') {
                Some(("simulated_ms", ms)) => result.simulated = millis(ms),
                Some(("real_ms", ms)) => result.real = millis(ms),
                Some(("cpu_ms", ms)) => result.cpu = millis(ms),
                Some(("check_ms", ms)) => result.checking = millis(ms),
                Some(("ok", value)) => result.ok &= value == "true",
                _ => {}
            }
        }
    }
    if !output.status.success() && !stdout.contains("replay:") {
        // It died before its report (a panic): say how.
        lines.push_str(&String::from_utf8_lossy(&output.stderr));
        lines.push_str(&format!("  replay: {}\n", settings.replay_command(seed)));
    }
    (lines, Some(result))
}
