//! The embedded default store: everything in process memory.
//!
//! It behaves like the production store where the lock protocol cares: a new ETag on
//! every write, 412 on a stale ETag, 409 on creating an existing id, and replicas that
//! lag the write region by a configured bound (bounded staleness), so stale reads can be
//! shown. It is only a store: faults come from `super::faults` and counts from
//! `super::counting` wrapped around it, as around any store.

use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use serde_json::Value;

use super::{
    Change, ChangeBatch, ChangeCursor, Committed, ETag, LocationStore, ReadFrom, ScanPage, StoreError, Unreadable,
    Versioned,
};
use crate::clock::{to_chrono, Clock};
use crate::document::{DocumentError, LocationDocument};

/// Settings of the in-memory store.
#[derive(Debug, Clone)]
pub struct MemoryStoreConfig {
    /// How far replicas trail the write region. Replica reads see the newest version
    /// committed at least this long ago: the worst case of a bounded-staleness store.
    pub replica_lag: Duration,
    /// How many changes the change stream retains; older ones are dropped, and a reader
    /// that fell further behind continues from the oldest retained change.
    pub change_log_capacity: usize,
}

impl Default for MemoryStoreConfig {
    fn default() -> Self {
        Self { replica_lag: Duration::ZERO, change_log_capacity: 100_000 }
    }
}

/// The in-memory [`LocationStore`].
#[derive(Debug)]
pub struct MemoryStore {
    clock: Arc<dyn Clock>,
    config: MemoryStoreConfig,
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    docs: BTreeMap<String, History>,
    /// The change stream: the committed versions themselves, shared with `docs`, and
    /// in their place those that cannot be read.
    log: VecDeque<(u64, Logged)>,
    next_seq: u64,
    next_etag: u64,
}

/// Versions of one document, oldest first: the newest is the write region's copy, and
/// older ones are kept only as long as a replica could still be serving them.
#[derive(Debug, Default)]
struct History {
    versions: VecDeque<StoredVersion>,
    /// Older versions were dropped, so the oldest kept one has been visible to replicas:
    /// a replica never "unsees" it, even if the clock steps back.
    pruned: bool,
}

/// One entry of the change stream.
type Logged = Result<Arc<Versioned>, Arc<Unreadable>>;

/// A committed version, kept decoded: decoding is deterministic, so the document (or
/// the reason it cannot be read) is worked out once at commit rather than on every read.
/// The version is shared with the change log rather than copied into it.
#[derive(Debug, Clone)]
struct StoredVersion {
    doc: Result<Arc<Versioned>, DocumentError>,
    etag: ETag,
    committed_at: DateTime<Utc>,
}

impl MemoryStore {
    /// An empty store reading time from `clock`.
    pub fn new(clock: Arc<dyn Clock>, config: MemoryStoreConfig) -> Self {
        Self { clock, config, state: Mutex::new(State::default()) }
    }

    /// Writes raw JSON as the newest version of a document, bypassing every check: for
    /// tests that need what this library would never write (another schema version, a
    /// forged partial cutover).
    pub fn put_raw(&self, id: &str, json: Value) -> ETag {
        let decoded = LocationDocument::from_json(json);
        let mut released = Vec::new();
        let mut state = self.lock_state();
        let now = self.clock.now();
        let etag = state.commit(id, decoded, now, self.config.change_log_capacity, &mut released);
        state.prune(id, self.replica_horizon(now), &mut released);
        etag
    }

    /// Forgets the document `id` entirely, as if it had never been written: for long
    /// replays that would otherwise keep every resource they ever migrated. Nothing
    /// appears on the change stream (it is no delete a reader must learn of) and the
    /// changes already logged stay. Returns whether there was a document.
    pub fn retire(&self, id: &str) -> bool {
        // Freed after the lock is released (the guard is a temporary of this statement).
        let retired = self.lock_state().docs.remove(id);
        retired.is_some()
    }

    /// Changes written to the change stream so far (dropped ones included).
    pub fn changes_logged(&self) -> u64 {
        self.lock_state().next_seq
    }

    /// How many documents the store holds.
    pub fn len(&self) -> usize {
        self.lock_state().docs.len()
    }

