//! What a hold is, and how each operation on it becomes a script call.

use std::sync::Arc;
use std::time::Duration;

use ::redis::{Cmd, Script, ToRedisArgs};

use super::config::Layout;
use super::keys::Keys;
use super::scripts::Scripts;
use crate::backend::Mode;
use crate::error::{Error, Result};

/// The layout a hold lives in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Kind {
    /// Exclusive, Redisson RLock hash (`mode` = `write`).
    Hash,
    /// Shared, Redisson read lock.
    Shared,
    /// Exclusive, redis-py `SET NX PX` string.
    Simple,
    /// Semaphore of this many permits, Redisson expirable semaphore.
    Semaphore(u32),
}

impl Kind {
    /// The layout of `mode` under `layout`.
    pub fn of(mode: Mode, layout: Layout) -> Kind {
        match mode {
            Mode::Exclusive if layout == Layout::Simple => Kind::Simple,
            Mode::Exclusive => Kind::Hash,
            Mode::Shared => Kind::Shared,
            Mode::Semaphore { permits } => Kind::Semaphore(permits),
        }
    }

    /// The lock mode.
    pub fn mode(self) -> Mode {
        match self {
            Kind::Hash | Kind::Simple => Mode::Exclusive,
            Kind::Shared => Mode::Shared,
            Kind::Semaphore(permits) => Mode::Semaphore { permits },
        }
    }

    /// Whether a grant may admit further waiters (shared holds, permits).
    pub fn admits_more(self) -> bool {
        matches!(self, Kind::Shared | Kind::Semaphore(_))
    }

    /// The renew script's kind letter.
    fn letter(self) -> &'static str {
        match self {
            Kind::Hash => "x",
            Kind::Shared => "s",
            Kind::Simple => "p",
            Kind::Semaphore(_) => "m",
        }
    }
}

/// One owner's hold on one lock.
#[derive(Debug, Clone)]
pub(crate) struct Target {
    /// The lock name as the user gave it.
    pub name: String,
    /// Its keys.
    pub keys: Arc<Keys>,
    /// The holder id: `<client uuid>:<owner>`.
    pub field: String,
    /// Its layout.
    pub kind: Kind,
}

/// How to acquire.
#[derive(Debug, Clone, Copy)]
pub(crate) struct AcquireSpec {
    /// The lease to set: the fixed lease, or the watchdog lease.
    pub lease: Duration,
    /// Whether the hold is kept alive by the watchdog (no fixed lease).
    pub watched: bool,
    /// Whether the caller will wait (so a fair lock queues it).
    pub wait: bool,
    /// Whether the FIFO queue is used.
    pub fair: bool,
    /// How long a queue entry lives without a refresh.
    pub waiter_ttl: Duration,
}

/// An acquire script's answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Reply {
    /// A new hold; `counter` is the token counter when fencing is deferred.
    Granted { token: u64, counter: u64 },
    /// Held by others; the current hold lasts about this many ms (< 0: unknown).
    Busy { hint_ms: i64 },
    /// The holders agreed on this many permits.
    PermitMismatch(i64),
}

impl Reply {
    /// Reads `{status, value, extra}`.
    pub fn parse(reply: &[i64]) -> Result<Reply> {
        let value = |i: usize| reply.get(i).copied().unwrap_or(0);
        Ok(match value(0) {
            1 => Reply::Granted {
                token: value(1).max(0) as u64,
                counter: value(2).max(0) as u64,
            },
            0 => Reply::Busy { hint_ms: value(1) },
            -3 => Reply::PermitMismatch(value(1)),
            other => {
                return Err(super::server::problem(format!(
                    "unexpected acquire script answer {other}"
                )))
            }
        })
    }

    /// Whether the reply took a hold.
    pub fn took(&self) -> bool {
        matches!(self, Reply::Granted { .. })
    }

    /// The error of a refusal.
    pub fn refusal(&self, target: &Target) -> Option<Error> {
        let name = target.name.clone();
        match *self {
            Reply::PermitMismatch(existing) => Some(Error::Conflict {
                name,
                mode: target.kind.mode(),
                detail: format!(
                    "the semaphore has {existing} permits, not {}",
                    match target.kind {
                        Kind::Semaphore(p) => p,
                        _ => 0,
                    }
                ),
            }),
            _ => None,
        }
    }
}

/// A script call, packed once: `EVALSHA <sha> <keys> <args>`, plus the script
/// for loading it on NOSCRIPT.
pub(crate) struct Call {
    pub script: &'static Script,
    pub cmd: Cmd,
}

impl Call {
    /// `EVALSHA` of `script` on `keys`; arguments follow with [`Call::arg`].
    pub fn new(script: &'static Script, keys: &[&str]) -> Call {
        let mut cmd = Cmd::with_capacity(keys.len() + 14, 512);
        cmd.arg("EVALSHA").arg(script.get_hash()).arg(keys.len());
        for key in keys {
            cmd.arg(*key);
        }
        Call { script, cmd }
    }

    /// Appends an argument.
    pub fn arg<T: ToRedisArgs>(mut self, arg: T) -> Call {
        self.cmd.arg(arg);
        self
    }
}

fn flag(on: bool) -> &'static str {
    if on {
        "1"
    } else {
        "0"
    }
}

fn ms(d: Duration) -> u64 {
    (d.as_millis() as u64).max(1)
}

