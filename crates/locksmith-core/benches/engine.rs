//! Benchmarks of the lock engine.
//!
//! `cargo bench -p locksmith-core --bench engine` runs:
//!
//! * `acquire_release/*` (criterion): uncontended `apply(Acquire)` +
//!   `apply(Release)` pairs on one core, one session, 16-byte lock names, the
//!   effects `Vec` reused (cleared) between commands. Throughput is one element
//!   per pair, so criterion's "thrpt" line reads in pairs/s.
//!   - `same_name`: the same lock every time (its entry is created and dropped
//!     each pair, as idle locks leave the table).
//!   - `distinct_names`: cycles through 4096 different names.
//!   - `*_prebuilt`: the commands are built outside the timed region, so only the
//!     engine is measured; the other variants also time building the `Command`
//!     values (cloning the owner and name `String`s), as a real caller pays.
//!
//! Then, printed to stdout:
//!
//! * allocator calls made inside the engine per acquire+release pair;
//! * the same pairs/s as the fastest of 200 windows of 10,000 pairs: robust
//!   against a loaded machine, where criterion's means include the time the
//!   benchmark spent preempted;
//! * pairs/s of a session that also has 0 to 100,000 requests queued: flat,
//!   because no per-request check walks the session's queue;
//! * memory per held lock: 1,000,000 locks with 16-byte names held by one
//!   session, measured with a counting global allocator (live bytes requested
//!   from the allocator, so malloc's own per-block overhead is not included),
//!   plus the time to insert them (from a run without counting) and to close the
//!   session holding them;
//! * on that table, the time of what inspection and snapshots ask of the
//!   engine thread: `freeze()` (what a snapshot costs it; the copy and the
//!   encoding happen on another thread, also timed), `list("")` of
//!   everything, and one page of `list_page` (the server's `List` answers in
//!   pages of at most 10,000);
//! * `freeze()` of an engine with 100,000 idle sessions and no lock: what a
//!   snapshot costs the engine thread of a server with many idle clients.

use std::alloc::{GlobalAlloc, Layout, System};
use std::hint::black_box;
use std::sync::atomic::{AtomicBool, AtomicIsize, AtomicUsize, Ordering::Relaxed};
use std::time::{Duration, Instant};

use criterion::{BenchmarkId, Criterion, Throughput};
use locksmith_core::{
    Acquire, ClientInfo, Command, Effect, Engine, Limits, Mode, RequestId, SessionId, Wait,
};

/// Counts live bytes (and calls) on top of the system allocator, while
/// [`COUNTING`] is set (it is off during the throughput runs, so that the
/// counters' atomic operations do not slow down the measured code).
struct Counting;

static COUNTING: AtomicBool = AtomicBool::new(false);
/// Signed: memory allocated before counting began may be freed while it is on,
/// which takes the count below its starting point. Only differences matter.
static LIVE: AtomicIsize = AtomicIsize::new(0);
static PEAK: AtomicIsize = AtomicIsize::new(0);
static CALLS: AtomicUsize = AtomicUsize::new(0);

fn grew(bytes: usize) {
    CALLS.fetch_add(1, Relaxed);
    let bytes = bytes as isize;
    let live = LIVE.fetch_add(bytes, Relaxed) + bytes;
    PEAK.fetch_max(live, Relaxed);
}

// SAFETY: every call is forwarded unchanged to `System`; only counters are added.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let p = System.alloc(layout);
        if !p.is_null() && COUNTING.load(Relaxed) {
            grew(layout.size());
        }
        p
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        let p = System.alloc_zeroed(layout);
        if !p.is_null() && COUNTING.load(Relaxed) {
            grew(layout.size());
        }
        p
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        System.dealloc(ptr, layout);
        if COUNTING.load(Relaxed) {
            LIVE.fetch_sub(layout.size() as isize, Relaxed);
        }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let p = System.realloc(ptr, layout, new_size);
        if !p.is_null() && COUNTING.load(Relaxed) {
            LIVE.fetch_sub(layout.size() as isize, Relaxed);
            grew(new_size);
        }
        p
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

const SESSION: SessionId = SessionId(1);
const OWNER: &str = "worker-1"; // 8 bytes
const NAMES: usize = 4096;

/// A 16-byte lock name: `bench/lk/0000042` (for `i` below 10 million).
fn name(i: usize) -> String {
    let n = format!("bench/lk/{i:07}");
    assert_eq!(n.len(), 16);
    n
}

