//! Every transition and every refusal of the lifecycle.

use std::time::Duration;

use chrono::{DateTime, TimeDelta, Utc};

use super::*;
use crate::clock::{Clock, ManualClock};

const DELAY: Duration = Duration::from_secs(60);
const PRE: Duration = Duration::from_secs(3600);
const MAX: Duration = Duration::from_secs(7200);

fn policy() -> LockPolicy {
    LockPolicy { convergence_delay: DELAY, max_pre_lock: MAX }
}

fn t0() -> DateTime<Utc> {
    ManualClock::at_epoch().now()
}

fn secs(n: i64) -> TimeDelta {
    TimeDelta::seconds(n)
}

fn req(duration: Duration) -> PreLockRequest {
    PreLockRequest { owner: "probe".into(), duration, target_location: None }
}

fn locked(now: DateTime<Utc>) -> (LocationDocument, LockToken) {
    let token = LockToken::generate();
    let doc = pre_lock(&LocationDocument::new("r", "westeurope"), &req(PRE), token.clone(), &policy(), now).unwrap();
    (doc, token)
}

fn lock(doc: &LocationDocument) -> &LockInfo {
    doc.primary.lock.as_ref().unwrap()
}

#[test]
fn pre_lock_sets_every_time_field() {
    let now = t0();
    let (doc, token) = locked(now);
    let l = lock(&doc);
    assert!(l.token.matches(&token));
    assert_eq!(l.phase, Phase::PreLock);
    assert_eq!(l.acquired_at, now);
    assert_eq!(l.effective_at, now + secs(60));
    assert_eq!(l.expires_at, now + secs(60 + 3600));
    assert_eq!(l.pre_lock_expires_at, l.expires_at);
    assert_eq!(l.max_expires_at, now + secs(60 + 7200));
    assert_eq!(l.renewals, 0);
    assert!(doc.migrating);
    assert_eq!(doc.primary.location, "westeurope");
}

#[test]
fn pre_lock_with_target_locks_the_secondary() {
    let doc = LocationDocument::new("r", "westeurope");
    let r = PreLockRequest { target_location: Some("northeurope".into()), ..req(PRE) };
    let next = pre_lock(&doc, &r, LockToken::generate(), &policy(), t0()).unwrap();
    let secondary = next.secondary.unwrap();
    assert_eq!(secondary.location, "northeurope");
    assert!(secondary.lock.is_some());
    let same = PreLockRequest { target_location: Some("westeurope".into()), ..req(PRE) };
    assert!(matches!(pre_lock(&doc, &same, LockToken::generate(), &policy(), t0()), Err(LockError::InvalidRequest(_))));
}

#[test]
fn second_pre_lock_is_refused_while_the_first_is_live() {
    let now = t0();
    let (doc, _) = locked(now);
    let err = pre_lock(&doc, &req(PRE), LockToken::generate(), &policy(), now + secs(10)).unwrap_err();
    assert_eq!(err, LockError::LockHeld { expires_at: lock(&doc).expires_at });
}

#[test]
fn pre_lock_replaces_an_expired_lock_with_a_new_token() {
    let now = t0();
    let (doc, old) = locked(now);
    let later = lock(&doc).expires_at;
    let fresh = LockToken::generate();
    let next = pre_lock(&doc, &req(PRE), fresh.clone(), &policy(), later).unwrap();
    assert!(lock(&next).token.matches(&fresh));
    assert!(!lock(&next).token.matches(&old));
}

#[test]
fn pre_lock_refuses_zero_and_over_maximum_durations() {
    let doc = LocationDocument::new("r", "westeurope");
    for d in [Duration::ZERO, MAX + Duration::from_secs(1)] {
        assert!(matches!(pre_lock(&doc, &req(d), LockToken::generate(), &policy(), t0()), Err(LockError::InvalidRequest(_))));
    }
}

#[test]
fn escalation_path_keeps_the_token_and_caps_by_the_parent_lease() {
    let now = t0();
    let (doc, token) = locked(now);
    let at = now + secs(60);
    let hd = escalate(&doc, &token, Phase::HardDelete, Duration::from_secs(600), at).unwrap();
    assert_eq!(lock(&hd).phase, Phase::HardDelete);
    assert_eq!(lock(&hd).expires_at, at + secs(600));
    assert!(lock(&hd).token.matches(&token));
    // A lease longer than the parent is cut at the parent's end.
    let w = escalate(&hd, &token, Phase::Write, Duration::from_secs(100_000), at + secs(10)).unwrap();
    assert_eq!(lock(&w).phase, Phase::Write);
    assert_eq!(lock(&w).expires_at, lock(&doc).pre_lock_expires_at);
}

#[test]
fn escalation_before_effective_at_is_refused() {
    let now = t0();
    let (doc, token) = locked(now);
    let err = escalate(&doc, &token, Phase::HardDelete, Duration::from_secs(60), now + secs(59)).unwrap_err();
    assert!(matches!(err, LockError::InvalidTransition(_)), "{err:?}");
}

#[test]
fn out_of_order_escalations_are_refused() {
    let now = t0();
    let (doc, token) = locked(now);
    let at = now + secs(61);
    for phase in [Phase::Write, Phase::PreLock] {
        assert!(matches!(escalate(&doc, &token, phase, Duration::from_secs(5), at), Err(LockError::InvalidTransition(_))));
    }
    let hd = escalate(&doc, &token, Phase::HardDelete, Duration::from_secs(60), at).unwrap();
    for phase in [Phase::HardDelete, Phase::PreLock] {
        assert!(matches!(escalate(&hd, &token, phase, Duration::from_secs(5), at), Err(LockError::InvalidTransition(_))));
    }
}

