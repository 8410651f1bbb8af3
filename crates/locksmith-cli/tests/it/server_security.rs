//! TLS, authentication and per-prefix permissions of `locksmith serve`,
//! against real server processes: for each permission and each transport
//! (TLS with a token, TLS with a client certificate, plaintext with a token),
//! what is allowed works, what is denied is denied and changes nothing, wrong
//! certificates and tokens are refused, and no secret shows in logs, errors
//! or listings. Certificates are made here, in a temporary directory.
//!
//! Needs the CLI binary, so it lives in locksmith-cli and not with the
//! server's own tests in locksmith-server: it starts `locksmith serve` as a
//! process, to test the server as an operator runs it (flags, data
//! directory, signals, restarts).

use crate::server_support;

use std::time::Duration;

use locksmith::server::ServerUrl;
use locksmith::{Client, ConnectOptions, Error};
use locksmith_proto::v1 as pb;
use locksmith_proto::v1::locksmith_client::LocksmithClient;
use locksmith_server::token_sha256;
use server_support::pki::Pki;
use server_support::{cluster_flag, get, unique, ServerProcess, BINARY};

/// The roles of the tests, each as a token identity and a certificate one.
const ROLES: [(&str, &str); 3] = [
    // Locks and inspects `jobs/`.
    (
        "locker",
        r#"{ prefix = "jobs/*", permissions = ["lock", "inspect"] }"#,
    ),
    // Inspects everything.
    ("viewer", r#"{ prefix = "", permissions = ["inspect"] }"#),
    // Administers, inspects and locks everything.
    (
        "admin",
        r#"{ prefix = "*", permissions = ["admin", "inspect", "lock"] }"#,
    ),
];

fn token(role: &str) -> String {
    format!("{role}-token-d41d8cd98f00b204")
}

/// An auth file with each role as `<role>` (token) and `CN=<role>-cert`.
fn auth_file(roles: &[(&str, &str)]) -> String {
    let mut text = String::new();
    for (role, grant) in roles {
        text += &format!(
            "[[identity]]\nname = \"{role}\"\ntoken_sha256 = \"{}\"\ngrants = [ {grant} ]\n\n",
            token_sha256(&token(role))
        );
        text += &format!(
            "[[identity]]\nname = \"{role}-cert\"\ncert_subject = \"CN={role}-cert\"\ngrants = [ {grant} ]\n\n"
        );
    }
    text
}

/// A server with TLS (client CA) and authentication, and the files for its
/// clients.
struct Secured {
    pki: Pki,
    server: ServerProcess,
}

#[derive(Clone, Copy, Debug)]
enum Transport {
    TlsToken,
    TlsCertificate,
    PlainToken,
}

impl Secured {
    fn start(tls: bool) -> Secured {
        let pki = Pki::new();
        pki.issue("ca", "server");
        for (role, _) in ROLES {
            pki.issue("ca", &format!("{role}-cert"));
            std::fs::write(pki.path(&format!("{role}.token")), token(role)).unwrap();
        }
        pki.issue("ca", "stranger-cert");
        pki.issue("foreign-ca", "foreign-cert");
        std::fs::write(pki.path("wrong.token"), "not-a-known-token").unwrap();
        std::fs::write(pki.path("auth.toml"), auth_file(&ROLES)).unwrap();
        let mut args = if tls {
            pki.serve_args("server")
        } else {
            Vec::new()
        };
        args.extend([
            "--auth-file".into(),
            pki.path_str("auth.toml"),
            "--metrics-listen".into(),
            "127.0.0.1:0".into(),
        ]);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let server = ServerProcess::start_with(&args);
        Secured { pki, server }
    }

    fn addr(&self) -> String {
        format!("127.0.0.1:{}", self.server.port())
    }

    /// The URL of `role` over `transport`.
    fn url(&self, transport: Transport, role: &str) -> String {
        let (addr, ca) = (self.addr(), self.pki.path_str("ca.pem"));
        match transport {
            Transport::TlsToken => format!(
                "locksmith+tls://{addr}?ca={ca}&token_file={}",
                self.pki.path_str(&format!("{role}.token"))
            ),
            Transport::TlsCertificate => self.cert_url(&format!("{role}-cert")),
            Transport::PlainToken => format!(
                "locksmith://{addr}?token_file={}",
                self.pki.path_str(&format!("{role}.token"))
            ),
        }
    }

    /// The URL presenting the certificate `<name>.pem`.
    fn cert_url(&self, name: &str) -> String {
        format!(
            "locksmith+tls://{}?ca={}&cert={}&key={}",
            self.addr(),
            self.pki.path_str("ca.pem"),
            self.pki.path_str(&format!("{name}.pem")),
            self.pki.path_str(&format!("{name}.key")),
        )
    }

    async fn client(&self, url: &str) -> Client {
        connect(url)
            .await
            .unwrap_or_else(|e| panic!("connect {url}: {e}\n{}", self.server.log_tail(20)))
    }

    /// The whole log, to look for secrets in.
    fn log(&self) -> String {
        std::fs::read_to_string(self.server.data_dir().parent().unwrap().join("serve.log"))
            .unwrap_or_default()
    }

    fn assert_no_secret_in(&self, what: &str, text: &str) {
        for (role, _) in ROLES {
            let token = token(role);
            assert!(
                !text.contains(&token),
                "{what} shows {role}'s token: {text}"
            );
            let hash = token_sha256(&token);
            assert!(
                !text.contains(&hash),
                "{what} shows {role}'s token hash: {text}"
            );
        }
        assert!(
            !text.contains("not-a-known-token"),
            "{what} shows a token: {text}"
        );
    }
}

async fn connect(url: &str) -> locksmith::Result<Client> {
    let options = ConnectOptions::default().session_ttl(Duration::from_secs(2));
    Client::connect_with(url, options).await
}

/// A raw gRPC stub with the URL's transport and credentials.
async fn stub(url: &str) -> Result<locksmith::server::Stub, String> {
    let parsed = ServerUrl::parse(url).map_err(|e| e.to_string())?;
    let channel = parsed
        .endpoint(&parsed.addresses()[0])
        .map_err(|e| e.to_string())?
        .connect()
        .await
        .map_err(|e| format!("{e:?}"))?;
    Ok(LocksmithClient::with_interceptor(
        channel,
        parsed.credentials(),
    ))
}

fn denied<T: std::fmt::Debug>(result: locksmith::Result<T>, what: &str) -> String {
    match result {
        Err(Error::PermissionDenied(message)) => message,
        other => panic!("{what}: expected PERMISSION_DENIED, got {other:?}"),
    }
}

/// Every permission over one transport: allowed works, denied is denied and
/// changes nothing, listings show only what the caller may inspect.
async fn permissions_hold(transport: Transport) {
    let secured = Secured::start(!matches!(transport, Transport::PlainToken));
    let locker = secured.client(&secured.url(transport, "locker")).await;
    let viewer = secured.client(&secured.url(transport, "viewer")).await;
    let admin = secured.client(&secured.url(transport, "admin")).await;
    let run = unique("security");
    let job = format!("jobs/{run}/nightly");
    let order = format!("orders/{run}/42");

    // lock: on its prefix only.
    let guard = locker
        .lock(job.as_str())
        .acquire()
        .await
        .expect("lock on jobs/");
    let message = denied(
        locker.lock(order.as_str()).try_acquire().await,
        "lock outside jobs/",
    );
    assert!(message.contains("lock"), "{message}");
    denied(
        locker
            .multi_lock([job.clone() + "-b", order.clone()])
            .try_acquire()
            .await,
        "a multi-lock reaching outside jobs/",
    );
    denied(
        viewer.lock(job.as_str()).try_acquire().await,
        "lock without the permission",
    );
    assert!(
        admin.describe(&order).await.unwrap().is_none(),
        "a denied acquire changes nothing"
    );
    assert!(
        admin
            .describe(&(job.clone() + "-b"))
            .await
            .unwrap()
            .is_none(),
        "a denied multi-lock takes none of its names"
    );
    let order_guard = admin
        .lock(order.as_str())
        .acquire()
        .await
        .expect("admin locks anything");

    // inspect: describe, list and history show only what the caller may see.
    assert!(locker.describe(&job).await.unwrap().is_some());
    denied(locker.describe(&order).await, "describe outside jobs/");
    assert!(viewer.describe(&order).await.unwrap().is_some());
    let everything: Vec<String> = viewer
        .list("")
        .await
        .unwrap()
        .into_iter()
        .map(|l| l.name)
        .collect();
    assert!(
        everything.contains(&job) && everything.contains(&order),
        "{everything:?}"
    );
    let mine: Vec<String> = locker
        .list("")
        .await
        .unwrap()
        .into_iter()
        .map(|l| l.name)
        .collect();
    assert!(mine.contains(&job), "{mine:?}");
    assert!(
        mine.iter().all(|name| name.starts_with("jobs/")),
        "{mine:?}"
    );
    let history = locker.history("").await.unwrap();
    assert!(
        history.iter().all(|g| g.name.starts_with("jobs/")),
        "{history:?}"
    );
    assert!(history.iter().any(|g| g.name == job));

    // admin: force-release and sessions.
    denied(
        locker.force_release(&job).await,
        "force-release without admin",
    );
    denied(
        viewer.force_release(&order).await,
        "force-release without admin",
    );
    assert!(admin.describe(&job).await.unwrap().is_some(), "still held");
    admin
        .force_release(&job)
        .await
        .expect("admin force-releases");
    assert!(admin.describe(&job).await.unwrap().is_none());
    assert!(guard.is_lost() || guard.release().await.is_err());

    let mut locker_stub = stub(&secured.url(transport, "locker")).await.unwrap();
    let mut viewer_stub = stub(&secured.url(transport, "viewer")).await.unwrap();
    let mut admin_stub = stub(&secured.url(transport, "admin")).await.unwrap();
    // The newest session, the one ended below.
    let victim = secured.client(&secured.url(transport, "locker")).await;
    let denied_list = locker_stub
        .list_sessions(pb::ListSessionsRequest {})
        .await
        .unwrap_err();
    assert_eq!(denied_list.code(), tonic::Code::PermissionDenied);
    let sessions = viewer_stub
        .list_sessions(pb::ListSessionsRequest {})
        .await
        .expect("inspect on every name lists sessions")
        .into_inner()
        .sessions;
    let session_id = sessions
        .iter()
        .map(|s| s.session_id)
        .max()
        .expect("sessions");
    let count = sessions.len();
    for stub in [&mut locker_stub, &mut viewer_stub] {
        let refused = stub
            .end_session(pb::EndSessionRequest { session_id })
            .await
            .unwrap_err();
        assert_eq!(refused.code(), tonic::Code::PermissionDenied, "{refused:?}");
    }
    let after = viewer_stub
        .list_sessions(pb::ListSessionsRequest {})
        .await
        .unwrap()
        .into_inner()
        .sessions;
    assert_eq!(after.len(), count, "a denied end-session ends nothing");
    admin_stub
        .end_session(pb::EndSessionRequest { session_id })
        .await
        .expect("admin ends sessions");

    // Unary lease calls follow the same rules.
    let lease = |name: &str| pb::AcquireLeaseRequest {
        acquire: Some(pb::Acquire {
            names: vec![name.to_owned()],
            owner: "cron".into(),
            lease_ms: Some(30_000),
            ..Default::default()
        }),
    };
    let refused = locker_stub.acquire_lease(lease(&order)).await.unwrap_err();
    assert_eq!(refused.code(), tonic::Code::PermissionDenied);
    let leased = locker_stub
        .acquire_lease(lease(&format!("jobs/{run}/lease")))
        .await
        .expect("lease on jobs/")
        .into_inner();
    assert!(leased.granted);
    // Releasing or renewing another prefix's hold, with its owner and token.
    let order_lease = format!("orders/{run}/lease");
    let held = admin_stub
        .acquire_lease(lease(&order_lease))
        .await
        .expect("admin leases anything")
        .into_inner();
    let hold = |lease_ms| {
        (
            order_lease.clone(),
            "cron".to_owned(),
            held.tokens.first().copied(),
            lease_ms,
        )
    };
    let (name, owner, token, _) = hold(0);
    let refused = locker_stub
        .release(pb::ReleaseRequest {
            release: Some(pb::Release { name, owner, token }),
        })
        .await
        .unwrap_err();
    assert_eq!(refused.code(), tonic::Code::PermissionDenied);
    let (name, owner, token, lease_ms) = hold(60_000);
    let refused = locker_stub
        .renew(pb::RenewRequest {
            renew: Some(pb::Renew {
                name,
                owner,
                token,
                lease_ms,
            }),
        })
        .await
        .unwrap_err();
    assert_eq!(refused.code(), tonic::Code::PermissionDenied);
    let still = admin
        .describe(&order_lease)
        .await
        .unwrap()
        .expect("still held");
    assert_eq!(still.holders[0].fencing_token, held.tokens.first().copied());
    admin.force_release(&order_lease).await.unwrap();

    order_guard.release().await.unwrap();
    for client in [locker, viewer, admin, victim] {
        let _ = client.close().await;
    }
    secured.assert_no_secret_in("the server log", &secured.log());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn permissions_over_tls_with_tokens() {
    permissions_hold(Transport::TlsToken).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn permissions_over_tls_with_client_certificates() {
    permissions_hold(Transport::TlsCertificate).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn permissions_over_plaintext_with_tokens() {
    permissions_hold(Transport::PlainToken).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrong_credentials_are_refused_and_secrets_stay_out_of_errors_and_logs() {
    let secured = Secured::start(true);
    let addr = secured.addr();
    let ca = secured.pki.path_str("ca.pem");

    // No credentials at all.
    let anonymous = connect(&format!("locksmith+tls://{addr}?ca={ca}")).await;
    assert!(
        matches!(anonymous, Err(Error::Unauthenticated(_))),
        "{anonymous:?}"
    );
    let mut raw = stub(&format!("locksmith+tls://{addr}?ca={ca}"))
        .await
        .unwrap();
    let status = raw
        .list(pb::ListRequest::default())
        .await
        .expect_err("listing without credentials");
    assert_eq!(status.code(), tonic::Code::Unauthenticated);

    // An unknown token.
    let wrong_url = format!(
        "locksmith+tls://{addr}?ca={ca}&token_file={}",
        secured.pki.path_str("wrong.token")
    );
    let wrong = connect(&wrong_url).await;
    let Err(Error::Unauthenticated(message)) = &wrong else {
        panic!("an unknown token: {wrong:?}");
    };
    secured.assert_no_secret_in("the error", message);
    let status = stub(&wrong_url)
        .await
        .unwrap()
        .describe(pb::DescribeRequest {
            name: "jobs/x".into(),
        })
        .await
        .unwrap_err();
    assert_eq!(status.code(), tonic::Code::Unauthenticated);
    secured.assert_no_secret_in("the status", &format!("{status:?}"));

    // A certificate the CA signed for no identity.
    let stranger = connect(&secured.cert_url("stranger-cert")).await;
    assert!(
        matches!(stranger, Err(Error::Unauthenticated(_))),
        "{stranger:?}"
    );

    // A certificate of another CA: the TLS handshake fails.
    let foreign = stub(&secured.cert_url("foreign-cert")).await;
    let refused = match foreign {
        Err(error) => error,
        Ok(mut client) => format!(
            "{:?}",
            client
                .describe(pb::DescribeRequest {
                    name: "jobs/x".into()
                })
                .await
                .expect_err("a foreign certificate is refused")
        ),
    };
    assert!(!refused.is_empty());

    // A server certificate the client's CA did not sign.
    let foreign_ca = secured.pki.path_str("foreign-ca.pem");
    let untrusted = stub(&format!(
        "locksmith+tls://{addr}?ca={foreign_ca}&token_file={}",
        secured.pki.path_str("admin.token")
    ))
    .await;
    let untrusted = match untrusted {
        Err(error) => error,
        Ok(mut client) => format!(
            "{:?}",
            client
                .describe(pb::DescribeRequest {
                    name: "jobs/x".into()
                })
                .await
                .expect_err("the client does not trust the server")
        ),
    };
    assert!(!untrusted.is_empty());

    // A plaintext client gets nothing but a closed connection.
    let plain = stub(&format!("locksmith://{addr}")).await;
    if let Ok(mut client) = plain {
        let status = client
            .describe(pb::DescribeRequest {
                name: "jobs/x".into(),
            })
            .await
            .expect_err("plaintext against TLS");
        // No answer of the server's: the transport saw the connection close.
        assert!(std::error::Error::source(&status).is_some(), "{status:?}");
    }

    // The session listing shows no credentials either.
    let admin = secured
        .client(&secured.url(Transport::TlsToken, "admin"))
        .await;
    let mut admin_stub = stub(&secured.url(Transport::TlsToken, "admin"))
        .await
        .unwrap();
    let sessions = admin_stub
        .list_sessions(pb::ListSessionsRequest {})
        .await
        .unwrap()
        .into_inner();
    secured.assert_no_secret_in("the session listing", &format!("{sessions:?}"));
    admin.close().await.unwrap();
    secured.assert_no_secret_in("the server log", &secured.log());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sighup_reloads_the_auth_file_and_a_bad_one_keeps_the_old() {
    let secured = Secured::start(true);
    let url = secured.url(Transport::TlsToken, "locker");
    let locker = secured.client(&url).await;
    let order = format!("orders/{}", unique("reload"));
    denied(
        locker.lock(order.as_str()).try_acquire().await,
        "before the reload",
    );

    let widened: Vec<(&str, &str)> = vec![
        (
            "locker",
            r#"{ prefix = "", permissions = ["lock", "inspect"] }"#,
        ),
        ROLES[1],
        ROLES[2],
    ];
    std::fs::write(secured.pki.path("auth.toml"), auth_file(&widened)).unwrap();
    let hangup = || {
        let pid = nix_pid(secured.server.pid());
        assert_eq!(unsafe { libc::kill(pid, libc::SIGHUP) }, 0);
    };
    hangup();
    let log_has = |what: &str| secured.log().contains(what);
    server_support::eventually(Duration::from_secs(10), "the reload", || async {
        log_has("auth file reloaded")
    })
    .await;
    // The session stream opened before the reload follows it.
    let guard = locker
        .lock(order.as_str())
        .acquire()
        .await
        .expect("allowed after the reload");
    guard.release().await.unwrap();

    std::fs::write(secured.pki.path("auth.toml"), "[[identity]]\nname = 'x'\n").unwrap();
    hangup();
    server_support::eventually(Duration::from_secs(10), "the refused reload", || async {
        log_has("auth file not reloaded")
    })
    .await;
    let guard = locker
        .lock(order.as_str())
        .acquire()
        .await
        .expect("the previous file stays in force");
    guard.release().await.unwrap();
    locker.close().await.unwrap();
    secured.assert_no_secret_in("the server log", &secured.log());
}

fn nix_pid(pid: u32) -> libc::pid_t {
    pid as libc::pid_t
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_authentication_the_http_listener_serves_only_what_names_nothing() {
    let secured = Secured::start(true);
    let log = secured.log();
    let port: u16 = log
        .lines()
        .find(|line| line.contains("HTTP listening"))
        .and_then(|line| line.split("127.0.0.1:").nth(1))
        .and_then(|rest| {
            rest.chars()
                .take_while(char::is_ascii_digit)
                .collect::<String>()
                .parse()
                .ok()
        })
        .expect("the HTTP port in the log");
    for path in [
        "/api/locks",
        "/api/sessions",
        "/api/history",
        "/api/cluster",
        "/debug/raft",
        "/",
    ] {
        let (code, _) = get(port, path).await;
        assert_eq!(code, 403, "{path}");
    }
    for path in ["/metrics", "/healthz", "/readyz"] {
        let (code, _) = get(port, path).await;
        assert_eq!(code, 200, "{path}");
    }
}

#[test]
fn the_cli_takes_its_token_from_the_environment() {
    let secured = Secured::start(true);
    let url = format!(
        "locksmith+tls://{}?ca={}",
        secured.addr(),
        secured.pki.path_str("ca.pem")
    );
    let run = |token: Option<&str>| {
        let mut command = std::process::Command::new(BINARY);
        command.args(["session", "list", "--backend", &url]);
        command.env_remove("LOCKSMITH_TOKEN");
        if let Some(token) = token {
            command.env("LOCKSMITH_TOKEN", token);
        }
        command.output().expect("run locksmith session list")
    };
    let allowed = run(Some(&token("viewer")));
    assert!(
        allowed.status.success(),
        "{}",
        String::from_utf8_lossy(&allowed.stderr)
    );
    let refused = run(None);
    assert!(!refused.status.success());
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(stderr.contains("authentication required"), "{stderr}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_auth_file_stops_the_start_and_says_why() {
    let pki = Pki::new();
    std::fs::write(
        pki.path("auth.toml"),
        format!(
            "[[identity]]\nname = \"a\"\ntoken_sha256 = \"{}\"\nbogus = 1\n",
            token_sha256("secret")
        ),
    )
    .unwrap();
    let dir = pki.path("data");
    let message = server_support::refused_start(&dir, &["--auth-file", &pki.path_str("auth.toml")]);
    assert!(message.contains("unknown field"), "{message}");
    assert!(!message.contains(&token_sha256("secret")), "{message}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tls_cluster_elects_a_leader_serves_holds_and_refuses_strange_members() {
    use locksmith_proto::raft as raft_pb;
    use locksmith_testkit::free_port;
    use raft_pb::append_frame::Kind;

    let pki = Pki::new();
    std::fs::write(pki.path("auth.toml"), auth_file(&ROLES)).unwrap();
    std::fs::write(pki.path("admin.token"), token("admin")).unwrap();
    pki.issue("foreign-ca", "foreign-member");
    let ports: Vec<u16> = (0..3).map(|_| free_port()).collect();
    let list = cluster_flag(&ports);
    let members: Vec<ServerProcess> = ports
        .iter()
        .enumerate()
        .map(|(i, &port)| {
            let name = format!("member-{}", i + 1);
            pki.issue("members-ca", &name);
            let mut args = pki.member_serve_args(&name);
            args.extend([
                "--node-id".into(),
                (i + 1).to_string(),
                "--cluster".into(),
                list.clone(),
                "--auth-file".into(),
                pki.path_str("auth.toml"),
            ]);
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            ServerProcess::start_on(port, &args)
        })
        .collect();
    let addrs: Vec<String> = ports.iter().map(|p| format!("127.0.0.1:{p}")).collect();
    let url = format!(
        "locksmith+tls://{}?ca={}&token_file={}",
        addrs.join(","),
        pki.path_str("members-ca.pem"),
        pki.path_str("admin.token")
    );
    let options = ConnectOptions::default().session_ttl(Duration::from_secs(10));
    let client = Client::connect_with(&url, options)
        .await
        .unwrap_or_else(|e| panic!("connect {url}: {e}\n{}", members[0].log_tail(30)));
    let name = unique("tls-cluster");
    let guard = client.lock(name.as_str()).acquire().await.expect("a hold");
    let info = client.describe(&name).await.unwrap().expect("held");
    assert_eq!(info.holders[0].fencing_token, Some(guard.fencing_token()));
    guard.release().await.unwrap();
    client.close().await.unwrap();

    // Raft traffic from a peer without a certificate, or with a client's
    // (which the port accepts, for clients): refused.
    pki.issue("ca", "a-client");
    for identity in ["", "&cert=CERT&key=KEY"] {
        let identity = identity
            .replace("CERT", &pki.path_str("a-client.pem"))
            .replace("KEY", &pki.path_str("a-client.key"));
        let peer = ServerUrl::parse(&format!(
            "locksmith+tls://{}?ca={}{identity}",
            addrs[0],
            pki.path_str("members-ca.pem")
        ))
        .unwrap();
        let channel = peer.endpoint(&addrs[0]).unwrap().connect().await.unwrap();
        let refused = raft_pb::raft_client::RaftClient::new(channel.clone())
            .vote(raft_pb::Payload::default())
            .await
            .unwrap_err();
        assert_eq!(refused.code(), tonic::Code::Unauthenticated, "{refused:?}");
        assert!(refused.message().contains("peer CA"), "{refused:?}");

        // Refused on its headers, before its message is read: a message
        // that never ends gets the refusal all the same.
        let mut grpc = tonic::client::Grpc::new(channel);
        grpc.ready().await.unwrap();
        let never = tonic::Request::new(futures::stream::pending::<raft_pb::Payload>());
        let path =
            tonic::codegen::http::uri::PathAndQuery::from_static("/locksmith.raft.v1.Raft/Append");
        let codec = tonic_prost::ProstCodec::<raft_pb::Payload, raft_pb::Payload>::default();
        let refused = tokio::time::timeout(
            Duration::from_secs(10),
            grpc.client_streaming(never, path, codec),
        )
        .await
        .expect("refused before the message is read")
        .unwrap_err();
        assert_eq!(refused.code(), tonic::Code::Unauthenticated, "{refused:?}");

        // The framed replication stream: refused in its first frame, on the
        // connection's certificate.
        let who = (!identity.is_empty()).then_some("a-client");
        let Kind::End(refused) = framed_append_opening(&pki, &addrs[0], who).await else {
            panic!("a framed replication stream without a member's certificate is refused");
        };
        assert_eq!(
            refused.code,
            tonic::Code::Unauthenticated as i32,
            "{refused:?}"
        );
        assert!(refused.message.contains("peer CA"), "{refused:?}");
        assert!(refused.closing, "{refused:?}");
    }
    // A member's certificate opens it.
    let opened = framed_append_opening(&pki, &addrs[0], Some("member-2")).await;
    assert!(matches!(opened, Kind::Accepted(_)), "{opened:?}");

    // A member whose certificate another CA signed: no TLS session at all.
    let foreign = ServerUrl::parse(&format!(
        "locksmith+tls://{}?ca={}&cert={}&key={}",
        addrs[0],
        pki.path_str("members-ca.pem"),
        pki.path_str("foreign-member.pem"),
        pki.path_str("foreign-member.key"),
    ))
    .unwrap();
    let refused = match foreign.endpoint(&addrs[0]).unwrap().connect().await {
        Err(error) => format!("{error:?}"),
        Ok(channel) => format!(
            "{:?}",
            raft_pb::raft_client::RaftClient::new(channel)
                .vote(raft_pb::Payload::default())
                .await
                .expect_err("a foreign member certificate is refused")
        ),
    };
    // Neither the Raft service's refusal nor its decoding: the connection
    // never got that far.
    assert!(
        !refused.contains("Unauthenticated") && !refused.contains("InvalidArgument"),
        "{refused}"
    );
    for member in &members {
        member.assert_running();
    }
}

/// Opens a framed replication stream to the member at `addr` over TLS
/// (trusting the members' CA), presenting `identity`'s certificate (of
/// `pki`) if given, and returns the member's first frame.
async fn framed_append_opening(
    pki: &Pki,
    addr: &str,
    identity: Option<&str>,
) -> locksmith_proto::raft::append_frame::Kind {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_file_iter(pki.path("members-ca.pem")).unwrap() {
        roots.add(cert.unwrap()).unwrap();
    }
    let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots);
    let config = match identity {
        Some(name) => {
            let certs = CertificateDer::pem_file_iter(pki.path(&format!("{name}.pem")))
                .unwrap()
                .collect::<Result<Vec<_>, _>>()
                .unwrap();
            let key = PrivateKeyDer::from_pem_file(pki.path(&format!("{name}.key"))).unwrap();
            builder.with_client_auth_cert(certs, key).unwrap()
        }
        None => builder.with_no_client_auth(),
    };
    let mut io = locksmith_proto::transport::dial(addr, Some(std::sync::Arc::new(config)), None)
        .await
        .unwrap();
    io.write_all(locksmith_proto::framed::APPEND_MAGIC)
        .await
        .unwrap();
    let len = io.read_u32().await.unwrap();
    let mut frame = vec![0; len as usize];
    io.read_exact(&mut frame).await.unwrap();
    locksmith_proto::framed::decode::<locksmith_proto::raft::AppendFrame>(&frame)
        .unwrap()
        .kind
        .expect("a frame of a kind")
}

#[test]
fn a_tls_cluster_member_without_a_peer_ca_is_refused_at_start() {
    let pki = Pki::new();
    pki.issue("ca", "server");
    let (cert, key) = (pki.path_str("server.pem"), pki.path_str("server.key"));
    // A client CA does not certify members.
    let message = server_support::refused_start(
        &pki.path("data"),
        &[
            "--tls-cert",
            &cert,
            "--tls-key",
            &key,
            "--tls-client-ca",
            &pki.path_str("ca.pem"),
            "--cluster",
            "1=127.0.0.1:7,2=127.0.0.1:8",
        ],
    );
    assert!(message.contains("--tls-peer-ca"), "{message}");
}

/// With authentication on, a joiner adds itself by its member certificate
/// (no identity of its own in the auth file); a stranger's certificate gets
/// no TLS session, and a client may not add a learner without `admin`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_a_member_with_a_certificate_of_the_clusters_ca_can_join() {
    use locksmith_proto::raft as raft_pb;
    use locksmith_testkit::free_port;

    let pki = Pki::new();
    std::fs::write(pki.path("auth.toml"), auth_file(&ROLES)).unwrap();
    std::fs::write(pki.path("admin.token"), token("admin")).unwrap();
    std::fs::write(pki.path("locker.token"), token("locker")).unwrap();
    pki.issue("members-ca", "member-1");
    pki.issue("members-ca", "member-2");
    pki.issue("foreign-ca", "member-3");
    let with_auth = |mut args: Vec<String>| {
        args.extend(["--auth-file".into(), pki.path_str("auth.toml")]);
        args
    };
    let first_port = free_port();
    let first = {
        let args = with_auth(pki.member_serve_args("member-1"));
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        ServerProcess::start_on(first_port, &args)
    };
    let through = format!("127.0.0.1:{first_port}");
    let joiner = |id: u64, name: &str| {
        let mut args = with_auth(pki.member_serve_args(name));
        args.extend([
            "--node-id".into(),
            id.to_string(),
            "--join".into(),
            through.clone(),
        ]);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        ServerProcess::start_on(free_port(), &args)
    };
    let url = ServerUrl::parse(&format!(
        "locksmith+tls://{through}?ca={}&token_file={}",
        pki.path_str("members-ca.pem"),
        pki.path_str("admin.token")
    ))
    .unwrap();
    let member_ids = || async {
        let channel = url.endpoint(&through).unwrap().connect().await.unwrap();
        let mut ids: Vec<u64> =
            raft_pb::cluster_client::ClusterClient::with_interceptor(channel, url.credentials())
                .status(raft_pb::StatusRequest {})
                .await
                .expect("cluster status")
                .into_inner()
                .members
                .iter()
                .map(|m| m.id)
                .collect();
        ids.sort();
        ids
    };

    let stranger = joiner(3, "member-3");
    server_support::eventually(Duration::from_secs(30), "the join to give up", || async {
        stranger.log_tail(20).contains("could not join the cluster")
    })
    .await;
    assert_eq!(member_ids().await, [1], "the foreign member was not added");

    // A client that may lock but not administer cannot add a learner.
    let locker = ServerUrl::parse(&format!(
        "locksmith+tls://{through}?ca={}&token_file={}",
        pki.path_str("members-ca.pem"),
        pki.path_str("locker.token")
    ))
    .unwrap();
    let channel = locker.endpoint(&through).unwrap().connect().await.unwrap();
    let refused =
        raft_pb::cluster_client::ClusterClient::with_interceptor(channel, locker.credentials())
            .add_learner(raft_pb::AddLearnerRequest {
                id: 9,
                address: "127.0.0.1:9".into(),
            })
            .await
            .expect_err("a locker may not add a learner");
    assert_eq!(refused.code(), tonic::Code::PermissionDenied, "{refused:?}");

    let _member = joiner(2, "member-2");
    server_support::eventually(Duration::from_secs(20), "member 2 to join", || async {
        member_ids().await == [1, 2]
    })
    .await;
    first.assert_running();
}
