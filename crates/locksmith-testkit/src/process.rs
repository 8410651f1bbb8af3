//! [`Process`]: one server process, with its log, signals and readiness wait.

use std::ffi::{OsStr, OsString};
use std::fs::{File, OpenOptions};
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::{Mutex, MutexGuard};
use std::thread;
use std::time::{Duration, Instant};

use crate::{spawner, Error, Result};

/// How many log lines startup errors include.
pub(crate) const ERROR_LOG_LINES: usize = 40;

/// What [`Process::start`] writes to the log before each start, so a reader
/// can tell this start's lines from an earlier one's.
pub const START_MARKER: &str = "==== locksmith-testkit: starting ";

/// How to start a server process, kept by [`Process`] so that it can start the
/// very same command again after a kill.
#[derive(Clone, Debug)]
pub struct ProcessSpec {
    name: String,
    program: PathBuf,
    args: Vec<OsString>,
    /// Variables to set (`Some`) or to remove from the inherited environment.
    env: Vec<(OsString, Option<OsString>)>,
    current_dir: Option<PathBuf>,
    log: PathBuf,
    user: Option<(u32, u32)>,
    stop_signal: i32,
    stop_timeout: Duration,
}

impl ProcessSpec {
    /// A process running `program`, called `name` in messages (like
    /// `"redis-server on port 6379"`), whose stdout and stderr are appended to
    /// the file `log`.
    pub fn new(
        name: impl Into<String>,
        program: impl Into<PathBuf>,
        log: impl Into<PathBuf>,
    ) -> Self {
        ProcessSpec {
            name: name.into(),
            program: program.into(),
            args: Vec::new(),
            env: Vec::new(),
            current_dir: None,
            log: log.into(),
            user: None,
            stop_signal: libc::SIGTERM,
            stop_timeout: Duration::from_secs(10),
        }
    }

    /// Adds one argument.
    pub fn arg(mut self, arg: impl AsRef<OsStr>) -> Self {
        self.args.push(arg.as_ref().to_owned());
        self
    }

    /// Adds arguments.
    pub fn args<I, S>(mut self, args: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        self.args
            .extend(args.into_iter().map(|a| a.as_ref().to_owned()));
        self
    }

    /// Sets an environment variable (the rest of the environment is inherited).
    pub fn env(mut self, key: impl AsRef<OsStr>, value: impl AsRef<OsStr>) -> Self {
        self.env
            .push((key.as_ref().to_owned(), Some(value.as_ref().to_owned())));
        self
    }

    /// Removes an inherited environment variable, so the program's default
    /// applies.
    pub fn env_remove(mut self, key: impl AsRef<OsStr>) -> Self {
        self.env.push((key.as_ref().to_owned(), None));
        self
    }

    /// Sets the working directory.
    pub fn current_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.current_dir = Some(dir.into());
        self
    }

    /// Runs the process as user `uid` and group `gid` (the caller must be root).
    pub fn user(mut self, uid: u32, gid: u32) -> Self {
        self.user = Some((uid, gid));
        self
    }

    /// The signal [`Process::stop`] sends first (default `SIGTERM`), and how long
    /// it waits for the process to exit before sending `SIGKILL` (default 10 s).
    pub fn stop_signal(mut self, signal: i32, timeout: Duration) -> Self {
        self.stop_signal = signal;
        self.stop_timeout = timeout;
        self
    }

    /// The name used in messages.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The command line, for messages.
    pub fn command_line(&self) -> String {
        std::iter::once(self.program.as_os_str())
            .chain(self.args.iter().map(OsString::as_os_str))
            .map(|s| s.to_string_lossy())
            .collect::<Vec<_>>()
            .join(" ")
    }

    fn command(&self, log: &File) -> io::Result<Command> {
        let mut command = Command::new(&self.program);
        command.args(&self.args);
        for (key, value) in &self.env {
            match value {
                Some(value) => command.env(key, value),
                None => command.env_remove(key),
            };
        }
        command
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log.try_clone()?)
            // Its own process group: kill/pause reach every process of the server
            // (PostgreSQL backends, ...), and a Ctrl-C meant for the test runner
            // does not hit the server first.
            .process_group(0);
        if let Some(dir) = &self.current_dir {
            command.current_dir(dir);
        }
        child_setup(&mut command, self.user);
        Ok(command)
    }
}

