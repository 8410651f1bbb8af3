//! `locksmith elect` and `locksmith leader` as processes, against a real etcd,
//! side by side with `etcdctl elect`.

use std::process::Stdio;
use std::sync::OnceLock;
use std::time::Duration;

use locksmith_testkit::Etcd;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader, Lines};
use tokio::process::{Child, ChildStdout, Command};
use tokio::time::timeout;

const BINARY: &str = env!("CARGO_BIN_EXE_locksmith");

/// One etcd for the whole binary (it dies with the test process).
fn etcd() -> &'static Etcd {
    static ETCD: OnceLock<Etcd> = OnceLock::new();
    ETCD.get_or_init(Etcd::start)
}

fn unique(test: &str) -> String {
    format!(
        "cli-elect/{}/{test}",
        &uuid::Uuid::new_v4().simple().to_string()[..8]
    )
}

/// `locksmith <args>` on the etcd (`LOCKSMITH_BACKEND`), stdin and stdout
/// piped.
fn locksmith(args: &[&str]) -> Child {
    Command::new(BINARY)
        .args(args)
        .env("LOCKSMITH_BACKEND", etcd().url())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("locksmith")
}

fn lines(child: &mut Child) -> Lines<BufReader<ChildStdout>> {
    BufReader::new(child.stdout.take().expect("stdout")).lines()
}

/// The next line a process printed, within ten seconds.
async fn next_line(lines: &mut Lines<BufReader<ChildStdout>>, what: &str) -> String {
    timeout(Duration::from_secs(10), lines.next_line())
        .await
        .unwrap_or_else(|_| panic!("never printed {what}"))
        .unwrap()
        .unwrap_or_else(|| panic!("ended before printing {what}"))
}

/// The exit code of a process, within ten seconds.
async fn exit_code(child: &mut Child, what: &str) -> i32 {
    timeout(Duration::from_secs(10), child.wait())
        .await
        .unwrap_or_else(|_| panic!("{what} did not exit"))
        .unwrap()
        .code()
        .unwrap_or(-1)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn elect_runs_the_command_while_leading_and_leader_follows() {
    let name = unique("follow");
    let mut watcher = locksmith(&["leader", &name, "--watch"]);
    let mut watched = lines(&mut watcher);
    assert_eq!(next_line(&mut watched, "that nobody leads").await, "");

    // The command reports its environment, then leads until its stdin
    // (inherited from `locksmith elect`) gets a line.
    let script = "echo \"$LOCKSMITH_ELECTION $LOCKSMITH_LEADER_VALUE $LOCKSMITH_FENCING_TOKEN\"; read line; exit 0";
    let mut first = locksmith(&["elect", &name, "first", "--", "sh", "-c", script]);
    let mut first_out = lines(&mut first);
    let env = next_line(&mut first_out, "the command's environment").await;
    let fields: Vec<&str> = env.split(' ').collect();
    assert_eq!(fields[..2], [name.as_str(), "first"]);
    let first_token: u64 = fields[2].parse().expect("a fencing token");
    assert_eq!(next_line(&mut watched, "the first leader").await, "first");

    // etcdctl sees the same leader (Go's election layout).
    let mut etcdctl = Command::from(etcd().etcdctl())
        .args(["elect", "-l", &name])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("etcdctl elect -l");
    let mut observed = lines(&mut etcdctl);
    next_line(&mut observed, "the leader's key").await;
    assert_eq!(
        next_line(&mut observed, "the leader's value").await,
        "first"
    );

    let mut second = locksmith(&[
        "elect",
        &name,
        "second",
        "--",
        "sh",
        "-c",
        "echo \"$LOCKSMITH_FENCING_TOKEN\"; read line; exit 7",
    ]);
    let mut second_out = lines(&mut second);
    let one = Command::new(BINARY)
        .args(["leader", &name, "--backend", &etcd().url()])
        .output()
        .await
        .unwrap();
    assert!(one.status.success(), "{one:?}");
    assert_eq!(String::from_utf8_lossy(&one.stdout), "first\n");
    assert!(
        second.try_wait().unwrap().is_none(),
        "elected while first leads"
    );

    // The first command exits: `elect` resigns, the second leads.
    let stdin = first.stdin.as_mut().unwrap();
    stdin.write_all(b"done\n").await.unwrap();
    stdin.flush().await.unwrap();
    assert_eq!(exit_code(&mut first, "the first elect").await, 0);
    let second_token: u64 = next_line(&mut second_out, "the second's token")
        .await
        .parse()
        .unwrap();
    assert!(second_token > first_token);
    // The handover may show a moment without a leader.
    let mut next = next_line(&mut watched, "the next leader").await;
    if next.is_empty() {
        next = next_line(&mut watched, "the next leader").await;
    }
    assert_eq!(next, "second");
    let stdin = second.stdin.as_mut().unwrap();
    stdin.write_all(b"done\n").await.unwrap();
    stdin.flush().await.unwrap();
    assert_eq!(
        exit_code(&mut second, "the second elect").await,
        7,
        "the command's status"
    );
    assert_eq!(next_line(&mut watched, "that nobody leads").await, "");

    let none = Command::new(BINARY)
        .args(["leader", &name, "--backend", &etcd().url()])
        .output()
        .await
        .unwrap();
    assert_eq!(none.status.code(), Some(3), "nobody leads: {none:?}");
    etcdctl.start_kill().unwrap();
    watcher.start_kill().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lost_leadership_stops_the_command() {
    let name = unique("lost");
    let mut elect = locksmith(&[
        "elect",
        &name,
        "doomed",
        "--kill-grace",
        "1s",
        "--",
        "sh",
        "-c",
        "echo leading; exec sleep 600",
    ]);
    let mut out = lines(&mut elect);
    assert_eq!(next_line(&mut out, "that it leads").await, "leading");
    // Someone deletes the leader's key.
    let deleted = etcd()
        .etcdctl()
        .args(["del", "--prefix", &format!("{name}/")])
        .output()
        .unwrap();
    assert!(deleted.status.success(), "{deleted:?}");
    assert_eq!(exit_code(&mut elect, "elect").await, 75, "EX_TEMPFAIL");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn elect_without_a_command_leads_until_interrupted() {
    let name = unique("hold");
    let mut elect = locksmith(&["elect", &name, "standing"]);
    let mut out = lines(&mut elect);
    let token = next_line(&mut out, "the fencing token").await;
    assert!(token.parse::<u64>().is_ok(), "{token}");
    let pid = elect.id().unwrap().to_string();
    assert!(std::process::Command::new("kill")
        .args(["-INT", &pid])
        .status()
        .unwrap()
        .success());
    assert_eq!(exit_code(&mut elect, "elect").await, 0);
    let keys = etcd()
        .etcdctl()
        .args(["get", "--prefix", "--keys-only", &format!("{name}/")])
        .output()
        .unwrap();
    assert!(keys.stdout.trim_ascii().is_empty(), "resigned: {keys:?}");
}
