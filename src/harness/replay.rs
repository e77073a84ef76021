//! A day of migrations replayed in compressed time: the paper's scale (6-10 million a
//! day) through the routing library and the convergence monitor, on the memory store.
//!
//! Every lock call goes through [`RoutingClient`] as the reference service makes it
//! (pre-lock under an idempotency key, hardDelete, write, `prepare_swap` then the swap
//! under a key, or a release), user reads resolve through another instance's cache,
//! and the [`Monitor`] follows the store's own change stream, sweeping as it goes. Time
//! is a [`ManualClock`] the drivers move tick by tick, each tick a fraction of a virtual
//! second, so a day passes as fast as the code runs; the drivers (threads, each its own
//! share of the migrations, as orchestrators work side by side) make every step falling
//! due in a tick, then meet before the clock moves on. The monitor's polls are made by
//! the drivers themselves, a batch every few steps and while one waits for the others
//! at a tick's end: on two cores a thread of its own would be a third taking turns with
//! them. The monitor is the same code either way, and never further behind than
//! [`ReplayConfig::max_monitor_lag`].
//! A migration's document is retired from the store once it ends, and the monitor
//! forgets ended migrations on its sweeps, so memory follows the migrations in flight
//! rather than the day's total.
//! The size of every version the lock calls write is counted by lock phase
//! (`super::sizes`; [`ReplayConfig::document_sizes`]), for contract 1.3's budget.
//!
//! `examples/replay.rs` runs it from the command line (BENCHMARKS.md has the figures);
//! `tests/replay_day.rs` runs a small day in the suite. No command of its own.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::fmt::Write as _;
use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicUsize, Ordering};
use std::sync::{Arc, Barrier, Mutex};
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};

use super::sizes::{DocumentSizes, SizeTable};
use crate::clock::{Clock, ManualClock};
use crate::monitor::{Monitor, MonitorConfig, MonitorError, Outcome};
use crate::routing::cache::TieredCache;
use crate::routing::{ClientOptions, LockPolicy, LockToken, Phase, PreLockRequest, RoutingClient, RoutingError};
use crate::store::counting::{CountingStore, OpCounts};
use crate::store::memory::{MemoryStore, MemoryStoreConfig};

/// The shape of the replayed day. Durations are virtual (the manual clock's).
#[derive(Debug, Clone)]
pub struct ReplayConfig {
    /// Migrations started over the day.
    pub migrations: u64,
    /// The span over which migrations start, evenly spaced.
    pub day: Duration,
    /// Service instances, each a `RoutingClient` with its own cache; lock calls and
    /// user reads of one migration go to different instances.
    pub instances: usize,
    /// Threads making the migrations' steps, each its own share of the migrations, as
    /// many orchestrators work side by side; they also make the monitor's polls.
    pub drivers: usize,
    /// Cache TTL of every instance (one tier).
    pub cache_ttl: Duration,
    /// The replication bound declared with the TTL (convergence delay = TTL + this).
    pub replication_bound: Duration,
    /// The orchestrator's wait past effectiveAt before hardDelete.
    pub escalation_buffer: Duration,
    /// How long hardDelete is held before the write lock.
    pub hard_delete_hold: Duration,
    /// How long the write lock is held (the data copy) before the swap.
    pub copy_hold: Duration,
    /// Every n-th migration is released instead of swapped (0: none).
    pub release_every: u64,
    /// Most changes the monitor may be behind before the driver waits for it; the
    /// store's change log holds twice this, so none is ever dropped unread.
    pub max_monitor_lag: usize,
    /// Count the size of every version the lock calls write, by lock phase (off: to
    /// measure what counting costs).
    pub document_sizes: bool,
}

impl Default for ReplayConfig {
    fn default() -> Self {
        Self {
            migrations: 10_000_000,
            day: Duration::from_secs(86_400),
            instances: 2,
            drivers: 2,
            cache_ttl: Duration::from_secs(30),
            replication_bound: Duration::from_secs(30),
            escalation_buffer: Duration::from_secs(10),
            hard_delete_hold: Duration::from_secs(30),
            copy_hold: Duration::from_secs(60),
            release_every: 100,
            // Small: a long log of retained documents only churns the allocator.
            max_monitor_lag: 4_096,
            document_sizes: true,
        }
    }
}