#[test]
fn wrong_token_is_refused_everywhere() {
    let now = t0();
    let (doc, _) = locked(now);
    let wrong = LockToken::generate();
    let at = now + secs(61);
    assert_eq!(escalate(&doc, &wrong, Phase::HardDelete, DELAY, at), Err(LockError::TokenMismatch));
    assert_eq!(renew(&doc, &wrong, DELAY, at), Err(LockError::TokenMismatch));
    assert_eq!(swap(&doc, &wrong, "northeurope", at), Err(LockError::TokenMismatch));
    assert_eq!(release(&doc, &wrong, at), Err(LockError::TokenMismatch));
    // And on a document with no lock at all.
    let bare = LocationDocument::new("r", "westeurope");
    assert_eq!(release(&bare, &wrong, at), Err(LockError::TokenMismatch));
}

#[test]
fn an_expired_token_can_do_nothing() {
    let now = t0();
    let (doc, token) = locked(now);
    let hd = escalate(&doc, &token, Phase::HardDelete, Duration::from_secs(30), now + secs(60)).unwrap();
    let w = escalate(&hd, &token, Phase::Write, Duration::from_secs(1), now + secs(61)).unwrap();
    let lapsed = now + secs(62);
    let expired = Err(LockError::LeaseExpired { expired_at: lapsed });
    assert_eq!(swap(&w, &token, "northeurope", lapsed), expired);
    assert_eq!(renew(&w, &token, DELAY, lapsed), expired);
    assert_eq!(release(&w, &token, lapsed), expired);
    assert_eq!(escalate(&hd, &token, Phase::Write, DELAY, now + secs(90)), Err(LockError::LeaseExpired { expired_at: now + secs(90) }));
}

#[test]
fn renew_extends_but_never_past_the_parent_or_the_maximum() {
    let now = t0();
    let (doc, token) = locked(now);
    // Renewing the pre-lock extends the parent lease, up to the maximum.
    let r = renew(&doc, &token, Duration::from_secs(100_000), now + secs(100)).unwrap();
    assert_eq!(lock(&r).expires_at, lock(&doc).max_expires_at);
    assert_eq!(lock(&r).pre_lock_expires_at, lock(&doc).max_expires_at);
    assert_eq!(lock(&r).renewals, 1);
    // A child phase is capped by the parent lease.
    let hd = escalate(&doc, &token, Phase::HardDelete, Duration::from_secs(60), now + secs(60)).unwrap();
    let r = renew(&hd, &token, Duration::from_secs(100_000), now + secs(100)).unwrap();
    assert_eq!(lock(&r).expires_at, lock(&doc).pre_lock_expires_at);
    // Renewing never shortens.
    let short = renew(&hd, &token, Duration::from_secs(1), now + secs(61)).unwrap();
    assert_eq!(lock(&short).expires_at, lock(&hd).expires_at);
    assert!(matches!(renew(&hd, &token, Duration::ZERO, now + secs(61)), Err(LockError::InvalidRequest(_))));
}

#[test]
fn swap_switches_location_clears_the_lock_and_guards_the_old_location() {
    let now = t0();
    let (doc, token) = locked(now);
    let hd = escalate(&doc, &token, Phase::HardDelete, Duration::from_secs(60), now + secs(60)).unwrap();
    let w = escalate(&hd, &token, Phase::Write, Duration::from_secs(60), now + secs(70)).unwrap();
    let at = now + secs(80);
    let swapped = swap(&w, &token, "northeurope", at).unwrap();
    assert_eq!(swapped.primary.location, "northeurope");
    assert!(swapped.primary.lock.is_none());
    assert!(!swapped.migrating);
    let guard = swapped.secondary.as_ref().unwrap();
    assert_eq!(guard.location, "westeurope");
    assert_eq!(guard.lock.as_ref().unwrap().expires_at, at + secs(60));
    // The token is spent.
    assert_eq!(release(&swapped, &token, at), Err(LockError::TokenMismatch));
}

#[test]
fn swap_outside_a_write_lock_or_to_the_same_place_is_refused() {
    let now = t0();
    let (doc, token) = locked(now);
    let at = now + secs(61);
    assert!(matches!(swap(&doc, &token, "northeurope", at), Err(LockError::InvalidTransition(_))));
    let hd = escalate(&doc, &token, Phase::HardDelete, DELAY, at).unwrap();
    assert!(matches!(swap(&hd, &token, "northeurope", at), Err(LockError::InvalidTransition(_))));
    let w = escalate(&hd, &token, Phase::Write, DELAY, at).unwrap();
    assert!(matches!(swap(&w, &token, "westeurope", at), Err(LockError::InvalidRequest(_))));
}

#[test]
fn swap_must_go_where_the_pre_lock_said() {
    let now = t0();
    let token = LockToken::generate();
    let r = PreLockRequest { target_location: Some("northeurope".into()), ..req(PRE) };
    let doc = pre_lock(&LocationDocument::new("r", "westeurope"), &r, token.clone(), &policy(), now).unwrap();
    let hd = escalate(&doc, &token, Phase::HardDelete, DELAY, now + secs(60)).unwrap();
    let w = escalate(&hd, &token, Phase::Write, DELAY, now + secs(60)).unwrap();
    assert!(matches!(swap(&w, &token, "eastus", now + secs(61)), Err(LockError::InvalidRequest(_))));
    assert!(swap(&w, &token, "northeurope", now + secs(61)).is_ok());
}

#[test]
fn release_clears_the_lock_and_keeps_the_location() {
    let now = t0();
    let (doc, token) = locked(now);
    let released = release(&doc, &token, now + secs(1)).unwrap();
    assert!(released.primary.lock.is_none());
    assert!(!released.migrating);
    assert_eq!(released.primary.location, "westeurope");
}
