//! Wake-ups for head waiters: one `LISTEN` connection per client.
//!
//! A waiter at the head of PostgreSQL's queue for a lock's key that still
//! cannot be granted (a lease holds the lock, or every semaphore slot is
//! taken) waits inside PostgreSQL, in a `pg_sleep` statement bounded by the
//! blocking lease's remaining time. It has a row in `waiters`, so releases of
//! that lock `NOTIFY <schema>, '<name>'`. This module listens on the channel
//! and, for a notification naming a lock one of our heads waits for, marks
//! the head woken and cancels its sleep, so it re-checks at once.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};

use futures::StreamExt;
use tokio_postgres::AsyncMessage;

use super::config::Settings;
use super::conn::CancelHandle;
use super::pg_error;
use crate::error::Result;

/// A head waiter's wake-up state.
pub(crate) struct Head {
    /// A release of the lock was announced since the head last looked.
    pub woken: AtomicBool,
    /// The head's connection runs its sleep statement right now.
    pub in_sleep: AtomicBool,
    cancel: CancelHandle,
}

impl Head {
    fn wake(&self) {
        self.woken.store(true, Ordering::SeqCst);
        if self.in_sleep.load(Ordering::SeqCst) {
            let cancel = self.cancel.clone();
            tokio::spawn(async move { cancel.cancel().await });
        }
    }
}

type Heads = Arc<Mutex<HashMap<String, Vec<Weak<Head>>>>>;

/// The client's `LISTEN` connection (started by the first head) and the heads
/// it wakes.
pub(crate) struct Listener {
    settings: Arc<Settings>,
    heads: Heads,
    /// The live connection's client; `None` before the first head or after the
    /// connection died.
    client: tokio::sync::Mutex<Option<Arc<tokio_postgres::Client>>>,
}

/// Keeps a head registered; dropping it unregisters.
pub(crate) struct Subscription {
    heads: Heads,
    name: String,
    pub head: Arc<Head>,
}

impl Drop for Subscription {
    fn drop(&mut self) {
        let mut heads = self.heads.lock().expect("heads lock");
        if let Some(list) = heads.get_mut(&self.name) {
            list.retain(|h| h.strong_count() > 0 && !std::ptr::eq(h.as_ptr(), &*self.head));
            if list.is_empty() {
                heads.remove(&self.name);
            }
        }
    }
}

impl Listener {
    pub fn new(settings: Arc<Settings>) -> Self {
        Listener {
            settings,
            heads: Arc::default(),
            client: tokio::sync::Mutex::new(None),
        }
    }

    /// Registers a head waiting on `name` whose sleeps `cancel` interrupts,
    /// making sure the `LISTEN` connection runs.
    ///
    /// Cancel safety: safe; a dropped call registers nothing (or a
    /// subscription that is dropped with it).
    pub async fn subscribe(&self, name: &str, cancel: CancelHandle) -> Result<Subscription> {
        let head = Arc::new(Head {
            woken: AtomicBool::new(false),
            in_sleep: AtomicBool::new(false),
            cancel,
        });
        self.heads
            .lock()
            .expect("heads lock")
            .entry(name.to_owned())
            .or_default()
            .push(Arc::downgrade(&head));
        let subscription = Subscription {
            heads: self.heads.clone(),
            name: name.to_owned(),
            head,
        };
        self.ensure().await?;
        Ok(subscription)
    }

    /// Makes sure the `LISTEN` connection runs (after it died, say).
    ///
    /// Cancel safety: safe.
    pub async fn ensure(&self) -> Result<()> {
        let mut client = self.client.lock().await;
        if client.as_ref().is_some_and(|c| !c.is_closed()) {
            return Ok(());
        }
        let (new, mut connection) = self
            .settings
            .pg
            .connect(self.settings.tls.0.clone())
            .await
            .map_err(pg_error)?;
        let heads = self.heads.clone();
        tokio::spawn(async move {
            let mut messages = futures::stream::poll_fn(move |cx| connection.poll_message(cx));
            while let Some(Ok(message)) = messages.next().await {
                if let AsyncMessage::Notification(note) = message {
                    let list: Vec<Arc<Head>> = heads
                        .lock()
                        .expect("heads lock")
                        .get(note.payload())
                        .map(|l| l.iter().filter_map(Weak::upgrade).collect())
                        .unwrap_or_default();
                    for head in list {
                        head.wake();
                    }
                }
            }
            // The connection is gone: notifications may have been missed, so
            // every head re-checks now (and keeps its bounded sleeps).
            let all: Vec<Arc<Head>> = heads
                .lock()
                .expect("heads lock")
                .values()
                .flatten()
                .filter_map(Weak::upgrade)
                .collect();
            for head in all {
                head.wake();
            }
            tracing::debug!("postgres LISTEN connection ended");
        });
        new.batch_execute(&format!("LISTEN \"{}\"", self.settings.schema))
            .await
            .map_err(pg_error)?;
        *client = Some(Arc::new(new));
        Ok(())
    }

    /// Closes the `LISTEN` connection.
    ///
    /// Cancel safety: safe; dropped before it gets the lock, the connection
    /// stays open until the next close or the listener's drop.
    pub async fn close(&self) {
        self.client.lock().await.take();
    }
}
