//! Cron scheduling of probe cycles per target: jitter, a per-target concurrency limit,
//! overlapping cycles on distinct pool resources, and counting of missed schedules.
//!
//! Replicas of `serve` with the same configuration share a target's pool without
//! meeting each other: the pool is cut into fixed groups of [`RESOURCES_PER_CYCLE`], and
//! a cycle first claims its group with a lock through the target's own contract
//! ([`CycleRunner::claim`]). A group another replica has claimed is skipped for the next
//! one; that is sharing the work, not a failure. The probe stays a black-box client: the
//! replicas never talk to each other or to the routing store.
//!
//! A target's settings can change while it runs ([`run_target_plans`], for a reload of
//! `serve`'s configuration): a cycle keeps the settings it started with, the next one
//! takes the new ones, and stopping a target's schedule ([`Stops::retire`]) lets its
//! cycles in flight finish instead of cancelling them.
//!
//! Time is read through [`WallClock`], which maps tokio's clock onto wall time, so the
//! scheduler is tested on a paused tokio clock without sleeping.

use std::collections::{HashSet, VecDeque};
use std::str::FromStr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use tokio::sync::watch;
use tokio::task::JoinSet;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use crate::probe::checks::report::CycleReport;
pub use crate::probe::checks::scenario::Claim;
use crate::probe::checks::settings::RESOURCES_PER_CYCLE;

/// Runs one cycle on the given resources (implemented by [`crate::probe::checks::scenario::Scenario`]).
#[async_trait]
pub trait CycleRunner: Send + Sync + 'static {
    /// Runs a cycle; must stop and release its locks when `cancel` fires.
    async fn run(&self, resources: Vec<String>, cancel: CancellationToken) -> CycleReport;

    /// Claims `group` for one cycle of at most `lease` against other replicas probing
    /// the same target. Without replicas to share with, nothing needs claiming.
    async fn claim(&self, _group: &[String], _lease: Duration) -> Claim {
        Claim::Unavailable
    }

    /// Gives a claim back.
    async fn unclaim(&self, _claim: Claim) {}

    /// Releases locks this target's cycles recorded and could not release (the
    /// target stops for good: no later cycle will retry); returns how many were cleared.
    async fn release_leftovers(&self) -> usize {
        0
    }
}

#[async_trait]
impl CycleRunner for crate::probe::checks::scenario::Scenario {
    async fn run(&self, resources: Vec<String>, cancel: CancellationToken) -> CycleReport {
        self.run_cycle(&resources, cancel).await
    }

    async fn claim(&self, group: &[String], lease: Duration) -> Claim {
        self.claim_group(group, lease).await
    }

    async fn unclaim(&self, claim: Claim) {
        self.release_claim(claim).await
    }

    async fn release_leftovers(&self) -> usize {
        self.recover().await
    }
}

/// Where finished cycles and missed schedules go (metrics, status).
pub trait CycleSink: Send + Sync + 'static {
    /// A cycle finished.
    fn cycle(&self, report: &CycleReport);
    /// `n` scheduled cycles of `target` did not start.
    fn missed(&self, target: &str, n: u64);
    /// A claim on a group of `target`'s pool gave `claim` (held, busy or unavailable).
    fn claimed(&self, _target: &str, _claim: &Claim) {}
    /// The scheduler woke for a firing of `target` this long after its time (jitter
    /// included): how far the process keeps up with its schedules.
    fn woke(&self, _target: &str, _lateness: Duration) {}
    /// A cycle of `target` found every slot of the process's [`CycleCap`] taken and
    /// waits for one.
    fn held_back(&self, _target: &str) {}
    /// A cycle of `target` began running this long after its firing time (jitter
    /// included): the scheduler's lateness, the wait for a slot of the cap and the wait
    /// for a thread of the runtime the cycles run on.
    fn started(&self, _target: &str, _delay: Duration) {}
    /// Cycles of the process now running (holding a slot of the cap).
    fn running(&self, _cycles: usize) {}
    /// Before each wait: where `target`'s schedule stands.
    fn scheduled(&self, _target: &str, _view: &ScheduleView) {}
}

/// Where a target's schedule stands, before each wait for its next firing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScheduleView {
    /// The cron expression, six fields.
    pub expression: String,
    /// The last firing acted on (a cycle started or counted as missed), if any yet.
    pub last: Option<DateTime<Utc>>,
    /// The next firing, jitter not included; `None` when the schedule has no more.
    pub next: Option<DateTime<Utc>>,
    /// The interval that ends at `next` (see [`interval_before`]).
    pub interval: Option<Duration>,
    /// A longer cycle is cancelled.
    pub timeout: Duration,
}

/// The time from the firing before `next` to `next`, by `schedule`: one interval of a
/// regular schedule, the current gap of an irregular one (`0 0 9,17 * * *` alternates 8 h
/// and 16 h). `None` when the schedule has no firing before `next`.
pub fn interval_before(schedule: &cron::Schedule, next: DateTime<Utc>) -> Option<Duration> {
    let previous = schedule.after(&next).next_back()?;
    (next - previous).to_std().ok()
}

/// Keyed lock calls a cycle leaves on its busiest resource, which a contract-1.3 service
/// keeps a record of for each key's window: the pre-lock, two escalations, a renewal and
/// the swap (the group's claim resource gets two: its pre-lock and release).
pub const RECORDS_PER_CYCLE: u32 = 5;
/// The records of keyed calls a contract-1.3 service keeps per document.
pub const SERVICE_KEYED_RECORDS: u32 = 256;
/// A contract-1.3 service's key window by default: its maximum pre-lock (48 h) and a
/// little more.
pub const DEFAULT_KEY_WINDOW: Duration = Duration::from_secs(48 * 3600);

/// How often one group of `target`'s pool is used within `window` from `from`, when one
/// replica runs every firing (firings counted up to 100,000): each use leaves
/// [`RECORDS_PER_CYCLE`] keyed records a service keeps for the window, at most
/// [`SERVICE_KEYED_RECORDS`] per resource.
pub fn uses_per_group(target: &TargetSchedule, from: DateTime<Utc>, window: Duration) -> Option<u64> {
    let groups = (target.pool.len() / RESOURCES_PER_CYCLE) as u64;
    if groups == 0 {
        return None;
    }
    let end = from + chrono::Duration::from_std(window).ok()?;
    let firings = target.schedule.after(&from).take(100_000).take_while(|t| *t <= end).count() as u64;
    Some(firings.div_ceil(groups))
}

