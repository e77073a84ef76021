//! The operators' routes: force-release a stuck lock, which takes two people
//! ([`crate::routing::force_release`]).
//!
//! Each principal has an admin key of its own, separate from the lock API's key, and may
//! be scoped to resource-id prefixes (the probe's two test principals to its test
//! prefix, so that holding both keys cannot release a production lock). One principal
//! requests, naming the lock by its fingerprint (the digest of its token, which these
//! routes show and never the token) and its phase, with a reason; another approves. The
//! approval's write removes the lock; the old holder's token is refused from then on.
//! Every request, approval and refusal is logged with the principal, never a key or a
//! token.

use std::sync::Arc;

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use chrono::{DateTime, Utc};
use serde::Deserialize;
use serde_json::{json, Value};

use super::error::ApiError;
use super::input::{self, JsonBody, PathParams};
use super::{Fault, Instance};
use crate::document::{ForceOutcome, ForceRelease, LocationDocument, LockToken, Phase};
use crate::routing::force_release::{self, AdminCall, ForceReleaseRequest};
use crate::store::faults::in_step;

/// One operator who may request or approve force-releases.
#[derive(Clone, PartialEq, Eq)]
pub struct AdminPrincipal {
    /// The name recorded in the audit trail (`requestedBy`, `approvedBy`).
    pub name: String,
    /// Its bearer key (read from its own file; never logged).
    pub key: String,
    /// Resource-id prefixes it may act on; empty: every resource.
    pub prefixes: Vec<String>,
}

impl std::fmt::Debug for AdminPrincipal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AdminPrincipal")
            .field("name", &self.name)
            .field("key", &"<redacted>")
            .field("prefixes", &self.prefixes)
            .finish()
    }
}

impl AdminPrincipal {
    /// Whether it may act on resource `id`.
    pub fn may_act_on(&self, id: &str) -> bool {
        self.prefixes.is_empty() || self.prefixes.iter().any(|p| id.starts_with(p.as_str()))
    }
}

/// Checks a principal's name: 1 to 64 of `a-z A-Z 0-9 . _ -`, so it reads the same in
/// the audit trail, the logs and the monitor's page.
pub fn check_principal_name(name: &str) -> Result<(), String> {
    let ok = !name.is_empty()
        && name.len() <= 64
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'));
    if ok {
        Ok(())
    } else {
        Err(format!("{name:?} is not a principal name (1 to 64 letters, digits, '.', '_' or '-')"))
    }
}

/// The shortest admin key accepted: a key is the only thing that tells two people apart.
pub const MIN_ADMIN_KEY_BYTES: usize = 16;

/// Body of `POST .../lock/force-release`.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RequestBody {
    lock_fingerprint: String,
    phase: String,
    reason: String,
}

/// Longest accepted reason.
const MAX_REASON_BYTES: usize = 1024;

/// The principal whose admin key is presented, allowed on `id`: 401 without a bearer
/// key, 403 `forbidden` for a key that is no principal's (the lock API's key included),
/// 403 `admin-out-of-scope` outside its prefixes or the service's test prefix.
fn authorize<'a>(instance: &'a Instance, headers: &HeaderMap, id: &str) -> Result<&'a AdminPrincipal, ApiError> {
    let presented =
        super::lock_api::bearer_key(headers).map(LockToken::from_presented).ok_or_else(ApiError::admin_unauthorized)?;
    // Every key is compared (in constant time), so the time taken says nothing of which
    // principal's key came close.
    let mut found = None;
    for principal in &instance.config.admin_principals {
        if LockToken::from_presented(principal.key.as_str()).matches(&presented) {
            found = Some(principal);
        }
    }
    let principal = found.ok_or_else(ApiError::admin_forbidden)?;
    instance.check_resource_id(id)?;
    let in_test_prefix = instance.config.test_prefix.as_ref().is_none_or(|p| id.starts_with(p.as_str()));
    if !principal.may_act_on(id) || !in_test_prefix {
        tracing::warn!(resource = %id, principal = %principal.name, "admin call refused: outside the principal's scope");
        return Err(ApiError::admin_out_of_scope(&principal.name));
    }
    Ok(principal)
}

