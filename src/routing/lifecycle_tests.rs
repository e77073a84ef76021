//! Every transition and every refusal of the lifecycle.

use std::time::Duration;

use chrono::{DateTime, TimeDelta, Utc};

use super::*;
use crate::clock::{Clock, ManualClock};

const DELAY: Duration = Duration::from_secs(60);
const PRE: Duration = Duration::from_secs(3600);
const MAX: Duration = Duration::from_secs(7200);

fn policy() -> LockPolicy {
    LockPolicy {
        convergence_delay: DELAY,
        max_pre_lock: MAX,
        skew_margin: Duration::ZERO,
        keyed_records: DEFAULT_KEYED_RECORDS,
        write_format: NEWEST_FORMAT,
        force_release_window: crate::routing::lifecycle::DEFAULT_FORCE_RELEASE_WINDOW,
        deviations: Deviations::default(),
    }
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

/// `doc`'s lock escalated to hard delete at `at` and to write 10 s later, a minute's
/// lease each.
fn to_write_lock(
    doc: &LocationDocument,
    token: &LockToken,
    policy: &LockPolicy,
    at: DateTime<Utc>,
) -> LocationDocument {
    let hd = escalate(doc, token, Phase::HardDelete, Duration::from_secs(60), policy, at).unwrap();
    escalate(&hd, token, Phase::Write, Duration::from_secs(60), policy, at + secs(10)).unwrap()
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
        assert!(matches!(
            pre_lock(&doc, &req(d), LockToken::generate(), &policy(), t0()),
            Err(LockError::InvalidRequest(_))
        ));
    }
}

#[test]
fn escalation_path_keeps_the_token_and_caps_by_the_parent_lease() {
    let now = t0();
    let (doc, token) = locked(now);
    let at = now + secs(60);
    let hd = escalate(&doc, &token, Phase::HardDelete, Duration::from_secs(600), &policy(), at).unwrap();
    assert_eq!(lock(&hd).phase, Phase::HardDelete);
    assert_eq!(lock(&hd).expires_at, at + secs(600));
    assert!(lock(&hd).token.matches(&token));
    // A lease longer than the parent is cut at the parent's end.
    let w = escalate(&hd, &token, Phase::Write, Duration::from_secs(100_000), &policy(), at + secs(10)).unwrap();
    assert_eq!(lock(&w).phase, Phase::Write);
    assert_eq!(lock(&w).expires_at, lock(&doc).pre_lock_expires_at);
}

#[test]
fn escalation_before_effective_at_is_refused() {
    let now = t0();
    let (doc, token) = locked(now);
    let err =
        escalate(&doc, &token, Phase::HardDelete, Duration::from_secs(60), &policy(), now + secs(59)).unwrap_err();
    assert!(matches!(err, LockError::InvalidTransition(_)), "{err:?}");
}

#[test]
fn out_of_order_escalations_are_refused() {
    let now = t0();
    let (doc, token) = locked(now);
    let at = now + secs(61);
    for phase in [Phase::Write, Phase::PreLock] {
        assert!(matches!(
            escalate(&doc, &token, phase, Duration::from_secs(5), &policy(), at),
            Err(LockError::InvalidTransition(_))
        ));
    }
    let hd = escalate(&doc, &token, Phase::HardDelete, Duration::from_secs(60), &policy(), at).unwrap();
    for phase in [Phase::HardDelete, Phase::PreLock] {
        assert!(matches!(
            escalate(&hd, &token, phase, Duration::from_secs(5), &policy(), at),
            Err(LockError::InvalidTransition(_))
        ));
    }
}

#[test]
fn wrong_token_is_refused_everywhere() {
    let now = t0();
    let (doc, _) = locked(now);
    let wrong = LockToken::generate();
    let at = now + secs(61);
    assert_eq!(escalate(&doc, &wrong, Phase::HardDelete, DELAY, &policy(), at), Err(LockError::TokenMismatch));
    assert_eq!(renew(&doc, &wrong, DELAY, &policy(), at), Err(LockError::TokenMismatch));
    assert_eq!(swap(&doc, &wrong, "northeurope", &policy(), at), Err(LockError::TokenMismatch));
    assert_eq!(release(&doc, &wrong, at), Err(LockError::TokenMismatch));
    // And on a document with no lock at all.
    let bare = LocationDocument::new("r", "westeurope");
    assert_eq!(release(&bare, &wrong, at), Err(LockError::TokenMismatch));
}

#[test]
fn an_expired_token_can_do_nothing() {
    let now = t0();
    let (doc, token) = locked(now);
    let hd = escalate(&doc, &token, Phase::HardDelete, Duration::from_secs(30), &policy(), now + secs(60)).unwrap();
    let w = escalate(&hd, &token, Phase::Write, Duration::from_secs(1), &policy(), now + secs(61)).unwrap();
    let lapsed = now + secs(62);
    let expired = Err(LockError::LeaseExpired { expired_at: lapsed });
    assert_eq!(swap(&w, &token, "northeurope", &policy(), lapsed), expired);
    assert_eq!(renew(&w, &token, DELAY, &policy(), lapsed), expired);
    assert_eq!(release(&w, &token, lapsed), expired);
    assert_eq!(
        escalate(&hd, &token, Phase::Write, DELAY, &policy(), now + secs(90)),
        Err(LockError::LeaseExpired { expired_at: now + secs(90) })
    );
}

