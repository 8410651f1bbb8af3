//! The command's modules (the library `locksmith_cli`), one module of tests
//! each: what the command prints and parses, and how `run` supervises.

/// The command line: `locksmith`'s own arguments.
mod command_line {
    use clap::Parser;
    use locksmith_cli::{Cli, Command};

    /// Every command names the store `--backend`; `cluster` still takes the
    /// `--server` it once had.
    #[test]
    fn cluster_takes_backend_and_its_old_spelling() {
        for flag in ["--backend", "--server"] {
            let cli =
                Cli::try_parse_from(["locksmith", "cluster", flag, "locksmith://h:1", "status"])
                    .unwrap_or_else(|e| panic!("{flag}: {e}"));
            assert!(matches!(cli.command, Command::Cluster(_)), "{flag}");
        }
        let cli = Cli::try_parse_from(["locksmith", "run", "x", "-vv", "--", "true"]).unwrap();
        assert_eq!(cli.verbose, 2, "-v after the subcommand counts too");
    }
}

/// `locksmith cluster status --json`.
mod cluster {
    use locksmith_cli::cluster::status_json;
    use locksmith_proto::raft as pb;

    #[test]
    fn status_json_has_the_documented_fields() {
        let view = pb::ClusterStatus {
            node_id: 1,
            leader_id: 1,
            term: 3,
            changing: true,
            cluster_version: 2,
            members: vec![pb::MemberStatus {
                id: 1,
                address: "a:1".into(),
                voter: true,
                leader: true,
                last_log_index: Some(9),
                applied_index: Some(9),
                lag: Some(0),
                version: Some("0.1.0".into()),
                record_version: Some(2),
            }],
        };
        let json = status_json(&view);
        assert_eq!(json["leader_id"], 1);
        assert_eq!(json["changing"], true);
        assert_eq!(json["members"][0]["lag"], 0);
        assert_eq!(json["members"][0]["address"], "a:1");
        assert_eq!(json["members"][0]["record_version"], 2);
        assert_eq!(json["cluster_version"], 2);
    }
}

/// Where `locksmith snapshot save` takes a backup from.
mod snapshot {
    use locksmith_cli::snapshot::caught_up_follower;
    use locksmith_proto::raft as pb;

    fn member(id: u64, matched: Option<u64>, lag: Option<u64>) -> pb::MemberStatus {
        pb::MemberStatus {
            id,
            address: format!("127.0.0.1:{}", 7000 + id),
            voter: true,
            leader: id == 1,
            last_log_index: matched,
            applied_index: None,
            lag,
            version: None,
            record_version: None,
        }
    }

    fn leader_view(members: Vec<pb::MemberStatus>) -> pb::ClusterStatus {
        pb::ClusterStatus {
            node_id: 1,
            leader_id: 1,
            term: 3,
            members,
            changing: false,
            cluster_version: 0,
        }
    }

    #[test]
    fn a_backup_comes_from_the_follower_least_behind_the_leader() {
        let view = leader_view(vec![
            member(1, Some(5_000), Some(0)),
            member(2, Some(4_990), Some(10)),
            member(3, Some(4_998), Some(2)),
        ]);
        assert_eq!(caught_up_follower(&view).map(|m| m.id), Some(3));
    }

    #[test]
    fn a_follower_far_behind_or_never_matched_is_not_a_backup_source() {
        let view = leader_view(vec![
            member(1, Some(5_000), Some(0)),
            member(2, Some(3_000), Some(2_000)),
            member(3, None, Some(5_000)),
        ]);
        assert_eq!(caught_up_follower(&view).map(|m| m.id), None);
        // A group of one: the leader alone.
        let view = leader_view(vec![member(1, Some(5_000), Some(0))]);
        assert_eq!(caught_up_follower(&view).map(|m| m.id), None);
    }
}

/// `locksmith run`'s supervision of its command.
mod run {
    use std::time::Duration;

    use locksmith_cli::common::Termination;
    use locksmith_cli::run::supervise;

