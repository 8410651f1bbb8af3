//! Idle sessions on etcd: leases, each renewed on a keep-alive stream of its
//! own (`Lease.LeaseKeepAlive`, as a client process keeps its one lease),
//! many streams to a connection, the connections spread over the members.

use futures::channel::mpsc;
use locksmith_proto::etcd::etcdserverpb::lease_client::LeaseClient;
use locksmith_proto::etcd::etcdserverpb::{
    LeaseGrantRequest, LeaseKeepAliveRequest, LeaseKeepAliveResponse,
};
use tokio::task::JoinSet;
use tonic::transport::Channel;
use tonic::Streaming;

use super::{open_by_connection, Plan, Renew, Shared};

/// Grants the plan's leases, opens their keep-alive streams and spawns
/// their keepers.
///
/// Cancel safety: dropped, the leases granted so far live until their TTL.
pub(super) async fn open(
    hosts: &[String],
    plan: &Plan,
    shared: &Shared,
    keepers: &mut JoinSet<Result<(), String>>,
) -> Result<(&'static str, usize), String> {
    let ttl_secs = plan.ttl.as_secs().max(1) as i64;
    let per_connection = plan.per_connection.max(1);
    open_by_connection(plan, shared, keepers, |first, last| {
        // The connections go round the members, as a client's balancer would.
        let host = hosts[first / per_connection % hosts.len()].clone();
        async move {
            let channel = Channel::from_shared(format!("http://{host}"))
                .map_err(|e| e.to_string())?
                .connect()
                .await
                .map_err(|e| format!("connect to {host}: {e}"))?;
            futures::future::try_join_all(
                (first..last).map(|_| Lease::grant(channel.clone(), ttl_secs)),
            )
            .await
        }
    })
    .await?;
    Ok(("lease + keep-alive stream", per_connection))
}

/// One lease and its keep-alive stream.
struct Lease {
    id: i64,
    requests: mpsc::UnboundedSender<LeaseKeepAliveRequest>,
    responses: Streaming<LeaseKeepAliveResponse>,
}

impl Lease {
    /// Grants a lease of `ttl_secs` and opens its keep-alive stream with a
    /// first renewal (etcd answers the call only with a response, which
    /// needs a request).
    ///
    /// Cancel safety: dropped, a lease granted so far lives until its TTL.
    async fn grant(channel: Channel, ttl_secs: i64) -> Result<Lease, String> {
        let mut client = LeaseClient::new(channel);
        let id = client
            .lease_grant(LeaseGrantRequest {
                ttl: ttl_secs,
                id: 0,
            })
            .await
            .map_err(|status| format!("lease grant: {}", status.message()))?
            .into_inner()
            .id;
        let (requests, outgoing) = mpsc::unbounded();
        let _ = requests.unbounded_send(LeaseKeepAliveRequest { id });
        let responses = client
            .lease_keep_alive(outgoing)
            .await
            .map_err(|status| format!("keep-alive: {}", status.message()))?
            .into_inner();
        let mut lease = Lease {
            id,
            requests,
            responses,
        };
        lease.answer().await?;
        Ok(lease)
    }

    /// The next keep-alive answer: the lease still lives, or why not.
    ///
    /// Cancel safety: not cancel safe; a dropped wait may leave its answer
    /// on the stream, so the stream goes with it.
    async fn answer(&mut self) -> Result<(), String> {
        match self.responses.message().await {
            Ok(Some(response)) if response.ttl > 0 => Ok(()),
            Ok(Some(_)) => Err(format!("lease {:x} expired", self.id)),
            Ok(None) => Err("the keep-alive stream ended".into()),
            Err(status) => Err(format!("keep-alive: {}", status.message())),
        }
    }
}

impl Renew for Lease {
    async fn renew(&mut self) -> Result<(), String> {
        self.requests
            .unbounded_send(LeaseKeepAliveRequest { id: self.id })
            .map_err(|_| "the keep-alive stream is closed".to_owned())?;
        self.answer().await
    }

    /// Leaves the lease to its TTL: the store is stopped with the run.
    async fn close(self) {}
}