/// Makes the child of `command` die with this process and, if `user` is given,
/// run as that `(uid, gid)`.
pub(crate) fn child_setup(command: &mut Command, user: Option<(u32, u32)>) {
    let parent = std::process::id();
    // SAFETY: the closure runs between fork and exec and only makes
    // async-signal-safe system calls; it allocates nothing.
    unsafe {
        command.pre_exec(move || {
            if let Some((uid, gid)) = user {
                if libc::setgroups(0, std::ptr::null()) != 0
                    || libc::setgid(gid) != 0
                    || libc::setuid(uid) != 0
                {
                    return Err(io::Error::last_os_error());
                }
            }
            // After setuid: changing credentials clears the parent-death signal.
            if libc::prctl(
                libc::PR_SET_PDEATHSIG,
                libc::SIGKILL as libc::c_ulong,
                0,
                0,
                0,
            ) != 0
            {
                return Err(io::Error::last_os_error());
            }
            // The parent may have died before prctl; then nobody would kill us.
            if libc::getppid() as u32 != parent {
                return Err(io::Error::from_raw_os_error(libc::ESRCH));
            }
            Ok(())
        });
    }
}

/// Gives `path` to `user`, the `(uid, gid)` a server runs as (`None`: keeps
/// it), so that a server which checks its files' owner accepts them.
pub(crate) fn give(path: &Path, user: Option<(u32, u32)>) -> Result<()> {
    let Some((uid, gid)) = user else {
        return Ok(());
    };
    std::os::unix::fs::chown(path, Some(uid), Some(gid))
        .map_err(|e| Error::io(format!("cannot give {} to uid {uid}", path.display()), e))
}

/// Runs a one-shot helper command (like `initdb`) to completion, as `user` if
/// given, failing with its output if it does not succeed.
pub(crate) fn run(command: &mut Command, user: Option<(u32, u32)>) -> Result<Output> {
    child_setup(command, user);
    let line = format!("{command:?}");
    let output = command
        .stdin(Stdio::null())
        .output()
        .map_err(|e| Error::io(format!("cannot run {line}"), e))?;
    if output.status.success() {
        Ok(output)
    } else {
        Err(Error::Command {
            command: line,
            status: output.status.to_string(),
            output: format!(
                "{}{}",
                String::from_utf8_lossy(&output.stdout),
                String::from_utf8_lossy(&output.stderr)
            ),
        })
    }
}

/// One server process: started from a [`ProcessSpec`], in its own process group,
/// killed with it (`PR_SET_PDEATHSIG`) and on drop, with its output in a log file.
///
/// All methods take `&self`, so one handle can be shared between the code under
/// test and a fault injector.
#[derive(Debug)]
pub struct Process {
    spec: ProcessSpec,
    child: Mutex<Option<Child>>,
    /// The pid of the running child (0 if none), for [`Process::kill_now`], which
    /// must not block on the lock.
    pid: AtomicI32,
}

impl Process {
    /// Starts the process described by `spec`.
    ///
    /// This returns as soon as the process exists; use [`Process::wait_ready`] to
    /// wait until it serves.
    pub fn spawn(spec: ProcessSpec) -> Result<Process> {
        let process = Process::prepare(spec);
        process.start()?;
        Ok(process)
    }

    /// The process described by `spec`, not started yet: [`Process::start`]
    /// starts it (a spare member that a test brings in later).
    pub fn prepare(spec: ProcessSpec) -> Process {
        Process {
            spec,
            child: Mutex::new(None),
            pid: AtomicI32::new(0),
        }
    }

