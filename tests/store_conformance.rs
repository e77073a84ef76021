//! The one store conformance suite: every `LocationStore` backend runs the same
//! checks, through `Arc<dyn LocationStore>` only.
//!
//! Backends: the in-memory store, and the Cosmos DB store against the local
//! Cosmos-compatible test server (started here; `scripts/setup-cosmos.sh` installs it),
//! once with the `_ts` poll and once reading the change feed; and against the
//! two-region test account (docs/cosmos-regions.md): replica reads 1 s behind, and an
//! account that failed over after the store connected (the store must follow it).
//! Each Cosmos test gets its own database, so tests do not see each other's documents.

#[path = "support/cosmos_server.rs"]
mod cosmos_server;

use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use lockprobe::clock::{Clock, SystemClock};
use lockprobe::routing::cache::TieredCache;
use lockprobe::routing::{
    ClientOptions, LocationDocument, LockError, LockPolicy, PreLockRequest, RoutingClient, RoutingError,
};
use lockprobe::store::{ChangeCursor, ETag, LocationStore, ReadFrom, StoreError};
use serde_json::json;

mod suite {
    use super::*;

    fn moved(doc: &LocationDocument, location: &str) -> LocationDocument {
        let mut next = doc.clone();
        next.primary.location = location.to_owned();
        next
    }

    pub async fn etag_changes_on_every_write(store: Arc<dyn LocationStore>) {
        let doc = LocationDocument::new("etag-1", "westeurope");
        let e1 = store.create(&doc).await.unwrap().etag;
        let read = store.read("etag-1", ReadFrom::WriteRegion).await.unwrap();
        assert_eq!((&read.doc, &read.etag), (&doc, &e1));

        let v2 = moved(&doc, "northeurope");
        let e2 = store.replace(&v2, &e1).await.unwrap().etag;
        // Rewriting identical content is still a write and still gets a new ETag.
        let e3 = store.replace(&v2, &e2).await.unwrap().etag;
        let etags: HashSet<&ETag> = [&e1, &e2, &e3].into_iter().collect();
        assert_eq!(etags.len(), 3, "every write gets a new etag: {e1:?} {e2:?} {e3:?}");
        let read = store.read("etag-1", ReadFrom::WriteRegion).await.unwrap();
        assert_eq!((&read.doc, &read.etag), (&v2, &e3));
    }

    pub async fn stale_etag_is_refused_and_changes_nothing(store: Arc<dyn LocationStore>) {
        let doc = LocationDocument::new("stale-1", "westeurope");
        let e1 = store.create(&doc).await.unwrap().etag;
        let v2 = moved(&doc, "northeurope");
        let e2 = store.replace(&v2, &e1).await.unwrap().etag;

        let v3 = moved(&doc, "eastus");
        assert_eq!(store.replace(&v3, &e1).await, Err(StoreError::PreconditionFailed));
        assert_eq!(store.replace(&v3, &ETag("\"never-issued\"".into())).await, Err(StoreError::PreconditionFailed));
        let read = store.read("stale-1", ReadFrom::WriteRegion).await.unwrap();
        assert_eq!((&read.doc, &read.etag), (&v2, &e2), "a refused replace must not change the document");
    }

    pub async fn create_of_an_existing_id_conflicts(store: Arc<dyn LocationStore>) {
        let doc = LocationDocument::new("dup-1", "westeurope");
        let e1 = store.create(&doc).await.unwrap().etag;
        assert_eq!(store.create(&moved(&doc, "eastus")).await, Err(StoreError::Conflict));
        let read = store.read("dup-1", ReadFrom::WriteRegion).await.unwrap();
        assert_eq!((&read.doc, &read.etag), (&doc, &e1));
    }

    pub async fn a_missing_id_is_not_found(store: Arc<dyn LocationStore>) {
        assert_eq!(store.read("nobody", ReadFrom::WriteRegion).await, Err(StoreError::NotFound));
        assert_eq!(store.read("nobody", ReadFrom::Replica).await, Err(StoreError::NotFound));
        let ghost = LocationDocument::new("nobody", "westeurope");
        assert_eq!(store.replace(&ghost, &ETag("\"any\"".into())).await, Err(StoreError::NotFound));
        assert_eq!(
            store.read("nobody", ReadFrom::WriteRegion).await,
            Err(StoreError::NotFound),
            "replace must not create"
        );
    }

