//! Client metrics through the `metrics` facade, against `memory://` under
//! tokio's paused clock, recorded by metrics-util's debugging recorder: each
//! acquire outcome, the wait and hold times, and a lost hold by its reason.

use std::time::Duration;

use locksmith::Client;
use metrics_util::debugging::{DebugValue, DebuggingRecorder};
use metrics_util::CompositeKey;

/// What the recorder holds, taken once (taking it resets the counters).
type Snapshot = Vec<(
    CompositeKey,
    Option<metrics::Unit>,
    Option<metrics::SharedString>,
    DebugValue,
)>;

/// The value of a counter, or the observations of a histogram, with these
/// labels besides `backend="memory"`.
fn find<'a>(snapshot: &'a Snapshot, name: &str, labels: &[(&str, &str)]) -> Option<&'a DebugValue> {
    snapshot
        .iter()
        .find(|(key, ..)| {
            let key = key.key();
            key.name() == name
                && key
                    .labels()
                    .any(|l| l.key() == "backend" && l.value() == "memory")
                && labels
                    .iter()
                    .all(|(k, v)| key.labels().any(|l| l.key() == *k && l.value() == *v))
        })
        .map(|(.., value)| value)
}

fn counter(snapshot: &Snapshot, name: &str, labels: &[(&str, &str)]) -> u64 {
    match find(snapshot, name, labels) {
        Some(DebugValue::Counter(n)) => *n,
        None => 0,
        Some(other) => panic!("{name} is not a counter: {other:?}"),
    }
}

fn observations(snapshot: &Snapshot, name: &str, labels: &[(&str, &str)]) -> Vec<f64> {
    match find(snapshot, name, labels) {
        Some(DebugValue::Histogram(values)) => values.iter().map(|v| v.0).collect(),
        None => Vec::new(),
        Some(other) => panic!("{name} is not a histogram: {other:?}"),
    }
}

#[test]
fn acquires_waits_holds_and_losses_are_counted() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .start_paused(true)
        .build()
        .expect("runtime");
    // A current-thread runtime runs every task on this thread, where the
    // local recorder is installed.
    metrics::with_local_recorder(&recorder, || {
        runtime.block_on(async {
            let url = format!("memory://{}", uuid::Uuid::new_v4().simple());
            let first = Client::connect(&url).await.expect("connect");
            let second = Client::connect(&url).await.expect("connect");

            let guard = first.lock("m/a").acquire().await.expect("granted");
            assert!(second
                .lock("m/a")
                .try_acquire()
                .await
                .expect("busy")
                .is_none());
            let timeout = second
                .lock("m/a")
                .acquire_timeout(Duration::from_millis(200))
                .await;
            assert!(matches!(timeout, Err(locksmith::Error::Timeout(_))));

            // A waiter granted after 3 s of (paused) time.
            let waiter = tokio::spawn({
                let lock = second.lock("m/a");
                async move { lock.acquire().await }
            });
            tokio::time::sleep(Duration::from_secs(3)).await;
            guard.release().await.expect("release");
            let next = waiter.await.expect("task").expect("granted");

            // Taken away by an administrator: lost, by that reason.
            first.force_release("m/a").await.expect("force release");
            let reason = next.lost().await;
            assert!(reason.contains("force"), "{reason}");
            drop(next);
        });
    });

    let snapshot = snapshotter.snapshot().into_vec();
    let acquires = |outcome| {
        counter(
            &snapshot,
            "locksmith_client_acquires_total",
            &[("outcome", outcome)],
        )
    };
    assert_eq!(acquires("granted"), 2);
    assert_eq!(acquires("busy"), 1);
    assert_eq!(acquires("timeout"), 1);
    assert_eq!(acquires("error"), 0);
    let waits = observations(&snapshot, "locksmith_client_wait_duration_seconds", &[]);
    assert_eq!(waits.len(), 2, "{waits:?}");
    assert!(waits.iter().any(|&w| w >= 3.0), "{waits:?}");
    let latencies = observations(
        &snapshot,
        "locksmith_client_acquire_duration_seconds",
        &[("outcome", "timeout")],
    );
    assert!(latencies.len() == 1 && latencies[0] >= 0.2, "{latencies:?}");
    let holds = observations(&snapshot, "locksmith_client_hold_duration_seconds", &[]);
    assert_eq!(holds.len(), 2, "{holds:?}");
    assert!(holds.iter().any(|&h| h >= 3.0), "{holds:?}");
    assert_eq!(
        counter(
            &snapshot,
            "locksmith_client_lost_total",
            &[("reason", "force_released")]
        ),
        1
    );
    assert_eq!(
        counter(&snapshot, "locksmith_client_renewal_failures_total", &[]),
        0
    );
}

#[test]
fn a_failed_extension_counts_as_a_renewal_failure() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .start_paused(true)
        .build()
        .expect("runtime");
    metrics::with_local_recorder(&recorder, || {
        runtime.block_on(async {
            let url = format!("memory://{}", uuid::Uuid::new_v4().simple());
            let client = Client::connect(&url).await.expect("connect");
            let guard = client
                .lock("m/leased")
                .lease(Duration::from_secs(1))
                .acquire()
                .await
                .expect("granted");
            client.force_release("m/leased").await.expect("force");
            guard.lost().await;
            assert!(matches!(
                guard.extend(Duration::from_secs(1)).await,
                Err(locksmith::Error::Lost(_))
            ));
            // Misuse is no renewal failure.
            assert!(guard.extend(Duration::ZERO).await.is_err());
        });
    });
    let snapshot = snapshotter.snapshot().into_vec();
    assert_eq!(
        counter(&snapshot, "locksmith_client_renewal_failures_total", &[]),
        1
    );
}