    /// Whether the store holds no document.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The store's state. Every critical section leaves it consistent (a version is
    /// pushed whole or not at all), so a panic elsewhere while it was held is no reason
    /// to stop serving: the guard is recovered rather than the poison propagated.
    fn lock_state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn replica_horizon(&self, now: DateTime<Utc>) -> DateTime<Utc> {
        // Saturating: a lag beyond chrono's range means replicas never catch up.
        now.checked_sub_signed(to_chrono(self.config.replica_lag)).unwrap_or(DateTime::<Utc>::MIN_UTC)
    }
}

impl State {
    /// Commits `decoded` (a document, or why its JSON is not one) as the newest version
    /// of `id`. Callers decode before taking the state's lock, and free what it drops
    /// from the change log (`released`) after releasing it: the lock is held for the
    /// bookkeeping only.
    fn commit(
        &mut self,
        id: &str,
        decoded: Result<LocationDocument, DocumentError>,
        now: DateTime<Utc>,
        log_capacity: usize,
        released: &mut Vec<Arc<Versioned>>,
    ) -> ETag {
        self.next_etag += 1;
        let etag = ETag(format!("\"m{:012x}\"", self.next_etag));
        let decoded = decoded.map(|doc| Arc::new(Versioned { doc, etag: etag.clone(), committed_at: now }));
        let logged = match &decoded {
            Ok(version) => Ok(version.clone()),
            Err(reason) => Err(Arc::new(Unreadable { id: id.to_owned(), committed_at: now, reason: reason.clone() })),
        };
        self.next_seq += 1;
        self.log.push_back((self.next_seq, logged));
        while self.log.len() > log_capacity {
            released.extend(self.log.pop_front().and_then(|(_, logged)| logged.ok()));
        }
        // The id is copied only for a new document: most commits replace one.
        let history = match self.docs.get_mut(id) {
            Some(history) => history,
            None => self.docs.entry(id.to_owned()).or_default(),
        };
        history.versions.push_back(StoredVersion { doc: decoded, etag: etag.clone(), committed_at: now });
        etag
    }

    /// Forgets versions no replica can serve any more (older than the newest version
    /// committed before the replica horizon), handing them to `released` to be freed
    /// once the lock is released.
    fn prune(&mut self, id: &str, horizon: DateTime<Utc>, released: &mut Vec<Arc<Versioned>>) {
        if let Some(history) = self.docs.get_mut(id) {
            while history.versions.len() > 1 && history.versions[1].committed_at <= horizon {
                released.extend(history.versions.pop_front().and_then(|v| v.doc.ok()));
                history.pruned = true;
            }
        }
    }

    fn newest(&self, id: &str) -> Option<&StoredVersion> {
        self.docs.get(id).and_then(|h| h.versions.back())
    }
}

/// The version, shared: callers copy it out once the state's lock is released.
fn shared(v: &StoredVersion) -> Result<Arc<Versioned>, StoreError> {
    v.doc.clone().map_err(StoreError::from)
}

#[async_trait]
impl LocationStore for MemoryStore {
    async fn read(&self, id: &str, from: ReadFrom) -> Result<Versioned, StoreError> {
        // Copied out of the lock: the change stream's reader is not held up meanwhile.
        self.read_shared(id, from).await.map(Arc::unwrap_or_clone)
    }

    async fn read_shared(&self, id: &str, from: ReadFrom) -> Result<Arc<Versioned>, StoreError> {
        let now = self.clock.now();
        let mut released = Vec::new();
        let mut state = self.lock_state();
        match from {
            ReadFrom::WriteRegion => shared(state.newest(id).ok_or(StoreError::NotFound)?),
            ReadFrom::Replica => {
                let horizon = self.replica_horizon(now);
                state.prune(id, horizon, &mut released);
                let history = state.docs.get(id).ok_or(StoreError::NotFound)?;
                let visible = history.versions.iter().rev().find(|v| v.committed_at <= horizon);
                let visible = visible.or_else(|| history.versions.front().filter(|_| history.pruned));
                shared(visible.ok_or(StoreError::NotFound)?)
            }
        }
    }

