//! The orchestrator's lock calls: pre-lock, escalate, renew, swap, release.
//!
//! Every call needs the bearer key and, when configured, a test-resource id. The token
//! is returned only in answers to callers that hold it, and never logged. Every call
//! takes an optional `Idempotency-Key`: repeated with the same key and body, it returns
//! the first call's outcome (the pre-lock's token included), so a caller that got
//! `outcome-unknown` or no answer at all can find out what happened.

use std::sync::Arc;

use axum::extract::State;
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Deserialize;
use serde_json::{json, Value};

use super::design::LockDesign;
use super::error::ApiError;
use super::input::{self, JsonBody, PathParams};
use super::{Fault, Instance};
use crate::clock::span;
use crate::routing::lifecycle;
use crate::routing::{LocationDocument, LockCall, LockError, LockToken, Phase, PreLockRequest, RoutingError, SwapPlan};
use crate::store::faults::in_step;

/// Body of `POST /lock`.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PreLockBody {
    owner: String,
    duration_seconds: f64,
    #[serde(default)]
    target_location: Option<String>,
}

/// Body of `POST /lock/escalate`.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct EscalateBody {
    token: LockToken,
    phase: String,
    duration_seconds: f64,
}

/// Body of `POST /lock/renew`.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RenewBody {
    token: LockToken,
    duration_seconds: f64,
}

/// Body of `POST /lock/swap`.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SwapBody {
    token: LockToken,
    target_location: String,
}

/// Longest accepted `owner`.
const MAX_OWNER_BYTES: usize = 256;

/// Checks credentials, the id, and the test prefix, in that order. Handlers call it
/// before looking at the body, so a caller without the key gets 401 or 403 and learns
/// nothing from how its body was judged.
fn authorize(instance: &Instance, headers: &HeaderMap, id: &str) -> Result<(), ApiError> {
    let presented = bearer_key(headers).ok_or_else(ApiError::unauthorized)?;
    let expected = LockToken::from_presented(instance.config.api_key.as_str());
    if !expected.matches(&LockToken::from_presented(presented)) {
        return Err(ApiError::forbidden());
    }
    instance.check_resource_id(id)?;
    match &instance.config.test_prefix {
        Some(prefix) if !id.starts_with(prefix.as_str()) => Err(ApiError::not_test_resource(prefix)),
        _ => Ok(()),
    }
}

/// The key of an `Authorization: Bearer <key>` header (the scheme in any case: RFC 9110
/// §11.1), if one was sent: the lock API's and the admin routes' credentials alike.
pub(super) fn bearer_key(headers: &HeaderMap) -> Option<&str> {
    headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split_once(' '))
        .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
        .map(|(_, key)| key)
}

/// The `Idempotency-Key` header, if sent: 1 to 128 printable ASCII characters.
pub(super) fn idempotency_key(instance: &Instance, headers: &HeaderMap) -> Result<Option<String>, ApiError> {
    if instance.config.has_fault(Fault::IgnoreIdempotencyKey) {
        return Ok(None);
    }
    let Some(value) = headers.get("idempotency-key") else { return Ok(None) };
    let bad = || ApiError::bad_request("Idempotency-Key must be 1 to 128 printable ASCII characters");
    let key = value.to_str().map_err(|_| bad())?;
    if key.is_empty() || key.len() > MAX_KEY_BYTES || !key.bytes().all(|b| (0x20..0x7f).contains(&b)) {
        return Err(bad());
    }
    Ok(Some(key.to_owned()))
}

/// Longest accepted `Idempotency-Key`.
const MAX_KEY_BYTES: usize = 128;

/// A presented token of plausible length. Bodies carry tokens as [`LockToken`], whose
/// `Debug` is redacted, so a logged request body cannot leak one.
fn token(field: &str, presented: LockToken) -> Result<LockToken, ApiError> {
    let raw = presented.expose();
    if raw.is_empty() || raw.len() > 128 {
        return Err(ApiError::bad_request(format!("{field} must be the token returned by the pre-lock")));
    }
    Ok(presented)
}

/// The lock view of the contract. `token` is included only for its holder.
fn lock_view(doc: &LocationDocument, token: &LockToken) -> Value {
    let Some(lock) = doc.primary.lock.as_ref() else { return Value::Null };
    let target = doc
        .secondary
        .as_ref()
        .filter(|s| s.lock.as_ref().is_some_and(|l| l.token.matches(token)))
        .map(|s| s.location.clone());
    json!({
        "token": token.expose(),
        "phase": lock.phase,
        "owner": lock.owner,
        "acquiredAt": lock.acquired_at,
        "effectiveAt": lock.effective_at,
        "expiresAt": lock.expires_at,
        "preLockExpiresAt": lock.pre_lock_expires_at,
        "maxExpiresAt": lock.max_expires_at,
        "renewals": lock.renewals,
        "convergenceDelaySeconds": lock.convergence_delay().as_seconds_f64(),
        "location": doc.primary.location,
        "targetLocation": target,
    })
}

