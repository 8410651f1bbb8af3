//! The faults that strike while the clients work, drawn from the seed: a
//! fault every 0.5–3 simulated seconds, each healed after a while, all
//! healed (and every member up) a few seconds before the clients stop.
//!
//! Calm runs ([`crate::Settings::calm`]) strike one member at a time (cut
//! off, cut one way, crashed, frozen, or a link held back), each healed
//! before the next, with `SETTLE` between: faults a cluster with spares in
//! its URL must ride out without losing any client's session. Other runs
//! may also slow a member's links to the others. With `--slow-disks`, any
//! run may slow one member's disk or every member's at once (a quorum that
//! commits slowly, nothing down). With `--slow-apply`, any run may make a
//! member busy: applying what Raft committed takes it a while.

use std::time::Duration;

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

use crate::cluster::{client_host, member_host, Pace, MAX_MEMBERS};
use crate::disk::Disk;
use crate::Settings;

/// How long before the clients stop every fault is healed.
const QUIET_BEFORE_END: Duration = Duration::from_secs(4);

/// In calm runs, how long the cluster has after a fault heals before the
/// next strikes: a restarted member catches up, the clients settle.
const SETTLE: Duration = Duration::from_secs(3);

/// The kind of fault that freezes a member (calm runs only, so that the
/// faults of other runs stay as their seeds drew them).
const FREEZE: i32 = 6;

/// The kind of fault that slows a member's links to the other members.
const SLOW: i32 = 7;

/// The kind of fault that slows a member's disk (`--slow-disks`).
const SLOW_DISK: i32 = 8;

/// The kind of fault that slows every member's disk at once
/// (`--slow-disks`): storage the members share, or a neighbour that
/// saturates it. A quorum then commits slowly while the leader's lease and
/// its heartbeats go on, so client operations and the leader's own
/// decisions stay in flight for a while.
const SLOW_DISKS: i32 = 9;

/// The kind of fault that makes a member busy (`--slow-apply`): applying
/// each run of committed entries takes it `BUSY_APPLY_MS`, while its
/// network and its core go on.
const BUSY: i32 = 10;

/// How long a busy member takes to apply each run of committed entries.
const BUSY_APPLY_MS: std::ops::Range<u64> = 200..1500;

/// How long a member's syncs take (`--power-loss`, `--slow-disks`).
const SYNC_LATENCY_MS: std::ops::RangeInclusive<u64> = 1..=10;

/// How long a slow disk's syncs take.
const SLOW_SYNC_MS: std::ops::Range<u64> = 20..200;

/// With `--power-loss`, a crash waits up to this long for the member to be
/// between a write of its log and the sync (a power loss while the disk
/// is busy), and strikes then.
const POWER_LOSS_WAIT: Duration = Duration::from_millis(250);

/// How slow a slow member's links are, one way: far past the 37.5 ms a
/// member waits for a peer to open a replication stream or answer a
/// heartbeat (¾ of a heartbeat interval), so that a slow leader commits
/// nothing and loses its lease while its followers, still hearing its
/// heartbeats, would elect nobody. Calm runs slow no link unless asked
/// (`--calm-slow-links`): their seeds draw the faults they drew before.
const SLOW_LATENCY_MS: std::ops::Range<u64> = 50..350;

/// A fault's undoing, due at a time.
enum Heal {
    Repair(String, String),
    RepairOneway(String, String),
    Release(String, String),
    Restore(String, String),
    Restart(String),
    Speed(String, String),
    DiskSpeed(u64),
    Unbusy(u64),
}

/// The faults of one run.
pub(crate) struct Faults {
    rng: SmallRng,
    enabled: bool,
    calm: bool,
    slow_links: bool,
    /// Calm runs may slow a member's links too (`--calm-slow-links`).
    calm_slow_links: bool,
    /// Every link's latency while it is not slowed.
    latency: std::ops::Range<Duration>,
    /// The cluster's members now (module `membership` adds and removes).
    members: Vec<u64>,
    /// Members removed and stopped for good.
    retired: Vec<String>,
    /// An operator's host exists (module `membership`).
    operator: bool,
    client_hosts: u32,
    quiet_from: Duration,
    next: Duration,
    heals: Vec<(Duration, Heal)>,
    struck: Vec<String>,
    crashed: Option<String>,
    /// A crash waiting for its member's disk to be busy (`POWER_LOSS_WAIT`):
    /// the member, how long it stays down, and the latest it strikes.
    power_loss: Option<(String, Duration, Duration)>,
    /// When a fault was last healed.
    healed_at: Duration,
    /// Each member's disk, by id − 1 (`--power-loss`, `--slow-disks`).
    disks: Vec<Option<Disk>>,
    /// Draws of the disks' own (what a power loss keeps), apart from the
    /// faults' so that these stay as they were drawn without disks.
    disk_rng: SmallRng,
    slow_disks: bool,
    /// How long each member takes to apply, by id − 1 (`--slow-apply`).
    paces: Vec<Option<Pace>>,
}

