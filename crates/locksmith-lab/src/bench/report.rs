//! The report of a run: JSON for machines, Markdown for people, both written
//! from the same [`Report`].

use std::fmt::Write as _;

use serde::Serialize;

use super::cpu::CpuPerOp;
use super::machine::Machine;
use super::scenario::{Contended, Scale, Uncontended};
use super::stats::{fmt_bytes, fmt_rate, fmt_us};
use super::target::Kind;

/// A scenario's result or why it has none.
#[derive(Debug, Clone, Serialize)]
#[serde(untagged)]
pub enum Outcome<T> {
    /// Measured.
    Ok(T),
    /// Could not be measured.
    Failed {
        /// What went wrong.
        error: String,
    },
}

impl<T> Outcome<T> {
    /// The result, if measured.
    pub fn ok(&self) -> Option<&T> {
        match self {
            Outcome::Ok(value) => Some(value),
            Outcome::Failed { .. } => None,
        }
    }

    fn cell(&self, show: impl FnOnce(&T) -> String) -> String {
        match self {
            Outcome::Ok(value) => show(value),
            Outcome::Failed { error } => format!("failed: {}", short(error)),
        }
    }
}

/// What the run was asked to do.
#[derive(Debug, Clone, Serialize)]
pub struct RunSettings {
    /// Length of each timed measurement (ms).
    pub duration_ms: u64,
    /// Session TTL of the clients (ms).
    pub session_ttl_ms: u64,
    /// Client counts of scenario (a).
    pub clients: Vec<usize>,
    /// Waiters of scenario (b).
    pub waiters: usize,
    /// Clients of scenario (c).
    pub fair_clients: usize,
    /// Hold time of scenario (c) (µs).
    pub fair_hold_us: u64,
    /// Clients holding the locks of scenario (d).
    pub scale_clients: usize,
    /// Acquires in flight in scenario (d).
    pub scale_concurrency: usize,
    /// Runs of each timed measurement (the median is reported).
    pub repeat: usize,
    /// Whether this was a `--quick` run.
    pub quick: bool,
    /// Workers of the tokio runtime the clients ran on (tokio's default, a
    /// worker per CPU, unless `TOKIO_WORKER_THREADS` says otherwise): at one
    /// client their wake-ups across workers weigh on every backend's figures
    /// (docs/BENCHMARKS.md, "Idle CPUs, and the bench's clients on one
    /// worker").
    pub client_workers: usize,
    /// The kernel's time slice the bench's threads asked for
    /// (`--client-slice`, µs); `None`: the kernel's default.
    pub client_slice_us: Option<u64>,
}

/// Everything measured for one backend.
#[derive(Debug, Clone, Serialize)]
pub struct BackendReport {
    /// Name in the report.
    pub label: String,
    /// Kind of store.
    pub kind: Kind,
    /// URL (password removed).
    pub url: String,
    /// Server version, when this run started the server.
    pub version: Option<String>,
    /// Whether this run started the server.
    pub spawned: bool,
    /// Settings this run changed from the server's defaults, and why.
    pub tuning: Vec<String>,
    /// (a), one entry per client count.
    pub uncontended: Vec<Outcome<Uncontended>>,
    /// (b).
    pub handoff: Option<Outcome<Contended>>,
    /// (c).
    pub fairness: Option<Outcome<Contended>>,
    /// (d).
    pub scale: Option<Outcome<Scale>>,
    /// (e).
    pub sessions: Option<Outcome<super::sessions::IdleSessions>>,
    /// (f).
    pub backup: Option<Outcome<super::backup::BackupRestore>>,
}

/// A whole run.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    /// The command line.
    pub command: String,
    /// When it started (RFC 3339, UTC).
    pub started: String,
    /// Where it ran.
    pub machine: Machine,
    /// What it was asked to do.
    pub settings: RunSettings,
    /// Label of the backend the ratios compare against (the locksmith server).
    pub reference: Option<String>,
    /// One entry per backend, the reference first.
    pub backends: Vec<BackendReport>,
}

