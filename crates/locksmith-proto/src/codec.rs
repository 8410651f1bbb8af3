//! The protobuf codec of the generated client and server: prost's, except
//! that a message which does not decode is the sender's error.
//!
//! `tonic-prost` answers a malformed message (a string that is not UTF-8, a
//! truncated field) with `INTERNAL`, which clients treat as a server failure
//! worth retrying. The same bytes fail the same way every time, so the
//! server says `INVALID_ARGUMENT` instead; encoding is unchanged.

use std::marker::PhantomData;

use tonic::codec::{Codec, DecodeBuf, Decoder};
use tonic::{Code, Status};
use tonic_prost::{ProstCodec, ProstDecoder, ProstEncoder};

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
    type Encoder = ProstEncoder<T>;
    type Decoder = ProtoDecoder<U>;

    fn encoder(&mut self) -> Self::Encoder {
        ProstCodec::<T, U>::default().encoder()
    }

    fn decoder(&mut self) -> Self::Decoder {
        ProtoDecoder(ProstCodec::<T, U>::default().decoder())
    }
}

/// prost's decoder with the status code of its errors changed.
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

    fn buffer_settings(&self) -> tonic::codec::BufferSettings {
        self.0.buffer_settings()
    }
}
