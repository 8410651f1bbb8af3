//! Hosts in network namespaces on one machine, joined by a bridge: for tests
//! of what crosses a network, such as a member of a cluster cut off from its
//! peers while its clients still reach it.
//!
//! Each host is a network namespace with one address on a private /24; the
//! machine itself (where the test and its clients run) has the bridge's
//! address on the same /24 and reaches every host. [`Network::cut`] drops all
//! traffic between two hosts (a blackhole route on each side), and
//! [`Network::heal`] restores it; traffic between the machine and the hosts
//! is never touched. Processes run in a host through [`Host::command`]
//! (`ip netns exec`).
//!
//! Needs root and iproute2 (`ip`). Everything is removed on drop.

use std::net::Ipv4Addr;
use std::path::PathBuf;
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};

use crate::error::{Error, Result};
use crate::process::ProcessSpec;

/// A bridge and hosts attached to it.
#[derive(Debug)]
pub struct Network {
    bridge: String,
    hosts: Vec<Host>,
    gateway: Ipv4Addr,
}

/// One host: a network namespace and its address.
#[derive(Debug, Clone)]
pub struct Host {
    /// The namespace's name.
    pub namespace: String,
    /// Its address, reachable from the machine and the other hosts.
    pub ip: Ipv4Addr,
}

impl Host {
    /// The command line prefix that runs a program in this host:
    /// `ip netns exec <namespace>`; the program and its arguments follow.
    pub fn command(&self) -> (String, Vec<String>) {
        (
            "ip".into(),
            vec!["netns".into(), "exec".into(), self.namespace.clone()],
        )
    }
}

/// Where a member of a replicated setup listens: its host's address, or
/// loopback ([`crate::HOST`]) when it runs on this machine's own network.
pub(crate) fn address(host: Option<&Host>) -> Ipv4Addr {
    host.map_or(Ipv4Addr::LOCALHOST, |h| h.ip)
}

/// A process that runs `program` in `host` (through `ip netns exec`, which
/// execs it, so signals reach the program itself), or here for `None`.
pub(crate) fn spec(
    host: Option<&Host>,
    name: String,
    program: PathBuf,
    log: PathBuf,
) -> ProcessSpec {
    match host {
        None => ProcessSpec::new(name, program, log),
        Some(host) => {
            let (ip, prefix) = host.command();
            ProcessSpec::new(name, ip, log).args(prefix).arg(program)
        }
    }
}

/// The hosts of a setup whose members each run on a host of their own
/// (`network` given), or `None` for every member on loopback, `count` long.
pub(crate) fn hosts(network: Option<&Network>, count: usize) -> Vec<Option<&Host>> {
    match network {
        Some(network) => network.hosts().iter().take(count).map(Some).collect(),
        None => vec![None; count],
    }
}

/// Runs `ip` with `args`, failing with its output.
fn ip(args: &[&str]) -> Result<()> {
    let output = Command::new("ip").args(args).output().map_err(|e| {
        if e.kind() == std::io::ErrorKind::NotFound {
            Error::NotInstalled {
                name: "ip".into(),
                looked_in: "on PATH".into(),
                package: "iproute2".into(),
            }
        } else {
            Error::Io {
                context: "cannot run ip".into(),
                source: e,
            }
        }
    })?;
    if output.status.success() {
        return Ok(());
    }
    Err(Error::Command {
        command: format!("ip {}", args.join(" ")),
        status: output.status.to_string(),
        output: String::from_utf8_lossy(&output.stderr).into_owned(),
    })
}

impl Network {
    /// Creates `hosts` hosts on a new bridge (needs root).
    pub fn create(hosts: usize) -> Result<Network> {
        static NEXT: AtomicU32 = AtomicU32::new(0);
        let unique = std::process::id() % 100_000 * 10 + NEXT.fetch_add(1, Ordering::Relaxed) % 10;
        // A /24 of 10.0.0.0/8 picked by the unique number, so that parallel
        // test processes do not share one.
        let (a, b) = (100 + (unique / 256 % 100) as u8, (unique % 256) as u8);
        let bridge = format!("lsb{unique}");
        let gateway = Ipv4Addr::new(10, a, b, 1);
        let mut network = Network {
            bridge: bridge.clone(),
            hosts: Vec::new(),
            gateway,
        };
        ip(&["link", "add", &bridge, "type", "bridge"])?;
        ip(&["addr", "add", &format!("{gateway}/24"), "dev", &bridge])?;
        ip(&["link", "set", &bridge, "up"])?;
        for i in 0..hosts {
            let namespace = format!("ls{unique}-{i}");
            let (outside, inside) = (format!("lsv{unique}o{i}"), format!("lsv{unique}i{i}"));
            let address = Ipv4Addr::new(10, a, b, 10 + i as u8);
            ip(&["netns", "add", &namespace])?;
            network.hosts.push(Host {
                namespace: namespace.clone(),
                ip: address,
            });
            ip(&[
                "link", "add", &outside, "type", "veth", "peer", "name", &inside,
            ])?;
            ip(&["link", "set", &inside, "netns", &namespace])?;
            ip(&["link", "set", &outside, "master", &bridge, "up"])?;
            ip(&[
                "-n",
                &namespace,
                "addr",
                "add",
                &format!("{address}/24"),
                "dev",
                &inside,
            ])?;
            ip(&["-n", &namespace, "link", "set", &inside, "up"])?;
            ip(&["-n", &namespace, "link", "set", "lo", "up"])?;
        }
        Ok(network)
    }

    /// The hosts, in order.
    pub fn hosts(&self) -> &[Host] {
        &self.hosts
    }

    /// The machine's own address on the bridge.
    pub fn gateway(&self) -> Ipv4Addr {
        self.gateway
    }

    /// Drops all traffic between hosts `a` and `b`, both ways.
    pub fn cut(&self, a: usize, b: usize) -> Result<()> {
        self.blackhole("add", a, b)
    }

    /// Lets hosts `a` and `b` reach each other again.
    pub fn heal(&self, a: usize, b: usize) -> Result<()> {
        self.blackhole("del", a, b)
    }

    fn blackhole(&self, action: &str, a: usize, b: usize) -> Result<()> {
        for (from, to) in [(a, b), (b, a)] {
            let target = format!("{}/32", self.hosts[to].ip);
            ip(&[
                "-n",
                &self.hosts[from].namespace,
                "route",
                action,
                "blackhole",
                &target,
            ])?;
        }
        Ok(())
    }
}

impl Drop for Network {
    fn drop(&mut self) {
        for host in &self.hosts {
            let _ = ip(&["netns", "del", &host.namespace]);
        }
        let _ = ip(&["link", "del", &self.bridge]);
    }
}
