//! The tower layer that authenticates every svc.v1 call and checks its role before its
//! handler runs, before tonic decodes the request message: a key whose role the method's row
//! in `auth::access::GRPC` does not admit gets PERMISSION_DENIED and, for a method in
//! `access::AUDITED`, a `denied` audit row, whatever the message holds (or fails to).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context as TaskContext, Poll};
use std::time::Duration;

use crate::auth::access::ResourceId;
use crate::server::Context;

#[derive(Clone)]
pub struct AuthLayer {
    context: Arc<Context>,
}

impl AuthLayer {
    pub fn new(context: Arc<Context>) -> Self {
        AuthLayer { context }
    }
}

impl<S> tower::Layer<S> for AuthLayer {
    type Service = AuthService<S>;
    fn layer(&self, inner: S) -> Self::Service {
        AuthService {
            inner,
            context: self.context.clone(),
        }
    }
}

#[derive(Clone)]
pub struct AuthService<S> {
    inner: S,
    context: Arc<Context>,
}

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

impl<S, B> tower::Service<http::Request<B>> for AuthService<S>
where
    S: tower::Service<http::Request<B>, Response = http::Response<tonic::body::Body>>
        + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
    B: hyper::body::Body<Data = bytes::Bytes> + Unpin + Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = BoxFuture<Result<Self::Response, Self::Error>>;

    fn poll_ready(&mut self, cx: &mut TaskContext<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut request: http::Request<B>) -> Self::Future {
        // The service that was polled ready is the one to call; leave a clone in its place.
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let context = self.context.clone();
        let path = request.uri().path().to_string();
        let span = crate::server::request_span("grpc", &path, &crate::server::request_id());
        let call = async move {
            if !path.starts_with("/svc.v1.") {
                return inner.call(request).await;
            }
            let header = request
                .headers()
                .get("authorization")
                .map(|value| value.to_str().unwrap_or(""));
            // admit: the key, its rate limit and its slot among rate_limit.max_in_flight (as
            // REST's `principal`), held until the response head is made; past the cap the
            // call gets RESOURCE_EXHAUSTED.
            match context.domain.admit(header).await {
                Ok((principal, _admission)) => {
                    // A method without a row is not a method: tonic answers UNIMPLEMENTED.
                    let access = crate::auth::access::grpc_access(&path);
                    let refused = access.and_then(|access| {
                        let checked = super::super::role_check(&principal, access);
                        checked.err().map(|refusal| (access, refusal))
                    });
                    if let Some((access, refusal)) = refused {
                        let found = match crate::auth::access::audited(&path).map(|a| a.id) {
                            Some(ResourceId::Field(field)) => {
                                field_of(&path, field, request.into_body()).await
                            }
                            _ => None,
                        };
                        super::super::audit_role_refusal(
                            &context.domain,
                            &principal,
                            &path,
                            access,
                            &refusal,
                            found,
                        )
                        .await;
                        let status = tonic::Status::from(refusal);
                        context.metrics.record_grpc(&path, code_name(status.code()));
                        return Ok(status.into_http());
                    }
                    request.extensions_mut().insert(principal);
                    let response = inner.call(request).await?;
                    let code = grpc_code_name(response.headers());
                    context.metrics.record_grpc(&path, code);
                    Ok(response)
                }
                Err(error) => {
                    let status = tonic::Status::from(error);
                    context.metrics.record_grpc(&path, code_name(status.code()));
                    Ok(status.into_http())
                }
            }
        };
        Box::pin(tracing::Instrument::instrument(call, span))
    }
}

/// How much of a refused request is read for its audit row's resource id, and for how long:
/// the id fields come first in their messages, and a refusal never waits on a slow body.
const REFUSED_READ_LIMIT: usize = 64 * 1024;
const REFUSED_READ_TIME: Duration = Duration::from_secs(1);

/// The string field `field` of the request message of `method`, read from the body of a
/// refused call: None when the body is not a readable, uncompressed message that has it.
async fn field_of<B>(method: &str, field: &str, mut body: B) -> Option<String>
where
    B: hyper::body::Body<Data = bytes::Bytes> + Unpin,
{
    use http_body_util::BodyExt;
    let number = field_number(method, field)?;
    let mut bytes = Vec::new();
    let read = async {
        while let Some(Ok(frame)) = body.frame().await {
            if let Ok(data) = frame.into_data() {
                bytes.extend_from_slice(&data);
            }
            if bytes.len() >= REFUSED_READ_LIMIT
                || message_of(&bytes).is_some_and(|(whole, _)| whole)
            {
                break;
            }
        }
    };
    let _ = tokio::time::timeout(REFUSED_READ_TIME, read).await;
    let (_, message) = message_of(&bytes)?;
    string_field(message, number)
}

/// The message in gRPC framing (a compressed flag, a 4-byte length, the message): whether it
/// is all there, and what there is of it. None for a compressed or too short one.
fn message_of(bytes: &[u8]) -> Option<(bool, &[u8])> {
    let header = bytes.get(..5)?;
    if header[0] != 0 {
        return None;
    }
    let length = u32::from_be_bytes([header[1], header[2], header[3], header[4]]) as usize;
    let rest = &bytes[5..];
    Some((rest.len() >= length, &rest[..length.min(rest.len())]))
}

