//! A backend that passes everything on to a real one and counts what
//! reaches it: how many acquires and releases a store sees for what the
//! lock API was asked.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use locksmith::backend::{
    AcquireRequest, Backend, Capabilities, Grant, GrantRecord, Hold, HolderChanges, LockInfo,
};
use locksmith::Result;

/// Counts the acquires and releases that reach `inner`.
pub(crate) struct CountingBackend {
    inner: Arc<dyn Backend>,
    counts: Arc<Counts>,
}

#[derive(Default)]
struct Counts {
    acquires: AtomicUsize,
    releases: AtomicUsize,
}

impl CountingBackend {
    pub(crate) fn new(inner: Arc<dyn Backend>) -> CountingBackend {
        CountingBackend {
            inner,
            counts: Arc::default(),
        }
    }

    /// Acquires the store was asked for.
    pub(crate) fn acquires(&self) -> usize {
        self.counts.acquires.load(Ordering::SeqCst)
    }

    /// Releases the store was asked for.
    pub(crate) fn releases(&self) -> usize {
        self.counts.releases.load(Ordering::SeqCst)
    }
}

#[async_trait]
impl Backend for CountingBackend {
    fn name(&self) -> &'static str {
        self.inner.name()
    }

    fn capabilities(&self) -> Capabilities {
        self.inner.capabilities()
    }

    /// Cancel safety: as the inner backend's.
    async fn acquire(&self, request: &AcquireRequest) -> Result<Option<Grant>> {
        self.counts.acquires.fetch_add(1, Ordering::SeqCst);
        Ok(self.inner.acquire(request).await?.map(|grant| Grant {
            hold: Box::new(CountingHold {
                inner: grant.hold,
                counts: self.counts.clone(),
            }),
            ..grant
        }))
    }

    /// Cancel safety: safe, read-only.
    async fn describe(&self, name: &str) -> Result<Option<LockInfo>> {
        self.inner.describe(name).await
    }

    /// Cancel safety: safe, read-only.
    async fn list(&self, prefix: &str) -> Result<Vec<LockInfo>> {
        self.inner.list(prefix).await
    }

    /// Cancel safety: safe, read-only.
    async fn history(&self, prefix: &str) -> Result<Vec<GrantRecord>> {
        self.inner.history(prefix).await
    }

    /// Cancel safety: as the inner backend's.
    async fn watch_holders(&self, name: &str) -> Result<Option<HolderChanges>> {
        self.inner.watch_holders(name).await
    }

    /// Cancel safety: as the inner backend's.
    async fn force_release(&self, name: &str) -> Result<()> {
        self.inner.force_release(name).await
    }

    /// Cancel safety: as the inner backend's.
    async fn close(&self) -> Result<()> {
        self.inner.close().await
    }
}

struct CountingHold {
    inner: Box<dyn Hold>,
    counts: Arc<Counts>,
}

#[async_trait]
impl Hold for CountingHold {
    /// Cancel safety: as the inner hold's.
    async fn release(self: Box<Self>) -> Result<()> {
        self.counts.releases.fetch_add(1, Ordering::SeqCst);
        self.inner.release().await
    }

    /// Cancel safety: as the inner hold's.
    async fn extend(&self, lease: Duration) -> Result<()> {
        self.inner.extend(lease).await
    }

    /// Cancel safety: as the inner hold's.
    async fn record_count(&self, count: u32) -> Result<()> {
        self.inner.record_count(count).await
    }

    /// Cancel safety: as the inner hold's.
    async fn proclaim(&self, value: &str) -> Result<()> {
        self.inner.proclaim(value).await
    }
}
