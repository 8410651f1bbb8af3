//! The members of a lock-server cluster as a client knows them
//! (`locksmith://h1:p1,h2:p2,h3:p3`), and the one it talks to.
//!
//! The client talks to one member at a time: the leader, as far as it knows.
//! When that member fails, it tries the next one in the list; when a member
//! answers that it is not the leader and names the leader (gRPC metadata
//! [`locksmith_proto::LEADER_METADATA`]), the client goes there at once, and
//! adds the address to its list if it was not on it (a member added to the
//! cluster after the client started).
//!
//! A member that answers nothing in time (frozen, or its machine gone) is
//! **passed over** for a while: the rotation skips it, and a hint naming it is
//! not followed. The followers of a frozen leader keep naming it until they
//! elect another, hundreds of milliseconds later; going back to it would spend
//! a whole attempt on a member that answers nothing while the session's TTL
//! runs. The client stays instead with the follower that answered and asks it
//! again after a pause ([`Redirect::Stale`]): that follower names the new
//! leader once one is elected. A leader cut off from a quorum of its cluster is
//! passed over in the same way: it ends its streams and refuses resumes while
//! it cannot commit, and its followers name it until they elect another (the
//! server marks such refusals with [`locksmith_proto::CUT_OFF_METADATA`],
//! saying how long an election may take); once that time has passed, a hint
//! naming it is followed again, since nobody else was elected and it may serve
//! again. Any other member that answers, even to refuse, or whose connection is
//! refused at once, is not passed over: it costs no time, and it may be the
//! next leader. Nor is a member whose connection broke (a crash): passed over
//! for a fixed while, it was ignored past its re-election, or followed back
//! before its followers noticed (docs/RELIABILITY.md, calm seeds 163 and 256).
//! Such a member is **broken** instead, until it answers again: an attempt on
//! it (by the rotation, or following a hint that names it) waits for its first
//! answer only a few round trips ([`Members::broken`]), so that a follower's
//! stale hint naming a crashed leader costs a moment, not a whole attempt,
//! while a leader restarted and elected again is followed back at once.
//!
//! Between rounds of attempts the client pauses, longer each round, but
//! never long beside the session's TTL ([`Rounds::for_session`]): once a new
//! leader serves, the session must resume there before its TTL runs out,
//! not sleep through its last chance.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use locksmith_core::planted::{self, Defect};
use locksmith_proto::transport::{self, Connector};
use locksmith_proto::v1::locksmith_client::LocksmithClient;
use tokio::time::Instant;
use tonic::Status;

use super::url::{ServerUrl, Stub};
use super::MAX_RESPONSE_BYTES;
use crate::error::Result;

/// One member: its address and a lazily connected channel to it.
#[derive(Clone)]
struct Member {
    /// `host:port`.
    addr: String,
    client: Stub,
    /// The address the cluster knows it by, when the client reached it
    /// under another name (DNS, a proxy) and the member said so.
    known_as: Option<String>,
    /// Until when it is passed over, after it answered nothing in time.
    passed_over_until: Option<Instant>,
    /// Its connection broke (or could not be made), and it has not answered
    /// since.
    broken: bool,
}

impl Member {
    /// Whether a leader hint naming `leader` means this member.
    fn is(&self, leader: &str) -> bool {
        self.addr == leader || self.known_as.as_deref() == Some(leader)
    }

    fn passed_over(&self) -> bool {
        self.passed_over_until
            .is_some_and(|until| Instant::now() < until)
    }
}

/// The members and which one is current.
pub(super) struct Members {
    members: Mutex<Vec<Member>>,
    current: AtomicUsize,
    /// How to reach a member (TLS, credentials), for those added later.
    url: ServerUrl,
    /// What opens the connections, when not TCP (a simulated network's).
    connector: Option<Connector>,
    /// How long a member that answered nothing is passed over.
    pass_over: Duration,
}

/// Where a member's refusal sends the client.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Redirect {
    /// It names no leader.
    None,
    /// It names the leader, which is current now.
    Leader,
    /// It names a leader that is passed over (the member has not noticed
    /// yet that it stopped answering): the member that answered stays
    /// current, to be asked again after a pause.
    Stale,
}

