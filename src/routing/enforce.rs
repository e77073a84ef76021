//! The allow / block / tombstone decision the routing path hands to a service.
//!
//! Exactly the table in DESIGN.md: reads are never blocked; an effective hard-delete
//! lock turns deletes into tombstones; an effective write lock blocks writes and
//! deletes (retriable); no lock, a pre-lock, or an expired lock restricts nothing.

use std::time::Duration;

use chrono::{DateTime, Utc};

use super::document::{LockInfo, Phase};
use crate::clock::span;

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

/// Decides `op` under `lock` (the primary lock as resolved on the routing path) at `now`.
pub fn enforce(op: Operation, lock: Option<&LockInfo>, now: DateTime<Utc>) -> Decision {
    let Some(lock) = lock.filter(|l| l.is_live(now) && l.effective_at <= now) else {
        return Decision::Allow;
    };
    match (lock.phase, op) {
        (_, Operation::Read) | (Phase::PreLock, _) => Decision::Allow,
        (Phase::HardDelete, Operation::Write) => Decision::Allow,
        (Phase::HardDelete, Operation::Delete) => Decision::Tombstone,
        (Phase::Write, Operation::Write | Operation::Delete) => {
            Decision::Block { retry_after: span(now, lock.expires_at) }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::{to_chrono, Clock, ManualClock};
    use crate::routing::document::LockToken;
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
            extra: Map::new(),
        }
    }

    fn row(lock: Option<&LockInfo>, now: DateTime<Utc>) -> [Decision; 3] {
        [Operation::Read, Operation::Write, Operation::Delete].map(|op| enforce(op, lock, now))
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
    fn effective_write_lock_blocks_writes_and_deletes_until_the_lease_ends() {
        let now = ManualClock::at_epoch().now();
        let block = Decision::Block { retry_after: Duration::from_secs(100) };
        assert_eq!(row(Some(&lock(Phase::Write, now, -10, 100)), now), [Decision::Allow, block, block]);
    }

    #[test]
    fn expired_lock_of_any_phase_allows_everything() {
        let now = ManualClock::at_epoch().now();
        for phase in [Phase::PreLock, Phase::HardDelete, Phase::Write] {
            assert_eq!(row(Some(&lock(phase, now, -100, -1)), now), ALLOW_ALL, "{phase}");
            // The lease boundary itself is already expired.
            assert_eq!(row(Some(&lock(phase, now, -100, 0)), now), ALLOW_ALL, "{phase}");
        }
    }

    #[test]
    fn not_yet_effective_lock_restricts_nothing() {
        let clock = ManualClock::at_epoch();
        let now = clock.now();
        let l = lock(Phase::Write, now, 5, 100);
        assert_eq!(row(Some(&l), now), ALLOW_ALL);
        let later = now + to_chrono(Duration::from_secs(5));
        assert_eq!(enforce(Operation::Write, Some(&l), later), Decision::Block { retry_after: Duration::from_secs(95) });
    }
}
