//! Every step and every refusal of the force-release procedure, and the fence it leaves.

use std::time::Duration;

use chrono::{DateTime, TimeDelta, Utc};

use super::*;
use crate::clock::{Clock, ManualClock};
use crate::document::LockToken;
use crate::routing::lifecycle::{self, settle, LockCall, PreLockRequest};

const DELAY: Duration = Duration::from_secs(60);

fn policy() -> LockPolicy {
    LockPolicy::new(DELAY, Duration::from_secs(7200))
}

fn t0() -> DateTime<Utc> {
    ManualClock::at_epoch().now()
}

fn secs(n: i64) -> TimeDelta {
    TimeDelta::seconds(n)
}

/// After the pre-lock took effect (decision + delay + margin).
fn effective() -> DateTime<Utc> {
    t0() + secs(120)
}

/// Applies a lock call at `now`, committed at once.
fn lock_call(doc: &LocationDocument, call: &LockCall, now: DateTime<Utc>) -> Result<LocationDocument, LockError> {
    let key = format!("w:{}", crate::document::to_hex(&rand::random::<[u8; 8]>()));
    match lifecycle::decide(doc, call, &key, &policy(), now)? {
        Decided::Write(next) => Ok(settle(*next, now)),
        Decided::Replayed => Ok(doc.clone()),
    }
}

/// A resource under a pre-lock to `northeurope`, and its token.
fn locked() -> (LocationDocument, LockToken) {
    let token = LockToken::generate();
    let request = PreLockRequest {
        owner: "migration-7".into(),
        duration: Duration::from_secs(3600),
        target_location: Some("northeurope".into()),
    };
    let call = LockCall::PreLock { request, token: token.clone() };
    (lock_call(&LocationDocument::new("r", "westeurope"), &call, t0()).unwrap(), token)
}

fn request_for(token: &LockToken, phase: Phase, by: &str) -> AdminCall {
    AdminCall::Request(ForceReleaseRequest {
        id: format!("req-{by}"),
        lock: token.digest(),
        phase,
        requested_by: by.into(),
        reason: "orchestrator lost its journal".into(),
    })
}

fn approval(id: &str, by: &str) -> AdminCall {
    AdminCall::Approve { id: id.into(), principal: by.into() }
}

/// Decides an admin call that must write, and commits it.
fn apply(doc: &LocationDocument, call: &AdminCall, now: DateTime<Utc>) -> LocationDocument {
    apply_under(&policy(), doc, call, now)
}

fn apply_under(policy: &LockPolicy, doc: &LocationDocument, call: &AdminCall, now: DateTime<Utc>) -> LocationDocument {
    match decide(doc, call, policy, now).unwrap() {
        Decided::Write(next) => settle(*next, now),
        Decided::Replayed => panic!("expected a write"),
    }
}

fn record<'a>(doc: &'a LocationDocument, id: &str) -> &'a ForceRelease {
    doc.force_releases.iter().find(|r| r.id == id).unwrap()
}

