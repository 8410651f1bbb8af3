//! A restored snapshot behaves exactly like the engine it was taken from.

use locksmith_core::{
    Acquire, ClientInfo, Command, Effect, EndingSnapshot, Engine, Limits, LostReason, Mode,
    RequestId, SessionId, Snapshot, Wait,
};

fn acquire(
    session: u64,
    request: u64,
    names: &[&str],
    mode: Mode,
    wait: Wait,
    lease: Option<u64>,
) -> Command {
    Command::Acquire(Acquire {
        session: SessionId(session),
        request: RequestId(request),
        owner: format!("o{session}"),
        names: names.iter().map(|n| n.to_string()).collect(),
        mode,
        wait,
        lease,
        reentrant: true,
        lock_delay: 500,
    })
}

#[test]
fn restored_engine_continues_identically() {
    let mut original = Engine::default();
    let mut effects = Vec::new();
    for s in 1..=3 {
        let open = Command::OpenSession {
            session: SessionId(s),
            ttl: 1_000,
            info: ClientInfo::default(),
        };
        original.apply(0, open, &mut effects).unwrap();
    }
    let setup = [
        acquire(1, 1, &["a"], Mode::Exclusive, Wait::Forever, Some(300)),
        acquire(2, 1, &["a", "b"], Mode::Exclusive, Wait::Until(5_000), None),
        acquire(3, 1, &["c"], Mode::Shared, Wait::Forever, None),
        acquire(1, 2, &["c"], Mode::Shared, Wait::Forever, None),
        acquire(2, 2, &["c"], Mode::Exclusive, Wait::Forever, None),
        acquire(
            3,
            2,
            &["d"],
            Mode::Semaphore { permits: 2 },
            Wait::Forever,
            None,
        ),
    ];
    for command in setup {
        original.apply(10, command, &mut effects).unwrap();
    }
    let snapshot = original.snapshot();
    let mut restored = Engine::restore(Limits::default(), snapshot.clone()).unwrap();
    assert_eq!(restored.snapshot(), snapshot);
    assert_eq!(restored.list(""), original.list(""));
    assert_eq!(restored.next_deadline(), original.next_deadline());

    // The same future gives the same effects on both.
    let mut now = 10;
    let mut steps = 0;
    while let Some(at) = original.next_deadline() {
        now = now.max(at);
        let due = original.due(now);
        assert_eq!(restored.due(now), due);
        for command in due {
            let (mut a, mut b) = (Vec::<Effect>::new(), Vec::<Effect>::new());
            let ra = original.apply(now, command.clone(), &mut a);
            let rb = restored.apply(now, command, &mut b);
            assert_eq!(ra, rb);
            assert_eq!(a, b);
        }
        steps += 1;
        assert!(steps < 100, "time-driven commands never settle");
    }
    assert!(steps > 2, "the scenario exercised expiry");
    assert_eq!(restored.snapshot(), original.snapshot());
    assert_eq!(restored.last_token(), original.last_token());
}

/// An engine with session 1 open (TTL 1 s) at time 0.
fn engine_with_session_one() -> Engine {
    let mut engine = Engine::default();
    let open = Command::OpenSession {
        session: SessionId(1),
        ttl: 1_000,
        info: ClientInfo::default(),
    };
    engine.apply(0, open, &mut Vec::new()).unwrap();
    engine
}

#[test]
fn a_raised_token_floor_survives_a_snapshot_and_only_moves_up() {
    let mut engine = engine_with_session_one();
    let grant = |engine: &mut Engine, request: u64, name: &str| {
        let mut effects = Vec::new();
        let command = acquire(1, request, &[name], Mode::Exclusive, Wait::No, None);
        engine.apply(1, command, &mut effects).unwrap();
        match effects.as_slice() {
            [Effect::Granted { tokens, .. }] => tokens[0],
            other => panic!("{other:?}"),
        }
    };
    assert_eq!(grant(&mut engine, 1, "a"), 1);
    engine.raise_token_floor(1_000);
    assert_eq!(grant(&mut engine, 2, "b"), 1_001);
    // A floor below the tokens already issued changes nothing.
    engine.raise_token_floor(5);
    assert_eq!(engine.last_token(), 1_001);
    let restored = Engine::restore(Limits::default(), engine.snapshot()).unwrap();
    assert_eq!(restored.last_token(), 1_001);
}

