//! The size of the documents a run writes, by lock phase: contract 1.3's budget (4 KiB
//! at the p99 of a fleet's versions, never more than the record budget's worst case,
//! under 100 KiB) checked on the versions a harness run makes.
//!
//! The routing clients whose writes are measured hand every version the store committed
//! to a [`DocumentSizes`] ([`DocumentSizes::record`] as their
//! [`crate::routing::CommitObserver`]): the bytes the store holds, pending record
//! included, each version once (a write the store refused is not counted). The size is
//! counted as the JSON is written ([`LocationDocument::serialized_len`]), never built, and
//! kept exactly per byte count up to 16 KiB (an HDR histogram to three significant digits
//! above, past the budget), so p50, p99 and the largest are exact for documents within
//! it.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, PoisonError};

use hdrhistogram::Histogram;

use crate::document::{LocationDocument, LOCK_STATES};

/// The contract's budget at the 99th percentile of the versions written.
pub const P99_BUDGET_BYTES: u64 = 4 * 1024;

/// The contract's hard maximum: the record budget's worst case stays under it.
pub const MAX_BYTES: u64 = 100 * 1024;

/// Sizes below this are counted exactly, one counter per byte count, without a lock:
/// the replay's drivers record side by side, often in the same phase, and a lock shared
/// by them cost it more than measuring did. A routing document is a few KiB.
const EXACT: usize = 16 * 1024;

/// Largest size the overflow histogram holds: Cosmos DB's item limit. A larger version
/// (which the store would refuse) is clamped to it, and its exact size still shows as
/// the largest.
const HIGHEST: u64 = 2 * 1024 * 1024;

/// Sizes of the versions written, by lock phase ([`LocationDocument::lock_state`]).
#[derive(Debug)]
pub struct DocumentSizes {
    /// One per [`LOCK_STATES`] entry, in its order.
    phases: [Phase; 4],
}

#[derive(Debug)]
struct Phase {
    /// `exact[b]`: versions of `b` bytes, for `b` below [`EXACT`].
    exact: Box<[AtomicU64]>,
    /// Versions of [`EXACT`] bytes or more (rare: past the budget), to three digits.
    over: Mutex<Histogram<u64>>,
    max: AtomicU64,
}

impl Default for DocumentSizes {
    fn default() -> Self {
        Self::new()
    }
}

impl DocumentSizes {
    /// Nothing counted yet.
    pub fn new() -> Self {
        let phase = || Phase {
            exact: (0..EXACT).map(|_| AtomicU64::new(0)).collect(),
            over: Mutex::new(
                // From 1, not EXACT: the lowest bound sets the unit, and EXACT as the
                // unit would make the buckets 16 KiB wide.
                Histogram::new_with_bounds(1, HIGHEST, 3).expect("1 to HIGHEST at 3 digits is valid"),
            ),
            max: AtomicU64::new(0),
        };
        Self { phases: [phase(), phase(), phase(), phase()] }
    }

    /// Counts one version written.
    pub fn record(&self, doc: &LocationDocument) {
        let state = doc.lock_state();
        let Some(phase) = LOCK_STATES.iter().position(|s| *s == state).map(|i| &self.phases[i]) else { return };
        let bytes = doc.serialized_len();
        phase.max.fetch_max(bytes as u64, Ordering::Relaxed);
        match phase.exact.get(bytes) {
            Some(count) => {
                count.fetch_add(1, Ordering::Relaxed);
            }
            None => {
                // A histogram left by a panicking holder is whole: `record` is one update.
                let mut over = phase.over.lock().unwrap_or_else(PoisonError::into_inner);
                over.saturating_record((bytes as u64).min(HIGHEST));
            }
        }
    }

    /// The figures per phase, in [`LOCK_STATES`] order, phases with no version included.
    /// Read once the writers are done: counts taken while they write may be mid-update.
    pub fn table(&self) -> SizeTable {
        let rows = LOCK_STATES.iter().zip(&self.phases).map(|(state, phase)| phase.sizes(state)).collect();
        SizeTable { rows }
    }
}

impl Phase {
    fn sizes(&self, state: &'static str) -> PhaseSizes {
        let exact: Vec<u64> = self.exact.iter().map(|c| c.load(Ordering::Relaxed)).collect();
        let over = self.over.lock().unwrap_or_else(PoisonError::into_inner);
        let versions = exact.iter().sum::<u64>() + over.len();
        let max = self.max.load(Ordering::Relaxed);
        // The size at rank ceil(q * n), walking the exact counts, then the overflow's
        // buckets (whose tops are capped at the exact largest).
        let at = |q: f64| -> u64 {
            if versions == 0 {
                return 0;
            }
            let rank = ((q * versions as f64).ceil() as u64).clamp(1, versions);
            let mut seen = 0;
            for (bytes, count) in exact.iter().enumerate() {
                seen += count;
                if seen >= rank {
                    return bytes as u64;
                }
            }
            for v in over.iter_recorded() {
                seen += v.count_at_value();
                if seen >= rank {
                    return over.highest_equivalent(v.value_iterated_to()).min(max);
                }
            }
            max
        };
        PhaseSizes { phase: state, versions, p50: at(0.5), p99: at(0.99), max }
    }
}

