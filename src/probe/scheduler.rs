//! Cron scheduling of probe cycles per target: jitter, a per-target concurrency limit,
//! overlapping cycles on distinct pool resources, and counting of missed schedules.
//!
//! Time is read through [`WallClock`], which maps tokio's clock onto wall time, so the
//! scheduler is tested on a paused tokio clock without sleeping.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use tokio::sync::Semaphore;
use tokio::task::JoinSet;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use super::report::CycleReport;
use super::settings::RESOURCES_PER_CYCLE;

/// Runs one cycle on the given resources (implemented by [`super::scenario::Scenario`]).
#[async_trait]
pub trait CycleRunner: Send + Sync + 'static {
    /// Runs a cycle; must stop and release its locks when `cancel` fires.
    async fn run(&self, resources: Vec<String>, cancel: CancellationToken) -> CycleReport;
}

#[async_trait]
impl CycleRunner for super::scenario::Scenario {
    async fn run(&self, resources: Vec<String>, cancel: CancellationToken) -> CycleReport {
        self.run_cycle(&resources, cancel).await
    }
}

/// Where finished cycles and missed schedules go (metrics, status).
pub trait CycleSink: Send + Sync + 'static {
    /// A cycle finished.
    fn cycle(&self, report: &CycleReport);
    /// `n` scheduled cycles of `target` did not start.
    fn missed(&self, target: &str, n: u64);
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

/// The pool of test resources; cycles take distinct ones, least recently used first.
#[derive(Debug)]
struct Pool(Mutex<VecDeque<String>>);

impl Pool {
    fn take(&self, n: usize) -> Option<Vec<String>> {
        let mut free = self.0.lock().unwrap_or_else(|e| e.into_inner());
        (free.len() >= n).then(|| free.drain(..n).collect())
    }

    fn give_back(&self, resources: Vec<String>) {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).extend(resources);
    }
}

/// Runs `target`'s schedule until `cancel` fires, then waits for running cycles (which are
/// cancelled too and release their locks).
pub async fn run_target(
    target: TargetSchedule,
    runner: Arc<dyn CycleRunner>,
    sink: Arc<dyn CycleSink>,
    clock: WallClock,
    cancel: CancellationToken,
) {
    let pool = Arc::new(Pool(Mutex::new(target.pool.iter().cloned().collect())));
    let slots = Arc::new(Semaphore::new(target.concurrency));
    let mut running = JoinSet::new();
    let mut after = clock.now();
    loop {
        let Some(fire) = target.schedule.after(&after).next() else {
            tracing::info!(target_name = %target.name, "schedule has no further firing times");
            break;
        };
        let jitter = if target.jitter.is_zero() {
            Duration::ZERO
        } else {
            Duration::from_millis(rand::random_range(0..=target.jitter.as_millis() as u64))
        };
        let wake = clock.instant_at(fire) + jitter;
        tokio::select! {
            _ = tokio::time::sleep_until(wake) => {}
            _ = cancel.cancelled() => break,
        }
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

        let Ok(permit) = slots.clone().try_acquire_owned() else {
            tracing::warn!(target_name = %target.name, limit = target.concurrency, "concurrency limit reached, schedule missed");
            sink.missed(&target.name, 1);
            continue;
        };
        let Some(resources) = pool.take(RESOURCES_PER_CYCLE) else {
            tracing::warn!(target_name = %target.name, "no free test resources, schedule missed");
            sink.missed(&target.name, 1);
            continue;
        };
        let (runner, sink, pool) = (runner.clone(), sink.clone(), pool.clone());
        let cycle_cancel = cancel.child_token();
        let timeout = target.timeout;
        let span = tracing::info_span!("probe", target = %target.name, resource = %resources[0]);
        running.spawn(
            async move {
                tracing::info!("cycle starting");
                let timer_cancel = cycle_cancel.clone();
                let timer = tokio::spawn(async move {
                    tokio::time::sleep(timeout).await;
                    timer_cancel.cancel();
                });
                let report = runner.run(resources.clone(), cycle_cancel).await;
                timer.abort();
                tracing::info!(result = report.result.as_str(), failed = report.failed_assertions(), "cycle finished");
                sink.cycle(&report);
                pool.give_back(resources);
                drop(permit);
            }
            .instrument(span),
        );
    }
    while running.join_next().await.is_some() {}
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
    use super::*;
    use crate::probe::report::CycleResult;
    use chrono::TimeZone;
    use std::str::FromStr;

    /// Records start times and resources; each cycle takes `length` of tokio time.
    struct FakeRunner {
        clock: WallClock,
        length: Duration,
        starts: Mutex<Vec<(DateTime<Utc>, Vec<String>)>>,
        cancelled: Mutex<usize>,
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
            CycleReport {
                target: "t".into(),
                resource: resources[0].clone(),
                started_at,
                finished_at: self.clock.now(),
                result: CycleResult::Passed,
                error: None,
                assertions: vec![],
                phase_durations: vec![],
                read_through_seconds: vec![],
                declared_convergence_seconds: None,
                expected_convergence_seconds: None,
                observed_convergence: vec![],
                notes: Vec::new(),
                store_region_changes: Vec::new(),
            }
        }
    }

    #[derive(Default)]
    struct Sink {
        cycles: Mutex<usize>,
        missed: Mutex<u64>,
    }

    impl CycleSink for Sink {
        fn cycle(&self, _: &CycleReport) {
            *self.cycles.lock().unwrap() += 1;
        }
        fn missed(&self, _: &str, n: u64) {
            *self.missed.lock().unwrap() += n;
        }
    }

    struct Run {
        runner: Arc<FakeRunner>,
        sink: Arc<Sink>,
        base: DateTime<Utc>,
    }

    /// Runs a schedule every 10 s from 00:00:03 for `for_secs` of paused tokio time.
    async fn run(length: u64, concurrency: usize, pool: usize, jitter: u64, timeout: u64, for_secs: u64) -> Run {
        let base = Utc.with_ymd_and_hms(2026, 1, 1, 0, 0, 3).unwrap();
        let clock = WallClock::starting_at(base);
        let runner = Arc::new(FakeRunner {
            clock,
            length: Duration::from_secs(length),
            starts: Mutex::new(vec![]),
            cancelled: Mutex::new(0),
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
