//! The kernel's time slice for the bench's own threads (`bench
//! --client-slice`).
//!
//! Linux's EEVDF scheduler (6.6 and later) lets a thread that wakes run at
//! once only when its deadline comes before that of the thread running on
//! its CPU; with equal slices a woken client often waits for the server
//! thread it shares a CPU with to finish its turn. Since 6.12 a normal
//! thread can ask for a slice of its own (`sched_setattr` with
//! `sched_runtime`, 100 µs to 100 ms): a short one makes its deadlines
//! early, so that it preempts on waking. On a machine the bench shares with
//! the servers it measures, that takes the client's own wait out of the
//! latencies it reports (docs/BENCHMARKS.md, "CPU per operation in the
//! bench's report"). Earlier kernels ignore the request.
//!
//! Neither libc nor nix wraps `sched_setattr`: the system call is made here.

use std::io;
use std::time::Duration;

/// `struct sched_attr` of `sched_setattr(2)` (its first version, 56 bytes).
#[repr(C)]
struct SchedAttr {
    size: u32,
    policy: u32,
    flags: u64,
    nice: i32,
    priority: u32,
    runtime: u64,
    deadline: u64,
    period: u64,
    util_min: u32,
    util_max: u32,
}

/// Children start with the default slice: the stores the bench starts are
/// measured as they run anywhere else. (Threads too: each of the bench's
/// threads sets its own, see `main`.)
const SCHED_FLAG_RESET_ON_FORK: u64 = 0x01;

/// The slices the kernel grants a normal thread (it clamps others into it).
pub const SLICES: std::ops::RangeInclusive<Duration> =
    Duration::from_micros(100)..=Duration::from_millis(100);

/// Parses `--client-slice`: a duration within [`SLICES`], refused outside
/// it rather than clamped (0 would ask for the default, silently).
pub fn parse_slice(text: &str) -> Result<Duration, String> {
    let slice = crate::parse_duration(text)?;
    if SLICES.contains(&slice) {
        Ok(slice)
    } else {
        Err(format!(
            "{text} is outside the slices the kernel grants ({:?} to {:?})",
            SLICES.start(),
            SLICES.end()
        ))
    }
}

/// Gives the calling thread a time slice of `slice` (within [`SLICES`]),
/// keeping its policy (normal) and nice value.
pub fn set_own_slice(slice: Duration) -> io::Result<()> {
    // SAFETY: getpriority reads the calling thread's nice value; errno is
    // cleared first because -1 is a valid result.
    let nice = unsafe {
        *libc::__errno_location() = 0;
        libc::getpriority(libc::PRIO_PROCESS, 0)
    };
    if nice == -1 && io::Error::last_os_error().raw_os_error() != Some(0) {
        return Err(io::Error::last_os_error());
    }
    let attr = SchedAttr {
        size: std::mem::size_of::<SchedAttr>() as u32,
        policy: libc::SCHED_OTHER as u32,
        flags: SCHED_FLAG_RESET_ON_FORK,
        nice,
        priority: 0,
        runtime: u64::try_from(slice.as_nanos()).unwrap_or(u64::MAX),
        deadline: 0,
        period: 0,
        util_min: 0,
        util_max: 0,
    };
    // SAFETY: `attr` is a valid `struct sched_attr` of the size it states,
    // alive for the call; pid 0 is the calling thread.
    let result =
        unsafe { libc::syscall(libc::SYS_sched_setattr, 0, &attr as *const SchedAttr, 0u32) };
    if result == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The slice the kernel shows for `path` (a `sched` file), where it
    /// shows it (CONFIG_SCHED_DEBUG).
    fn shown_slice(path: &str) -> Option<u64> {
        let sched = std::fs::read_to_string(path).ok()?;
        let line = sched.lines().find(|l| l.starts_with("se.slice"))?;
        line.rsplit(' ').next()?.trim().parse().ok()
    }

    #[test]
    fn a_slice_outside_what_the_kernel_grants_is_refused() {
        assert_eq!(parse_slice("100us"), Ok(Duration::from_micros(100)));
        assert_eq!(parse_slice("100ms"), Ok(Duration::from_millis(100)));
        for refused in ["0s", "99us", "101ms"] {
            let error = parse_slice(refused).unwrap_err();
            assert!(error.contains("outside the slices"), "{refused}: {error}");
        }
        assert!(parse_slice("soon").is_err());
    }

    #[test]
    fn a_child_process_starts_with_the_default_slice() {
        std::thread::spawn(|| {
            set_own_slice(Duration::from_micros(100)).expect("sched_setattr");
            let mut child = std::process::Command::new("sleep")
                .arg("5")
                .spawn()
                .expect("sleep");
            let shown = shown_slice(&format!("/proc/{}/sched", child.id()));
            let _ = child.kill();
            let _ = child.wait();
            if let (Some(own), Some(child)) = (shown_slice("/proc/thread-self/sched"), shown) {
                assert_eq!(own, 100_000);
                assert_ne!(child, 100_000, "the child inherited the slice");
            }
        })
        .join()
        .unwrap();
    }

    #[test]
    fn a_thread_sets_its_own_slice_and_keeps_its_nice_value() {
        std::thread::spawn(|| {
            // SAFETY: sets the calling thread's nice value.
            unsafe { libc::setpriority(libc::PRIO_PROCESS, 0, 5) };
            set_own_slice(Duration::from_micros(100)).expect("sched_setattr");
            // SAFETY: as above.
            let nice = unsafe { libc::getpriority(libc::PRIO_PROCESS, 0) };
            assert_eq!(nice, 5);
            // Where the kernel shows it, the slice is the one asked for.
            if let Some(ns) = shown_slice("/proc/thread-self/sched") {
                assert_eq!(ns, 100_000);
            }
        })
        .join()
        .unwrap();
    }
}
