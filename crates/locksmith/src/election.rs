//! Leader election: leadership is an exclusive, non-reentrant lock whose
//! holder publishes a value (its address, its id, ...).
//!
//! Who leads is the lock's rule and nothing else: the first holder that
//! [`crate::Client::describe`] reports. On etcd and ZooKeeper the hold
//! publishes the value where those stores' own election recipes read it, so
//! `etcdctl elect`, Go's `concurrency.Election`, kazoo's `Election` and
//! Curator's `LeaderSelector` see a locksmith leader and the reverse (see
//! the backends' module docs).
//!
//! [`Election::observe`] follows the leader: pushed by stores that can watch
//! ([`crate::backend::Backend::watch_holders`]), polled every
//! [`OBSERVE_POLL`] by the others.

use std::time::Duration;

use futures::stream::{Stream, StreamExt};

use crate::arguments::check_owner;
use crate::backend::HolderChanges;
use crate::client::Client;
use crate::error::{Error, Result};
use crate::guard::Guard;

/// How often [`Election::observe`] reads the leader on a store that cannot
/// watch (the locksmith server, Redis, PostgreSQL).
pub const OBSERVE_POLL: Duration = Duration::from_millis(500);

/// Pause before [`Election::observe`] tries again after an error.
const OBSERVE_RETRY: Duration = Duration::from_secs(1);

/// The elections a client makes.
impl Client {
    /// Leader election on a lock name.
    pub fn election(&self, name: impl Into<String>) -> Election {
        Election::new(self.clone(), name.into())
    }
}

/// An election on one lock name.
#[derive(Clone, Debug)]
pub struct Election {
    client: Client,
    name: String,
}

/// The current leader as observers see it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Leader {
    /// The value the leader published (its candidate id, address, ...).
    pub value: String,
    /// Its fencing token, where the store records one.
    pub fencing_token: Option<u64>,
}

impl Election {
    pub(crate) fn new(client: Client, name: String) -> Self {
        Election { client, name }
    }

    /// The election's (lock) name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Waits until this candidate leads, publishing `value` (1..=256 bytes
    /// without NUL). Leadership lasts until the returned [`Leadership`] is
    /// resigned, dropped or lost: select on [`Leadership::lost`] to step
    /// down in time.
    ///
    /// Cancel safety: safe; a dropped campaign leaves no candidacy behind.
    pub async fn campaign(&self, value: impl Into<String>) -> Result<Leadership> {
        let value = value.into();
        check_owner("an election's value", &value)?;
        let guard = self
            .client
            .lock(self.name.clone())
            .owner(value.clone())
            .reentrant(false)
            .publish(value.clone())
            .acquire()
            .await?;
        Ok(Leadership {
            client: self.client.clone(),
            guard,
            value,
        })
    }

    /// The current leader, if any: the lock's first holder.
    ///
    /// Cancel safety: safe, read-only.
    pub async fn leader(&self) -> Result<Option<Leader>> {
        let info = self.client.describe(&self.name).await?;
        Ok(info
            .and_then(|info| info.holders.into_iter().next())
            .map(|holder| Leader {
                value: holder.owner,
                fencing_token: holder.fencing_token,
            }))
    }

    /// The leader now, then every change of leader or of its value, as Go's
    /// `Election.Observe` (`None`: nobody leads). A failed read or watch is
    /// reported as an `Err` item, and the stream carries on after a pause; it
    /// ends only when dropped. Changes that come and go between two reads may
    /// be seen as one.
    ///
    /// Cancel safety: safe; dropping the stream (or a pending `next()`) stops
    /// the watch.
    pub fn observe(&self) -> impl Stream<Item = Result<Option<Leader>>> + Send + 'static {
        let observer = Observer {
            election: self.clone(),
            changes: None,
            polls: false,
            last: None,
            retry: false,
        };
        futures::stream::unfold(observer, |mut observer| async move {
            let item = observer.next().await;
            Some((item, observer))
        })
    }
}

