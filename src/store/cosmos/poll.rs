//! The query-based change stream: a cursor over `_ts` for servers without a usable
//! change feed.
//!
//! `_ts` has one-second resolution, so neither `_ts` alone nor `(_ts, id)` is a safe
//! cursor: a document written later in the same second with a smaller id would be
//! skipped. The cursor instead keeps the highest `_ts` delivered and every version
//! (id, ETag) delivered within `overlap` of it. Each poll re-reads from `max_ts -
//! overlap` and drops what it already delivered, so a write that becomes visible late
//! (up to `overlap` behind a later one) is still delivered, and nothing is delivered
//! twice. Like Cosmos DB's change feed, only the latest version of a document that
//! changed several times between polls is seen.

use std::collections::HashSet;

use serde::{Deserialize, Serialize};

/// Where a `_ts` poll stands.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PollCursor {
    /// Highest `_ts` delivered so far (`None` at the beginning).
    #[serde(rename = "t")]
    pub max_ts: Option<i64>,
    /// Versions delivered with `_ts >= max_ts - overlap`: (id, etag, ts).
    #[serde(rename = "s")]
    pub seen: Vec<(String, String, i64)>,
}

/// One document version as the poll query returned it.
#[derive(Debug, Clone, PartialEq)]
pub struct Candidate<T> {
    /// Document id.
    pub id: String,
    /// Its `_etag`.
    pub etag: String,
    /// Its `_ts`.
    pub ts: i64,
    /// The payload (the document).
    pub item: T,
}

const PREFIX: &str = "poll:";

impl PollCursor {
    /// Parses a store cursor; the empty cursor is the beginning.
    pub fn decode(cursor: &str) -> Result<Self, String> {
        if cursor.is_empty() {
            return Ok(Self::default());
        }
        let body = cursor.strip_prefix(PREFIX).ok_or_else(|| format!("not a cosmos poll cursor: {cursor:?}"))?;
        serde_json::from_str(body).map_err(|e| format!("corrupt cosmos poll cursor: {e}"))
    }

    /// The store cursor string.
    pub fn encode(&self) -> String {
        format!("{PREFIX}{}", serde_json::to_string(self).expect("a cursor always serializes"))
    }

    /// The lowest `_ts` the next query must read (`None`: everything).
    pub fn query_from(&self, overlap_secs: i64) -> Option<i64> {
        self.max_ts.map(|t| t.saturating_sub(overlap_secs))
    }

    /// How many rows the next query must fetch so that `limit` undelivered ones fit
    /// even if every already-delivered version comes first.
    pub fn fetch_size(&self, limit: usize) -> usize {
        limit.saturating_add(self.seen.len())
    }

    /// Picks up to `limit` undelivered versions from `rows` (query rows in any order),
    /// returns them in (`_ts`, id) order and advances the cursor past them.
    pub fn advance<T>(
        &self,
        mut rows: Vec<Candidate<T>>,
        limit: usize,
        overlap_secs: i64,
    ) -> (Vec<Candidate<T>>, PollCursor) {
        // A set, not a scan of `seen` per row: a busy container writes thousands of
        // versions within one overlap window, and every poll re-reads all of them.
        let delivered: HashSet<(&str, &str)> =
            self.seen.iter().map(|(id, etag, _)| (id.as_str(), etag.as_str())).collect();
        rows.retain(|r| !delivered.contains(&(r.id.as_str(), r.etag.as_str())));
        rows.sort_by(|a, b| (a.ts, &a.id).cmp(&(b.ts, &b.id)));
        rows.truncate(limit);
        let max_ts = rows.iter().map(|r| r.ts).max().into_iter().chain(self.max_ts).max();
        let mut seen = self.seen.clone();
        seen.extend(rows.iter().map(|r| (r.id.clone(), r.etag.clone(), r.ts)));
        if let Some(max) = max_ts {
            let horizon = max.saturating_sub(overlap_secs);
            seen.retain(|(_, _, ts)| *ts >= horizon);
        }
        (rows, PollCursor { max_ts, seen })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(id: &str, etag: &str, ts: i64) -> Candidate<()> {
        Candidate { id: id.into(), etag: etag.into(), ts, item: () }
    }

    fn ids<T>(rows: &[Candidate<T>]) -> Vec<&str> {
        rows.iter().map(|r| r.id.as_str()).collect()
    }

    #[test]
    fn a_later_write_in_the_same_second_with_a_smaller_id_is_not_skipped() {
        let start = PollCursor::default();
        let (first, cursor) = start.advance(vec![row("m", "e1", 100), row("z", "e2", 100)], 10, 2);
        assert_eq!(ids(&first), ["m", "z"]);
        // "a" lands in second 100 after the poll: (ts, id) would skip it, the seen set does not.
        let again = vec![row("m", "e1", 100), row("z", "e2", 100), row("a", "e3", 100)];
        let (second, cursor) = cursor.advance(again.clone(), 10, 2);
        assert_eq!(ids(&second), ["a"]);
        let (third, _) = cursor.advance(again, 10, 2);
        assert!(third.is_empty(), "nothing is delivered twice");
    }

    #[test]
    fn a_rewrite_is_delivered_again_and_old_entries_leave_the_cursor() {
        let (_, cursor) = PollCursor::default().advance(vec![row("a", "e1", 100)], 10, 2);
        let (rows, cursor) = cursor.advance(vec![row("a", "e2", 101)], 10, 2);
        assert_eq!(ids(&rows), ["a"]);
        let (_, cursor) = cursor.advance(vec![row("b", "e3", 105)], 10, 2);
        assert_eq!(cursor.max_ts, Some(105));
        assert_eq!(cursor.seen, [("b".to_owned(), "e3".to_owned(), 105)]);
        assert_eq!(cursor.query_from(2), Some(103));
    }

    #[test]
    fn limit_takes_the_oldest_and_the_rest_follow() {
        let rows = vec![row("c", "3", 102), row("a", "1", 101), row("b", "2", 101)];
        let (page, cursor) = PollCursor::default().advance(rows.clone(), 2, 2);
        assert_eq!(ids(&page), ["a", "b"]);
        assert!(cursor.fetch_size(2) >= 4);
        let (rest, _) = cursor.advance(rows, 2, 2);
        assert_eq!(ids(&rest), ["c"]);
    }

    #[test]
    fn cursor_round_trips_and_foreign_cursors_are_refused() {
        let (_, cursor) = PollCursor::default().advance(vec![row("a\"b", "e", 7)], 10, 2);
        assert_eq!(PollCursor::decode(&cursor.encode()).unwrap(), cursor);
        assert_eq!(PollCursor::decode("").unwrap(), PollCursor::default());
        assert!(PollCursor::decode("42").is_err());
        assert!(PollCursor::decode("poll:{").is_err());
    }
}