    pub async fn a_shared_read_is_the_version_a_read_copies(store: Arc<dyn LocationStore>) {
        let doc = LocationDocument::new("shared-1", "westeurope");
        let e1 = store.create(&doc).await.unwrap().etag;
        let e2 = store.replace(&moved(&doc, "northeurope"), &e1).await.unwrap().etag;
        let shared = store.read_shared("shared-1", ReadFrom::WriteRegion).await.unwrap();
        assert_eq!(shared.etag, e2);
        assert_eq!(*shared, store.read("shared-1", ReadFrom::WriteRegion).await.unwrap());
        for from in [ReadFrom::WriteRegion, ReadFrom::Replica] {
            assert_eq!(store.read_shared("nobody", from).await, Err(StoreError::NotFound));
        }
    }

    pub async fn unknown_fields_are_preserved(store: Arc<dyn LocationStore>) {
        let stored = json!({
            "id": "future-1", "schemaVersion": 1, "migrating": false, "secondary": null,
            "primary": {"location": "westeurope", "lock": null, "tier": "gold"},
            "addedByV1_3": {"nested": [1, 2, {"deep": true}]}
        });
        let doc = LocationDocument::from_json(stored).unwrap();
        let e1 = store.create(&doc).await.unwrap().etag;
        let read = store.read("future-1", ReadFrom::WriteRegion).await.unwrap();
        assert_eq!(read.doc, doc, "read back exactly what was written, no store metadata added");

        let next = moved(&read.doc, "northeurope");
        store.replace(&next, &e1).await.unwrap();
        let json = store.read("future-1", ReadFrom::WriteRegion).await.unwrap().doc.to_json();
        assert_eq!(json["addedByV1_3"], json!({"nested": [1, 2, {"deep": true}]}));
        assert_eq!(json["primary"]["tier"], json!("gold"));
        assert_eq!(json["primary"]["location"], json!("northeurope"));
        let fields: BTreeSet<&str> = json.as_object().unwrap().keys().map(String::as_str).collect();
        assert_eq!(
            fields,
            BTreeSet::from(["id", "schemaVersion", "primary", "secondary", "migrating", "addedByV1_3"]),
            "no store system field may leak into the document"
        );
    }

    /// Reads the change stream from `cursor` until a page comes back empty.
    async fn drain(
        store: &dyn LocationStore,
        mut cursor: ChangeCursor,
        page: usize,
    ) -> (Vec<(String, ETag)>, ChangeCursor) {
        let mut seen = Vec::new();
        let mut last_commit = None;
        for _ in 0..100 {
            let batch = store.read_changes(&cursor, page).await.unwrap();
            assert!(batch.changes.len() <= page, "a page holds at most the limit");
            if batch.changes.is_empty() {
                assert_eq!(batch.next, cursor, "an empty page does not move the cursor");
                return (seen, cursor);
            }
            for change in &batch.changes {
                assert!(last_commit <= Some(change.doc.committed_at), "changes come in commit-time order");
                last_commit = Some(change.doc.committed_at);
                seen.push((change.doc.doc.id.clone(), change.doc.etag.clone()));
            }
            cursor = batch.next;
        }
        panic!("the change stream never ran dry");
    }

    /// Delivered versions of each id must be committed versions, in commit order,
    /// without repeats, ending at the current version (a backend may skip
    /// intermediate versions, as Cosmos DB's change feed does).
    fn assert_faithful(delivered: &[(String, ETag)], committed: &HashMap<String, Vec<ETag>>, ids: &[&str]) {
        for id in ids {
            let history = &committed[*id];
            let got: Vec<&ETag> = delivered.iter().filter(|(d, _)| d == id).map(|(_, e)| e).collect();
            let positions: Vec<usize> = got
                .iter()
                .map(|e| {
                    history.iter().position(|h| h == *e).unwrap_or_else(|| panic!("{id}: {e:?} was never committed"))
                })
                .collect();
            assert!(positions.windows(2).all(|w| w[0] < w[1]), "{id}: versions out of order or repeated: {got:?}");
            assert_eq!(got.last(), history.last().as_ref(), "{id}: the latest version must be delivered");
        }
        let known: BTreeSet<&str> = ids.iter().copied().collect();
        assert!(delivered.iter().all(|(id, _)| known.contains(id.as_str())), "only written documents: {delivered:?}");
    }

