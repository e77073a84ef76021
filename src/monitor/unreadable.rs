//! The documents the monitor cannot read, as it last met them.
//!
//! A stored document this library refuses (a newer library's format, or not a location
//! document at all) must not blind the monitor to the rest of the fleet: the stream and
//! the scan hand such documents over apart ([`crate::store::Unreadable`]), and the
//! monitor skips them, keeps them here, counts them and shows them until a readable
//! version of the same id replaces them.

use std::collections::HashMap;

use chrono::{DateTime, Utc};

use crate::document::DocumentError;
use crate::store::Unreadable;

/// What is known of one unreadable document.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnreadableEntry {
    /// [`DocumentError::reason`] of its refusal.
    pub reason: &'static str,
    /// When the unreadable version was committed (store clock, upper bound).
    pub committed_at: DateTime<Utc>,
}

/// Unreadable documents by id, with counts by reason kept as they change.
#[derive(Debug, Default)]
pub struct UnreadableDocuments {
    by_id: HashMap<String, UnreadableEntry>,
    counts: [usize; DocumentError::REASONS.len()],
}

fn reason_index(reason: &str) -> usize {
    DocumentError::REASONS.iter().position(|r| *r == reason).unwrap_or(0)
}

impl UnreadableDocuments {
    /// Notes that `met` cannot be read; returns whether its id was not already known
    /// as unreadable (the caller counts and logs it once). A version committed before
    /// the one already known changes nothing.
    pub fn met(&mut self, met: &Unreadable) -> bool {
        let entry = UnreadableEntry { reason: met.reason.reason(), committed_at: met.committed_at };
        match self.by_id.get_mut(&met.id) {
            Some(known) if known.committed_at > met.committed_at => false,
            Some(known) => {
                self.counts[reason_index(known.reason)] -= 1;
                self.counts[reason_index(entry.reason)] += 1;
                *known = entry;
                false
            }
            None => {
                self.counts[reason_index(entry.reason)] += 1;
                self.by_id.insert(met.id.clone(), entry);
                true
            }
        }
    }

    /// Whether a readable version of `id` committed at `committed_at` should be applied:
    /// not if it is older than the unreadable version known (a lagging stream's), and
    /// if it is as new or newer, the id is readable again and forgotten here. `None`
    /// for a version known to be the newest (a scan's): always applied.
    pub fn readable(&mut self, id: &str, committed_at: Option<DateTime<Utc>>) -> bool {
        if self.by_id.is_empty() {
            return true; // the common case: one test of a length, no hashing
        }
        match self.by_id.get(id) {
            Some(known) if committed_at.is_some_and(|at| at < known.committed_at) => false,
            Some(known) => {
                self.counts[reason_index(known.reason)] -= 1;
                self.by_id.remove(id);
                true
            }
            None => true,
        }
    }

    /// Unreadable documents known now with `reason`.
    pub fn count(&self, reason: &str) -> usize {
        self.counts[reason_index(reason)]
    }

    /// Unreadable documents known now.
    pub fn len(&self) -> usize {
        self.by_id.len()
    }

    /// At most `limit` of them, by id.
    pub fn listing(&self, limit: usize) -> Vec<(String, UnreadableEntry)> {
        let mut ids: Vec<&String> = self.by_id.keys().collect();
        ids.sort();
        ids.into_iter().take(limit).map(|id| (id.clone(), self.by_id[id].clone())).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(secs: i64) -> DateTime<Utc> {
        DateTime::from_timestamp(secs, 0).unwrap()
    }

    fn newer_format(id: &str, secs: i64) -> Unreadable {
        Unreadable {
            id: id.into(),
            committed_at: at(secs),
            reason: DocumentError::UnsupportedSchema { id: id.into(), found: 9 },
        }
    }

    fn malformed(id: &str, secs: i64) -> Unreadable {
        Unreadable { id: id.into(), committed_at: at(secs), reason: DocumentError::Malformed("x".into()) }
    }

    #[test]
    fn an_id_is_new_once_and_counted_by_its_latest_reason() {
        let mut known = UnreadableDocuments::default();
        assert!(known.met(&newer_format("a", 10)));
        assert!(!known.met(&newer_format("a", 10)), "met again: not new");
        assert!(!known.met(&malformed("a", 12)));
        assert_eq!((known.count("unsupported-format"), known.count("malformed"), known.len()), (0, 1, 1));
        assert!(!known.met(&newer_format("a", 11)), "older than the one known");
        assert_eq!(known.count("malformed"), 1);
        assert!(known.met(&newer_format("b", 1)));
        assert_eq!(known.listing(1), [("a".to_owned(), UnreadableEntry { reason: "malformed", committed_at: at(12) })]);
    }

    #[test]
    fn a_readable_version_as_new_clears_it_and_an_older_one_is_skipped() {
        let mut known = UnreadableDocuments::default();
        known.met(&newer_format("a", 10));
        assert!(!known.readable("a", Some(at(9))), "a lagging stream's older version");
        assert_eq!(known.len(), 1);
        assert!(known.readable("b", Some(at(1))));
        assert!(known.readable("a", Some(at(10))));
        assert_eq!((known.len(), known.count("unsupported-format")), (0, 0));
        known.met(&newer_format("a", 10));
        assert!(known.readable("a", None), "a scan's version is the newest");
        assert_eq!(known.len(), 0);
    }
}
