//! The lock lifecycle as pure functions over (document, request, now).
//!
//! `preLock -> hardDelete -> write -> swap`, with renew and release from any live
//! phase. Each function either returns the next document or a typed refusal; the
//! client turns a returned document into exactly one ETag-conditional write. Nothing
//! here reads a clock or a store, so every rule is testable on its own.

use std::time::Duration;

use chrono::{DateTime, Utc};
use serde_json::Map;

use super::document::{LocationDocument, LockInfo, LockToken, Phase, Section};
use crate::clock::to_chrono;

/// Why a lock operation was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LockError {
    /// Another token holds a live lock.
    #[error("another migration holds a live lock until {expires_at}")]
    LockHeld {
        /// When the holder's current lease ends.
        expires_at: DateTime<Utc>,
    },
    /// The presented token is not the live lock's.
    #[error("the token does not match the live lock")]
    TokenMismatch,
    /// The presented token's lease has lapsed: it can do nothing any more.
    #[error("the lock's lease expired at {expired_at}")]
    LeaseExpired {
        /// When it lapsed.
        expired_at: DateTime<Utc>,
    },
    /// Not allowed from the current state (wrong order, too early, wrong phase).
    #[error("invalid transition: {0}")]
    InvalidTransition(String),
    /// A requested duration or value is out of the service's bounds.
    #[error("invalid request: {0}")]
    InvalidRequest(String),
}

/// The service's timing rules for locks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LockPolicy {
    /// Declared convergence delay: max cache TTL across tiers + replication bound.
    pub convergence_delay: Duration,
    /// The longest pre-lock (parent lease) the service grants, renewals included.
    pub max_pre_lock: Duration,
}

impl LockPolicy {
    /// The honest declaration: convergence delay = largest cache TTL + replication bound.
    pub fn declared(max_cache_ttl: Duration, replication_bound: Duration, max_pre_lock: Duration) -> Self {
        Self { convergence_delay: max_cache_ttl + replication_bound, max_pre_lock }
    }
}

/// A pre-lock request.
#[derive(Debug, Clone)]
pub struct PreLockRequest {
    /// Who is migrating (free text for operators).
    pub owner: String,
    /// Requested pre-lock lease, counted from effectiveAt.
    pub duration: Duration,
    /// Target location, if the orchestrator already knows it.
    pub target_location: Option<String>,
}

/// Grants a pre-lock under the new `token`.
///
/// effectiveAt = now + convergence delay; the pre-lock lease runs `duration` past
/// effectiveAt, and `max_pre_lock` past it is the ceiling for every later renewal.
pub fn pre_lock(
    doc: &LocationDocument,
    req: &PreLockRequest,
    token: LockToken,
    policy: &LockPolicy,
    now: DateTime<Utc>,
) -> Result<LocationDocument, LockError> {
    if let Some(live) = doc.live_lock(now) {
        return Err(LockError::LockHeld { expires_at: live.expires_at });
    }
    // A swap's guard keeps the old location refusing writes until caches converge on
    // the new one; a new target elsewhere would overwrite it, so wait for it to lapse.
    // (A new migration back to the guarded location locks it anyway, for longer.)
    if let Some(guard) = swap_guard(doc, now) {
        if req.target_location.as_deref().is_some_and(|t| t != doc.secondary.as_ref().map_or("", |s| s.location.as_str())) {
            return Err(LockError::LockHeld { expires_at: guard.expires_at });
        }
    }
    if req.duration.is_zero() {
        return Err(LockError::InvalidRequest("durationSeconds must be positive".into()));
    }
    if req.duration > policy.max_pre_lock {
        return Err(LockError::InvalidRequest(format!(
            "durationSeconds {} exceeds the service maximum pre-lock of {}",
            req.duration.as_secs_f64(),
            policy.max_pre_lock.as_secs_f64()
        )));
    }
    if req.target_location.as_deref() == Some(doc.primary.location.as_str()) {
        return Err(LockError::InvalidRequest("targetLocation is the current location".into()));
    }
    let effective_at = now + to_chrono(policy.convergence_delay);
    let expires_at = effective_at + to_chrono(req.duration);
    let lock = LockInfo {
        token,
        phase: Phase::PreLock,
        owner: req.owner.clone(),
        acquired_at: now,
        effective_at,
        expires_at,
        pre_lock_expires_at: expires_at,
        max_expires_at: effective_at + to_chrono(policy.max_pre_lock),
        renewals: 0,
        extra: Map::new(),
    };
    let mut next = doc.clone();
    // Keep unknown fields a newer version may have put on the section or an old lock.
    next.primary.lock = Some(match &doc.primary.lock {
        Some(old) => LockInfo { extra: old.extra.clone(), ..lock.clone() },
        None => lock.clone(),
    });
    next.migrating = true;
    // A declared target is locked so it refuses writes before cutover; without one, a
    // previous swap's guard on the old location stays until it lapses.
    if let Some(target) = &req.target_location {
        next.secondary = Some(Section {
            location: target.clone(),
            lock: Some(LockInfo { extra: Map::new(), ..lock }),
            extra: Map::new(),
        });
    }
    Ok(next)
}

