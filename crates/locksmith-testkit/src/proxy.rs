//! The fault proxy (cargo feature `proxy`): a TCP relay between one client
//! and a server that can blackhole or delay traffic, like a network
//! partition or a slow link, for `locksmith-lab torture` and the conformance
//! suite's cut connections.
//!
//! Each client gets its own proxy per server address ([`Route`]), so a
//! partition can cut off exactly the client that holds the lock. A blackhole stops
//! delivering bytes in both directions and holds new connections without
//! connecting them, but drops nothing: when it heals, what was sent arrives,
//! as it would after TCP retransmission over a partition that healed in time.
//! A delay holds every chunk for the given time before passing it on, in order.
//! A refusal closes every connection and refuses new ones: the server is
//! unreachable and nothing sent meanwhile arrives later.

use std::net::SocketAddr;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;

/// What the proxy does to traffic.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Relay at once.
    Pass,
    /// Deliver nothing until the mode changes.
    Blackhole,
    /// Deliver each chunk this long after it was read.
    Delay(Duration),
    /// Close every connection and refuse new ones until the mode changes.
    Refuse,
}

/// One relay from a loopback port to `upstream`.
pub struct Proxy {
    addr: SocketAddr,
    mode: watch::Sender<Mode>,
    task: tokio::task::JoinHandle<()>,
}

impl Proxy {
    /// Listens on a free loopback port and relays to `upstream`.
    ///
    /// Cancel safety: safe; nothing is running until it returns.
    pub async fn start(upstream: SocketAddr) -> std::io::Result<Proxy> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let (mode, watcher) = watch::channel(Mode::Pass);
        let task = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                tokio::spawn(relay(client, upstream, watcher.clone()));
            }
        });
        Ok(Proxy { addr, mode, task })
    }

    /// Where the client connects instead of the backend.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Changes what happens to traffic, for every connection at once.
    pub fn set(&self, mode: Mode) {
        self.mode.send_replace(mode);
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Waits while the proxy blackholes; fails when it refuses (or is gone).
///
/// Cancel safety: safe; it only watches the mode.
async fn passable(mode: &mut watch::Receiver<Mode>) -> Result<Mode, ()> {
    loop {
        match *mode.borrow_and_update() {
            Mode::Blackhole => {}
            Mode::Refuse => return Err(()),
            current => return Ok(current),
        }
        mode.changed().await.map_err(|_| ())?;
    }
}

/// Relays one client connection to `upstream` as the mode says, until both
/// directions have ended (each passes its side's EOF on as a shutdown), or
/// the proxy refuses or is dropped.
///
/// Cancel safety: safe; dropping it closes both connections and aborts the
/// pumps' reader tasks, losing what they had queued.
async fn relay(client: TcpStream, upstream: SocketAddr, mut mode: watch::Receiver<Mode>) {
    // A partitioned client's connection attempt is not answered until it heals.
    if passable(&mut mode).await.is_err() {
        return;
    }
    let Ok(server) = TcpStream::connect(upstream).await else {
        return; // The backend is down (a restart fault): the client sees a reset.
    };
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    let (client_read, client_write) = client.into_split();
    let (server_read, server_write) = server.into_split();
    let up = pump(client_read, server_write, mode.clone());
    let down = pump(server_read, client_write, mode);
    // Each direction ends on its own: a side that half-closes still gets
    // what the other sends after it (a reply to a request followed by EOF).
    tokio::join!(up, down);
}

/// Copies one direction: a reader task timestamps chunks, the writer holds them
/// as the mode says.
///
/// Cancel safety: dropping it aborts its reader task: chunks read but not
/// yet written are lost, and `to` is dropped without a shutdown.
async fn pump(mut from: OwnedReadHalf, mut to: OwnedWriteHalf, mut mode: watch::Receiver<Mode>) {
    let (chunks, mut queue) = mpsc::channel::<(Instant, Vec<u8>)>(1024);
    let reader = async move {
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            match from.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    if chunks
                        .send((Instant::now(), buf[..n].to_vec()))
                        .await
                        .is_err()
                    {
                        break;
                    }
                }
            }
        }
    };
    let writer = async move {
        loop {
            let next = tokio::select! {
                next = queue.recv() => next,
                changed = mode.changed() => {
                    if changed.is_err() || *mode.borrow() == Mode::Refuse {
                        return;
                    }
                    continue;
                }
            };
            let Some((read_at, chunk)) = next else { break };
            loop {
                let Ok(current) = passable(&mut mode).await else {
                    return;
                };
                if let Mode::Delay(delay) = current {
                    tokio::time::sleep_until(read_at + delay).await;
                }
                // A blackhole or refusal may have started while this chunk
                // was delayed.
                match *mode.borrow() {
                    Mode::Blackhole => {}
                    Mode::Refuse => return,
                    _ => break,
                }
            }
            if to.write_all(&chunk).await.is_err() {
                return;
            }
        }
        let _ = to.shutdown().await;
    };
    // The writer drains what the reader queued before the reader's end, then
    // closes its side.
    let _reader = AbortOnDrop(tokio::spawn(reader));
    writer.await;
}