#[test]
fn renew_extends_but_never_past_the_parent_or_the_maximum() {
    let now = t0();
    let (doc, token) = locked(now);
    // Renewing the pre-lock extends the parent lease, up to the maximum.
    let r = renew(&doc, &token, Duration::from_secs(100_000), &policy(), now + secs(100)).unwrap();
    assert_eq!(lock(&r).expires_at, lock(&doc).max_expires_at);
    assert_eq!(lock(&r).pre_lock_expires_at, lock(&doc).max_expires_at);
    assert_eq!(lock(&r).renewals, 1);
    // A child phase is capped by the parent lease.
    let hd = escalate(&doc, &token, Phase::HardDelete, Duration::from_secs(60), &policy(), now + secs(60)).unwrap();
    let r = renew(&hd, &token, Duration::from_secs(100_000), &policy(), now + secs(100)).unwrap();
    assert_eq!(lock(&r).expires_at, lock(&doc).pre_lock_expires_at);
    // Renewing never shortens.
    let short = renew(&hd, &token, Duration::from_secs(1), &policy(), now + secs(61)).unwrap();
    assert_eq!(lock(&short).expires_at, lock(&hd).expires_at);
    assert!(matches!(renew(&hd, &token, Duration::ZERO, &policy(), now + secs(61)), Err(LockError::InvalidRequest(_))));
}

#[test]
fn swap_switches_location_clears_the_lock_and_guards_the_old_location() {
    let now = t0();
    let (doc, token) = locked(now);
    let w = to_write_lock(&doc, &token, &policy(), now + secs(60));
    let at = now + secs(80);
    let swapped = swap(&w, &token, "northeurope", &policy(), at).unwrap();
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
    assert!(matches!(swap(&doc, &token, "northeurope", &policy(), at), Err(LockError::InvalidTransition(_))));
    let hd = escalate(&doc, &token, Phase::HardDelete, DELAY, &policy(), at).unwrap();
    assert!(matches!(swap(&hd, &token, "northeurope", &policy(), at), Err(LockError::InvalidTransition(_))));
    let w = escalate(&hd, &token, Phase::Write, DELAY, &policy(), at).unwrap();
    assert!(matches!(swap(&w, &token, "westeurope", &policy(), at), Err(LockError::InvalidRequest(_))));
}

