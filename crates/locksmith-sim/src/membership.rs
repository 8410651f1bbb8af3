//! Membership changes while the clients work (`--membership`): an operator
//! adds a member, removes a voter or replaces one, through the cluster's
//! own admin service (`locksmith.raft.v1.Cluster`, what `locksmith cluster`
//! calls), as an operator does:
//!
//! - **add**: a new member starts on a host of its own with an empty data
//!   directory and `join` set (`locksmith serve --join`), so that it adds
//!   itself as a learner; once the leader has it, the operator promotes it
//!   (`promote`: openraft's joint consensus, old and new voters both
//!   voting, then the new ones alone);
//! - **remove**: the operator removes a voter (the leader too, at times),
//!   then stops it for good, as `locksmith torture`'s `membership-change`
//!   does;
//! - **replace**: an add, then a remove.
//!
//! The voters stay between three and four; ids are never reused (at most
//! [`crate::cluster::MAX_MEMBERS`] members in a run). The operator asks the
//! members in turn, follows a member's hint to the leader, and asks again
//! after an answer that leaves the outcome open (a broken connection, a
//! leader deposed mid-change); `ALREADY_EXISTS` or `NOT_FOUND` on a retry
//! says an earlier attempt made the change.
//!
//! Two rules are checked. **Changes finish**: every change is made within
//! [`CHANGE_WITHIN`]. **The operator is told the truth**: a member that
//! led, in one term, from before the call until after its answer, and had
//! no change under way when the call came (one under way was an earlier
//! attempt's), answers a change it made "done"; it may refuse one it did
//! not make (another change not committed yet, say), but an error for a
//! change it made while nothing deposed it is a defect (the
//! joint-membership finisher racing the change it finishes, `56f2f4a`, did
//! that).
//!
//! In calm runs a change starts only while no fault is active, and no
//! fault strikes while it runs: one thing at a time.

use std::cell::RefCell;
use std::collections::VecDeque;
use std::rc::Rc;
use std::time::Duration;

use locksmith_proto::raft as pb;
use locksmith_proto::raft::cluster_client::ClusterClient;
use locksmith_proto::transport;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use tonic::transport::{Channel, Endpoint};

use crate::check::Violation;
use crate::cluster::{member_host, MAX_MEMBERS, PORT};
use crate::faults::Faults;

/// How long a change may take, faults and all, before it counts as stuck.
pub const CHANGE_WITHIN: Duration = Duration::from_secs(40);

/// How long an operator's call may take before it is given up (its
/// outcome then open).
const CALL_TIMEOUT: Duration = Duration::from_secs(5);

/// The fewest and most voters the changes keep.
const VOTERS: std::ops::RangeInclusive<usize> = 3..=4;

/// One step the operator takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Step {
    /// Make this new member (started already, joining as a learner) a voter.
    Promote(u64),
    /// Take this voter out of the cluster, then stop it.
    Remove(u64),
}

/// What the main loop and the operator's host share (one thread).
#[derive(Default)]
struct Shared {
    /// Changes the main loop gave the operator, each a list of steps.
    queue: VecDeque<(String, Vec<Step>)>,
    /// Members the operator wants stopped for good (removed).
    retire: Vec<u64>,
    /// Set by the operator when it has finished the change it was given.
    finished: bool,
    /// The voters, as the operator last made them.
    voters: Vec<u64>,
    /// What the checks found.
    violations: Vec<Violation>,
    /// What was done, with the time, for the report.
    done: Vec<String>,
}

/// The membership changes of one run.
pub(crate) struct Membership {
    rng: SmallRng,
    enabled: bool,
    calm: bool,
    shared: Rc<RefCell<Shared>>,
    next: Duration,
    /// Changes still to start.
    left: u32,
    /// A change is under way.
    busy: bool,
    /// The next member id.
    next_id: u64,
    /// No change starts from here on.
    last_start: Duration,
}

impl Membership {
    pub(crate) fn new(seed: u64, settings: &crate::Settings) -> Membership {
        let mut rng = SmallRng::seed_from_u64(seed ^ 0x006d_656d_6265_7273);
        let next = Duration::from_millis(rng.gen_range(1500..4000));
        let left = rng.gen_range(1..=2);
        Membership {
            rng,
            enabled: settings.membership && settings.faults,
            calm: settings.calm,
            shared: Rc::new(RefCell::new(Shared {
                voters: (1..=settings.members).collect(),
                ..Shared::default()
            })),
            next,
            left,
            busy: false,
            next_id: settings.members + 1,
            last_start: settings.duration.saturating_sub(Duration::from_secs(4)),
        }
    }

    /// Whether a change is under way (calm runs strike no fault then).
    pub(crate) fn busy(&self) -> bool {
        self.busy
    }

    /// The operator's host, if changes are made: a client of the
    /// simulation, done once its last change is.
    pub(crate) fn operator(&self, until: Duration) -> Option<Operator> {
        self.enabled.then(|| Operator {
            shared: self.shared.clone(),
            until,
        })
    }