/// Stops a task when the future that started it is dropped (the relay ends
/// when either direction does).
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// A lock store URL split around its host list, so the hosts can be replaced
/// by fault proxies: `scheme://[userinfo@]h1:p1,h2:p2[/path][?query]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UrlHosts {
    head: String,
    /// `host:port` of each server, default ports filled in.
    pub hosts: Vec<String>,
    tail: String,
}

impl UrlHosts {
    /// Splits `url`.
    pub fn parse(url: &str) -> Result<UrlHosts, String> {
        let (scheme, rest) = url
            .split_once("://")
            .ok_or_else(|| format!("{url:?} is not a URL"))?;
        let default_port = match scheme {
            "locksmith" | "locksmith+tls" => 7420,
            "redis" | "rediss" | "redis+redlock" | "redis+cluster" | "rediss+cluster" => 6379,
            "redis+sentinel" | "rediss+sentinel" => 26379,
            "zk" | "zks" | "zookeeper" => 2181,
            "etcd" | "etcds" => 2379,
            "postgres" | "postgresql" => 5432,
            other => {
                return Err(format!(
                    "{other}:// has no hosts to put a fault proxy in front of"
                ))
            }
        };
        let end = rest.find(['/', '?']).unwrap_or(rest.len());
        let (authority, tail) = rest.split_at(end);
        let (userinfo, hosts) = match authority.rsplit_once('@') {
            Some((userinfo, hosts)) => (format!("{userinfo}@"), hosts),
            None => (String::new(), authority),
        };
        let hosts: Vec<String> = hosts
            .split(',')
            .filter(|h| !h.is_empty())
            .map(|h| {
                let has_port = match h.rfind(']') {
                    Some(bracket) => h[bracket..].contains(':'),
                    None => h.contains(':'),
                };
                if has_port {
                    h.to_owned()
                } else {
                    format!("{h}:{default_port}")
                }
            })
            .collect();
        if hosts.is_empty() {
            return Err(format!("{url:?} names no host"));
        }
        Ok(UrlHosts {
            head: format!("{scheme}://{userinfo}"),
            hosts,
            tail: tail.to_owned(),
        })
    }

    /// The URL with the hosts replaced by `addrs`, in order.
    pub fn with_hosts(&self, addrs: &[SocketAddr]) -> String {
        let hosts: Vec<String> = addrs.iter().map(ToString::to_string).collect();
        format!("{}{}{}", self.head, hosts.join(","), self.tail)
    }
}

/// One client's way to a store: a fault proxy in front of each host of the
/// store's URL, and the URL that goes through them.
pub struct Route {
    url: String,
    proxies: Vec<Proxy>,
}

impl Route {
    /// Starts a proxy in front of each host of `url`.
    ///
    /// Cancel safety: safe; the proxies started so far stop when dropped.
    pub async fn start(url: &str) -> Result<Route, String> {
        let parts = UrlHosts::parse(url)?;
        let mut proxies = Vec::new();
        for host in &parts.hosts {
            let upstream = tokio::net::lookup_host(host.as_str())
                .await
                .ok()
                .and_then(|mut addrs| addrs.next())
                .ok_or_else(|| format!("cannot resolve {host} of {url}"))?;
            let proxy = Proxy::start(upstream)
                .await
                .map_err(|e| format!("cannot start a fault proxy: {e}"))?;
            proxies.push(proxy);
        }
        let addrs: Vec<SocketAddr> = proxies.iter().map(Proxy::addr).collect();
        Ok(Route {
            url: parts.with_hosts(&addrs),
            proxies,
        })
    }

    /// The store's URL with every host replaced by its proxy.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// The proxies, in the order of the URL's hosts.
    pub fn proxies(&self) -> &[Proxy] {
        &self.proxies
    }

    /// Sets every proxy of the route to `mode`.
    pub fn set(&self, mode: Mode) {
        for proxy in &self.proxies {
            proxy.set(mode);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn echo_server() -> SocketAddr {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            while let Ok((mut stream, _)) = listener.accept().await {
                tokio::spawn(async move {
                    let (mut r, mut w) = stream.split();
                    let _ = tokio::io::copy(&mut r, &mut w).await;
                });
            }
        });
        addr
    }

