//! Encoding a frozen state (a Raft snapshot or a backup) where it does not
//! compete with serving.
//!
//! With a table of a million locks, encoding takes a few hundred
//! milliseconds of CPU. On tokio's blocking pool it ran at the priority of
//! the runtime's threads and the core's, and on a busy machine the
//! scheduler shared the CPUs between them (the handoff p99 during a backup
//! was 1.4–2.3× that without, docs/BENCHMARKS.md, "Operations: backup and
//! restore"). So it runs on a thread of its own whose nice value is raised
//! ([`Background`]): the threads that serve win the CPU whenever they want
//! it, the encoding takes what they leave, and a backup's encoding wins it
//! over a Raft snapshot's. Nothing it does delays a heartbeat or a commit:
//! the state is frozen before (the core goes on at once) and nothing is
//! locked while it runs.
//!
//! A lower priority is not enough on its own: when every CPU is busy, a
//! thread that serves and wakes up may still wait for the rest of the
//! background thread's time slice (on the 2-vCPU machine of
//! docs/BENCHMARKS.md, two busy threads at nice +10, or even at
//! `SCHED_IDLE`, took the handoff p99 from 0.8 to 3.6–4.3 ms). So the work
//! also gives way ([`give_way`]): every [`GIVE_WAY_EVERY`] of it, the
//! thread yields its CPU to whatever is waiting for one (two busy threads
//! yielding every 500 µs: 1.0 ms).

use std::cell::Cell;
use std::io;
use std::time::{Duration, Instant};

/// Background work, by how far below serving it runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Background {
    /// A backup, which an operator waits for: nice +10, a share of about
    /// 1/10 of a CPU wanted by a thread that serves (CFS weights 110
    /// against 1024), and all of one nobody else wants.
    Backup,
    /// A Raft snapshot, which nobody waits for (the log it replaces only
    /// grows a little longer meanwhile): nice +19 (weight 15), so that a
    /// backup taken at the same time gets the CPU first. Every member
    /// comes to its snapshot at about the same entry, after a big fill all
    /// of them at once.
    Snapshot,
}

impl Background {
    /// How much the thread's nice value is raised (at most to 19).
    pub(crate) fn nice(self) -> i32 {
        match self {
            Background::Backup => 10,
            Background::Snapshot => 19,
        }
    }

    fn name(self) -> &'static str {
        match self {
            Background::Backup => "backup",
            Background::Snapshot => "snapshot",
        }
    }
}

/// Runs `work` on a thread of its own at `what`'s lower priority, named
/// `locksmith-{what}`; its result, or an error if it panicked or no thread
/// could be started.
///
/// Cancel safety: dropped, the work still finishes on its thread and its
/// result is thrown away.
pub(crate) async fn in_background<T: Send + 'static>(
    what: Background,
    work: impl FnOnce() -> T + Send + 'static,
) -> io::Result<T> {
    let (done, result) = tokio::sync::oneshot::channel();
    let name = what.name();
    std::thread::Builder::new()
        .name(format!("locksmith-{name}"))
        .spawn(move || {
            lower_priority(what.nice());
            let _ = done.send(giving_way(work));
        })?;
    result
        .await
        .map_err(|_| io::Error::other(format!("{name} panicked")))
}

/// How long background work runs before it gives way to threads waiting
/// for a CPU: about what a handoff takes, so that one waits at most that
/// much longer.
pub(crate) const GIVE_WAY_EVERY: Duration = Duration::from_micros(500);

thread_local! {
    /// When this thread last gave way (or started to work).
    static GAVE_WAY: Cell<Option<Instant>> = const { Cell::new(None) };
}

/// Runs `work`, long work on a big table, giving way ([`give_way`]) as it
/// goes (`locksmith_core::pace`).
pub(crate) fn giving_way<R>(work: impl FnOnce() -> R) -> R {
    GAVE_WAY.set(None);
    locksmith_core::pace::pausing(give_way, work)
}

/// Yields the CPU (`sched_yield`) if [`GIVE_WAY_EVERY`] has passed since
/// this thread last did: a thread waiting for this CPU runs now, and the
/// work goes on at once if none is.
fn give_way() {
    let now = Instant::now();
    match GAVE_WAY.get() {
        Some(last) if now.duration_since(last) < GIVE_WAY_EVERY => {}
        Some(_) => {
            std::thread::yield_now();
            GAVE_WAY.set(Some(Instant::now()));
        }
        None => GAVE_WAY.set(Some(now)),
    }
}

/// Raises the calling thread's nice value by `by`. On Linux a
/// nice value belongs to a thread, and `setpriority(PRIO_PROCESS, tid)`
/// sets that thread's alone (sched(7)); the rest of the process keeps its
/// own, and threads it starts afterwards inherit it. Where it cannot
/// (another system, a refusal), the thread runs as before.
pub(crate) fn lower_priority(by: i32) {
    #[cfg(target_os = "linux")]
    // SAFETY: plain system calls on this thread's own id.
    unsafe {
        let tid = libc::gettid() as libc::id_t;
        // getpriority returns the nice value itself (-1 is a valid one);
        // an error is told apart by errno only, and leaves it unchanged.
        *libc::__errno_location() = 0;
        let nice = libc::getpriority(libc::PRIO_PROCESS, tid);
        if *libc::__errno_location() == 0 {
            let lowered = (nice + by).min(19);
            libc::setpriority(libc::PRIO_PROCESS, tid, lowered);
        }
    }
}

