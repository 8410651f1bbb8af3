//! `locksmith status` and `locksmith release --force`.
//!
//! `status` prints the locks under a prefix as a table, or with `--json` as
//! one JSON document (with `--watch`, one per line, every interval):
//!
//! ```json
//! {
//!   "backend": "server",
//!   "prefix": "jobs/",
//!   "at": "2026-01-02T03:04:05.678Z",
//!   "locks": [{
//!     "name": "jobs/report",
//!     "holders": [{"owner": "w1", "lock_by": "cron@host-a", "mode": "exclusive",
//!                  "hold_count": 1, "fencing_token": 42,
//!                  "lock_time": "2026-01-02T03:04:00.000Z",
//!                  "lease_expires": "2026-01-02T03:04:20.000Z", "lease_left_ms": 14322}],
//!     "waiters": [{"owner": "w2", "mode": "exclusive", "since": "2026-01-02T03:04:03.000Z"}]
//!   }],
//!   "history": [{"name": "jobs/report", "fencing_token": 41, "owner": "w0",
//!                "lock_by": "cron@host-b", "mode": "exclusive",
//!                "granted_at": "2026-01-02T02:59:00.000Z", "waited_ms": 0,
//!                "end": "released", "ended_at": "2026-01-02T03:03:59.000Z",
//!                "lost_reason": null}]
//! }
//! ```
//!
//! Times are RFC 3339 in UTC; a field the store does not record is `null`;
//! `mode` is `exclusive`, `shared` or `semaphore(N)`; `history` (only with
//! `--history`) lists the recent grants the locksmith server remembers, by
//! name and oldest first, with `end` one of `held`, `released`, `lost`.

use std::borrow::Cow;
use std::io::{IsTerminal, Write};
use std::process::ExitCode;
use std::time::{Duration, SystemTime};

use comfy_table::{presets::ASCII_NO_BORDERS, Table};
use locksmith::{Client, GrantRecord, HoldEnd, LockInfo};
use serde::Serialize;

use crate::common::{fail, parse_duration, BackendArgs, Termination};

/// Options of `locksmith status`.
#[derive(Debug, clap::Args)]
pub struct StatusArgs {
    /// Only locks whose name starts with this.
    #[arg(default_value = "")]
    prefix: String,
    /// Print JSON instead of a table (the fields are in `locksmith status --help`
    /// and the README).
    #[arg(long)]
    json: bool,
    /// Print again every INTERVAL (default 2s) until interrupted; with
    /// --json, one document per line.
    #[arg(
        long,
        value_name = "INTERVAL",
        num_args = 0..=1,
        default_missing_value = "2s",
        value_parser = parse_duration
    )]
    watch: Option<Duration>,
    /// Also show the recent grants of each lock: who held it, with which
    /// token, and how it ended (kept by the locksmith server).
    #[arg(long)]
    history: bool,
    #[command(flatten)]
    backend: BackendArgs,
}

/// Options of `locksmith release`.
#[derive(Debug, clap::Args)]
pub struct ReleaseArgs {
    /// Lock name.
    name: String,
    /// Confirm that the lock is to be taken away from whoever holds it.
    #[arg(long)]
    force: bool,
    #[command(flatten)]
    backend: BackendArgs,
}

/// Prints the locks under a prefix, once or every `--watch` interval.
///
/// Cancel safety: safe, read-only (SIGINT/SIGTERM end a `--watch` between
/// two prints).
pub async fn status(args: StatusArgs) -> ExitCode {
    let mut termination = Termination::listen();
    let client = match args.backend.connect("status").await {
        Ok(client) => client,
        Err(code) => return code,
    };
    let Some(interval) = args.watch else {
        return match print_once(&client, &args, false).await {
            Ok(()) => ExitCode::SUCCESS,
            Err(error) => fail(&error),
        };
    };
    loop {
        if let Err(error) = print_once(&client, &args, true).await {
            eprintln!("locksmith: {error}");
        }
        tokio::select! {
            _ = tokio::time::sleep(interval) => {}
            _ = termination.recv() => return ExitCode::SUCCESS,
        }
    }
}

