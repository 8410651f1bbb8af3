//! The protobuf codec of the generated client and server: prost's, except
//! that a message which does not decode is the sender's error.
//!
//! `tonic-prost` answers a malformed message (a string that is not UTF-8, a
//! truncated field) with `INTERNAL`, which clients treat as a server failure
//! worth retrying. The same bytes fail the same way every time, so the
//! server says `INVALID_ARGUMENT` instead; encoding is unchanged.
//!
//! Its buffers start at [`BUFFER_BYTES`] rather than tonic's 8 KiB: every
//! session stream keeps one buffer each way for as long as it lives, and
//! most streams are idle sessions exchanging heartbeats of a few bytes; a
//! stream that sends more grows its buffers as it needs (by doubling, and
//! reused in place once what was sent from them is written), so a big
//! message costs a few more allocations, not a slower stream
//! (docs/BENCHMARKS.md, "Codec buffers of 128 bytes").

use std::marker::PhantomData;

use tonic::codec::{BufferSettings, Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};
use tonic::{Code, Status};
use tonic_prost::{ProstCodec, ProstDecoder, ProstEncoder};

/// The bytes each way a stream's buffers start at (see the module docs).
pub const BUFFER_BYTES: usize = 128;

/// Buffers of [`BUFFER_BYTES`], yielding at tonic's threshold (32 KiB).
fn buffer_settings() -> BufferSettings {
    BufferSettings::new(BUFFER_BYTES, 32 * 1024)
}

/// prost encoding, with decode errors answered as `INVALID_ARGUMENT`.
#[derive(Debug, Clone)]
pub struct ProtoCodec<T, U> {
    _types: PhantomData<(T, U)>,
}

impl<T, U> Default for ProtoCodec<T, U> {
    fn default() -> Self {
        ProtoCodec {
            _types: PhantomData,
        }
    }
}

impl<T, U> Codec for ProtoCodec<T, U>
where
    T: prost::Message + Send + 'static,
    U: prost::Message + Default + Send + 'static,
{
    type Encode = T;
    type Decode = U;
    type Encoder = ProtoEncoder<T>;
    type Decoder = ProtoDecoder<U>;

    fn encoder(&mut self) -> Self::Encoder {
        ProtoEncoder(ProstCodec::<T, U>::default().encoder())
    }

    fn decoder(&mut self) -> Self::Decoder {
        ProtoDecoder(ProstCodec::<T, U>::default().decoder())
    }
}

/// prost's encoder, with small buffers to start.
#[derive(Debug, Clone)]
pub struct ProtoEncoder<T>(ProstEncoder<T>);

impl<T: prost::Message> Encoder for ProtoEncoder<T> {
    type Item = T;
    type Error = Status;

    fn encode(&mut self, item: T, dst: &mut EncodeBuf<'_>) -> Result<(), Status> {
        self.0.encode(item, dst)
    }

    fn buffer_settings(&self) -> BufferSettings {
        buffer_settings()
    }
}

/// prost's decoder with the status code of its errors changed, and small
/// buffers to start.
#[derive(Debug, Clone)]
pub struct ProtoDecoder<U>(ProstDecoder<U>);

impl<U: prost::Message + Default> Decoder for ProtoDecoder<U> {
    type Item = U;
    type Error = Status;

    fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<U>, Status> {
        self.0.decode(src).map_err(|status| {
            Status::new(
                Code::InvalidArgument,
                format!("malformed message: {}", status.message()),
            )
        })
    }

    fn buffer_settings(&self) -> BufferSettings {
        buffer_settings()
    }
}
