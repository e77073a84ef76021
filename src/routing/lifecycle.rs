//! The lock lifecycle as pure functions over (document, request, now).
//!
//! `preLock -> hardDelete -> write -> swap`, with renew and release from any live
//! phase. Each transition either returns the next document or a typed refusal; the
//! client turns a returned document into exactly one ETag-conditional write. Nothing
//! here reads a clock or a store, so every rule is testable on its own, and the model
//! checker (`tests/model.rs`) runs these same functions.
//!
//! Three layers, each built on the one before:
//!
//! - the transitions ([`pre_lock`], [`escalate`], [`renew`], [`swap`], [`release`]);
//! - [`settle`]: what a written document means once the store has committed it. A
//!   write is decided on one clock and lands later on the store's, so two rules are
//!   judged by the commit time every reader gets with the version: a pre-lock restricts
//!   nothing before its commit + the declared delay + the skew margin, and a call that
//!   relied on a live lease is void when it landed after that lease ended;
//! - [`decide`]: a lock call with its idempotency key. A repeated call returns the
//!   first call's outcome instead of acting again, and a writer recognises its own
//!   committed write after an ambiguous answer.

use std::borrow::Cow;
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, TimeDelta, Utc};
use serde_json::Map;

use crate::clock::to_chrono;
use crate::document::{
    digest_hex, CallKind, LocationDocument, LockInfo, LockToken, OperationRecord, PendingEffect, Phase, Section,
    FORMAT_2, NEWEST_FORMAT,
};

/// Why a lock operation was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LockError {
    /// Another token holds a live lock.
    #[error("another migration holds a live lock until {expires_at}")]
    LockHeld {
        /// When a new lock can be granted: the holder's current lease has ended for
        /// everyone (its end + twice the skew margin, by the deciding clock).
        expires_at: DateTime<Utc>,
    },
    /// The presented token is not the live lock's.
    #[error("the token does not match the live lock")]
    TokenMismatch,
    /// The presented token's lock was removed by an approved force-release: it can do
    /// nothing any more, on any instance.
    #[error("the lock was force-released at {at} (request {request}, approved by {approved_by})")]
    ForceReleased {
        /// The force-release request that removed it.
        request: String,
        /// Who approved it.
        approved_by: String,
        /// When.
        at: DateTime<Utc>,
    },
    /// A force-release was approved by the principal who requested it: it takes two.
    #[error("{principal} requested this force-release and cannot approve it: a second person must")]
    SelfApproval {
        /// The principal.
        principal: String,
    },
    /// No force-release request with this id is in the document.
    #[error("no force-release request {0} on this resource")]
    UnknownForceRelease(String),
    /// The force-release request's approval window ended before the approval.
    #[error("the force-release request's approval window ended at {approve_by}")]
    ForceReleaseExpired {
        /// The end of its window.
        approve_by: DateTime<Utc>,
    },
    /// A force-release was requested for a lock the resource no longer holds in that
    /// phase (another token, a later phase): the requester must look again.
    #[error("the resource's lock is not the one named (another token or another phase): look at it again")]
    ForceReleaseTargetChanged,
    /// The resource already has as many force-release requests waiting as it keeps.
    #[error("{open} force-release requests already wait for an approval on this resource")]
    ForceReleasesFull {
        /// How many wait.
        open: usize,
    },
    /// The force-release request was decided already (released or void) by another
    /// approval.
    #[error("the force-release request was already decided ({outcome})")]
    ForceReleaseDecided {
        /// `released` or `void`.
        outcome: &'static str,
    },
    /// The presented token's lease has lapsed: it can do nothing any more.
    #[error("the lock's lease expired at {expired_at}")]
    LeaseExpired {
        /// When it lapsed.
        expired_at: DateTime<Utc>,
    },
    /// A repeated pre-lock whose lock lapsed and was replaced by another since: when
    /// it lapsed is no longer in the document.
    #[error("the lock this key took lapsed, and another lock was taken since")]
    LapsedAndReplaced,
    /// Not allowed from the current state (wrong order, too early, wrong phase).
    #[error("invalid transition: {0}")]
    InvalidTransition(String),
    /// A requested duration or value is out of the service's bounds.
    #[error("invalid request: {0}")]
    InvalidRequest(String),
    /// The idempotency key was used before for a different request.
    #[error("the idempotency key was already used for a different request")]
    KeyReused,
    /// The document already keeps as many records of keyed calls inside their windows
    /// as the policy allows: a new one would mean forgetting a key still honoured.
    #[error(
        "this resource already keeps {kept} idempotency records still honoured (the most it keeps); \
         repeat after {retry_at}, or send the call without an Idempotency-Key"
    )]
    RecordsFull {
        /// How many it keeps.
        kept: usize,
        /// When the oldest of them leaves its window.
        retry_at: DateTime<Utc>,
        /// From the decision to `retry_at`.
        retry_after: Duration,
    },
}