/// How a server started by the bench runs (the locksmith-testkit settings).
fn setup(kind: Kind) -> &'static str {
    match kind {
        Kind::Server => {
            "`locksmith serve`, a Raft group of one: its log synced before each answer (group commit: one `fdatasync` per batch) and snapshots"
        }
        Kind::Memory => "the engine inside the bench's own process: no network, no disk (the ceiling)",
        Kind::Redis => {
            "`redis-server` with `appendonly yes`, `appendfsync always` (every write fsynced before the reply), Redisson-compatible layout"
        }
        Kind::RedisSentinel => {
            "a Redis primary with 2 replicas and 3 Sentinels (each `redis-server` as above), found through the Sentinels"
        }
        Kind::RedisCluster => {
            "a Redis Cluster of 3 primaries with a replica each (each `redis-server` as above), sharded pub/sub"
        }
        Kind::Redlock => "Redlock over 5 independent `redis-server`s (each as above)",
        Kind::ZooKeeper => {
            "standalone ZooKeeper (one JVM, `tickTime=500`, transaction log fsynced), Curator-compatible layout"
        }
        Kind::ZooKeeperEnsemble => {
            "a ZooKeeper ensemble of 3 servers (each as the standalone one), Curator-compatible layout"
        }
        Kind::Etcd => "single-node `etcd` (write-ahead log fsynced), etcd concurrency-package layout",
        Kind::ServerCluster => "a locksmith cluster of 3 members (Raft, each with its own data directory), on loopback",
        Kind::ServerClusterTls => "the same cluster with TLS on every connection (members certified by a CA of their own) and authentication on (a bearer token)",
        Kind::EtcdCluster => "an etcd cluster of 3 members (each as the single node), etcd concurrency-package layout",
        Kind::Postgres => {
            "PostgreSQL (`max_connections=200`, `shared_buffers=32MB`, fsync on); session advisory locks, tokens from a sequence"
        }
    }
}

