//! Starts every server for real, talks to it in its own protocol, and checks that
//! kill, pause and restart do what the conformance suite and the torture tool rely
//! on.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::Output;
use std::thread;
use std::time::{Duration, Instant};

use locksmith_testkit::{
    free_port, try_binary, Error, Etcd, Postgres, Process, ProcessSpec, Redis, RespValue, Server,
    ZooKeeper,
};

/// `PING` written by hand on a raw socket.
fn raw_redis_ping(port: u16) -> std::io::Result<String> {
    let mut stream = TcpStream::connect(("127.0.0.1", port))?;
    stream.set_read_timeout(Some(Duration::from_millis(500)))?;
    stream.write_all(b"*1\r\n$4\r\nPING\r\n")?;
    let mut reply = [0u8; 7];
    stream.read_exact(&mut reply)?;
    Ok(String::from_utf8_lossy(&reply).into_owned())
}

fn success(output: Output) -> String {
    assert!(
        output.status.success(),
        "command failed ({}): {}{}",
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).trim().to_owned()
}

fn eventually(what: &str, mut check: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !check() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn free_ports_differ() {
    let a = free_port();
    let b = free_port();
    assert_ne!(a, b);
    assert!(a > 0 && b > 0);
}

#[test]
fn a_missing_binary_names_its_package() {
    let err = try_binary("locksmith-no-such-server", "locksmith-no-such-package").unwrap_err();
    assert!(matches!(err, Error::NotInstalled { .. }));
    assert_eq!(
        err.to_string(),
        "locksmith-no-such-server not found on PATH: install it with \
         `apt-get install locksmith-no-such-package`, or run scripts/test which does"
    );
}

#[test]
#[should_panic(expected = "apt-get install locksmith-no-such-package")]
fn binary_panics_with_the_install_hint() {
    locksmith_testkit::binary("locksmith-no-such-server", "locksmith-no-such-package");
}

#[test]
fn a_server_dying_at_startup_reports_its_log() {
    let dir = tempfile::tempdir().unwrap();
    let spec = ProcessSpec::new("doomed", "/bin/sh", dir.path().join("log"))
        .args(["-c", "echo 'FATAL: config is wrong' >&2; exit 3"]);
    let process = Process::spawn(spec).unwrap();
    let err = process
        .wait_ready(Duration::from_secs(10), || Err("not yet".into()))
        .unwrap_err();
    assert!(matches!(err, Error::Exited { .. }), "{err}");
    let message = err.to_string();
    assert!(
        message.contains("doomed exited while starting"),
        "{message}"
    );
    assert!(message.contains("exit status: 3"), "{message}");
    assert!(message.contains("FATAL: config is wrong"), "{message}");
    assert!(!process.is_running());
}

#[test]
fn a_server_that_never_answers_times_out_with_its_log() {
    let dir = tempfile::tempdir().unwrap();
    let spec = ProcessSpec::new("mute", "/bin/sh", dir.path().join("log"))
        .args(["-c", "echo listening on nothing; exec sleep 60"]);
    let process = Process::spawn(spec).unwrap();
    let err = process
        .wait_ready(Duration::from_millis(300), || {
            Err("connection refused".into())
        })
        .unwrap_err();
    let message = err.to_string();
    assert!(matches!(err, Error::NotReady { .. }), "{message}");
    assert!(
        message.contains("last probe: connection refused"),
        "{message}"
    );
    assert!(message.contains("listening on nothing"), "{message}");
    assert!(process.is_running());
    process.kill();
    assert!(!process.is_running());
}

#[test]
fn redis_answers_ping_and_keeps_data_across_kill_and_restart() {
    let redis = Redis::start();
    assert_eq!(redis.url(), format!("redis://127.0.0.1:{}", redis.port()));
    assert_eq!(raw_redis_ping(redis.port()).unwrap(), "+PONG\r\n");

    assert_eq!(
        redis.query(&["SET", "fence", "42"]).unwrap().as_str(),
        Some("OK")
    );
    let pid = redis.pid().unwrap();
    redis.kill();
    assert!(!redis.is_running());
    assert!(raw_redis_ping(redis.port()).is_err());

    redis.restart();
    assert!(redis.is_running());
    assert_ne!(redis.pid().unwrap(), pid);
    assert_eq!(redis.query(&["GET", "fence"]).unwrap().as_str(), Some("42"));

    // A graceful restart of a running server keeps data too.
    redis.query(&["INCR", "fence"]).unwrap();
    redis.restart();
    assert_eq!(redis.query(&["GET", "fence"]).unwrap().as_str(), Some("43"));
}

#[test]
fn redis_pause_freezes_and_resume_thaws() {
    let redis = Redis::start();
    redis.pause();
    assert!(redis.is_running());
    assert!(
        raw_redis_ping(redis.port()).is_err(),
        "a paused redis must not answer"
    );
    redis.resume();
    assert_eq!(raw_redis_ping(redis.port()).unwrap(), "+PONG\r\n");
}

#[test]
fn redis_replica_follows_its_primary() {
    let primary = Redis::start();
    let replica = Redis::start_replica_of(&primary);
    assert_eq!(replica.primary_port(), Some(primary.port()));
    primary.query(&["SET", "k", "v"]).unwrap();
    eventually("the write to reach the replica", || {
        replica.query(&["GET", "k"]).unwrap() == RespValue::Bulk(Some(b"v".to_vec()))
    });
    let role = replica.query(&["ROLE"]).unwrap();
    let RespValue::Array(Some(fields)) = role else {
        panic!("ROLE answered {role:?}")
    };
    assert_eq!(fields[0].as_str(), Some("slave"));
}

#[test]
fn dropping_a_server_kills_it_and_removes_its_directory() {
    let redis = Redis::start();
    let pid = redis.pid().unwrap() as i32;
    let dir: PathBuf = redis.dir().to_owned();
    let port = redis.port();
    assert!(dir.join("redis.log").is_file());
    drop(redis);
    assert!(!dir.exists(), "{} was not removed", dir.display());
    // SAFETY: signal 0 only checks whether the pid exists.
    assert_ne!(unsafe { libc::kill(pid, 0) }, 0, "redis {pid} still runs");
    assert!(TcpStream::connect(("127.0.0.1", port)).is_err());
}

#[test]
fn servers_outlive_the_thread_that_started_them() {
    // PR_SET_PDEATHSIG fires when the forking *thread* exits; the testkit forks
    // from a thread of its own, so this server must survive.
    let redis = thread::spawn(Redis::start).join().unwrap();
    thread::sleep(Duration::from_millis(200));
    assert!(redis.is_running());
    assert_eq!(raw_redis_ping(redis.port()).unwrap(), "+PONG\r\n");
}

#[test]
fn shared_zookeeper_answers_four_letter_words() {
    let zk = ZooKeeper::shared();
    assert!(std::ptr::eq(zk, ZooKeeper::shared()));
    assert_eq!(zk.connect_string(), format!("127.0.0.1:{}", zk.port()));
    assert_eq!(zk.url(), format!("zk://127.0.0.1:{}", zk.port()));
    let srvr = zk.four_letter("srvr").unwrap();
    assert!(srvr.contains("Mode: standalone"), "srvr answered {srvr:?}");
    assert_eq!(zk.four_letter("ruok").unwrap(), "imok");
    let conf = zk.four_letter("conf").unwrap();
    assert!(
        conf.contains("minSessionTimeout=1000"),
        "conf answered {conf:?}"
    );
}

/// The secure client port speaks TLS with the server's certificate of its
/// own CA, to a client presenting a certificate of that CA (`openssl
/// s_client`, a real TLS client); the plain port keeps answering.
#[test]
fn zookeeper_tls_port_handshakes_with_a_client_certificate() {
    let zk = ZooKeeper::start_tls();
    let port = zk.secure_port().expect("a secure port");
    let ca = zk.ca_cert().unwrap();
    let (cert, key) = zk.client_cert("client").unwrap().unwrap();
    let openssl = locksmith_testkit::binary("openssl", "openssl");
    let out = std::process::Command::new(openssl)
        .args(["s_client", "-connect", &format!("127.0.0.1:{port}")])
        .args(["-verify_return_error", "-verify_ip", "127.0.0.1"])
        .arg("-CAfile")
        .arg(&ca)
        .arg("-cert")
        .arg(&cert)
        .arg("-key")
        .arg(&key)
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("Verify return code: 0 (ok)"), "{out:?}");
    assert!(!text.contains("Cipher is (NONE)"), "{out:?}");
    assert_eq!(zk.four_letter("ruok").unwrap(), "imok");
}