    async fn round_trip(stream: &mut TcpStream, byte: u8) -> u8 {
        stream.write_all(&[byte]).await.unwrap();
        let mut back = [0u8];
        stream.read_exact(&mut back).await.unwrap();
        back[0]
    }

    #[tokio::test]
    async fn relays_blackholes_and_delays() {
        let proxy = Proxy::start(echo_server().await).await.unwrap();
        let mut stream = TcpStream::connect(proxy.addr()).await.unwrap();
        assert_eq!(round_trip(&mut stream, 1).await, 1);

        proxy.set(Mode::Blackhole);
        stream.write_all(&[2]).await.unwrap();
        let mut back = [0u8];
        let held =
            tokio::time::timeout(Duration::from_millis(200), stream.read_exact(&mut back)).await;
        assert!(held.is_err(), "nothing passes a blackhole");
        proxy.set(Mode::Pass);
        stream.read_exact(&mut back).await.unwrap();
        assert_eq!(back[0], 2, "held bytes arrive after healing");

        proxy.set(Mode::Delay(Duration::from_millis(150)));
        let start = std::time::Instant::now();
        assert_eq!(round_trip(&mut stream, 3).await, 3);
        assert!(
            start.elapsed() >= Duration::from_millis(300),
            "delayed both ways"
        );
    }

    #[tokio::test]
    async fn a_refusal_closes_connections_and_loses_what_was_sent() {
        let proxy = Proxy::start(echo_server().await).await.unwrap();
        let mut stream = TcpStream::connect(proxy.addr()).await.unwrap();
        assert_eq!(round_trip(&mut stream, 1).await, 1);

        proxy.set(Mode::Refuse);
        let mut back = [0u8];
        assert!(
            matches!(stream.read(&mut back).await, Ok(0) | Err(_)),
            "an open connection is closed"
        );
        let mut refused = TcpStream::connect(proxy.addr()).await.unwrap();
        let _ = refused.write_all(&[2]).await;
        assert!(
            matches!(refused.read(&mut back).await, Ok(0) | Err(_)),
            "a new connection is closed before anything passes"
        );
        proxy.set(Mode::Pass);
        let mut healed = TcpStream::connect(proxy.addr()).await.unwrap();
        assert_eq!(
            round_trip(&mut healed, 3).await,
            3,
            "nothing sent while refused arrives"
        );
    }

    #[tokio::test]
    async fn a_reply_sent_after_the_client_half_closes_arrives() {
        // A server that answers once the request has ended (its EOF).
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let server = listener.local_addr().unwrap();
        tokio::spawn(async move {
            let (mut stream, _) = listener.accept().await.unwrap();
            let mut request = Vec::new();
            stream.read_to_end(&mut request).await.unwrap();
            tokio::time::sleep(Duration::from_millis(50)).await;
            stream.write_all(&request).await.unwrap();
        });
        let proxy = Proxy::start(server).await.unwrap();
        let mut stream = TcpStream::connect(proxy.addr()).await.unwrap();
        stream.write_all(b"request").await.unwrap();
        stream.shutdown().await.unwrap();
        let mut reply = Vec::new();
        stream.read_to_end(&mut reply).await.unwrap();
        assert_eq!(reply, b"request");
    }

    #[test]
    fn urls_get_their_hosts_replaced() {
        let parts = UrlHosts::parse("postgres://u:p@localhost/db?sslmode=disable").unwrap();
        assert_eq!(parts.hosts, vec!["localhost:5432"]);
        let proxy: SocketAddr = "127.0.0.1:9000".parse().unwrap();
        assert_eq!(
            parts.with_hosts(&[proxy]),
            "postgres://u:p@127.0.0.1:9000/db?sslmode=disable"
        );

        let zk = UrlHosts::parse("zk://127.0.0.1:2181,127.0.0.1:2182/chroot").unwrap();
        assert_eq!(zk.hosts.len(), 2);
        assert_eq!(
            zk.with_hosts(&[proxy, proxy]),
            "zk://127.0.0.1:9000,127.0.0.1:9000/chroot"
        );

        assert_eq!(
            UrlHosts::parse("locksmith://127.0.0.1:7420")
                .unwrap()
                .with_hosts(&[proxy]),
            "locksmith://127.0.0.1:9000"
        );
        assert!(UrlHosts::parse("memory://x").is_err());
    }
}
