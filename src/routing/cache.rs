//! The tiered TTL cache of location documents (e.g. edge, regional, service-local).
//!
//! Each tier has its own TTL. An entry keeps the time its document was fetched from
//! the store, also when it is copied from a slower tier into a faster one, so no tier
//! can serve a document older than the largest TTL: that is what lets a service
//! declare max TTL + replication bound as its convergence delay.

use std::collections::HashMap;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use chrono::{DateTime, Utc};

use crate::clock::to_chrono;
use crate::store::Versioned;

/// A cached document and when it was fetched from the store.
#[derive(Debug, Clone)]
pub struct CachedEntry {
    /// The document and its ETag.
    pub record: Arc<Versioned>,
    /// When it was read from the store (not when it entered this tier).
    pub fetched_at: DateTime<Utc>,
}

#[derive(Debug)]
struct Tier {
    ttl: chrono::TimeDelta,
    entries: RwLock<HashMap<String, CachedEntry>>,
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

impl TieredCache {
    /// Tiers with these TTLs, fastest first. At least one tier; a zero TTL is allowed
    /// and means that tier never serves.
    pub fn try_new(ttls: &[Duration]) -> Result<Self, CacheConfigError> {
        if ttls.is_empty() {
            return Err(CacheConfigError("at least one cache tier is needed".into()));
        }
        let tiers = ttls.iter().map(|ttl| Tier { ttl: to_chrono(*ttl), entries: RwLock::default() }).collect();
        Ok(Self { tiers, max_ttl: ttls.iter().copied().max().unwrap_or_default() })
    }

    /// The largest TTL across tiers: the cache's share of the convergence delay.
    pub fn max_ttl(&self) -> Duration {
        self.max_ttl
    }

    /// The first fresh entry, fastest tier first. A hit in a slower tier is copied into
    /// the faster ones, keeping its fetch time.
    pub fn get(&self, id: &str, now: DateTime<Utc>) -> Option<CachedEntry> {
        for (depth, tier) in self.tiers.iter().enumerate() {
            let found = tier.entries.read().expect("cache lock poisoned").get(id).cloned();
            if let Some(entry) = found.filter(|e| now < e.fetched_at + tier.ttl) {
                for faster in &self.tiers[..depth] {
                    faster.entries.write().expect("cache lock poisoned").insert(id.to_owned(), entry.clone());
                }
                return Some(entry);
            }
        }
        None
    }

    /// Stores a document fetched at `fetched_at` in every tier.
    pub fn put(&self, id: &str, record: Arc<Versioned>, fetched_at: DateTime<Utc>) {
        let entry = CachedEntry { record, fetched_at };
        for tier in &self.tiers {
            tier.entries.write().expect("cache lock poisoned").insert(id.to_owned(), entry.clone());
        }
    }

    /// Drops expired entries from every tier, so a long-running service does not keep
    /// documents it no longer serves.
    pub fn evict_expired(&self, now: DateTime<Utc>) {
        for tier in &self.tiers {
            tier.entries.write().expect("cache lock poisoned").retain(|_, e| now < e.fetched_at + tier.ttl);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::{Clock, ManualClock};
    use crate::routing::document::LocationDocument;
    use crate::store::ETag;

    fn record(location: &str) -> Arc<Versioned> {
        Arc::new(Versioned { doc: LocationDocument::new("r", location), etag: ETag("e".into()) })
    }

    #[test]
    fn entries_expire_per_tier_and_copies_keep_their_age() {
        let clock = ManualClock::at_epoch();
        let cache = TieredCache::try_new(&[Duration::from_secs(1), Duration::from_secs(10)]).unwrap();
        assert_eq!(cache.max_ttl(), Duration::from_secs(10));
        cache.put("r", record("a"), clock.now());
        clock.advance(Duration::from_secs(2));
        // The fast tier has expired; the slow one still serves, and refills the fast tier
        // with the original fetch time.
        let hit = cache.get("r", clock.now()).unwrap();
        assert_eq!(hit.fetched_at + chrono::TimeDelta::seconds(2), clock.now());
        clock.advance(Duration::from_secs(8));
        assert!(cache.get("r", clock.now()).is_none(), "nothing may outlive the largest TTL");
    }

    #[test]
    fn needs_a_tier() {
        assert!(TieredCache::try_new(&[]).is_err());
    }

    #[test]
    fn eviction_drops_only_expired_entries() {
        let clock = ManualClock::at_epoch();
        let cache = TieredCache::try_new(&[Duration::from_secs(5)]).unwrap();
        cache.put("old", record("a"), clock.now());
        clock.advance(Duration::from_secs(3));
        cache.put("new", record("b"), clock.now());
        clock.advance(Duration::from_secs(3));
        cache.evict_expired(clock.now());
        assert!(cache.get("old", clock.now()).is_none());
        assert!(cache.get("new", clock.now()).is_some());
    }
}
