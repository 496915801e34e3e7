//! The domain error enum, and its mappings to HTTP (status and the REST error code), to gRPC,
//! and to the JSON error body every JSON surface answers with (`error_body`).
//!
//! Domain modules return `Error`; svc-server's REST, gRPC and bus replies translate it here,
//! with exhaustive matches, so a new variant is handled on each or the build fails.
//! svc-registry answers with the same status and body. Exit codes are mapped once, from `Error::code`, in
//! `program::exit::of_code` (the CLIs' layer-1 core), which the gRPC and HTTP statuses reach
//! through the same codes.

use std::time::Duration;

pub type Result<T, E = Error> = std::result::Result<T, E>;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{0}")]
    NotFound(String),
    /// The request could not be parsed (bad JSON, wrong shape): HTTP 400.
    #[error("{0}")]
    Malformed(String),
    /// The request parsed but a value is not acceptable: HTTP 422.
    #[error("{0}")]
    Invalid(String),
    /// A rule refused a value the request names (a webhook URL on the SSRF deny-list):
    /// answered as `Invalid` is (HTTP 422 `invalid_argument`, gRPC INVALID_ARGUMENT), but
    /// audited `denied`, not `error` (contract §9; `is_refusal`).
    #[error("{0}")]
    Refused(String),
    #[error("{0}")]
    Conflict(String),
    /// The change would break a rule the current state must keep (the last active admin
    /// key): HTTP 409, gRPC FailedPrecondition.
    #[error("{0}")]
    FailedPrecondition(String),
    #[error("{0}")]
    Unauthenticated(String),
    #[error("{0}")]
    Forbidden(String),
    #[error("rate limit exceeded; retry in {}s", retry_after.as_secs().max(1))]
    RateLimited { retry_after: Duration },
    /// The key already has `rate_limit.max_in_flight` requests in progress: HTTP 429.
    #[error("{0}")]
    TooManyInFlight(String),
    /// The client did not send its request (body) in time: HTTP 408, connection closed.
    #[error("{0}")]
    Timeout(String),
    /// A request body that is not `application/json`: HTTP 415.
    #[error("{0}")]
    UnsupportedMediaType(String),
    #[error("{0}")]
    TooLarge(String),
    /// A REST route exists but not for this method: HTTP 405 with `Allow: <allow>`.
    #[error("{message}")]
    MethodNotAllowed { message: String, allow: String },
    #[error("{0}")]
    Unavailable(String),
    /// The disk holding the data dir is full (ENOSPC, EDQUOT, SQLITE_FULL): HTTP 507, gRPC
    /// RESOURCE_EXHAUSTED, exit 1. Nothing was written; reads go on, and writes work again
    /// once space is freed, without a restart (docs/reliability.md, "Disk full").
    #[error("no space left on data_dir: {0}")]
    StorageFull(String),
    #[error("{0}: not implemented yet")]
    Unimplemented(String),
    /// The cause is logged; callers only ever see "internal error".
    #[error("internal error")]
    Internal(String),
}

impl Error {
    pub fn internal(cause: impl std::fmt::Display) -> Self {
        Error::Internal(cause.to_string())
    }

    /// The machine-readable code in REST error bodies.
    pub fn code(&self) -> &'static str {
        match self {
            Error::NotFound(_) => "not_found",
            Error::Malformed(_) => "bad_request",
            Error::Invalid(_) | Error::Refused(_) => "invalid_argument",
            Error::Conflict(_) => "conflict",
            Error::FailedPrecondition(_) => "failed_precondition",
            Error::Unauthenticated(_) => "unauthenticated",
            Error::Forbidden(_) => "permission_denied",
            Error::RateLimited { .. } => "rate_limited",
            Error::TooManyInFlight(_) => "too_many_in_flight",
            Error::Timeout(_) => "request_timeout",
            Error::UnsupportedMediaType(_) => "unsupported_media_type",
            Error::TooLarge(_) => "payload_too_large",
            Error::MethodNotAllowed { .. } => "method_not_allowed",
            Error::Unavailable(_) => "unavailable",
            Error::StorageFull(_) => "insufficient_storage",
            Error::Unimplemented(_) => "unimplemented",
            Error::Internal(_) => "internal",
        }
    }

    /// Whether this is a refusal (audited `denied`) rather than a failure (audited `error`),
    /// contract §9. A refusal is a rule saying no before anything was attempted: the caller's
    /// key or role, a rule on what the request names (`Refused`), a rule the current state
    /// must keep (`FailedPrecondition`: the last admin key, an online restore, a blueprint
    /// still applied, a cluster operation outside cluster mode), or an operation the server
    /// does not do by design (`Unimplemented`: policies are files, members join by
    /// themselves). Everything else is a failure:
    /// input that could not be used, something missing or in the way, a limit reached, the
    /// server or its storage failing. docs/reliability.md ("Audit outcomes") has the table.
    pub fn is_refusal(&self) -> bool {
        match self {
            Error::Forbidden(_)
            | Error::Unauthenticated(_)
            | Error::Refused(_)
            | Error::FailedPrecondition(_)
            | Error::Unimplemented(_) => true,
            Error::NotFound(_)
            | Error::Malformed(_)
            | Error::Invalid(_)
            | Error::Conflict(_)
            | Error::RateLimited { .. }
            | Error::TooManyInFlight(_)
            | Error::Timeout(_)
            | Error::UnsupportedMediaType(_)
            | Error::TooLarge(_)
            | Error::MethodNotAllowed { .. }
            | Error::Unavailable(_)
            | Error::StorageFull(_)
            | Error::Internal(_) => false,
        }
    }

    /// The JSON body that carries this error (`error_body`). `Internal` shows only
    /// "internal error": its cause is for the log.
    pub fn body(&self) -> serde_json::Value {
        error_body(self.code(), &self.to_string())
    }

    pub fn http_status(&self) -> u16 {
        match self {
            Error::NotFound(_) => 404,
            Error::Malformed(_) => 400,
            Error::Invalid(_) | Error::Refused(_) => 422,
            Error::Conflict(_) | Error::FailedPrecondition(_) => 409,
            Error::Unauthenticated(_) => 401,
            Error::Forbidden(_) => 403,
            Error::RateLimited { .. } | Error::TooManyInFlight(_) => 429,
            Error::Timeout(_) => 408,
            Error::UnsupportedMediaType(_) => 415,
            Error::TooLarge(_) => 413,
            Error::MethodNotAllowed { .. } => 405,
            Error::Unavailable(_) => 503,
            Error::StorageFull(_) => 507,
            Error::Unimplemented(_) => 501,
            Error::Internal(_) => 500,
        }
    }
}