/// `POST /v1/resources/{id}/lock`: a new pre-lock (creates the document if needed).
pub async fn pre_lock(
    State(instance): State<Arc<Instance>>,
    PathParams(id): PathParams<String>,
    headers: HeaderMap,
    body: Result<JsonBody<PreLockBody>, ApiError>,
) -> Result<Response, ApiError> {
    authorize(&instance, &headers, &id)?;
    let key = idempotency_key(&instance, &headers)?;
    let JsonBody(body) = body?;
    let duration = input::duration("durationSeconds", body.duration_seconds)?;
    if body.owner.is_empty() || body.owner.len() > MAX_OWNER_BYTES {
        return Err(ApiError::bad_request(format!("owner must be 1 to {MAX_OWNER_BYTES} bytes")));
    }
    // The owner is shown in route views and logs: no line breaks or escapes in them.
    if body.owner.chars().any(char::is_control) {
        return Err(ApiError::bad_request("owner must not contain control characters"));
    }
    if let Some(target) = &body.target_location {
        input::check_name("targetLocation", target)?;
    }
    let req = PreLockRequest { owner: body.owner, duration, target_location: body.target_location };
    let lock_id = instance.lock_document_id(&id);
    let home = match instance.config.lock_design {
        LockDesign::Embedded => instance.config.home_location.clone(),
        LockDesign::Record => in_step("preLock", instance.lock_record_home(&id)).await?,
    };
    let granting = instance.routing.pre_lock_with_key(&lock_id, &home, &req, key.as_deref());
    let grant = in_step("preLock", granting).await.map_err(|e| match e {
        // The loser learns when the holder's lease ends at the latest.
        RoutingError::Lock(LockError::LockHeld { expires_at }) => {
            ApiError::locked(e.to_string(), span(instance.routing.clock().now(), expires_at))
        }
        other => other.into(),
    })?;
    tracing::info!(resource = %id, instance = instance.index, "pre-lock granted");
    Ok((StatusCode::CREATED, Json(lock_view(&grant.record.doc, &grant.token))).into_response())
}

/// `POST /v1/resources/{id}/lock/escalate`.
pub async fn escalate(
    State(instance): State<Arc<Instance>>,
    PathParams(id): PathParams<String>,
    headers: HeaderMap,
    body: Result<JsonBody<EscalateBody>, ApiError>,
) -> Result<Json<Value>, ApiError> {
    authorize(&instance, &headers, &id)?;
    let key = idempotency_key(&instance, &headers)?;
    let JsonBody(body) = body?;
    let token = token("token", body.token)?;
    let phase: Phase = body.phase.parse().map_err(ApiError::bad_request)?;
    let duration = input::duration("durationSeconds", body.duration_seconds)?;
    let call = LockCall::Escalate { token: token.clone(), phase, duration };
    let record =
        in_step("escalate", instance.routing.call(&instance.lock_document_id(&id), None, &call, key.as_deref()))
            .await?;
    tracing::info!(resource = %id, instance = instance.index, %phase, "lock escalated");
    Ok(Json(lock_view(&record.doc, &token)))
}

/// `POST /v1/resources/{id}/lock/renew`.
pub async fn renew(
    State(instance): State<Arc<Instance>>,
    PathParams(id): PathParams<String>,
    headers: HeaderMap,
    body: Result<JsonBody<RenewBody>, ApiError>,
) -> Result<Json<Value>, ApiError> {
    authorize(&instance, &headers, &id)?;
    let key = idempotency_key(&instance, &headers)?;
    let JsonBody(body) = body?;
    let token = token("token", body.token)?;
    let duration = input::duration("durationSeconds", body.duration_seconds)?;
    let call = LockCall::Renew { token: token.clone(), duration };
    let record =
        in_step("renew", instance.routing.call(&instance.lock_document_id(&id), None, &call, key.as_deref())).await?;
    tracing::info!(resource = %id, instance = instance.index, "lock renewed");
    Ok(Json(lock_view(&record.doc, &token)))
}

