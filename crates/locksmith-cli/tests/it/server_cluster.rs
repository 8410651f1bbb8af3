//! A replicated lock server: three `locksmith serve` processes forming one
//! Raft group on loopback, and clients that list all three.
//!
//! Needs the CLI binary, so it lives in locksmith-cli and not with the
//! server's own tests in locksmith-server: it starts `locksmith serve` as a
//! process, to test the server as an operator runs it (flags, data
//! directory, signals, restarts).

use crate::server_support;

use std::time::Duration;

use locksmith::{Client, ConnectOptions, Guard};
use locksmith_proto::v1 as pb;
use locksmith_proto::v1::locksmith_client::LocksmithClient;
use locksmith_testkit::free_port;
use server_support::{eventually, unique, url_of, ServerProcess};

/// Three members of a new cluster, ids 1 to 3.
struct Cluster {
    members: Vec<ServerProcess>,
}

impl Cluster {
    fn start() -> Cluster {
        Cluster::start_with(&[])
    }

    fn start_with(extra: &[&str]) -> Cluster {
        Cluster {
            members: ServerProcess::start_cluster(extra),
        }
    }

    fn url(&self) -> String {
        url_of(&self.members)
    }

    async fn client(&self, session_ttl: Duration) -> Client {
        let options = ConnectOptions::default().session_ttl(session_ttl);
        Client::connect_with(&self.url(), options)
            .await
            .unwrap_or_else(|e| panic!("connect to {}: {e}", self.url()))
    }

