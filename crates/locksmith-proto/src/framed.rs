//! The session stream without HTTP/2 ("framed"): the same [`v1::ClientBatch`]
//! and [`v1::ServerBatch`] messages as the `Session` call, each behind a
//! 4-byte big-endian length, on a connection of its own to the server's port.
//!
//! Why a second transport for one call: at one client, HTTP/2 and gRPC are
//! about half of a session request's round trip on loopback (a gRPC stream
//! echo 59–71 µs against 33 µs for the same messages framed on TCP), and
//! they cost the server a third more CPU per trip (docs/BENCHMARKS.md, "What
//! HTTP/2 and gRPC cost"). A session stream uses none of what HTTP/2 adds
//! (streams multiplexed on one connection, flow control per stream, headers
//! per call): it is one long-lived, ordered exchange of messages, which TCP
//! already is. The unary calls and the `Sessions` stream stay on gRPC.
//!
//! ```text
//! client: MAGIC  FramedHello  ClientBatch  ClientBatch ...
//! server:        FramedServerFrame::accepted (or ::status, the end)
//!                FramedServerFrame::batch ...  FramedServerFrame::status
//! ```
//!
//! The server tells a framed connection from an HTTP/2 one by its first
//! bytes ([`MAGIC`] against HTTP/2's client preface), so both share one port,
//! and TLS when the port speaks it. The hello carries what the `Session`
//! call's headers carry (the bearer token); a status frame carries what its
//! trailers carry (code, message, the leader's address). The messages are
//! documented in `locksmith.proto`; this module is the encoding both ends
//! use, so that they cannot drift apart.
//!
//! The members' replication stream travels the same way (its own magic,
//! [`APPEND_MAGIC`], and frames of `raft.proto`); the members' other calls
//! stay on gRPC.
//!
//! [`v1::ClientBatch`]: crate::v1::ClientBatch
//! [`v1::ServerBatch`]: crate::v1::ServerBatch

use bytes::{BufMut, BytesMut};
use prost::Message;
use tokio_util::codec::LengthDelimitedCodec;
use tonic::metadata::{AsciiMetadataKey, AsciiMetadataValue, KeyAndValueRef, MetadataMap};
use tonic::{Code, Status};

use crate::raft;
use crate::v1 as pb;

/// The first bytes a framed session connection sends (after TLS, when on).
/// HTTP/2's preface starts `PRI *`, so the first byte tells them apart.
pub const MAGIC: &[u8; 12] = b"LOCKSMITH/1\n";

/// The first bytes of a member's framed replication stream
/// ([`raft::AppendFrame`]). It differs from [`MAGIC`] in its last
/// character but one, so a member older than the framed replication stream
/// refuses it at that byte.
///
/// [`raft::AppendFrame`]: crate::raft::AppendFrame
pub const APPEND_MAGIC: &[u8; 12] = b"LOCKSMITH/A\n";

/// Bytes of the length before each frame.
const LENGTH_BYTES: usize = 4;

/// The codec that cuts what a connection reads into frames, each at most
/// `max_frame` bytes (the message size limit gRPC would apply): a longer
/// one is an error ([`read_error`]) before its bytes are read.
pub fn codec(max_frame: usize) -> LengthDelimitedCodec {
    LengthDelimitedCodec::builder()
        .length_field_length(LENGTH_BYTES)
        .max_frame_length(max_frame)
        .new_codec()
}

/// Appends `message` to `buf` as one frame.
pub fn put_frame(buf: &mut BytesMut, message: &impl Message) {
    let len = message.encoded_len();
    buf.reserve(LENGTH_BYTES + len);
    buf.put_u32(u32::try_from(len).expect("a frame within 4 GiB"));
    message
        .encode(buf)
        .expect("the buffer was reserved for the message");
}

/// Decodes one frame's message; one that does not decode is the sender's
/// error (`INVALID_ARGUMENT`), as on the gRPC call (module `codec`).
pub fn decode<M: Message + Default>(frame: &[u8]) -> Result<M, Status> {
    M::decode(frame).map_err(|error| {
        Status::invalid_argument(format!("a framed message does not decode: {error}"))
    })
}

/// The status for an error of reading frames: a frame over the limit is
/// `OUT_OF_RANGE`, as gRPC's message limit; anything else is the
/// connection's failure (`UNAVAILABLE`, the error as its source, as tonic
/// gives a broken connection).
pub fn read_error(error: std::io::Error) -> Status {
    if error.kind() == std::io::ErrorKind::InvalidData {
        return Status::out_of_range(format!("a framed message is too large: {error}"));
    }
    connection_error(error)
}

/// A status for a failure of the connection itself, with `error` as its
/// source: what tells a broken connection from an answer of the server.
pub fn connection_error(error: std::io::Error) -> Status {
    let mut status = Status::unavailable(error.to_string());
    status.set_source(std::sync::Arc::new(error));
    status
}

/// The hello that carries `metadata` (its ASCII entries).
pub fn hello(metadata: &MetadataMap) -> pb::FramedHello {
    pb::FramedHello {
        headers: headers_of(metadata),
    }
}