/// `POST /v1/resources/{id}/lock/force-release`: asks for the live lock to be removed.
/// 201 with the request; a repeat with the same `Idempotency-Key` and body answers the
/// same request again.
pub async fn request(
    State(instance): State<Arc<Instance>>,
    PathParams(id): PathParams<String>,
    headers: HeaderMap,
    body: Result<JsonBody<RequestBody>, ApiError>,
) -> Result<Response, ApiError> {
    let principal = authorize(&instance, &headers, &id)?;
    let key = super::lock_api::idempotency_key(&instance, &headers)?;
    let JsonBody(body) = body?;
    let phase: Phase = body
        .phase
        .parse()
        .map_err(|_| ApiError::bad_request(format!("phase {:?} is not preLock, hardDelete or write", body.phase)))?;
    let fingerprint = body.lock_fingerprint;
    if fingerprint.len() != 32 || !fingerprint.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)) {
        return Err(ApiError::bad_request("lockFingerprint must be the lock's 32-digit lowercase hex fingerprint"));
    }
    let reason = body.reason.trim().to_owned();
    if reason.is_empty() || reason.len() > MAX_REASON_BYTES || reason.chars().any(char::is_control) {
        return Err(ApiError::bad_request(format!(
            "reason must be 1 to {MAX_REASON_BYTES} bytes of text without control characters"
        )));
    }
    // The key is the caller's, per principal: another principal's same key is another request.
    let request_id = match &key {
        Some(key) => force_release::request_id_for_key(&format!("{}\u{0}{key}", principal.name)),
        None => crate::document::to_hex(&rand::random::<[u8; 16]>()),
    };
    let call = AdminCall::Request(ForceReleaseRequest {
        id: request_id.clone(),
        lock: fingerprint,
        phase,
        requested_by: principal.name.clone(),
        reason,
    });
    let record =
        in_step("forceRelease", instance.routing.force_release(&instance.lock_document_id(&id), &call)).await?;
    let now = instance.routing.clock().now();
    let view = record
        .doc
        .force_releases
        .iter()
        .find(|r| r.id == request_id)
        .map(|r| record_view(r, now))
        .ok_or_else(|| ApiError::internal("a written force-release request is not in the document"))?;
    tracing::info!(resource = %id, instance = instance.index, request = %request_id, principal = %principal.name, "force-release requested");
    Ok((StatusCode::CREATED, Json(json!({ "request": view }))).into_response())
}

/// `POST /v1/resources/{id}/lock/force-release/{request}/approve`: a second principal
/// approves. 200 with the request once it released the lock; 409
/// `force-release-void` when the lock had changed (the request is closed, nothing
/// removed).
pub async fn approve(
    State(instance): State<Arc<Instance>>,
    PathParams((id, request_id)): PathParams<(String, String)>,
    headers: HeaderMap,
) -> Result<Json<Value>, ApiError> {
    let principal = authorize(&instance, &headers, &id)?;
    input::check_name("request id", &request_id)?;
    if instance.config.has_fault(Fault::AckForceReleaseWithoutReleasing) {
        return acknowledged_without_releasing(&instance, &id, &request_id, &principal.name).await;
    }
    let call = AdminCall::Approve { id: request_id.clone(), principal: principal.name.clone() };
    let answer = in_step("forceRelease", instance.routing.force_release(&instance.lock_document_id(&id), &call)).await;
    let record = match answer {
        Ok(record) => record,
        Err(e) => {
            tracing::warn!(resource = %id, instance = instance.index, request = %request_id, principal = %principal.name, error = %e, "force-release approval refused");
            return Err(e.into());
        }
    };
    let now = instance.routing.clock().now();
    let decided = record
        .doc
        .force_releases
        .iter()
        .find(|r| r.id == request_id)
        .ok_or_else(|| ApiError::internal("an approved force-release request is not in the document"))?;
    match decided.outcome {
        ForceOutcome::Released => {
            tracing::warn!(resource = %id, instance = instance.index, request = %request_id, requested_by = %decided.requested_by, approved_by = %principal.name, reason = %decided.reason, "lock force-released");
            Ok(Json(json!({ "request": record_view(decided, now) })))
        }
        _ => {
            tracing::info!(resource = %id, instance = instance.index, request = %request_id, principal = %principal.name, "force-release void: the lock changed");
            Err(ApiError::force_release_void())
        }
    }
}