/// One look at the locks (and their history), printed as `args` asks.
///
/// Cancel safety: safe, read-only; it prints only after its last await.
async fn print_once(client: &Client, args: &StatusArgs, watching: bool) -> locksmith::Result<()> {
    let locks = client.list(&args.prefix).await?;
    let history = if args.history {
        Some(client.history(&args.prefix).await?)
    } else {
        None
    };
    let now = SystemTime::now();
    let mut out = std::io::stdout().lock();
    let written = if args.json {
        let report = Report::new(
            client.backend().name(),
            &args.prefix,
            now,
            &locks,
            history.as_deref(),
        );
        let text = if watching {
            serde_json::to_string(&report)
        } else {
            serde_json::to_string_pretty(&report)
        }
        .expect("a report always serializes");
        writeln!(out, "{text}")
    } else {
        if watching && std::io::stdout().is_terminal() {
            // Home the cursor and clear the screen: a refreshing view.
            let _ = write!(out, "\x1b[H\x1b[2J");
        }
        let mut text = render(&locks, now).to_string();
        if let Some(history) = &history {
            text.push_str("\n\nRECENT GRANTS\n");
            text.push_str(&render_history(history).to_string());
        }
        if watching {
            text.push('\n');
        }
        writeln!(out, "{text}")
    };
    // A closed stdout (`| head`) ends the output, not the program with a panic.
    let _ = written.and_then(|()| out.flush());
    Ok(())
}

/// Force-releases a lock.
///
/// Cancel safety: a dropped call may or may not have released the lock.
pub async fn release(args: ReleaseArgs) -> ExitCode {
    if !args.force {
        eprintln!(
            "locksmith: release takes a lock away from its holder; pass --force to confirm \
             (holders release their own locks by ending `locksmith run`/`hold`)"
        );
        return ExitCode::from(2);
    }
    let client = match args.backend.connect("release").await {
        Ok(client) => client,
        Err(code) => return code,
    };
    match client.force_release(&args.name).await {
        Ok(()) => {
            eprintln!("locksmith: released {}", args.name);
            ExitCode::SUCCESS
        }
        Err(error) => fail(&error),
    }
}

/// `text` as it may reach a terminal: what is not printable (control
/// characters, escape sequences, line breaks, bidirectional overrides,
/// zero-width characters) is written as a Rust escape (`\u{1b}`, `\n`), and
/// a backslash as `\\`, so a lock name, owner or client label can neither
/// drive the operator's terminal nor forge rows of the table, and two
/// different names never print the same.
pub fn printable(text: &str) -> Cow<'_, str> {
    // `escape_debug` leaves exactly the printable characters alone, except
    // quotes, which need no escape here.
    let plain = |c: char| matches!(c, '"' | '\'') || c.escape_debug().len() == 1;
    if text.chars().all(plain) {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        if plain(c) {
            out.push(c);
        } else {
            out.extend(c.escape_debug());
        }
    }
    Cow::Owned(out)
}

/// One row per holder (and one for a lock with only waiters).
pub fn render(locks: &[LockInfo], now: SystemTime) -> Table {
    let mut table = Table::new();
    table.load_style(ASCII_NO_BORDERS).set_header([
        "NAME",
        "MODE",
        "OWNER",
        "LOCK BY",
        "LOCKED AT",
        "TOKEN",
        "LEASE LEFT",
        "WAITERS",
    ]);
    let seconds = |d: Duration| format!("{:.1}s", d.as_secs_f64());
    for lock in locks {
        let waiters = lock.waiters.len().to_string();
        if lock.holders.is_empty() {
            table.add_row([
                &*printable(&lock.name),
                "-",
                "-",
                "-",
                "-",
                "-",
                "-",
                waiters.as_str(),
            ]);
        }
        for holder in &lock.holders {
            let mode = match holder.hold_count {
                1 => holder.mode.to_string(),
                n => format!("{} x{n}", holder.mode),
            };
            table.add_row([
                printable(&lock.name).into_owned(),
                mode,
                printable(&holder.owner).into_owned(),
                holder
                    .lock_by
                    .as_deref()
                    .map_or_else(|| "-".into(), |by| printable(by).into_owned()),
                holder
                    .lock_time
                    .map(|t| humantime::format_rfc3339_seconds(t).to_string())
                    .unwrap_or_else(|| "-".into()),
                holder
                    .fencing_token
                    .map(|t| t.to_string())
                    .unwrap_or_else(|| "-".into()),
                holder
                    .lease_expires
                    .map(|at| seconds(at.duration_since(now).unwrap_or_default()))
                    .unwrap_or_else(|| "-".into()),
                waiters.clone(),
            ]);
        }
    }
    table
}

fn time(at: SystemTime) -> String {
    humantime::format_rfc3339_millis(at).to_string()
}