/// `POST /v1/resources/{id}/lock/swap`: copies the items to the target under the write
/// lock, then switches location and clears the lock in one write. A swap this key
/// already made is answered again without copying anything.
pub async fn swap(
    State(instance): State<Arc<Instance>>,
    PathParams(id): PathParams<String>,
    headers: HeaderMap,
    body: Result<JsonBody<SwapBody>, ApiError>,
) -> Result<Json<Value>, ApiError> {
    authorize(&instance, &headers, &id)?;
    let key = idempotency_key(&instance, &headers)?;
    let JsonBody(body) = body?;
    let token = token("token", body.token)?;
    let to = body.target_location;
    input::check_name("targetLocation", &to)?;
    let routing = &instance.routing;
    let lock_id = instance.lock_document_id(&id);
    for _ in 0..SWAP_ATTEMPTS {
        // The target as it is before the document is read: a concurrent swap of the same
        // lock may finish while this one reads and waits, and writes may then land at the
        // new location that a copy made from this one's (older) look must not overwrite.
        let target_before = instance.items.version(&to, &id);
        let held = match in_step("swap", routing.prepare_swap(&lock_id, &token, &to, key.as_deref())).await? {
            SwapPlan::AlreadySwapped(record) => {
                // A repeat finishes what the first call may not have: the routing
                // document's move (no write when it moved already).
                follow_swap(&instance, &id, &record.doc).await;
                return Ok(Json(route_view(&record.doc)));
            }
            SwapPlan::Copy(held) => held,
        };
        // The lock may have been force-released while `prepare_swap` waited: a fenced
        // swap must not land its copy at the target, so the lock is read again just
        // before it (the copy itself is in-process and immediate). What is left between
        // that read and the copy is harmless: the target is not authoritative without a
        // swap, and the next migration's copy, conditional on the target's version,
        // replaces the whole resource there (docs/contract.md, "Force-release").
        let now = in_step("swap", routing.read_uncached(&lock_id)).await?;
        lifecycle::held_lock(&now.record.doc, &token, routing.clock().now()).map_err(RoutingError::from)?;
        let from = held.doc.primary.location.clone();
        // Writes are blocked while the write lock holds, so the source is stable.
        let Some(copied) = instance.items.copy_resource_if(&id, &from, &to, target_before) else {
            tracing::info!(resource = %id, instance = instance.index, "target changed while the swap read and waited; deciding again");
            continue;
        };
        let record = in_step("swap", routing.swap_with_key(&lock_id, &token, &to, key.as_deref())).await?;
        follow_swap(&instance, &id, &record.doc).await;
        tracing::info!(resource = %id, instance = instance.index, %from, to = %to, copied, "swapped");
        return Ok(Json(route_view(&record.doc)));
    }
    Err(RoutingError::RetryExhausted { attempts: SWAP_ATTEMPTS }.into())
}

/// In the record design, moves the routing document after its lock record, whose swap
/// is committed (`lock_record` is the record as written, or as a repeat read it). The
/// swap has then taken effect: every operation acts on the lock record's location. So a
/// failure of this second write is logged, not answered: a 503 `store-unavailable`
/// ("nothing was changed") would tell the orchestrator the resource is still at its
/// source. The routing document, left behind, moves at the swap's repeat or the next
/// swap.
async fn follow_swap(instance: &Instance, id: &str, lock_record: &LocationDocument) {
    let at = &lock_record.primary.location;
    if let Err(e) = in_step("swap", instance.follow_lock_record(id, at)).await {
        tracing::warn!(resource = %id, instance = instance.index, error = %e, "swapped; the routing document did not follow the lock record yet");
    }
}

/// A swap whose copy found the target changed decides again; this many times at most.
const SWAP_ATTEMPTS: u32 = 3;

/// The route view a swap answers with: the new location, no lock.
fn route_view(doc: &LocationDocument) -> Value {
    json!({ "location": doc.primary.location, "lock": Value::Null, "source": "store" })
}

/// `DELETE /v1/resources/{id}/lock` with `Lock-Token`.
pub async fn release(
    State(instance): State<Arc<Instance>>,
    PathParams(id): PathParams<String>,
    headers: HeaderMap,
) -> Result<StatusCode, ApiError> {
    authorize(&instance, &headers, &id)?;
    let key = idempotency_key(&instance, &headers)?;
    let raw = headers
        .get("lock-token")
        .and_then(|v| v.to_str().ok())
        .ok_or_else(|| ApiError::bad_request("the Lock-Token header is required"))?;
    let token = token("Lock-Token", LockToken::from_presented(raw))?;
    if instance.config.has_fault(Fault::AckReleaseWithoutReleasing) {
        return Ok(StatusCode::NO_CONTENT);
    }
    in_step(
        "release",
        instance.routing.call(&instance.lock_document_id(&id), None, &LockCall::Release { token }, key.as_deref()),
    )
    .await?;
    tracing::info!(resource = %id, instance = instance.index, "lock released");
    Ok(StatusCode::NO_CONTENT)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_bodies_never_show_the_token_in_debug() {
        let secret = "0123456789abcdef0123456789abcdef";
        let escalate: EscalateBody =
            serde_json::from_value(json!({"token": secret, "phase": "write", "durationSeconds": 1})).unwrap();
        let renew: RenewBody = serde_json::from_value(json!({"token": secret, "durationSeconds": 1})).unwrap();
        let swap: SwapBody = serde_json::from_value(json!({"token": secret, "targetLocation": "x"})).unwrap();
        for shown in [format!("{escalate:?}"), format!("{renew:?}"), format!("{swap:?}")] {
            assert!(!shown.contains(secret), "{shown}");
        }
        assert_eq!(token("token", escalate.token).unwrap().expose(), secret);
    }
}