/// Deliberate deviations from the protocol: the behaviours of earlier versions and the
/// broken designs that the fault campaign, the release gate and the model checker must
/// catch. All off in the shipped protocol.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct Deviations {
    /// `effectiveAt` counts from the decider's clock, not from the store's commit
    /// (version 1): a pre-lock that lands late starts restricting too early.
    pub legacy_effective_at: bool,
    /// A renewal takes effect whenever it lands, also after its lease lapsed (version 1).
    pub legacy_renewal: bool,
    /// Escalation is granted before `effectiveAt`.
    pub early_escalation: bool,
    /// Caches serve a document whose lock has started instead of reading through.
    pub cache_serves_started_locks: bool,
    /// A hardDelete or write lease (escalated or renewed) is capped only at the maximum,
    /// not at the pre-lock: a child lease outlives its parent.
    pub uncapped_child_lease: bool,
    /// A pre-lock longer than the service maximum is granted, and a pre-lock's
    /// renewal is not capped at the maximum.
    pub uncapped_pre_lock: bool,
    /// A renewal is acknowledged (and counted) but leaves the lease where it was.
    pub renewal_not_extended: bool,
    /// Contract 1.1's record keeping: at most [`LockPolicy::keyed_records`] records, the
    /// oldest dropped for a new one even inside its window, so a delayed repeat of a
    /// pre-lock whose record was dropped gets a fresh lock nobody learned.
    pub legacy_record_eviction: bool,
}

/// The service's timing rules for locks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LockPolicy {
    /// Declared convergence delay: max cache TTL across tiers + replication bound.
    pub convergence_delay: Duration,
    /// The longest pre-lock (parent lease) the service grants, renewals included.
    pub max_pre_lock: Duration,
    /// The largest difference tolerated between any two clocks that judge a lock (the
    /// service instances and the store): restrictions start this much after the
    /// converged instant and end this much after the lease, by the local clock.
    pub skew_margin: Duration,
    /// How many records of calls made under a caller's `Idempotency-Key` a document
    /// keeps inside their windows; a keyed call that would need one more is refused
    /// ([`LockError::RecordsFull`]) rather than forget a key still honoured.
    pub keyed_records: usize,
    /// The newest document format this library writes ([`crate::document::FORMAT_1`] or
    /// [`NEWEST_FORMAT`]). Format 1 is the *expand* step of a rollout over readers of
    /// format 1 only: every write is settled at its decision instead of carrying a
    /// pending effect, so an older reader can read it, and the guarantees that need the
    /// commit time (effective from the commit, no resurrected lease) are given up until
    /// the fleet writes the newest format again (docs/release-gate.md, "Rolling out a
    /// new document format").
    pub write_format: u64,
    /// How long a force-release request waits for its second person
    /// ([`crate::routing::force_release`]); an approval after it is refused.
    pub force_release_window: Duration,
    /// Off in the shipped protocol; see [`Deviations`].
    pub deviations: Deviations,
}

/// The keyed records a document keeps when none is configured. With keys of the
/// longest length the contract allows a document at the budget is about 75 KB, well under
/// Cosmos DB's 2 MB item limit (docs/contract.md, version 1.3, states the sum).
pub const DEFAULT_KEYED_RECORDS: usize = 256;

/// How long a force-release request waits for an approval when nothing else is
/// configured: long enough to reach a second person on call, short enough that an
/// approval is given for the lock as the requester saw it.
pub const DEFAULT_FORCE_RELEASE_WINDOW: Duration = Duration::from_secs(3600);

/// How many records of keyless calls (`w:` keys) a document keeps, the newest. Only the
/// call that wrote one ever looks for it (its own retries, within that one call), so the
/// newest few are enough and they never take a keyed record's place.
pub const KEYLESS_RECORDS: usize = 16;

/// The skew margin when none is configured.
pub const DEFAULT_SKEW_MARGIN: Duration = Duration::from_millis(500);

impl LockPolicy {
    /// A policy declaring `convergence_delay`, with the default skew margin and no deviations.
    pub fn new(convergence_delay: Duration, max_pre_lock: Duration) -> Self {
        Self {
            convergence_delay,
            max_pre_lock,
            skew_margin: DEFAULT_SKEW_MARGIN,
            keyed_records: DEFAULT_KEYED_RECORDS,
            write_format: NEWEST_FORMAT,
            force_release_window: DEFAULT_FORCE_RELEASE_WINDOW,
            deviations: Deviations::default(),
        }
    }

    /// The honest declaration: convergence delay = largest cache TTL + replication bound.
    pub fn declared(max_cache_ttl: Duration, replication_bound: Duration, max_pre_lock: Duration) -> Self {
        Self::new(max_cache_ttl + replication_bound, max_pre_lock)
    }