    pub async fn change_stream_delivers_committed_writes_in_order_and_resumes(store: Arc<dyn LocationStore>) {
        let mut committed: HashMap<String, Vec<ETag>> = HashMap::new();
        fn write(committed: &mut HashMap<String, Vec<ETag>>, id: &str, etag: ETag) {
            committed.entry(id.to_owned()).or_default().push(etag);
        }
        let docs: Vec<LocationDocument> =
            ["c", "a", "b"].iter().map(|id| LocationDocument::new(*id, "westeurope")).collect();
        for doc in &docs {
            write(&mut committed, &doc.id, store.create(doc).await.unwrap().etag);
        }
        let b1 = committed["b"][0].clone();
        write(&mut committed, "b", store.replace(&moved(&docs[2], "northeurope"), &b1).await.unwrap().etag);

        let (first, cursor) = drain(&*store, ChangeCursor::beginning(), 2).await;
        assert_faithful(&first, &committed, &["a", "b", "c"]);

        // Resume: only what was written after the cursor comes back.
        let a1 = committed["a"][0].clone();
        write(&mut committed, "a", store.replace(&moved(&docs[1], "eastus"), &a1).await.unwrap().etag);
        write(&mut committed, "d", store.create(&LocationDocument::new("d", "westeurope")).await.unwrap().etag);
        let (second, cursor) = drain(&*store, cursor, 2).await;
        let ids: BTreeSet<&str> = second.iter().map(|(id, _)| id.as_str()).collect();
        assert_eq!(ids, BTreeSet::from(["a", "d"]), "after the cursor only the new writes: {second:?}");
        let all: Vec<(String, ETag)> = first.iter().chain(&second).cloned().collect();
        assert_faithful(&all, &committed, &["a", "b", "c", "d"]);

        let (third, _) = drain(&*store, cursor, 2).await;
        assert!(third.is_empty(), "nothing new: {third:?}");
    }

    pub async fn scan_pages_in_id_order(store: Arc<dyn LocationStore>) {
        let ids = ["m", "b", "x", "a", "q", "c", "z"];
        let mut etags = HashMap::new();
        for id in ids {
            etags.insert(id.to_owned(), store.create(&LocationDocument::new(id, "westeurope")).await.unwrap().etag);
        }
        let mut after: Option<String> = None;
        let mut pages = Vec::new();
        loop {
            let page = store.scan(after.as_deref(), 3).await.unwrap();
            if page.is_empty() {
                break;
            }
            assert!(page.len() <= 3);
            assert!(page.unreadable.is_empty(), "{:?}", page.unreadable);
            for v in &page.documents {
                assert_eq!(etags[&v.doc.id], v.etag, "scan returns the current version of {}", v.doc.id);
            }
            after = page.last_id().map(str::to_owned);
            pages.push(page.documents.into_iter().map(|v| v.doc.id).collect::<Vec<_>>());
        }
        assert_eq!(pages, [vec!["a", "b", "c"], vec!["m", "q", "x"], vec!["z"]]);
        assert!(store.scan(Some("zz"), 3).await.unwrap().is_empty());
        assert_eq!(
            store.scan(Some("b"), 2).await.unwrap().documents.iter().map(|v| v.doc.id.as_str()).collect::<Vec<_>>(),
            ["c", "m"]
        );
    }