/// An engine with one open session ([`SESSION`]) that may hold any number
/// of locks (the scenarios here go past the default limit).
fn engine_with_session() -> Engine {
    let mut engine = Engine::new(Limits {
        max_holds_per_session: usize::MAX,
        ..Limits::default()
    });
    engine
        .apply(
            0,
            Command::OpenSession {
                session: SESSION,
                ttl: 60_000,
                info: ClientInfo {
                    name: "bench".into(),
                    host: "localhost".into(),
                },
            },
            &mut Vec::new(),
        )
        .expect("open session");
    engine
}

fn acquire(name: String, request: u64) -> Command {
    Command::Acquire(Acquire {
        session: SESSION,
        request: RequestId(request),
        owner: OWNER.to_owned(),
        names: vec![name],
        mode: Mode::Exclusive,
        wait: Wait::No,
        lease: None,
        reentrant: true,
        lock_delay: 0,
    })
}

fn release(name: String) -> Command {
    Command::Release {
        session: SESSION,
        owner: OWNER.to_owned(),
        name,
        token: None,
    }
}

/// One acquire + release pair at time `now`; panics unless the acquire is granted.
#[inline]
fn pair(engine: &mut Engine, effects: &mut Vec<Effect>, now: u64, acq: Command, rel: Command) {
    engine.apply(now, acq, effects).expect("acquire");
    debug_assert!(matches!(effects.as_slice(), [Effect::Granted { .. }]));
    effects.clear();
    engine.apply(now, rel, effects).expect("release");
    effects.clear();
}

fn acquire_release(c: &mut Criterion) {
    let names: Vec<String> = (0..NAMES).map(name).collect();
    let mut group = c.benchmark_group("acquire_release");
    group.throughput(Throughput::Elements(1));
    group.measurement_time(Duration::from_secs(4));

    for (label, distinct) in [("same_name", false), ("distinct_names", true)] {
        let pick = move |i: u64| if distinct { i as usize % NAMES } else { 0 };

        // Caller's view: the commands are built inside the timed loop.
        group.bench_function(BenchmarkId::from_parameter(label), |b| {
            let mut engine = engine_with_session();
            let mut effects = Vec::with_capacity(8);
            let mut i = 0u64;
            b.iter(|| {
                i += 1;
                let n = &names[pick(i)];
                pair(
                    &mut engine,
                    &mut effects,
                    i,
                    acquire(n.clone(), i),
                    release(n.clone()),
                );
            });
            black_box(&engine);
        });

        // Engine only: commands built in chunks outside the timed region.
        group.bench_function(
            BenchmarkId::from_parameter(format!("{label}_prebuilt")),
            |b| {
                let mut engine = engine_with_session();
                let mut effects = Vec::with_capacity(8);
                let mut i = 0u64;
                b.iter_custom(|iters| {
                    let mut total = Duration::ZERO;
                    let mut left = iters;
                    while left > 0 {
                        let chunk = left.min(4096);
                        left -= chunk;
                        let cmds: Vec<(Command, Command)> = (0..chunk)
                            .map(|k| {
                                let n = &names[pick(i + k)];
                                (acquire(n.clone(), i + k), release(n.clone()))
                            })
                            .collect();
                        let start = Instant::now();
                        for (acq, rel) in cmds {
                            i += 1;
                            pair(&mut engine, &mut effects, i, acq, rel);
                        }
                        total += start.elapsed();
                    }
                    total
                });
                black_box(&engine);
            },
        );
    }
    group.finish();
}

/// What [`fill`] measured.
struct Filled {
    engine: Engine,
    elapsed: Duration,
    live: usize,
    peak: usize,
    calls: usize,
}

/// Acquires `count` distinct locks (16-byte names) in one session. With
/// `counting`, the allocator counts bytes and calls meanwhile (which slows the
/// allocations down: time is taken from a run without it).
fn fill(count: usize, counting: bool) -> Filled {
    COUNTING.store(counting, Relaxed);
    let mut effects = Vec::with_capacity(8);
    let mut engine = engine_with_session();
    // Build the names first (untimed). They are moved into the commands, and the
    // engine frees what it does not keep, so after the loop the live-byte delta is
    // the engine's alone.
    let baseline = LIVE.load(Relaxed);
    let names: Vec<String> = (0..count).map(name).collect();
    let calls_before = CALLS.load(Relaxed);
    PEAK.store(LIVE.load(Relaxed), Relaxed);
    let start = Instant::now();
    for (i, n) in names.into_iter().enumerate() {
        engine
            .apply(1, acquire(n, i as u64), &mut effects)
            .expect("acquire");
        debug_assert!(matches!(effects.as_slice(), [Effect::Granted { .. }]));
        effects.clear();
    }
    let elapsed = start.elapsed();
    drop(effects);
    COUNTING.store(false, Relaxed);
    assert_eq!(engine.sessions()[0].holds, count);
    Filled {
        engine,
        elapsed,
        calls: CALLS.load(Relaxed) - calls_before,
        live: (LIVE.load(Relaxed) - baseline) as usize,
        peak: (PEAK.load(Relaxed) - baseline) as usize,
    }
}

