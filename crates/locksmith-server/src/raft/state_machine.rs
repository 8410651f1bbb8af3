//! openraft's handle on the replicated state machine, which lives in the
//! core (module `core::replicated`): openraft hands committed
//! entries to [`CoreMachine`], which passes them on to the core
//! ([`RaftEvent::Apply`]) in order, so that every member, the leader
//! included, applies the same entries in the same order to the same state,
//! in one place (the leader's front end also answers its own batches'
//! clients then: module `core::front`). It does not wait for the core to
//! apply them: the core's channel keeps the order, and anything asked of
//! the core later (a snapshot, an installed snapshot) queues behind them.
//!
//! A snapshot is the replicated state (`ServerSnapshot`: the engine, the
//! session table, the counters), frozen by the core and postcard-encoded on a
//! blocking thread, with openraft's metadata (last applied log id and
//! membership) beside it.
//!
//! Cancel safety: openraft runs these methods in tasks it never aborts (its
//! state machine worker, a snapshot build), so none is dropped midway while
//! the member runs; only a start dropped while openraft replays the log
//! (`member::open`) could. Each method says what a dropped call leaves.

use std::io::{self, Cursor};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

use futures::{Stream, TryStreamExt};
use openraft::storage::{EntryResponder, RaftStateMachine};
use openraft::type_config::alias::{LogIdOf, SnapshotMetaOf, SnapshotOf, StoredMembershipOf};
use openraft::{EntryPayload, RaftSnapshotBuilder};
use tokio::sync::oneshot;

use crate::entry::{Applied, TypeConfig};
use crate::environment::ApplyPace;
use crate::inbox::{CoreSender, RaftEvent};
use crate::stats::Stats;
use crate::storage::background::{in_background, Background};
use crate::storage::member::{SnapshotFile, StoredSnapshot};

/// A snapshot as openraft moves it.
type Snapshot = SnapshotOf<TypeConfig, Cursor<Vec<u8>>>;

/// openraft's handle on the core.
#[derive(Clone)]
pub(crate) struct CoreMachine {
    core: CoreSender,
    /// The last entry (and membership) handed to the core. The core's
    /// channel is the state machine's queue: whatever reads the state goes
    /// through it, behind these entries, so for openraft they are applied.
    applied: Arc<Mutex<Applied>>,
    /// The newest snapshot built or installed.
    current: Arc<Mutex<Option<Snapshot>>>,
    /// Where snapshots are kept on disk (none for a server without a data
    /// directory).
    file: Option<SnapshotFile>,
    /// The member's counters: snapshots built are counted there.
    stats: Arc<Stats>,
    /// A simulated busy member's pace of applying
    /// ([`ApplyPace`]); none on a machine.
    pace: Option<Arc<dyn ApplyPace>>,
}

impl CoreMachine {
    /// The machine over the core fed by `core`; `kept` is the snapshot the
    /// member found on disk at start, which the core has installed.
    pub(crate) fn new(
        core: CoreSender,
        file: Option<SnapshotFile>,
        kept: Option<StoredSnapshot>,
        stats: Arc<Stats>,
    ) -> CoreMachine {
        let applied = kept.as_ref().map_or_else(Applied::default, |s| Applied {
            last_applied: s.meta.last_log_id,
            membership: s.meta.last_membership.clone(),
        });
        let current = kept.map(|s| SnapshotOf::<TypeConfig, Cursor<Vec<u8>>> {
            meta: s.meta,
            snapshot: Cursor::new(s.data),
        });
        CoreMachine {
            core,
            applied: Arc::new(Mutex::new(applied)),
            current: Arc::new(Mutex::new(current)),
            file,
            stats,
            pace: None,
        }
    }

    /// Applies at `pace` (a simulation's busy member), if given.
    pub(crate) fn paced_by(mut self, pace: Option<Arc<dyn ApplyPace>>) -> CoreMachine {
        self.pace = pace;
        self
    }

