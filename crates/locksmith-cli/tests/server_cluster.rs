//! A replicated lock server: three `locksmith serve` processes forming one
//! Raft group on loopback, and clients that list all three.

mod server_support;

use std::time::Duration;

use locksmith::{Client, ConnectOptions};
use locksmith_proto::v1 as pb;
use locksmith_proto::v1::locksmith_client::LocksmithClient;
use locksmith_testkit::free_port;
use server_support::{unique, ServerProcess};

/// Three members of a new cluster, ids 1 to 3.
struct Cluster {
    members: Vec<ServerProcess>,
}

impl Cluster {
    fn start() -> Cluster {
        let ports: Vec<u16> = (0..3).map(|_| free_port()).collect();
        let list = ports
            .iter()
            .enumerate()
            .map(|(i, port)| format!("{}=127.0.0.1:{port}", i + 1))
            .collect::<Vec<_>>()
            .join(",");
        let members = ports
            .iter()
            .enumerate()
            .map(|(i, &port)| {
                let id = (i + 1).to_string();
                ServerProcess::start_on(port, &["--node-id", &id, "--cluster", &list])
            })
            .collect();
        Cluster { members }
    }

    fn url(&self) -> String {
        let addrs: Vec<String> = self
            .members
            .iter()
            .map(|m| format!("127.0.0.1:{}", m.port()))
            .collect();
        format!("locksmith://{}", addrs.join(","))
    }

    async fn client(&self, session_ttl: Duration) -> Client {
        let options = ConnectOptions {
            session_ttl,
            ..ConnectOptions::default()
        };
        Client::connect_with(&self.url(), options)
            .await
            .unwrap_or_else(|e| panic!("connect to {}: {e}", self.url()))
    }

    /// The index of the member that answers inspection (the leader), once
    /// one does, among those not in `except`.
    async fn leader(&self, except: &[usize]) -> usize {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
        loop {
            for (i, member) in self.members.iter().enumerate() {
                if except.contains(&i) {
                    continue;
                }
                let address = format!("http://127.0.0.1:{}", member.port());
                let Ok(mut client) = LocksmithClient::connect(address).await else {
                    continue;
                };
                let request = pb::DescribeRequest {
                    name: "probe".into(),
                };
                if client.describe(request).await.is_ok() {
                    return i;
                }
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "no leader among the members"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
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