/// The process's bound on cycles running at once, over all targets (`serve`'s
/// `max_concurrent_cycles`). A cycle that finds every slot taken waits for one, first
/// come first served, and is counted as held back; while it waits it counts against its
/// target's own `concurrency`, so the target's later firings are missed, not queued.
#[derive(Debug)]
pub struct CycleCap {
    slots: Arc<tokio::sync::Semaphore>,
    limit: usize,
}

impl CycleCap {
    /// At most `limit` cycles at once (at least one).
    pub fn new(limit: usize) -> Self {
        let limit = limit.clamp(1, tokio::sync::Semaphore::MAX_PERMITS);
        Self { slots: Arc::new(tokio::sync::Semaphore::new(limit)), limit }
    }

    /// The bound.
    pub fn limit(&self) -> usize {
        self.limit
    }

    /// Cycles holding a slot now.
    pub fn running(&self) -> usize {
        self.limit - self.slots.available_permits()
    }
}

/// Where a target's cycles run: the runtime that runs them (the scheduler's own when
/// `None`) and the process's cap on running cycles (none when `None`). `serve` runs the
/// schedules' timers on a thread of their own and the cycles on its main runtime, so
/// that cycle work cannot delay a wake-up.
#[derive(Debug, Clone, Default)]
pub struct CycleRoom {
    /// The runtime cycles are spawned on.
    pub runtime: Option<tokio::runtime::Handle>,
    /// The process's cap.
    pub cap: Option<Arc<CycleCap>>,
}

/// Parses a schedule: the standard 5-field cron (`minute hour day month weekday`, run at
/// second 0) or the 6/7-field form with seconds first (and an optional year) that the
/// `cron` crate reads. In the 5-field form the weekday must be named (`MON-FRI`), since
/// cron dialects number weekdays differently (0 or 1 for Sunday) and a silent shift by
/// one day is worse than a refusal. Errors say what was expected.
pub fn parse_schedule(expr: &str) -> Result<cron::Schedule, String> {
    let fields: Vec<&str> = expr.split_whitespace().collect();
    let full = match fields.len() {
        5 => {
            if fields[4].chars().any(|c| c.is_ascii_digit()) {
                return Err(format!(
                    "{expr:?}: name the weekdays in a 5-field cron ({:?} -> e.g. MON-FRI): cron dialects number them differently",
                    fields[4]
                ));
            }
            format!("0 {}", fields.join(" "))
        }
        6 | 7 => fields.join(" "),
        n => {
            return Err(format!(
                "{expr:?} has {n} fields; expected 5 (minute hour day month weekday) or 6 with seconds first (second minute hour day month weekday)"
            ))
        }
    };
    cron::Schedule::from_str(&full).map_err(|e| format!("invalid cron expression {expr:?}: {e}"))
}

/// Wall time derived from tokio's clock: `base_wall` at `base`, advancing with tokio time.
#[derive(Debug, Clone, Copy)]
pub struct WallClock {
    base_wall: DateTime<Utc>,
    base: Instant,
}

impl WallClock {
    /// Starts at the current system time.
    pub fn system() -> Self {
        Self::starting_at(Utc::now())
    }

    /// Starts at `wall` now (tests pick a fixed wall time).
    pub fn starting_at(wall: DateTime<Utc>) -> Self {
        Self { base_wall: wall, base: Instant::now() }
    }

    /// Current wall time.
    pub fn now(&self) -> DateTime<Utc> {
        self.base_wall + chrono::Duration::from_std(self.base.elapsed()).unwrap_or_default()
    }

    /// The tokio instant at which wall time reaches `t` (now if already past).
    pub fn instant_at(&self, t: DateTime<Utc>) -> Instant {
        let ahead = (t - self.now()).to_std().unwrap_or_default();
        Instant::now() + ahead
    }
}

/// How one target is scheduled.
#[derive(Debug, Clone)]
pub struct TargetSchedule {
    /// Target name.
    pub name: String,
    /// When cycles start.
    pub schedule: cron::Schedule,
    /// Up to this much random delay after each scheduled time.
    pub jitter: Duration,
    /// Cycles of this target that may run at once.
    pub concurrency: usize,
    /// A cycle running longer is cancelled (and releases its locks).
    pub timeout: Duration,
    /// Test resources cycles draw from.
    pub pool: Vec<String>,
}

/// The pool of test resources in fixed groups of [`RESOURCES_PER_CYCLE`], least recently
/// used first. Groups are fixed so that replicas with the same pool agree on them (and
/// on the resource that claims each). It knows the groups cycles hold, so a new layout
/// (a reloaded `pool_size` or `test_prefix`) never hands out a group a cycle still uses.
#[derive(Debug)]
struct Pool(Mutex<PoolState>);

#[derive(Debug, Default)]
struct PoolState {
    free: VecDeque<Vec<String>>,
    in_use: Vec<Vec<String>>,
    layout: HashSet<Vec<String>>,
}

fn groups(resources: &[String]) -> Vec<Vec<String>> {
    resources.chunks_exact(RESOURCES_PER_CYCLE).map(<[String]>::to_vec).collect()
}

impl Pool {
    fn new(resources: &[String]) -> Self {
        let groups = groups(resources);
        Self(Mutex::new(PoolState {
            layout: groups.iter().cloned().collect(),
            free: groups.into(),
            in_use: Vec::new(),
        }))
    }

    fn state(&self) -> std::sync::MutexGuard<'_, PoolState> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn take(&self) -> Option<Vec<String>> {
        let mut s = self.state();
        let group = s.free.pop_front()?;
        s.in_use.push(group.clone());
        Some(group)
    }

    fn free(&self) -> usize {
        self.state().free.len()
    }

    /// Returns a group a cycle took; a group the current layout no longer has is dropped.
    fn give_back(&self, group: Vec<String>) {
        let mut s = self.state();
        if let Some(i) = s.in_use.iter().position(|g| *g == group) {
            s.in_use.swap_remove(i);
        }
        if s.layout.contains(&group) {
            s.free.push_back(group);
        }
    }

    /// Cuts a new list of resources into groups: free groups it keeps stay in their
    /// order, new ones come last, groups in use come back when their cycle ends.
    fn reshape(&self, resources: &[String]) {
        let mut s = self.state();
        let groups = groups(resources);
        s.layout = groups.iter().cloned().collect();
        let layout = s.layout.clone();
        s.free.retain(|g| layout.contains(g));
        for g in groups {
            if !s.free.contains(&g) && !s.in_use.contains(&g) {
                s.free.push_back(g);
            }
        }
    }
}

