//! Idle sessions on ZooKeeper: a session is a connection of its own, and its
//! client pings by itself when idle (about every third of the session
//! timeout), so nothing is sent here and nothing is timed: ZooKeeper's
//! client does not let its caller see a ping's answer.

use futures::StreamExt;
use tokio::task::JoinSet;

use super::{Plan, Shared};

/// Sessions connecting at once while they open.
const OPENING_AT_ONCE: usize = 64;

/// Opens the plan's sessions on the servers among `hosts` and spawns a task
/// per session that keeps it until the run stops.
///
/// Cancel safety: dropped, the sessions opened so far are closed as their
/// clients drop.
pub(super) async fn open(
    hosts: &[String],
    plan: &Plan,
    shared: &Shared,
    keepers: &mut JoinSet<Result<(), String>>,
) -> Result<(&'static str, usize), String> {
    let servers = hosts.join(",");
    let mut connecting = futures::stream::iter(0..plan.sessions)
        .map(|_| {
            let servers = servers.clone();
            async move {
                zookeeper_client::Client::connector()
                    .with_session_timeout(plan.ttl)
                    .connect(&servers)
                    .await
                    .map_err(|e| format!("connect to {servers}: {e}"))
            }
        })
        .buffer_unordered(OPENING_AT_ONCE);
    while let Some(client) = connecting.next().await {
        let client = client?;
        let shared = shared.clone();
        keepers.spawn(async move {
            shared.until_stopped().await;
            drop(client);
            Ok(())
        });
    }
    Ok(("session (a connection of its own)", 1))
}