#[test]
fn zookeeper_restarts_on_the_same_port_with_its_data() {
    let zk = ZooKeeper::start();
    let port = zk.port();
    // Creating a session is a transaction; `srvr` reports the last zxid.
    let session = zk_open_session(port);
    let zxid_before = zxid(&zk);
    assert!(zxid_before > 0, "creating a session logged no transaction");
    drop(session);
    zk.kill();
    assert!(!zk.is_running());
    assert!(zk.four_letter("ruok").is_err());
    zk.restart();
    assert_eq!(zk.port(), port);
    assert_eq!(zk.four_letter("ruok").unwrap(), "imok");
    // The transaction log was replayed: the zxid did not go back to 0.
    assert!(zxid(&zk) >= zxid_before, "the transaction log was lost");
}

/// Opens a ZooKeeper session with a hand-written `ConnectRequest` and returns the
/// connection.
fn zk_open_session(port: u16) -> TcpStream {
    let mut body = Vec::new();
    body.extend(0_i32.to_be_bytes()); // protocolVersion
    body.extend(0_i64.to_be_bytes()); // lastZxidSeen
    body.extend(10_000_i32.to_be_bytes()); // timeOut (ms)
    body.extend(0_i64.to_be_bytes()); // sessionId: new session
    body.extend(16_i32.to_be_bytes()); // passwd
    body.extend([0_u8; 16]);
    let mut stream = TcpStream::connect(("127.0.0.1", port)).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    stream
        .write_all(&(body.len() as i32).to_be_bytes())
        .unwrap();
    stream.write_all(&body).unwrap();
    let mut len = [0_u8; 4];
    stream.read_exact(&mut len).unwrap();
    let mut response = vec![0_u8; i32::from_be_bytes(len) as usize];
    stream.read_exact(&mut response).unwrap();
    // protocolVersion (4), timeOut (4), sessionId (8), passwd
    let timeout = i32::from_be_bytes(response[4..8].try_into().unwrap());
    let session_id = i64::from_be_bytes(response[8..16].try_into().unwrap());
    assert_ne!(session_id, 0, "no session granted");
    assert_eq!(timeout, 10_000);
    stream
}

