//! `redis+sentinel://`: the primary that Sentinel names, followed across
//! failovers.
//!
//! The client asks the Sentinels, in the URL's order, for the address of the
//! master name (`SENTINEL get-master-addr-by-name`), and before it talks to a
//! new address it checks that the server there calls itself a master (`ROLE`),
//! as Redis's guidelines for Sentinel clients ask: a Sentinel cut off from
//! the others may name a primary that was replaced meanwhile.
//!
//! A background task asks again every second, and every 100 ms for two
//! seconds after a command failed in a way that hints the primary moved (it
//! is unreachable, or answers `READONLY` because it was demoted). When the
//! answer changes, commands go to the new primary, the subscription
//! connection moves there (its waiters re-check), and the watchdog re-checks
//! every hold at once: a hold that the new primary does not have (the old
//! one failed before replicating it) fires its `lost` signal.

use std::sync::{Arc, Weak};
use std::time::Duration;

use ::redis::aio::{ConnectionManager, ConnectionManagerConfig};
use tokio::sync::{watch, Notify};
use tokio::time::Instant;

use super::config::Config;
use super::server::{client, failure, problem, Server};
use crate::error::Result;

/// How often the Sentinels are asked while all is well.
const POLL: Duration = Duration::from_secs(1);
/// How often they are asked after a command failed.
const POLL_SUSPECT: Duration = Duration::from_millis(100);
/// How long a failed command keeps the fast polling up.
const SUSPECT_FOR: Duration = Duration::from_secs(2);
/// Connect and command timeout towards a Sentinel or a candidate primary.
const ASK_TIMEOUT: Duration = Duration::from_millis(500);

/// The primary of a Sentinel setup, as this client talks to it now.
pub(crate) struct Primary {
    master: String,
    current: watch::Sender<Arc<Server>>,
    /// A command failed in a way that hints the primary moved.
    suspect: Arc<Notify>,
}

/// One Sentinel and a connection to it.
struct Sentinel {
    label: String,
    conn: ConnectionManager,
}

/// What the Sentinels and the primary need to be reached.
struct Follower {
    config: Config,
    sentinels: Vec<Sentinel>,
    response_timeout: Duration,
    /// Notified after a switch, so the watchdog re-checks every hold.
    switched: Arc<Notify>,
}

impl Primary {
    /// Finds the primary through the Sentinels of `config` and starts
    /// following it; fails when no Sentinel names a primary that answers as
    /// one.
    ///
    /// Cancel safety: safe; nothing is left behind.
    pub async fn connect(
        config: &Config,
        master: &str,
        response_timeout: Duration,
        switched: Arc<Notify>,
    ) -> Result<Arc<Primary>> {
        let settings = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(ASK_TIMEOUT))
            .set_response_timeout(Some(ASK_TIMEOUT))
            .set_number_of_retries(0);
        let mut sentinels = Vec::with_capacity(config.nodes.len());
        for url in &config.nodes {
            let client = client(url, config)?;
            let label = format!("{}", client.get_connection_info().addr());
            let conn = ConnectionManager::new_lazy_with_config(client, settings.clone())
                .map_err(|e| failure(format!("cannot set up Sentinel {label}"), e))?;
            sentinels.push(Sentinel { label, conn });
        }
        let follower = Follower {
            config: config.clone(),
            sentinels,
            response_timeout,
            switched,
        };
        let first = match follower.find(master, None).await {
            Ok(Some(server)) => server,
            Ok(None) => unreachable!("with no current primary, any answer is new"),
            Err(why) => {
                return Err(problem(format!(
                    "no Sentinel of {} named a primary for {master:?}: {why}",
                    config.display
                )))
            }
        };
        tracing::debug!(master, primary = %first.label, "redis primary found through Sentinel");
        let primary = Arc::new(Primary {
            master: master.to_owned(),
            current: watch::channel(Arc::new(first)).0,
            suspect: Arc::new(Notify::new()),
        });
        tokio::spawn(follow(
            Arc::downgrade(&primary),
            primary.suspect.clone(),
            follower,
        ));
        Ok(primary)
    }

    /// The server commands go to now.
    pub fn current(&self) -> Arc<Server> {
        self.current.borrow().clone()
    }

    /// The current server, and every later one.
    pub fn watch(&self) -> watch::Receiver<Arc<Server>> {
        self.current.subscribe()
    }

    /// `host:port (primary of NAME)`, for messages.
    pub fn label(&self) -> String {
        format!("{} (primary of {})", self.current().label, self.master)
    }

    /// Asks the Sentinels again soon: a command failed in a way that hints
    /// the primary moved.
    pub fn suspect(&self) {
        self.suspect.notify_one();
    }
}

