//! Force-release: an operator's removal of a stuck lock, which takes two people.
//!
//! The paper's first lesson (§8) is that a lock with no way out turns a migration bug
//! into resources stuck for days; its answer was admin tooling with multi-level
//! approval. Here one principal requests the release of a lock, named by its token's
//! digest (never the token) and its phase, with a reason; a different principal
//! approves it within [`LockPolicy::force_release_window`]. Only the approval's write
//! removes the lock, and like every lock write it is conditional on the ETag of the
//! version it was decided on, never on the token.
//!
//! What a release leaves behind is what the holder's own release would: the location
//! stays where the document says (no partial cutover), a hardDelete or write phase
//! ends, the declared target's lock goes, an earlier swap's guard stays until it lapses.
//! The record stays too (the newest [`KEPT`] closed ones), so the old holder's token is
//! refused by name on every call ([`LockError::ForceReleased`], through
//! `lifecycle::held_lock`) and the change stream tells a force-release from a release.
//!
//! A renewal of the targeted lock does not void a request (the token and phase are the
//! same); another token or a later phase does: the approval then writes the request as
//! `void` and removes nothing.
//!
//! These are pure functions over (document, call, now), like the lifecycle; the client
//! runs them in its one compare-and-set loop.

use chrono::{DateTime, Utc};
use serde_json::Map;

use crate::clock::to_chrono;
use crate::document::{digest_hex, ForceOutcome, ForceRelease, LocationDocument, Phase};
use crate::routing::lifecycle::{Decided, LockError, LockPolicy};

/// How many requests may wait for an approval at once on one resource: a second
/// person's attention is the scarce part, and more would only be noise (or an attack
/// on the document's size).
pub const OPEN: usize = 4;

/// How many decided or expired requests a document keeps, the newest: the audit trail
/// the change stream carries, and what names a fenced token in its refusal. An older
/// fenced token is still refused, as any token that is not the lock's.
pub const KEPT: usize = 16;

/// A request to force-release a lock.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ForceReleaseRequest {
    /// The request's id, chosen by the service (from the caller's idempotency key, so a
    /// repeated request is recognised, or at random).
    pub id: String,
    /// Digest of the targeted lock's token, as the lock's views show it.
    pub lock: String,
    /// The phase the requester saw the lock in.
    pub phase: Phase,
    /// The requesting principal.
    pub requested_by: String,
    /// Why, for the audit.
    pub reason: String,
}

/// A call of the force-release procedure.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AdminCall {
    /// Ask for a lock to be force-released.
    Request(ForceReleaseRequest),
    /// Approve request `id` as `principal`.
    Approve {
        /// The request's id.
        id: String,
        /// The approving principal (never the requester).
        principal: String,
    },
}

impl AdminCall {
    /// The id of the request the call is about.
    pub fn request_id(&self) -> &str {
        match self {
            AdminCall::Request(req) => &req.id,
            AdminCall::Approve { id, .. } => id,
        }
    }

    /// Which call this is, as named in logs and metrics.
    pub fn as_str(&self) -> &'static str {
        match self {
            AdminCall::Request(_) => "forceReleaseRequest",
            AdminCall::Approve { .. } => "forceReleaseApprove",
        }
    }
}

/// A request id made from a caller's idempotency key: a repeat of the request then
/// names the same record.
pub fn request_id_for_key(key: &str) -> String {
    digest_hex(&[b"lockprobe-force-release:", key.as_bytes()])
}

/// Decides `call` on a settled document: the document to write, or [`Decided::Replayed`]
/// when the call took effect already (the same request recorded, or the same principal's
/// approval decided).
pub fn decide(
    doc: &LocationDocument,
    call: &AdminCall,
    policy: &LockPolicy,
    now: DateTime<Utc>,
) -> Result<Decided, LockError> {
    match call {
        AdminCall::Request(req) => request(doc, req, policy, now),
        AdminCall::Approve { id, principal } => approve(doc, id, principal, now),
    }
}

/// Whether `call` took effect in this settled document: its request is recorded, or its
/// approval decided it.
pub fn took_effect(doc: &LocationDocument, call: &AdminCall) -> bool {
    let record = doc.force_releases.iter().find(|r| r.id == call.request_id());
    match call {
        AdminCall::Request(_) => record.is_some(),
        AdminCall::Approve { principal, .. } => {
            record.is_some_and(|r| r.outcome != ForceOutcome::Requested && r.approved_by.as_deref() == Some(principal))
        }
    }
}