    /// The size of the newest snapshot built or installed (0 if none).
    pub(crate) fn snapshot_bytes(&self) -> u64 {
        let current = self.current.lock().unwrap_or_else(|e| e.into_inner());
        current
            .as_ref()
            .map_or(0, |s| s.snapshot.get_ref().len() as u64)
    }

    /// Keeps `snapshot` on disk (before openraft purges the log it covers)
    /// and as the current one; returns it. The file is written, and the
    /// copy kept as the current one made, on a blocking thread: with a
    /// million locks each is tens of megabytes, which copied on the worker
    /// stalled every request behind them.
    ///
    /// Cancel safety: dropped while the file is written, the write still
    /// completes on its blocking thread (the file is replaced atomically),
    /// but the snapshot is not made the current one.
    async fn keep_durably(&self, snapshot: Snapshot) -> io::Result<Snapshot> {
        let file = self.file.clone();
        let (snapshot, kept) = tokio::task::spawn_blocking(move || -> io::Result<_> {
            if let Some(file) = file {
                let data = snapshot.snapshot.get_ref();
                file.save(&snapshot.meta, data)?;
                let index = snapshot.meta.last_log_id.as_ref().map(|id| id.index);
                tracing::info!(?index, bytes = data.len(), "snapshot written");
            }
            let kept = copy(&snapshot);
            Ok((snapshot, kept))
        })
        .await
        .map_err(io::Error::other)??;
        *self.current.lock().unwrap_or_else(|e| e.into_inner()) = Some(kept);
        Ok(snapshot)
    }

    /// Sends `event` to the core and waits for its answer.
    ///
    /// Cancel safety: the op is sent before the only await; a dropped call
    /// leaves it to run, its answer unread.
    async fn ask<T>(&self, event: impl FnOnce(oneshot::Sender<T>) -> RaftEvent) -> io::Result<T> {
        let (reply, answer) = oneshot::channel();
        self.core.send(event(reply)).map_err(|_| stopped())?;
        answer.await.map_err(|_| stopped())
    }
}

fn copy(
    snapshot: &SnapshotOf<TypeConfig, Cursor<Vec<u8>>>,
) -> SnapshotOf<TypeConfig, Cursor<Vec<u8>>> {
    SnapshotOf::<TypeConfig, Cursor<Vec<u8>>> {
        meta: snapshot.meta.clone(),
        snapshot: Cursor::new(snapshot.snapshot.get_ref().clone()),
    }
}

fn stopped() -> io::Error {
    io::Error::other("the lock engine stopped")
}

impl RaftSnapshotBuilder<TypeConfig> for CoreMachine {
    type SnapshotData = Cursor<Vec<u8>>;

    /// The core freezes its state (it goes on at once); the frozen state is
    /// encoded on a thread of lower priority (`storage::background`), then
    /// written.
    ///
    /// Cancel safety: safe; dropped midway, the core's copy is thrown away
    /// (an encoding already started finishes on its thread, unused),
    /// or a write already started completes as in `keep_durably`.
    async fn build_snapshot(&mut self) -> io::Result<SnapshotOf<TypeConfig, Cursor<Vec<u8>>>> {
        let frozen = self.ask(|reply| RaftEvent::Snapshot { reply }).await?;
        let started = std::time::Instant::now();
        let snapshot = in_background(Background::Snapshot, move || frozen.encode()).await?;
        tracing::debug!(
            bytes = snapshot.snapshot.get_ref().len(),
            elapsed = ?started.elapsed(),
            "snapshot encoded"
        );
        let snapshot = self.keep_durably(snapshot).await?;
        self.stats.snapshots.fetch_add(1, Ordering::Relaxed);
        Ok(snapshot)
    }
}

impl RaftStateMachine<TypeConfig> for CoreMachine {
    type SnapshotData = Cursor<Vec<u8>>;
    type SnapshotBuilder = Self;

    /// The last entry (and membership) handed to the core.
    ///
    /// Cancel safety: safe, read-only, no await.
    async fn applied_state(
        &mut self,
    ) -> io::Result<(Option<LogIdOf<TypeConfig>>, StoredMembershipOf<TypeConfig>)> {
        let applied = self.applied.lock().unwrap_or_else(|e| e.into_inner());
        Ok((applied.last_applied, applied.membership.clone()))
    }

