//! Starts every replicated setup for real, kills a member where it hurts most
//! (the primary, the leader), and checks that the setup recovers as the
//! failover tests and the torture tool rely on: another member takes over with
//! the data, and the killed member comes back into the setup.

use locksmith_testkit::{
    EtcdCluster, Redis, RedisCluster, RedisSentinel, RespValue, ZooKeeperEnsemble,
};

fn bulk(text: &str) -> RespValue {
    RespValue::Bulk(Some(text.as_bytes().to_vec()))
}

/// `WAIT` until `replicas` replicas have every write so far.
fn replicate(primary: &Redis, replicas: usize) {
    let acked = primary
        .query(&["WAIT", &replicas.to_string(), "5000"])
        .unwrap();
    assert_eq!(
        acked.as_int(),
        Some(replicas as i64),
        "WAIT answered {acked:?}"
    );
}

#[test]
fn redis_sentinel_fails_over_and_takes_the_old_primary_back() {
    let setup = RedisSentinel::start();
    assert_eq!(setup.nodes().len(), 3);
    assert_eq!(setup.sentinels().len(), 3);
    assert!(setup.url().starts_with("redis+sentinel://127.0.0.1:"));
    assert!(setup.url().ends_with("/locksmith"));
    let old = setup.primary();
    assert_eq!(old.port(), setup.nodes()[0].port());
    old.query(&["SET", "k", "v"]).unwrap();
    replicate(old, 2);

    old.kill();
    let new = setup.wait_for_failover(old).unwrap();
    assert_ne!(new.port(), old.port());
    assert_eq!(new.query(&["GET", "k"]).unwrap(), bulk("v"));
    assert_eq!(setup.primary().port(), new.port());

    old.restart();
    setup.wait_healthy().unwrap();
    let info = old.query(&["INFO", "replication"]).unwrap();
    let info = info.as_str().unwrap();
    assert!(info.contains("role:slave"), "{info}");
    // The primary now, which is `new` unless the Sentinels failed over once
    // more meanwhile (a loaded machine can make a primary miss their 1 s
    // down-after; a second failover was seen under the whole suite).
    let primary = setup.primary().port();
    assert!(
        info.contains(&format!("master_port:{primary}")),
        "the old primary should replicate from {primary} (after {new_port}):\n{info}",
        new_port = new.port()
    );
}

#[test]
fn redis_cluster_serves_every_slot_and_fails_over() {
    let cluster = RedisCluster::start();
    assert_eq!(cluster.nodes().len(), 6);
    assert_eq!(cluster.primaries().len(), 3);
    assert!(cluster.url().starts_with("redis+cluster://127.0.0.1:"));
    // Keys in different slots land on different primaries.
    let owners: std::collections::BTreeSet<u16> = (0..30)
        .map(|i| cluster.primary_of(&format!("key-{i}")).unwrap().port())
        .collect();
    assert_eq!(owners.len(), 3, "30 keys over 3 primaries: {owners:?}");

    let old = cluster.primary_of("orders/42").unwrap();
    assert_eq!(
        old.query(&["SET", "orders/42", "v"]).unwrap().as_str(),
        Some("OK")
    );
    replicate(old, 1);
    // WAIT counts an acknowledgement, but a replica whose link dropped under
    // load may be in a full resync (its old data flushed, the new not loaded
    // yet), and a primary killed then leaves it empty. Kill only once the
    // replica is in sync and holds the key.
    let replica = cluster
        .nodes()
        .iter()
        .find(|n| {
            n.query(&["INFO", "replication"])
                .ok()
                .and_then(|i| i.as_str().map(str::to_owned))
                .is_some_and(|i| {
                    i.contains("role:slave") && i.contains(&format!("master_port:{}", old.port()))
                })
        })
        .expect("the primary of orders/42 has a replica");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    loop {
        let info = replica.query(&["INFO", "replication"]).unwrap();
        let info = info.as_str().unwrap_or_default().to_owned();
        let keys = replica.query(&["DBSIZE"]).unwrap().as_int();
        if info.contains("master_link_status:up")
            && info.contains("master_sync_in_progress:0")
            && keys == Some(1)
        {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "replica {} not in sync with orders/42 ({keys:?} keys):\n{info}",
            replica.port()
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    old.kill();
    cluster.wait_for_failover(old).unwrap();
    let new = cluster.primary_of("orders/42").unwrap();
    assert_ne!(new.port(), old.port());
    let value = new.query(&["GET", "orders/42"]).unwrap();
    if value != bulk("v") {
        // Seen once under the whole suite: the view of every node, to tell
        // which failover happened.
        let views: Vec<String> = cluster
            .nodes()
            .iter()
            .filter(|n| n.is_running())
            .map(|n| {
                let nodes = n.query(&["CLUSTER", "NODES"]).ok();
                let nodes = nodes.as_ref().and_then(RespValue::as_str).unwrap_or("?");
                format!("node {}:\n{nodes}", n.port())
            })
            .collect();
        panic!(
            "{} serves orders/42 after {} died, without the acknowledged value ({value:?}):\n{}",
            new.port(),
            old.port(),
            views.join("\n")
        );
    }

    old.restart();
    cluster.wait_healthy().unwrap();
    assert_eq!(cluster.primaries().len(), 3);
    let moved = old.query(&["GET", "orders/42"]).unwrap();
    assert!(
        matches!(&moved, RespValue::Error(e) if e.starts_with("MOVED")),
        "the old primary came back as a replica: {moved:?}"
    );
}

#[test]
fn etcd_cluster_elects_a_new_leader_and_takes_the_old_one_back() {
    let cluster = EtcdCluster::start();
    assert_eq!(cluster.members().len(), 3);
    assert_eq!(cluster.endpoints().len(), 3);
    let leader = cluster.leader().unwrap();
    let put = leader.etcdctl().args(["put", "k", "v"]).output().unwrap();
    assert!(put.status.success(), "{put:?}");

    leader.kill();
    let next = cluster.leader().unwrap();
    assert_ne!(next.port(), leader.port());
    let get = next
        .etcdctl()
        .args(["get", "k", "--print-value-only"])
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&get.stdout).trim(), "v");

    leader.restart();
    cluster.wait_healthy().unwrap();
    assert!(leader.is_healthy());
}