#[test]
fn two_people_release_the_lock_and_the_old_token_is_fenced_everywhere() {
    let (doc, token) = locked();
    let now = effective();
    let requested = apply(&doc, &request_for(&token, Phase::PreLock, "alice"), now);
    // A request alone changes no lock.
    assert_eq!(requested.primary, doc.primary);
    assert!(requested.migrating);
    let r = record(&requested, "req-alice");
    assert_eq!((r.outcome, r.owner.as_str(), r.requested_at), (ForceOutcome::Requested, "migration-7", now));
    assert_eq!(r.approve_by, now + secs(3600));
    assert_eq!(status(r, now), "requested");
    assert!(took_effect(&requested, &request_for(&token, Phase::PreLock, "alice")));
    assert!(!took_effect(&requested, &approval("req-alice", "bob")));

    let released = apply(&requested, &approval("req-alice", "bob"), now + secs(5));
    assert!(took_effect(&released, &approval("req-alice", "bob")));
    // The location stays; the lock, the target's lock and the migrating flag go.
    assert_eq!(released.primary.location, "westeurope");
    assert_eq!(released.primary.lock, None);
    assert_eq!(released.secondary, None);
    assert!(!released.migrating);
    let r = record(&released, "req-alice");
    assert_eq!(
        (r.outcome, r.approved_by.as_deref(), r.approved_at),
        (ForceOutcome::Released, Some("bob"), Some(now + secs(5)))
    );
    assert_eq!(status(r, now + secs(7200)), "released", "a decided request never expires");

    // The old holder is told, by name, for every call it can make.
    let fenced = LockError::ForceReleased { request: "req-alice".into(), approved_by: "bob".into(), at: now + secs(5) };
    let later = now + secs(10);
    let calls = [
        LockCall::Escalate { token: token.clone(), phase: Phase::HardDelete, duration: Duration::from_secs(60) },
        LockCall::Renew { token: token.clone(), duration: Duration::from_secs(60) },
        LockCall::Swap { token: token.clone(), target: "northeurope".into() },
        LockCall::Release { token: token.clone() },
    ];
    for call in &calls {
        assert_eq!(lock_call(&released, call, later), Err(fenced.clone()), "{call:?}");
    }
    // ... also once another migration holds the resource.
    let other = LockToken::generate();
    let request =
        PreLockRequest { owner: "migration-8".into(), duration: Duration::from_secs(600), target_location: None };
    let retaken = lock_call(&released, &LockCall::PreLock { request, token: other }, later).unwrap();
    for call in &calls {
        assert_eq!(lock_call(&retaken, call, later + secs(200)), Err(fenced.clone()), "{call:?}");
    }
}

#[test]
fn a_keyed_pre_lock_repeated_after_its_lock_was_force_released_is_told_so() {
    let token = LockToken::generate();
    let request = PreLockRequest { owner: "m".into(), duration: Duration::from_secs(3600), target_location: None };
    let call = LockCall::PreLock { request: request.clone(), token: token.clone() };
    let doc = match lifecycle::decide(&LocationDocument::new("r", "w"), &call, "k:first", &policy(), t0()).unwrap() {
        Decided::Write(next) => settle(*next, t0()),
        Decided::Replayed => unreachable!(),
    };
    let now = effective();
    let doc = apply(&doc, &request_for(&token, Phase::PreLock, "alice"), now);
    let doc = apply(&doc, &approval("req-alice", "bob"), now);
    let repeat = LockCall::PreLock { request, token: LockToken::generate() };
    let answer = lifecycle::decide(&doc, &repeat, "k:first", &policy(), now + secs(1));
    assert!(matches!(answer, Err(LockError::ForceReleased { .. })), "{answer:?}");
}

#[test]
fn nobody_approves_their_own_request() {
    let (doc, token) = locked();
    let now = effective();
    let requested = apply(&doc, &request_for(&token, Phase::PreLock, "alice"), now);
    assert_eq!(
        decide(&requested, &approval("req-alice", "alice"), &policy(), now),
        Err(LockError::SelfApproval { principal: "alice".into() })
    );
}