/// Follows the primary until the backend is gone.
///
/// Cancel safety: stopping it stops following; commands keep going to the
/// last primary found.
async fn follow(primary: Weak<Primary>, suspect: Arc<Notify>, follower: Follower) {
    let mut suspect_until: Option<Instant> = None;
    let mut complained = false;
    loop {
        let pause = match suspect_until {
            Some(until) if Instant::now() < until => POLL_SUSPECT,
            _ => POLL,
        };
        let notified = tokio::select! {
            _ = suspect.notified() => true,
            _ = tokio::time::sleep(pause) => false,
        };
        if notified {
            suspect_until = Some(Instant::now() + SUSPECT_FOR);
        }
        let Some(primary) = primary.upgrade() else {
            return;
        };
        let current = primary.current();
        match follower.find(&primary.master, Some(&current.label)).await {
            Ok(None) => complained = false,
            Ok(Some(next)) => {
                complained = false;
                tracing::warn!(
                    master = %primary.master,
                    from = %current.label,
                    to = %next.label,
                    "redis primary changed; re-checking every hold"
                );
                primary.current.send_replace(Arc::new(next));
                follower.switched.notify_one();
            }
            Err(why) if !complained => {
                complained = true;
                tracing::warn!(master = %primary.master, %why, "cannot ask the Sentinels for the primary");
            }
            Err(_) => {}
        }
    }
}

impl Follower {
    /// Asks the Sentinels in order for the primary of `master`; answers the
    /// server to switch to, or `None` when the first Sentinel that answers
    /// names `current`.
    ///
    /// Cancel safety: safe; it only reads.
    async fn find(
        &self,
        master: &str,
        current: Option<&str>,
    ) -> std::result::Result<Option<Server>, String> {
        let mut complaints = Vec::new();
        for sentinel in &self.sentinels {
            let asked = ::redis::cmd("SENTINEL")
                .arg("get-master-addr-by-name")
                .arg(master)
                .query_async::<Option<(String, u16)>>(&mut sentinel.conn.clone())
                .await;
            let (host, port) = match asked {
                Ok(Some(addr)) => addr,
                Ok(None) => {
                    complaints.push(format!("{}: unknown master name", sentinel.label));
                    continue;
                }
                Err(e) => {
                    complaints.push(format!("{}: {e}", sentinel.label));
                    continue;
                }
            };
            let address = if host.contains(':') {
                format!("[{host}]:{port}")
            } else {
                format!("{host}:{port}")
            };
            if current == Some(address.as_str()) {
                return Ok(None);
            }
            let url = self.config.data_node_url(&address);
            let server = Server::connect(&url, &self.config, self.response_timeout, false)
                .await
                .map_err(|e| e.to_string())?;
            let role = tokio::time::timeout(
                ASK_TIMEOUT,
                server.query::<Vec<::redis::Value>>(&::redis::cmd("ROLE")),
            )
            .await;
            match role {
                Ok(Ok(role)) if role.first().is_some_and(is_master) => return Ok(Some(server)),
                Ok(Ok(_)) => complaints.push(format!(
                    "{} names {address}, which is not a master (yet)",
                    sentinel.label
                )),
                Ok(Err(e)) => complaints.push(format!(
                    "{} names {address}, which does not answer: {e}",
                    sentinel.label
                )),
                Err(_) => complaints.push(format!(
                    "{} names {address}, which does not answer within {ASK_TIMEOUT:?}",
                    sentinel.label
                )),
            }
        }
        Err(complaints.join("; "))
    }
}

fn is_master(value: &::redis::Value) -> bool {
    matches!(value, ::redis::Value::BulkString(b) if b == b"master")
        || matches!(value, ::redis::Value::SimpleString(s) if s == "master")
}
