//! The replicated state machine: committed [`Batch`]es applied, in log order,
//! to a lock engine, identically on every member.
//!
//! A member applies each record at `max(record.now, last applied now)`, so
//! engine time never goes backwards when leadership (and with it the clock
//! that stamps records) moves to another member. A command that fails on
//! apply fails the same way everywhere (the engine is deterministic) and
//! changes nothing.
//!
//! A snapshot is the engine's own ([`locksmith_core::Snapshot`]) plus the last
//! applied time, postcard-encoded, with openraft's metadata (last applied log
//! id and membership) beside it.

use std::io::{self, Cursor};
use std::sync::Arc;

use futures::{Stream, TryStreamExt};
use locksmith_core::{Effect, Engine, Limits, Millis, Snapshot};
use openraft::storage::{EntryResponder, RaftStateMachine};
use openraft::type_config::alias::{LogIdOf, SnapshotMetaOf, SnapshotOf, StoredMembershipOf};
use openraft::{EntryPayload, RaftSnapshotBuilder};
use serde::{Deserialize, Serialize};
use tokio::sync::Mutex;

use super::{Batch, TypeConfig};
use crate::storage::Record;

/// The engine as one member holds it.
#[derive(Clone)]
pub(crate) struct EngineMachine {
    inner: Arc<Mutex<Inner>>,
}

struct Inner {
    engine: Engine,
    limits: Limits,
    last_now: Millis,
    last_applied: Option<LogIdOf<TypeConfig>>,
    membership: StoredMembershipOf<TypeConfig>,
    current: Option<(SnapshotMetaOf<TypeConfig>, Vec<u8>)>,
}

/// What a snapshot's bytes hold.
#[derive(Serialize, Deserialize)]
struct MachineSnapshot {
    last_now: Millis,
    engine: Snapshot,
}

impl EngineMachine {
    /// An empty machine.
    pub(crate) fn new(limits: Limits) -> EngineMachine {
        EngineMachine {
            inner: Arc::new(Mutex::new(Inner {
                engine: Engine::new(limits.clone()),
                limits,
                last_now: 0,
                last_applied: None,
                membership: StoredMembershipOf::<TypeConfig>::default(),
                current: None,
            })),
        }
    }

    /// Runs `read` on the engine as applied so far.
    pub(crate) async fn read<T>(&self, read: impl FnOnce(&Engine) -> T) -> T {
        read(&self.inner.lock().await.engine)
    }
}

impl Inner {
    fn apply_batch(&mut self, batch: Batch, effects: &mut Vec<Effect>) {
        for record in batch.records {
            let Record::Command(record) = record else {
                continue; // acknowledgements concern the server's session table
            };
            let now = record.now.max(self.last_now);
            self.last_now = now;
            if let Err(error) = self.engine.apply(now, record.command, effects) {
                tracing::debug!(%error, "a replicated command does not apply");
            }
        }
    }

    fn encode(&self) -> io::Result<Vec<u8>> {
        let snapshot = MachineSnapshot {
            last_now: self.last_now,
            engine: self.engine.snapshot(),
        };
        postcard::to_allocvec(&snapshot).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))
    }
}

impl RaftSnapshotBuilder<TypeConfig> for EngineMachine {
    type SnapshotData = Cursor<Vec<u8>>;

    async fn build_snapshot(&mut self) -> io::Result<SnapshotOf<TypeConfig, Cursor<Vec<u8>>>> {
        let mut inner = self.inner.lock().await;
        let data = inner.encode()?;
        let meta = SnapshotMetaOf::<TypeConfig> {
            last_log_id: inner.last_applied,
            last_membership: inner.membership.clone(),
        };
        inner.current = Some((meta.clone(), data.clone()));
        Ok(SnapshotOf::<TypeConfig, Cursor<Vec<u8>>> {
            meta,
            snapshot: Cursor::new(data),
        })
    }
}

impl RaftStateMachine<TypeConfig> for EngineMachine {
    type SnapshotData = Cursor<Vec<u8>>;
    type SnapshotBuilder = Self;

    async fn applied_state(
        &mut self,
    ) -> io::Result<(Option<LogIdOf<TypeConfig>>, StoredMembershipOf<TypeConfig>)> {
        let inner = self.inner.lock().await;
        Ok((inner.last_applied, inner.membership.clone()))
    }

    async fn apply<Entries>(&mut self, mut entries: Entries) -> io::Result<()>
    where
        Entries: Stream<Item = io::Result<EntryResponder<TypeConfig>>> + Unpin + Send,
    {
        let mut inner = self.inner.lock().await;
        let mut effects = Vec::new();
        while let Some((entry, responder)) = entries.try_next().await? {
            inner.last_applied = Some(entry.log_id);
            match entry.payload {
                EntryPayload::Blank => {}
                EntryPayload::Normal(batch) => inner.apply_batch(batch, &mut effects),
                EntryPayload::Membership(membership) => {
                    inner.membership =
                        StoredMembershipOf::<TypeConfig>::new(Some(entry.log_id), membership);
                }
            }
            effects.clear();
            if let Some(responder) = responder {
                responder.send(());
            }
        }
        Ok(())
    }

    async fn install_snapshot(
        &mut self,
        meta: &SnapshotMetaOf<TypeConfig>,
        snapshot: Cursor<Vec<u8>>,
    ) -> io::Result<()> {
        let data = snapshot.into_inner();
        let decoded: MachineSnapshot = postcard::from_bytes(&data)
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
        let mut inner = self.inner.lock().await;
        inner.engine = Engine::restore(inner.limits.clone(), decoded.engine);
        inner.last_now = decoded.last_now;
        inner.last_applied = meta.last_log_id;
        inner.membership = meta.last_membership.clone();
        inner.current = Some((meta.clone(), data));
        Ok(())
    }

    async fn get_current_snapshot(
        &mut self,
    ) -> io::Result<Option<SnapshotOf<TypeConfig, Cursor<Vec<u8>>>>> {
        let inner = self.inner.lock().await;
        Ok(inner
            .current
            .as_ref()
            .map(|(meta, data)| SnapshotOf::<TypeConfig, Cursor<Vec<u8>>> {
                meta: meta.clone(),
                snapshot: Cursor::new(data.clone()),
            }))
    }

    async fn get_snapshot_builder(&mut self) -> Self {
        self.clone()
    }
}