    /// Starts a change when one is due, and stops the members removed.
    pub(crate) fn at(
        &mut self,
        now: Duration,
        sim: &mut turmoil::Sim<'_>,
        faults: &mut Faults,
        data: &std::path::Path,
    ) {
        if !self.enabled {
            return;
        }
        let retire = std::mem::take(&mut self.shared.borrow_mut().retire);
        for id in retire {
            faults.retire(&member_host(id), sim);
        }
        if self.busy && self.shared.borrow().finished {
            let mut shared = self.shared.borrow_mut();
            shared.finished = false;
            for done in std::mem::take(&mut shared.done) {
                faults.record(done);
            }
            drop(shared);
            self.busy = false;
            self.next = now + Duration::from_millis(self.rng.gen_range(1000..3000));
            faults.settle_from(now);
        }
        if self.busy
            || self.left == 0
            || now < self.next
            || now > self.last_start
            || (self.calm && !faults.settled(now))
        {
            return;
        }
        let voters = self.shared.borrow().voters.clone();
        let can_add = voters.len() < *VOTERS.end() && self.next_id as usize <= MAX_MEMBERS;
        let can_remove = voters.len() > *VOTERS.start();
        let kind = match (can_add, can_remove) {
            (true, true) => self.rng.gen_range(0..3),
            (true, false) => [0, 2][self.rng.gen_range(0..2)],
            (false, true) => 1,
            (false, false) => return,
        };
        let mut steps = Vec::new();
        let mut what = Vec::new();
        if kind != 1 {
            let id = self.next_id;
            self.next_id += 1;
            let setup = crate::cluster::MemberSetup {
                id,
                cluster: Vec::new(),
                data_dir: data.join(member_host(id)),
                join: Some(
                    voters
                        .iter()
                        .map(|&id| format!("{}:{PORT}", member_host(id)))
                        .collect::<Vec<_>>()
                        .join(","),
                ),
                disk: faults.disk(id),
                pace: faults.pace(id),
            };
            sim.host(member_host(id), move || {
                crate::cluster::run_member(setup.clone())
            });
            faults.join(id);
            steps.push(Step::Promote(id));
            what.push(format!("member{id} added"));
        }
        if kind != 0 {
            let gone = voters[self.rng.gen_range(0..voters.len())];
            steps.push(Step::Remove(gone));
            what.push(format!("member{gone} removed"));
        }
        let what = what.join(", then ");
        tracing::info!(target: "locksmith_sim::membership", at = ?now, "{what}");
        faults.record(format!("{:.3}s {what}", now.as_secs_f64()));
        self.shared.borrow_mut().queue.push_back((what, steps));
        self.left -= 1;
        self.busy = true;
    }

    /// What the checks of the changes found.
    pub(crate) fn violations(&self) -> Vec<Violation> {
        std::mem::take(&mut self.shared.borrow_mut().violations)
    }
}

/// The operator: makes the changes it is given, one at a time.
pub(crate) struct Operator {
    shared: Rc<RefCell<Shared>>,
    until: Duration,
}