    /// The index of the member that answers inspection (the leader), once
    /// one does, among those not in `except`.
    async fn leader(&self, except: &[usize]) -> usize {
        server_support::leader(&self.members, except).await
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_holder_keeps_its_lock_when_the_leader_dies_and_tokens_keep_increasing() {
    let cluster = Cluster::start();
    let name = unique("cluster-failover");
    let holder = cluster.client(Duration::from_secs(10)).await;
    let guard = holder.lock(name.as_str()).acquire().await.expect("acquire");
    let token = guard.fencing_token();
    let leader = cluster.leader(&[]).await;

    cluster.members[leader].kill();
    let new_leader = cluster.leader(&[leader]).await;
    assert_ne!(new_leader, leader);

    // The hold was committed on a quorum: the new leader has it.
    let other = cluster.client(Duration::from_secs(10)).await;
    let info = other
        .describe(&name)
        .await
        .expect("describe")
        .expect("still held");
    assert_eq!(info.holders[0].fencing_token, Some(token));
    let busy = other.lock(name.as_str()).try_acquire().await.expect("try");
    assert!(busy.is_none(), "held by the first client still");

    // The holder's session moved to the new leader and is healthy.
    assert!(!guard.is_lost(), "a failover within the TTL loses nothing");
    guard
        .release()
        .await
        .expect("release through the new leader");
    let next = other.lock(name.as_str()).acquire().await.expect("acquire");
    assert!(next.fencing_token() > token);
    next.release().await.unwrap();
    holder.close().await.unwrap();
    other.close().await.unwrap();
}

/// Whether the member at `index` answers inspection (only a leader does).
async fn answers(cluster: &Cluster, index: usize) -> bool {
    let address = format!("http://127.0.0.1:{}", cluster.members[index].port());
    let Ok(mut client) = LocksmithClient::connect(address).await else {
        return false;
    };
    let request = pb::DescribeRequest {
        name: "probe".into(),
    };
    client.describe(request).await.is_ok()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_paused_past_the_election_timeout_steps_down_and_grants_nothing() {
    let cluster = Cluster::start();
    let name = unique("cluster-pause");
    let holder = cluster.client(Duration::from_secs(10)).await;
    let guard = holder.lock(name.as_str()).acquire().await.expect("acquire");
    let token = guard.fencing_token();
    let leader = cluster.leader(&[]).await;

    cluster.members[leader].pause();
    // Inspection through the holder's client, which was talking to the
    // frozen leader (its socket still accepts; nothing answers): the call
    // gives up on it and is answered by the next leader.
    let described = tokio::time::timeout(Duration::from_secs(15), holder.describe(&name))
        .await
        .expect("a call to a frozen member moves on to the others")
        .expect("describe")
        .expect("still held");
    assert_eq!(described.holders[0].fencing_token, Some(token));
    let new_leader = cluster.leader(&[leader]).await;
    // A waiter queues on the new leader while the old one is frozen.
    let waiter = cluster.client(Duration::from_secs(10)).await;
    let lock = waiter.lock(name.as_str());
    let waiting = tokio::spawn(async move { lock.acquire().await });
    eventually(Duration::from_secs(10), "the waiter queues", || async {
        let info = waiter.describe(&name).await.ok().flatten();
        info.is_some_and(|lock| lock.waiters.len() == 1)
    })
    .await;

    cluster.members[leader].unpause();
    // Woken up, the old leader learns the new term and serves nobody.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while answers(&cluster, leader).await {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the old leader still answers as leader"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(answers(&cluster, new_leader).await);
    assert!(!waiting.is_finished(), "granted while the holder holds it");
    assert!(
        !guard.is_lost(),
        "the holder kept its session across the pause"
    );
    guard
        .release()
        .await
        .expect("release through the new leader");
    let next = waiting.await.unwrap().expect("the waiter is granted");
    assert!(next.fencing_token() > token);
    next.release().await.unwrap();
    holder.close().await.unwrap();
    waiter.close().await.unwrap();
}

/// A holder whose session TTL is barely above the failover: its client must
/// not wait for the frozen leader's connection to die, but resume at the new
/// leader while the session still lives.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_holder_with_a_short_ttl_keeps_its_lock_when_the_leader_freezes() {
    let cluster = Cluster::start();
    holder_with_a_short_ttl_through_a_freeze(&cluster, |_| cluster.url()).await;
}

/// The same, for a client that knows the members by other names than the
/// cluster does (`localhost`, where the cluster says `127.0.0.1`) and opens
/// its session on the leader: the followers' hints, naming the frozen leader
/// by the cluster's name until they elect another, must not send it back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_holder_knowing_the_members_by_other_names_keeps_its_lock_when_the_leader_freezes() {
    let cluster = Cluster::start();
    holder_with_a_short_ttl_through_a_freeze(&cluster, |leader| {
        let mut order: Vec<usize> = (0..cluster.members.len()).collect();
        order.swap(0, leader);
        let names: Vec<String> = order
            .iter()
            .map(|&i| format!("localhost:{}", cluster.members[i].port()))
            .collect();
        format!("locksmith://{}", names.join(","))
    })
    .await;
}

/// Freezes the leader under a holder with a 2 s session TTL whose client
/// reaches the cluster at `url(leader)`: the holder keeps its lock and
/// releases it at the new leader.
async fn holder_with_a_short_ttl_through_a_freeze(
    cluster: &Cluster,
    url: impl Fn(usize) -> String,
) {
    let name = unique("cluster-freeze-short-ttl");
    let leader = cluster.leader(&[]).await;
    let url = url(leader);
    let ttl = Duration::from_secs(2);
    let before_open = tokio::time::Instant::now();
    let options = ConnectOptions::default().session_ttl(ttl);
    let holder = Client::connect_with(&url, options)
        .await
        .unwrap_or_else(|e| panic!("connect to {url}: {e}"));
    let guard = holder.lock(name.as_str()).acquire().await.expect("acquire");
    let token = guard.fencing_token();

    // Frozen just before the client's first heartbeat (a third of the TTL
    // after its session opened), the leader is suspected half a TTL after
    // the open: about 0.45 s after the freeze, before the followers can
    // elect another (0.6 s at the least), while they still name it.
    tokio::time::sleep_until(before_open + ttl / 3 - Duration::from_millis(100)).await;
    cluster.members[leader].pause();
    let new_leader = cluster.leader(&[leader]).await;
    assert_ne!(new_leader, leader);
    // Three TTLs with the old leader frozen: long enough for any loss to show.
    let lost = tokio::time::timeout(Duration::from_secs(6), guard.lost()).await;
    cluster.members[leader].unpause();
    assert!(lost.is_err(), "the holder lost its lock: {:?}", lost.ok());

    the_hold_outlived_its_leader(cluster, &name, guard, token, holder).await;
}

/// After a leader change, `holder`'s hold on `name` is still its own: a
/// new client sees it with the same token, and the new leader accepts its
/// release.
async fn the_hold_outlived_its_leader(
    cluster: &Cluster,
    name: &str,
    guard: locksmith::Guard,
    token: u64,
    holder: Client,
) {
    let other = cluster.client(Duration::from_secs(10)).await;
    let info = other.describe(name).await.expect("describe").expect("held");
    assert_eq!(info.holders[0].fencing_token, Some(token));
    guard.release().await.expect("release at the new leader");
    holder.close().await.unwrap();
    other.close().await.unwrap();
}

/// A session stream to one member, driven by hand: heartbeats and their
/// answers, with the time each heartbeat was sent.
struct RawSession {
    tx: tokio::sync::mpsc::UnboundedSender<pb::ClientBatch>,
    inbound: tonic::Streaming<pb::ServerBatch>,
}

impl RawSession {
    /// Opens a session of `ttl_ms` on the member listening on `port`.
    async fn open(port: u16, ttl_ms: u64) -> RawSession {
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        let outbound = futures::stream::unfold(rx, |mut rx| async move {
            rx.recv().await.map(|batch| (batch, rx))
        });
        let mut client = LocksmithClient::connect(format!("http://127.0.0.1:{port}"))
            .await
            .expect("gRPC connect");
        let mut raw = RawSession {
            inbound: client
                .session(outbound)
                .await
                .expect("session call")
                .into_inner(),
            tx,
        };
        raw.send(pb::client_message::Kind::Open(pb::OpenSession {
            client_name: "raw".into(),
            host: "test".into(),
            ttl_ms,
        }));
        let batch = raw.inbound.message().await.expect("stream").expect("open");
        assert!(
            matches!(
                batch.messages[0].kind,
                Some(pb::server_message::Kind::Opened(_))
            ),
            "{batch:?}"
        );
        raw
    }