/// How long a claim outlives its cycle's timeout: time to release the cycle's locks.
const CLAIM_SLACK: Duration = Duration::from_secs(60);

/// A free group this replica could claim, with its claim; `None` when every free group
/// is held by another replica (each group is tried once, in pool order).
async fn claim_a_group(
    pool: &Pool,
    runner: &dyn CycleRunner,
    sink: &dyn CycleSink,
    target: &str,
    lease: Duration,
) -> Option<(Vec<String>, Claim)> {
    for _ in 0..pool.free() {
        let group = pool.take()?;
        let claim = runner.claim(&group, lease).await;
        sink.claimed(target, &claim);
        if claim == Claim::Busy {
            tracing::info!(target_name = %target, resource = %group[0], "test resources held by another replica, trying the next ones");
            pool.give_back(group);
            continue;
        }
        return Some((group, claim));
    }
    None
}

/// What a target's cycles run with: its schedule and the runner holding its settings.
#[derive(Clone)]
pub struct TargetPlan {
    /// When and on what cycles run.
    pub schedule: TargetSchedule,
    /// Runs a cycle with the target's settings.
    pub runner: Arc<dyn CycleRunner>,
}

/// The two ways a target's schedule ends.
#[derive(Debug, Clone)]
pub struct Stops {
    /// No new cycles; cycles in flight finish with their settings (a target removed
    /// from the configuration).
    pub retire: CancellationToken,
    /// No new cycles, and cycles in flight are cancelled and release their locks (the
    /// process stops).
    pub shutdown: CancellationToken,
}

/// Runs a target on the latest of `plans` until one of `stops` fires, then waits for
/// the cycles in flight. A new plan applies from the next firing: the schedule is read
/// afresh from now, the pool takes the new layout, the concurrency limit the new value;
/// cycles already running keep the runner (settings) and timeout they started with.
/// When the schedule has no further firing times the target waits for a new plan.
/// Cycles run where `room` says, within its cap.
pub async fn run_target_plans(
    mut plans: watch::Receiver<TargetPlan>,
    sink: Arc<dyn CycleSink>,
    clock: WallClock,
    stops: Stops,
    room: CycleRoom,
) {
    let mut plan = plans.borrow_and_update().clone();
    let pool = Arc::new(Pool::new(&plan.schedule.pool));
    let mut plans_open = true;
    let mut running = JoinSet::new();
    let mut after = clock.now();
    let mut last_fire = None;
    loop {
        let target = &plan.schedule;
        let next = target.schedule.after(&after).next();
        sink.scheduled(
            &target.name,
            &ScheduleView {
                expression: target.schedule.to_string(),
                last: last_fire,
                next,
                interval: next.and_then(|n| interval_before(&target.schedule, n)),
                timeout: target.timeout,
            },
        );
        if next.is_none() && !plans_open {
            tracing::info!(target_name = %target.name, "schedule has no further firing times");
            break;
        }
        let jitter = if target.jitter.is_zero() {
            Duration::ZERO
        } else {
            Duration::from_millis(rand::random_range(0..=target.jitter.as_millis() as u64))
        };
        let wake = next.map(|fire| clock.instant_at(fire) + jitter);
        let woke = wait(wake, &mut plans, plans_open, &stops).await;
        match woke {
            Wake::Fire => {}
            Wake::Stop => break,
            Wake::Plan(false) => {
                plans_open = false;
                continue;
            }
            Wake::Plan(true) => {
                plan = plans.borrow_and_update().clone();
                pool.reshape(&plan.schedule.pool);
                after = clock.now();
                tracing::info!(target_name = %plan.schedule.name, "new settings apply from the next cycle");
                continue;
            }
        }
        let target = &plan.schedule;
        let (Some(fire), Some(wake)) = (next, wake) else { continue };
        last_fire = Some(fire);
        sink.woke(&target.name, Instant::now().saturating_duration_since(wake));
        // Reap finished cycles so the set does not grow over months of uptime.
        while running.try_join_next().is_some() {}

        // Firing times passed while we were not running (suspended host, overloaded
        // runtime) count as missed: they are not made up.
        let now = clock.now();
        let late = chrono::Duration::from_std(jitter).unwrap_or_default() + chrono::Duration::seconds(1);
        let skipped = skipped_fires(&target.schedule, fire, now, late);
        if !skipped.is_empty() {
            tracing::warn!(target_name = %target.name, skipped = skipped.len(), "woke up late, schedules missed");
            sink.missed(&target.name, skipped.len() as u64);
        }
        after = skipped.last().copied().unwrap_or(fire);

        // Cycles in flight count against the limit whatever settings they started with.
        if running.len() >= target.concurrency {
            tracing::warn!(target_name = %target.name, limit = target.concurrency, "concurrency limit reached, schedule missed");
            sink.missed(&target.name, 1);
            continue;
        }
        if pool.free() == 0 {
            tracing::warn!(target_name = %target.name, "no free test resources, schedule missed");
            sink.missed(&target.name, 1);
            continue;
        }
        let cycle = Cycle {
            runner: plan.runner.clone(),
            sink: sink.clone(),
            pool: pool.clone(),
            name: target.name.clone(),
            timeout: target.timeout,
            due: wake,
            cap: room.cap.clone(),
            retire: stops.retire.clone(),
            cancel: stops.shutdown.child_token(),
        };
        let span = tracing::info_span!("probe", target = %target.name);
        let cycle = cycle.run().instrument(span);
        match &room.runtime {
            Some(runtime) => running.spawn_on(cycle, runtime),
            None => running.spawn(cycle),
        };
    }
    while running.join_next().await.is_some() {}
}

/// Sleeps until `wake` (for ever when `None`), a new plan (while `plans_open`) or a stop.
async fn wait(wake: Option<Instant>, plans: &mut watch::Receiver<TargetPlan>, plans_open: bool, stops: &Stops) -> Wake {
    let sleep = async {
        match wake {
            Some(wake) => tokio::time::sleep_until(wake).await,
            None => std::future::pending().await,
        }
    };
    let changed = async {
        if plans_open {
            plans.changed().await.is_ok()
        } else {
            std::future::pending().await
        }
    };
    tokio::select! {
        _ = sleep => Wake::Fire,
        open = changed => Wake::Plan(open),
        _ = stops.retire.cancelled() => Wake::Stop,
        _ = stops.shutdown.cancelled() => Wake::Stop,
    }
}