/// What a replay did and what the monitor made of it.
#[derive(Debug, Clone, Default)]
pub struct ReplayReport {
    /// Migrations started.
    pub migrations: u64,
    /// Lock calls made through the routing client (prepare_swap counted).
    pub lock_calls: u64,
    /// User reads resolved through an instance's cache.
    pub resolves: u64,
    /// Routing calls that failed, and the first few failures.
    pub failures: u64,
    /// The first failures, for the report.
    pub first_failures: Vec<String>,
    /// Store calls, by kind.
    pub store: OpCounts,
    /// Changes the monitor applied from the stream.
    pub changes: u64,
    /// The monitor's outcomes.
    pub swapped: u64,
    /// Released migrations.
    pub released: u64,
    /// Lapsed migrations.
    pub lapsed: u64,
    /// Anomalies the monitor counted.
    pub early_escalations: u64,
    /// Partial cutovers counted.
    pub partial_cutovers: u64,
    /// Orphaned locks at the end.
    pub orphaned_locks: usize,
    /// Migrations the monitor still saw in flight at the end.
    pub in_flight_at_end: usize,
    /// Most migrations in flight at once (the monitor's count, sampled at each sweep).
    pub peak_in_flight: usize,
    /// Most timelines the monitor held at once (in flight plus recently ended).
    pub peak_timelines: usize,
    /// The monitor's own estimate of its heap at that peak.
    pub peak_monitor_bytes: usize,
    /// Most documents the store held at once.
    pub peak_documents: usize,
    /// Wall time of the whole replay.
    pub wall: Duration,
    /// Virtual time the replay covered.
    pub virtual_span: Duration,
    /// Sizes of the versions the lock calls wrote, by lock phase (empty when
    /// [`ReplayConfig::document_sizes`] is off).
    pub document_sizes: SizeTable,
}

impl ReplayReport {
    /// Changes applied by the monitor per wall second.
    pub fn events_per_second(&self) -> f64 {
        self.changes as f64 / self.wall.as_secs_f64().max(1e-9)
    }
}

/// The steps of one migration, in order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Step {
    PreLock,
    HardDelete,
    Write,
    End,
}

/// Runs a replay: the drivers on threads of their own (`config.drivers`), making the
/// monitor's polls between their steps; the end drained on the current runtime.
pub async fn run(config: ReplayConfig) -> Result<ReplayReport, MonitorError> {
    let clock = Arc::new(ManualClock::at_epoch());
    let dyn_clock: Arc<dyn Clock> = clock.clone();
    let store = Arc::new(MemoryStore::new(
        dyn_clock.clone(),
        MemoryStoreConfig { replica_lag: Duration::ZERO, change_log_capacity: config.max_monitor_lag * 2 },
    ));
    let policy = LockPolicy::declared(config.cache_ttl, config.replication_bound, Duration::from_secs(3600));
    let monitor_config = MonitorConfig {
        // Small: a poll is made between two steps, and holds that driver's next one up.
        poll_batch: MONITOR_BATCH,
        declared_delay: Some(policy.convergence_delay),
        escalation_buffer: config.escalation_buffer,
        ..MonitorConfig::default()
    };
    let registry = prometheus::Registry::new();
    // The calls the day makes, counted by the one counting wrapper (the memory store
    // itself only stores).
    let counted = Arc::new(CountingStore::new(store.clone()));
    let monitor = Arc::new(Monitor::new(counted.clone(), dyn_clock.clone(), monitor_config, &registry)?);
    // Every version the lock calls write, handed over by the clients as written: a
    // store wrapper in front of them would add a boxed call to every read as well.
    let sizes = Arc::new(DocumentSizes::new());
    let clients: Vec<RoutingClient> = (0..config.instances.max(1))
        .map(|_| {
            let client = RoutingClient::new(
                counted.clone(),
                dyn_clock.clone(),
                TieredCache::try_new(&[config.cache_ttl]).expect("one tier"),
                policy.clone(),
                ClientOptions::default(),
            );
            if !config.document_sizes {
                return client;
            }
            let sizes = sizes.clone();
            client.with_commit_observer(Arc::new(move |doc| sizes.record(doc)))
        })
        .collect();

    let started = Instant::now();
    let (mut report, followed) = drive(&config, &clock, &store, &monitor, clients).await;
    if let Some(failure) = followed.failure {
        return Err(failure);
    }

    // Past every lease and the lapse grace: a lock still standing now is an orphan.
    clock.advance(Duration::from_secs(3600) + monitor.config().lapse_grace);
    let rest = monitor.drain().await?;
    monitor.sweep();
    report.wall = started.elapsed();
    report.virtual_span = crate::clock::span(ManualClock::at_epoch().now(), clock.now());
    report.store = counted.calls();
    report.changes = followed.applied + rest as u64;
    report.swapped = monitor.outcomes(Outcome::Swapped);
    report.released = monitor.outcomes(Outcome::Released);
    report.lapsed = monitor.outcomes(Outcome::Lapsed);
    report.early_escalations = monitor.early_escalations();
    report.partial_cutovers = monitor.partial_cutovers();
    report.orphaned_locks = monitor.orphaned_locks();
    report.in_flight_at_end = monitor.in_flight();
    (report.peak_in_flight, report.peak_timelines, report.peak_monitor_bytes) = followed.peaks;
    if config.document_sizes {
        report.document_sizes = sizes.table();
    }
    Ok(report)
}