    fn send(&self, kind: pb::client_message::Kind) {
        let batch = pb::ClientBatch {
            messages: vec![pb::ClientMessage { kind: Some(kind) }],
            ..Default::default()
        };
        let _ = self.tx.send(batch);
    }
}

/// Heartbeats are answered by the leader without a log entry; a leader cut
/// off from its quorum (both followers frozen) answers no heartbeat sent
/// after its lease could have run out on the followers' side: the earliest
/// another member could be elected. Its answers are not logged, so nothing
/// but the lease holds it back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn heartbeats_are_not_logged_and_a_leader_cut_off_stops_answering_them_before_another_can_lead(
) {
    let cluster = Cluster::start();
    let leader = cluster.leader(&[]).await;
    // Once every member has told the leader its record version, the leader
    // logs the version they all read: an entry that must come before the
    // window below, not in it (on a loaded machine it came late).
    eventually(
        Duration::from_secs(10),
        "the members agreed on a record version",
        || async {
            // The leader knows what each member announced.
            let url = server_support::members_url(&[cluster.members[leader].port()]);
            let status = server_support::cluster_status(&url).await;
            let read: Option<Vec<u64>> = server_support::record_versions(&status)
                .into_iter()
                .collect();
            let agreed = status["cluster_version"].as_u64();
            read.and_then(|read| read.into_iter().min())
                .is_some_and(|v| Some(v) == agreed)
        },
    )
    .await;
    let mut raw = RawSession::open(cluster.members[leader].port(), 10_000).await;
    // Heartbeats every 10 ms, each one's send time kept; the k-th answer
    // stands for a heartbeat sent no earlier than the k-th.
    let sent = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let sender = tokio::spawn({
        let sent = sent.clone();
        let tx = raw.tx.clone();
        async move {
            let mut tick = tokio::time::interval(Duration::from_millis(10));
            loop {
                tick.tick().await;
                sent.lock().unwrap().push(tokio::time::Instant::now());
                let heartbeat = pb::client_message::Kind::Heartbeat(pb::Heartbeat {});
                let batch = pb::ClientBatch {
                    messages: vec![pb::ClientMessage {
                        kind: Some(heartbeat),
                    }],
                    ..Default::default()
                };
                if tx.send(batch).is_err() {
                    return;
                }
            }
        }
    });
    let answered = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let reader = tokio::spawn({
        let answered = answered.clone();
        async move {
            while let Ok(Some(batch)) = raw.inbound.message().await {
                let heartbeats = batch
                    .messages
                    .iter()
                    .filter(|m| matches!(m.kind, Some(pb::server_message::Kind::Heartbeat(_))))
                    .count();
                answered.fetch_add(heartbeats, std::sync::atomic::Ordering::SeqCst);
            }
        }
    });
    let leader_log = || {
        let members = members(&cluster.url());
        let leader = members.iter().find(|m| m["leader"] == true).cloned();
        leader.expect("a leader")["last_log_index"].clone()
    };
    let log_before = leader_log();
    let answered_before = answered.load(std::sync::atomic::Ordering::SeqCst);
    eventually(Duration::from_secs(5), "heartbeats answered", || async {
        answered.load(std::sync::atomic::Ordering::SeqCst) >= answered_before + 30
    })
    .await;
    assert_eq!(leader_log(), log_before, "heartbeats were logged");
    for follower in (0..3).filter(|&i| i != leader) {
        cluster.members[follower].pause();
    }
    let cut_off = tokio::time::Instant::now();
    // The followers' side of the lease: the longest election timeout, twice
    // `--election-timeout` (200 ms by default). Wait well past it.
    let lease = Duration::from_millis(400);
    tokio::time::sleep(lease * 3).await;
    let answers = answered.load(std::sync::atomic::Ordering::SeqCst);
    // (A lower bound of the latest answered heartbeat's sending.)
    let last_answered = sent.lock().unwrap()[answers - 1];
    for follower in (0..3).filter(|&i| i != leader) {
        cluster.members[follower].unpause();
    }
    sender.abort();
    reader.abort();
    assert!(
        last_answered < cut_off + lease,
        "a heartbeat sent {:?} after the cut-off was answered (the lease is {lease:?})",
        last_answered - cut_off
    );
}

/// A client whose heartbeats only the leader heard (they are not logged)
/// keeps its session and its lock when that leader dies long after the
/// session opened: the new leader gives every session a full TTL before it
/// expires any, and the client resumes there in time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_kept_alive_by_heartbeats_the_old_leader_answered_lives_on_at_the_new_one() {
    let cluster = Cluster::start();
    let name = unique("cluster-unlogged-heartbeats");
    let ttl = Duration::from_secs(3);
    let holder = cluster.client(ttl).await;
    let guard = holder.lock(name.as_str()).acquire().await.expect("acquire");
    let token = guard.fencing_token();
    let leader = cluster.leader(&[]).await;
    // Two TTLs of heartbeats answered by the leader alone: what the log
    // knows of the session's deadline is long past.
    tokio::time::sleep(ttl * 2).await;
    assert!(!guard.is_lost());
    cluster.members[leader].kill();
    cluster.leader(&[leader]).await;
    // Two TTLs more at the new leader.
    let lost = tokio::time::timeout(ttl * 2, guard.lost()).await;
    assert!(lost.is_err(), "the holder lost its lock: {:?}", lost.ok());
    the_hold_outlived_its_leader(&cluster, &name, guard, token, holder).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_follower_catches_up_and_carries_the_state_when_the_leader_dies() {
    let cluster = Cluster::start();
    let client = cluster.client(Duration::from_secs(10)).await;
    let leader = cluster.leader(&[]).await;
    let follower = (leader + 1) % 3;
    cluster.members[follower].kill();
    // Grants the follower misses while it is down.
    let mut held = Vec::new();
    for i in 0..20 {
        let name = unique(&format!("cluster-catch-up-{i}"));
        let guard = client.lock(name.as_str()).acquire().await.expect("acquire");
        held.push((name, guard));
    }
    cluster.members[follower].restart();
    // With the other follower down, nothing commits unless the restarted
    // one accepts it, which it only does once its log holds everything
    // before.
    let other_follower = 3 - leader - follower;
    cluster.members[other_follower].kill();
    let probe = unique("cluster-catch-up-probe");
    let guard = client
        .lock(probe.as_str())
        .acquire()
        .await
        .expect("acquire");
    guard.release().await.expect("release");
    // Now the restarted follower and the other one carry on alone.
    cluster.members[other_follower].restart();
    cluster.members[leader].kill();
    cluster.leader(&[leader]).await;
    let other = cluster.client(Duration::from_secs(10)).await;
    for (name, guard) in &held {
        let info = other.describe(name).await.expect("describe").expect("held");
        assert_eq!(info.holders[0].fencing_token, Some(guard.fencing_token()));
    }
    for (_, guard) in held {
        guard.release().await.expect("release");
    }
    client.close().await.unwrap();
    other.close().await.unwrap();
}