impl Members {
    /// Parses `locksmith[+tls]://host[:port][,host[:port]...][?options]`
    /// (module `url`); a member that answers nothing in time is passed over
    /// for `pass_over`. Connects to nothing yet: each channel connects on
    /// first use and reconnects by itself.
    #[cfg(test)]
    pub(super) fn parse(url: &str, pass_over: Duration) -> Result<Members> {
        Members::parse_with(url, pass_over, None)
    }

    /// Parses as `parse` does; the channels connect through `connector`
    /// when given, else over TCP.
    pub(super) fn parse_with(
        url: &str,
        pass_over: Duration,
        connector: Option<Connector>,
    ) -> Result<Members> {
        let url = ServerUrl::parse(url)?;
        let members = url
            .addresses()
            .iter()
            .map(|addr| member(&url, connector.as_ref(), addr.clone()))
            .collect::<Result<Vec<_>>>()?;
        Ok(Members {
            connector,
            members: Mutex::new(members),
            current: AtomicUsize::new(0),
            url,
            pass_over,
        })
    }

    fn list(&self) -> MutexGuard<'_, Vec<Member>> {
        self.members.lock().expect("member list poisoned")
    }

    /// The members' addresses, in order.
    pub(super) fn addresses(&self) -> Vec<String> {
        self.list().iter().map(|m| m.addr.clone()).collect()
    }

    /// How many members the client knows.
    pub(super) fn len(&self) -> usize {
        self.list().len()
    }

    /// The URL the members were given by.
    pub(super) fn url(&self) -> &ServerUrl {
        &self.url
    }

    /// What opens connections, when not TCP.
    pub(super) fn connector(&self) -> Option<&Connector> {
        self.connector.as_ref()
    }

    /// The member to talk to: its position (for [`Members::failed`]), its
    /// address and a client.
    pub(super) fn current(&self) -> (usize, String, Stub) {
        let list = self.list();
        let at = self.current.load(Ordering::Acquire) % list.len();
        (at, list[at].addr.clone(), list[at].client.clone())
    }

    /// The member at `at` could not serve (down, refusing connections, no
    /// leader known): the next member not passed over (the next one, when
    /// all are) becomes current, unless another caller moved on already.
    pub(super) fn failed(&self, at: usize) {
        self.move_on(&self.list(), at);
    }

    /// The member at `at` answered nothing in time (or leads but cannot
    /// commit): it is passed over for a while, under every name the client
    /// knows it by (its URL's and the cluster's can be two entries), and the
    /// next member becomes current as with [`Members::failed`].
    pub(super) fn unresponsive(&self, at: usize) {
        self.pass_over(at, self.pass_over, "answered nothing or cannot commit");
    }

    /// Passes the member at `at` over for `period` (`why`, for the log),
    /// under every name the client knows it by (its URL's and the
    /// cluster's can be two entries), and moves on as [`Members::failed`]
    /// does.
    fn pass_over(&self, at: usize, period: Duration, why: &str) {
        let mut list = self.list();
        if let Some(member) = list.get(at) {
            let name = member
                .known_as
                .clone()
                .unwrap_or_else(|| member.addr.clone());
            tracing::debug!(backend = super::BACKEND, addr = %member.addr, ?period, "passing over a member: {why}");
            let until = Instant::now() + period;
            for (i, member) in list.iter_mut().enumerate() {
                if i == at || member.is(&name) {
                    member.passed_over_until = Some(until);
                }
            }
        }
        self.move_on(&list, at);
    }

    /// The member at `at` could not serve, as `status` (a [`member_down`]
    /// refusal) says. A leader cut off from a quorum of the cluster is passed
    /// over while its followers may still name it (until they elect
    /// another), as long as its mark says (never longer than a member that
    /// answered nothing): coming back sooner would only be refused again,
    /// and later could miss it serving again, when its quorum came back
    /// and nobody else was elected (a slow link, not a partition). Any
    /// other goes to the back as with [`Members::failed`].
    pub(super) fn could_not_serve(&self, at: usize, status: &Status) {
        match status.metadata().get(locksmith_proto::CUT_OFF_METADATA) {
            Some(mark) => {
                let period = mark
                    .to_str()
                    .ok()
                    .and_then(|ms| ms.parse().ok())
                    .map_or(self.pass_over, |ms| {
                        Duration::from_millis(ms).min(self.pass_over)
                    });
                self.pass_over(at, period, "cut off from its quorum");
            }
            None => self.failed(at),
        }
    }

    /// The connection to the member at `at` broke, or could not be made (a
    /// transport error, not an answer of the member's): it is broken, under
    /// every name the client knows it by, until it answers again, and the
    /// next member becomes current as with [`Members::failed`].
    pub(super) fn broke(&self, at: usize) {
        self.mark_broken(at, true);
        self.move_on(&self.list(), at);
    }

    /// The member at `at`, broken, did not answer within its short attempt:
    /// the next attempt on it is a whole one again (on a slow network a
    /// member that is up must still be reachable, however short the TTL),
    /// and the next member becomes current as with [`Members::failed`].
    pub(super) fn out_of_patience(&self, at: usize) {
        self.mark_broken(at, false);
        self.move_on(&self.list(), at);
    }

    /// The member at `at` answered (anything, even a refusal): it is no
    /// longer broken.
    pub(super) fn answered(&self, at: usize) {
        self.mark_broken(at, false);
    }

    fn mark_broken(&self, at: usize, broken: bool) {
        let mut list = self.list();
        let Some(member) = list.get(at) else { return };
        if member.broken == broken {
            return;
        }
        let name = member
            .known_as
            .clone()
            .unwrap_or_else(|| member.addr.clone());
        if broken {
            tracing::debug!(backend = super::BACKEND, addr = %member.addr, "its connection broke: the next attempt on it is short");
        }
        for (i, member) in list.iter_mut().enumerate() {
            if i == at || member.is(&name) {
                member.broken = broken;
            }
        }
    }

    /// Whether the member at `at` is broken: its connection broke, and it
    /// has not answered since. An attempt on it gives it only a few round
    /// trips to answer: a crashed machine answers nothing at all, and its
    /// followers name it for a while after the crash.
    ///
    /// With the stale hint put back, no member is broken, as when that
    /// defect shipped: the short attempt came later and made following a
    /// stale hint cheap.
    pub(super) fn broken(&self, at: usize) -> bool {
        !planted::active(Defect::StaleHint)
            && self.list().get(at).is_some_and(|member| member.broken)
    }

    /// The member at `at` said the cluster knows it as `address` (empty:
    /// it did not say), which its followers' leader hints name.
    pub(super) fn known_as(&self, at: usize, address: &str) {
        let mut list = self.list();
        if let Some(member) = list.get_mut(at) {
            if !address.is_empty() && member.addr != address {
                member.known_as = Some(address.to_owned());
            }
        }
    }

    fn move_on(&self, list: &[Member], at: usize) {
        let len = list.len();
        let next = (1..=len)
            .map(|step| (at + step) % len)
            .find(|&i| !list[i].passed_over())
            .unwrap_or((at + 1) % len);
        let _ = self
            .current
            .compare_exchange(at, next, Ordering::AcqRel, Ordering::Acquire);
    }

    /// Where `status`, a member's refusal, sends the client: to the leader
    /// it names (made current, and added if it is new), unless that leader
    /// is passed over.
    pub(super) fn follow(&self, status: &Status) -> Redirect {
        let Some(leader) = leader_of(status) else {
            return Redirect::None;
        };
        let mut list = self.list();
        let to = match list.iter().position(|m| m.is(&leader)) {
            Some(to) if list[to].passed_over() && !planted::active(Defect::StaleHint) => {
                tracing::debug!(backend = super::BACKEND, %leader, "not following the leader named: it answered nothing a moment ago");
                return Redirect::Stale;
            }
            Some(to) => to,
            None => match member(&self.url, self.connector.as_ref(), leader.clone()) {
                Ok(new) => {
                    list.push(new);
                    list.len() - 1
                }
                Err(_) => return Redirect::None,
            },
        };
        self.current.store(to, Ordering::Release);
        tracing::debug!(backend = super::BACKEND, %leader, "following the leader");
        Redirect::Leader
    }
}

