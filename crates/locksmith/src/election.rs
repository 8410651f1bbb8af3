//! Leader election: leadership is an exclusive lock whose owner id is the value
//! the leader publishes.

use crate::client::Client;
use crate::error::Result;
use crate::guard::Guard;

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

    /// Waits until this candidate leads, publishing `value`. Leadership lasts
    /// until the returned guard is released or lost; select on
    /// [`Guard::lost`] to step down in time.
    ///
    /// Cancel safety: safe; a dropped campaign leaves no candidacy behind.
    pub async fn campaign(&self, value: impl Into<String>) -> Result<Guard> {
        self.client
            .lock(self.name.clone())
            .owner(value)
            .reentrant(false)
            .acquire()
            .await
    }

    /// The current leader, if any.
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
}
