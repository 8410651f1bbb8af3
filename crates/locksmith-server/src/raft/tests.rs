//! Three members in one process, each with its own Raft log on disk and its
//! own gRPC port on loopback: the lock engine replicated through openraft,
//! a leader killed, a member restarted from its files.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use locksmith_core::{Acquire, ClientInfo, Command, Limits, Mode, RequestId, SessionId, Wait};
use locksmith_proto::raft::raft_server::RaftServer;
use openraft::{BasicNode, Config};
use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tokio_stream::wrappers::TcpListenerStream;

use super::network::{PeerNetwork, RaftService};
use super::state_machine::EngineMachine;
use super::{Batch, TypeConfig};
use crate::storage::raft_log::RaftLog;
use crate::storage::{LogRecord, Record};

type Raft = openraft::Raft<TypeConfig, EngineMachine>;

const WAIT: Duration = Duration::from_secs(10);

struct Member {
    raft: Raft,
    machine: EngineMachine,
    server: JoinHandle<()>,
}

impl Member {
    async fn start(id: u64, dir: &Path, listener: TcpListener) -> Member {
        let config = Config {
            heartbeat_interval: 50,
            election_timeout_min: 300,
            election_timeout_max: 600,
            enable_pre_vote: Some(true),
            ..Config::default()
        }
        .validate()
        .expect("valid Raft config");
        let log = RaftLog::open(dir, 1 << 20).expect("open the Raft log");
        let machine = EngineMachine::new(Limits::default());
        let network = PeerNetwork {
            snapshot_rate: 64 << 20,
        };
        let raft = Raft::new(id, Arc::new(config), network, log, machine.clone())
            .await
            .expect("start Raft");
        let service = RaftServer::new(RaftService::new(raft.clone()));
        let server = tokio::spawn(async move {
            let _ = tonic::transport::Server::builder()
                .add_service(service)
                .serve_with_incoming(TcpListenerStream::new(listener))
                .await;
        });
        Member {
            raft,
            machine,
            server,
        }
    }

    async fn stop(self) {
        self.server.abort();
        let _ = self.raft.shutdown().await;
    }
}

fn record(now: u64, command: Command) -> Record {
    Record::Command(LogRecord {
        now,
        command,
        secret: None,
        request: None,
    })
}

fn acquire(session: u64, request: u64, name: &str) -> Command {
    Command::Acquire(Acquire {
        session: SessionId(session),
        request: RequestId(request),
        owner: format!("owner-{session}"),
        names: vec![name.to_owned()],
        mode: Mode::Exclusive,
        wait: Wait::Forever,
        lease: None,
        reentrant: false,
        lock_delay: 0,
    })
}

async fn leader_among(members: &BTreeMap<u64, Member>) -> u64 {
    let any = members.values().next().expect("a member");
    let metrics = any
        .raft
        .wait(Some(WAIT))
        .metrics(
            |m| m.current_leader.is_some_and(|l| members.contains_key(&l)),
            "a leader among the running members",
        )
        .await
        .expect("a leader is elected");
    metrics.current_leader.expect("checked")
}

/// Proposes `batch` through the leader, as a proposer must: a member that is
/// not (yet) a leader with a valid lease answers "forward", and the batch goes
/// to whoever leads then. Returns the entry's index.
async fn write(members: &BTreeMap<u64, Member>, batch: Batch) -> u64 {
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let leader = leader_among(members).await;
        match members[&leader].raft.client_write(batch.clone()).await {
            Ok(written) => return written.log_id.index,
            Err(error) => {
                assert!(
                    tokio::time::Instant::now() < deadline,
                    "never written: {error}"
                );
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    }
}

/// Waits until every member applied `index`, then returns each one's
/// (last token, holder of `name`).
async fn converged(
    members: &BTreeMap<u64, Member>,
    index: u64,
    name: &str,
) -> Vec<(u64, Option<(String, u64)>)> {
    let mut seen = Vec::new();
    for member in members.values() {
        member
            .raft
            .wait(Some(WAIT))
            .applied_index_at_least(Some(index), "the entry is applied")
            .await
            .expect("applied everywhere");
        seen.push(
            member
                .machine
                .read(|engine| {
                    let holder = engine.describe(name).map(|info| {
                        let h = &info.holders[0];
                        (h.owner.clone(), h.fencing_token)
                    });
                    (engine.last_token(), holder)
                })
                .await,
        );
    }
    seen
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_engine_is_replicated_and_survives_its_leader() {
    let dirs: Vec<_> = (0..3).map(|_| tempfile::tempdir().unwrap()).collect();
    let mut listeners = Vec::new();
    let mut nodes = BTreeMap::new();
    for id in 1..=3u64 {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        nodes.insert(id, BasicNode { addr });
        listeners.push(listener);
    }
    let mut members = BTreeMap::new();
    for (id, listener) in (1..=3u64).zip(listeners) {
        let dir = dirs[id as usize - 1].path();
        members.insert(id, Member::start(id, dir, listener).await);
    }
    members[&1]
        .raft
        .initialize(nodes.clone())
        .await
        .expect("initialize the cluster");

    // Two sessions; one holds "a", the other waits for it.
    let open = |session| Command::OpenSession {
        session: SessionId(session),
        ttl: 60_000,
        info: ClientInfo::default(),
    };
    let batch = Batch {
        records: vec![
            record(1, open(1)),
            record(1, open(2)),
            record(2, acquire(1, 1, "a")),
            record(3, acquire(2, 1, "a")),
        ],
    };
    let index = write(&members, batch).await;
    let seen = converged(&members, index, "a").await;
    assert!(
        seen.iter().all(|s| *s == (1, Some(("owner-1".into(), 1)))),
        "{seen:?}"
    );

    // The leader dies; the others elect one and carry on from the same state:
    // the waiter is granted with a higher token when the holder's session ends.
    let leader = leader_among(&members).await;
    let old = members.remove(&leader).expect("the leader");
    let old_addr = nodes[&leader].addr.clone();
    old.stop().await;
    let close = Command::CloseSession {
        session: SessionId(1),
    };
    let index = write(
        &members,
        Batch {
            records: vec![record(10, close)],
        },
    )
    .await;
    let seen = converged(&members, index, "a").await;
    assert!(
        seen.iter().all(|s| *s == (2, Some(("owner-2".into(), 2)))),
        "{seen:?}"
    );

    // The old leader comes back from its files, on its old address, and
    // catches up.
    let (id, dir) = nodes
        .iter()
        .find(|(_, node)| node.addr == old_addr)
        .map(|(id, _)| (*id, dirs[*id as usize - 1].path()))
        .unwrap();
    let listener = TcpListener::bind(&old_addr).await.unwrap();
    members.insert(id, Member::start(id, dir, listener).await);
    let seen = converged(&members, index, "a").await;
    assert!(
        seen.iter().all(|s| *s == (2, Some(("owner-2".into(), 2)))),
        "{seen:?}"
    );
    for (_, member) in members {
        member.stop().await;
    }
}