/// The live lock held by `token`, or the refusal explaining why there is none.
pub fn held_lock<'a>(doc: &'a LocationDocument, token: &LockToken, now: DateTime<Utc>) -> Result<&'a LockInfo, LockError> {
    match &doc.primary.lock {
        Some(lock) if lock.token.matches(token) => {
            if lock.is_live(now) {
                Ok(lock)
            } else {
                Err(LockError::LeaseExpired { expired_at: lock.expires_at })
            }
        }
        _ => Err(LockError::TokenMismatch),
    }
}

/// The live lock on `secondary` left by a swap (not the current migration's target).
fn swap_guard(doc: &LocationDocument, now: DateTime<Utc>) -> Option<&LockInfo> {
    let guard = doc.secondary.as_ref()?.lock.as_ref().filter(|l| l.is_live(now))?;
    let own_target = doc.primary.lock.as_ref().is_some_and(|p| p.token.matches(&guard.token));
    (!own_target).then_some(guard)
}

/// Keeps the declared target's lock as long as the migration's parent lease.
fn sync_target_lock(doc: &mut LocationDocument, token: &LockToken) {
    let Some(parent) = doc.primary.lock.as_ref().map(|l| (l.pre_lock_expires_at, l.renewals)) else { return };
    if let Some(target) = doc.secondary.as_mut().and_then(|s| s.lock.as_mut()).filter(|l| l.token.matches(token)) {
        target.expires_at = parent.0;
        target.pre_lock_expires_at = parent.0;
        target.renewals = parent.1;
    }
}

/// Escalates the live lock to `phase` (`hardDelete` from `preLock`, `write` from
/// `hardDelete`), with a new lease of `duration` that never outlives the pre-lock.
pub fn escalate(
    doc: &LocationDocument,
    token: &LockToken,
    phase: Phase,
    duration: Duration,
    now: DateTime<Utc>,
) -> Result<LocationDocument, LockError> {
    let lock = held_lock(doc, token, now)?;
    let allowed = matches!((lock.phase, phase), (Phase::PreLock, Phase::HardDelete) | (Phase::HardDelete, Phase::Write));
    if !allowed {
        return Err(LockError::InvalidTransition(format!("cannot escalate from {} to {}", lock.phase, phase)));
    }
    if now < lock.effective_at {
        return Err(LockError::InvalidTransition(format!(
            "cannot escalate before effectiveAt {} (caches may not have converged)",
            lock.effective_at.to_rfc3339()
        )));
    }
    if duration.is_zero() {
        return Err(LockError::InvalidRequest("durationSeconds must be positive".into()));
    }
    let ceiling = lock.pre_lock_expires_at.min(lock.max_expires_at);
    let mut next = doc.clone();
    let new = next.primary.lock.as_mut().expect("held_lock found it");
    new.phase = phase;
    new.expires_at = (now + to_chrono(duration)).min(ceiling);
    Ok(next)
}