/// Why the scheduler woke up.
enum Wake {
    Fire,
    /// A new plan (`true`), or no more plans will come (`false`).
    Plan(bool),
    Stop,
}

/// One cycle of a target, spawned when its firing came.
struct Cycle {
    runner: Arc<dyn CycleRunner>,
    sink: Arc<dyn CycleSink>,
    pool: Arc<Pool>,
    name: String,
    timeout: Duration,
    /// Its firing time plus jitter: when it should have begun.
    due: Instant,
    cap: Option<Arc<CycleCap>>,
    /// The target was removed: a cycle still waiting for a slot does not begin.
    retire: CancellationToken,
    /// The process stops (the timeout fires it too).
    cancel: CancellationToken,
}

impl Cycle {
    /// Takes a slot of the cap (waiting for one if need be), claims a group, runs on it
    /// until done or `timeout`, records, gives everything back.
    async fn run(self) {
        let Some(slot) = self.slot().await else { return };
        self.sink.started(&self.name, Instant::now().saturating_duration_since(self.due));
        self.show_running();
        self.claim_and_run().await;
        drop(slot);
        self.show_running();
    }

    fn show_running(&self) {
        if let Some(cap) = &self.cap {
            self.sink.running(cap.running());
        }
    }

    async fn claim_and_run(&self) {
        let (pool, runner, sink) = (self.pool.as_ref(), self.runner.as_ref(), self.sink.as_ref());
        let Some((resources, claim)) = claim_a_group(pool, runner, sink, &self.name, self.timeout + CLAIM_SLACK).await
        else {
            tracing::info!("every free group of test resources is held by another replica; this firing is theirs");
            return;
        };
        tracing::info!(resource = %resources[0], "cycle starting");
        let (timer_cancel, timeout) = (self.cancel.clone(), self.timeout);
        let timer = tokio::spawn(async move {
            tokio::time::sleep(timeout).await;
            timer_cancel.cancel();
        });
        let report = runner.run(resources.clone(), self.cancel.clone()).await;
        timer.abort();
        tracing::info!(result = report.result.as_str(), failed = report.failed_assertions(), "cycle finished");
        sink.cycle(&report);
        runner.unclaim(claim).await;
        pool.give_back(resources);
    }

    /// A slot of the cap (`Some(None)` without a cap); `None` when the target was
    /// removed or the process stops while the cycle waits for one.
    async fn slot(&self) -> Option<Option<tokio::sync::OwnedSemaphorePermit>> {
        let Some(cap) = &self.cap else { return Some(None) };
        if let Ok(slot) = cap.slots.clone().try_acquire_owned() {
            return Some(Some(slot));
        }
        tracing::warn!(limit = cap.limit, "every slot of max_concurrent_cycles is taken, the cycle waits for one");
        self.sink.held_back(&self.name);
        tokio::select! {
            slot = cap.slots.clone().acquire_owned() => slot.ok().map(Some),
            _ = self.retire.cancelled() => None,
            _ = self.cancel.cancelled() => None,
        }
    }
}

/// Firing times after `fire` that were already more than `late` in the past at `now`.
fn skipped_fires(
    schedule: &cron::Schedule,
    fire: DateTime<Utc>,
    now: DateTime<Utc>,
    late: chrono::Duration,
) -> Vec<DateTime<Utc>> {
    schedule.after(&fire).take_while(|t| *t + late <= now).collect()
}

#[cfg(test)]
mod tests {
    /// At 6-hourly a group of two is used 4 times in 48 h; at 1-minute 1,440 times,
    /// past the 51 uses that 256 records allow.
    #[test]
    fn uses_per_group_counts_firings_over_groups() {
        let at = DateTime::parse_from_rfc3339("2026-12-04T00:30:00Z").unwrap().to_utc();
        let target = |cron: &str, pool: usize| TargetSchedule {
            name: "t".into(),
            schedule: parse_schedule(cron).unwrap(),
            jitter: Duration::ZERO,
            concurrency: 2,
            timeout: Duration::from_secs(60),
            pool: (1..=pool).map(|i| format!("probe-{i:04}")).collect(),
        };
        assert_eq!(uses_per_group(&target("0 0 */6 * * *", 14), at, DEFAULT_KEY_WINDOW), Some(4));
        assert_eq!(uses_per_group(&target("0 * * * * *", 14), at, DEFAULT_KEY_WINDOW), Some(1440));
        assert_eq!(uses_per_group(&target("0 * * * * *", 6), at, DEFAULT_KEY_WINDOW), None);
        let budget = u64::from(SERVICE_KEYED_RECORDS / RECORDS_PER_CYCLE);
        assert_eq!(budget, 51);
    }

    /// A regular schedule's interval, and an irregular one's current gap.
    #[test]
    fn the_interval_is_the_gap_that_ends_at_the_next_firing() {
        let at = |s: &str| DateTime::parse_from_rfc3339(s).unwrap().to_utc();
        let six_hourly = parse_schedule("0 0 */6 * * *").unwrap();
        assert_eq!(interval_before(&six_hourly, at("2026-12-04T18:00:00Z")), Some(Duration::from_secs(6 * 3600)));
        let twice_a_day = parse_schedule("0 0 9,17 * * *").unwrap();
        assert_eq!(interval_before(&twice_a_day, at("2026-12-04T17:00:00Z")), Some(Duration::from_secs(8 * 3600)));
        assert_eq!(interval_before(&twice_a_day, at("2026-12-05T09:00:00Z")), Some(Duration::from_secs(16 * 3600)));
        let every_minute = parse_schedule("* * * * *").unwrap();
        assert_eq!(interval_before(&every_minute, at("2026-12-04T18:01:00Z")), Some(Duration::from_secs(60)));
    }

    use super::*;
    use crate::probe::checks::report::CycleResult;
    use chrono::TimeZone;
    use std::str::FromStr;