#[test]
fn a_renewal_keeps_the_request_and_a_later_phase_or_another_token_voids_it() {
    let (doc, token) = locked();
    let now = effective();
    let requested = apply(&doc, &request_for(&token, Phase::PreLock, "alice"), now);

    let renewed =
        lock_call(&requested, &LockCall::Renew { token: token.clone(), duration: Duration::from_secs(600) }, now)
            .unwrap();
    assert_eq!(record(&renewed, "req-alice").outcome, ForceOutcome::Requested, "a lock call keeps the records");
    let released = apply(&renewed, &approval("req-alice", "bob"), now + secs(1));
    assert_eq!(released.primary.lock, None);
    assert_eq!(record(&released, "req-alice").outcome, ForceOutcome::Released);

    let escalate =
        LockCall::Escalate { token: token.clone(), phase: Phase::HardDelete, duration: Duration::from_secs(60) };
    let escalated = lock_call(&requested, &escalate, now).unwrap();
    let void = apply(&escalated, &approval("req-alice", "bob"), now + secs(1));
    assert_eq!(void.primary, escalated.primary, "a void approval removes nothing");
    assert!(void.migrating);
    let r = record(&void, "req-alice");
    assert_eq!((r.outcome, r.approved_by.as_deref()), (ForceOutcome::Void, Some("bob")));
    assert!(took_effect(&void, &approval("req-alice", "bob")), "a void approval is decided, and recognised");
    // Not a fence: the holder goes on.
    assert!(lock_call(
        &void,
        &LockCall::Renew { token: token.clone(), duration: Duration::from_secs(30) },
        now + secs(2)
    )
    .is_ok());

    let gone = lock_call(&requested, &LockCall::Release { token: token.clone() }, now).unwrap();
    let other = LockToken::generate();
    let request = PreLockRequest { owner: "m2".into(), duration: Duration::from_secs(600), target_location: None };
    let retaken = lock_call(&gone, &LockCall::PreLock { request, token: other.clone() }, now).unwrap();
    let void = apply(&retaken, &approval("req-alice", "bob"), now + secs(1));
    assert!(void.primary.lock.as_ref().unwrap().token.matches(&other), "another token's lock stays");
    assert_eq!(record(&void, "req-alice").outcome, ForceOutcome::Void);
}

#[test]
fn an_approval_after_the_window_unknown_or_decided_is_refused() {
    let (doc, token) = locked();
    let now = effective();
    let requested = apply(&doc, &request_for(&token, Phase::PreLock, "alice"), now);
    let deadline = now + secs(3600);
    // The window's last instant is still inside it.
    assert!(matches!(decide(&requested, &approval("req-alice", "bob"), &policy(), deadline), Ok(Decided::Write(_))));
    let late = deadline + secs(1);
    assert_eq!(
        decide(&requested, &approval("req-alice", "bob"), &policy(), late),
        Err(LockError::ForceReleaseExpired { approve_by: deadline })
    );
    assert_eq!(status(record(&requested, "req-alice"), late), "expired");
    assert_eq!(
        decide(&requested, &approval("req-nobody", "bob"), &policy(), now),
        Err(LockError::UnknownForceRelease("req-nobody".into()))
    );
    let released = apply(&requested, &approval("req-alice", "bob"), now);
    // The same approval again is a replay; a third person's finds it decided.
    assert_eq!(decide(&released, &approval("req-alice", "bob"), &policy(), now), Ok(Decided::Replayed));
    assert_eq!(
        decide(&released, &approval("req-alice", "carol"), &policy(), now),
        Err(LockError::ForceReleaseDecided { outcome: "released" })
    );
}

#[test]
fn a_request_names_the_live_lock_as_it_is_and_repeats_are_recognised() {
    let (doc, token) = locked();
    let now = effective();
    // No lock at all, a lapsed one, another token, another phase.
    let bare = LocationDocument::new("r", "w");
    assert!(matches!(
        decide(&bare, &request_for(&token, Phase::PreLock, "alice"), &policy(), now),
        Err(LockError::InvalidTransition(_))
    ));
    let lapsed = doc.primary.lock.as_ref().unwrap().expires_at;
    assert!(matches!(
        decide(&doc, &request_for(&token, Phase::PreLock, "alice"), &policy(), lapsed),
        Err(LockError::InvalidTransition(_))
    ));
    assert_eq!(
        decide(&doc, &request_for(&LockToken::generate(), Phase::PreLock, "alice"), &policy(), now),
        Err(LockError::ForceReleaseTargetChanged)
    );
    assert_eq!(
        decide(&doc, &request_for(&token, Phase::Write, "alice"), &policy(), now),
        Err(LockError::ForceReleaseTargetChanged)
    );
    let requested = apply(&doc, &request_for(&token, Phase::PreLock, "alice"), now);
    assert_eq!(
        decide(&requested, &request_for(&token, Phase::PreLock, "alice"), &policy(), now + secs(1)),
        Ok(Decided::Replayed)
    );
    let AdminCall::Request(mut changed) = request_for(&token, Phase::PreLock, "alice") else { unreachable!() };
    changed.reason = "another reason".into();
    assert_eq!(decide(&requested, &AdminCall::Request(changed), &policy(), now), Err(LockError::KeyReused));
    assert_eq!(request_id_for_key("a"), request_id_for_key("a"));
    assert_ne!(request_id_for_key("a"), request_id_for_key("b"));
}