#[test]
fn swap_must_go_where_the_pre_lock_said() {
    let now = t0();
    let token = LockToken::generate();
    let r = PreLockRequest { target_location: Some("northeurope".into()), ..req(PRE) };
    let doc = pre_lock(&LocationDocument::new("r", "westeurope"), &r, token.clone(), &policy(), now).unwrap();
    let hd = escalate(&doc, &token, Phase::HardDelete, DELAY, &policy(), now + secs(60)).unwrap();
    let w = escalate(&hd, &token, Phase::Write, DELAY, &policy(), now + secs(60)).unwrap();
    assert!(matches!(swap(&w, &token, "eastus", &policy(), now + secs(61)), Err(LockError::InvalidRequest(_))));
    assert!(swap(&w, &token, "northeurope", &policy(), now + secs(61)).is_ok());
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

// --- Commit-time rules: `settle` -------------------------------------------------------

const MARGIN: Duration = Duration::from_secs(2);

fn margined() -> LockPolicy {
    LockPolicy { skew_margin: MARGIN, ..policy() }
}

/// A pre-lock decided at `now` under `margined()`, settled as committed at `committed`.
fn committed_pre_lock(now: DateTime<Utc>, committed: DateTime<Utc>) -> (LocationDocument, LockToken) {
    let token = LockToken::generate();
    let doc = pre_lock(&LocationDocument::new("r", "westeurope"), &req(PRE), token.clone(), &margined(), now).unwrap();
    (settle(doc, committed), token)
}

#[test]
fn a_pre_lock_starts_no_earlier_than_its_commit_plus_delay_and_margin() {
    let now = t0();
    // Committed at once: effectiveAt is the decide time + delay + margin.
    let (prompt, _) = committed_pre_lock(now, now);
    assert_eq!(lock(&prompt).effective_at, now + secs(62));
    assert_eq!(lock(&prompt).phase_since, Some(now));
    assert!(prompt.pending.is_none(), "settled documents carry no pending effect");
    // Committed 3 s late (the slow-commit scenario): everything counted from effectiveAt moves.
    let (late, _) = committed_pre_lock(now, now + secs(3));
    let l = lock(&late);
    assert_eq!(l.effective_at, now + secs(65));
    assert_eq!(l.expires_at, now + secs(65 + 3600));
    assert_eq!(l.max_expires_at, now + secs(65 + 7200));
    assert_eq!(l.acquired_at, now, "acquiredAt stays the decision");
    assert_eq!(l.convergence_delay(), secs(60), "the declared delay is kept apart from the margin");
}

#[test]
fn the_legacy_effective_at_counts_from_the_decision_whatever_the_commit() {
    let now = t0();
    let legacy =
        LockPolicy { deviations: Deviations { legacy_effective_at: true, ..Deviations::default() }, ..margined() };
    let doc =
        pre_lock(&LocationDocument::new("r", "westeurope"), &req(PRE), LockToken::generate(), &legacy, now).unwrap();
    let settled = settle(doc, now + secs(3));
    assert_eq!(lock(&settled).effective_at, now + secs(60));
}

#[test]
fn a_target_lock_moves_with_its_pre_lock() {
    let now = t0();
    let r = PreLockRequest { target_location: Some("northeurope".into()), ..req(PRE) };
    let doc = pre_lock(&LocationDocument::new("r", "westeurope"), &r, LockToken::generate(), &margined(), now).unwrap();
    let settled = settle(doc, now + secs(5));
    let target = settled.secondary.as_ref().unwrap().lock.as_ref().unwrap();
    assert_eq!(target.effective_at, lock(&settled).effective_at);
    assert_eq!(target.expires_at, lock(&settled).expires_at);
}

/// A pre-lock, settled, escalated to hardDelete at its effectiveAt and settled, then a
/// short write lock: (write-locked document, token, its lease end).
fn write_locked(now: DateTime<Utc>) -> (LocationDocument, LockToken, DateTime<Utc>) {
    let (doc, token) = committed_pre_lock(now, now);
    let at = lock(&doc).effective_at;
    let hd = settle(escalate(&doc, &token, Phase::HardDelete, Duration::from_secs(600), &margined(), at).unwrap(), at);
    assert_eq!(lock(&hd).phase_since, Some(at), "the phase starts when its escalation lands");
    let w = settle(escalate(&hd, &token, Phase::Write, Duration::from_secs(10), &margined(), at).unwrap(), at);
    let end = lock(&w).expires_at;
    (w, token, end)
}

#[test]
fn a_renewal_that_lands_after_the_lease_is_void() {
    let now = t0();
    let (w, token, end) = write_locked(now);
    // Decided 0.2 s before the lease ends, committed 1.2 s after it (the late-renewal scenario).
    let decided = end - TimeDelta::milliseconds(200);
    let renewed = renew(&w, &token, Duration::from_secs(30), &margined(), decided).unwrap();
    let landed_late = settle(renewed.clone(), end + TimeDelta::milliseconds(1200));
    assert_eq!(lock(&landed_late).expires_at, end, "a lapsed lease is never resurrected");
    assert_eq!(held_lock(&landed_late, &token, end + secs(1)), Err(LockError::LeaseExpired { expired_at: end }));
    // The same renewal landing in time takes effect, and starts no phase: the write
    // lock's start stays where its escalation landed.
    let in_time = settle(renewed, end - TimeDelta::milliseconds(100));
    assert_eq!(lock(&in_time).expires_at, decided + secs(30));
    assert_eq!(lock(&in_time).phase_since, lock(&w).phase_since, "a renewal is not a new phase");
}

#[test]
fn the_legacy_renewal_resurrects_a_lapsed_lease() {
    let now = t0();
    let (w, token, end) = write_locked(now);
    let legacy = LockPolicy { deviations: Deviations { legacy_renewal: true, ..Deviations::default() }, ..margined() };
    let renewed = renew(&w, &token, Duration::from_secs(30), &legacy, end - TimeDelta::milliseconds(200)).unwrap();
    let landed_late = settle(renewed, end + TimeDelta::milliseconds(1200));
    assert!(lock(&landed_late).expires_at > end);
}

#[test]
fn an_escalation_or_a_swap_that_lands_after_the_lease_is_void() {
    let now = t0();
    let (w, token, end) = write_locked(now);
    let swapped = swap(&w, &token, "northeurope", &margined(), end - TimeDelta::milliseconds(10)).unwrap();
    let late = settle(swapped.clone(), end + TimeDelta::milliseconds(1));
    assert_eq!(late.primary.location, "westeurope", "a void swap leaves the location where it was");
    assert_eq!(lock(&late).phase, Phase::Write);
    assert_eq!(lock(&late).expires_at, end);
    assert_eq!(settle(swapped.clone(), end - TimeDelta::milliseconds(1)).primary.location, "northeurope", "in time");
    // At the lease end itself the lease has ended: a reader whose clock runs ahead by the
    // margin has taken the lapse as final by then (found by the model checker).
    assert_eq!(settle(swapped, end).primary.location, "westeurope", "landing at the lease end is late");

    let (doc, token) = committed_pre_lock(now, now);
    let end = lock(&doc).expires_at;
    let hd = escalate(&doc, &token, Phase::HardDelete, Duration::from_secs(60), &margined(), end - secs(1)).unwrap();
    let late = settle(hd, end + secs(1));
    assert_eq!(lock(&late).phase, Phase::PreLock);
    assert_eq!(lock(&late).expires_at, end);
}

#[test]
fn a_pending_effect_left_behind_by_an_older_writer_is_ignored() {
    let now = t0();
    let token = LockToken::generate();
    let doc = pre_lock(&LocationDocument::new("r", "westeurope"), &req(PRE), token, &margined(), now).unwrap();
    // A writer that does not know `pending` changes the lock and keeps the field as it was.
    let mut rewritten = doc.clone();
    rewritten.primary.location = "eastus".into();
    let settled = settle(rewritten, now + secs(30));
    assert_eq!(lock(&settled).effective_at, lock(&doc).effective_at, "not shifted by someone else's commit");
    assert!(settled.pending.is_none());
}

/// One write of every kind of call, as decided, each with the times it may land at: in
/// time, at the write lock's lease end and after it (void, shifted or as decided).
fn decided_writes() -> Vec<(CallKind, LocationDocument, Vec<DateTime<Utc>>)> {
    let now = t0();
    let (w, token, end) = write_locked(now);
    let (pre, pre_token) = committed_pre_lock(now, now);
    let at = lock(&pre).effective_at;
    let calls = [
        (pre_lock_call(&LockToken::generate()), LocationDocument::new("r", "westeurope"), now),
        (LockCall::Escalate { token: pre_token, phase: Phase::HardDelete, duration: PRE }, pre, at),
        (LockCall::Renew { token: token.clone(), duration: Duration::from_secs(30) }, w.clone(), end - secs(1)),
        (LockCall::Swap { token: token.clone(), target: "northeurope".into() }, w.clone(), end - secs(1)),
        (LockCall::Release { token }, w, end - secs(1)),
    ];
    calls
        .into_iter()
        .map(|(call, doc, decided)| {
            let Decided::Write(next) = decide(&doc, &call, "k:one", &margined(), decided).unwrap() else {
                panic!("{:?} writes", call.kind())
            };
            (call.kind(), *next, vec![decided, end, end + secs(5), decided + secs(3600)])
        })
        .collect()
}

#[test]
fn a_decided_write_settles_the_same_without_its_digest_checked() {
    for (kind, next, landings) in decided_writes() {
        for committed in landings {
            assert_eq!(
                settle_own_write(next.clone(), committed),
                settle(next.clone(), committed),
                "{kind:?} committed at {committed}"
            );
        }
    }
}

#[test]
fn a_view_of_a_version_is_its_settled_state_and_lends_it_when_settling_changes_nothing() {
    let stripped = |doc: &LocationDocument| LocationDocument { pending: None, ..doc.clone() };
    let mut lent = 0;
    for (kind, next, landings) in decided_writes() {
        for committed in landings {
            let view = settle_view(&next, committed);
            let settled = settle(next.clone(), committed);
            assert_eq!(stripped(&view), settled, "{kind:?} committed at {committed}");
            let unchanged = settled == stripped(&next);
            assert_eq!(matches!(view, Cow::Borrowed(_)), unchanged, "{kind:?} committed at {committed}");
            lent += usize::from(unchanged);
        }
    }
    assert!(lent > 0, "some writes settle to themselves (a swap or release in time)");
    // A record another writer left behind settles to nothing, and its view is the same.
    let now = t0();
    let doc = pre_lock(&LocationDocument::new("r", "westeurope"), &req(PRE), LockToken::generate(), &margined(), now);
    let mut rewritten = doc.unwrap();
    rewritten.primary.location = "eastus".into();
    let later = now + secs(30);
    assert_eq!(stripped(&settle_view(&rewritten, later)), settle(rewritten.clone(), later));
}

#[test]
fn a_malformed_request_is_refused_before_the_lock_state_is_judged() {
    let now = t0();
    let (doc, _) = locked(now);
    for bad in [Duration::ZERO, MAX + Duration::from_secs(1)] {
        let err = pre_lock(&doc, &req(bad), LockToken::generate(), &policy(), now).unwrap_err();
        assert!(matches!(err, LockError::InvalidRequest(_)), "{err:?}");
    }
    let wrong = LockToken::generate();
    assert!(matches!(
        escalate(&doc, &wrong, Phase::HardDelete, Duration::ZERO, &policy(), now),
        Err(LockError::InvalidRequest(_))
    ));
    assert!(matches!(renew(&doc, &wrong, Duration::ZERO, &policy(), now), Err(LockError::InvalidRequest(_))));
    assert!(matches!(swap(&doc, &wrong, "", &policy(), now), Err(LockError::InvalidRequest(_))));
}

#[test]
fn a_new_token_waits_until_the_old_lease_has_ended_by_every_clock() {
    let now = t0();
    let (doc, _) = committed_pre_lock(now, now);
    let end = lock(&doc).expires_at;
    // Past the end and the margin by this clock, another clock (up to the margin behind)
    // may still be inside its margin: refused until twice the margin.
    let err = pre_lock(&doc, &req(PRE), LockToken::generate(), &margined(), end + secs(3)).unwrap_err();
    assert_eq!(err, LockError::LockHeld { expires_at: end + secs(4) });
    assert!(pre_lock(&doc, &req(PRE), LockToken::generate(), &margined(), end + secs(4)).is_ok());
}

#[test]
fn durations_past_the_representable_time_are_refused_not_a_panic() {
    let huge = LockPolicy {
        max_pre_lock: Duration::from_secs(u64::MAX / 4),
        convergence_delay: Duration::from_secs(u64::MAX / 4),
        ..policy()
    };
    let err = pre_lock(&LocationDocument::new("r", "w"), &req(PRE), LockToken::generate(), &huge, t0()).unwrap_err();
    assert!(matches!(err, LockError::InvalidRequest(_)), "{err:?}");
}

// --- Idempotency: `decide` ----------------------------------------------------------

fn pre_lock_call(token: &LockToken) -> LockCall {
    LockCall::PreLock { request: req(PRE), token: token.clone() }
}

fn written(decided: Decided) -> LocationDocument {
    match decided {
        Decided::Write(doc) => *doc,
        Decided::Replayed => panic!("expected a write"),
    }
}

#[test]
fn a_repeated_pre_lock_returns_the_first_token_and_never_a_fresh_lock() {
    let now = t0();
    let first = LockToken::generate();
    let doc = settle(
        written(decide(&LocationDocument::new("r", "w"), &pre_lock_call(&first), "k:a", &margined(), now).unwrap()),
        now,
    );
    assert!(took_effect(&doc, "k:a"));
    // The repeat brings its own fresh token; the answer is the first one's lock.
    let again = pre_lock_call(&LockToken::generate());
    assert_eq!(decide(&doc, &again, "k:a", &margined(), now + secs(1)), Ok(Decided::Replayed));
    // Another key is a new pre-lock, refused while the first holds.
    assert!(matches!(decide(&doc, &again, "k:b", &margined(), now), Err(LockError::LockHeld { .. })));
    // Released: the repeat is 409, never a new lock.
    let released = written(decide(&doc, &LockCall::Release { token: first.clone() }, "k:r", &margined(), now).unwrap());
    assert_eq!(decide(&released, &again, "k:a", &margined(), now), Err(LockError::TokenMismatch));
    // Lapsed: 410.
    let lapsed_at = lock(&doc).expires_at;
    assert_eq!(
        decide(&doc, &again, "k:a", &margined(), lapsed_at),
        Err(LockError::LeaseExpired { expired_at: lapsed_at })
    );
}

#[test]
fn the_same_key_for_another_request_is_refused() {
    let now = t0();
    let token = LockToken::generate();
    let doc =
        written(decide(&LocationDocument::new("r", "w"), &pre_lock_call(&token), "k:a", &margined(), now).unwrap());
    let other = LockCall::PreLock { request: req(Duration::from_secs(10)), token: LockToken::generate() };
    assert_eq!(decide(&doc, &other, "k:a", &margined(), now), Err(LockError::KeyReused));
    let renew_call = LockCall::Renew { token, duration: DELAY };
    assert_eq!(decide(&doc, &renew_call, "k:a", &margined(), now), Err(LockError::KeyReused));
}

#[test]
fn repeated_escalate_swap_and_release_succeed_again_without_writing() {
    let now = t0();
    let (doc, token) = committed_pre_lock(now, now);
    let at = lock(&doc).effective_at;
    let up = LockCall::Escalate { token: token.clone(), phase: Phase::HardDelete, duration: DELAY };
    let hd = settle(written(decide(&doc, &up, "k:e", &margined(), at).unwrap()), at);
    assert_eq!(decide(&hd, &up, "k:e", &margined(), at), Ok(Decided::Replayed), "not 409 invalid-transition");
    let w = settle(
        written(
            decide(
                &hd,
                &LockCall::Escalate { token: token.clone(), phase: Phase::Write, duration: DELAY },
                "k:w",
                &margined(),
                at,
            )
            .unwrap(),
        ),
        at,
    );
    let over = LockCall::Swap { token: token.clone(), target: "northeurope".into() };
    let swapped = settle(written(decide(&w, &over, "k:s", &margined(), at).unwrap()), at);
    assert_eq!(decide(&swapped, &over, "k:s", &margined(), at), Ok(Decided::Replayed));
    assert_eq!(
        decide(&swapped, &up, "k:e", &margined(), at),
        Err(LockError::TokenMismatch),
        "the escalation's lock is gone"
    );
}

#[test]
fn a_void_call_leaves_no_record_so_its_repeat_is_judged_afresh() {
    let now = t0();
    let (w, token, end) = write_locked(now);
    let call = LockCall::Renew { token: token.clone(), duration: Duration::from_secs(30) };
    let renewed = written(decide(&w, &call, "k:late", &margined(), end - TimeDelta::milliseconds(200)).unwrap());
    let late = settle(renewed, end + secs(1));
    assert!(!took_effect(&late, "k:late"));
    assert!(matches!(decide(&late, &call, "k:late", &margined(), end + secs(1)), Err(LockError::LeaseExpired { .. })));
}

/// Decides and commits `call` under `key` at `now` (committed at once).
fn commit(
    doc: &LocationDocument,
    call: &LockCall,
    key: &str,
    policy: &LockPolicy,
    now: DateTime<Utc>,
) -> LocationDocument {
    settle(written(decide(doc, call, key, policy, now).unwrap()), now)
}

/// `pairs` pre-lock/release pairs under fresh keys (`k:<tag><i>`), starting at `now`.
fn churn(
    mut doc: LocationDocument,
    pairs: usize,
    tag: &str,
    policy: &LockPolicy,
    now: DateTime<Utc>,
) -> LocationDocument {
    for i in 0..pairs {
        let token = LockToken::generate();
        doc = commit(&doc, &pre_lock_call(&token), &format!("k:{tag}{i}p"), policy, now);
        doc = commit(&doc, &LockCall::Release { token }, &format!("k:{tag}{i}r"), policy, now);
    }
    doc
}

/// The three sequences that broke contract 1.1's "at most 16 records": a repeat after
/// many calls in between answers as the first call did, never with a fresh lock.
#[test]
fn a_repeated_pre_lock_is_never_a_fresh_lock_whatever_the_calls_in_between() {
    let p = margined();
    let now = t0();
    let again = || pre_lock_call(&LockToken::generate());
    // Released, then 40 more locks came and went: 409.
    let first = LockToken::generate();
    let doc = commit(&LocationDocument::new("r", "w"), &pre_lock_call(&first), "k:K", &p, now);
    let doc = commit(&doc, &LockCall::Release { token: first }, "k:R", &p, now);
    let doc = churn(doc, 40, "a", &p, now);
    assert_eq!(decide(&doc, &again(), "k:K", &p, now), Err(LockError::TokenMismatch));
    // ... and another lock holds now: still 409 (released), not 410 (lapsed).
    let doc = commit(&doc, &pre_lock_call(&LockToken::generate()), "k:H", &p, now);
    assert_eq!(decide(&doc, &again(), "k:K", &p, now), Err(LockError::TokenMismatch));
    // Lapsed, then another lock and 20 renewals of it: 410, not 409 and not a lock.
    let first = LockToken::generate();
    let doc = commit(&LocationDocument::new("r", "w"), &pre_lock_call(&first), "k:K", &p, now);
    let after = later(lock(&doc).expires_at, p.margin() * 2).unwrap() + secs(1);
    // (Another lock taken and released in between: its release says nothing of ours.)
    let doc = churn(doc, 1, "x", &p, after);
    let next = LockToken::generate();
    let mut doc = commit(&doc, &pre_lock_call(&next), "k:N", &p, after);
    for i in 0..20 {
        doc = commit(&doc, &LockCall::Renew { token: next.clone(), duration: DELAY }, &format!("k:n{i}"), &p, after);
    }
    assert_eq!(decide(&doc, &again(), "k:K", &p, after), Err(LockError::LapsedAndReplaced));
    // Still held, renewed 40 times (with keys and without): the first token, not 423.
    let first = LockToken::generate();
    let mut doc = commit(&LocationDocument::new("r", "w"), &pre_lock_call(&first), "k:K", &p, now);
    for i in 0..40 {
        let renewal = LockCall::Renew { token: first.clone(), duration: DELAY };
        doc = commit(&doc, &renewal, &format!("k:{i}"), &p, now);
        doc = commit(&doc, &renewal, &format!("w:{i}"), &p, now);
    }
    assert_eq!(decide(&doc, &again(), "k:K", &p, now), Ok(Decided::Replayed));
    assert_eq!(doc.operations.iter().filter(|r| r.key.starts_with("w:")).count(), KEYLESS_RECORDS);
    let record_json = serde_json::to_string(&doc.operations).unwrap();
    assert!(!record_json.contains(first.expose()));
}

/// A full budget refuses a keyed call (and says until when) instead of forgetting a key
/// still honoured; a keyless call still goes through; once the oldest record's window
/// ends, there is room again.
#[test]
fn a_full_record_budget_refuses_keyed_calls_until_the_oldest_window_ends() {
    let p = LockPolicy { keyed_records: 6, ..margined() };
    let now = t0();
    let doc = churn(LocationDocument::new("r", "w"), 3, "a", &p, now);
    assert_eq!(doc.operations.len(), 6);
    let token = LockToken::generate();
    let refused = decide(&doc, &pre_lock_call(&token), "k:new", &p, now + secs(5));
    let oldest = doc.operations.iter().map(|r| r.keep_until).min().unwrap();
    assert_eq!(
        refused,
        Err(LockError::RecordsFull {
            kept: 6,
            retry_at: oldest,
            retry_after: (oldest - now - secs(5)).to_std().unwrap()
        })
    );
    // Every key is still answered as before.
    assert_eq!(decide(&doc, &pre_lock_call(&token), "k:a0p", &p, now), Err(LockError::TokenMismatch));
    // Without a key the call is decided (and recorded among the keyless ones).
    let keyless = commit(&doc, &pre_lock_call(&token), "w:x", &p, now + secs(5));
    assert_eq!(lock(&keyless).token, token);
    // Past the oldest window, the new key is taken.
    assert!(matches!(decide(&doc, &pre_lock_call(&token), "k:new", &p, oldest + secs(1)), Ok(Decided::Write(_))));
}

/// Contract 1.1's eviction, kept as a deviation (`--fault legacy-record-eviction`):
/// the repeat of an evicted pre-lock gets a fresh lock.
#[test]
fn the_legacy_eviction_grants_a_fresh_lock_to_a_late_repeat() {
    let p = LockPolicy {
        keyed_records: 16,
        deviations: Deviations { legacy_record_eviction: true, ..Deviations::default() },
        ..margined()
    };
    let now = t0();
    let first = LockToken::generate();
    let doc = commit(&LocationDocument::new("r", "w"), &pre_lock_call(&first), "k:K", &p, now);
    let doc = commit(&doc, &LockCall::Release { token: first }, "k:R", &p, now);
    let doc = churn(doc, 8, "a", &p, now);
    assert_eq!(doc.operations.len(), 16);
    assert!(matches!(decide(&doc, &pre_lock_call(&LockToken::generate()), "k:K", &p, now), Ok(Decided::Write(_))));
}

/// The worst-case size the record budget allows (docs/contract.md, version 1.3): every
/// keyed record with a key of the longest length the contract accepts (128 characters),
/// the keyless ones beside them, and a live lock. It stays well under Cosmos DB's 2 MB
/// item limit, and the figure the contract states is this one.
#[test]
fn a_document_at_the_record_budget_stays_well_under_the_item_limit() {
    let p = margined();
    let now = t0();
    let longest =
        |tag: &str, i: usize| format!("k:{}", format!("{tag}{i:04}").repeat(32).chars().take(128).collect::<String>());
    let mut doc = LocationDocument::new("r", "westeurope");
    for i in 0..DEFAULT_KEYED_RECORDS / 2 {
        let token = LockToken::generate();
        doc = commit(&doc, &pre_lock_call(&token), &longest("p", i), &p, now);
        doc = commit(&doc, &LockCall::Release { token }, &longest("r", i), &p, now);
    }
    let token = LockToken::generate();
    for i in 0..KEYLESS_RECORDS {
        let call =
            if i == 0 { pre_lock_call(&token) } else { LockCall::Renew { token: token.clone(), duration: DELAY } };
        doc = commit(&doc, &call, &format!("w:{i:016x}"), &p, now);
    }
    assert_eq!(doc.operations.len(), DEFAULT_KEYED_RECORDS + KEYLESS_RECORDS);
    let bytes = doc.serialized_len();
    println!("a document at the record budget: {bytes} bytes");
    assert!(bytes < 100 * 1024, "{bytes} bytes: the contract states under 100 KiB");
}

// Mutants that survived the library's unit tests (scripts/mutants.sh, RELIABILITY.md
// "Mutation score of the routing core"), each killed by the test below it.

#[test]
fn the_declared_delay_is_the_largest_ttl_plus_the_replication_bound() {
    let p = LockPolicy::declared(Duration::from_secs(2), Duration::from_secs(1), Duration::from_secs(3600));
    assert_eq!(p.convergence_delay, Duration::from_secs(3));
    assert_eq!(p.max_pre_lock, Duration::from_secs(3600));
}

#[test]
fn a_pre_lock_of_exactly_the_maximum_is_granted() {
    let doc = LocationDocument::new("r", "westeurope");
    let granted = pre_lock(&doc, &req(MAX), LockToken::generate(), &policy(), t0()).unwrap();
    let l = lock(&granted);
    assert_eq!(l.expires_at - l.effective_at, TimeDelta::from_std(MAX).unwrap());
}

#[test]
fn a_pre_lock_over_a_lapsed_lock_keeps_the_fields_a_newer_version_wrote_on_it() {
    let (mut doc, _) = locked(t0());
    let old = doc.primary.lock.as_mut().unwrap();
    old.extra.insert("fencedBy".into(), serde_json::json!("a newer version"));
    let later = old.expires_at;
    let next = pre_lock(&doc, &req(PRE), LockToken::generate(), &policy(), later).unwrap();
    assert_eq!(lock(&next).extra.get("fencedBy"), Some(&serde_json::json!("a newer version")));
}

#[test]
fn a_swap_guard_holds_off_a_new_target_elsewhere_until_it_lapses() {
    let now = t0();
    let (doc, token) = locked(now);
    let w = to_write_lock(&doc, &token, &policy(), now + secs(60));
    let at = now + secs(80);
    // Now at northeurope, westeurope guarded until at + 60 s.
    let swapped = swap(&w, &token, "northeurope", &policy(), at).unwrap();
    let to = |place: &str| PreLockRequest { target_location: Some(place.into()), ..req(PRE) };
    let soon = at + secs(1);
    assert_eq!(
        pre_lock(&swapped, &to("eastus"), LockToken::generate(), &policy(), soon),
        Err(LockError::LockHeld { expires_at: at + secs(60) })
    );
    // Back to the guarded location, or no target: granted while the guard lives.
    assert!(pre_lock(&swapped, &to("westeurope"), LockToken::generate(), &policy(), soon).is_ok());
    assert!(pre_lock(&swapped, &req(PRE), LockToken::generate(), &policy(), soon).is_ok());
    // Once the guard lapsed, a target elsewhere is granted.
    assert!(pre_lock(&swapped, &to("eastus"), LockToken::generate(), &policy(), at + secs(61)).is_ok());
}

#[test]
fn renewing_a_pre_lock_keeps_its_target_lock_with_it() {
    let doc = LocationDocument::new("r", "westeurope");
    let r = PreLockRequest { target_location: Some("northeurope".into()), ..req(PRE) };
    let token = LockToken::generate();
    let locked = pre_lock(&doc, &r, token.clone(), &policy(), t0()).unwrap();
    let renewed = renew(&locked, &token, Duration::from_secs(5400), &policy(), t0() + secs(61)).unwrap();
    let parent = lock(&renewed).pre_lock_expires_at;
    let target = renewed.secondary.as_ref().unwrap().lock.as_ref().unwrap();
    assert_eq!((target.expires_at, target.pre_lock_expires_at, target.renewals), (parent, parent, 1));
    assert!(parent > lock(&locked).pre_lock_expires_at, "the renewal extended the parent");
}

#[test]
fn the_swap_guard_is_a_write_lock_from_the_swap_for_the_delay_and_the_margin() {
    let p = LockPolicy { skew_margin: Duration::from_secs(5), ..policy() };
    let now = t0();
    let token = LockToken::generate();
    let doc = pre_lock(&LocationDocument::new("r", "westeurope"), &req(PRE), token.clone(), &p, now).unwrap();
    let start = lock(&doc).effective_at;
    let w = to_write_lock(&doc, &token, &p, start);
    let at = start + secs(20);
    let swapped = swap(&w, &token, "northeurope", &p, at).unwrap();
    let guard = swapped.secondary.as_ref().unwrap().lock.as_ref().unwrap();
    let end = at + secs(60 + 5);
    assert_eq!(guard.phase, Phase::Write);
    assert_eq!(
        (guard.effective_at, guard.expires_at, guard.pre_lock_expires_at, guard.max_expires_at),
        (at, end, end, end)
    );
}

#[test]
fn an_uncapped_pre_lock_renews_past_the_maximum() {
    let p = LockPolicy { deviations: Deviations { uncapped_pre_lock: true, ..Deviations::default() }, ..policy() };
    let (doc, token) = locked(t0());
    let at = lock(&doc).effective_at;
    let renewed = renew(&doc, &token, MAX + Duration::from_secs(3600), &p, at).unwrap();
    assert_eq!(lock(&renewed).expires_at, at + TimeDelta::from_std(MAX).unwrap() + secs(3600));
    // Capped without the deviation.
    let capped = renew(&doc, &token, MAX + Duration::from_secs(3600), &policy(), at).unwrap();
    assert_eq!(lock(&capped).expires_at, lock(&doc).max_expires_at);
}

#[test]
fn a_call_bound_to_a_lease_keeps_the_previous_version_without_its_records() {
    // A keyed pre-lock, so the document carries a record and a pending effect.
    let token = LockToken::generate();
    let call = LockCall::PreLock { request: req(PRE), token: token.clone() };
    let Decided::Write(doc) =
        decide(&LocationDocument::new("r", "westeurope"), &call, "k:key", &policy(), t0()).unwrap()
    else {
        panic!("a first pre-lock writes")
    };
    let doc = *doc;
    assert!(!doc.operations.is_empty() && doc.pending.is_some(), "the pre-lock wrote records to drop");
    let at = lock(&doc).effective_at;
    let renewed = renew(&doc, &token, Duration::from_secs(60), &policy(), at).unwrap();
    let previous = renewed.pending.as_ref().and_then(|p| p.previous.as_ref()).expect("bound to the old lease");
    assert!(previous.operations.is_empty() && previous.pending.is_none(), "{previous:?}");
}

#[test]
fn a_write_with_nothing_pending_carries_no_pending_record_and_one_that_starts_a_phase_does() {
    // A legacy renewal binds nothing to the lease: nothing pending.
    let legacy = LockPolicy { deviations: Deviations { legacy_renewal: true, ..Deviations::default() }, ..policy() };
    let (doc, token) = locked(t0());
    let renewed = renew(&doc, &token, Duration::from_secs(60), &legacy, lock(&doc).effective_at).unwrap();
    assert!(renewed.pending.is_none(), "{:?}", renewed.pending);
    // A legacy effectiveAt records no delay after the commit, but the phase still starts
    // at the commit: pending.
    let legacy =
        LockPolicy { deviations: Deviations { legacy_effective_at: true, ..Deviations::default() }, ..policy() };
    let pre =
        pre_lock(&LocationDocument::new("r", "westeurope"), &req(PRE), LockToken::generate(), &legacy, t0()).unwrap();
    let pending = pre.pending.as_ref().expect("the phase starts at the commit");
    assert!(pending.phase_starts && pending.effective_after_commit_seconds.is_none());
}

#[test]
fn a_swap_keeps_the_declared_targets_fields_and_starts_the_guard_afresh() {
    let r = PreLockRequest { target_location: Some("northeurope".into()), ..req(PRE) };
    let token = LockToken::generate();
    let mut doc = pre_lock(&LocationDocument::new("r", "westeurope"), &r, token.clone(), &policy(), t0()).unwrap();
    doc.secondary.as_mut().unwrap().extra.insert("shard".into(), serde_json::json!(7));
    let start = lock(&doc).effective_at;
    let w = to_write_lock(&doc, &token, &policy(), start);
    // As stored and read back: the write phase's start is known.
    let w = settle(w, start + secs(10));
    assert!(lock(&w).phase_since.is_some());
    let swapped = swap(&w, &token, "northeurope", &policy(), start + secs(20)).unwrap();
    assert_eq!(swapped.primary.extra.get("shard"), Some(&serde_json::json!(7)));
    let guard = swapped.secondary.as_ref().unwrap().lock.as_ref().unwrap();
    assert_eq!(guard.phase_since, None, "the guard is not the write phase that began earlier");
}

#[test]
fn the_expand_step_writes_every_call_in_format_1_settled_at_its_decision() {
    // A whole migration decided with `write_format` 1: every document written is one a
    // reader of format 1 reads (no pending effect), and it means what the newest format's
    // document means once committed at the decision.
    let expand = LockPolicy { write_format: crate::document::FORMAT_1, ..margined() };
    let token = LockToken::generate();
    let mut at = t0();
    let pre = LockCall::PreLock {
        request: PreLockRequest { target_location: Some("eastus".into()), ..req(PRE) },
        token: token.clone(),
    };
    // Past the pre-lock's effectiveAt (the delay and the margin after it).
    let effective_at = at + secs(120);
    let escalate = |phase| LockCall::Escalate { token: token.clone(), phase, duration: Duration::from_secs(60) };
    let calls = [
        (pre, at),
        (escalate(Phase::HardDelete), effective_at),
        (LockCall::Renew { token: token.clone(), duration: Duration::from_secs(90) }, effective_at + secs(5)),
        (escalate(Phase::Write), effective_at + secs(10)),
        (LockCall::Swap { token: token.clone(), target: "eastus".into() }, effective_at + secs(20)),
    ];
    let (mut old, mut new) = (LocationDocument::new("r", "westeurope"), LocationDocument::new("r", "westeurope"));
    for (i, (call, now)) in calls.into_iter().enumerate() {
        at = now;
        let key = format!("k:{i}");
        let expanded = written(decide(&old, &call, &key, &expand, at).unwrap());
        assert_eq!(expanded.format(), crate::document::FORMAT_1, "call {i}");
        assert!(expanded.pending.is_none(), "call {i}");
        let newest = written(decide(&new, &call, &key, &margined(), at).unwrap());
        assert_eq!(newest.format(), FORMAT_2, "call {i}: the newest format carries its pending effect");
        let newest = settle(newest, at);
        assert_eq!(expanded, newest, "call {i}: the same meaning as the newest format committed at once");
        if matches!(i, 0 | 1 | 3) {
            assert_eq!(lock(&expanded).phase_since, Some(at), "call {i}: a phase starts at its decision");
        }
        (old, new) = (expanded, newest);
    }
    assert_eq!(old.primary.location, "eastus");
}

/// A pre-lock as decided under `margined()` at `now`, its pending record changed by
/// `edit` and sealed again, as another writer of format 2 may write it.
fn pre_lock_with_pending(now: DateTime<Utc>, edit: impl FnOnce(&mut PendingEffect)) -> LocationDocument {
    let doc = pre_lock(&LocationDocument::new("r", "westeurope"), &req(PRE), LockToken::generate(), &margined(), now);
    let mut doc = doc.unwrap();
    let mut pending = Arc::unwrap_or_clone(doc.pending.take().unwrap());
    edit(&mut pending);
    seal(&mut doc, pending);
    doc
}

#[test]
fn each_part_of_a_pending_record_takes_effect_on_its_own() {
    // The record's fields are independent in the format: a start delayed past the
    // commit applies without a phase start (which this library's pre-locks also carry).
    let now = t0();
    let doc = pre_lock_with_pending(now, |p| p.phase_starts = false);
    let decided_start = lock(&doc).effective_at;
    let settled = settle(doc.clone(), now + secs(3));
    assert_eq!(lock(&settled).effective_at, decided_start + secs(3), "the start moves with a late commit");
    assert_eq!(lock(&settled).phase_since, None, "no phase starts where the record says none does");
    assert!(matches!(settle_view(&doc, now + secs(3)), Cow::Owned(_)));
    // Committed at the decision, the floor is the decided start itself: nothing moves,
    // so a reader is lent the document as written.
    assert_eq!(settle(doc.clone(), now), LocationDocument { pending: None, ..doc.clone() });
    assert!(matches!(settle_view(&doc, now), Cow::Borrowed(_)), "a floor at the start itself changes nothing");
}

#[test]
fn a_void_write_keeps_the_documents_unknown_fields_and_leaves_no_pending_record() {
    let now = t0();
    let (w, token, end) = write_locked(now);
    let mut renewed =
        renew(&w, &token, Duration::from_secs(30), &margined(), end - TimeDelta::milliseconds(200)).unwrap();
    // A field a newer version put on the document, and a previous version that (written
    // by another writer) carries a pending record of its own.
    renewed.extra.insert("newerField".into(), serde_json::json!(1));
    let pending = Arc::make_mut(renewed.pending.as_mut().unwrap());
    let previous = Arc::make_mut(pending.previous.as_mut().unwrap());
    previous.pending = Some(Arc::new(PendingEffect { phase_starts: true, ..PendingEffect::empty() }));
    let landed_late = settle(renewed, end + TimeDelta::milliseconds(1200));
    assert_eq!(lock(&landed_late).expires_at, end, "void");
    assert_eq!(landed_late.extra.get("newerField"), Some(&serde_json::json!(1)), "unknown fields are kept");
    assert!(landed_late.pending.is_none(), "what the next write stores carries no pending effect");
}

#[test]
fn a_calls_record_outlives_its_lock_by_the_declared_delay_and_the_margin() {
    // Until then some reader may still see the lock, and a repeat of the call must be
    // answered from the record, not decided afresh.
    let now = t0();
    let empty = LocationDocument::new("r", "westeurope");
    let Decided::Write(next) =
        decide(&empty, &pre_lock_call(&LockToken::generate()), "k:one", &margined(), now).unwrap()
    else {
        panic!("a pre-lock writes")
    };
    let l = lock(&next);
    let record = next.operations.iter().find(|r| &*r.key == "k:one").unwrap();
    assert_eq!(record.keep_until, l.max_expires_at.max(l.expires_at) + secs(60) + secs(2));
}
