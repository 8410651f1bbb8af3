//! What the core receives: client ops ([`Op`], from the gRPC service
//! and the HTTP listener) and Raft's events ([`RaftEvent`], from openraft's
//! state machine, the proposer and the role watch), in one channel, so that
//! the order each sender sends in holds (a snapshot request queues behind the
//! entries handed over before it; a stream's batches stay in order).

use std::sync::mpsc;

use openraft::storage::ApplyResponder;
use openraft::type_config::alias::{EntryOf, SnapshotMetaOf};
use tokio::sync::oneshot;

use crate::entry::TypeConfig;
use crate::op::Op;
use crate::storage::FrozenState;

/// A message to the core.
pub(crate) enum Input {
    /// What a client asks.
    Client(Op),
    /// What Raft tells the core.
    Raft(RaftEvent),
    /// End every stream and stop.
    Shutdown {
        done: oneshot::Sender<Result<(), String>>,
    },
}

impl From<Op> for Input {
    fn from(op: Op) -> Input {
        Input::Client(op)
    }
}

impl From<RaftEvent> for Input {
    fn from(event: RaftEvent) -> Input {
        Input::Raft(event)
    }
}

/// The core stopped: nothing sent to it is handled any more.
#[derive(Debug)]
pub(crate) struct Stopped;

/// The sending side of the core's channel.
#[derive(Clone)]
pub(crate) struct CoreSender(Sender);

/// A core on its own thread ([`crate::Execution::Threads`]) blocks on a std
/// channel; a core run as a task awaits a tokio one.
#[derive(Clone)]
enum Sender {
    Thread(mpsc::Sender<Input>),
    Task(tokio::sync::mpsc::UnboundedSender<Input>),
}

impl CoreSender {
    /// The channel of a core on its own thread: its sender, and the
    /// receiver its loop reads.
    pub(crate) fn channel() -> (CoreSender, mpsc::Receiver<Input>) {
        let (sender, receiver) = mpsc::channel();
        (CoreSender(Sender::Thread(sender)), receiver)
    }

    /// The channel of a core run as a task.
    pub(crate) fn task_channel() -> (CoreSender, TaskInbox) {
        let (sender, receiver) = tokio::sync::mpsc::unbounded_channel();
        (CoreSender(Sender::Task(sender)), receiver)
    }

    /// Queues `input` for the core; never blocks.
    pub(crate) fn send(&self, input: impl Into<Input>) -> Result<(), Stopped> {
        match &self.0 {
            Sender::Thread(sender) => sender.send(input.into()).map_err(|_| Stopped),
            Sender::Task(sender) => sender.send(input.into()).map_err(|_| Stopped),
        }
    }
}

/// The receiver of a core run as a task.
pub(crate) type TaskInbox = tokio::sync::mpsc::UnboundedReceiver<Input>;

/// What the core's loop takes from its channel without waiting, whichever
/// kind it is.
pub(crate) trait Inbox {
    /// Moves every input waiting now into `into`.
    fn take_waiting(&mut self, into: &mut Vec<Input>);
}

impl Inbox for &mpsc::Receiver<Input> {
    fn take_waiting(&mut self, into: &mut Vec<Input>) {
        into.extend(self.try_iter());
    }
}

impl Inbox for &mut TaskInbox {
    fn take_waiting(&mut self, into: &mut Vec<Input>) {
        while let Ok(input) = self.try_recv() {
            into.push(input);
        }
    }
}

/// What Raft tells the core.
pub(crate) enum RaftEvent {
    /// Committed log entries to apply, in order (from openraft's state
    /// machine, which does not wait for them); `responders` are told once
    /// they are applied (openraft's own writes wait on them).
    Apply {
        entries: Vec<EntryOf<TypeConfig>>,
        responders: Vec<ApplyResponder<TypeConfig>>,
    },
    /// Copy the applied state for a snapshot.
    Snapshot { reply: oneshot::Sender<FrozenState> },
    /// Replace the state with a snapshot the leader sent.
    Install {
        meta: SnapshotMetaOf<TypeConfig>,
        data: Vec<u8>,
        done: oneshot::Sender<Result<(), String>>,
    },
    /// This member's role changed.
    Role(Role),
    /// openraft refused the batch `origin`/`seq` (this member cannot reach a
    /// quorum, or no longer leads): it was never appended.
    Refused {
        origin: u64,
        seq: u64,
        reason: String,
    },
}

/// A member's role, as openraft reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Role {
    /// This member leads; `address` is its own, as the members know it
    /// (what their leader hints name), when known.
    Leader { address: Option<String> },
    /// Another member leads (its client address, when known), or nobody yet.
    Follower { leader: Option<String> },
}
