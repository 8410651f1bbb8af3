//! The faults that strike while the clients work, drawn from the seed: a
//! fault every 0.5–3 simulated seconds, each healed after a while, all
//! healed (and every member up) a few seconds before the clients stop.
//!
//! Calm runs ([`crate::Settings::calm`]) strike one member at a time (cut
//! off, cut one way, crashed, frozen, or a link held back), each healed
//! before the next, with `SETTLE` between: faults a cluster with spares in
//! its URL must ride out without losing any client's session. Other runs
//! may also slow a member's links to the others.

use std::time::Duration;

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

use crate::cluster::{client_host, member_host};
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

/// How slow a slow member's links are, one way: far past the 37.5 ms a
/// member waits for a peer to open a replication stream or answer a
/// heartbeat (¾ of a heartbeat interval), so that a slow leader commits
/// nothing and loses its lease while its followers, still hearing its
/// heartbeats, elect nobody. Only safety is checked then: calm runs, which
/// ask that no session be lost, slow no link, because the cluster does not
/// ride this out yet (docs/RELIABILITY.md, "Open findings").
const SLOW_LATENCY_MS: std::ops::Range<u64> = 50..350;

/// A fault's undoing, due at a time.
enum Heal {
    Repair(String, String),
    RepairOneway(String, String),
    Release(String, String),
    Restore(String, String),
    Restart(String),
    Speed(String, String),
}

/// The faults of one run.
pub(crate) struct Faults {
    rng: SmallRng,
    enabled: bool,
    calm: bool,
    slow_links: bool,
    /// Every link's latency while it is not slowed.
    latency: std::ops::Range<Duration>,
    members: u64,
    client_hosts: u32,
    quiet_from: Duration,
    next: Duration,
    heals: Vec<(Duration, Heal)>,
    struck: Vec<String>,
    crashed: Option<String>,
}

impl Faults {
    pub(crate) fn new(seed: u64, settings: &Settings) -> Faults {
        Faults {
            rng: SmallRng::seed_from_u64(seed ^ 0x0066_6175_6c74),
            enabled: settings.faults,
            calm: settings.calm,
            slow_links: settings.slow_links,
            latency: settings.latency(),
            members: settings.members,
            client_hosts: settings.client_hosts(),
            quiet_from: settings.duration.saturating_sub(QUIET_BEFORE_END),
            next: Duration::from_secs(2),
            heals: Vec::new(),
            struck: Vec::new(),
            crashed: None,
        }
    }

    /// What struck, in order, with the time.
    pub(crate) fn struck(self) -> Vec<String> {
        self.struck
    }

    /// Strikes and heals what is due at `now`.
    pub(crate) fn at(&mut self, now: Duration, sim: &mut turmoil::Sim<'_>) {
        let quiet = now >= self.quiet_from;
        let (due, later): (Vec<_>, Vec<_>) = std::mem::take(&mut self.heals)
            .into_iter()
            .partition(|(at, _)| *at <= now || quiet);
        self.heals = later;
        for (_, heal) in due {
            self.heal(heal, sim);
        }
        if !self.enabled || quiet || now < self.next || (self.calm && !self.heals.is_empty()) {
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
        member_host(self.rng.gen_range(1..=self.members))
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
        let kinds: &[i32] = match (self.calm, self.slow_links) {
            (true, _) => &[0, 1, 2, 3, FREEZE],
            (false, false) => &[0, 1, 2, 3, 4, 5],
            (false, true) => &[0, 1, 2, 3, 4, 5, SLOW],
        };
        let kind = kinds[self.rng.gen_range(0..kinds.len())];
        let what = match kind {
            0 => {
                let others: Vec<String> = (1..=self.members)
                    .map(member_host)
                    .filter(|m| *m != member)
                    .collect();
                for other in others {
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
            2 if self.crashed.is_none() => {
                sim.crash(member.as_str());
                self.crashed = Some(member.clone());
                self.heals.push((until, Heal::Restart(member.clone())));
                format!("{member} crashed")
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
                let others: Vec<String> = (1..=self.members)
                    .map(member_host)
                    .chain((1..=self.client_hosts).map(client_host))
                    .chain(["prober".to_owned()])
                    .filter(|host| *host != member)
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
                let others: Vec<String> = (1..=self.members)
                    .map(member_host)
                    .filter(|m| *m != member)
                    .collect();
                for other in others {
                    sim.set_link_latency(member.as_str(), other.as_str(), latency);
                    self.heals.push((until, Heal::Speed(member.clone(), other)));
                }
                format!("{member}'s links to the other members slow ({latency:?} one way)")
            }
            4 => {
                let client = client_host(self.rng.gen_range(1..=self.client_hosts));
                for id in 1..=self.members {
                    let m = member_host(id);
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
            Heal::Restart(member) => {
                sim.bounce(member.as_str());
                self.crashed = None;
            }
        }
    }
}