/// Memory per held lock and time to insert them, printed to stdout.
fn memory_per_held_lock(count: usize) {
    // Timing first, without counting.
    let Filled {
        mut engine,
        elapsed,
        ..
    } = fill(count, false);
    // The session's end, step by step as a server applies it: the close,
    // then each `ContinueSessionEnd` that falls due.
    let mut effects = Vec::new();
    let mut steps = Vec::new();
    let mut command = Some(Command::CloseSession { session: SESSION });
    while let Some(next) = command {
        let start = Instant::now();
        engine
            .apply(2, next, &mut effects)
            .expect("a step of the end");
        steps.push(start.elapsed());
        command = engine.due(2).into_iter().next();
    }
    assert_eq!(effects.len(), count);
    assert!(engine.list("").is_empty());
    drop((engine, effects));
    let closed: Duration = steps.iter().sum();
    let slowest = steps.iter().max().copied().unwrap_or_default();

    let Filled {
        live, peak, calls, ..
    } = fill(count, true);
    let per_lock = live as f64 / count as f64;
    println!();
    println!("memory per held lock ({count} exclusive holds, 16-byte names, one session):");
    println!(
        "  live bytes after insert: {live} ({:.1} MiB) -> {per_lock:.1} bytes per held lock (goal <= 256: {})",
        live as f64 / (1 << 20) as f64,
        if per_lock <= 256.0 { "met" } else { "MISSED" }
    );
    println!(
        "  peak during insert (incl. the {count} prebuilt names): {:.1} MiB; {:.1} allocator calls per acquire",
        peak as f64 / (1 << 20) as f64,
        calls as f64 / count as f64,
    );
    println!(
        "  insert time: {:.3} s ({:.0} ns per acquire, {:.2} M acquires/s)",
        elapsed.as_secs_f64(),
        elapsed.as_nanos() as f64 / count as f64,
        count as f64 / elapsed.as_secs_f64() / 1e6,
    );
    println!(
        "  closing the session (releases all, {count} Lost effects): {:.3} s in {} steps; \
         the first {:.2} ms, the slowest {:.2} ms",
        closed.as_secs_f64(),
        steps.len(),
        steps[0].as_secs_f64() * 1e3,
        slowest.as_secs_f64() * 1e3,
    );
}

/// Pairs per second in the fastest of many short windows.
///
/// On a loaded machine criterion's means include time the benchmark spent
/// preempted; a window of 10,000 pairs (a few ms) usually runs undisturbed, so
/// the fastest window is close to what an idle core does. With `prebuilt` the
/// commands are built before the window starts (engine only).
fn fastest_window(distinct: bool, prebuilt: bool, windows: usize) -> f64 {
    const WINDOW: u64 = 10_000;
    let names: Vec<String> = (0..NAMES).map(name).collect();
    let pick = |i: u64| &names[if distinct { i as usize % NAMES } else { 0 }];
    let mut engine = engine_with_session();
    let mut effects = Vec::with_capacity(8);
    let mut best = Duration::MAX;
    let mut i = 0u64;
    for _ in 0..windows {
        let elapsed = if prebuilt {
            let cmds: Vec<(Command, Command)> = (0..WINDOW)
                .map(|k| {
                    let n = pick(i + 1 + k);
                    (acquire(n.clone(), i + 1 + k), release(n.clone()))
                })
                .collect();
            let start = Instant::now();
            for (acq, rel) in cmds {
                i += 1;
                pair(&mut engine, &mut effects, i, acq, rel);
            }
            start.elapsed()
        } else {
            let start = Instant::now();
            for _ in 0..WINDOW {
                i += 1;
                let n = pick(i);
                pair(
                    &mut engine,
                    &mut effects,
                    i,
                    acquire(n.clone(), i),
                    release(n.clone()),
                );
            }
            start.elapsed()
        };
        best = best.min(elapsed);
    }
    WINDOW as f64 / best.as_secs_f64()
}