/// The cluster again, each member a host of its own (a network namespace),
/// so that the network between members can be cut while clients, on this
/// machine, reach them all.
struct SeparateHosts {
    network: locksmith_testkit::netns::Network,
    members: Vec<locksmith_testkit::Process>,
    _dirs: Vec<tempfile::TempDir>,
}

impl SeparateHosts {
    const PORT: u16 = 7420;

    fn start() -> SeparateHosts {
        let network = locksmith_testkit::netns::Network::create(3).expect("network namespaces");
        let list = network
            .hosts()
            .iter()
            .enumerate()
            .map(|(i, host)| format!("{}={}:{}", i + 1, host.ip, Self::PORT))
            .collect::<Vec<_>>()
            .join(",");
        let mut members = Vec::new();
        let mut dirs = Vec::new();
        for (i, host) in network.hosts().iter().enumerate() {
            let dir = tempfile::Builder::new()
                .prefix("locksmith-serve-")
                .tempdir_in(env!("CARGO_TARGET_TMPDIR"))
                .unwrap();
            let (program, prefix) = host.command();
            let spec = locksmith_testkit::ProcessSpec::new(
                format!("member {} in {}", i + 1, host.namespace),
                program,
                dir.path().join("serve.log"),
            )
            .args(prefix)
            .arg(server_support::BINARY)
            .args(["serve", "--listen", &format!("{}:{}", host.ip, Self::PORT)])
            .args(["--node-id", &(i + 1).to_string(), "--cluster", &list])
            .arg("--data-dir")
            .arg(dir.path().join("data"))
            .env(
                "RUST_LOG",
                "info,locksmith_server::core::front::sessions=debug",
            );
            members.push(locksmith_testkit::Process::spawn(spec).expect("start a member"));
            dirs.push(dir);
        }
        SeparateHosts {
            network,
            members,
            _dirs: dirs,
        }
    }

    fn address(&self, i: usize) -> String {
        format!("{}:{}", self.network.hosts()[i].ip, Self::PORT)
    }

    async fn client(&self) -> Client {
        let url = format!(
            "locksmith://{}",
            (0..3)
                .map(|i| self.address(i))
                .collect::<Vec<_>>()
                .join(",")
        );
        let options = ConnectOptions::default().session_ttl(Duration::from_secs(10));
        Client::connect_with(&url, options)
            .await
            .unwrap_or_else(|e| panic!("connect to {url}: {e}"))
    }

    /// The sessions member `i` has taken a resume of, as its log says.
    fn resumes(&self, i: usize) -> usize {
        let path = self.members[i].log_path();
        std::fs::read_to_string(path)
            .unwrap_or_else(|e| panic!("read {}: {e}", path.display()))
            .matches("session resumed")
            .count()
    }

    async fn answers(&self, i: usize) -> bool {
        let address = format!("http://{}", self.address(i));
        let ask = async {
            let mut client = LocksmithClient::connect(address).await.ok()?;
            let request = pb::DescribeRequest {
                name: "probe".into(),
            };
            client.describe(request).await.ok()
        };
        // A member without a quorum answers only once it gives up on one.
        matches!(
            tokio::time::timeout(Duration::from_secs(3), ask).await,
            Ok(Some(_))
        )
    }

