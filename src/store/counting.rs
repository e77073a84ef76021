//! The one counting wrapper, around any [`LocationStore`]: its point calls by document
//! kind (routing document or lock record, [`DocKind::of`] the id) and call kind, for the
//! head-to-head measurement of the two lock designs and the service's `/metrics`, and
//! every call by kind ([`CountingStore::calls`]) for the tests and the replay.
//!
//! The counts are the store's own: every call that reaches the store is counted, once,
//! whatever the caller does with the answer (a failed call included), so a design
//! cannot look cheaper by how it reports itself.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use async_trait::async_trait;
use prometheus::{IntCounter, IntCounterVec, Opts, Registry};

use super::{
    ChangeBatch, ChangeCursor, Committed, ETag, LocationStore, OpKind, ReadFrom, ScanPage, StoreError, Versioned,
};
use crate::document::{DocKind, LocationDocument};

/// Calls of every kind, whatever the document: the point calls, the change-stream reads
/// and the scans.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct OpCounts {
    /// Point reads from the write region.
    pub read_write_region: u64,
    /// Point reads from a replica.
    pub read_replica: u64,
    /// Creates.
    pub create: u64,
    /// Replaces.
    pub replace: u64,
    /// Change-stream reads.
    pub read_changes: u64,
    /// Scans.
    pub scan: u64,
}

impl OpCounts {
    /// Point reads of either kind.
    pub fn reads(&self) -> u64 {
        self.read_write_region + self.read_replica
    }

    /// Writes of either kind.
    pub fn writes(&self) -> u64 {
        self.create + self.replace
    }

    /// Calls since `earlier`, kind by kind.
    pub fn since(&self, earlier: &OpCounts) -> OpCounts {
        OpCounts {
            read_write_region: self.read_write_region - earlier.read_write_region,
            read_replica: self.read_replica - earlier.read_replica,
            create: self.create - earlier.create,
            replace: self.replace - earlier.replace,
            read_changes: self.read_changes - earlier.read_changes,
            scan: self.scan - earlier.scan,
        }
    }
}

/// The point calls counted per document kind.
const POINT_CALLS: [OpKind; 4] = [OpKind::ReadWriteRegion, OpKind::ReadReplica, OpKind::Create, OpKind::Replace];

/// Calls of one document kind.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct KindCounts {
    /// Point reads from the write region.
    pub read_write_region: u64,
    /// Point reads from a replica.
    pub read_replica: u64,
    /// Creates.
    pub create: u64,
    /// Replaces.
    pub replace: u64,
}

impl KindCounts {
    /// Point reads of either kind.
    pub fn reads(&self) -> u64 {
        self.read_write_region + self.read_replica
    }

    /// Writes of either kind.
    pub fn writes(&self) -> u64 {
        self.create + self.replace
    }

    fn since(&self, earlier: &KindCounts) -> KindCounts {
        KindCounts {
            read_write_region: self.read_write_region - earlier.read_write_region,
            read_replica: self.read_replica - earlier.read_replica,
            create: self.create - earlier.create,
            replace: self.replace - earlier.replace,
        }
    }
}

/// A snapshot of the counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct StoreCounts {
    /// Calls on routing documents.
    pub routing: KindCounts,
    /// Calls on lock records.
    pub lock: KindCounts,
}

impl StoreCounts {
    /// Calls since `earlier`.
    pub fn since(&self, earlier: &StoreCounts) -> StoreCounts {
        StoreCounts { routing: self.routing.since(&earlier.routing), lock: self.lock.since(&earlier.lock) }
    }

    /// The counts of one kind.
    pub fn of(&self, kind: DocKind) -> &KindCounts {
        match kind {
            DocKind::Routing => &self.routing,
            DocKind::Lock => &self.lock,
        }
    }
}

/// Counts every call of the wrapped store: point calls by document and call kind (also
/// exported), the change stream's reads and the scans.
#[derive(Debug, Clone)]
pub struct CountingStore {
    inner: Arc<dyn LocationStore>,
    calls: IntCounterVec,
    /// `counters[doc][call]`, resolved once so counting is one atomic add.
    counters: Arc<[[IntCounter; 4]; 2]>,
    /// Change-stream reads and scans (no document to count them by).
    read_changes: Arc<AtomicU64>,
    scans: Arc<AtomicU64>,
}

impl CountingStore {
    /// Counts the calls made to `inner`.
    pub fn new(inner: Arc<dyn LocationStore>) -> Self {
        let calls = IntCounterVec::new(
            Opts::new(
                "lockprobe_store_document_calls_total",
                "Point calls the routing store served, by document kind (routing document or lock record) and call.",
            ),
            &["doc", "op"],
        )
        .expect("a valid metric definition");
        let row = |doc: DocKind| POINT_CALLS.map(|op| calls.with_label_values(&[doc.as_str(), op.as_str()]));
        let counters = Arc::new([row(DocKind::Routing), row(DocKind::Lock)]);
        Self { inner, calls, counters, read_changes: Arc::default(), scans: Arc::default() }
    }