impl Faults {
    pub(crate) fn new(seed: u64, settings: &Settings) -> Faults {
        let mut disk_rng = SmallRng::seed_from_u64(seed ^ 0x6469_736b);
        let disks = (0..MAX_MEMBERS)
            .map(|_| {
                let latency = Duration::from_millis(disk_rng.gen_range(SYNC_LATENCY_MS));
                (settings.power_loss || settings.slow_disks).then(|| Disk::new(latency))
            })
            .collect();
        Faults {
            paces: (0..MAX_MEMBERS)
                .map(|_| settings.slow_apply.then(Pace::default))
                .collect(),
            disks,
            disk_rng,
            slow_disks: settings.slow_disks,
            rng: SmallRng::seed_from_u64(seed ^ 0x0066_6175_6c74),
            enabled: settings.faults,
            calm: settings.calm,
            slow_links: settings.slow_links,
            calm_slow_links: settings.calm_slow_links,
            latency: settings.latency(),
            members: (1..=settings.members).collect(),
            retired: Vec::new(),
            operator: settings.membership && settings.faults,
            client_hosts: settings.client_hosts(),
            quiet_from: settings.duration.saturating_sub(QUIET_BEFORE_END),
            next: Duration::from_secs(2),
            heals: Vec::new(),
            struck: Vec::new(),
            crashed: None,
            power_loss: None,
            healed_at: Duration::ZERO,
        }
    }

    /// What struck, in order, with the time.
    pub(crate) fn struck(self) -> Vec<String> {
        self.struck
    }

    /// Whether no fault is active and the last was healed [`SETTLE`] ago
    /// or more (calm runs' rule, which membership changes follow too).
    pub(crate) fn settled(&self, now: Duration) -> bool {
        self.heals.is_empty() && now >= self.healed_at + SETTLE
    }

    /// In a calm run, the next fault strikes [`SETTLE`] after `now` at the
    /// soonest (a membership change ended).
    pub(crate) fn settle_from(&mut self, now: Duration) {
        if self.calm {
            self.next = self.next.max(now + SETTLE);
        }
    }

    /// Notes an event of the run beside the faults (a membership change).
    pub(crate) fn record(&mut self, what: String) {
        self.struck.push(what);
    }

    /// Member `id`'s disk, if the run simulates disks.
    pub(crate) fn disk(&self, id: u64) -> Option<Disk> {
        self.disks[id as usize - 1].clone()
    }

    /// Member `id`'s pace of applying, if the run may make members busy.
    pub(crate) fn pace(&self, id: u64) -> Option<Pace> {
        self.paces[id as usize - 1].clone()
    }

    /// A new member, which faults may strike from now on.
    pub(crate) fn join(&mut self, id: u64) {
        self.members.push(id);
    }

    /// Stops `member` for good (removed from the cluster): no fault strikes
    /// it any more, and a restart due is dropped.
    pub(crate) fn retire(&mut self, member: &str, sim: &mut turmoil::Sim<'_>) {
        self.members.retain(|&id| member_host(id) != member);
        if self.power_loss.as_ref().is_some_and(|(m, ..)| m == member) {
            self.power_loss = None;
        }
        if self.crashed.as_deref() == Some(member) {
            self.crashed = None;
        } else {
            sim.crash(member);
        }
        self.retired.push(member.to_owned());
        tracing::info!(target: "locksmith_sim::faults", %member, "stopped for good");
    }

    /// Strikes and heals what is due at `now`; in a calm run, strikes
    /// nothing while `held_off` (a membership change under way).
    pub(crate) fn at(&mut self, now: Duration, sim: &mut turmoil::Sim<'_>, held_off: bool) {
        let quiet = now >= self.quiet_from;
        let (due, later): (Vec<_>, Vec<_>) = std::mem::take(&mut self.heals)
            .into_iter()
            .partition(|(at, _)| *at <= now || quiet);
        self.heals = later;
        if !due.is_empty() {
            self.healed_at = now;
        }
        for (_, heal) in due {
            self.heal(heal, sim);
        }
        self.lose_power(now, sim, quiet);
        if !self.enabled
            || quiet
            || now < self.next
            || (self.calm && (!self.heals.is_empty() || held_off))
        {
            return;
        }
        self.next = now + Duration::from_millis(self.rng.gen_range(500..3000));
        self.strike(now, sim);
        if self.calm {
            let healed = self.heals.iter().map(|(at, _)| *at).max().unwrap_or(now);
            self.next = self.next.max(healed + SETTLE);
        }
    }