#[test]
fn open_requests_are_capped_and_the_audit_trail_is_bounded() {
    let (mut doc, token) = locked();
    let now = effective();
    let call = |i: usize| {
        AdminCall::Request(ForceReleaseRequest {
            id: format!("r{i}"),
            lock: token.digest(),
            phase: Phase::PreLock,
            requested_by: "alice".into(),
            reason: "stuck".into(),
        })
    };
    // A window of ten seconds, so that all of it happens within the lock's lease.
    let short = LockPolicy { force_release_window: Duration::from_secs(10), ..policy() };
    for i in 0..OPEN {
        doc = apply_under(&short, &doc, &call(i), now);
    }
    assert_eq!(decide(&doc, &call(OPEN), &short, now + secs(10)), Err(LockError::ForceReleasesFull { open: OPEN }));
    // Expired requests no longer count as open, and the closed ones are kept to KEPT.
    let mut at = now + secs(11);
    for i in OPEN..OPEN + KEPT + 3 {
        doc = apply_under(&short, &doc, &call(i), at);
        at += secs(11);
    }
    let open = doc.force_releases.iter().filter(|r| r.is_open(at - secs(11))).count();
    assert_eq!(open, 1);
    assert_eq!(doc.force_releases.len(), KEPT + 1);
    assert!(doc.force_releases.iter().all(|r| r.id != "r0"), "the oldest went first");
}

#[test]
fn a_void_lock_call_keeps_the_requests_made_since_it_was_decided() {
    let (doc, token) = locked();
    let now = effective();
    let requested = apply(&doc, &request_for(&token, Phase::PreLock, "alice"), now);
    // A renewal decided on this version lands after its lease: void. The document it
    // falls back to still has the request.
    let renew = LockCall::Renew { token: token.clone(), duration: Duration::from_secs(60) };
    let Decided::Write(next) = lifecycle::decide(&requested, &renew, "w:late", &policy(), now).unwrap() else {
        unreachable!()
    };
    let lease_end = requested.primary.lock.as_ref().unwrap().expires_at;
    let settled = settle(*next, lease_end + secs(1));
    assert_eq!(settled.primary.lock.as_ref().unwrap().expires_at, lease_end, "void");
    assert_eq!(record(&settled, "req-alice").outcome, ForceOutcome::Requested);
}

#[test]
fn the_records_round_trip_and_hostile_instants_are_refused() {
    let (doc, token) = locked();
    let now = effective();
    let doc = apply(&doc, &request_for(&token, Phase::PreLock, "alice"), now);
    let doc = apply(&doc, &approval("req-alice", "bob"), now);
    let json = doc.to_json();
    let records = json.get("forceReleases").and_then(|v| v.as_array()).unwrap();
    assert_eq!(records[0]["outcome"], "released");
    assert_eq!(records[0]["approvedBy"], "bob");
    assert_eq!(records[0]["lock"], token.digest().as_str());
    assert!(!json.to_string().contains(token.expose()), "a record never holds the token");
    assert_eq!(LocationDocument::from_json(json.clone()).unwrap(), doc);
    let mut hostile = json;
    hostile["forceReleases"][0]["approveBy"] = "0000-01-01T00:00:00Z".into();
    let err = LocationDocument::from_json(hostile).unwrap_err();
    assert!(err.to_string().contains("forceReleases[0]"), "{err}");
}
