//! User data of the reference service, kept per location (one item store per location
//! name), so a migration really moves data and a missed lock really loses it.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Mutex, MutexGuard, PoisonError};

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
type ByLocation = HashMap<String, HashMap<String, ResourceItems>>;

/// Items of every resource, per location. Shared by all instances of a service.
#[derive(Debug, Default)]
pub struct ItemStores {
    by_location: Mutex<ByLocation>,
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
    /// The map, even after a panic while it was held. That is safe here: every critical
    /// section below is a single map operation (at most a clone, then one insert), with
    /// no invariant spanning two steps, so a panic part-way leaves the map consistent.
    /// Refusing the poisoned lock instead would turn one failed request into a panic
    /// of every later one, on every instance, which takes the service down.
    fn locked(&self) -> MutexGuard<'_, ByLocation> {
        self.by_location.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Reads an item of `resource` at `location`.
    pub fn get(&self, location: &str, resource: &str, key: &str) -> Option<Item> {
        let all = self.locked();
        all.get(location)?.get(resource)?.get(key).cloned()
    }

    /// Writes an item.
    pub fn put(&self, location: &str, resource: &str, key: &str, value: Value) -> WriteOutcome {
        let mut all = self.locked();
        let items = all.entry(location.to_owned()).or_default().entry(resource.to_owned()).or_default();
        let previous = items.insert(key.to_owned(), Item { value, tombstone: false });
        match previous {
            Some(Item { tombstone: false, .. }) => WriteOutcome::Replaced,
            _ => WriteOutcome::Created,
        }
    }

    /// Deletes an item physically; false when there was nothing to delete.
    pub fn remove(&self, location: &str, resource: &str, key: &str) -> bool {
        let mut all = self.locked();
        all.get_mut(location).and_then(|r| r.get_mut(resource)).and_then(|items| items.remove(key)).is_some()
    }

    /// Turns an item into a tombstone; false when there was no item.
    pub fn tombstone(&self, location: &str, resource: &str, key: &str) -> bool {
        let mut all = self.locked();
        match all.get_mut(location).and_then(|r| r.get_mut(resource)).and_then(|items| items.get_mut(key)) {
            Some(item) => {
                *item = Item { value: Value::Null, tombstone: true };
                true
            }
            None => false,
        }
    }

    /// Makes `to` hold exactly what `from` holds for `resource`, tombstones included,
    /// so nothing deleted at the source is resurrected from an older copy at the
    /// target. Returns how many items were copied.
    pub fn copy_resource(&self, resource: &str, from: &str, to: &str) -> usize {
        let mut all = self.locked();
        let items = all.get(from).and_then(|r| r.get(resource)).cloned().unwrap_or_default();
        let copied = items.len();
        all.entry(to.to_owned()).or_default().insert(resource.to_owned(), items);
        copied
    }
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
    fn a_poisoned_store_keeps_serving() {
        let stores = std::sync::Arc::new(ItemStores::default());
        stores.put("a", "r", "k", json!(1));
        let holder = stores.clone();
        let panicked = std::thread::spawn(move || {
            let _all = holder.by_location.lock().unwrap();
            panic!("a request panicked while holding the item store");
        })
        .join();
        assert!(panicked.is_err() && stores.by_location.is_poisoned());
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