/// The metadata a hello carries; a header that metadata cannot hold is
/// `INVALID_ARGUMENT`.
pub fn metadata_of(hello: pb::FramedHello) -> Result<MetadataMap, Status> {
    metadata(hello.headers).map_err(|name| {
        Status::invalid_argument(format!("the framed hello's header {name:?} is not valid"))
    })
}

/// The frame that ends a stream with `status`.
pub fn status_frame(status: &Status) -> pb::FramedServerFrame {
    pb::FramedServerFrame {
        kind: Some(pb::framed_server_frame::Kind::Status(pb::FramedStatus {
            code: status.code() as i32,
            message: status.message().to_owned(),
            metadata: headers_of(status.metadata()),
        })),
    }
}

/// The status a status frame carries. An entry metadata cannot hold is
/// left out (the server only sends valid ones).
pub fn status_of(frame: pb::FramedStatus) -> Status {
    let metadata = metadata(
        frame
            .metadata
            .into_iter()
            .filter(|h| {
                AsciiMetadataKey::from_bytes(h.name.as_bytes()).is_ok()
                    && AsciiMetadataValue::try_from(h.value.as_str()).is_ok()
            })
            .collect(),
    )
    .unwrap_or_default();
    Status::with_metadata(Code::from_i32(frame.code), frame.message, metadata)
}

/// The replication stream's frame that ends a session with `status`, and
/// says whether the connection closes after it; `seq` is the number of
/// the leader's frame that ended the session.
pub fn append_end(status: &Status, closing: bool, seq: u64) -> raft::AppendFrame {
    raft::AppendFrame {
        seq,
        kind: Some(raft::append_frame::Kind::End(raft::AppendEnd {
            code: status.code() as i32,
            message: status.message().to_owned(),
            closing,
        })),
    }
}

/// The status an end of a replication stream carries.
pub fn append_status(end: raft::AppendEnd) -> Status {
    Status::new(Code::from_i32(end.code), end.message)
}

fn headers_of(metadata: &MetadataMap) -> Vec<pb::FramedHeader> {
    metadata
        .iter()
        .filter_map(|entry| match entry {
            KeyAndValueRef::Ascii(key, value) => Some(pb::FramedHeader {
                name: key.as_str().to_owned(),
                value: value.to_str().ok()?.to_owned(),
            }),
            KeyAndValueRef::Binary(..) => None,
        })
        .collect()
}

/// The metadata of `headers`, or the name of the first that it cannot hold.
fn metadata(headers: Vec<pb::FramedHeader>) -> Result<MetadataMap, String> {
    let mut metadata = MetadataMap::new();
    for header in headers {
        let key = AsciiMetadataKey::from_bytes(header.name.as_bytes());
        let value = AsciiMetadataValue::try_from(header.value.as_str());
        match (key, value) {
            (Ok(key), Ok(value)) => {
                metadata.append(key, value);
            }
            _ => return Err(header.name),
        }
    }
    Ok(metadata)
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio_util::codec::Decoder;

    #[test]
    fn a_frame_reads_back_as_its_message() {
        let batch = pb::ServerBatch {
            messages: vec![pb::ServerMessage::default(); 3],
        };
        let mut buf = BytesMut::new();
        put_frame(&mut buf, &batch);
        put_frame(&mut buf, &batch);
        let mut codec = codec(1 << 20);
        for _ in 0..2 {
            let frame = codec.decode(&mut buf).unwrap().unwrap();
            assert_eq!(decode::<pb::ServerBatch>(&frame).unwrap(), batch);
        }
        assert!(buf.is_empty());
    }

    #[test]
    fn a_frame_over_the_limit_is_out_of_range() {
        let mut buf = BytesMut::new();
        buf.put_u32(1 << 20);
        let error = codec(1024).decode(&mut buf).unwrap_err();
        assert_eq!(read_error(error).code(), Code::OutOfRange);
    }

    #[test]
    fn a_status_keeps_its_code_message_and_metadata() {
        let mut metadata = MetadataMap::new();
        metadata.insert(crate::LEADER_METADATA, "10.0.0.2:7461".parse().unwrap());
        let sent = Status::with_metadata(Code::FailedPrecondition, "not the leader", metadata);
        let Some(pb::framed_server_frame::Kind::Status(frame)) = status_frame(&sent).kind else {
            panic!("a status frame");
        };
        let got = status_of(frame);
        assert_eq!(got.code(), Code::FailedPrecondition);
        assert_eq!(got.message(), "not the leader");
        assert_eq!(
            got.metadata().get(crate::LEADER_METADATA).unwrap(),
            "10.0.0.2:7461"
        );
        assert!(std::error::Error::source(&got).is_none());
    }

    #[test]
    fn a_hello_carries_the_token_and_refuses_what_metadata_cannot_hold() {
        let mut metadata = MetadataMap::new();
        metadata.insert("authorization", "Bearer abc".parse().unwrap());
        let got = metadata_of(hello(&metadata)).unwrap();
        assert_eq!(got.get("authorization").unwrap(), "Bearer abc");
        let bad = pb::FramedHello {
            headers: vec![pb::FramedHeader {
                name: "authorization".into(),
                value: "line\nbreak".into(),
            }],
        };
        assert_eq!(metadata_of(bad).unwrap_err().code(), Code::InvalidArgument);
    }
}