impl Operator {
    /// Runs until the clients stop and its last change is made.
    pub(crate) async fn run(self) -> turmoil::Result {
        loop {
            let next = self.shared.borrow_mut().queue.pop_front();
            let Some((what, steps)) = next else {
                if turmoil::sim_elapsed().unwrap_or_default() > self.until {
                    return Ok(());
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
                continue;
            };
            let started = turmoil::sim_elapsed().unwrap_or_default();
            for step in steps {
                match tokio::time::timeout(CHANGE_WITHIN, self.make(step)).await {
                    Ok(Ok(())) => {}
                    Ok(Err(violation)) => {
                        self.shared.borrow_mut().violations.push(violation);
                        break;
                    }
                    Err(_) => {
                        self.shared.borrow_mut().violations.push(Violation {
                            rule: "membership changes finish",
                            lock: 0,
                            detail: format!(
                                "{step:?} ({what}, from {started:?}) not made within {CHANGE_WITHIN:?}"
                            ),
                        });
                        break;
                    }
                }
            }
            let mut shared = self.shared.borrow_mut();
            shared.done.push(format!(
                "{:.3}s {what}: ended (asked at {:.3}s)",
                turmoil::sim_elapsed().unwrap_or_default().as_secs_f64(),
                started.as_secs_f64(),
            ));
            shared.finished = true;
        }
    }

    /// Makes `step`, asking the members until the leader makes it; a
    /// violation if a leader tells an untruth about it.
    ///
    /// Cancel safety: safe to drop; a change asked for may be made anyway.
    async fn make(&self, step: Step) -> Result<(), Violation> {
        let mut open = false;
        let mut ask: VecDeque<String> = VecDeque::new();
        let mut pause = Duration::from_millis(50);
        loop {
            if ask.is_empty() {
                let voters = self.shared.borrow().voters.clone();
                ask.extend(
                    voters
                        .iter()
                        .map(|&id| format!("{}:{PORT}", member_host(id))),
                );
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(Duration::from_millis(500));
            }
            let target = ask.pop_front().expect("refilled above");
            let Ok(mut admin) = admin(&target).await else {
                continue;
            };
            let Ok(before) = status(&mut admin).await else {
                continue;
            };
            if !before.leads() {
                if let Some(leader) = before.leader_address() {
                    ask.retain(|a| *a != leader);
                    ask.push_front(leader);
                }
                continue;
            }
            let made_before = before.made(step);
            if made_before {
                // An earlier attempt, whose answer was open, made it.
                return self.made(step);
            }
            let reply = tokio::time::timeout(CALL_TIMEOUT, async {
                match step {
                    Step::Promote(id) => admin.promote(pb::MemberRequest { id }).await,
                    Step::Remove(id) => admin.remove(pb::MemberRequest { id }).await,
                }
            })
            .await;
            let status = match reply {
                Ok(Ok(_)) => return self.made(step),
                Ok(Err(status)) => status,
                Err(_) => {
                    open = true;
                    continue;
                }
            };
            // An answer of the member's own (not a broken connection,
            // after which the change may go on), to a call that found no
            // change under way: one under way already was an earlier
            // attempt's, which the member may finish meanwhile and then
            // rightly answer this one as made before (`NOT_FOUND`).
            let answered = std::error::Error::source(&status).is_none();
            let started_here = !before.0.changing;
            if let (true, true, Ok(after)) =
                (answered, started_here, self::status(&mut admin).await)
            {
                if after.leads() && after.0.term == before.0.term && after.made(step) {
                    return Err(Violation {
                        rule: "the operator is told the truth",
                        lock: 0,
                        detail: format!(
                            "{step:?}: member {} led in term {} before and after, made the \
                             change and answered {:?}: {}",
                            after.0.node_id,
                            after.0.term,
                            status.code(),
                            status.message()
                        ),
                    });
                }
            }
            match (status.code(), step) {
                (tonic::Code::AlreadyExists, Step::Promote(_))
                | (tonic::Code::NotFound, Step::Remove(_))
                    if open =>
                {
                    return self.made(step)
                }
                (tonic::Code::NotFound, Step::Promote(_)) => {
                    // The new member has not added itself yet.
                    ask.push_front(target);
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                (tonic::Code::FailedPrecondition, _) => {
                    // Not the leader any more, or a change not committed
                    // yet: nothing made, or open if the leader was deposed.
                    open = true;
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                _ => {
                    open = true;
                    tracing::info!(
                        target: "locksmith_sim::membership",
                        ?step, code = ?status.code(), message = status.message(),
                        "a change not made yet"
                    );
                }
            }
        }
    }

    /// Notes `step` made; a removed member is stopped.
    fn made(&self, step: Step) -> Result<(), Violation> {
        let mut shared = self.shared.borrow_mut();
        match step {
            Step::Promote(id) => shared.voters.push(id),
            Step::Remove(id) => {
                shared.voters.retain(|&v| v != id);
                shared.retire.push(id);
            }
        }
        tracing::info!(target: "locksmith_sim::membership", ?step, "made");
        Ok(())
    }
}

/// A member's view of the membership.
struct View(pb::ClusterStatus);

impl View {
    fn leads(&self) -> bool {
        self.0.leader_id == self.0.node_id && self.0.leader_id != 0
    }

    fn leader_address(&self) -> Option<String> {
        self.0
            .members
            .iter()
            .find(|m| m.id == self.0.leader_id && self.0.leader_id != 0)
            .map(|m| m.address.clone())
    }

    /// Whether `step` shows as made: the member a voter, or gone, and no
    /// change of voters under way.
    fn made(&self, step: Step) -> bool {
        if self.0.changing {
            return false;
        }
        match step {
            Step::Promote(id) => self.0.members.iter().any(|m| m.id == id && m.voter),
            Step::Remove(id) => self.0.members.iter().all(|m| m.id != id),
        }
    }
}

/// A client of the admin service of the member at `address`.
///
/// Cancel safety: safe (a dropped connect leaves nothing behind).
async fn admin(address: &str) -> Result<ClusterClient<Channel>, tonic::transport::Error> {
    let endpoint =
        Endpoint::from_shared(format!("http://{address}"))?.connect_timeout(Duration::from_secs(1));
    let channel = transport::connect(endpoint, Some(&crate::cluster::connector())).await?;
    Ok(ClusterClient::new(channel))
}

/// A member's status.
///
/// Cancel safety: safe, read-only.
async fn status(admin: &mut ClusterClient<Channel>) -> Result<View, tonic::Status> {
    let asked = tokio::time::timeout(Duration::from_secs(2), admin.status(pb::StatusRequest {}));
    match asked.await {
        Ok(answer) => Ok(View(answer?.into_inner())),
        Err(_) => Err(tonic::Status::deadline_exceeded("no status within 2 s")),
    }
}
