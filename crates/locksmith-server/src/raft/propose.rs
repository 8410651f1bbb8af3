//! How the core's batches reach openraft.
//!
//! The core hands each batch straight to openraft's queue
//! ([`Proposer::propose`]): no task sits between them, so a request pays no
//! wake-up on its way to the log. It does not wait for the batch to commit
//! (the core bounds how many are in flight): the batch comes back through
//! openraft's state machine once committed, like every entry on every
//! member, and the core matches it to its waiting routes then. Its
//! [`Outcome`] only tells the core if openraft refused it
//! ([`RaftEvent::Refused`]), from wherever openraft ends it, without a task
//! waiting on a channel for every batch.
//!
//! A new leader's first batch is the exception: right after an election the
//! leader's lease is not confirmed yet and openraft refuses writes, so that
//! batch goes to a task ([`run_openers`]) that sends it again until the first
//! round of heartbeats confirms the lease. Nothing else is in flight while it
//! is, so order holds.

use std::time::Duration;

use openraft::errors::{ClientWriteError, ForwardReason, RaftError};
use tokio::sync::mpsc::{UnboundedReceiver, UnboundedSender};

use super::Raft;
use crate::entry::{Batch, Outcome, TypeConfig};
use crate::inbox::{CoreSender, RaftEvent};

/// The core's handle for proposing batches.
pub(crate) struct Proposer {
    /// openraft, and the core's own channel for refusals (none until the
    /// member starts, and in the core's own tests).
    raft: Option<(Raft, CoreSender)>,
    /// First batches of leadership stints, for [`run_openers`].
    openers: UnboundedSender<Batch>,
    /// The batches proposed while unattached, in the core's own tests.
    #[cfg(test)]
    held: Vec<Batch>,
    /// Whether [`Proposer::lease_holds`] says so while unattached, in the
    /// core's own tests.
    #[cfg(test)]
    pub(crate) lease_in_tests: bool,
}

impl Proposer {
    /// A proposer that drops its batches until [`Proposer::attach`] (the
    /// core's own tests keep them: `Proposer::held`); the receiver is for
    /// [`run_openers`].
    pub(crate) fn new() -> (Proposer, UnboundedReceiver<Batch>) {
        let (openers, receiver) = tokio::sync::mpsc::unbounded_channel();
        (
            Proposer {
                raft: None,
                openers,
                #[cfg(test)]
                held: Vec::new(),
                #[cfg(test)]
                lease_in_tests: false,
            },
            receiver,
        )
    }

    /// Connects the proposer to openraft and to the core's channel.
    pub(crate) fn attach(&mut self, raft: Raft, core: CoreSender) {
        self.raft = Some((raft, core));
    }

    /// Whether this member leads under a lease ([`leads_under_lease`]).
    pub(crate) fn lease_holds(&self, lease: Duration) -> bool {
        let Some((raft, _)) = &self.raft else {
            #[cfg(test)]
            return self.lease_in_tests;
            #[cfg(not(test))]
            return false;
        };
        leads_under_lease(raft, lease)
    }

    /// Hands `batch` to openraft; `first`: the first batch of a leadership
    /// stint. Called by the core: it blocks only while openraft's
    /// queue is full (65 536 messages), which holds the core back instead of
    /// queueing without bound.
    pub(crate) fn propose(&mut self, batch: Batch, first: bool) {
        let Some((raft, core)) = &self.raft else {
            #[cfg(test)]
            self.held.push(batch);
            return;
        };
        if first {
            // The task ends only with the server, after the core.
            let _ = self.openers.send(batch);
            return;
        }
        let (origin, seq) = (batch.origin, batch.seq);
        let refusals = core.clone();
        let outcome = Outcome::new(
            move |result: openraft::raft::ClientWriteResult<TypeConfig>| {
                if let Err(error) = result {
                    refuse(&refusals, origin, seq, error.to_string());
                }
            },
        );
        // Ready at the first poll unless openraft's queue is full; openraft's
        // core empties it without ever waiting for the core.
        let written = futures::executor::block_on(raft.client_write_ff(batch, Some(outcome)));
        if let Err(fatal) = written {
            refuse(core, origin, seq, fatal.to_string());
        }
    }
}