/// The leader a member's answer names, if it says it is not the leader.
pub(super) fn leader_of(status: &Status) -> Option<String> {
    let value = status.metadata().get(locksmith_proto::LEADER_METADATA)?;
    let leader = value.to_str().ok()?.trim();
    (!leader.is_empty()).then(|| leader.to_owned())
}

fn member(url: &ServerUrl, connector: Option<&Connector>, addr: String) -> Result<Member> {
    let endpoint = url
        .endpoint(&addr)?
        .connect_timeout(Duration::from_secs(5))
        .tcp_nodelay(true)
        .http2_keep_alive_interval(Duration::from_secs(10))
        .keep_alive_timeout(Duration::from_secs(20))
        .keep_alive_while_idle(true);
    let channel = transport::channel(endpoint, connector);
    Ok(Member {
        addr,
        client: LocksmithClient::with_interceptor(channel, url.credentials())
            .max_decoding_message_size(MAX_RESPONSE_BYTES),
        known_as: None,
        passed_over_until: None,
        broken: false,
    })
}

/// The first pause between rounds of attempts; each one after is twice as
/// long, up to a longest.
const FIRST_PAUSE: Duration = Duration::from_millis(20);

/// The longest pause between rounds of a session's attempts to resume (or
/// open anew), whatever its TTL: enough to spare a cluster that is down.
const LONGEST_SESSION_PAUSE: Duration = Duration::from_secs(1);