/// First line of an error, shortened for a table cell.
/// Each member's CPU in (f), alone → during a save, the leader's first:
/// `L1 12 → 48 %, F2 3 → 31 %`.
fn members_cpu(f: &super::backup::BackupRestore) -> String {
    let mut members: Vec<_> = f.member_cpu.iter().collect();
    members.sort_by_key(|m| (m.id != f.leader_id, m.id));
    members
        .iter()
        .map(|m| {
            let role = if m.id == f.leader_id { "L" } else { "F" };
            format!(
                "{role}{} {:.0} → {:.0} %",
                m.id, m.alone_percent, m.during_percent
            )
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// The head of a table with a `backend` column, then `columns`, each
/// right-aligned: its header line and its rule line.
fn table_head(columns: impl IntoIterator<Item = String>) -> String {
    let mut header = String::from("| backend |");
    let mut rule = String::from("|---|");
    for column in columns {
        let _ = write!(header, " {column} |");
        rule.push_str("---:|");
    }
    format!("{header}\n{rule}\n")
}

/// A [`CpuPerOp`] as a cell: the bench's time run / waiting for a CPU,
/// then the store's, in µs.
fn fmt_cpu(cpu: &CpuPerOp) -> String {
    let bench = format!("{:.0} / {:.0}", cpu.bench_run_us, cpu.bench_wait_us);
    match (cpu.store_run_us, cpu.store_wait_us) {
        (Some(run), Some(wait)) => format!("{bench} · {run:.0} / {wait:.0}"),
        _ => format!("{bench} · –"),
    }
}

fn short(error: &str) -> String {
    let line = error.lines().next().unwrap_or("").replace('|', "/");
    if line.chars().count() > 80 {
        format!("{}…", line.chars().take(79).collect::<String>())
    } else {
        line
    }
}

/// `value (1.23×)` against the reference value, when there is one.
fn with_ratio(shown: String, value: f64, reference: Option<f64>) -> String {
    match reference {
        Some(r) if r > 0.0 && value.is_finite() => format!("{shown} ({}×)", fmt_ratio(value / r)),
        _ => shown,
    }
}

/// A ratio as precise as it is worth, so that neither 0.0026 nor 199.97 reads
/// as noise: whole from 100, one decimal from 10, two from 0.1, and two
/// significant digits below: `200`, `17.0`, `1.62`, `0.45`, `0.0026`.
fn fmt_ratio(ratio: f64) -> String {
    if ratio >= 100.0 {
        format!("{ratio:.0}")
    } else if ratio >= 10.0 {
        format!("{ratio:.1}")
    } else if ratio >= 0.1 || ratio <= 0.0 {
        format!("{ratio:.2}")
    } else {
        // Two significant digits below 0.1.
        let decimals = (1 - ratio.log10().floor() as i32).max(2) as usize;
        format!("{ratio:.decimals$}")
    }
}

impl Report {
    fn reference(&self) -> Option<&BackendReport> {
        let label = self.reference.as_ref()?;
        self.backends.iter().find(|b| &b.label == label)
    }

    /// The CPU each measurement of (a) and (b) cost per operation, the
    /// bench's and the store's, run and waited for ([`super::cpu`]).
    fn cpu_table(&self, md: &mut String) {
        let s = &self.settings;
        let has_cpu = |b: &BackendReport| {
            b.uncontended
                .iter()
                .any(|o| o.ok().is_some_and(|u| u.cpu.is_some()))
                || b.handoff
                    .as_ref()
                    .and_then(Outcome::ok)
                    .is_some_and(|h| h.cpu.is_some())
        };
        if !self.backends.iter().any(has_cpu) {
            return;
        }
        let _ = writeln!(
            md,
            "\n### CPU per operation: run, and waiting for a CPU\n\n\
             µs per pair of (a) and per grant of (b), from the kernel's scheduler \
             statistics: this bench's process (its clients) `run / waiting`, then \
             the store's processes, summed, when this run started them. Waiting = \
             ready to run while another thread held the CPU; on a machine the bench \
             shares with the servers it measures, part of every latency above.\n"
        );
        let columns = s.clients.iter().map(|c| format!("C={c} pair"));
        md.push_str(&table_head(columns.chain(["handoff".to_owned()])));
        for b in self.backends.iter().filter(|b| has_cpu(b)) {
            let mut row = format!("| {} |", b.label);
            for i in 0..s.clients.len() {
                let cell = b
                    .uncontended
                    .get(i)
                    .and_then(Outcome::ok)
                    .and_then(|u| u.cpu.as_ref())
                    .map_or_else(|| "–".to_owned(), fmt_cpu);
                let _ = write!(row, " {cell} |");
            }
            let handoff = b
                .handoff
                .as_ref()
                .and_then(Outcome::ok)
                .and_then(|h| h.cpu.as_ref())
                .map_or_else(|| "–".to_owned(), fmt_cpu);
            let _ = writeln!(row, " {handoff} |");
            md.push_str(&row);
        }
    }

    /// The report as Markdown: the settings, then one table per scenario, each
    /// backend a row, ratios against the locksmith server in parentheses.
    pub fn markdown(&self, charts: &[(&str, &str)]) -> String {
        let mut md = String::new();
        let s = &self.settings;
        let reference = self.reference();
        let _ = writeln!(md, "Command: `{}`  ", self.command);
        let _ = writeln!(md, "Started: {}  ", self.started);
        let _ = writeln!(md, "Machine: {}  ", self.machine.line());
        let versions: Vec<String> = self
            .backends
            .iter()
            .map(|b| match &b.version {
                Some(v) => format!("{} = {v}", b.label),
                None if b.kind == Kind::Memory => format!("{} = in-process", b.label),
                None => format!("{} = {} (not started by this run)", b.label, b.url),
            })
            .collect();
        let _ = writeln!(md, "Backends: {}  ", versions.join(", "));
        let setups: Vec<String> = self
            .backends
            .iter()
            .filter(|b| b.spawned || b.kind == Kind::Memory)
            .map(|b| {
                let mut line = format!("- {}: {}", b.label, setup(b.kind));
                for change in &b.tuning {
                    let _ = write!(line, "; {change}");
                }
                line
            })
            .collect();
        if !setups.is_empty() {
            let _ = writeln!(
                md,
                "\nEvery server runs on loopback, started by the bench, durable as in production:\n\n{}",
                setups.join("\n")
            );
        }
        let _ = writeln!(
            md,
            "\nEach timed measurement runs {} ms{}; session TTL {} ms; the clients on a runtime of {} \
             worker{}{}{}.",
            s.duration_ms,
            if s.repeat > 1 {
                format!(
                    ", in {} rounds (each round measures every backend in turn): the tables show each \
                     backend's median round (every round's rate is in report.json)",
                    s.repeat
                )
            } else {
                String::new()
            },
            s.session_ttl_ms,
            s.client_workers,
            if s.client_workers == 1 { "" } else { "s" },
            s.client_slice_us
                .map(|us| format!(", its threads on a scheduler slice of {us} µs"))
                .unwrap_or_default(),
            if s.quick {
                "; **quick mode** (small counts, short runs: figures are indicative only)"
            } else {
                ""
            }
        );
        match reference {
            Some(r) => {
                let _ = writeln!(
                    md,
                    "\nRatios in parentheses are against `{}` (the locksmith server): above 1 means \
                     more of it (for rates, better; for latencies and memory, worse).",
                    r.label
                );
            }
            None => {
                let _ = writeln!(md, "\nNo locksmith server in this run, so no ratios.");
            }
        }

        // (a)
        if self.backends.iter().any(|b| !b.uncontended.is_empty()) {
            let _ = writeln!(
                md,
                "\n### (a) Uncontended: acquire + release pairs per second\n\n\
             C clients, each its own connection, each looping on a lock of its own.\n"
            );
            let columns = s.clients.iter().map(|c| format!("C={c} pairs/s"));
            let latency = "p50 / p99 pair latency (C=1)".to_owned();
            md.push_str(&table_head(columns.chain([latency])));
            for b in &self.backends {
                let mut row = format!("| {} |", b.label);
                for (i, outcome) in b.uncontended.iter().enumerate() {
                    let base = reference
                        .and_then(|r| r.uncontended.get(i))
                        .and_then(Outcome::ok)
                        .map(|u| u.pairs_per_sec);
                    let _ = write!(
                        row,
                        " {} |",
                        outcome.cell(|u| with_ratio(
                            fmt_rate(u.pairs_per_sec),
                            u.pairs_per_sec,
                            base
                        ))
                    );
                }
                for _ in b.uncontended.len()..s.clients.len() {
                    row.push_str(" – |");
                }
                let latency = b
                    .uncontended
                    .first()
                    .map(|o| {
                        o.cell(|u| {
                            format!(
                                "{} / {}",
                                fmt_us(u.latency.p50_us),
                                fmt_us(u.latency.p99_us)
                            )
                        })
                    })
                    .unwrap_or_else(|| "–".into());
                let _ = writeln!(row, " {latency} |");
                md.push_str(&row);
            }
        }
        // (b)
        if self.backends.iter().any(|b| b.handoff.is_some()) {
            let _ = writeln!(
            md,
            "\n### (b) Contended handoff: {} waiters on one lock, no hold time\n\n\
             Handoff = from the moment the holder calls release to the moment the next \
             holder's acquire returns (both in this process).\n\n\
             | backend | transfers/s | handoff p50 | handoff p99 | handoff max | regranted to the releaser |\n\
             |---|---:|---:|---:|---:|---:|",
            s.waiters
        );
            for b in &self.backends {
                let Some(outcome) = &b.handoff else { continue };
                let base = reference.and_then(|r| r.handoff.as_ref()?.ok().cloned());
                let row = match outcome {
                    Outcome::Ok(h) => format!(
                        "| {} | {} | {} | {} | {} | {:.0} % |",
                        b.label,
                        with_ratio(
                            fmt_rate(h.grants_per_sec),
                            h.grants_per_sec,
                            base.as_ref().map(|r| r.grants_per_sec)
                        ),
                        with_ratio(
                            fmt_us(h.handoff.p50_us),
                            h.handoff.p50_us,
                            base.as_ref().map(|r| r.handoff.p50_us)
                        ),
                        with_ratio(
                            fmt_us(h.handoff.p99_us),
                            h.handoff.p99_us,
                            base.as_ref().map(|r| r.handoff.p99_us)
                        ),
                        fmt_us(h.handoff.max_us),
                        h.self_regrant_ratio * 100.0
                    ),
                    Outcome::Failed { error } => {
                        format!("| {} | failed: {} | | | | |", b.label, short(error))
                    }
                };
                let _ = writeln!(md, "{row}");
            }
        }
        self.cpu_table(&mut md);
        // (c)
        if self.backends.iter().any(|b| b.fairness.is_some()) {
            let _ = writeln!(
            md,
            "\n### (c) Fairness: {} clients on one lock, each holding it {}\n\n\
             Wait = from the acquire call to its return. Jain's index of grants per client: \
             1.00 = every client got the same share, 1/n = one client got everything.\n\n\
             | backend | grants/s | wait p50 | wait p99 | wait max | Jain's index | grants per client (min–max) |\n\
             |---|---:|---:|---:|---:|---:|---:|",
            s.fair_clients,
            fmt_us(s.fair_hold_us as f64)
        );
            for b in &self.backends {
                let Some(outcome) = &b.fairness else { continue };
                let base = reference.and_then(|r| r.fairness.as_ref()?.ok().cloned());
                let row = match outcome {
                    Outcome::Ok(f) => format!(
                        "| {} | {} | {} | {} | {} | {:.3} | {}–{} |",
                        b.label,
                        with_ratio(
                            fmt_rate(f.grants_per_sec),
                            f.grants_per_sec,
                            base.as_ref().map(|r| r.grants_per_sec)
                        ),
                        fmt_us(f.wait.p50_us),
                        with_ratio(
                            fmt_us(f.wait.p99_us),
                            f.wait.p99_us,
                            base.as_ref().map(|r| r.wait.p99_us)
                        ),
                        fmt_us(f.wait.max_us),
                        f.jain,
                        f.per_client.iter().min().unwrap_or(&0),
                        f.per_client.iter().max().unwrap_or(&0),
                    ),
                    Outcome::Failed { error } => {
                        format!("| {} | failed: {} | | | | | |", b.label, short(error))
                    }
                };
                let _ = writeln!(md, "{row}");
            }
        }
        // (d)
        if self.backends.iter().any(|b| b.scale.is_some()) {
            let _ = writeln!(
            md,
            "\n### (d) Scale: many locks held at once\n\n\
             {} clients (each its own connection and session) hold the locks between them; \
             acquires run {} at a time in all. Memory is the server's (the PSS of its process \
             tree, so PostgreSQL's shared memory counts once) with every lock held, and its \
             growth per lock over a baseline read with the clients connected; known only for \
             servers this run started (not for `memory://`, which shares the bench's process).\n\n\
             | backend | locks | time to hold all | acquires/s | release all | memory held | per lock |\n\
             |---|---:|---:|---:|---:|---:|---:|",
            s.scale_clients,
            s.scale_concurrency
        );
            for b in &self.backends {
                let Some(outcome) = &b.scale else { continue };
                let base = reference.and_then(|r| r.scale.as_ref()?.ok().cloned());
                let row = match outcome {
                    Outcome::Ok(d) => format!(
                        "| {} | {}{} | {} | {} | {} | {} | {} |",
                        b.label,
                        fmt_rate(d.locks as f64),
                        if d.lost_at_peak > 0 || d.release_errors > 0 {
                            format!(
                                " ({} already lost when the memory was read, {} lost before their release)",
                                fmt_rate(d.lost_at_peak as f64),
                                fmt_rate(d.release_errors as f64)
                            )
                        } else {
                            String::new()
                        },
                        fmt_us(d.hold_secs * 1e6),
                        with_ratio(
                            fmt_rate(d.holds_per_sec),
                            d.holds_per_sec,
                            base.as_ref().map(|r| r.holds_per_sec)
                        ),
                        fmt_us(d.release_secs * 1e6),
                        d.memory_held.map_or("n/a".into(), |m| fmt_bytes(m as f64)),
                        match d.bytes_per_lock {
                            Some(per) => with_ratio(
                                format!("{per:.0} B"),
                                per,
                                base.as_ref().and_then(|r| r.bytes_per_lock)
                            ),
                            None => "n/a".into(),
                        },
                    ),
                    Outcome::Failed { error } => {
                        format!("| {} | failed: {} | | | | | |", b.label, short(error))
                    }
                };
                let _ = writeln!(md, "{row}");
            }
        }
        // (e)
        if self.backends.iter().any(|b| b.sessions.is_some()) {
            let _ = writeln!(
                md,
                "\n### (e) Idle sessions beside a handoff loop\n\n\
                 Sessions kept alive and doing nothing else, each renewed every third of its \
                 TTL as the store's own clients do (a locksmith session on a channel of its \
                 connection's `Sessions` stream to the leader, or on a session stream of its \
                 own with `--stream-per-session`; an etcd lease on a keep-alive stream; a ZooKeeper session whose client pings by \
                 itself and is not timed; a Redis hold under a watchdog script). CPU is each \
                 member's with the sessions alone (% of one core), memory each member's PSS \
                 before / with them, and the growth of the most grown member per session; the \
                 renewals are timed with the sessions alone and beside the handoff loop.\n\n\
                 | backend | sessions | renewals/s | renewal p50 / p99 | members' CPU | \
                 members' memory before → with | per session | handoff p50 alone / beside |\n\
                 |---|---:|---:|---|---|---|---:|---|"
            );
            for b in &self.backends {
                let Some(outcome) = &b.sessions else { continue };
                let row = match outcome {
                    Outcome::Ok(e) => format!(
                        "| {} | {} × {} ({} a connection, TTL {} ms{}) | {:.0} | {} | {} | {} | {:.0} B | {} / {} |",
                        b.label,
                        e.sessions,
                        e.session_kind,
                        e.per_connection,
                        e.ttl_ms,
                        if e.renewals_spread { ", renewals spread" } else { "" },
                        e.heartbeats_per_sec,
                        e.heartbeat.map_or("not timed".into(), |h| format!(
                            "{} / {}",
                            fmt_us(h.p50_us),
                            fmt_us(h.p99_us)
                        )),
                        e.member_cpu_percent
                            .iter()
                            .map(|c| format!("{c:.1} %"))
                            .collect::<Vec<_>>()
                            .join(", "),
                        e.member_memory_before
                            .iter()
                            .zip(&e.member_memory_with)
                            .map(|(b, w)| format!("{} → {}", fmt_bytes(*b as f64), fmt_bytes(*w as f64)))
                            .collect::<Vec<_>>()
                            .join(", "),
                        e.bytes_per_session,
                        fmt_us(e.handoff_p50_alone_us),
                        fmt_us(e.handoff_p50_beside_us),
                    ),
                    Outcome::Failed { error } => {
                        format!("| {} | failed: {} | | | | | | |", b.label, short(error))
                    }
                };
                let _ = writeln!(md, "{row}");
            }
        }
        // (f)
        if self.backends.iter().any(|b| b.backup.is_some()) {
            let _ = writeln!(
                md,
                "\n### (f) Backup and restore of many held locks\n\n\
                 `locksmith snapshot save` (from the member it chooses: a caught-up \
                 follower, or the leader of a group of one) while the handoff loop of (b) runs \
                 (each save's wall time, process start to exit, and the member it came from: \
                 L the leader, F a follower), the handoff latency of the grants during the \
                 saves and in the windows without, and each member's CPU in both (% of a core, \
                 alone → during; the leader's first); on a cluster, a new member joining \
                 (the leader sends it the state): the time until it is caught up and the \
                 handoff latency meanwhile; then `locksmith snapshot restore` into a \
                 new cluster of as many members (the slowest member's) and the time from \
                 starting it to its first grant.\n\n\
                 | backend | locks held (sessions) | save (from) | file | handoff p50 / p99 \
                 alone | handoff p50 / p99 during a save | a member joins: caught up in, \
                 handoff p50 / p99 | members' CPU | restore | start → first grant | data on |\n\
                 |---|---:|---|---:|---|---|---|---|---:|---:|---|"
            );
            for b in &self.backends {
                let Some(outcome) = &b.backup else { continue };
                let row = match outcome {
                    Outcome::Ok(f) => format!(
                        "| {} | {} ({}) | {} | {} | {} / {} | {} / {} | {} | {} | {:.2} s | {:.2} s | {} |",
                        b.label,
                        f.backup_locks,
                        f.backup_sessions,
                        f.saves_secs
                            .iter()
                            .zip(&f.saved_from)
                            .map(|(s, (id, led))| {
                                format!("{s:.2} s ({}{id})", if *led { "L" } else { "F" })
                            })
                            .collect::<Vec<_>>()
                            .join(", "),
                        fmt_bytes(f.file_bytes as f64),
                        fmt_us(f.handoff_alone.p50_us),
                        fmt_us(f.handoff_alone.p99_us),
                        fmt_us(f.handoff_during.p50_us),
                        fmt_us(f.handoff_during.p99_us),
                        f.join.as_ref().map_or("-".into(), |join| format!(
                            "{:.2} s, {} / {}",
                            join.secs,
                            fmt_us(join.handoff.p50_us),
                            fmt_us(join.handoff.p99_us)
                        )),
                        members_cpu(f),
                        f.restore_secs,
                        f.serve_secs,
                        f.data_on,
                    ),
                    Outcome::Failed { error } => {
                        format!("| {} | failed: {} | | | | | | | | | |", b.label, short(error))
                    }
                };
                let _ = writeln!(md, "{row}");
            }
        }
        if !charts.is_empty() {
            md.push_str("\n### Charts\n\n");
            for (file, title) in charts {
                let _ = writeln!(md, "![{title}]({file})\n");
            }
        }
        md
    }
}

pub use locksmith::redact;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_table_head_has_a_backend_column_then_right_aligned_ones() {
        assert_eq!(
            table_head(["C=1 pair".to_owned(), "handoff".to_owned()]),
            "| backend | C=1 pair | handoff |\n|---|---:|---:|\n"
        );
    }

    #[test]
    fn ratios_keep_two_significant_digits() {
        assert_eq!(fmt_ratio(199.97), "200");
        assert_eq!(fmt_ratio(16.98), "17.0");
        assert_eq!(fmt_ratio(1.0), "1.00");
        assert_eq!(fmt_ratio(0.45), "0.45");
        assert_eq!(fmt_ratio(0.06), "0.060");
        assert_eq!(fmt_ratio(0.0026), "0.0026");
    }
}
