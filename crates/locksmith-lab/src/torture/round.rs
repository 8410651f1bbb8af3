//! One round: K client processes, each behind its own fault proxy, reporting
//! to a fresh fenced resource.

use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use locksmith_testkit::proxy::{Proxy, Route};
use tokio::process::{Child, Command};

use super::protocol::now;
use super::resource::{Resource, Who};

/// What every client of a round does.
#[derive(Debug, Clone)]
pub struct RoundConfig {
    /// Client processes.
    pub clients: u32,
    /// Lock names the clients take turns on.
    pub locks: Vec<String>,
    /// Time inside the critical section.
    pub hold: Duration,
    /// Session TTL of every client.
    pub session_ttl: Duration,
    /// File collecting the clients' stderr.
    pub log: PathBuf,
}

struct Slot {
    child: Option<Child>,
    incarnation: u32,
    /// The client's way to the store, through its fault proxies.
    route: Route,
}

/// The running round.
pub struct Round {
    /// The fenced resource the clients write to and report to.
    pub resource: Resource,
    slots: Vec<Slot>,
    config: RoundConfig,
    exe: PathBuf,
    /// Things that went wrong outside the checker's view (a client crashed).
    pub notes: Vec<String>,
}

impl Round {
    /// Starts the resource, one proxy per client and backend address, and the
    /// clients.
    ///
    /// Cancel safety: dropping it kills whatever it started (`kill_on_drop`).
    pub async fn start(url: &str, config: RoundConfig) -> Result<Round, String> {
        let exe =
            std::env::current_exe().map_err(|e| format!("cannot find this executable: {e}"))?;
        let resource = Resource::start()
            .await
            .map_err(|e| format!("cannot start the fenced resource: {e}"))?;
        let mut slots = Vec::new();
        for _ in 0..config.clients {
            slots.push(Slot {
                child: None,
                incarnation: 0,
                route: Route::start(url).await?,
            });
        }
        let mut round = Round {
            resource,
            slots,
            config,
            exe,
            notes: Vec::new(),
        };
        for slot in 0..round.slots.len() {
            round.spawn(slot)?;
        }
        Ok(round)
    }

    /// Starts the client of `slot` (a new incarnation if it ran before).
    fn spawn(&mut self, index: usize) -> Result<(), String> {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.config.log)
            .map_err(|e| format!("cannot open {}: {e}", self.config.log.display()))?;
        let slot = &mut self.slots[index];
        let mut command = Command::new(&self.exe);
        command
            .args(["torture", "--client-mode"])
            .args(["--client-id", &index.to_string()])
            .args(["--incarnation", &slot.incarnation.to_string()])
            .args(["--client-url", slot.route.url()])
            .args(["--resource", &self.resource.addr().to_string()])
            .args([
                "--hold",
                &humantime::format_duration(self.config.hold).to_string(),
            ])
            .args([
                "--session-ttl",
                &humantime::format_duration(self.config.session_ttl).to_string(),
            ]);
        for lock in &self.config.locks {
            command.args(["--lock-name", lock]);
        }
        command
            .env(
                "RUST_LOG",
                std::env::var("LOCKSMITH_TORTURE_CLIENT_LOG").unwrap_or_else(|_| "warn".into()),
            )
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::from(log))
            .kill_on_drop(true);
        // SAFETY: prctl(2) is async-signal-safe; the child dies with us.
        unsafe {
            command.pre_exec(|| {
                nix::sys::prctl::set_pdeathsig(nix::sys::signal::Signal::SIGKILL)
                    .map_err(std::io::Error::from)
            });
        }
        let child = command.spawn().map_err(|e| {
            format!(
                "cannot start a torture client ({}): {e}",
                self.exe.display()
            )
        })?;
        slot.child = Some(child);
        Ok(())
    }

    /// The process id of the client in `slot` if `who` is its current incarnation.
    pub fn pid(&self, who: Who) -> Option<u32> {
        let slot = self.slots.get(who.0 as usize)?;
        (slot.incarnation == who.1)
            .then(|| slot.child.as_ref()?.id())
            .flatten()
    }

    /// `kill -9` the client `who` and start its next incarnation after `pause`.
    ///
    /// Cancel safety: the kill may happen without the respawn.
    pub async fn kill_and_respawn(&mut self, who: Who, pause: Duration) -> Result<(), String> {
        let slot = &mut self.slots[who.0 as usize];
        if slot.incarnation != who.1 {
            return Err(format!("client {who:?} is already gone"));
        }
        if let Some(mut child) = slot.child.take() {
            let _ = child.start_kill();
            let _ = child.wait().await;
        }
        slot.incarnation += 1;
        tokio::time::sleep(pause).await;
        self.spawn(who.0 as usize)
    }

    /// The fault proxies of client `slot`.
    pub fn proxies(&self, slot: u32) -> &[Proxy] {
        self.slots[slot as usize].route.proxies()
    }

    /// Every client's fault proxy to the `host`-th server of the URL.
    pub fn proxies_to(&self, host: usize) -> impl Iterator<Item = &Proxy> {
        self.slots
            .iter()
            .filter_map(move |s| s.route.proxies().get(host))
    }

    /// Every fault proxy.
    pub fn all_proxies(&self) -> impl Iterator<Item = &Proxy> {
        self.slots.iter().flat_map(|s| s.route.proxies())
    }

    /// Respawns clients that exited on their own (a crash is noted).
    pub fn reap(&mut self) -> Result<(), String> {
        for index in 0..self.slots.len() {
            let slot = &mut self.slots[index];
            let Some(child) = slot.child.as_mut() else {
                continue;
            };
            if let Ok(Some(status)) = child.try_wait() {
                self.notes.push(format!(
                    "client {index} (incarnation {}) exited on its own: {status}",
                    slot.incarnation
                ));
                slot.child = None;
                slot.incarnation += 1;
                self.spawn(index)?;
            }
        }
        Ok(())
    }

    /// Tells the clients to stop, waits up to `grace` for them to release and
    /// exit, and kills the rest. Returns the clients that were still waiting
    /// for the lock (or stuck holding it) at the end of the grace time.
    ///
    /// Cancel safety: the remaining clients are killed on drop anyway.
    pub async fn finish(&mut self, grace: Duration) -> Vec<String> {
        self.resource.stop();
        let stopped_at = now();
        let deadline = tokio::time::Instant::now() + grace;
        loop {
            let running = self
                .slots
                .iter_mut()
                .filter_map(|s| s.child.as_mut())
                .map(|c| matches!(c.try_wait(), Ok(None)))
                .filter(|running| *running)
                .count();
            if running == 0 || tokio::time::Instant::now() >= deadline {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let events = self.resource.events();
        let mut stuck = Vec::new();
        for (index, slot) in self.slots.iter_mut().enumerate() {
            let Some(mut child) = slot.child.take() else {
                continue;
            };
            if matches!(child.try_wait(), Ok(None)) {
                let who = (index as u32, slot.incarnation);
                let last = events.iter().rev().find(|e| e.who == who);
                let doing = match last.and_then(|e| e.request.as_ref()) {
                    Some(super::protocol::Request::Waiting { lock, at }) => format!(
                        "waiting for {lock} for {:.1} s",
                        (stopped_at as f64 - *at as f64) / 1e9 + grace.as_secs_f64()
                    ),
                    Some(other) => format!("last reported {other:?}"),
                    None => "never reported".into(),
                };
                stuck.push(format!(
                    "client {who:?} did not finish within {:?} after the round ended: {doing}",
                    grace
                ));
                let _ = child.start_kill();
                let _ = child.wait().await;
            }
        }
        stuck
    }
}
