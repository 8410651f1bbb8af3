//! Replica acknowledgement of a grant: the one rule for every Redis with
//! replicas (Sentinel and Cluster alike).
//!
//! A grant goes out in one pipeline with `WAIT replicas timeout`
//! ([`super::node::Node::eval_and_wait`]). When fewer replicas than asked
//! acknowledge it, a failover could hand the lock out again, so the grant
//! is not handed to the caller: it is given back *before* the acquire
//! returns (never left to a background task that a process exit could cut
//! short), and the caller gets [`Error::Unreplicated`], which says how
//! many replicas acknowledged, of how many asked, within what time, and how
//! many the primary has connected, and whether the undo was confirmed. It is
//! never [`Error::Conflict`] or a busy answer: nobody else holds the lock.
//! A waiting acquire tries again (see `Shared::acquire_one`) only after a
//! confirmed undo, so it never waits on a grant of its own.

use ::redis::RedisError;

use super::ops::{Reply, Target};
use super::server::failure;
use super::Shared;
use crate::error::{Error, Undo, Unreplicated};

impl Shared {
    /// Gives back what an attempt took when only `acknowledged` of `asked`
    /// replicas acknowledged it, and answers the error that says so.
    ///
    /// Cancel safety: if dropped, the undo may not have happened; the grant
    /// is on no watchdog and ends with its lease.
    pub(super) async fn refuse_unacknowledged(
        &self,
        target: &Target,
        reply: Reply,
        lease: std::time::Duration,
        acknowledged: i64,
        asked: u32,
    ) -> Error {
        let node = &self.nodes[0];
        // The model layer never asks for a hold the owner has: the owner's
        // hold is this grant, given back whole.
        let token = match reply {
            Reply::Granted { token, .. } => Some(token),
            _ => None,
        };
        let (undone, connected) = tokio::join!(
            self.release_on(target, &[0], token),
            node.replicas_connected(&target.keys)
        );
        let undo = match undone {
            // Gone already (expired, taken over): nothing of ours is held.
            Ok(()) | Err(Error::NotHeld { .. } | Error::NotOwner { .. }) => Undo::GivenBack,
            Err(error) => Undo::Unconfirmed {
                lease,
                reason: error.to_string(),
            },
        };
        let connected = connected
            .map_err(|e: RedisError| {
                let error = failure("asking the primary for its replicas", e);
                tracing::debug!(lock = %target.name, %error, "replica count unknown");
            })
            .ok();
        let error = Unreplicated {
            name: target.name.clone(),
            primary: node.label(),
            acknowledged: acknowledged.clamp(0, i64::from(u32::MAX)) as u32,
            asked,
            within: self.config.wait_timeout,
            connected,
            undo,
        };
        tracing::debug!(%error, "grant not acknowledged by enough replicas");
        Error::Unreplicated(Box::new(error))
    }
}