/// How many steps a driver makes between two polls of the monitor.
const POLL_EVERY: u32 = 16;

/// Changes per monitor poll: about what the drivers write between two polls, so the
/// monitor keeps pace with a poll every [`POLL_EVERY`] steps of either driver.
const MONITOR_BATCH: usize = 128;

/// How many migration starts one tick of virtual time holds, at most: enough work per
/// tick that the drivers' meeting at its end costs next to nothing, few enough that a
/// step runs close to its time.
const STARTS_PER_TICK: u64 = 128;

/// The longest tick: no step runs more than this after its time.
const MAX_TICK: Duration = Duration::from_secs(1);

/// What the drivers share: the world they drive and the tick they are in.
struct Drivers {
    config: ReplayConfig,
    /// Virtual time zero.
    origin: DateTime<Utc>,
    /// Virtual nanoseconds between two migrations' starts.
    spacing_ns: i64,
    /// Virtual nanoseconds per tick.
    tick_ns: i64,
    clock: Arc<ManualClock>,
    store: Arc<MemoryStore>,
    clients: Vec<RoutingClient>,
    monitor: Arc<Monitor>,
    /// Whether a driver is polling the monitor now: another one does not queue behind it.
    polling: AtomicBool,
    /// What the drivers' polls made of the stream.
    followed: Mutex<Followed>,
    /// Where the drivers meet between ticks.
    barrier: Barrier,
    /// How many drivers have reached the meeting after this tick.
    arrived: AtomicUsize,
    /// Each driver's next step (virtual nanoseconds from the origin), `i64::MAX` once
    /// it has none left.
    next_at: Vec<AtomicI64>,
    /// The end of the tick being run, `i64::MAX` once every driver is done. Written by
    /// the barrier's leader only, between the two meetings.
    tick_end: AtomicI64,
    /// Virtual time of the next cache eviction (leader only).
    next_eviction: AtomicI64,
    /// Virtual time of the monitor's next sweep (leader only).
    next_sweep: AtomicI64,
    /// Whether this tick begins with the caches' eviction, which the drivers share out.
    evict: AtomicBool,
    /// Most documents the store held at once, sampled between ticks.
    peak_documents: AtomicUsize,
}

/// What the monitor made of the stream while the drivers ran.
#[derive(Debug, Default)]
struct Followed {
    /// Changes applied.
    applied: u64,
    /// Most in flight, timelines and the monitor's bytes at that peak, sampled at sweeps.
    peaks: (usize, usize, usize),
    /// The first poll that failed: the drivers stop polling and the replay fails.
    failure: Option<MonitorError>,
}

