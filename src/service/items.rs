//! User data of the reference service, kept per location (one item store per location
//! name), so a migration really moves data and a missed lock really loses it.

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;

use serde_json::Value;

/// One stored item; a tombstone remembers that it was deleted under a hard-delete lock.
#[derive(Debug, Clone, PartialEq)]
pub struct Item {
    /// The value last written (null for a tombstone).
    pub value: Value,
    /// Deleted during a migration: kept so the copy carries the deletion.
    pub tombstone: bool,
}

type ResourceItems = BTreeMap<String, Item>;

/// Items of every resource, per location. Shared by all instances of a service.
#[derive(Debug, Default)]
pub struct ItemStores {
    inner: Mutex<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    by_location: HashMap<String, HashMap<String, ResourceItems>>,
    /// How many times the items of (location, resource) changed: a copy can be made
    /// conditional on the target not having changed since it was looked at.
    versions: HashMap<(String, String), u64>,
}

impl Inner {
    fn items_mut(&mut self, location: &str, resource: &str) -> &mut ResourceItems {
        self.by_location.entry(location.to_owned()).or_default().entry(resource.to_owned()).or_default()
    }

    fn changed(&mut self, location: &str, resource: &str) {
        *self.versions.entry((location.to_owned(), resource.to_owned())).or_default() += 1;
    }
}

/// Whether a write created the item or overwrote it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WriteOutcome {
    /// There was no item (or only a tombstone).
    Created,
    /// A live item was overwritten.
    Replaced,
}

impl ItemStores {
    /// Every critical section below leaves the maps consistent (one insert, removal or
    /// whole-resource replacement), so a panic elsewhere while the lock was held is no
    /// reason to stop serving: the guard is recovered rather than the poison propagated.
    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Reads an item of `resource` at `location`.
    pub fn get(&self, location: &str, resource: &str, key: &str) -> Option<Item> {
        let inner = self.lock();
        inner.by_location.get(location)?.get(resource)?.get(key).cloned()
    }

    /// Writes an item.
    pub fn put(&self, location: &str, resource: &str, key: &str, value: Value) -> WriteOutcome {
        let mut inner = self.lock();
        let previous = inner.items_mut(location, resource).insert(key.to_owned(), Item { value, tombstone: false });
        inner.changed(location, resource);
        match previous {
            Some(Item { tombstone: false, .. }) => WriteOutcome::Replaced,
            _ => WriteOutcome::Created,
        }
    }

    /// Deletes an item physically; false when there was nothing to delete.
    pub fn remove(&self, location: &str, resource: &str, key: &str) -> bool {
        let mut inner = self.lock();
        let removed = inner.items_mut(location, resource).remove(key).is_some();
        if removed {
            inner.changed(location, resource);
        }
        removed
    }

    /// Turns an item into a tombstone; false when there was no item.
    pub fn tombstone(&self, location: &str, resource: &str, key: &str) -> bool {
        let mut inner = self.lock();
        let Some(item) = inner.items_mut(location, resource).get_mut(key) else { return false };
        *item = Item { value: Value::Null, tombstone: true };
        inner.changed(location, resource);
        true
    }

    /// How many times the items of `resource` at `location` have changed.
    pub fn version(&self, location: &str, resource: &str) -> u64 {
        self.lock().versions.get(&(location.to_owned(), resource.to_owned())).copied().unwrap_or(0)
    }

    /// Makes `to` hold exactly what `from` holds for `resource`, tombstones included,
    /// so nothing deleted at the source is resurrected from an older copy at the
    /// target. Returns how many items were copied.
    pub fn copy_resource(&self, resource: &str, from: &str, to: &str) -> usize {
        let mut inner = self.lock();
        copy(&mut inner, resource, from, to)
    }

    /// [`Self::copy_resource`], only if the target is still at `target_version`
    /// (see [`Self::version`]); `None`, and nothing copied, if it changed since.
    pub fn copy_resource_if(&self, resource: &str, from: &str, to: &str, target_version: u64) -> Option<usize> {
        let mut inner = self.lock();
        let now = inner.versions.get(&(to.to_owned(), resource.to_owned())).copied().unwrap_or(0);
        (now == target_version).then(|| copy(&mut inner, resource, from, to))
    }
}

fn copy(inner: &mut Inner, resource: &str, from: &str, to: &str) -> usize {
    let items = inner.by_location.get(from).and_then(|r| r.get(resource)).cloned().unwrap_or_default();
    let copied = items.len();
    *inner.items_mut(to, resource) = items;
    inner.changed(to, resource);
    copied
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn copy_replaces_the_targets_items_and_keeps_tombstones() {
        let stores = ItemStores::default();
        stores.put("b", "r", "stale", json!(1));
        stores.put("a", "r", "live", json!(2));
        stores.put("a", "r", "gone", json!(3));
        assert!(stores.tombstone("a", "r", "gone"));
        assert_eq!(stores.copy_resource("r", "a", "b"), 2);
        assert_eq!(stores.get("b", "r", "stale"), None, "an old copy at the target must not survive");
        assert_eq!(stores.get("b", "r", "live").unwrap().value, json!(2));
        assert!(stores.get("b", "r", "gone").unwrap().tombstone);
    }

    #[test]
    fn a_conditional_copy_refuses_a_target_that_changed() {
        let stores = ItemStores::default();
        stores.put("a", "r", "k", json!(1));
        let before = stores.version("b", "r");
        assert_eq!(stores.copy_resource_if("r", "a", "b", before), Some(1));
        // A write lands at the new location; a second copy based on the old look must
        // not overwrite it.
        stores.put("b", "r", "new", json!(2));
        assert_eq!(stores.copy_resource_if("r", "a", "b", before), None);
        assert_eq!(stores.get("b", "r", "new").unwrap().value, json!(2));
    }

    #[test]
    fn a_poisoned_store_keeps_serving() {
        let stores = std::sync::Arc::new(ItemStores::default());
        stores.put("a", "r", "k", json!(1));
        let holder = stores.clone();
        let panicked = std::thread::spawn(move || {
            let _all = holder.inner.lock().unwrap();
            panic!("a request panicked while holding the item store");
        })
        .join();
        assert!(panicked.is_err() && stores.inner.is_poisoned());
        assert_eq!(stores.get("a", "r", "k").unwrap().value, json!(1));
        assert_eq!(stores.put("a", "r", "k2", json!(2)), WriteOutcome::Created);
        assert!(stores.tombstone("a", "r", "k"));
        assert_eq!(stores.copy_resource("r", "a", "b"), 2);
        assert!(stores.remove("b", "r", "k2"));
    }

    #[test]
    fn write_over_a_tombstone_counts_as_created() {
        let stores = ItemStores::default();
        assert_eq!(stores.put("a", "r", "k", json!(1)), WriteOutcome::Created);
        assert_eq!(stores.put("a", "r", "k", json!(2)), WriteOutcome::Replaced);
        stores.tombstone("a", "r", "k");
        assert_eq!(stores.put("a", "r", "k", json!(3)), WriteOutcome::Created);
        assert!(stores.remove("a", "r", "k"));
        assert!(!stores.remove("a", "r", "k"));
    }
}