#[test]
fn zookeeper_ensemble_elects_a_new_leader_and_takes_the_old_one_back() {
    let ensemble = ZooKeeperEnsemble::start();
    assert_eq!(ensemble.servers().len(), 3);
    assert!(ensemble.url().starts_with("zk://127.0.0.1:"));
    let leader = ensemble.leader().unwrap();

    leader.kill();
    let next = ensemble.leader().unwrap();
    assert_ne!(next.port(), leader.port());

    leader.restart();
    ensemble.wait_healthy().unwrap();
    let srvr = leader.four_letter("srvr").unwrap();
    assert!(srvr.contains("Mode: follower"), "{srvr}");
    assert_eq!(
        ensemble.servers().iter().filter(|s| s.is_running()).count(),
        3
    );
}

/// On hosts of their own, a primary cut off from its replicas and Sentinels
/// is the classic split brain: the Sentinels promote a replica while the old
/// primary, still reached by its clients, goes on taking writes; once the
/// network heals it is made a replica and those writes are gone.
#[test]
fn a_sentinel_primary_cut_off_from_its_peers_takes_writes_that_are_lost() {
    let setup = RedisSentinel::try_start_on_hosts().expect("as root, with iproute2");
    let network = setup.network().expect("hosts of their own");
    assert!(
        setup.url().starts_with("redis+sentinel://10."),
        "{}",
        setup.url()
    );
    let old = setup.primary();
    assert_eq!(
        old.port(),
        setup.nodes()[0].port(),
        "node 0 starts as primary"
    );
    let peers = 1..setup.nodes().len() + setup.sentinels().len();
    for peer in peers.clone() {
        network.cut(0, peer).unwrap();
    }
    let new = setup.wait_for_failover(old).unwrap();
    assert_eq!(
        old.query(&["SET", "split", "brain"]).unwrap(),
        RespValue::Simple("OK".into()),
        "the old primary still takes writes"
    );
    for peer in peers {
        network.heal(0, peer).unwrap();
    }
    setup.wait_healthy().unwrap();
    assert_eq!(setup.primary().port(), new.port());
    assert!(old.query(&["GET", "split"]).unwrap().is_nil());
}

/// On hosts of their own, an etcd leader cut off from its peers commits
/// nothing (no quorum), and the cluster is whole again after the heal.
#[test]
fn an_etcd_leader_cut_off_from_its_peers_commits_nothing() {
    let cluster = EtcdCluster::try_start_on_hosts().expect("as root, with iproute2");
    let network = cluster.network().expect("hosts of their own");
    assert!(cluster.url().starts_with("etcd://10."), "{}", cluster.url());
    let leader = cluster.leader().unwrap();
    let at = cluster
        .members()
        .iter()
        .position(|m| m.port() == leader.port())
        .unwrap();
    let peers: Vec<usize> = (0..3).filter(|&i| i != at).collect();
    for &peer in &peers {
        network.cut(at, peer).unwrap();
    }
    let put = leader
        .etcdctl()
        .args(["--command-timeout=3s", "put", "cut", "off"])
        .output()
        .unwrap();
    assert!(!put.status.success(), "a cut-off leader committed: {put:?}");
    for &peer in &peers {
        network.heal(at, peer).unwrap();
    }
    cluster.wait_healthy().unwrap();
    let put = cluster
        .leader()
        .unwrap()
        .etcdctl()
        .args(["put", "healed", "yes"])
        .output()
        .unwrap();
    assert!(put.status.success(), "{put:?}");
}

/// On hosts of their own, a ZooKeeper leader cut off from its peers steps
/// down (it has lost its quorum), the other two elect a leader, and after the
/// heal the ensemble is whole again.
#[test]
fn a_zookeeper_leader_cut_off_from_its_peers_steps_down() {
    let ensemble = ZooKeeperEnsemble::try_start_on_hosts().expect("as root, with iproute2");
    let network = ensemble.network().expect("hosts of their own");
    assert!(ensemble.url().starts_with("zk://10."), "{}", ensemble.url());
    let leader = ensemble.leader().unwrap();
    let at = ensemble
        .servers()
        .iter()
        .position(|s| s.port() == leader.port())
        .unwrap();
    let peers: Vec<usize> = (0..3).filter(|&i| i != at).collect();
    for &peer in &peers {
        network.cut(at, peer).unwrap();
    }
    let leads = |i: usize| {
        ensemble.servers()[i]
            .four_letter("srvr")
            .is_ok_and(|srvr| srvr.contains("Mode: leader"))
    };
    // The old leader notices after syncLimit × tickTime (2.5 s).
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    let settled = loop {
        if !leads(at) && peers.iter().any(|&i| leads(i)) {
            break true;
        }
        if std::time::Instant::now() > deadline {
            break false;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    };
    for &peer in &peers {
        network.heal(at, peer).unwrap();
    }
    assert!(
        settled,
        "the old leader went on leading, or no other was elected"
    );
    ensemble.wait_healthy().unwrap();
    assert!(!leads(at), "the old leader came back as a follower");
}