/// The orchestrators' and users' side: every migration's steps, on `config.drivers`
/// threads of their own, with the monitor's polls in between.
///
/// Virtual time moves in ticks. Between ticks the drivers meet; the last to arrive
/// sets the clock to the next tick's end and lets the monitor catch up and sweep when
/// due; then every driver evicts its share of the caches when that is due and makes,
/// in order, the steps of its own migrations (migration `m` belongs to driver
/// `m % drivers`) that fall due by the tick's end. A step's successor is scheduled from
/// when the step was made, as an orchestrator waits from when it heard back, so a step
/// made late by part of a tick never shortens the wait the lock rules count on.
async fn drive(
    config: &ReplayConfig,
    clock: &Arc<ManualClock>,
    store: &Arc<MemoryStore>,
    monitor: &Arc<Monitor>,
    clients: Vec<RoutingClient>,
) -> (ReplayReport, Followed) {
    let n = config.drivers.max(1);
    let spacing_ns = (config.day.as_nanos() / u128::from(config.migrations.max(1))) as i64;
    // A tick writes about four changes per start: at most half the allowed monitor lag,
    // so with the lag reached before it the log (twice that lag) still drops nothing.
    let starts_per_tick = STARTS_PER_TICK.min(config.max_monitor_lag as u64 / 8).max(1) as i64;
    let shared = Arc::new(Drivers {
        origin: clock.now(),
        spacing_ns,
        tick_ns: spacing_ns.saturating_mul(starts_per_tick).clamp(1, MAX_TICK.as_nanos() as i64),
        config: config.clone(),
        clock: clock.clone(),
        store: store.clone(),
        clients,
        monitor: monitor.clone(),
        polling: AtomicBool::new(false),
        followed: Mutex::new(Followed::default()),
        barrier: Barrier::new(n),
        arrived: AtomicUsize::new(0),
        next_at: (0..n).map(|_| AtomicI64::new(i64::MAX)).collect(),
        tick_end: AtomicI64::new(0),
        next_eviction: AtomicI64::new(config.cache_ttl.as_nanos() as i64),
        next_sweep: AtomicI64::new(monitor.config().sweep_interval.as_nanos() as i64),
        evict: AtomicBool::new(false),
        peak_documents: AtomicUsize::new(0),
    });
    let threads: Vec<_> = (0..n)
        .map(|d| {
            let shared = shared.clone();
            tokio::task::spawn_blocking(move || {
                // A runtime of its own: the store and clients are ready at once, and the
                // driver blocks on the barrier without holding up anybody's tasks.
                let runtime =
                    tokio::runtime::Builder::new_current_thread().enable_all().build().expect("a tokio runtime");
                let driven = std::panic::catch_unwind(AssertUnwindSafe(|| runtime.block_on(drive_own(&shared, d))));
                if driven.is_err() {
                    // Keep meeting the others, with nothing left to do, until they are
                    // done: a driver missing from the barrier would hold them forever.
                    while runtime.block_on(shared.meet(d, i64::MAX)) != i64::MAX {}
                }
                driven
            })
        })
        .collect();
    let mut report = ReplayReport { migrations: config.migrations, ..ReplayReport::default() };
    for thread in threads {
        let part = match thread.await.expect("a replay driver thread is not cancelled") {
            Ok(part) => part,
            Err(panic) => std::panic::resume_unwind(panic),
        };
        report.lock_calls += part.lock_calls;
        report.resolves += part.resolves;
        report.failures += part.failures;
        let room = 10usize.saturating_sub(report.first_failures.len());
        report.first_failures.extend(part.first_failures.into_iter().take(room));
    }
    report.peak_documents = shared.peak_documents.load(Ordering::Acquire);
    let followed = std::mem::take(&mut *shared.lock_followed());
    (report, followed)
}