/// A snapshot with two sessions: one holds `a` (a hold with a lease too)
/// and the other waits for `a` and `b`, while it holds `b` shared.
fn busy_snapshot() -> Snapshot {
    let mut engine = Engine::default();
    let mut effects = Vec::new();
    for s in 1..=2 {
        let open = Command::OpenSession {
            session: SessionId(s),
            ttl: 1_000,
            info: ClientInfo::default(),
        };
        engine.apply(0, open, &mut effects).unwrap();
    }
    for command in [
        acquire(1, 1, &["a"], Mode::Exclusive, Wait::No, Some(500)),
        acquire(2, 1, &["b"], Mode::Shared, Wait::No, None),
        acquire(2, 2, &["a", "c"], Mode::Exclusive, Wait::Forever, None),
    ] {
        engine.apply(1, command, &mut effects).unwrap();
    }
    engine.snapshot()
}

/// Locks listed out of name order (not as an engine writes them, but
/// consistent) restore to the same table, each found by its name.
#[test]
fn a_snapshot_listing_its_locks_out_of_order_restores_the_same_table() {
    let snapshot = busy_snapshot();
    let mut reversed = snapshot.clone();
    reversed.locks.reverse();
    assert_ne!(reversed.locks, snapshot.locks);
    let restored = Engine::restore(Limits::default(), reversed).unwrap();
    assert_eq!(restored.snapshot(), snapshot);
    for lock in &snapshot.locks {
        let found = restored.describe(&lock.name).expect("found by name");
        assert_eq!(found.name, lock.name);
    }
}

/// A snapshot whose parts contradict each other is refused when restored,
/// with what is wrong; before the check, such an engine panicked later, on
/// the command that relied on the missing part (here: expiring the session
/// whose queue entry had no waiter).
#[test]
fn an_inconsistent_snapshot_is_refused() {
    let good = busy_snapshot();
    assert!(Engine::restore(Limits::default(), good.clone()).is_ok());
    let lock = |s: &Snapshot, name: &str| s.locks.iter().position(|l| l.name == name).unwrap();
    type Spoil = Box<dyn Fn(&mut Snapshot)>;
    let cases: Vec<(&str, Spoil)> = vec![
        (
            "neither open nor ending",
            Box::new(|s| s.sessions.retain(|x| x.session != SessionId(1))),
        ),
        (
            "listed twice",
            Box::new(|s| {
                s.ending.push(EndingSnapshot {
                    session: SessionId(1),
                    reason: LostReason::SessionClosed,
                    since: 1,
                    info: ClientInfo::default(),
                })
            }),
        ),
        ("never issued", Box::new(|s| s.last_token = 1)),
        (
            "given twice",
            Box::new(move |s| {
                let a = lock(s, "a");
                let b = lock(s, "b");
                s.locks[b].holders[0].token = s.locks[a].holders[0].token;
            }),
        ),
        (
            "exclude each other",
            Box::new(move |s| {
                let (a, b) = (lock(s, "a"), lock(s, "b"));
                let hold = s.locks[b].holders[0].clone();
                s.locks[a].holders.push(hold);
            }),
        ),
        (
            "held 0 times",
            Box::new(move |s| {
                let a = lock(s, "a");
                s.locks[a].holders[0].count = 0;
            }),
        ),
        ("waits for it once at most", Box::new(|s| s.waiters.clear())),
        (
            "the queues hold",
            Box::new(move |s| {
                let c = lock(s, "c");
                s.locks[c].queue.clear();
            }),
        ),
        (
            "listed twice",
            Box::new(|s| {
                let again = s.sessions[0].clone();
                s.sessions.push(again);
            }),
        ),
        ("empty", Box::new(|s| s.locks[0].name = String::new())),
    ];
    for (expected, spoil) in cases {
        let mut bad = good.clone();
        spoil(&mut bad);
        #[cfg(feature = "serde")]
        {
            let streamed = read_checked(&bad).expect_err(expected);
            assert!(
                streamed.to_string().contains(expected),
                "{expected}: {streamed}"
            );
        }
        let error = Engine::restore(Limits::default(), bad).expect_err(expected);
        assert!(error.to_string().contains(expected), "{expected}: {error}");
    }
}

/// `snapshot`, encoded as the server writes it, read back by
/// [`CheckedSnapshot`] (then a marker written after it, which must read:
/// a snapshot that breaks a rule is still read to its end).
#[cfg(feature = "serde")]
fn read_checked(
    snapshot: &Snapshot,
) -> Result<locksmith_core::SnapshotCensus, locksmith_core::SnapshotError> {
    use locksmith_core::CheckedSnapshot;
    let bytes = postcard::to_stdvec(&(snapshot, 0xfeed_u64)).unwrap();
    let (checked, marker): (CheckedSnapshot, u64) = postcard::from_bytes(&bytes).unwrap();
    assert_eq!(marker, 0xfeed);
    checked.into_result()
}