/// Extends the live lock's lease by `duration` from now, never shortening it and never
/// past the parent lease or the maximum. Renewing a pre-lock extends the parent lease
/// itself, up to the maximum.
pub fn renew(doc: &LocationDocument, token: &LockToken, duration: Duration, now: DateTime<Utc>) -> Result<LocationDocument, LockError> {
    let lock = held_lock(doc, token, now)?;
    if duration.is_zero() {
        return Err(LockError::InvalidRequest("durationSeconds must be positive".into()));
    }
    let wanted = match lock.phase {
        // A pre-lock's lease counts from effectiveAt, as at acquisition.
        Phase::PreLock => now.max(lock.effective_at) + to_chrono(duration),
        Phase::HardDelete | Phase::Write => now + to_chrono(duration),
    };
    let ceiling = match lock.phase {
        Phase::PreLock => lock.max_expires_at,
        Phase::HardDelete | Phase::Write => lock.pre_lock_expires_at.min(lock.max_expires_at),
    };
    let mut next = doc.clone();
    let new = next.primary.lock.as_mut().expect("held_lock found it");
    new.expires_at = wanted.min(ceiling).max(lock.expires_at);
    if lock.phase == Phase::PreLock {
        new.pre_lock_expires_at = new.expires_at;
    }
    new.renewals = lock.renewals.saturating_add(1);
    sync_target_lock(&mut next, token);
    Ok(next)
}

/// Cuts over to `target`: location switched, lock cleared and the old location held
/// in `secondary` (locked until caches converge on the new one), all in one document.
pub fn swap(doc: &LocationDocument, token: &LockToken, target: &str, now: DateTime<Utc>) -> Result<LocationDocument, LockError> {
    let lock = held_lock(doc, token, now)?;
    if lock.phase != Phase::Write {
        return Err(LockError::InvalidTransition(format!("swap needs a write lock; the lock is in {}", lock.phase)));
    }
    if target.is_empty() || target == doc.primary.location {
        return Err(LockError::InvalidRequest(format!("targetLocation {target:?} is not a different location")));
    }
    let declared_by_this_lock =
        |s: &&Section| s.lock.as_ref().is_some_and(|l| l.token.matches(token)) && s.location != target;
    if let Some(declared) = doc.secondary.as_ref().filter(declared_by_this_lock) {
        return Err(LockError::InvalidRequest(format!(
            "targetLocation {target:?} differs from the {:?} declared at pre-lock",
            declared.location
        )));
    }
    let old_location = doc.primary.location.clone();
    let convergence = lock.convergence_delay();
    let guard = LockInfo {
        phase: Phase::Write,
        effective_at: now,
        expires_at: now + convergence,
        pre_lock_expires_at: now + convergence,
        max_expires_at: now + convergence,
        extra: Map::new(),
        ..lock.clone()
    };
    let mut next = doc.clone();
    next.primary.location = target.to_owned();
    next.primary.lock = None;
    next.secondary = Some(Section { location: old_location, lock: Some(guard), extra: Map::new() });
    next.migrating = false;
    Ok(next)
}

/// Releases the live lock held by `token`; the location stays as it is.
pub fn release(doc: &LocationDocument, token: &LockToken, now: DateTime<Utc>) -> Result<LocationDocument, LockError> {
    held_lock(doc, token, now)?;
    let mut next = doc.clone();
    next.primary.lock = None;
    next.migrating = false;
    if next.secondary.as_ref().is_some_and(|s| s.lock.as_ref().is_some_and(|l| l.token.matches(token))) {
        next.secondary = None;
    }
    Ok(next)
}

#[cfg(test)]
#[path = "lifecycle_tests.rs"]
mod tests;