/// `{"error":{"code":CODE,"message":MESSAGE}}`: the error body of REST (contract §4), the
/// console's event stream, the bus replies (enrolment, files) and svc-registry. Built here
/// only, so that a client reads every one of them the same way; `server/tls.rs` writes one
/// as fixed bytes, and its test holds them to this.
pub fn error_body(code: &str, message: &str) -> serde_json::Value {
    serde_json::json!({"error": {"code": code, "message": message}})
}

impl From<Error> for tonic::Status {
    fn from(error: Error) -> Self {
        if let Error::Internal(cause) = &error {
            tracing::error!(%cause, "internal error");
        }
        let message = error.to_string();
        match error {
            Error::NotFound(_) => tonic::Status::not_found(message),
            Error::Malformed(_)
            | Error::Invalid(_)
            | Error::Refused(_)
            | Error::UnsupportedMediaType(_) => tonic::Status::invalid_argument(message),
            Error::Conflict(_) => tonic::Status::already_exists(message),
            Error::FailedPrecondition(_) => tonic::Status::failed_precondition(message),
            Error::TooManyInFlight(_) => tonic::Status::resource_exhausted(message),
            Error::Timeout(_) => tonic::Status::deadline_exceeded(message),
            Error::Unauthenticated(_) => tonic::Status::unauthenticated(message),
            Error::Forbidden(_) => tonic::Status::permission_denied(message),
            Error::RateLimited { retry_after } => {
                let mut status = tonic::Status::resource_exhausted(message);
                if let Ok(value) = retry_after.as_secs().max(1).to_string().parse() {
                    status.metadata_mut().insert("retry-after", value);
                }
                status
            }
            Error::TooLarge(_) => tonic::Status::out_of_range(message),
            Error::Unavailable(_) => tonic::Status::unavailable(message),
            Error::StorageFull(_) => tonic::Status::resource_exhausted(message),
            Error::Unimplemented(_) | Error::MethodNotAllowed { .. } => {
                tonic::Status::unimplemented(message)
            }
            Error::Internal(_) => tonic::Status::internal(message),
        }
    }
}

/// A duplicate key is `Conflict` on every store driver (PostgreSQL's mapping is in
/// store/postgres.rs); anything else the database says is internal.
impl From<rusqlite::Error> for Error {
    fn from(error: rusqlite::Error) -> Self {
        match &error {
            rusqlite::Error::SqliteFailure(e, _)
                if e.extended_code == rusqlite::ffi::SQLITE_CONSTRAINT_UNIQUE
                    || e.extended_code == rusqlite::ffi::SQLITE_CONSTRAINT_PRIMARYKEY =>
            {
                Error::Conflict(format!("sqlite: {error}"))
            }
            // SQLite rolls the transaction back and the connection stays usable.
            rusqlite::Error::SqliteFailure(e, _) if e.code == rusqlite::ErrorCode::DiskFull => {
                Error::StorageFull(format!("sqlite: {error}"))
            }
            _ => Error::Internal(format!("sqlite: {error}")),
        }
    }
}

impl From<std::io::Error> for Error {
    fn from(error: std::io::Error) -> Self {
        if is_no_space(&error) {
            return Error::StorageFull(error.to_string());
        }
        Error::Internal(format!("io: {error}"))
    }
}

/// True for "the filesystem is full" and "the quota is used up".
pub fn is_no_space(error: &std::io::Error) -> bool {
    matches!(
        error.raw_os_error(),
        Some(libc::ENOSPC) | Some(libc::EDQUOT)
    )
}