    pub async fn concurrent_replaces_from_one_etag_have_one_winner(store: Arc<dyn LocationStore>) {
        const N: usize = 16;
        let doc = LocationDocument::new("race-1", "westeurope");
        let e1 = store.create(&doc).await.unwrap().etag;
        let tasks: Vec<_> = (0..N)
            .map(|i| {
                let (store, doc, e1) = (store.clone(), moved(&doc, &format!("region-{i}")), e1.clone());
                tokio::spawn(async move { (i, store.replace(&doc, &e1).await) })
            })
            .collect();
        let mut winners = Vec::new();
        for task in tasks {
            match task.await.unwrap() {
                (i, Ok(committed)) => winners.push((i, committed.etag)),
                (_, Err(StoreError::PreconditionFailed)) => {}
                (i, Err(other)) => panic!("replace {i} failed with {other:?}, expected success or 412"),
            }
        }
        assert_eq!(winners.len(), 1, "exactly one replace wins: {winners:?}");
        let (winner, etag) = &winners[0];
        let read = store.read("race-1", ReadFrom::WriteRegion).await.unwrap();
        assert_eq!(read.doc.primary.location, format!("region-{winner}"));
        assert_eq!(&read.etag, etag);
    }

    pub async fn fifty_concurrent_pre_locks_have_one_winner(store: Arc<dyn LocationStore>) {
        const N: usize = 50;
        store.create(&LocationDocument::new("lock-1", "westeurope")).await.unwrap();
        let clock: Arc<dyn Clock> = Arc::new(SystemClock);
        let policy = LockPolicy::new(Duration::from_secs(2), Duration::from_secs(600));
        let tasks: Vec<_> = (0..N)
            .map(|i| {
                // One client per task: 50 service instances, each with its own cache.
                let client = RoutingClient::new(
                    store.clone(),
                    clock.clone(),
                    TieredCache::try_new(&[Duration::from_secs(1)]).unwrap(),
                    policy.clone(),
                    ClientOptions::default(),
                );
                let req = PreLockRequest {
                    owner: format!("orchestrator-{i}"),
                    duration: Duration::from_secs(60),
                    target_location: Some("northeurope".into()),
                };
                tokio::spawn(async move { client.pre_lock("lock-1", &req).await })
            })
            .collect();
        let mut grants = Vec::new();
        let mut held = 0;
        for task in tasks {
            match task.await.unwrap() {
                Ok(grant) => grants.push(grant),
                Err(RoutingError::Lock(LockError::LockHeld { .. })) => held += 1,
                Err(other) => panic!("a pre-lock failed with {other:?}, expected a grant or LockHeld"),
            }
        }
        assert_eq!((grants.len(), held), (1, N - 1));
        let stored = store.read("lock-1", ReadFrom::WriteRegion).await.unwrap();
        let lock = stored.doc.primary.lock.expect("the winner's lock is stored");
        assert!(lock.token.matches(&grants[0].token), "the stored lock is the winner's");
        assert_eq!(stored.etag, grants[0].record.etag);
    }
}

/// Instantiates the whole suite for one backend. `$make` is an async expression that
/// returns a fresh `Arc<dyn LocationStore>` (the Cosmos server it may need lives as
/// long as the test binary).
macro_rules! conformance_suite {
    ($backend:ident, $make:expr) => {
        mod $backend {
            use super::*;

            conformance_suite!(@tests $make;
                etag_changes_on_every_write,
                stale_etag_is_refused_and_changes_nothing,
                create_of_an_existing_id_conflicts,
                a_missing_id_is_not_found,
                a_shared_read_is_the_version_a_read_copies,
                unknown_fields_are_preserved,
                change_stream_delivers_committed_writes_in_order_and_resumes,
                scan_pages_in_id_order,
                concurrent_replaces_from_one_etag_have_one_winner,
                fifty_concurrent_pre_locks_have_one_winner
            );
        }
    };
    (@tests $make:expr; $($name:ident),+) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $name() {
                suite::$name($make.await).await;
            }
        )+
    };
}

async fn memory_store() -> Arc<dyn LocationStore> {
    use lockprobe::store::memory::{MemoryStore, MemoryStoreConfig};
    Arc::new(MemoryStore::new(Arc::new(SystemClock), MemoryStoreConfig::default()))
}