/// The sizes of one phase's versions, bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct PhaseSizes {
    /// The phase ([`LOCK_STATES`]).
    pub phase: &'static str,
    /// Versions written in it.
    pub versions: u64,
    /// Median size (exact under 16 KiB, three significant digits above).
    pub p50: u64,
    /// 99th percentile (likewise).
    pub p99: u64,
    /// Largest size, exact.
    pub max: u64,
}

/// The sizes of a run's versions, per phase, in a migration's order.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
#[serde(transparent)]
pub struct SizeTable {
    /// One row per phase, in [`LOCK_STATES`] order.
    pub rows: Vec<PhaseSizes>,
}

impl SizeTable {
    /// Several runs' tables as one: the versions of every run, and each phase's
    /// largest p50, p99 and max over the runs (the run nearest the budget is the one
    /// that matters to it).
    pub fn worst_of<'a>(tables: impl IntoIterator<Item = &'a SizeTable>) -> SizeTable {
        let mut worst = SizeTable::default();
        for table in tables {
            for r in &table.rows {
                match worst.rows.iter_mut().find(|w| w.phase == r.phase) {
                    Some(w) => {
                        w.versions += r.versions;
                        w.p50 = w.p50.max(r.p50);
                        w.p99 = w.p99.max(r.p99);
                        w.max = w.max.max(r.max);
                    }
                    None => worst.rows.push(*r),
                }
            }
        }
        worst
    }

    /// The row of `phase`, if it is one of [`LOCK_STATES`].
    pub fn phase(&self, phase: &str) -> Option<&PhaseSizes> {
        self.rows.iter().find(|r| r.phase == phase)
    }

    /// The phases whose figures break the contract's budget: p99 over
    /// [`P99_BUDGET_BYTES`] or a version over [`MAX_BYTES`]; what each broke.
    pub fn over_budget(&self) -> Vec<String> {
        let mut over = Vec::new();
        for r in &self.rows {
            if r.p99 > P99_BUDGET_BYTES {
                over.push(format!("{}: p99 {} B over the {P99_BUDGET_BYTES} B budget", r.phase, r.p99));
            }
            if r.max > MAX_BYTES {
                over.push(format!("{}: a version of {} B over the {MAX_BYTES} B maximum", r.phase, r.max));
            }
        }
        over
    }

    /// The table as text, one line per phase, each prefixed with `indent`.
    pub fn text(&self, indent: &str) -> String {
        let mut out =
            format!("{indent}{:<11} {:>10} {:>7} {:>7} {:>7}\n", "phase", "versions", "p50 B", "p99 B", "max B");
        for r in &self.rows {
            out.push_str(&format!(
                "{indent}{:<11} {:>10} {:>7} {:>7} {:>7}\n",
                r.phase, r.versions, r.p50, r.p99, r.max
            ));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_are_counted_by_phase_and_ranked_exactly() {
        let sizes = DocumentSizes::new();
        let small = LocationDocument::new("r1", "westeurope");
        sizes.record(&small);
        let mut large = LocationDocument::new("r1", "northeurope");
        large.extra.insert("padding".into(), "x".repeat(5_000).into());
        sizes.record(&large);
        let table = sizes.table();
        let unlocked = table.phase("unlocked").unwrap();
        assert_eq!(unlocked.versions, 2);
        assert_eq!(unlocked.max, large.serialized_len() as u64);
        // Two versions: the median is the smaller, exactly; the p99 the larger.
        assert_eq!(unlocked.p50, small.serialized_len() as u64, "{unlocked:?}");
        assert_eq!(unlocked.p99, large.serialized_len() as u64, "{unlocked:?}");
        assert!(unlocked.p99 > P99_BUDGET_BYTES, "{unlocked:?}");
        assert_eq!(table.phase("preLock").unwrap().versions, 0);
        assert_eq!(table.rows.len(), 4);
        let over = table.over_budget();
        assert_eq!(over.len(), 1, "{over:?}");
        assert!(over[0].starts_with("unlocked: p99"), "{over:?}");

        let row = |phase, versions, p50, p99, max| PhaseSizes { phase, versions, p50, p99, max };
        let one = SizeTable { rows: vec![row("preLock", 3, 900, 1000, 1100), row("write", 1, 2000, 2000, 2000)] };
        let two = SizeTable { rows: vec![row("preLock", 2, 950, 990, 1200)] };
        let worst = SizeTable::worst_of([&one, &two]);
        assert_eq!(worst.rows, vec![row("preLock", 5, 950, 1000, 1200), row("write", 1, 2000, 2000, 2000)]);
    }

    #[test]
    fn sizes_past_the_exact_counts_are_ranked_after_them() {
        let sizes = DocumentSizes::new();
        let padded = |n: usize| {
            let mut doc = LocationDocument::new("r1", "westeurope");
            doc.extra.insert("padding".into(), "x".repeat(n).into());
            doc
        };
        for _ in 0..100 {
            sizes.record(&padded(10));
        }
        let (big, bigger) = (padded(20_000), padded(40_000));
        sizes.record(&big);
        sizes.record(&bigger);
        let unlocked = *sizes.table().phase("unlocked").unwrap();
        assert_eq!((unlocked.versions, unlocked.p50), (102, padded(10).serialized_len() as u64));
        // Rank 101 of 102 is the first past the exact counts, to three digits.
        let expected = big.serialized_len() as u64;
        assert!(unlocked.p99 >= expected && unlocked.p99 <= expected + expected / 1000, "{unlocked:?}");
        assert_eq!(unlocked.max, bigger.serialized_len() as u64);
    }
}
