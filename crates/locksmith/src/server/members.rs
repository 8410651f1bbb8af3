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
//! **passed over** for a while: the rotation skips it, and a hint that
//! names it is not followed. Its followers keep naming a frozen leader
//! until they elect another, hundreds of milliseconds later; going back to
//! it would spend a whole reconnect attempt on a member that answers
//! nothing, while the session's TTL runs. A member that answers, even to
//! refuse ("no leader yet"), or whose connection is refused at once, is
//! not passed over: it costs no time, and it may be the next leader.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

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
    /// When it last answered nothing in time.
    unresponsive_at: Option<Instant>,
}

/// The members and which one is current.
pub(super) struct Members {
    members: Mutex<Vec<Member>>,
    current: AtomicUsize,
    /// How to reach a member (TLS, credentials), for those added later.
    url: ServerUrl,
    /// How long a member that answered nothing is passed over.
    pass_over: Duration,
}

/// What a member's refusal says about where to go next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Redirect {
    /// It names no leader.
    None,
    /// It names the leader, which is current now.
    Leader,
    /// It names a leader that answered nothing a moment ago (it has not
    /// noticed yet): the next member not passed over is current now, worth
    /// a try after a pause, since an election is probably under way.
    Stale,
}

impl Members {
    /// Parses `locksmith[+tls]://host[:port][,host[:port]...][?options]`
    /// (module `url`); a member that answers nothing in time is passed
    /// over for `pass_over`.
    /// Connects to nothing yet: each channel connects on first use and
    /// reconnects by itself.
    pub(super) fn parse(url: &str, pass_over: Duration) -> Result<Members> {
        let url = ServerUrl::parse(url)?;
        let members = url
            .addresses()
            .iter()
            .map(|addr| member(&url, addr.clone()))
            .collect::<Result<Vec<_>>>()?;
        Ok(Members {
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

    /// The member to talk to: its position (for [`Members::failed`]), its
    /// address and a client.
    pub(super) fn current(&self) -> (usize, String, Stub) {
        let list = self.list();
        let at = self.current.load(Ordering::Acquire) % list.len();
        (at, list[at].addr.clone(), list[at].client.clone())
    }

    /// The member at `at` could not serve (down, refusing connections):
    /// the next member not passed over (or, when all are, the next one)
    /// becomes current, unless another caller moved on already.
    pub(super) fn failed(&self, at: usize) {
        self.move_on(&self.list(), at);
    }

    /// The member at `at` answered nothing in time: as [`Members::failed`],
    /// and it is passed over for a while.
    pub(super) fn unresponsive(&self, at: usize) {
        let mut list = self.list();
        if let Some(member) = list.get_mut(at) {
            member.unresponsive_at = Some(Instant::now());
        }
        self.move_on(&list, at);
    }

    /// Makes the member after `at` current (the next one not passed over,
    /// if any), unless another caller moved on from `at` already.
    fn move_on(&self, list: &[Member], at: usize) {
        let len = list.len();
        let next = (1..=len)
            .map(|step| (at + step) % len)
            .find(|&i| !self.passed_over(&list[i]))
            .unwrap_or((at + 1) % len);
        let _ = self
            .current
            .compare_exchange(at, next, Ordering::AcqRel, Ordering::Acquire);
    }

    fn passed_over(&self, member: &Member) -> bool {
        member
            .unresponsive_at
            .is_some_and(|at| at.elapsed() < self.pass_over)
    }

    /// Where `status`, the answer of the member at `at`, sends the client.
    /// If it is a "not the leader" answer naming the leader, makes the
    /// leader current (adding it if it is new), unless that member is
    /// passed over ([`Redirect::Stale`]: then the next member is current).
    pub(super) fn follow(&self, status: &Status, at: usize) -> Redirect {
        let Some(leader) = leader_of(status) else {
            return Redirect::None;
        };
        let mut list = self.list();
        let to = match list.iter().position(|m| m.addr == leader) {
            Some(to) if self.passed_over(&list[to]) => {
                tracing::debug!(backend = super::BACKEND, %leader, "not following the leader named: it answered nothing a moment ago");
                self.move_on(&list, at);
                return Redirect::Stale;
            }
            Some(to) => to,
            None => match member(&self.url, leader.clone()) {
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

fn member(url: &ServerUrl, addr: String) -> Result<Member> {
    let channel = url
        .endpoint(&addr)?
        .connect_timeout(Duration::from_secs(5))
        .tcp_nodelay(true)
        .http2_keep_alive_interval(Duration::from_secs(10))
        .keep_alive_timeout(Duration::from_secs(20))
        .keep_alive_while_idle(true)
        .connect_lazy();
    Ok(Member {
        addr,
        client: LocksmithClient::with_interceptor(channel, url.credentials())
            .max_decoding_message_size(MAX_RESPONSE_BYTES),
        unresponsive_at: None,
    })
}

/// Rounds over the members while none serves: each member once per round,
/// a pause between rounds, until a deadline. An election (every member
/// answering "no leader yet") or a leader's restart is waited out this way
/// rather than failing at once.
pub(super) struct Rounds {
    deadline: tokio::time::Instant,
    left_in_round: usize,
    pause: Duration,
}

impl Rounds {
    /// Rounds over `members` for at most `patience`.
    pub(super) fn new(members: &Members, patience: Duration) -> Rounds {
        Rounds {
            deadline: tokio::time::Instant::now() + patience,
            left_in_round: members.len(),
            pause: Duration::from_millis(20),
        }
    }

    /// Whether to try again after a member failed; waits first when every
    /// member failed once since the last pause.
    ///
    /// Cancel safety: safe (a sleep).
    pub(super) async fn again(&mut self, members: &Members) -> bool {
        if tokio::time::Instant::now() >= self.deadline {
            return false;
        }
        self.left_in_round = self.left_in_round.saturating_sub(1);
        if self.left_in_round == 0 {
            let pause = self.pause.min(self.deadline - tokio::time::Instant::now());
            tokio::time::sleep(pause).await;
            self.pause = (self.pause * 2).min(Duration::from_millis(100));
            self.left_in_round = members.len();
        }
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
        assert_eq!(members.follow(&naming("b:2"), 0), Redirect::Leader);
        assert_eq!(members.current().1, "b:2");
        assert_eq!(members.follow(&naming("c:3"), 1), Redirect::Leader);
        assert_eq!(members.current().1, "c:3");
        assert_eq!(members.len(), 3);
        assert_eq!(
            members.follow(&Status::unavailable("down"), 2),
            Redirect::None
        );
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
    /// has been passed over for a while.
    #[tokio::test(start_paused = true)]
    async fn a_member_that_answers_nothing_is_passed_over_for_a_while() {
        let members = Members::parse("locksmith://a:1,b:2,c:3", PASS_OVER).unwrap();
        members.unresponsive(0);
        assert_eq!(members.current().1, "b:2");
        // b has not noticed: it still names a.
        assert_eq!(members.follow(&naming("a:1"), 1), Redirect::Stale);
        assert_eq!(members.current().1, "c:3", "on to the next, not to a");
        assert_eq!(members.follow(&naming("a:1"), 2), Redirect::Stale);
        assert_eq!(members.current().1, "b:2", "around the list, past a");
        // b, then c, refuse connections: the rotation still skips a, and
        // neither is passed over (each answers at once; either may lead
        // next).
        members.failed(1);
        assert_eq!(members.current().1, "c:3");
        members.failed(2);
        assert_eq!(members.current().1, "b:2");
        // The others elected c: its name is followed at once.
        assert_eq!(members.follow(&naming("c:3"), 2), Redirect::Leader);
        assert_eq!(members.current().1, "c:3");
        // A while later, a is followed again (it may lead once more).
        tokio::time::advance(PASS_OVER).await;
        assert_eq!(members.follow(&naming("a:1"), 2), Redirect::Leader);
        assert_eq!(members.current().1, "a:1");
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
}