/// Driver `d`'s side of [`drive`]: its migrations' steps, tick by tick.
async fn drive_own(shared: &Drivers, d: usize) -> ReplayReport {
    let config = &shared.config;
    let n = shared.next_at.len() as u64;
    let spacing_ns = shared.spacing_ns;
    let delay = shared.clients[0].policy().convergence_delay + shared.clients[0].policy().skew_margin;
    let offsets = |step: Step| -> Duration {
        let hard_delete = delay + config.escalation_buffer;
        match step {
            Step::PreLock => Duration::ZERO,
            Step::HardDelete => hard_delete,
            Step::Write => hard_delete + config.hard_delete_hold,
            Step::End => hard_delete + config.hard_delete_hold + config.copy_hold,
        }
    };
    let lease = Duration::from_secs(600);
    let mut report = ReplayReport::default();
    let mut pending: BinaryHeap<Reverse<(i64, u64, Step)>> = BinaryHeap::new();
    let mut tokens: HashMap<u64, LockToken> = HashMap::new();
    let mut next_start = d as u64;
    let mut id = String::new();
    let mut since_poll = 0u32;
    // When this driver's next step falls due, and whether it is a migration's start (a
    // queued step goes first when both fall at the same instant).
    let next_due = |pending: &BinaryHeap<Reverse<(i64, u64, Step)>>, next_start: u64| -> Option<(i64, bool)> {
        let start_at = (next_start < config.migrations).then(|| next_start as i64 * spacing_ns);
        match (start_at, pending.peek().map(|Reverse((at, _, _))| *at)) {
            (Some(s), Some(q)) if s < q => Some((s, true)),
            (_, Some(q)) => Some((q, false)),
            (Some(s), None) => Some((s, true)),
            (None, None) => None,
        }
    };
    loop {
        let due = next_due(&pending, next_start).map_or(i64::MAX, |(at, _)| at);
        let end = shared.meet(d, due).await;
        if end == i64::MAX {
            return report;
        }
        if shared.evict.load(Ordering::Acquire) {
            // Each driver its share of the instances, side by side rather than while
            // the others wait (the caches take concurrent use).
            shared.clients.iter().skip(d).step_by(n as usize).for_each(RoutingClient::evict_expired);
        }
        while let Some((_, starts)) = next_due(&pending, next_start).filter(|(at, _)| *at <= end) {
            let (m, step) = if starts {
                next_start += n;
                (next_start - n, Step::PreLock)
            } else {
                let Some(Reverse((_, m, step))) = pending.pop() else { break };
                (m, step)
            };
            id.clear();
            write!(id, "resource-{m:010}").expect("writing to a String cannot fail");
            let clients = &shared.clients;
            let (orchestrator, user) =
                (&clients[m as usize % clients.len()], &clients[(m as usize + 1) % clients.len()]);
            let outcome =
                migration_step(config, orchestrator, user, &id, m, step, lease, &mut tokens, &mut report).await;
            match outcome {
                Ok(Some(next)) => {
                    let wait = (offsets(next) - offsets(step)).as_nanos() as i64;
                    pending.push(Reverse((end.saturating_add(wait), m, next)));
                }
                Ok(None) => {
                    shared.store.retire(&id);
                }
                Err(e) => {
                    report.failures += 1;
                    if report.first_failures.len() < 10 {
                        report.first_failures.push(format!("{id} at {step:?}: {e}"));
                    }
                    tokens.remove(&m);
                    shared.store.retire(&id);
                }
            }
            since_poll += 1;
            if since_poll == POLL_EVERY {
                since_poll = 0;
                shared.poll_monitor().await;
            }
        }
    }
}

impl Drivers {
    /// Driver `d` meets the others between ticks, its next step due at `due`; returns
    /// the end of the tick to run, `i64::MAX` once no driver has a step left. A driver
    /// that arrives before the others polls the monitor while it waits.
    async fn meet(&self, d: usize, due: i64) -> i64 {
        self.next_at[d].store(due, Ordering::Release);
        let drivers = self.next_at.len();
        if self.arrived.fetch_add(1, Ordering::AcqRel) + 1 < drivers {
            while self.arrived.load(Ordering::Acquire) < drivers && self.poll_monitor().await > 0 {}
        }
        if self.barrier.wait().is_leader() {
            self.arrived.store(0, Ordering::Release);
            self.plan_tick().await;
        }
        self.barrier.wait();
        self.tick_end.load(Ordering::Acquire)
    }

    /// The leader's work between ticks: the next tick's end (the earliest due step,
    /// rounded up to a whole tick), the clock set to it, whether the caches' eviction
    /// is due, the monitor brought within the allowed lag, and its sweep when due.
    async fn plan_tick(&self) {
        let tick_ns = self.tick_ns;
        let due = self.next_at.iter().map(|a| a.load(Ordering::Acquire)).min().unwrap_or(i64::MAX);
        if due == i64::MAX {
            self.tick_end.store(i64::MAX, Ordering::Release);
            return;
        }
        let end =
            due.div_euclid(tick_ns).saturating_add(i64::from(due.rem_euclid(tick_ns) != 0)).saturating_mul(tick_ns);
        self.clock.set(self.origin + chrono::TimeDelta::nanoseconds(end));
        self.evict.store(falls_due(&self.next_eviction, end, self.config.cache_ttl), Ordering::Release);
        // Each tick writes far fewer changes than the log's slack (the log holds twice
        // the allowed lag), so none is dropped unread.
        while self.store.changes_logged().saturating_sub(self.lock_followed().applied)
            > self.config.max_monitor_lag as u64
        {
            if self.poll_monitor().await == 0 {
                break;
            }
        }
        if falls_due(&self.next_sweep, end, self.monitor.config().sweep_interval) {
            self.sweep_monitor();
        }
        self.peak_documents.fetch_max(self.store.len(), Ordering::AcqRel);
        self.tick_end.store(end, Ordering::Release);
    }

