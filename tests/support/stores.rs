//! The memory store as tests instrument it: the one fault injector
//! ([`FaultyStore`]) and the one counting wrapper ([`CountingStore`]) around it, so a
//! test can switch a fault on for a few calls and count the calls by kind.

#![allow(dead_code)]

use std::sync::Arc;

use lockprobe::clock::Clock;
use lockprobe::store::memory::{MemoryStore, MemoryStoreConfig};
use lockprobe::store::{LocationStore, OpKind};
use lockprobe::testing::{CountingStore, OpCounts};
use lockprobe::testing::{FaultAction, FaultRule, FaultyStore};

/// A memory store behind a fault injector behind a counter: every call a client makes
/// is counted, faulted or not.
#[derive(Debug, Clone)]
pub struct Instrumented {
    /// The store itself (raw writes, its change log).
    pub memory: Arc<MemoryStore>,
    faults: Arc<FaultyStore>,
    counting: Arc<CountingStore>,
}

impl Instrumented {
    /// A fresh memory store on `clock`.
    pub fn new(clock: Arc<dyn Clock>, config: MemoryStoreConfig) -> Self {
        let memory = Arc::new(MemoryStore::new(clock.clone(), config));
        let faults = Arc::new(FaultyStore::new(memory.clone(), clock, 0));
        let counting = Arc::new(CountingStore::new(faults.clone()));
        Self { memory, faults, counting }
    }

    /// The store to give clients and services.
    pub fn store(&self) -> Arc<dyn LocationStore> {
        self.counting.clone()
    }

    /// Calls made so far, by kind.
    pub fn counts(&self) -> OpCounts {
        self.counting.calls()
    }

    /// Makes the next `times` calls of `kind` suffer `action`.
    pub fn inject(&self, kind: OpKind, action: FaultAction, times: u32) {
        self.faults.add_rule(FaultRule::new(kind, action).times(times));
    }

    /// Drops every fault not yet injected.
    pub fn clear_faults(&self) {
        self.faults.clear_rules();
    }
}
