//! The members of a lock-server cluster as a client knows them
//! (`locksmith://h1:p1,h2:p2,h3:p3`), and the one it talks to.
//!
//! The client talks to one member at a time: the leader, as far as it knows.
//! When that member fails, it tries the next one in the list; when a member
//! answers that it is not the leader and names the leader (gRPC metadata
//! [`locksmith_proto::LEADER_METADATA`]), the client goes there at once, and
//! adds the address to its list if it was not on it (a member added to the
//! cluster after the client started).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use locksmith_proto::v1::locksmith_client::LocksmithClient;
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
}

/// The members and which one is current.
pub(super) struct Members {
    members: Mutex<Vec<Member>>,
    current: AtomicUsize,
    /// How to reach a member (TLS, credentials), for those added later.
    url: ServerUrl,
}

impl Members {
    /// Parses `locksmith[+tls]://host[:port][,host[:port]...][?options]`
    /// (module `url`). Connects to nothing yet: each channel connects on
    /// first use and reconnects by itself.
    pub(super) fn parse(url: &str) -> Result<Members> {
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

    /// The member at `at` failed: the next one becomes current, unless
    /// another caller moved on already.
    pub(super) fn failed(&self, at: usize) {
        let len = self.len();
        let _ =
            self.current
                .compare_exchange(at, (at + 1) % len, Ordering::AcqRel, Ordering::Acquire);
    }

    /// If `status` is a member's "not the leader" answer naming the leader,
    /// makes the leader current (adding it if it is new) and returns true.
    pub(super) fn follow(&self, status: &Status) -> bool {
        let Some(leader) = leader_of(status) else {
            return false;
        };
        let mut list = self.list();
        let at = match list.iter().position(|m| m.addr == leader) {
            Some(at) => at,
            None => match member(&self.url, leader.clone()) {
                Ok(new) => {
                    list.push(new);
                    list.len() - 1
                }
                Err(_) => return false,
            },
        };
        self.current.store(at, Ordering::Release);
        tracing::debug!(backend = super::BACKEND, %leader, "following the leader");
        true
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

    #[tokio::test]
    async fn a_redirect_makes_the_leader_current_and_adds_a_new_one() {
        let members = Members::parse("locksmith://a:1,b:2").unwrap();
        assert_eq!(members.current().1, "a:1");
        let mut status = Status::unavailable("not the leader");
        status
            .metadata_mut()
            .insert(locksmith_proto::LEADER_METADATA, "b:2".parse().unwrap());
        assert!(members.follow(&status));
        assert_eq!(members.current().1, "b:2");
        status
            .metadata_mut()
            .insert(locksmith_proto::LEADER_METADATA, "c:3".parse().unwrap());
        assert!(members.follow(&status));
        assert_eq!(members.current().1, "c:3");
        assert_eq!(members.len(), 3);
        assert!(!members.follow(&Status::unavailable("down")));
        assert_eq!(members.current().1, "c:3");
    }

    #[tokio::test]
    async fn a_failure_moves_to_the_next_member_once() {
        let members = Members::parse("locksmith://a:1,b:2,c:3").unwrap();
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
}