/// Pairs per second (fastest of `windows` windows of 1,000 pairs, 4096 names)
/// in a session that also has `queued` acquires waiting, spread over locks it
/// holds under another owner: the cost of each acquire must not grow with
/// the session's queue (the holds-per-session check used to walk it).
fn pairs_with_queue(queued: usize, windows: usize) -> f64 {
    const WINDOW: u64 = 1_000;
    let limits = Limits {
        max_waiters_per_lock: usize::MAX,
        // 100 000 queued names and the held ones are past the default.
        max_holds_per_session: usize::MAX,
        ..Limits::default()
    };
    let mut engine = Engine::new(limits);
    let mut effects = Vec::new();
    let open = Command::OpenSession {
        session: SESSION,
        ttl: 60_000,
        info: ClientInfo::default(),
    };
    engine.apply(0, open, &mut effects).expect("open session");
    let blockers = 16;
    for b in 0..blockers {
        let mut hold = acquire(format!("bench/blocker/{b}"), u64::MAX - b as u64);
        if let Command::Acquire(a) = &mut hold {
            a.owner = "blocker".into();
        }
        engine.apply(0, hold, &mut effects).expect("blocker");
    }
    for q in 0..queued {
        let mut wait = acquire(
            format!("bench/blocker/{}", q % blockers),
            1 << 40 | q as u64,
        );
        if let Command::Acquire(a) = &mut wait {
            a.owner = format!("waiter-{q}");
            a.wait = Wait::Forever;
        }
        engine.apply(0, wait, &mut effects).expect("queue");
    }
    effects.clear();
    let names: Vec<String> = (0..NAMES).map(name).collect();
    let mut best = Duration::MAX;
    let mut i = 0u64;
    for _ in 0..windows {
        let start = Instant::now();
        for _ in 0..WINDOW {
            i += 1;
            let n = &names[i as usize % NAMES];
            pair(
                &mut engine,
                &mut effects,
                1,
                acquire(n.clone(), i),
                release(n.clone()),
            );
        }
        best = best.min(start.elapsed());
    }
    WINDOW as f64 / best.as_secs_f64()
}

/// Allocator calls of one acquire + release pair (steady state, same name).
fn allocations_per_pair() {
    let mut engine = engine_with_session();
    let mut effects = Vec::with_capacity(8);
    let n = name(0);
    for i in 0..1000 {
        pair(
            &mut engine,
            &mut effects,
            i,
            acquire(n.clone(), i),
            release(n.clone()),
        );
    }
    let cmds: Vec<(Command, Command)> = (0..1000)
        .map(|i| (acquire(n.clone(), i), release(n.clone())))
        .collect();
    COUNTING.store(true, Relaxed);
    let before = CALLS.load(Relaxed);
    for (i, (acq, rel)) in cmds.into_iter().enumerate() {
        pair(&mut engine, &mut effects, 1000 + i as u64, acq, rel);
    }
    let calls = CALLS.load(Relaxed) - before;
    COUNTING.store(false, Relaxed);
    println!(
        "allocator calls inside the engine per acquire+release pair: {:.1}",
        calls as f64 / 1000.0
    );
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let listing = args.iter().any(|a| a == "--list");
    // `cargo test --benches` runs this binary without `--bench`: keep it quick.
    let quick = !args.iter().any(|a| a == "--bench");

    let mut criterion = Criterion::default().configure_from_args();
    acquire_release(&mut criterion);
    criterion.final_summary();

    if listing {
        return;
    }
    allocations_per_pair();
    let windows = if quick { 2 } else { 200 };
    println!(
        "acquire+release pairs/s, fastest of {windows} windows of 10,000 pairs (goal >= 3 M):"
    );
    for (label, distinct, prebuilt) in [
        ("same name, engine only (commands prebuilt)", false, true),
        ("4096 names, engine only (commands prebuilt)", true, true),
        ("same name, building the commands too", false, false),
        ("4096 names, building the commands too", true, false),
    ] {
        let rate = fastest_window(distinct, prebuilt, windows);
        println!(
            "  {label}: {:.2} M pairs/s ({})",
            rate / 1e6,
            if rate >= 3e6 { "met" } else { "MISSED" }
        );
    }
    println!("acquire+release pairs/s in a session with queued requests (4096 names):");
    for queued in [0, 1_000, 10_000, 100_000] {
        let rate = pairs_with_queue(queued, if quick { 1 } else { 20 });
        println!("  {queued:>7} queued: {rate:.0} pairs/s");
    }
    memory_per_held_lock(if quick { 10_000 } else { 1_000_000 });
    inspection_of_a_big_table(if quick { 10_000 } else { 1_000_000 });
    #[cfg(feature = "serde")]
    encoding_of_a_big_table(if quick { 10_000 } else { 1_000_000 });
    freeze_with_idle_sessions(if quick { 10_000 } else { 100_000 });
}

