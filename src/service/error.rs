//! `ApiError`: every failure of the reference service as RFC 9457 problem+json with a
//! stable `type` from the contract's table.

use std::time::Duration;

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::json;

use crate::document::DocumentError;
use crate::routing::{LockError, RoutingError};

/// Prefix of every problem `type`.
pub const TYPE_PREFIX: &str = "urn:lockprobe:error:";

/// `Retry-After` of an `outcome-unknown` answer: the store's late writes land within
/// seconds, and a repeat tells the caller what happened.
pub const OUTCOME_UNKNOWN_RETRY: Duration = Duration::from_secs(1);

/// An error answer of the service.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiError {
    /// HTTP status.
    pub status: StatusCode,
    /// Stable type name (after [`TYPE_PREFIX`]).
    pub kind: &'static str,
    /// Human-readable detail; generic for 5xx.
    pub detail: String,
    /// For 423: when to retry.
    pub retry_after: Option<Duration>,
    /// What went wrong inside, for the log; never shown to the caller.
    pub cause: Option<String>,
}

impl ApiError {
    fn new(status: StatusCode, kind: &'static str, detail: impl Into<String>) -> Self {
        Self { status, kind, detail: detail.into(), retry_after: None, cause: None }
    }

    fn caused_by(self, cause: impl std::fmt::Display) -> Self {
        Self { cause: Some(cause.to_string()), ..self }
    }

    /// 400 `bad-request`.
    pub fn bad_request(detail: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "bad-request", detail)
    }

    /// 401 `unauthorized`.
    pub fn unauthorized() -> Self {
        Self::new(StatusCode::UNAUTHORIZED, "unauthorized", "the lock API needs Authorization: Bearer <key>")
    }

    /// 403 `forbidden`.
    pub fn forbidden() -> Self {
        Self::new(StatusCode::FORBIDDEN, "forbidden", "the lock API key is not valid")
    }

    /// 401 `unauthorized` on an admin route.
    pub fn admin_unauthorized() -> Self {
        Self::new(StatusCode::UNAUTHORIZED, "unauthorized", "admin routes need Authorization: Bearer <admin key>")
    }

    /// 403 `forbidden` on an admin route: the key is no admin principal's (the lock
    /// API's key is not an admin key).
    pub fn admin_forbidden() -> Self {
        Self::new(StatusCode::FORBIDDEN, "forbidden", "the key is not an admin principal's")
    }

    /// 403 `admin-out-of-scope`: the principal may not act on this resource.
    pub fn admin_out_of_scope(principal: &str) -> Self {
        Self::new(
            StatusCode::FORBIDDEN,
            "admin-out-of-scope",
            format!("admin principal {principal:?} may not act on this resource (outside its prefixes or the service's test prefix)"),
        )
    }

    /// 409 `force-release-void`: the approval found the lock changed (another token, a
    /// later phase, or none); the request is closed and nothing was removed.
    pub fn force_release_void() -> Self {
        Self::new(
            StatusCode::CONFLICT,
            "force-release-void",
            "the lock changed since the request (another token, a later phase, or no lock): the request is closed as void and nothing was removed",
        )
    }

    /// 403 `not-test-resource`.
    pub fn not_test_resource(prefix: &str) -> Self {
        Self::new(
            StatusCode::FORBIDDEN,
            "not-test-resource",
            format!("the lock API only accepts resource ids starting with {prefix:?}"),
        )
    }

    /// 404 `not-found`.
    pub fn not_found(what: impl Into<String>) -> Self {
        Self::new(StatusCode::NOT_FOUND, "not-found", what)
    }

    /// 500 `internal`: a fault of this service; `cause` is logged, never shown.
    pub fn internal(cause: impl std::fmt::Display) -> Self {
        Self::new(StatusCode::INTERNAL_SERVER_ERROR, "internal", "the service failed to handle this request")
            .caused_by(cause)
    }

    /// 405 `method-not-allowed`; the router adds the `Allow` header.
    pub fn method_not_allowed() -> Self {
        Self::new(
            StatusCode::METHOD_NOT_ALLOWED,
            "method-not-allowed",
            "this route does not take this method; the Allow header lists those it takes",
        )
    }

    /// 413 `payload-too-large`.
    pub fn too_large(limit: usize) -> Self {
        Self::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "payload-too-large",
            format!("request bodies are limited to {limit} bytes"),
        )
    }

    /// 423 `lock-held` with `Retry-After`.
    pub fn locked(detail: impl Into<String>, retry_after: Duration) -> Self {
        Self { retry_after: Some(retry_after), ..Self::new(StatusCode::LOCKED, "lock-held", detail) }
    }

    /// The full `type` URI.
    pub fn type_uri(&self) -> String {
        format!("{TYPE_PREFIX}{}", self.kind)
    }
}

/// Whole seconds for `Retry-After`, at least one (zero would invite a busy loop).
pub fn retry_after_secs(d: Duration) -> u64 {
    d.as_secs() + u64::from(d.subsec_nanos() > 0).max(u64::from(d.is_zero()))
}

