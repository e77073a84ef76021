//! When a view of a location document that did not come from the write region just now
//! may be acted on: pure rules, shared by the client and the model checker.
//!
//! A cache entry is served (rather than read through) only while its lock, if any, has
//! not started; a replica's view of a lock that has started, or lapsed so recently that
//! a renewal may not have replicated yet, is re-read from the write region. A lock that
//! had lapsed for every clock when it was fetched is final: an expired token can do
//! nothing, and a call that relied on the lease is void if it lands after it.

use std::time::Duration;

use chrono::{DateTime, Utc};

use super::lifecycle::LockPolicy;
use crate::clock::to_chrono;
use crate::document::{LocationDocument, LockInfo};

fn plus(t: DateTime<Utc>, d: Duration) -> DateTime<Utc> {
    t.checked_add_signed(to_chrono(d)).unwrap_or(DateTime::<Utc>::MAX_UTC)
}

fn minus(t: DateTime<Utc>, d: Duration) -> DateTime<Utc> {
    t.checked_sub_signed(to_chrono(d)).unwrap_or(DateTime::<Utc>::MIN_UTC)
}

/// Until when a settled document fetched at `fetched` may be served from a cache
/// without reading through (each tier's TTL applies on top). A document carrying a lock
/// that was possibly live when fetched may be served until that lock starts (its
/// `effectiveAt` less the skew margin); after that only the write region can say what
/// holds now.
pub fn serve_until(doc: &LocationDocument, fetched: DateTime<Utc>, policy: &LockPolicy) -> DateTime<Utc> {
    match &doc.primary.lock {
        Some(lock) if plus(lock.expires_at, policy.skew_margin) > fetched => {
            if policy.deviations.cache_serves_started_locks {
                DateTime::<Utc>::MAX_UTC
            } else {
                minus(lock.effective_at, policy.skew_margin)
            }
        }
        _ => DateTime::<Utc>::MAX_UTC,
    }
}

/// Whether `lock` may restrict user operations at `now` by some clock within the margin.
pub fn has_started(lock: &LockInfo, now: DateTime<Utc>, policy: &LockPolicy) -> bool {
    lock.effective_at <= plus(now, policy.skew_margin)
}

/// Whether a replica's view of `lock` could differ from the write region's in a way
/// that matters: the lock has started, and it is live or lapsed so recently (within its
/// declared convergence delay, which covers the replication bound, plus the margin)
/// that a change made before the lapse may not have replicated yet.
pub fn replica_view_needs_write_region(lock: &LockInfo, now: DateTime<Utc>, policy: &LockPolicy) -> bool {
    let recent = lock
        .expires_at
        .checked_add_signed(lock.convergence_delay() + to_chrono(policy.skew_margin))
        .unwrap_or(DateTime::<Utc>::MAX_UTC);
    has_started(lock, now, policy) && now < recent
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::{Clock, ManualClock};
    use crate::routing::lifecycle::{pre_lock, PreLockRequest};
    use crate::routing::LockToken;

    fn policy() -> LockPolicy {
        LockPolicy::declared(Duration::from_secs(2), Duration::from_secs(1), Duration::from_secs(3600))
    }

    fn locked(now: DateTime<Utc>) -> LocationDocument {
        let req = PreLockRequest { owner: "t".into(), duration: Duration::from_secs(60), target_location: None };
        pre_lock(&LocationDocument::new("r", "a"), &req, LockToken::generate(), &policy(), now).unwrap()
    }

    #[test]
    fn a_lock_free_document_is_served_for_the_whole_ttl() {
        let now = ManualClock::at_epoch().now();
        assert_eq!(serve_until(&LocationDocument::new("r", "a"), now, &policy()), DateTime::<Utc>::MAX_UTC);
    }

    #[test]
    fn a_pre_lock_is_served_until_it_starts_less_the_margin() {
        let now = ManualClock::at_epoch().now();
        let doc = locked(now);
        let lock = doc.primary.lock.as_ref().unwrap();
        assert_eq!(serve_until(&doc, now, &policy()), lock.effective_at - to_chrono(policy().skew_margin));
        let broken = LockPolicy {
            deviations: crate::routing::lifecycle::Deviations {
                cache_serves_started_locks: true,
                ..Default::default()
            },
            ..policy()
        };
        assert_eq!(serve_until(&doc, now, &broken), DateTime::<Utc>::MAX_UTC);
    }

    #[test]
    fn a_lock_lapsed_for_every_clock_is_final() {
        let now = ManualClock::at_epoch().now();
        let doc = locked(now);
        let lock = doc.primary.lock.as_ref().unwrap();
        let just_lapsed = lock.expires_at + to_chrono(Duration::from_millis(100));
        assert!(serve_until(&doc, just_lapsed, &policy()) < just_lapsed, "within the margin it may be live elsewhere");
        let long_lapsed = lock.expires_at + to_chrono(Duration::from_secs(1));
        assert_eq!(serve_until(&doc, long_lapsed, &policy()), DateTime::<Utc>::MAX_UTC);
        assert!(replica_view_needs_write_region(lock, long_lapsed, &policy()), "a renewal may still be replicating");
        let settled = lock.expires_at + to_chrono(Duration::from_secs(4));
        assert!(!replica_view_needs_write_region(lock, settled, &policy()));
        // A renewal may be replicating until the declared delay and the margin after the
        // lease's end, and no longer.
        let replicated = lock.expires_at + lock.convergence_delay() + to_chrono(policy().skew_margin);
        assert!(replica_view_needs_write_region(lock, replicated - to_chrono(Duration::from_nanos(1)), &policy()));
        assert!(!replica_view_needs_write_region(lock, replicated, &policy()));
        // Final from the very end of the margin, the instant every clock agrees it lapsed.
        let margin_end = lock.expires_at + to_chrono(policy().skew_margin);
        assert!(serve_until(&doc, margin_end - to_chrono(Duration::from_nanos(1)), &policy()) < margin_end);
        assert_eq!(serve_until(&doc, margin_end, &policy()), DateTime::<Utc>::MAX_UTC);
    }

    #[test]
    fn a_lock_starts_for_the_fastest_clock_a_margin_early() {
        let now = ManualClock::at_epoch().now();
        let doc = locked(now);
        let lock = doc.primary.lock.as_ref().unwrap();
        let starts = lock.effective_at - to_chrono(policy().skew_margin);
        let before = starts - to_chrono(Duration::from_nanos(1));
        assert!(!has_started(lock, before, &policy()));
        assert!(has_started(lock, starts, &policy()));
        // Not started: a replica's view of it is as good as the write region's.
        assert!(!replica_view_needs_write_region(lock, before, &policy()));
        assert!(replica_view_needs_write_region(lock, starts, &policy()));
    }
}