    /// Whether process `pid` is gone or a zombie (killed, not reaped yet).
    fn ended(pid: u32) -> bool {
        std::fs::read_to_string(format!("/proc/{pid}/stat")).map_or(true, |stat| {
            stat.rsplit(')')
                .next()
                .unwrap_or("")
                .trim_start()
                .starts_with('Z')
        })
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_dropped_supervision_kills_the_command() {
        let client = locksmith::Client::connect("memory://").await.unwrap();
        let guard = client.lock("supervised").acquire().await.unwrap();
        let mut termination = Termination::listen();
        let dir = tempfile::tempdir().unwrap();
        let pid_file = dir.path().join("pid");
        let script = format!("echo $$ > {}; exec sleep 60", pid_file.display());
        let command = ["sh".to_string(), "-c".to_string(), script];
        let supervised = supervise(
            &command,
            &[],
            &mut termination,
            &guard,
            "supervised",
            Duration::from_secs(1),
        );
        let started = async {
            loop {
                if let Ok(pid) = std::fs::read_to_string(&pid_file) {
                    if let Ok(pid) = pid.trim().parse::<u32>() {
                        return pid;
                    }
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        };
        // The command runs; then the supervision is dropped.
        let pid = tokio::select! {
            _ = supervised => panic!("the command ended before it was dropped"),
            pid = started => pid,
        };
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while !ended(pid) {
            assert!(std::time::Instant::now() < deadline, "the command runs on");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        guard.release().await.unwrap();
    }
}

/// SIGINT and SIGTERM, as every command waits for them.
mod common {
    use std::time::Duration;

    use futures::FutureExt;
    use locksmith_cli::common::Termination;
    use nix::sys::signal::{raise, Signal};

    /// What left `locksmith elect` leading after SIGINT: the signal landed
    /// after one wait was dropped and before the next one began.
    #[tokio::test]
    async fn a_signal_between_two_waits_ends_the_second() {
        let mut termination = Termination::listen();
        let mut witness = Termination::listen();
        // A first wait, dropped unfinished (as a `select!` drops it).
        assert!(termination.recv().now_or_never().is_none());
        raise(Signal::SIGTERM).unwrap();
        // Once another listener has it, tokio has told every listener.
        assert_eq!(witness.recv().await, Signal::SIGTERM);
        let signal = tokio::time::timeout(Duration::from_secs(10), termination.recv())
            .await
            .expect("the signal was missed");
        assert_eq!(signal, Signal::SIGTERM);
    }
}

/// `locksmith session`: ids and the table.
mod session {
    use locksmith_cli::session::{parse_session_id, render};
    use locksmith_proto::v1 as pb;

    #[test]
    fn session_ids_are_hex() {
        assert_eq!(parse_session_id("000000000000002a"), Ok(42));
        assert_eq!(parse_session_id("0x2a"), Ok(42));
        assert!(parse_session_id("xyz").is_err());
    }

    #[test]
    fn renders_sessions() {
        let list = pb::ListSessionsResponse {
            sessions: vec![pb::SessionInfo {
                session_id: 42,
                client_name: "cron\u{1b}[2J".into(),
                host: "host-a".into(),
                ttl_ms: 15_000,
                expires_at_ms: 12_500,
                holds: 3,
                connected: false,
                peer: "10.0.0.7:51234".into(),
            }],
            now_ms: 10_000,
        };
        let text = render(&list).to_string();
        for expected in [
            "000000000000002a",
            "cron\\u{1b}[2J",
            "host-a",
            "10.0.0.7:51234",
            "no",
            "15.0s",
            "2.5s",
        ] {
            assert!(text.contains(expected), "{expected} missing from\n{text}");
        }
    }
}

/// `locksmith status`: the table and what it escapes.
mod status {
    use std::borrow::Cow;
    use std::time::{Duration, SystemTime};

    use locksmith::LockInfo;
    use locksmith::{Holder, Mode, Waiter};
    use locksmith_cli::status::{printable, render};

    #[test]
    fn renders_holders_and_waiters() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000);
        let locks = [LockInfo {
            name: "jobs/report".into(),
            holders: vec![Holder {
                owner: "w1".into(),
                lock_by: Some("cron@host-a".into()),
                lock_time: Some(now - Duration::from_secs(5)),
                fencing_token: Some(42),
                lease_expires: Some(now + Duration::from_millis(2500)),
                mode: Mode::Exclusive,
                hold_count: 2,
            }],
            waiters: vec![Waiter {
                owner: "w2".into(),
                mode: Mode::Exclusive,
                since: None,
            }],
        }];
        let text = render(&locks, now).to_string();
        for expected in [
            "jobs/report",
            "exclusive x2",
            "w1",
            "cron@host-a",
            "42",
            "2.5s",
            "1970-01-12T13:46:35Z",
        ] {
            assert!(text.contains(expected), "{expected} missing from\n{text}");
        }
    }

    #[test]
    fn escapes_what_is_not_printable() {
        assert!(matches!(printable("orders/42 ünï ключ"), Cow::Borrowed(_)));
        for (raw, shown) in [
            ("a\u{1b}[2Jb", "a\\u{1b}[2Jb"),
            ("row\nforged", "row\\nforged"),
            ("cr\rtab\t", "cr\\rtab\\t"),
            ("rtl\u{202e}txt", "rtl\\u{202e}txt"),
            ("zero\u{200b}width", "zero\\u{200b}width"),
            ("bell\u{7}del\u{7f}", "bell\\u{7}del\\u{7f}"),
            ("c1\u{9b}31m", "c1\\u{9b}31m"),
            // A backslash is doubled, so "\\n" typed in a name cannot pass
            // for an escaped line break.
            ("back\\nslash", "back\\\\nslash"),
            ("quotes \"'", "quotes \"'"),
        ] {
            assert_eq!(printable(raw), shown, "{raw:?}");
        }
    }
}
