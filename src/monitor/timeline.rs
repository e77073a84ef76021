//! The compact record the monitor keeps per in-flight migration.
//!
//! A million of these must fit in a few hundred megabytes, so times are milliseconds
//! (absolute `i64` where a lease or order is compared, `u32` offsets from acquiredAt
//! elsewhere) and the lock token is never kept: a migration is told apart from the
//! next one on the same resource by its acquiredAt plus a 32-bit keyed hash of the
//! token, which cannot be turned back into the token.

use chrono::{DateTime, Utc};

use crate::document::Phase;

/// Offsets larger than this (about 49 days) saturate; `NONE` marks "not observed".
const NONE: u32 = u32::MAX;

/// One migration's lock timeline, as observed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Timeline {
    /// acquiredAt, milliseconds since the Unix epoch.
    pub(crate) acquired_ms: i64,
    /// The current phase's lease end, milliseconds since the epoch.
    pub(crate) expires_ms: i64,
    /// Newest observation applied (commit time or scan time): older stream versions are
    /// stale and skipped.
    pub(crate) last_seen_ms: i64,
    /// Declared convergence delay (effectiveAt - acquiredAt), milliseconds.
    pub(crate) delay_ms: u32,
    /// When hardDelete was observed, as an offset from acquiredAt.
    pub(crate) hard_delete_off: u32,
    /// When the write lock was observed, as an offset from acquiredAt.
    pub(crate) write_off: u32,
    /// Keyed hash of the token: tells this migration from the next one.
    pub(crate) token_hash: u32,
    /// Hash of the primary location, to see it change.
    pub(crate) location_hash: u32,
    /// Renewals seen so far.
    pub(crate) renewals: u32,
    /// Current phase.
    pub(crate) phase: Phase,
    /// `EARLY_JUDGED`, `PARTIAL_COUNTED`, `LAPSED`, `ENDED`, `PROBE`.
    pub(crate) flags: u8,
    /// Where the table keeps this migration's resource id (see [`super::table`]): here,
    /// the four bytes fill what would otherwise be padding.
    pub(crate) id_at: u32,
}

/// The escalation to hardDelete has been judged against delay + buffer.
pub(crate) const EARLY_JUDGED: u8 = 1;
/// A partial cutover was counted for this migration.
pub(crate) const PARTIAL_COUNTED: u8 = 2;
/// The lease ran out with the lock still in the document: an orphan.
pub(crate) const LAPSED: u8 = 4;
/// The migration ended (the lock is gone); kept briefly so late versions of it are
/// recognised as such.
pub(crate) const ENDED: u8 = 8;
/// The lock was taken by lockprobe's own probe (its owner says so): reported apart from
/// the fleet's, and its lapse is the lease-lapse check's design, not an anomaly.
pub(crate) const PROBE: u8 = 16;

/// Milliseconds since the Unix epoch.
pub(crate) fn ms(t: DateTime<Utc>) -> i64 {
    t.timestamp_millis()
}

/// `to - from` as a saturating `u32` offset (negative spans count as zero).
pub(crate) fn offset(from_ms: i64, to_ms: i64) -> u32 {
    u32::try_from((to_ms - from_ms).max(0)).unwrap_or(NONE - 1)
}

impl Timeline {
    /// A timeline for a lock first observed now.
    pub(crate) fn new(
        acquired_ms: i64,
        effective_ms: i64,
        expires_ms: i64,
        token_hash: u32,
        location_hash: u32,
        phase: Phase,
        renewals: u32,
    ) -> Self {
        Self {
            acquired_ms,
            expires_ms,
            last_seen_ms: i64::MIN,
            delay_ms: offset(acquired_ms, effective_ms),
            hard_delete_off: NONE,
            write_off: NONE,
            token_hash,
            location_hash,
            renewals,
            phase,
            flags: 0,
            id_at: 0,
        }
    }

    /// Whether this is the migration identified by `acquired_ms` and `token_hash`.
    pub(crate) fn is(&self, acquired_ms: i64, token_hash: u32) -> bool {
        self.acquired_ms == acquired_ms && self.token_hash == token_hash
    }

    /// Whether `flag` is set.
    pub(crate) fn has(&self, flag: u8) -> bool {
        self.flags & flag != 0
    }

    /// Sets `flag` (ending a migration replaces every flag with `ENDED`).
    pub(crate) fn set(&mut self, flag: u8) {
        self.flags |= flag;
    }

    /// Records when a phase began (`at_ms` absolute).
    pub(crate) fn mark_phase_start(&mut self, phase: Phase, at_ms: i64) {
        let off = offset(self.acquired_ms, at_ms);
        match phase {
            Phase::PreLock => {}
            Phase::HardDelete => self.hard_delete_off = off,
            Phase::Write => self.write_off = off,
        }
    }

    /// When `phase` began, if observed.
    pub(crate) fn phase_start_ms(&self, phase: Phase) -> Option<i64> {
        let off = match phase {
            Phase::PreLock => 0,
            Phase::HardDelete => self.hard_delete_off,
            Phase::Write => self.write_off,
        };
        (off != NONE).then(|| self.acquired_ms + i64::from(off))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stays_small() {
        // Three i64, seven u32 (the id's address included), a phase and flags: the
        // budget a million of them share.
        assert!(std::mem::size_of::<Timeline>() <= 56, "{}", std::mem::size_of::<Timeline>());
    }

    #[test]
    fn offsets_saturate_and_phase_starts_round_trip() {
        assert_eq!(offset(10, 5), 0);
        assert_eq!(offset(0, i64::MAX), NONE - 1);
        let mut t = Timeline::new(1_000, 3_000, 9_000, 7, 9, Phase::PreLock, 0);
        assert_eq!(t.phase_start_ms(Phase::PreLock), Some(1_000));
        assert_eq!(t.phase_start_ms(Phase::HardDelete), None);
        t.mark_phase_start(Phase::HardDelete, 4_500);
        assert_eq!(t.phase_start_ms(Phase::HardDelete), Some(4_500));
        assert_eq!(t.delay_ms, 2_000);
    }
}