/// [`Fault::AckForceReleaseWithoutReleasing`]: the request shown as released, nothing
/// written (the requester's own approval is still refused).
async fn acknowledged_without_releasing(
    instance: &Instance,
    id: &str,
    request_id: &str,
    principal: &str,
) -> Result<Json<Value>, ApiError> {
    let read = in_step("forceRelease", instance.routing.read_uncached(&instance.lock_document_id(id))).await?;
    let now = instance.routing.clock().now();
    let mut record = read
        .record
        .doc
        .force_releases
        .iter()
        .find(|r| r.id == request_id)
        .cloned()
        .ok_or_else(|| ApiError::from(crate::routing::LockError::UnknownForceRelease(request_id.to_owned())))?;
    if record.requested_by == principal {
        return Err(crate::routing::LockError::SelfApproval { principal: principal.to_owned() }.into());
    }
    record.outcome = ForceOutcome::Released;
    tracing::warn!(resource = %id, request = %request_id, "fault: force-release approval acknowledged without releasing");
    Ok(Json(json!({ "request": record_view(&record, now) })))
}

/// `GET /v1/resources/{id}/lock/force-release`: the lock as an operator needs to judge
/// it (fingerprint, phase, owner, age, lease end; never the token) and every request
/// the document keeps, open or decided.
pub async fn list(
    State(instance): State<Arc<Instance>>,
    PathParams(id): PathParams<String>,
    headers: HeaderMap,
) -> Result<Json<Value>, ApiError> {
    authorize(&instance, &headers, &id)?;
    let read = in_step("forceRelease", instance.routing.read_uncached(&instance.lock_document_id(&id))).await?;
    let now = instance.routing.clock().now();
    Ok(Json(admin_view(&read.record.doc, now)))
}

/// What `GET .../lock/force-release` answers.
fn admin_view(doc: &LocationDocument, now: DateTime<Utc>) -> Value {
    let lock = doc.primary.lock.as_ref().map(|l| {
        json!({
            "fingerprint": l.token.digest(),
            "phase": l.phase,
            "owner": l.owner,
            "acquiredAt": l.acquired_at,
            "ageSeconds": (now - l.acquired_at).num_milliseconds().max(0) as f64 / 1000.0,
            "effectiveAt": l.effective_at,
            "expiresAt": l.expires_at,
            "maxExpiresAt": l.max_expires_at,
            "renewals": l.renewals,
            "live": l.is_live(now),
        })
    });
    let requests: Vec<Value> = doc.force_releases.iter().map(|r| record_view(r, now)).collect();
    json!({ "location": doc.primary.location, "lock": lock, "requests": requests })
}

/// One request as the admin routes show it.
fn record_view(r: &ForceRelease, now: DateTime<Utc>) -> Value {
    json!({
        "id": r.id,
        "lockFingerprint": r.lock,
        "phase": r.phase,
        "owner": r.owner,
        "requestedBy": r.requested_by,
        "reason": r.reason,
        "requestedAt": r.requested_at,
        "approveBy": r.approve_by,
        "approvedBy": r.approved_by,
        "approvedAt": r.approved_at,
        "status": force_release::status(r, now),
    })
}