    fn member(&mut self) -> String {
        // The same draw as from `1..=members` before members changed.
        let n = self.rng.gen_range(1..=self.members.len());
        member_host(self.members[n - 1])
    }

    /// The disk of the member on host `member`.
    fn disk_of(&self, member: &str) -> Option<Disk> {
        self.disk(member_id(member))
    }

    /// Every member now but `than`.
    fn others(&self, than: &str) -> Vec<String> {
        self.members
            .iter()
            .map(|&id| member_host(id))
            .filter(|m| *m != than)
            .collect()
    }

    fn other_member(&mut self, than: &str) -> String {
        loop {
            let other = self.member();
            if other != than {
                return other;
            }
        }
    }

    fn strike(&mut self, now: Duration, sim: &mut turmoil::Sim<'_>) {
        let lasting = Duration::from_millis(self.rng.gen_range(200..4000));
        let until = now + lasting;
        let member = self.member();
        // Calm runs strike the members only and keep their links whole,
        // and may freeze one; they slow no link (see `SLOW_LATENCY_MS`).
        // Slow links came last: without them a seed draws the faults it
        // drew before they existed.
        let kinds: &[i32] = match (self.calm, self.slow_links, self.slow_disks) {
            (true, _, false) => &[0, 1, 2, 3, FREEZE],
            (true, _, true) => &[0, 1, 2, 3, FREEZE, SLOW_DISK, SLOW_DISKS],
            (false, false, false) => &[0, 1, 2, 3, 4, 5],
            (false, false, true) => &[0, 1, 2, 3, 4, 5, SLOW_DISK, SLOW_DISKS],
            (false, true, false) => &[0, 1, 2, 3, 4, 5, SLOW],
            (false, true, true) => &[0, 1, 2, 3, 4, 5, SLOW, SLOW_DISK, SLOW_DISKS],
        };
        let busy = [BUSY];
        let mut kinds = match self.paces[0].is_some() {
            true => [kinds, &busy[..]].concat(),
            false => kinds.to_vec(),
        };
        if self.calm && self.calm_slow_links {
            kinds.push(SLOW);
        }
        let kind = kinds[self.rng.gen_range(0..kinds.len())];
        let what = match kind {
            0 => {
                for other in self.others(&member) {
                    sim.partition(member.as_str(), other.as_str());
                    self.heals
                        .push((until, Heal::Repair(member.clone(), other)));
                }
                format!("{member} cut off from the other members")
            }
            1 => {
                let other = self.other_member(&member);
                sim.partition_oneway(member.as_str(), other.as_str());
                self.heals
                    .push((until, Heal::RepairOneway(member.clone(), other.clone())));
                format!("{member} → {other} cut (one way)")
            }
            2 if self.crashed.is_none() && self.disk_of(&member).is_some() => {
                self.crashed = Some(member.clone());
                self.power_loss = Some((member.clone(), lasting, now + POWER_LOSS_WAIT));
                self.lose_power(now, sim, false);
                return;
            }
            2 if self.crashed.is_none() => {
                sim.crash(member.as_str());
                self.crashed = Some(member.clone());
                self.heals.push((until, Heal::Restart(member.clone())));
                format!("{member} crashed")
            }
            SLOW_DISK => {
                let latency = Duration::from_millis(self.rng.gen_range(SLOW_SYNC_MS));
                let id = member_id(&member);
                if let Some(disk) = self.disk(id) {
                    disk.set_latency(latency);
                }
                self.heals.push((until, Heal::DiskSpeed(id)));
                format!("{member}'s disk slow ({latency:?} a sync)")
            }
            BUSY => {
                let per_run = Duration::from_millis(self.rng.gen_range(BUSY_APPLY_MS));
                let id = member_id(&member);
                if let Some(pace) = self.pace(id) {
                    pace.set(per_run);
                }
                self.heals.push((until, Heal::Unbusy(id)));
                format!("{member} busy ({per_run:?} to apply each run of committed entries)")
            }
            SLOW_DISKS => {
                let latency = Duration::from_millis(self.rng.gen_range(SLOW_SYNC_MS));
                for id in self.members.clone() {
                    if let Some(disk) = self.disk(id) {
                        disk.set_latency(latency);
                    }
                    self.heals.push((until, Heal::DiskSpeed(id)));
                }
                format!("every member's disk slow ({latency:?} a sync)")
            }
            3 => {
                let other = self.other_member(&member);
                sim.hold(member.as_str(), other.as_str());
                let until = now + lasting / 4;
                self.heals
                    .push((until, Heal::Release(member.clone(), other.clone())));
                format!("{member} ↔ {other} held back (delay)")
            }
            FREEZE => {
                // Every message to and from it waits (a process stopped, a
                // long pause): its connections stay open, nothing answers.
                let others: Vec<String> = self
                    .others(&member)
                    .into_iter()
                    .chain((1..=self.client_hosts).map(client_host))
                    .chain(["prober".to_owned()])
                    .chain(self.operator.then(|| "operator".to_owned()))
                    .collect();
                for other in others {
                    sim.hold(member.as_str(), other.as_str());
                    self.heals
                        .push((until, Heal::Release(member.clone(), other)));
                }
                format!("{member} frozen")
            }
            SLOW => {
                let latency = Duration::from_millis(self.rng.gen_range(SLOW_LATENCY_MS));
                for other in self.others(&member) {
                    sim.set_link_latency(member.as_str(), other.as_str(), latency);
                    self.heals.push((until, Heal::Speed(member.clone(), other)));
                }
                format!("{member}'s links to the other members slow ({latency:?} one way)")
            }
            4 => {
                let client = client_host(self.rng.gen_range(1..=self.client_hosts));
                for m in self.others("") {
                    sim.partition(client.as_str(), m.as_str());
                    self.heals.push((until, Heal::Repair(client.clone(), m)));
                }
                format!("{client} cut off from the cluster")
            }
            _ => {
                let other = self.other_member(&member);
                sim.set_link_fail_rate(member.as_str(), other.as_str(), 0.05);
                self.heals
                    .push((until, Heal::Restore(member.clone(), other.clone())));
                format!("{member} ↔ {other} losing messages")
            }
        };
        tracing::info!(target: "locksmith_sim::faults", at = ?now, for_ = ?lasting, "{what}");
        self.struck
            .push(format!("{:.3}s {what} for {lasting:?}", now.as_secs_f64()));
    }