    /// Applies one batch of the change stream, unless another driver is polling or a
    /// poll has failed; returns how many changes it applied.
    async fn poll_monitor(&self) -> usize {
        if self.polling.swap(true, Ordering::AcqRel) {
            return 0;
        }
        let polled = if self.lock_followed().failure.is_some() { Ok(0) } else { self.monitor.poll_once().await };
        self.polling.store(false, Ordering::Release);
        let mut followed = self.lock_followed();
        match polled {
            Ok(n) => {
                followed.applied += n as u64;
                n
            }
            Err(e) => {
                followed.failure.get_or_insert(e);
                0
            }
        }
    }

    /// Ends the lapsed timelines, and samples the monitor's peaks.
    fn sweep_monitor(&self) {
        self.monitor.sweep();
        let retained = self.monitor.retained();
        let in_flight = self.monitor.in_flight();
        let mut followed = self.lock_followed();
        let peaks = &mut followed.peaks;
        peaks.0 = peaks.0.max(in_flight);
        if retained.timelines > peaks.1 {
            (peaks.1, peaks.2) = (retained.timelines, retained.bytes);
        }
    }

    /// What the polls made of the stream. A driver that panicked holding it left it
    /// whole (every update is one assignment), so its poison is not passed on.
    fn lock_followed(&self) -> std::sync::MutexGuard<'_, Followed> {
        self.followed.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// Whether something done every `every` of virtual time, next at `next`, falls due in
/// the tick ending at `end`; if so, the next time is `every` after this tick's end.
/// (Leader only: the drivers read neither between the meetings.)
fn falls_due(next: &AtomicI64, end: i64, every: Duration) -> bool {
    let due = end >= next.load(Ordering::Acquire);
    if due {
        next.store(end.saturating_add(every.as_nanos() as i64), Ordering::Release);
    }
    due
}

fn text(e: RoutingError) -> String {
    e.to_string()
}

/// Makes one step of migration `m`; returns the next step, or `None` once it ended.
#[allow(clippy::too_many_arguments)]
async fn migration_step(
    config: &ReplayConfig,
    orchestrator: &RoutingClient,
    user: &RoutingClient,
    id: &str,
    m: u64,
    step: Step,
    lease: Duration,
    tokens: &mut HashMap<u64, LockToken>,
    report: &mut ReplayReport,
) -> Result<Option<Step>, String> {
    let (home, target) =
        if m.is_multiple_of(2) { ("westeurope", "northeurope") } else { ("northeurope", "westeurope") };
    match step {
        Step::PreLock => {
            let req = PreLockRequest { owner: "replay".into(), duration: lease, target_location: Some(target.into()) };
            let key = format!("pre-{m}");
            report.lock_calls += 1;
            let grant = orchestrator.pre_lock_with_key(id, home, &req, Some(&key)).await.map_err(text)?;
            tokens.insert(m, grant.token);
            report.resolves += 1;
            user.resolve(id).await.map_err(text)?;
            Ok(Some(Step::HardDelete))
        }
        Step::HardDelete | Step::Write => {
            let phase = if step == Step::HardDelete { Phase::HardDelete } else { Phase::Write };
            let token = tokens.get(&m).expect("a started migration has its token");
            report.lock_calls += 1;
            orchestrator.escalate(id, token, phase, lease).await.map_err(text)?;
            Ok(Some(if step == Step::HardDelete { Step::Write } else { Step::End }))
        }
        Step::End => {
            let token = tokens.remove(&m).expect("a started migration has its token");
            let released = config.release_every > 0 && m.is_multiple_of(config.release_every);
            if released {
                report.lock_calls += 1;
                orchestrator.release(id, &token).await.map_err(text)?;
            } else {
                let key = format!("swap-{m}");
                report.lock_calls += 2;
                orchestrator.prepare_swap(id, &token, target, Some(&key)).await.map_err(text)?;
                orchestrator.swap_with_key(id, &token, target, Some(&key)).await.map_err(text)?;
            }
            report.resolves += 1;
            let routed = user.resolve(id).await.map_err(text)?;
            let expected = if released { home } else { target };
            if routed.location() != expected || routed.lock().is_some() {
                return Err(format!(
                    "after the migration the user instance routes to {} (lock: {}), not {expected} unlocked",
                    routed.location(),
                    routed.lock().is_some()
                ));
            }
            Ok(None)
        }
    }
}
