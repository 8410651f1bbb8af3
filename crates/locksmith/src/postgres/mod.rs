//! `postgres://` backend (being written).

use async_trait::async_trait;

use crate::backend::{AcquireRequest, Backend, Capabilities, Grant, LockInfo};
use crate::client::ConnectOptions;
use crate::error::{Error, Result};

const BACKEND: &str = "postgres";

/// The postgres backend.
pub struct PostgresBackend;

impl PostgresBackend {
    /// Connects to the store named by `url`.
    ///
    /// Cancel safety: safe; a dropped connect leaves nothing behind.
    pub async fn connect(_url: &str, _options: &ConnectOptions) -> Result<Self> {
        Err(Error::Unsupported {
            backend: BACKEND,
            what: "not built yet".into(),
        })
    }
}

#[async_trait]
impl Backend for PostgresBackend {
    fn name(&self) -> &'static str {
        BACKEND
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            fifo: false,
            lock_delay: false,
            lists_waiters: false,
            shared: false,
            semaphore: false,
        }
    }

    async fn acquire(&self, _request: &AcquireRequest) -> Result<Option<Grant>> {
        unimplemented!()
    }

    async fn describe(&self, _name: &str) -> Result<Option<LockInfo>> {
        unimplemented!()
    }

    async fn list(&self, _prefix: &str) -> Result<Vec<LockInfo>> {
        unimplemented!()
    }

    async fn force_release(&self, _name: &str) -> Result<()> {
        unimplemented!()
    }

    async fn close(&self) -> Result<()> {
        unimplemented!()
    }
}