    /// Crashes the member whose crash waits for its disk to be busy, once
    /// it is (or once it has waited long enough): a power loss, which drops
    /// or tears what its log wrote and did not sync.
    fn lose_power(&mut self, now: Duration, sim: &mut turmoil::Sim<'_>, quiet: bool) {
        let Some((member, lasting, by)) = self.power_loss.clone() else {
            return;
        };
        if quiet {
            self.power_loss = None;
            self.crashed = None;
            return;
        }
        let Some(disk) = self.disk_of(&member) else {
            return;
        };
        if !disk.busy() && now < by {
            return;
        }
        self.power_loss = None;
        sim.crash(member.as_str());
        self.heals
            .push((now + lasting, Heal::Restart(member.clone())));
        let what = match disk.lose_unsynced(&mut self.disk_rng) {
            Some(lost) => format!("{member} crashed (power loss: {lost})"),
            None => format!("{member} crashed (power loss, nothing unsynced)"),
        };
        tracing::info!(target: "locksmith_sim::faults", at = ?now, for_ = ?lasting, "{what}");
        self.struck
            .push(format!("{:.3}s {what} for {lasting:?}", now.as_secs_f64()));
    }

    fn heal(&mut self, heal: Heal, sim: &mut turmoil::Sim<'_>) {
        match heal {
            Heal::Repair(a, b) => sim.repair(a.as_str(), b.as_str()),
            Heal::RepairOneway(a, b) => sim.repair_oneway(a.as_str(), b.as_str()),
            Heal::Release(a, b) => sim.release(a.as_str(), b.as_str()),
            Heal::Restore(a, b) => sim.set_link_fail_rate(a.as_str(), b.as_str(), 0.0),
            Heal::Speed(a, b) => {
                sim.set_link_latency(a.as_str(), b.as_str(), self.latency.start);
                sim.set_link_max_message_latency(a.as_str(), b.as_str(), self.latency.end);
            }
            Heal::Unbusy(id) => {
                if let Some(pace) = self.pace(id) {
                    pace.set(Duration::ZERO);
                }
            }
            Heal::DiskSpeed(id) => {
                if let Some(disk) = self.disk(id) {
                    disk.set_latency(disk.usual_latency());
                }
            }
            Heal::Restart(member) => {
                if !self.retired.contains(&member) {
                    sim.bounce(member.as_str());
                    self.crashed = None;
                }
            }
        }
    }
}

/// The id of the member on host `member` (`member3`: 3).
fn member_id(member: &str) -> u64 {
    member
        .trim_start_matches("member")
        .parse()
        .expect("a member's host name")
}