/// Rounds over the members while none serves: each member once per round,
/// a pause between rounds, until a deadline. An election (every member
/// answering "no leader yet") or a leader's restart is waited out this way
/// rather than failing at once. Members that refuse at once cost a round
/// nothing: only a whole round of failures pauses, so that going past
/// members that are not started does not add up pauses.
pub(super) struct Rounds {
    deadline: Option<Instant>,
    left_in_round: usize,
    pause: Duration,
    longest_pause: Duration,
}

impl Rounds {
    /// Rounds over `members` for at most `patience`, pausing 20 ms
    /// ([`FIRST_PAUSE`]), then twice as long each time up to 100 ms.
    pub(super) fn new(members: &Members, patience: Duration) -> Rounds {
        Rounds {
            deadline: Some(Instant::now() + patience),
            ..Rounds::endless(members, Duration::from_millis(100))
        }
    }

    /// Rounds without a deadline for a session of `ttl`, pausing up to a
    /// twentieth of it (at most [`LONGEST_SESSION_PAUSE`]). However long an
    /// election took, the session resumes within that much of the new
    /// leader's first answer; a longer sleep could outlast the session's
    /// trust while a leader serves, and lose it for nothing.
    pub(super) fn for_session(members: &Members, ttl: Duration) -> Rounds {
        Rounds::endless(
            members,
            (ttl / 20).clamp(FIRST_PAUSE, LONGEST_SESSION_PAUSE),
        )
    }

    /// Rounds without a deadline, pausing up to `longest_pause`.
    fn endless(members: &Members, longest_pause: Duration) -> Rounds {
        Rounds {
            deadline: None,
            left_in_round: members.len(),
            pause: FIRST_PAUSE,
            longest_pause,
        }
    }

    /// The pause to take after a member failed: none while a member of this
    /// round is still untried.
    pub(super) fn after_failure(&mut self, members: &Members) -> Duration {
        self.left_in_round = self.left_in_round.saturating_sub(1);
        if self.left_in_round > 0 {
            return Duration::ZERO;
        }
        self.left_in_round = members.len();
        self.next_pause()
    }