/// The state of one [`Election::observe`] stream.
struct Observer {
    election: Election,
    /// The store's wake-ups, once subscribed.
    changes: Option<HolderChanges>,
    /// The store cannot watch: read every [`OBSERVE_POLL`].
    polls: bool,
    /// What the stream said last.
    last: Option<Option<Leader>>,
    /// The last item was an error: pause before the next attempt.
    retry: bool,
}

impl Observer {
    /// The next leader that differs from the last one reported, or an error.
    ///
    /// Cancel safety: safe; a dropped call leaves the observer consistent
    /// (at worst it subscribes again).
    async fn next(&mut self) -> Result<Option<Leader>> {
        if std::mem::take(&mut self.retry) {
            tokio::time::sleep(OBSERVE_RETRY).await;
        }
        let result = self.next_change().await;
        if result.is_err() {
            self.changes = None;
            self.retry = true;
        }
        result
    }

    /// Cancel safety: as for [`Observer::next`].
    async fn next_change(&mut self) -> Result<Option<Leader>> {
        loop {
            if self.changes.is_none() && !self.polls {
                let backend = self.election.client.backend();
                match backend.watch_holders(&self.election.name).await? {
                    Some(changes) => self.changes = Some(changes),
                    None => self.polls = true,
                }
            }
            // Read after subscribing: a change after the read wakes us.
            let leader = self.election.leader().await?;
            if self.last.as_ref() != Some(&leader) {
                self.last = Some(leader.clone());
                return Ok(leader);
            }
            match &mut self.changes {
                Some(changes) => match changes.next().await {
                    Some(Ok(())) => {}
                    Some(Err(error)) => return Err(error),
                    // The store ended the watch: subscribe again.
                    None => self.changes = None,
                },
                None => tokio::time::sleep(OBSERVE_POLL).await,
            }
        }
    }
}

/// This candidate's leadership, from a won [`Election::campaign`] until
/// [`Leadership::resign`], drop (which resigns in the background) or loss.
#[must_use = "dropping a leadership resigns it at once"]
#[derive(Debug)]
pub struct Leadership {
    client: Client,
    guard: Guard,
    value: String,
}

impl Leadership {
    /// The value this leader publishes now.
    pub fn value(&self) -> &str {
        &self.value
    }

    /// The fencing token of this term: greater than every earlier leader's.
    pub fn fencing_token(&self) -> u64 {
        self.guard.fencing_token()
    }

    /// Completes, with the reason, once this leadership can no longer be
    /// trusted (see [`Guard::lost`]).
    ///
    /// Cancel safety: safe; it only observes.
    pub async fn lost(&self) -> String {
        self.guard.lost().await
    }

    /// Whether leadership has been lost.
    pub fn is_lost(&self) -> bool {
        self.guard.is_lost()
    }

    /// The hold underneath, for its lost signal and names.
    pub fn guard(&self) -> &Guard {
        &self.guard
    }

    /// Publishes a new value while leading, atomically and only if this is
    /// still the leader's hold (Go's `Election.Proclaim`). Stores whose
    /// [`crate::Capabilities::proclaim`] is unset answer
    /// [`Error::Unsupported`]; there, resign and campaign again.
    ///
    /// Cancel safety: safe; the new value either landed or did not.
    pub async fn proclaim(&mut self, value: impl Into<String>) -> Result<()> {
        let value = value.into();
        check_owner("an election's value", &value)?;
        let backend = self.client.backend();
        if !backend.capabilities().proclaim {
            return Err(Error::Unsupported {
                backend: backend.name(),
                what: "changing the leader's value while it leads (resign and campaign again)"
                    .into(),
            });
        }
        self.guard.proclaim(&value).await?;
        self.value = value;
        Ok(())
    }

    /// Steps down: the next candidate in line leads. An error means
    /// leadership had already been lost.
    ///
    /// Cancel safety: as for [`Guard::release`].
    pub async fn resign(self) -> Result<()> {
        self.guard.release().await
    }
}
