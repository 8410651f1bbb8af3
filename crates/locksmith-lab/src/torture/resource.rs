//! The fenced resource: a small TCP service in the coordinator standing for the
//! storage a lock protects.
//!
//! It takes a write only if the writer's fencing token is not below the highest
//! token it has accepted for that lock (Kleppmann's fencing rule), and it logs
//! everything every client reports, stamped with its own `CLOCK_MONOTONIC`
//! time on arrival, for the checker. It also knows who is inside a critical
//! section right now (between an accepted `Begin` write and the `End` write, an
//! abort, or the client's connection closing), which is how the nemesis finds a
//! holder to kill or pause.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard};

use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};

use super::protocol::{now, Phase, Reply, Request};

/// A client process: slot and incarnation.
pub type Who = (u32, u32);

/// One entry of the resource's log.
#[derive(Debug, Clone)]
pub struct Event {
    /// Arrival time at the resource (`CLOCK_MONOTONIC` ns).
    pub at: u64,
    /// Who sent it.
    pub who: Who,
    /// What was reported; `None` when the client's connection closed.
    pub request: Option<Request>,
    /// For writes, whether the resource took it.
    pub accepted: bool,
}

/// A client inside its critical section.
#[derive(Debug, Clone)]
pub struct Inside {
    /// The lock.
    pub lock: String,
    /// The token it entered with.
    pub token: u64,
    /// When its `Begin` write was accepted.
    pub since: u64,
}

#[derive(Default)]
struct State {
    events: Vec<Event>,
    highest: HashMap<String, u64>,
    inside: HashMap<Who, Inside>,
    grants: u64,
    stop: bool,
    /// Asked for by the nemesis: the next accepted `Begin` lingers this long.
    linger: Option<std::time::Duration>,
    /// The client told to linger, once one was.
    lingering: Option<Who>,
}

/// The running resource service.
pub struct Resource {
    state: Arc<Mutex<State>>,
    addr: SocketAddr,
    task: tokio::task::JoinHandle<()>,
}

impl Resource {
    /// Starts the service on a free loopback port.
    ///
    /// Cancel safety: safe; nothing is running until it returns.
    pub async fn start() -> std::io::Result<Resource> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let state = Arc::new(Mutex::new(State::default()));
        let shared = state.clone();
        let task = tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let _ = stream.set_nodelay(true);
                tokio::spawn(serve(stream, shared.clone()));
            }
        });
        Ok(Resource { state, addr, task })
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Where clients connect.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Tells every client to release and exit at its next report.
    pub fn stop(&self) {
        self.state().stop = true;
    }

    /// Makes the next client that enters a critical section stay inside
    /// `extra` longer; [`Resource::lingering`] then names it.
    pub fn request_linger(&self, extra: std::time::Duration) {
        let mut state = self.state();
        state.linger = Some(extra);
        state.lingering = None;
    }

    /// Takes back a linger nobody has taken yet, so that a fault that gave
    /// up waiting for a holder does not leave it to whoever enters next
    /// (after the round's faults, where nothing waits for it to leave).
    /// Returns the client that took it, if one did meanwhile.
    pub fn withdraw_linger(&self) -> Option<(Who, Inside)> {
        self.state().linger = None;
        self.lingering()
    }

    /// The client told to linger, while it is still inside.
    pub fn lingering(&self) -> Option<(Who, Inside)> {
        let state = self.state();
        let who = state.lingering?;
        state.inside.get(&who).map(|inside| (who, inside.clone()))
    }

    /// Grants reported so far.
    pub fn grants(&self) -> u64 {
        self.state().grants
    }

    /// Who is inside a critical section right now.
    pub fn inside(&self) -> Vec<(Who, Inside)> {
        let mut inside: Vec<_> = self
            .state()
            .inside
            .iter()
            .map(|(w, i)| (*w, i.clone()))
            .collect();
        inside.sort_by_key(|(_, i)| i.since);
        inside
    }

    /// The log so far.
    pub fn events(&self) -> Vec<Event> {
        self.state().events.clone()
    }
}