impl Target {
    /// The acquire call; `defer` leaves the fencing token to a Redlock quorum.
    pub fn acquire(
        &self,
        scripts: &'static Scripts,
        spec: &AcquireSpec,
        lock_by: &str,
        defer: bool,
    ) -> Call {
        let k = &*self.keys;
        match self.kind {
            Kind::Hash | Kind::Shared => Call::new(
                &scripts.acquire_hash,
                &[
                    &k.lock,
                    &k.token,
                    &k.meta,
                    &k.queue,
                    &k.queue_deadlines,
                    &k.channel,
                ],
            )
            .arg(&self.field)
            .arg(ms(spec.lease))
            .arg(lock_by)
            .arg(flag(spec.fair))
            .arg(flag(spec.wait))
            .arg(ms(spec.waiter_ttl))
            .arg(flag(defer))
            .arg(if self.kind == Kind::Shared { "s" } else { "x" })
            .arg(k.rw_timeout_prefix(&self.field)),
            Kind::Simple => Call::new(&scripts.acquire_simple, &[&k.lock, &k.token, &k.meta])
                .arg(&self.field)
                .arg(ms(spec.lease))
                .arg(lock_by)
                .arg(flag(defer)),
            Kind::Semaphore(permits) => Call::new(
                &scripts.acquire_semaphore,
                &[
                    &k.lock,
                    &k.permits,
                    &k.token,
                    &k.meta,
                    &k.queue,
                    &k.queue_deadlines,
                    &k.channel,
                    &k.sem_channel,
                ],
            )
            .arg(&self.field)
            .arg(ms(spec.lease))
            .arg(lock_by)
            .arg(flag(spec.fair))
            .arg(flag(spec.wait))
            .arg(ms(spec.waiter_ttl))
            .arg(flag(defer))
            .arg(permits),
        }
    }

    /// The release call of the whole hold; with `token`, only if the holder
    /// id's hold is still the one with that token.
    pub fn release(&self, scripts: &'static Scripts, fair: bool, token: Option<u64>) -> Call {
        let k = &*self.keys;
        let token = token.map_or_else(String::new, |t| t.to_string());
        match self.kind {
            Kind::Hash => Call::new(
                &scripts.release_hash,
                &[
                    &k.lock,
                    &k.meta,
                    &k.queue,
                    &k.queue_deadlines,
                    &k.channel,
                    &k.rw_channel,
                ],
            )
            .arg(&self.field)
            .arg(flag(fair))
            .arg("x")
            .arg("")
            .arg("")
            .arg(&token),
            Kind::Shared => Call::new(
                &scripts.release_hash,
                &[
                    &k.lock,
                    &k.meta,
                    &k.queue,
                    &k.queue_deadlines,
                    &k.channel,
                    &k.rw_channel,
                ],
            )
            .arg(&self.field)
            .arg(flag(fair))
            .arg("s")
            .arg(k.rw_timeout_prefix(&self.field))
            .arg(k.rw_key_prefix())
            .arg(&token),
            Kind::Simple => Call::new(&scripts.release_simple, &[&k.lock, &k.meta, &k.channel])
                .arg(&self.field)
                .arg(&token),
            Kind::Semaphore(permits) => Call::new(
                &scripts.release_semaphore,
                &[
                    &k.lock,
                    &k.permits,
                    &k.meta,
                    &k.queue,
                    &k.queue_deadlines,
                    &k.channel,
                    &k.sem_channel,
                ],
            )
            .arg(&self.field)
            .arg(flag(fair))
            .arg(permits)
            .arg(&token),
        }
    }

    /// The call that records the hold's re-entry depth (the hold with
    /// `token`).
    pub fn set_count(&self, scripts: &'static Scripts, count: u32, token: u64) -> Call {
        let k = &*self.keys;
        Call::new(&scripts.set_count, &[&k.lock, &k.meta, &k.permits])
            .arg(self.kind.letter())
            .arg(&self.field)
            .arg(count)
            .arg(token)
            .arg(if self.kind == Kind::Shared {
                k.rw_timeout_prefix(&self.field)
            } else {
                String::new()
            })
    }

    /// Leaving the fair queue.
    pub fn leave_queue(&self, scripts: &'static Scripts) -> Call {
        let k = &*self.keys;
        Call::new(
            &scripts.leave_queue,
            &[&k.queue, &k.queue_deadlines, &k.channel],
        )
        .arg(&self.field)
    }

    /// The channel a waiter for this hold listens on.
    pub fn wait_channel(&self, fair: bool) -> String {
        if fair {
            self.keys.waiter_channel(&self.field)
        } else if let Kind::Semaphore(_) = self.kind {
            self.keys.sem_channel.clone()
        } else {
            self.keys.channel.clone()
        }
    }
}

/// A renew (or check) call for up to [`super::watchdog::BATCH`] holds; a lease
/// of 0 only checks. `exact` sets the TTL to the lease instead of raising it.
pub(crate) fn renew(
    scripts: &'static Scripts,
    targets: &[Target],
    leases: &[u64],
    exact: bool,
) -> Call {
    let mut keys = Vec::with_capacity(targets.len() * 3);
    for target in targets {
        let k = &*target.keys;
        keys.extend([k.lock.as_str(), k.meta.as_str(), k.permits.as_str()]);
    }
    let mut call = Call::new(&scripts.renew, &keys).arg(targets.len());
    for (target, lease) in targets.iter().zip(leases) {
        call = call
            .arg(target.kind.letter())
            .arg(&target.field)
            .arg(*lease)
            .arg(flag(exact))
            .arg(if target.kind == Kind::Shared {
                target.keys.rw_timeout_prefix(&target.field)
            } else {
                String::new()
            });
    }
    call
}

/// The fencing call of Redlock's second phase.
pub(crate) fn fence(
    scripts: &'static Scripts,
    target: &Target,
    value: u64,
    lease: Duration,
) -> Call {
    Call::new(&scripts.fence, &[&target.keys.token, &target.keys.meta])
        .arg(value)
        .arg(&target.field)
        .arg(ms(lease))
}