/// One row per recent grant.
fn render_history(grants: &[GrantRecord]) -> Table {
    let mut table = Table::new();
    table.load_style(ASCII_NO_BORDERS).set_header([
        "NAME",
        "TOKEN",
        "OWNER",
        "LOCK BY",
        "MODE",
        "GRANTED AT",
        "WAITED",
        "ENDED",
    ]);
    for g in grants {
        let ended = match &g.end {
            HoldEnd::Held => "held".to_owned(),
            HoldEnd::Released { at } => {
                format!("released {}", humantime::format_rfc3339_seconds(*at))
            }
            HoldEnd::Lost { at, reason } => {
                format!("lost ({reason}) {}", humantime::format_rfc3339_seconds(*at))
            }
        };
        table.add_row([
            printable(&g.name).into_owned(),
            g.fencing_token.to_string(),
            printable(&g.owner).into_owned(),
            g.lock_by
                .as_deref()
                .map_or_else(|| "-".into(), |by| printable(by).into_owned()),
            g.mode.to_string(),
            humantime::format_rfc3339_seconds(g.granted_at).to_string(),
            format!("{:.1}s", g.waited.as_secs_f64()),
            ended,
        ]);
    }
    table
}

/// `status --json`: see the module docs.
#[derive(Debug, Serialize)]
struct Report<'a> {
    backend: &'a str,
    prefix: &'a str,
    at: String,
    locks: Vec<LockJson<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    history: Option<Vec<GrantJson<'a>>>,
}

#[derive(Debug, Serialize)]
struct LockJson<'a> {
    name: &'a str,
    holders: Vec<HolderJson<'a>>,
    waiters: Vec<WaiterJson<'a>>,
}

#[derive(Debug, Serialize)]
struct HolderJson<'a> {
    owner: &'a str,
    lock_by: Option<&'a str>,
    mode: String,
    hold_count: u32,
    fencing_token: Option<u64>,
    lock_time: Option<String>,
    lease_expires: Option<String>,
    lease_left_ms: Option<u64>,
}

#[derive(Debug, Serialize)]
struct WaiterJson<'a> {
    owner: &'a str,
    mode: String,
    since: Option<String>,
}

#[derive(Debug, Serialize)]
struct GrantJson<'a> {
    name: &'a str,
    fencing_token: u64,
    owner: &'a str,
    lock_by: Option<&'a str>,
    mode: String,
    granted_at: String,
    waited_ms: u64,
    end: &'static str,
    ended_at: Option<String>,
    lost_reason: Option<&'a str>,
}

impl<'a> Report<'a> {
    fn new(
        backend: &'a str,
        prefix: &'a str,
        now: SystemTime,
        locks: &'a [LockInfo],
        history: Option<&'a [GrantRecord]>,
    ) -> Report<'a> {
        let locks = locks
            .iter()
            .map(|lock| LockJson {
                name: &lock.name,
                holders: lock
                    .holders
                    .iter()
                    .map(|h| HolderJson {
                        owner: &h.owner,
                        lock_by: h.lock_by.as_deref(),
                        mode: h.mode.to_string(),
                        hold_count: h.hold_count,
                        fencing_token: h.fencing_token,
                        lock_time: h.lock_time.map(time),
                        lease_expires: h.lease_expires.map(time),
                        lease_left_ms: h.lease_expires.map(|at| {
                            at.duration_since(now).unwrap_or_default().as_millis() as u64
                        }),
                    })
                    .collect(),
                waiters: lock
                    .waiters
                    .iter()
                    .map(|w| WaiterJson {
                        owner: &w.owner,
                        mode: w.mode.to_string(),
                        since: w.since.map(time),
                    })
                    .collect(),
            })
            .collect();
        let history = history.map(|grants| {
            grants
                .iter()
                .map(|g| {
                    let (end, ended_at, lost_reason) = match &g.end {
                        HoldEnd::Held => ("held", None, None),
                        HoldEnd::Released { at } => ("released", Some(time(*at)), None),
                        HoldEnd::Lost { at, reason } => {
                            ("lost", Some(time(*at)), Some(reason.as_str()))
                        }
                    };
                    GrantJson {
                        name: &g.name,
                        fencing_token: g.fencing_token,
                        owner: &g.owner,
                        lock_by: g.lock_by.as_deref(),
                        mode: g.mode.to_string(),
                        granted_at: time(g.granted_at),
                        waited_ms: g.waited.as_millis() as u64,
                        end,
                        ended_at,
                        lost_reason,
                    }
                })
                .collect()
        });
        Report {
            backend,
            prefix,
            at: time(now),
            locks,
            history,
        }
    }
}
