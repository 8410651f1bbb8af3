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
    /// Members of the cluster.
    #[arg(long, default_value_t = 3)]
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
    /// no-grace or no-deadline-check (`locksmith_core::planted`).
    #[arg(long, value_parser = parse_defect)]
    plant: Option<Defect>,
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
            Some(seeds) => campaign(seeds, &settings, args.real_limit),
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
            "result simulated_ms=0 real_ms={} ok=false",
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
        "seed {seed}: {} grants, {} faults, {:.1}s simulated in {:.1}s ({:.0}×), digest {:016x}{}",
        report.grants(),
        report.faults.len(),
        report.simulated.as_secs_f64(),
        report.real.as_secs_f64(),
        report.simulated.as_secs_f64() / report.real.as_secs_f64(),
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
        "result simulated_ms={} real_ms={} ok={}",
        report.simulated.as_millis(),
        report.real.as_millis(),
        report.violations.is_empty()
    );
    if report.violations.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

/// Runs every seed of `seeds` in a process of its own, then sums up.
fn campaign(seeds: std::ops::Range<u64>, settings: &Settings, real_limit: u64) -> ExitCode {
    let program = std::env::current_exe().expect("the path of this program");
    let (mut runs, mut failed) = (0u64, Vec::new());
    let (mut simulated, mut real) = (Duration::ZERO, Duration::ZERO);
    for seed in seeds {
        let mut command = Command::new(&program);
        command
            .arg("--seed")
            .arg(seed.to_string())
            .args(["--members", &settings.members.to_string()])
            .args(["--clients", &settings.clients.to_string()])
            .args(["--locks", &settings.locks.to_string()])
            .args(["--duration", &settings.duration.as_secs().to_string()])
            .args(["--real-limit", &real_limit.to_string()]);
        if !settings.faults {
            command.arg("--no-faults");
        }
        if settings.calm {
            command.arg("--calm");
        }
        if settings.mixed {
            command.arg("--mixed");
        }
        if let Some(defect) = settings.plant {
            command.args(["--plant", defect.name()]);
        }
        let output = match command.output() {
            Ok(output) => output,
            Err(error) => {
                eprintln!("cannot run {}: {error}", program.display());
                return ExitCode::FAILURE;
            }
        };
        runs += 1;
        let stdout = String::from_utf8_lossy(&output.stdout);
        let mut ok = output.status.success();
        for line in stdout.lines() {
            match line.strip_prefix("result ") {
                Some(result) => {
                    for field in result.split(' ') {
                        match field.split_once('=') {
                            Some(("simulated_ms", ms)) => {
                                simulated += Duration::from_millis(ms.parse().unwrap_or(0))
                            }
                            Some(("real_ms", ms)) => {
                                real += Duration::from_millis(ms.parse().unwrap_or(0))
                            }
                            Some(("ok", value)) => ok &= value == "true",
                            _ => {}
                        }
                    }
                }
                None => println!("{line}"),
            }
        }
        if !ok {
            if !output.status.success() && !stdout.contains("replay:") {
                // It died before its report (a panic): say how.
                print!("{}", String::from_utf8_lossy(&output.stderr));
                println!("  replay: {}", settings.replay_command(seed));
            }
            failed.push(seed);
        }
    }
    println!(
        "{runs} seeds, {} failed {failed:?}; {:.0}s simulated in {:.0}s of runs ({:.1}×)",
        failed.len(),
        simulated.as_secs_f64(),
        real.as_secs_f64(),
        simulated.as_secs_f64() / real.as_secs_f64().max(1e-9)
    );
    if failed.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