impl From<RoutingError> for ApiError {
    fn from(e: RoutingError) -> Self {
        match e {
            RoutingError::Lock(lock) => lock.into(),
            RoutingError::NotFound => Self::not_found("no location document for this resource"),
            RoutingError::RetryExhausted { .. } => {
                Self::new(StatusCode::SERVICE_UNAVAILABLE, "conflict-retry-exhausted", "concurrent updates did not settle; nothing was changed; retry")
            }
            RoutingError::Unavailable(cause) => {
                Self::new(StatusCode::SERVICE_UNAVAILABLE, "store-unavailable", "the routing store is unavailable; nothing was changed")
                    .caused_by(cause)
            }
            RoutingError::OutcomeUnknown(cause) => Self {
                retry_after: Some(OUTCOME_UNKNOWN_RETRY),
                ..Self::new(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "outcome-unknown",
                    "the routing store may have applied this call; repeat it with the same Idempotency-Key to learn its outcome",
                )
                .caused_by(cause)
            },
            RoutingError::Document(cause @ DocumentError::UnsupportedSchema { .. }) => {
                Self::new(StatusCode::INTERNAL_SERVER_ERROR, "unsupported-document", "the location document cannot be used by this service version")
                    .caused_by(cause)
            }
            RoutingError::Document(cause @ DocumentError::Malformed(_)) => Self::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                "invalid-document",
                "the stored location document is not valid (a field missing, of the wrong type or out of range); nothing was changed",
            )
            .caused_by(cause),
        }
    }
}

impl From<LockError> for ApiError {
    fn from(e: LockError) -> Self {
        let detail = e.to_string();
        match e {
            LockError::LockHeld { .. } => Self::new(StatusCode::LOCKED, "lock-held", detail),
            LockError::TokenMismatch => Self::new(StatusCode::CONFLICT, "token-mismatch", detail),
            LockError::ForceReleased { .. } => Self::new(StatusCode::GONE, "lock-force-released", detail),
            LockError::LeaseExpired { .. } | LockError::LapsedAndReplaced => {
                Self::new(StatusCode::GONE, "lock-expired", detail)
            }
            LockError::InvalidTransition(_) => Self::new(StatusCode::CONFLICT, "invalid-transition", detail),
            LockError::InvalidRequest(_) => Self::bad_request(detail),
            LockError::KeyReused => Self::new(StatusCode::UNPROCESSABLE_ENTITY, "idempotency-key-reused", detail),
            LockError::RecordsFull { retry_after, .. } => Self {
                retry_after: Some(retry_after),
                ..Self::new(StatusCode::TOO_MANY_REQUESTS, "idempotency-records-full", detail)
            },
            // The force-release procedure's refusals (`routing::force_release`), answered
            // by the admin routes (contract 1.4).
            LockError::SelfApproval { .. } => Self::new(StatusCode::FORBIDDEN, "self-approval", detail),
            LockError::UnknownForceRelease(_) => Self::new(StatusCode::NOT_FOUND, "force-release-not-found", detail),
            LockError::ForceReleaseExpired { .. } => Self::new(StatusCode::GONE, "force-release-expired", detail),
            LockError::ForceReleaseDecided { .. } => Self::new(StatusCode::CONFLICT, "force-release-decided", detail),
            LockError::ForceReleaseTargetChanged => {
                Self::new(StatusCode::CONFLICT, "force-release-target-changed", detail)
            }
            LockError::ForceReleasesFull { .. } => {
                Self::new(StatusCode::TOO_MANY_REQUESTS, "force-release-requests-full", detail)
            }
        }
    }
}

/// Whether `cause` is seen for the first time by this process. Remembers at most
/// [`CAUSES_REMEMBERED`] causes; past that every one counts as new again, so a flood of
/// distinct bad documents is still logged, only not without bound in memory.
fn first_time(cause: &str) -> bool {
    use std::collections::HashSet;
    use std::sync::{Mutex, OnceLock};
    static SEEN: OnceLock<Mutex<HashSet<String>>> = OnceLock::new();
    let mut seen = SEEN.get_or_init(Default::default).lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    if seen.contains(cause) {
        return false;
    }
    if seen.len() < CAUSES_REMEMBERED {
        seen.insert(cause.to_owned());
    }
    true
}

/// How many document refusals [`first_time`] remembers.
const CAUSES_REMEMBERED: usize = 1024;

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        // The one log line of a failure: the store does not log its own errors, the
        // routing library returns them, and this is where they are acted on.
        let cause = self.cause.as_deref().unwrap_or("-");
        if matches!(self.kind, "invalid-document" | "unsupported-document") && !first_time(cause) {
            // The same stored document answers every request on it the same way: its
            // cause is logged once (per process, while the set of them stays small),
            // not once per request a client or a probe keeps sending.
            tracing::debug!(kind = self.kind, status = self.status.as_u16(), cause, "request failed");
        } else if self.status == StatusCode::SERVICE_UNAVAILABLE {
            tracing::warn!(kind = self.kind, status = self.status.as_u16(), cause, "request failed");
        } else if self.status.is_server_error() {
            tracing::error!(kind = self.kind, status = self.status.as_u16(), cause, "request failed");
        } else {
            tracing::debug!(kind = self.kind, status = self.status.as_u16(), detail = %self.detail, "request refused");
        }
        let body = json!({
            "type": self.type_uri(),
            "title": self.status.canonical_reason().unwrap_or("error"),
            "status": self.status.as_u16(),
            "detail": self.detail,
        });
        let mut response = (self.status, body.to_string()).into_response();
        let headers = response.headers_mut();
        headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("application/problem+json"));
        if let Some(after) = self.retry_after {
            headers.insert(header::RETRY_AFTER, HeaderValue::from(retry_after_secs(after)));
        }
        response
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retry_after_rounds_up_and_is_never_zero() {
        assert_eq!(retry_after_secs(Duration::ZERO), 1);
        assert_eq!(retry_after_secs(Duration::from_millis(1)), 1);
        assert_eq!(retry_after_secs(Duration::from_secs(3)), 3);
        assert_eq!(retry_after_secs(Duration::from_millis(3001)), 4);
    }
}
