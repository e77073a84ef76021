//! The tiered TTL cache of location documents (e.g. edge, regional, service-local).
//!
//! Each tier has its own TTL. An entry keeps the time its document was fetched from
//! the store, also when it is copied from a slower tier into a faster one, so no tier
//! can serve a document older than the largest TTL: that is what lets a service
//! declare max TTL + replication bound as its convergence delay.
//!
//! Whether an entry may be *served* (rather than only telling the client to read
//! through) is decided once, when it is stored, as an absolute instant: the hit path is
//! then one hash lookup and two integer compares, with times as Unix nanoseconds.
//! Fetch times are lower bounds of the true instant and lookups compare an upper bound
//! ([`crate::clock::Clock::upper_unix_nanos`]), so an entry expires early, never late.
//!
//! Each tier is a lock-free concurrent map (`papaya`) hashed with `ahash`, and a hit
//! writes no memory that another thread reads: a reader only marks its own thread's
//! slot in the epoch collector (shared by the tiers) and reads the table; the entry's
//! document is lent under that guard ([`TieredCache::pin`]) rather than handed out with
//! its reference count raised. Threads resolving the same resources then do not move
//! cache lines between cores on every hit, as a lock word or an `Arc` count would.
//! Replaced entries are freed once no guard that could see them remains. ahash,
//! randomly keyed per map, keeps hashing an id cheap while resource ids chosen by
//! clients still cannot be made to collide on purpose. BENCHMARKS.md ("Routing
//! resolve") has the figures.

use std::sync::Arc;
use std::time::Duration;

use crate::store::{ETag, Versioned};

/// What the cache knows about a resource right now.
#[derive(Debug, Clone)]
pub enum Lookup<T = Arc<Versioned>> {
    /// A fresh entry that may be served as is.
    Serve(T),
    /// A fresh entry that must not be served (it carries a started lock): read the
    /// write region instead of a replica.
    ReadThrough,
    /// Nothing fresh.
    Miss,
}

#[derive(Debug, Clone)]
struct Entry {
    record: Arc<Versioned>,
    /// When the document was read from the store.
    fetched_ns: i64,
    /// Until when it may be served without a read-through (independent of tier TTLs).
    serve_until_ns: i64,
}

type Entries = papaya::HashMap<String, Entry, ahash::RandomState>;

#[derive(Debug)]
struct Tier {
    ttl_ns: i64,
    entries: Entries,
}

/// Cache tiers, fastest first.
#[derive(Debug)]
pub struct TieredCache {
    tiers: Vec<Tier>,
    /// The tiers' one epoch collector, so one guard covers a walk through all of them.
    collector: Arc<seize::Collector>,
    max_ttl: Duration,
}

/// The cache pinned by the current thread: documents it lends stay valid while it
/// lives. Not `Send`; hold it only for synchronous work (it delays the freeing of
/// replaced entries, never their replacement).
pub struct PinnedCache<'c> {
    cache: &'c TieredCache,
    guard: papaya::LocalGuard<'c>,
}

/// An invalid cache configuration.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("cache: {0}")]
pub struct CacheConfigError(String);

fn nanos(d: Duration) -> i64 {
    i64::try_from(d.as_nanos()).unwrap_or(i64::MAX)
}

impl TieredCache {
    /// Tiers with these TTLs, fastest first. At least one tier; a zero TTL is allowed
    /// and means that tier never serves.
    pub fn try_new(ttls: &[Duration]) -> Result<Self, CacheConfigError> {
        if ttls.is_empty() {
            return Err(CacheConfigError("at least one cache tier is needed".into()));
        }
        let collector = Arc::new(seize::Collector::new());
        let tiers = ttls
            .iter()
            .map(|ttl| Tier {
                ttl_ns: nanos(*ttl),
                entries: papaya::HashMap::builder()
                    .hasher(ahash::RandomState::new())
                    .shared_collector(collector.clone())
                    .build(),
            })
            .collect();
        Ok(Self { tiers, collector, max_ttl: ttls.iter().copied().max().unwrap_or_default() })
    }

    /// The largest TTL across tiers: the cache's share of the convergence delay.
    pub fn max_ttl(&self) -> Duration {
        self.max_ttl
    }