/// Raises by `by` the nice value of this process's session group, if this
/// process leads its session; the value it then has, or `None` when it
/// leaves it alone.
///
/// Where Linux groups each session's threads for the scheduler
/// (autogrouping, on by default in most distributions' kernels, sched(7)),
/// the CPUs are first shared between the groups, equally, and a thread's
/// nice value weighs only against the threads of its own group: a command
/// at nice +10 started from an operator's shell still gets half of a CPU
/// that a server started elsewhere wants (measured: two busy loops in two
/// sessions on one CPU, one at nice +10, ran the same time each; with
/// their groups' nice values 0 and 10, 90 % and 10 %). A group's own nice
/// value (`/proc/self/autogroup`) weighs between groups. Only the session's
/// leader changes it: in a session it does not lead (a shell's), the change
/// would reach the shell's other commands and outlive this one. Nothing
/// happens where the kernel has no autogroups (the file is absent).
pub(crate) fn lower_session_priority(by: i32) -> io::Result<Option<i32>> {
    #[cfg(target_os = "linux")]
    {
        // SAFETY: plain system calls about this process.
        let leads_its_session = unsafe { libc::getsid(0) == libc::getpid() };
        if !leads_its_session {
            return Ok(None);
        }
        let path = "/proc/self/autogroup";
        let read = || -> io::Result<Option<i32>> {
            match std::fs::read_to_string(path) {
                Ok(text) => autogroup_nice(&text).map(Some).ok_or_else(|| {
                    io::Error::other(format!(
                        "{path} reads {text:?}, not a group and its nice value"
                    ))
                }),
                Err(error) if error.kind() == io::ErrorKind::NotFound => Ok(None),
                Err(error) => Err(error),
            }
        };
        let Some(nice) = read()? else {
            return Ok(None);
        };
        std::fs::write(path, (nice + by).min(19).to_string())?;
        read()
    }
    #[cfg(not(target_os = "linux"))]
    {
        let _ = by;
        Ok(None)
    }
}

/// The nice value in `/proc/self/autogroup`'s text (`/autogroup-25 nice 0`).
#[cfg(target_os = "linux")]
fn autogroup_nice(text: &str) -> Option<i32> {
    text.trim().rsplit_once(" nice ")?.1.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nice_of_this_thread() -> i32 {
        // SAFETY: plain system calls on this thread's own id.
        unsafe { libc::getpriority(libc::PRIO_PROCESS, libc::gettid() as libc::id_t) }
    }

    #[cfg(target_os = "linux")]
    #[tokio::test]
    async fn the_work_runs_at_a_lower_priority_and_the_caller_keeps_its_own() {
        let before = nice_of_this_thread();
        let (nice, name) = in_background(Background::Backup, || {
            let name = std::thread::current().name().map(str::to_owned);
            (nice_of_this_thread(), name)
        })
        .await
        .unwrap();
        assert_eq!(nice, (before + 10).min(19));
        assert_eq!(name.as_deref(), Some("locksmith-backup"));
        let nice = in_background(Background::Snapshot, nice_of_this_thread)
            .await
            .unwrap();
        assert_eq!(nice, 19);
        assert_eq!(nice_of_this_thread(), before);
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn a_session_group_is_read_from_the_kernels_text() {
        assert_eq!(autogroup_nice("/autogroup-25 nice 0\n"), Some(0));
        assert_eq!(autogroup_nice("/autogroup-7 nice -5"), Some(-5));
        assert_eq!(autogroup_nice("/autogroup-7 nice"), None);
        assert_eq!(autogroup_nice(""), None);
    }

    /// The test runner leads no session of its own (cargo started it), so
    /// its session's group, shared with the shell that ran cargo, is left
    /// as it was.
    #[cfg(target_os = "linux")]
    #[test]
    fn a_session_this_process_does_not_lead_is_left_alone() {
        // SAFETY: plain system calls about this process.
        if unsafe { libc::getsid(0) == libc::getpid() } {
            return;
        }
        let before = std::fs::read_to_string("/proc/self/autogroup").ok();
        assert_eq!(lower_session_priority(10).unwrap(), None);
        assert_eq!(std::fs::read_to_string("/proc/self/autogroup").ok(), before);
    }

    #[tokio::test]
    async fn work_that_panics_is_an_error_not_a_hang() {
        let error = in_background(Background::Snapshot, || -> u32 { panic!("on purpose") })
            .await
            .unwrap_err();
        assert!(error.to_string().contains("snapshot panicked"), "{error}");
    }
}
