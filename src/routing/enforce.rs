//! The allow / block / tombstone decision the routing path hands to a service.
//!
//! The enforcement table: reads are never blocked; a hard-delete lock turns deletes
//! into tombstones; a write lock blocks writes and deletes (retriable); no lock, a
//! pre-lock, or an expired lock restricts nothing.
//!
//! A lock reaches hard-delete or write only by an escalation, which is granted only
//! after `effectiveAt` (by the deciding clock, and `effectiveAt` already carries the
//! skew margin), so an escalated lock is in force from the moment it is seen: a reader
//! whose clock runs behind must not wait for `effectiveAt` by its own clock. It stays
//! in force until its lease has ended by every clock within the skew margin, so a
//! reader whose clock runs ahead never lifts it early.

use std::time::Duration;

use chrono::{DateTime, Utc};

use crate::clock::{span, to_chrono};
use crate::document::{LockInfo, Phase};

/// A user operation on a resource's data.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Operation {
    /// Read an item.
    Read,
    /// Create or overwrite an item.
    Write,
    /// Delete an item.
    Delete,
}

/// What the service must do with the operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    /// Proceed normally.
    Allow,
    /// Refuse with 423; the lock's lease ends in `retry_after` at the latest.
    Block {
        /// Time left on the blocking lease.
        retry_after: Duration,
    },
    /// Keep a tombstone instead of deleting physically.
    Tombstone,
}