impl Drop for Resource {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Applies one request to the state and logs it; returns the reply.
fn apply(state: &mut State, who: Who, request: Request) -> Reply {
    let at = now();
    let mut accepted = true;
    let mut linger_ms = 0;
    match &request {
        Request::Hello { .. } => {}
        Request::Granted { .. } => state.grants += 1,
        Request::Write {
            lock, token, phase, ..
        } => {
            let highest = state.highest.entry(lock.clone()).or_insert(0);
            accepted = *token >= *highest;
            if accepted {
                *highest = *token;
            }
            match phase {
                Phase::Begin if accepted => {
                    if let Some(extra) = state.linger.take() {
                        linger_ms = extra.as_millis() as u64;
                        state.lingering = Some(who);
                    }
                    state.inside.insert(
                        who,
                        Inside {
                            lock: lock.clone(),
                            token: *token,
                            since: at,
                        },
                    );
                }
                Phase::Begin => {}
                Phase::End => {
                    state.inside.remove(&who);
                }
            }
        }
        Request::Abort { .. } => {
            state.inside.remove(&who);
        }
        Request::Waiting { .. }
        | Request::Lost { .. }
        | Request::Released { .. }
        | Request::Failed { .. } => {}
    }
    state.events.push(Event {
        at,
        who,
        request: Some(request),
        accepted,
    });
    Reply {
        accepted,
        stop: state.stop,
        linger_ms,
    }
}

/// Serves one client connection: a `Hello`, then requests until it closes.
///
/// Cancel safety: dropped midway (it runs as its own task, so only at the
/// runtime's shutdown), it closes the connection without logging the close
/// or taking the client out of `inside`; a request applied may go unanswered.
async fn serve(stream: TcpStream, state: Arc<Mutex<State>>) {
    let (read, mut write) = stream.into_split();
    let mut lines = BufReader::new(read).lines();
    let mut who: Option<Who> = None;
    while let Ok(Some(line)) = lines.next_line().await {
        let Ok(request) = serde_json::from_str::<Request>(&line) else {
            tracing::warn!(%line, "torture resource: unreadable request");
            break;
        };
        if let Request::Hello {
            client,
            incarnation,
            ..
        } = &request
        {
            who = Some((*client, *incarnation));
        }
        let Some(sender) = who else {
            tracing::warn!("torture resource: request before hello");
            break;
        };
        let reply = apply(
            &mut state.lock().unwrap_or_else(|p| p.into_inner()),
            sender,
            request,
        );
        let mut line = serde_json::to_string(&reply).expect("replies serialize");
        line.push('\n');
        if write.write_all(line.as_bytes()).await.is_err() {
            break;
        }
    }
    if let Some(who) = who {
        let mut state = state.lock().unwrap_or_else(|p| p.into_inner());
        state.inside.remove(&who);
        state.events.push(Event {
            at: now(),
            who,
            request: None,
            accepted: true,
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(token: u64, phase: Phase) -> Request {
        Request::Write {
            lock: "l".into(),
            token,
            phase,
            start: 0,
            end: 0,
        }
    }

    #[test]
    fn writes_below_the_highest_token_are_rejected() {
        let mut state = State::default();
        assert!(apply(&mut state, (0, 0), write(5, Phase::Begin)).accepted);
        assert!(apply(&mut state, (0, 0), write(5, Phase::End)).accepted);
        assert!(apply(&mut state, (1, 0), write(7, Phase::Begin)).accepted);
        assert!(!apply(&mut state, (0, 0), write(6, Phase::Begin)).accepted);
        assert_eq!(state.inside.len(), 1, "a rejected begin does not enter");
        assert!(apply(&mut state, (1, 0), write(7, Phase::End)).accepted);
        assert!(state.inside.is_empty());
    }

    #[tokio::test]
    async fn a_withdrawn_linger_is_given_to_nobody() {
        let resource = Resource::start().await.unwrap();
        resource.request_linger(std::time::Duration::from_secs(9));
        assert!(resource.withdraw_linger().is_none());
        let reply = apply(&mut resource.state(), (0, 0), write(5, Phase::Begin));
        assert!(reply.accepted);
        assert_eq!(reply.linger_ms, 0, "the next holder does not linger");
        assert!(resource.lingering().is_none());

        // Taken before it was withdrawn: the holder lingers and is named.
        resource.request_linger(std::time::Duration::from_secs(9));
        apply(&mut resource.state(), (0, 0), write(5, Phase::End));
        let reply = apply(&mut resource.state(), (1, 0), write(6, Phase::Begin));
        assert_eq!(reply.linger_ms, 9_000);
        assert_eq!(resource.withdraw_linger().map(|(who, _)| who), Some((1, 0)));
    }

    #[tokio::test]
    async fn clients_talk_json_lines() {
        let resource = Resource::start().await.unwrap();
        let stream = TcpStream::connect(resource.addr()).await.unwrap();
        let (read, mut write_half) = stream.into_split();
        let mut lines = BufReader::new(read).lines();
        for request in [
            Request::Hello {
                client: 3,
                incarnation: 1,
                pid: 42,
            },
            write(9, Phase::Begin),
        ] {
            let mut line = serde_json::to_string(&request).unwrap();
            line.push('\n');
            write_half.write_all(line.as_bytes()).await.unwrap();
            let reply: Reply =
                serde_json::from_str(&lines.next_line().await.unwrap().unwrap()).unwrap();
            assert!(reply.accepted && !reply.stop);
        }
        assert_eq!(resource.inside()[0].0, (3, 1));
        assert_eq!(resource.inside()[0].1.token, 9);
        drop(write_half);
        drop(lines);
        for _ in 0..100 {
            if resource.inside().is_empty() {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        assert!(
            resource.inside().is_empty(),
            "a closed connection leaves the section"
        );
        assert!(resource.events().last().unwrap().request.is_none());
    }
}