/// The time to encode a frozen table of `count` held locks as a snapshot or
/// backup is (postcard, off the engine thread; best of 3), printed to
/// stdout. The locks are taken in a scrambled order, as many clients take
/// them, so that the table's order is not the names' (the encoding sorts
/// them by name). With the `serde` feature, which encoding needs.
#[cfg(feature = "serde")]
fn encoding_of_a_big_table(count: usize) {
    let mut engine = engine_with_session();
    let mut effects = Vec::with_capacity(8);
    // A step prime to `count` visits every index once.
    let step = (7919..).find(|s| gcd(*s, count) == 1).expect("a step");
    for i in 0..count {
        let scrambled = (i * step + 13) % count;
        engine
            .apply(
                1,
                acquire(format!("bench/lk/{scrambled}"), i as u64),
                &mut effects,
            )
            .expect("acquire");
        effects.clear();
    }
    let took = (0..3)
        .map(|_| {
            let frozen = engine.freeze();
            let start = Instant::now();
            let bytes = Vec::with_capacity(frozen.encoded_len_hint());
            black_box(postcard::to_extend(&frozen, bytes).expect("encoded").len());
            start.elapsed()
        })
        .min()
        .expect("three runs");
    println!(
        "a frozen table of {count} held locks, taken in a scrambled order, encoded (best of 3): {:.1} ms",
        took.as_secs_f64() * 1e3
    );
}

#[cfg(feature = "serde")]
fn gcd(a: usize, b: usize) -> usize {
    if b == 0 {
        a
    } else {
        gcd(b, a % b)
    }
}

/// The engine-thread cost of `freeze()` with `count` open sessions holding
/// nothing (best of 3 runs), printed to stdout.
fn freeze_with_idle_sessions(count: u64) {
    let mut engine = Engine::new(Limits::default());
    let mut effects = Vec::new();
    for session in 1..=count {
        let open = Command::OpenSession {
            session: SessionId(session),
            ttl: 10_000,
            info: ClientInfo {
                name: format!("worker-{session}"),
                host: "host-0001.example.internal".into(),
            },
        };
        engine.apply(0, open, &mut effects).expect("open session");
        effects.clear();
    }
    let took = (0..3)
        .map(|_| {
            let start = Instant::now();
            let frozen = black_box(engine.freeze());
            let took = start.elapsed();
            drop(frozen);
            took
        })
        .min()
        .expect("three runs");
    println!(
        "freeze() of {count} idle sessions (best of 3): {:.1} ms",
        took.as_secs_f64() * 1e3
    );
}

/// Something of `frozen` to keep the optimizer honest.
fn frozen_len(frozen: &locksmith_core::FrozenEngine) -> usize {
    std::mem::size_of_val(frozen)
}

/// The engine-thread cost of a snapshot's copy and of listings, on a table of
/// `count` held locks (best of 3 runs each), printed to stdout.
fn inspection_of_a_big_table(count: usize) {
    let Filled { engine, .. } = fill(count, false);
    let best = |run: &dyn Fn() -> usize| {
        (0..3)
            .map(|_| {
                let start = Instant::now();
                black_box(run());
                start.elapsed()
            })
            .min()
            .expect("three runs")
    };
    let middle = name(count / 2);
    println!("engine-thread time on a table of {count} held locks (best of 3):");
    for (label, took) in [
        (
            "freeze() (what the engine thread pays for a snapshot)",
            best(&|| {
                let frozen = engine.freeze();
                let took = frozen_len(&frozen);
                drop(frozen);
                took
            }),
        ),
        (
            "freeze().into_snapshot() (the copy, off the engine thread)",
            best(&|| engine.freeze().into_snapshot().locks.len()),
        ),
        ("list(\"\") of every lock", best(&|| engine.list("").len())),
        (
            "list_page(\"\", first 10,000)",
            best(&|| engine.list_page("", "", 10_000).locks.len()),
        ),
        (
            "list_page(\"\", 10,000 from the middle)",
            best(&|| engine.list_page("", &middle, 10_000).locks.len()),
        ),
    ] {
        println!("  {label}: {:.1} ms", took.as_secs_f64() * 1e3);
    }
}
