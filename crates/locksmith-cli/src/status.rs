//! `locksmith status` and `locksmith release --force`.

use std::borrow::Cow;
use std::process::ExitCode;
use std::time::{Duration, SystemTime};

use comfy_table::{presets::ASCII_NO_BORDERS, Table};
use locksmith::LockInfo;

use crate::common::{fail, BackendArgs};

/// Options of `locksmith status`.
#[derive(Debug, clap::Args)]
pub struct StatusArgs {
    /// Only locks whose name starts with this.
    #[arg(default_value = "")]
    prefix: String,
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

/// Prints a table of locks under a prefix.
pub async fn status(args: StatusArgs) -> ExitCode {
    let client = match args.backend.connect("status").await {
        Ok(client) => client,
        Err(code) => return code,
    };
    match client.list(&args.prefix).await {
        Ok(locks) => {
            println!("{}", render(&locks, SystemTime::now()));
            ExitCode::SUCCESS
        }
        Err(error) => fail(&error),
    }
}

/// Force-releases a lock.
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
pub(crate) fn printable(text: &str) -> Cow<'_, str> {
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
fn render(locks: &[LockInfo], now: SystemTime) -> Table {
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

#[cfg(test)]
mod tests {
    use super::*;
    use locksmith::{Holder, Mode, Waiter};

    #[test]
    fn renders_holders_and_waiters() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000);
        let locks = [LockInfo {
            name: "jobs/report".into(),
            holders: vec![Holder {
                owner: "w1".into(),
                lock_by: Some("cron@host-a".into()),
                lock_time: Some(now - Duration::from_secs(5)),
                fencing_token: Some(42),
                lease_expires: Some(now + Duration::from_millis(2500)),
                mode: Mode::Exclusive,
                hold_count: 2,
            }],
            waiters: vec![Waiter {
                owner: "w2".into(),
                mode: Mode::Exclusive,
                since: None,
            }],
        }];
        let text = render(&locks, now).to_string();
        for expected in [
            "jobs/report",
            "exclusive x2",
            "w1",
            "cron@host-a",
            "42",
            "2.5s",
            "1970-01-12T13:46:35Z",
        ] {
            assert!(text.contains(expected), "{expected} missing from\n{text}");
        }
    }

    #[test]
    fn escapes_what_is_not_printable() {
        assert!(matches!(printable("orders/42 ünï ключ"), Cow::Borrowed(_)));
        for (raw, shown) in [
            ("a\u{1b}[2Jb", "a\\u{1b}[2Jb"),
            ("row\nforged", "row\\nforged"),
            ("cr\rtab\t", "cr\\rtab\\t"),
            ("rtl\u{202e}txt", "rtl\\u{202e}txt"),
            ("zero\u{200b}width", "zero\\u{200b}width"),
            ("bell\u{7}del\u{7f}", "bell\\u{7}del\\u{7f}"),
            ("c1\u{9b}31m", "c1\\u{9b}31m"),
            // A backslash is doubled, so "\\n" typed in a name cannot pass
            // for an escaped line break.
            ("back\\nslash", "back\\\\nslash"),
            ("quotes \"'", "quotes \"'"),
        ] {
            assert_eq!(printable(raw), shown, "{raw:?}");
        }
    }
}