    /// Hands the committed `entries` to the core, in one op.
    ///
    /// A simulated busy member first waits its pace ([`ApplyPace`]).
    ///
    /// Cancel safety: dropped while it reads the entries or waits its pace,
    /// it hands the core nothing and records nothing as applied: the entries
    /// it read, and their responders, are dropped with it.
    async fn apply<Entries>(&mut self, mut entries: Entries) -> io::Result<()>
    where
        Entries: Stream<Item = io::Result<EntryResponder<TypeConfig>>> + Unpin + Send,
    {
        let mut batch = Vec::new();
        let mut responders = Vec::new();
        let mut handed = self
            .applied
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        while let Some((entry, responder)) = entries.try_next().await? {
            if let EntryPayload::Membership(membership) = &entry.payload {
                handed.membership =
                    StoredMembershipOf::<TypeConfig>::new(Some(entry.log_id), membership.clone());
            }
            handed.last_applied = Some(entry.log_id);
            batch.push(entry);
            responders.extend(responder);
        }
        if batch.is_empty() {
            return Ok(());
        }
        if let Some(pace) = &self.pace {
            pace.applying().await;
        }
        *self.applied.lock().unwrap_or_else(|e| e.into_inner()) = handed;
        // Not waiting for the core: the next entries come through at once,
        // and whatever asks the core afterwards (a snapshot, a read) queues
        // behind these in its channel. If the core stops instead, so does
        // the member.
        self.core
            .send(RaftEvent::Apply {
                entries: batch,
                responders,
            })
            .map_err(|_| stopped())
    }

    /// Has the core install a snapshot received from the leader, then keeps
    /// it.
    ///
    /// Cancel safety: not safe midway: dropped after the op is sent, the
    /// core installs the snapshot, but `applied_state` may still report the
    /// state before it, and the current snapshot the old one (the file may be
    /// written or not).
    async fn install_snapshot(
        &mut self,
        meta: &SnapshotMetaOf<TypeConfig>,
        snapshot: Cursor<Vec<u8>>,
    ) -> io::Result<()> {
        let data = snapshot.into_inner();
        let (started, bytes) = (std::time::Instant::now(), data.len());
        // The core takes the bytes; the copy kept is made on a blocking
        // thread, not on the worker (tens of megabytes with a big table).
        let kept_meta = meta.clone();
        let (data, installed) = tokio::task::spawn_blocking(move || {
            let installed = SnapshotOf::<TypeConfig, Cursor<Vec<u8>>> {
                meta: kept_meta,
                snapshot: Cursor::new(data.clone()),
            };
            (data, installed)
        })
        .await
        .map_err(io::Error::other)?;
        self.ask(|done| RaftEvent::Install {
            meta: meta.clone(),
            data,
            done,
        })
        .await?
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
        tracing::info!(
            index = ?meta.last_log_id.as_ref().map(|id| id.index),
            bytes,
            took_ms = started.elapsed().as_millis() as u64,
            "installed the leader's snapshot"
        );
        *self.applied.lock().unwrap_or_else(|e| e.into_inner()) = Applied {
            last_applied: meta.last_log_id,
            membership: meta.last_membership.clone(),
        };
        self.keep_durably(installed).await?;
        Ok(())
    }

    /// The newest snapshot built or installed.
    ///
    /// Cancel safety: safe, read-only, no await.
    async fn get_current_snapshot(
        &mut self,
    ) -> io::Result<Option<SnapshotOf<TypeConfig, Cursor<Vec<u8>>>>> {
        let current = self.current.lock().unwrap_or_else(|e| e.into_inner());
        Ok(current.as_ref().map(copy))
    }

    /// A builder of snapshots: this machine, shared.
    ///
    /// Cancel safety: safe, no await.
    async fn get_snapshot_builder(&mut self) -> Self {
        self.clone()
    }
}
