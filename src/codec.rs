//! The gRPC message codec: prost's, except that bytes which are not the expected message
//! are the caller's fault.
//!
//! tonic-prost answers a message that fails to decode with INTERNAL ("failed to decode
//! Protobuf message"), which tells a client (and our metrics) that the server broke when the
//! client sent garbage. Every generated service and client uses this codec instead
//! (`build.rs`, `codec_path`), which maps a decode failure to INVALID_ARGUMENT and leaves
//! everything else to prost. Encoding is prost's unchanged.

use std::marker::PhantomData;

use tonic::codec::{Codec, DecodeBuf, Decoder};
use tonic::Status;
use tonic_prost::{ProstCodec, ProstDecoder, ProstEncoder};

#[derive(Debug, Clone)]
pub struct ProtoCodec<T, U> {
    inner: ProstCodec<T, U>,
}

impl<T, U> Default for ProtoCodec<T, U> {
    fn default() -> Self {
        ProtoCodec {
            inner: ProstCodec::default(),
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
        self.inner.encoder()
    }

    fn decoder(&mut self) -> Self::Decoder {
        ProtoDecoder {
            inner: self.inner.decoder(),
            _message: PhantomData,
        }
    }
}

/// ProstDecoder's only error, the bytes are not a valid message, as the client's mistake.
/// Out of line: `decode` is compiled once per message type (111 of them).
#[inline(never)]
fn malformed(status: Status) -> Status {
    if status.code() == tonic::Code::Internal {
        Status::invalid_argument(format!("malformed request message: {}", status.message()))
    } else {
        status
    }
}

#[derive(Debug)]
pub struct ProtoDecoder<U> {
    inner: ProstDecoder<U>,
    _message: PhantomData<U>,
}

impl<U: prost::Message + Default> Decoder for ProtoDecoder<U> {
    type Item = U;
    type Error = Status;

    fn decode(&mut self, source: &mut DecodeBuf<'_>) -> Result<Option<U>, Status> {
        self.inner.decode(source).map_err(malformed)
    }

    fn buffer_settings(&self) -> tonic::codec::BufferSettings {
        self.inner.buffer_settings()
    }
}
