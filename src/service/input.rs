//! Request parsing that refuses bad input with a problem naming the field, before
//! anything is read or written.

use std::time::Duration;

use axum::extract::rejection::{JsonRejection, PathRejection};
use axum::extract::{FromRequest, FromRequestParts, Path, Request};
use axum::http::request::Parts;
use serde::de::DeserializeOwned;

use super::error::ApiError;

/// Longest resource id or item key, in bytes.
pub const MAX_ID_BYTES: usize = 255;

/// No lease longer than this is accepted anywhere (ten years): larger values are typos.
/// The same bound as every flag and config duration.
pub const MAX_DURATION_SECS: f64 = crate::duration::MAX_DURATION.as_secs_f64();

/// The shortest lease accepted, in seconds: one millisecond. Leases are kept to the
/// nanosecond, but a positive number below a nanosecond would become a zero lease, and
/// nothing shorter than a millisecond is a lease anyone means; the OpenAPI description
/// states this minimum, so a client can know it.
pub const MIN_DURATION_SECS: f64 = 0.001;

/// A JSON body whose rejections become problem+json (400, or 413 when too large).
#[derive(Debug)]
pub struct JsonBody<T>(pub T);

impl<S, T> FromRequest<S> for JsonBody<T>
where
    T: DeserializeOwned,
    S: Send + Sync,
{
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, Self::Rejection> {
        let limit = req.extensions().get::<BodyLimit>().map(|l| l.0);
        match axum::Json::<T>::from_request(req, state).await {
            Ok(axum::Json(value)) => Ok(Self(value)),
            Err(JsonRejection::BytesRejection(e)) if e.status() == axum::http::StatusCode::PAYLOAD_TOO_LARGE => {
                Err(ApiError::too_large(limit.unwrap_or_default()))
            }
            Err(e) => Err(ApiError::bad_request(e.body_text())),
        }
    }
}

/// Path parameters whose rejections become problem+json: a segment that is not UTF-8
/// once percent-decoded is 400 `bad-request`, like any other bad id.
#[derive(Debug)]
pub struct PathParams<T>(pub T);

impl<S, T> FromRequestParts<S> for PathParams<T>
where
    T: DeserializeOwned + Send,
    S: Send + Sync,
{
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        match Path::<T>::from_request_parts(parts, state).await {
            Ok(Path(value)) => Ok(Self(value)),
            // A route whose parameters do not fit the handler's type: our bug, not the caller's.
            Err(e @ PathRejection::MissingPathParams(_)) => Err(ApiError::internal(e.body_text())),
            Err(PathRejection::FailedToDeserializePathParams(e)) if e.status().is_server_error() => {
                Err(ApiError::internal(e.body_text()))
            }
            Err(e) => Err(ApiError::bad_request(e.body_text())),
        }
    }
}

/// The configured body limit, carried in request extensions so errors can name it.
#[derive(Debug, Clone, Copy)]
pub struct BodyLimit(pub usize);

/// Characters no id or key may hold: Cosmos DB forbids the first four in document ids,
/// and every store refuses the same set so an id valid on one is valid on all.
const FORBIDDEN_IN_NAMES: [char; 4] = ['/', '\\', '?', '#'];

/// Checks a resource id, item key or location name: 1 to [`MAX_ID_BYTES`] bytes, none of
/// `/ \ ? #`, no control characters.
pub fn check_name(field: &str, value: &str) -> Result<(), ApiError> {
    if value.is_empty() {
        return Err(ApiError::bad_request(format!("{field} must not be empty")));
    }
    if value.len() > MAX_ID_BYTES {
        return Err(ApiError::bad_request(format!(
            "{field} is {} bytes; at most {MAX_ID_BYTES} are allowed",
            value.len()
        )));
    }
    if value.contains(FORBIDDEN_IN_NAMES) || value.chars().any(char::is_control) {
        return Err(ApiError::bad_request(format!(
            "{field} must not contain '/', '\\', '?', '#' or control characters"
        )));
    }
    Ok(())
}

