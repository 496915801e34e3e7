//! The tower layer that authenticates every svc.v1 call before its handler runs.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context as TaskContext, Poll};

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
    B: Send + 'static,
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
            match context.domain.authenticate(header).await {
                Ok(principal) => {
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