    /// The pause to take before asking the same member again: it named a
    /// leader that is passed over, or refused the request itself.
    pub(super) fn before_asking_again(&mut self) -> Duration {
        self.next_pause()
    }

    fn next_pause(&mut self) -> Duration {
        let pause = self.pause;
        self.pause = (self.pause * 2).min(self.longest_pause);
        match self.deadline {
            Some(deadline) => pause.min(deadline.saturating_duration_since(Instant::now())),
            None => pause,
        }
    }

    /// Whether to try again after a member failed (`stale`: it named a
    /// leader that is passed over, so it is asked again); pauses first as
    /// [`Rounds::after_failure`] or [`Rounds::before_asking_again`] say.
    ///
    /// Cancel safety: safe (a sleep).
    pub(super) async fn again(&mut self, members: &Members, stale: bool) -> bool {
        if self
            .deadline
            .is_some_and(|deadline| Instant::now() >= deadline)
        {
            return false;
        }
        let pause = if stale {
            self.before_asking_again()
        } else {
            self.after_failure(members)
        };
        tokio::time::sleep(pause).await;
        true
    }
}

/// Whether `status` says the member could not serve at all (unreachable,
/// stopping, broken connection), so the next member is worth trying; an
/// answer about the request itself is not.
pub(super) fn member_down(status: &Status) -> bool {
    use tonic::Code;
    matches!(
        status.code(),
        Code::Unavailable | Code::Unknown | Code::Cancelled | Code::DeadlineExceeded
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    const PASS_OVER: Duration = Duration::from_secs(1);

    fn naming(leader: &str) -> Status {
        let mut status = Status::unavailable("not the leader");
        status
            .metadata_mut()
            .insert(locksmith_proto::LEADER_METADATA, leader.parse().unwrap());
        status
    }

    #[tokio::test]
    async fn a_redirect_makes_the_leader_current_and_adds_a_new_one() {
        let members = Members::parse("locksmith://a:1,b:2", PASS_OVER).unwrap();
        assert_eq!(members.current().1, "a:1");
        assert_eq!(members.follow(&naming("b:2")), Redirect::Leader);
        assert_eq!(members.current().1, "b:2");
        assert_eq!(members.follow(&naming("c:3")), Redirect::Leader);
        assert_eq!(members.current().1, "c:3");
        assert_eq!(members.len(), 3);
        assert_eq!(members.follow(&Status::unavailable("down")), Redirect::None);
        assert_eq!(members.current().1, "c:3");
    }

    #[tokio::test]
    async fn a_failure_moves_to_the_next_member_once() {
        let members = Members::parse("locksmith://a:1,b:2,c:3", PASS_OVER).unwrap();
        let (at, _, _) = members.current();
        members.failed(at);
        members.failed(at);
        assert_eq!(
            members.current().1,
            "b:2",
            "a second report of a:1 is stale"
        );
        let (at, _, _) = members.current();
        members.failed(at);
        members.failed(2);
        assert_eq!(members.current().1, "a:1", "around the list");
    }

    /// A leader that stopped answering is not gone back to on the word of
    /// a follower that has not noticed yet, nor by the rotation, until it
    /// has been passed over for a while; the follower is asked again.
    #[tokio::test(start_paused = true)]
    async fn a_member_that_answers_nothing_is_passed_over_for_a_while() {
        let members = Members::parse("locksmith://a:1,b:2,c:3", PASS_OVER).unwrap();
        members.unresponsive(0);
        assert_eq!(members.current().1, "b:2");
        // b has not noticed: it still names a. The client stays with b.
        assert_eq!(members.follow(&naming("a:1")), Redirect::Stale);
        assert_eq!(members.current().1, "b:2", "b is asked again, not a");
        // b, then c, refuse connections: the rotation skips a, and neither
        // is passed over (each answers at once; either may lead next).
        members.failed(1);
        assert_eq!(members.current().1, "c:3");
        members.failed(2);
        assert_eq!(members.current().1, "b:2", "around the list, past a");
        // b and c elected c: its name is followed at once.
        assert_eq!(members.follow(&naming("c:3")), Redirect::Leader);
        assert_eq!(members.current().1, "c:3");
        // A while later, a is followed again (it may lead once more).
        tokio::time::advance(PASS_OVER).await;
        assert_eq!(members.follow(&naming("a:1")), Redirect::Leader);
        assert_eq!(members.current().1, "a:1");
    }

    /// A member reached under another name (a proxy, a DNS name) is known
    /// under both once it says which: a follower's hint naming a frozen
    /// leader by the cluster's name does not send the client back to it.
    #[tokio::test(start_paused = true)]
    async fn a_member_is_known_by_the_name_it_gives() {
        let members = Members::parse("locksmith://proxy-a:1,proxy-b:2", PASS_OVER).unwrap();
        members.known_as(0, "a:1");
        members.known_as(1, "");
        members.unresponsive(0);
        assert_eq!(members.follow(&naming("a:1")), Redirect::Stale);
        assert_eq!(members.current().1, "proxy-b:2");
        tokio::time::advance(PASS_OVER).await;
        assert_eq!(members.follow(&naming("a:1")), Redirect::Leader);
        assert_eq!(members.current().1, "proxy-a:1", "no third entry");
        assert_eq!(members.len(), 2);
    }

    /// A member the client knows under two entries (its URL's name and, from
    /// an earlier hint, the cluster's) is passed over under both.
    #[tokio::test(start_paused = true)]
    async fn a_member_known_twice_is_passed_over_under_both_names() {
        let members = Members::parse("locksmith://proxy-a:1,proxy-b:2", PASS_OVER).unwrap();
        members.known_as(0, "a:1");
        assert_eq!(members.follow(&naming("a:1")), Redirect::Leader);
        assert_eq!(members.current().1, "proxy-a:1");
        members.unresponsive(0);
        assert_eq!(members.current().1, "proxy-b:2");
        // An earlier hint, from before the client knew the other name.
        let members = Members::parse("locksmith://proxy-a:1,proxy-b:2", PASS_OVER).unwrap();
        assert_eq!(members.follow(&naming("a:1")), Redirect::Leader);
        assert_eq!(members.len(), 3);
        members.known_as(0, "a:1");
        members.unresponsive(2);
        assert_eq!(members.current().1, "proxy-b:2", "past proxy-a:1");
        members.failed(1);
        assert_eq!(members.current().1, "proxy-b:2", "a:1 is skipped too");
    }

    fn cut_off(elects_within_ms: &'static str) -> Status {
        let mut cut_off = Status::unavailable("this member cannot reach a quorum");
        cut_off.metadata_mut().insert(
            locksmith_proto::CUT_OFF_METADATA,
            tonic::metadata::MetadataValue::from_static(elects_within_ms),
        );
        cut_off
    }

    /// A leader cut off from its peers ends the stream marked so: it is
    /// passed over, and its followers' hints naming it are not followed,
    /// until they name the leader they elected or the election they could
    /// hold is over (what the mark says, never longer than a member that
    /// answered nothing is passed over). A plain refusal is not.
    #[tokio::test(start_paused = true)]
    async fn a_leader_cut_off_from_its_peers_is_passed_over_while_its_followers_elect() {
        let members = Members::parse("locksmith://a:1,b:2,c:3", PASS_OVER).unwrap();
        members.could_not_serve(0, &Status::unavailable("stopping"));
        assert_eq!(members.current().1, "b:2");
        assert_eq!(members.follow(&naming("a:1")), Redirect::Leader);

        members.could_not_serve(0, &cut_off("400"));
        assert_eq!(members.current().1, "b:2");
        assert_eq!(members.follow(&naming("a:1")), Redirect::Stale);
        assert_eq!(members.current().1, "b:2", "b is asked again");
        assert_eq!(members.follow(&naming("c:3")), Redirect::Leader);
        tokio::time::advance(Duration::from_millis(399)).await;
        assert_eq!(members.follow(&naming("a:1")), Redirect::Stale);
        // Nobody else was elected: its quorum is back, and so is it.
        tokio::time::advance(Duration::from_millis(1)).await;
        assert_eq!(members.follow(&naming("a:1")), Redirect::Leader);

        members.could_not_serve(0, &cut_off("60000"));
        tokio::time::advance(PASS_OVER - Duration::from_millis(1)).await;
        assert_eq!(members.follow(&naming("a:1")), Redirect::Stale);
        tokio::time::advance(Duration::from_millis(1)).await;
        assert_eq!(members.follow(&naming("a:1")), Redirect::Leader);
    }

    /// A member whose connection broke is not passed over: the rotation
    /// and a follower's hint still go to it (it may have been restarted
    /// and elected again), but it is broken, under each of its names,
    /// until it answers.
    #[tokio::test]
    async fn a_member_whose_connection_broke_is_broken_until_it_answers() {
        let members = Members::parse("locksmith://proxy-a:1,b:2,c:3", PASS_OVER).unwrap();
        members.known_as(0, "a:1");
        assert_eq!(members.follow(&naming("a:1")), Redirect::Leader);
        assert_eq!(members.len(), 3, "a:1 is proxy-a:1");
        members.broke(0);
        assert_eq!(members.current().1, "b:2", "on to the next member");
        assert!(members.broken(0));
        assert!(!members.broken(1));
        assert_eq!(members.follow(&naming("a:1")), Redirect::Leader);
        assert_eq!(
            members.current().1,
            "proxy-a:1",
            "followed, not passed over"
        );
        members.answered(0);
        assert!(!members.broken(0));
        // Rotating past a broken member does not skip it.
        members.broke(1);
        members.failed(2);
        assert_eq!(members.current().1, "proxy-a:1");
        members.failed(0);
        assert_eq!(
            members.current().1,
            "b:2",
            "a broken member is tried in turn"
        );
        // A short attempt that found no answer makes the next one whole.
        members.broke(0);
        members.out_of_patience(0);
        assert!(!members.broken(0));
    }

    /// A session's pauses between rounds of attempts stay short beside its
    /// TTL, so that it does not sleep through the time it has left once a
    /// leader serves again; with a long TTL they grow to a second.
    #[tokio::test]
    async fn a_session_pauses_briefly_beside_its_ttl() {
        let members = Members::parse("locksmith://a:1", PASS_OVER).unwrap();
        let pauses = |ttl| {
            let mut rounds = Rounds::for_session(&members, ttl);
            (0..10)
                .map(|_| rounds.before_asking_again().as_millis())
                .collect::<Vec<_>>()
        };
        assert_eq!(
            pauses(Duration::from_secs(2)),
            [20, 40, 80, 100, 100, 100, 100, 100, 100, 100]
        );
        assert_eq!(
            pauses(Duration::from_secs(60)),
            [20, 40, 80, 160, 320, 640, 1000, 1000, 1000, 1000]
        );
    }

    /// When every member answered nothing a moment ago, the rotation goes
    /// on in order.
    #[tokio::test(start_paused = true)]
    async fn with_every_member_passed_over_the_rotation_goes_on() {
        let members = Members::parse("locksmith://a:1,b:2", PASS_OVER).unwrap();
        members.unresponsive(0);
        assert_eq!(members.current().1, "b:2");
        members.unresponsive(1);
        assert_eq!(members.current().1, "a:1");
    }

    /// Members that refuse at once do not add up pauses: only a whole round
    /// of failures pauses, and each pause is longer than the last, up to
    /// the longest.
    #[tokio::test]
    async fn only_a_whole_round_of_failures_pauses() {
        let members = Members::parse("locksmith://a:1,b:2,c:3,d:4", PASS_OVER).unwrap();
        let mut rounds = Rounds::endless(&members, Duration::from_millis(50));
        let pauses: Vec<u128> = (0..12)
            .map(|_| rounds.after_failure(&members).as_millis())
            .collect();
        assert_eq!(pauses, [0, 0, 0, 20, 0, 0, 0, 40, 0, 0, 0, 50]);
        assert_eq!(rounds.before_asking_again(), Duration::from_millis(50));
    }
}