    /// Runs `target`'s schedule on settings that never change (the runtime always runs
    /// [`run_target_plans`], for reloads) until `cancel` fires, then waits for running
    /// cycles (which are cancelled too and release their locks).
    async fn run_target(
        target: TargetSchedule,
        runner: Arc<dyn CycleRunner>,
        sink: Arc<dyn CycleSink>,
        clock: WallClock,
        cancel: CancellationToken,
    ) {
        // No sender: the settings never change.
        let (_, plans) = watch::channel(TargetPlan { schedule: target, runner });
        let stops = Stops { retire: cancel.clone(), shutdown: cancel };
        run_target_plans(plans, sink, clock, stops, CycleRoom::default()).await;
    }

    /// Records start times and resources; each cycle takes `length` of tokio time.
    struct FakeRunner {
        clock: WallClock,
        length: Duration,
        starts: Mutex<Vec<(DateTime<Utc>, Vec<String>)>>,
        cancelled: Mutex<usize>,
        /// Groups (by first resource) another replica holds; `None`: claims unavailable.
        busy: Option<Vec<String>>,
        unclaimed: Mutex<Vec<Claim>>,
    }

    impl FakeRunner {
        /// A passed cycle on `resources` that started and finished at `started_at`.
        fn report(resources: &[String], started_at: DateTime<Utc>) -> CycleReport {
            CycleReport {
                target: "t".into(),
                resource: resources[0].clone(),
                started_at,
                finished_at: started_at,
                result: CycleResult::Passed,
                error: None,
                assertions: vec![],
                phase_durations: vec![],
                read_through_seconds: vec![],
                read_through_client_seconds: vec![],
                declared_convergence_seconds: None,
                expected_convergence_seconds: None,
                observed_convergence: vec![],
                notes: Vec::new(),
                store_region_changes: Vec::new(),
                declared_versions: Vec::new(),
                walk: Default::default(),
                decisions: Vec::new(),
            }
        }
    }

    #[async_trait]
    impl CycleRunner for FakeRunner {
        async fn run(&self, resources: Vec<String>, cancel: CancellationToken) -> CycleReport {
            let started_at = self.clock.now();
            self.starts.lock().unwrap().push((started_at, resources.clone()));
            tokio::select! {
                _ = tokio::time::sleep(self.length) => {}
                _ = cancel.cancelled() => *self.cancelled.lock().unwrap() += 1,
            }
            CycleReport { finished_at: self.clock.now(), ..FakeRunner::report(&resources, started_at) }
        }

        async fn claim(&self, group: &[String], _lease: Duration) -> Claim {
            match &self.busy {
                None => Claim::Unavailable,
                Some(busy) if busy.contains(&group[0]) => Claim::Busy,
                Some(_) => Claim::Held { resource: format!("{}-claim", group[0]), token: "t".into() },
            }
        }

        async fn unclaim(&self, claim: Claim) {
            self.unclaimed.lock().unwrap().push(claim);
        }
    }

    #[derive(Default)]
    struct Sink {
        cycles: Mutex<usize>,
        missed: Mutex<u64>,
        woke: Mutex<Vec<Duration>>,
        started: Mutex<Vec<Duration>>,
        held_back: Mutex<usize>,
    }

    impl CycleSink for Sink {
        fn cycle(&self, _: &CycleReport) {
            *self.cycles.lock().unwrap() += 1;
        }
        fn missed(&self, _: &str, n: u64) {
            *self.missed.lock().unwrap() += n;
        }
        fn woke(&self, _: &str, lateness: Duration) {
            self.woke.lock().unwrap().push(lateness);
        }
        fn started(&self, _: &str, delay: Duration) {
            self.started.lock().unwrap().push(delay);
        }
        fn held_back(&self, _: &str) {
            *self.held_back.lock().unwrap() += 1;
        }
    }

    struct Run {
        runner: Arc<FakeRunner>,
        sink: Arc<Sink>,
        base: DateTime<Utc>,
    }

    /// Runs a schedule every 10 s from 00:00:03 for `for_secs` of paused tokio time.
    async fn run(length: u64, concurrency: usize, pool: usize, jitter: u64, timeout: u64, for_secs: u64) -> Run {
        run_beside(None, length, concurrency, pool, jitter, timeout, for_secs).await
    }

    /// Like [`run`], beside other replicas holding the groups that start with `busy`.
    async fn run_beside(
        busy: Option<Vec<String>>,
        length: u64,
        concurrency: usize,
        pool: usize,
        jitter: u64,
        timeout: u64,
        for_secs: u64,
    ) -> Run {
        let base = Utc.with_ymd_and_hms(2026, 1, 1, 0, 0, 3).unwrap();
        let clock = WallClock::starting_at(base);
        let runner = Arc::new(FakeRunner {
            clock,
            length: Duration::from_secs(length),
            starts: Mutex::new(vec![]),
            cancelled: Mutex::new(0),
            busy,
            unclaimed: Mutex::new(vec![]),
        });
        let sink = Arc::new(Sink::default());
        let target = TargetSchedule {
            name: "t".into(),
            schedule: cron::Schedule::from_str("*/10 * * * * *").unwrap(),
            jitter: Duration::from_secs(jitter),
            concurrency,
            timeout: Duration::from_secs(timeout),
            pool: (1..=pool).map(|i| format!("probe-{i:04}")).collect(),
        };
        let cancel = CancellationToken::new();
        let task = tokio::spawn(run_target(target, runner.clone(), sink.clone(), clock, cancel.clone()));
        tokio::time::sleep(Duration::from_secs(for_secs)).await;
        cancel.cancel();
        task.await.unwrap();
        Run { runner, sink, base }
    }

    fn offsets(r: &Run) -> Vec<i64> {
        r.runner.starts.lock().unwrap().iter().map(|(t, _)| (*t - r.base).num_seconds()).collect()
    }

    #[tokio::test(start_paused = true)]
    async fn fires_at_cron_times() {
        let r = run(1, 1, 7, 0, 60, 35).await;
        // 00:00:10, :20, :30 are 7, 17 and 27 s after the 00:00:03 start.
        assert_eq!(offsets(&r), vec![7, 17, 27]);
        assert_eq!(*r.sink.cycles.lock().unwrap(), 3);
        assert_eq!(*r.sink.missed.lock().unwrap(), 0);
        // Every wake-up is reported; on a paused clock the timer fires exactly on time.
        assert_eq!(*r.sink.woke.lock().unwrap(), vec![Duration::ZERO; 3]);
    }

    /// A runner that holds its thread (no await point) for a while, as a CPU-bound cycle
    /// on a busy runtime would.
    struct Hog(Duration);

