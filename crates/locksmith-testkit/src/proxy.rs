//! The fault proxy: a TCP relay between one client process and the backend
//! that can blackhole or delay traffic, like a network partition or a slow
//! link.
//!
//! Each client slot gets its own proxy (per backend address), so a partition
//! can cut off exactly the client that holds the lock. A blackhole stops
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
    // When either side closes or fails, the whole relay ends.
    tokio::select! {
        _ = up => {}
        _ = down => {}
    }
}

/// Copies one direction: a reader task timestamps chunks, the writer holds them
/// as the mode says.
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
}
