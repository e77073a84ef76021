//! A wrapper that gives any [`LocationStore`] (in practice the memory store) the latency
//! of a real one, for load measurements: each point call waits a time drawn uniformly
//! from its kind's range before it is served.
//!
//! The defaults ([`LatencyModel::cosmos_in_region`]) follow Azure Cosmos DB's published
//! figures for point operations in the client's own region: "SLA of less than 10 ms for
//! point read/write operations with direct connectivity"
//! (<https://learn.microsoft.com/azure/cosmos-db/monitor-server-side-latency>), so
//! reads 3-8 ms and writes 5-10 ms. A service outside the write region pays the round
//! trip to it on every write-region read and write
//! ([`LatencyModel::write_region_round_trip`]: tens of milliseconds between continents,
//! about 80 ms West Europe to East US in
//! <https://learn.microsoft.com/azure/networking/azure-network-latency>); the default is
//! 0, a service beside its write region, which
//! is the kindest case for a design that reads the write region on every operation.

use std::ops::RangeInclusive;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use rand::Rng;

use super::{ChangeBatch, ChangeCursor, Committed, ETag, LocationStore, ReadFrom, ScanPage, StoreError, Versioned};
use crate::document::LocationDocument;

/// How long each kind of call takes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LatencyModel {
    /// A point read from the nearest replica.
    pub replica_read: RangeInclusive<Duration>,
    /// A point read from the write region (before the round trip).
    pub write_region_read: RangeInclusive<Duration>,
    /// A create or replace (before the round trip).
    pub write: RangeInclusive<Duration>,
    /// Added to every call that must reach the write region.
    pub write_region_round_trip: Duration,
}

impl LatencyModel {
    /// Cosmos DB, in region (see the module documentation).
    pub fn cosmos_in_region() -> Self {
        let ms = Duration::from_millis;
        Self {
            replica_read: ms(3)..=ms(8),
            write_region_read: ms(3)..=ms(8),
            write: ms(5)..=ms(10),
            write_region_round_trip: Duration::ZERO,
        }
    }

    /// No latency at all (for tests that count calls).
    pub fn none() -> Self {
        Self {
            replica_read: Duration::ZERO..=Duration::ZERO,
            write_region_read: Duration::ZERO..=Duration::ZERO,
            write: Duration::ZERO..=Duration::ZERO,
            write_region_round_trip: Duration::ZERO,
        }
    }
}

fn draw(range: &RangeInclusive<Duration>) -> Duration {
    let (low, high) = (range.start().as_nanos() as u64, range.end().as_nanos() as u64);
    if high <= low {
        return *range.start();
    }
    Duration::from_nanos(rand::rng().random_range(low..=high))
}

/// The wrapped store, slowed down by a [`LatencyModel`].
#[derive(Debug, Clone)]
pub struct LatencyStore {
    inner: Arc<dyn LocationStore>,
    model: LatencyModel,
}

impl LatencyStore {
    /// `inner` with the latency of `model`.
    pub fn new(inner: Arc<dyn LocationStore>, model: LatencyModel) -> Self {
        Self { inner, model }
    }

    async fn wait(&self, range: &RangeInclusive<Duration>, write_region: bool) {
        let extra = if write_region { self.model.write_region_round_trip } else { Duration::ZERO };
        let wait = draw(range) + extra;
        if !wait.is_zero() {
            tokio::time::sleep(wait).await;
        }
    }

    async fn wait_for_read(&self, from: ReadFrom) {
        match from {
            ReadFrom::WriteRegion => self.wait(&self.model.write_region_read, true).await,
            ReadFrom::Replica => self.wait(&self.model.replica_read, false).await,
        }
    }
}

#[async_trait]
impl LocationStore for LatencyStore {
    async fn read(&self, id: &str, from: ReadFrom) -> Result<Versioned, StoreError> {
        self.wait_for_read(from).await;
        self.inner.read(id, from).await
    }

    async fn read_shared(&self, id: &str, from: ReadFrom) -> Result<Arc<Versioned>, StoreError> {
        self.wait_for_read(from).await;
        self.inner.read_shared(id, from).await
    }

    async fn create(&self, doc: &LocationDocument) -> Result<Committed, StoreError> {
        self.wait(&self.model.write, true).await;
        self.inner.create(doc).await
    }

    async fn replace(&self, doc: &LocationDocument, if_match: &ETag) -> Result<Committed, StoreError> {
        self.wait(&self.model.write, true).await;
        self.inner.replace(doc, if_match).await
    }

    async fn read_changes(&self, cursor: &ChangeCursor, limit: usize) -> Result<ChangeBatch, StoreError> {
        self.inner.read_changes(cursor, limit).await
    }

    async fn scan(&self, after: Option<&str>, limit: usize) -> Result<ScanPage, StoreError> {
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
    use crate::store::memory::{MemoryStore, MemoryStoreConfig};

    #[tokio::test(start_paused = true)]
    async fn each_call_waits_within_its_range_plus_the_round_trip() {
        let memory = Arc::new(MemoryStore::new(Arc::new(ManualClock::at_epoch()), MemoryStoreConfig::default()));
        let ms = Duration::from_millis;
        let model = LatencyModel {
            replica_read: ms(3)..=ms(3),
            write_region_read: ms(5)..=ms(6),
            write: ms(10)..=ms(10),
            write_region_round_trip: ms(80),
        };
        let store = LatencyStore::new(memory, model);
        let timed = |started: tokio::time::Instant| started.elapsed();
        let t = tokio::time::Instant::now();
        store.create(&LocationDocument::new("r", "a")).await.unwrap();
        assert_eq!(timed(t), ms(90));
        let t = tokio::time::Instant::now();
        store.read("r", ReadFrom::Replica).await.unwrap();
        assert_eq!(timed(t), ms(3));
        let t = tokio::time::Instant::now();
        store.read("r", ReadFrom::WriteRegion).await.unwrap();
        assert!((ms(85)..=ms(86)).contains(&timed(t)), "{:?}", timed(t));
        let t = tokio::time::Instant::now();
        store.read_shared("r", ReadFrom::Replica).await.unwrap();
        assert_eq!(timed(t), ms(3), "a shared read waits like a copying one");
    }
}