/// One server for the whole test binary (it exits with the process).
fn cosmos_endpoint() -> String {
    static SERVER: std::sync::OnceLock<cosmos_server::CosmosServer> = std::sync::OnceLock::new();
    SERVER.get_or_init(cosmos_server::CosmosServer::start).endpoint()
}

/// The Cosmos store as configured for the local server (`_ts` poll), a fresh database
/// per test.
async fn cosmos_store() -> Arc<dyn LocationStore> {
    Arc::new(cosmos_server::connect(&cosmos_endpoint(), &prometheus::Registry::new()).await)
}

/// The Cosmos store reading the change feed (the launcher serves a latest-version feed
/// in place of the server's stub), a fresh database per test.
async fn cosmos_change_feed_store() -> Arc<dyn LocationStore> {
    let registry = prometheus::Registry::new();
    Arc::new(
        cosmos_server::connect_with(&cosmos_endpoint(), &registry, |args| {
            args.change_stream = lockprobe::app::store::cosmos::ChangeStreamChoice::ChangeFeed
        })
        .await,
    )
}

/// The two-region account for the whole test binary: West Europe takes writes, North
/// Europe (the store's preferred replica region) is 1 s behind.
fn two_regions() -> &'static cosmos_server::CosmosRegions {
    static REGIONS: std::sync::OnceLock<cosmos_server::CosmosRegions> = std::sync::OnceLock::new();
    REGIONS.get_or_init(|| cosmos_server::CosmosServer::start_two_regions(Duration::from_secs(1)))
}

async fn two_region_store(regions: &cosmos_server::CosmosRegions) -> lockprobe::store::cosmos::CosmosStore {
    let args = cosmos_server::two_region_args(regions, &cosmos_server::unique_database("conformance-regions"));
    lockprobe::store::cosmos::CosmosStore::connect(cosmos_server::config_from(&args), &prometheus::Registry::new())
        .await
        .expect("connects to the two-region account")
}

/// The Cosmos store on the two-region account, a fresh database per test.
async fn cosmos_two_regions_store() -> Arc<dyn LocationStore> {
    Arc::new(two_region_store(two_regions()).await)
}

/// The Cosmos store on a two-region account of its own that made a planned failover
/// after the store connected: the store believes West Europe takes writes, the
/// account says North Europe. (`--cosmos-write-region` still says West Europe.)
async fn cosmos_after_failover_store() -> Arc<dyn LocationStore> {
    let regions = cosmos_server::CosmosServer::start_two_regions(Duration::from_millis(200));
    let store = two_region_store(&regions).await;
    regions.failover(cosmos_server::Failover::Planned).await;
    Arc::new(WithAccount { store, _regions: regions })
}

/// A store that keeps its test account running for as long as it lives.
#[derive(Debug)]
struct WithAccount {
    store: lockprobe::store::cosmos::CosmosStore,
    _regions: cosmos_server::CosmosRegions,
}

#[async_trait::async_trait]
impl LocationStore for WithAccount {
    async fn read(&self, id: &str, from: ReadFrom) -> Result<lockprobe::store::Versioned, StoreError> {
        self.store.read(id, from).await
    }
    async fn create(&self, doc: &LocationDocument) -> Result<lockprobe::store::Committed, StoreError> {
        self.store.create(doc).await
    }
    async fn replace(
        &self,
        doc: &LocationDocument,
        if_match: &ETag,
    ) -> Result<lockprobe::store::Committed, StoreError> {
        self.store.replace(doc, if_match).await
    }
    async fn read_changes(
        &self,
        cursor: &ChangeCursor,
        limit: usize,
    ) -> Result<lockprobe::store::ChangeBatch, StoreError> {
        self.store.read_changes(cursor, limit).await
    }
    async fn scan(&self, after: Option<&str>, limit: usize) -> Result<lockprobe::store::ScanPage, StoreError> {
        self.store.scan(after, limit).await
    }
}

conformance_suite!(memory, memory_store());
conformance_suite!(cosmos, cosmos_store());
conformance_suite!(cosmos_change_feed, cosmos_change_feed_store());
conformance_suite!(cosmos_two_regions, cosmos_two_regions_store());
conformance_suite!(cosmos_after_failover, cosmos_after_failover_store());