fn request(
    doc: &LocationDocument,
    req: &ForceReleaseRequest,
    policy: &LockPolicy,
    now: DateTime<Utc>,
) -> Result<Decided, LockError> {
    if let Some(known) = doc.force_releases.iter().find(|r| r.id == req.id) {
        let same = known.lock == req.lock
            && known.phase == req.phase
            && known.requested_by == req.requested_by
            && known.reason == req.reason;
        return if same { Ok(Decided::Replayed) } else { Err(LockError::KeyReused) };
    }
    let lock = doc.primary.lock.as_ref().filter(|l| l.is_live(now)).ok_or_else(|| {
        LockError::InvalidTransition("the resource holds no live lock: there is nothing to force-release".into())
    })?;
    if *lock.token.digest() != *req.lock || lock.phase != req.phase {
        return Err(LockError::ForceReleaseTargetChanged);
    }
    let open = doc.force_releases.iter().filter(|r| r.is_open(now)).count();
    if open >= OPEN {
        return Err(LockError::ForceReleasesFull { open });
    }
    let approve_by = now
        .checked_add_signed(to_chrono(policy.force_release_window))
        .ok_or_else(|| LockError::InvalidRequest("the approval window reaches past the representable time".into()))?;
    let mut next = doc.clone();
    let records = std::sync::Arc::make_mut(&mut next.force_releases);
    records.push(ForceRelease {
        id: req.id.clone(),
        lock: req.lock.clone(),
        phase: req.phase,
        owner: lock.owner.clone(),
        requested_by: req.requested_by.clone(),
        reason: req.reason.clone(),
        requested_at: now,
        approve_by,
        approved_by: None,
        approved_at: None,
        outcome: ForceOutcome::Requested,
        extra: Map::new(),
    });
    prune(records, now);
    Ok(Decided::Write(Box::new(next)))
}

fn approve(doc: &LocationDocument, id: &str, principal: &str, now: DateTime<Utc>) -> Result<Decided, LockError> {
    let record =
        doc.force_releases.iter().find(|r| r.id == id).ok_or_else(|| LockError::UnknownForceRelease(id.to_owned()))?;
    if record.requested_by == principal {
        return Err(LockError::SelfApproval { principal: principal.to_owned() });
    }
    if record.outcome != ForceOutcome::Requested {
        return if record.approved_by.as_deref() == Some(principal) {
            Ok(Decided::Replayed)
        } else {
            Err(LockError::ForceReleaseDecided { outcome: record.outcome.as_str() })
        };
    }
    if now > record.approve_by {
        return Err(LockError::ForceReleaseExpired { approve_by: record.approve_by });
    }
    // The lock the request named, in the phase it named (a renewal changes neither).
    let targeted = doc.primary.lock.as_ref().filter(|l| l.phase == record.phase && *l.token.digest() == *record.lock);
    let mut next = doc.clone();
    let outcome = match targeted {
        Some(lock) => {
            let token = lock.token.clone();
            next.primary.lock = None;
            next.migrating = false;
            if next.secondary.as_ref().is_some_and(|s| s.lock.as_ref().is_some_and(|l| l.token.matches(&token))) {
                next.secondary = None;
            }
            ForceOutcome::Released
        }
        None => ForceOutcome::Void,
    };
    let records = std::sync::Arc::make_mut(&mut next.force_releases);
    if let Some(decided) = records.iter_mut().find(|r| r.id == id) {
        decided.approved_by = Some(principal.to_owned());
        decided.approved_at = Some(now);
        decided.outcome = outcome;
    }
    prune(records, now);
    Ok(Decided::Write(Box::new(next)))
}

/// Keeps every open request and the newest [`KEPT`] others (by request time).
fn prune(records: &mut Vec<ForceRelease>, now: DateTime<Utc>) {
    let closed = records.iter().filter(|r| !r.is_open(now)).count();
    let mut excess = closed.saturating_sub(KEPT);
    if excess == 0 {
        return;
    }
    records.sort_by_key(|r| r.requested_at);
    records.retain(|r| {
        let drop = excess > 0 && !r.is_open(now);
        excess -= usize::from(drop);
        !drop
    });
}

/// The approval a force-release request is waiting for, or what became of it, as of `now`.
pub fn status(record: &ForceRelease, now: DateTime<Utc>) -> &'static str {
    match record.outcome {
        ForceOutcome::Requested if now > record.approve_by => "expired",
        outcome => outcome.as_str(),
    }
}

#[cfg(test)]
#[path = "force_release_tests.rs"]
mod tests;