/// Decides `op` under `lock` (the primary lock as resolved on the routing path) at `now`,
/// with `skew` the skew margin of the deciding service.
///
/// ```
/// use std::{sync::Arc, time::Duration};
/// use lockprobe::clock::{Clock, ManualClock};
/// use lockprobe::routing::{cache::TieredCache, enforce, ClientOptions, Decision, LockPolicy, Operation};
/// use lockprobe::routing::{Phase, PreLockRequest, RoutingClient};
/// use lockprobe::store::memory::{MemoryStore, MemoryStoreConfig};
///
/// # tokio::runtime::Runtime::new().unwrap().block_on(async {
/// let clock = Arc::new(ManualClock::at_epoch());
/// let store = Arc::new(MemoryStore::new(clock.clone(), MemoryStoreConfig::default()));
/// let ttl = Duration::from_secs(5);
/// let policy = LockPolicy::declared(ttl, Duration::from_secs(1), Duration::from_secs(48 * 3600));
/// let (converged, skew) = (policy.convergence_delay + policy.skew_margin, policy.skew_margin);
/// let client =
///     RoutingClient::new(store, clock.clone(), TieredCache::try_new(&[ttl])?, policy, ClientOptions::default());
/// let lock_of = |route: &lockprobe::routing::Resolved| route.record.doc.primary.lock.clone();
///
/// // No lock: everything proceeds.
/// let route = client.resolve_or_create("user-42", "westeurope").await?;
/// assert_eq!(enforce(Operation::Write, lock_of(&route).as_ref(), clock.now(), skew), Decision::Allow);
///
/// // The final sync: the orchestrator holds the write phase; writes wait, reads go on.
/// let request = PreLockRequest { owner: "migration-7".into(), duration: Duration::from_secs(3600), target_location: None };
/// let grant = client.pre_lock("user-42", &request).await?;
/// clock.advance(converged);
/// client.escalate("user-42", &grant.token, Phase::HardDelete, Duration::from_secs(600)).await?;
/// client.escalate("user-42", &grant.token, Phase::Write, Duration::from_secs(60)).await?;
/// clock.advance(converged);
///
/// let route = client.resolve("user-42").await?;
/// let lock = lock_of(&route);
/// assert!(matches!(enforce(Operation::Write, lock.as_ref(), clock.now(), skew), Decision::Block { .. }));
/// assert_eq!(enforce(Operation::Read, lock.as_ref(), clock.now(), skew), Decision::Allow);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// # }).unwrap();
/// ```
pub fn enforce(op: Operation, lock: Option<&LockInfo>, now: DateTime<Utc>, skew: Duration) -> Decision {
    let Some(lock) = lock else { return Decision::Allow };
    let ends = lock.expires_at.checked_add_signed(to_chrono(skew)).unwrap_or(DateTime::<Utc>::MAX_UTC);
    if now >= ends {
        return Decision::Allow;
    }
    match (lock.phase, op) {
        (_, Operation::Read) | (Phase::PreLock, _) => Decision::Allow,
        (Phase::HardDelete, Operation::Write) => Decision::Allow,
        (Phase::HardDelete, Operation::Delete) => Decision::Tombstone,
        (Phase::Write, Operation::Write | Operation::Delete) => Decision::Block { retry_after: span(now, ends) },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::{Clock, ManualClock};
    use crate::document::LockToken;
    use chrono::TimeDelta;
    use serde_json::Map;

    fn lock(phase: Phase, now: DateTime<Utc>, effective_in: i64, expires_in: i64) -> LockInfo {
        LockInfo {
            token: LockToken::generate(),
            phase,
            owner: "test".into(),
            acquired_at: now - chrono::TimeDelta::seconds(100),
            effective_at: now + chrono::TimeDelta::seconds(effective_in),
            expires_at: now + chrono::TimeDelta::seconds(expires_in),
            pre_lock_expires_at: now + chrono::TimeDelta::seconds(1000),
            max_expires_at: now + chrono::TimeDelta::seconds(2000),
            renewals: 0,
            convergence_delay_seconds: None,
            phase_since: None,
            extra: Map::new(),
        }
    }

    const SKEW: Duration = Duration::from_secs(1);

    fn row(lock: Option<&LockInfo>, now: DateTime<Utc>) -> [Decision; 3] {
        [Operation::Read, Operation::Write, Operation::Delete].map(|op| enforce(op, lock, now, SKEW))
    }

    const ALLOW_ALL: [Decision; 3] = [Decision::Allow; 3];

    #[test]
    fn no_lock_allows_everything() {
        let now = ManualClock::at_epoch().now();
        assert_eq!(row(None, now), ALLOW_ALL);
    }

    #[test]
    fn pre_lock_before_and_after_effective_allows_everything() {
        let now = ManualClock::at_epoch().now();
        assert_eq!(row(Some(&lock(Phase::PreLock, now, 10, 100)), now), ALLOW_ALL);
        assert_eq!(row(Some(&lock(Phase::PreLock, now, -10, 100)), now), ALLOW_ALL);
    }

    #[test]
    fn effective_hard_delete_tombstones_deletes_only() {
        let now = ManualClock::at_epoch().now();
        assert_eq!(
            row(Some(&lock(Phase::HardDelete, now, -10, 100)), now),
            [Decision::Allow, Decision::Allow, Decision::Tombstone]
        );
    }

    #[test]
    fn write_lock_blocks_writes_and_deletes_until_the_lease_ends_by_every_clock() {
        let now = ManualClock::at_epoch().now();
        let block = Decision::Block { retry_after: Duration::from_secs(101) };
        assert_eq!(row(Some(&lock(Phase::Write, now, -10, 100)), now), [Decision::Allow, block, block]);
    }

    #[test]
    fn expired_lock_of_any_phase_allows_everything_once_past_the_skew_margin() {
        let now = ManualClock::at_epoch().now();
        for phase in [Phase::PreLock, Phase::HardDelete, Phase::Write] {
            assert_eq!(row(Some(&lock(phase, now, -100, -2)), now), ALLOW_ALL, "{phase}");
            // The lease boundary + the margin is already expired.
            assert_eq!(row(Some(&lock(phase, now, -100, -1)), now), ALLOW_ALL, "{phase}");
        }
        // Within the margin of its end, a lock may still be live by another clock.
        let short = Decision::Block { retry_after: Duration::from_millis(500) };
        let lapsing = lock(Phase::Write, now, -100, 0);
        assert_eq!(enforce(Operation::Write, Some(&lapsing), now + TimeDelta::milliseconds(500), SKEW), short);
    }

    #[test]
    fn an_escalated_lock_is_in_force_even_if_this_clock_is_behind_its_effective_time() {
        // Escalation was granted at effectiveAt by the decider's clock; a reader whose
        // clock lags must not wait for it by its own.
        let now = ManualClock::at_epoch().now();
        let behind = lock(Phase::HardDelete, now, 1, 100);
        assert_eq!(enforce(Operation::Delete, Some(&behind), now, SKEW), Decision::Tombstone);
        let pre = lock(Phase::PreLock, now, -5, 100);
        assert_eq!(row(Some(&pre), now), ALLOW_ALL);
    }
}
