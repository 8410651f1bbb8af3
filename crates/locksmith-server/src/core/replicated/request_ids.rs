//! Request ids: the client picks them, the server holds it to them.
//!
//! A session keeps each request's final reply until the client acknowledges
//! it, so that a request sent again after a reconnect is answered from the
//! kept reply instead of running twice. That is only right if it is the same
//! request: an id reused for another one (a release under an acquire's id, an
//! acquire of another lock) used to get the first request's reply, and never
//! ran. So while the server remembers an id (its request waits, or its reply
//! is kept), it also remembers a fingerprint of the request; a different
//! request under that id is refused as a protocol error and changes nothing.
//! Once the client acknowledges the reply, the id is free again.
//!
//! The check runs when a request's record is applied, so replay rebuilds the
//! fingerprints as it goes; they are not in snapshots: a reply recovered from a snapshot
//! is matched by kind only (an acquire's outcome, with as many tokens as
//! names, for an acquire; `done` for a release or renew).

use std::hash::{DefaultHasher, Hash, Hasher};

use locksmith_core::{Command, SessionId};
use locksmith_proto::v1 as pb;

use super::Replicated;
use crate::convert;
use crate::storage::Outcome;

/// What the server already knows of a request id.
pub(super) enum Known {
    /// Nothing: the request is new.
    New,
    /// The same request, answered: send the kept reply again.
    Answered(Outcome),
    /// The same request, still waiting for its outcome.
    Waiting,
    /// A different request under an id in use.
    Conflict(pb::Error),
}

impl Replicated {
    /// Checks request `id` of `session`, about to run as `command`, against
    /// what the session remembers; remembers it when it is new.
    pub(super) fn check_request_id(
        &mut self,
        session: SessionId,
        id: u64,
        command: &Command,
    ) -> Known {
        let Some(entry) = self.sessions.get_mut(&session) else {
            return Known::New;
        };
        let fingerprint = fingerprint(command);
        let kept = entry.kept_mut();
        let same = match kept.fingerprints.get(&id) {
            Some(&known) => known == fingerprint,
            None => match kept.replies.get(&id) {
                Some(outcome) => same_kind(command, outcome),
                None => {
                    kept.fingerprints.insert(id, fingerprint);
                    return Known::New;
                }
            },
        };
        let kept = kept.replies.get(&id);
        match (same, kept) {
            (false, _) => Known::Conflict(convert::error(
                pb::ErrorCode::InvalidArgument,
                format!(
                    "request id {id} is in use by another request of this session: a retry \
                     must repeat its request exactly, and a new request needs an id not in \
                     use (ids are free again once their reply is acknowledged)"
                ),
            )),
            (true, Some(outcome)) => Known::Answered(outcome.clone()),
            (true, None) => Known::Waiting,
        }
    }

    /// Forgets request `id` of `session` (refused, so nothing is kept).
    pub(super) fn forget_request_id(&mut self, session: SessionId, id: u64) {
        if let Some(entry) = self.sessions.get_mut(&session) {
            entry.kept_mut().fingerprints.remove(&id);
            entry.tidy();
        }
    }
}

/// What makes two requests the same: everything but the time an acquire may
/// wait (a client re-sending after a reconnect may shorten it) and the
/// request id itself.
fn fingerprint(command: &Command) -> u64 {
    let mut hasher = DefaultHasher::new();
    match command {
        Command::Acquire(a) => {
            "acquire".hash(&mut hasher);
            (
                &a.names,
                a.mode,
                &a.owner,
                a.lease,
                a.reentrant,
                a.lock_delay,
            )
                .hash(&mut hasher);
        }
        Command::Release {
            owner, name, token, ..
        } => ("release", owner, name, token).hash(&mut hasher),
        Command::Renew {
            owner,
            name,
            token,
            lease,
            ..
        } => ("renew", owner, name, token, lease).hash(&mut hasher),
        Command::SetHoldCount {
            owner,
            name,
            token,
            count,
            ..
        } => ("set_hold_count", owner, name, token, count).hash(&mut hasher),
        other => format!("{other:?}").hash(&mut hasher),
    }
    hasher.finish()
}

/// Whether `outcome` can be the reply to `command`, for a reply whose
/// request's fingerprint is not known.
fn same_kind(command: &Command, outcome: &Outcome) -> bool {
    match (command, outcome) {
        (Command::Acquire(a), Outcome::Granted(tokens)) => tokens.len() == a.names.len(),
        (Command::Acquire(_), Outcome::WouldBlock | Outcome::TimedOut | Outcome::Cancelled) => true,
        (
            Command::Release { .. } | Command::Renew { .. } | Command::SetHoldCount { .. },
            Outcome::Done,
        ) => true,
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use locksmith_core::{Acquire, Mode, RequestId, Wait};

    fn acquire(names: &[&str], wait: Wait) -> Command {
        Command::Acquire(Acquire {
            session: SessionId(1),
            request: RequestId(7),
            owner: "o".into(),
            names: names.iter().map(|n| n.to_string()).collect(),
            mode: Mode::Exclusive,
            wait,
            lease: None,
            reentrant: false,
            lock_delay: 0,
        })
    }

    fn release(name: &str) -> Command {
        Command::Release {
            session: SessionId(1),
            owner: "o".into(),
            name: name.into(),
            token: None,
        }
    }

    #[test]
    fn a_retry_is_the_same_request_and_another_lock_is_not() {
        let first = acquire(&["a"], Wait::Until(1_000));
        assert_eq!(
            fingerprint(&first),
            fingerprint(&acquire(&["a"], Wait::Until(900)))
        );
        assert_ne!(fingerprint(&first), fingerprint(&acquire(&["b"], Wait::No)));
        assert_ne!(fingerprint(&first), fingerprint(&release("a")));
        assert_ne!(fingerprint(&release("a")), fingerprint(&release("b")));
    }

    #[test]
    fn without_a_fingerprint_the_kind_of_the_reply_decides() {
        let one = acquire(&["a"], Wait::No);
        assert!(same_kind(&one, &Outcome::Granted(vec![4])));
        assert!(!same_kind(&one, &Outcome::Granted(vec![4, 5])));
        assert!(same_kind(&one, &Outcome::Cancelled));
        assert!(!same_kind(&one, &Outcome::Done));
        assert!(same_kind(&release("a"), &Outcome::Done));
        assert!(!same_kind(&release("a"), &Outcome::Granted(vec![4])));
    }
}