    async fn create(&self, doc: &LocationDocument) -> Result<Committed, StoreError> {
        // Kept as written: a document this library made reads back from its JSON as
        // itself, so the round trip through JSON (the replay's largest cost) adds nothing.
        let decoded = Ok(doc.clone());
        // Declared before the guard, so freed after the lock is released.
        let mut released = Vec::new();
        let mut state = self.lock_state();
        // Read under the lock: the commit time is when the write commits, never when it
        // began waiting to (see `a_commit_is_stamped_when_it_commits`).
        let now = self.clock.now();
        if state.docs.contains_key(&doc.id) {
            return Err(StoreError::Conflict);
        }
        let etag = state.commit(&doc.id, decoded, now, self.config.change_log_capacity, &mut released);
        Ok(Committed { etag, committed_at: now })
    }

    async fn replace(&self, doc: &LocationDocument, if_match: &ETag) -> Result<Committed, StoreError> {
        let decoded = Ok(doc.clone());
        let mut released = Vec::new();
        let mut state = self.lock_state();
        // Under the lock, as in `create`.
        let now = self.clock.now();
        let current = state.newest(&doc.id).ok_or(StoreError::NotFound)?;
        if &current.etag != if_match {
            return Err(StoreError::PreconditionFailed);
        }
        let etag = state.commit(&doc.id, decoded, now, self.config.change_log_capacity, &mut released);
        state.prune(&doc.id, self.replica_horizon(now), &mut released);
        Ok(Committed { etag, committed_at: now })
    }

    async fn read_changes(&self, cursor: &ChangeCursor, limit: usize) -> Result<ChangeBatch, StoreError> {
        let after: u64 = if cursor.0.is_empty() {
            0
        } else {
            cursor
                .0
                .parse()
                .map_err(|_| StoreError::Unavailable(format!("not a memory-store cursor: {:?}", cursor.0)))?
        };
        let page: Vec<(u64, Logged)> = {
            let state = self.lock_state();
            // Sequence numbers in the log are consecutive, so the first change after the
            // cursor is found by arithmetic, not by walking the whole retained log.
            let oldest = state.log.front().map_or(0, |(seq, _)| *seq);
            let skip = usize::try_from((after + 1).saturating_sub(oldest)).unwrap_or(usize::MAX);
            state.log.range(skip.min(state.log.len())..).take(limit).cloned().collect()
        };
        let last = page.last().map(|(s, _)| *s);
        let mut batch = ChangeBatch { next: ChangeCursor(last.unwrap_or(after).to_string()), ..ChangeBatch::default() };
        for (_, logged) in page {
            match logged {
                Ok(doc) => batch.changes.push(Change { doc }),
                Err(unreadable) => batch.unreadable.push(Arc::unwrap_or_clone(unreadable)),
            }
        }
        Ok(batch)
    }

