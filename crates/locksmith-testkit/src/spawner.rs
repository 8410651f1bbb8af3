//! One long-lived thread that forks every server.
//!
//! `PR_SET_PDEATHSIG` fires when the *thread* that forked the child exits, not
//! when the process does. Test harnesses run each test on its own thread, tokio
//! retires idle blocking threads, and `ZooKeeper::shared()` outlives the test that
//! created it; forking from those threads would kill servers at random. Forking
//! from one thread that lives as long as the process ties the servers' lives to
//! the process, which is what we want.

use std::io;
use std::process::{Child, Command};
use std::sync::mpsc::{self, Sender};
use std::sync::{Mutex, OnceLock};
use std::thread;

type Request = (Command, Sender<io::Result<Child>>);

/// Spawns `command` from the spawner thread and returns the child.
pub(crate) fn spawn(command: Command) -> io::Result<Child> {
    static SPAWNER: OnceLock<Mutex<Sender<Request>>> = OnceLock::new();
    let spawner = SPAWNER.get_or_init(|| {
        let (tx, rx) = mpsc::channel::<Request>();
        thread::Builder::new()
            .name("locksmith-testkit-spawner".into())
            .spawn(move || {
                for (mut command, reply) in rx {
                    // The requester may have given up waiting; nothing to do then.
                    let _ = reply.send(command.spawn());
                }
            })
            .expect("cannot start the locksmith-testkit spawner thread");
        Mutex::new(tx)
    });
    let (reply_tx, reply_rx) = mpsc::channel();
    spawner
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
        .send((command, reply_tx))
        .map_err(|_| io::Error::other("the locksmith-testkit spawner thread is gone"))?;
    reply_rx
        .recv()
        .map_err(|_| io::Error::other("the locksmith-testkit spawner thread is gone"))?
}