/// The number of the string field `field` of `method`'s request message, from the compiled
/// descriptors.
fn field_number(method: &str, field: &str) -> Option<u32> {
    use prost::Message;
    use prost_types::field_descriptor_proto::Type;
    static SET: std::sync::OnceLock<prost_types::FileDescriptorSet> = std::sync::OnceLock::new();
    let set = SET.get_or_init(|| {
        prost_types::FileDescriptorSet::decode(crate::proto::FILE_DESCRIPTOR_SET)
            .unwrap_or_default()
    });
    let (service, method) = method.trim_start_matches('/').split_once('/')?;
    let input = set.file.iter().find_map(|file| {
        file.service
            .iter()
            .filter(|s| format!("{}.{}", file.package(), s.name()) == service)
            .flat_map(|s| &s.method)
            .find(|m| m.name() == method)
            .map(|m| m.input_type().to_string())
    })?;
    let message = set.file.iter().find_map(|file| {
        file.message_type
            .iter()
            .find(|m| format!(".{}.{}", file.package(), m.name()) == input)
    })?;
    message
        .field
        .iter()
        .find(|f| f.name() == field && f.r#type() == Type::String)
        .and_then(|f| u32::try_from(f.number()).ok())
}

/// The last value of string field `number` in a protobuf message (the last one wins, as
/// when decoding), read as far as the bytes go.
fn string_field(message: &[u8], number: u32) -> Option<String> {
    fn varint(bytes: &[u8], at: &mut usize) -> Option<u64> {
        let mut value = 0u64;
        for shift in (0..64).step_by(7) {
            let byte = *bytes.get(*at)?;
            *at += 1;
            value |= u64::from(byte & 0x7f) << shift;
            if byte & 0x80 == 0 {
                return Some(value);
            }
        }
        None
    }
    let mut found = None;
    let mut at = 0;
    while at < message.len() {
        let Some(key) = varint(message, &mut at) else {
            break;
        };
        let skip = match key & 7 {
            0 => varint(message, &mut at).map(|_| 0),
            1 => Some(8),
            2 => {
                let Some(length) = varint(message, &mut at).and_then(|l| usize::try_from(l).ok())
                else {
                    break;
                };
                let Some(value) = at.checked_add(length).and_then(|end| message.get(at..end))
                else {
                    break;
                };
                if key >> 3 == u64::from(number) {
                    found = std::str::from_utf8(value).ok().map(str::to_string);
                }
                Some(length)
            }
            5 => Some(4),
            _ => None,
        };
        match skip {
            Some(skip) => at = at.saturating_add(skip),
            None => break,
        }
    }
    found
}

/// The code of a unary response (a trailers-only error puts `grpc-status` in the headers;
/// a successful or streaming response has it in trailers, which count as "ok" here).
fn grpc_code_name(headers: &http::HeaderMap) -> &'static str {
    headers
        .get("grpc-status")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<i32>().ok())
        .map(|code| code_name(tonic::Code::from(code)))
        .unwrap_or("ok")
}

fn code_name(code: tonic::Code) -> &'static str {
    match code {
        tonic::Code::Ok => "ok",
        tonic::Code::InvalidArgument => "invalid_argument",
        tonic::Code::NotFound => "not_found",
        tonic::Code::AlreadyExists => "already_exists",
        tonic::Code::PermissionDenied => "permission_denied",
        tonic::Code::Unauthenticated => "unauthenticated",
        tonic::Code::ResourceExhausted => "resource_exhausted",
        tonic::Code::FailedPrecondition => "failed_precondition",
        tonic::Code::DeadlineExceeded => "deadline_exceeded",
        tonic::Code::Unimplemented => "unimplemented",
        tonic::Code::Unavailable => "unavailable",
        tonic::Code::Internal => "internal",
        _ => "other",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::auth::access::{self, AUDITED};
    use crate::proto;

    /// Every `Field` of `access::AUDITED` names a string field of its method's request.
    #[test]
    fn every_audited_field_is_a_string_of_its_request() {
        for (method, audited) in AUDITED {
            if let ResourceId::Field(field) = audited.id {
                assert!(
                    field_number(method, field).is_some(),
                    "{method}: its request has no string field '{field}'"
                );
            }
        }
        assert_eq!(field_number("/svc.v1.FleetService/SetLabels", "nope"), None);
        assert_eq!(field_number("/svc.v1.Nope/SetLabels", "id"), None);
        assert!(access::audited("/svc.v1.FleetService/SetLabels").is_some());
    }

    fn framed(message: &[u8]) -> Vec<u8> {
        let mut bytes = vec![0];
        bytes.extend_from_slice(&(message.len() as u32).to_be_bytes());
        bytes.extend_from_slice(message);
        bytes
    }

    #[test]
    fn a_field_is_read_from_what_arrived_of_a_message() {
        use prost::Message;
        let request = proto::SetLabelsRequest {
            id: "db-1".into(),
            set: [("role".to_string(), "web".to_string())].into(),
            remove: vec!["x".into()],
        };
        let number = field_number("/svc.v1.FleetService/SetLabels", "id").unwrap();
        let bytes = framed(&request.encode_to_vec());
        let (whole, message) = message_of(&bytes).unwrap();
        assert!(whole);
        assert_eq!(string_field(message, number).as_deref(), Some("db-1"));
        // Cut short after the id: still found; cut inside it, or garbage: none, no panic.
        let (whole, message) = message_of(&bytes[..5 + 6 + 2]).unwrap();
        assert!(!whole);
        assert_eq!(string_field(message, number).as_deref(), Some("db-1"));
        assert_eq!(string_field(&message[..4], number), None);
        assert_eq!(string_field(&[0xff; 12], number), None);
        assert_eq!(string_field(&[], number), None);
        assert_eq!(message_of(&[0, 0, 0]), None);
        assert_eq!(message_of(&[1, 0, 0, 0, 0]), None, "compressed");
        // Another field number, a later value: the last one wins.
        let later = [request.encode_to_vec(), vec![10, 2, b'w', b'2']].concat();
        assert_eq!(string_field(&later, number).as_deref(), Some("w2"));
    }
}