    /// Exports the counters on `registry` (the service's `/metrics`).
    pub fn register(&self, registry: &Registry) -> Result<(), prometheus::Error> {
        registry.register(Box::new(self.calls.clone()))
    }

    /// The counts so far.
    pub fn counts(&self) -> StoreCounts {
        let kind = |doc: DocKind| {
            let c = &self.counters[doc_index(doc)];
            KindCounts {
                read_write_region: c[0].get(),
                read_replica: c[1].get(),
                create: c[2].get(),
                replace: c[3].get(),
            }
        };
        StoreCounts { routing: kind(DocKind::Routing), lock: kind(DocKind::Lock) }
    }

    /// Every call so far, by kind, whatever the document.
    pub fn calls(&self) -> OpCounts {
        let StoreCounts { routing: r, lock: l } = self.counts();
        OpCounts {
            read_write_region: r.read_write_region + l.read_write_region,
            read_replica: r.read_replica + l.read_replica,
            create: r.create + l.create,
            replace: r.replace + l.replace,
            read_changes: self.read_changes.load(Ordering::Relaxed),
            scan: self.scans.load(Ordering::Relaxed),
        }
    }

    fn count(&self, id: &str, op: OpKind) {
        let call = POINT_CALLS.iter().position(|k| *k == op).expect("a point call");
        self.counters[doc_index(DocKind::of(id))][call].inc();
    }
}

fn doc_index(doc: DocKind) -> usize {
    match doc {
        DocKind::Routing => 0,
        DocKind::Lock => 1,
    }
}

#[async_trait]
impl LocationStore for CountingStore {
    async fn read(&self, id: &str, from: ReadFrom) -> Result<Versioned, StoreError> {
        self.count(id, OpKind::read_from(from));
        self.inner.read(id, from).await
    }

    async fn read_shared(&self, id: &str, from: ReadFrom) -> Result<Arc<Versioned>, StoreError> {
        self.count(id, OpKind::read_from(from));
        self.inner.read_shared(id, from).await
    }

    async fn create(&self, doc: &LocationDocument) -> Result<Committed, StoreError> {
        self.count(&doc.id, OpKind::Create);
        self.inner.create(doc).await
    }

    async fn replace(&self, doc: &LocationDocument, if_match: &ETag) -> Result<Committed, StoreError> {
        self.count(&doc.id, OpKind::Replace);
        self.inner.replace(doc, if_match).await
    }

    async fn read_changes(&self, cursor: &ChangeCursor, limit: usize) -> Result<ChangeBatch, StoreError> {
        self.read_changes.fetch_add(1, Ordering::Relaxed);
        self.inner.read_changes(cursor, limit).await
    }

    async fn scan(&self, after: Option<&str>, limit: usize) -> Result<ScanPage, StoreError> {
        self.scans.fetch_add(1, Ordering::Relaxed);
        self.inner.scan(after, limit).await
    }

    fn region(&self) -> Option<String> {
        self.inner.region()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::ManualClock;
    use crate::document::lock_record_id;
    use crate::store::memory::{MemoryStore, MemoryStoreConfig};

    #[tokio::test]
    async fn calls_are_counted_by_document_kind_and_exported() {
        let memory = Arc::new(MemoryStore::new(Arc::new(ManualClock::at_epoch()), MemoryStoreConfig::default()));
        // What reaches the store, counted again right in front of it.
        let reached = Arc::new(CountingStore::new(memory));
        let store = CountingStore::new(reached.clone());
        let registry = Registry::new();
        store.register(&registry).unwrap();
        let routing = store.create(&LocationDocument::new("r1", "a")).await.unwrap();
        store.create(&LocationDocument::new(lock_record_id("r1"), "a")).await.unwrap();
        store.read("r1", ReadFrom::Replica).await.unwrap();
        store.read(&lock_record_id("r1"), ReadFrom::WriteRegion).await.unwrap();
        // A shared read is counted like a copying one, and reaches the store.
        store.read_shared(&lock_record_id("r1"), ReadFrom::WriteRegion).await.unwrap();
        store.replace(&LocationDocument::new("r1", "b"), &routing.etag).await.unwrap();
        let counts = store.counts();
        assert_eq!(counts.routing, KindCounts { read_write_region: 0, read_replica: 1, create: 1, replace: 1 });
        assert_eq!(counts.lock, KindCounts { read_write_region: 2, read_replica: 0, create: 1, replace: 0 });
        assert_eq!(reached.calls().reads(), 3, "every counted call reached the store");
        store.read_changes(&ChangeCursor::beginning(), 10).await.unwrap();
        store.scan(None, 10).await.unwrap();
        let calls = store.calls();
        assert_eq!(
            calls,
            OpCounts { read_write_region: 2, read_replica: 1, create: 2, replace: 1, read_changes: 1, scan: 1 },
            "every call by kind, both document kinds together"
        );
        assert_eq!((calls.reads(), calls.writes()), (3, 3));
        assert_eq!(calls.since(&OpCounts { create: 2, ..OpCounts::default() }).writes(), 1);
        let text = crate::exposition::render(&registry);
        assert!(
            text.contains(r#"lockprobe_store_document_calls_total{doc="lock",op="read_write_region"} 2"#),
            "{text}"
        );
    }
}