    async fn leader(&self, except: Option<usize>) -> usize {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
        loop {
            for i in (0..3).filter(|&i| Some(i) != except) {
                if self.answers(i).await {
                    return i;
                }
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "no leader: {}",
                self.members
                    .iter()
                    .map(|m| m.log_tail(10))
                    .collect::<Vec<_>>()
                    .join("\n")
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_cut_off_from_its_peers_but_not_its_clients_stops_serving() {
    let cluster = SeparateHosts::start();
    let name = unique("cluster-partition");
    let holder = cluster.client().await;
    let guard = holder.lock(name.as_str()).acquire().await.expect("acquire");
    let token = guard.fencing_token();
    let leader = cluster.leader(None).await;
    // A client that sends a request every 50 ms, without waiting for the
    // last: its first request after the cut-off leader's lease runs out is
    // refused at once (fewer batches than `--max-batches-in-flight` wait by
    // then), hundreds of milliseconds before the others elect a leader,
    // while they still name the cut-off one.
    let busy_client = cluster.client().await;
    let busy_loop = tokio::spawn({
        let busy = busy_client.clone();
        async move {
            let mut tick = tokio::time::interval(Duration::from_millis(50));
            let mut requests = tokio::task::JoinSet::new();
            for i in 0..100 {
                tick.tick().await;
                let lock = busy.lock(format!("cluster-partition-busy-{i}"));
                requests.spawn(async move {
                    if let Ok(Some(guard)) = lock.try_acquire().await {
                        let _ = guard.release().await;
                    }
                });
            }
            requests.join_all().await;
        }
    });
    let resumes_before = cluster.resumes(leader);
    for peer in (0..3).filter(|&i| i != leader) {
        cluster.network.cut(leader, peer).unwrap();
    }
    // The two others elect a leader; the cut-off one, which every client
    // still reaches, must stop serving: it cannot commit anything.
    let new_leader = cluster.leader(Some(leader)).await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while cluster.answers(leader).await {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the cut-off leader still serves"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let other = cluster.client().await;
    let busy = other.lock(name.as_str()).try_acquire().await.expect("try");
    assert!(busy.is_none(), "the hold survives on the majority side");
    let info = other.describe(&name).await.unwrap().expect("held");
    assert_eq!(info.holders[0].fencing_token, Some(token));
    assert!(cluster.answers(new_leader).await);
    assert!(
        !guard.is_lost(),
        "the holder moved to the new leader in time"
    );
    busy_loop.await.unwrap();
    // A client it sent away does not come back while its followers still
    // name it: it is passed over, not resumed on again and again.
    assert_eq!(
        cluster.resumes(leader),
        resumes_before,
        "sessions resumed on the cut-off leader"
    );

    for peer in (0..3).filter(|&i| i != leader) {
        cluster.network.heal(leader, peer).unwrap();
    }
    guard.release().await.expect("release");
    // The holder's session, opened on the cut-off leader, was resumed on
    // another member: resumes are logged, so the count above means something.
    let resumed_elsewhere: usize = (0..3)
        .filter(|&i| i != leader)
        .map(|i| cluster.resumes(i))
        .sum();
    assert!(resumed_elsewhere > 0, "no member logged a resume");
    let next = other.lock(name.as_str()).acquire().await.expect("acquire");
    assert!(next.fencing_token() > token);
    next.release().await.unwrap();
    holder.close().await.unwrap();
    other.close().await.unwrap();
    busy_client.close().await.unwrap();
}

/// PreVote: a follower that hears no leader asks the others whether they
/// would vote for it before it raises its term. Cut off, it gets no answer,
/// so its term stays; back, it follows the leader it had. Without PreVote it
/// raises its term at every election timeout while it is away, and its first
/// answer after the cut heals unseats the leader.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follower_cut_off_and_back_does_not_unseat_the_leader() {
    let cluster = SeparateHosts::start();
    let leader = cluster.leader(None).await;
    let follower = (0..3).find(|&i| i != leader).unwrap();
    let view = |i: usize| -> serde_json::Value {
        let url = format!("locksmith://{}", cluster.address(i));
        serde_json::from_str(&cluster_cli(&url, &["status", "--json"])).unwrap()
    };
    eventually(
        Duration::from_secs(10),
        "the follower knows the leader",
        || async { view(follower)["leader_id"] == leader + 1 },
    )
    .await;
    let before = view(leader);
    assert_eq!(before["leader_id"], leader + 1, "{before}");

    for peer in (0..3).filter(|&i| i != follower) {
        cluster.network.cut(follower, peer).unwrap();
    }
    // Ten times the longest election timeout (400 ms): the follower tries
    // to be elected again and again.
    tokio::time::sleep(Duration::from_secs(4)).await;
    let away = view(follower);
    assert_eq!(
        away["term"], before["term"],
        "a member cut off raised its term: {away}"
    );
    // The other two may have held an election of their own meanwhile (a
    // slow machine): what matters is what the follower's return does.
    let at_return = view(leader);
    for peer in (0..3).filter(|&i| i != follower) {
        cluster.network.heal(follower, peer).unwrap();
    }

    // Back: the follower takes the leader's entries again, from the same
    // leader in the same term.
    let client = cluster.client().await;
    let name = unique("cluster-prevote");
    let guard = client.lock(name.as_str()).acquire().await.expect("acquire");
    let written = view(leader)["members"][leader]["last_log_index"].clone();
    eventually(
        Duration::from_secs(10),
        "the follower catches up",
        || async {
            let back = view(follower);
            back["leader_id"] == at_return["leader_id"]
                && back["members"][follower]["last_log_index"].as_u64() >= written.as_u64()
        },
    )
    .await;
    let back = view(follower);
    assert_eq!(
        back["term"], at_return["term"],
        "the follower's return started an election: {back}"
    );
    guard.release().await.expect("release");
    client.close().await.unwrap();
}

/// Many acquires of many long names at once: the core puts them in few,
/// big log entries, and a follower that catches up gets many entries per
/// AppendEntries. Whatever their size, they must reach the followers, or
/// nothing commits and every client of the cluster waits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acquires_of_many_long_names_at_once_are_replicated() {
    let cluster = Cluster::start();
    let leader = cluster.leader(&[]).await;
    let url = cluster.url();
    let prefix = unique("cluster-big-entries");
    let client = cluster.client(Duration::from_secs(30)).await;
    // 480 acquires of long names: 15 MB of names, sent together, so that a
    // follower gets requests of many big entries to write.
    let guards = tokio::time::timeout(
        Duration::from_secs(60),
        hold_long_names(&client, &prefix, 480),
    )
    .await
    .expect("the acquires are answered: their entries commit");
    let written = members(&url)[leader]["last_log_index"].as_u64();
    eventually(
        Duration::from_secs(30),
        "both followers have every entry",
        || async {
            members(&url)
                .iter()
                .all(|m| m["lag"].as_u64() == Some(0) && m["last_log_index"].as_u64() >= written)
        },
    )
    .await;
    for guard in guards {
        guard.release().await.expect("release");
    }
    client.close().await.unwrap();
}

/// Holds `acquires` × 64 names under `prefix` through `client`, the acquires
/// sent all at once: 64 is the most names one acquire may take, and each
/// name of some 480 bytes is near the longest a name may be, so the log
/// gets big entries.
async fn hold_long_names(client: &Client, prefix: &str, acquires: usize) -> Vec<Guard> {
    let pad = "n".repeat(440);
    let acquires = (0..acquires).map(|i| {
        let names: Vec<String> = (0..64).map(|j| format!("{prefix}/{i}/{j}/{pad}")).collect();
        let lock = client.multi_lock(names);
        async move { lock.acquire_timeout(Duration::from_secs(60)).await }
    });
    futures::future::join_all(acquires)
        .await
        .into_iter()
        .collect::<Result<_, _>>()
        .expect("every acquire is granted")
}

/// Starts member 4, joining through member 1, and waits (up to `limit`)
/// until the leader sees its log caught up; returns its port and process.
async fn join_member_4(cluster: &Cluster, limit: Duration) -> (u16, ServerProcess) {
    let url = cluster.url();
    let port = free_port();
    let through = format!("127.0.0.1:{}", cluster.members[0].port());
    let joiner = ServerProcess::start_on(port, &["--node-id", "4", "--join", &through]);
    eventually(limit, "member 4 caught up", || async {
        members(&url)
            .iter()
            .any(|m| m["id"] == 4 && m["lag"].as_u64() == Some(0))
    })
    .await;
    (port, joiner)
}

/// `locksmith cluster --server URL ARGS...`: its stdout, or a panic with its
/// stderr.
/// A member of a new cluster that starts after the others elected a leader
/// follows that leader. openraft's `initialize` starts an election at once,
/// in term 1; a member with a higher id than a leader elected in term 1
/// outranks it with that vote (leaders of one term are ordered by id), and
/// the leader stepped down for an election as soon as it reached member 3.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_that_starts_late_does_not_unseat_the_leader() {
    let ports = [free_port(), free_port(), free_port()];
    let start = |i: usize| ServerProcess::start_member(&ports, i, &[]);
    let status = |i: usize| -> serde_json::Value {
        let url = format!("locksmith://127.0.0.1:{}", ports[i]);
        serde_json::from_str(&cluster_cli(&url, &["status", "--json"])).unwrap()
    };
    let early = [start(0), start(1)];
    let client = ServerProcess::client_of(&ports[..2]).await;
    let name = unique("cluster-late-member");
    let guard = client.lock(name.as_str()).acquire().await.expect("acquire");
    let leader = (0..2)
        .find(|&i| status(i)["leader_id"] == i + 1)
        .expect("a leader among the first two");
    let before = status(leader);

    let late = start(2);
    let written = before["members"][leader]["last_log_index"].as_u64();
    eventually(Duration::from_secs(20), "member 3 catches up", || async {
        let view = status(2);
        view["leader_id"] == leader + 1 && view["members"][2]["last_log_index"].as_u64() >= written
    })
    .await;
    let after = status(leader);
    assert_eq!(after["leader_id"], leader + 1, "{after}");
    assert_eq!(
        after["term"], before["term"],
        "member 3's start caused an election: {after}"
    );
    guard.release().await.expect("release");
    client.close().await.unwrap();
    drop((early, late));
}

fn cluster_cli(url: &str, args: &[&str]) -> String {
    let output = std::process::Command::new(server_support::BINARY)
        .args(["cluster", "--server", url])
        .args(args)
        .output()
        .expect("run locksmith cluster");
    assert!(
        output.status.success(),
        "locksmith cluster {args:?}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout).unwrap()
}

/// The members in `locksmith cluster status --json`.
fn members(url: &str) -> Vec<serde_json::Value> {
    let status: serde_json::Value =
        serde_json::from_str(&cluster_cli(url, &["status", "--json"])).unwrap();
    status["members"].as_array().unwrap().clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_member_joins_as_a_learner_is_promoted_and_an_old_voter_leaves() {
    // Frequent snapshots: the log the new member needs is gone by the time
    // it joins, so it catches up from a snapshot.
    let cluster = Cluster::start_with(&["--snapshot-every", "5", "--snapshot-log-percent", "0"]);
    let url = cluster.url();
    let client = cluster.client(Duration::from_secs(10)).await;
    let mut held = Vec::new();
    for i in 0..20 {
        let name = unique(&format!("cluster-join-{i}"));
        let guard = client.lock(name.as_str()).acquire().await.expect("acquire");
        held.push((name, guard));
    }

    let (port, joiner) = join_member_4(&cluster, Duration::from_secs(20)).await;
    assert!(
        members(&url)
            .iter()
            .any(|m| m["id"] == 4 && m["voter"] == false),
        "member 4 is a learner"
    );
    assert!(
        joiner.log_tail(500).contains("snapshot written"),
        "the learner got a snapshot:\n{}",
        joiner.log_tail(50)
    );
    cluster_cli(&url, &["promote", "4"]);
    let leader = cluster.leader(&[]).await;
    let old = (leader + 1) % 3;
    cluster_cli(&url, &["remove", &(old + 1).to_string()]);
    cluster.members[old].kill();
    let now: Vec<_> = members(&url);
    assert!(
        now.iter().any(|m| m["id"] == 4 && m["voter"] == true),
        "{now:?}"
    );
    assert!(!now.iter().any(|m| m["id"] == (old + 1) as u64), "{now:?}");

    // Without the old leader, no quorum forms unless the new member votes
    // and has every hold.
    cluster.members[leader].kill();
    let other = ServerProcess::client_of(&[cluster.members[3 - leader - old].port(), port]).await;
    for (name, guard) in &held {
        let info = other.describe(name).await.expect("describe").expect("held");
        assert_eq!(info.holders[0].fencing_token, Some(guard.fencing_token()));
    }
    let fresh = other
        .lock(unique("cluster-join-fresh").as_str())
        .acquire()
        .await
        .expect("the two left commit");
    assert!(fresh.fencing_token() > held.iter().map(|h| h.1.fencing_token()).max().unwrap());
    drop(held);
    drop(client);
}

/// A member started with `--join` before the members it joins through have
/// elected a leader (members started together, in any order) keeps asking,
/// and joins once they have.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_that_asks_to_join_before_the_cluster_is_up_joins_once_it_is() {
    let ports = [free_port(), free_port(), free_port()];
    let through = format!("127.0.0.1:{},127.0.0.1:{}", ports[0], ports[1]);
    let _joiner = ServerProcess::start_on(free_port(), &["--node-id", "4", "--join", &through]);
    // The others start well after it: nothing answers it meanwhile.
    tokio::time::sleep(Duration::from_secs(4)).await;
    let _members: Vec<ServerProcess> = (0..3)
        .map(|i| ServerProcess::start_member(&ports, i, &[]))
        .collect();
    let url = server_support::members_url(&ports);
    eventually(Duration::from_secs(30), "member 4 joined", || async {
        members(&url)
            .iter()
            .any(|m| m["id"] == 4 && m["lag"].as_u64() == Some(0))
    })
    .await;
}

/// `locksmith cluster status --json` of `url`.
fn cluster_view(url: &str) -> serde_json::Value {
    serde_json::from_str(&cluster_cli(url, &["status", "--json"])).unwrap()
}

/// Member 4 is a voter and no change of voters is under way.
fn promoted_and_settled(url: &str) -> bool {
    let view = cluster_view(url);
    view["changing"] == false
        && view["members"]
            .as_array()
            .unwrap()
            .iter()
            .any(|m| m["id"] == 4 && m["voter"] == true)
}

/// Starts `locksmith cluster promote 4` against `url`, and waits until the
/// leader (index `leader`) logs that it is promoting: the change is in
/// openraft's hands.
async fn promotion_started(cluster: &Cluster, leader: usize) -> std::process::Child {
    let promote = std::process::Command::new(server_support::BINARY)
        .args(["cluster", "--server", &cluster.url(), "promote", "4"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("run locksmith cluster promote");
    eventually(Duration::from_secs(10), "the leader promotes", || async {
        cluster.members[leader]
            .log_tail(50)
            .contains("promoting a learner to voter")
    })
    .await;
    promote
}

/// openraft makes a change of voters in two steps (a joint membership, then
/// the new one), the second driven by the call that asked for the first. A
/// caller that goes away while the first waits for its quorum must not leave
/// the cluster halfway: the change ends on its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_promotion_whose_caller_goes_away_midway_still_ends() {
    let cluster = Cluster::start();
    let url = cluster.url();
    let (_, joiner) = join_member_4(&cluster, Duration::from_secs(20)).await;
    let leader = cluster.leader(&[]).await;
    let follower = (leader + 1) % 3;
    // The joint membership needs 3 of members 1-4: with member 4 and a
    // follower frozen, it waits.
    joiner.pause();
    cluster.members[follower].pause();
    let mut promote = promotion_started(&cluster, leader).await;
    promote.kill().expect("kill the caller");
    promote.wait().unwrap();
    // Time for the leader to see the caller's connection close before the
    // joint membership can commit (without it this test cannot fail).
    tokio::time::sleep(Duration::from_millis(300)).await;
    joiner.unpause();
    cluster.members[follower].unpause();

    eventually(Duration::from_secs(20), "member 4 a voter, settled", || {
        let url = url.clone();
        async move { promoted_and_settled(&url) }
    })
    .await;
    // The change's own task took the second step: it succeeded, or openraft
    // refused it because the leader's lease lapsed while two voters were
    // frozen (the joint entry can commit just before the lease is renewed),
    // and only then may the finisher end it.
    let log = cluster.members[leader].log_tail(200);
    assert!(
        !log.contains("ending a membership change left halfway")
            || log.contains("the second step error"),
        "the change ended only because the leader found it halfway:\n{}",
        cluster.members[leader].log_tail(50)
    );
}

/// A leader that dies between the two steps of a change of voters leaves
/// its successor a joint membership that nobody ends; the new leader ends
/// it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_leader_ends_a_change_of_voters_its_predecessor_left_halfway() {
    let cluster = Cluster::start();
    let (port, joiner) = join_member_4(&cluster, Duration::from_secs(20)).await;
    let leader = cluster.leader(&[]).await;
    let (frozen, other) = ((leader + 1) % 3, (leader + 2) % 3);
    joiner.pause();
    cluster.members[frozen].pause();
    let mut promote = promotion_started(&cluster, leader).await;
    // The joint membership is in the leader's log and the other follower's,
    // not committed. The leader dies; the other follower, whose log is the
    // longest, leads in the joint membership.
    let other_url = format!("locksmith://127.0.0.1:{}", cluster.members[other].port());
    eventually(
        Duration::from_secs(10),
        "the joint entry replicated",
        || async { cluster_view(&other_url)["changing"] == true },
    )
    .await;
    cluster.members[leader].kill();
    let _ = promote.wait();
    joiner.unpause();
    cluster.members[frozen].unpause();

    let survivors = server_support::members_url(&[
        cluster.members[frozen].port(),
        cluster.members[other].port(),
        port,
    ]);
    eventually(Duration::from_secs(30), "member 4 a voter, settled", || {
        let survivors = survivors.clone();
        async move { promoted_and_settled(&survivors) }
    })
    .await;
}

/// A snapshot of a big table takes seconds to send at the bounded rate and
/// to install: the new member must still get it, however long that takes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_member_gets_a_snapshot_of_a_big_table() {
    let cluster = Cluster::start_with(&["--snapshot-every", "5", "--snapshot-log-percent", "0"]);
    let client = cluster.client(Duration::from_secs(30)).await;
    // 32 000 holds of long names: a snapshot of about 15 MB, a quarter of a
    // second of sending at the bounded rate before the peer decodes it.
    let guards = hold_long_names(&client, &unique("cluster-big-snapshot"), 500).await;

    let (_, joiner) = join_member_4(&cluster, Duration::from_secs(60)).await;
    assert!(
        joiner.log_tail(500).contains("snapshot written"),
        "the learner got a snapshot:\n{}",
        joiner.log_tail(50)
    );
    drop(guards);
    client.close().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_auto_promote_lag_a_learner_that_caught_up_becomes_a_voter() {
    let cluster = Cluster::start_with(&["--auto-promote-lag", "10"]);
    let url = cluster.url();
    let client = cluster.client(Duration::from_secs(10)).await;
    let guard = client
        .lock(unique("cluster-auto-promote").as_str())
        .acquire()
        .await
        .expect("acquire");
    let through = format!("127.0.0.1:{}", cluster.members[0].port());
    let _joiner = ServerProcess::start_on(free_port(), &["--node-id", "4", "--join", &through]);
    eventually(Duration::from_secs(20), "member 4 promoted", || {
        let url = url.clone();
        async move {
            members(&url)
                .iter()
                .any(|m| m["id"] == 4 && m["voter"] == true)
        }
    })
    .await;
    guard.release().await.unwrap();
}

/// `/api/cluster` of the member whose HTTP listener is on `port`.
async fn cluster_json(port: u16) -> serde_json::Value {
    let (code, body) = server_support::get(port, "/api/cluster").await;
    assert_eq!(code, 200, "{body}");
    serde_json::from_str(&body).expect("JSON")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_member_shows_the_cluster_on_its_web_api() {
    let ports: Vec<u16> = (0..3).map(|_| free_port()).collect();
    let http: Vec<u16> = (0..3).map(|_| free_port()).collect();
    let members: Vec<ServerProcess> = (0..3)
        .map(|i| {
            let listen = format!("127.0.0.1:{}", http[i]);
            ServerProcess::start_member(&ports, i, &["--metrics-listen", &listen])
        })
        .collect();
    let cluster = Cluster { members };
    let leader = cluster.leader(&[]).await;

    // The leader knows every member's log and lag.
    let on_leader = cluster_json(http[leader]).await;
    assert_eq!(on_leader["node_id"], leader + 1);
    assert_eq!(on_leader["leader_id"], leader + 1);
    let listed = on_leader["members"].as_array().expect("members").clone();
    assert_eq!(listed.len(), 3, "{on_leader}");
    for (i, member) in listed.iter().enumerate() {
        assert_eq!(member["id"], i + 1, "{on_leader}");
        assert_eq!(member["address"], format!("127.0.0.1:{}", ports[i]));
        let role = if i == leader { "leader" } else { "voter" };
        assert_eq!(member["role"], role, "{on_leader}");
        assert!(member["lag"].is_u64(), "{on_leader}");
    }
    // A follower knows the members and who leads, once the leader's first
    // entries reach it: until then a freshly started follower may have voted
    // without holding the membership entry yet, and lists no members.
    eventually(
        Duration::from_secs(10),
        "followers know the members and the leader",
        || async {
            let mut known = true;
            for i in (0..3).filter(|&i| i != leader) {
                let on_follower = cluster_json(http[i]).await;
                assert_eq!(on_follower["node_id"], i + 1);
                known &= on_follower["members"].as_array().map(Vec::len) == Some(3);
                known &= on_follower["leader_id"] == leader + 1;
            }
            known
        },
    )
    .await;
}

/// During a rolling upgrade, with a member of the build before (it reads
/// record version 2, which has no hold counts), the client counts re-entry
/// alone: the server sees one acquire, inspection shows 1, and the last
/// release still ends the hold.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn during_an_upgrade_the_client_counts_re_entry_alone() {
    let ports: Vec<u16> = (0..2).map(|_| free_port()).collect();
    let members = [
        ServerProcess::start_member(&ports, 0, &[]),
        ServerProcess::start_member(&ports, 1, &["--record-version", "2"]),
    ];
    server_support::leader(&members, &[]).await;
    let client = Client::connect(&server_support::members_url(&ports))
        .await
        .unwrap();
    let name = unique("upgrade-reentry");
    let lock = client.lock(name.as_str()).owner("worker");
    let first = lock.acquire().await.unwrap();
    let second = lock.acquire().await.unwrap();
    assert_eq!(first.fencing_token(), second.fencing_token());
    assert_eq!(second.hold_count(), 2);
    let info = client.describe(&name).await.unwrap().expect("held");
    assert_eq!(info.holders.len(), 1, "{info:?}");
    assert_eq!(
        info.holders[0].hold_count, 1,
        "the older member reads no count"
    );
    second.release().await.unwrap();
    assert!(!first.is_lost());
    first.release().await.unwrap();
    let info = client.describe(&name).await.unwrap();
    assert!(
        info.as_ref().is_none_or(|i| i.holders.is_empty()),
        "{info:?}"
    );
    for member in &members {
        member.assert_running();
    }
}