fn zxid(zk: &ZooKeeper) -> u64 {
    let srvr = zk.four_letter("srvr").unwrap();
    let hex = srvr
        .lines()
        .find_map(|l| l.strip_prefix("Zxid: 0x"))
        .unwrap_or_else(|| panic!("no Zxid in {srvr:?}"));
    u64::from_str_radix(hex.trim(), 16).unwrap()
}

#[test]
fn etcd_puts_gets_and_keeps_data_across_kill_and_restart() {
    let etcd = Etcd::start();
    assert_eq!(etcd.endpoint(), format!("http://127.0.0.1:{}", etcd.port()));
    assert_eq!(etcd.url(), format!("etcd://127.0.0.1:{}", etcd.port()));
    assert!(etcd.is_healthy());

    success(etcd.etcdctl().args(["put", "fence", "7"]).output().unwrap());
    let got = success(
        etcd.etcdctl()
            .args(["get", "fence", "--print-value-only"])
            .output()
            .unwrap(),
    );
    assert_eq!(got, "7");

    etcd.kill();
    assert!(!etcd.is_running());
    etcd.restart();
    let got = success(
        etcd.etcdctl()
            .args(["get", "fence", "--print-value-only"])
            .output()
            .unwrap(),
    );
    assert_eq!(got, "7");
}

#[test]
fn etcd_pause_makes_it_unhealthy_until_resumed() {
    let etcd = Etcd::start();
    etcd.pause();
    assert!(!etcd.is_healthy());
    etcd.resume();
    eventually("etcd to be healthy again", || etcd.is_healthy());
}

#[test]
fn postgres_answers_and_keeps_tables_across_restart_and_kill() {
    let pg = Postgres::start();
    assert_eq!(
        pg.url(),
        format!("postgres://postgres@127.0.0.1:{}/postgres", pg.port())
    );
    assert_eq!(
        success(
            pg.psql()
                .args(["-A", "-t", "-c", "select 1"])
                .output()
                .unwrap()
        ),
        "1"
    );

    pg.query("create table fence (token bigint); insert into fence values (1)")
        .unwrap();
    pg.restart();
    pg.query("insert into fence values (2)").unwrap();
    assert_eq!(pg.query("select count(*) from fence").unwrap(), "2");

    // kill -9 of the postmaster and its backends, then crash recovery.
    pg.kill();
    assert!(!pg.is_running());
    pg.restart();
    assert_eq!(
        pg.query("select string_agg(token::text, ',' order by token) from fence")
            .unwrap(),
        "1,2"
    );

    let err = pg.query("select * from no_such_table").unwrap_err();
    assert!(err.to_string().contains("no_such_table"), "{err}");
}

#[test]
fn every_server_works_through_the_trait() {
    let servers: Vec<Box<dyn Server>> = vec![Box::new(Redis::start()), Box::new(Etcd::start())];
    for server in &servers {
        assert!(server.url().ends_with(&server.port().to_string()));
        assert!(server.is_running(), "{} does not run", server.name());
        server.kill();
        assert!(!server.is_running(), "{} still runs", server.name());
        server.restart();
        assert!(server.is_running(), "{} does not run", server.name());
        assert!(server.process().log_tail(5).lines().count() > 0);
    }
}
