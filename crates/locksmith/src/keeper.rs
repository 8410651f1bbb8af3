//! The keeper's rules for a hold the client keeps alive, decided once for
//! every backend: when it is renewed, and until when it may be trusted
//! without an answer from the store. Each backend's renewal loop (the
//! server's session heartbeats, etcd's lease keep-alives, the Redis
//! watchdog, PostgreSQL's lease rows, the memory store's sessions) applies
//! them to its store. ZooKeeper's session is kept alive by its client
//! library, which pings at a third of the session timeout itself.

use std::time::Duration;

use tokio::time::Instant;

/// How often a hold, or the session or lease that keeps it, is renewed:
/// every third of its TTL (Redisson's watchdog rule), so that two renewals
/// in a row can fail or be slow before it runs out.
pub(crate) fn renewal_interval(ttl: Duration) -> Duration {
    ttl / 3
}

/// Until when a hold renewed (or granted) for `lease` by a request sent at
/// `sent` may be trusted without another answer: the lease counted from
/// the send, never from the answer, so never later than the store's own
/// clock says; less `drift` where the store's clocks may run at other rates
/// than ours (Redlock's `lease × 1% + 2 ms`; zero elsewhere).
pub(crate) fn trusted_until(sent: Instant, lease: Duration, drift: Duration) -> Instant {
    sent + lease.saturating_sub(drift)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renewal_comes_at_a_third_and_trust_ends_with_the_lease_from_the_send() {
        assert_eq!(
            renewal_interval(Duration::from_secs(30)),
            Duration::from_secs(10)
        );
        let sent = Instant::now();
        let lease = Duration::from_secs(30);
        assert_eq!(trusted_until(sent, lease, Duration::ZERO), sent + lease);
        assert_eq!(
            trusted_until(sent, lease, Duration::from_millis(302)),
            sent + lease - Duration::from_millis(302)
        );
        assert_eq!(
            trusted_until(sent, lease, lease * 2),
            sent,
            "never before the send"
        );
    }
}