    async fn scan(&self, after: Option<&str>, limit: usize) -> Result<ScanPage, StoreError> {
        let state = self.lock_state();
        let range = match after {
            Some(a) => state.docs.range::<str, _>((std::ops::Bound::Excluded(a), std::ops::Bound::Unbounded)),
            None => state.docs.range::<str, _>(..),
        };
        let mut page = ScanPage::default();
        for (id, newest) in range.filter_map(|(id, h)| h.versions.back().map(|v| (id, v))).take(limit) {
            match &newest.doc {
                Ok(version) => page.documents.push(Versioned::clone(version)),
                Err(reason) => page.unreadable.push(Unreadable {
                    id: id.clone(),
                    committed_at: newest.committed_at,
                    reason: reason.clone(),
                }),
            }
        }
        Ok(page)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::ManualClock;

    fn store(lag: Duration) -> (Arc<ManualClock>, MemoryStore) {
        let clock = Arc::new(ManualClock::at_epoch());
        let store = MemoryStore::new(clock.clone(), MemoryStoreConfig { replica_lag: lag, change_log_capacity: 4 });
        (clock, store)
    }

    /// A clock that holds up the caller of its next reading until told to go on: a
    /// writer stalled right after it read the time.
    #[derive(Debug)]
    struct StallingClock {
        inner: ManualClock,
        stall_next: std::sync::atomic::AtomicBool,
        stalled: std::sync::mpsc::SyncSender<()>,
        go_on: std::sync::Mutex<std::sync::mpsc::Receiver<()>>,
    }

    impl Clock for StallingClock {
        fn now(&self) -> DateTime<Utc> {
            let now = self.inner.now();
            if self.stall_next.swap(false, std::sync::atomic::Ordering::SeqCst) {
                let _ = self.stalled.send(());
                let _ = self.go_on.lock().unwrap().recv();
            }
            now
        }
    }

    /// The commit time is what a lease-bound write is judged by (`lifecycle::settle`): a
    /// renewal stamped before it waited for the store, and committed after the lease
    /// lapsed, would count as landing in time, contradicting readers that saw the lapse.
    /// So a writer that stalls while another commits must still be stamped after it:
    /// the change stream's commit times never go backwards.
    #[test]
    fn a_commit_is_stamped_when_it_commits() {
        let (stalled_tx, stalled_rx) = std::sync::mpsc::sync_channel(1);
        let (go_tx, go_rx) = std::sync::mpsc::channel();
        let clock = Arc::new(StallingClock {
            inner: ManualClock::at_epoch(),
            stall_next: Default::default(),
            stalled: stalled_tx,
            go_on: std::sync::Mutex::new(go_rx),
        });
        let store = Arc::new(MemoryStore::new(clock.clone(), MemoryStoreConfig::default()));
        let a = LocationDocument::new("a", "westeurope");
        let first = futures::executor::block_on(store.create(&a)).unwrap();
        clock.stall_next.store(true, std::sync::atomic::Ordering::SeqCst);
        let stalled = std::thread::spawn({
            let store = store.clone();
            move || futures::executor::block_on(store.replace(&a, &first.etag)).unwrap()
        });
        stalled_rx.recv().unwrap();
        // While the first writer is held up, time passes and another writer comes.
        clock.inner.advance(Duration::from_secs(1));
        let other = std::thread::spawn({
            let store = store.clone();
            move || futures::executor::block_on(store.create(&LocationDocument::new("b", "westeurope"))).unwrap()
        });
        std::thread::sleep(Duration::from_millis(100));
        go_tx.send(()).unwrap();
        stalled.join().unwrap();
        other.join().unwrap();
        let log = futures::executor::block_on(store.read_changes(&ChangeCursor::default(), 10)).unwrap();
        let times: Vec<DateTime<Utc>> = log.changes.iter().map(|c| c.doc.committed_at).collect();
        assert_eq!(times.len(), 3);
        assert!(times.windows(2).all(|w| w[0] <= w[1]), "commit times out of commit order: {times:?}");
    }

    #[tokio::test]
    async fn replicas_lag_by_the_configured_bound() {
        let (clock, store) = store(Duration::from_secs(5));
        let doc = LocationDocument::new("r1", "westeurope");
        let first = store.create(&doc).await.unwrap();
        assert_eq!(first.committed_at, clock.now(), "the memory store commits at once, on its clock");
        assert_eq!(store.read("r1", ReadFrom::Replica).await, Err(StoreError::NotFound));
        clock.advance(Duration::from_secs(5));
        assert_eq!(store.read("r1", ReadFrom::Replica).await.unwrap().etag, first.etag);

        let mut moved = doc.clone();
        moved.primary.location = "northeurope".into();
        let second = store.replace(&moved, &first.etag).await.unwrap().etag;
        assert_eq!(store.read("r1", ReadFrom::WriteRegion).await.unwrap().etag, second);
        assert_eq!(store.read("r1", ReadFrom::Replica).await.unwrap().doc.primary.location, "westeurope");
        clock.advance(Duration::from_secs(5));
        assert_eq!(store.read("r1", ReadFrom::Replica).await.unwrap().etag, second);
    }

    #[tokio::test]
    async fn change_log_keeps_only_its_capacity() {
        let (_clock, store) = store(Duration::ZERO);
        for i in 0..6 {
            store.create(&LocationDocument::new(format!("r{i}"), "x")).await.unwrap();
        }
        let batch = store.read_changes(&ChangeCursor::beginning(), 100).await.unwrap();
        let ids: Vec<_> = batch.changes.iter().map(|c| c.doc.doc.id.as_str()).collect();
        assert_eq!(ids, ["r2", "r3", "r4", "r5"]);
        let rest = store.read_changes(&batch.next, 100).await.unwrap();
        assert!(rest.changes.is_empty());
        assert_eq!(rest.next, batch.next);
    }

    #[tokio::test]
    async fn pages_continue_from_the_cursor_and_a_reader_left_behind_resumes_at_the_oldest() {
        let (_clock, store) = store(Duration::ZERO);
        let ids = |b: &ChangeBatch| b.changes.iter().map(|c| c.doc.doc.id.clone()).collect::<Vec<_>>();
        for i in 0..3 {
            store.create(&LocationDocument::new(format!("r{i}"), "x")).await.unwrap();
        }
        let first = store.read_changes(&ChangeCursor::beginning(), 2).await.unwrap();
        assert_eq!(ids(&first), ["r0", "r1"]);
        let second = store.read_changes(&first.next, 2).await.unwrap();
        assert_eq!(ids(&second), ["r2"]);
        // Four more writes push r0..r2 out of a log of four: the reader at r0 resumes
        // at the oldest change still held.
        for i in 3..7 {
            store.create(&LocationDocument::new(format!("r{i}"), "x")).await.unwrap();
        }
        let behind = store.read_changes(&first.next, 10).await.unwrap();
        assert_eq!(ids(&behind), ["r3", "r4", "r5", "r6"]);
        let ahead = ChangeCursor("99".into());
        let none = store.read_changes(&ahead, 10).await.unwrap();
        assert!(none.changes.is_empty());
        assert_eq!(none.next, ahead);
    }

    #[tokio::test]
    async fn shared_reads_and_the_change_stream_lend_the_stored_version_itself() {
        let (_clock, store) = store(Duration::ZERO);
        store.create(&LocationDocument::new("r1", "x")).await.unwrap();
        let first = store.read_shared("r1", ReadFrom::WriteRegion).await.unwrap();
        let again = store.read_shared("r1", ReadFrom::Replica).await.unwrap();
        assert!(Arc::ptr_eq(&first, &again), "one stored version, not a copy per read");
        let logged = store.read_changes(&ChangeCursor::beginning(), 10).await.unwrap();
        assert!(Arc::ptr_eq(&logged.changes[0].doc, &first));
        assert_eq!(store.read("r1", ReadFrom::WriteRegion).await.unwrap(), *first);
    }

    /// How many versions of `id` the store keeps.
    fn versions_kept(store: &MemoryStore, id: &str) -> usize {
        store.lock_state().docs.get(id).map_or(0, |h| h.versions.len())
    }

    #[tokio::test]
    async fn versions_no_replica_can_serve_are_forgotten() {
        // Replicas lag 1 s: a version stays while some replica may still serve it, and
        // goes once a newer one was committed before the replicas' horizon.
        let (clock, store) = store(Duration::from_secs(1));
        let v1 = store.create(&LocationDocument::new("r", "a")).await.unwrap();
        let v2 = store.replace(&LocationDocument::new("r", "b"), &v1.etag).await.unwrap();
        assert_eq!(versions_kept(&store, "r"), 2, "both within the lag");
        clock.advance(Duration::from_secs(2));
        store.replace(&LocationDocument::new("r", "c"), &v2.etag).await.unwrap();
        // "a" was replaced before the horizon by "b", which a replica serves now.
        assert_eq!(versions_kept(&store, "r"), 2, "\"b\" (what replicas serve) and \"c\" (not replicated yet)");
        let replica = store.read("r", ReadFrom::Replica).await.unwrap();
        assert_eq!(replica.doc.primary.location, "b");
        clock.advance(Duration::from_secs(2));
        assert_eq!(store.read("r", ReadFrom::Replica).await.unwrap().doc.primary.location, "c");
        assert_eq!(versions_kept(&store, "r"), 1, "a replica read prunes too");
    }

    #[tokio::test]
    async fn a_retired_document_is_gone_without_a_change() {
        let (_clock, store) = store(Duration::ZERO);
        assert!(store.is_empty());
        assert_eq!(store.changes_logged(), 0);
        store.create(&LocationDocument::new("r1", "x")).await.unwrap();
        store.create(&LocationDocument::new("r2", "x")).await.unwrap();
        assert_eq!(store.len(), 2);
        assert!(!store.is_empty());
        assert_eq!(store.changes_logged(), 2, "one change per write");
        assert!(store.retire("r2"));
        assert!(store.retire("r1"));
        assert!(!store.retire("r1"));
        assert!(store.is_empty());
        assert_eq!(store.changes_logged(), 2, "a retirement logs nothing");
        assert_eq!(store.read("r1", ReadFrom::WriteRegion).await, Err(StoreError::NotFound));
        let log = store.read_changes(&ChangeCursor::beginning(), 10).await.unwrap();
        assert_eq!(log.changes.len(), 2, "only the creates are on the stream");
    }
}