/// A snapshot checked as it is read, without being built, is held to the
/// same rules and counted alike; names out of order are still told apart.
#[cfg(feature = "serde")]
#[test]
fn a_snapshot_checked_as_it_is_read_agrees_with_the_built_one() {
    let good = busy_snapshot();
    let census = good.census().unwrap();
    assert_eq!(read_checked(&good), Ok(census));
    assert_eq!(
        (census.sessions, census.locks, census.held, census.holds),
        (2, 3, 2, 2)
    );
    assert_eq!((census.waiters, census.ending), (1, 0));

    let mut reversed = good.clone();
    reversed.locks.reverse();
    assert_eq!(read_checked(&reversed), Ok(census));
    assert_eq!(reversed.census(), Ok(census));
    let mut twice = reversed.clone();
    let again = twice.locks[0].clone();
    twice.locks.push(again);
    for error in [read_checked(&twice), twice.census()] {
        let error = error.unwrap_err().to_string();
        assert!(error.contains("listed twice"), "{error}");
    }

    // A damaged encoding is a decoding error, not a broken rule.
    let bytes = postcard::to_stdvec(&good).unwrap();
    let cut = &bytes[..bytes.len() - 3];
    assert!(postcard::from_bytes::<locksmith_core::CheckedSnapshot>(cut).is_err());
}

/// Encoding a frozen table and checking one as it is read pause every few
/// dozen locks while their caller asks (`pace::pausing`), and not
/// otherwise: a server's background thread gives way there.
#[cfg(feature = "serde")]
#[test]
fn encoding_and_checking_a_big_table_pause_as_they_go() {
    use locksmith_core::{pace, CheckedSnapshot};
    thread_local! {
        static PAUSES: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
    }
    fn count_pause() {
        PAUSES.set(PAUSES.get() + 1);
    }
    const LOCKS: u64 = 5_000;
    let mut engine = engine_with_session_one();
    let mut effects = Vec::new();
    for i in 0..LOCKS {
        let name = format!("lock-{:05}", (i * 7919) % LOCKS);
        let command = acquire(1, i + 1, &[&name], Mode::Exclusive, Wait::Forever, None);
        engine.apply(1, command, &mut effects).unwrap();
    }
    let frozen = engine.freeze();

    let bytes = postcard::to_stdvec(&frozen).unwrap();
    assert_eq!(PAUSES.get(), 0, "no pause asked for, none made");
    let again = pace::pausing(count_pause, || postcard::to_stdvec(&frozen).unwrap());
    assert_eq!(again, bytes, "pausing changes nothing encoded");
    let encoding = PAUSES.get();
    // Collected, sorted and written: a pause every 64 locks at least.
    assert!(encoding as u64 >= LOCKS / 64, "{encoding} pauses");

    let census = pace::pausing(count_pause, || {
        postcard::from_bytes::<CheckedSnapshot>(&bytes)
            .unwrap()
            .into_result()
            .unwrap()
    });
    assert_eq!(census.held, LOCKS as usize);
    let checking = PAUSES.get() - encoding;
    assert!(checking as u64 >= LOCKS / 64, "{checking} pauses");
}

#[cfg(feature = "serde")]
proptest::proptest! {
    // As in `model`: no regressions file beside an integration test; a
    // failure prints its minimal input.
    #![proptest_config(proptest::prelude::ProptestConfig {
        failure_persistence: None,
        ..proptest::prelude::ProptestConfig::default()
    })]

    /// A frozen table encodes its locks in the order of their names, as the
    /// snapshot it would build lists them, whatever order they were taken
    /// in and whatever prefix they share (the encoding sorts by the bytes
    /// after the shared prefix first).
    #[test]
    fn a_frozen_table_encodes_its_locks_in_name_order(
        names in proptest::prelude::Strategy::prop_flat_map(
            (
                "(|orders/|jobs/nightly/aaaaaaaaaa)",
                proptest::collection::btree_set("[ab0é日]{1,11}(/[ab]{1,9})?", 1..48),
            ),
            |(prefix, suffixes)| {
                let names: Vec<String> =
                    suffixes.into_iter().map(|s| format!("{prefix}{s}")).collect();
                proptest::prelude::Strategy::prop_shuffle(proptest::prelude::Just(names))
            },
        )
    ) {
        let mut engine = engine_with_session_one();
        let mut effects = Vec::new();
        for (i, name) in names.iter().enumerate() {
            let command = acquire(1, i as u64 + 1, &[name], Mode::Exclusive, Wait::No, None);
            engine.apply(1, command, &mut effects).unwrap();
        }
        let built = engine.freeze().into_snapshot();
        proptest::prop_assert_eq!(built.locks.len(), names.len());
        proptest::prop_assert_eq!(
            postcard::to_stdvec(&engine.freeze()).unwrap(),
            postcard::to_stdvec(&built).unwrap()
        );
    }
}