    /// Pins the cache for the current thread, to look documents up without taking
    /// them out ([`PinnedCache::lookup`]).
    pub fn pin(&self) -> PinnedCache<'_> {
        PinnedCache { cache: self, guard: self.collector.enter() }
    }

    /// [`PinnedCache::lookup`], the document taken out (its `Arc` cloned).
    pub fn lookup(&self, id: &str, now_ns: i64) -> Lookup {
        let pinned = self.pin();
        match pinned.lookup(id, now_ns) {
            Lookup::Serve(record) => Lookup::Serve(record.clone()),
            Lookup::ReadThrough => Lookup::ReadThrough,
            Lookup::Miss => Lookup::Miss,
        }
    }

    /// Stores a document fetched at `fetched_ns` in every tier; it may be served until
    /// `serve_until_ns` (or its tier's TTL, whichever comes first).
    pub fn put(&self, id: &str, record: Arc<Versioned>, fetched_ns: i64, serve_until_ns: i64) {
        let entry = Entry { record, fetched_ns, serve_until_ns };
        let guard = self.collector.enter();
        for tier in &self.tiers {
            tier.entries.insert(id.to_owned(), entry.clone(), &guard);
        }
    }

    /// The cached record of exactly version `etag` of `id`, however old: never to be
    /// served (that is [`PinnedCache::lookup`]'s rule), but to spare work that depends
    /// on the version alone, such as settling it again.
    pub fn version(&self, id: &str, etag: &ETag) -> Option<Arc<Versioned>> {
        let guard = self.collector.enter();
        self.tiers
            .iter()
            .find_map(|tier| tier.entries.get(id, &guard).filter(|e| &e.record.etag == etag).map(|e| e.record.clone()))
    }

    /// Drops expired entries from every tier, so a long-running service does not keep
    /// documents it no longer serves.
    pub fn evict_expired(&self, now_ns: i64) {
        let guard = self.collector.enter();
        for tier in &self.tiers {
            tier.entries.retain(|_, e| now_ns < e.fetched_ns.saturating_add(tier.ttl_ns), &guard);
        }
    }
}

impl<'c> PinnedCache<'c> {
    /// The first fresh entry, fastest tier first, its document lent for as long as
    /// this pin. A hit in a slower tier is copied into the faster ones, keeping its
    /// fetch time.
    pub fn lookup<'p>(&'p self, id: &str, now_ns: i64) -> Lookup<&'p Arc<Versioned>> {
        let tiers = &self.cache.tiers;
        for (depth, tier) in tiers.iter().enumerate() {
            let Some(entry) = tier.entries.get(id, &self.guard) else { continue };
            if now_ns >= entry.fetched_ns.saturating_add(tier.ttl_ns) {
                continue;
            }
            for faster in &tiers[..depth] {
                faster.entries.insert(id.to_owned(), entry.clone(), &self.guard);
            }
            return if now_ns < entry.serve_until_ns { Lookup::Serve(&entry.record) } else { Lookup::ReadThrough };
        }
        Lookup::Miss
    }
}

