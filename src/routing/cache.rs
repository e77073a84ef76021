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
//! Each tier is a sharded concurrent map (`dashmap`) hashed with `ahash`: a hit takes
//! one shard's read lock, not a lock over the whole tier, so service threads resolving
//! different resources do not contend on one lock word; and ahash, randomly keyed per
//! map, keeps hashing an id cheap while resource ids chosen by clients still cannot be
//! made to collide on purpose. BENCHMARKS.md ("Routing resolve") has the figures.

use std::sync::Arc;
use std::time::Duration;

use crate::store::Versioned;

/// What the cache knows about a resource right now.
#[derive(Debug, Clone)]
pub enum Lookup {
    /// A fresh entry that may be served as is.
    Serve(Arc<Versioned>),
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

type Entries = dashmap::DashMap<String, Entry, ahash::RandomState>;

#[derive(Debug)]
struct Tier {
    ttl_ns: i64,
    entries: Entries,
}

/// Cache tiers, fastest first.
#[derive(Debug)]
pub struct TieredCache {
    tiers: Vec<Tier>,
    max_ttl: Duration,
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
        let tiers = ttls
            .iter()
            .map(|ttl| Tier { ttl_ns: nanos(*ttl), entries: Entries::with_hasher(ahash::RandomState::new()) })
            .collect();
        Ok(Self { tiers, max_ttl: ttls.iter().copied().max().unwrap_or_default() })
    }

    /// The largest TTL across tiers: the cache's share of the convergence delay.
    pub fn max_ttl(&self) -> Duration {
        self.max_ttl
    }

    /// The first fresh entry, fastest tier first. A hit in a slower tier is copied into
    /// the faster ones, keeping its fetch time.
    pub fn lookup(&self, id: &str, now_ns: i64) -> Lookup {
        for (depth, tier) in self.tiers.iter().enumerate() {
            let Some(entry) = tier.entries.get(id) else { continue };
            let fresh_until = entry.fetched_ns.saturating_add(tier.ttl_ns);
            if now_ns >= fresh_until {
                continue;
            }
            let answer =
                if now_ns < entry.serve_until_ns { Lookup::Serve(entry.record.clone()) } else { Lookup::ReadThrough };
            if depth > 0 {
                // The shard's read lock is let go before any tier is written.
                let copy = Entry::clone(&entry);
                drop(entry);
                for faster in &self.tiers[..depth] {
                    faster.entries.insert(id.to_owned(), copy.clone());
                }
            }
            return answer;
        }
        Lookup::Miss
    }

    /// Stores a document fetched at `fetched_ns` in every tier; it may be served until
    /// `serve_until_ns` (or its tier's TTL, whichever comes first).
    pub fn put(&self, id: &str, record: Arc<Versioned>, fetched_ns: i64, serve_until_ns: i64) {
        let entry = Entry { record, fetched_ns, serve_until_ns };
        for tier in &self.tiers {
            tier.entries.insert(id.to_owned(), entry.clone());
        }
    }

    /// Drops expired entries from every tier, so a long-running service does not keep
    /// documents it no longer serves.
    pub fn evict_expired(&self, now_ns: i64) {
        for tier in &self.tiers {
            tier.entries.retain(|_, e| now_ns < e.fetched_ns.saturating_add(tier.ttl_ns));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::routing::document::LocationDocument;
    use crate::store::ETag;

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
}
