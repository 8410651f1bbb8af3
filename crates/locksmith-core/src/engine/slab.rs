//! The engine's lock entries by id, shared copy-on-write in chunks, so
//! that freezing a table of a million locks for a snapshot costs a
//! reference per chunk, not one per lock.
//!
//! A frozen copy ([`Slab::share`]) holds the same chunks as the engine.
//! The engine's first change to a chunk while a copy is alive copies that
//! chunk: [`CHUNK`] references, tens of microseconds, the cost spread over
//! the requests that touch the table instead of paid at once on the
//! thread that serves them (a reference per lock was about 50 ms of stall
//! per snapshot with a million). Each entry is itself shared
//! (`Arc<LockEntry>`): an entry changed meanwhile is copied first.

use std::sync::Arc;

use super::{LockEntry, LockId};

/// Entries per chunk: a chunk copied on a change while frozen is 8 KiB of
/// references; a million locks are about a thousand chunks.
const CHUNK: usize = 1024;

type Slot = Option<Arc<LockEntry>>;

/// Lock entries by [`LockId`]: `None` where an id is free.
#[derive(Debug, Default)]
pub(super) struct Slab {
    /// Every chunk but the last is full.
    chunks: Vec<Arc<Vec<Slot>>>,
}

impl Slab {
    /// The slot of `id`, `None` past the end.
    pub(super) fn get(&self, id: LockId) -> Option<&Slot> {
        let (chunk, at) = place(id);
        self.chunks.get(chunk)?.get(at)
    }

    /// The slot of `id` (which exists), its chunk copied first if shared.
    pub(super) fn slot_mut(&mut self, id: LockId) -> &mut Slot {
        let (chunk, at) = place(id);
        &mut Arc::make_mut(&mut self.chunks[chunk])[at]
    }

    /// Puts `entry` into a new slot at the end: its id.
    pub(super) fn push(&mut self, entry: Arc<LockEntry>) -> LockId {
        let id = self.len();
        match self.chunks.last_mut() {
            Some(last) if last.len() < CHUNK => Arc::make_mut(last).push(Some(entry)),
            _ => {
                let mut chunk = Vec::with_capacity(CHUNK);
                chunk.push(Some(entry));
                self.chunks.push(Arc::new(chunk));
            }
        }
        LockId::try_from(id).expect("fewer than 2^32 locks")
    }

    /// Slots in use or free.
    fn len(&self) -> usize {
        self.chunks
            .last()
            .map_or(0, |last| (self.chunks.len() - 1) * CHUNK + last.len())
    }

    /// Every live entry, by id.
    pub(super) fn entries(&self) -> impl Iterator<Item = &Arc<LockEntry>> {
        self.chunks.iter().flat_map(|chunk| chunk.iter().flatten())
    }

    /// Every live entry, by id, to change (chunks copied first if shared).
    pub(super) fn entries_mut(&mut self) -> impl Iterator<Item = &mut Arc<LockEntry>> {
        self.chunks
            .iter_mut()
            .flat_map(|chunk| Arc::make_mut(chunk).iter_mut().flatten())
    }

    /// The same entries, shared: a reference per chunk.
    pub(super) fn share(&self) -> Slab {
        Slab {
            chunks: self.chunks.clone(),
        }
    }
}

/// The chunk of `id` and its place in it.
fn place(id: LockId) -> (usize, usize) {
    let id = id as usize;
    (id / CHUNK, id % CHUNK)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::Holders;
    use std::collections::VecDeque;

    fn entry(name: &str) -> Arc<LockEntry> {
        Arc::new(LockEntry {
            name: name.into(),
            holders: Holders::default(),
            queue: VecDeque::new(),
            delay_until: None,
        })
    }

    fn names(slab: &Slab) -> Vec<String> {
        slab.entries().map(|e| e.name.to_string()).collect()
    }

    #[test]
    fn ids_follow_on_across_chunks_and_free_slots_are_skipped() {
        let mut slab = Slab::default();
        for i in 0..CHUNK + 3 {
            assert_eq!(slab.push(entry(&i.to_string())) as usize, i);
        }
        assert_eq!(slab.len(), CHUNK + 3);
        *slab.slot_mut(1) = None;
        *slab.slot_mut(CHUNK as LockId + 1) = None;
        assert!(slab.get(1).is_some_and(Option::is_none));
        assert!(slab.get(CHUNK as LockId + 3).is_none(), "past the end");
        let live = names(&slab);
        assert_eq!(live.len(), CHUNK + 1);
        assert_eq!(live[1], "2");
        assert_eq!(
            live.last().map(String::as_str),
            Some(&*(CHUNK + 2).to_string())
        );
    }

    #[test]
    fn a_shared_copy_keeps_what_it_saw_while_the_slab_changes() {
        let mut slab = Slab::default();
        for i in 0..2 * CHUNK + 1 {
            slab.push(entry(&format!("a{i}")));
        }
        let frozen = slab.share();
        let before = names(&frozen);
        // A change, a removal, an addition and a change of every entry.
        Arc::make_mut(slab.slot_mut(0).as_mut().unwrap()).name = "changed".into();
        *slab.slot_mut(CHUNK as LockId) = None;
        slab.push(entry("new"));
        for e in slab.entries_mut() {
            Arc::make_mut(e).delay_until = Some(7);
        }
        assert_eq!(names(&frozen), before, "the frozen copy is unchanged");
        assert!(frozen.entries().all(|e| e.delay_until.is_none()));
        let now = names(&slab);
        assert_eq!(now[0], "changed");
        assert_eq!(now.len(), 2 * CHUNK + 1);
        assert_eq!(now.last().map(String::as_str), Some("new"));
        assert!(slab.entries().all(|e| e.delay_until == Some(7)));
        // Only the chunks changed were copied: the middle one is shared
        // until its entries changed (here, all did).
        drop(frozen);
        assert!(slab.chunks.iter().all(|c| Arc::strong_count(c) == 1));
    }

    #[test]
    fn sharing_costs_a_reference_per_chunk_not_per_entry() {
        let mut slab = Slab::default();
        for i in 0..3 * CHUNK {
            slab.push(entry(&i.to_string()));
        }
        let frozen = slab.share();
        assert!(frozen.chunks.iter().all(|c| Arc::strong_count(c) == 2));
        assert!(slab.entries().all(|e| Arc::strong_count(e) == 1));
        // A change copies its chunk alone.
        slab.slot_mut(5);
        let shared: Vec<usize> = slab.chunks.iter().map(Arc::strong_count).collect();
        assert_eq!(shared, [1, 2, 2]);
    }
}