impl std::fmt::Debug for PinnedCache<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PinnedCache").field("cache", self.cache).finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::document::{LocationDocument, LockToken};

    const S: i64 = 1_000_000_000;

    fn record(location: &str) -> Arc<Versioned> {
        Arc::new(Versioned {
            doc: LocationDocument::new("r", location),
            etag: ETag("e".into()),
            committed_at: chrono::DateTime::UNIX_EPOCH,
        })
    }

    fn served(l: &Lookup) -> bool {
        matches!(l, Lookup::Serve(_))
    }

    #[test]
    fn entries_expire_per_tier_and_copies_keep_their_age() {
        let cache = TieredCache::try_new(&[Duration::from_secs(1), Duration::from_secs(10)]).unwrap();
        assert_eq!(cache.max_ttl(), Duration::from_secs(10));
        cache.put("r", record("a"), 0, i64::MAX);
        // The fast tier has expired; the slow one still serves and refills the fast tier
        // with the original fetch time, so the copy expires with the original.
        assert!(served(&cache.lookup("r", 2 * S)));
        assert!(served(&cache.lookup("r", 10 * S - 1)));
        assert!(matches!(cache.lookup("r", 10 * S), Lookup::Miss), "nothing may outlive the largest TTL");
    }

    #[test]
    fn an_entry_past_its_serve_time_asks_for_a_read_through() {
        let cache = TieredCache::try_new(&[Duration::from_secs(10)]).unwrap();
        cache.put("r", record("a"), 0, 3 * S);
        assert!(served(&cache.lookup("r", 3 * S - 1)));
        assert!(matches!(cache.lookup("r", 3 * S), Lookup::ReadThrough));
        assert!(matches!(cache.lookup("r", 10 * S), Lookup::Miss));
    }

    #[test]
    fn a_lent_document_stays_as_lent_while_the_entry_is_replaced() {
        let cache = TieredCache::try_new(&[Duration::from_secs(1), Duration::from_secs(10)]).unwrap();
        cache.put("r", record("a"), 0, i64::MAX);
        let pinned = cache.pin();
        // Lent from the slow tier (the fast one has expired), which refills the fast one.
        let Lookup::Serve(lent) = pinned.lookup("r", 2 * S) else { panic!("a fresh entry is served") };
        cache.put("r", record("b"), 2 * S, i64::MAX);
        cache.evict_expired(5 * S);
        assert_eq!(lent.doc.primary.location, "a");
        drop(pinned);
        let Lookup::Serve(now_served) = cache.lookup("r", 5 * S) else { panic!("the new entry is served") };
        assert_eq!(now_served.doc.primary.location, "b");
    }

    #[test]
    fn a_version_is_found_by_its_etag_however_old() {
        let cache = TieredCache::try_new(&[Duration::from_secs(1)]).unwrap();
        cache.put("r", record("a"), 0, 0);
        let etag = ETag("e".into());
        let found = cache.version("r", &etag).expect("the cached version, past its TTL and serve time");
        assert_eq!(found.doc.primary.location, "a");
        assert!(cache.version("r", &ETag("other".into())).is_none(), "another version is not this one");
        assert!(cache.version("q", &etag).is_none());
        cache.evict_expired(2 * S);
        assert!(cache.version("r", &etag).is_none(), "an evicted entry is gone");
    }

    #[test]
    fn needs_a_tier() {
        assert!(TieredCache::try_new(&[]).is_err());
    }

    #[test]
    fn eviction_drops_only_expired_entries() {
        let cache = TieredCache::try_new(&[Duration::from_secs(5)]).unwrap();
        cache.put("old", record("a"), 0, i64::MAX);
        cache.put("new", record("b"), 3 * S, i64::MAX);
        cache.evict_expired(6 * S);
        assert!(matches!(cache.lookup("old", 6 * S), Lookup::Miss));
        assert!(served(&cache.lookup("new", 6 * S)));
    }

    #[test]
    fn a_cache_holding_a_lock_never_shows_its_token_in_debug_output() {
        // Caches hold whole documents, tokens included, and a pinned cache or a client
        // may end up in a log line through `{:?}`.
        let cache = TieredCache::try_new(&[Duration::from_secs(5)]).unwrap();
        let token = LockToken::generate();
        let doc = crate::routing::lifecycle::pre_lock(
            &LocationDocument::new("r", "a"),
            &crate::routing::lifecycle::PreLockRequest {
                owner: "o".into(),
                duration: Duration::from_secs(60),
                target_location: None,
            },
            token.clone(),
            &crate::routing::lifecycle::LockPolicy::new(Duration::from_secs(1), Duration::from_secs(3600)),
            chrono::DateTime::UNIX_EPOCH,
        )
        .unwrap();
        let versioned = Versioned { doc, etag: ETag("e".into()), committed_at: chrono::DateTime::UNIX_EPOCH };
        cache.put("r", Arc::new(versioned), 0, i64::MAX);
        let pinned = format!("{:?}", cache.pin());
        assert!(pinned.starts_with("PinnedCache"), "{pinned}");
        for shown in [pinned, format!("{cache:?}")] {
            assert!(shown.contains("LockToken(<redacted>)"), "the cached lock is there: {shown}");
            assert!(!shown.contains(token.expose()), "{shown}");
        }
    }

    #[test]
    fn an_entry_is_evicted_from_the_instant_it_stops_being_served() {
        // The same boundary as `lookup`'s: live until fetched + TTL, gone at it. Seen
        // through `version`, which finds an entry however old while it is kept.
        let cache = TieredCache::try_new(&[Duration::from_secs(5)]).unwrap();
        let etag = ETag("e".into());
        cache.put("r", record("a"), 0, i64::MAX);
        cache.evict_expired(5 * S - 1);
        assert!(cache.version("r", &etag).is_some(), "kept while it can still be served");
        cache.evict_expired(5 * S);
        assert!(cache.version("r", &etag).is_none(), "dropped when it expires");
    }
}