    /// Starts the process again with the same command, if it is not running.
    pub fn start(&self) -> Result<()> {
        let mut child = self.lock();
        if Self::reap_if_exited(&mut child, &self.pid).is_none() && child.is_some() {
            return Ok(());
        }
        let mut log = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.spec.log)
            .map_err(|e| Error::io(format!("cannot open {}", self.spec.log.display()), e))?;
        let _ = writeln!(log, "{START_MARKER}{} ====", self.spec.command_line());
        let command = self
            .spec
            .command(&log)
            .map_err(|e| Error::io(format!("cannot set up {}", self.spec.name), e))?;
        let spawned = spawner::spawn(command).map_err(|e| {
            Error::io(
                format!(
                    "cannot start {} ({})",
                    self.spec.name,
                    self.spec.command_line()
                ),
                e,
            )
        })?;
        tracing::debug!(server = %self.spec.name, pid = spawned.id(), "started");
        self.pid.store(spawned.id() as i32, Ordering::SeqCst);
        *child = Some(spawned);
        Ok(())
    }

    /// Kills the process and its whole process group with `SIGKILL` and reaps it.
    /// Does nothing if it is not running.
    pub fn kill(&self) {
        let mut child = self.lock();
        if let Some(mut c) = child.take() {
            // The leader is not reaped yet, so its pid (= the group id) is still ours.
            let group = c.id() as i32;
            signal_group(&c, libc::SIGKILL);
            self.pid.store(0, Ordering::SeqCst);
            let _ = c.wait();
            wait_group_gone(group);
            tracing::debug!(server = %self.spec.name, "killed");
        }
    }

    /// Stops the process gracefully: resumes it if paused, sends the spec's stop
    /// signal (`SIGTERM` by default) to the leader, waits for it to exit, and
    /// kills the whole group with `SIGKILL` if it does not exit in time.
    pub fn stop(&self) {
        let mut child = self.lock();
        let Some(c) = child.as_mut() else { return };
        signal_group(c, libc::SIGCONT);
        // SAFETY: plain kill(2) on our own unreaped child.
        unsafe { libc::kill(c.id() as i32, self.spec.stop_signal) };
        let deadline = Instant::now() + self.spec.stop_timeout;
        while !has_exited(c) && Instant::now() < deadline {
            thread::sleep(Duration::from_millis(20));
        }
        drop(child);
        // Kills whatever is left of the group (or the leader if it hung), then reaps.
        self.kill();
    }

    /// Freezes the whole process group with `SIGSTOP`, and waits (up to 2 s) until
    /// every thread of it has actually stopped: the signal is asynchronous, and on
    /// a busy machine a multi-threaded server can go on serving for a moment.
    pub fn pause(&self) {
        if let Some(c) = self.lock().as_ref() {
            signal_group(c, libc::SIGSTOP);
            let group = c.id() as i32;
            let deadline = Instant::now() + Duration::from_secs(2);
            while !group_stopped(group) && Instant::now() < deadline {
                thread::sleep(Duration::from_millis(2));
            }
        }
    }

    /// Resumes the process group with `SIGCONT`.
    pub fn resume(&self) {
        if let Some(c) = self.lock().as_ref() {
            signal_group(c, libc::SIGCONT);
        }
    }

    /// Sends `signal` to the leader process only (not its group). Fails if the
    /// process is not running.
    pub fn signal(&self, signal: i32) -> io::Result<()> {
        let child = self.lock();
        let c = child
            .as_ref()
            .ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, "process is not running"))?;
        // SAFETY: plain kill(2) on our own unreaped child.
        if unsafe { libc::kill(c.id() as i32, signal) } == 0 {
            Ok(())
        } else {
            Err(io::Error::last_os_error())
        }
    }

    /// Whether the process exists (a paused process counts as running). A process
    /// found to have exited is reaped here.
    pub fn is_running(&self) -> bool {
        let mut child = self.lock();
        Self::reap_if_exited(&mut child, &self.pid);
        child.is_some()
    }

    /// The exit status if the process has exited on its own since it was last
    /// started (it is reaped then); `None` while it runs or after [`Process::kill`].
    pub fn try_exit_status(&self) -> Option<ExitStatus> {
        Self::reap_if_exited(&mut self.lock(), &self.pid)
    }

    /// The pid of the process (also its process group id), if it runs.
    pub fn pid(&self) -> Option<u32> {
        match self.pid.load(Ordering::SeqCst) {
            0 => None,
            pid => Some(pid as u32),
        }
    }

    /// The name used in messages, like `"redis-server on port 6379"`.
    pub fn name(&self) -> &str {
        &self.spec.name
    }

    /// The spec the process was started from.
    pub fn spec(&self) -> &ProcessSpec {
        &self.spec
    }

    /// The log file holding the process's stdout and stderr (across restarts).
    pub fn log_path(&self) -> &Path {
        &self.spec.log
    }

    /// The last `lines` lines of the log.
    pub fn log_tail(&self, lines: usize) -> String {
        const MAX_BYTES: u64 = 64 * 1024;
        let read = || -> io::Result<String> {
            let mut file = File::open(&self.spec.log)?;
            let len = file.metadata()?.len();
            file.seek(SeekFrom::Start(len.saturating_sub(MAX_BYTES)))?;
            let mut bytes = Vec::new();
            file.read_to_end(&mut bytes)?;
            Ok(String::from_utf8_lossy(&bytes).into_owned())
        };
        match read() {
            Ok(text) => {
                let all: Vec<&str> = text.lines().collect();
                all[all.len().saturating_sub(lines)..].join("\n")
            }
            Err(e) => format!("(cannot read {}: {e})", self.spec.log.display()),
        }
    }

    /// Calls `probe` until it returns `Ok`, failing if the process exits first or
    /// `timeout` passes; the error carries the last probe error and the log tail.
    ///
    /// `probe` should talk to the server for real (a protocol ping) and give up
    /// quickly (well under a second) when the server does not answer.
    pub fn wait_ready(
        &self,
        timeout: Duration,
        mut probe: impl FnMut() -> std::result::Result<(), String>,
    ) -> Result<()> {
        let start = Instant::now();
        let mut pause = Duration::from_millis(20);
        loop {
            {
                let mut child = self.lock();
                if let Some(status) = Self::reap_if_exited(&mut child, &self.pid) {
                    return Err(self.exited_error(status.to_string()));
                }
                if child.is_none() {
                    return Err(self.exited_error("it was killed".into()));
                }
            }
            let last_probe = match probe() {
                Ok(()) => {
                    tracing::debug!(server = %self.spec.name, elapsed = ?start.elapsed(), "ready");
                    return Ok(());
                }
                Err(e) => e,
            };
            if start.elapsed() >= timeout {
                return Err(Error::NotReady {
                    server: self.spec.name.clone(),
                    timeout,
                    last_probe,
                    log: self.spec.log.clone(),
                    tail: self.log_tail(ERROR_LOG_LINES),
                });
            }
            thread::sleep(pause);
            pause = (pause * 2).min(Duration::from_millis(200));
        }
    }

    /// Kills the process group without locking or reaping: for `atexit` hooks,
    /// where another thread may hold the lock.
    pub(crate) fn kill_now(&self) {
        let pid = self.pid.swap(0, Ordering::SeqCst);
        if pid > 0 {
            // SAFETY: plain killpg(2); the pid is our unreaped child (reaping
            // clears `self.pid` first).
            unsafe { libc::killpg(pid, libc::SIGKILL) };
        }
    }

    fn exited_error(&self, status: String) -> Error {
        // Give the log a moment: the last lines of a dying process may be in flight.
        thread::sleep(Duration::from_millis(50));
        Error::Exited {
            server: self.spec.name.clone(),
            status,
            log: self.spec.log.clone(),
            tail: self.log_tail(ERROR_LOG_LINES),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Option<Child>> {
        self.child
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// If the child has exited, kills what is left of its group, reaps it and
    /// returns its status.
    fn reap_if_exited(child: &mut Option<Child>, pid: &AtomicI32) -> Option<ExitStatus> {
        let c = child.as_mut()?;
        if !has_exited(c) {
            return None;
        }
        let group = c.id() as i32;
        signal_group(c, libc::SIGKILL);
        pid.store(0, Ordering::SeqCst);
        let status = c.wait().unwrap_or_else(|_| ExitStatus::from_raw(0));
        *child = None;
        wait_group_gone(group);
        Some(status)
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Sends `signal` to the process group led by `child` (which must not be reaped).
fn signal_group(child: &Child, signal: i32) {
    // SAFETY: plain killpg(2); the group id is our unreaped child's pid, so it
    // cannot have been reused.
    unsafe { libc::killpg(child.id() as i32, signal) };
}

/// Waits (up to 2 s) until no live process of the group `group` is left, so that
/// a restarted server does not meet the old one's processes (PostgreSQL backends
/// holding shared memory). Called right after the leader is reaped, when all
/// members have been sent `SIGKILL`. Zombies do not count: they hold nothing, and
/// under an init that does not reap they would stay forever.
fn wait_group_gone(group: i32) {
    let deadline = Instant::now() + Duration::from_secs(2);
    // SAFETY: signal 0 only checks whether the group still has members.
    while unsafe { libc::killpg(group, 0) } == 0
        && has_live_member(group)
        && Instant::now() < deadline
    {
        thread::sleep(Duration::from_millis(10));
    }
}

/// Whether a process of group `group` that is not a zombie exists, from `/proc`
/// (`true` if `/proc` cannot be read).
fn has_live_member(group: i32) -> bool {
    let Ok(members) = group_members(group) else {
        return true;
    };
    members.iter().any(|(_, state)| !matches!(state, 'Z' | 'X'))
}

/// Whether every thread of every live process of group `group` is stopped
/// (`true` if `/proc` cannot be read, so that callers do not wait for nothing).
fn group_stopped(group: i32) -> bool {
    let Ok(members) = group_members(group) else {
        return true;
    };
    members.iter().all(|(pid, state)| {
        matches!(state, 'Z' | 'X')
            || std::fs::read_dir(format!("/proc/{pid}/task")).map_or(true, |tasks| {
                tasks.flatten().all(|task| {
                    std::fs::read_to_string(task.path().join("stat"))
                        .ok()
                        .and_then(|stat| parse_stat(&stat))
                        // A thread that exited meanwhile does not count.
                        .is_none_or(|(state, _)| matches!(state, 'T' | 't' | 'Z' | 'X'))
                })
            })
    })
}

/// `(pid, state)` of every process of group `group`, from `/proc`.
fn group_members(group: i32) -> io::Result<Vec<(u32, char)>> {
    Ok(std::fs::read_dir("/proc")?
        .flatten()
        .filter_map(|entry| {
            let pid: u32 = entry.file_name().to_str()?.parse().ok()?;
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
            let (state, pgrp) = parse_stat(&stat)?;
            (pgrp == group).then_some((pid, state))
        })
        .collect())
}

/// `(state, pgrp)` from a `/proc/<pid>/stat` line: `pid (comm) state ppid pgrp
/// ...`, where comm may hold spaces and parentheses.
fn parse_stat(stat: &str) -> Option<(char, i32)> {
    let mut fields = stat.rsplit_once(')')?.1.split_whitespace();
    let state = fields.next()?.chars().next()?;
    let pgrp = fields.nth(1)?.parse().ok()?;
    Some((state, pgrp))
}

/// Whether `child` has exited, without reaping it (its pid stays ours).
fn has_exited(child: &Child) -> bool {
    // SAFETY: waitid with WNOWAIT only inspects our own child; `info` is a plain
    // C struct that may be zeroed.
    unsafe {
        let mut info: libc::siginfo_t = std::mem::zeroed();
        let rc = libc::waitid(
            libc::P_PID,
            child.id() as libc::id_t,
            &mut info,
            libc::WEXITED | libc::WNOHANG | libc::WNOWAIT,
        );
        // With WNOHANG, si_pid stays 0 while the child has not exited. An error
        // (ECHILD) means it is already gone.
        rc != 0 || info.si_pid() != 0
    }
}