#[cfg(test)]
impl Proposer {
    /// The batches proposed while unattached, oldest first.
    pub(crate) fn held(&self) -> &[Batch] {
        &self.held
    }
}

/// Writes each stint's first batch (see the module docs), and tells the core
/// of one that could not be written.
///
/// Cancel safety: runs until the server stops; dropped mid-write, a batch
/// may or may not be in the log, and the core, stopping too, waits for
/// nothing of it.
pub(crate) async fn run_openers(
    raft: Raft,
    mut openers: UnboundedReceiver<Batch>,
    core: CoreSender,
    patience: Duration,
) {
    while let Some(batch) = openers.recv().await {
        let (origin, seq) = (batch.origin, batch.seq);
        if let Err(reason) = write_first(&raft, batch, patience).await {
            if !refuse(&core, origin, seq, reason) {
                return;
            }
        }
    }
}

/// Writes a stint's first batch, waiting for it to commit, and sends it again
/// while the leader's lease is not confirmed yet.
///
/// Cancel safety: as `Raft::client_write`'s; dropped, the batch may or may
/// not be appended.
async fn write_first(raft: &Raft, batch: Batch, patience: Duration) -> Result<(), String> {
    let started = tokio::time::Instant::now();
    loop {
        match raft.client_write(batch.clone()).await {
            Ok(_) => return Ok(()),
            Err(RaftError::APIError(ClientWriteError::ForwardToLeader(forward)))
                if forward.reason == ForwardReason::LeaseExpired
                    && raft.is_leader()
                    && started.elapsed() < patience =>
            {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            Err(error) => return Err(error.to_string()),
        }
    }
}

/// Tells the core that its batch `origin`/`seq` was refused; false when the
/// core is gone.
fn refuse(core: &CoreSender, origin: u64, seq: u64, reason: String) -> bool {
    tracing::warn!(%reason, "a batch was refused");
    core.send(RaftEvent::Refused {
        origin,
        seq,
        reason,
    })
    .is_ok()
}

/// Whether this member leads under its lease, for the readers: the same
/// check the core makes ([`leads_under_lease`]).
#[derive(Clone)]
pub(crate) struct HeartbeatLease {
    raft: Raft,
    /// How much of openraft's lease is counted on
    /// ([`crate::core::heartbeat_lease`]).
    lease: Duration,
}

impl HeartbeatLease {
    pub(crate) fn new(raft: Raft, lease: Duration) -> HeartbeatLease {
        HeartbeatLease { raft, lease }
    }

    /// Whether this member leads and a quorum acknowledged it within the
    /// lease.
    pub(crate) fn holds(&self) -> bool {
        leads_under_lease(&self.raft, self.lease)
    }
}

/// Whether the member of `raft` leads under a lease: a quorum of its voters
/// acknowledged it less than `lease` ago, so no other member can be elected
/// yet (a member alone in its group always can be sure). Read from
/// openraft's metrics, which follow its state a little late: the
/// acknowledgement seen here is never newer than openraft's own.
pub(crate) fn leads_under_lease(raft: &Raft, lease: Duration) -> bool {
    use openraft::async_runtime::WatchReceiver;
    use openraft::Instant as _;
    let metrics = raft.metrics();
    let m = metrics.borrow_watched();
    if m.state != openraft::ServerState::Leader {
        return false;
    }
    let mut voters = m.membership_config.membership().voter_ids();
    if voters.next() == Some(m.id) && voters.next().is_none() {
        return true;
    }
    m.last_quorum_acked
        .as_ref()
        .is_some_and(|acked| acked.elapsed() < lease)
}