    #[async_trait]
    impl CycleRunner for Hog {
        async fn run(&self, resources: Vec<String>, _cancel: CancellationToken) -> CycleReport {
            // Moving tokio's clock without yielding: the scheduler's own timer fires late.
            tokio::time::advance(self.0).await;
            FakeRunner::report(&resources, Utc::now())
        }
    }

    /// A target firing every second, up to 4 cycles at once, on a pool of 28.
    fn every_second_four_at_once() -> TargetSchedule {
        TargetSchedule {
            name: "t".into(),
            schedule: cron::Schedule::from_str("* * * * * *").unwrap(),
            jitter: Duration::ZERO,
            concurrency: 4,
            timeout: Duration::from_secs(60),
            pool: (1..=28).map(|i| format!("probe-{i:04}")).collect(),
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_wake_up_delayed_by_a_busy_runtime_is_reported_late() {
        let sink = Arc::new(Sink::default());
        let target = every_second_four_at_once();
        let cancel = CancellationToken::new();
        let clock = WallClock::starting_at(Utc.with_ymd_and_hms(2026, 1, 1, 0, 0, 0).unwrap());
        let task = tokio::spawn(run_target(
            target,
            Arc::new(Hog(Duration::from_millis(1500))),
            sink.clone(),
            clock,
            cancel.clone(),
        ));
        tokio::time::sleep(Duration::from_millis(3200)).await;
        cancel.cancel();
        task.await.unwrap();
        let woke = sink.woke.lock().unwrap().clone();
        assert!(woke.iter().any(|l| *l >= Duration::from_millis(400)), "{woke:?}");
    }

    /// A runner that blocks its thread (no await point) for a while: a cycle that keeps
    /// the runtime it runs on busy, on a real clock.
    struct Blocker(Duration);

    #[async_trait]
    impl CycleRunner for Blocker {
        async fn run(&self, resources: Vec<String>, _cancel: CancellationToken) -> CycleReport {
            std::thread::sleep(self.0);
            FakeRunner::report(&resources, Utc::now())
        }
    }

    #[test]
    fn cycles_on_another_runtime_do_not_delay_the_wake_ups_and_their_own_delay_is_reported() {
        let runtime = |name: &str| {
            tokio::runtime::Builder::new_multi_thread()
                .worker_threads(1)
                .thread_name(name)
                .enable_all()
                .build()
                .unwrap()
        };
        let (scheduler, work) = (runtime("scheduler"), runtime("work"));
        let sink = Arc::new(Sink::default());
        let target = every_second_four_at_once();
        let (_plans, updates) =
            watch::channel(TargetPlan { schedule: target, runner: Arc::new(Blocker(Duration::from_millis(1500))) });
        let stops = Stops { retire: CancellationToken::new(), shutdown: CancellationToken::new() };
        let room = CycleRoom { runtime: Some(work.handle().clone()), cap: None };
        let task = scheduler.spawn(run_target_plans(updates, sink.clone(), WallClock::system(), stops.clone(), room));
        std::thread::sleep(Duration::from_millis(3600));
        stops.shutdown.cancel();
        scheduler.block_on(task).unwrap();
        let woke = sink.woke.lock().unwrap().clone();
        let started = sink.started.lock().unwrap().clone();
        assert!(woke.len() >= 3, "{woke:?}");
        // Each cycle holds the work runtime's one thread for 1.5 s, a firing comes every
        // second: the scheduler wakes on time, the cycles begin late, and that is reported.
        // (On the cycles' runtime a wake-up would wait up to 1.5 s; 700 ms leaves a loaded
        // machine room to schedule the scheduler's thread.)
        assert!(woke.iter().all(|l| *l < Duration::from_millis(700)), "{woke:?}");
        assert!(started.iter().any(|d| *d >= Duration::from_millis(400)), "{started:?}");
    }

    #[tokio::test(start_paused = true)]
    async fn a_cycle_over_the_process_cap_waits_for_a_slot_and_is_counted() {
        let base = Utc.with_ymd_and_hms(2026, 1, 1, 0, 0, 3).unwrap();
        let clock = WallClock::starting_at(base);
        let (first, second) = (fake(5, clock), fake(5, clock));
        let sink = Arc::new(Sink::default());
        let room = CycleRoom { runtime: None, cap: Some(Arc::new(CycleCap::new(1))) };
        let stops = Stops { retire: CancellationToken::new(), shutdown: CancellationToken::new() };
        let mut tasks = Vec::new();
        for runner in [first.clone(), second.clone()] {
            let (plans, updates) = watch::channel(TargetPlan { schedule: every_ten_seconds(7, 1), runner });
            tasks.push((
                plans,
                tokio::spawn(run_target_plans(updates, sink.clone(), clock, stops.clone(), room.clone())),
            ));
        }
        // Both fire at 00:00:10 (7 s in); one slot: one runs 10..15, the other from 15.
        tokio::time::sleep(Duration::from_secs(16)).await;
        stops.shutdown.cancel();
        for (_plans, task) in tasks {
            task.await.unwrap();
        }
        let mut starts: Vec<i64> = [first, second]
            .iter()
            .flat_map(|r| r.starts.lock().unwrap().iter().map(|(t, _)| (*t - base).num_seconds()).collect::<Vec<_>>())
            .collect();
        starts.sort();
        assert_eq!(starts, vec![7, 12], "the second waited for the first's slot");
        assert_eq!(*sink.held_back.lock().unwrap(), 1);
        let mut delays = sink.started.lock().unwrap().clone();
        delays.sort();
        assert_eq!(delays, vec![Duration::ZERO, Duration::from_secs(5)]);
        assert_eq!(*sink.missed.lock().unwrap(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn overlapping_cycles_use_distinct_resources() {
        let r = run(15, 2, 14, 0, 60, 30).await;
        let starts = r.runner.starts.lock().unwrap().clone();
        assert_eq!(starts.len(), 3, "{starts:?}");
        // The first two overlap (10..25 and 20..35) and must not share a resource.
        let (a, b) = (&starts[0].1, &starts[1].1);
        assert!(a.iter().all(|x| !b.contains(x)), "{a:?} vs {b:?}");
        assert_eq!(a.len(), RESOURCES_PER_CYCLE);
        assert_eq!(*r.sink.missed.lock().unwrap(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn concurrency_limit_counts_missed_schedules() {
        // Each cycle lasts 25 s with one slot: fires at 10 (runs), 20 and 30 (missed), 40 (runs).
        let r = run(25, 1, 14, 0, 60, 40).await;
        assert_eq!(offsets(&r), vec![7, 37]);
        assert_eq!(*r.sink.missed.lock().unwrap(), 2);
    }

    #[tokio::test(start_paused = true)]
    async fn empty_pool_counts_missed_schedules() {
        // Two slots but resources for one cycle only.
        let r = run(15, 2, RESOURCES_PER_CYCLE, 0, 60, 30).await;
        assert_eq!(offsets(&r), vec![7, 27]);
        assert_eq!(*r.sink.missed.lock().unwrap(), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn a_group_another_replica_holds_is_skipped_for_the_next() {
        let busy = vec!["probe-0001".to_owned()];
        let r = run_beside(Some(busy), 1, 1, 14, 0, 60, 25).await;
        let starts = r.runner.starts.lock().unwrap().clone();
        assert_eq!(starts.len(), 2, "{starts:?}");
        assert!(starts.iter().all(|(_, group)| group[0] == "probe-0008"), "{starts:?}");
        let unclaimed = r.runner.unclaimed.lock().unwrap().clone();
        assert_eq!(unclaimed.len(), 2, "every claim given back");
        assert!(unclaimed.iter().all(|c| matches!(c, Claim::Held { resource, .. } if resource == "probe-0008-claim")));
        assert_eq!(*r.sink.missed.lock().unwrap(), 0, "stepping aside is not a missed schedule");
    }

    #[tokio::test(start_paused = true)]
    async fn when_other_replicas_hold_every_group_the_firing_is_theirs() {
        let busy = vec!["probe-0001".to_owned(), "probe-0008".to_owned()];
        let r = run_beside(Some(busy), 1, 1, 14, 0, 60, 25).await;
        assert!(r.runner.starts.lock().unwrap().is_empty());
        assert_eq!(*r.sink.missed.lock().unwrap(), 0);
    }

    fn fake(length: u64, clock: WallClock) -> Arc<FakeRunner> {
        Arc::new(FakeRunner {
            clock,
            length: Duration::from_secs(length),
            starts: Mutex::new(vec![]),
            cancelled: Mutex::new(0),
            busy: None,
            unclaimed: Mutex::new(vec![]),
        })
    }

    fn every_ten_seconds(pool: usize, concurrency: usize) -> TargetSchedule {
        TargetSchedule {
            name: "t".into(),
            schedule: cron::Schedule::from_str("*/10 * * * * *").unwrap(),
            jitter: Duration::ZERO,
            concurrency,
            timeout: Duration::from_secs(60),
            pool: (1..=pool).map(|i| format!("probe-{i:04}")).collect(),
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_new_plan_applies_from_the_next_cycle_and_the_one_in_flight_keeps_its_settings() {
        let base = Utc.with_ymd_and_hms(2026, 1, 1, 0, 0, 3).unwrap();
        let clock = WallClock::starting_at(base);
        let (old, new) = (fake(8, clock), fake(1, clock));
        let sink = Arc::new(Sink::default());
        let (plans, updates) = watch::channel(TargetPlan { schedule: every_ten_seconds(7, 1), runner: old.clone() });
        let stops = Stops { retire: CancellationToken::new(), shutdown: CancellationToken::new() };
        let task = tokio::spawn(run_target_plans(updates, sink.clone(), clock, stops.clone(), CycleRoom::default()));
        // The first cycle starts at 00:00:10 (7 s in) and runs 8 s; change the plan in its middle.
        tokio::time::sleep(Duration::from_secs(10)).await;
        assert_eq!(old.starts.lock().unwrap().len(), 1);
        plans.send_replace(TargetPlan { schedule: every_ten_seconds(14, 1), runner: new.clone() });
        tokio::time::sleep(Duration::from_secs(25)).await;
        stops.shutdown.cancel();
        task.await.unwrap();
        assert_eq!(*old.cancelled.lock().unwrap(), 0, "the cycle in flight was not cancelled");
        assert_eq!(old.starts.lock().unwrap().len(), 1, "no cycle started on the old settings after the change");
        // The old cycle ran 00:00:10 to :18; the new settings run at :20 and :30.
        let starts: Vec<i64> = new.starts.lock().unwrap().iter().map(|(t, _)| (*t - base).num_seconds()).collect();
        assert_eq!(starts, vec![17, 27], "the new settings from the next firing on");
        assert_eq!(*sink.cycles.lock().unwrap(), 3);
    }

    #[tokio::test(start_paused = true)]
    async fn a_cycle_in_flight_counts_against_the_new_concurrency_and_keeps_its_group() {
        let base = Utc.with_ymd_and_hms(2026, 1, 1, 0, 0, 3).unwrap();
        let clock = WallClock::starting_at(base);
        let (old, new) = (fake(15, clock), fake(15, clock));
        let sink = Arc::new(Sink::default());
        let (plans, updates) = watch::channel(TargetPlan { schedule: every_ten_seconds(7, 1), runner: old.clone() });
        let stops = Stops { retire: CancellationToken::new(), shutdown: CancellationToken::new() };
        let task = tokio::spawn(run_target_plans(updates, sink.clone(), clock, stops.clone(), CycleRoom::default()));
        tokio::time::sleep(Duration::from_secs(9)).await;
        // Two slots and a second group: the next firing (:20) runs beside the old cycle,
        // on the new group, never on the group the old cycle holds.
        plans.send_replace(TargetPlan { schedule: every_ten_seconds(14, 2), runner: new.clone() });
        tokio::time::sleep(Duration::from_secs(9)).await;
        stops.shutdown.cancel();
        task.await.unwrap();
        let old_group = old.starts.lock().unwrap()[0].1[0].clone();
        let new_starts = new.starts.lock().unwrap().clone();
        assert_eq!(new_starts.len(), 1, "{new_starts:?}");
        assert_eq!(old_group, "probe-0001");
        assert_eq!(new_starts[0].1[0], "probe-0008");
    }

    #[tokio::test(start_paused = true)]
    async fn retiring_lets_the_cycle_in_flight_finish_and_starts_no_other() {
        let base = Utc.with_ymd_and_hms(2026, 1, 1, 0, 0, 3).unwrap();
        let clock = WallClock::starting_at(base);
        let runner = fake(8, clock);
        let sink = Arc::new(Sink::default());
        let (_plans, updates) =
            watch::channel(TargetPlan { schedule: every_ten_seconds(14, 2), runner: runner.clone() });
        let stops = Stops { retire: CancellationToken::new(), shutdown: CancellationToken::new() };
        let task = tokio::spawn(run_target_plans(updates, sink.clone(), clock, stops.clone(), CycleRoom::default()));
        tokio::time::sleep(Duration::from_secs(9)).await;
        stops.retire.cancel();
        let started = tokio::time::Instant::now();
        task.await.unwrap();
        // It ended when the cycle did (00:00:18), 6 s after the retirement.
        assert_eq!(started.elapsed(), Duration::from_secs(6));
        assert_eq!(*runner.cancelled.lock().unwrap(), 0);
        assert_eq!(runner.starts.lock().unwrap().len(), 1);
        assert_eq!(*sink.cycles.lock().unwrap(), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn shutdown_cancels_the_cycle_in_flight() {
        let base = Utc.with_ymd_and_hms(2026, 1, 1, 0, 0, 3).unwrap();
        let clock = WallClock::starting_at(base);
        let runner = fake(8, clock);
        let (_plans, updates) =
            watch::channel(TargetPlan { schedule: every_ten_seconds(7, 1), runner: runner.clone() });
        let stops = Stops { retire: CancellationToken::new(), shutdown: CancellationToken::new() };
        let task = tokio::spawn(run_target_plans(
            updates,
            Arc::new(Sink::default()),
            clock,
            stops.clone(),
            CycleRoom::default(),
        ));
        tokio::time::sleep(Duration::from_secs(9)).await;
        stops.shutdown.cancel();
        task.await.unwrap();
        assert_eq!(*runner.cancelled.lock().unwrap(), 1);
    }

    #[test]
    fn a_reshaped_pool_never_hands_out_a_group_in_use() {
        let resources = |n: usize| (1..=n).map(|i| format!("p{i}")).collect::<Vec<_>>();
        let pool = Pool::new(&resources(14));
        let held = pool.take().unwrap();
        pool.reshape(&resources(21));
        assert_eq!(pool.free(), 2, "p8 and p15, not p1 which a cycle holds");
        pool.give_back(held);
        assert_eq!(pool.free(), 3);
        let held = pool.take().unwrap();
        assert_eq!(held[0], "p8");
        pool.reshape(&resources(7));
        assert_eq!(pool.free(), 1);
        pool.give_back(held);
        assert_eq!(pool.free(), 1, "a group the new layout has not is dropped when given back");
    }

    #[test]
    fn the_pool_is_cut_into_fixed_groups_and_a_short_tail_is_not_used() {
        let resources: Vec<String> = (1..=16).map(|i| format!("p{i}")).collect();
        let pool = Pool::new(&resources);
        assert_eq!(pool.free(), 2);
        assert_eq!(pool.take().unwrap()[0], "p1");
        assert_eq!(pool.take().unwrap()[0], "p8");
        assert!(pool.take().is_none());
    }

    #[tokio::test(start_paused = true)]
    async fn jitter_delays_within_bound() {
        let r = run(1, 1, 7, 3, 60, 45).await;
        let fires = [7, 17, 27, 37];
        let got = offsets(&r);
        assert_eq!(got.len(), 4, "{got:?}");
        for (g, f) in got.iter().zip(fires) {
            assert!((f..=f + 3).contains(g), "{got:?}");
        }
    }

    #[tokio::test(start_paused = true)]
    async fn timeout_cancels_a_long_cycle() {
        let r = run(100, 1, 7, 0, 5, 20).await;
        assert_eq!(*r.runner.cancelled.lock().unwrap(), 2);
        assert_eq!(*r.sink.cycles.lock().unwrap(), 2);
    }

    #[test]
    fn a_standard_five_field_cron_runs_at_second_zero_and_six_fields_are_seconds_first() {
        let at = |expr: &str| {
            let base = Utc.with_ymd_and_hms(2026, 1, 1, 0, 0, 0).unwrap();
            parse_schedule(expr).unwrap().after(&base).take(2).collect::<Vec<_>>()
        };
        let six_hourly = vec![
            Utc.with_ymd_and_hms(2026, 1, 1, 6, 0, 0).unwrap(),
            Utc.with_ymd_and_hms(2026, 1, 1, 12, 0, 0).unwrap(),
        ];
        assert_eq!(at("0 */6 * * *"), six_hourly, "5 fields: minute first");
        assert_eq!(at("0 0 */6 * * *"), six_hourly, "6 fields: seconds first");
        assert_eq!(at("*/10 * * * * *")[0], Utc.with_ymd_and_hms(2026, 1, 1, 0, 0, 10).unwrap());
        // 2026-01-01 is a Thursday: the next weekday-only 09:30 after Friday's is Monday's.
        let weekdays = parse_schedule("30 9 * * MON-FRI").unwrap();
        let friday = Utc.with_ymd_and_hms(2026, 1, 2, 9, 30, 0).unwrap();
        assert_eq!(weekdays.after(&friday).next(), Some(Utc.with_ymd_and_hms(2026, 1, 5, 9, 30, 0).unwrap()));
    }

    #[test]
    fn a_schedule_that_cannot_be_read_says_what_was_expected() {
        for (expr, says) in [
            ("0 9 * * 1-5", "name the weekdays"),
            ("* * * *", "has 4 fields; expected 5"),
            ("", "has 0 fields"),
            ("61 * * * *", "invalid cron expression"),
        ] {
            let e = parse_schedule(expr).expect_err(expr);
            assert!(e.contains(says), "{expr:?}: {e}");
        }
    }

    #[test]
    fn late_wake_up_counts_skipped_fires() {
        let schedule = cron::Schedule::from_str("*/10 * * * * *").unwrap();
        let fire = Utc.with_ymd_and_hms(2026, 1, 1, 0, 0, 10).unwrap();
        let second = chrono::Duration::seconds(1);
        // Woke on time: nothing skipped.
        assert!(skipped_fires(&schedule, fire, fire, second).is_empty());
        // Woke 30.5 s late (suspended host): :20, :30 and :40 were skipped.
        let now = fire + chrono::Duration::milliseconds(30_500);
        let skipped = skipped_fires(&schedule, fire, now, second);
        assert_eq!(skipped.len(), 2, "{skipped:?}");
        assert_eq!(skipped_fires(&schedule, fire, now + second, second).len(), 3);
    }
}