/// Converts `durationSeconds` into a duration: positive, finite, at most ten years.
pub fn duration(field: &str, seconds: f64) -> Result<Duration, ApiError> {
    if !seconds.is_finite() || seconds < MIN_DURATION_SECS {
        return Err(ApiError::bad_request(format!(
            "{field} must be a number of seconds, at least {MIN_DURATION_SECS}"
        )));
    }
    if seconds > MAX_DURATION_SECS {
        return Err(ApiError::bad_request(format!("{field} {seconds} is absurd; at most {MAX_DURATION_SECS} seconds")));
    }
    Ok(Duration::from_secs_f64(seconds))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_checked() {
        assert!(check_name("id", "probe-1").is_ok());
        assert!(check_name("id", "").is_err());
        assert!(check_name("id", "a/b").is_err());
        assert!(check_name("id", &"x".repeat(256)).is_err());
        assert!(check_name("id", &"x".repeat(255)).is_ok());
        assert!(check_name("id", "a\nb").is_err());
        for bad in ["a\\b", "a?b", "a#b", "?", "#", "\\", "a\u{7f}b", "a\u{85}b"] {
            let e = check_name("id", bad).unwrap_err();
            assert_eq!(e.kind, "bad-request", "{bad:?}");
        }
        assert!(check_name("id", "probe-é.%_~:@!$&'()*+,;=").is_ok(), "everything else stays allowed");
    }

    async fn answer_of(router: axum::Router, uri: &str) -> (axum::http::StatusCode, String, serde_json::Value) {
        use tower::ServiceExt;
        let response = router.oneshot(Request::get(uri).body(axum::body::Body::empty()).unwrap()).await.unwrap();
        let status = response.status();
        let content_type = response.headers()[axum::http::header::CONTENT_TYPE].to_str().unwrap().to_owned();
        let body = axum::body::to_bytes(response.into_body(), 4096).await.unwrap();
        (status, content_type, serde_json::from_slice(&body).unwrap())
    }

    #[tokio::test]
    async fn path_rejections_are_problems() {
        async fn one(PathParams(id): PathParams<String>) -> String {
            id
        }
        async fn two(PathParams((a, b)): PathParams<(String, String)>) -> String {
            a + &b
        }
        let router = axum::Router::new()
            .route("/one/{id}", axum::routing::get(one))
            .route("/mismatch/{id}", axum::routing::get(two));
        let (status, content_type, body) = answer_of(router.clone(), "/one/%FF").await;
        assert_eq!((status.as_u16(), content_type.as_str()), (400, "application/problem+json"));
        assert_eq!(body["type"], "urn:lockprobe:error:bad-request");
        let (status, content_type, body) = answer_of(router, "/mismatch/x").await;
        assert_eq!(
            (status.as_u16(), content_type.as_str()),
            (500, "application/problem+json"),
            "a route that does not fit its handler is our fault"
        );
        assert_eq!(body["type"], "urn:lockprobe:error:internal");
    }

    #[test]
    fn durations_are_checked() {
        assert_eq!(duration("d", 1.5).unwrap(), Duration::from_millis(1500));
        for bad in [0.0, -1.0, f64::NAN, f64::INFINITY, 1e12] {
            assert!(duration("d", bad).is_err(), "{bad}");
        }
        assert_eq!(duration("d", MIN_DURATION_SECS).unwrap(), Duration::from_millis(1));
    }

    /// Found by schemathesis: 5e-324 is positive, passed this check, became a zero
    /// lease and was refused deeper down with a message the description did not predict.
    #[test]
    fn sub_millisecond_durations_are_refused_here_naming_the_minimum() {
        for tiny in [5e-324, 1e-10, 0.000_999] {
            let e = duration("durationSeconds", tiny).unwrap_err();
            assert!(e.detail.contains("durationSeconds") && e.detail.contains("0.001"), "{tiny}: {}", e.detail);
        }
    }
}