    fn margin(&self) -> TimeDelta {
        to_chrono(self.skew_margin)
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

/// `t + d`, refused rather than overflowing (a panic on input is never an answer).
fn later(t: DateTime<Utc>, d: TimeDelta) -> Result<DateTime<Utc>, LockError> {
    t.checked_add_signed(d)
        .ok_or_else(|| LockError::InvalidRequest("a requested duration reaches past the representable time".into()))
}

/// Whether `lock` may still restrict someone by some clock within the margin: its
/// lease has not ended for everyone yet.
fn possibly_live(lock: &LockInfo, now: DateTime<Utc>, margin: TimeDelta) -> bool {
    now < lock.expires_at.checked_add_signed(margin).unwrap_or(DateTime::<Utc>::MAX_UTC)
}

fn positive(field: &str, duration: Duration) -> Result<(), LockError> {
    if duration.is_zero() {
        return Err(LockError::InvalidRequest(format!("{field} must be positive")));
    }
    Ok(())
}

/// Grants a pre-lock under the new `token`.
///
/// The lock restricts nothing until `effectiveAt`, the decide time + convergence delay +
/// skew margin, which [`settle`] moves to the store's commit + the same once the commit
/// time is known; the pre-lock lease runs `duration` past effectiveAt, and
/// `max_pre_lock` past it is the ceiling for every later renewal. A malformed request
/// is refused before the lock state is looked at. A new token is issued only once the
/// previous lease has ended, and its margin too, by every clock within the skew margin
/// of the deciding one (the end + twice the margin by the deciding clock).
pub fn pre_lock(
    doc: &LocationDocument,
    req: &PreLockRequest,
    token: LockToken,
    policy: &LockPolicy,
    now: DateTime<Utc>,
) -> Result<LocationDocument, LockError> {
    positive("durationSeconds", req.duration)?;
    if req.duration > policy.max_pre_lock && !policy.deviations.uncapped_pre_lock {
        return Err(LockError::InvalidRequest(format!(
            "durationSeconds {} exceeds the service maximum pre-lock of {}",
            req.duration.as_secs_f64(),
            policy.max_pre_lock.as_secs_f64()
        )));
    }
    if req.target_location.as_deref() == Some(doc.primary.location.as_str()) {
        return Err(LockError::InvalidRequest("targetLocation is the current location".into()));
    }
    let margin = policy.margin();
    // An instance enforces an ended lease until its end + the margin by its own clock,
    // and a new lock replaces the old one for every reader. So the grant waits twice
    // the margin by the deciding clock: any other clock (within the margin of this one)
    // then reads at least the end + the margin, and no instance's enforcement of the
    // old lease is cut short by the new lock (contract 1.3, "One rule in the margin").
    let everyone_done = margin + margin;
    if let Some(held) = doc.primary.lock.as_ref().filter(|l| possibly_live(l, now, everyone_done)) {
        return Err(LockError::LockHeld { expires_at: later(held.expires_at, everyone_done)? });
    }
    // A swap's guard keeps the old location refusing writes until caches converge on
    // the new one; a new target elsewhere would overwrite it, so wait for it to lapse.
    // (A new migration back to the guarded location locks it anyway, for longer.)
    if let Some(guard) = swap_guard(doc, now) {
        if req
            .target_location
            .as_deref()
            .is_some_and(|t| t != doc.secondary.as_ref().map_or("", |s| s.location.as_str()))
        {
            return Err(LockError::LockHeld { expires_at: guard.expires_at });
        }
    }
    let delay = to_chrono(policy.convergence_delay);
    let start_after = if policy.deviations.legacy_effective_at { delay } else { delay + margin };
    let effective_at = later(now, start_after)?;
    let expires_at = later(effective_at, to_chrono(req.duration))?;
    let lock = LockInfo {
        token,
        phase: Phase::PreLock,
        owner: req.owner.clone(),
        acquired_at: now,
        effective_at,
        expires_at,
        pre_lock_expires_at: expires_at,
        max_expires_at: later(effective_at, to_chrono(policy.max_pre_lock))?,
        renewals: 0,
        convergence_delay_seconds: Some(policy.convergence_delay.as_secs_f64()),
        phase_since: None,
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
    let effective_after_commit_seconds = (!policy.deviations.legacy_effective_at).then(|| start_after.as_seconds_f64());
    seal(&mut next, PendingEffect { effective_after_commit_seconds, phase_starts: true, ..PendingEffect::empty() });
    Ok(next)
}

/// The live lock held by `token`, or the refusal explaining why there is none. The
/// holder's lease ends at `expiresAt` by the deciding clock (readers keep enforcing for
/// the skew margin beyond it, so the two never leave a gap). A token whose lock was
/// force-released is told so ([`LockError::ForceReleased`]) while the record is kept.
pub fn held_lock<'a>(
    doc: &'a LocationDocument,
    token: &LockToken,
    now: DateTime<Utc>,
) -> Result<&'a LockInfo, LockError> {
    match &doc.primary.lock {
        Some(lock) if lock.token.matches(token) => {
            if lock.is_live(now) {
                Ok(lock)
            } else {
                Err(LockError::LeaseExpired { expired_at: lock.expires_at })
            }
        }
        _ => Err(fenced(doc, &token.digest()).unwrap_or(LockError::TokenMismatch)),
    }
}

/// The refusal of a token (by its digest) whose lock an approved force-release removed.
pub(crate) fn fenced(doc: &LocationDocument, lock: &str) -> Option<LockError> {
    let record = doc.force_releases.iter().find(|r| r.fences(lock))?;
    Some(LockError::ForceReleased {
        request: record.id.clone(),
        approved_by: record.approved_by.clone().unwrap_or_default(),
        at: record.approved_at.unwrap_or(record.requested_at),
    })
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

/// A call decided while `lease_end` was live is void if the store commits it later:
/// the readers that saw the lapse and treated it as final must never be contradicted.
fn lease_bound(doc: &LocationDocument, lease_end: DateTime<Utc>, phase_starts: bool) -> PendingEffect {
    PendingEffect {
        void_if_committed_after: Some(lease_end),
        previous: Some(Arc::new(LocationDocument {
            operations: Arc::default(),
            force_releases: Arc::default(),
            pending: None,
            ..doc.clone()
        })),
        phase_starts,
        ..PendingEffect::empty()
    }
}

/// Escalates the live lock to `phase` (`hardDelete` from `preLock`, `write` from
/// `hardDelete`), with a new lease of `duration` that never outlives the pre-lock.
/// Refused before `effectiveAt`; void if it lands after the current lease.
pub fn escalate(
    doc: &LocationDocument,
    token: &LockToken,
    phase: Phase,
    duration: Duration,
    policy: &LockPolicy,
    now: DateTime<Utc>,
) -> Result<LocationDocument, LockError> {
    positive("durationSeconds", duration)?;
    let lock = held_lock(doc, token, now)?;
    let allowed =
        matches!((lock.phase, phase), (Phase::PreLock, Phase::HardDelete) | (Phase::HardDelete, Phase::Write));
    if !allowed {
        return Err(LockError::InvalidTransition(format!("cannot escalate from {} to {}", lock.phase, phase)));
    }
    if now < lock.effective_at && !policy.deviations.early_escalation {
        return Err(LockError::InvalidTransition(format!(
            "cannot escalate before effectiveAt {} (caches may not have converged)",
            lock.effective_at.to_rfc3339()
        )));
    }
    let ceiling = child_ceiling(lock, policy);
    let lease_end = lock.expires_at;
    let mut next = doc.clone();
    let new = next.primary.lock.as_mut().expect("held_lock found it");
    new.phase = phase;
    new.expires_at = later(now, to_chrono(duration))?.min(ceiling);
    new.phase_since = None;
    let pending = lease_bound(doc, lease_end, true);
    seal(&mut next, pending);
    Ok(next)
}

/// The latest a hardDelete or write lease may end: the pre-lock's end and the maximum.
fn child_ceiling(lock: &LockInfo, policy: &LockPolicy) -> DateTime<Utc> {
    if policy.deviations.uncapped_child_lease {
        lock.max_expires_at
    } else {
        lock.pre_lock_expires_at.min(lock.max_expires_at)
    }
}

/// Extends the live lock's lease by `duration` from now, never shortening it and never
/// past the parent lease or the maximum. Renewing a pre-lock extends the parent lease
/// itself, up to the maximum. Void if it lands after the lease it extends: a lapsed
/// lease is never resurrected.
pub fn renew(
    doc: &LocationDocument,
    token: &LockToken,
    duration: Duration,
    policy: &LockPolicy,
    now: DateTime<Utc>,
) -> Result<LocationDocument, LockError> {
    positive("durationSeconds", duration)?;
    let lock = held_lock(doc, token, now)?;
    let wanted = match lock.phase {
        // A pre-lock's lease counts from effectiveAt, as at acquisition.
        Phase::PreLock => later(now.max(lock.effective_at), to_chrono(duration))?,
        Phase::HardDelete | Phase::Write => later(now, to_chrono(duration))?,
    };
    let ceiling = match lock.phase {
        Phase::PreLock if policy.deviations.uncapped_pre_lock => DateTime::<Utc>::MAX_UTC,
        Phase::PreLock => lock.max_expires_at,
        Phase::HardDelete | Phase::Write => child_ceiling(lock, policy),
    };
    let lease_end = lock.expires_at;
    let mut next = doc.clone();
    let new = next.primary.lock.as_mut().expect("held_lock found it");
    new.expires_at =
        if policy.deviations.renewal_not_extended { lock.expires_at } else { wanted.min(ceiling).max(lock.expires_at) };
    if lock.phase == Phase::PreLock {
        new.pre_lock_expires_at = new.expires_at;
    }
    new.renewals = lock.renewals.saturating_add(1);
    sync_target_lock(&mut next, token);
    let pending =
        if policy.deviations.legacy_renewal { PendingEffect::empty() } else { lease_bound(doc, lease_end, false) };
    seal(&mut next, pending);
    Ok(next)
}

/// Cuts over to `target`: location switched, lock cleared and the old location held
/// in `secondary` (locked until caches converge on the new one), all in one document.
/// Void if it lands after the write lock's lease: the location then stays where it was.
pub fn swap(
    doc: &LocationDocument,
    token: &LockToken,
    target: &str,
    policy: &LockPolicy,
    now: DateTime<Utc>,
) -> Result<LocationDocument, LockError> {
    if target.is_empty() {
        return Err(LockError::InvalidRequest("targetLocation must not be empty".into()));
    }
    // Judged after the token: a swap repeated after it took effect (by another key) is
    // told that its token no longer holds, not that its request was malformed.
    let lock = held_lock(doc, token, now)?;
    if target == doc.primary.location {
        return Err(LockError::InvalidRequest(format!("targetLocation {target:?} is not a different location")));
    }
    if lock.phase != Phase::Write {
        return Err(LockError::InvalidTransition(format!("swap needs a write lock; the lock is in {}", lock.phase)));
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
    let guard_end = later(now, lock.convergence_delay() + policy.margin())?;
    let guard = LockInfo {
        phase: Phase::Write,
        effective_at: now,
        expires_at: guard_end,
        pre_lock_expires_at: guard_end,
        max_expires_at: guard_end,
        phase_since: None,
        ..lock.clone()
    };
    let lease_end = lock.expires_at;
    // Fields other versions wrote stay with what they describe: the old location's
    // section (now the guarded secondary), the declared target's (now the primary), the
    // lock (now the guard, under the same token).
    let target_extra = doc.secondary.as_ref().filter(|s| s.location == target).map(|s| s.extra.clone());
    let mut next = doc.clone();
    let old_primary = std::mem::replace(
        &mut next.primary,
        Section { location: target.to_owned(), lock: None, extra: target_extra.unwrap_or_default() },
    );
    next.secondary = Some(Section { location: old_location, lock: Some(guard), extra: old_primary.extra });
    next.migrating = false;
    let pending = lease_bound(doc, lease_end, false);
    seal(&mut next, pending);
    Ok(next)
}

/// Releases the live lock held by `token`; the location stays as it is. A release
/// that lands late only lifts what had lapsed already, so it carries no condition.
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

impl PendingEffect {
    fn empty() -> Self {
        Self {
            effective_after_commit_seconds: None,
            void_if_committed_after: None,
            previous: None,
            phase_starts: false,
            key: None,
            digest: String::new(),
        }
    }

    fn is_empty(&self) -> bool {
        self.effective_after_commit_seconds.is_none() && self.void_if_committed_after.is_none() && !self.phase_starts
    }
}

/// Attaches the commit-dependent effect of a write to the document it writes, sealed
/// with the digest of that document's state.
fn seal(next: &mut LocationDocument, mut pending: PendingEffect) {
    if pending.is_empty() {
        next.pending = None;
        return;
    }
    pending.digest = next.state_digest();
    next.pending = Some(Arc::new(pending));
}

/// The document as every reader must take it, given that the store committed this
/// version at `committed_at` (an upper bound, on the store's clock).
///
/// A pre-lock's `effectiveAt` and the leases counted from it move no earlier than the
/// commit + the recorded delay; a lease-bound call that landed after its lease is void
/// and the document it replaced stands (its lock lapsed); a phase's start becomes the
/// commit time. The result carries no pending effect: it is what the next write stores.
/// A pending record left unchanged by a writer that does not know it (its digest no
/// longer matches the state) is dropped, not applied to someone else's write.
pub fn settle(doc: LocationDocument, committed_at: DateTime<Utc>) -> LocationDocument {
    settle_checked(doc, committed_at, true)
}

/// [`settle`] for a document [`decide`] produced and the caller has just written, as it
/// was decided: its pending record was sealed on exactly this state (after sealing,
/// `decide` only adds the call's record and key, which the digest does not cover), so
/// the digest, which guards against a record another writer left behind, is not
/// computed again. Every document read from a store goes through [`settle`].
pub fn settle_own_write(doc: LocationDocument, committed_at: DateTime<Utc>) -> LocationDocument {
    settle_checked(doc, committed_at, false)
}

/// [`settle`] for a reader that only looks at the state: the document itself, lent,
/// when settling would change nothing in it but drop its pending record (which such a
/// reader ignores), so the common case copies nothing; a settled copy otherwise.
pub fn settle_view(doc: &LocationDocument, committed_at: DateTime<Utc>) -> Cow<'_, LocationDocument> {
    match &doc.pending {
        Some(pending) if Effects::of(doc, pending, committed_at).any() => Cow::Owned(settle(doc.clone(), committed_at)),
        _ => Cow::Borrowed(doc),
    }
}

/// What a pending record would do to the document it rides on, committed at a time.
struct Effects {
    /// The write landed at or after its lease's end: it is void.
    is_void: bool,
    /// The earliest the lock may take effect (commit + the recorded delay).
    floor: Option<DateTime<Utc>>,
    /// The lock would move to start no earlier than `floor`.
    shifts: bool,
    /// A phase starts at the commit.
    starts_phase: bool,
}

impl Effects {
    fn of(doc: &LocationDocument, pending: &PendingEffect, committed_at: DateTime<Utc>) -> Self {
        // At the deadline itself the lease has ended (it is live only while `now < expiresAt`),
        // and a reader whose clock runs ahead by the margin may already have taken the lapse
        // as final: a write committed then is as late as one committed after it.
        let is_void = pending.void_if_committed_after.is_some_and(|deadline| committed_at >= deadline);
        let floor = pending.effective_after_commit_seconds.map(|seconds| {
            TimeDelta::try_milliseconds((seconds * 1000.0).ceil() as i64)
                .and_then(|d| committed_at.checked_add_signed(d))
                .unwrap_or(DateTime::<Utc>::MAX_UTC)
        });
        let lock = doc.primary.lock.as_ref();
        let shifts = lock.is_some_and(|l| floor.is_some_and(|floor| l.effective_at < floor));
        let starts_phase = pending.phase_starts && lock.is_some();
        Self { is_void, floor, shifts, starts_phase }
    }

    fn any(&self) -> bool {
        self.is_void || self.shifts || self.starts_phase
    }
}

fn settle_checked(mut doc: LocationDocument, committed_at: DateTime<Utc>, check_digest: bool) -> LocationDocument {
    let Some(pending) = doc.pending.take() else { return doc };
    let effects = Effects::of(&doc, &pending, committed_at);
    if !effects.any() {
        // Nothing to apply: the document stands as written whether the record is its
        // writer's or was left behind, so the digest (hashing the sections, most of a
        // settle's cost) need not be checked.
        return doc;
    }
    if check_digest && pending.digest != doc.state_digest() {
        return doc;
    }
    if effects.is_void {
        return void(doc, Arc::unwrap_or_clone(pending));
    }
    if let Some(floor) = effects.floor {
        start_no_earlier_than(&mut doc, floor);
    }
    if effects.starts_phase {
        if let Some(lock) = doc.primary.lock.as_mut() {
            lock.phase_since = Some(committed_at);
        }
    }
    doc
}

/// A void write: the document it replaced, with the operations recorded since (but
/// not the void call's own record: it took no effect, and its repeat must say so) and
/// the force-release records as written.
fn void(doc: LocationDocument, pending: PendingEffect) -> LocationDocument {
    let Some(previous) = pending.previous else {
        // Written without its predecessor (never by this library): the safe reading is
        // that the lease ended where the call needed it.
        let mut doc = doc;
        if let (Some(lock), Some(end)) = (doc.primary.lock.as_mut(), pending.void_if_committed_after) {
            lock.expires_at = lock.expires_at.min(end);
        }
        return doc;
    };
    let own = pending.key;
    let operations = Arc::new(doc.operations.iter().filter(|r| Some(&*r.key) != own.as_deref()).cloned().collect());
    LocationDocument {
        operations,
        force_releases: doc.force_releases,
        pending: None,
        extra: doc.extra,
        ..Arc::unwrap_or_clone(previous)
    }
}

/// Moves the primary lock (and the target lock of the same token) so that it starts no
/// earlier than `floor`, its leases counted from the new start.
fn start_no_earlier_than(doc: &mut LocationDocument, floor: DateTime<Utc>) {
    let Some(lock) = doc.primary.lock.as_mut() else { return };
    if lock.effective_at >= floor {
        return;
    }
    let shift = floor - lock.effective_at;
    let token = lock.token.clone();
    let move_lock = |l: &mut LockInfo| {
        let by = |t: DateTime<Utc>| t.checked_add_signed(shift).unwrap_or(DateTime::<Utc>::MAX_UTC);
        l.effective_at = by(l.effective_at);
        l.expires_at = by(l.expires_at);
        l.pre_lock_expires_at = by(l.pre_lock_expires_at);
        l.max_expires_at = by(l.max_expires_at);
    };
    move_lock(lock);
    if let Some(target) = doc.secondary.as_mut().and_then(|s| s.lock.as_mut()).filter(|l| l.token.matches(&token)) {
        move_lock(target);
    }
}

/// A lock call, with what the caller asked for.
#[derive(Debug, Clone)]
pub enum LockCall {
    /// Take a pre-lock; `token` is the one the service generated for it.
    PreLock {
        /// What was asked.
        request: PreLockRequest,
        /// The token to issue if the pre-lock is granted.
        token: LockToken,
    },
    /// Escalate to `phase` with a lease of `duration`.
    Escalate {
        /// The presented token.
        token: LockToken,
        /// `hardDelete` or `write`.
        phase: Phase,
        /// The new phase's lease.
        duration: Duration,
    },
    /// Renew by `duration`.
    Renew {
        /// The presented token.
        token: LockToken,
        /// Requested extension.
        duration: Duration,
    },
    /// Cut over to `target`.
    Swap {
        /// The presented token.
        token: LockToken,
        /// The new location.
        target: String,
    },
    /// Release.
    Release {
        /// The presented token.
        token: LockToken,
    },
}

impl LockCall {
    /// Which call this is.
    pub fn kind(&self) -> CallKind {
        match self {
            LockCall::PreLock { .. } => CallKind::PreLock,
            LockCall::Escalate { .. } => CallKind::Escalate,
            LockCall::Renew { .. } => CallKind::Renew,
            LockCall::Swap { .. } => CallKind::Swap,
            LockCall::Release { .. } => CallKind::Release,
        }
    }

    /// The token the call presents or (a pre-lock) would issue.
    pub fn token(&self) -> &LockToken {
        match self {
            LockCall::PreLock { token, .. }
            | LockCall::Escalate { token, .. }
            | LockCall::Renew { token, .. }
            | LockCall::Swap { token, .. }
            | LockCall::Release { token } => token,
        }
    }

    /// Digest of what the caller asked (the call, its body and the presented token;
    /// not the token a pre-lock would issue, which the service chose).
    pub fn request_digest(&self) -> String {
        self.request_digest_with(&self.token().digest())
    }

    /// [`Self::request_digest`], given the digest of the call's token (made once per
    /// decision: the call's record keeps it too).
    fn request_digest_with(&self, token_digest: &str) -> String {
        let nanos = |d: &Duration| d.as_nanos().to_le_bytes();
        let kind = self.kind().as_str().as_bytes();
        match self {
            LockCall::PreLock { request, .. } => {
                let target = request.target_location.as_deref().unwrap_or("\u{0}none");
                digest_hex(&[kind, request.owner.as_bytes(), &nanos(&request.duration), target.as_bytes()])
            }
            LockCall::Escalate { phase, duration, .. } => {
                digest_hex(&[kind, token_digest.as_bytes(), phase.as_str().as_bytes(), &nanos(duration)])
            }
            LockCall::Renew { duration, .. } => digest_hex(&[kind, token_digest.as_bytes(), &nanos(duration)]),
            LockCall::Swap { target, .. } => digest_hex(&[kind, token_digest.as_bytes(), target.as_bytes()]),
            LockCall::Release { .. } => digest_hex(&[kind, token_digest.as_bytes()]),
        }
    }

    /// The transition this call makes, on a settled document.
    pub fn transition(
        &self,
        doc: &LocationDocument,
        policy: &LockPolicy,
        now: DateTime<Utc>,
    ) -> Result<LocationDocument, LockError> {
        match self {
            LockCall::PreLock { request, token } => pre_lock(doc, request, token.clone(), policy, now),
            LockCall::Escalate { token, phase, duration } => escalate(doc, token, *phase, *duration, policy, now),
            LockCall::Renew { token, duration } => renew(doc, token, *duration, policy, now),
            LockCall::Swap { token, target } => swap(doc, token, target, policy, now),
            LockCall::Release { token } => release(doc, token, now),
        }
    }
}

/// What [`decide`] concluded.
#[derive(Debug, Clone, PartialEq)]
pub enum Decided {
    /// Write this document, conditional on the version the decision was made on.
    Write(Box<LocationDocument>),
    /// The call already took effect under this key: answer as the first time, write nothing.
    Replayed,
}

/// Decides a lock call on a settled document under idempotency key `key` (`k:<key>` for
/// a caller's key, `w:<random>` for a call without one).
///
/// A key already recorded for the same request is a replay: a pre-lock whose token
/// still holds the lock is granted again (410 once lapsed, 409 once released or
/// swapped, never a fresh lock); an escalate or renew whose token still holds the lock,
/// a swap and a release succeed again. The same key with another request is refused.
/// Otherwise the transition runs and the call is recorded in the document it writes;
/// records stay until their window ends ([`OperationRecord::keep_until`]), and a keyed
/// call that would need more than [`LockPolicy::keyed_records`] is refused instead
/// ([`LockError::RecordsFull`]).
pub fn decide(
    doc: &LocationDocument,
    call: &LockCall,
    key: &str,
    policy: &LockPolicy,
    now: DateTime<Utc>,
) -> Result<Decided, LockError> {
    if let Some(record) = doc.operations.iter().find(|r| &*r.key == key) {
        if record.call != call.kind() || *record.request != *call.request_digest() {
            return Err(LockError::KeyReused);
        }
        replay(doc, call, record, now)?;
        return Ok(Decided::Replayed);
    }
    let mut next = call.transition(doc, policy, now)?;
    if policy.write_format < FORMAT_2 {
        // The expand step: what the write means is fixed now, as if the store committed
        // it at the decision, so a reader of format 1 takes it exactly as this library
        // does (the lease checked live just now, so nothing is void).
        next = settle_own_write(next, now);
    }
    let acted_on = match call {
        LockCall::PreLock { .. } => next.primary.lock.as_ref(),
        _ => doc.primary.lock.as_ref(),
    };
    let keep_until = acted_on
        .map(|l| l.max_expires_at.max(l.expires_at))
        .unwrap_or(now)
        .checked_add_signed(to_chrono(policy.convergence_delay) + policy.margin())
        .unwrap_or(DateTime::<Utc>::MAX_UTC)
        .max(now);
    // The token's digest once: the request's digest and the record both need it.
    let token_digest = call.token().digest();
    let request = call.request_digest_with(&token_digest);
    // The records are shared with `doc` until here: this write gets its own.
    let operations = Arc::make_mut(&mut next.operations);
    operations.retain(|r| r.keep_until >= now);
    make_room(operations, key, policy, now)?;
    operations.push(OperationRecord {
        key: key.into(),
        call: call.kind(),
        request: request.into(),
        lock: token_digest.into(),
        keep_until,
        extra: Map::new(),
    });
    if let Some(pending) = next.pending.as_mut() {
        Arc::make_mut(pending).key = Some(key.to_owned());
    }
    Ok(Decided::Write(Box::new(next)))
}

/// Whether `key` is a caller's `Idempotency-Key` (`k:`), whose record must answer for
/// it through its whole window; every other record is the library's own (`w:`).
fn is_keyed(key: &str) -> bool {
    key.starts_with("k:")
}

/// Makes room for the record of a call under `key` among `operations` (all inside their
/// windows): the oldest keyless records beyond [`KEYLESS_RECORDS`] go; a keyed record
/// is never dropped, so a keyed call that would exceed [`LockPolicy::keyed_records`] is
/// refused until the oldest keyed record's window ends.
fn make_room(
    operations: &mut Vec<OperationRecord>,
    key: &str,
    policy: &LockPolicy,
    now: DateTime<Utc>,
) -> Result<(), LockError> {
    if !is_keyed(key) {
        let keyless = operations.iter().filter(|r| !is_keyed(&r.key)).count();
        let mut excess = (keyless + 1).saturating_sub(KEYLESS_RECORDS);
        operations.retain(|r| {
            let drop = excess > 0 && !is_keyed(&r.key);
            excess -= usize::from(drop);
            !drop
        });
        return Ok(());
    }
    let keyed = operations.iter().filter(|r| is_keyed(&r.key)).count();
    if keyed < policy.keyed_records {
        return Ok(());
    }
    if policy.deviations.legacy_record_eviction {
        let mut excess = keyed + 1 - policy.keyed_records.max(1);
        operations.retain(|r| {
            let drop = excess > 0 && is_keyed(&r.key);
            excess -= usize::from(drop);
            !drop
        });
        return Ok(());
    }
    let retry_at = operations.iter().filter(|r| is_keyed(&r.key)).map(|r| r.keep_until).min().unwrap_or(now);
    Err(LockError::RecordsFull { kept: keyed, retry_at, retry_after: (retry_at - now).to_std().unwrap_or_default() })
}

/// The answer to a repeated call whose first instance took effect.
fn replay(
    doc: &LocationDocument,
    call: &LockCall,
    record: &OperationRecord,
    now: DateTime<Utc>,
) -> Result<(), LockError> {
    match call {
        LockCall::PreLock { .. } => match &doc.primary.lock {
            Some(lock) if *lock.token.digest() == *record.lock => {
                if lock.is_live(now) {
                    Ok(())
                } else {
                    Err(LockError::LeaseExpired { expired_at: lock.expires_at })
                }
            }
            // Removed by an operator: said so, whatever came after. Otherwise another
            // token's lock means ours ended before it was taken: released or swapped if a
            // record of that says so (every keyed one is still here), else lapsed.
            other => Err(match fenced(doc, &record.lock) {
                Some(refusal) => refusal,
                None if other.is_some() && !ended_by_a_call(doc, &record.lock) => LockError::LapsedAndReplaced,
                None => LockError::TokenMismatch,
            }),
        },
        LockCall::Escalate { token, .. } | LockCall::Renew { token, .. } => held_lock(doc, token, now).map(|_| ()),
        LockCall::Swap { .. } | LockCall::Release { .. } => Ok(()),
    }
}

/// Whether a record says that the lock whose token has digest `lock` was released or
/// swapped (rather than left to lapse).
fn ended_by_a_call(doc: &LocationDocument, lock: &str) -> bool {
    doc.operations.iter().any(|r| *r.lock == *lock && matches!(r.call, CallKind::Release | CallKind::Swap))
}

/// Whether the call recorded under `key` took effect in this settled document.
pub fn took_effect(doc: &LocationDocument, key: &str) -> bool {
    doc.operations.iter().any(|r| &*r.key == key)
}

#[cfg(test)]
#[path = "lifecycle_tests.rs"]
mod tests;
