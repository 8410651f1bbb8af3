//! Elections in the layout of Go's `concurrency.Election`
//! (`client/v3/concurrency/election.go`), which `etcdctl elect` runs.
//!
//! The election `name` is the lock `name`: a candidate is the key
//! `<name>/<lease id in hex>` on its session lease, the leader is the key
//! with the lowest create revision, and each candidate waits for the delete
//! of the one created just before it. That is exactly the lock layout; the
//! one difference is the value, which holds the proposal as it is (see
//! [`super::layout::key_value`]). This module adds what only elections do:
//! `Observe`. (`Proclaim` is a write of the hold's own key, with the hold:
//! `super::hold`.)

use std::sync::Arc;

use futures::StreamExt;

use super::layout::lock_prefix;
use super::rpc::etcdserverpb::WatchCreateRequest;
use super::rpc::{self, WatchStream};
use super::{backend_error, Inner};
use crate::backend::HolderChanges;
use crate::error::{Error, Result};

/// Go's `Election.Observe` watches the whole prefix: so does this, on a watch
/// stream of its own, confirmed by etcd before it is returned (so a read
/// after it misses nothing). Every event under the prefix is a wake-up.
///
/// Cancel safety: safe; a dropped call closes its stream.
pub(crate) async fn watch_holders(inner: &Arc<Inner>, name: &str) -> Result<HolderChanges> {
    let (key, range_end) = rpc::prefix_range(lock_prefix(&inner.namespace, name).as_bytes());
    let request = WatchCreateRequest {
        key,
        range_end,
        ..WatchCreateRequest::default()
    };
    let mut stream = inner.client.watch_stream(request).await.map_err(failed)?;
    loop {
        match stream.message().await.map_err(failed)? {
            Some(response) if response.created => break,
            Some(_) => continue,
            None => return Err(ended()),
        }
    }
    let wake_ups = futures::stream::unfold(Some(stream), |stream| async move {
        let mut stream: WatchStream = stream?;
        loop {
            match stream.message().await {
                Ok(Some(response)) if response.canceled => {
                    let reason = response.cancel_reason;
                    return Some((Err(Error::backend(super::BACKEND, reason)), None));
                }
                Ok(Some(response)) if !response.events.is_empty() => {
                    return Some((Ok(()), Some(stream)))
                }
                Ok(Some(_)) => continue,
                Ok(None) => return Some((Err(ended()), None)),
                Err(error) => return Some((Err(failed(error)), None)),
            }
        }
    });
    Ok(wake_ups.boxed())
}

fn failed(error: tonic::Status) -> Error {
    backend_error("watching the election", error)
}

fn ended() -> Error {
    Error::backend(super::BACKEND, "etcd ended the election's watch stream")
}
