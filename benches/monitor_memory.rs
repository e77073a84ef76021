//! How much memory the monitor holds per in-flight migration.
//!
//! Feeds one million in-flight migrations (a third each in preLock, hardDelete and
//! write, 36-character ids as a GUID would be) into a `Monitor` and reports the live
//! heap it retains, counted by a global allocator wrapper that exists in this binary
//! only. Run: `cargo bench --bench monitor_memory` (or add `-- 100000` for fewer).

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicIsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use lockprobe::clock::{Clock, ManualClock};
use lockprobe::monitor::{Monitor, MonitorConfig, Seen};
use lockprobe::routing::lifecycle::{self, LockPolicy, PreLockRequest};
use lockprobe::routing::{LocationDocument, LockToken, Phase};
use lockprobe::store::memory::{MemoryStore, MemoryStoreConfig};
use lockprobe::store::LocationStore;

/// Live heap bytes: allocations minus frees.
static LIVE: AtomicIsize = AtomicIsize::new(0);

struct Counting;

// SAFETY: every call is forwarded to the system allocator unchanged; only a counter
// is updated on the side.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        LIVE.fetch_add(layout.size() as isize, Ordering::Relaxed);
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE.fetch_sub(layout.size() as isize, Ordering::Relaxed);
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        LIVE.fetch_add(new_size as isize - layout.size() as isize, Ordering::Relaxed);
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

const S: Duration = Duration::from_secs(1);

/// CPU time this thread has used: unlike wall time, not stretched by other processes
/// taking turns on the cores (CI shares the machine).
fn thread_cpu() -> Duration {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: `ts` is a valid, writable timespec for the call's duration.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

fn main() {
    // `cargo bench` passes `--bench`; `cargo test --all-targets` does not, and then a
    // small run checks the bench still works without costing the suite 200 MB.
    let args: Vec<String> = std::env::args().skip(1).collect();
    let benching = args.iter().any(|a| a == "--bench");
    let default = if benching { 1_000_000 } else { 10_000 };
    let n: usize = args.iter().find(|a| !a.starts_with('-')).map(|a| a.parse().expect("a count")).unwrap_or(default);
    let clock = Arc::new(ManualClock::at_epoch());
    let store: Arc<dyn LocationStore> = Arc::new(MemoryStore::new(clock.clone(), MemoryStoreConfig::default()));
    let registry = prometheus::Registry::new();
    let dyn_clock: Arc<dyn Clock> = clock.clone();
    let monitor = Monitor::new(store, dyn_clock, MonitorConfig::default(), &registry).unwrap();

    let policy = LockPolicy::new(3600 * S, 48 * 3600 * S);
    let req = PreLockRequest {
        owner: "orchestrator-7".into(),
        duration: 48 * 3600 * S,
        target_location: Some("northeurope".into()),
    };
    let t0 = clock.now();
    let later = t0 + chrono::TimeDelta::hours(2);
    let token = LockToken::generate();

    let before = LIVE.load(Ordering::Relaxed);
    let started = Instant::now();
    let cpu_started = thread_cpu();
    // The monitor's share of the ingest, apart from building the documents.
    let mut observing = Duration::ZERO;
    let mut observe = |doc: &LocationDocument, at| {
        let t = Instant::now();
        monitor.observe(doc, at, Seen::Stream);
        observing += t.elapsed();
    };
    for i in 0..n {
        let id = format!("{:08x}-0000-4000-8000-{:012x}", i, i.wrapping_mul(2654435761));
        let doc = LocationDocument::new(id, "westeurope");
        // One token for all: generating a million is not what is measured, and the
        // monitor keeps only a hash of it either way.
        let mut doc = lifecycle::pre_lock(&doc, &req, token.clone(), &policy, t0).unwrap();
        observe(&doc, t0);
        let phase = match i % 3 {
            0 => None,
            1 => Some(Phase::HardDelete),
            _ => Some(Phase::Write),
        };
        if let Some(phase) = phase {
            doc = lifecycle::escalate(&doc, &token, Phase::HardDelete, 6 * 3600 * S, &policy, later).unwrap();
            if phase == Phase::Write {
                doc = lifecycle::escalate(&doc, &token, Phase::Write, 300 * S, &policy, later).unwrap();
            }
            observe(&doc, later);
        }
    }
    let elapsed = started.elapsed();
    let cpu = thread_cpu() - cpu_started;
    let retained = LIVE.load(Ordering::Relaxed) - before;
    assert_eq!(monitor.in_flight(), n, "every migration is tracked");
    let mib = retained as f64 / (1024.0 * 1024.0);
    let own = monitor.retained().bytes;
    println!(
        "monitor_memory: {n} in-flight migrations retain {retained} bytes ({mib:.1} MiB), {:.1} bytes per migration \
         (the monitor's own count: {own}); ingest took {elapsed:.1?} ({cpu:.1?} of CPU), {observing:.1?} of it in Monitor::observe",
        retained as f64 / n as f64
    );
}
