//! Which transport carries a session stream: framed on a connection of its
//! own (module `framed_connection`, the default) or the gRPC `Session` call
//! (module `stream_connection`), as the URL's `session_transport` says. The
//! session (module `session`) sees the same batches and statuses from both.

use locksmith_proto::transport::Connector;
use locksmith_proto::v1 as pb;
use tonic::Status;

use super::url::{ServerUrl, SessionTransport};
use super::{framed_connection, stream_connection};

/// The inbound half of a session stream, on either transport.
pub(super) enum Inbound {
    Framed(framed_connection::Inbound),
    Grpc(stream_connection::Inbound),
}

impl Inbound {
    /// The next batch (sending what the session queued meanwhile); `None`
    /// once the server ended the stream without an error.
    ///
    /// Cancel safety: safe, as each transport's.
    pub(super) async fn message(&mut self) -> Result<Option<pb::ServerBatch>, Status> {
        match self {
            Inbound::Framed(inbound) => inbound.message().await,
            Inbound::Grpc(inbound) => inbound.message().await,
        }
    }
}

/// Opens a session stream to `addr` on the URL's transport, sending what
/// `outbound` yields.
///
/// Cancel safety: safe; a dropped open closes what it opened.
pub(super) async fn open(
    addr: &str,
    url: &ServerUrl,
    connector: Option<&Connector>,
    outbound: impl futures::Stream<Item = pb::ClientBatch> + Send + 'static,
) -> Result<Inbound, Status> {
    Ok(match url.session_transport() {
        SessionTransport::Framed => {
            Inbound::Framed(framed_connection::open(addr, url, connector, outbound).await?)
        }
        SessionTransport::Grpc => {
            Inbound::Grpc(stream_connection::open(addr, url, connector, outbound).await?)
        }
    })
}
